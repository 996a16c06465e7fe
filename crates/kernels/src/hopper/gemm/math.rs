//! The math (consumer) warpgroups: per tile, the FP8 scale pointers, the K loop (wait for a
//! stage, one group of 4 `wgmma`, release the stage, promote FP8 products with their scales),
//! then the epilogue.

use super::sched::TileCoord;
use super::{epilogue, Gemm, BK_BYTES};
use crate::hopper::Layout;
use builder::*;

/// A math thread's registers: its place in the warpgroup, accumulators (and FP8's per-block
/// products), and the pipeline positions.
pub(super) struct MathThread {
    /// Thread index within the warpgroup, its warp and lane.
    pub wt: Reg<u32>,
    pub warp: Reg<u32>,
    pub lane: Reg<u32>,
    /// Lane % 4 (the fragment's column pair).
    q: Reg<u32>,
    /// BN/2 FP32 accumulators (the wgmma m64nBN fragment).
    pub acc: Vec<Reg<f32>>,
    /// FP8 only: one K block's products before promotion.
    tmp: Vec<Reg<f32>>,
    p_false: Reg<Pred>,
    p_true: Reg<Pred>,
    /// This thread's first row within the tile: 64*wg + 16*warp + lane/4 (second: +8).
    row_in_tile: Reg<u32>,
    /// Byte offset of this warpgroup's 64 A rows within a stage's A tile.
    a_row_off: Reg<u32>,
    st: PipeState,
    /// The stage of the previous K block (BF16 releases it one block late).
    prev: PipeState,
}

/// The rows and first column a math thread holds in a tile (fragment rows r0 and r0 + 8).
#[derive(Clone, Copy)]
pub(super) struct ThreadTile {
    pub tc: TileCoord,
    pub r0: Reg<u32>,
    pub r1: Reg<u32>,
    pub col0: Reg<u32>,
}

impl MathThread {
    fn new(k: &mut KernelBuilder, g: &Gemm) -> MathThread {
        let wt = k.warpgroup_thread();
        let warp = k.shr(wt, 5u32);
        let lane = k.and(wt, 31u32);
        let row = k.shr(lane, 2u32);
        let q = k.and(lane, 3u32);
        let nacc = (g.spec.bn / 2) as usize;
        let acc = k.reg_vec::<f32>(nacc);
        let tmp = if g.fp8() {
            k.reg_vec::<f32>(nacc)
        } else {
            Vec::new()
        };
        let zero = k.mov(0u32);
        let p_false = k.ne(zero, 0u32);
        let p_true = k.eq(zero, 0u32);
        let row_in_tile = {
            let x = k.mul(g.wg, 64u32);
            let y = k.mad_lo(warp, 16u32, x);
            k.add(y, row)
        };
        let a_row_off = k.mul(g.wg, 64 * BK_BYTES);
        if let Some(tm) = g.p.tmap_d {
            // each warpgroup's leader issues its TMA stores through tmap_d
            let lead = k.eq(wt, 0u32);
            k.if_(lead, |k| k.fence_proxy_tensormap_acquire(tm));
        }
        MathThread {
            wt,
            warp,
            lane,
            q,
            acc,
            tmp,
            p_false,
            p_true,
            row_in_tile,
            a_row_off,
            st: PipeState::new(k),
            prev: PipeState::new(k),
        }
    }
}

/// The math role (after `setmaxnreg.inc`).
pub(super) fn run(k: &mut KernelBuilder, g: &Gemm) {
    let m = MathThread::new(k, g);
    let s = g.sched;
    k.for_range(s.cta, s.num_tiles, s.ncta, |k, tile| {
        one_tile(k, g, &m, tile)
    });
    if g.spec.tma_store() {
        // the last tile's TMA store must finish before the CTA's shared memory goes
        let one = k.eq(m.wt, 0u32);
        k.if_(one, |k| k.cp_async_bulk_wait_group(0, false));
    }
}

