//! Memory, asynchronous-copy and atomic instruction forms (issue 16 item 3), each run on the
//! emulator against an exact host reference on fresh random inputs: `cp.async.mbarrier.arrive`
//! with and without `.noinc`, `st.async` / `red.async` into another CTA's shared memory with
//! mbarrier transaction completion, `cp.reduce.async.bulk` to global and shared::cluster
//! memory, `cp.reduce.async.bulk.tensor` (tile, 1d-5d), and `atom`/`red` vector, 128-bit,
//! 16-bit CAS and `.sem`/`.scope` forms with many threads hitting few addresses. Every kernel is
//! also checked by the validator, round-tripped through the printer and (when installed)
//! assembled by ptxas for sm_90a.

use emu::hopper::{Swizzle, TensorMapDesc, TmaType};
use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// A fresh random generator; the seed is printed so a failure can be replayed.
fn rng() -> StdRng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

/// The validator and ptxas (sm_90a, when installed) accept `text`; it prints and parses back.
fn check(text: &str) {
    let m = ptx::parse(text).unwrap_or_else(|e| panic!("parse: {e}\n{text}"));
    let diags = ptx::validate(&m);
    assert!(
        diags.iter().all(|d| !d.is_error()),
        "validator: {diags:#?}\n{text}"
    );
    assert_eq!(
        ptx::parse(&ptx::print(&m)).unwrap(),
        m,
        "parse(print(m)) != m"
    );
    if ptx::ptxas::ptxas_for_tests("isa_mem test PTX").is_some() {
        let rep = ptx::ptxas::assemble(text, "sm_90a", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}\n{text}"));
        for k in &rep.kernels {
            assert_eq!(
                k.spill_stores_bytes + k.spill_loads_bytes,
                0,
                "{} spills",
                k.name
            );
        }
    }
}

/// Device memory for one test.
struct Dev {
    mem: GlobalMemory,
}

type Buf = Arc<emu::memory::Allocation>;

impl Dev {
    fn new() -> Dev {
        Dev {
            mem: GlobalMemory::new(),
        }
    }
    fn buf(&self, data: &[u8]) -> Buf {
        let b = self.mem.alloc(data.len().max(16) as u64, 0).unwrap();
        b.write_bytes(0, data);
        b
    }
    /// An output buffer poisoned with 0xff bytes.
    fn out(&self, n: usize) -> Buf {
        self.buf(&vec![0xff; n])
    }
    /// Checks and runs `kernel` of `text` with 64-bit pointer parameters.
    fn run(&self, text: &str, kernel: &str, params: &[u64], cfg: &LaunchConfig) {
        check(text);
        let m = LoadedModule::load(&self.mem, ptx::parse(text).unwrap(), 0).unwrap();
        let p: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
        launch(
            m.kernel(kernel).unwrap(),
            self.mem.snapshot(),
            p,
            cfg,
            &LaunchOptions::default(),
        )
        .unwrap_or_else(|e| panic!("launch of {kernel}: {e}"));
    }
}

fn read(b: &Buf, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    b.read_bytes(0, &mut v);
    v
}

fn cfg(grid: u32, block: u32, cluster: u32) -> LaunchConfig {
    LaunchConfig {
        cluster: [cluster, 1, 1],
        ..LaunchConfig::linear(grid, block)
    }
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn bytes32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn bytes64(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
/// Random non-zero bytes.
fn random_bytes(r: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| r.gen_range(1..=255u8)).collect()
}

// ---------------------------------------------------------------------------------------------
// cp.async.mbarrier.arrive

const CP_ASYNC_ARRIVE: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.shared .align 16 .b8 sbuf[1024];
.shared .align 8 .b64 mb[2];
.visible .entry k(.param .u64 in, .param .u64 out, .param .u64 flags)
{
    .reg .pred %p<8>;
    .reg .b32 %r<24>;
    .reg .b64 %rd<16>;
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    ld.param.u64 %rd3, [flags];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, mb;
    add.u32 %r3, %r2, 8;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared.b64 [%r2], 64;
    @%p1 mbarrier.init.shared.b64 [%r3], 64;
    bar.sync 0;
    shl.b32 %r4, %r1, 4;
    mov.u32 %r5, sbuf;
    add.u32 %r6, %r5, %r4;
    cvt.u64.u32 %rd4, %r4;
    add.s64 %rd5, %rd1, %rd4;
    cp.async.ca.shared.global [%r6], [%rd5], 16;
    // .noinc: each of the 64 arrivals counts against the expected 64
    cp.async.mbarrier.arrive.noinc.shared.b64 [%r2];
    // without .noinc: the pending count is raised first, so the net change is zero
    cp.async.mbarrier.arrive.shared.b64 [%r3];
    bar.sync 0;
    mbarrier.test_wait.parity.shared.b64 %p2, [%r2], 0;
    mbarrier.test_wait.parity.shared.b64 %p3, [%r3], 0;
    bar.sync 0;
    mbarrier.arrive.shared.b64 %rd6, [%r3];
    bar.sync 0;
    mbarrier.test_wait.parity.shared.b64 %p4, [%r3], 0;
WAIT:
    mbarrier.try_wait.parity.shared.b64 %p5, [%r2], 0;
    @!%p5 bra WAIT;
    ld.shared.v4.u32 {%r7, %r8, %r9, %r10}, [%r6];
    add.s64 %rd7, %rd2, %rd4;
    st.global.v4.u32 [%rd7], {%r7, %r8, %r9, %r10};
    selp.u32 %r11, 1, 0, %p2;
    selp.u32 %r12, 2, 0, %p3;
    selp.u32 %r13, 4, 0, %p4;
    or.b32 %r14, %r11, %r12;
    or.b32 %r15, %r14, %r13;
    mul.wide.u32 %rd8, %r1, 4;
    add.s64 %rd9, %rd3, %rd8;
    st.global.u32 [%rd9], %r15;
    ret;
}
"#;

#[test]
fn cp_async_mbarrier_arrive_noinc_and_counted() {
    let mut r = rng();
    let d = Dev::new();
    let input = random_bytes(&mut r, 1024);
    let inp = d.buf(&input);
    let out = d.out(1024);
    let flags = d.out(256);
    d.run(
        CP_ASYNC_ARRIVE,
        "k",
        &[inp.base, out.base, flags.base],
        &cfg(2, 64, 1),
    );
    assert_eq!(read(&out, 1024), input, "copied data");
    // phase 0 of the .noinc barrier completed; the counted one only after the plain arrives
    for (t, f) in u32s(&read(&flags, 256)).into_iter().enumerate() {
        assert_eq!(
            f, 0b101,
            "thread {t}: noinc done, counted not done, then done"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// st.async: every thread stores 52 bytes (.b32, .v4.b32, .v2.b64, .v2.f32, .s64) into the
// other CTA of its cluster, completing them on that CTA's mbarrier.

const ST_ASYNC: &str = r#"
.version 8.1
.target sm_90a
.address_size 64
.shared .align 16 .b8 recv[3328];
.shared .align 8 .b64 mb;
.visible .entry k(.param .u64 in, .param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<40>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<24>;
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %cluster_ctarank;
    xor.b32 %r4, %r3, 1;
    mov.u32 %r5, mb;
    mov.u32 %r6, recv;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared::cta.b64 [%r5], 1;
    @%p1 mbarrier.arrive.expect_tx.shared::cta.b64 %rd3, [%r5], 3328;
    fence.mbarrier_init.release.cluster;
    barrier.cluster.arrive.release.aligned;
    barrier.cluster.wait.acquire.aligned;
    // this CTA's input block and the peer's receive buffer and mbarrier
    mul.wide.u32 %rd4, %r2, 3328;
    add.s64 %rd5, %rd1, %rd4;
    mapa.shared::cluster.u32 %r7, %r6, %r4;
    mapa.shared::cluster.u32 %r8, %r5, %r4;
    // .b32 at [4*tid]
    shl.b32 %r9, %r1, 2;
    cvt.u64.u32 %rd6, %r9;
    add.s64 %rd7, %rd5, %rd6;
    ld.global.u32 %r10, [%rd7];
    add.u32 %r11, %r7, %r9;
    st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%r11], %r10, [%r8];
    // .v4.b32 at [256 + 16*tid]
    shl.b32 %r12, %r1, 4;
    add.u32 %r13, %r12, 256;
    cvt.u64.u32 %rd8, %r13;
    add.s64 %rd9, %rd5, %rd8;
    ld.global.v4.u32 {%r14, %r15, %r16, %r17}, [%rd9];
    add.u32 %r18, %r7, %r13;
    st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%r18], {%r14, %r15, %r16, %r17}, [%r8];
    // .v2.b64 at [1280 + 16*tid]
    add.u32 %r19, %r12, 1280;
    cvt.u64.u32 %rd10, %r19;
    add.s64 %rd11, %rd5, %rd10;
    ld.global.v2.u64 {%rd12, %rd13}, [%rd11];
    add.u32 %r20, %r7, %r19;
    st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b64 [%r20], {%rd12, %rd13}, [%r8];
    // .v2.f32 at [2304 + 8*tid]
    shl.b32 %r21, %r1, 3;
    add.u32 %r22, %r21, 2304;
    cvt.u64.u32 %rd14, %r22;
    add.s64 %rd15, %rd5, %rd14;
    ld.global.v2.f32 {%f1, %f2}, [%rd15];
    add.u32 %r23, %r7, %r22;
    st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%r23], {%f1, %f2}, [%r8];
    // .s64 at [2816 + 8*tid]
    add.u32 %r24, %r21, 2816;
    cvt.u64.u32 %rd16, %r24;
    add.s64 %rd17, %rd5, %rd16;
    ld.global.s64 %rd18, [%rd17];
    add.u32 %r25, %r7, %r24;
    st.async.weak.shared::cluster.mbarrier::complete_tx::bytes.s64 [%r25], %rd18, [%r8];
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r5], 0;
    @!%p2 bra WAIT;
    // copy the received block out: 832 words, 13 per thread
    add.s64 %rd19, %rd2, %rd4;
    mov.u32 %r26, 0;
COPY:
    shl.b32 %r27, %r26, 6;
    add.u32 %r28, %r27, %r1;
    shl.b32 %r29, %r28, 2;
    add.u32 %r30, %r6, %r29;
    ld.shared.u32 %r31, [%r30];
    cvt.u64.u32 %rd20, %r29;
    add.s64 %rd21, %rd19, %rd20;
    st.global.u32 [%rd21], %r31;
    add.u32 %r26, %r26, 1;
    setp.lt.u32 %p3, %r26, 13;
    @%p3 bra COPY;
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    ret;
}
"#;

