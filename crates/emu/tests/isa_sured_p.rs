//! `sured.p` on every integer surface format it reduces (issue 16 item 3): `.b32` on `U32` and
//! `S32` surfaces (add/min/max/and/or, min/max signed on `S32`), `.b64` on `U64` and `S64`
//! surfaces (min/max: the only `.b64` operations ptxas 13.5 accepts), in 1D, 2D and 3D with
//! `.trap` (in range), `.clamp` and `.zero` (coordinates one texel outside), against a host
//! reference that applies every thread's reduction in turn (the operations commute). Also the
//! faults for a width/format mismatch and the validator's `.b64` rule. Every kernel goes
//! through the validator, the printer round trip and, when installed, ptxas (sm_90a).

use emu::texture::{TexDesc, TexFormat};
use emu::GlobalMemory;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "common/tex.rs"]
mod common;
use common::{buffer, poisoned, read, run};

const HEAD: &str = ".version 8.7\n.target sm_90a\n.address_size 64\n";
const N: usize = 160;

/// The instruction type and value register of a `.b32` or (`wide`) `.b64` reduction.
fn width(wide: bool) -> (&'static str, &'static str) {
    if wide {
        ("b64", "%rd5")
    } else {
        ("b32", "%r5")
    }
}

/// A kernel where thread `t` reads `(x, y, z, _, value)` (value: 8 bytes at 16) from 32-byte record `t`
/// of the input and reduces `value` into texel (x, y, z) of the surface.
fn kernel(ins: &str, wide: bool) -> String {
    let val = if wide {
        "    ld.global.u64 %rd5, [%rd2+16];\n"
    } else {
        "    ld.global.u32 %r5, [%rd2+16];\n"
    };
    format!(
        "{HEAD}.visible .entry k(.param .u64 ps, .param .u64 pin)\n{{\n    .reg .pred %p<2>;\n\
         \x20   .reg .b32 %r<16>;\n    .reg .b64 %rd<16>;\n    ld.param.u64 %rd1, [ps];\n\
         \x20   ld.param.u64 %rd2, [pin];\n    mov.u32 %r0, %tid.x;\n    mov.u32 %r9, %ctaid.x;\n\
         \x20   mad.lo.u32 %r0, %r9, 128, %r0;\n    setp.ge.u32 %p1, %r0, {N};\n    @%p1 ret;\n\
         \x20   mul.wide.u32 %rd3, %r0, 32;\n    add.s64 %rd2, %rd2, %rd3;\n\
         \x20   ld.global.v4.u32 {{%r1, %r2, %r3, %r4}}, [%rd2];\n{val}{ins}\n    ret;\n}}\n"
    )
}

fn reduce(op: &str, format: TexFormat, old: u64, v: u64) -> u64 {
    let m32 = |x: u64| x & 0xffff_ffff;
    match (op, format) {
        ("add", _) => m32(old.wrapping_add(v)),
        ("and", _) => old & v,
        ("or", _) => m32(old | v),
        ("min", TexFormat::S32) => (old as i32).min(v as i32) as u32 as u64,
        ("max", TexFormat::S32) => (old as i32).max(v as i32) as u32 as u64,
        ("min", TexFormat::S64) => (old as i64).min(v as i64) as u64,
        ("max", TexFormat::S64) => (old as i64).max(v as i64) as u64,
        ("min", TexFormat::U32) => old.min(m32(v)),
        ("max", TexFormat::U32) => old.max(m32(v)),
        ("min", _) => old.min(v),
        _ => old.max(v),
    }
}

