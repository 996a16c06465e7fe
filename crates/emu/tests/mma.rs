//! `mma.sync` tests. The reference goes the other way from the implementation: for every matrix
//! element it computes which lane / element slot holds it (the inverse of the PTX fragment
//! tables), scatters random asymmetric matrices into fragments that way, runs the warp-wide
//! `mma_sync`, gathers D the same way and compares with a plain f64 / i64 matrix product.
//!
//! Numerics: the layout tests call `mma_sync`, the exact mode. Their integer-valued inputs make
//! every sum exact, so the hardware models would give the same bits; the exact mode keeps the
//! f64 reference independent of [`emu::tc_numerics`]. `hw_models_through_fragments` runs the
//! hardware models through the same fragment layouts against the slow integer reference.

use emu::fp;
use emu::mma::{mma_sync, mma_sync_with, MmaSpec};
use emu::tc_numerics::{model_for, reference_dot};
use emu::Lanes;
use ptx::Ty;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// (lane, element slot) holding A[r][c].
fn a_home(s: &MmaSpec, r: usize, c: usize) -> (usize, usize) {
    let g = r % 8;
    let hi = r / 8; // 0/1: upper or lower 8 rows
    match (s.aty, s.k) {
        (Ty::F16 | Ty::Bf16, 16) => (g * 4 + (c % 8) / 2, c % 2 + 2 * hi + 4 * (c / 8)),
        (Ty::F16 | Ty::Bf16, 8) => (g * 4 + c / 2, c % 2 + 2 * hi),
        (Ty::Tf32, 4) => (g * 4 + c, hi),
        (Ty::Tf32, 8) => (g * 4 + c % 4, hi + 2 * (c / 4)),
        (Ty::F64, _) => (r * 4 + c, 0),
        (_, 32) => (g * 4 + (c % 16) / 4, c % 4 + 4 * hi + 8 * (c / 16)),
        (_, 16) => (g * 4 + c / 4, c % 4 + 4 * hi),
        _ => unreachable!(),
    }
}

/// (lane, element slot) holding B[k][n].
fn b_home(s: &MmaSpec, k: usize, n: usize) -> (usize, usize) {
    match (s.bty, s.k) {
        (Ty::F16 | Ty::Bf16, 16) => (n * 4 + (k % 8) / 2, k % 2 + 2 * (k / 8)),
        (Ty::F16 | Ty::Bf16, 8) => (n * 4 + k / 2, k % 2),
        (Ty::Tf32, 4) | (Ty::F64, _) => (n * 4 + k, 0),
        (Ty::Tf32, 8) => (n * 4 + k % 4, k / 4),
        (_, 32) => (n * 4 + (k % 16) / 4, k % 4 + 4 * (k / 16)),
        (_, 16) => (n * 4 + k / 4, k % 4),
        _ => unreachable!(),
    }
}

/// (lane, element slot) holding C[r][c] / D[r][c].
fn c_home(s: &MmaSpec, r: usize, c: usize) -> (usize, usize) {
    if s.m == 8 {
        (r * 4 + c / 2, c % 2)
    } else {
        ((r % 8) * 4 + c / 2, c % 2 + 2 * (r / 8))
    }
}

fn width(t: Ty) -> usize {
    match t {
        Ty::F16 | Ty::Bf16 => 16,
        Ty::E4m3 | Ty::E5m2 | Ty::S8 | Ty::U8 => 8,
        Ty::F64 => 64,
        _ => 32,
    }
}

fn put(regs: &mut [Lanes], t: Ty, lane: usize, slot: usize, bits: u64) {
    let w = width(t);
    let per = if w >= 32 { 1 } else { 32 / w };
    let (reg, sub) = (slot / per, slot % per);
    if w >= 32 {
        regs[reg][lane] = bits;
    } else {
        regs[reg][lane] |= (bits & ((1 << w) - 1)) << (sub * w);
    }
}

