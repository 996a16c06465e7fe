//! Volta `mma.sync.aligned.m8n8k4.alayout.blayout.dtype.f16.f16.ctype` (issue 16 item 3): every
//! form ptxas 13.5 accepts (`.row`/`.col` for A and B, `.f32.f16.f16.f32`, `.f32.f16.f16.f16`,
//! `.f16.f16.f16.f16`) on random f16 inputs (never zero; negative and subnormal values
//! included), outputs poisoned, against references computed here:
//! - the fragment layout is written out in this file from the PTX ISA section "Matrix Fragments
//!   for mma.m8n8k4 with .f16 floating point type" (not taken from the emulator);
//! - exact mode: the products and C summed exactly in `i128` fixed point, rounded once to
//!   nearest even by this file's own IEEE encoder;
//! - hardware mode on sm_70: the V100 model of Khattak and Mikaitis (arXiv 2512.07004; their
//!   MATLAB `V100TC`: one block of 4 products plus C, terms aligned to the largest exponent and
//!   truncated to 23 fraction bits, one more when the largest nominal product's significand
//!   is 2 or more and C is not larger, then round toward zero to f32 or to nearest to f16),
//!   written here in integer arithmetic, plus a hand-computed vector where that extra bit shows;
//! - hardware mode on sm_90: the target's f16 model, `tc_numerics::reference_dot` (the slow
//!   integer oracle), then f16 rounding of an f16 D.
//!
//! Every test kernel is assembled by ptxas (sm_70 kernels for sm_75, the lowest target ptxas
//! 13.5 has) with no spills, and the forms ptxas rejects are checked to be rejected by the
//! validator and the emulator with a message naming the problem.

use emu::tc_numerics::{model_for, reference_dot};
use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule, Numerics};
use ptx::Ty;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn rng() -> StdRng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

/// One form: layouts of A and B, D and C types (`"f16"` / `"f32"`).
#[derive(Clone, Copy, Debug)]
struct Form {
    a_row: bool,
    b_row: bool,
    dty: &'static str,
    cty: &'static str,
}

fn all_forms() -> Vec<Form> {
    let mut v = Vec::new();
    for (dty, cty) in [("f32", "f32"), ("f32", "f16"), ("f16", "f16")] {
        for a_row in [true, false] {
            for b_row in [true, false] {
                v.push(Form {
                    a_row,
                    b_row,
                    dty,
                    cty,
                });
            }
        }
    }
    v
}

/// Registers of an accumulator fragment of type `t` (f16: four f16x2, f32: eight).
fn acc_regs(t: &str) -> usize {
    if t == "f16" {
        4
    } else {
        8
    }
}

fn layout(row: bool) -> &'static str {
    if row {
        "row"
    } else {
        "col"
    }
}

fn regs(p: &str, n: usize) -> String {
    let v: Vec<String> = (0..n).map(|i| format!("%{p}{i}")).collect();
    format!("{{{}}}", v.join(", "))
}

/// The mma instruction of form `f`.
fn mma_line(f: &Form) -> String {
    format!(
        "mma.sync.aligned.m8n8k4.{}.{}.{}.f16.f16.{} {}, {}, {}, {};",
        layout(f.a_row),
        layout(f.b_row),
        f.dty,
        f.cty,
        regs("d", acc_regs(f.dty)),
        regs("a", 2),
        regs("b", 2),
        regs("c", acc_regs(f.cty)),
    )
}

