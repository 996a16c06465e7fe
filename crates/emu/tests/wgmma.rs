//! `wgmma.mma_async` against a reference built from the shared-memory matrix-descriptor
//! semantics: for every swizzle mode, several N, bf16 and e4m3 inputs. The host lays A (64 x K,
//! K-major) and B (N x K, K-major) out in shared memory exactly as the descriptor describes
//! (core matrices / swizzle atoms, XOR swizzle of 16-byte chunks), the kernel copies that image
//! into shared memory, runs one wgmma and stores its accumulator registers; the host maps the
//! registers back with the accumulator fragment layout and compares with an f64 product.
//!
//! Numerics: the layout cases use small integers (every sum exact), so they hold under both
//! numerics and run with the default (the sm_90 hardware model). `hw_model_with_accumulator`
//! uses random fractions and a non-zero accumulator and compares with the slow integer model of
//! `emu::tc_numerics` for sm_90.

use emu::hopper::elem_f64;
use emu::tc_numerics::{model_for, reference_dot};
use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule, Numerics};
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, Debug)]
enum Sw {
    None,
    B32,
    B64,
    B128,
}

/// Byte offset of (row, kbyte) in a K-major operand laid out for the descriptor.
fn place(sw: Sw, row: usize, kbyte: usize, sbo: usize, lbo: usize) -> usize {
    match sw {
        Sw::None => (row / 8) * sbo + (kbyte / 16) * lbo + (row % 8) * 16 + kbyte % 16,
        _ => {
            let (w, mask) = match sw {
                Sw::B32 => (32, 1),
                Sw::B64 => (64, 3),
                _ => (128, 7),
            };
            let lin = (row / 8) * sbo + (row % 8) * w + kbyte;
            lin ^ (((lin >> 7) & mask) << 4)
        }
    }
}

fn desc(start: usize, lbo: usize, sbo: usize, sw: Sw) -> u64 {
    let code: u64 = match sw {
        Sw::None => 0,
        Sw::B128 => 1,
        Sw::B64 => 2,
        Sw::B32 => 3,
    };
    ((start as u64 >> 4) & 0x3fff)
        | (((lbo as u64 >> 4) & 0x3fff) << 16)
        | (((sbo as u64 >> 4) & 0x3fff) << 32)
        | (code << 62)
}

/// One wgmma kernel; with `init` every accumulator starts at that value and scale-d is 1. With
/// `a_regs`, A comes from fragment registers: thread t loads its four at byte `da + 16 t` of
/// the global image.
fn kernel(n: usize, ty: &str, k: usize, init: Option<f32>, a_regs: bool) -> String {
    let regs = n / 2;
    let list: Vec<String> = (0..regs).map(|i| format!("%f{i}")).collect();
    let mut inits = String::new();
    if let Some(x) = init {
        for i in 0..regs {
            inits.push_str(&format!("    mov.b32 %f{i}, 0f{:08X};\n", x.to_bits()));
        }
    }
    let scale_d = init.is_some() as u32;
    let (a_load, a_op) = if a_regs {
        (
            "    mul.wide.u32 %rd9, %r2, 16;\n    add.s64 %rd9, %rd9, %rd2;\n    \
             add.s64 %rd9, %rd9, %rd1;\n    ld.global.v4.u32 {%a0, %a1, %a2, %a3}, [%rd9];\n",
            "{%a0, %a1, %a2, %a3}",
        )
    } else {
        ("", "%rd2")
    };
    let mut stores = String::new();
    for i in 0..regs {
        stores.push_str(&format!("    st.global.f32 [%rd5+{}], %f{i};\n", 4 * i));
    }
    format!(
        r#".version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
.visible .entry wg(.param .u64 img, .param .u32 img_words, .param .u64 da, .param .u64 db, .param .u64 out)
{{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b32 %a<4>;
    .reg .b64 %rd<12>;
    .reg .f32 %f<{regs}>;
    ld.param.u64 %rd1, [img];
    ld.param.u32 %r1, [img_words];
    ld.param.u64 %rd2, [da];
    ld.param.u64 %rd3, [db];
    ld.param.u64 %rd4, [out];
{copy}    setp.ne.u32 %p2, %r2, 1000;
{inits}{a_load}    wgmma.fence.sync.aligned;
    wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ty}.{ty} {{{list}}}, {a_op}, %rd3, {scale_d}, 1, 1;
    wgmma.commit_group.sync.aligned;
    wgmma.wait_group.sync.aligned 0;
    mul.wide.u32 %rd8, %r2, {rb};
    add.s64 %rd5, %rd4, %rd8;
{stores}    ret;
}}
"#,
        list = list.join(", "),
        rb = 4 * regs,
        copy = SMEM_IMAGE_COPY,
    )
}

