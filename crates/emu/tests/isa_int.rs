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
    .reg .f32 %f<4>;
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
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
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
        return if mask & (1 << base) != 0 {
            base
        } else {
            u32::MAX
        };
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
    let masks: Vec<u32> = words(4).iter().zip(words(5)).map(|(x, y)| x & y).collect();
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
    let narrow = [
        ("u8", 8, false),
        ("s8", 8, true),
        ("u4", 4, false),
        ("s4", 4, true),
    ];
    for (ty, bits, signed) in narrow
        .into_iter()
        .chain([("u2", 2, false), ("s2", 2, true)])
    {
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
                } else if i % 4 == 1 {
                    // around the 2- and 4-bit ranges
                    rng.gen_range(-12i32..20) as u32
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
    let byte =
        |a: u32, b: u32, s: u32| ((((b as u64) << 32 | a as u64) >> (8 * (s & 7))) & 0xff) as u32;
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
            (0..bits)
                .find(|k| (v << (64 - bits + k)) >> 63 == 1)
                .unwrap()
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
            if c {
                format!(", {}%r3", n(2))
            } else {
                String::new()
            }
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
        let r = if self.sat {
            clamp_bits(r, 32, signed)
        } else {
            r
        };
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
    check(
        &scalar_cases(20, &ops, 24),
        &words(21),
        &words(22),
        &words(23),
    );
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

// ------------------------------------------------------------------------------------------
// packed half precision
// ------------------------------------------------------------------------------------------

/// A 16-bit float format: f16 or bf16.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Fmt {
    bf16: bool,
}
const F16: Fmt = Fmt { bf16: false };
const BF16: Fmt = Fmt { bf16: true };

impl Fmt {
    fn name(self) -> &'static str {
        if self.bf16 {
            "bf16"
        } else {
            "f16"
        }
    }
    fn value(self, h: u32) -> f64 {
        let h = h as u16;
        if self.bf16 {
            half::bf16::from_bits(h).to_f64()
        } else {
            half::f16::from_bits(h).to_f64()
        }
    }
    /// fraction bits, minimum normal exponent, maximum exponent
    fn params(self) -> (u32, i32, i32) {
        if self.bf16 {
            (7, -126, 127)
        } else {
            (10, -14, 15)
        }
    }
    /// (integer significand, exponent) of a finite value: value = m * 2^e.
    fn split(self, h: u32) -> (i128, i32) {
        let (m, emin, _) = self.params();
        let mag = h & 0x7fff;
        let (e, f) = (mag >> m, mag & ((1 << m) - 1));
        let (sig, exp) = if e == 0 {
            (f as i128, emin - m as i32)
        } else {
            (
                (f | 1 << m) as i128,
                e as i32 - (1 << (15 - m - 1)) + 1 - m as i32,
            )
        };
        (if h & 0x8000 != 0 { -sig } else { sig }, exp)
    }
    /// Rounds `n * 2^e` to nearest even in this format.
    fn round(self, n: i128, e: i32) -> u32 {
        let (m, emin, emax) = self.params();
        let sign = if n < 0 { 0x8000 } else { 0 };
        let mut mag = n.unsigned_abs();
        if mag == 0 {
            return sign;
        }
        let top = e + 127 - mag.leading_zeros() as i32; // exponent of the leading bit
        let q = top.max(emin) - m as i32; // exponent of the last kept bit
        let mut q2 = e;
        if q > e {
            let k = (q - e) as u32;
            let rem = mag & ((1u128 << k) - 1);
            let half = 1u128 << (k - 1);
            mag >>= k;
            if rem > half || (rem == half && mag & 1 == 1) {
                mag += 1;
            }
            q2 = q;
        } else {
            mag <<= (e - q) as u32;
            q2 = q2.min(q);
        }
        if mag >> (m + 1) != 0 {
            mag >>= 1;
            q2 += 1;
        }
        if mag >> m == 0 {
            return sign | mag as u32; // subnormal
        }
        let exp = q2 + m as i32;
        if exp > emax {
            return sign | (0x7fff & !((1 << m) - 1)); // infinity
        }
        let biased = (exp + (1 << (15 - m - 1)) - 1) as u32;
        sign | biased << m | (mag as u32 & ((1 << m) - 1))
    }
    fn is_nan(self, h: u32) -> bool {
        self.value(h).is_nan()
    }
}