fn get(regs: &[Lanes], t: Ty, lane: usize, slot: usize) -> u64 {
    let w = width(t);
    let per = if w >= 32 { 1 } else { 32 / w };
    let (reg, sub) = (slot / per, slot % per);
    if w >= 64 {
        regs[reg][lane]
    } else {
        (regs[reg][lane] >> (sub * w)) & ((1 << w) - 1)
    }
}

fn encode(t: Ty, v: f64, rng: &mut StdRng) -> u64 {
    match t {
        Ty::F16 => half::f16::from_f64(v).to_bits() as u64,
        Ty::Bf16 => half::bf16::from_f64(v).to_bits() as u64,
        // tf32: low 13 bits are garbage the tensor core must ignore
        Ty::Tf32 => ((v as f32).to_bits() | rng.gen_range(0..0x2000u32)) as u64,
        Ty::F32 => (v as f32).to_bits() as u64,
        Ty::F64 => v.to_bits(),
        Ty::E4m3 => fp::f32_to_e4m3(v as f32, true) as u64,
        Ty::E5m2 => fp::f32_to_e5m2(v as f32, true) as u64,
        Ty::S8 | Ty::U8 => v as i64 as u64 & 0xFF,
        Ty::S32 => v as i64 as u64 & 0xFFFF_FFFF,
        _ => unreachable!(),
    }
}

fn decode_d(t: Ty, bits: u64) -> f64 {
    match t {
        Ty::F16 => half::f16::from_bits(bits as u16).to_f64(),
        Ty::F32 => f32::from_bits(bits as u32) as f64,
        Ty::F64 => f64::from_bits(bits),
        Ty::S32 => bits as u32 as i32 as f64,
        _ => unreachable!(),
    }
}

/// Random value exactly representable in `t`, small enough that every sum is exact.
fn sample(t: Ty, rng: &mut StdRng) -> f64 {
    match t {
        Ty::E5m2 => rng.gen_range(-7..=7) as f64,
        Ty::E4m3 => rng.gen_range(-8..=8) as f64 * if rng.gen() { 1.0 } else { 0.5 },
        Ty::S8 => rng.gen_range(-128..=127) as f64,
        Ty::U8 => rng.gen_range(0..=255) as f64,
        Ty::S32 => rng.gen_range(-100_000..=100_000) as f64,
        _ => rng.gen_range(-16..=16) as f64 * if rng.gen() { 1.0 } else { 0.25 },
    }
}

fn run_case(s: &MmaSpec, rng: &mut StdRng) {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let am: Vec<Vec<f64>> = (0..m)
        .map(|_| (0..k).map(|_| sample(s.aty, rng)).collect())
        .collect();
    let bm: Vec<Vec<f64>> = (0..k)
        .map(|_| (0..n).map(|_| sample(s.bty, rng)).collect())
        .collect();
    let cm: Vec<Vec<f64>> = (0..m)
        .map(|_| (0..n).map(|_| sample(s.cty, rng)).collect())
        .collect();
    let (na, nb, nc, nd) = s.frag_counts();
    let mut a = vec![[0u64; 32]; na];
    let mut b = vec![[0u64; 32]; nb];
    let mut c = vec![[0u64; 32]; nc];
    for (r, row) in am.iter().enumerate() {
        for (cc, &v) in row.iter().enumerate() {
            let (lane, slot) = a_home(s, r, cc);
            put(&mut a, s.aty, lane, slot, encode(s.aty, v, rng));
        }
    }
    for (kk, row) in bm.iter().enumerate() {
        for (cc, &v) in row.iter().enumerate() {
            let (lane, slot) = b_home(s, kk, cc);
            put(&mut b, s.bty, lane, slot, encode(s.bty, v, rng));
        }
    }
    for (r, row) in cm.iter().enumerate() {
        for (cc, &v) in row.iter().enumerate() {
            let (lane, slot) = c_home(s, r, cc);
            put(&mut c, s.cty, lane, slot, encode(s.cty, v, rng));
        }
    }
    let mut d = vec![[0xDEAD_BEEFu64; 32]; nd];
    let ar: Vec<&Lanes> = a.iter().collect();
    let br: Vec<&Lanes> = b.iter().collect();
    let cr: Vec<&Lanes> = c.iter().collect();
    mma_sync(s, &ar, &br, &cr, &mut d);
    for r in 0..m {
        for cc in 0..n {
            let want: f64 = (0..k).map(|kk| am[r][kk] * bm[kk][cc]).sum::<f64>() + cm[r][cc];
            let (lane, slot) = c_home(s, r, cc);
            let got = decode_d(s.dty, get(&d, s.dty, lane, slot));
            let want = match s.dty {
                Ty::F16 => half::f16::from_f64(want).to_f64(),
                _ => want,
            };
            assert_eq!(got, want, "{s:?} D[{r}][{cc}]");
        }
    }
    // every register of D is fully written (no stale bits in unused halves)
    for reg in &d {
        for &v in reg.iter() {
            assert!(
                s.dty == Ty::F64 || v >> 32 == 0,
                "{s:?}: D register not zero-extended"
            );
        }
    }
}