/// The kernels' prologue: the block copies the shared-memory image (`%rd1`, `%r1` words) into
/// `smem` and makes it visible to the async proxy; leaves `%r2` = `%tid.x`.
const SMEM_IMAGE_COPY: &str = "    mov.u32 %r2, %tid.x;
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
";

/// Values of a case: small integers (exact sums, compared with f64) or random fractions with an
/// accumulator start value (compared with the sm_90 model).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Vals {
    Ints,
    Model(f32),
}

fn run_case(n: usize, fp8: bool, sw: Sw, seed: u64) {
    run_case_with(n, fp8, sw, seed, Vals::Ints, false)
}

/// The A fragment registers of every thread (4 words each, thread-major) holding the 64 x k
/// raw elements `a` (`es` bytes each), as the PTX ISA lays out wgmma's register A: for 16-bit
/// inputs element i of lane 4g + q is row g + 8 ((i >> 1) & 1), k 2q + (i & 1) + 8 (i >> 2);
/// for 8-bit inputs row g + 8 ((i >> 2) & 1), k 4q + (i & 3) + 16 (i >> 3); warp w owns rows
/// 16w...
fn a_fragments(a: &[u64], k: usize, es: usize) -> Vec<u8> {
    let mut out = vec![0u8; 128 * 16];
    for t in 0..128 {
        let (w, g, q) = (t >> 5, (t & 31) >> 2, t & 3);
        for i in 0..16 / es {
            let (r, kk) = if es == 2 {
                (g + 8 * ((i >> 1) & 1), 2 * q + (i & 1) + 8 * (i >> 2))
            } else {
                (g + 8 * ((i >> 2) & 1), 4 * q + (i & 3) + 16 * (i >> 3))
            };
            let bits = a[(16 * w + r) * k + kk].to_le_bytes();
            out[16 * t + es * i..16 * t + es * (i + 1)].copy_from_slice(&bits[..es]);
        }
    }
    out
}

