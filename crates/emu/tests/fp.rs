//! Tests of `emu::fp` against references written independently of the implementation: native
//! IEEE f32/f64 arithmetic of the host, the `half` crate, neighbour search over all values of a
//! small format, and error-free transformations (TwoSum / fma residuals) for directed rounding.

use emu::fp::{self, cvt, fop, testp, CvtSpec, FMode, FOp, IRnd, Rnd, TestpKind};
use ptx::Ty;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------------------------
// Reference model of a small float format: value of every code from the textbook formula.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct RFmt {
    e: u32,
    m: u32,
    /// e4m3-style: no Inf, only all-ones is NaN
    fnuz_like: bool,
}
const RF16: RFmt = RFmt {
    e: 5,
    m: 10,
    fnuz_like: false,
};
const RBF16: RFmt = RFmt {
    e: 8,
    m: 7,
    fnuz_like: false,
};
const RE4M3: RFmt = RFmt {
    e: 4,
    m: 3,
    fnuz_like: true,
};
const RE5M2: RFmt = RFmt {
    e: 5,
    m: 2,
    fnuz_like: false,
};

/// Value of a code: Some(f64) for finite/infinite values, None for NaN.
fn ref_value(f: RFmt, code: u64) -> Option<f64> {
    let sign = if (code >> (f.e + f.m)) & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let ex = ((code >> f.m) & ((1 << f.e) - 1)) as i32;
    let man = (code & ((1 << f.m) - 1)) as f64;
    let bias = (1i32 << (f.e - 1)) - 1;
    let all_ones = (1i32 << f.e) - 1;
    if f.fnuz_like {
        if ex == all_ones && man as u64 == (1 << f.m) - 1 {
            return None;
        }
    } else if ex == all_ones {
        return if man == 0.0 {
            Some(sign * f64::INFINITY)
        } else {
            None
        };
    }
    let scale = |p: i32| 2f64.powi(p);
    Some(if ex == 0 {
        sign * man * scale(1 - bias - f.m as i32)
    } else {
        sign * (1.0 + man / scale(f.m as i32)) * scale(ex - bias)
    })
}

/// All non-negative finite codes sorted by value (code, value).
fn positive_table(f: RFmt) -> Vec<(u64, f64)> {
    let n = 1u64 << (f.e + f.m);
    let mut v: Vec<(u64, f64)> = (0..n)
        .filter_map(|c| ref_value(f, c).filter(|x| x.is_finite()).map(|x| (c, x)))
        .collect();
    v.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
    v
}

/// Reference rounding of a finite f64 `x` (exactly representable input, e.g. an f32) into `f`.
fn ref_round(f: RFmt, tab: &[(u64, f64)], x: f64, rnd: Rnd, satfinite: bool) -> u64 {
    let sbit = 1u64 << (f.e + f.m);
    let neg = x.is_sign_negative();
    let s = if neg { sbit } else { 0 };
    let ax = x.abs();
    let (max_code, max) = *tab.last().unwrap();
    let inf_code = if f.fnuz_like {
        sbit - 1
    } else {
        ((1u64 << f.e) - 1) << f.m
    };
    let over = |s: u64| -> u64 {
        let to_inf = match rnd {
            Rnd::Rn | Rnd::Rna => true,
            Rnd::Rz => false,
            Rnd::Rp => !neg,
            Rnd::Rm => neg,
        };
        if satfinite || !to_inf {
            s | max_code
        } else {
            s | inf_code
        }
    };
    if ax.is_infinite() {
        return if satfinite {
            s | max_code
        } else {
            s | inf_code
        };
    }
    // neighbours lo <= ax <= hi
    let i = tab.partition_point(|&(_, v)| v <= ax);
    let (lo_c, lo) = tab[i - 1];
    if lo == ax {
        return s | lo_c;
    }
    let (hi_c, hi) = if i < tab.len() {
        tab[i]
    } else {
        // beyond max: the next step would be max + ulp(max)
        let ulp = max - tab[tab.len() - 2].1;
        (u64::MAX, max + ulp)
    };
    let d_lo = ax - lo;
    let d_hi = hi - ax;
    let pick_hi = match rnd {
        Rnd::Rn => d_hi < d_lo || (d_hi == d_lo && (hi_c == u64::MAX || lo_c & 1 == 1)),
        Rnd::Rna => d_hi <= d_lo,
        Rnd::Rz => false,
        Rnd::Rp => !neg,
        Rnd::Rm => neg,
    };
    if pick_hi {
        if hi_c == u64::MAX {
            over(s)
        } else {
            s | hi_c
        }
    } else {
        s | lo_c
    }
}

fn spec(dst: Ty, src: Ty, rnd: Rnd) -> CvtSpec {
    CvtSpec::new(dst, src).rnd(rnd)
}

fn satf(mut s: CvtSpec) -> CvtSpec {
    s.satfinite = true;
    s
}

const RNDS: [Rnd; 5] = [Rnd::Rn, Rnd::Rz, Rnd::Rm, Rnd::Rp, Rnd::Rna];

fn random_f32_bits(rng: &mut StdRng) -> u32 {
    match rng.gen_range(0..4) {
        // anywhere
        0 => rng.gen(),
        // near the small formats' ranges
        1 => {
            let e = rng.gen_range(100u32..150);
            (rng.gen::<u32>() & 0x807F_FFFF) | (e << 23)
        }
        // few mantissa bits set: many exact ties
        2 => {
            let e = rng.gen_range(90u32..160);
            let m = (rng.gen::<u32>() & 0x7F) << rng.gen_range(0..17);
            (rng.gen::<u32>() & 0x8000_0000) | (e << 23) | (m & 0x7F_FFFF)
        }
        // subnormal f32
        _ => rng.gen::<u32>() & 0x807F_FFFF,
    }
}

// ---------------------------------------------------------------------------------------------
// Brief example vectors
// ---------------------------------------------------------------------------------------------

#[test]
fn example_vectors() {
    let a = 0.40625f32.to_bits() as u64;
    let b = 12.9f32.to_bits() as u64;
    assert_eq!(cvt(&satf(spec(Ty::E4m3x2, Ty::F32, Rnd::Rn)), a, b), 0x2D55);
    assert_eq!(cvt(&spec(Ty::Bf16x2, Ty::F32, Rnd::Rn), a, b), 0x3ED0_414E);
    assert_eq!(
        cvt(&spec(Ty::F16x2, Ty::E4m3x2, Rnd::Rn), 0x2D55, 0),
        0x3680_4A80
    );
}

// ---------------------------------------------------------------------------------------------
// Narrowing conversions from f32, every rounding mode
// ---------------------------------------------------------------------------------------------

#[test]
fn f32_to_small_formats_random() {
    let mut rng = StdRng::seed_from_u64(1);
    let cases = [
        (Ty::F16, RF16, false),
        (Ty::Bf16, RBF16, false),
        (Ty::Bf16, RBF16, true),
        (Ty::F16, RF16, true),
    ];
    for (ty, rf, sf) in cases {
        let tab = positive_table(rf);
        for _ in 0..40_000 {
            let x = f32::from_bits(random_f32_bits(&mut rng));
            if x.is_nan() {
                continue;
            }
            for rnd in RNDS {
                let mut s = spec(ty, Ty::F32, rnd);
                s.satfinite = sf;
                let got = cvt(&s, x.to_bits() as u64, 0);
                let want = ref_round(rf, &tab, x as f64, rnd, sf);
                assert_eq!(
                    got,
                    want,
                    "{ty} {rnd:?} sf={sf} x={x:e} ({:#x})",
                    x.to_bits()
                );
            }
        }
    }
}