fn forms() -> Vec<MmaSpec> {
    let f = |shape, d, a, b, c| MmaSpec::new(shape, d, a, b, c, false).unwrap();
    let mut v = vec![
        f((16, 8, 16), Ty::F32, Ty::F16, Ty::F16, Ty::F32),
        f((16, 8, 16), Ty::F16, Ty::F16, Ty::F16, Ty::F16),
        f((16, 8, 16), Ty::F32, Ty::F16, Ty::F16, Ty::F16),
        f((16, 8, 16), Ty::F32, Ty::Bf16, Ty::Bf16, Ty::F32),
        f((16, 8, 8), Ty::F32, Ty::F16, Ty::F16, Ty::F32),
        f((16, 8, 8), Ty::F16, Ty::F16, Ty::F16, Ty::F16),
        f((16, 8, 8), Ty::F32, Ty::Bf16, Ty::Bf16, Ty::F32),
        f((16, 8, 8), Ty::F32, Ty::Tf32, Ty::Tf32, Ty::F32),
        f((16, 8, 4), Ty::F32, Ty::Tf32, Ty::Tf32, Ty::F32),
        f((8, 8, 4), Ty::F64, Ty::F64, Ty::F64, Ty::F64),
    ];
    for a in [Ty::E4m3, Ty::E5m2] {
        for b in [Ty::E4m3, Ty::E5m2] {
            v.push(f((16, 8, 32), Ty::F32, a, b, Ty::F32));
            v.push(f((16, 8, 32), Ty::F16, a, b, Ty::F16));
        }
    }
    for a in [Ty::S8, Ty::U8] {
        for b in [Ty::S8, Ty::U8] {
            v.push(f((16, 8, 32), Ty::S32, a, b, Ty::S32));
            v.push(f((16, 8, 16), Ty::S32, a, b, Ty::S32));
        }
    }
    v
}

#[test]
fn all_forms_match_reference() {
    let mut rng = StdRng::seed_from_u64(42);
    for s in forms() {
        for _ in 0..20 {
            run_case(&s, &mut rng);
        }
    }
}

#[test]
fn frag_counts() {
    let f = |shape, d, a, b, c| {
        MmaSpec::new(shape, d, a, b, c, false)
            .unwrap()
            .frag_counts()
    };
    assert_eq!(
        f((16, 8, 16), Ty::F32, Ty::F16, Ty::F16, Ty::F32),
        (4, 2, 4, 4)
    );
    assert_eq!(
        f((16, 8, 16), Ty::F16, Ty::F16, Ty::F16, Ty::F16),
        (4, 2, 2, 2)
    );
    assert_eq!(
        f((16, 8, 8), Ty::F32, Ty::F16, Ty::F16, Ty::F32),
        (2, 1, 4, 4)
    );
    assert_eq!(
        f((16, 8, 8), Ty::F32, Ty::Tf32, Ty::Tf32, Ty::F32),
        (4, 2, 4, 4)
    );
    assert_eq!(
        f((16, 8, 4), Ty::F32, Ty::Tf32, Ty::Tf32, Ty::F32),
        (2, 1, 4, 4)
    );
    assert_eq!(
        f((16, 8, 32), Ty::F32, Ty::E4m3, Ty::E5m2, Ty::F32),
        (4, 2, 4, 4)
    );
    assert_eq!(
        f((16, 8, 32), Ty::S32, Ty::S8, Ty::U8, Ty::S32),
        (4, 2, 4, 4)
    );
    assert_eq!(
        f((16, 8, 16), Ty::S32, Ty::S8, Ty::S8, Ty::S32),
        (2, 1, 4, 4)
    );
    assert_eq!(
        f((8, 8, 4), Ty::F64, Ty::F64, Ty::F64, Ty::F64),
        (1, 1, 2, 2)
    );
}

