//! Hopper producer/consumer GEMM tile: one CTA computes `c = a * b^T` for a 64 x 64 tile with
//! BF16 inputs and f32 accumulation (sm_90a).
//!
//! - A producer warp (warp 4; one elected thread) walks K in 64-element blocks: it waits until
//!   the consumers freed a stage of a 2-stage shared-memory ring (`empty` mbarrier), arms the
//!   stage's `full` mbarrier with the bytes to expect and issues two TMA loads (a 64 x 64 box of
//!   `a` and of `b`, 128-byte swizzled) completing on it.
//! - A consumer warpgroup (warps 0-3) waits on `full`, runs 4 `wgmma.m64n64k16` over the stage
//!   (shared-memory descriptors advanced 32 bytes per K step), waits for them, releases the stage
//!   on `empty` and finally stores its accumulator fragment to `c`.
//!
//! `a` is 64 x K and `b` 64 x K, both row-major (K-major operands); `c` is 64 x 64 row-major.
//! The tensor maps are passed as device addresses of 128-byte map objects (`u64` parameters).
//!
//! `cargo run --example tma_wgmma -p builder` (the emulator is an sm_90a part;
//! `PTXFORGE_DEVICE=cuda` for an sm_90a GPU, which is not tested here). Exits nonzero on
//! a mismatch.

use builder::*;
use rand::{Rng, SeedableRng};
use runtime::half::bf16;
use runtime::tensor_map::{Swizzle as MapSwizzle, TensorDataType};
use runtime::{Backend, Device, LaunchConfig, TensorMap};
use std::error::Error;

/// Rows of the tile (one wgmma M) and its columns (the wgmma N).
pub const M: u32 = 64;
pub const N: u32 = 64;
/// K elements per stage: one 128-byte swizzle row of BF16.
pub const BK: u32 = 64;
/// Depth of the shared-memory ring.
pub const STAGES: u32 = 2;
/// 128 consumer threads (one warpgroup) + one producer warp.
pub const THREADS: u32 = 160;
/// Bytes of one stage: the A box then the B box.
const TILE_BYTES: u32 = M * BK * 2;
const STAGE_BYTES: u32 = 2 * TILE_BYTES;

/// Signature: tensor map of `a`, tensor map of `b`, `c`, K.
pub type TmaWgmma = TypedKernel<(u64, u64, GlobalPtr<f32>, u32)>;

/// What both roles share: the ring, stage 0's tiles and the loop bound.
#[derive(Clone, Copy)]
struct Ring {
    pipe: Pipeline,
    a0: SmemTile,
    b0: SmemTile,
    num_kb: Reg<u32>,
}

impl Ring {
    /// The A and B tiles of stage `stage`.
    fn tiles(&self, k: &mut KernelBuilder, stage: Reg<u32>) -> (SmemTile, SmemTile) {
        let base = k.mad_lo(stage, STAGE_BYTES, self.a0.base.reg());
        (self.a0.rebase(base), self.b0.rebase(base))
    }
}

/// The producer: one thread issues every stage's two TMA loads.
fn producer(k: &mut KernelBuilder, r: &Ring, maps: [Reg<u64>; 2]) {
    for m in maps {
        k.fence_proxy_tensormap_acquire(m);
    }
    let st = PipeState::new(k);
    k.for_range(0u32, r.num_kb, 1u32, |k, kb| {
        r.pipe.producer_acquire(k, &st);
        let bar = r.pipe.producer_commit_tx(k, &st, STAGE_BYTES);
        let (a_t, b_t) = r.tiles(k, st.stage);
        let kx = k.mul(kb, BK);
        let kx = k.bitcast::<i32, u32>(kx);
        k.tma_load_2d(a_t.base, maps[0], kx, 0i32, bar);
        k.tma_load_2d(b_t.base, maps[1], kx, 0i32, bar);
        st.advance(k, STAGES);
    });
}

/// The consumer warpgroup: wgmma over every stage into `acc`, then the store to `c`.
fn consumer(k: &mut KernelBuilder, r: &Ring, acc: &[Reg<f32>], c: GlobalPtr<f32>) {
    let st = PipeState::new(k);
    let zero = k.mov(0u32);
    let p_true = k.eq(zero, 0u32);
    k.for_range(0u32, r.num_kb, 1u32, |k, _| {
        r.pipe.consumer_wait(k, &st);
        let (a_t, b_t) = r.tiles(k, st.stage);
        let (ad, bd) = (k.tile_desc(&a_t, 0, 0), k.tile_desc(&b_t, 0, 0));
        k.wgmma_fence();
        for kk in 0..BK / 16 {
            let (a, b) = (k.desc_add(ad, 32 * kk), k.desc_add(bd, 32 * kk));
            k.wgmma_mma_async::<Bf16>(N as u16, acc, a, b, p_true, false, false);
        }
        k.wgmma_commit_group();
        k.wgmma_wait_group(0);
        r.pipe.consumer_release(k, &st);
        st.advance(k, STAGES);
    });
    store(k, acc, c);
}