#[test]
fn f32_to_fp8_random() {
    let mut rng = StdRng::seed_from_u64(2);
    for (ty, rf) in [(Ty::E4m3x2, RE4M3), (Ty::E5m2x2, RE5M2)] {
        let tab = positive_table(rf);
        for _ in 0..100_000 {
            let x = f32::from_bits(random_f32_bits(&mut rng));
            let y = f32::from_bits(random_f32_bits(&mut rng));
            let got = cvt(
                &satf(spec(ty, Ty::F32, Rnd::Rn)),
                x.to_bits() as u64,
                y.to_bits() as u64,
            );
            let r = |v: f32| {
                if v.is_nan() {
                    0x7F
                } else {
                    ref_round(rf, &tab, v as f64, Rnd::Rn, true)
                }
            };
            assert_eq!(got, (r(x) << 8) | r(y), "{ty} x={x:e} y={y:e}");
            // helpers agree
            if ty == Ty::E4m3x2 {
                assert_eq!(fp::f32_to_e4m3(x, true) as u64, r(x));
            } else {
                assert_eq!(fp::f32_to_e5m2(x, true) as u64, r(x));
            }
        }
    }
}

#[test]
fn fp8_special_cases() {
    let e4 = |x: f32| {
        cvt(
            &satf(spec(Ty::E4m3x2, Ty::F32, Rnd::Rn)),
            0,
            x.to_bits() as u64,
        )
    };
    let e5 = |x: f32| {
        cvt(
            &satf(spec(Ty::E5m2x2, Ty::F32, Rnd::Rn)),
            0,
            x.to_bits() as u64,
        )
    };
    assert_eq!(e4(448.0), 0x7E);
    assert_eq!(e4(1e9), 0x7E);
    assert_eq!(e4(-1e9), 0xFE);
    assert_eq!(e4(f32::INFINITY), 0x7E);
    assert_eq!(e4(f32::NEG_INFINITY), 0xFE);
    assert_eq!(e4(f32::NAN), 0x7F);
    assert_eq!(e4(2f32.powi(-9)), 0x01); // min subnormal
    assert_eq!(e4(2f32.powi(-10)), 0x00); // tie to even -> 0
    assert_eq!(e4(1.5 * 2f32.powi(-10)), 0x01);
    assert_eq!(e4(-0.0), 0x80);
    assert_eq!(e5(57344.0), 0x7B);
    assert_eq!(e5(1e9), 0x7B);
    assert_eq!(e5(f32::INFINITY), 0x7B);
    assert_eq!(e5(f32::NAN), 0x7F);
    assert_eq!(e5(2f32.powi(-16)), 0x01);
    // non-satfinite helpers: e5m2 overflow -> Inf, e4m3 overflow -> NaN
    assert_eq!(fp::f32_to_e5m2(1e9, false), 0x7C);
    assert_eq!(fp::f32_to_e4m3(1e9, false), 0x7F);
    assert_eq!(fp::f32_to_e4m3(-1e9, false), 0xFF);
    // relu
    let mut s = satf(spec(Ty::E4m3x2, Ty::F32, Rnd::Rn));
    s.relu = true;
    assert_eq!(
        cvt(&s, (-3.0f32).to_bits() as u64, 3.0f32.to_bits() as u64),
        0x0044
    );
    assert_eq!(cvt(&s, f32::NAN.to_bits() as u64, 0), 0x7F00);
}

// ---------------------------------------------------------------------------------------------
// Exhaustive: all 16-bit and 8-bit codes
// ---------------------------------------------------------------------------------------------

#[test]
fn exhaustive_f16_bf16_widening() {
    for code in 0u64..65536 {
        for (ty, rf) in [(Ty::F16, RF16), (Ty::Bf16, RBF16)] {
            let got = cvt(&spec(Ty::F32, ty, Rnd::Rn), code, 0) as u32;
            let got64 = cvt(&spec(Ty::F64, ty, Rnd::Rn), code, 0);
            match ref_value(rf, code) {
                Some(v) => {
                    assert_eq!(f32::from_bits(got) as f64, v, "{ty} {code:#x}");
                    assert_eq!(got.to_bits_sign(), v.is_sign_negative(), "{ty} {code:#x}");
                    assert_eq!(f64::from_bits(got64), v, "{ty} {code:#x}");
                }
                None => {
                    assert!(f32::from_bits(got).is_nan(), "{ty} {code:#x}");
                    assert!(f64::from_bits(got64).is_nan());
                }
            }
            // the half crate agrees on every non-NaN value
            if ty == Ty::F16 {
                let h = half::f16::from_bits(code as u16);
                if !h.is_nan() {
                    assert_eq!(got, h.to_f32().to_bits());
                    assert_eq!(fp::f16_to_f32(code as u16).to_bits(), got);
                }
            } else {
                let h = half::bf16::from_bits(code as u16);
                if !h.is_nan() {
                    assert_eq!(got, h.to_f32().to_bits());
                    assert_eq!(fp::bf16_to_f32(code as u16).to_bits(), got);
                }
            }
        }
    }
}

trait SignBit {
    fn to_bits_sign(self) -> bool;
}
impl SignBit for u32 {
    fn to_bits_sign(self) -> bool {
        self >> 31 == 1
    }
}