#[test]
fn integer_wrap_and_satfinite() {
    // A = all 127, B = all 127, C = i32::MAX - 10: the dot product overflows i32
    for sat in [false, true] {
        let s = MmaSpec::new((16, 8, 32), Ty::S32, Ty::S8, Ty::S8, Ty::S32, sat).unwrap();
        let a = [0x7F7F_7F7Fu64; 32];
        let b = [0x7F7F_7F7Fu64; 32];
        let cv = (i32::MAX - 10) as u32 as u64;
        let c = [cv; 32];
        let mut d = vec![[0u64; 32]; 4];
        mma_sync(&s, &[&a; 4], &[&b; 2], &[&c; 4], &mut d);
        let exact = (i32::MAX - 10) as i64 + 32 * 127 * 127;
        let want = if sat {
            i32::MAX as u32 as u64
        } else {
            exact as i32 as u32 as u64
        };
        assert!(d.iter().all(|r| r.iter().all(|&x| x == want)), "sat={sat}");
    }
    // negative saturation with s8 x u8
    let s = MmaSpec::new((16, 8, 32), Ty::S32, Ty::S8, Ty::U8, Ty::S32, true).unwrap();
    let a = [0x8080_8080u64; 32]; // -128
    let b = [0xFFFF_FFFFu64; 32]; // 255
    let c = [(i32::MIN + 5) as u32 as u64; 32];
    let mut d = vec![[0u64; 32]; 4];
    mma_sync(&s, &[&a; 4], &[&b; 2], &[&c; 4], &mut d);
    assert!(d
        .iter()
        .all(|r| r.iter().all(|&x| x == i32::MIN as u32 as u64)));
}

#[test]
fn rounding_and_nan() {
    // f32 accumulate: 1 + 2^-30 products round once to f32; NaN input gives canonical NaN
    let s = MmaSpec::new((16, 8, 16), Ty::F32, Ty::F16, Ty::F16, Ty::F32, false).unwrap();
    let one = 0x3C00u64;
    let a = [one | (one << 16); 32];
    let b = [one | (one << 16); 32];
    let c = [1f32.to_bits() as u64; 32];
    let mut d = vec![[0u64; 32]; 4];
    mma_sync(&s, &[&a; 4], &[&b; 2], &[&c; 4], &mut d);
    assert!(d
        .iter()
        .all(|r| r.iter().all(|&x| x == 17f32.to_bits() as u64)));
    let mut an = a;
    an[0] = 0x7E00 | (one << 16); // NaN in A[0][0]
    mma_sync(&s, &[&an, &a, &a, &a], &[&b; 2], &[&c; 4], &mut d);
    // row 0 of D is NaN (lanes 0..4, registers 0 and 1), row 8 is not
    #[allow(clippy::needless_range_loop)]
    for lane in 0..4 {
        assert_eq!(d[0][lane], 0x7FFF_FFFF);
        assert_eq!(d[1][lane], 0x7FFF_FFFF);
        assert_eq!(d[2][lane], 17f32.to_bits() as u64);
    }
    assert_eq!(d[0][4], 17f32.to_bits() as u64);
}

