//! Integer, bit, video and packed-half instructions (issue 16 item 3) on the emulator against
//! independent Rust references written from the PTX ISA pseudo-code: `dp2a`, `fns`, `bmsk`,
//! `szext`, `cvt.pack.sat`, every `prmt` mode, `bfind.shiftamt`; the scalar video instructions
//! (`vadd vsub vabsdiff vmin vmax vshl vshr vmad vset` with selectors, saturation, secondary
//! operations and merges) and the SIMD `vadd2`..`vset2`, `vadd4`..`vset4` (selectors, masks,
//! `.sat`, `.add`), each form drawn at random; `set`/`setp`/`min`/`max`/`fma.relu`/`neg`/`abs` on
//! `f16x2` and `bf16x2` (exact references), `ex2.approx` and `tanh.approx` on the half types
//! (within the ISA's stated error bounds). Every kernel also goes through the validator and, when
//! it is installed, ptxas (sm_90a).
//!
//! Each test builds one kernel holding many cases: thread `t` loads `a`, `b`, `c` (u32) into
//! `%r1..%r3` (halves in `%h1..%h6`), each case leaves its result in `%r10`, which is stored to
//! `out[t][case]`; the output is poisoned first.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const N: usize = 256;

/// A case: PTX lines leaving a u32 in `%r10`, and its reference on (a, b, c).
type Reference = Box<dyn Fn(u32, u32, u32) -> u32>;
struct Case {
    ptx: String,
    want: Reference,
}

fn case(ptx: impl Into<String>, want: impl Fn(u32, u32, u32) -> u32 + 'static) -> Case {
    Case {
        ptx: ptx.into(),
        want: Box::new(want),
    }
}

fn kernel(cases: &[Case]) -> String {
    let k = cases.len();
    let body: String = cases
        .iter()
        .enumerate()
        .map(|(j, c)| format!("    {}\n    st.global.u32 [%rd9+{}], %r10;\n", c.ptx, 4 * j))
        .collect();
    format!(
        r#".version 8.7
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 po)
{{
    .reg .pred %p<8>;
    .reg .b16 %h<16>;
    .reg .b32 %r<32>;
    .reg .b64 %rd<16>;
    mov.u32 %r0, %tid.x;
    mov.u32 %r5, %ctaid.x;
    mad.lo.u32 %r0, %r5, 128, %r0;
    mul.wide.u32 %rd5, %r0, 4;
    ld.param.u64 %rd1, [pa];
    add.s64 %rd1, %rd1, %rd5;
    ld.global.u32 %r1, [%rd1];
    ld.param.u64 %rd2, [pb];
    add.s64 %rd2, %rd2, %rd5;
    ld.global.u32 %r2, [%rd2];
    ld.param.u64 %rd3, [pc];
    add.s64 %rd3, %rd3, %rd5;
    ld.global.u32 %r3, [%rd3];
    mov.b32 {{%h1, %h2}}, %r1;
    mov.b32 {{%h3, %h4}}, %r2;
    mov.b32 {{%h5, %h6}}, %r3;
    mul.wide.u32 %rd7, %r0, {stride};
    ld.param.u64 %rd9, [po];
    add.s64 %rd9, %rd9, %rd7;
{body}    ret;
}}
"#,
        stride = 4 * k
    )
}