/// Packed half-word pairs: random finite values, specials (zeros, subnormals, infinities, NaN)
/// and, in `b` against `a`, equal values, so every comparison outcome occurs.
fn halves(seed: u64, fmt: Fmt, other: Option<&[u32]>) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let specials = [
        0x0000, 0x8000, 0x0001, 0x8001, 0x7fff, 0xffff, 0x3c00, 0xbc00,
    ];
    let inf = if fmt.bf16 { 0x7f80 } else { 0x7c00 };
    let one = |rng: &mut StdRng, i: usize, k: u32| -> u32 {
        match rng.gen_range(0..8) {
            0 => specials[rng.gen_range(0..specials.len())],
            1 => inf | if rng.gen() { 0x8000 } else { 0 },
            2 if other.is_some() => (other.unwrap()[i] >> (16 * k)) & 0xffff,
            _ => rng.gen::<u32>() & 0xffff,
        }
    };
    (0..N)
        .map(|i| one(&mut rng, i, 0) | one(&mut rng, i, 1) << 16)
        .collect()
}

fn fcmp(cmp: &str, x: f64, y: f64) -> bool {
    let nan = x.is_nan() || y.is_nan();
    match cmp {
        "eq" => x == y,
        "ne" => !nan && x != y,
        "lt" => x < y,
        "le" => x <= y,
        "gt" => x > y,
        "ge" => x >= y,
        "equ" => nan || x == y,
        "neu" => nan || x != y,
        "ltu" => nan || x < y,
        "leu" => nan || x <= y,
        "gtu" => nan || x > y,
        "geu" => nan || x >= y,
        "num" => !nan,
        _ => nan,
    }
}

const CMPS: [&str; 14] = [
    "eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan",
];

fn half_of(x: u32, k: u32) -> u32 {
    (x >> (16 * k)) & 0xffff
}