#[test]
fn from_instruction() {
    let parse = |s: &str| match ptx::parse_statements(s).expect("parse").into_iter().next() {
        Some(ptx::Statement::Instr(i)) => i,
        other => panic!("{other:?}"),
    };
    let i = parse(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f5,%f6,%f7,%f8};",
    );
    let s = MmaSpec::from_instruction(&i).unwrap();
    assert_eq!(
        (s.m, s.n, s.k, s.dty, s.aty, s.bty, s.cty),
        (16, 8, 16, Ty::F32, Ty::Bf16, Ty::Bf16, Ty::F32)
    );
    let i = parse(
        "mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.u8.s32 {%r1,%r2,%r3,%r4}, {%r5,%r6,%r7,%r8}, {%r9,%r10}, {%r11,%r12,%r13,%r14};",
    );
    let s = MmaSpec::from_instruction(&i).unwrap();
    assert!(s.satfinite);
    assert_eq!(s.frag_counts(), (4, 2, 4, 4));
    let i = parse(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f5,%f6,%f7,%f8};",
    );
    assert!(MmaSpec::from_instruction(&i).is_ok());
    let i = parse(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.bf16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f5,%f6,%f7,%f8};",
    );
    assert!(MmaSpec::from_instruction(&i).is_err());
    let i = parse(
        "mma.sync.aligned.m16n8k16.col.row.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f5,%f6,%f7,%f8};",
    );
    assert!(MmaSpec::from_instruction(&i).is_err());
}

#[test]
fn short_fragments_do_not_panic() {
    let s = MmaSpec::new((16, 8, 16), Ty::F32, Ty::F16, Ty::F16, Ty::F32, false).unwrap();
    let z = [0u64; 32];
    let mut d = vec![[0u64; 32]; 1];
    mma_sync(&s, &[&z], &[], &[], &mut d);
    assert_eq!(d[0], [0u64; 32]);
}

/// Random bits of a finite value of `t` with a random fraction and a modest exponent spread.
fn rand_bits(t: Ty, rng: &mut StdRng) -> u64 {
    let v = rng.gen_range(-4.0..4.0) * 2f64.powi(rng.gen_range(-4..4));
    encode(t, v, rng)
}

/// Every float form under the sm_80, sm_89 and sm_90 models, through the fragment layouts:
/// D (gathered) equals the slow integer model of `tc_numerics` per element (an f16 D is the
/// model's FP32 result rounded to nearest).
#[test]
fn hw_models_through_fragments() {
    let mut rng = StdRng::seed_from_u64(7);
    for s in forms() {
        if matches!(s.aty, Ty::S8 | Ty::U8 | Ty::F64) {
            continue;
        }
        for sm in [80, 89, 90] {
            let model = model_for(sm, s.aty).unwrap();
            let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
            let am: Vec<Vec<u64>> = (0..m)
                .map(|_| (0..k).map(|_| rand_bits(s.aty, &mut rng)).collect())
                .collect();
            let bm: Vec<Vec<u64>> = (0..n)
                .map(|_| (0..k).map(|_| rand_bits(s.bty, &mut rng)).collect())
                .collect();
            let cm: Vec<Vec<u64>> = (0..m)
                .map(|_| (0..n).map(|_| rand_bits(s.cty, &mut rng)).collect())
                .collect();
            let (na, nb, nc, nd) = s.frag_counts();
            let (mut a, mut b, mut c) = (
                vec![[0u64; 32]; na],
                vec![[0u64; 32]; nb],
                vec![[0u64; 32]; nc],
            );
            for (r, (arow, crow)) in am.iter().zip(&cm).enumerate() {
                for (kk, &bits) in arow.iter().enumerate() {
                    let (lane, slot) = a_home(&s, r, kk);
                    put(&mut a, s.aty, lane, slot, bits);
                }
                for (cc, &bits) in crow.iter().enumerate() {
                    let (lane, slot) = c_home(&s, r, cc);
                    put(&mut c, s.cty, lane, slot, bits);
                }
            }
            for (cc, bcol) in bm.iter().enumerate() {
                for (kk, &bits) in bcol.iter().enumerate() {
                    let (lane, slot) = b_home(&s, kk, cc);
                    put(&mut b, s.bty, lane, slot, bits);
                }
            }
            let mut d = vec![[0xDEAD_BEEFu64; 32]; nd];
            let ar: Vec<&Lanes> = a.iter().collect();
            let br: Vec<&Lanes> = b.iter().collect();
            let cr: Vec<&Lanes> = c.iter().collect();
            mma_sync_with(&s, Some(&model), &ar, &br, &cr, &mut d);
            for r in 0..m {
                for cc in 0..n {
                    let c32 = decode_d(s.cty, cm[r][cc]) as f32;
                    let want = reference_dot(&model, s.aty, s.bty, &am[r], &bm[cc], c32.to_bits())
                        .unwrap();
                    let want = match s.dty {
                        Ty::F16 => half::f16::from_f32(f32::from_bits(want)).to_bits() as u64,
                        _ => want as u64,
                    };
                    let (lane, slot) = c_home(&s, r, cc);
                    assert_eq!(
                        get(&d, s.dty, lane, slot),
                        want,
                        "sm_{sm} {s:?} D[{r}][{cc}]"
                    );
                }
            }
        }
    }
}

