//! Tiled tensor-core GEMM: `c = a * b^T` with BF16 inputs and f32 accumulation, through
//! shared-memory tiles and `mma.sync.m16n8k16`.
//!
//! `a` is M x K and `b` is N x K, both row-major (K contiguous: the "NT" layout `mma`'s
//! `.row.col` wants); `c` is M x N row-major. Each CTA of 4 warps computes a 32 x 32 tile of
//! `c`, stepping through K 32 at a time: all 128 threads copy the A and B tiles into shared
//! memory (32-bit words, rows padded to 20 words so fragment reads are bank-conflict free),
//! then each warp runs 2 x 2 `mma`s per K step on its 16 x 16 quarter.
//!
//! `cargo run --example mma_gemm -p builder` (emulator; `PTXFORGE_DEVICE=cuda` for a GPU).
//! Exits nonzero on a mismatch.

use builder::*;
use rand::{Rng, SeedableRng};
use runtime::half::bf16;
use runtime::{Device, LaunchConfig};
use std::error::Error;

/// CTA tile of `c` (rows and columns) and the K step.
pub const TILE: u32 = 32;
/// Threads per CTA (4 warps, 2 x 2 over the tile).
pub const THREADS: u32 = 128;
/// Shared-memory row stride in 32-bit words: 16 words of data, 4 of padding.
const ROW_WORDS: u32 = 20;

/// The kernel's signature: `a`, `b`, `c`, `n`, `k` (M is the grid's y extent times 32).
pub type MmaGemm = TypedKernel<(GlobalPtr<Bf16>, GlobalPtr<Bf16>, GlobalPtr<f32>, u32, u32)>;

/// Copies one 32 x 32 BF16 tile (rows `row0..row0+32`, words `kw0..kw0+16` of each row of
/// `src`, `kw` words per row) into `dst` (`ROW_WORDS` words per row): 4 words per thread.
fn load_tile(k: &mut KernelBuilder, src: GlobalPtr<Bf16x2>, dst: SharedPtr<Bf16x2>, at: TileAt) {
    k.unroll(TILE * TILE / 2 / THREADS, |k, j| {
        let idx = k.add(at.tid, j * THREADS);
        let (r, w) = (k.shr(idx, 4u32), k.and(idx, 15u32));
        let grow = k.add(at.row0, r);
        let gcol = k.add(at.kw0, w);
        let gi = k.mad_lo(grow, at.kw, gcol);
        let si = k.mad_lo(r, ROW_WORDS, w);
        let v = k.ld(src.offset(gi));
        k.st(dst.offset(si), v);
    });
}

/// Where a tile copy reads from: the thread, the tile's first row and word, words per row.
#[derive(Clone, Copy)]
struct TileAt {
    tid: Reg<u32>,
    row0: Reg<u32>,
    kw0: Reg<u32>,
    kw: Reg<u32>,
}

/// The warp's fragments of one k16 step and the two n8 `mma`s into `acc`.
/// `fa`/`fb` point at this lane's first A / B word of the step (row `g`, word `tg`).
fn mma_step(
    k: &mut KernelBuilder,
    fa: SharedPtr<Bf16x2>,
    fb: SharedPtr<Bf16x2>,
    acc: &[[Reg<f32>; 4]; 2],
) {
    let r8 = (8 * ROW_WORDS) as i64;
    let a = [
        k.ld(fa),
        k.ld(fa.at(r8)),
        k.ld(fa.at(4)),
        k.ld(fa.at(r8 + 4)),
    ];
    for (j, c) in acc.iter().enumerate() {
        let fbj = fb.at(j as i64 * r8);
        let b = [k.ld(fbj), k.ld(fbj.at(4))];
        k.mma_to::<M16N8K16Bf16>(*c, a, b, *c);
    }
}

