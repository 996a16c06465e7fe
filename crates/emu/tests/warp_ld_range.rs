//! Scalar `ld` resolved from the lanes' address range (`exec/fastmem.rs`: `warp_range`, one
//! bounds check for the whole warp, then one read loop per memory) against a host reference on
//! fresh random inputs: lane-reversed, strided, broadcast and byte/sign-extended global loads,
//! a predicated (odd lanes) load, one access over two allocations (the per-lane path), shared
//! memory through shared and generic addresses, generic global loads, full and partial warps.
//! Outputs start poisoned. Faults keep their lane: a load one word past an allocation's end
//! in the last lane, and a misaligned one, are reported for the right thread.

use emu::{launch, FaultKind, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

#[path = "common/load.rs"]
mod load;

const KERNEL: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.shared .align 4 .b32 sw[48];
.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 po)
{
    .reg .pred %p<2>;
    .reg .b32 %r<32>;
    .reg .b64 %rd<24>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [po];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mad.lo.u32 %r3, %r2, 48, %r1;
    mul.wide.u32 %rd4, %r3, 36;
    add.s64 %rd5, %rd3, %rd4;
    // k0: A[47 - t + 48 c] (lane-reversed)
    sub.u32 %r4, 47, %r1;
    mad.lo.u32 %r4, %r2, 48, %r4;
    mul.wide.u32 %rd6, %r4, 4;
    add.s64 %rd6, %rd1, %rd6;
    ld.global.u32 %r10, [%rd6];
    st.global.u32 [%rd5], %r10;
    // k1: halfword (3 t mod 48) + 96 c of A, sign-extended
    mul.lo.u32 %r5, %r1, 3;
    rem.u32 %r5, %r5, 48;
    mad.lo.u32 %r5, %r2, 96, %r5;
    mul.wide.u32 %rd7, %r5, 2;
    add.s64 %rd7, %rd1, %rd7;
    ld.global.s16 %r11, [%rd7];
    st.global.u32 [%rd5+4], %r11;
    // k2: A[200 + c] for every lane (broadcast)
    add.u32 %r6, %r2, 200;
    mul.wide.u32 %rd8, %r6, 4;
    add.s64 %rd8, %rd1, %rd8;
    ld.global.u32 %r12, [%rd8];
    st.global.u32 [%rd5+8], %r12;
    // k3: odd lanes load A[2 t], even ones keep 7
    mov.u32 %r13, 7;
    and.b32 %r7, %r1, 1;
    setp.eq.u32 %p1, %r7, 1;
    mul.wide.u32 %rd9, %r1, 8;
    add.s64 %rd9, %rd1, %rd9;
    @%p1 ld.global.u32 %r13, [%rd9];
    st.global.u32 [%rd5+12], %r13;
    // k4: odd lanes B[t / 2 + 24 c], even ones A[t + 100]: one access over two allocations
    shr.u32 %r8, %r1, 1;
    mad.lo.u32 %r8, %r2, 24, %r8;
    mul.wide.u32 %rd10, %r8, 4;
    add.s64 %rd10, %rd2, %rd10;
    add.u32 %r9, %r1, 100;
    mul.wide.u32 %rd11, %r9, 4;
    add.s64 %rd11, %rd1, %rd11;
    selp.b64 %rd12, %rd10, %rd11, %p1;
    ld.global.u32 %r14, [%rd12];
    st.global.u32 [%rd5+16], %r14;
    // k5: shared word (5 t mod 48) after thread t stored A[t + 48 c] ^ 0x1234 at word t
    mov.u32 %r15, sw;
    shl.b32 %r16, %r1, 2;
    add.u32 %r17, %r15, %r16;
    mad.lo.u32 %r18, %r2, 48, %r1;
    mul.wide.u32 %rd13, %r18, 4;
    add.s64 %rd13, %rd1, %rd13;
    ld.global.u32 %r19, [%rd13];
    xor.b32 %r19, %r19, 0x1234;
    st.shared.u32 [%r17], %r19;
    bar.sync 0;
    mul.lo.u32 %r20, %r1, 5;
    rem.u32 %r20, %r20, 48;
    shl.b32 %r20, %r20, 2;
    add.u32 %r20, %r15, %r20;
    ld.shared.u32 %r21, [%r20];
    st.global.u32 [%rd5+20], %r21;
    // k6: shared word (7 t mod 48) through a generic address
    mul.lo.u32 %r22, %r1, 7;
    rem.u32 %r22, %r22, 48;
    shl.b32 %r22, %r22, 2;
    add.u32 %r22, %r15, %r22;
    cvt.u64.u32 %rd14, %r22;
    cvta.shared.u64 %rd15, %rd14;
    ld.u32 %r23, [%rd15];
    st.global.u32 [%rd5+24], %r23;
    // k7: byte (13 t mod 192) + 512 c of A, zero-extended
    mul.lo.u32 %r24, %r1, 13;
    rem.u32 %r24, %r24, 192;
    mad.lo.u32 %r24, %r2, 512, %r24;
    cvt.u64.u32 %rd16, %r24;
    add.s64 %rd16, %rd1, %rd16;
    ld.global.u8 %r25, [%rd16];
    st.global.u32 [%rd5+28], %r25;
    // k8: A[255 - t] through a generic address (lane 0 reads A's last word)
    sub.u32 %r26, 255, %r1;
    mul.wide.u32 %rd17, %r26, 4;
    add.s64 %rd17, %rd1, %rd17;
    ld.u32 %r27, [%rd17];
    st.global.u32 [%rd5+32], %r27;
    ret;
}
.visible .entry kf(.param .u64 pa, .param .u32 ps, .param .u64 po)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pa];
    ld.param.u32 %r1, [ps];
    ld.param.u64 %rd2, [po];
    mov.u32 %r2, %tid.x;
    shl.b32 %r3, %r2, 2;
    add.u32 %r3, %r3, %r1;
    cvt.u64.u32 %rd3, %r3;
    add.s64 %rd3, %rd1, %rd3;
    ld.global.u32 %r4, [%rd3];
    mul.wide.u32 %rd4, %r2, 4;
    add.s64 %rd4, %rd2, %rd4;
    st.global.u32 [%rd4], %r4;
    ret;
}
"#;