/// One output tile: MMA over K and store, or (skipped tile) zeros for a contiguous padding
/// segment and nothing for masked rows.
fn one_tile(k: &mut KernelBuilder, g: &Gemm, m: &MathThread, tile: Reg<u32>) {
    let tc = g.sched.decode(k, g, tile);
    let r0 = k.add(tc.m0, m.row_in_tile);
    let r1 = k.add(r0, 8u32);
    let col0 = k.mad_lo(m.q, 2u32, tc.n0);
    let tt = ThreadTile { tc, r0, r1, col0 };
    k.if_else(
        tc.skip,
        |k| {
            if g.spec.layout == Layout::Contiguous {
                let z = k.mov(0.0f32);
                epilogue::store(k, g, m, &tt, &vec![z; m.acc.len()]);
            }
        },
        |k| {
            let sp = scale_ptrs(k, g, m, &tt);
            k.for_range(0u32, g.sched.num_kb, 1u32, |k, kb| k_block(k, g, m, sp, kb));
            if !g.fp8() {
                k.wgmma_wait_group(0);
                release(k, g, &m.prev);
            }
            epilogue::store(k, g, m, &tt, &m.acc);
        },
    );
}

/// One K block: scales (FP8), wait for the stage, MMA, release the stage, promote (FP8).
fn k_block(k: &mut KernelBuilder, g: &Gemm, m: &MathThread, sp: Option<ScalePtrs>, kb: Reg<u32>) {
    // scales first (global latency overlaps the barrier wait)
    let scales = sp.map(|sp| load_scales(k, g, sp, kb));
    g.smem.pipe.consumer_wait(k, &m.st);
    issue_wgmma(k, g, m, kb);
    k.wgmma_commit_group();
    if g.fp8() {
        // promotion needs this block's products: wait, release, promote
        k.wgmma_wait_group(0);
        release(k, g, &m.st);
    } else {
        // BF16 keeps one group in flight: once the previous block's group has completed, its
        // stage goes back to the producer
        k.wgmma_wait_group(1);
        let later = k.ne(kb, 0u32);
        k.if_(later, |k| release(k, g, &m.prev));
        k.mov_to(m.prev.stage, m.st.stage);
    }
    if let Some(s) = scales {
        promote(k, g.spec.bn, &m.acc, &m.tmp, &s);
    }
    m.st.advance(k, g.spec.stages);
}

/// The 4 `wgmma` of this stage (K-major SW128 descriptors advanced by 32 bytes): FP8 into
/// `tmp` (fresh every block), BF16 into `acc` (accumulating from the second block on).
fn issue_wgmma(k: &mut KernelBuilder, g: &Gemm, m: &MathThread, kb: Reg<u32>) {
    let (a_t, b_t) = g.smem.stage_tiles(k, m.st.stage);
    let a_base = k.add(a_t.base.reg(), m.a_row_off);
    let a_t = SmemTile {
        base: SharedPtr::from_reg(a_base).add_bytes(a_t.base.byte_offset()),
        rows: 64,
        ..a_t
    };
    let adesc = k.tile_desc(&a_t, 0, 0);
    let bdesc = k.tile_desc(&b_t, 0, 0);
    let sd0 = if g.fp8() { m.p_false } else { k.ne(kb, 0u32) };
    let bn = g.spec.bn as u16;
    k.wgmma_fence();
    for kk in 0..4u32 {
        let (ad, bd) = if kk == 0 {
            (adesc, bdesc)
        } else {
            (k.desc_add(adesc, 32 * kk), k.desc_add(bdesc, 32 * kk))
        };
        let sd = if kk == 0 { sd0 } else { m.p_true };
        if g.fp8() {
            k.wgmma_mma_async_fp8(bn, &m.tmp, ad, bd, sd, Fp8::E4m3, Fp8::E4m3);
        } else {
            k.wgmma_mma_async::<Bf16>(bn, &m.acc, ad, bd, sd, false, false);
        }
    }
}

/// Gives stage `s` back to the producer (with multicast: on both CTAs of the pair).
fn release(k: &mut KernelBuilder, g: &Gemm, s: &PipeState) {
    let pipe = g.smem.pipe;
    match g.rank {
        None => pipe.consumer_release(k, s),
        Some(_) => {
            pipe.consumer_release_cluster(k, s, 0u32);
            pipe.consumer_release_cluster(k, s, 1u32);
        }
    }
}