/// A one-warp kernel: lane `l` reads its A (2 words), B (2 words) and C words from `pin`
/// (lane-major), runs `mma` and writes its D words to `pout`.
fn kernel(target: &str, mma: &str, nc: usize, nd: usize, ct: &str, dt: &str) -> String {
    let nin = 4 + nc;
    let creg = if ct == "f16" { "b32" } else { "f32" };
    let dreg = if dt == "f16" { "b32" } else { "f32" };
    let mut s = format!(
        ".version 8.7\n.target {target}\n.address_size 64\n\
         .visible .entry k(.param .u64 pin, .param .u64 pout)\n{{\n\
         .reg .b32 %a<2>, %b<2>, %t;\n.reg .{creg} %c<{nc}>;\n.reg .{dreg} %d<{nd}>;\n\
         .reg .b64 %rd<4>;\n\
         ld.param.u64 %rd1, [pin];\nld.param.u64 %rd2, [pout];\n\
         cvta.to.global.u64 %rd1, %rd1;\ncvta.to.global.u64 %rd2, %rd2;\nmov.u32 %t, %tid.x;\n\
         mul.wide.u32 %rd3, %t, {};\nadd.s64 %rd1, %rd1, %rd3;\n\
         mul.wide.u32 %rd3, %t, {};\nadd.s64 %rd2, %rd2, %rd3;\n",
        4 * nin,
        4 * nd
    );
    for i in 0..2 {
        s += &format!("ld.global.b32 %a{i}, [%rd1+{}];\n", 4 * i);
        s += &format!("ld.global.b32 %b{i}, [%rd1+{}];\n", 4 * (2 + i));
    }
    for i in 0..nc {
        s += &format!("ld.global.{creg} %c{i}, [%rd1+{}];\n", 4 * (4 + i));
    }
    s += mma;
    s += "\n";
    for i in 0..nd {
        s += &format!("st.global.{dreg} [%rd2+{}], %d{i};\n", 4 * i);
    }
    s + "ret;\n}\n"
}

fn form_kernel(f: &Form, target: &str) -> String {
    kernel(
        target,
        &mma_line(f),
        acc_regs(f.cty),
        acc_regs(f.dty),
        f.cty,
        f.dty,
    )
}

/// ptxas's architecture for a test target (ptxas 13.5 has no sm_70).
fn ptxas_arch(target: &str) -> &str {
    if target == "sm_70" {
        "sm_75"
    } else {
        target
    }
}

/// Assembles `text` with ptxas (when installed): accepted, no spills.
fn ptxas_accepts(text: &str, target: &str) {
    if ptx::ptxas::ptxas_for_tests("isa_mma_m8n8k4 test PTX").is_none() {
        return;
    }
    let rep = ptx::ptxas::assemble(text, ptxas_arch(target), &Default::default())
        .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}\n{text}"));
    for k in &rep.kernels {
        assert_eq!(
            k.spill_stores_bytes + k.spill_loads_bytes,
            0,
            "spills\n{text}"
        );
    }
}

/// Parses, validates (no errors), round-trips and runs kernel `k` on one warp with `input`
/// (u32 words, lane-major); returns `nout` words per lane, poisoned with 0xff before the run.
fn run(text: &str, input: &[u32], nout: usize, numerics: Numerics) -> Vec<u32> {
    let module = ptx::parse(text).unwrap();
    assert_eq!(ptx::parse(&ptx::print(&module)).unwrap(), module);
    let diags = ptx::validate(&module);
    assert!(diags.iter().all(|d| !d.is_error()), "{diags:?}\n{text}");
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, module, 0).unwrap();
    let pin = mem.alloc(4 * input.len() as u64, 0).unwrap();
    let bytes: Vec<u8> = input.iter().flat_map(|w| w.to_le_bytes()).collect();
    pin.write_bytes(0, &bytes);
    let out_len = 4 * 32 * nout as u64;
    let pout = mem.alloc(out_len, 0).unwrap();
    pout.fill(0, out_len, &[0xff]);
    let mut params = pin.base.to_le_bytes().to_vec();
    params.extend_from_slice(&pout.base.to_le_bytes());
    let o = LaunchOptions {
        numerics,
        ..Default::default()
    };
    let cfg = LaunchConfig::linear(1, 32);
    launch(m.kernel("k").unwrap(), mem.snapshot(), params, &cfg, &o).unwrap();
    let mut v = vec![0u8; out_len as usize];
    pout.read_bytes(0, &mut v);
    v.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f16 floating point type").

/// The quad-pair (0..4) lane `l` works for: lanes 0-3 with 16-19, 4-7 with 20-23, ...
fn quad_pair(l: usize) -> usize {
    (l % 16) / 4
}

/// `(row, col)` of element `i` (a0..a3) of A for lane `l`.
fn a_elem(row_major: bool, l: usize, i: usize) -> (usize, usize) {
    let upper = l >= 16;
    if row_major {
        (if upper { l % 4 + 4 } else { l % 4 }, i)
    } else {
        (if upper { i % 4 + 4 } else { i % 4 }, l % 4)
    }
}