fn run_case_with(n: usize, fp8: bool, sw: Sw, seed: u64, vals: Vals, a_regs: bool) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (k, es) = if fp8 { (32usize, 1usize) } else { (16, 2) };
    let kbytes = k * es;
    // Layout parameters of the descriptor for this swizzle.
    let (lbo, sbo) = match sw {
        Sw::None => (128usize, 256usize),
        Sw::B32 => (0, 256),
        Sw::B64 => (0, 512),
        Sw::B128 => (0, 1024),
    };
    let a_rows = 64usize;
    let a_bytes = a_rows.div_ceil(8) * sbo.max(256);
    let b_start = a_bytes.div_ceil(1024) * 1024;
    let b_bytes = n.div_ceil(8) * sbo.max(256);
    let total = (b_start + b_bytes).div_ceil(4) * 4;
    let mut img = vec![0u8; total];
    // raw encodings, K-major
    let mut a = vec![0u64; 64 * k];
    let mut b = vec![0u64; n * k];
    let enc = |v: f64| -> u64 {
        if fp8 {
            emu::fp::f32_to_e4m3(v as f32, true) as u64
        } else {
            emu::fp::f32_to_bf16_rn(v as f32) as u64
        }
    };
    for r in 0..64 {
        for kk in 0..k {
            let v = match vals {
                Vals::Ints => rng.gen_range(-4i32..=4) as f64 + if kk % 3 == 0 { 0.5 } else { 0.0 },
                Vals::Model(_) => rng.gen_range(-4.0..4.0),
            };
            let bits = enc(v);
            a[r * k + kk] = bits;
            let off = place(sw, r, kk * es, sbo, lbo);
            img[off..off + es].copy_from_slice(&bits.to_le_bytes()[..es]);
        }
    }
    for c in 0..n {
        for kk in 0..k {
            let v = match vals {
                Vals::Ints => rng.gen_range(-3i32..=3) as f64 * if c % 2 == 0 { 1.0 } else { 2.0 },
                Vals::Model(_) => rng.gen_range(-4.0..4.0) * 2f64.powi(rng.gen_range(-6..3)),
            };
            let bits = enc(v);
            b[c * k + kk] = bits;
            let off = b_start + place(sw, c, kk * es, sbo, lbo);
            img[off..off + es].copy_from_slice(&bits.to_le_bytes()[..es]);
        }
    }
    let _ = kbytes;
    let mem = GlobalMemory::new();
    let ty = if fp8 { ptx::Ty::E4m3 } else { ptx::Ty::Bf16 };
    let init = match vals {
        Vals::Ints => None,
        Vals::Model(x) => Some(x),
    };
    let text = kernel(n, if fp8 { "e4m3" } else { "bf16" }, k, init, a_regs);
    let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
    // the shared-memory image, then (register A) the fragments
    img.extend_from_slice(&a_fragments(&a, k, es));
    let gimg = mem.alloc(img.len() as u64, 0).unwrap();
    gimg.write_bytes(0, &img);
    let out = mem.alloc((128 * n / 2 * 4) as u64, 0).unwrap();
    out.fill(0, (128 * n / 2 * 4) as u64, &[0xff]);
    let mut p = Vec::new();
    p.extend_from_slice(&gimg.base.to_le_bytes());
    p.extend_from_slice(&((total / 4) as u32).to_le_bytes());
    p.extend_from_slice(&[0u8; 4]);
    let da = if a_regs {
        total as u64
    } else {
        desc(0, lbo, sbo, sw)
    };
    p.extend_from_slice(&da.to_le_bytes());
    p.extend_from_slice(&desc(b_start, lbo, sbo, sw).to_le_bytes());
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
        numerics: match vals {
            Vals::Ints => LaunchOptions::default().numerics,
            Vals::Model(_) => Numerics::Hardware,
        },
        ..LaunchOptions::default()
    };
    launch(m.kernel("wg").unwrap(), mem.snapshot(), p, &cfg, &opts).unwrap();
    let mut raw = vec![0u8; 128 * n / 2 * 4];
    out.read_bytes(0, &mut raw);
    // Accumulator layout: thread t, w = t>>5, register i:
    // row = 16w + g + 8*((i>>1)&1), col = 8*(i>>2) + 2q + (i&1).
    for t in 0..128usize {
        let (w, l) = (t >> 5, t & 31);
        let (g, q) = (l >> 2, l & 3);
        for i in 0..n / 2 {
            let row = 16 * w + g + 8 * ((i >> 1) & 1);
            let col = 8 * (i >> 2) + 2 * q + (i & 1);
            let ar = &a[row * k..(row + 1) * k];
            let bc = &b[col * k..(col + 1) * k];
            let want = match vals {
                Vals::Ints => (0..k)
                    .map(|kk| elem_f64(ty, ar[kk]) * elem_f64(ty, bc[kk]))
                    .sum::<f64>(),
                // finite products added to an infinite accumulator leave it unchanged
                Vals::Model(c) if !c.is_finite() => c as f64,
                Vals::Model(c) => {
                    let m = model_for(90, ty).unwrap();
                    let bits = reference_dot(&m, ty, ty, ar, bc, c.to_bits()).unwrap();
                    f32::from_bits(bits) as f64
                }
            };
            let off = 4 * (t * n / 2 + i);
            let got = f32::from_le_bytes(raw[off..off + 4].try_into().unwrap()) as f64;
            assert_eq!(
                got, want,
                "n={n} fp8={fp8} {sw:?} a_regs={a_regs}: D[{row}][{col}] (thread {t}, reg {i})"
            );
        }
    }
}

#[test]
fn wgmma_every_swizzle_and_n() {
    let mut seed = 7;
    for sw in [Sw::None, Sw::B32, Sw::B64, Sw::B128] {
        for n in [8usize, 64, 256] {
            for fp8 in [false, true] {
                seed += 1;
                run_case(n, fp8, sw, seed);
            }
        }
    }
}

