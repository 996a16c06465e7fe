//! The warp-wide memory fast paths (`exec/fastmem.rs`: whole-warp `ld`/`st`/`cp.async`, merged
//! sub-word global stores, pooled CTA state) against a host reference on fresh random inputs:
//! permuted 16-bit stores, bytes loaded from two alternating buffers (one warp access over two
//! allocations: the general path) and stored with a divergent mask,
//! `cp.async` rows with zero fill (16- and 4-byte, some lanes predicated off) read back through
//! generic shared addresses, local-memory vectors, generic global loads and stores. Outputs
//! start poisoned; the bytes a kernel must not write are checked to stay so. More CTAs than
//! the workers hold at once run, so later CTAs reuse earlier ones' register files and shared
//! memory (their initial state must still be zero).

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const KERNEL: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.shared .align 16 .b8 sbuf[2560];
.visible .entry k(.param .u64 in16, .param .u64 in8, .param .u64 in128, .param .u64 out16,
    .param .u64 out8, .param .u64 out128, .param .u64 outg, .param .u64 out4)
{
    .local .align 8 .b8 lbuf[8];
    .reg .pred %p<4>;
    .reg .b16 %rs<8>;
    .reg .b32 %r<40>;
    .reg .b64 %rd<40>;
    ld.param.u64 %rd1, [in16];
    ld.param.u64 %rd2, [in8];
    ld.param.u64 %rd3, [in128];
    ld.param.u64 %rd4, [out16];
    ld.param.u64 %rd5, [out8];
    ld.param.u64 %rd6, [out128];
    ld.param.u64 %rd7, [outg];
    ld.param.u64 %rd8, [out4];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    // the lane's first shared word must read zero (fresh or reused CTA state)
    shl.b32 %r30, %r1, 4;
    mov.u32 %r9, sbuf;
    add.u32 %r10, %r9, %r30;
    ld.shared.u32 %r31, [%r10];
    // 1. out16[(37 g) % N] = in16[g] + 1 + first shared word
    mul.wide.u32 %rd9, %r4, 2;
    add.s64 %rd10, %rd1, %rd9;
    ld.global.u16 %rs1, [%rd10];
    cvt.u16.u32 %rs5, %r31;
    add.u16 %rs2, %rs1, 1;
    add.u16 %rs2, %rs2, %rs5;
    mul.lo.u32 %r5, %r4, 37;
    rem.u32 %r6, %r5, 1024;
    mul.wide.u32 %rd11, %r6, 2;
    add.s64 %rd12, %rd4, %rd11;
    st.global.u16 [%rd12], %rs2;
    // 2. bytes of in8 (odd g) or in16 (even g) xor 0x5a: all lanes at out8[g], odd ones also
    // at out8[N + g]
    and.b32 %r7, %r4, 1;
    setp.eq.u32 %p1, %r7, 1;
    cvt.u64.u32 %rd13, %r4;
    selp.b64 %rd14, %rd2, %rd1, %p1;
    add.s64 %rd15, %rd14, %rd13;
    ld.global.u8 %rs3, [%rd15];
    xor.b16 %rs4, %rs3, 0x5a;
    add.s64 %rd16, %rd5, %rd13;
    st.global.u8 [%rd16], %rs4;
    @%p1 st.global.u8 [%rd16+1024], %rs4;
    // 3. cp.async of in128 row g into shared row tid, zero-filled when tid % 3 == 0; each
    // thread reads its neighbour's row (tid ^ 1) through a generic address
    mul.wide.u32 %rd17, %r4, 16;
    add.s64 %rd18, %rd3, %rd17;
    rem.u32 %r11, %r1, 3;
    setp.eq.u32 %p2, %r11, 0;
    selp.u32 %r12, 0, 16, %p2;
    cp.async.cg.shared.global [%r10], [%rd18], 16, %r12;
    // 4-byte rows of in8 for odd g only, into shared words 2048 + 4 tid
    shl.b32 %r13, %r1, 2;
    add.u32 %r14, %r9, %r13;
    mul.wide.u32 %rd19, %r4, 4;
    add.s64 %rd20, %rd2, %rd19;
    @%p1 cp.async.ca.shared.global [%r14+2048], [%rd20], 4;
    cp.async.commit_group;
    cp.async.wait_group 0;
    bar.sync 0;
    xor.b32 %r15, %r1, 1;
    shl.b32 %r16, %r15, 4;
    add.u32 %r17, %r9, %r16;
    cvt.u64.u32 %rd21, %r17;
    cvta.shared.u64 %rd22, %rd21;
    ld.v4.u32 {%r18, %r19, %r20, %r21}, [%rd22];
    add.s64 %rd23, %rd6, %rd17;
    st.global.v4.u32 [%rd23], {%r18, %r19, %r20, %r21};
    ld.shared.u32 %r22, [%r14+2048];
    add.s64 %rd24, %rd8, %rd19;
    @%p1 st.global.u32 [%rd24], %r22;
    // 4. local round trip of {3 g, tid ^ 0xabc}, stored through a generic global address with
    // a generic load of in128 word g; the last word of each 16-byte outg slot is not written
    mul.lo.u32 %r23, %r4, 3;
    xor.b32 %r24, %r1, 0xabc;
    st.local.v2.u32 [lbuf], {%r23, %r24};
    ld.local.v2.u32 {%r25, %r26}, [lbuf];
    cvta.global.u64 %rd25, %rd7;
    add.s64 %rd26, %rd25, %rd17;
    st.v2.u32 [%rd26], {%r25, %r26};
    cvta.global.u64 %rd27, %rd3;
    add.s64 %rd28, %rd27, %rd19;
    ld.u32 %r27, [%rd28];
    st.u32 [%rd26+8], %r27;
    // dirty this CTA's shared memory for the next CTA that reuses it
    st.shared.u32 [%r10], %r4;
    ret;
}
"#;