#[test]
fn packed_half_set_setp() {
    for fmt in [F16, BF16] {
        let t = fmt.name();
        let cmp_h = move |cmp: &'static str, a: u32, b: u32, k: u32| {
            fcmp(cmp, fmt.value(half_of(a, k)), fmt.value(half_of(b, k)))
        };
        let mut cases = Vec::new();
        for cmp in CMPS {
            cases.push(case(
                format!(
                    "setp.{cmp}.{t}x2 %p1|%p2, %r1, %r2;\n    selp.u32 %r10, 1, 0, %p1;\n    selp.u32 %r11, 2, 0, %p2;\n    or.b32 %r10, %r10, %r11;"
                ),
                move |a, b, _| cmp_h(cmp, a, b, 0) as u32 | (cmp_h(cmp, a, b, 1) as u32) << 1,
            ));
        }
        // with a boolean operation on a predicate taken from c's low bit
        for (cmp, bop) in [("lt", "and"), ("geu", "or"), ("ne", "xor"), ("nan", "and")] {
            let pc = "and.b32 %r12, %r3, 1;\n    setp.ne.u32 %p5, %r12, 0;";
            let f = move |x: bool, c: bool| match bop {
                "and" => x & c,
                "or" => x | c,
                _ => x ^ c,
            };
            cases.push(case(
                format!(
                    "{pc}\n    setp.{cmp}.{bop}.{t}x2 %p1|%p2, %r1, %r2, %p5;\n    selp.u32 %r10, 1, 0, %p1;\n    selp.u32 %r11, 2, 0, %p2;\n    or.b32 %r10, %r10, %r11;"
                ),
                move |a, b, c| {
                    f(cmp_h(cmp, a, b, 0), c & 1 == 1) as u32
                        | (f(cmp_h(cmp, a, b, 1), c & 1 == 1) as u32) << 1
                },
            ));
            cases.push(case(
                format!("{pc}\n    set.{cmp}.{bop}.{t}x2.{t}x2 %r10, %r1, %r2, %p5;"),
                move |a, b, c| {
                    let one = if fmt.bf16 { 0x3f80 } else { 0x3c00 };
                    (0..2).fold(0, |d, k| {
                        d | (f(cmp_h(cmp, a, b, k), c & 1 == 1) as u32 * one) << (16 * k)
                    })
                },
            ));
        }
        for cmp in ["eq", "ltu", "gt", "num"] {
            cases.push(case(
                format!("set.{cmp}.u32.{t}x2 %r10, %r1, %r2;"),
                move |a, b, _| {
                    (0..2).fold(0, |d, k| {
                        d | (cmp_h(cmp, a, b, k) as u32 * 0xffff) << (16 * k)
                    })
                },
            ));
            cases.push(case(
                format!("set.{cmp}.{t}x2.{t}x2 %r10, %r1, %r2;"),
                move |a, b, _| {
                    let one = if fmt.bf16 { 0x3f80 } else { 0x3c00 };
                    (0..2).fold(0, |d, k| d | (cmp_h(cmp, a, b, k) as u32 * one) << (16 * k))
                },
            ));
            // scalar: a .b16 result (1.0 or 0) and a .u32 one
            cases.push(case(
                format!("set.{cmp}.{t}.{t} %h10, %h1, %h3;\n    cvt.u32.u16 %r10, %h10;"),
                move |a, b, _| cmp_h(cmp, a, b, 0) as u32 * if fmt.bf16 { 0x3f80 } else { 0x3c00 },
            ));
            cases.push(case(
                format!("set.{cmp}.u32.{t} %r10, %h1, %h3;"),
                move |a, b, _| cmp_h(cmp, a, b, 0) as u32 * 0xffff_ffff,
            ));
        }
        if !fmt.bf16 {
            // .ftz: subnormal inputs compare as zero
            let flush = |h: u32| if h & 0x7c00 == 0 { 0.0 } else { F16.value(h) };
            cases.push(case(
                "setp.lt.ftz.f16x2 %p1|%p2, %r1, %r2;\n    selp.u32 %r10, 1, 0, %p1;\n    selp.u32 %r11, 2, 0, %p2;\n    or.b32 %r10, %r10, %r11;",
                move |a, b, _| {
                    (0..2).fold(0, |d, k| {
                        d | ((flush(half_of(a, k)) < flush(half_of(b, k))) as u32) << k
                    })
                },
            ));
        }
        let a = halves(40 + fmt.bf16 as u64, fmt, None);
        let b = halves(42 + fmt.bf16 as u64, fmt, Some(&a));
        check(&cases, &a, &b, &words(44));
    }
}

/// min/max of one element: NaN rules (`.NaN`: any NaN gives NaN; else the other operand),
/// -0 below +0, `.xorsign.abs`: magnitudes compared, the XOR of the signs applied to a number.
fn minmax_ref(fmt: Fmt, x: u32, y: u32, max: bool, nan_mode: bool, xorsign: bool) -> u32 {
    let sign = if xorsign { (x ^ y) & 0x8000 } else { 0 };
    let (x, y) = if xorsign {
        (x & 0x7fff, y & 0x7fff)
    } else {
        (x, y)
    };
    let (xn, yn) = (fmt.is_nan(x), fmt.is_nan(y));
    let r = if (xn && yn) || (nan_mode && (xn || yn)) {
        return 0x7fff;
    } else if xn {
        y
    } else if yn {
        x
    } else {
        let (vx, vy) = (fmt.value(x), fmt.value(y));
        let x_first = if vx == vy {
            // equal: only zeros of both signs differ; min takes -0, max +0
            (x & 0x8000 != 0) != max
        } else {
            (vx < vy) != max
        };
        if x_first {
            x
        } else {
            y
        }
    };
    r | sign
}