/// Per-tile scale pointers of the FP8 kernels: A's 1x128 scales of rows r0 / r1, B's block
/// scales from block `nb0`, and the tile's column offset inside its first B block.
#[derive(Clone, Copy)]
struct ScalePtrs {
    p0: GlobalPtr<f32>,
    p1: GlobalPtr<f32>,
    pb: GlobalPtr<f32>,
    nb0: Reg<u32>,
    rem: Reg<u32>,
}

/// FP8: the tile's scale pointers (rows clamped: rows past M are not stored), and the
/// accumulators zeroed. `None` for BF16.
fn scale_ptrs(
    k: &mut KernelBuilder,
    g: &Gemm,
    m: &MathThread,
    tt: &ThreadTile,
) -> Option<ScalePtrs> {
    let (sa, sb) = g.p.scales?;
    let sb_kb = g.sched.sb_kb;
    let last = k.sub(tt.tc.row_end, 1u32);
    let c0 = k.min(tt.r0, last);
    let c1 = k.min(tt.r1, last);
    let o0 = k.mul(c0, sb_kb);
    let o1 = k.mul(c1, sb_kb);
    let p0 = k.addr(sa.offset(o0));
    let p1 = k.addr(sa.offset(o1));
    let nb0 = k.shr(tt.tc.n0, 7u32);
    let gb = k.mad_lo(tt.tc.grp, g.sched.n_blocks, nb0);
    let ob = k.mul(gb, sb_kb);
    let pb = k.addr(sb.offset(ob));
    let rem = k.and(tt.tc.n0, 127u32);
    for r in &m.acc {
        k.mov_to(*r, 0.0f32);
    }
    Some(ScalePtrs {
        p0,
        p1,
        pb,
        nb0,
        rem,
    })
}

/// One K block's scales: A's of rows r0 / r1, and B's of the blocks the tile straddles.
struct Scales {
    s0: Reg<f32>,
    s1: Reg<f32>,
    sbs: Vec<Reg<f32>>,
    /// The tile's first column modulo 128.
    rem: Reg<u32>,
}

fn load_scales(k: &mut KernelBuilder, g: &Gemm, sp: ScalePtrs, kb: Reg<u32>) -> Scales {
    let s0 = k.ld_nc(sp.p0.offset(kb));
    let s1 = k.ld_nc(sp.p1.offset(kb));
    let mut sbs = Vec::new();
    for i in 0..g.spec.b_scale_blocks() {
        // clamp the block index to N/128 - 1
        let lastb = k.sub(g.sched.n_blocks, 1u32);
        let bi = k.add(sp.nb0, i);
        let bi = k.min(bi, lastb);
        let di = k.sub(bi, sp.nb0);
        let off = k.mad_lo(di, g.sched.sb_kb, kb);
        sbs.push(k.ld_nc(sp.pb.offset(off)));
    }
    Scales {
        s0,
        s1,
        sbs,
        rem: sp.rem,
    }
}

/// FP8 promotion: `acc[i] += tmp[i] * sa(row(i)) * sb(block(col(i)))`.
fn promote(k: &mut KernelBuilder, bn: u32, acc: &[Reg<f32>], tmp: &[Reg<f32>], s: &Scales) {
    let sbs = &s.sbs;
    for j in 0..bn / 8 {
        // which B scale block holds columns n0 + 8j .. +7 (n0 % 128 = rem)
        let sb = if sbs.len() == 1 {
            sbs[0]
        } else if bn % 128 == 0 {
            sbs[(8 * j / 128) as usize]
        } else {
            let mut cur = sbs[0];
            for (i, sbi) in sbs.iter().enumerate().skip(1) {
                let bound = 128 * i as i64 - 8 * j as i64;
                if bound <= 0 {
                    cur = *sbi;
                } else {
                    let p = k.ge(s.rem, bound as u32);
                    cur = k.selp(*sbi, cur, p);
                }
            }
            cur
        };
        let f0 = k.mul(s.s0, sb);
        let f1 = k.mul(s.s1, sb);
        for i in 0..4usize {
            let r = 4 * j as usize + i;
            let f = if i < 2 { f0 } else { f1 };
            k.fma_to(acc[r], tmp[r], f, acc[r]);
        }
    }
}