/// Validates, assembles (when ptxas is there) and runs the cases on N threads; returns
/// `out[thread][case]`.
fn run(cases: &[Case], a: &[u32], b: &[u32], c: &[u32]) -> Vec<Vec<u32>> {
    let text = kernel(cases);
    let module = ptx::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let errors: Vec<_> = ptx::validate(&module)
        .into_iter()
        .filter(|d| d.is_error())
        .collect();
    assert!(errors.is_empty(), "validator: {errors:?}");
    assert_eq!(ptx::parse(&ptx::print(&module)).unwrap(), module);
    if ptx::ptxas::ptxas_for_tests("isa_int test PTX").is_some() {
        ptx::ptxas::assemble(&text, "sm_90a", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}\n{text}"));
    }
    let k = cases.len();
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, module, 0).unwrap();
    let mut p = Vec::new();
    let mut keep = Vec::new();
    for v in [a, b, c] {
        let buf = mem.alloc((N * 4) as u64, 0).unwrap();
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        buf.write_bytes(0, &bytes);
        p.extend_from_slice(&buf.base.to_le_bytes());
        keep.push(buf);
    }
    let out = mem.alloc((N * 4 * k) as u64, 0).unwrap();
    out.fill(0, (N * 4 * k) as u64, &[0xa5]);
    p.extend_from_slice(&out.base.to_le_bytes());
    let cfg = LaunchConfig::linear((N / 128) as u32, 128);
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut raw = vec![0u8; N * 4 * k];
    out.read_bytes(0, &mut raw);
    raw.chunks(4 * k)
        .map(|row| {
            row.chunks(4)
                .map(|x| u32::from_le_bytes(x.try_into().unwrap()))
                .collect()
        })
        .collect()
}