/// Reading the accumulator between `wgmma.mma_async` and `wgmma.wait_group` sees the old value;
/// after the wait it sees the product.
#[test]
fn wgmma_result_is_not_visible_before_wait() {
    let text = r#".version 8.0
.target sm_90a
.address_size 64
.shared .align 1024 .b8 tile[4096];
.visible .entry stale(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<8>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    // A = B = all ones in bf16 (0x3F80) over the whole 4 KiB tile.
    mov.u32 %r2, 0x3F803F80;
    shl.b32 %r3, %r1, 2;
    mov.u32 %r4, tile;
    add.u32 %r5, %r4, %r3;
    st.shared.u32 [%r5], %r2;
    st.shared.u32 [%r5+512], %r2;
    st.shared.u32 [%r5+1024], %r2;
    st.shared.u32 [%r5+1536], %r2;
    st.shared.u32 [%r5+2048], %r2;
    st.shared.u32 [%r5+2560], %r2;
    st.shared.u32 [%r5+3072], %r2;
    st.shared.u32 [%r5+3584], %r2;
    bar.sync 0;
    mov.f32 %f0, 0f40E00000;        // 7.0
    mov.f32 %f1, 0f40E00000;
    mov.f32 %f2, 0f40E00000;
    mov.f32 %f3, 0f40E00000;
    // no swizzle: LBO 128, SBO 256 (fields >> 4)
    mov.b64 %rd2, 0x0000001000080000;
    mov.b64 %rd3, 0x0000001000080000;
    wgmma.fence.sync.aligned;
    wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f0, %f1, %f2, %f3}, %rd2, %rd3, 1, 1, 1, 0, 0;
    wgmma.commit_group.sync.aligned;
    mov.f32 %f4, %f0;               // read before the wait: stale
    wgmma.wait_group.sync.aligned 0;
    mov.f32 %f5, %f0;               // after the wait: 7 + 16
    mul.wide.u32 %rd4, %r1, 8;
    add.s64 %rd5, %rd1, %rd4;
    st.global.v2.f32 [%rd5], {%f4, %f5};
    ret;
}
"#;
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(text).unwrap(), 0).unwrap();
    let out = mem.alloc(128 * 8, 0).unwrap();
    out.fill(0, 1024, &[0xff]);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [128, 1, 1],
        shared_bytes: 0,
        sms: 1,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    launch(
        m.kernel("stale").unwrap(),
        mem.snapshot(),
        out.base.to_le_bytes().to_vec(),
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut b = vec![0u8; 1024];
    out.read_bytes(0, &mut b);
    for t in 0..128usize {
        let before = f32::from_le_bytes(b[8 * t..8 * t + 4].try_into().unwrap());
        let after = f32::from_le_bytes(b[8 * t + 4..8 * t + 8].try_into().unwrap());
        assert_eq!((before, after), (7.0, 23.0), "thread {t}");
    }
}

/// A bulk copy into shared memory that a committed-but-unwaited wgmma still reads is a
/// write-after-read race on hardware (the stage was released too early): the emulator stops
/// with a diagnostic naming the copy and the reading warps. Waiting first is fine, and so is a
/// copy into bytes the wgmma does not read.
#[test]
fn async_copy_over_inflight_wgmma_operands_is_a_race() {
    let kernel = |before_copy: &str, dst_off: u32| {
        format!(
            r#".version 8.0
.target sm_90a
.address_size 64
.shared .align 1024 .b8 tile[8192];
.shared .align 8 .b64 bar;
.visible .entry race(.param .u64 src)
{{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<8>;
    ld.param.u64 %rd1, [src];
    mov.u32 %r1, %tid.x;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared::cta.b64 [bar], 1;
    bar.sync 0;
    // m64n8k16 bf16, A and B from the first 4 KiB (no swizzle: LBO 128, SBO 256)
    mov.b64 %rd2, 0x0000001000080000;
    mov.b64 %rd3, 0x0000001000080000;
    wgmma.fence.sync.aligned;
    wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {{%f0, %f1, %f2, %f3}}, %rd2, %rd3, 0, 1, 1, 0, 0;
    wgmma.commit_group.sync.aligned;
    {before_copy}
    bar.sync 0;
    mov.u32 %r2, tile;
    add.u32 %r2, %r2, {dst_off};
    @%p1 mbarrier.arrive.expect_tx.shared::cta.b64 %rd4, [bar], 256;
    @%p1 cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r2], [%rd1], 256, [bar];
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [bar], 0;
    @!%p2 bra WAIT;
    wgmma.wait_group.sync.aligned 0;
    ret;
}}
"#
        )
    };
    let run = |text: String| {
        let mem = GlobalMemory::new();
        let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
        let src = mem.alloc(256, 0).unwrap();
        let cfg = LaunchConfig {
            sms: 1,
            ..LaunchConfig::linear(1, 128)
        };
        launch(
            m.kernel("race").unwrap(),
            mem.snapshot(),
            src.base.to_le_bytes().to_vec(),
            &cfg,
            &LaunchOptions::default(),
        )
    };
    // copy into the operands while the group is in flight
    let e = run(kernel("", 0)).expect_err("race must be reported");
    let msg = e.to_string();
    assert!(
        msg.contains("cp.async.bulk") && msg.contains("still being read by warp(s)"),
        "{msg}"
    );
    assert!(msg.contains("race"), "names the kernel: {msg}");
    // wait for the wgmma first: fine
    run(kernel("wgmma.wait_group.sync.aligned 0;", 0)).unwrap();
    // a copy into bytes the wgmma does not read (past the 4 KiB it reads): fine
    run(kernel("", 6144)).unwrap();
}