#[test]
fn packed_half_min_max_neg_abs() {
    let mut cases = Vec::new();
    for fmt in [F16, BF16] {
        let t = fmt.name();
        for op in ["min", "max"] {
            for (mods, nan, xs) in [
                ("", false, false),
                (".NaN", true, false),
                (".xorsign.abs", false, true),
                (".NaN.xorsign.abs", true, true),
            ] {
                let max = op == "max";
                cases.push(case(
                    format!("{op}{mods}.{t}x2 %r10, %r1, %r2;"),
                    move |a, b, _| {
                        (0..2).fold(0, |d, k| {
                            d | minmax_ref(fmt, half_of(a, k), half_of(b, k), max, nan, xs)
                                << (16 * k)
                        })
                    },
                ));
                cases.push(case(
                    format!("{op}{mods}.{t} %h10, %h1, %h3;\n    cvt.u32.u16 %r10, %h10;"),
                    move |a, b, _| minmax_ref(fmt, a & 0xffff, b & 0xffff, max, nan, xs),
                ));
            }
        }
        cases.push(case(format!("neg.{t}x2 %r10, %r1;"), |a, _, _| {
            a ^ 0x8000_8000
        }));
        cases.push(case(format!("abs.{t}x2 %r10, %r1;"), |a, _, _| {
            a & 0x7fff_7fff
        }));
    }
    // inputs with both formats' specials
    let a: Vec<u32> = halves(50, F16, None)
        .into_iter()
        .zip(halves(51, BF16, None))
        .enumerate()
        .map(|(i, (x, y))| if i % 2 == 0 { x } else { y })
        .collect();
    let b: Vec<u32> = halves(52, F16, Some(&a))
        .into_iter()
        .zip(halves(53, BF16, Some(&a)))
        .enumerate()
        .map(|(i, (x, y))| if i % 2 == 0 { x } else { y })
        .collect();
    // neg/abs of a NaN may give any NaN: keep NaN out of a's neg/abs lanes by checking them
    // separately is not needed, the emulator and the ISA both flip/clear the sign bit only.
    check(&cases, &a, &b, &words(54));
}

/// Exact `fma.rn` of one element (finite inputs), then `.relu`.
fn fma_relu_ref(fmt: Fmt, a: u32, b: u32, c: u32) -> u32 {
    let ((ma, ea), (mb, eb), (mc, ec)) = (fmt.split(a), fmt.split(b), fmt.split(c));
    let (mp, ep) = (ma * mb, ea + eb);
    // a zero term takes the other's exponent (its own may be far away)
    let (ep, ec) = match (mp == 0, mc == 0) {
        (true, false) => (ec, ec),
        (false, true) => (ep, ep),
        _ => (ep, ec),
    };
    let e = ep.min(ec);
    let n = (mp << (ep - e)) + (mc << (ec - e));
    let r = if n == 0 {
        // exact zero: -0 only when the product and c are both -0
        let neg_p = (a ^ b) & 0x8000 != 0;
        if mp == 0 && mc == 0 && neg_p && c & 0x8000 != 0 {
            0x8000
        } else {
            0
        }
    } else {
        fmt.round(n, e)
    };
    if r & 0x8000 != 0 {
        0
    } else {
        r
    }
}

/// Finite values with exponents in [-emax, emax], both signs.
fn finite_halves(seed: u64, fmt: Fmt, emax: i32) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let one = |rng: &mut StdRng| -> u32 {
        let x: f64 = rng.gen_range(-1.0..1.0) * 2f64.powi(rng.gen_range(-emax..=emax));
        let h = if fmt.bf16 {
            half::bf16::from_f64(x).to_bits()
        } else {
            half::f16::from_f64(x).to_bits()
        };
        if rng.gen_range(0..10) == 0 {
            0
        } else {
            h as u32
        }
    };
    (0..N)
        .map(|_| one(&mut rng) | one(&mut rng) << 16)
        .collect()
}

#[test]
fn packed_half_fma_relu_exact() {
    for (fmt, emax) in [(F16, 15), (BF16, 20)] {
        let t = fmt.name();
        let cases = vec![
            case(
                format!("fma.rn.relu.{t}x2 %r10, %r1, %r2, %r3;"),
                move |a, b, c| {
                    (0..2).fold(0, |d, k| {
                        d | fma_relu_ref(fmt, half_of(a, k), half_of(b, k), half_of(c, k))
                            << (16 * k)
                    })
                },
            ),
            case(
                format!("fma.rn.relu.{t} %h10, %h1, %h3, %h5;\n    cvt.u32.u16 %r10, %h10;"),
                move |a, b, c| fma_relu_ref(fmt, a & 0xffff, b & 0xffff, c & 0xffff),
            ),
        ];
        let s = 60 + 3 * fmt.bf16 as u64;
        check(
            &cases,
            &finite_halves(s, fmt, emax / 2),
            &finite_halves(s + 1, fmt, emax / 2),
            &finite_halves(s + 2, fmt, emax),
        );
    }
}

