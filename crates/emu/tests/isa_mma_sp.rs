//! Warp matrix forms of issue 16 item 3 beyond the dense f16/bf16/tf32/fp8/s8 `mma`: sparse
//! `mma.sp{::ordered_metadata}` for every shape and type (random 2:4 / 1:2 / pair-wise 4:8
//! patterns, every valid sparsity selector, lanes that do not hold metadata filled with
//! garbage), and the dense sub-byte and single-bit `mma` forms (`.s4`/`.u4`, `.b1` with
//! `.xor.popc` / `.and.popc`, `.s8` m8n8k16).
//!
//! Each kernel is checked by ptxas for its target and run on the emulator, outputs poisoned.
//! The reference is computed here from the PTX ISA's fragment rules: the test builds a dense A
//! with the sparsity pattern, its compressed form and the metadata, and compares D with an
//! exact dot product (integers in i64; floats in f64 on inputs whose products and sums are
//! exact, then one rounding to D's type) in the exact mode, and with
//! `tc_numerics::reference_dot` on the decompressed operands under the hardware model.

use emu::tc_numerics::{model_for, reference_dot};
use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule, Numerics};
use half::{bf16, f16};
use ptx::Ty;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn ptxas(text: &str, target: &str) {
    if ptx::ptxas::ptxas_for_tests("isa_mma_sp test PTX").is_some() {
        ptx::ptxas::assemble(text, target, &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX for {target}: {e}\n{text}"));
    }
}

/// Runs kernel `k` on one warp: `input` (u32 words, lane-major) in, `nout` words per lane out
/// (poisoned with 0xff bytes first).
fn run(text: &str, input: &[u32], nout: usize, numerics: Numerics) -> Vec<u32> {
    let mem = GlobalMemory::new();
    let module = ptx::parse(text).unwrap();
    assert_eq!(
        ptx::parse(&ptx::print(&module)).unwrap(),
        module,
        "round trip"
    );
    let diags = ptx::validate(&module);
    assert!(
        diags.iter().all(|d| !d.is_error()),
        "validator: {diags:?}\n{text}"
    );
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
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        params,
        &LaunchConfig::linear(1, 32),
        &o,
    )
    .unwrap();
    let mut v = vec![0u8; out_len as usize];
    pout.read_bytes(0, &mut v);
    v.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A kernel that loads `nin` words per lane into %i0.., moves C into `cty` registers, runs
/// `ins` with D in %d.., A/B/C/metadata operand strings given, and stores D.
struct Kern<'a> {
    target: &'a str,
    version: &'a str,
    nin: usize,
    nc: usize,
    nd: usize,
    /// register type of C and D (`f32` or `b32`)
    acc_reg: &'a str,
    /// first input word of C
    c_at: usize,
}

fn list(p: &str, from: usize, n: usize) -> String {
    let v: Vec<String> = (from..from + n).map(|i| format!("%{p}{i}")).collect();
    format!("{{{}}}", v.join(", "))
}

impl Kern<'_> {
    fn text(&self, ins: &str, tail: &str) -> String {
        let mut s = format!(
            ".version {}\n.target {}\n.address_size 64\n.visible .entry k(.param .u64 pin, .param .u64 pout)\n{{\n\
             .reg .b32 %i<{}>, %t;\n.reg .{} %c<{}>, %d<{}>;\n.reg .b64 %rd<4>;\n\
             ld.param.u64 %rd1, [pin];\nld.param.u64 %rd2, [pout];\nmov.u32 %t, %tid.x;\n\
             mul.wide.u32 %rd3, %t, {};\nadd.s64 %rd1, %rd1, %rd3;\n\
             mul.wide.u32 %rd3, %t, {};\nadd.s64 %rd2, %rd2, %rd3;\n",
            self.version,
            self.target,
            self.nin,
            self.acc_reg,
            self.nc,
            self.nd,
            4 * self.nin,
            4 * self.nd
        );
        for i in 0..self.nin {
            s.push_str(&format!("ld.global.u32 %i{i}, [%rd1+{}];\n", 4 * i));
        }
        for i in 0..self.nc {
            s.push_str(&format!("mov.b32 %c{i}, %i{};\n", self.c_at + i));
        }
        s.push_str(&format!("{ins} {}, {tail};\n", list("d", 0, self.nd)));
        for i in 0..self.nd {
            s.push_str(&format!("st.global.b32 [%rd2+{}], %d{i};\n", 4 * i));
        }
        s.push_str("ret;\n}\n");
        s
    }
}

/// Input element types of the tests.
#[derive(Clone, Copy, Debug, PartialEq)]
enum El {
    F16,
    Bf16,
    Tf32,
    E4m3,
    E5m2,
    S8,
    U8,
    S4,
    U4,
    B1,
}