/// `c[i][j] = sum_k a[i][k] * b[j][k]`; needs N and K multiples of 32, grid (N/32, M/32).
pub fn mma_gemm(t: Target) -> Result<MmaGemm, BuildError> {
    let kb = KernelBuilder::new("mma_gemm_bf16", t).typed();
    let (kb, a) = kb.param::<GlobalPtr<Bf16>>("a");
    let (kb, b) = kb.param::<GlobalPtr<Bf16>>("b");
    let (kb, c) = kb.param::<GlobalPtr<f32>>("c");
    let (kb, n) = kb.param::<u32>("n");
    let (mut k, kdim) = kb.param::<u32>("k");
    k.reqntid(&[THREADS]);
    let words = (TILE * ROW_WORDS) as u64;
    let (sa, sb) = (
        k.shared_array::<Bf16x2>(words, 16),
        k.shared_array::<Bf16x2>(words, 16),
    );
    let tid = k.tid_x();
    let (warp, lane) = (k.shr(tid, 5u32), k.and(tid, 31u32));
    let (g, tg) = (k.shr(lane, 2u32), k.and(lane, 3u32));
    let (wm, wn) = (k.shr(warp, 1u32), k.and(warp, 1u32));
    let (cy, cx) = (k.ctaid_y(), k.ctaid_x());
    let (m0, n0) = (k.mul(cy, TILE), k.mul(cx, TILE));
    let kw = k.shr(kdim, 1u32);
    // This lane's fragment rows: A row wm*16+g, B row (= column of c) wn*16+g.
    let ra = k.mad_lo(wm, 16u32, g);
    let rb = k.mad_lo(wn, 16u32, g);
    let ia = k.mad_lo(ra, ROW_WORDS, tg);
    let ib = k.mad_lo(rb, ROW_WORDS, tg);
    let (fa, fb) = (k.addr(sa.offset(ia)), k.addr(sb.offset(ib)));
    let acc: [[Reg<f32>; 4]; 2] = [[(); 4]; 2].map(|r| r.map(|_| k.mov(0.0f32)));
    k.for_range(0u32, kw, TILE / 2, |k, kw0| {
        let at = TileAt {
            tid,
            row0: m0,
            kw0,
            kw,
        };
        load_tile(k, a.cast(), sa, at);
        load_tile(k, b.cast(), sb, TileAt { row0: n0, ..at });
        k.bar_sync(0u32);
        k.unroll(TILE / 16, |k, s| {
            mma_step(k, fa.at(8 * s as i64), fb.at(8 * s as i64), &acc)
        });
        k.bar_sync(0u32);
    });
    // c fragment: (row g, cols 2tg, 2tg+1) in acc[j][0..2], row g+8 in acc[j][2..4].
    let row = k.add(m0, ra);
    let col = k.add(n0, rb);
    let col = k.sub(col, g);
    let col = k.mad_lo(tg, 2u32, col);
    let ci = k.mad_lo(row, n, col);
    let pc = k.addr(c.offset(ci));
    let r8 = k.mul(n, 8u32);
    let pc8 = k.addr(pc.offset(r8));
    for (j, f) in acc.iter().enumerate() {
        let o = 8 * j as i64;
        k.st(pc.at(o), f[0]);
        k.st(pc.at(o + 1), f[1]);
        k.st(pc8.at(o), f[2]);
        k.st(pc8.at(o + 1), f[3]);
    }
    k.finish()
}

/// `emu` (default) or the device named by `PTXFORGE_DEVICE` (`cuda`, `cuda:1`, `emu:3`).
fn device() -> runtime::Result<Device> {
    Device::from_name(&std::env::var("PTXFORGE_DEVICE").unwrap_or_else(|_| "emu".into()))
}

pub fn main() -> Result<(), Box<dyn Error>> {
    let (m, n, kd) = (64usize, 96usize, 128usize);
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut rand_bf16 = |len: usize| -> Vec<bf16> {
        (0..len)
            .map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0)))
            .collect()
    };
    let (a, b) = (rand_bf16(m * kd), rand_bf16(n * kd));

    let dev = device()?;
    let f = dev.load_kernel(&mma_gemm(Target::sm80())?)?;
    let (a_buf, b_buf) = (dev.upload(&a)?, dev.upload(&b)?);
    let c_buf = dev.upload(&vec![f32::NAN; m * n])?; // poisoned: every element must be written
    let stream = dev.default_stream();
    let cfg = LaunchConfig {
        grid: [(n / TILE as usize) as u32, (m / TILE as usize) as u32, 1],
        ..LaunchConfig::linear(1, THREADS)
    };
    stream.launch_typed(&f, &cfg, (&a_buf, &b_buf, &c_buf, n as u32, kd as u32))?;
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
    println!("mma_gemm: {m}x{n}x{kd} BF16 GEMM matches the f64 host reference");
    Ok(())
}