/// Exact mode, bit for bit, on inputs whose sums round (random fractions, wide exponent
/// spread): D is the f64 sum of the products in increasing k order from 0.0, plus C, rounded
/// once to f32 (the documented semantics; the fast paths must not reorder the sum).
#[test]
fn exact_mode_is_the_k_order_f64_sum() {
    let mut rng = StdRng::seed_from_u64(11);
    for s in forms() {
        if s.dty != Ty::F32 || matches!(s.aty, Ty::S8 | Ty::U8 | Ty::F64) {
            continue;
        }
        let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
        for _ in 0..5 {
            let am: Vec<Vec<u64>> = (0..m)
                .map(|_| (0..k).map(|_| rand_bits(s.aty, &mut rng)).collect())
                .collect();
            let bm: Vec<Vec<u64>> = (0..n)
                .map(|_| (0..k).map(|_| rand_bits(s.bty, &mut rng)).collect())
                .collect();
            let cm: Vec<Vec<u64>> = (0..m)
                .map(|_| (0..n).map(|_| rand_bits(s.cty, &mut rng)).collect())
                .collect();
            let (na, nb, nc, nd) = s.frag_counts();
            let (mut a, mut b, mut c) = (
                vec![[0u64; 32]; na],
                vec![[0u64; 32]; nb],
                vec![[0u64; 32]; nc],
            );
            for (r, (arow, crow)) in am.iter().zip(&cm).enumerate() {
                for (kk, &bits) in arow.iter().enumerate() {
                    let (lane, slot) = a_home(&s, r, kk);
                    put(&mut a, s.aty, lane, slot, bits);
                }
                for (cc, &bits) in crow.iter().enumerate() {
                    let (lane, slot) = c_home(&s, r, cc);
                    put(&mut c, s.cty, lane, slot, bits);
                }
            }
            for (cc, bcol) in bm.iter().enumerate() {
                for (kk, &bits) in bcol.iter().enumerate() {
                    let (lane, slot) = b_home(&s, kk, cc);
                    put(&mut b, s.bty, lane, slot, bits);
                }
            }
            let mut d = vec![[0xDEAD_BEEFu64; 32]; nd];
            let ar: Vec<&Lanes> = a.iter().collect();
            let br: Vec<&Lanes> = b.iter().collect();
            let cr: Vec<&Lanes> = c.iter().collect();
            mma_sync(&s, &ar, &br, &cr, &mut d);
            for r in 0..m {
                for cc in 0..n {
                    let mut sum = 0f64;
                    for kk in 0..k {
                        sum += emu::hopper::elem_f64(s.aty, am[r][kk])
                            * emu::hopper::elem_f64(s.bty, bm[cc][kk]);
                    }
                    sum += decode_d(s.cty, cm[r][cc]);
                    let want = (sum as f32).to_bits() as u64;
                    let (lane, slot) = c_home(&s, r, cc);
                    assert_eq!(get(&d, s.dty, lane, slot), want, "{s:?} D[{r}][{cc}]");
                }
            }
        }
    }
}
