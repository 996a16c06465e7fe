//! libdevice math on the emulator: nvcc 13.5 inlines libdevice's f32 and f64 functions (sin, pow,
//! erf, lgamma, ... 34 of them, `tests-data/libdevice/math.cu`, committed PTX for sm_80 and
//! sm_90, `build.sh`) and every result must be within the CUDA Programming Guide's maximum ulp
//! error of the correctly rounded result (table "Mathematical Functions Appendix", no fast math).
//! The f32 kernels also run as built with `-ftz=true` (subnormal inputs referenced at ±0, a zero
//! of the right sign accepted for a subnormal result).
//!
//! References are independent of the emulator:
//! * f32 functions that Rust's std has: computed in f64 on fresh random inputs each run (seed
//!   from the clock, printed; `PTXFORGE_LIBDEVICE_SEED=N` replays one). f64 libm is within about
//!   one f64 ulp, 2^-29 of an f32 ulp, so rounding it to f32 gives the correctly rounded result
//!   except in vanishingly rare near-halfway cases.
//! * f32 erf, erfc, erfinv, lgamma, tgamma and every f64 function: tables computed with mpmath
//!   at 320 bits (`tests-data/libdevice/refs.py` writes `refs_f32.tsv` and `refs_f64.tsv`).
//!
//! The error is the guide's measure: the distance in ulps between the returned value and the
//! correctly rounded result, counted in representable numbers (infinity is one past MAX). NaN
//! must give NaN, and a zero result must have the sign C99 Annex F gives it.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::fmt::Write as _;

/// One function of `math.cu`: its kernel suffix, whether it takes two inputs, and the guide's
/// maximum ulp error for the float and the double version.
struct Func {
    name: &'static str,
    binary: bool,
    f32_ulps: u64,
    f64_ulps: u64,
}

const fn f(name: &'static str, f32_ulps: u64, f64_ulps: u64) -> Func {
    Func {
        name,
        binary: false,
        f32_ulps,
        f64_ulps,
    }
}

const fn f2(name: &'static str, f32_ulps: u64, f64_ulps: u64) -> Func {
    Func {
        name,
        binary: true,
        f32_ulps,
        f64_ulps,
    }
}

/// The guide's bounds (CUDA Programming Guide, Mathematical Functions appendix; f32 without
/// `-use_fast_math`, i.e. `-prec-div=true -prec-sqrt=true -ftz=false`). lgamma's bound holds
/// outside (-10.001, -2.264) for f32 and (-23.0001, -2.2637) for f64 ([`lgamma_unbounded`]).
const FUNCS: [Func; 34] = [
    f("sin", 2, 2),
    f("cos", 2, 2),
    f("tan", 4, 2),
    f("sincos", 2, 2),
    f("exp", 2, 1),
    f("exp2", 2, 1),
    f("exp10", 2, 1),
    f("expm1", 1, 1),
    f("log", 1, 1),
    f("log2", 1, 1),
    f("log10", 2, 1),
    f("log1p", 1, 1),
    f2("pow", 4, 2),
    f("sqrt", 0, 0),
    f("rsqrt", 2, 1),
    f("cbrt", 1, 1),
    f("erf", 2, 2),
    f("erfc", 4, 5),
    f("erfinv", 2, 5),
    f("lgamma", 6, 4),
    f("tgamma", 5, 10),
    f("atan", 2, 2),
    f2("atan2", 3, 2),
    f("asin", 2, 2),
    f("acos", 2, 2),
    f("sinh", 3, 2),
    f("cosh", 2, 1),
    f("tanh", 2, 1),
    f("asinh", 3, 3),
    f("acosh", 4, 3),
    f("atanh", 3, 2),
    f2("hypot", 3, 2),
    f2("fmod", 0, 0),
    f2("remainder", 0, 0),
];

/// The PTX files with f32 kernels: both targets without fast math, and sm_80 with `-ftz=true`
/// (libdevice's flush-to-zero paths and the emulator's `.ftz` forms; f32 kernels only).
const F32_BUILDS: [(&str, &str); 3] = [
    ("math_sm80.ptx", "sm_80 f32"),
    ("math_sm90.ptx", "sm_90 f32"),
    ("math_ftz_sm80.ptx", "sm_80 ftz f32"),
];

