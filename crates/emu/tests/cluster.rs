//! Clusters: distributed shared memory through `mapa`, `barrier.cluster`, cluster special
//! registers, and TMA multicast into both CTAs of a cluster.

use emu::hopper::{Swizzle, TensorMapDesc, TmaType};
use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};

const DSMEM: &str = r#"
.version 8.0
.target sm_90
.address_size 64
.shared .align 16 .b8 buf[512];
.visible .entry dsmem(.param .u64 out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %cluster_ctarank;
    mov.u32 %r3, %ctaid.x;
    // buf[tid] = ctaid * 1000 + tid
    mad.lo.u32 %r4, %r3, 1000, %r1;
    shl.b32 %r5, %r1, 2;
    mov.u32 %r6, buf;
    add.u32 %r7, %r6, %r5;
    st.shared.u32 [%r7], %r4;
    barrier.cluster.arrive.release.aligned;
    barrier.cluster.wait.acquire.aligned;
    // read the other CTA's buf[tid] through distributed shared memory
    xor.b32 %r8, %r2, 1;
    mapa.shared::cluster.u32 %r9, %r7, %r8;
    ld.shared::cluster.u32 %r10, [%r9];
    // out[ctaid * 128 + tid] = peer value; out[512 + ctaid] = nctarank * 100 + rank
    mad.lo.u32 %r11, %r3, 128, %r1;
    mul.wide.u32 %rd2, %r11, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r10;
    setp.eq.u32 %p1, %r1, 0;
    mov.u32 %r12, %cluster_nctarank;
    mad.lo.u32 %r13, %r12, 100, %r2;
    mul.wide.u32 %rd4, %r3, 4;
    add.s64 %rd5, %rd1, %rd4;
    @%p1 st.global.u32 [%rd5+2048], %r13;
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    ret;
}
"#;

#[test]
fn distributed_shared_memory_and_cluster_barrier() {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(DSMEM).unwrap(), 0).unwrap();
    let out = mem.alloc(4 * (512 + 4), 0).unwrap();
    out.fill(0, 4 * 516, &[0xff]);
    let cfg = LaunchConfig {
        cluster: [2, 1, 1],
        ..LaunchConfig::linear(4, 128)
    };
    launch(
        m.kernel("dsmem").unwrap(),
        mem.snapshot(),
        out.base.to_le_bytes().to_vec(),
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut b = vec![0u8; 4 * 516];
    out.read_bytes(0, &mut b);
    let w = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
    for cta in 0..4usize {
        let peer = cta ^ 1;
        for t in 0..128usize {
            assert_eq!(
                w(cta * 128 + t),
                (peer * 1000 + t) as u32,
                "cta {cta} thread {t}"
            );
        }
        assert_eq!(
            w(512 + cta),
            200 + (cta % 2) as u32,
            "cluster rank of cta {cta}"
        );
    }
}

const MULTICAST: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
.visible .entry mc(.param .u64 tmap, .param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    .reg .b16 %rs<2>;
    ld.param.u64 %rd1, [tmap];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %cluster_ctarank;
    mov.u32 %r3, smem;
    add.u32 %r4, %r3, 2048;           // mbarrier after a 2 KiB tile
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared::cta.b64 [%r4], 1;
    @%p1 mbarrier.arrive.expect_tx.shared::cta.b64 %rd3, [%r4], 2048;
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    // rank 0 loads the tile once and multicasts it to both CTAs
    setp.eq.u32 %p2, %r2, 0;
    and.pred %p3, %p1, %p2;
    mov.u16 %rs1, 3;
    mov.u32 %r5, 0;
    @%p3 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%r3], [%rd1, {%r5, %r5}], [%r4], %rs1;
W:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r4], 0;
    @!%p2 bra W;
    // each thread copies 16 bytes of its CTA's tile to out[ctaid]
    mov.u32 %r6, %ctaid.x;
    shl.b32 %r7, %r1, 4;
    add.u32 %r8, %r3, %r7;
    ld.shared.v4.u32 {%r9, %r10, %r11, %r12}, [%r8];
    mad.lo.u32 %r13, %r6, 2048, %r7;
    cvt.u64.u32 %rd4, %r13;
    add.s64 %rd5, %rd2, %rd4;
    st.global.v4.u32 [%rd5], {%r9, %r10, %r11, %r12};
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    ret;
}
"#;

#[test]
fn tma_multicast_reaches_both_ctas() {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(MULTICAST).unwrap(), 0).unwrap();
    // 32 x 32 u16 tensor, box = whole tensor (2 KiB), no swizzle.
    let g = mem.alloc(2048, 0).unwrap();
    let data: Vec<u8> = (0..1024u32)
        .flat_map(|i| ((i * 7 + 3) as u16).to_le_bytes())
        .collect();
    g.write_bytes(0, &data);
    let desc = TensorMapDesc {
        dtype: TmaType::U16,
        rank: 2,
        global_address: g.base,
        dims: [32, 32, 0, 0, 0],
        strides: [64, 0, 0, 0],
        box_dims: [32, 32, 0, 0, 0],
        elem_strides: [1; 5],
        swizzle: Swizzle::None,
        oob_nan: false,
        interleave: 0,
        im2col: None,
    };
    let tm = mem.alloc(128, 0).unwrap();
    tm.write_bytes(0, &desc.to_bytes());
    let out = mem.alloc(4096, 0).unwrap();
    out.fill(0, 4096, &[0xcc]);
    let mut p = tm.base.to_le_bytes().to_vec();
    p.extend_from_slice(&out.base.to_le_bytes());
    let cfg = LaunchConfig {
        cluster: [2, 1, 1],
        shared_bytes: 2048 + 16,
        ..LaunchConfig::linear(2, 128)
    };
    launch(
        m.kernel("mc").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut o = vec![0u8; 4096];
    out.read_bytes(0, &mut o);
    assert_eq!(&o[..2048], &data[..], "rank 0 tile");
    assert_eq!(&o[2048..], &data[..], "rank 1 tile (multicast)");
}
