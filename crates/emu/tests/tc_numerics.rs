//! Tensor-core numerics models ([`emu::tc_numerics`]): the published distinguishing vectors give
//! the published hardware outputs, and the fast model agrees bit for bit with the slow integer
//! reference on random inputs for every float form and architecture.

use emu::hopper::elem_f64;
use emu::tc_numerics::{dot, model_for, reference_dot, TcModel};
use ptx::Ty;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn p2(e: i32) -> f64 {
    2f64.powi(e)
}

/// D = sum a_i b_i + c under the model of `sm` for `t` inputs (the values must be exact in `t`).
fn run(sm: u32, t: Ty, a: &[f64], b: &[f64], c: f64) -> f64 {
    let m = model_for(sm, t).unwrap();
    dot(&m, a, b, c as f32) as f64
}

/// Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 7:e330
/// (2021), test suite github.com/north-numerical-computing/tensor-cores-numerical-behavior
/// (`tc_test_numerics-A100-bf16.cu`, `tc_test_numerics-T4-A100-binary16.cu`), sections B-D.
/// The paper reports for A100 (binary16 and bfloat16, binary32 accumulation): exact products,
/// binary32 accumulation, alignment to the largest term, round-down of positive and round-up of
/// negative sums, no extra bits in the alignment, no intermediate normalisation, carry-out bits.
#[test]
fn fasi_et_al_vectors_on_a100() {
    for t in [Ty::Bf16, Ty::F16] {
        let below1 = if t == Ty::Bf16 {
            1.0 - p2(-8)
        } else {
            1.0 - p2(-11)
        };
        // B: products are computed exactly
        let sq = below1 * below1;
        assert_eq!(run(80, t, &[below1], &[below1], 0.0), sq);
        assert_eq!(run(80, t, &[below1; 4], &[below1; 4], 0.0), 4.0 * sq);
        // B: products are accumulated in binary32: 1 + 4 * 2^-25 stays 1
        assert_eq!(run(80, t, &[0.5; 4], &[p2(-24); 4], 1.0), 1.0);
        // B: the sum starts from the largest element, wherever it is
        for j in 0..4 {
            let mut a = [0.5; 4];
            let mut b = [p2(-24); 4];
            (a[j], b[j]) = (1.0, 1.0);
            assert_eq!(run(80, t, &a, &b, p2(-24)), 1.0, "j = {j}");
        }
        // C: round-down for positive values, round-up for negative values
        let tail = p2(-23) + p2(-24);
        assert_eq!(run(80, t, &[1.0; 4], &[2.0, tail, 0.0, 0.0], 0.0), 2.0);
        assert_eq!(run(80, t, &[1.0; 4], &[-2.0, -tail, 0.0, 0.0], 0.0), -2.0);
        // D1: no extra bits in the alignment: 1 - (1 - 2^-24) gives 2^-23, not 2^-24
        let below1_32 = 1.0 - p2(-24);
        assert_eq!(run(80, t, &[1.0], &[1.0], -below1_32), p2(-23));
        // D2: no normalisation between the additions (1 - 2^-24 + 4 * 2^-24 -> 1 + 2^-23)
        assert_eq!(
            run(80, t, &[1.0; 4], &[p2(-24); 4], below1_32),
            1.0 + p2(-23)
        );
        // D4: carry-out bits
        for i in 0..4 {
            let mut b = [1.0; 4];
            b[i] = p2(-23);
            let c = 1.0 + p2(-22) + p2(-23);
            assert_eq!(run(80, t, &[1.0; 4], &b, c), 4.0 + p2(-21), "i = {i}");
        }
        assert_eq!(run(80, t, &[1.0; 4], &[1.0, 1.5, 1.75, 1.875], 1.875), 8.0);
        let c = 1.0 + p2(-22) + p2(-23);
        assert_eq!(run(80, t, &[1.0; 4], &[1.0; 4], c), 5.0);
        assert_eq!(run(80, t, &[1.0; 4], &[-1.0; 4], -c), -5.0);
    }
}

/// The public probes (github.com/huweim/emulation_sys, "carry propagation" method) tell the
/// architectures apart: with FP16 inputs and FP32 accumulation, two products of 2^-24 added to
/// 1.0 survive the alignment on H100 (25 aligned significand bits: 1 + 2^-23) but not on
/// A100/Ada (24 bits: 1.0); on H100 FP8 wgmma keeps 13 fraction bits, truncated.
#[test]
fn probe_vectors_tell_architectures_apart() {
    let tiny = p2(-12); // f16: 2^-12 * 2^-12 = 2^-24
    for (sm, want) in [(80, 1.0), (86, 1.0), (89, 1.0), (90, 1.0 + p2(-23))] {
        assert_eq!(
            run(sm, Ty::F16, &[tiny; 2], &[tiny; 2], 1.0),
            want,
            "sm_{sm}"
        );
    }
    // FP8 (e5m2 and e4m3): 1 + 2^-13 is kept, 1 + 2^-14 is truncated to 1.
    for t in [Ty::E5m2, Ty::E4m3] {
        for sm in [89, 90] {
            assert_eq!(run(sm, t, &[p2(-7)], &[p2(-6)], 1.0), 1.0 + p2(-13));
            assert_eq!(run(sm, t, &[p2(-7)], &[p2(-7)], 1.0), 1.0);
            // the accumulator itself holds 13 fraction bits (e8m13): C = 1 + 2^-20 loses 2^-20
            assert_eq!(run(sm, t, &[0.5], &[0.5], 1.0 + p2(-20)), 1.25);
        }
    }
    // bf16 on H100 keeps the bit A100 drops (2^-24 below the leading bit of 1.0)
    assert_eq!(run(90, Ty::Bf16, &[1.0], &[1.0], -(1.0 - p2(-24))), p2(-24));
    assert_eq!(run(80, Ty::Bf16, &[1.0], &[1.0], -(1.0 - p2(-24))), p2(-23));
}

