//! TMA: `cp.async.bulk.tensor.2d` completing on an mbarrier, with 128-byte swizzle and
//! out-of-bounds fill, checked element by element against the tensor-map definition. Also checks
//! that data is not visible before the barrier completes (stale read before waiting).

use emu::hopper::{Swizzle, TensorMapDesc, TmaType};
use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};

const K: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
.visible .entry tma(.param .u64 tmap, .param .u64 out, .param .u64 early, .param .u32 c0, .param .u32 c1)
{
    .reg .pred %p<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [tmap];
    ld.param.u64 %rd2, [out];
    ld.param.u64 %rd9, [early];
    ld.param.u32 %r10, [c0];
    ld.param.u32 %r11, [c1];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, smem;
    add.u32 %r3, %r2, 8192;          // mbarrier after the 8 KiB tile
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared::cta.b64 [%r3], 1;
    bar.sync 0;
    @%p1 mbarrier.arrive.expect_tx.shared::cta.b64 %rd3, [%r3], 8192;
    @%p1 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r2], [%rd1, {%r10, %r11}], [%r3];
    // Read before waiting: must still see the old contents (zero).
    shl.b32 %r4, %r1, 2;
    add.u32 %r5, %r2, %r4;
    ld.shared.u32 %r6, [%r5];
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %rd9, %rd4;
    st.global.u32 [%rd5], %r6;
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r3], 0;
    @!%p2 bra WAIT;
    // Copy the 8 KiB tile out as stored (swizzled), 64 words per thread.
    mov.u32 %r7, 0;
LOOP:
    shl.b32 %r8, %r7, 7;
    add.u32 %r8, %r8, %r1;          // word index = i*128 + tid
    shl.b32 %r9, %r8, 2;
    add.u32 %r12, %r2, %r9;
    ld.shared.u32 %r13, [%r12];
    mul.wide.u32 %rd6, %r8, 4;
    add.s64 %rd7, %rd2, %rd6;
    st.global.u32 [%rd7], %r13;
    add.u32 %r7, %r7, 1;
    setp.lt.u32 %p3, %r7, 16;
    @%p3 bra LOOP;
    ret;
}
"#;

#[test]
fn tma_tile_with_swizzle_and_oob_fill() {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(K).unwrap(), 0).unwrap();
    // Global tensor: 100 rows x 80 cols of u16 (row pitch 160 bytes, padded to 192).
    let (rows, cols, pitch) = (100usize, 80usize, 192usize);
    let g = mem.alloc((rows * pitch) as u64, 0).unwrap();
    let mut data = vec![0u8; rows * pitch];
    for r in 0..rows {
        for c in 0..cols {
            let v = (r * 1000 + c * 7 + 1) as u16;
            data[r * pitch + 2 * c..r * pitch + 2 * c + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    g.write_bytes(0, &data);
    // Box: 64 cols (128 bytes) x 64 rows, starting at (c0, c1) = (40, 60): overhangs both ends.
    let desc = TensorMapDesc {
        dtype: TmaType::U16,
        rank: 2,
        global_address: g.base,
        dims: [cols as u32, rows as u32, 0, 0, 0],
        strides: [pitch as u64, 0, 0, 0],
        box_dims: [64, 64, 0, 0, 0],
        elem_strides: [1, 1, 1, 1, 1],
        swizzle: Swizzle::B128,
        oob_nan: false,
        interleave: 0,
        im2col: None,
    };
    let tm = mem.alloc(128, 0).unwrap();
    tm.write_bytes(0, &desc.to_bytes());
    let out = mem.alloc(8192, 0).unwrap();
    out.fill(0, 8192, &[0xee]);
    let early = mem.alloc(512, 0).unwrap();
    early.fill(0, 512, &[0xee]);
    let (c0, c1) = (40u32, 60u32);
    let mut p = Vec::new();
    for v in [tm.base, out.base, early.base] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p.extend_from_slice(&c0.to_le_bytes());
    p.extend_from_slice(&c1.to_le_bytes());
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [128, 1, 1],
        shared_bytes: 8192 + 64,
        sms: 1,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    launch(
        m.kernel("tma").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut e = vec![0u8; 512];
    early.read_bytes(0, &mut e);
    // The issuing warp reads right after issuing, before anyone observed the barrier: stale.
    // (Other warps may legitimately see the tile once a waiter has observed completion.)
    assert!(
        e[..128].iter().all(|&b| b == 0),
        "tile visible before the mbarrier completed"
    );
    let mut o = vec![0u8; 8192];
    out.read_bytes(0, &mut o);
    for r in 0..64usize {
        for c in 0..64usize {
            // 128B swizzle: 16-byte chunk index XOR (row % 8).
            let lin = r * 128 + 2 * c;
            let phys = lin ^ (((lin >> 7) & 7) << 4);
            let got = u16::from_le_bytes([o[phys], o[phys + 1]]);
            let (gr, gc) = (c1 as usize + r, c0 as usize + c);
            let want = if gr < rows && gc < cols {
                (gr * 1000 + gc * 7 + 1) as u16
            } else {
                0
            };
            assert_eq!(got, want, "box ({r},{c})");
        }
    }
}