/// The sm_90 model through wgmma: random fractions (truncation matters) and a non-zero
/// accumulator (scale-d = 1: C is aligned and truncated with the products), bf16 and e4m3, A
/// from shared memory and from registers (the f32 tile path), and an infinite accumulator (the
/// f64 path the f32 kernel leaves such tiles to).
#[test]
fn hw_model_with_accumulator() {
    for (i, fp8) in [false, true].into_iter().enumerate() {
        for (j, c) in [0.3f32, -17.25, 1e-3, f32::INFINITY]
            .into_iter()
            .enumerate()
        {
            for a_regs in [false, true] {
                let seed = 100 + (8 * i + 2 * j) as u64 + a_regs as u64;
                run_case_with(16, fp8, Sw::B128, seed, Vals::Model(c), a_regs);
            }
        }
        run_case_with(64, fp8, Sw::B64, 200 + i as u64, Vals::Model(0.75), false);
    }
}

/// The pending-result bookkeeping of `wgmma.commit_group` / `wait_group` across chains: a
/// wgmma chained on the accumulator of the same open group, one whose C is in a committed
/// group, one on a subset of those registers (n = 8 on the upper half of an n = 16
/// accumulator), `wait_group 1` retiring only the older group, a read before any wait (stale
/// values), and a wgmma under a guard that leaves half the lanes out (their registers keep
/// their values). Small integers: every sum is exact, so the f64 reference holds in both
/// numerics modes.
#[test]
fn pending_accumulator_chains() {
    let text = r#".version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
.visible .entry chains(.param .u64 img, .param .u32 img_words, .param .u64 da, .param .u64 db1, .param .u64 db2, .param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<12>;
    .reg .f32 %f<8>;
    ld.param.u64 %rd1, [img];
    ld.param.u32 %r1, [img_words];
    ld.param.u64 %rd2, [da];
    ld.param.u64 %rd3, [db1];
    ld.param.u64 %rd9, [db2];
    ld.param.u64 %rd4, [out];
{COPY}
    mul.wide.u32 %rd8, %r2, 128;
    add.s64 %rd5, %rd4, %rd8;
    mov.f32 %f0, 0f42C80000;
    mov.f32 %f1, 0f42C80000;
    mov.f32 %f2, 0f42C80000;
    mov.f32 %f3, 0f42C80000;
    mov.f32 %f4, 0f42C80000;
    mov.f32 %f5, 0f42C80000;
    mov.f32 %f6, 0f42C80000;
    mov.f32 %f7, 0f42C80000;
    wgmma.fence.sync.aligned;
    wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%f0, %f1, %f2, %f3, %f4, %f5, %f6, %f7}, %rd2, %rd3, 0, 1, 1, 0, 0;
    wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%f0, %f1, %f2, %f3, %f4, %f5, %f6, %f7}, %rd2, %rd3, 1, 1, 1, 0, 0;
    wgmma.commit_group.sync.aligned;
    st.global.v4.f32 [%rd5], {%f0, %f1, %f2, %f3};
    st.global.v4.f32 [%rd5+16], {%f4, %f5, %f6, %f7};
    wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%f0, %f1, %f2, %f3, %f4, %f5, %f6, %f7}, %rd2, %rd3, 1, 1, 1, 0, 0;
    wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f4, %f5, %f6, %f7}, %rd2, %rd9, 1, 1, 1, 0, 0;
    wgmma.commit_group.sync.aligned;
    wgmma.wait_group.sync.aligned 1;
    st.global.v4.f32 [%rd5+32], {%f0, %f1, %f2, %f3};
    st.global.v4.f32 [%rd5+48], {%f4, %f5, %f6, %f7};
    wgmma.wait_group.sync.aligned 0;
    st.global.v4.f32 [%rd5+64], {%f0, %f1, %f2, %f3};
    st.global.v4.f32 [%rd5+80], {%f4, %f5, %f6, %f7};
    and.b32 %r8, %r2, 1;
    setp.eq.u32 %p2, %r8, 0;
    @%p2 wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%f0, %f1, %f2, %f3, %f4, %f5, %f6, %f7}, %rd2, %rd3, 1, 1, 1, 0, 0;
    wgmma.commit_group.sync.aligned;
    wgmma.wait_group.sync.aligned 0;
    st.global.v4.f32 [%rd5+96], {%f0, %f1, %f2, %f3};
    st.global.v4.f32 [%rd5+112], {%f4, %f5, %f6, %f7};
    ret;
}
"#
    .replace("{COPY}\n", SMEM_IMAGE_COPY);
    let (k, lbo, sbo) = (16usize, 128usize, 256usize);
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let (b1_at, b2_at, total) = (2048usize, 3072usize, 3328usize);
    let mut img = vec![0u8; total];
    let mut fill = |rows: usize, at: usize, lo: i32, hi: i32| -> Vec<f64> {
        let mut v = vec![0f64; rows * k];
        for r in 0..rows {
            for kk in 0..k {
                let x = rng.gen_range(lo..=hi) as f64;
                v[r * k + kk] = x;
                let bits = emu::fp::f32_to_bf16_rn(x as f32).to_le_bytes();
                let off = at + place(Sw::None, r, 2 * kk, sbo, lbo);
                img[off..off + 2].copy_from_slice(&bits);
            }
        }
        v
    };
    let (a, b1, b2) = (
        fill(64, 0, -4, 4),
        fill(16, b1_at, -3, 3),
        fill(8, b2_at, -3, 3),
    );
    let dot = |row: usize, b: &[f64], col: usize| -> f64 {
        (0..k).map(|kk| a[row * k + kk] * b[col * k + kk]).sum()
    };
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
    let gimg = mem.alloc(total as u64, 0).unwrap();
    gimg.write_bytes(0, &img);
    let out = mem.alloc(128 * 128, 0).unwrap();
    out.fill(0, 128 * 128, &[0xff]);
    let mut p = Vec::new();
    p.extend_from_slice(&gimg.base.to_le_bytes());
    p.extend_from_slice(&((total / 4) as u32).to_le_bytes());
    p.extend_from_slice(&[0u8; 4]);
    for d in [desc(0, lbo, sbo, Sw::None), desc(b1_at, lbo, sbo, Sw::None)] {
        p.extend_from_slice(&d.to_le_bytes());
    }
    p.extend_from_slice(&desc(b2_at, lbo, sbo, Sw::None).to_le_bytes());
    p.extend_from_slice(&out.base.to_le_bytes());
    let cfg = LaunchConfig {
        shared_bytes: total as u32,
        sms: 1,
        ..LaunchConfig::linear(1, 128)
    };
    for numerics in [Numerics::Exact, Numerics::Hardware] {
        let opts = LaunchOptions {
            numerics,
            ..LaunchOptions::default()
        };
        let k0 = m.kernel("chains").unwrap();
        launch(k0, mem.snapshot(), p.clone(), &cfg, &opts).unwrap();
        let mut raw = vec![0u8; 128 * 128];
        out.read_bytes(0, &mut raw);
        for t in 0..128usize {
            let (w, g, q) = (t >> 5, (t & 31) >> 2, t & 3);
            for i in 0..8 {
                let row = 16 * w + g + 8 * ((i >> 1) & 1);
                let col = 8 * (i >> 2) + 2 * q + (i & 1);
                let pv = dot(row, &b1, col);
                // the n = 8 wgmma on registers 4..7 (columns 8..15 here are its 0..7)
                let upper = if col >= 8 {
                    dot(row, &b2, col - 8)
                } else {
                    0.0
                };
                let after_g2 = 3.0 * pv + upper;
                let guarded = if t % 2 == 0 { after_g2 + pv } else { after_g2 };
                let want = [100.0, 2.0 * pv, after_g2, guarded];
                for (s, &want) in want.iter().enumerate() {
                    let off = 128 * t + 32 * s + 4 * i;
                    let got = f32::from_le_bytes(raw[off..off + 4].try_into().unwrap()) as f64;
                    assert_eq!(got, want, "{numerics:?} snapshot {s} thread {t} reg {i}");
                }
            }
        }
    }
}