const BLOCK: u32 = 48;
const GRID: u32 = 2;
const N: usize = (BLOCK * GRID) as usize;
const OUTS: usize = 9;

fn rng() -> StdRng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

type Buf = Arc<emu::memory::Allocation>;

fn buf(mem: &GlobalMemory, words: &[u32]) -> Buf {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let b = mem.alloc(bytes.len() as u64, 0).unwrap();
    b.write_bytes(0, &bytes);
    b
}

fn words(b: &Buf, n: usize) -> Vec<u32> {
    let mut v = vec![0u8; 4 * n];
    b.read_bytes(0, &mut v);
    v.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The host reference of [`KERNEL`]'s `k`: `OUTS` words per thread.
fn reference(a: &[u32], b: &[u32]) -> Vec<u32> {
    let half = |i: usize| (a[i / 2] >> (16 * (i % 2))) as u16;
    let byte = |i: usize| (a[i / 4] >> (8 * (i % 4))) as u8;
    let mut out = Vec::with_capacity(N * OUTS);
    for g in 0..N {
        let (t, c) = (g % BLOCK as usize, g / BLOCK as usize);
        let odd = t % 2 == 1;
        let s = |w: usize| a[w + 48 * c] ^ 0x1234;
        out.extend([
            a[47 - t + 48 * c],
            half(3 * t % 48 + 96 * c) as i16 as i32 as u32,
            a[200 + c],
            if odd { a[2 * t] } else { 7 },
            if odd { b[t / 2 + 24 * c] } else { a[t + 100] },
            s(5 * t % 48),
            s(7 * t % 48),
            byte(13 * t % 192 + 512 * c) as u32,
            a[255 - t],
        ]);
    }
    out
}

fn module(mem: &GlobalMemory) -> LoadedModule {
    load::load_checked(mem, KERNEL, &["sm_90a"], "warp_ld_range test PTX")
}

fn run(
    m: &LoadedModule,
    mem: &GlobalMemory,
    (name, params): (&str, Vec<u8>),
    (grid, block): (u32, u32),
) -> Result<emu::LaunchStats, emu::EmuError> {
    let opts = LaunchOptions {
        threads: 2,
        ..Default::default()
    };
    let cfg = LaunchConfig::linear(grid, block);
    launch(m.kernel(name).unwrap(), mem.snapshot(), params, &cfg, &opts)
}

#[test]
fn range_resolved_loads_match_reference() {
    let mut r = rng();
    let mem = GlobalMemory::new();
    let a: Vec<u32> = (0..256).map(|_| r.gen()).collect();
    let b: Vec<u32> = (0..64).map(|_| r.gen()).collect();
    let (ba, bb) = (buf(&mem, &a), buf(&mem, &b));
    let out = buf(&mem, &vec![u32::MAX; N * OUTS]);
    let m = module(&mem);
    let params = [&ba, &bb, &out]
        .iter()
        .flat_map(|x| x.base.to_le_bytes())
        .collect();
    run(&m, &mem, ("k", params), (GRID, BLOCK)).unwrap_or_else(|e| panic!("launch: {e}"));
    let (got, want) = (words(&out, N * OUTS), reference(&a, &b));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "thread {} output k{}", i / OUTS, i % OUTS);
    }
}

#[test]
fn range_resolved_loads_keep_the_faulting_lane() {
    let mut r = rng();
    let mem = GlobalMemory::new();
    let a: Vec<u32> = (0..256).map(|_| r.gen()).collect();
    let ba = buf(&mem, &a);
    let out = buf(&mem, &[u32::MAX; 32]);
    let m = module(&mem);
    let launch_at = |shift: u32| {
        let mut p = ba.base.to_le_bytes().to_vec();
        p.extend(shift.to_le_bytes());
        p.extend([0u8; 4]);
        p.extend(out.base.to_le_bytes());
        run(&m, &mem, ("kf", p), (1, 32))
    };
    // the last lane reads A's last word: in bounds
    launch_at(4 * 224).unwrap_or_else(|e| panic!("launch: {e}"));
    assert_eq!(words(&out, 32), a[224..].to_vec());
    // one word further: the last lane is out of bounds
    let e = launch_at(4 * 225).unwrap_err();
    let s = e.to_string();
    assert!(
        matches!(
            e.fault(),
            Some(FaultKind::OutOfBounds {
                space: "global",
                ..
            })
        ),
        "{s}"
    );
    assert!(s.contains("thread (31,0,0)"), "{s}");
    // two bytes off: every lane misaligned, the first reported
    let e = launch_at(4 * 100 + 2).unwrap_err();
    let s = e.to_string();
    assert!(
        matches!(e.fault(), Some(FaultKind::Misaligned { size: 4, .. })),
        "{s}"
    );
    assert!(s.contains("thread (0,0,0)"), "{s}");
}