#[test]
fn half_rounding_reference_matches_the_half_crate() {
    // the reference's own rounding against `half` on values an f32 holds exactly (`half`
    // converts from f64 through f32, rounding twice)
    let mut rng = StdRng::seed_from_u64(70);
    for fmt in [F16, BF16] {
        for _ in 0..20000 {
            let n: i64 = rng.gen_range(-(1 << 24)..(1 << 24));
            let e: i32 = rng.gen_range(-70..-10);
            let x = (n as f64 * 2f64.powi(e)) as f32;
            let want = if fmt.bf16 {
                half::bf16::from_f32(x).to_bits()
            } else {
                half::f16::from_f32(x).to_bits()
            };
            let want = if n == 0 { 0 } else { want as u32 };
            assert_eq!(fmt.round(n as i128, e), want, "{fmt:?} {n} * 2^{e}");
        }
    }
}

/// An approximate function checked per element against the f64 function: within `rel` of
/// the exact value, or within `abs` (subnormal spacing; with `.ftz` a flushed result), and
/// NaN, infinities and the sign as the function gives them.
struct Approx {
    ptx: String,
    fmt: Fmt,
    /// elements the instruction computes: 2 (packed) or 1 (low half)
    elems: u32,
    f: fn(f64) -> f64,
    rel: f64,
    abs: f64,
}

fn approx_ok(fmt: Fmt, got: u32, x: f64, f: fn(f64) -> f64, rel: f64, abs: f64) -> bool {
    let want = f(x);
    let g = fmt.value(got);
    if want.is_nan() {
        return g.is_nan();
    }
    let max = if fmt.bf16 { 3.3895e38 } else { 65504.0 };
    if want.abs() > max {
        // past the largest finite value: infinity, or the largest value when rounding down
        return g.is_infinite() && g.signum() == want.signum() || g.abs() == max;
    }
    if want.is_infinite() || g.is_infinite() {
        return g == want;
    }
    (g - want).abs() <= (rel * want.abs()).max(abs)
}