/// `(row, col)` of element `i` (b0..b3) of B for lane `l`.
fn b_elem(row_major: bool, l: usize, i: usize) -> (usize, usize) {
    let upper = l >= 16;
    if row_major {
        (l % 4, if upper { i + 4 } else { i })
    } else {
        (i, if upper { l % 4 + 4 } else { l % 4 })
    }
}

/// `(row, col)` of element `i` (c0..c7) of C/D of type `t` for lane `l`.
fn c_elem(t: &str, l: usize, i: usize) -> (usize, usize) {
    let upper = if l < 16 { 0 } else { 4 };
    if t == "f16" {
        (l % 4 + upper, i)
    } else {
        let x = (l & 0b1) + (i & 0b10);
        (x + upper, (i & 0b100) + (l & 0b10) + (i & 0b1))
    }
}

/// The raw 16- or 32-bit element `i` of a lane's fragment words (f16: two per word, low half
/// first).
fn raw(words: &[u32], i: usize, t: &str) -> u32 {
    if t == "f16" {
        (words[i / 2] >> (16 * (i % 2))) & 0xffff
    } else {
        words[i]
    }
}

/// One quad-pair's matrices as raw bits: A 8x4, B 4x8, C 8x8 (C in its own type).
struct Mats {
    a: [[u32; 4]; 8],
    b: [[u32; 8]; 4],
    c: [[u32; 8]; 8],
}

/// Lane `l`'s input words: A (2), B (2), C.
fn lane_words(input: &[u32], l: usize, nin: usize) -> &[u32] {
    &input[l * nin..(l + 1) * nin]
}

fn matrices(f: &Form, input: &[u32], qp: usize) -> Mats {
    let nin = 4 + acc_regs(f.cty);
    let mut m = Mats {
        a: [[0; 4]; 8],
        b: [[0; 8]; 4],
        c: [[0; 8]; 8],
    };
    for l in (0..32).filter(|&l| quad_pair(l) == qp) {
        let w = lane_words(input, l, nin);
        for i in 0..4 {
            let (r, c) = a_elem(f.a_row, l, i);
            m.a[r][c] = raw(&w[0..2], i, "f16");
            let (r, c) = b_elem(f.b_row, l, i);
            m.b[r][c] = raw(&w[2..4], i, "f16");
        }
        for i in 0..8 {
            let (r, c) = c_elem(f.cty, l, i);
            m.c[r][c] = raw(&w[4..], i, f.cty);
        }
    }
    m
}