impl El {
    fn bits(self) -> usize {
        match self {
            El::F16 | El::Bf16 => 16,
            El::Tf32 => 32,
            El::E4m3 | El::E5m2 | El::S8 | El::U8 => 8,
            El::S4 | El::U4 => 4,
            El::B1 => 1,
        }
    }
    fn ty(self) -> Ty {
        match self {
            El::F16 => Ty::F16,
            El::Bf16 => Ty::Bf16,
            El::Tf32 => Ty::Tf32,
            El::E4m3 => Ty::E4m3,
            El::E5m2 => Ty::E5m2,
            El::S8 => Ty::S8,
            El::U8 => Ty::U8,
            El::S4 => Ty::S4,
            El::U4 => Ty::U4,
            El::B1 => Ty::B1,
        }
    }
    /// A random non-zero value and its raw bits; float values are small enough that every
    /// product and sum of a test is exact in f64.
    fn random(self, rng: &mut StdRng) -> (f64, u32) {
        let small = |rng: &mut StdRng| loop {
            let x = rng.gen_range(-127i32..=127);
            if x != 0 {
                return x as f64 / 64.0;
            }
        };
        match self {
            El::F16 => {
                let x = small(rng);
                (x, f16::from_f64(x).to_bits() as u32)
            }
            El::Bf16 => {
                let x = small(rng);
                (x, bf16::from_f64(x).to_bits() as u32)
            }
            // tf32 ignores the low 13 bits of its register: fill them with garbage
            El::Tf32 => {
                let x = small(rng);
                (x, (x as f32).to_bits() | rng.gen_range(0..1 << 13))
            }
            El::E4m3 | El::E5m2 => loop {
                let code = rng.gen_range(0..256u32);
                let x = fp8(self, code);
                if x != 0.0 && x.abs() >= 1.0 / 16.0 && x.abs() <= 16.0 {
                    return (x, code);
                }
            },
            El::S8 => {
                let v = rng.gen_range(-128i32..=127);
                (v as f64, v as u8 as u32)
            }
            El::U8 => {
                let v = rng.gen_range(0..=255u32);
                (v as f64, v)
            }
            El::S4 => {
                let v = rng.gen_range(-8i32..=7);
                (v as f64, (v as u32) & 15)
            }
            El::U4 => {
                let v = rng.gen_range(0..=15u32);
                (v as f64, v)
            }
            El::B1 => {
                let v = rng.gen_range(0..=1u32);
                (v as f64, v)
            }
        }
    }
}

/// An 8-bit float code's value, decoded bit by bit (normal and subnormal; the NaN codes are
/// never generated by the callers' range filter).
fn fp8(el: El, code: u32) -> f64 {
    let (eb, mb, bias) = if el == El::E4m3 {
        (4, 3, 7)
    } else {
        (5, 2, 15)
    };
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> mb) & ((1 << eb) - 1)) as i32;
    let m = (code & ((1 << mb) - 1)) as f64 / (1 << mb) as f64;
    let v = if e == 0 {
        m * 2f64.powi(1 - bias)
    } else {
        (1.0 + m) * 2f64.powi(e - bias)
    };
    if (el == El::E5m2 && e == 31) || (el == El::E4m3 && code & 0x7f == 0x7f) {
        return f64::NAN;
    }
    sign * v
}

/// Accumulator types.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Acc {
    F32,
    F16,
    S32,
}

impl Acc {
    fn regs(self) -> usize {
        if self == Acc::F16 {
            2
        } else {
            4
        }
    }
}

/// Random C values (16 x 8 or 8 x 8) and the accumulator fragment words of each lane: element
/// `e` at (g + 8*(e >> 1), 2q + (e & 1)) for m16, (g, 2q + e) for m8; f16 two per word.
fn random_c(rng: &mut StdRng, acc: Acc, m: usize) -> (Vec<Vec<f64>>, Vec<Vec<u32>>) {
    let c: Vec<Vec<f64>> = (0..m)
        .map(|_| {
            (0..8)
                .map(|_| match acc {
                    Acc::S32 if rng.gen_bool(0.3) => {
                        // near the ends of the range: .satfinite clamps, plain forms wrap
                        let s = if rng.gen_bool(0.5) { 1.0 } else { -1.0 };
                        s * (i32::MAX - rng.gen_range(0..2000)) as f64
                    }
                    Acc::S32 => rng.gen_range(-100_000..100_000) as f64,
                    _ => rng.gen_range(-127i32..=127) as f64 / 64.0,
                })
                .collect()
        })
        .collect();
    let per = m * 8 / 32;
    let words = (0..32)
        .map(|lane| {
            let (g, q) = (lane / 4, lane % 4);
            let el = |e: usize| {
                if m == 16 {
                    c[g + 8 * (e >> 1)][2 * q + (e & 1)]
                } else {
                    c[g][2 * q + e]
                }
            };
            match acc {
                Acc::F32 => (0..per).map(|e| (el(e) as f32).to_bits()).collect(),
                Acc::S32 => (0..per).map(|e| el(e) as i64 as i32 as u32).collect(),
                Acc::F16 => (0..per / 2)
                    .map(|r| {
                        let h = |e| f16::from_f64(el(e)).to_bits() as u32;
                        h(2 * r) | h(2 * r + 1) << 16
                    })
                    .collect(),
            }
        })
        .collect();
    (c, words)
}