#[test]
fn st_async_into_the_peer_cta_completes_its_mbarrier() {
    let mut r = rng();
    let d = Dev::new();
    let ctas = 4usize;
    let input = random_bytes(&mut r, 3328 * ctas);
    let inp = d.buf(&input);
    let out = d.out(3328 * ctas);
    d.run(
        ST_ASYNC,
        "k",
        &[inp.base, out.base],
        &cfg(ctas as u32, 64, 2),
    );
    let o = read(&out, 3328 * ctas);
    for c in 0..ctas {
        let peer = c ^ 1;
        assert!(
            o[c * 3328..(c + 1) * 3328] == input[peer * 3328..(peer + 1) * 3328],
            "CTA {c} did not receive CTA {peer}'s block"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// red.async (and the synchronous red/atom.shared::cluster): all threads of a 4-CTA cluster
// reduce into two slots per operation in CTA 0's shared memory.

/// (operation, type) of the 32-bit red.async forms, in slot order.
const RED32: [(&str, &str); 11] = [
    ("add", "u32"),
    ("add", "s32"),
    ("min", "u32"),
    ("min", "s32"),
    ("max", "u32"),
    ("max", "s32"),
    ("inc", "u32"),
    ("dec", "u32"),
    ("and", "b32"),
    ("or", "b32"),
    ("xor", "b32"),
];
const RED64: [(&str, &str); 2] = [("add", "u64"), ("add", "s64")];
const RED_THREADS: usize = 256;
/// Transaction bytes of one thread's red.async operations.
const RED_TX: usize = 11 * 4 + 2 * 8;

fn red_async_ptx() -> String {
    let mut body = String::new();
    let pre = "red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes";
    for (j, (op, ty)) in RED32.iter().enumerate() {
        body += &format!(
            "    ld.global.u32 %r{v}, [%rd5+{o}];\n    {pre}.{op}.{ty} [%r9+{a}], %r{v}, [%r8];\n",
            v = 20 + j,
            o = 4 * j,
            a = 8 * j
        );
    }
    for (k, (op, ty)) in RED64.iter().enumerate() {
        body += &format!(
            "    ld.global.u64 %rd{v}, [%rd5+{o}];\n    {pre}.{op}.{ty} [%r10+{a}], %rd{v}, [%r8];\n",
            v = 10 + k,
            o = 48 + 8 * k,
            a = 16 * k
        );
    }
    format!(
        r#"
.version 8.1
.target sm_90a
.address_size 64
.shared .align 16 .b8 tgt[144];
.shared .align 8 .b64 mb;
.visible .entry k(.param .u64 init, .param .u64 vals, .param .u64 out)
{{
    .reg .pred %p<8>;
    .reg .b32 %r<40>;
    .reg .b64 %rd<24>;
    ld.param.u64 %rd1, [init];
    ld.param.u64 %rd2, [vals];
    ld.param.u64 %rd3, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %cluster_ctarank;
    mov.u32 %r3, tgt;
    mov.u32 %r4, mb;
    setp.eq.u32 %p1, %r2, 0;
    setp.lt.u32 %p2, %r1, 36;
    and.pred %p3, %p1, %p2;
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd6, %rd1, %rd4;
    shl.b32 %r5, %r1, 2;
    add.u32 %r6, %r3, %r5;
    @%p3 ld.global.u32 %r7, [%rd6];
    @%p3 st.shared.u32 [%r6], %r7;
    setp.eq.u32 %p4, %r1, 0;
    and.pred %p5, %p1, %p4;
    @%p5 mbarrier.init.shared::cta.b64 [%r4], 1;
    @%p5 mbarrier.arrive.expect_tx.shared::cta.b64 %rd7, [%r4], {tx};
    fence.mbarrier_init.release.cluster;
    barrier.cluster.arrive.release.aligned;
    barrier.cluster.wait.acquire.aligned;
    mapa.shared::cluster.u32 %r11, %r3, 0;
    mapa.shared::cluster.u32 %r8, %r4, 0;
    and.b32 %r12, %r1, 1;
    shl.b32 %r13, %r12, 2;
    add.u32 %r9, %r11, %r13;
    shl.b32 %r14, %r12, 3;
    add.u32 %r15, %r11, %r14;
    add.u32 %r10, %r15, 88;
    mov.u32 %r16, %ctaid.x;
    mad.lo.u32 %r17, %r16, 64, %r1;
    mul.wide.u32 %rd8, %r17, 64;
    add.s64 %rd5, %rd2, %rd8;
{body}    red.shared::cluster.add.u32 [%r9+120], %r20;
    atom.shared::cluster.add.u32 %r18, [%r9+128], %r20;
    barrier.cluster.arrive.release.aligned;
    barrier.cluster.wait.acquire.aligned;
    @!%p1 bra DONE;
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p6, [%r4], 0;
    @!%p6 bra WAIT;
    @!%p2 bra DONE;
    ld.shared.u32 %r19, [%r6];
    add.s64 %rd9, %rd3, %rd4;
    st.global.u32 [%rd9], %r19;
DONE:
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    ret;
}}
"#,
        tx = RED_THREADS * RED_TX
    )
}

/// The 32-bit reduction `op` on `ty` (exact integer semantics of the PTX ISA).
fn red32(op: &str, ty: &str, old: u32, b: u32) -> u32 {
    match (op, ty) {
        ("add", _) => old.wrapping_add(b),
        ("min", "s32") => (old as i32).min(b as i32) as u32,
        ("max", "s32") => (old as i32).max(b as i32) as u32,
        ("min", _) => old.min(b),
        ("max", _) => old.max(b),
        ("inc", _) => {
            if old >= b {
                0
            } else {
                old + 1
            }
        }
        ("dec", _) => {
            if old == 0 || old > b {
                b
            } else {
                old - 1
            }
        }
        ("and", _) => old & b,
        ("or", _) => old | b,
        ("xor", _) => old ^ b,
        _ => unreachable!("{op}.{ty}"),
    }
}

#[test]
fn red_async_into_cta0_of_the_cluster() {
    let mut r = rng();
    let d = Dev::new();
    let init: Vec<u32> = (0..36).map(|_| r.gen()).collect();
    // inc/dec limits are the same for every thread, so the result does not depend on order
    let (inc_lim, dec_lim) = (r.gen_range(1..200u32), r.gen_range(1..200u32));
    let mut vals = vec![0u8; RED_THREADS * 64];
    for (t, v) in vals.chunks_mut(64).enumerate() {
        for j in 0..11 {
            let x = match j {
                6 => inc_lim,
                7 => dec_lim,
                // small addends keep some sums from wrapping; bit ops get full words
                0 | 1 if t % 3 == 0 => r.gen_range(0..1000),
                _ => r.gen(),
            };
            v[4 * j..4 * j + 4].copy_from_slice(&x.to_le_bytes());
        }
        for k in 0..2 {
            v[48 + 8 * k..56 + 8 * k].copy_from_slice(&r.gen::<u64>().to_le_bytes());
        }
    }
    let (ib, vb, out) = (d.buf(&bytes32(&init)), d.buf(&vals), d.out(144));
    d.run(
        &red_async_ptx(),
        "k",
        &[ib.base, vb.base, out.base],
        &cfg(4, 64, 4),
    );
    let got = u32s(&read(&out, 144));
    let val32 =
        |t: usize, j: usize| u32::from_le_bytes(vals[t * 64 + 4 * j..][..4].try_into().unwrap());
    let val64 = |t: usize, k: usize| {
        u64::from_le_bytes(vals[t * 64 + 48 + 8 * k..][..8].try_into().unwrap())
    };
    for slot in 0..2 {
        let threads = (0..RED_THREADS).filter(|t| t % 2 == slot);
        for (j, (op, ty)) in RED32.iter().enumerate() {
            let want = threads
                .clone()
                .fold(init[2 * j + slot], |a, t| red32(op, ty, a, val32(t, j)));
            assert_eq!(got[2 * j + slot], want, "red.async.{op}.{ty} slot {slot}");
        }
        for (k, (_, ty)) in RED64.iter().enumerate() {
            let w = 22 + 4 * k + 2 * slot;
            let old = init[w] as u64 | (init[w + 1] as u64) << 32;
            let want = threads
                .clone()
                .fold(old, |a, t| a.wrapping_add(val64(t, k)));
            let g = got[w] as u64 | (got[w + 1] as u64) << 32;
            assert_eq!(g, want, "red.async.add.{ty} slot {slot}");
        }
        for (w, what) in [(30, "red.shared::cluster"), (32, "atom.shared::cluster")] {
            let want = threads
                .clone()
                .fold(init[w + slot], |a, t| a.wrapping_add(val32(t, 0)));
            assert_eq!(got[w + slot], want, "{what}.add.u32 slot {slot}");
        }
    }
    assert_eq!(
        &got[34..36],
        &init[34..36],
        "bytes past the targets untouched"
    );
}

// ---------------------------------------------------------------------------------------------
// Host reference for element-wise reductions on raw bits (op names as in PTX; `add.noftz`
// counts as `add`). Float cases use inputs whose results are exact.

fn size_of(ty: &str) -> usize {
    match ty {
        "f16" | "bf16" | "b16" | "u16" => 2,
        "u32" | "s32" | "b32" | "f32" | "f16x2" | "bf16x2" => 4,
        _ => 8,
    }
}

fn host_red(op: &str, ty: &str, a: u64, b: u64) -> u64 {
    let op = op.trim_end_matches(".noftz");
    let f16v = |x: u64| f16::from_bits(x as u16).to_f64();
    let bf16v = |x: u64| bf16::from_bits(x as u16).to_f64();
    let pick = |lt: bool| if lt { a } else { b };
    match (op, ty) {
        ("add", "f32") => (f32::from_bits(a as u32) + f32::from_bits(b as u32)).to_bits() as u64,
        ("add", "f64") => (f64::from_bits(a) + f64::from_bits(b)).to_bits(),
        ("add", "f16") => f16::from_f64(f16v(a) + f16v(b)).to_bits() as u64,
        ("add", "bf16") => bf16::from_f64(bf16v(a) + bf16v(b)).to_bits() as u64,
        ("min", "f16") => pick(f16v(a) < f16v(b)),
        ("max", "f16") => pick(f16v(a) > f16v(b)),
        ("min", "bf16") => pick(bf16v(a) < bf16v(b)),
        ("max", "bf16") => pick(bf16v(a) > bf16v(b)),
        ("add", "u64" | "s64") => a.wrapping_add(b),
        ("min", "u64") => a.min(b),
        ("max", "u64") => a.max(b),
        ("min", "s64") => (a as i64).min(b as i64) as u64,
        ("max", "s64") => (a as i64).max(b as i64) as u64,
        ("and", "b64") => a & b,
        ("or", "b64") => a | b,
        ("xor", "b64") => a ^ b,
        (op, ty) => red32(op, ty, a as u32, b as u32) as u64,
    }
}

/// Random element bits for reducing with `op` on `ty`: float additions get small integers
/// (sums stay exact); f16/bf16 min/max get finite values; everything else full-range bits.
fn elem(r: &mut StdRng, op: &str, ty: &str) -> u64 {
    let small = |r: &mut StdRng, m: i32| {
        let v = r.gen_range(1..=m);
        (if r.gen() { v } else { -v }) as f64
    };
    match (op.trim_end_matches(".noftz"), ty) {
        ("add", "f32") => (small(r, 1000) as f32).to_bits() as u64,
        ("add", "f64") => small(r, 1000).to_bits(),
        ("add", "f16") => f16::from_f64(small(r, 64)).to_bits() as u64,
        ("add", "bf16") => bf16::from_f64(small(r, 32)).to_bits() as u64,
        (_, "f16") => f16::from_f64(r.gen_range(-100.0..100.0)).to_bits() as u64,
        (_, "bf16") => bf16::from_f64(r.gen_range(-100.0..100.0)).to_bits() as u64,
        (_, ty) if size_of(ty) == 4 => r.gen_range(1..=u32::MAX) as u64,
        _ => r.gen_range(1..=u64::MAX),
    }
}

/// `n` random elements of `ty` as bytes. `inc`/`dec` use small values so both branches occur.
fn elems(r: &mut StdRng, op: &str, ty: &str, n: usize) -> Vec<u8> {
    let es = size_of(ty);
    (0..n)
        .flat_map(|_| {
            let v = match op {
                "inc" | "dec" => r.gen_range(0..40u64),
                _ => elem(r, op, ty),
            };
            v.to_le_bytes()[..es].to_vec()
        })
        .collect()
}

fn get(b: &[u8], i: usize, es: usize) -> u64 {
    let mut x = [0u8; 8];
    x[..es].copy_from_slice(&b[i * es..(i + 1) * es]);
    u64::from_le_bytes(x)
}

/// Folds `srcs` (each a byte image of elements) into `init` element by element.
fn fold_ref(op: &str, ty: &str, init: &[u8], srcs: &[&[u8]]) -> Vec<u8> {
    let es = size_of(ty);
    let mut acc = init.to_vec();
    for s in srcs {
        for i in 0..init.len() / es {
            let v = host_red(op, ty, get(&acc, i, es), get(s, i, es));
            acc[i * es..(i + 1) * es].copy_from_slice(&v.to_le_bytes()[..es]);
        }
    }
    acc
}

// ---------------------------------------------------------------------------------------------
// cp.reduce.async.bulk: four CTAs reduce 512 bytes of shared memory into one global buffer.

/// (operation, type) pairs of the global form, each run as its own kernel.
const BULK_GLOBAL: [(&str, &str); 20] = [
    ("add", "u32"),
    ("add", "s32"),
    ("add", "u64"),
    ("add", "f32"),
    ("add", "f64"),
    ("add.noftz", "f16"),
    ("add.noftz", "bf16"),
    ("min", "u32"),
    ("min", "s32"),
    ("max", "u64"),
    ("min", "s64"),
    ("max", "s64"),
    ("min", "f16"),
    ("max", "bf16"),
    ("inc", "u32"),
    ("dec", "u32"),
    ("and", "b32"),
    ("or", "b64"),
    ("xor", "b32"),
    ("and", "b64"),
];

fn bulk_global_ptx(op: &str, ty: &str, hint: bool) -> String {
    let (h, pol) = if hint {
        (".L2::cache_hint", ", %rd9")
    } else {
        ("", "")
    };
    format!(
        r#"
.version 8.0
.target sm_90a
.address_size 64
.shared .align 128 .b8 sm[512];
.visible .entry k(.param .u64 in, .param .u64 out)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mul.wide.u32 %rd3, %r2, 512;
    add.s64 %rd4, %rd1, %rd3;
    shl.b32 %r3, %r1, 4;
    cvt.u64.u32 %rd5, %r3;
    add.s64 %rd6, %rd4, %rd5;
    ld.global.v4.u32 {{%r4, %r5, %r6, %r7}}, [%rd6];
    mov.u32 %r8, sm;
    add.u32 %r9, %r8, %r3;
    st.shared.v4.u32 [%r9], {{%r4, %r5, %r6, %r7}};
    fence.proxy.async.shared::cta;
    bar.sync 0;
    setp.eq.u32 %p1, %r1, 0;
    mov.u64 %rd9, 0;
    @%p1 cp.reduce.async.bulk.global.shared::cta.bulk_group{h}.{op}.{ty} [%rd2], [%r8], 512{pol};
    @%p1 cp.async.bulk.commit_group;
    @%p1 cp.async.bulk.wait_group.read 0;
    ret;
}}
"#
    )
}

#[test]
fn cp_reduce_async_bulk_to_global() {
    let mut r = rng();
    let cases = BULK_GLOBAL
        .iter()
        .map(|&(o, t)| (o, t, false))
        .chain([("add", "u32", true)]);
    for (op, ty, hint) in cases {
        let d = Dev::new();
        let init = elems(&mut r, op, ty, 512 / size_of(ty));
        // inc/dec: every CTA reduces the same values (their result depends on order otherwise)
        let one = elems(&mut r, op, ty, 512 / size_of(ty));
        let srcs: Vec<Vec<u8>> = (0..4)
            .map(|_| match op {
                "inc" | "dec" => one.clone(),
                _ => elems(&mut r, op, ty, 512 / size_of(ty)),
            })
            .collect();
        let (inp, out) = (d.buf(&srcs.concat()), d.buf(&init));
        d.run(
            &bulk_global_ptx(op, ty, hint),
            "k",
            &[inp.base, out.base],
            &cfg(4, 32, 1),
        );
        let refs: Vec<&[u8]> = srcs.iter().map(|s| s.as_slice()).collect();
        let want = fold_ref(op, ty, &init, &refs);
        let got = read(&out, 512);
        let es = size_of(ty);
        for i in 0..512 / es {
            assert_eq!(
                get(&got, i, es),
                get(&want, i, es),
                "cp.reduce.async.bulk .{op}.{ty} element {i}"
            );
        }
    }
}

/// (operation, type) pairs of the shared::cluster form.
const BULK_CLUSTER: [(&str, &str); 10] = [
    ("add", "u32"),
    ("add", "s32"),
    ("min", "u32"),
    ("max", "s32"),
    ("inc", "u32"),
    ("dec", "u32"),
    ("and", "b32"),
    ("or", "b32"),
    ("xor", "b32"),
    ("add", "u64"),
];

fn bulk_cluster_ptx(op: &str, ty: &str) -> String {
    format!(
        r#"
.version 8.0
.target sm_90a
.address_size 64
.shared .align 128 .b8 src[256];
.shared .align 128 .b8 dst[256];
.shared .align 8 .b64 mb;
.visible .entry k(.param .u64 in, .param .u64 init, .param .u64 out)
{{
    .reg .pred %p<8>;
    .reg .b32 %r<24>;
    .reg .b64 %rd<16>;
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [init];
    ld.param.u64 %rd3, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %cluster_ctarank;
    setp.eq.u32 %p1, %r3, 0;
    setp.eq.u32 %p2, %r1, 0;
    and.pred %p3, %p1, %p2;
    shl.b32 %r4, %r1, 4;
    cvt.u64.u32 %rd4, %r4;
    mul.wide.u32 %rd5, %r2, 256;
    add.s64 %rd6, %rd1, %rd5;
    add.s64 %rd7, %rd6, %rd4;
    ld.global.v4.u32 {{%r5, %r6, %r7, %r8}}, [%rd7];
    mov.u32 %r9, src;
    add.u32 %r10, %r9, %r4;
    st.shared.v4.u32 [%r10], {{%r5, %r6, %r7, %r8}};
    mov.u32 %r11, dst;
    add.u32 %r12, %r11, %r4;
    add.s64 %rd8, %rd2, %rd4;
    @%p1 ld.global.v4.u32 {{%r5, %r6, %r7, %r8}}, [%rd8];
    @%p1 st.shared.v4.u32 [%r12], {{%r5, %r6, %r7, %r8}};
    mov.u32 %r13, mb;
    @%p3 mbarrier.init.shared::cta.b64 [%r13], 1;
    @%p3 mbarrier.arrive.expect_tx.shared::cta.b64 %rd9, [%r13], 512;
    fence.proxy.async.shared::cta;
    fence.mbarrier_init.release.cluster;
    barrier.cluster.arrive.release.aligned;
    barrier.cluster.wait.acquire.aligned;
    mapa.shared::cluster.u32 %r14, %r11, 0;
    mapa.shared::cluster.u32 %r15, %r13, 0;
    @%p2 cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.{op}.{ty} [%r14], [%r9], 256, [%r15];
    @!%p1 bra DONE;
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p4, [%r13], 0;
    @!%p4 bra WAIT;
    ld.shared.v4.u32 {{%r5, %r6, %r7, %r8}}, [%r12];
    add.s64 %rd10, %rd3, %rd4;
    st.global.v4.u32 [%rd10], {{%r5, %r6, %r7, %r8}};
DONE:
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    ret;
}}
"#
    )
}

#[test]
fn cp_reduce_async_bulk_to_shared_cluster() {
    let mut r = rng();
    for (op, ty) in BULK_CLUSTER {
        let d = Dev::new();
        let n = 256 / size_of(ty);
        let init = elems(&mut r, op, ty, n);
        let one = elems(&mut r, op, ty, n);
        let srcs: Vec<Vec<u8>> = (0..2)
            .map(|_| match op {
                "inc" | "dec" => one.clone(),
                _ => elems(&mut r, op, ty, n),
            })
            .collect();
        let (inp, ib, out) = (d.buf(&srcs.concat()), d.buf(&init), d.out(256));
        d.run(
            &bulk_cluster_ptx(op, ty),
            "k",
            &[inp.base, ib.base, out.base],
            &cfg(2, 16, 2),
        );
        let refs: Vec<&[u8]> = srcs.iter().map(|s| s.as_slice()).collect();
        assert_eq!(
            read(&out, 256),
            fold_ref(op, ty, &init, &refs),
            "cp.reduce.async.bulk.shared::cluster .{op}.{ty}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// cp.reduce.async.bulk.tensor (tile mode): three CTAs reduce a box each, at random coordinates
// that may overhang the tensor, into one global tensor of rank 1..5.

/// (rank, element type, its name in the host reference, operation).
const TENSOR_CASES: [(usize, TmaType, &str, &str); 9] = [
    (1, TmaType::U32, "u32", "add"),
    (2, TmaType::I32, "s32", "min"),
    (3, TmaType::F32, "f32", "add"),
    (4, TmaType::F16, "f16", "add"),
    (5, TmaType::U64, "b64", "xor"),
    (2, TmaType::Bf16, "bf16", "max"),
    (3, TmaType::U32, "u32", "inc"),
    (2, TmaType::I64, "s64", "max"),
    (4, TmaType::U32, "b32", "or"),
];

fn tensor_reduce_ptx(rank: usize, op: &str) -> String {
    let regs: Vec<String> = (0..rank).map(|i| format!("%r{}", 20 + i)).collect();
    let loads: String = (0..rank)
        .map(|i| format!("    ld.global.u32 %r{}, [%rd8+{}];\n", 20 + i, 4 * i))
        .collect();
    format!(
        r#"
.version 8.0
.target sm_90a
.address_size 64
.shared .align 128 .b8 sm[512];
.visible .entry k(.param .u64 tmap, .param .u64 in, .param .u64 coords)
{{
    .reg .pred %p<4>;
    .reg .b32 %r<32>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [tmap];
    ld.param.u64 %rd2, [in];
    ld.param.u64 %rd3, [coords];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mul.wide.u32 %rd4, %r2, 512;
    add.s64 %rd5, %rd2, %rd4;
    shl.b32 %r3, %r1, 4;
    cvt.u64.u32 %rd6, %r3;
    add.s64 %rd7, %rd5, %rd6;
    ld.global.v4.u32 {{%r4, %r5, %r6, %r7}}, [%rd7];
    mov.u32 %r8, sm;
    add.u32 %r9, %r8, %r3;
    st.shared.v4.u32 [%r9], {{%r4, %r5, %r6, %r7}};
    fence.proxy.async.shared::cta;
    bar.sync 0;
    mul.wide.u32 %rd9, %r2, 32;
    add.s64 %rd8, %rd3, %rd9;
{loads}    setp.eq.u32 %p1, %r1, 0;
    @%p1 cp.async.bulk.prefetch.tensor.{rank}d.L2.global.tile [%rd1, {{{regs}}}];
    @%p1 cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.{op}.tile.bulk_group [%rd1, {{{regs}}}], [%r8];
    @%p1 cp.async.bulk.commit_group;
    @%p1 cp.async.bulk.wait_group.read 0;
    ret;
}}
"#,
        regs = regs.join(", ")
    )
}

#[test]
fn cp_reduce_async_bulk_tensor_tile_1d_to_5d() {
    let mut r = rng();
    for (rank, dtype, ty, op) in TENSOR_CASES {
        let d = Dev::new();
        let es = size_of(ty);
        let b0 = 16 / es;
        let (dims_all, box_all) = ([3 * b0, 5, 4, 3, 3], [b0, 3, 2, 2, 2]);
        let (dims, bx) = (&dims_all[..rank], &box_all[..rank]);
        let total: usize = dims.iter().product();
        let boxn: usize = bx.iter().product();
        let init = elems(&mut r, op, ty, total);
        let g = d.buf(&init);
        let mut strides = [0u64; 4];
        let mut pitch = (dims[0] * es) as u64;
        for i in 1..rank {
            strides[i - 1] = pitch;
            pitch *= dims[i] as u64;
        }
        let mut dm = [0u32; 5];
        let mut bm = [0u32; 5];
        for i in 0..rank {
            dm[i] = dims[i] as u32;
            bm[i] = bx[i] as u32;
        }
        let desc = TensorMapDesc {
            dtype,
            rank: rank as u32,
            global_address: g.base,
            dims: dm,
            strides,
            box_dims: bm,
            elem_strides: [1; 5],
            swizzle: Swizzle::None,
            oob_nan: false,
            interleave: 0,
            im2col: None,
        };
        let tm = d.buf(&desc.to_bytes());
        // inc: every source element is the same limit, so the result does not depend on order
        let lim = r.gen_range(0..40u64).to_le_bytes()[..es].to_vec();
        let boxes: Vec<Vec<u8>> = (0..3)
            .map(|_| {
                let mut b = match op {
                    "inc" => lim.repeat(boxn),
                    _ => elems(&mut r, op, ty, boxn),
                };
                b.resize(512, 0);
                b
            })
            .collect();
        let coords: Vec<Vec<i32>> = (0..3)
            .map(|_| {
                (0..rank)
                    .map(|i| r.gen_range(-(bx[i] as i32) + 1..dims[i] as i32))
                    .collect()
            })
            .collect();
        let mut cbytes = vec![0u8; 3 * 32];
        for (c, cs) in coords.iter().enumerate() {
            for (i, v) in cs.iter().enumerate() {
                cbytes[c * 32 + 4 * i..c * 32 + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        let (inb, cb) = (d.buf(&boxes.concat()), d.buf(&cbytes));
        d.run(
            &tensor_reduce_ptx(rank, op),
            "k",
            &[tm.base, inb.base, cb.base],
            &cfg(3, 32, 1),
        );
        // reference: each CTA's box element (row-major, innermost first) onto its tensor element
        let mut want = init.clone();
        for (c, cs) in coords.iter().enumerate() {
            for e in 0..boxn {
                let (mut rem, mut lin, mut scale, mut inside) = (e, 0usize, 1usize, true);
                for i in 0..rank {
                    let gi = cs[i] as i64 + (rem % bx[i]) as i64;
                    rem /= bx[i];
                    inside &= (0..dims[i] as i64).contains(&gi);
                    lin += gi.max(0) as usize * scale;
                    scale *= dims[i];
                }
                if inside {
                    let v = host_red(op, ty, get(&want, lin, es), get(&boxes[c], e, es));
                    want[lin * es..(lin + 1) * es].copy_from_slice(&v.to_le_bytes()[..es]);
                }
            }
        }
        let got = read(&g, total * es);
        for i in 0..total {
            assert_eq!(
                get(&got, i, es),
                get(&want, i, es),
                "{rank}d .{op} on {ty}: element {i} (coords {coords:?})"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// atom/red vector forms, f16/bf16 scalar and packed adds, and .sem/.scope qualifiers: 256
// threads, two target slots per form (even and odd threads).

const ATOMS: &str = r#"
.version 8.3
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 acc, .param .u64 vals, .param .u64 olds)
{
    .reg .pred %p<4>;
    .reg .b16 %h<16>;
    .reg .b32 %r<48>;
    .reg .f32 %f<16>;
    .reg .b64 %rd<24>;
    ld.param.u64 %rd1, [acc];
    ld.param.u64 %rd2, [vals];
    ld.param.u64 %rd3, [olds];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mad.lo.u32 %r3, %r2, 64, %r1;
    mul.wide.u32 %rd4, %r3, 128;
    add.s64 %rd5, %rd2, %rd4;           // this thread's values
    mul.wide.u32 %rd6, %r3, 32;
    add.s64 %rd7, %rd3, %rd6;           // this thread's returned old values
    and.b32 %r4, %r1, 1;                // slot
    mul.wide.u32 %rd8, %r4, 16;
    add.s64 %rd9, %rd1, %rd8;           // acc + 16*slot
    mul.wide.u32 %rd10, %r4, 8;
    add.s64 %rd11, %rd1, %rd10;         // acc + 8*slot
    mul.wide.u32 %rd12, %r4, 4;
    add.s64 %rd13, %rd1, %rd12;         // acc + 4*slot
    mul.wide.u32 %rd14, %r4, 2;
    add.s64 %rd15, %rd1, %rd14;         // acc + 2*slot
    ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd5];
    red.global.v4.f32.add [%rd9], {%f1, %f2, %f3, %f4};
    ld.global.v2.f32 {%f5, %f6}, [%rd5+16];
    atom.global.v2.f32.add {%f7, %f8}, [%rd11+32], {%f5, %f6};
    st.global.v2.f32 [%rd7], {%f7, %f8};
    ld.global.v4.b32 {%r5, %r6, %r7, %r8}, [%rd5+32];
    mov.b32 {%h1, %h2}, %r5;
    mov.b32 {%h3, %h4}, %r6;
    mov.b32 {%h5, %h6}, %r7;
    mov.b32 {%h7, %h8}, %r8;
    red.global.add.noftz.v8.f16 [%rd9+48], {%h1, %h2, %h3, %h4, %h5, %h6, %h7, %h8};
    ld.global.v2.b32 {%r9, %r10}, [%rd5+48];
    atom.global.v2.bf16x2.add.noftz {%r11, %r12}, [%rd11+80], {%r9, %r10};
    st.global.v2.b32 [%rd7+8], {%r11, %r12};
    ld.global.v4.b32 {%r13, %r14, %r15, %r16}, [%rd5+64];
    atom.global.v4.f16x2.max.noftz {%r17, %r18, %r19, %r20}, [%rd9+96], {%r13, %r14, %r15, %r16};
    st.global.v4.b32 [%rd7+16], {%r17, %r18, %r19, %r20};
    ld.global.v4.b16 {%h9, %h10, %h11, %h12}, [%rd5+80];
    red.global.v4.bf16.min.noftz [%rd11+128], {%h9, %h10, %h11, %h12};
    ld.global.b16 %h13, [%rd5+88];
    atom.global.add.noftz.f16 %h14, [%rd15+144], %h13;
    ld.global.b16 %h15, [%rd5+90];
    red.global.add.noftz.bf16 [%rd15+148], %h15;
    ld.global.b32 %r21, [%rd5+92];
    atom.global.add.noftz.f16x2 %r22, [%rd13+152], %r21;
    ld.global.v2.f32 {%f9, %f10}, [%rd5+96];
    createpolicy.fractional.L2::evict_last.b64 %rd16, 1.0;
    atom.global.v2.f32.add.L2::cache_hint {%f11, %f12}, [%rd11+160], {%f9, %f10}, %rd16;
    ld.global.v2.u32 {%r23, %r24}, [%rd5+104];
    atom.acq_rel.gpu.global.add.u32 %r25, [%rd13+176], %r23;
    atom.relaxed.sys.global.max.s32 %r26, [%rd13+184], %r24;
    ld.global.u64 %rd17, [%rd5+112];
    red.release.gpu.global.add.u64 [%rd11+192], %rd17;
    ld.global.u32 %r27, [%rd5+120];
    red.relaxed.cluster.global.xor.b32 [%rd13+208], %r27;
    ld.global.u32 %r29, [%rd5+124];
    atom.acquire.cta.global.inc.u32 %r28, [%rd13+216], %r29;
    ret;
}
"#;

/// Bits of `n` values of `ty` from `gen` (an f64 per element).
fn vals_of(ty: &str, v: &[f64]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match ty {
            "f32" => (x as f32).to_bits().to_le_bytes().to_vec(),
            "f16" => f16::from_f64(x).to_bits().to_le_bytes().to_vec(),
            _ => bf16::from_f64(x).to_bits().to_le_bytes().to_vec(),
        })
        .collect()
}

/// Small signed integers as floats (|x| <= m, never 0).
fn smallf(r: &mut StdRng, m: i32, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let v = r.gen_range(1..=m) as f64;
            if r.gen() {
                v
            } else {
                -v
            }
        })
        .collect()
}

/// Folds the per-thread bytes `vals[t][at..at + bytes]` of the threads in `slot` into `acc`
/// at `acc_at + slot * bytes` with `op` on elements of `ty`.
fn fold_slots(
    acc: &mut [u8],
    vals: &[Vec<u8>],
    (op, ty): (&str, &str),
    at: usize,
    acc_at: usize,
    bytes: usize,
) {
    let es = size_of(ty);
    for slot in 0..2 {
        let a0 = acc_at + slot * bytes;
        for v in vals.iter().skip(slot).step_by(2) {
            for i in 0..bytes / es {
                let x = host_red(op, ty, get(&acc[a0..], i, es), get(&v[at..], i, es));
                acc[a0 + i * es..a0 + (i + 1) * es].copy_from_slice(&x.to_le_bytes()[..es]);
            }
        }
    }
}

#[test]
fn atom_red_vector_half_and_ordered_forms() {
    let mut r = rng();
    let d = Dev::new();
    let n = 256usize;
    let lim = r.gen_range(1..100u32);
    let vals: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let mut v = Vec::with_capacity(128);
            v.extend(vals_of("f32", &smallf(&mut r, 1000, 4)));
            // positive increments: the returned old values order the additions
            let inc: Vec<f64> = (0..2).map(|_| r.gen_range(1..=100) as f64).collect();
            v.extend(vals_of("f32", &inc));
            v.extend(vals_of("f32", &[0.0, 0.0]));
            v.extend(vals_of("f16", &smallf(&mut r, 8, 8)));
            v.extend(vals_of("bf16", &smallf(&mut r, 1, 4)));
            v.extend([0u8; 8]);
            let any: Vec<f64> = (0..12).map(|_| r.gen_range(-100.0..100.0)).collect();
            v.extend(vals_of("f16", &any[..8]));
            v.extend(vals_of("bf16", &any[8..]));
            v.extend(vals_of("f16", &smallf(&mut r, 8, 1)));
            v.extend(vals_of("bf16", &smallf(&mut r, 1, 1)));
            v.extend(vals_of("f16", &smallf(&mut r, 8, 2)));
            v.extend(vals_of("f32", &smallf(&mut r, 1000, 2)));
            v.extend(r.gen::<u32>().to_le_bytes());
            v.extend(r.gen::<u32>().to_le_bytes());
            v.extend(r.gen::<u64>().to_le_bytes());
            v.extend(lim.to_le_bytes());
            v.extend([0u8; 4]);
            assert_eq!(v.len(), 128);
            v
        })
        .collect();
    // targets: float sums start from small integers, the rest from random bits
    let mut acc = Vec::new();
    acc.extend(vals_of("f32", &smallf(&mut r, 1000, 12)));
    acc.extend(vals_of("f16", &smallf(&mut r, 64, 16)));
    acc.extend(vals_of("bf16", &smallf(&mut r, 32, 8)));
    let any: Vec<f64> = (0..24).map(|_| r.gen_range(-100.0..100.0)).collect();
    acc.extend(vals_of("f16", &any[..16]));
    acc.extend(vals_of("bf16", &any[16..]));
    acc.extend(vals_of("f16", &smallf(&mut r, 64, 2)));
    acc.extend(vals_of("bf16", &smallf(&mut r, 32, 2)));
    acc.extend(vals_of("f16", &smallf(&mut r, 64, 4)));
    acc.extend(vals_of("f32", &smallf(&mut r, 1000, 4)));
    for _ in 0..4 {
        acc.extend(r.gen::<u32>().to_le_bytes());
    }
    for _ in 0..2 {
        acc.extend(r.gen::<u64>().to_le_bytes());
    }
    for _ in 0..2 {
        acc.extend(r.gen::<u32>().to_le_bytes());
    }
    for _ in 0..2 {
        acc.extend(r.gen_range(0..100u32).to_le_bytes());
    }
    assert_eq!(acc.len(), 224);
    let (ab, vb, ob) = (d.buf(&acc), d.buf(&vals.concat()), d.out(32 * n));
    d.run(ATOMS, "k", &[ab.base, vb.base, ob.base], &cfg(4, 64, 1));
    let mut want = acc.clone();
    for (op, ty, at, acc_at, bytes) in [
        ("add", "f32", 0, 0, 16),
        ("add", "f32", 16, 32, 8),
        ("add", "f16", 32, 48, 16),
        ("add", "bf16", 48, 80, 8),
        ("max", "f16", 64, 96, 16),
        ("min", "bf16", 80, 128, 8),
        ("add", "f16", 88, 144, 2),
        ("add", "bf16", 90, 148, 2),
        ("add", "f16", 92, 152, 4),
        ("add", "f32", 96, 160, 8),
        ("add", "u32", 104, 176, 4),
        ("max", "s32", 108, 184, 4),
        ("add", "u64", 112, 192, 8),
        ("xor", "b32", 120, 208, 4),
        ("inc", "u32", 124, 216, 4),
    ] {
        fold_slots(&mut want, &vals, (op, ty), at, acc_at, bytes);
        assert_eq!(
            read(&ab, 224)[acc_at..acc_at + 2 * bytes],
            want[acc_at..acc_at + 2 * bytes],
            "{op}.{ty} at acc+{acc_at}"
        );
    }
    // atom.global.v2.f32.add: per element, the returned old values chain the additions
    let olds = read(&ob, 32 * n);
    for slot in 0..2 {
        for e in 0..2 {
            let f = |b: &[u8], i: usize| f32::from_bits(get(b, i, 4) as u32);
            let mut chain: Vec<(f32, f32)> = (slot..n)
                .step_by(2)
                .map(|t| (f(&olds[32 * t..], e), f(&vals[t][16..], e)))
                .collect();
            chain.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut cur = f(&acc[32 + 8 * slot..], e);
            for (old, inc) in chain {
                assert_eq!(
                    old, cur,
                    "atom.v2.f32.add old value, slot {slot} element {e}"
                );
                cur += inc;
            }
            assert_eq!(cur, f(&want[32 + 8 * slot..], e));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 128-bit atom.cas/atom.exch and 16-bit atom.cas: CAS loops from 256 threads on one global
// counter pair and one per CTA in shared memory, and an exchange chain.

const WIDE: &str = r#"
.version 8.3
.target sm_90a
.address_size 64
.shared .align 16 .b8 s128[16];
.shared .align 4 .b8 s16[4];
.visible .entry k(.param .u64 c128, .param .u64 x128, .param .u64 vals, .param .u64 olds, .param .u64 c16, .param .u64 out, .param .u64 sinit)
{
    .reg .pred %p<8>;
    .reg .b16 %h<8>;
    .reg .b32 %r<24>;
    .reg .b64 %rd<40>;
    .reg .b128 %q<8>;
    ld.param.u64 %rd1, [c128];
    ld.param.u64 %rd2, [x128];
    ld.param.u64 %rd3, [vals];
    ld.param.u64 %rd4, [olds];
    ld.param.u64 %rd5, [c16];
    ld.param.u64 %rd6, [out];
    ld.param.u64 %rd33, [sinit];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mad.lo.u32 %r3, %r2, 64, %r1;
    add.u32 %r4, %r3, 1;
    cvt.u64.u32 %rd7, %r4;              // this thread's high-word increment
    mov.u32 %r5, s128;
    mov.u32 %r6, s16;
    and.b32 %r7, %r1, 1;
    shl.b32 %r8, %r7, 1;
    add.u32 %r9, %r6, %r8;              // s16 + 2*slot
    cvt.u64.u32 %rd8, %r8;
    add.s64 %rd9, %rd5, %rd8;           // c16 + 2*slot
    setp.eq.u32 %p1, %r1, 0;
    // shared counters start from the global counters' initial values (an unchanged copy);
    // the global CAS loop starts from any guess
    ld.global.v2.u64 {%rd10, %rd11}, [%rd33];
    @%p1 st.shared.v2.u64 [%r5], {%rd10, %rd11};
    ld.global.v2.u16 {%h1, %h2}, [%rd33+16];
    @%p1 st.shared.v2.u16 [%r6], {%h1, %h2};
    bar.sync 0;
G128:
    add.u64 %rd12, %rd10, 1;
    add.u64 %rd13, %rd11, %rd7;
    mov.b128 %q1, {%rd10, %rd11};
    mov.b128 %q2, {%rd12, %rd13};
    atom.global.cas.b128 %q3, [%rd1], %q1, %q2;
    mov.b128 {%rd14, %rd15}, %q3;
    setp.ne.u64 %p2, %rd14, %rd10;
    setp.ne.u64 %p3, %rd15, %rd11;
    or.pred %p4, %p2, %p3;
    mov.u64 %rd10, %rd14;
    mov.u64 %rd11, %rd15;
    @%p4 bra G128;
    ld.shared.v2.u64 {%rd16, %rd17}, [%r5];
S128:
    add.u64 %rd18, %rd16, 1;
    add.u64 %rd19, %rd17, %rd7;
    mov.b128 %q4, {%rd16, %rd17};
    mov.b128 %q5, {%rd18, %rd19};
    atom.relaxed.cta.shared::cta.cas.b128 %q6, [%r5], %q4, %q5;
    mov.b128 {%rd20, %rd21}, %q6;
    setp.ne.u64 %p2, %rd20, %rd16;
    setp.ne.u64 %p3, %rd21, %rd17;
    or.pred %p4, %p2, %p3;
    mov.u64 %rd16, %rd20;
    mov.u64 %rd17, %rd21;
    @%p4 bra S128;
    // exchange chain: every thread swaps its value in and records what it took out
    mul.wide.u32 %rd22, %r3, 16;
    add.s64 %rd23, %rd3, %rd22;
    ld.global.v2.u64 {%rd24, %rd25}, [%rd23];
    mov.b128 %q7, {%rd24, %rd25};
    atom.acq_rel.gpu.global.exch.b128 %q7, [%rd2], %q7;
    mov.b128 {%rd26, %rd27}, %q7;
    add.s64 %rd28, %rd4, %rd22;
    st.global.v2.u64 [%rd28], {%rd26, %rd27};
    // 16-bit CAS counters, global and shared
    ld.global.u16 %h3, [%rd9];
G16:
    add.u16 %h4, %h3, 1;
    atom.global.cas.b16 %h5, [%rd9], %h3, %h4;
    setp.ne.b16 %p5, %h5, %h3;
    mov.b16 %h3, %h5;
    @%p5 bra G16;
    ld.shared.u16 %h3, [%r9];
S16:
    add.u16 %h4, %h3, 1;
    atom.shared.cas.b16 %h5, [%r9], %h3, %h4;
    setp.ne.b16 %p5, %h5, %h3;
    mov.b16 %h3, %h5;
    @%p5 bra S16;
    bar.sync 0;
    // out[cta] = shared 128-bit counter (16 bytes), shared 16-bit counters (4 bytes)
    mul.wide.u32 %rd29, %r2, 32;
    add.s64 %rd30, %rd6, %rd29;
    ld.shared.v2.u64 {%rd31, %rd32}, [%r5];
    @%p1 st.global.v2.u64 [%rd30], {%rd31, %rd32};
    ld.shared.u32 %r10, [%r6];
    @%p1 st.global.u32 [%rd30+16], %r10;
    ret;
}
"#;

#[test]
fn atom_cas_exch_b128_and_cas_b16() {
    let mut r = rng();
    let d = Dev::new();
    let (n, ctas) = (256usize, 4usize);
    let c0 = [r.gen::<u64>(), r.gen::<u64>()];
    let x0 = [r.gen::<u64>(), r.gen::<u64>()];
    let h0 = [r.gen::<u16>(), r.gen::<u16>()];
    let vals: Vec<[u64; 2]> = (0..n).map(|_| [r.gen(), r.gen()]).collect();
    let c128 = d.buf(&bytes64(&c0));
    let x128 = d.buf(&bytes64(&x0));
    let vb = d.buf(&bytes64(&vals.concat()));
    let ob = d.out(16 * n);
    let hb: Vec<u8> = h0.iter().flat_map(|h| h.to_le_bytes()).collect();
    let c16 = d.buf(&hb);
    let out = d.out(32 * ctas);
    let sinit = d.buf(&[bytes64(&c0), hb.clone()].concat());
    d.run(
        WIDE,
        "k",
        &[
            c128.base, x128.base, vb.base, ob.base, c16.base, out.base, sinit.base,
        ],
        &cfg(ctas as u32, 64, 1),
    );
    // global 128-bit counter: +1 low and +(gtid+1) high per thread
    let tri = |ts: std::ops::Range<u64>| ts.map(|t| t + 1).fold(0u64, u64::wrapping_add);
    let got = u64s(&read(&c128, 16));
    assert_eq!(got[0], c0[0].wrapping_add(n as u64), "cas.b128 low word");
    assert_eq!(
        got[1],
        c0[1].wrapping_add(tri(0..n as u64)),
        "cas.b128 high word"
    );
    let o = read(&out, 32 * ctas);
    for c in 0..ctas {
        let w = u64s(&o[32 * c..32 * c + 16]);
        let ts = (64 * c) as u64..(64 * c + 64) as u64;
        assert_eq!(w[0], c0[0].wrapping_add(64), "shared cas.b128 low, CTA {c}");
        assert_eq!(
            w[1],
            c0[1].wrapping_add(tri(ts)),
            "shared cas.b128 high, CTA {c}"
        );
        for s in 0..2 {
            let h = u16::from_le_bytes([o[32 * c + 16 + 2 * s], o[32 * c + 17 + 2 * s]]);
            assert_eq!(
                h,
                h0[s].wrapping_add(32),
                "shared cas.b16 slot {s}, CTA {c}"
            );
        }
    }
    let g16 = read(&c16, 4);
    for s in 0..2 {
        let h = u16::from_le_bytes([g16[2 * s], g16[2 * s + 1]]);
        assert_eq!(h, h0[s].wrapping_add(128), "global cas.b16 slot {s}");
    }
    // exch.b128: the values taken out plus the final one are the initial one plus all swapped in
    let mut taken: Vec<[u64; 2]> = u64s(&read(&ob, 16 * n))
        .chunks(2)
        .map(|c| [c[0], c[1]])
        .collect();
    let fin = u64s(&read(&x128, 16));
    taken.push([fin[0], fin[1]]);
    let mut put = vals.clone();
    put.push(x0);
    taken.sort();
    put.sort();
    assert_eq!(taken, put, "exch.b128 chain");
}

// ---------------------------------------------------------------------------------------------
// The validator's operation/type rules for these forms agree with ptxas.

/// (instruction, valid?) — each checked against the validator and, when installed, ptxas.
const FORMS: &[(&str, bool)] = &[
    ("atom.global.add.u32 %r3, [%rd1], %r2;", true),
    ("cp.async.bulk.prefetch.L2.global [%rd1], 64;", true),
    ("cp.async.bulk.prefetch.tensor.2d.L2.global [%rd1, {%r1, %r1}];", true),
    ("atom.global.add.s64 %rd5, [%rd1], %rd3;", false),
    ("atom.global.min.f32 %f1, [%rd1], %f2;", false),
    ("atom.global.min.s64 %rd5, [%rd1], %rd3;", true),
    ("atom.global.inc.u64 %rd5, [%rd1], %rd3;", false),
    ("atom.global.and.u32 %r3, [%rd1], %r2;", false),
    ("atom.global.exch.b16 %h1, [%rd1], %h2;", false),
    ("atom.global.cas.b16 %h1, [%rd1], %h2, %h3;", true),
    ("atom.global.cas.b128 %q3, [%rd1], %q1, %q2;", true),
    ("atom.global.add.f16 %h1, [%rd1], %h2;", false),
    ("atom.global.add.noftz.f16 %h1, [%rd1], %h2;", true),
    ("atom.global.add.noftz.f32 %f1, [%rd1], %f2;", false),
    ("atom.global.min.noftz.f16 %h1, [%rd1], %h2;", false),
    ("atom.global.v8.f16.add.noftz {%h1,%h2,%h3,%h4,%h1,%h2,%h3,%h4}, [%rd1], {%h1,%h2,%h3,%h4,%h1,%h2,%h3,%h4};", true),
    ("atom.global.v2.f32.min {%f1,%f2}, [%rd1], {%f1,%f2};", false),
    ("atom.shared.v2.f32.add {%f1,%f2}, [%r1], {%f1,%f2};", false),
    ("atom.global.v2.f32.add.L2::cache_hint {%f1,%f2}, [%rd1], {%f1,%f2}, %rd3;", true),
    ("red.global.cas.b32 [%rd1], %r2, %r3;", false),
    ("red.global.v4.bf16x2.max.noftz [%rd1], {%r2,%r3,%r4,%r5};", true),
    ("red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.min.u64 [%r1], %rd3, [%r1+512];", false),
    ("red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.xor.b64 [%r1], %rd3, [%r1+512];", false),
    ("red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.add.s64 [%r1], %rd3, [%r1+512];", true),
    ("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b64 [%r1], {%rd3,%rd3,%rd3,%rd3}, [%r1+512];", false),
    ("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f64 [%r1], {%fd1,%fd1}, [%r1+512];", true),
    ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f16 [%rd1], [%r1], 64;", false),
    ("cp.reduce.async.bulk.global.shared::cta.bulk_group.min.f32 [%rd1], [%r1], 64;", false),
    ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s64 [%rd1], [%r1], 64;", false),
    ("cp.reduce.async.bulk.global.shared::cta.bulk_group.min.bf16 [%rd1], [%r1], 64;", true),
    ("cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.min.u64 [%r1], [%r1+256], 64, [%r1+512];", false),
    ("cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.max.s32 [%r1], [%r1+256], 64, [%r1+512];", true),
];

#[test]
fn validator_agrees_with_ptxas_on_atomic_forms() {
    let ptxas = ptx::ptxas::ptxas_for_tests("isa_mem forms").is_some();
    for &(ins, valid) in FORMS {
        let text = format!(
            ".version 8.7\n.target sm_90a\n.address_size 64\n.shared .align 16 .b8 sbuf[1024];\n\
             .visible .entry k(.param .u64 p)\n{{\n\
             .reg .b16 %h<8>; .reg .b32 %r<16>; .reg .b64 %rd<16>; .reg .f32 %f<8>;\n\
             .reg .f64 %fd<4>; .reg .b128 %q<4>;\n\
             ld.param.u64 %rd1, [p]; mov.u32 %r1, sbuf; mov.u64 %rd3, 0;\n\
             mov.b128 %q1, {{%rd3, %rd3}}; mov.b128 %q2, {{%rd3, %rd3}};\n\
             {ins}\nret;\n}}\n"
        );
        let m = ptx::parse(&text).unwrap_or_else(|e| panic!("{ins}: {e}"));
        let errs: Vec<String> = ptx::validate(&m)
            .into_iter()
            .filter(|d| d.is_error())
            .map(|d| d.to_string())
            .collect();
        assert_eq!(errs.is_empty(), valid, "validator on `{ins}`: {errs:?}");
        if ptxas {
            let r = ptx::ptxas::assemble(&text, "sm_90a", &Default::default());
            assert_eq!(r.is_ok(), valid, "ptxas on `{ins}`: {r:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ld/st.b128 and mov.b128 (a .b128 register is a pair of 64-bit halves), after an L2 bulk
// prefetch of the input.

const B128: &str = r#"
.version 8.3
.target sm_90a
.address_size 64
.shared .align 16 .b8 sm[1024];
.visible .entry k(.param .u64 in, .param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<16>;
    .reg .b128 %q<8>;
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    cp.async.bulk.prefetch.L2.global [%rd1], 1024;
    shl.b32 %r2, %r1, 4;
    cvt.u64.u32 %rd3, %r2;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.b128 %q1, [%rd4];
    mov.b128 {%rd5, %rd6}, %q1;
    mov.b128 %q2, {%rd6, %rd5};
    mov.u32 %r3, sm;
    add.u32 %r4, %r3, %r2;
    st.shared.b128 [%r4], %q2;
    bar.sync 0;
    xor.b32 %r5, %r2, 16;
    add.u32 %r6, %r3, %r5;
    ld.shared.b128 %q3, [%r6];
    mov.b128 %q4, %q3;
    add.s64 %rd7, %rd2, %rd3;
    st.global.b128 [%rd7], %q4;
    ret;
}
"#;

#[test]
fn ld_st_mov_b128() {
    let mut r = rng();
    let d = Dev::new();
    let input: Vec<u64> = (0..128).map(|_| r.gen_range(1..=u64::MAX)).collect();
    let (inp, out) = (d.buf(&bytes64(&input)), d.out(1024));
    d.run(B128, "k", &[inp.base, out.base], &cfg(1, 64, 1));
    let got = u64s(&read(&out, 1024));
    for t in 0..64 {
        let p = t ^ 1;
        assert_eq!(
            [got[2 * t], got[2 * t + 1]],
            [input[2 * p + 1], input[2 * p]],
            "thread {t}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// atom/red .add.f32 flush subnormal inputs and results to sign-preserving zero (PTX ISA);
// .add.f64 does not.

const FTZ: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 acc, .param .u64 vals, .param .u64 olds)
{
    .reg .b32 %r<4>;
    .reg .f32 %f<4>;
    .reg .f64 %fd<4>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [acc];
    ld.param.u64 %rd2, [vals];
    ld.param.u64 %rd3, [olds];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %rd2, %rd4;
    add.s64 %rd6, %rd1, %rd4;
    ld.global.f32 %f1, [%rd5];
    atom.global.add.f32 %f2, [%rd6], %f1;
    add.s64 %rd7, %rd3, %rd4;
    st.global.f32 [%rd7], %f2;
    red.global.add.f32 [%rd6+64], %f1;
    mul.wide.u32 %rd8, %r1, 8;
    add.s64 %rd9, %rd2, %rd8;
    add.s64 %rd10, %rd1, %rd8;
    ld.global.f64 %fd1, [%rd9+64];
    red.global.add.f64 [%rd10+128], %fd1;
    ret;
}
"#;

#[test]
fn atom_add_f32_flushes_subnormals_f64_does_not() {
    let mut r = rng();
    let d = Dev::new();
    let n = 16usize;
    // magnitudes around the smallest normal, so inputs and sums are often subnormal
    let f32s = |r: &mut StdRng| -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v = f32::from_bits(r.gen_range(1..0x0180_0000u32));
                if r.gen() {
                    v
                } else {
                    -v
                }
            })
            .collect()
    };
    let (a0, b) = (f32s(&mut r), f32s(&mut r));
    let a64: Vec<f64> = (0..n)
        .map(|_| f64::from_bits(r.gen_range(1..1u64 << 53)))
        .collect();
    let b64: Vec<f64> = (0..n)
        .map(|_| -f64::from_bits(r.gen_range(1..1u64 << 52)))
        .collect();
    let bits32 = |v: &[f32]| bytes32(&v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    let bits64 = |v: &[f64]| bytes64(&v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    let acc = d.buf(&[bits32(&a0), bits32(&a0), bits64(&a64)].concat());
    let vals = d.buf(&[bits32(&b), bits64(&b64)].concat());
    let olds = d.out(4 * n);
    d.run(
        FTZ,
        "k",
        &[acc.base, vals.base, olds.base],
        &cfg(1, n as u32, 1),
    );
    let ftz = |x: f32| {
        if x.is_subnormal() {
            0.0f32.copysign(x)
        } else {
            x
        }
    };
    let got = read(&acc, 8 * n + 8 * n);
    let g32 = u32s(&got[..8 * n]);
    let g64 = u64s(&got[8 * n..]);
    let o = u32s(&read(&olds, 4 * n));
    for t in 0..n {
        let want = ftz(ftz(a0[t]) + ftz(b[t])).to_bits();
        assert_eq!(g32[t], want, "atom.add.f32 {:e} + {:e}", a0[t], b[t]);
        assert_eq!(g32[n + t], want, "red.add.f32 {:e} + {:e}", a0[t], b[t]);
        assert_eq!(
            o[t],
            a0[t].to_bits(),
            "atom.add.f32 returns the old value as stored"
        );
        assert_eq!(
            g64[t],
            (a64[t] + b64[t]).to_bits(),
            "red.add.f64 keeps subnormals"
        );
    }
}