/// A random finite encoding of `t`: half with any exponent (huge alignment shifts, subnormals,
/// flushes), half with exponents near 1.0 (cancellation and carries).
fn random_bits(t: Ty, rng: &mut StdRng) -> u64 {
    let (ebits, fbits): (u32, u32) = match t {
        Ty::F16 => (5, 10),
        Ty::Bf16 => (8, 7),
        Ty::Tf32 | Ty::F32 => (8, 23),
        Ty::E4m3 => (4, 3),
        _ => (5, 2), // e5m2
    };
    let emax = (1u64 << ebits) - 1;
    let bias = emax / 2;
    loop {
        let e = if rng.gen() {
            rng.gen_range(0..=emax)
        } else {
            rng.gen_range(bias.saturating_sub(3)..=bias + 3)
        };
        let f = rng.gen_range(0..1u64 << fbits);
        let s = rng.gen_range(0..2u64);
        let bits = (s << (ebits + fbits)) | (e << fbits) | f;
        let v = elem_f64(t, bits);
        if v.is_finite() {
            // tf32: the low 13 register bits are ignored; set them to garbage
            return if t == Ty::Tf32 {
                bits | rng.gen_range(0..0x2000)
            } else {
                bits
            };
        }
    }
}

fn cross_check(sm: u32, aty: Ty, bty: Ty, k: usize, cases: usize, seed: u64) {
    let m: TcModel = model_for(sm, aty).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    for case in 0..cases {
        let a: Vec<u64> = (0..k).map(|_| random_bits(aty, &mut rng)).collect();
        let b: Vec<u64> = (0..k).map(|_| random_bits(bty, &mut rng)).collect();
        let c = random_bits(Ty::F32, &mut rng) as u32;
        let want = reference_dot(&m, aty, bty, &a, &b, c).unwrap();
        let af: Vec<f64> = a.iter().map(|&x| elem_f64(aty, x)).collect();
        let bf: Vec<f64> = b.iter().map(|&x| elem_f64(bty, x)).collect();
        let got = dot(&m, &af, &bf, f32::from_bits(c)).to_bits();
        assert_eq!(
            got, want,
            "sm_{sm} {aty}x{bty} k={k} case {case}: fast {got:#x}, reference {want:#x}\n a={a:x?}\n b={b:x?}\n c={c:#x}"
        );
    }
}

/// Fast model == slow integer model, bit for bit, for every float input form on every modelled
/// architecture, at the k of the instructions (and a longer k that spans several blocks).
#[test]
fn fast_model_matches_integer_reference() {
    let forms: [(Ty, Ty, &[usize]); 6] = [
        (Ty::F16, Ty::F16, &[8, 16, 64]),
        (Ty::Bf16, Ty::Bf16, &[8, 16, 64]),
        (Ty::Tf32, Ty::Tf32, &[4, 8, 32]),
        (Ty::E4m3, Ty::E4m3, &[32, 64]),
        (Ty::E5m2, Ty::E5m2, &[32]),
        (Ty::E4m3, Ty::E5m2, &[32]),
    ];
    let mut seed = 1;
    for sm in [80, 86, 89, 90] {
        for (aty, bty, ks) in forms {
            for &k in ks {
                cross_check(sm, aty, bty, k, 400, seed);
                seed += 1;
            }
        }
    }
}

/// Inputs with NaN or infinity follow IEEE arithmetic (the reference declines them).
#[test]
fn specials_propagate() {
    let m = model_for(90, Ty::Bf16).unwrap();
    assert!(dot(&m, &[f64::NAN, 1.0], &[1.0, 1.0], 0.0).is_nan());
    assert_eq!(dot(&m, &[f64::INFINITY], &[2.0], 1.0), f32::INFINITY);
    assert!(dot(&m, &[f64::INFINITY, 1.0], &[1.0, f64::NEG_INFINITY], 0.0).is_nan());
    assert_eq!(
        reference_dot(&m, Ty::Bf16, Ty::Bf16, &[0x7fc0], &[0x3f80], 0),
        None
    );
}