/// Packs elements of `bits` bits into a word (element 0 in the low bits).
fn pack(vals: &[u32], bits: usize) -> u32 {
    vals.iter().enumerate().fold(0u32, |w, (j, v)| {
        if bits == 32 {
            *v
        } else {
            w | (v & ((1u32 << bits) - 1)) << (j * bits)
        }
    })
}

/// Words of an A-like fragment of the matrix `raw` (`rows x cols` raw element bits): register
/// `i`, element `j` at row g + 8*(i & 1), column pr*q + j + 4*pr*(i >> 1) for 16 rows; row g,
/// column pr*q + j + 4*pr*i for 8 rows (PTX ISA mma fragments).
fn a_words(raw: &[Vec<u32>], bits: usize, lane: usize) -> Vec<u32> {
    let (rows, cols) = (raw.len(), raw[0].len());
    let pr = 32 / bits;
    let regs = rows * cols * bits / 1024;
    let (g, q) = (lane / 4, lane % 4);
    (0..regs)
        .map(|i| {
            let (r, c0) = if rows == 16 {
                (g + 8 * (i & 1), pr * q + 4 * pr * (i >> 1))
            } else {
                (g, pr * q + 4 * pr * i)
            };
            pack(&raw[r][c0..c0 + pr], bits)
        })
        .collect()
}

/// Words of a B fragment of `raw` (k x 8): register r, element j at k = pr*q + j + 4*pr*r,
/// column g.
fn b_words(raw: &[Vec<u32>], bits: usize, lane: usize) -> Vec<u32> {
    let k = raw.len();
    let pr = 32 / bits;
    let (g, q) = (lane / 4, lane % 4);
    (0..k * 8 * bits / 1024)
        .map(|r| {
            let col: Vec<u32> = (0..pr).map(|j| raw[pr * q + j + 4 * pr * r][g]).collect();
            pack(&col, bits)
        })
        .collect()
}

/// The expected D word of lane `lane`, accumulator element `e`, from `dot(row, col) -> value`.
fn d_word(acc: Acc, sat: bool, vals: &[f64]) -> u32 {
    match acc {
        Acc::F32 => (vals[0] as f32).to_bits(),
        Acc::F16 => {
            f16::from_f64(vals[0]).to_bits() as u32
                | (f16::from_f64(vals[1]).to_bits() as u32) << 16
        }
        Acc::S32 => {
            let v = vals[0] as i64;
            if sat {
                v.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32
            } else {
                v as i32 as u32
            }
        }
    }
}

/// Position of accumulator element `e` of lane `lane`.
fn c_pos(m: usize, lane: usize, e: usize) -> (usize, usize) {
    let (g, q) = (lane / 4, lane % 4);
    if m == 16 {
        (g + 8 * (e >> 1), 2 * q + (e & 1))
    } else {
        (g, 2 * q + e)
    }
}

/// One sparse form.
#[derive(Clone, Copy, Debug)]
struct SpForm {
    k: usize,
    a: El,
    b: El,
    acc: Acc,
    sat: bool,
    target: &'static str,
}

/// A random sparse A (16 x k): for each chunk of four units (16-bit units for f16/bf16/tf32,
/// where a tf32 is two units; bytes otherwise, where an s4/u4 unit is a pair), two kept units
/// at positions i0 < i1. Returns the dense raw elements, values, compressed raw elements and
/// each row's chunk positions.
struct SparseA {
    raw: Vec<Vec<u32>>,
    val: Vec<Vec<f64>>,
    comp: Vec<Vec<u32>>,
    pos: Vec<Vec<(u32, u32)>>,
}