/// The expected D words of every lane: `elem(a_row, b_col, c)` gives D element bits.
fn expected(f: &Form, input: &[u32], elem: &dyn Fn([u32; 4], [u32; 4], u32) -> u32) -> Vec<u32> {
    let nd = acc_regs(f.dty);
    let mut out = vec![0u32; 32 * nd];
    for l in 0..32 {
        let m = matrices(f, input, quad_pair(l));
        for i in 0..8 {
            let (r, c) = c_elem(f.dty, l, i);
            let bcol = [m.b[0][c], m.b[1][c], m.b[2][c], m.b[3][c]];
            let v = elem(m.a[r], bcol, m.c[r][c]);
            if f.dty == "f16" {
                out[l * nd + i / 2] |= (v & 0xffff) << (16 * (i % 2));
            } else {
                out[l * nd + i] = v;
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Exact values and this file's IEEE encoder.

/// An exact binary value `(-1)^neg * m * 2^e`.
#[derive(Clone, Copy, Debug)]
struct Val {
    neg: bool,
    m: u64,
    e: i32,
}

fn decode_f16(x: u32) -> Val {
    let (neg, ex, fr) = (x >> 15 & 1 == 1, (x >> 10) & 0x1f, (x & 0x3ff) as u64);
    assert!(ex != 0x1f, "test inputs are finite");
    if ex == 0 {
        Val { neg, m: fr, e: -24 }
    } else {
        Val {
            neg,
            m: fr | 0x400,
            e: ex as i32 - 25,
        }
    }
}

fn decode_f32(x: u32) -> Val {
    let (neg, ex, fr) = (x >> 31 == 1, (x >> 23) & 0xff, (x & 0x7f_ffff) as u64);
    assert!(ex != 0xff, "test inputs are finite");
    if ex == 0 {
        Val {
            neg,
            m: fr,
            e: -149,
        }
    } else {
        Val {
            neg,
            m: fr | 0x80_0000,
            e: ex as i32 - 150,
        }
    }
}

fn decode(t: &str, x: u32) -> Val {
    if t == "f16" {
        decode_f16(x)
    } else {
        decode_f32(x)
    }
}

/// Exponent of the leading bit of a non-zero value.
fn lead(v: Val) -> i32 {
    v.e + 63 - v.m.leading_zeros() as i32
}

/// `v` as a signed integer in units of 2^unit, truncated toward zero.
fn fixed(v: Val, unit: i32) -> i128 {
    let mag = if v.e >= unit {
        (v.m as i128) << (v.e - unit)
    } else if unit - v.e >= 64 {
        0
    } else {
        (v.m >> (unit - v.e)) as i128
    };
    if v.neg {
        -mag
    } else {
        mag
    }
}

/// IEEE bits of `x * 2^unit` rounded to `t` (f16 or f32), to nearest even or toward zero
/// (where an overflow gives the largest finite value).
fn encode(x: i128, unit: i32, t: &str, nearest: bool) -> u32 {
    let (p, emin, ebits) = if t == "f16" {
        (11, -14, 5)
    } else {
        (24, -126, 8)
    };
    let sign = if x < 0 { 1u32 << (p + ebits - 1) } else { 0 };
    let mag = x.unsigned_abs();
    if mag == 0 {
        return 0;
    }
    let top = 127 - mag.leading_zeros() as i32;
    // lowest kept bit, as a bit index of `mag`
    let q = (top + 1 - p).max(emin + 1 - p - unit);
    let mut k = if q <= 0 { mag << -q } else { mag >> q };
    if nearest && q > 0 {
        let rem = mag & ((1u128 << q) - 1);
        let half = 1u128 << (q - 1);
        if rem > half || rem == half && k & 1 == 1 {
            k += 1;
        }
    }
    let mut lsb = q + unit;
    if k >> p == 1 {
        k >>= 1;
        lsb += 1;
    }
    if k >> (p - 1) == 0 {
        // subnormal (lsb is the subnormal spacing) or zero
        return sign | k as u32;
    }
    let biased = lsb + p - 1 + (1 << (ebits - 1)) - 1;
    let emax_biased = (1 << ebits) - 1;
    if biased >= emax_biased {
        let inf = (emax_biased as u32) << (p - 1);
        return sign | if nearest { inf } else { inf - 1 };
    }
    sign | (biased as u32) << (p - 1) | (k as u32 - (1 << (p - 1)))
}

/// Exact `a . b + c`, rounded once to nearest even to `dt`.
fn exact_ref(f: &Form, a: [u32; 4], b: [u32; 4], c: u32) -> u32 {
    const UNIT: i32 = -64; // the test's C values are multiples of 2^-63, products of 2^-48
    let mut s = fixed(decode(f.cty, c), UNIT);
    for k in 0..4 {
        let (x, y) = (decode_f16(a[k]), decode_f16(b[k]));
        let p = Val {
            neg: x.neg != y.neg,
            m: x.m * y.m,
            e: x.e + y.e,
        };
        s += fixed(p, UNIT);
    }
    encode(s, UNIT, f.dty, true)
}

/// The V100 model (module docs), in integers.
fn v100_ref(f: &Form, a: [u32; 4], b: [u32; 4], c: u32) -> u32 {
    let cv = decode(f.cty, c);
    let mut prods = Vec::new();
    // (product, nominal exponent = sum of the inputs' IEEE exponents, significand product >= 2)
    for k in 0..4 {
        let (x, y) = (decode_f16(a[k]), decode_f16(b[k]));
        if x.m != 0 && y.m != 0 {
            let p = Val {
                neg: x.neg != y.neg,
                m: x.m * y.m,
                e: x.e + y.e,
            };
            // an f16's IEEE exponent is its lsb exponent + 10 (subnormals: -14)
            prods.push((p, x.e + 10 + y.e + 10, x.m * y.m >= 1 << 21));
        }
    }
    if prods.is_empty() {
        return encode(fixed(cv, cv.e), cv.e, f.dty, true);
    }
    let e_nom = prods.iter().map(|p| p.1).max().unwrap();
    let big = prods.iter().any(|p| p.1 == e_nom && p.2);
    let special = big && (cv.m == 0 || lead(cv) <= e_nom);
    let mut e_max = prods.iter().map(|p| lead(p.0)).max().unwrap();
    if cv.m != 0 {
        e_max = e_max.max(lead(cv));
    }
    let unit = e_max - 23 - special as i32;
    let s: i128 = prods.iter().map(|p| fixed(p.0, unit)).sum::<i128>() + fixed(cv, unit);
    encode(s, unit, f.dty, f.dty == "f16")
}

/// The sm_90 f16 model through `tc_numerics::reference_dot`, then f16 rounding for an f16 D.
fn sm90_ref(f: &Form, a: [u32; 4], b: [u32; 4], c: u32) -> u32 {
    let m = model_for(90, Ty::F16).unwrap();
    let c32 = if f.cty == "f16" {
        half::f16::from_bits(c as u16).to_f32().to_bits()
    } else {
        c
    };
    let a64: Vec<u64> = a.iter().map(|&x| x as u64).collect();
    let b64: Vec<u64> = b.iter().map(|&x| x as u64).collect();
    let d = reference_dot(&m, Ty::F16, Ty::F16, &a64, &b64, c32).unwrap();
    if f.dty == "f16" {
        half::f16::from_f32(f32::from_bits(d)).to_bits() as u32
    } else {
        d
    }
}

// ---------------------------------------------------------------------------------------------
// Random inputs.

/// A random non-zero finite f16: a quarter subnormal, half near 1 (exponents 2^-6..2^6), a
/// quarter anywhere in the normal range; either sign.
fn rand_f16(r: &mut StdRng) -> u32 {
    let sign = (r.gen::<bool>() as u32) << 15;
    let frac = r.gen_range(0..0x400u32);
    match r.gen_range(0..4) {
        0 => sign | r.gen_range(1..0x400u32),
        1 | 2 => sign | r.gen_range(9..=21u32) << 10 | frac,
        _ => sign | r.gen_range(1..=30u32) << 10 | frac,
    }
}

/// A random non-zero f32 C: magnitude 2^-40 .. 2^31 (multiples of 2^-63), either sign.
fn rand_f32(r: &mut StdRng) -> u32 {
    let sign = (r.gen::<bool>() as u32) << 31;
    sign | r.gen_range(87..=157u32) << 23 | r.gen_range(0..0x80_0000u32)
}

/// Random input words for form `f`: per lane A (2 f16x2), B (2 f16x2), C.
fn rand_input(f: &Form, r: &mut StdRng) -> Vec<u32> {
    let nin = 4 + acc_regs(f.cty);
    let mut v = Vec::with_capacity(32 * nin);
    for _ in 0..32 {
        for _ in 0..4 {
            v.push(rand_f16(r) | rand_f16(r) << 16);
        }
        for _ in 0..acc_regs(f.cty) {
            v.push(if f.cty == "f16" {
                rand_f16(r) | rand_f16(r) << 16
            } else {
                rand_f32(r)
            });
        }
    }
    v
}

type Ref = fn(&Form, [u32; 4], [u32; 4], u32) -> u32;

/// Runs every form on `target` under `numerics` (`rounds` random inputs each) against `refr`.
fn check_forms(target: &str, numerics: Numerics, refr: Ref, rounds: usize) {
    let mut r = rng();
    for f in all_forms() {
        let text = form_kernel(&f, target);
        ptxas_accepts(&text, target);
        for _ in 0..rounds {
            let input = rand_input(&f, &mut r);
            let got = run(&text, &input, acc_regs(f.dty), numerics);
            let want = expected(&f, &input, &|a, b, c| refr(&f, a, b, c));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g,
                    w,
                    "{f:?} {target} {numerics:?}: lane {} D word {}: {g:#x} != {w:#x}",
                    i / acc_regs(f.dty),
                    i % acc_regs(f.dty)
                );
            }
        }
    }
}

#[test]
fn every_form_exact_mode_matches_the_exact_sum() {
    check_forms("sm_70", Numerics::Exact, exact_ref, 3);
}

#[test]
fn every_form_on_sm70_matches_the_v100_model() {
    check_forms("sm_70", Numerics::Hardware, v100_ref, 3);
}

#[test]
fn every_form_on_sm90_matches_the_target_f16_model() {
    check_forms("sm_90", Numerics::Hardware, sm90_ref, 2);
}

/// Quad-pair `qp` gets A row 0 = `a`, B column 0 = `b`, C(0,0) = `c` (f32 C, f32 D, .row.col)
/// and small non-zero values elsewhere; returns D(0,0) of quad-pair 0.
fn one_dot(a: [f32; 4], b: [f32; 4], c: f32, numerics: Numerics) -> u32 {
    let f = Form {
        a_row: true,
        b_row: false,
        dty: "f32",
        cty: "f32",
    };
    let h = |x: f32| half::f16::from_f32(x).to_bits() as u32;
    let mut input = rand_input(&f, &mut rng());
    // lane 0 holds row 0 of A (a0..a3), column 0 of B (b0..b3) and C(0,0) as c0
    input[0] = h(a[0]) | h(a[1]) << 16;
    input[1] = h(a[2]) | h(a[3]) << 16;
    input[2] = h(b[0]) | h(b[1]) << 16;
    input[3] = h(b[2]) | h(b[3]) << 16;
    input[4] = c.to_bits();
    let text = form_kernel(&f, "sm_70");
    run(&text, &input, 8, numerics)[0]
}

#[test]
fn v100_model_keeps_one_more_bit_when_the_largest_product_is_2_or_more() {
    // 1.5 * 1.5 = 2.25 (significand product 2.25 at nominal exponent 0), -2^-12 * 2^-11 =
    // -2^-23, two products of 2^-40 and C = 2^-30. The V100 model aligns to 2^-23 (24 bits
    // below 2^1): 2.25 - 2^-23, rounded toward zero to f32 = 2.25 - 2^-22. Aligning with 23
    // bits below 2^1 (the sm_80 model) drops the -2^-23; the exact sum rounds to 2.25.
    let p40 = 2f32.powi(-20);
    let a = [1.5, -(2f32.powi(-12)), p40, p40];
    let b = [1.5, 2f32.powi(-11), p40, p40];
    let c = 2f32.powi(-30);
    let below = (2.25f32 - 2f32.powi(-22)).to_bits();
    assert_eq!(below, 0x400f_ffff);
    assert_eq!(one_dot(a, b, c, Numerics::Hardware), below);
    assert_eq!(one_dot(a, b, c, Numerics::Exact), 2.25f32.to_bits());
    // a C above the products' nominal exponent turns the extra bit off: aligned to 2^2 - 23,
    // the -2^-22 (a product of -2^-11 * 2^-11) is dropped and 6.25 is exact
    let a2 = [1.5, -(2f32.powi(-11)), p40, p40];
    let b2 = [1.5, 2f32.powi(-11), p40, p40];
    assert_eq!(one_dot(a2, b2, 4.0, Numerics::Hardware), 6.25f32.to_bits());
    assert_eq!(
        one_dot(a2, b2, 4.0, Numerics::Exact),
        6.25f32.to_bits(),
        "6.25 - 2^-22 + 2^-39 rounds to 6.25 at f32 (ulp 2^-21)"
    );
}

/// A kernel with one mma line whose fragments use the given register lists.
fn bad_kernel(mma: &str) -> String {
    format!(
        ".version 8.7\n.target sm_80\n.address_size 64\n.visible .entry k()\n{{\n\
         .reg .b32 %r<12>;\n.reg .f32 %f<16>;\n{mma}\nret;\n}}\n"
    )
}

#[test]
fn forms_ptxas_rejects_are_rejected_with_a_clear_message() {
    let f8 = "{%f0, %f1, %f2, %f3, %f4, %f5, %f6, %f7}";
    let c8 = "{%f8, %f9, %f10, %f11, %f12, %f13, %f14, %f15}";
    let h4 = "{%r4, %r5, %r6, %r7}";
    let ab = "{%r0, %r1}, {%r2, %r3}";
    let cases = [
        (
            format!("mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f32 {h4}, {ab}, {c8};"),
            ".dtype must be .f32 when .ctype is .f32",
        ),
        (
            format!("mma.sync.aligned.m8n8k4.row.col.f32.tf32.tf32.f32 {f8}, {ab}, {c8};"),
            "takes .f16 (Volta) or .f64",
        ),
        (
            format!("mma.sync.aligned.m8n8k4.row.col.f16.bf16.bf16.f16 {h4}, {ab}, {h4};"),
            "only .f32.bf16.bf16.f32 assembles",
        ),
        (
            format!("mma.sync.aligned.m8n8k4.row.col.f32.f16.bf16.f32 {f8}, {ab}, {c8};"),
            "B must be .f16",
        ),
        (
            format!("mma.sync.aligned.m8n8k4.row.col.satfinite.f32.f16.f16.f32 {f8}, {ab}, {c8};"),
            ".satfinite",
        ),
        (
            format!("mma.sync.aligned.m8n8k4.f32.f16.f16.f32 {f8}, {ab}, {c8};"),
            ".alayout.blayout",
        ),
        (
            format!("mma.sync.m8n8k4.row.col.f32.f16.f16.f32 {f8}, {ab}, {c8};"),
            ".sync.aligned",
        ),
        (
            format!("mma.sync.aligned.m8n8k4.row.col.rn.f32.f16.f16.f32 {f8}, {ab}, {c8};"),
            "rounding",
        ),
        (
            format!(
                "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {{%f0, %f1, %f2, %f3}}, {ab}, {c8};"
            ),
            "fragment D needs 8 registers",
        ),
        (
            format!("mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f16 {h4}, {ab}, {c8};"),
            "fragment C needs 4 registers",
        ),
    ];
    for (line, want) in cases {
        let text = bad_kernel(&line);
        if ptx::ptxas::ptxas_for_tests("isa_mma_m8n8k4 rejections").is_some() {
            assert!(
                ptx::ptxas::assemble(&text, "sm_80", &Default::default()).is_err(),
                "ptxas accepts {line}"
            );
        }
        let Ok(m) = ptx::parse(&text) else {
            continue; // rejected by the parser: also a rejection
        };
        let errs: Vec<String> = ptx::validate(&m)
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.message.clone())
            .collect();
        assert!(
            errs.iter().any(|e| e.contains(want)),
            "validator on `{line}`: {errs:?}"
        );
        let mem = GlobalMemory::new();
        let lm = LoadedModule::load(&mem, m, 0).unwrap();
        assert!(lm.kernel("k").is_err(), "the emulator decodes `{line}`");
    }
}

#[test]
fn undocumented_bf16_form_is_accepted_with_a_warning_and_not_run() {
    // ptxas 13.5 assembles it for sm_80 (with no arithmetic in the SASS); the PTX ISA has no
    // m8n8k4 .bf16, so the validator warns and the emulator refuses it by name
    let line = "mma.sync.aligned.m8n8k4.col.row.f32.bf16.bf16.f32 \
                {%f0, %f1, %f2, %f3, %f4, %f5, %f6, %f7}, {%r0, %r1}, {%r2, %r3}, \
                {%f8, %f9, %f10, %f11, %f12, %f13, %f14, %f15};";
    let text = bad_kernel(line);
    if ptx::ptxas::ptxas_for_tests("isa_mma_m8n8k4 bf16").is_some() {
        ptx::ptxas::assemble(&text, "sm_80", &Default::default()).unwrap();
    }
    let m = ptx::parse(&text).unwrap();
    let diags = ptx::validate(&m);
    assert!(diags.iter().all(|d| !d.is_error()), "{diags:?}");
    assert!(
        diags
            .iter()
            .any(|d| d.message.contains("not in the PTX ISA")),
        "{diags:?}"
    );
    let mem = GlobalMemory::new();
    let lm = LoadedModule::load(&mem, m, 0).unwrap();
    let Err(err) = lm.kernel("k") else {
        panic!("the emulator must refuse the .bf16 form");
    };
    assert!(err.to_string().contains(".bf16 is not emulated"), "{err}");
}