#[test]
fn half_ex2_tanh_within_bounds() {
    let tests = [
        // ex2.approx: relative error 2^-9.9 (f16), 2^-7 (bf16, subnormal results flushed)
        (
            ".f16x2",
            "ex2.approx.f16x2 %r10, %r1;",
            F16,
            2,
            f64::exp2 as fn(f64) -> f64,
            -9.9,
            -24.0,
        ),
        (
            ".f16",
            "ex2.approx.f16 %h10, %h1;",
            F16,
            1,
            f64::exp2,
            -9.9,
            -24.0,
        ),
        (
            ".bf16x2",
            "ex2.approx.ftz.bf16x2 %r10, %r1;",
            BF16,
            2,
            f64::exp2,
            -7.0,
            -126.0,
        ),
        (
            ".bf16",
            "ex2.approx.ftz.bf16 %h10, %h1;",
            BF16,
            1,
            f64::exp2,
            -7.0,
            -126.0,
        ),
        // tanh.approx: relative error 2^-10.987 (f16), 2^-8 (bf16)
        (
            ".f16x2",
            "tanh.approx.f16x2 %r10, %r1;",
            F16,
            2,
            f64::tanh,
            -10.987,
            -24.0,
        ),
        (
            ".f16",
            "tanh.approx.f16 %h10, %h1;",
            F16,
            1,
            f64::tanh,
            -10.987,
            -24.0,
        ),
        (
            ".bf16x2",
            "tanh.approx.bf16x2 %r10, %r1;",
            BF16,
            2,
            f64::tanh,
            -8.0,
            -133.0,
        ),
        (
            ".bf16",
            "tanh.approx.bf16 %h10, %h1;",
            BF16,
            1,
            f64::tanh,
            -8.0,
            -133.0,
        ),
    ];
    let cases: Vec<Approx> = tests
        .iter()
        .map(|(_, ptx, fmt, elems, f, rel, abs)| Approx {
            ptx: if *elems == 1 {
                format!("{ptx}\n    cvt.u32.u16 %r10, %h10;")
            } else {
                ptx.to_string()
            },
            fmt: *fmt,
            elems: *elems,
            f: *f,
            rel: 2f64.powf(*rel),
            abs: 2f64.powf(*abs),
        })
        .collect();
    // inputs: values in the functions' interesting ranges, specials, and any bits
    for fmt in [F16, BF16] {
        let mut rng = StdRng::seed_from_u64(80 + fmt.bf16 as u64);
        let range = if fmt.bf16 { 140.0 } else { 26.0 };
        let specials = [0x0000u32, 0x8000, 0x0001, 0x8001, 0x7fff, 0x3c00, 0xbc00];
        let inf = if fmt.bf16 { 0x7f80 } else { 0x7c00 };
        let mut one = || -> u32 {
            match rng.gen_range(0..10) {
                0 => specials[rng.gen_range(0..specials.len())],
                1 => inf | if rng.gen() { 0x8000 } else { 0 },
                2 => rng.gen::<u32>() & 0xffff,
                _ => {
                    let x: f64 = rng.gen_range(-range..range);
                    if fmt.bf16 {
                        half::bf16::from_f32(x as f32).to_bits() as u32
                    } else {
                        half::f16::from_f32(x as f32).to_bits() as u32
                    }
                }
            }
        };
        let a: Vec<u32> = (0..N).map(|_| one() | one() << 16).collect();
        let mine: Vec<&Approx> = cases.iter().filter(|c| c.fmt == fmt).collect();
        let plain: Vec<Case> = mine
            .iter()
            .map(|c| case(c.ptx.clone(), |_, _, _| 0))
            .collect();
        let got = run(&plain, &a, &a, &a);
        let mut bad = Vec::new();
        for (j, c) in mine.iter().enumerate() {
            for t in 0..N {
                for k in 0..c.elems {
                    let x = fmt.value(half_of(a[t], k));
                    let g = half_of(got[t][j], k);
                    if !approx_ok(fmt, g, x, c.f, c.rel, c.abs) && bad.len() < 20 {
                        bad.push(format!(
                            "`{}` x={x} ({:#x}): got {} ({g:#x}), f(x)={}",
                            c.ptx,
                            half_of(a[t], k),
                            fmt.value(g),
                            (c.f)(x)
                        ));
                    }
                }
                if c.elems == 1 && got[t][j] >> 16 != 0 {
                    bad.push(format!("`{}`: high half of the cvt not zero", c.ptx));
                }
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}

#[test]
fn setp_ftz_flushes_subnormal_inputs() {
    // f32 and f16 comparisons with .ftz see subnormal inputs as zero of the same sign
    let f32v = |x: u32| {
        if x & 0x7f80_0000 == 0 {
            0.0
        } else {
            f32::from_bits(x) as f64
        }
    };
    let f16v = |x: u32| {
        if x & 0x7c00 == 0 {
            0.0
        } else {
            F16.value(x)
        }
    };
    let sel = "selp.u32 %r10, 1, 0, %p1;";
    let mut cases = Vec::new();
    for cmp in ["eq", "lt", "gtu", "ne"] {
        cases.push(case(
            format!("mov.b32 %f1, %r1;\n    mov.b32 %f2, %r2;\n    setp.{cmp}.ftz.f32 %p1, %f1, %f2;\n    {sel}"),
            move |a, b, _| fcmp(cmp, f32v(a), f32v(b)) as u32,
        ));
        cases.push(case(
            format!("setp.{cmp}.ftz.f16 %p1, %h1, %h3;\n    {sel}"),
            move |a, b, _| fcmp(cmp, f16v(a & 0xffff), f16v(b & 0xffff)) as u32,
        ));
    }
    // subnormals, zeros and small normals of both formats, in both halves
    let mut rng = StdRng::seed_from_u64(90);
    let mut tiny = || -> Vec<u32> {
        (0..N)
            .map(|_| {
                let sign = if rng.gen() { 0x8000_8000 } else { 0 };
                match rng.gen_range(0..4) {
                    0 => sign,
                    1 => rng.gen_range(0..0x0080_0000) | sign,
                    2 => (rng.gen_range(0..0x400) * 0x10001) | sign,
                    _ => rng.gen::<u32>() & 0x0fff_0fff,
                }
            })
            .collect()
    };
    let (a, b) = (tiny(), tiny());
    check(&cases, &a, &b, &a);
}