fn sparse_a(rng: &mut StdRng, f: &SpForm) -> SparseA {
    let el = f.a;
    // elements per unit (tf32: half an element per unit, handled as one element per pair of units)
    let per_unit = match el {
        El::S4 | El::U4 => 2,
        _ => 1,
    };
    let chunk_elems = if el == El::Tf32 { 2 } else { 4 * per_unit };
    let mut s = SparseA {
        raw: vec![vec![0; f.k]; 16],
        val: vec![vec![0.0; f.k]; 16],
        comp: vec![Vec::new(); 16],
        pos: vec![Vec::new(); 16],
    };
    for r in 0..16 {
        for ch in 0..f.k / chunk_elems {
            let (i0, i1) = if el == El::Tf32 {
                // one of the two tf32 elements: units 0,1 or 2,3
                if rng.gen_bool(0.5) {
                    (0, 1)
                } else {
                    (2, 3)
                }
            } else {
                let i0 = rng.gen_range(0..3u32);
                (i0, rng.gen_range(i0 + 1..4))
            };
            s.pos[r].push((i0, i1));
            let kept: Vec<usize> = if el == El::Tf32 {
                vec![ch * 2 + (i0 / 2) as usize]
            } else {
                [i0, i1]
                    .iter()
                    .flat_map(|&u| {
                        (0..per_unit).map(move |e| ch * chunk_elems + u as usize * per_unit + e)
                    })
                    .collect()
            };
            for col in kept {
                let (v, bits) = el.random(rng);
                s.raw[r][col] = bits;
                s.val[r][col] = v;
                s.comp[r].push(bits);
            }
        }
    }
    s
}

/// The metadata word of lane `lane` for selector `sel` (garbage in lanes outside the selected
/// threads): 16-bit units: thread j of t holds chunks 4j.. of rows g (bits 0..15) and g+8
/// (16..31); bytes: thread j holds chunks 8*(j >> 1).. of row g + 8*(j & 1).
fn meta_word(
    rng: &mut StdRng,
    f: &SpForm,
    pos: &[Vec<(u32, u32)>],
    lane: usize,
    sel: usize,
) -> u32 {
    let unit16 = matches!(f.a, El::F16 | El::Bf16 | El::Tf32);
    let chunks = pos[0].len();
    let threads = if unit16 { chunks / 4 } else { 2 * chunks / 8 };
    let (g, q) = (lane / 4, lane % 4);
    if q < threads * sel || q >= threads * (sel + 1) {
        return rng.gen();
    }
    let j = q - threads * sel;
    let nib = |r: usize, c: usize| {
        let (i0, i1) = pos[r][c];
        i0 | i1 << 2
    };
    let mut w = 0u32;
    if unit16 {
        for c in 0..4 {
            w |= nib(g, 4 * j + c) << (4 * c);
            w |= nib(g + 8, 4 * j + c) << (16 + 4 * c);
        }
    } else {
        let row = g + 8 * (j & 1);
        for c in 0..8 {
            w |= nib(row, 8 * (j >> 1) + c) << (4 * c);
        }
    }
    w
}

fn ty_name(el: El) -> &'static str {
    match el {
        El::F16 => "f16",
        El::Bf16 => "bf16",
        El::Tf32 => "tf32",
        El::E4m3 => "e4m3",
        El::E5m2 => "e5m2",
        El::S8 => "s8",
        El::U8 => "u8",
        El::S4 => "s4",
        El::U4 => "u4",
        El::B1 => "b1",
    }
}

fn acc_name(a: Acc) -> &'static str {
    match a {
        Acc::F32 => "f32",
        Acc::F16 => "f16",
        Acc::S32 => "s32",
    }
}

