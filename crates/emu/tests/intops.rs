//! Integer, bit and comparison instructions against Rust reference semantics on random and
//! edge-case inputs: one tiny kernel per instruction form, every lane a different input.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::{Rng, SeedableRng};

const N: usize = 256;

/// Runs `ins` (a PTX instruction over %r10 = f(%r1, %r2, %r3) or the 64-bit equivalents) on
/// N inputs and returns the results.
fn run(ins: &str, wide: bool, dst_pred: bool, a: &[u64], b: &[u64], c: &[u64]) -> Vec<u64> {
    let (ty, sz, reg) = if wide {
        ("b64", 8, "%rd")
    } else {
        ("b32", 4, "%r")
    };
    let body = if dst_pred {
        format!("{ins}\n    selp.u32 %r20, 1, 0, %p1;\n    cvt.u64.u32 %rd20, %r20;\n    st.global.u64 [%rd9], %rd20;")
    } else if wide {
        format!("{ins}\n    st.global.u64 [%rd9], {reg}10;")
    } else {
        format!("{ins}\n    cvt.u64.u32 %rd20, %r10;\n    st.global.u64 [%rd9], %rd20;")
    };
    let text = format!(
        r#".version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd)
{{
    .reg .pred %p<4>;
    .reg .b32 %r<24>;
    .reg .b64 %rd<24>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u64 %rd4, [pd];
    mov.u32 %r0, %tid.x;
    mov.u32 %r5, %ctaid.x;
    mad.lo.u32 %r0, %r5, 128, %r0;
    mul.wide.u32 %rd5, %r0, {sz};
    mul.wide.u32 %rd6, %r0, 8;
    add.s64 %rd7, %rd1, %rd5;
    ld.global.{ty} {reg}1, [%rd7];
    add.s64 %rd7, %rd2, %rd5;
    ld.global.{ty} {reg}2, [%rd7];
    add.s64 %rd7, %rd3, %rd5;
    ld.global.{ty} {reg}3, [%rd7];
    add.s64 %rd9, %rd4, %rd6;
    {body}
    ret;
}}
"#
    );
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(
        &mem,
        ptx::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}")),
        0,
    )
    .unwrap();
    let mut bufs = Vec::new();
    for v in [a, b, c] {
        let buf = mem.alloc((N * sz) as u64, 0).unwrap();
        let bytes: Vec<u8> = v
            .iter()
            .flat_map(|x| x.to_le_bytes()[..sz].to_vec())
            .collect();
        buf.write_bytes(0, &bytes);
        bufs.push(buf);
    }
    let out = mem.alloc((N * 8) as u64, 0).unwrap();
    out.fill(0, (N * 8) as u64, &[0xa5]);
    let mut p = Vec::new();
    for x in bufs.iter().map(|b| b.base).chain([out.base]) {
        p.extend_from_slice(&x.to_le_bytes());
    }
    let cfg = LaunchConfig {
        grid: [(N / 128) as u32, 1, 1],
        block: [128, 1, 1],
        shared_bytes: 0,
        sms: 132,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{ins}: {e}"));
    let mut raw = vec![0u8; N * 8];
    out.read_bytes(0, &mut raw);
    raw.chunks(8)
        .map(|x| u64::from_le_bytes(x.try_into().unwrap()))
        .collect()
}

fn inputs(seed: u64, wide: bool) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let edges32 = [
        0u64,
        1,
        2,
        31,
        32,
        33,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        0xffff_fffe,
        0x1234_5678,
    ];
    let edges64 = [
        0u64,
        1,
        63,
        64,
        0x7fff_ffff_ffff_ffff,
        0x8000_0000_0000_0000,
        u64::MAX,
        0xffff_ffff,
    ];
    (0..N)
        .map(|i| {
            let e: &[u64] = if wide { &edges64 } else { &edges32 };
            if i % 5 == 0 {
                e[(i / 5) % e.len()]
            } else if wide {
                rng.gen::<u64>() >> rng.gen_range(0..64)
            } else {
                (rng.gen::<u32>() >> rng.gen_range(0..32)) as u64
            }
        })
        .collect()
}

type Ref = fn(u64, u64, u64) -> u64;