/// Threads per CTA and CTAs: more CTAs than the launch workers hold at once.
const BLOCK: u32 = 128;
const GRID: u32 = 8;
const N: usize = (BLOCK * GRID) as usize;

fn rng() -> StdRng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn check_ptx(text: &str) {
    let m = ptx::parse(text).unwrap_or_else(|e| panic!("parse: {e}"));
    let diags = ptx::validate(&m);
    assert!(diags.iter().all(|d| !d.is_error()), "validator: {diags:#?}");
    if ptx::ptxas::ptxas_for_tests("warp_mem test PTX").is_some() {
        let rep = ptx::ptxas::assemble(text, "sm_90a", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}"));
        for k in &rep.kernels {
            assert_eq!(k.spill_stores_bytes + k.spill_loads_bytes, 0, "spills");
        }
    }
}

type Buf = Arc<emu::memory::Allocation>;

fn buf(mem: &GlobalMemory, data: &[u8]) -> Buf {
    let b = mem.alloc(data.len() as u64, 0).unwrap();
    b.write_bytes(0, data);
    b
}

fn read(b: &Buf, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    b.read_bytes(0, &mut v);
    v
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap())
}

/// The host reference of every output of [`KERNEL`] (poison 0xff where nothing is written).
struct Expected {
    out16: Vec<u8>,
    out8: Vec<u8>,
    out128: Vec<u8>,
    outg: Vec<u8>,
    out4: Vec<u8>,
}

fn reference(in16: &[u8], in8: &[u8], in128: &[u8]) -> Expected {
    let mut e = Expected {
        out16: vec![0xff; 2 * N],
        out8: vec![0xff; 2 * N],
        out128: vec![0xff; 16 * N],
        outg: vec![0xff; 16 * N],
        out4: vec![0xff; 4 * N],
    };
    for g in 0..N {
        let (tid, cta) = (g % BLOCK as usize, g / BLOCK as usize);
        let x = u16::from_le_bytes([in16[2 * g], in16[2 * g + 1]]).wrapping_add(1);
        let at = (g * 37) % N;
        e.out16[2 * at..2 * at + 2].copy_from_slice(&x.to_le_bytes());
        let odd = g % 2 == 1;
        let b = if odd { in8[g] } else { in16[g] } ^ 0x5a;
        e.out8[g] = b;
        if odd {
            e.out8[N + g] = b;
            e.out4[4 * g..4 * g + 4].copy_from_slice(&in8[4 * g..4 * g + 4]);
        }
        let nb = tid ^ 1;
        let src = cta * BLOCK as usize + nb;
        let row = &mut e.out128[16 * g..16 * g + 16];
        if nb % 3 == 0 {
            row.fill(0);
        } else {
            row.copy_from_slice(&in128[16 * src..16 * src + 16]);
        }
        let slot = &mut e.outg[16 * g..16 * g + 12];
        slot[..4].copy_from_slice(&(3 * g as u32).to_le_bytes());
        slot[4..8].copy_from_slice(&(tid as u32 ^ 0xabc).to_le_bytes());
        slot[8..].copy_from_slice(&u32_at(in128, g).to_le_bytes());
    }
    e
}

#[test]
fn warp_memory_fast_paths_match_reference() {
    check_ptx(KERNEL);
    let mut r = rng();
    let mem = GlobalMemory::new();
    let rand_bytes = |r: &mut StdRng, n: usize| -> Vec<u8> { (0..n).map(|_| r.gen()).collect() };
    let (in16, in8, in128) = (
        rand_bytes(&mut r, 2 * N),
        rand_bytes(&mut r, 4 * N),
        rand_bytes(&mut r, 16 * N),
    );
    let ins = [buf(&mem, &in16), buf(&mem, &in8), buf(&mem, &in128)];
    let sizes = [2 * N, 2 * N, 16 * N, 16 * N, 4 * N];
    let outs: Vec<Buf> = sizes.iter().map(|&n| buf(&mem, &vec![0xff; n])).collect();
    let m = LoadedModule::load(&mem, ptx::parse(KERNEL).unwrap(), 0).unwrap();
    let params: Vec<u8> = ins
        .iter()
        .chain(outs.iter())
        .flat_map(|b| b.base.to_le_bytes())
        .collect();
    let opts = LaunchOptions {
        threads: 2,
        ..Default::default()
    };
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        params,
        &LaunchConfig::linear(GRID, BLOCK),
        &opts,
    )
    .unwrap_or_else(|e| panic!("launch: {e}"));
    let e = reference(&in16, &in8, &in128);
    let want = [e.out16, e.out8, e.out128, e.outg, e.out4];
    let names = ["out16", "out8", "out128", "outg", "out4"];
    for ((b, w), name) in outs.iter().zip(want.iter()).zip(names) {
        let got = read(b, w.len());
        if let Some(i) = (0..w.len()).find(|&i| got[i] != w[i]) {
            panic!("{name}: byte {i}: got {:#04x}, want {:#04x}", got[i], w[i]);
        }
    }
}
