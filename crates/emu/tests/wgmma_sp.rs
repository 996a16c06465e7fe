//! `wgmma.mma_async.sp` (sm_90a): f16/bf16 m64nNk32, tf32 m64nNk16, e4m3/e5m2 and s8/u8
//! m64nNk64, with the compressed A from a shared-memory descriptor (no swizzle and 128-byte
//! swizzle) or from registers, every valid sparsity selector, garbage in the lanes that hold no
//! metadata. The host builds a random sparse A (2:4 chunks; 1:2 for tf32), its compressed
//! image and the metadata of each warp's 16 rows, lays the compressed A (64 x k/2, K-major)
//! and B (N x k, K-major) out as the descriptors describe, and compares D with an exact
//! product (f64 on values whose sums are exact, i64 for the integer forms) in the exact mode,
//! and with `tc_numerics::reference_dot` on the decompressed operands under the sm_90 model.
//! Every kernel is checked by ptxas; outputs are poisoned first.

use emu::tc_numerics::{model_for, reference_dot};
use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule, Numerics};
use half::{bf16, f16};
use ptx::Ty;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Byte offset of (row, kbyte) in a K-major operand laid out for the descriptor (no swizzle:
/// 8 x 16-byte core matrices, k chunks `lbo` apart, 8-row groups `sbo` apart; 128-byte
/// swizzle: rows of 128 bytes, 16-byte chunks XORed with the row within the 8-row group).
fn place(sw128: bool, row: usize, kbyte: usize, sbo: usize, lbo: usize) -> usize {
    if sw128 {
        let lin = (row / 8) * sbo + (row % 8) * 128 + kbyte;
        lin ^ (((lin >> 7) & 7) << 4)
    } else {
        (row / 8) * sbo + (kbyte / 16) * lbo + (row % 8) * 16 + kbyte % 16
    }
}

/// The descriptor's (lbo, sbo) for rows of `kbytes` bytes.
fn strides(sw128: bool, kbytes: usize) -> (usize, usize) {
    if sw128 {
        (16, 1024)
    } else {
        (128, 128 * kbytes.div_ceil(16))
    }
}

fn desc(start: usize, lbo: usize, sbo: usize, sw128: bool) -> u64 {
    ((start as u64 >> 4) & 0x3fff)
        | (((lbo as u64 >> 4) & 0x3fff) << 16)
        | (((sbo as u64 >> 4) & 0x3fff) << 32)
        | ((sw128 as u64) << 62)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum El {
    F16,
    Bf16,
    Tf32,
    E4m3,
    E5m2,
    S8,
    U8,
}

impl El {
    fn name(self) -> &'static str {
        match self {
            El::F16 => "f16",
            El::Bf16 => "bf16",
            El::Tf32 => "tf32",
            El::E4m3 => "e4m3",
            El::E5m2 => "e5m2",
            El::S8 => "s8",
            El::U8 => "u8",
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
        }
    }
    fn size(self) -> usize {
        match self {
            El::F16 | El::Bf16 => 2,
            El::Tf32 => 4,
            _ => 1,
        }
    }
    fn int(self) -> bool {
        matches!(self, El::S8 | El::U8)
    }
    /// A random non-zero value exact in the type and its raw bits (floats: multiples of 1/64
    /// below 2, or 8-bit floats between 1/16 and 16, so every sum of a test is exact in f64).
    fn random(self, rng: &mut StdRng) -> (f64, u32) {
        let x = loop {
            let v = rng.gen_range(-127i32..=127);
            if v != 0 {
                break v as f64 / 64.0;
            }
        };
        match self {
            El::F16 => (x, f16::from_f64(x).to_bits() as u32),
            El::Bf16 => (x, bf16::from_f64(x).to_bits() as u32),
            El::Tf32 => (x, (x as f32).to_bits() | rng.gen_range(0..1 << 13)),
            El::E4m3 | El::E5m2 => loop {
                let code = rng.gen_range(0..256u32);
                let v = fp8(self, code);
                if v.abs() >= 1.0 / 16.0 && v.abs() <= 16.0 {
                    return (v, code);
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
        }
    }
}

/// An 8-bit float code's value, bit by bit (NaN codes give NaN and are filtered out).
fn fp8(el: El, code: u32) -> f64 {
    let (eb, mb, bias) = if el == El::E4m3 {
        (4, 3, 7)
    } else {
        (5, 2, 15)
    };
    let e = ((code >> mb) & ((1 << eb) - 1)) as i32;
    if (el == El::E5m2 && e == 31) || (el == El::E4m3 && code & 0x7f == 0x7f) {
        return f64::NAN;
    }
    let m = (code & ((1 << mb) - 1)) as f64 / (1 << mb) as f64;
    let v = if e == 0 {
        m * 2f64.powi(1 - bias)
    } else {
        (1.0 + m) * 2f64.powi(e - bias)
    };
    if code & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// One case.
#[derive(Clone, Copy, Debug)]
struct Case {
    a: El,
    b: El,
    n: usize,
    /// A from registers (else from a descriptor)
    regs: bool,
    sw128: bool,
    sel: usize,
    hw: bool,
    /// integer forms: start every accumulator at this value (scale-d 1) and use `.satfinite`
    /// when the flag is set
    acc: Option<(i32, bool)>,
    /// the dense `wgmma.mma_async` of the same types (A not sparse, half the k)
    dense: bool,
}

/// A random sparse A (64 x k): raw dense elements, values, the compressed raw elements of each
/// row and each row's chunk nibbles (`i0 | i1 << 2`, positions of the kept 16-bit units for
/// f16/bf16/tf32 (a tf32 is two units), of the kept bytes for 8-bit types).
struct SparseA {
    raw: Vec<Vec<u32>>,
    val: Vec<Vec<f64>>,
    comp: Vec<Vec<u32>>,
    nib: Vec<Vec<u32>>,
}

/// A random dense A (64 x k), stored as its own "compressed" form (every element kept).
fn dense_a(rng: &mut StdRng, el: El, k: usize) -> SparseA {
    let mut s = SparseA {
        raw: vec![vec![0; k]; 64],
        val: vec![vec![0.0; k]; 64],
        comp: vec![Vec::new(); 64],
        nib: vec![Vec::new(); 64],
    };
    for r in 0..64 {
        for kk in 0..k {
            let (v, bits) = el.random(rng);
            s.raw[r][kk] = bits;
            s.val[r][kk] = v;
            s.comp[r].push(bits);
        }
    }
    s
}

fn sparse_a(rng: &mut StdRng, el: El, k: usize) -> SparseA {
    let chunk = if el == El::Tf32 { 2 } else { 4 };
    let mut s = SparseA {
        raw: vec![vec![0; k]; 64],
        val: vec![vec![0.0; k]; 64],
        comp: vec![Vec::new(); 64],
        nib: vec![Vec::new(); 64],
    };
    for r in 0..64 {
        for ch in 0..k / chunk {
            let (i0, i1) = if el == El::Tf32 {
                if rng.gen_bool(0.5) {
                    (0, 1)
                } else {
                    (2, 3)
                }
            } else {
                let i0 = rng.gen_range(0..3u32);
                (i0, rng.gen_range(i0 + 1..4))
            };
            s.nib[r].push(i0 | i1 << 2);
            let kept = if el == El::Tf32 {
                vec![ch * 2 + (i0 / 2) as usize]
            } else {
                vec![ch * 4 + i0 as usize, ch * 4 + i1 as usize]
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

/// Metadata word of thread `t` (warp w = t/32 holds rows 16w..16w+15): 16-bit types, two
/// threads per group: thread j (lane 4g + 2sel + j) holds chunks 4j..4j+3 of rows g (bits
/// 0..15) and g + 8 (bits 16..31); 8-bit types, four threads: thread j holds chunks
/// 8*(j >> 1).. of row g + 8*(j & 1). Other lanes get garbage.
fn meta_word(rng: &mut StdRng, el: El, nib: &[Vec<u32>], t: usize, sel: usize) -> u32 {
    let (w, lane) = (t / 32, t % 32);
    let (g, q) = (lane / 4, lane % 4);
    let unit16 = matches!(el, El::F16 | El::Bf16 | El::Tf32);
    let threads = if unit16 { 2 } else { 4 };
    if q < threads * sel || q >= threads * (sel + 1) {
        return rng.gen();
    }
    let j = q - threads * sel;
    let row = |r: usize| &nib[16 * w + r];
    let mut word = 0;
    if unit16 {
        for c in 0..4 {
            word |= row(g)[4 * j + c] << (4 * c);
            word |= row(g + 8)[4 * j + c] << (16 + 4 * c);
        }
    } else {
        for c in 0..8 {
            word |= row(g + 8 * (j & 1))[8 * (j >> 1) + c] << (4 * c);
        }
    }
    word
}

/// The compressed A register words of thread `t`: register i holds bytes 16*(i >> 1) + 4q ..
/// of compressed row 16w + g + 8*(i & 1).
fn a_words(el: El, comp: &[Vec<u32>], t: usize) -> [u32; 4] {
    let (w, lane) = (t / 32, t % 32);
    let (g, q) = (lane / 4, lane % 4);
    let es = el.size();
    let mut out = [0u32; 4];
    for (i, o) in out.iter_mut().enumerate() {
        let row = &comp[16 * w + g + 8 * (i & 1)];
        let first = (16 * (i >> 1) + 4 * q) / es;
        for e in 0..4 / es {
            *o |= row[first + e] << (8 * es * e);
        }
    }
    out
}

fn kernel(c: &Case, k: usize) -> String {
    let regs = c.n / 2;
    let int = c.a.int();
    let dreg = if int { "b32" } else { "f32" };
    let list: Vec<String> = (0..regs).map(|i| format!("%d{i}")).collect();
    let (dty, a_op) = (
        if int { "s32" } else { "f32" },
        if c.regs {
            "{%a0, %a1, %a2, %a3}"
        } else {
            "%rd2"
        },
    );
    let imms = if int {
        String::new()
    } else if matches!(c.a, El::F16 | El::Bf16) && !c.regs {
        ", 1, 1, 0, 0".into()
    } else if matches!(c.a, El::F16 | El::Bf16) {
        ", 1, 1, 0".into()
    } else {
        ", 1, 1".into()
    };
    let mut stores = String::new();
    for i in 0..regs {
        stores.push_str(&format!("    st.global.b32 [%rd5+{}], %d{i};\n", 4 * i));
    }
    let mut inits = String::new();
    if let Some((x, _)) = c.acc {
        for i in 0..regs {
            inits.push_str(&format!("    mov.b32 %d{i}, {x};\n"));
        }
    }
    let sat = if matches!(c.acc, Some((_, true))) {
        ".satfinite"
    } else {
        ""
    };
    let scale_d = c.acc.is_some() as u32;
    format!(
        r#".version 8.5
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
.visible .entry wg(.param .u64 img, .param .u32 img_words, .param .u64 da, .param .u64 db, .param .u64 thr, .param .u64 out)
{{
    .reg .pred %p<3>;
    .reg .b32 %r<12>, %a<4>, %meta;
    .reg .b64 %rd<12>;
    .reg .{dreg} %d<{regs}>;
    ld.param.u64 %rd1, [img];
    ld.param.u32 %r1, [img_words];
    ld.param.u64 %rd2, [da];
    ld.param.u64 %rd3, [db];
    ld.param.u64 %rd9, [thr];
    ld.param.u64 %rd4, [out];
    mov.u32 %r2, %tid.x;
    mul.wide.u32 %rd10, %r2, 20;
    add.s64 %rd9, %rd9, %rd10;
    ld.global.u32 %meta, [%rd9];
    ld.global.u32 %a0, [%rd9+4];
    ld.global.u32 %a1, [%rd9+8];
    ld.global.u32 %a2, [%rd9+12];
    ld.global.u32 %a3, [%rd9+16];
    mov.u32 %r3, %r2;
COPY:
    setp.ge.u32 %p1, %r3, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd6, %r3, 4;
    add.s64 %rd7, %rd1, %rd6;
    ld.global.u32 %r4, [%rd7];
    shl.b32 %r5, %r3, 2;
    mov.u32 %r6, smem;
    add.u32 %r7, %r6, %r5;
    st.shared.u32 [%r7], %r4;
    add.u32 %r3, %r3, 128;
    bra COPY;
DONE:
    bar.sync 0;
    fence.proxy.async.shared::cta;
{inits}    wgmma.fence.sync.aligned;
    wgmma.mma_async{sp}.sync.aligned.m64n{n}k{k}.{dty}.{at}.{bt}{sat} {{{list}}}, {a_op}, %rd3, {meta}{scale_d}{imms};
    wgmma.commit_group.sync.aligned;
    wgmma.wait_group.sync.aligned 0;
    mul.wide.u32 %rd8, %r2, {rb};
    add.s64 %rd5, %rd4, %rd8;
{stores}    ret;
}}
"#,
        n = c.n,
        at = c.a.name(),
        bt = c.b.name(),
        sp = if c.dense { "" } else { ".sp" },
        meta = if c.dense {
            String::new()
        } else {
            format!("%meta, {}, ", c.sel)
        },
        list = list.join(", "),
        rb = 4 * regs
    )
}

fn run_case(c: Case, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let es = c.a.size();
    // the dense row is 64 bytes for every input type (32 for the dense forms)
    let k = if c.dense { 32 / es } else { 64 / es };
    let sa = if c.dense {
        dense_a(&mut rng, c.a, k)
    } else {
        sparse_a(&mut rng, c.a, k)
    };
    let bm: Vec<Vec<(f64, u32)>> = (0..c.n)
        .map(|_| (0..k).map(|_| c.b.random(&mut rng)).collect())
        .collect();
    // shared image: compressed A (32-byte rows) then B (64-byte rows)
    let (alb, asb) = strides(c.sw128, 32);
    let (blb, bsb) = strides(c.sw128, k * es);
    let b_start = (8 * asb).div_ceil(1024) * 1024;
    let total = (b_start + c.n.div_ceil(8) * bsb).div_ceil(4) * 4;
    let mut img = vec![0u8; total];
    for r in 0..64 {
        for (kk, bits) in sa.comp[r].iter().enumerate() {
            let off = place(c.sw128, r, kk * es, asb, alb);
            img[off..off + es].copy_from_slice(&bits.to_le_bytes()[..es]);
        }
    }
    for (col, bc) in bm.iter().enumerate() {
        for (kk, (_, bits)) in bc.iter().enumerate() {
            let off = b_start + place(c.sw128, col, kk * es, bsb, blb);
            img[off..off + es].copy_from_slice(&bits.to_le_bytes()[..es]);
        }
    }
    let mut thr = Vec::new();
    for t in 0..128 {
        let meta = if c.dense {
            0
        } else {
            meta_word(&mut rng, c.a, &sa.nib, t, c.sel)
        };
        thr.extend(meta.to_le_bytes());
        for w in a_words(c.a, &sa.comp, t) {
            thr.extend(w.to_le_bytes());
        }
    }
    let text = kernel(&c, k);
    if ptx::ptxas::ptxas_for_tests("wgmma_sp test PTX").is_some() {
        ptx::ptxas::assemble(&text, "sm_90a", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}\n{text}"));
    }
    let module = ptx::parse(&text).unwrap();
    assert_eq!(
        ptx::parse(&ptx::print(&module)).unwrap(),
        module,
        "round trip"
    );
    let diags = ptx::validate(&module);
    assert!(diags.iter().all(|d| !d.is_error()), "{diags:?}");
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, module, 0).unwrap();
    let gimg = mem.alloc(total as u64, 0).unwrap();
    gimg.write_bytes(0, &img);
    let gthr = mem.alloc(thr.len() as u64, 0).unwrap();
    gthr.write_bytes(0, &thr);
    let out_bytes = (128 * c.n / 2 * 4) as u64;
    let out = mem.alloc(out_bytes, 0).unwrap();
    out.fill(0, out_bytes, &[0xff]);
    let mut p = Vec::new();
    p.extend_from_slice(&gimg.base.to_le_bytes());
    p.extend_from_slice(&((total / 4) as u32).to_le_bytes());
    p.extend_from_slice(&[0u8; 4]);
    p.extend_from_slice(&desc(0, alb, asb, c.sw128).to_le_bytes());
    p.extend_from_slice(&desc(b_start, blb, bsb, c.sw128).to_le_bytes());
    p.extend_from_slice(&gthr.base.to_le_bytes());
    p.extend_from_slice(&out.base.to_le_bytes());
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [128, 1, 1],
        shared_bytes: total as u32,
        sms: 1,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    let opts = LaunchOptions {
        numerics: if c.hw {
            Numerics::Hardware
        } else {
            Numerics::Exact
        },
        ..LaunchOptions::default()
    };
    launch(m.kernel("wg").unwrap(), mem.snapshot(), p, &cfg, &opts).unwrap();
    let mut raw = vec![0u8; out_bytes as usize];
    out.read_bytes(0, &mut raw);
    for t in 0..128usize {
        let (w, l) = (t >> 5, t & 31);
        let (g, q) = (l >> 2, l & 3);
        for i in 0..c.n / 2 {
            let row = 16 * w + g + 8 * ((i >> 1) & 1);
            let col = 8 * (i >> 2) + 2 * q + (i & 1);
            let want = if c.hw {
                let model = model_for(90, c.a.ty()).unwrap();
                let a: Vec<u64> = sa.raw[row].iter().map(|x| *x as u64).collect();
                let b: Vec<u64> = bm[col].iter().map(|x| x.1 as u64).collect();
                reference_dot(&model, c.a.ty(), c.b.ty(), &a, &b, 0).unwrap()
            } else {
                let s: f64 = (0..k).map(|kk| sa.val[row][kk] * bm[col][kk].0).sum();
                if c.a.int() {
                    let (start, sat) = c.acc.unwrap_or((0, false));
                    let v = s as i64 + start as i64;
                    let v = if sat {
                        v.clamp(i32::MIN as i64, i32::MAX as i64)
                    } else {
                        v
                    };
                    v as i32 as u32
                } else {
                    (s as f32).to_bits()
                }
            };
            let off = 4 * (t * c.n / 2 + i);
            let got = u32::from_le_bytes(raw[off..off + 4].try_into().unwrap());
            assert_eq!(got, want, "{c:?}: D[{row}][{col}] (thread {t}, reg {i})");
        }
    }
}

#[test]
fn wgmma_sp_every_type_selector_and_a_source() {
    use El::*;
    let case = |a, b, n, regs, sw128, sel| Case {
        a,
        b,
        n,
        regs,
        sw128,
        sel,
        hw: false,
        acc: None,
        dense: false,
    };
    let cases = [
        case(F16, F16, 16, false, true, 0),
        case(F16, F16, 8, true, false, 1),
        case(Bf16, Bf16, 24, false, false, 1),
        case(Bf16, Bf16, 16, true, true, 0),
        case(Tf32, Tf32, 16, false, true, 1),
        case(Tf32, Tf32, 8, true, false, 0),
        case(E4m3, E5m2, 16, false, false, 0),
        case(E5m2, E4m3, 8, true, true, 0),
        case(S8, U8, 16, false, true, 0),
        case(U8, U8, 24, true, false, 0),
        // accumulators near the top of the s32 range: .satfinite clamps, the plain form wraps
        Case {
            acc: Some((i32::MAX - 100_000, true)),
            ..case(U8, U8, 16, false, true, 0)
        },
        Case {
            acc: Some((i32::MAX - 100_000, false)),
            ..case(S8, S8, 8, true, false, 0)
        },
        Case {
            acc: Some((i32::MIN + 100_000, true)),
            ..case(S8, U8, 16, true, true, 0)
        },
    ];
    for (n, c) in cases.into_iter().enumerate() {
        run_case(c, 500 + n as u64);
    }
}

#[test]
fn wgmma_sp_hardware_model_matches_reference_dot() {
    use El::*;
    for (n, (a, regs)) in [(Bf16, false), (E4m3, true), (Tf32, false)]
        .into_iter()
        .enumerate()
    {
        let c = Case {
            a,
            b: a,
            n: 16,
            regs,
            sw128: true,
            sel: 0,
            hw: true,
            acc: None,
            dense: false,
        };
        run_case(c, 600 + n as u64);
    }
}

/// The dense tf32 `wgmma` with A from registers reads the m16n8k8-style fragment (one element
/// per register: rows g, g + 8, columns q, q + 4), as the sparse forms' compressed A does.
#[test]
fn wgmma_dense_tf32_a_from_registers() {
    for (n, sw128) in [(8, true), (16, false)] {
        let c = Case {
            a: El::Tf32,
            b: El::Tf32,
            n,
            regs: true,
            sw128,
            sel: 0,
            hw: false,
            acc: None,
            dense: true,
        };
        run_case(c, 700 + n as u64);
    }
}