/// Runs one sparse form with selector `sel` under `numerics` and checks every D element.
fn sparse_case(f: SpForm, sel: usize, ordered: bool, numerics: Numerics, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let sa = sparse_a(&mut rng, &f);
    let bmat: Vec<Vec<(f64, u32)>> = (0..f.k)
        .map(|_| (0..8).map(|_| f.b.random(&mut rng)).collect())
        .collect();
    let braw: Vec<Vec<u32>> = bmat
        .iter()
        .map(|r| r.iter().map(|x| x.1).collect())
        .collect();
    let (c, cw) = random_c(&mut rng, f.acc, 16);
    let bits = f.a.bits();
    let na = 16 * f.k / 2 * bits / 1024;
    let nb = f.k * 8 * f.b.bits() / 1024;
    let nc = f.acc.regs();
    let nin = na + nb + nc + 1;
    let mut input = Vec::new();
    for (lane, c_lane) in cw.iter().enumerate() {
        input.extend(a_words(&sa.comp, bits, lane));
        input.extend(b_words(&braw, f.b.bits(), lane));
        input.extend(c_lane);
        input.push(meta_word(&mut rng, &f, &sa.pos, lane, sel));
    }
    let kern = Kern {
        target: f.target,
        version: "8.5",
        nin,
        nc,
        nd: nc,
        acc_reg: if f.acc == Acc::F32 { "f32" } else { "b32" },
        c_at: na + nb,
    };
    let sp = if ordered {
        "sp::ordered_metadata"
    } else {
        "sp"
    };
    let ins = format!(
        "mma.{sp}.sync.aligned.m16n8k{}.row.col{}.{}.{}.{}.{}",
        f.k,
        if f.sat { ".satfinite" } else { "" },
        acc_name(f.acc),
        ty_name(f.a),
        ty_name(f.b),
        acc_name(f.acc)
    );
    let tail = format!(
        "{}, {}, {}, %i{}, {sel}",
        list("i", 0, na),
        list("i", na, nb),
        list("c", 0, nc),
        nin - 1
    );
    let text = kern.text(&ins, &tail);
    ptxas(&text, f.target);
    let got = run(&text, &input, nc, numerics);
    let sm: u32 = f.target[3..5].parse().unwrap();
    for lane in 0..32 {
        let elems = if f.acc == Acc::F16 { 2 } else { 1 };
        for w in 0..nc {
            let vals: Vec<f64> = (0..elems)
                .map(|h| {
                    let (r, col) = c_pos(16, lane, w * elems + h);
                    let s: f64 = (0..f.k).map(|kk| sa.val[r][kk] * bmat[kk][col].0).sum();
                    s + c[r][col]
                })
                .collect();
            let want = match numerics {
                Numerics::Hardware => {
                    let (r, col) = c_pos(16, lane, w);
                    let model = model_for(sm, f.a.ty()).unwrap();
                    let a: Vec<u64> = sa.raw[r].iter().map(|x| *x as u64).collect();
                    let b: Vec<u64> = (0..f.k).map(|kk| braw[kk][col] as u64).collect();
                    let cbits = (c[r][col] as f32).to_bits();
                    reference_dot(&model, f.a.ty(), f.b.ty(), &a, &b, cbits).unwrap()
                }
                Numerics::Exact => d_word(f.acc, f.sat, &vals),
            };
            assert_eq!(
                got[nc * lane + w],
                want,
                "{ins} sel {sel} {numerics:?}: lane {lane} D word {w}"
            );
        }
    }
}

const fn sp(k: usize, a: El, b: El, acc: Acc, sat: bool, target: &'static str) -> SpForm {
    SpForm {
        k,
        a,
        b,
        acc,
        sat,
        target,
    }
}

/// Every sparse shape/type with every valid selector, exact numerics.
#[test]
fn mma_sp_every_form_and_selector() {
    use El::*;
    let forms = [
        (sp(16, F16, F16, Acc::F32, false, "sm_80"), 4),
        (sp(16, Bf16, Bf16, Acc::F32, false, "sm_80"), 4),
        (sp(16, F16, F16, Acc::F16, false, "sm_80"), 4),
        (sp(32, F16, F16, Acc::F32, false, "sm_80"), 2),
        (sp(32, F16, F16, Acc::F16, false, "sm_80"), 2),
        (sp(32, Bf16, Bf16, Acc::F32, false, "sm_80"), 2),
        (sp(8, Tf32, Tf32, Acc::F32, false, "sm_80"), 4),
        (sp(16, Tf32, Tf32, Acc::F32, false, "sm_80"), 2),
        (sp(64, E4m3, E5m2, Acc::F32, false, "sm_89"), 1),
        (sp(64, E5m2, E4m3, Acc::F32, false, "sm_90a"), 1),
        (sp(32, S8, U8, Acc::S32, true, "sm_80"), 2),
        (sp(32, U8, S8, Acc::S32, false, "sm_80"), 2),
        (sp(64, S8, S8, Acc::S32, true, "sm_80"), 1),
        (sp(64, U8, U8, Acc::S32, false, "sm_90a"), 1),
        (sp(64, S4, U4, Acc::S32, true, "sm_80"), 2),
        (sp(64, U4, U4, Acc::S32, false, "sm_80"), 2),
        (sp(128, S4, S4, Acc::S32, false, "sm_80"), 1),
        (sp(128, U4, S4, Acc::S32, true, "sm_90a"), 1),
    ];
    for (n, (f, sels)) in forms.into_iter().enumerate() {
        for sel in 0..sels {
            let ordered = (n + sel) % 2 == 1;
            sparse_case(
                f,
                sel,
                ordered,
                Numerics::Exact,
                1000 + 10 * n as u64 + sel as u64,
            );
        }
    }
}

/// The float forms under each target's tensor-core model agree with `reference_dot` on the
/// decompressed operands.
#[test]
fn mma_sp_hardware_numerics_match_the_reference_model() {
    use El::*;
    let forms = [
        sp(32, F16, F16, Acc::F32, false, "sm_80"),
        sp(16, Bf16, Bf16, Acc::F32, false, "sm_90a"),
        sp(16, Tf32, Tf32, Acc::F32, false, "sm_80"),
        sp(64, E4m3, E4m3, Acc::F32, false, "sm_89"),
        sp(64, E5m2, E4m3, Acc::F32, false, "sm_90a"),
    ];
    for (n, f) in forms.into_iter().enumerate() {
        sparse_case(f, 0, true, Numerics::Hardware, 2000 + n as u64);
    }
}

