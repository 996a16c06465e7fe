//! The emulator's fast paths (lane-parallel f32 ops and common conversions) agree bit for bit
//! with the exact software float unit (`emu::fp`) on random and special inputs; approximate
//! functions stay within the PTX bounds.

use emu::alu::{cvt_fast, f32_special};
use emu::fp::{self, CvtSpec, FMode, FOp, Rnd};
use emu::Lanes;
use ptx::{Opcode, Ty};
use rand::{Rng, SeedableRng};

fn inputs(seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v: Vec<u32> = vec![
        0,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffc0_1234,
        1,
        0x8000_0001,
        0x007f_ffff,
        0x0080_0000,
        0x3f80_0000,
        0xbf80_0000,
        0x43e0_0000,
        0x43df_ffff,
        0x43e8_0000,
        0x3c80_0000,
        0x3c7f_ffff,
        0x3b00_0000,
        0x3a80_0000,
        0x3f80_8000,
        0x3f81_8000,
        0x7f7f_ffff,
    ];
    for _ in 0..4000 {
        let b: u32 = rng.gen();
        v.push(b);
        // Also values in ranges that matter for fp8/bf16 rounding.
        let x: f32 = rng.gen_range(-600.0..600.0);
        v.push(x.to_bits());
        let y: f32 = rng.gen_range(-0.03..0.03);
        v.push(y.to_bits());
    }
    v
}

fn run(f: emu::alu::WFn, a: &[u32], b: &[u32]) -> Vec<u64> {
    let mut out = Vec::new();
    for (ca, cb) in a.chunks(32).zip(b.chunks(32)) {
        // rows: d (poisoned), a, b, c (zero); all lanes active
        let mut regs: Vec<Lanes> = vec![[u64::MAX; 32], [0; 32], [0; 32], [0; 32]];
        for i in 0..ca.len() {
            regs[1][i] = ca[i] as u64;
            regs[2][i] = cb[i] as u64;
        }
        let s = emu::alu::Slots {
            m: u32::MAX,
            d: 0,
            a: 1,
            b: 2,
            c: 3,
        };
        f(&mut regs, s);
        out.extend_from_slice(&regs[0][..ca.len()]);
    }
    out
}

#[test]
fn conversions_match_exact_unit() {
    let a = inputs(1);
    let mut b = inputs(2);
    b.truncate(a.len());
    let specs = [
        CvtSpec::new(Ty::Bf16x2, Ty::F32).rnd(Rnd::Rn),
        CvtSpec::new(Ty::Bf16, Ty::F32).rnd(Rnd::Rn),
        {
            let mut s = CvtSpec::new(Ty::E4m3x2, Ty::F32).rnd(Rnd::Rn);
            s.satfinite = true;
            s
        },
        CvtSpec::new(Ty::F32, Ty::Bf16),
        CvtSpec::new(Ty::F16x2, Ty::E4m3x2).rnd(Rnd::Rn),
        CvtSpec::new(Ty::F32, Ty::F16),
        CvtSpec::new(Ty::U64, Ty::U32),
        CvtSpec::new(Ty::S64, Ty::S32),
        CvtSpec::new(Ty::U64, Ty::S32),
        CvtSpec::new(Ty::U32, Ty::U64),
        CvtSpec::new(Ty::S32, Ty::S16),
        CvtSpec::new(Ty::U16, Ty::U32),
        CvtSpec::new(Ty::F32, Ty::S32).rnd(Rnd::Rn),
        CvtSpec::new(Ty::F32, Ty::U32).rnd(Rnd::Rn),
    ];
    for spec in specs {
        let f = cvt_fast(&spec).unwrap_or_else(|| panic!("no fast path for {spec:?}"));
        // Narrow sources get their own bit widths.
        let mask = |t: Ty| {
            if t.size() >= 8 {
                u64::MAX
            } else {
                (1u64 << (t.size() * 8)) - 1
            }
        };
        let aa: Vec<u32> = a
            .iter()
            .map(|&x| (x as u64 & mask(spec.src)) as u32)
            .collect();
        let bb: Vec<u32> = b
            .iter()
            .map(|&x| (x as u64 & mask(spec.src)) as u32)
            .collect();
        let got = run(f, &aa, &bb);
        for i in 0..aa.len() {
            let want = fp::cvt(&spec, aa[i] as u64, bb[i] as u64);
            assert_eq!(got[i], want, "{spec:?}: inputs {:#x}, {:#x}", aa[i], bb[i]);
        }
    }
}

#[test]
fn f32_ops_match_exact_unit() {
    let a = inputs(3);
    let mut b = inputs(4);
    b.truncate(a.len());
    for ftz in [false, true] {
        for (op, fop, arity) in [
            (Opcode::Div, FOp::Div, 2),
            (Opcode::Min, FOp::Min, 2),
            (Opcode::Max, FOp::Max, 2),
            (Opcode::Add, FOp::Add, 2),
            (Opcode::Sub, FOp::Sub, 2),
            (Opcode::Mul, FOp::Mul, 2),
            (Opcode::Rcp, FOp::Rcp, 1),
            (Opcode::Sqrt, FOp::Sqrt, 1),
        ] {
            let f = f32_special(op, ftz).unwrap();
            let got = run(f, &a, &b);
            let mode = FMode {
                rnd: Rnd::Rn,
                ftz,
                ..FMode::default()
            };
            for i in 0..a.len() {
                let bb = if arity == 2 { b[i] as u64 } else { 0 };
                let want = fp::fop(fop, Ty::F32, mode, a[i] as u64, bb, 0);
                assert_eq!(got[i], want, "{op:?} ftz={ftz}: {:#x}, {:#x}", a[i], bb);
            }
        }
    }
}

#[test]
fn approximate_functions_within_ptx_bounds() {
    let a = inputs(5);
    for (op, fop, ulps) in [
        (Opcode::Ex2, FOp::Ex2, 2i64),
        (Opcode::Lg2, FOp::Lg2, 2),
        (Opcode::Tanh, FOp::Tanh, 2),
        (Opcode::Rsqrt, FOp::Rsqrt, 2),
    ] {
        let f = f32_special(op, false).unwrap();
        let got = run(f, &a, &a);
        let mode = FMode {
            rnd: Rnd::Rn,
            approx: true,
            ..FMode::default()
        };
        for i in 0..a.len() {
            let want = fp::fop(fop, Ty::F32, mode, a[i] as u64, 0, 0) as u32;
            let g = got[i] as u32;
            let (gf, wf) = (f32::from_bits(g), f32::from_bits(want));
            if gf.is_nan() || wf.is_nan() {
                assert!(
                    gf.is_nan() && wf.is_nan(),
                    "{op:?}({:#x}): {gf} vs {wf}",
                    a[i]
                );
                continue;
            }
            let d = (g as i32 as i64 - want as i32 as i64).abs();
            assert!(
                d <= ulps || gf == wf,
                "{op:?}({:#x}): {gf} vs {wf} ({d} ulp)",
                a[i]
            );
        }
    }
}
