//! The library's shared-memory layouts are free of bank conflicts: every registered kernel runs
//! its test shapes on the emulator with the bank profiler on (`emu::banks`: 32 banks x 4 bytes,
//! phases by access width, one phase per ldmatrix/stmatrix matrix) and takes exactly the ideal
//! number of wavefronts. This covers the swizzled cp.async/ldmatrix tiles of the mma.sync GEMMs,
//! the quantisers' transposes and the Hopper epilogue's swizzled stmatrix staging; wgmma and
//! TMA shared-memory traffic runs in the async proxy and is not modelled.

use kernels::registry::Kind;

#[test]
fn every_library_kernel_is_free_of_shared_bank_conflicts() {
    let dev = runtime::Device::emu(71);
    let st = dev.stream(0);
    st.set_bank_profile(true);
    let (mut profiled, mut epilogues) = (0, 0);
    for info in kernels::registry() {
        for (i, s) in info.test_shapes.iter().enumerate() {
            let rep = info.check(&st, s, 900 + i as u64).unwrap();
            assert!(rep.pass, "{} {s:?}: {rep:?}", info.name);
            let banks = st
                .last_stats()
                .and_then(|x| x.banks)
                .expect("emulator launches report a bank profile");
            let t = banks.total;
            assert_eq!(
                t.wavefronts,
                t.ideal,
                "{} {s:?}: {} of {} shared wavefronts are bank conflicts; worst lines: {:#?}",
                info.name,
                t.conflicts(),
                t.wavefronts,
                &banks.lines[..banks.lines.len().min(3)]
            );
            profiled += (t.requests > 0) as usize;
            // the TMA-store epilogue writes its staging buffer with stmatrix: one x4 request per
            // two 8-column chunks of each warp's 16 rows
            if let Kind::Hopper(h) = &info.kind {
                if h.tma_store() {
                    let stm: u64 = banks
                        .lines
                        .iter()
                        .filter(|l| l.instruction.starts_with("stmatrix"))
                        .map(|l| l.counts.requests)
                        .sum();
                    assert!(stm > 0, "{}: no stmatrix profiled", info.name);
                    epilogues += 1;
                }
            }
        }
    }
    // the test can fail: GEMMs and transposing quantisers do go through shared memory
    assert!(
        profiled >= 20,
        "only {profiled} launches touched shared memory"
    );
    assert!(epilogues >= 4);
}