/// Dense sub-byte, single-bit and m8n8k16 mma forms against exact integer dot products.
#[test]
fn mma_sub_byte_and_b1_forms() {
    use El::*;
    // (m, k, a, b, satfinite, bit op, target)
    let forms: [(usize, usize, El, El, bool, &str, &str); 11] = [
        (8, 16, S8, U8, false, "", "sm_75"),
        (8, 16, U8, U8, true, "", "sm_80"),
        (8, 32, S4, S4, true, "", "sm_75"),
        (8, 32, U4, S4, false, "", "sm_80"),
        (16, 32, S4, U4, false, "", "sm_80"),
        (16, 64, U4, U4, true, "", "sm_90a"),
        (16, 64, S4, S4, false, "", "sm_80"),
        (8, 128, B1, B1, false, "xor", "sm_80"),
        (8, 128, B1, B1, false, "and", "sm_80"),
        (16, 128, B1, B1, false, "xor", "sm_80"),
        (16, 256, B1, B1, false, "and", "sm_90a"),
    ];
    for (n, (m, k, a, b, sat, op, target)) in forms.into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(3000 + n as u64);
        let am: Vec<Vec<(f64, u32)>> = (0..m)
            .map(|_| (0..k).map(|_| a.random(&mut rng)).collect())
            .collect();
        let bm: Vec<Vec<(f64, u32)>> = (0..k)
            .map(|_| (0..8).map(|_| b.random(&mut rng)).collect())
            .collect();
        let raw = |x: &Vec<Vec<(f64, u32)>>| -> Vec<Vec<u32>> {
            x.iter().map(|r| r.iter().map(|e| e.1).collect()).collect()
        };
        let (c, cw) = random_c(&mut rng, Acc::S32, m);
        let na = m * k * a.bits() / 1024;
        let nb = k * 8 * b.bits() / 1024;
        let nc = m * 8 / 32;
        let mut input = Vec::new();
        for (lane, c_lane) in cw.iter().enumerate() {
            input.extend(a_words(&raw(&am), a.bits(), lane));
            input.extend(b_words(&raw(&bm), b.bits(), lane));
            input.extend(c_lane);
        }
        let kern = Kern {
            target,
            version: if target == "sm_75" { "7.0" } else { "8.5" },
            nin: na + nb + nc,
            nc,
            nd: nc,
            acc_reg: "b32",
            c_at: na + nb,
        };
        let ins = format!(
            "mma.sync.aligned.m{m}n8k{k}.row.col{}.s32.{}.{}.s32{}",
            if sat { ".satfinite" } else { "" },
            ty_name(a),
            ty_name(b),
            if op.is_empty() {
                String::new()
            } else {
                format!(".{op}.popc")
            }
        );
        let tail = format!(
            "{}, {}, {}",
            list("i", 0, na),
            list("i", na, nb),
            list("c", 0, nc)
        );
        let text = kern.text(&ins, &tail);
        ptxas(&text, target);
        let got = run(&text, &input, nc, Numerics::Exact);
        for lane in 0..32 {
            for e in 0..nc {
                let (r, col) = c_pos(m, lane, e);
                let dot: i64 = (0..k)
                    .map(|kk| {
                        let (x, y) = (am[r][kk].0 as i64, bm[kk][col].0 as i64);
                        match op {
                            "xor" => x ^ y,
                            "and" => x & y,
                            _ => x * y,
                        }
                    })
                    .sum();
                let want = d_word(Acc::S32, sat, &[(dot + c[r][col] as i64) as f64]);
                assert_eq!(got[nc * lane + e], want, "{ins}: lane {lane} D[{r}][{col}]");
            }
        }
    }
}

#[test]
fn mma_sp_rejects_an_out_of_range_selector() {
    let kern = Kern {
        target: "sm_80",
        version: "8.5",
        nin: 13,
        nc: 4,
        nd: 4,
        acc_reg: "f32",
        c_at: 8,
    };
    let text = kern.text(
        "mma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32",
        "{%i0, %i1, %i2, %i3}, {%i4, %i5, %i6, %i7}, {%c0, %c1, %c2, %c3}, %i12, 2",
    );
    let mem = GlobalMemory::new();
    let loaded = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0);
    let err = match loaded {
        Err(e) => e.to_string(),
        Ok(m) => match m.kernel("k") {
            Err(e) => e.to_string(),
            Ok(k) => launch(
                k,
                mem.snapshot(),
                vec![0; 16],
                &LaunchConfig::linear(1, 32),
                &LaunchOptions::default(),
            )
            .expect_err("selector 2 of m16n8k32 must be refused")
            .to_string(),
        },
    };
    assert!(err.contains("sparsity selector"), "{err}");
}