/// The m64nN accumulator fragment: warp `w`, lane (`g` = lane / 4, `t` = lane % 4) holds, for
/// each 8-column block `j`, rows `16w + g` and `+8`, columns `8j + 2t` and `+1`.
fn store(k: &mut KernelBuilder, acc: &[Reg<f32>], c: GlobalPtr<f32>) {
    let (tid, lane) = (k.tid_x(), k.lane_id());
    let w = k.shr(tid, 5u32);
    let (g, t) = (k.shr(lane, 2u32), k.and(lane, 3u32));
    let row = k.mad_lo(w, 16u32, g);
    let col = k.shl(t, 1u32);
    let i = k.mad_lo(row, N, col);
    let p = k.addr(c.offset(i));
    for (j, f) in acc.chunks(4).enumerate() {
        let o = 8 * j as i64;
        let r8 = (8 * N) as i64;
        for (e, off) in [o, o + 1, o + r8, o + r8 + 1].into_iter().enumerate() {
            k.st(p.at(off), f[e]);
        }
    }
}

/// `c[i][j] = sum_k a[i][k] * b[j][k]` for a 64 x 64 tile; K a multiple of 64. Launch one CTA
/// of `THREADS` threads with [`shared_bytes`] of dynamic shared memory.
pub fn tma_wgmma(t: Target) -> Result<TmaWgmma, BuildError> {
    let kb = KernelBuilder::new("tma_wgmma_bf16", t).typed();
    let (kb, map_a) = kb.param::<u64>("tmap_a");
    let (kb, map_b) = kb.param::<u64>("tmap_b");
    let (kb, c) = kb.param::<GlobalPtr<f32>>("c");
    let (mut k, kdim) = kb.param::<u32>("k");
    k.reqntid(&[THREADS]);
    let mut layout = SmemLayout::new(&mut k);
    let a0 = layout.tile(M, BK * 2, SmemSwizzle::B128);
    let b0 = layout.tile(N, BK * 2, SmemSwizzle::B128);
    layout.reserve(STAGE_BYTES * (STAGES - 1), 1024);
    let pipe = Pipeline::new(&mut layout, STAGES);
    let num_kb = k.shr(kdim, BK.trailing_zeros());
    let ring = Ring {
        pipe,
        a0,
        b0,
        num_kb,
    };
    let tid = k.tid_x();
    let leader = k.eq(tid, 0u32);
    // full: the producer's one arrive (+ the TMA bytes); empty: all 128 consumer threads
    pipe.init(&mut k, leader, 1, 128);
    let acc: Vec<Reg<f32>> = (0..N / 2).map(|_| k.mov(0.0f32)).collect();
    let is_producer = k.ge(tid, 128u32);
    k.if_else(
        is_producer,
        |k| {
            let elected = k.eq(tid, 128u32);
            k.if_(elected, |k| producer(k, &ring, [map_a, map_b]));
        },
        |k| consumer(k, &ring, &acc, c),
    );
    k.finish()
}

/// Dynamic shared memory the kernel needs: the ring and its barriers.
pub fn shared_bytes() -> u32 {
    STAGE_BYTES * STAGES + 2 * STAGES * 8
}

/// The 128-byte tensor map of a `rows x cols` row-major BF16 matrix at `addr`, read in
/// 64 x 64 boxes with the 128-byte swizzle the wgmma descriptors assume.
fn map(dev: &Device, addr: u64, rows: u32, cols: u32) -> runtime::Result<[u8; 128]> {
    let mut t = TensorMap::tiled(
        TensorDataType::BF16,
        addr,
        &[cols as u64, rows as u64],
        &[BK, 64],
    );
    t.swizzle = MapSwizzle::B128;
    match dev.backend() {
        Backend::Emu => t.encode_emu(),
        _ => t.encode_cuda(),
    }
}

/// `emu` (default) or the device named by `PTXFORGE_DEVICE` (`cuda`, `cuda:1`, `emu:3`).
fn device() -> runtime::Result<Device> {
    Device::from_name(&std::env::var("PTXFORGE_DEVICE").unwrap_or_else(|_| "emu".into()))
}

pub fn main() -> Result<(), Box<dyn Error>> {
    let kd = 4 * BK as usize; // 4 K blocks: the 2-stage ring wraps twice
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut rand_bf16 = |len: usize| -> Vec<bf16> {
        (0..len)
            .map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0)))
            .collect()
    };
    let (m, n) = (M as usize, N as usize);
    let (a, b) = (rand_bf16(m * kd), rand_bf16(n * kd));

    let dev = device()?;
    let f = dev.load_kernel(&tma_wgmma(Target::sm90a())?)?;
    let (a_buf, b_buf) = (dev.upload(&a)?, dev.upload(&b)?);
    let c_buf = dev.upload(&vec![f32::NAN; m * n])?; // poisoned: every element must be written
    let mut maps = map(&dev, a_buf.device_ptr(), M, kd as u32)?.to_vec();
    maps.extend(map(&dev, b_buf.device_ptr(), N, kd as u32)?);
    let maps = dev.upload(&maps)?;
    let (map_a, map_b) = (maps.device_ptr(), maps.device_ptr() + 128);
    let stream = dev.default_stream();
    let cfg = LaunchConfig {
        shared_bytes: shared_bytes(),
        ..LaunchConfig::linear(1, THREADS)
    };
    stream.launch_typed(&f, &cfg, (map_a, map_b, &c_buf, kd as u32))?;
    let c = stream.read(&c_buf)?;

    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..kd)
                .map(|p| a[i * kd + p].to_f64() * b[j * kd + p].to_f64())
                .sum();
            let got = c[i * n + j] as f64;
            if got.is_nan() || (got - want).abs() > 1e-4 * (kd as f64).sqrt() {
                return Err(format!("c[{i}][{j}] = {got}, expected {want}").into());
            }
        }
    }
    println!("tma_wgmma: 64x64x{kd} BF16 tile (TMA ring + wgmma) matches the f64 host reference");
    Ok(())
}