/// The emulator's column-parallel tile path (`tile`, used by mma and wgmma) equals the integer
/// reference for every form and architecture, including all-zero columns, extreme exponents and
/// tiles with a column remainder (cols not a multiple of 8); with NaN/infinity it equals `dot`.
#[test]
fn tile_matches_reference() {
    use emu::tc_numerics::{tile, tile_baseline};
    let mut rng = StdRng::seed_from_u64(99);
    let forms = [
        (Ty::F16, 16),
        (Ty::Bf16, 32),
        (Ty::Tf32, 8),
        (Ty::E4m3, 64),
        (Ty::E5m2, 32),
    ];
    for sm in [80, 89, 90] {
        for (t, k) in forms {
            let m = model_for(sm, t).unwrap();
            let (rows, cols) = (3, 19);
            let mut bits = |zero_col: bool| -> u64 {
                if zero_col {
                    0
                } else {
                    random_bits(t, &mut rng)
                }
            };
            let a: Vec<u64> = (0..rows * k).map(|_| bits(false)).collect();
            // column 5 of B is all zero (with C = 0 below: an all-zero block)
            let b: Vec<u64> = (0..k * cols).map(|i| bits(i % cols == 5)).collect();
            let c: Vec<u32> = (0..rows * cols)
                .map(|i| {
                    if i % cols == 5 {
                        0
                    } else {
                        random_bits(Ty::F32, &mut rng) as u32
                    }
                })
                .collect();
            let af: Vec<f64> = a.iter().map(|&x| elem_f64(t, x)).collect();
            let mut bf: Vec<f64> = b.iter().map(|&x| elem_f64(t, x)).collect();
            // a NaN in column 7 and an infinity in column 11 (row 0 of B)
            bf[7] = f64::NAN;
            bf[11] = f64::INFINITY;
            let mut acc: Vec<f64> = c.iter().map(|&x| f32::from_bits(x) as f64).collect();
            // the baseline (no AVX2) build of the same code gives the same bits
            let mut base = acc.clone();
            tile(&m, &af, &bf, k, cols, &mut acc);
            tile_baseline(&m, &af, &bf, k, cols, &mut base);
            let bits = |v: &[f64]| v.iter().map(|x| (*x as f32).to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&acc),
                bits(&base),
                "sm_{sm} {t}: dispatched vs baseline"
            );
            for r in 0..rows {
                for col in 0..cols {
                    let got = (acc[r * cols + col] as f32).to_bits();
                    let ar = &a[r * k..(r + 1) * k];
                    let bc: Vec<u64> = (0..k).map(|kk| b[kk * cols + col]).collect();
                    let want = if col == 7 || col == 11 {
                        let bcf: Vec<f64> = (0..k).map(|kk| bf[kk * cols + col]).collect();
                        let arf = &af[r * k..(r + 1) * k];
                        dot(&m, arf, &bcf, f32::from_bits(c[r * cols + col])).to_bits()
                    } else {
                        reference_dot(&m, t, t, ar, &bc, c[r * cols + col]).unwrap()
                    };
                    assert_eq!(got, want, "sm_{sm} {t} k={k} D[{r}][{col}]");
                }
            }
        }
    }
}

/// The 16-row tiles of mma.sync and wgmma (the f32 kernel's shape) equal the integer reference
/// output by output for every form and architecture, with wgmma-like column counts.
#[test]
fn tile16_matches_reference() {
    use emu::tc_numerics::tile;
    let mut rng = StdRng::seed_from_u64(1616);
    let forms = [
        (Ty::F16, 16),
        (Ty::Bf16, 16),
        (Ty::Tf32, 8),
        (Ty::E4m3, 32),
        (Ty::E5m2, 32),
    ];
    for sm in [80, 89, 90] {
        for (t, k) in forms {
            let m = model_for(sm, t).unwrap();
            let (rows, cols) = (16, if sm == 90 { 40 } else { 8 });
            let a: Vec<u64> = (0..rows * k).map(|_| random_bits(t, &mut rng)).collect();
            let b: Vec<u64> = (0..k * cols).map(|_| random_bits(t, &mut rng)).collect();
            let c: Vec<u32> = (0..rows * cols)
                .map(|_| random_bits(Ty::F32, &mut rng) as u32)
                .collect();
            let af: Vec<f64> = a.iter().map(|&x| elem_f64(t, x)).collect();
            let bf: Vec<f64> = b.iter().map(|&x| elem_f64(t, x)).collect();
            let mut acc: Vec<f64> = c.iter().map(|&x| f32::from_bits(x) as f64).collect();
            tile(&m, &af, &bf, k, cols, &mut acc);
            for r in 0..rows {
                for col in 0..cols {
                    let got = (acc[r * cols + col] as f32).to_bits();
                    let bc: Vec<u64> = (0..k).map(|kk| b[kk * cols + col]).collect();
                    let ar = &a[r * k..(r + 1) * k];
                    let want = reference_dot(&m, t, t, ar, &bc, c[r * cols + col]).unwrap();
                    assert_eq!(got, want, "sm_{sm} {t} k={k} D[{r}][{col}]");
                }
            }
        }
    }
}