/// Runs kernel `k` on one warp with one u64 pointer parameter per buffer; buffer `out` is
/// poisoned (0xff bytes) first. Returns that buffer after the launch.
fn run_bufs(text: &str, bufs: &[Vec<u8>], out: usize) -> Vec<u8> {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(text).unwrap(), 0).unwrap();
    let mut params = Vec::new();
    let mut ptrs = Vec::new();
    for (i, b) in bufs.iter().enumerate() {
        let p = mem.alloc(b.len() as u64, 0).unwrap();
        if i == out {
            p.fill(0, b.len() as u64, &[0xff]);
        } else {
            p.write_bytes(0, b);
        }
        params.extend_from_slice(&p.base.to_le_bytes());
        ptrs.push(p);
    }
    let o = LaunchOptions::default();
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        params,
        &LaunchConfig::linear(1, 32),
        &o,
    )
    .unwrap();
    let mut v = vec![0u8; bufs[out].len()];
    ptrs[out].read_bytes(0, &mut v);
    v
}

/// Packs raw elements of `bits` bits into bytes, element `i` at bit `i * bits` (low bits of a
/// byte first), as sub-byte matrices lie in memory.
fn pack_bits(raw: &[u32], bits: usize) -> Vec<u8> {
    let mut out = vec![0u8; (raw.len() * bits).div_ceil(8)];
    for (i, v) in raw.iter().enumerate() {
        for b in 0..bits {
            if v >> b & 1 != 0 {
                let at = i * bits + b;
                out[at / 8] |= 1 << (at % 8);
            }
        }
    }
    out
}

/// Sub-byte `wmma` (m8n8k32 `.s4`/`.u4`, m8n8k128 `.b1` with `.xor.popc` / `.and.popc`):
/// load A (row-major, padded stride) and B (column-major), load C, mma, store D; D against an
/// exact integer reference.
#[test]
fn wmma_sub_byte_and_b1_load_mma_store() {
    use El::*;
    // (k, a, b, bit op, satfinite, A stride in elements, C/D row-major, target, version)
    let cases = [
        (32, S4, S4, "", true, 64, true, "sm_75", "6.5"),
        (32, U4, U4, "", false, 32, false, "sm_80", "8.5"),
        (32, S4, S4, "", false, 96, true, "sm_90a", "8.5"),
        (128, B1, B1, "xor", false, 256, true, "sm_75", "6.5"),
        (128, B1, B1, "and", false, 128, false, "sm_80", "8.5"),
    ];
    for (n, (k, a, b, op, sat, lda, crow, target, version)) in cases.into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(4000 + n as u64);
        let am: Vec<Vec<(f64, u32)>> = (0..8)
            .map(|_| (0..lda).map(|_| a.random(&mut rng)).collect())
            .collect();
        // B column-major with the default stride k: column c holds B[0..k][c]
        let bcols: Vec<Vec<(f64, u32)>> = (0..8)
            .map(|_| (0..k).map(|_| b.random(&mut rng)).collect())
            .collect();
        let (c, _) = random_c(&mut rng, Acc::S32, 8);
        let araw: Vec<u32> = am.iter().flat_map(|r| r.iter().map(|e| e.1)).collect();
        let braw: Vec<u32> = bcols.iter().flat_map(|r| r.iter().map(|e| e.1)).collect();
        let cmem: Vec<u8> = (0..64)
            .flat_map(|i| {
                let (r, col) = if crow { (i / 8, i % 8) } else { (i % 8, i / 8) };
                (c[r][col] as i64 as i32).to_le_bytes()
            })
            .collect();
        let lay = if crow { "row" } else { "col" };
        let (at, bt) = (ty_name(a), ty_name(b));
        let opm = if op.is_empty() {
            String::new()
        } else {
            format!(".{op}.popc")
        };
        let text = format!(
            ".version {version}\n.target {target}\n.address_size 64\n\
             .visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd)\n{{\n\
             .reg .b32 %a, %b, %c<2>, %d<2>;\n.reg .b64 %rd<5>;\n\
             ld.param.u64 %rd1, [pa];\nld.param.u64 %rd2, [pb];\n\
             ld.param.u64 %rd3, [pc];\nld.param.u64 %rd4, [pd];\n\
             wmma.load.a.sync.aligned.row.m8n8k{k}.global.{at} {{%a}}, [%rd1], {lda};\n\
             wmma.load.b.sync.aligned.col.m8n8k{k}.global.{bt} {{%b}}, [%rd2];\n\
             wmma.load.c.sync.aligned.{lay}.m8n8k{k}.global.s32 {{%c0, %c1}}, [%rd3];\n\
             wmma.mma{opm}.sync.aligned.row.col.m8n8k{k}.s32.{at}.{bt}.s32{} {{%d0, %d1}}, {{%a}}, {{%b}}, {{%c0, %c1}};\n\
             wmma.store.d.sync.aligned.{lay}.m8n8k{k}.global.s32 [%rd4], {{%d0, %d1}};\n\
             ret;\n}}\n",
            if sat { ".satfinite" } else { "" }
        );
        ptxas(&text, target);
        let bufs = vec![
            pack_bits(&araw, a.bits()),
            pack_bits(&braw, b.bits()),
            cmem,
            vec![0u8; 256],
        ];
        let got = run_bufs(&text, &bufs, 3);
        for r in 0..8 {
            for col in 0..8 {
                let dot: i64 = (0..k)
                    .map(|kk| {
                        let (x, y) = (am[r][kk].0 as i64, bcols[col][kk].0 as i64);
                        match op {
                            "xor" => x ^ y,
                            "and" => x & y,
                            _ => x * y,
                        }
                    })
                    .sum();
                let want = d_word(Acc::S32, sat, &[(dot + c[r][col] as i64) as f64]);
                let i = if crow { 8 * r + col } else { 8 * col + r };
                let g = u32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
                assert_eq!(g, want, "case {n} ({at} {op}): D[{r}][{col}]");
            }
        }
    }
}