#[test]
fn integer_and_bit_ops_match_reference() {
    let cases32: Vec<(&str, Ref)> = vec![
        ("add.u32 %r10, %r1, %r2;", |a, b, _| {
            (a as u32).wrapping_add(b as u32) as u64
        }),
        ("sub.s32 %r10, %r1, %r2;", |a, b, _| {
            (a as u32).wrapping_sub(b as u32) as u64
        }),
        ("add.sat.s32 %r10, %r1, %r2;", |a, b, _| {
            (a as i32).saturating_add(b as i32) as u32 as u64
        }),
        ("mul.lo.u32 %r10, %r1, %r2;", |a, b, _| {
            (a as u32).wrapping_mul(b as u32) as u64
        }),
        ("mul.hi.u32 %r10, %r1, %r2;", |a, b, _| {
            (a as u32 as u64 * b as u32 as u64) >> 32
        }),
        ("mul.hi.s32 %r10, %r1, %r2;", |a, b, _| {
            ((a as i32 as i64 * b as i32 as i64) >> 32) as u32 as u64
        }),
        ("mad.lo.s32 %r10, %r1, %r2, %r3;", |a, b, c| {
            (a as u32).wrapping_mul(b as u32).wrapping_add(c as u32) as u64
        }),
        ("mad.hi.u32 %r10, %r1, %r2, %r3;", |a, b, c| {
            (((a as u32 as u64 * b as u32 as u64) >> 32) as u32).wrapping_add(c as u32) as u64
        }),
        ("min.s32 %r10, %r1, %r2;", |a, b, _| {
            (a as i32).min(b as i32) as u32 as u64
        }),
        ("max.u32 %r10, %r1, %r2;", |a, b, _| {
            (a as u32).max(b as u32) as u64
        }),
        ("abs.s32 %r10, %r1;", |a, _, _| {
            (a as i32).wrapping_abs() as u32 as u64
        }),
        ("neg.s32 %r10, %r1;", |a, _, _| {
            (a as i32).wrapping_neg() as u32 as u64
        }),
        ("and.b32 %r10, %r1, %r2;", |a, b, _| a & b),
        ("or.b32 %r10, %r1, %r2;", |a, b, _| a | b),
        ("xor.b32 %r10, %r1, %r2;", |a, b, _| a ^ b),
        ("not.b32 %r10, %r1;", |a, _, _| !(a as u32) as u64),
        ("cnot.b32 %r10, %r1;", |a, _, _| (a as u32 == 0) as u64),
        ("shl.b32 %r10, %r1, %r2;", |a, b, _| {
            if (b as u32) >= 32 {
                0
            } else {
                ((a as u32) << b) as u64
            }
        }),
        ("shr.u32 %r10, %r1, %r2;", |a, b, _| {
            if (b as u32) >= 32 {
                0
            } else {
                ((a as u32) >> b) as u64
            }
        }),
        ("shr.s32 %r10, %r1, %r2;", |a, b, _| {
            ((a as i32) >> (b as u32).min(31)) as u32 as u64
        }),
        ("popc.b32 %r10, %r1;", |a, _, _| {
            (a as u32).count_ones() as u64
        }),
        ("clz.b32 %r10, %r1;", |a, _, _| {
            (a as u32).leading_zeros() as u64
        }),
        ("brev.b32 %r10, %r1;", |a, _, _| {
            (a as u32).reverse_bits() as u64
        }),
        ("bfind.u32 %r10, %r1;", |a, _, _| {
            if a as u32 == 0 {
                0xffff_ffff
            } else {
                31 - (a as u32).leading_zeros() as u64
            }
        }),
        ("bfind.s32 %r10, %r1;", |a, _, _| {
            let v = if (a as i32) < 0 {
                !(a as u32)
            } else {
                a as u32
            };
            if v == 0 {
                0xffff_ffff
            } else {
                31 - v.leading_zeros() as u64
            }
        }),
        ("bfe.u32 %r10, %r1, %r2, %r3;", |a, b, c| {
            let (pos, len) = ((b & 0xff) as u32, (c & 0xff) as u32);
            let mut d = 0u64;
            for i in 0..32 {
                let bit = if i < len && pos + i < 32 {
                    (a >> (pos + i)) & 1
                } else {
                    0
                };
                d |= bit << i;
            }
            d
        }),
        ("bfe.s32 %r10, %r1, %r2, %r3;", |a, b, c| {
            let (pos, len) = ((b & 0xff) as u32, (c & 0xff) as u32);
            let msb = if len == 0 { 0 } else { (pos + len - 1).min(31) };
            let sbit = if len == 0 { 0 } else { (a >> msb) & 1 };
            let mut d = 0u64;
            for i in 0..32 {
                let bit = if i < len && pos + i < 32 {
                    (a >> (pos + i)) & 1
                } else {
                    sbit
                };
                d |= bit << i;
            }
            d
        }),
        ("prmt.b32 %r10, %r1, %r2, %r3;", |a, b, c| {
            let bytes = ((b as u32 as u64) << 32 | a as u32 as u64).to_le_bytes();
            let mut d = 0u32;
            for i in 0..4 {
                let sel = ((c as u32) >> (4 * i)) & 0xf;
                let byte = bytes[(sel & 7) as usize];
                let v = if sel & 8 != 0 {
                    if byte & 0x80 != 0 {
                        0xff
                    } else {
                        0
                    }
                } else {
                    byte
                };
                d |= (v as u32) << (8 * i);
            }
            d as u64
        }),
        ("shf.l.wrap.b32 %r10, %r1, %r2, %r3;", |a, b, c| {
            ((((b as u32 as u64) << 32 | a as u32 as u64) << ((c as u32) & 31)) >> 32) as u32 as u64
        }),
        ("shf.r.clamp.b32 %r10, %r1, %r2, %r3;", |a, b, c| {
            ((((b as u32 as u64) << 32 | a as u32 as u64) >> (c as u32).min(32)) as u32) as u64
        }),
        ("lop3.b32 %r10, %r1, %r2, %r3, 0xE8;", |a, b, c| {
            ((a & b) | (a & c) | (b & c)) & 0xffff_ffff
        }),
        ("setp.lt.s32 %p1, %r1, %r2;", |a, b, _| {
            ((a as i32) < (b as i32)) as u64
        }),
        ("setp.hs.u32 %p1, %r1, %r2;", |a, b, _| {
            ((a as u32) >= (b as u32)) as u64
        }),
        ("setp.ne.and.u32 %p1, %r1, %r2, %p0;", |_, _, _| 0),
        ("sad.u32 %r10, %r1, %r2, %r3;", |a, b, c| {
            (a as u32).abs_diff(b as u32).wrapping_add(c as u32) as u64
        }),
        ("mul24.lo.u32 %r10, %r1, %r2;", |a, b, _| {
            ((a as u32 & 0xff_ffff).wrapping_mul(b as u32 & 0xff_ffff)) as u64
        }),
    ];
    let (a, b, c) = (inputs(1, false), inputs(2, false), inputs(3, false));
    let (bs, cs): (Vec<u64>, Vec<u64>) = (
        b.iter().map(|x| x % 40).collect(),
        c.iter().map(|x| x % 40).collect(),
    );
    for (ins, f) in cases32 {
        // Shift / bit-field operands get small counts so every regime is exercised.
        let small = ins.starts_with("sh") || ins.starts_with("bfe");
        let (bb, cc) = if small { (&bs, &cs) } else { (&b, &c) };
        let pred = ins.starts_with("setp");
        let text = if ins.contains("%p0") {
            format!("setp.eq.u32 %p0, %r3, 7;\n    {ins}")
        } else {
            ins.to_string()
        };
        let got = run(&text, false, pred, &a, bb, cc);
        for i in 0..N {
            let want = if ins.contains("%p0") {
                ((a[i] as u32 != bb[i] as u32) && cc[i] as u32 == 7) as u64
            } else {
                f(a[i], bb[i], cc[i])
            };
            assert_eq!(
                got[i], want,
                "{ins} a={:#x} b={:#x} c={:#x}",
                a[i], bb[i], cc[i]
            );
        }
    }
}

