//! `rcp.approx.ftz.f64` and `rsqrt.approx.ftz.f64` as the PTX ISA defines them (9.7.3.14 and
//! 9.7.3.17): only the upper word of the input is read (1.11.20 format), subnormal inputs and
//! results flush to sign-preserving zero, NaN gives `0x7fffffff00000000`, and the lower 32 bits of
//! the result are zero. libdevice's f64 log, atan, erfc, lgamma, pow... refine these with Newton
//! steps. The emulator used to return the correctly rounded full-precision value (nonzero low
//! word, subnormals not flushed). The exact check: the result `d` has a 21-bit significand, so
//! `d * tmp` and `d * d` are exact in f64, and the bound is half an ulp of the 1.11.20 format.
//! `rcp.rn.f64` and `rsqrt.approx.f64` (no `.ftz`) stay full precision.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::{Rng, SeedableRng};

const PTX: &str = r#".version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 pout, .param .u64 pin)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    .reg .f64 %fd<8>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pin];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 8;
    add.s64 %rd3, %rd2, %rd3;
    ld.global.f64 %fd1, [%rd3];
    rcp.approx.ftz.f64 %fd2, %fd1;
    rsqrt.approx.ftz.f64 %fd3, %fd1;
    rcp.rn.f64 %fd4, %fd1;
    rsqrt.approx.f64 %fd5, %fd1;
    mul.wide.u32 %rd4, %r1, 32;
    add.s64 %rd4, %rd1, %rd4;
    st.global.f64 [%rd4], %fd2;
    st.global.f64 [%rd4+8], %fd3;
    st.global.f64 [%rd4+16], %fd4;
    st.global.f64 [%rd4+24], %fd5;
    ret;
}
"#;

/// Runs the kernel on `input` (one thread each); per thread the four results' bits.
fn run(input: &[u64]) -> Vec<[u64; 4]> {
    if ptx::ptxas::ptxas_for_tests("fp_gross_f64 test PTX").is_some() {
        ptx::ptxas::assemble(PTX, "sm_80", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}"));
    }
    let n = input.len();
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(PTX).unwrap(), 0).unwrap();
    let pin = mem.alloc(8 * n as u64, 0).unwrap();
    let bytes: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
    pin.write_bytes(0, &bytes);
    let out_len = 32 * n as u64;
    let pout = mem.alloc(out_len, 0).unwrap();
    pout.fill(0, out_len, &[0xa5]); // poison
    let mut p = pout.base.to_le_bytes().to_vec();
    p.extend_from_slice(&pin.base.to_le_bytes());
    let cfg = LaunchConfig::linear(1, n as u32);
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut raw = vec![0u8; out_len as usize];
    pout.read_bytes(0, &mut raw);
    raw.chunks(32)
        .map(|c| std::array::from_fn(|k| u64::from_le_bytes(c[8 * k..][..8].try_into().unwrap())))
        .collect()
}

const CANON_NAN: u64 = 0x7fff_ffff_0000_0000;

/// The input as the instruction sees it: the upper word, subnormals flushed.
fn upper(a: u64) -> f64 {
    let x = f64::from_bits(a & 0xffff_ffff_0000_0000);
    if x.is_subnormal() {
        0f64.copysign(x)
    } else {
        x
    }
}

/// Checks one gross result `d` against the ISA: `want_special` is the ISA table's result for
/// zero/infinite/NaN inputs; for finite nonzero inputs `err(d)` (exact) must be within `bound`,
/// or `d` a flushed zero where the exact result is subnormal.
fn check(name: &str, a: u64, d: u64, want_special: Option<u64>, err: f64, tiny: bool, bound: f64) {
    let ctx = format!("{name}({a:#018x}) = {d:#018x}");
    if let Some(w) = want_special {
        assert_eq!(d, w, "{ctx}: want {w:#018x}");
        return;
    }
    assert_eq!(d & 0xffff_ffff, 0, "{ctx}: low word must be zero");
    if f64::from_bits(d) == 0.0 {
        assert!(tiny, "{ctx}: zero for a normal result");
        return;
    }
    assert!(
        err.abs() <= bound,
        "{ctx}: relative error {err:e} > {bound:e}"
    );
}

fn inputs() -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let mut v: Vec<u64> = vec![
        0,
        1 << 63,
        f64::INFINITY.to_bits(),
        f64::NEG_INFINITY.to_bits(),
        f64::NAN.to_bits(),
        0x7ff0_0000_0000_0001, // NaN only in the low word: the upper word is +Inf
        0x0000_0000_dead_beef, // subnormal
        0x800f_ffff_ffff_ffff, // -subnormal
        0x0010_0000_0000_0000, // MIN_POSITIVE: 1/x = 2^1022
        0x7fef_ffff_ffff_ffff, // MAX: 1/x subnormal, flushed
        0x7fd0_0000_0000_0000, // 2^1022: 1/x = 2^-1022, still normal
        1f64.to_bits() | 0xffff_ffff, // low word must be ignored
        (-3f64).to_bits() | 0x1234_5678, // rsqrt: NaN
    ];
    for _ in 0..240 {
        // every exponent, random significand and low word, either sign
        let e: u64 = rng.gen_range(1..2047);
        v.push(rng.gen::<u64>() & (1 << 63 | 0xf_ffff_ffff_ffff) | e << 52);
    }
    v
}

#[test]
fn rcp_and_rsqrt_approx_ftz_f64_follow_the_isa() {
    let input = inputs();
    let out = run(&input);
    let bound = 2f64.powi(-21) * (1.0 + 2f64.powi(-20)); // half an ulp at 20 fraction bits
    for (&a, r) in input.iter().zip(&out) {
        let x = upper(a);
        let (rcp, rsq) = (f64::from_bits(r[0]), f64::from_bits(r[1]));
        // rcp: d * x - 1 is exact (21-bit significands)
        let special = if x.is_nan() {
            Some(CANON_NAN)
        } else if x == 0.0 {
            Some(f64::INFINITY.copysign(x).to_bits())
        } else if x.is_infinite() {
            Some(0f64.copysign(x).to_bits())
        } else {
            None
        };
        let tiny = x.abs() > 2f64.powi(1022);
        check("rcp", a, r[0], special, rcp.mul_add(x, -1.0), tiny, bound);
        // rsqrt: d^2 x - 1 is about twice d's relative error
        let special = if x.is_nan() || x < 0.0 && x != 0.0 {
            Some(CANON_NAN)
        } else if x == 0.0 {
            Some(f64::INFINITY.copysign(x).to_bits())
        } else if x.is_infinite() {
            Some(0)
        } else {
            None
        };
        let e = (rsq * rsq).mul_add(x, -1.0);
        check("rsqrt", a, r[1], special, e, false, 2.0 * bound);
        // the full-precision forms are unchanged
        let xf = f64::from_bits(a);
        if !xf.is_nan() {
            assert_eq!(f64::from_bits(r[2]), 1.0 / xf, "rcp.rn.f64({a:#x})");
        }
        if xf > 0.0 && xf.is_normal() {
            let y = f64::from_bits(r[3]);
            let e = ((y * y).mul_add(xf, -1.0)).abs();
            assert!(e < 1e-15, "rsqrt.approx.f64({a:#x}) = {y:e}");
        }
    }
}