/// The validator knows the targets and ISA versions the new forms need (as ptxas enforces:
/// FP8 `mma.sp` sm_89 / PTX 8.4, `.and.popc` sm_80 / PTX 7.1, sub-byte `wmma` sm_75,
/// `wgmma.mma_async.sp` sm_90a / PTX 8.2, mixed s8/u8 `wgmma.mma_async.sp` PTX 8.4).
#[test]
fn validator_knows_the_targets_of_the_new_forms() {
    let check = |version: &str, target: &str, ins: &str| -> Vec<String> {
        let text = format!(
            ".version {version}\n.target {target}\n.address_size 64\n.visible .entry k()\n{{\n\
             .reg .b32 %r<24>;\n.reg .f32 %f<8>;\n.reg .b64 %rd<4>;\n{ins}\nret;\n}}\n"
        );
        let m = ptx::parse(&text).unwrap();
        ptx::validate(&m)
            .into_iter()
            .filter(|d| d.is_error())
            .map(|d| format!("{d:?}"))
            .collect()
    };
    let sp8 = "mma.sp.sync.aligned.m16n8k64.row.col.f32.e4m3.e4m3.f32 {%f0, %f1, %f2, %f3}, \
               {%r0, %r1, %r2, %r3}, {%r4, %r5, %r6, %r7}, {%f4, %f5, %f6, %f7}, %r8, 0;";
    assert!(check("8.4", "sm_89", sp8).is_empty());
    assert!(
        !check("8.4", "sm_80", sp8).is_empty(),
        "FP8 mma.sp needs sm_89"
    );
    assert!(
        !check("8.3", "sm_89", sp8).is_empty(),
        "FP8 mma.sp needs PTX 8.4"
    );
    let and = "mma.sync.aligned.m8n8k128.row.col.s32.b1.b1.s32.and.popc {%r0, %r1}, {%r2}, \
               {%r3}, {%r4, %r5};";
    assert!(check("7.1", "sm_80", and).is_empty());
    assert!(
        !check("7.1", "sm_75", and).is_empty(),
        ".and.popc needs sm_80"
    );
    assert!(
        !check("7.0", "sm_80", and).is_empty(),
        ".and.popc needs PTX 7.1"
    );
    let w4 = "wmma.mma.sync.aligned.row.col.m8n8k32.s32.s4.s4.s32 {%r0, %r1}, {%r2}, {%r3}, \
              {%r4, %r5};";
    assert!(check("6.5", "sm_75", w4).is_empty());
    assert!(
        !check("6.5", "sm_72", w4).is_empty(),
        "sub-byte wmma needs sm_75"
    );
    let wsp = "wgmma.mma_async.sp.sync.aligned.m64n8k64.s32.s8.u8 {%r0, %r1, %r2, %r3}, %rd0, \
               %rd1, %r8, 0, 1;";
    assert!(check("8.4", "sm_90a", wsp).is_empty());
    assert!(
        !check("8.3", "sm_90a", wsp).is_empty(),
        "mixed s8/u8 wgmma.sp needs PTX 8.4"
    );
    assert!(
        !check("8.4", "sm_90", wsp).is_empty(),
        "wgmma.sp needs sm_90a"
    );
}