/// Runs and compares every case exactly.
fn check(cases: &[Case], a: &[u32], b: &[u32], c: &[u32]) {
    let got = run(cases, a, b, c);
    let mut bad = Vec::new();
    for (j, cs) in cases.iter().enumerate() {
        for t in 0..N {
            let want = (cs.want)(a[t], b[t], c[t]);
            if got[t][j] != want && bad.len() < 20 {
                bad.push(format!(
                    "`{}` a={:#x} b={:#x} c={:#x}: got {:#x}, want {want:#x}",
                    cs.ptx, a[t], b[t], c[t], got[t][j]
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}

/// Random words with edge cases mixed in.
fn words(seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let edges = [
        0u32,
        1,
        0x7f,
        0x80,
        0xff,
        0x7fff,
        0x8000,
        0xffff,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        0x8080_8080,
        0x7f7f_7f7f,
        0x0001_ffff,
    ];
    (0..N)
        .map(|i| {
            if i < edges.len() * 3 && i % 3 == (seed % 3) as usize {
                edges[i / 3]
            } else {
                rng.gen()
            }
        })
        .collect()
}

/// Small counts (0..40) for shift, width and position operands, mixed with random words.
fn counts(seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..N)
        .map(|i| {
            if i % 5 == 4 {
                rng.gen()
            } else {
                rng.gen_range(0..40)
            }
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// integer and bit instructions
// ------------------------------------------------------------------------------------------

fn ext(v: u32, bits: u32, signed: bool) -> i64 {
    let v = v as u64 & ((1u64 << bits) - 1);
    if signed && v >> (bits - 1) == 1 {
        v as i64 - (1i64 << bits)
    } else {
        v as i64
    }
}

#[test]
fn dp2a_all_forms() {
    let mut cases = Vec::new();
    for hi in [false, true] {
        for sa in [false, true] {
            for sb in [false, true] {
                let t = |s: bool| if s { "s32" } else { "u32" };
                let ptx = format!(
                    "dp2a.{}.{}.{} %r10, %r1, %r2, %r3;",
                    if hi { "hi" } else { "lo" },
                    t(sa),
                    t(sb)
                );
                cases.push(case(ptx, move |a, b, c| {
                    let base = if hi { 2 } else { 0 };
                    let mut d = c as i64;
                    for i in 0..2 {
                        d += ext(a >> (16 * i), 16, sa) * ext(b >> (8 * (base + i)), 8, sb);
                    }
                    d as u32
                }));
            }
        }
    }
    check(&cases, &words(1), &words(2), &words(3));
}

/// `fns` from the manual's loop, written as a scan over bit positions.
fn fns_ref(mask: u32, base: u32, offset: i32) -> u32 {
    if offset == 0 {
        return if mask & (1 << base) != 0 { base } else { u32::MAX };
    }
    let order: Vec<u32> = if offset > 0 {
        (base..32).collect()
    } else {
        (0..=base).rev().collect()
    };
    order
        .into_iter()
        .filter(|p| mask & (1 << p) != 0)
        .nth(offset.unsigned_abs() as usize - 1)
        .unwrap_or(u32::MAX)
}

/// `bmsk`: bits [a, a+b) with the manual's clamp/wrap and overflow rules.
fn bmsk_ref(a: u32, b: u32, clamp: bool) -> u32 {
    let (pos, width) = if clamp {
        if a >= 32 {
            return 0;
        }
        (a, b.min(32))
    } else {
        (a & 31, b & 31)
    };
    let end = (pos + width).min(32);
    (pos..end).fold(0, |m, i| m | 1 << i)
}

fn szext_ref(a: u32, b: u32, clamp: bool, signed: bool) -> u32 {
    let n = if clamp { b.min(32) } else { b & 31 };
    match n {
        0 => 0,
        32 => a,
        n => {
            let v = a & ((1 << n) - 1);
            if signed {
                ext(v, n, true) as u32
            } else {
                v
            }
        }
    }
}

#[test]
fn fns_bmsk_szext() {
    // offset = c mod 81 - 40, computed in the kernel too
    let mut cases = vec![
        case(
            "and.b32 %r11, %r2, 31;\n    rem.u32 %r12, %r3, 81;\n    sub.s32 %r12, %r12, 40;\n    fns.b32 %r10, %r1, %r11, %r12;",
            |a, b, c| fns_ref(a, b & 31, (c % 81) as i32 - 40),
        ),
        case("bmsk.clamp.b32 %r10, %r2, %r3;", |_, b, c| bmsk_ref(b, c, true)),
        case("bmsk.wrap.b32 %r10, %r2, %r3;", |_, b, c| bmsk_ref(b, c, false)),
        case("bmsk.wrap.b32 %r10, 1, 2;", |_, _, _| 6),
    ];
    for clamp in [false, true] {
        for signed in [false, true] {
            let ptx = format!(
                "szext.{}.{} %r10, %r1, %r2;",
                if clamp { "clamp" } else { "wrap" },
                if signed { "s32" } else { "u32" }
            );
            cases.push(case(ptx, move |a, b, _| szext_ref(a, b, clamp, signed)));
        }
    }
    // mask with few bits set, so that offsets find and miss
    let masks: Vec<u32> = words(4)
        .iter()
        .zip(words(5))
        .map(|(x, y)| x & y)
        .collect();
    let mut mixed = counts(6);
    mixed[..4].copy_from_slice(&[32, 33, 31, u32::MAX]);
    check(&cases, &masks, &mixed, &counts(7));
}

#[test]
fn cvt_pack_sat() {
    let sat = |x: u32, bits: u32, signed: bool| -> u32 {
        let x = x as i32 as i64;
        let (lo, hi) = if signed {
            (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1)
        } else {
            (0, (1i64 << bits) - 1)
        };
        (x.clamp(lo, hi) as u32) & ((1 << bits) - 1)
    };
    let mut cases = Vec::new();
    for (ty, bits, signed) in [("u16", 16, false), ("s16", 16, true)] {
        cases.push(case(
            format!("cvt.pack.sat.{ty}.s32 %r10, %r1, %r2;"),
            move |a, b, _| sat(a, bits, signed) << bits | sat(b, bits, signed),
        ));
    }
    for (ty, bits, signed) in [("u8", 8, false), ("s8", 8, true)] {
        cases.push(case(
            format!("cvt.pack.sat.{ty}.s32.b32 %r10, %r1, %r2, %r3;"),
            move |a, b, c| c << (2 * bits) | sat(a, bits, signed) << bits | sat(b, bits, signed),
        ));
    }
    // values around the narrow ranges, and anything
    let mut rng = StdRng::seed_from_u64(8);
    let mut near = || -> Vec<u32> {
        (0..N)
            .map(|i| {
                if i % 2 == 0 {
                    rng.gen_range(-70000i32..70000) as u32
                } else {
                    rng.gen_range(-300i32..300) as u32
                }
            })
            .collect()
    };
    let (a, b) = (near(), near());
    check(&cases, &a, &b, &words(9));
}

#[test]
fn prmt_every_mode_and_bfind_shiftamt() {
    // result byte i takes source byte TABLE[mode][c & 3][i] of {b, a} (PTX ISA prmt table,
    // written here as the manual's b3 b2 b1 b0 nibbles)
    let table: [(&str, [u16; 4]); 6] = [
        ("f4e", [0x3210, 0x4321, 0x5432, 0x6543]),
        ("b4e", [0x5670, 0x6701, 0x7012, 0x0123]),
        ("rc8", [0x0000, 0x1111, 0x2222, 0x3333]),
        ("ecl", [0x3210, 0x3211, 0x3222, 0x3333]),
        ("ecr", [0x0000, 0x1110, 0x2210, 0x3210]),
        ("rc16", [0x1010, 0x3232, 0x1010, 0x3232]),
    ];
    let byte = |a: u32, b: u32, s: u32| ((((b as u64) << 32 | a as u64) >> (8 * (s & 7))) & 0xff) as u32;
    let mut cases = vec![case("prmt.b32 %r10, %r1, %r2, %r3;", move |a, b, c| {
        (0..4).fold(0, |d, i| {
            let sel = (c >> (4 * i)) & 0xf;
            let v = byte(a, b, sel);
            let v = if sel & 8 != 0 {
                if v & 0x80 != 0 {
                    0xff
                } else {
                    0
                }
            } else {
                v
            };
            d | v << (8 * i)
        })
    })];
    for (mode, sels) in table {
        cases.push(case(
            format!("prmt.b32.{mode} %r10, %r1, %r2, %r3;"),
            move |a, b, c| {
                let s = sels[(c & 3) as usize] as u32;
                (0..4).fold(0, |d, i| d | byte(a, b, (s >> (4 * i)) & 0xf) << (8 * i))
            },
        ));
    }
    let lead = |v: u64, bits: u32| -> u32 {
        if v == 0 {
            u32::MAX
        } else {
            // shift that brings the highest set bit to the top
            (0..bits).find(|k| (v << (64 - bits + k)) >> 63 == 1).unwrap()
        }
    };
    cases.push(case("bfind.shiftamt.u32 %r10, %r1;", move |a, _, _| {
        lead(a as u64, 32)
    }));
    cases.push(case("bfind.shiftamt.s32 %r10, %r1;", move |a, _, _| {
        let v = if (a as i32) < 0 { !a } else { a };
        lead(v as u64, 32)
    }));
    cases.push(case(
        "mov.b64 %rd10, {%r1, %r2};\n    bfind.shiftamt.s64 %r10, %rd10;",
        move |a, b, _| {
            let x = (b as u64) << 32 | a as u64;
            let v = if (x as i64) < 0 { !x } else { x };
            lead(v, 64)
        },
    ));
    cases.push(case(
        "mov.b64 %rd10, {%r1, %r2};\n    bfind.shiftamt.u64 %r10, %rd10;",
        move |a, b, _| lead((b as u64) << 32 | a as u64, 64),
    ));
    // small b for the 64-bit forms half of the time
    let b: Vec<u32> = words(11)
        .iter()
        .enumerate()
        .map(|(i, x)| if i % 2 == 0 { x >> (i % 32) } else { *x })
        .collect();
    check(&cases, &words(10), &b, &words(12));
}

// ------------------------------------------------------------------------------------------
// video instructions
// ------------------------------------------------------------------------------------------

/// A scalar video form, drawn at random: the PTX text and everything the reference needs.
#[derive(Clone, Copy, Debug)]
struct Scalar {
    op: &'static str,
    /// signedness of d, a, b
    s: [bool; 3],
    sat: bool,
    sec: Option<&'static str>,
    /// (half, index) selectors of a, b and the merge position of d
    asel: Option<(bool, u32)>,
    bsel: Option<(bool, u32)>,
    dsel: Option<(bool, u32)>,
    wrap: bool,
    cmp: &'static str,
    /// vmad: negations of a, b, c; .po; .shr7/.shr15
    neg: [bool; 3],
    po: bool,
    shr: u32,
}

fn ty(s: bool) -> &'static str {
    if s {
        "s32"
    } else {
        "u32"
    }
}

fn sel_text(s: Option<(bool, u32)>) -> String {
    match s {
        None => String::new(),
        Some((h, k)) => format!(".{}{k}", if h { 'h' } else { 'b' }),
    }
}

impl Scalar {
    fn draw(rng: &mut StdRng, op: &'static str) -> Scalar {
        let sel = |rng: &mut StdRng| match rng.gen_range(0..4) {
            0 => None,
            1 => Some((true, rng.gen_range(0..2))),
            _ => Some((false, rng.gen_range(0..4))),
        };
        let shift = op == "vshl" || op == "vshr";
        let mut v = Scalar {
            op,
            s: [rng.gen(), rng.gen(), rng.gen::<bool>() && !shift],
            sat: rng.gen() && op != "vset",
            sec: None,
            asel: sel(rng),
            bsel: sel(rng),
            dsel: None,
            wrap: rng.gen(),
            cmp: ["eq", "ne", "lt", "le", "gt", "ge"][rng.gen_range(0..6)],
            neg: [false; 3],
            po: false,
            shr: 0,
        };
        if op == "vmad" {
            v.po = rng.gen_range(0..4) == 0;
            if !v.po {
                let k = rng.gen_range(0..5);
                if k < 3 {
                    v.neg[k] = true;
                }
            }
            v.shr = [0, 0, 7, 15][rng.gen_range(0..4)];
            // the signedness of the result follows the operands and negations
            v.s[0] = v.s[1] || v.s[2] || v.neg.iter().any(|x| *x);
            return v;
        }
        match rng.gen_range(0..3) {
            0 => {}
            1 => v.sec = Some(["add", "min", "max"][rng.gen_range(0..3)]),
            _ => v.dsel = sel(rng).or(Some((false, 2))),
        }
        v
    }

    fn ptx(&self) -> String {
        let types = if self.op == "vset" {
            format!("{}.{}.{}", ty(self.s[1]), ty(self.s[2]), self.cmp)
        } else {
            format!("{}.{}.{}", ty(self.s[0]), ty(self.s[1]), ty(self.s[2]))
        };
        let mut mods = String::new();
        if self.po {
            mods += ".po";
        }
        if self.sat {
            mods += ".sat";
        }
        if self.shr != 0 {
            mods += &format!(".shr{}", self.shr);
        }
        if self.op == "vshl" || self.op == "vshr" {
            mods += if self.wrap { ".wrap" } else { ".clamp" };
        }
        if let Some(s) = self.sec {
            mods += &format!(".{s}");
        }
        let n = |k: usize| if self.neg[k] { "-" } else { "" };
        let c = self.op == "vmad" || self.sec.is_some() || self.dsel.is_some();
        format!(
            "{}.{types}{mods} %r10{}, {}%r1{}, {}%r2{}{};",
            self.op,
            sel_text(self.dsel),
            n(0),
            sel_text(self.asel),
            n(1),
            sel_text(self.bsel),
            if c { format!(", {}%r3", n(2)) } else { String::new() }
        )
    }

    /// The manual's scalar video pipeline: extract, operate on exact integers, saturate to the
    /// destination (or merged part's) range, then the secondary operation or the merge.
    fn reference(&self, a: u32, b: u32, c: u32) -> u32 {
        let part = |x: u32, signed: bool, sel: Option<(bool, u32)>| -> i128 {
            (match sel {
                None => ext(x, 32, signed),
                Some((true, k)) => ext(x >> (16 * k), 16, signed),
                Some((false, k)) => ext(x >> (8 * k), 8, signed),
            }) as i128
        };
        let ta = part(a, self.s[1], self.asel);
        let tb = part(b, self.s[2], self.bsel);
        if self.op == "vmad" {
            return self.vmad(ta, tb, c);
        }
        let shift = if self.wrap { tb & 31 } else { tb.min(32) };
        let tmp: i128 = match self.op {
            "vadd" => ta + tb,
            "vsub" => ta - tb,
            "vabsdiff" => (ta - tb).abs(),
            "vmin" => ta.min(tb),
            "vmax" => ta.max(tb),
            "vshl" => ta * (1i128 << shift),
            "vshr" => ta.div_euclid(1i128 << shift),
            _ => compare(self.cmp, ta, tb) as i128,
        };
        let tmp = if self.sat {
            let bits = match self.dsel {
                Some((true, _)) => 16,
                Some((false, _)) => 8,
                None => 32,
            };
            clamp_bits(tmp, bits, self.s[0])
        } else {
            tmp
        };
        let tc = ext(c, 32, self.s[0]) as i128;
        let d = match (self.sec, self.dsel) {
            (Some("add"), _) => tmp + tc,
            (Some("min"), _) => tmp.min(tc),
            (Some(_), _) => tmp.max(tc),
            (None, Some((h, k))) => {
                let w = if h { 16 } else { 8 };
                let m = ((1u64 << w) - 1) << (w * k);
                let placed = ((tmp as u64) << (w * k)) & m;
                (placed | (c as u64 & !m)) as i128
            }
            (None, None) => tmp,
        };
        d as u32
    }

    /// `vmad`: +-(a*b) +- c (+1 with .po), arithmetic right shift, saturation by the sign of the
    /// final result (signed when an operand is signed or negated).
    fn vmad(&self, ta: i128, tb: i128, c: u32) -> u32 {
        let signed = self.s[1] || self.s[2] || self.neg.iter().any(|x| *x);
        let p = if self.neg[0] ^ self.neg[1] {
            -(ta * tb)
        } else {
            ta * tb
        };
        let tc = if self.neg[2] {
            -(ext(c, 32, true) as i128)
        } else {
            ext(c, 32, signed) as i128
        };
        let r = (p + tc + self.po as i128).div_euclid(1i128 << self.shr);
        let r = if self.sat { clamp_bits(r, 32, signed) } else { r };
        r as u32
    }
}

fn compare(cmp: &str, x: i128, y: i128) -> bool {
    match cmp {
        "eq" => x == y,
        "ne" => x != y,
        "lt" => x < y,
        "le" => x <= y,
        "gt" => x > y,
        _ => x >= y,
    }
}

fn clamp_bits(v: i128, bits: u32, signed: bool) -> i128 {
    if signed {
        v.clamp(-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        v.clamp(0, (1i128 << bits) - 1)
    }
}

fn scalar_cases(seed: u64, ops: &[&'static str], per_op: usize) -> Vec<Case> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cases = Vec::new();
    for &op in ops {
        for _ in 0..per_op {
            let v = Scalar::draw(&mut rng, op);
            cases.push(case(v.ptx(), move |a, b, c| v.reference(a, b, c)));
        }
    }
    cases
}

#[test]
fn video_scalar_arithmetic() {
    let ops = ["vadd", "vsub", "vabsdiff", "vmin", "vmax"];
    check(&scalar_cases(20, &ops, 24), &words(21), &words(22), &words(23));
}

#[test]
fn video_scalar_shift_mad_set() {
    let cases = scalar_cases(24, &["vshl", "vshr", "vset", "vmad"], 24);
    // shift counts are small most of the time; vmad and vset see them as values too
    check(&cases, &words(25), &counts(26), &words(27));
}

/// A SIMD video form (`vop2`/`vop4`, `vset2`/`vset4`), drawn at random.
#[derive(Clone, Copy, Debug)]
struct Simd {
    op: &'static str,
    lanes: u32,
    s: [bool; 3],
    sat: bool,
    add: bool,
    cmp: &'static str,
    /// source lane of {b, a} for each result lane, for a and b
    asel: [u32; 4],
    bsel: [u32; 4],
    explicit: [bool; 3],
    mask: u32,
}

impl Simd {
    fn draw(rng: &mut StdRng, op: &'static str, lanes: u32) -> Simd {
        let range = if lanes == 2 { 4 } else { 8 };
        let pick = |rng: &mut StdRng| [0; 4].map(|_: u32| rng.gen_range(0..range));
        let (asel, bsel) = (pick(rng), pick(rng));
        let explicit = [rng.gen(), rng.gen(), rng.gen()];
        let add = rng.gen_range(0..3) == 0;
        let mut mask = if explicit[2] {
            rng.gen_range(1..(1 << lanes))
        } else {
            (1 << lanes) - 1
        };
        if mask == 0 {
            mask = 1;
        }
        let defaults = if lanes == 2 {
            ([0, 1, 0, 0], [2, 3, 0, 0])
        } else {
            ([0, 1, 2, 3], [4, 5, 6, 7])
        };
        Simd {
            op,
            lanes,
            s: [rng.gen(), rng.gen(), rng.gen()],
            sat: !add && op != "vset" && rng.gen(),
            add,
            cmp: ["eq", "ne", "lt", "le", "gt", "ge"][rng.gen_range(0..6)],
            asel: if explicit[0] { asel } else { defaults.0 },
            bsel: if explicit[1] { bsel } else { defaults.1 },
            explicit,
            mask,
        }
    }

    fn ptx(&self) -> String {
        let n = self.lanes as usize;
        let letter = if n == 2 { 'h' } else { 'b' };
        let sel = |lanes: &[u32; 4], on: bool| -> String {
            if !on {
                return String::new();
            }
            let digits: String = lanes[..n].iter().rev().map(|d| d.to_string()).collect();
            format!(".{letter}{digits}")
        };
        let mask = if self.explicit[2] {
            let digits: String = (0..n as u32)
                .rev()
                .filter(|i| self.mask >> i & 1 == 1)
                .map(|d| d.to_string())
                .collect();
            format!(".{letter}{digits}")
        } else {
            String::new()
        };
        let types = if self.op == "vset" {
            format!("{}.{}.{}", ty(self.s[1]), ty(self.s[2]), self.cmp)
        } else {
            format!("{}.{}.{}", ty(self.s[0]), ty(self.s[1]), ty(self.s[2]))
        };
        format!(
            "{}{}.{types}{}{} %r10{mask}, %r1{}, %r2{}, %r3;",
            self.op,
            self.lanes,
            if self.sat { ".sat" } else { "" },
            if self.add { ".add" } else { "" },
            sel(&self.asel, self.explicit[0]),
            sel(&self.bsel, self.explicit[1]),
        )
    }

    /// The manual's SIMD pipeline: lanes extracted from {b, a}, operated on, optionally clamped
    /// to the lane range of dtype, then accumulated into c (`.add`) or merged with c's lanes.
    fn reference(&self, a: u32, b: u32, c: u32) -> u32 {
        let w = 32 / self.lanes;
        let src = (b as u64) << 32 | a as u64;
        let lane = |k: u32, signed: bool| ext((src >> (w * k)) as u32, w, signed) as i128;
        let mut sum = c as i128;
        let mut merged = 0u32;
        for i in 0..self.lanes {
            let (x, y) = (
                lane(self.asel[i as usize], self.s[1]),
                lane(self.bsel[i as usize], self.s[2]),
            );
            let mut t = match self.op {
                "vadd" => x + y,
                "vsub" => x - y,
                "vavrg" => (x + y + ((x + y >= 0) as i128)).div_euclid(2),
                "vabsdiff" => (x - y).abs(),
                "vmin" => x.min(y),
                "vmax" => x.max(y),
                _ => compare(self.cmp, x, y) as i128,
            };
            if self.sat {
                t = clamp_bits(t, w, self.s[0]);
            }
            let lane_mask = (((1u64 << w) - 1) << (w * i)) as u32;
            if self.mask >> i & 1 == 1 {
                sum += t;
                merged |= ((t as u32) << (w * i)) & lane_mask;
            } else {
                merged |= c & lane_mask;
            }
        }
        if self.add {
            sum as u32
        } else {
            merged
        }
    }
}

fn simd_cases(seed: u64, lanes: u32, per_op: usize) -> Vec<Case> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cases = Vec::new();
    for op in ["vadd", "vsub", "vavrg", "vabsdiff", "vmin", "vmax", "vset"] {
        for _ in 0..per_op {
            let v = Simd::draw(&mut rng, op, lanes);
            cases.push(case(v.ptx(), move |a, b, c| v.reference(a, b, c)));
        }
    }
    cases
}

#[test]
fn video_simd_half_words() {
    check(&simd_cases(30, 2, 14), &words(31), &words(32), &words(33));
}

#[test]
fn video_simd_bytes() {
    check(&simd_cases(34, 4, 14), &words(35), &words(36), &words(37));
}