#[test]
fn wide_integer_ops_match_reference() {
    let cases: Vec<(&str, Ref)> = vec![
        ("add.s64 %rd10, %rd1, %rd2;", |a, b, _| a.wrapping_add(b)),
        ("mul.lo.u64 %rd10, %rd1, %rd2;", |a, b, _| a.wrapping_mul(b)),
        ("mul.hi.s64 %rd10, %rd1, %rd2;", |a, b, _| {
            ((a as i64 as i128 * b as i64 as i128) >> 64) as u64
        }),
        ("min.s64 %rd10, %rd1, %rd2;", |a, b, _| {
            (a as i64).min(b as i64) as u64
        }),
        ("shr.s64 %rd10, %rd1, 3;", |a, _, _| {
            ((a as i64) >> 3) as u64
        }),
        (
            "popc.b64 %r10, %rd1;\n    cvt.u64.u32 %rd10, %r10;",
            |a, _, _| a.count_ones() as u64,
        ),
        ("div.u64 %rd10, %rd1, %rd2;", |a, b, _| a / b),
        ("rem.s64 %rd10, %rd1, %rd2;", |a, b, _| {
            (a as i64).wrapping_rem(b as i64) as u64
        }),
    ];
    let a = inputs(4, true);
    let b: Vec<u64> = inputs(5, true)
        .iter()
        .map(|x| if *x == 0 { 3 } else { *x })
        .collect();
    let c = inputs(6, true);
    for (ins, f) in cases {
        let got = run(ins, true, false, &a, &b, &c);
        for i in 0..N {
            assert_eq!(
                got[i],
                f(a[i], b[i], c[i]),
                "{ins} a={:#x} b={:#x}",
                a[i],
                b[i]
            );
        }
    }
}