#[test]
fn exhaustive_f16_bf16_roundtrip_and_to_fp8() {
    let t43 = positive_table(RE4M3);
    let t52 = positive_table(RE5M2);
    let t16 = positive_table(RF16);
    for code in 0u64..65536 {
        // f16 -> f32 -> f16 is the identity on non-NaN codes, and f16 -> bf16 vs reference
        let v = ref_value(RF16, code);
        let f32b = cvt(&spec(Ty::F32, Ty::F16, Rnd::Rn), code, 0);
        let back = cvt(&spec(Ty::F16, Ty::F32, Rnd::Rn), f32b, 0);
        match v {
            Some(_) => assert_eq!(back, code),
            None => assert_eq!(back, 0x7FFF),
        }
        // f16x2 -> e4m3x2 / e5m2x2 (satfinite), both halves
        let packed = (code << 16) | (code ^ 0x8000);
        for (ty, tab, rf) in [(Ty::E4m3x2, &t43, RE4M3), (Ty::E5m2x2, &t52, RE5M2)] {
            let got = cvt(&satf(spec(ty, Ty::F16x2, Rnd::Rn)), packed, 0);
            let r = |c: u64| match ref_value(RF16, c) {
                None => 0x7F,
                Some(x) => ref_round(rf, tab, x, Rnd::Rn, true),
            };
            assert_eq!(got, (r(code) << 8) | r(code ^ 0x8000), "{ty} {code:#x}");
        }
        // bf16 -> f16 rounding
        if let Some(x) = ref_value(RBF16, code) {
            if code % 97 == 0 {
                for rnd in RNDS {
                    let got = cvt(&spec(Ty::F16, Ty::Bf16, rnd), code, 0);
                    assert_eq!(
                        got,
                        ref_round(RF16, &t16, x, rnd, false),
                        "bf16->f16 {code:#x} {rnd:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn exhaustive_fp8_decode() {
    for code in 0u64..256 {
        for (ty, rf, f) in [
            (Ty::E4m3x2, RE4M3, fp::e4m3_to_f32 as fn(u8) -> f32),
            (Ty::E5m2x2, RE5M2, fp::e5m2_to_f32 as fn(u8) -> f32),
        ] {
            let got = cvt(
                &spec(Ty::F16x2, ty, Rnd::Rn),
                (code << 8) | (code ^ 0x80),
                0,
            );
            let (hi, lo) = (got >> 16, got & 0xFFFF);
            for (half_bits, c) in [(hi, code), (lo, code ^ 0x80)] {
                let h = half::f16::from_bits(half_bits as u16);
                match ref_value(rf, c) {
                    Some(v) => {
                        assert_eq!(h.to_f64(), v, "{ty} {c:#x}");
                        assert_eq!(h.is_sign_negative(), v.is_sign_negative());
                        assert_eq!(f(c as u8) as f64, v);
                    }
                    None => {
                        assert!(h.is_nan(), "{ty} {c:#x}");
                        assert!(f(c as u8).is_nan());
                    }
                }
            }
            // relu on unpack: negatives -> +0, NaN -> canonical
            let mut s = spec(Ty::F16x2, ty, Rnd::Rn);
            s.relu = true;
            let got = cvt(&s, code, 0) & 0xFFFF;
            match ref_value(rf, code) {
                Some(v) if v < 0.0 || (v == 0.0 && v.is_sign_negative()) => assert_eq!(got, 0),
                Some(v) => assert_eq!(half::f16::from_bits(got as u16).to_f64(), v),
                None => assert_eq!(got, 0x7FFF),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// half crate, tf32, f64 <-> f32
// ---------------------------------------------------------------------------------------------

#[test]
fn f32_to_f16_bf16_vs_half_crate() {
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..200_000 {
        let x = f32::from_bits(random_f32_bits(&mut rng));
        if x.is_nan() {
            assert_eq!(fp::f32_to_f16_rn(x), 0x7FFF);
            assert_eq!(fp::f32_to_bf16_rn(x), 0x7FFF);
            continue;
        }
        assert_eq!(
            fp::f32_to_f16_rn(x),
            half::f16::from_f32(x).to_bits(),
            "{x:e}"
        );
        assert_eq!(
            fp::f32_to_bf16_rn(x),
            half::bf16::from_f32(x).to_bits(),
            "{x:e}"
        );
    }
}

#[test]
fn tf32_rna() {
    let mut rng = StdRng::seed_from_u64(4);
    for _ in 0..200_000 {
        let bits = random_f32_bits(&mut rng);
        let x = f32::from_bits(bits);
        let got = fp::f32_to_tf32_rna(x);
        if x.is_nan() {
            assert!(f32::from_bits(got).is_nan());
            continue;
        }
        // ties away: add half of the dropped range to the magnitude, truncate (carries into the
        // exponent and to Inf by themselves)
        let want = if x.is_infinite() {
            bits
        } else {
            bits.wrapping_add(0x1000) & !0x1FFF
        };
        assert_eq!(got, want, "{x:e} {bits:#x}");
    }
    assert_eq!(
        fp::f32_to_tf32_rna(1.0 + 2f32.powi(-11)),
        (1.0f32 + 2f32.powi(-10)).to_bits()
    );
}

/// Next representable f32 above / below (finite x).
fn next_up(x: f32) -> f32 {
    if x.is_nan() || x == f32::INFINITY {
        return x;
    }
    if x == 0.0 {
        return f32::from_bits(1);
    }
    let b = x.to_bits();
    f32::from_bits(if x > 0.0 { b + 1 } else { b - 1 })
}
fn next_down(x: f32) -> f32 {
    -next_up(-x)
}
fn next_up64(x: f64) -> f64 {
    if x.is_nan() || x == f64::INFINITY {
        return x;
    }
    if x == 0.0 {
        return f64::from_bits(1);
    }
    let b = x.to_bits();
    f64::from_bits(if x > 0.0 { b + 1 } else { b - 1 })
}
fn next_down64(x: f64) -> f64 {
    -next_up64(-x)
}

/// Directed rounding of `exact = hi + tail` (tail = residual sign only) to f32 from an f64.
fn directed_f32(v: f64, tail_sign: f64, rnd: Rnd) -> f32 {
    // RN to f32, then adjust using the exact relation with v (+ tail)
    let r = v as f32;
    let rv = r as f64;
    let cmp = if rv == v {
        tail_sign.partial_cmp(&0.0).unwrap().reverse() // r vs exact
    } else {
        rv.partial_cmp(&v).unwrap()
    };
    use std::cmp::Ordering::*;
    match (rnd, cmp) {
        (_, Equal) | (Rnd::Rn, _) => r,
        (Rnd::Rp, Less) => next_up(r),
        (Rnd::Rm, Greater) => next_down(r),
        (Rnd::Rz, Greater) if v > 0.0 => next_down(r),
        (Rnd::Rz, Less) if v < 0.0 => next_up(r),
        _ => r,
    }
}

#[test]
fn f64_to_f32_all_modes() {
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..200_000 {
        let e = rng.gen_range(1023 - 160..1023 + 140u64);
        let bits = (rng.gen::<u64>() & 0x800F_FFFF_FFFF_FFFF) | (e << 52);
        let x = f64::from_bits(bits);
        for rnd in [Rnd::Rn, Rnd::Rz, Rnd::Rm, Rnd::Rp] {
            let got = cvt(&spec(Ty::F32, Ty::F64, rnd), bits, 0) as u32;
            let mut want = directed_f32(x, 0.0, rnd);
            // overflow handling of the reference: `as f32` gives Inf, directed modes clamp
            if want.is_infinite() && x.abs() < f64::INFINITY {
                let toward_inf = match rnd {
                    Rnd::Rn => true,
                    Rnd::Rz => false,
                    Rnd::Rp => x > 0.0,
                    Rnd::Rm => x < 0.0,
                    Rnd::Rna => true,
                };
                if !toward_inf {
                    want = f32::MAX.copysign(x as f32);
                }
            }
            assert_eq!(got, want.to_bits(), "{x:e} {rnd:?}");
        }
    }
    // NaN narrows to the canonical NaN; f32 -> f64 keeps the payload, quieted
    assert_eq!(
        cvt(&spec(Ty::F32, Ty::F64, Rnd::Rn), f64::NAN.to_bits(), 0),
        0x7FFF_FFFF
    );
    assert_eq!(
        cvt(&spec(Ty::F64, Ty::F32, Rnd::Rn), 0xFF80_0001, 0),
        0xFFF8_0000_2000_0000
    );
}

// ---------------------------------------------------------------------------------------------
// ftz / sat / relu / satfinite / integer rounding on cvt
// ---------------------------------------------------------------------------------------------

#[test]
fn cvt_modifiers() {
    let sub = f32::from_bits(0x0000_0123);
    let nsub = f32::from_bits(0x8000_0123);
    let mut s = spec(Ty::F32, Ty::F32, Rnd::Rn);
    s.ftz = true;
    assert_eq!(cvt(&s, sub.to_bits() as u64, 0), 0);
    assert_eq!(cvt(&s, nsub.to_bits() as u64, 0), 0x8000_0000);
    // f64 -> f32 ftz flushes a subnormal result
    let mut s = spec(Ty::F32, Ty::F64, Rnd::Rn);
    assert_eq!(
        cvt(&s, 1e-40f64.to_bits(), 0),
        (1e-40f64 as f32).to_bits() as u64
    );
    s.ftz = true;
    assert_eq!(cvt(&s, 1e-40f64.to_bits(), 0), 0);
    assert_eq!(cvt(&s, (-1e-40f64).to_bits(), 0), 0x8000_0000);
    // .sat to [0, 1]
    let mut s = spec(Ty::F16, Ty::F32, Rnd::Rn);
    s.sat = true;
    let f = |x: f32| cvt(&s, x.to_bits() as u64, 0);
    assert_eq!(f(2.0), 0x3C00);
    assert_eq!(f(-2.0), 0);
    assert_eq!(f(-0.0), 0);
    assert_eq!(f(f32::NAN), 0);
    assert_eq!(f(f32::INFINITY), 0x3C00);
    assert_eq!(f(0.5), 0x3800);
    // relu
    let mut s = spec(Ty::Bf16, Ty::F32, Rnd::Rn);
    s.relu = true;
    assert_eq!(cvt(&s, (-5.0f32).to_bits() as u64, 0), 0);
    assert_eq!(cvt(&s, f32::NAN.to_bits() as u64, 0), 0x7FFF);
    assert_eq!(cvt(&s, 5.0f32.to_bits() as u64, 0), 0x40A0);
    // bf16 overflow -> Inf, satfinite -> max
    let s = spec(Ty::Bf16, Ty::F32, Rnd::Rn);
    assert_eq!(cvt(&s, f32::MAX.to_bits() as u64, 0), 0x7F80);
    assert_eq!(cvt(&satf(s), f32::MAX.to_bits() as u64, 0), 0x7F7F);
    assert_eq!(cvt(&satf(s), f32::NEG_INFINITY.to_bits() as u64, 0), 0xFF7F);
    assert_eq!(cvt(&satf(s), f32::NAN.to_bits() as u64, 0), 0x7FFF);
    // f16 round-to-integer forms
    let one_half = 0x3E00u64; // 1.5
    let r = |ir: IRnd, x: u64| cvt(&CvtSpec::new(Ty::F16, Ty::F16).irnd(ir), x, 0);
    assert_eq!(r(IRnd::Rni, one_half), 0x4000);
    assert_eq!(r(IRnd::Rzi, one_half), 0x3C00);
    assert_eq!(r(IRnd::Rmi, 0xBE00), 0xC000);
    assert_eq!(r(IRnd::Rpi, 0xBA00), 0x8000); // ceil(-0.75) = -0
    assert_eq!(r(IRnd::Rni, 0x3C01 + 0x0400), 0x4000); // 2.001 -> 2
}

#[test]
fn cvt_float_rounding_to_integral() {
    let mut rng = StdRng::seed_from_u64(6);
    for _ in 0..100_000 {
        let e = rng.gen_range(100u32..170);
        let bits = (rng.gen::<u32>() & 0x807F_FFFF) | (e << 23);
        let x = f32::from_bits(bits);
        for (ir, want) in [
            (IRnd::Rni, x.round_ties_even()),
            (IRnd::Rzi, x.trunc()),
            (IRnd::Rmi, x.floor()),
            (IRnd::Rpi, x.ceil()),
        ] {
            let got = cvt(&CvtSpec::new(Ty::F32, Ty::F32).irnd(ir), bits as u64, 0);
            assert_eq!(got, want.to_bits() as u64, "{x:e} {ir:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Integer conversions
// ---------------------------------------------------------------------------------------------

fn ref_int_range(t: Ty) -> (f64, f64) {
    match t {
        Ty::S8 => (-128.0, 127.0),
        Ty::U8 => (0.0, 255.0),
        Ty::S16 => (-32768.0, 32767.0),
        Ty::U16 => (0.0, 65535.0),
        Ty::S32 => (-2147483648.0, 2147483647.0),
        Ty::U32 => (0.0, 4294967295.0),
        Ty::S64 => (-9223372036854775808.0, 9223372036854775807.0),
        _ => (0.0, 18446744073709551615.0),
    }
}

#[test]
fn float_to_int_saturating() {
    let mut rng = StdRng::seed_from_u64(7);
    let ints = [
        Ty::S8,
        Ty::U8,
        Ty::S16,
        Ty::U16,
        Ty::S32,
        Ty::U32,
        Ty::S64,
        Ty::U64,
    ];
    for _ in 0..50_000 {
        let e = rng.gen_range(0u64..2047);
        let bits = (rng.gen::<u64>() & 0x800F_FFFF_FFFF_FFFF) | ((e.min(1023 + 70)) << 52);
        let x = f64::from_bits(bits);
        for &t in &ints {
            for (ir, r) in [
                (IRnd::Rni, x.round_ties_even()),
                (IRnd::Rzi, x.trunc()),
                (IRnd::Rmi, x.floor()),
                (IRnd::Rpi, x.ceil()),
            ] {
                let got = cvt(&CvtSpec::new(t, Ty::F64).irnd(ir), bits, 0);
                let (lo, hi) = ref_int_range(t);
                let w = t.bits();
                let want = if r <= lo {
                    if t.is_signed() {
                        1u64 << (w - 1)
                    } else {
                        0
                    }
                } else if r >= hi {
                    if t.is_signed() {
                        (1u64 << (w - 1)) - 1
                    } else if w == 64 {
                        u64::MAX
                    } else {
                        (1u64 << w) - 1
                    }
                } else if r < 0.0 {
                    let m = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
                    (((-r) as u64).wrapping_neg()) & m
                } else {
                    r as u64
                };
                assert_eq!(got, want, "{x:e} -> {t} {ir:?}");
            }
        }
    }
    let nan = f32::NAN.to_bits() as u64;
    assert_eq!(
        cvt(&CvtSpec::new(Ty::S32, Ty::F32).irnd(IRnd::Rni), nan, 0),
        0
    );
    assert_eq!(
        cvt(&CvtSpec::new(Ty::U8, Ty::F16).irnd(IRnd::Rni), 0x7C00, 0),
        255
    );
    assert_eq!(
        cvt(&CvtSpec::new(Ty::S8, Ty::F16).irnd(IRnd::Rni), 0xFC00, 0),
        0x80
    );
    // subnormal input with .rpi: 1 without ftz, 0 with ftz
    let mut s = CvtSpec::new(Ty::S32, Ty::F32).irnd(IRnd::Rpi);
    assert_eq!(cvt(&s, 1, 0), 1);
    s.ftz = true;
    assert_eq!(cvt(&s, 1, 0), 0);
}

#[test]
fn int_to_float_all_modes() {
    let mut rng = StdRng::seed_from_u64(8);
    for _ in 0..100_000 {
        let v: i64 = rng.gen::<i64>() >> rng.gen_range(0..63);
        // RN against the host's `as` conversions
        assert_eq!(
            cvt(&spec(Ty::F32, Ty::S64, Rnd::Rn), v as u64, 0),
            (v as f32).to_bits() as u64
        );
        assert_eq!(
            cvt(&spec(Ty::F64, Ty::S64, Rnd::Rn), v as u64, 0),
            (v as f64).to_bits()
        );
        let u = v as u64;
        assert_eq!(
            cvt(&spec(Ty::F32, Ty::U64, Rnd::Rn), u, 0),
            (u as f32).to_bits() as u64
        );
        // directed, via the exact difference in i128
        for rnd in [Rnd::Rz, Rnd::Rm, Rnd::Rp] {
            let got = f32::from_bits(cvt(&spec(Ty::F32, Ty::S64, rnd), v as u64, 0) as u32);
            let r = v as f32;
            let diff = r as i128 - v as i128; // r - exact
            let want = match rnd {
                Rnd::Rp if diff < 0 => next_up(r),
                Rnd::Rm if diff > 0 => next_down(r),
                Rnd::Rz if diff > 0 && v > 0 => next_down(r),
                Rnd::Rz if diff < 0 && v < 0 => next_up(r),
                _ => r,
            };
            assert_eq!(got, want, "{v} {rnd:?}");
        }
        // 32-bit source: only the low 32 bits count, sign-extended
        let w = v as u64 | 0xDEAD_0000_0000_0000;
        assert_eq!(
            cvt(&spec(Ty::F32, Ty::S32, Rnd::Rn), w, 0),
            (v as i32 as f32).to_bits() as u64
        );
        assert_eq!(
            cvt(&spec(Ty::F16, Ty::U16, Rnd::Rn), w, 0),
            half::f16::from_f32(v as u16 as f32).to_bits() as u64
        );
    }
}

#[test]
fn int_to_int() {
    let c = |d: Ty, s: Ty, sat: bool, a: u64| {
        let mut sp = CvtSpec::new(d, s);
        sp.sat = sat;
        cvt(&sp, a, 0)
    };
    assert_eq!(c(Ty::S32, Ty::S8, false, 0xFF), 0xFFFF_FFFF);
    assert_eq!(c(Ty::U32, Ty::U8, false, 0x1FF), 0xFF);
    assert_eq!(
        c(Ty::S64, Ty::S32, false, 0x8000_0000),
        0xFFFF_FFFF_8000_0000
    );
    assert_eq!(c(Ty::U64, Ty::U32, false, 0x8000_0000), 0x8000_0000);
    assert_eq!(c(Ty::S8, Ty::S32, false, 0x1234_5680), 0x80);
    assert_eq!(c(Ty::S8, Ty::S32, true, 0x1234_5680), 0x7F);
    assert_eq!(c(Ty::S8, Ty::S32, true, (-1000i32) as u32 as u64), 0x80);
    assert_eq!(c(Ty::U8, Ty::S32, true, (-5i32) as u32 as u64), 0);
    assert_eq!(c(Ty::U32, Ty::S64, true, u64::MAX), 0);
    assert_eq!(c(Ty::S32, Ty::U32, true, 0xFFFF_FFFF), 0x7FFF_FFFF);
    assert_eq!(c(Ty::U64, Ty::S64, true, u64::MAX), 0);
    assert_eq!(c(Ty::S64, Ty::U64, true, u64::MAX), i64::MAX as u64);
    assert_eq!(c(Ty::U16, Ty::S8, false, 0x80), 0xFF80);
}

// ---------------------------------------------------------------------------------------------
// Arithmetic
// ---------------------------------------------------------------------------------------------

fn m(rnd: Rnd) -> FMode {
    FMode {
        rnd,
        ..FMode::default()
    }
}

fn same_f32(got: u64, want: f32) -> bool {
    if want.is_nan() {
        got == 0x7FFF_FFFF
    } else {
        got == want.to_bits() as u64
    }
}

#[test]
fn f32_rn_vs_host() {
    let mut rng = StdRng::seed_from_u64(9);
    for _ in 0..300_000 {
        let (a, b, c) = (
            f32::from_bits(random_f32_bits(&mut rng)),
            f32::from_bits(random_f32_bits(&mut rng)),
            f32::from_bits(random_f32_bits(&mut rng)),
        );
        let (ab, bb, cb) = (a.to_bits() as u64, b.to_bits() as u64, c.to_bits() as u64);
        let f = |op| fop(op, Ty::F32, m(Rnd::Rn), ab, bb, cb);
        assert!(same_f32(f(FOp::Add), a + b), "{a:e} + {b:e}");
        assert!(same_f32(f(FOp::Sub), a - b), "{a:e} - {b:e}");
        assert!(same_f32(f(FOp::Mul), a * b), "{a:e} * {b:e}");
        assert!(same_f32(f(FOp::Div), a / b), "{a:e} / {b:e}");
        assert!(
            same_f32(f(FOp::Fma), a.mul_add(b, c)),
            "fma {a:e} {b:e} {c:e}"
        );
        assert!(same_f32(f(FOp::Sqrt), a.sqrt()), "sqrt {a:e}");
        assert!(same_f32(f(FOp::Rcp), 1.0 / a), "rcp {a:e}");
    }
}

#[test]
fn f64_rn_vs_host() {
    let mut rng = StdRng::seed_from_u64(10);
    let r64 = |rng: &mut StdRng| -> f64 {
        match rng.gen_range(0..3) {
            0 => f64::from_bits(rng.gen()),
            1 => f64::from_bits(
                (rng.gen::<u64>() & 0x800F_FFFF_FFFF_FFFF) | (rng.gen_range(1000u64..1050) << 52),
            ),
            _ => f64::from_bits(rng.gen::<u64>() & 0x800F_FFFF_FFFF_FFFF),
        }
    };
    for _ in 0..300_000 {
        let (a, b, c) = (r64(&mut rng), r64(&mut rng), r64(&mut rng));
        let f = |op| {
            fop(
                op,
                Ty::F64,
                m(Rnd::Rn),
                a.to_bits(),
                b.to_bits(),
                c.to_bits(),
            )
        };
        let chk = |got: u64, want: f64, what: &str| {
            if want.is_nan() {
                assert_eq!(got, 0x7FFF_FFFF_FFFF_FFFF, "{what}");
            } else {
                assert_eq!(got, want.to_bits(), "{what} a={a:e} b={b:e} c={c:e}");
            }
        };
        chk(f(FOp::Add), a + b, "add");
        chk(f(FOp::Mul), a * b, "mul");
        chk(f(FOp::Div), a / b, "div");
        chk(f(FOp::Fma), a.mul_add(b, c), "fma");
        chk(f(FOp::Sqrt), a.sqrt(), "sqrt");
    }
}

/// f32 directed rounding: the f64 result plus the sign of its exact residual decides.
#[test]
fn f32_directed_modes() {
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..200_000 {
        let gen = |rng: &mut StdRng| {
            let e = rng.gen_range(60u32..190);
            f32::from_bits((rng.gen::<u32>() & 0x807F_FFFF) | (e << 23))
        };
        let (a, b) = (gen(&mut rng), gen(&mut rng));
        let (x, y) = (a as f64, b as f64);
        // TwoSum residual
        let s = x + y;
        let bb = s - x;
        let err_add = (x - (s - bb)) + (y - bb);
        let p = x * y; // exact
        let q = x / y;
        let err_div = -q.mul_add(y, -x); // x - q*y, exact; sign of (exact - q) is sign(err)*sign(y)
        let sq = x.abs().sqrt();
        let err_sqrt = -sq.mul_add(sq, -x.abs());
        for rnd in [Rnd::Rn, Rnd::Rz, Rnd::Rm, Rnd::Rp] {
            let g = |op, u: f32, v: f32| {
                f32::from_bits(fop(
                    op,
                    Ty::F32,
                    m(rnd),
                    u.to_bits() as u64,
                    v.to_bits() as u64,
                    0,
                ) as u32)
            };
            assert_eq!(
                g(FOp::Add, a, b),
                directed_f32(s, err_add, rnd),
                "{a:e}+{b:e} {rnd:?}"
            );
            assert_eq!(
                g(FOp::Mul, a, b),
                directed_f32(p, 0.0, rnd),
                "{a:e}*{b:e} {rnd:?}"
            );
            assert_eq!(
                g(FOp::Div, a, b),
                directed_f32(q, err_div * y.signum(), rnd),
                "{a:e}/{b:e} {rnd:?}"
            );
            let sa = a.abs();
            assert_eq!(
                g(FOp::Sqrt, sa, 0.0),
                directed_f32(sq, err_sqrt, rnd),
                "sqrt {sa:e} {rnd:?}"
            );
        }
    }
}

/// f64 directed rounding via TwoSum / TwoProd residuals.
#[test]
fn f64_directed_modes() {
    let mut rng = StdRng::seed_from_u64(12);
    let pick = |s: f64, err: f64, rnd: Rnd| -> f64 {
        use Rnd::*;
        if err == 0.0 {
            return s;
        }
        match rnd {
            Rp if err > 0.0 => next_up64(s),
            Rm if err < 0.0 => next_down64(s),
            Rz if err < 0.0 && s > 0.0 => next_down64(s),
            Rz if err > 0.0 && s < 0.0 => next_up64(s),
            _ => s,
        }
    };
    for _ in 0..200_000 {
        let gen = |rng: &mut StdRng| {
            let e = rng.gen_range(900u64..1150);
            f64::from_bits((rng.gen::<u64>() & 0x800F_FFFF_FFFF_FFFF) | (e << 52))
        };
        let (a, b, c) = (gen(&mut rng), gen(&mut rng), gen(&mut rng));
        let s = a + b;
        let bb = s - a;
        let err = (a - (s - bb)) + (b - bb);
        let p = a * b;
        let perr = a.mul_add(b, -p);
        for rnd in [Rnd::Rz, Rnd::Rm, Rnd::Rp] {
            let g = |op| {
                f64::from_bits(fop(
                    op,
                    Ty::F64,
                    m(rnd),
                    a.to_bits(),
                    b.to_bits(),
                    c.to_bits(),
                ))
            };
            assert_eq!(g(FOp::Add), pick(s, err, rnd), "{a:e}+{b:e} {rnd:?}");
            assert_eq!(g(FOp::Mul), pick(p, perr, rnd), "{a:e}*{b:e} {rnd:?}");
            // fma with c = 0 is the product
            let g0 = f64::from_bits(fop(FOp::Fma, Ty::F64, m(rnd), a.to_bits(), b.to_bits(), 0));
            assert_eq!(g0, pick(p, perr, rnd), "fma0 {a:e}*{b:e} {rnd:?}");
        }
    }
}

#[test]
fn f16_bf16_arith_and_packed() {
    let mut rng = StdRng::seed_from_u64(13);
    for _ in 0..100_000 {
        let (a, b, c): (u16, u16, u16) = (rng.gen(), rng.gen(), rng.gen());
        for (ty, to32, from32) in [
            (
                Ty::F16,
                fp::f16_to_f32 as fn(u16) -> f32,
                fp::f32_to_f16_rn as fn(f32) -> u16,
            ),
            (Ty::Bf16, fp::bf16_to_f32, fp::f32_to_bf16_rn),
        ] {
            let (x, y, z) = (to32(a) as f64, to32(b) as f64, to32(c) as f64);
            // reference: exact result as (f64, residual), round-to-odd to 53 then 24 bits, then
            // round to nearest 16-bit (round-to-odd with >= p+2 bits avoids double rounding)
            let f = |op| fop(op, ty, m(Rnd::Rn), a as u64, b as u64, c as u64);
            let want = |s: f64, err: f64| -> u64 {
                if s.is_nan() {
                    0x7FFF
                } else {
                    ro24_then(ro64(s, err), from32)
                }
            };
            let (s, e) = two_sum(x, y);
            assert_eq!(f(FOp::Add), want(s, e), "{ty} {a:#x}+{b:#x}");
            assert_eq!(f(FOp::Mul), want(x * y, 0.0), "{ty} {a:#x}*{b:#x}");
            let (s, e) = two_sum(x * y, z); // the product is exact in f64
            assert_eq!(f(FOp::Fma), want(s, e), "{ty} fma {a:#x} {b:#x} {c:#x}");
            // packed: element i of the result is the scalar op on element i
            let tx2 = if ty == Ty::F16 { Ty::F16x2 } else { Ty::Bf16x2 };
            let pa = ((b as u64) << 16) | a as u64;
            let pb = ((a as u64) << 16) | c as u64;
            let got = fop(FOp::Mul, tx2, m(Rnd::Rn), pa, pb, 0);
            assert_eq!(
                got & 0xFFFF,
                fop(FOp::Mul, ty, m(Rnd::Rn), a as u64, c as u64, 0)
            );
            assert_eq!(
                got >> 16,
                fop(FOp::Mul, ty, m(Rnd::Rn), b as u64, a as u64, 0)
            );
        }
    }
}

fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    if !s.is_finite() {
        return (s, 0.0);
    }
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// Round-to-odd of `s + err` to f64 (`s` = RN of the exact value, `err` the exact residual).
fn ro64(s: f64, err: f64) -> f64 {
    if err == 0.0 || !s.is_finite() || s.to_bits() & 1 == 1 {
        return s;
    }
    let up = (err > 0.0) == (s > 0.0); // magnitude increases
    f64::from_bits(if up { s.to_bits() + 1 } else { s.to_bits() - 1 })
}

/// Round-to-odd to f32, then the given round-to-nearest 16-bit conversion.
fn ro24_then(v: f64, from32: fn(f32) -> u16) -> u64 {
    let r = v as f32;
    if !v.is_finite() || r as f64 == v {
        return from32(r) as u64;
    }
    let t = if (r as f64).abs() > v.abs() {
        f32::from_bits(r.to_bits() - 1)
    } else {
        r
    };
    from32(f32::from_bits(t.to_bits() | 1)) as u64
}

#[test]
fn ftz_sat_relu_minmax() {
    let sub = 0x0000_0001u64;
    let nsub = 0x8000_0001u64;
    let one = 1f32.to_bits() as u64;
    let ftz = FMode {
        ftz: true,
        ..FMode::default()
    };
    // inputs flushed
    assert_eq!(fop(FOp::Add, Ty::F32, ftz, sub, 0, 0), 0);
    assert_eq!(fop(FOp::Mul, Ty::F32, ftz, nsub, one, 0), 0x8000_0000);
    assert_eq!(fop(FOp::Mul, Ty::F32, FMode::default(), nsub, one, 0), nsub);
    // outputs flushed
    let tiny = 2f32.powi(-100).to_bits() as u64;
    assert_eq!(fop(FOp::Mul, Ty::F32, ftz, tiny, tiny, 0), 0);
    let small = 2f32.powi(-70).to_bits() as u64;
    let neg_small = (-2f32.powi(-70)).to_bits() as u64;
    assert_eq!(
        fop(FOp::Mul, Ty::F32, ftz, small, neg_small, 0),
        0x8000_0000
    );
    assert_eq!(
        fop(FOp::Mul, Ty::F32, FMode::default(), small, neg_small, 0),
        (-2f32.powi(-140)).to_bits() as u64
    );
    // f16 ftz
    let f16ftz = FMode {
        ftz: true,
        ..FMode::default()
    };
    assert_eq!(fop(FOp::Add, Ty::F16, f16ftz, 0x0001, 0x0001, 0), 0);
    assert_eq!(
        fop(FOp::Add, Ty::F16, FMode::default(), 0x0001, 0x0001, 0),
        0x0002
    );
    // bf16 and f64 ignore ftz
    assert_eq!(fop(FOp::Add, Ty::Bf16, f16ftz, 0x0001, 0x0001, 0), 0x0002);
    assert_eq!(fop(FOp::Add, Ty::F64, f16ftz, 1, 1, 0), 2);
    // sat
    let sat = FMode {
        sat: true,
        ..FMode::default()
    };
    let f = |x: f32| fop(FOp::Add, Ty::F32, sat, x.to_bits() as u64, 0, 0);
    assert_eq!(f(2.0), one);
    assert_eq!(f(-2.0), 0);
    assert_eq!(f(0.25), 0.25f32.to_bits() as u64);
    assert_eq!(
        fop(
            FOp::Add,
            Ty::F32,
            sat,
            f32::INFINITY.to_bits() as u64,
            f32::NEG_INFINITY.to_bits() as u64,
            0
        ),
        0
    );
    // relu (fma.relu.f16 / bf16)
    let relu = FMode {
        relu: true,
        ..FMode::default()
    };
    assert_eq!(fop(FOp::Fma, Ty::F16, relu, 0x3C00, 0xC000, 0x3C00), 0); // 1*-2+1 = -1 -> 0
    assert_eq!(fop(FOp::Fma, Ty::F16, relu, 0x3C00, 0x4000, 0x3C00), 0x4200);
    assert_eq!(fop(FOp::Fma, Ty::Bf16, relu, 0x7FC1, 0x3F80, 0), 0x7FFF);
    // min/max
    let nan = 0x7FC0_0001u64;
    let two = 2f32.to_bits() as u64;
    let d = FMode::default();
    let n = FMode {
        nan: true,
        ..FMode::default()
    };
    assert_eq!(fop(FOp::Min, Ty::F32, d, nan, two, 0), two);
    assert_eq!(fop(FOp::Max, Ty::F32, d, two, nan, 0), two);
    assert_eq!(fop(FOp::Min, Ty::F32, d, nan, nan, 0), 0x7FFF_FFFF);
    assert_eq!(fop(FOp::Min, Ty::F32, n, nan, two, 0), 0x7FFF_FFFF);
    assert_eq!(fop(FOp::Min, Ty::F32, d, 0x8000_0000, 0, 0), 0x8000_0000);
    assert_eq!(fop(FOp::Min, Ty::F32, d, 0, 0x8000_0000, 0), 0x8000_0000);
    assert_eq!(fop(FOp::Max, Ty::F32, d, 0x8000_0000, 0, 0), 0);
    assert_eq!(fop(FOp::Max, Ty::F32, d, one, two, 0), two);
    assert_eq!(
        fop(FOp::Min, Ty::F16x2, d, 0x3C00_7E00, 0x4000_3C00, 0),
        0x3C00_3C00
    );
    assert_eq!(
        fop(FOp::Max, Ty::Bf16x2, n, 0x3F80_7FC0, 0x4000_3F80, 0),
        0x4000_7FFF
    );
    // neg / abs / copysign
    assert_eq!(
        fop(FOp::Neg, Ty::F32, d, one, 0, 0),
        (-1f32).to_bits() as u64
    );
    assert_eq!(
        fop(FOp::Abs, Ty::F64, d, (-3f64).to_bits(), 0, 0),
        3f64.to_bits()
    );
    assert_eq!(fop(FOp::Neg, Ty::F16x2, d, 0x3C00_BC00, 0, 0), 0xBC00_3C00);
    assert_eq!(
        fop(FOp::Copysign, Ty::F32, d, (-1f32).to_bits() as u64, two, 0),
        (-2f32).to_bits() as u64
    );
    assert_eq!(fop(FOp::Neg, Ty::F32, ftz, sub, 0, 0), 0x8000_0000);
}

#[test]
fn special_values() {
    let d = FMode {
        approx: true,
        ..FMode::default()
    };
    let f = |op, x: f32| f32::from_bits(fop(op, Ty::F32, d, x.to_bits() as u64, 0, 0) as u32);
    let inf = f32::INFINITY;
    assert_eq!(f(FOp::Ex2, -inf).to_bits(), 0);
    assert_eq!(f(FOp::Ex2, inf), inf);
    assert_eq!(f(FOp::Ex2, 3.0), 8.0);
    assert_eq!(f(FOp::Ex2, -0.0), 1.0);
    assert_eq!(f(FOp::Lg2, 0.0), -inf);
    assert_eq!(f(FOp::Lg2, -0.0), -inf);
    assert!(f(FOp::Lg2, -1.0).is_nan());
    assert_eq!(f(FOp::Lg2, inf), inf);
    assert_eq!(f(FOp::Lg2, 8.0), 3.0);
    assert_eq!(f(FOp::Rsqrt, -0.0), -inf);
    assert_eq!(f(FOp::Rsqrt, 0.0), inf);
    assert!(f(FOp::Rsqrt, -1.0).is_nan());
    assert_eq!(f(FOp::Rsqrt, inf).to_bits(), 0);
    assert_eq!(f(FOp::Rsqrt, 4.0), 0.5);
    assert_eq!(f(FOp::Rcp, 0.0), inf);
    assert_eq!(f(FOp::Rcp, -0.0), -inf);
    assert_eq!(f(FOp::Rcp, -inf).to_bits(), 0x8000_0000);
    assert!(f(FOp::Sin, inf).is_nan());
    assert!(f(FOp::Cos, -inf).is_nan());
    assert_eq!(f(FOp::Sin, -0.0).to_bits(), 0x8000_0000);
    assert_eq!(f(FOp::Tanh, inf), 1.0);
    assert_eq!(f(FOp::Tanh, -inf), -1.0);
    assert_eq!(f(FOp::Sqrt, -0.0).to_bits(), 0x8000_0000);
    assert!(f(FOp::Sqrt, -1.0).is_nan());
    assert_eq!(
        fop(FOp::Sqrt, Ty::F32, d, (-1f32).to_bits() as u64, 0, 0),
        0x7FFF_FFFF
    );
    // canonical NaN for every type
    let dd = FMode::default();
    assert_eq!(
        fop(FOp::Add, Ty::F32, dd, 0x7F80_0000, 0xFF80_0000, 0),
        0x7FFF_FFFF
    );
    assert_eq!(fop(FOp::Mul, Ty::F16, dd, 0x7C00, 0, 0), 0x7FFF);
    assert_eq!(fop(FOp::Add, Ty::Bf16, dd, 0xFFC1, 0, 0), 0x7FFF);
    assert_eq!(fop(FOp::Div, Ty::F64, dd, 0, 0, 0), 0x7FFF_FFFF_FFFF_FFFF);
    // signed zeros of exact cancellation
    let one = 1f32.to_bits() as u64;
    let mone = (-1f32).to_bits() as u64;
    assert_eq!(fop(FOp::Add, Ty::F32, m(Rnd::Rn), one, mone, 0), 0);
    assert_eq!(
        fop(FOp::Add, Ty::F32, m(Rnd::Rm), one, mone, 0),
        0x8000_0000
    );
    assert_eq!(
        fop(FOp::Fma, Ty::F32, m(Rnd::Rn), 0x8000_0000, one, 0x8000_0000),
        0x8000_0000
    );
    // overflow in directed modes
    let max = f32::MAX.to_bits() as u64;
    assert_eq!(fop(FOp::Mul, Ty::F32, m(Rnd::Rz), max, max, 0), max);
    assert_eq!(fop(FOp::Mul, Ty::F32, m(Rnd::Rp), max, max, 0), 0x7F80_0000);
    assert_eq!(fop(FOp::Mul, Ty::F32, m(Rnd::Rm), max, max, 0), max);
    assert_eq!(
        fop(FOp::Mul, Ty::F32, m(Rnd::Rm), max, max | 0x8000_0000, 0),
        0xFF80_0000
    );
    // underflow in directed modes: smallest subnormal
    let tiny = 2f32.powi(-100).to_bits() as u64;
    assert_eq!(fop(FOp::Mul, Ty::F32, m(Rnd::Rp), tiny, tiny, 0), 1);
    assert_eq!(fop(FOp::Mul, Ty::F32, m(Rnd::Rn), tiny, tiny, 0), 0);
}

#[test]
fn approx_accuracy() {
    let mut rng = StdRng::seed_from_u64(14);
    let d = FMode {
        approx: true,
        ..FMode::default()
    };
    for _ in 0..50_000 {
        let x: f32 = rng.gen_range(-120.0..120.0);
        let got = f32::from_bits(fop(FOp::Ex2, Ty::F32, d, x.to_bits() as u64, 0, 0) as u32);
        let want = (x as f64).exp2();
        assert!(
            ((got as f64 - want) / want).abs() <= 2f64.powi(-23),
            "ex2 {x}"
        );
        let y: f32 = rng.gen_range(1e-30..1e30);
        let got = f32::from_bits(fop(FOp::Rsqrt, Ty::F32, d, y.to_bits() as u64, 0, 0) as u32);
        let want = 1.0 / (y as f64).sqrt();
        assert!(
            ((got as f64 - want) / want).abs() <= 2f64.powi(-23),
            "rsqrt {y}"
        );
        let got = f32::from_bits(fop(FOp::Lg2, Ty::F32, d, y.to_bits() as u64, 0, 0) as u32);
        let want = (y as f64).log2();
        assert!(
            (got as f64 - want).abs() <= 2f64.powi(-22) * want.abs().max(1.0),
            "lg2 {y}"
        );
        let z: f32 = rng.gen_range(-8.0..8.0);
        let got = f32::from_bits(fop(FOp::Tanh, Ty::F32, d, z.to_bits() as u64, 0, 0) as u32);
        assert!(
            (got as f64 - (z as f64).tanh()).abs()
                <= 2f64.powi(-11) * (z as f64).tanh().abs() + 1e-30,
            "tanh {z}"
        );
        // f16 ex2
        let h = half::f16::from_f32(rng.gen_range(-10.0..10.0));
        let got = half::f16::from_bits(fop(FOp::Ex2, Ty::F16, d, h.to_bits() as u64, 0, 0) as u16);
        assert_eq!(got, half::f16::from_f64(h.to_f64().exp2()));
    }
}

#[test]
fn testp_kinds() {
    use TestpKind::*;
    let cases: [(u64, [bool; 6]); 7] = [
        // finite infinite number notanumber normal subnormal
        (0x0000_0000, [true, false, true, false, false, false]),
        (0x8000_0000, [true, false, true, false, false, false]),
        (0x0000_0001, [true, false, true, false, false, true]),
        (0x3F80_0000, [true, false, true, false, true, false]),
        (0xFF80_0000, [false, true, true, false, false, false]),
        (0x7FC0_0000, [false, false, false, true, false, false]),
        (0x7F7F_FFFF, [true, false, true, false, true, false]),
    ];
    for (bits, want) in cases {
        for (k, w) in [Finite, Infinite, Number, NotANumber, Normal, Subnormal]
            .into_iter()
            .zip(want)
        {
            assert_eq!(testp(k, Ty::F32, bits), w, "{bits:#x} {k:?}");
            let b64 = cvt(&CvtSpec::new(Ty::F64, Ty::F32), bits, 0);
            // f32 subnormals are normal f64 values
            let w64 = match k {
                Normal if bits & 0x7FFF_FFFF == 1 => true,
                Subnormal => false,
                _ => w,
            };
            assert_eq!(testp(k, Ty::F64, b64), w64, "{bits:#x} {k:?} f64");
        }
    }
}

#[test]
fn from_instruction_decoding() {
    let parse = |s: &str| {
        let stmts = ptx::parse_statements(s).expect("parse");
        match stmts.into_iter().next() {
            Some(ptx::Statement::Instr(i)) => i,
            other => panic!("{other:?}"),
        }
    };
    let i = parse("cvt.rn.satfinite.relu.e4m3x2.f32 %rs1, %f1, %f2;");
    let s = CvtSpec::from_instruction(&i).unwrap();
    assert_eq!(
        (s.dst, s.src, s.rnd, s.satfinite, s.relu),
        (Ty::E4m3x2, Ty::F32, Some(Rnd::Rn), true, true)
    );
    let i = parse("cvt.rzi.s32.f32 %r1, %f1;");
    let s = CvtSpec::from_instruction(&i).unwrap();
    assert_eq!((s.dst, s.src, s.irnd), (Ty::S32, Ty::F32, Some(IRnd::Rzi)));
    let i = parse("cvt.rn.e4m3x2.f32 %rs1, %f1, %f2;");
    assert!(CvtSpec::from_instruction(&i).is_err());
    let i = parse("cvt.u32.pred %r1, %p1;");
    assert!(CvtSpec::from_instruction(&i).is_err());
    let i = parse("fma.rz.ftz.sat.f32 %f1, %f2, %f3, %f4;");
    let fm = FMode::from_instruction(&i);
    assert_eq!(
        (fm.rnd, fm.ftz, fm.sat, fm.approx),
        (Rnd::Rz, true, true, false)
    );
    let i = parse("max.NaN.f16x2 %r1, %r2, %r3;");
    assert!(FMode::from_instruction(&i).nan);
    let i = parse("testp.subnormal.f32 %p1, %f1;");
    assert_eq!(
        TestpKind::from_instruction(&i).unwrap(),
        TestpKind::Subnormal
    );
}

#[test]
fn no_panics_on_any_bits() {
    let mut rng = StdRng::seed_from_u64(15);
    let tys = [
        Ty::F16,
        Ty::Bf16,
        Ty::F16x2,
        Ty::Bf16x2,
        Ty::F32,
        Ty::F64,
        Ty::S32,
        Ty::Pred,
    ];
    let ops = [
        FOp::Add,
        FOp::Sub,
        FOp::Mul,
        FOp::Fma,
        FOp::Div,
        FOp::Min,
        FOp::Max,
        FOp::Neg,
        FOp::Abs,
        FOp::Rcp,
        FOp::Sqrt,
        FOp::Rsqrt,
        FOp::Ex2,
        FOp::Lg2,
        FOp::Sin,
        FOp::Cos,
        FOp::Tanh,
        FOp::Copysign,
    ];
    let all = [
        Ty::U8,
        Ty::S8,
        Ty::U16,
        Ty::S16,
        Ty::U32,
        Ty::S32,
        Ty::U64,
        Ty::S64,
        Ty::B32,
        Ty::F16,
        Ty::Bf16,
        Ty::F32,
        Ty::F64,
        Ty::Tf32,
        Ty::F16x2,
        Ty::Bf16x2,
        Ty::E4m3x2,
        Ty::E5m2x2,
        Ty::Pred,
        Ty::E4m3,
    ];
    for _ in 0..3000 {
        let (a, b, c): (u64, u64, u64) = (rng.gen(), rng.gen(), rng.gen());
        for &t in &tys {
            for &op in &ops {
                for rnd in RNDS {
                    let md = FMode {
                        rnd,
                        ftz: rng.gen(),
                        sat: rng.gen(),
                        relu: rng.gen(),
                        nan: rng.gen(),
                        approx: rng.gen(),
                        xorsign: rng.gen(),
                    };
                    let _ = fop(op, t, md, a, b, c);
                }
            }
        }
        let d = all[rng.gen_range(0..all.len())];
        let s = all[rng.gen_range(0..all.len())];
        let mut sp = CvtSpec::new(d, s);
        sp.rnd = if rng.gen() {
            Some(RNDS[rng.gen_range(0..5)])
        } else {
            None
        };
        sp.irnd = if rng.gen() { Some(IRnd::Rni) } else { None };
        sp.ftz = rng.gen();
        sp.sat = rng.gen();
        sp.satfinite = rng.gen();
        sp.relu = rng.gen();
        let _ = cvt(&sp, a, b);
    }
}