/// One case: `ops` on a `format` surface of `ext` in `dims` dimensions with out-of-range mode
/// `oob`.
fn case(rng: &mut StdRng, op: &str, format: TexFormat, dims: usize, oob: &str) {
    let wide = format.bytes() == 8;
    let es = format.bytes() as usize;
    let mut ext = [1u32; 3];
    for e in ext.iter_mut().take(dims) {
        *e = rng.gen_range(2..5);
    }
    let texels = (ext[0] * ext[1] * ext[2]) as usize;
    let narrow = |x: u64| if wide { x } else { x >> 32 };
    let init: Vec<u64> = (0..texels).map(|_| narrow(rng.gen())).collect();
    let enc = |v: &[u64]| -> Vec<u8> {
        v.iter()
            .flat_map(|x| x.to_le_bytes()[..es].to_vec())
            .collect()
    };
    let mem = GlobalMemory::new();
    let surf = buffer(&mem, &enc(&init));
    let d = TexDesc::surface(surf.base, format, 1, &ext[..dims]).unwrap();
    let h = d.upload(&mem, 0).unwrap();
    let (mut want, mut input) = (init.clone(), Vec::new());
    for _ in 0..N {
        let out = oob != "trap";
        let c: Vec<i64> = (0..3)
            .map(|k| match (k < dims, out) {
                (false, _) => 0,
                (true, true) => rng.gen_range(-1..=ext[k] as i64),
                (true, false) => rng.gen_range(0..ext[k] as i64),
            })
            .collect();
        let v = narrow(rng.gen());
        input.extend(c.iter().flat_map(|x| (*x as i32).to_le_bytes()));
        input.extend([0u8; 4]);
        input.extend(v.to_le_bytes());
        input.extend([0u8; 8]);
        let inside = (0..3).all(|k| (0..ext[k] as i64).contains(&c[k]));
        if !inside && oob == "zero" {
            continue;
        }
        let at: Vec<i64> = (0..3).map(|k| c[k].clamp(0, ext[k] as i64 - 1)).collect();
        let i = ((at[2] * ext[1] as i64 + at[1]) * ext[0] as i64 + at[0]) as usize;
        want[i] = reduce(op, format, want[i], v);
    }
    let coords = ["{%r1}", "{%r1, %r2}", "{%r1, %r2, %r3, %r3}"][dims - 1];
    let (b, r) = width(wide);
    let ins = format!("    sured.p.{op}.{dims}d.{b}.{oob} [%rd1, {coords}], {r};");
    let m = common::load_checked(&mem, &kernel(&ins, wide), &["sm_90a"], "isa_sured_p PTX");
    let inb = buffer(&mem, &input);
    run(&m, &mem, N, &[h.base, inb.base]).unwrap();
    assert_eq!(
        read(&surf, texels * es),
        enc(&want),
        "{ins} on {format:?} {ext:?}"
    );
}

#[test]
fn sured_p_every_format_geometry_and_mode() {
    let mut rng = StdRng::seed_from_u64(0x5ed_b64);
    let cases: [(&[&str], TexFormat); 4] = [
        (&["add", "min", "max", "and", "or"], TexFormat::S32),
        (&["min", "max"], TexFormat::U32),
        (&["min", "max"], TexFormat::U64),
        (&["min", "max"], TexFormat::S64),
    ];
    for (ops, format) in cases {
        for (k, op) in ops.iter().enumerate() {
            for dims in 1..=3 {
                let oob = ["trap", "clamp", "zero"][(k + dims) % 3];
                case(&mut rng, op, format, dims, oob);
            }
        }
    }
}

#[test]
fn sured_p_width_must_match_the_format() {
    let mem = GlobalMemory::new();
    let surf = poisoned(&mem, 64);
    for (format, wide, want) in [
        (
            TexFormat::U32,
            true,
            "sured.p.b64 reduces U64 or S64 surfaces, not U32",
        ),
        (
            TexFormat::S64,
            false,
            "sured.p.b32 reduces U32 or S32 surfaces, not S64",
        ),
        (
            TexFormat::F32,
            false,
            "sured.p.b32 reduces U32 or S32 surfaces, not F32",
        ),
    ] {
        let h = TexDesc::surface(surf.base, format, 1, &[2])
            .unwrap()
            .upload(&mem, 0)
            .unwrap();
        let (b, r) = width(wide);
        let ins = format!("    sured.p.max.1d.{b}.trap [%rd1, {{%r1}}], {r};");
        let m = common::load_checked(&mem, &kernel(&ins, wide), &["sm_90a"], "isa_sured_p PTX");
        let input = buffer(&mem, &vec![0u8; 32 * N]);
        let err = run(&m, &mem, 1, &[h.base, input.base]).unwrap_err();
        assert!(err.contains(want), "{err}");
        assert_eq!(
            read(&surf, 64),
            vec![0xa5; 64],
            "a refused reduction writes nothing"
        );
    }
    // sust.p cannot store 64-bit channels
    let h = TexDesc::surface(surf.base, TexFormat::U64, 1, &[2])
        .unwrap()
        .upload(&mem, 0)
        .unwrap();
    let ins = "    sust.p.1d.b32.trap [%rd1, {%r1}], {%r5};";
    let m = common::load_checked(&mem, &kernel(ins, false), &["sm_90a"], "isa_sured_p PTX");
    let input = buffer(&mem, &vec![0u8; 32 * N]);
    let err = run(&m, &mem, 1, &[h.base, input.base]).unwrap_err();
    assert!(err.contains("64-bit channels"), "{err}");
}

#[test]
fn validator_rejects_sured_p_b64_add() {
    for op in ["add", "and", "or"] {
        let ins = format!("    sured.p.{op}.1d.b64.trap [%rd1, {{%r1}}], %rd5;");
        let errs = common::validator_errors(&kernel(&ins, true));
        assert!(
            errs.iter().any(|e| e.contains("takes .min or .max")),
            "{op}: {errs:?}"
        );
    }
}