/// f32 functions whose reference comes from `refs_f32.tsv` (Rust's std lacks them).
const F32_TABLE: [&str; 5] = ["erf", "erfc", "erfinv", "lgamma", "tgamma"];

#[derive(Clone, Copy, PartialEq, Debug)]
enum Prec {
    F32,
    F64,
}

/// One input and its exact result `hi + lo` (hi = the exact value rounded to f64).
#[derive(Clone, Copy, Debug)]
struct Case {
    a: f64,
    b: f64,
    hi: f64,
    lo: f64,
}

fn data_path(file: &str) -> String {
    format!(
        "{}/../../tests-data/libdevice/{file}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A reference table: the committed one, or `$PTXFORGE_LIBDEVICE_REFS/file` (a soak run's
/// bigger table from `refs.py N SEED DIR`).
fn refs(file: &str) -> String {
    let p = match std::env::var("PTXFORGE_LIBDEVICE_REFS") {
        Ok(dir) => format!("{dir}/{file}"),
        Err(_) => data_path(file),
    };
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// Fresh f32 inputs per function: 240, or `$PTXFORGE_LIBDEVICE_N` for a soak run.
fn f32_count() -> usize {
    std::env::var("PTXFORGE_LIBDEVICE_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(240)
}

/// The rows of an mpmath table for `name` (columns: fn, a, b or "-", hi, lo as f64 hex bits).
fn table(text: &str, name: &str) -> Vec<Case> {
    let hex = |s: &str| f64::from_bits(u64::from_str_radix(s, 16).expect("hex bits"));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .filter(|c| c[0] == name)
        .map(|c| Case {
            a: hex(c[1]),
            b: if c[2] == "-" { 0.0 } else { hex(c[2]) },
            hi: hex(c[3]),
            lo: hex(c[4]),
        })
        .collect()
}

/// Fresh f32 inputs drawn across `name`'s interesting ranges, plus special values.
fn f32_inputs(name: &str, rng: &mut StdRng, n: usize) -> Vec<(f32, f32)> {
    let mut out: Vec<(f32, f32)> = (0..n).map(|i| f32_input(name, rng, i % 4)).collect();
    let specials = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0,
        -1.0,
        0.5,
        2.0,
        -2.0,
        f32::MIN_POSITIVE,
        1e-45,
        -1e-45,
        f32::MAX,
    ];
    for (i, &a) in specials.iter().enumerate() {
        if is_binary(name) {
            for (j, &b) in specials.iter().enumerate() {
                if (i + j) % 3 == 0 || name == "pow" {
                    out.push((a, b));
                }
            }
        } else {
            out.push((a, 0.0));
        }
    }
    out
}

fn is_binary(name: &str) -> bool {
    FUNCS.iter().any(|f| f.name == name && f.binary)
}

/// Log-uniform: binary exponent uniform in `[e0, e1)`, random significand, random sign.
fn lu(rng: &mut StdRng, e0: i32, e1: i32) -> f32 {
    let x = (1.0 + rng.gen::<f64>()) * 2f64.powi(rng.gen_range(e0..e1));
    let x = x as f32;
    if rng.gen() {
        -x
    } else {
        x
    }
}

fn uni(rng: &mut StdRng, a: f64, b: f64) -> f32 {
    rng.gen_range(a..b) as f32
}

/// `c` rounded to f32 and moved by up to `k` ulps.
fn near(rng: &mut StdRng, c: f64, k: i32) -> f32 {
    let x = c as f32;
    let d = rng.gen_range(-k..=k);
    f32::from_bits((x.to_bits() as i32 + if x > 0.0 { d } else { -d }) as u32)
}

/// One random input for range kind `k` (0..4) of `name`.
fn f32_input(name: &str, rng: &mut StdRng, k: usize) -> (f32, f32) {
    let pm1 = |rng: &mut StdRng| if rng.gen() { 1.0 } else { -1.0 };
    let x = match (name, k) {
        ("sin" | "cos" | "tan" | "sincos", 0) => lu(rng, -149, 0),
        ("sin" | "cos" | "tan" | "sincos", 1) => uni(rng, -10.0, 10.0),
        ("sin" | "cos" | "tan" | "sincos", 2) => lu(rng, 0, 100), // up to 1e30: Payne-Hanek
        ("sin" | "cos" | "tan" | "sincos", _) => {
            let k = rng.gen_range(-4000..4000) as f64;
            near(rng, k * std::f64::consts::FRAC_PI_2, 3)
        }
        ("exp" | "expm1", 0) => uni(rng, -104.0, 89.0),
        ("exp2", 0) => uni(rng, -150.0, 128.0),
        ("exp10", 0) => uni(rng, -46.0, 38.6),
        ("exp" | "exp2" | "exp10" | "expm1", 1 | 3) => lu(rng, -149, 0),
        ("exp" | "exp2" | "exp10" | "expm1", _) => uni(rng, -1.0, 1.0),
        ("log" | "log2" | "log10" | "sqrt" | "rsqrt", 0 | 3) => lu(rng, -149, 128).abs(),
        ("log" | "log2" | "log10" | "sqrt" | "rsqrt", 1) => uni(rng, 0.5, 2.0),
        ("log" | "log2" | "log10" | "sqrt" | "rsqrt", _) => near(rng, 1.0, 300),
        ("log1p", 0) => lu(rng, -149, 0),
        ("log1p", 1) => lu(rng, 0, 128).abs(),
        ("log1p", 2) => uni(rng, -1.0, 1.0),
        ("log1p", _) => near(rng, -1.0, 300),
        ("cbrt" | "atan" | "asinh", 0 | 1) => lu(rng, -149, 128),
        ("cbrt" | "atan" | "asinh", _) => uni(rng, -4.0, 4.0),
        ("asin" | "acos" | "atanh", 0) => uni(rng, -1.0, 1.0),
        ("asin" | "acos" | "atanh", 1) => lu(rng, -149, 0),
        ("asin" | "acos" | "atanh", _) => {
            let c = pm1(rng);
            near(rng, c, 3000)
        }
        ("sinh" | "cosh" | "tanh", 0) => uni(rng, -20.0, 20.0),
        ("sinh" | "cosh" | "tanh", 1) => lu(rng, -149, 0),
        ("sinh" | "cosh" | "tanh", _) => uni(rng, -90.0, 90.0),
        ("acosh", 0 | 1) => lu(rng, 0, 128).abs(),
        ("acosh", 2) => near(rng, 1.0, 3000),
        ("acosh", _) => uni(rng, 1.0, 4.0),
        _ => return f32_pair(name, rng, k),
    };
    (x, 0.0)
}

/// Inputs of the two-argument functions.
fn f32_pair(name: &str, rng: &mut StdRng, k: usize) -> (f32, f32) {
    match (name, k) {
        ("pow", 0) => (lu(rng, -20, 20).abs(), uni(rng, -30.0, 30.0)),
        ("pow", 1) => (uni(rng, 0.5, 2.0), uni(rng, -300.0, 300.0)),
        ("pow", 2) => (lu(rng, -8, 8), rng.gen_range(-40..40) as f32),
        ("pow", _) => (lu(rng, -149, 128).abs(), uni(rng, -3.0, 3.0)),
        ("fmod" | "remainder", 0 | 1) => (lu(rng, -149, 128), lu(rng, -149, 128)),
        ("fmod" | "remainder", 2) => (lu(rng, -10, 30), lu(rng, -10, 10)),
        ("fmod" | "remainder", _) => {
            // exact halves: remainder's ties go to the even quotient
            let y = lu(rng, -5, 5);
            ((rng.gen_range(-200..200) as f32 + 0.5) * y, y)
        }
        ("atan2", 0 | 1) => (lu(rng, -149, 128), lu(rng, -149, 128)),
        ("atan2", _) => (uni(rng, -4.0, 4.0), uni(rng, -4.0, 4.0)),
        ("hypot", 0) => (lu(rng, -149, 128), lu(rng, -149, 128)),
        ("hypot", 1) => {
            let e = rng.gen_range(-120..124);
            (lu(rng, e - 2, e + 1), lu(rng, e - 20, e + 1))
        }
        (_, _) => (uni(rng, -10.0, 10.0), uni(rng, -10.0, 10.0)),
    }
}

/// IEEE remainder of f32 values, exact in f64: `x - n y` with n = x/y rounded to even.
fn remainder(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() || x.is_infinite() || y == 0.0 {
        return f64::NAN;
    }
    if y.is_infinite() {
        return x;
    }
    let r = x % y; // exact, sign of x
    let (ar, ay) = (r.abs(), y.abs());
    // the truncated quotient is odd iff |x mod 2y| >= |y| (also exact)
    let odd = (x % (2.0 * ay)).abs() >= ay;
    let r = if 2.0 * ar > ay || (2.0 * ar == ay && odd) {
        r - ay.copysign(r)
    } else {
        r
    };
    if r == 0.0 {
        0f64.copysign(x)
    } else {
        r
    }
}

/// The f32 function `name` at f32 inputs (widened), computed with f64 libm.
fn ref_f32(name: &str, a: f64, b: f64) -> f64 {
    match name {
        "sin" => a.sin(),
        "cos" => a.cos(),
        "tan" => a.tan(),
        "exp" => a.exp(),
        "exp2" => a.exp2(),
        "exp10" => 10f64.powf(a),
        "expm1" => a.exp_m1(),
        "log" => a.ln(),
        "log2" => a.log2(),
        "log10" => a.log10(),
        "log1p" => a.ln_1p(),
        "pow" => a.powf(b),
        "sqrt" => a.sqrt(),
        "rsqrt" if a == 0.0 => f64::INFINITY.copysign(a),
        "rsqrt" => 1.0 / a.sqrt(),
        "cbrt" => a.cbrt(),
        "atan" => a.atan(),
        "atan2" => a.atan2(b),
        "asin" => a.asin(),
        "acos" => a.acos(),
        "sinh" => a.sinh(),
        "cosh" => a.cosh(),
        "tanh" => a.tanh(),
        "asinh" => a.asinh(),
        "acosh" => a.acosh(),
        "atanh" => a.atanh(),
        "hypot" => a.hypot(b),
        "fmod" => a % b,
        "remainder" => remainder(a, b),
        _ => panic!("no f64 reference for {name}"),
    }
}

/// The emulator with one of the committed PTX files loaded.
struct Emu {
    mem: GlobalMemory,
    module: LoadedModule,
    /// Built with `-ftz=true`: f32 subnormal inputs and results are flushed to zero.
    ftz: bool,
}

/// Written into the outputs before each launch: a NaN no arithmetic produces.
const POISON32: u32 = 0x7fc0_dead;
const POISON64: u64 = 0x7ff8_dead_dead_dead;

impl Emu {
    fn new(file: &str) -> Emu {
        let p = data_path(file);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
        let mem = GlobalMemory::new();
        let module = LoadedModule::load(&mem, ptx::parse(&text).expect("parse"), 0).expect("load");
        Emu {
            mem,
            module,
            ftz: file.contains("ftz"),
        }
    }

    /// Runs `entry` on `inputs` (each one value per element, as raw bits of the precision's
    /// width) and returns `outs` output arrays of raw bits.
    fn run(&self, entry: &str, prec: Prec, inputs: &[Vec<u64>], outs: usize) -> Vec<Vec<u64>> {
        let n = inputs[0].len();
        let w = if prec == Prec::F32 { 4 } else { 8 };
        let enc = |v: &[u64]| -> Vec<u8> {
            v.iter()
                .flat_map(|&x| x.to_le_bytes()[..w].to_vec())
                .collect()
        };
        let mut params = Vec::new();
        let mut bufs = Vec::new();
        let poison = match prec {
            Prec::F32 => vec![POISON32 as u64; n],
            Prec::F64 => vec![POISON64; n],
        };
        for data in inputs.iter().chain(std::iter::repeat_n(&poison, outs)) {
            let b = self.mem.alloc((n * w) as u64, 0).unwrap();
            b.write_bytes(0, &enc(data));
            params.extend_from_slice(&b.base.to_le_bytes());
            bufs.push(b);
        }
        params.extend_from_slice(&(n as i32).to_le_bytes());
        let cfg = LaunchConfig::linear(n.div_ceil(128) as u32, 128);
        let opts = LaunchOptions {
            threads: 2,
            ..LaunchOptions::default()
        };
        let prog = self.module.kernel(entry).unwrap();
        launch(prog, self.mem.snapshot(), params, &cfg, &opts)
            .unwrap_or_else(|e| panic!("{entry}: {e}"));
        let out = bufs[inputs.len()..]
            .iter()
            .map(|b| {
                let mut raw = vec![0u8; n * w];
                b.read_bytes(0, &mut raw);
                raw.chunks(w)
                    .map(|c| c.iter().rev().fold(0u64, |acc, &x| acc << 8 | x as u64))
                    .collect()
            })
            .collect();
        for b in bufs {
            self.mem.free(b.base);
        }
        out
    }
}

/// Position of a value in the ordered sequence of representable numbers (±0 both 0).
fn ord(bits: u64, prec: Prec) -> i64 {
    let (sign, mag) = match prec {
        Prec::F32 => (bits >> 31 & 1, (bits & 0x7fff_ffff) as i64),
        Prec::F64 => (bits >> 63, (bits & !(1 << 63)) as i64),
    };
    if sign == 1 {
        -mag
    } else {
        mag
    }
}

/// Ulp distance of the result `y` (raw bits) from the correctly rounded `want`; `None` for a
/// NaN where a number belongs (or the reverse), or a zero of the wrong sign.
fn ulps(y: u64, want: f64, prec: Prec) -> Option<u64> {
    let (y_nan, want_bits) = match prec {
        Prec::F32 => (
            f32::from_bits(y as u32).is_nan(),
            (want as f32).to_bits() as u64,
        ),
        Prec::F64 => (f64::from_bits(y).is_nan(), want.to_bits()),
    };
    if want.is_nan() || y_nan {
        return (want.is_nan() && y_nan).then_some(0);
    }
    let (oy, ow) = (ord(y, prec), ord(want_bits, prec));
    if oy == 0 && ow == 0 && y != want_bits {
        return None; // zeros of different sign
    }
    Some(oy.abs_diff(ow))
}

/// `hi + lo` rounded to f32 (as f64): `hi as f32`, except where `hi` is halfway between two f32
/// values and `lo` breaks the tie.
fn round_f32(hi: f64, lo: f64) -> f64 {
    let r = hi as f32;
    if lo == 0.0 || !r.is_finite() || r as f64 == hi {
        return r as f64;
    }
    let other = if hi > r as f64 {
        r.next_up()
    } else {
        r.next_down()
    };
    if (hi - r as f64).abs() != (other as f64 - hi).abs() {
        return r as f64;
    }
    // a tie in hi: the exact value lies on lo's side
    if (lo > 0.0) == (other as f64 > r as f64) {
        other as f64
    } else {
        r as f64
    }
}

/// lgamma's guide bound does not hold inside this interval (the guide says "larger inside").
fn lgamma_unbounded(x: f64, prec: Prec) -> bool {
    match prec {
        Prec::F32 => x > -10.001 && x < -2.264,
        Prec::F64 => x > -23.0001 && x < -2.2637,
    }
}

/// The worst case of one function, and every case over the bound.
#[derive(Default)]
struct Report {
    /// `-ftz=true` build: a zero of the right sign is exact where the result is subnormal.
    ftz: bool,
    worst: u64,
    worst_case: String,
    fails: Vec<String>,
    count: usize,
}

impl Report {
    fn add(&mut self, name: &str, prec: Prec, c: &Case, y: u64, bound: u64) {
        if name == "lgamma" && lgamma_unbounded(c.a, prec) {
            return;
        }
        self.count += 1;
        let want = match prec {
            Prec::F32 => round_f32(c.hi, c.lo),
            Prec::F64 => c.hi,
        };
        let flushed = self.ftz && want != 0.0 && want.abs() < f32::MIN_POSITIVE as f64;
        let d = if flushed && y == (0f32.copysign(want as f32)).to_bits() as u64 {
            Some(0)
        } else {
            ulps(y, want, prec)
        };
        let shown = || {
            let yv = match prec {
                Prec::F32 => f32::from_bits(y as u32) as f64,
                Prec::F64 => f64::from_bits(y),
            };
            format!(
                "{name}({:e}, {:e}) = {yv:e} [{y:#x}], want {want:e} (+{:e})",
                c.a, c.b, c.lo
            )
        };
        let e = d.unwrap_or(u64::MAX);
        if e > self.worst || self.worst_case.is_empty() {
            self.worst = e;
            self.worst_case = shown();
        }
        if e > bound {
            self.fails.push(match d {
                Some(d) => format!("{d} ulp: {}", shown()),
                None => format!("special value: {}", shown()),
            });
        }
    }
}

/// Runs `name`'s kernel in `prec` on `cases` and checks each result against its bound.
/// sincos checks the sin output on the cases (their reference is sin's) unless `second`
/// (then its cos output, on cos's references).
fn check(emu: &Emu, name: &str, prec: Prec, cases: &[Case], second: bool) -> Report {
    let f = FUNCS
        .iter()
        .find(|f| f.name == name)
        .expect("known function");
    let bound = if prec == Prec::F32 {
        f.f32_ulps
    } else {
        f.f64_ulps
    };
    let bits = |v: f64| match prec {
        Prec::F32 => (v as f32).to_bits() as u64,
        Prec::F64 => v.to_bits(),
    };
    let mut inputs = vec![cases.iter().map(|c| bits(c.a)).collect::<Vec<_>>()];
    if f.binary {
        inputs.push(cases.iter().map(|c| bits(c.b)).collect());
    }
    let pre = if prec == Prec::F32 { "f32" } else { "f64" };
    let outs = if name == "sincos" { 2 } else { 1 };
    let res = emu.run(&format!("{pre}_{name}"), prec, &inputs, outs);
    let ys = &res[usize::from(second)];
    let mut rep = Report {
        ftz: emu.ftz,
        ..Report::default()
    };
    for (c, &y) in cases.iter().zip(ys) {
        let poisoned = y == POISON64 || (prec == Prec::F32 && y == POISON32 as u64);
        assert!(!poisoned, "{pre}_{name}: output not written for {c:?}");
        rep.add(name, prec, c, y, bound);
    }
    rep
}

/// f32 cases of `name`: fresh random inputs with f64 libm references, or the mpmath table.
/// With `ftz` the references are taken at the flushed inputs (the kernel gets the originals).
fn f32_cases(name: &str, rng: &mut StdRng, table_text: &str, ftz: bool) -> Vec<Case> {
    if F32_TABLE.contains(&name) {
        let mut cases = table(table_text, name);
        if ftz {
            cases.iter_mut().for_each(|c| flush_table_case(name, c));
        }
        return cases;
    }
    let base = if name == "sincos" { "sin" } else { name };
    let flush = |x: f32| {
        if ftz && x.is_subnormal() {
            0f32.copysign(x)
        } else {
            x
        }
    };
    f32_inputs(name, rng, f32_count())
        .into_iter()
        .map(|(a, b)| {
            let hi = ref_f32(base, flush(a) as f64, flush(b) as f64);
            Case {
                a: a as f64,
                b: b as f64,
                hi,
                lo: 0.0,
            }
        })
        .collect()
}

/// A table case at a subnormal input, under `-ftz=true`: the function's value at ±0.
fn flush_table_case(name: &str, c: &mut Case) {
    let x = c.a as f32;
    if !x.is_subnormal() {
        return;
    }
    let z = 0f64.copysign(c.a);
    c.lo = 0.0;
    c.hi = match name {
        "erf" | "erfinv" => z,
        "erfc" => 1.0,
        "lgamma" => f64::INFINITY,
        _ => f64::INFINITY.copysign(c.a), // tgamma
    };
}

fn seed() -> u64 {
    std::env::var("PTXFORGE_LIBDEVICE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// Collects the per-function summary and failures of one precision on one target.
fn summarize(out: &mut String, fails: &mut Vec<String>, tag: &str, name: &str, rep: Report) {
    let _ = writeln!(
        out,
        "{tag} {name:10} n={:4} worst {:>3} ulp  {}",
        rep.count,
        if rep.worst == u64::MAX {
            "NaN/sign".to_string()
        } else {
            rep.worst.to_string()
        },
        rep.worst_case
    );
    fails.extend(rep.fails.into_iter().take(4).map(|s| format!("{tag}: {s}")));
}

/// The f32 functions of `file` (`math_sm80.ptx`, ...), tagged `tag` in the summary.
fn run_f32(file: &str, tag: &str, seed: u64) -> (String, Vec<String>) {
    let emu = Emu::new(file);
    let text = refs("refs_f32.tsv");
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut out, mut fails) = (String::new(), Vec::new());
    for f in &FUNCS {
        let cases = f32_cases(f.name, &mut rng, &text, emu.ftz);
        assert!(cases.len() > 100, "{}: {} cases", f.name, cases.len());
        let rep = check(&emu, f.name, Prec::F32, &cases, false);
        summarize(&mut out, &mut fails, tag, f.name, rep);
        if f.name == "sincos" {
            let cos: Vec<Case> = cases
                .iter()
                .map(|c| Case {
                    hi: c.a.cos(),
                    ..*c
                })
                .collect();
            let rep = check(&emu, f.name, Prec::F32, &cos, true);
            summarize(&mut out, &mut fails, tag, "sincos.cos", rep);
        }
    }
    (out, fails)
}

fn run_f64(sm: u32) -> (String, Vec<String>) {
    let emu = Emu::new(&format!("math_sm{sm}.ptx"));
    let text = refs("refs_f64.tsv");
    let (mut out, mut fails) = (String::new(), Vec::new());
    let tag = format!("sm_{sm} f64");
    for f in &FUNCS {
        let (cases, second) = if f.name == "sincos" {
            (table(&text, "sin"), Some(table(&text, "cos")))
        } else {
            (table(&text, f.name), None)
        };
        assert!(cases.len() > 100, "{}: {} table rows", f.name, cases.len());
        let rep = check(&emu, f.name, Prec::F64, &cases, false);
        summarize(&mut out, &mut fails, &tag, f.name, rep);
        if let Some(cos) = second {
            let rep = check(&emu, f.name, Prec::F64, &cos, true);
            summarize(&mut out, &mut fails, &tag, "sincos.cos", rep);
        }
    }
    (out, fails)
}

fn verdict(out: &str, fails: &[String], what: &str) {
    println!("{out}");
    assert!(
        fails.is_empty(),
        "{what}: results outside the guide's bound:\n{}",
        fails.join("\n")
    );
}

#[test]
fn libdevice_f32_within_guide_ulp_bounds() {
    let seed = seed();
    println!("seed {seed} (PTXFORGE_LIBDEVICE_SEED={seed} replays it)");
    for (file, tag) in F32_BUILDS {
        let (out, fails) = run_f32(file, tag, seed);
        verdict(&out, &fails, &format!("seed {seed}"));
    }
}

#[test]
fn libdevice_f64_within_guide_ulp_bounds() {
    for sm in [80, 90] {
        let (out, fails) = run_f64(sm);
        verdict(&out, &fails, "refs_f64.tsv");
    }
}

#[test]
fn libdevice_ptx_passes_ptxas_without_spills() {
    let Some(ptxas) = ptx::ptxas::ptxas_for_tests("libdevice PTX under ptxas") else {
        return;
    };
    for (file, _) in F32_BUILDS {
        let p = data_path(file);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
        let sm = if file.contains("sm90") { 90 } else { 80 };
        let precs: &[&str] = if file.contains("ftz") {
            &["f32"]
        } else {
            &["f32", "f64"]
        };
        let rep =
            ptx::ptxas::assemble_with(&ptxas, &text, &format!("sm_{sm}"), &Default::default())
                .unwrap_or_else(|e| panic!("ptxas rejects {p}: {e}"));
        for f in &FUNCS {
            for pre in precs {
                let name = format!("{pre}_{}", f.name);
                let k = rep
                    .kernel(&name)
                    .unwrap_or_else(|| panic!("{p}: no {name}"));
                assert_eq!(
                    k.spill_stores_bytes + k.spill_loads_bytes,
                    0,
                    "{p}: {name} spills"
                );
            }
        }
    }
}
