//! The sm_90a GEMM generator: persistent, warp-specialised, TMA + mbarrier pipeline + wgmma.
//!
//! CTA = `math_wgs` math warpgroups (64 rows of the BM = 64 * math_wgs tile each) + one TMA
//! producer warpgroup (the last one). Roles get their registers with `setmaxnreg` (producer 40,
//! math 232 by default). The grid is persistent (at most one CTA per SM); every CTA walks the
//! output tiles `blockIdx.x, blockIdx.x + gridDim.x, ...` in a rasterised order (groups of
//! [`RASTER_GROUP`] M-blocks sweep N together, so a B tile is reused from L2 by neighbouring
//! CTAs and the A rows of a group stay hot). Producer and consumers walk the same sequence.
//!
//! Per K block (128 bytes of K: 128 e4m3 or 64 bf16) and stage of the `stages`-deep ring:
//! the producer waits on `empty[s]`, arrives on `full[s]` with the transaction bytes and issues
//! two 2-D TMA loads (A box [128 B, BM] and B box [128 B, BN], 128-byte swizzle); the math
//! warpgroups wait on `full[s]`, issue 4 `wgmma` (m64nBNk32 e4m3 or m64nBNk16 bf16, K-major
//! SW128 descriptors advanced by 32 bytes) as one group. FP8 waits for the group, releases
//! `empty[s]` and promotes; BF16 accumulates in the wgmma registers and keeps one group in
//! flight (`wgmma.wait_group 1`), releasing the previous block's stage once its group is done
//! (the emulator stops with a diagnostic if a TMA write lands on operands of a group still in
//! flight, so releasing too early fails the tests). FP8 promotion:
//! `acc += tmp * (sa[row] * sb[nblock])` with the per-row 1x128 scales of A and the 128x128
//! block scales of B, read from global memory before waiting on the stage.
//! BN need not divide 128 (any multiple of 8 up to 256): a tile then straddles two or three B
//! scale blocks, chosen per 8-column accumulator chunk.
//!
//! Tensor maps arrive as pointers into global memory written by host copies, so every thread
//! that issues TMA through one first executes `fence.proxy.tensormap::generic.acquire.sys`.
//!
//! Epilogue (normal and contiguous layouts, DeepGEMM's choice): each math warpgroup converts its
//! 64 x BN accumulators to BF16 (contiguous padding rows zeroed), writes them into its own
//! shared staging buffer with `stmatrix.x4` (the accumulator fragment is the `stmatrix` m8n8
//! fragment), fences the generic proxy against the async proxy, and one thread issues 2-D TMA
//! tensor stores (`cp.async.bulk.tensor.2d.global.shared::cta.bulk_group`) that the tensor map
//! clips to M x N. The staging buffer is split into column panels as wide as the largest TMA
//! swizzle span dividing a BN row (128, 64 or 32 bytes; DeepGEMM's choice), each stored with that
//! swizzle by its own TMA box, so `stmatrix` writes are free of bank conflicts (checked by the
//! emulator's bank profiler in `kernels/tests/banks.rs`). The store runs while the warpgroup starts the next tile; the staging buffer is
//! reused only after `cp.async.bulk.wait_group.read 0` and a warpgroup barrier (named barrier
//! 1 + warpgroup). Masked layout: direct `st.global.b32` of bf16x2 pairs guarded by the row
//! bound, since rows past `masked_m[g]` must stay untouched (a TMA box would overwrite them).
//!
//! Multicast (`multicast_a`, cluster of 2 along N): CTA pairs share the M block; each CTA loads
//! half of the A box and multicasts it to both, and consumers release the stage on both CTAs'
//! `empty` barriers. The tile decoder rasterises over N-pairs so the two CTAs of a cluster always
//! work on the same M block (N must give an even number of tiles). Tested on the emulator
//! (clusters, distributed shared memory, TMA multicast) and assembled by ptxas.

use super::HopperSpec;
use crate::gemm::{InTy, Layout};
use crate::{shape_err, Result};
use builder::hopper::Swizzle;
use builder::*;

/// M-blocks per rasterisation group.
pub const RASTER_GROUP: u32 = 8;
/// Bytes of K per pipeline stage (one 128-byte swizzle row).
pub const BK_BYTES: u32 = 128;

/// Generates the kernel of `spec` for `t` (sm_90a only).
pub fn gen_hopper_gemm(t: &Target, spec: &HopperSpec) -> Result<ptx::Module> {
    crate::host::check_target(&spec.name(), t, super::TARGETS)?;
    spec.validate()?;
    let name = spec.name();
    let fp8 = spec.input == InTy::Fp8;
    let wgs = spec.math_wgs;
    let bm = spec.bm();
    let bn = spec.bn;
    let stages = spec.stages;
    let threads = spec.threads();
    let cluster = if spec.multicast_a { 2u32 } else { 1 };

    let mut k = KernelBuilder::new(&name, t.clone());
    k.maxntid(&[threads, 1, 1]).minnctapersm(1);
    if cluster > 1 {
        k.cluster_dims(&[cluster, 1, 1]);
    }
    let tmap_a = k.param_tensormap_ptr("tmap_a");
    let tmap_b = k.param_tensormap_ptr("tmap_b");
    let tmap_d = if spec.tma_store() {
        Some(k.param_tensormap_ptr("tmap_d"))
    } else {
        None
    };
    let scale_params = if fp8 {
        Some((
            k.param_ptr_aligned::<f32>("sa", 4),
            k.param_ptr_aligned::<f32>("sb", 4),
        ))
    } else {
        None
    };
    let d = k.param_ptr_aligned::<u16>("d", 4);
    let rows = match spec.layout {
        Layout::Normal => Rows::Normal,
        Layout::Contiguous => Rows::Contiguous(k.param_ptr_aligned::<i32>("m_indices", 4)),
        Layout::Masked => Rows::Masked(k.param_ptr_aligned::<i32>("masked_m", 4)),
        Layout::KGrouped => return shape_err(&name, "no K-grouped Hopper kernel"),
    };
    let m_indices = rows.m_indices();
    let m = k.param::<u32>(if spec.layout == Layout::Masked {
        "m_max"
    } else {
        "m"
    });
    let n = k.param::<u32>("n");
    let kdim = k.param::<u32>("k");
    let groups = k.param::<u32>("groups");

    // ---- shared memory: per stage A [BM x 128 B] and B [BN x 128 B] (SW128), then barriers
    let mut lay = SmemLayout::new(&mut k);
    let a_tile0 = lay.tile(bm, BK_BYTES, Swizzle::B128);
    let b_tile0 = lay.tile(bn, BK_BYTES, Swizzle::B128);
    let stage_bytes = lay.used().div_ceil(1024) * 1024;
    lay.reserve(stage_bytes * (stages - 1), 1024);
    let pipe = Pipeline::new(&mut lay, stages);
    // epilogue staging: one 64 x BN bf16 buffer per math warpgroup
    let d_stage = if spec.tma_store() {
        Some(lay.array::<u8>(spec.epilogue_bytes(), 1024))
    } else {
        None
    };
    let tx_bytes = (bm + bn) * BK_BYTES;
    let smem_base = a_tile0.base.reg();

    let tid = k.tid_x();
    let wg = k.warpgroup_index();
    let is_leader = k.eq(tid, 0u32);
    // full: one producer arrival (+ tx); empty: every math thread of the cluster's CTAs
    pipe.init(&mut k, is_leader, 1, 128 * wgs * cluster);
    if cluster > 1 {
        k.barrier_cluster_arrive();
        k.barrier_cluster_wait();
    }

    // ---- tile scheduler (identical in both roles)
    let num_m = {
        let x = k.add(m, bm - 1);
        k.div(x, bm)
    };
    let num_n = {
        let x = k.add(n, bn - 1);
        k.div(x, bn)
    };
    let per_group_tiles = k.mul(num_m, num_n);
    let num_tiles = if spec.layout == Layout::Masked {
        k.mul(per_group_tiles, groups)
    } else {
        per_group_tiles
    };
    let num_kb = k.div(kdim, BK_BYTES / spec.input.esize());
    let sb_kb = k.shr(kdim, 7u32); // K/128 scale blocks
    let n_blocks = k.shr(n, 7u32); // N/128 scale blocks per group
    let cta = k.ctaid_x();
    let ncta = k.nctaid_x();

    // Decodes a linear tile id into (group, m0 (row in A/D), n0 (column), rows valid (bound)).
    struct TileCoord {
        grp: Reg<u32>,
        m0: Reg<u32>,
        n0: Reg<u32>,
        /// First row index past this tile's group (rows >= this are not written).
        row_end: Reg<u32>,
        /// Row of this tile's rows within its group (for B-group lookup in masked layout).
        skip: Reg<Pred>,
    }
    let decode = |k: &mut KernelBuilder, tile: Reg<u32>| -> TileCoord {
        let (grp, t) = if spec.layout == Layout::Masked {
            let g = k.div(tile, per_group_tiles);
            let r = k.rem(tile, per_group_tiles);
            (g, r)
        } else {
            (k.mov(0u32), tile)
        };
        // With a cluster of 2 along N, tiles 2p and 2p+1 are the two halves of N-pair p and
        // share their M block (the multicast A tile): rasterise over pairs, then pick the half.
        let (t, half, pairs_n) = if cluster > 1 {
            let h = k.and(t, 1u32);
            let tp = k.shr(t, 1u32);
            let pn = k.shr(num_n, 1u32);
            (tp, Some(h), pn)
        } else {
            (t, None, num_n)
        };
        let per = k.mul(pairs_n, RASTER_GROUP);
        let gi = k.div(t, per);
        let first_m = k.mul(gi, RASTER_GROUP);
        let left = k.sub(num_m, first_m);
        let gsz = k.min(left, RASTER_GROUP);
        let r = k.rem(t, per);
        let mb = {
            let x = k.rem(r, gsz);
            k.add(first_m, x)
        };
        let nb = k.div(r, gsz);
        let nb = match half {
            Some(h) => k.mad_lo(nb, 2u32, h),
            None => nb,
        };
        let mloc = k.mul(mb, bm);
        let n0 = k.mul(nb, bn);
        match rows {
            Rows::Normal => {
                let f = k.mov(0u32);
                let skip = k.ne(f, 0u32);
                TileCoord {
                    grp,
                    m0: mloc,
                    n0,
                    row_end: m,
                    skip,
                }
            }
            Rows::Masked(idx) => {
                let valid = k.ld(idx.offset(grp));
                let valid = k.bitcast::<u32, i32>(valid);
                let valid = k.min(valid, m);
                let skip = k.ge(mloc, valid);
                let base = k.mul(grp, m);
                let m0 = k.add(base, mloc);
                let row_end = k.add(base, valid);
                TileCoord {
                    grp,
                    m0,
                    n0,
                    row_end,
                    skip,
                }
            }
            Rows::Contiguous(idx) => {
                // the expert of the 128-row segment holding m0 (-1: all padding)
                let e = k.ld(idx.offset(mloc));
                let pad = k.lt(e, 0i32);
                let e0 = k.max(e, 0i32);
                let grp = k.bitcast::<u32, i32>(e0);
                TileCoord {
                    grp,
                    m0: mloc,
                    n0,
                    row_end: m,
                    skip: pad,
                }
            }
        }
    };

    let budget = RegBudget {
        producer: spec.producer_regs,
        consumer: spec.consumer_regs,
    };
    let is_producer = k.eq(wg, wgs);
    let rank = if cluster > 1 {
        Some(k.cluster_ctarank())
    } else {
        None
    };

    k.warp_specialize(
        is_producer,
        budget,
        // ------------------------------------------------------------------ TMA producer
        |k| {
            let wt = k.warpgroup_thread();
            let one = k.eq(wt, 0u32);
            k.if_(one, |k| {
                // the maps were written by host copies: acquire them for the tensor-map proxy
                // in the thread that issues the TMA loads
                k.fence_proxy_tensormap_acquire(tmap_a);
                k.fence_proxy_tensormap_acquire(tmap_b);
                let st = PipeState::new(k);
                k.for_range(cta, num_tiles, ncta, |k, tile| {
                    let tc = decode(k, tile);
                    k.if_not(tc.skip, |k| {
                        let brow = if spec.layout == Layout::Normal {
                            tc.n0
                        } else {
                            k.mad_lo(tc.grp, n, tc.n0)
                        };
                        let brow = k.bitcast::<i32, u32>(brow);
                        let arow = k.bitcast::<i32, u32>(tc.m0);
                        k.for_range(0u32, num_kb, 1u32, |k, kb| {
                            pipe.producer_acquire(k, &st);
                            let bar = pipe.producer_commit_tx(k, &st, tx_bytes);
                            let sbase = k.mad_lo(st.stage, stage_bytes, smem_base);
                            let a_t = a_tile0.rebase(sbase);
                            let b_t = b_tile0.rebase(sbase);
                            let kx = k.mul(kb, BK_BYTES / spec.input.esize());
                            let kx = k.bitcast::<i32, u32>(kx);
                            match rank {
                                None => k.tma_load_2d(a_t.base, tmap_a, kx, arow, bar),
                                Some(r) => {
                                    // each CTA of the pair loads half of the A box and
                                    // multicasts it to both
                                    let half = (bm / 2) as i32;
                                    let ri = k.bitcast::<i32, u32>(r);
                                    let off = k.mul(ri, half);
                                    let row = k.add(arow, off);
                                    let sm = k.mul(r, bm / 2 * BK_BYTES);
                                    let dst = k.add(a_t.base.reg(), sm);
                                    let dst = SharedPtr::<u8>::from_reg(dst)
                                        .add_bytes(a_t.base.byte_offset());
                                    let mask = k.mov(3u16);
                                    k.tma_load_2d_multicast(dst, tmap_a, kx, row, bar, mask);
                                }
                            }
                            k.tma_load_2d(b_t.base, tmap_b, kx, brow, bar);
                            st.advance(k, stages);
                        });
                    });
                });
            });
        },
        // ------------------------------------------------------------------ math warpgroups
        |k| {
            let wt = k.warpgroup_thread();
            let warp = k.shr(wt, 5u32);
            let lane = k.and(wt, 31u32);
            let g = k.shr(lane, 2u32);
            let q = k.and(lane, 3u32);
            let nacc = (bn / 2) as usize;
            let acc = k.reg_vec::<f32>(nacc);
            let tmp = if fp8 {
                k.reg_vec::<f32>(nacc)
            } else {
                Vec::new()
            };
            let zero = k.mov(0u32);
            let p_false = k.ne(zero, 0u32);
            let p_true = k.eq(zero, 0u32);
            // this thread's rows within the tile: 64*wg + 16*warp + g (+8)
            let row_in_tile = {
                let x = k.mul(wg, 64u32);
                let y = k.mad_lo(warp, 16u32, x);
                k.add(y, g)
            };
            let a_row_off = k.mul(wg, 64 * BK_BYTES);
            if let Some(tm) = tmap_d {
                // each warpgroup's leader issues its TMA stores through tmap_d
                let lead = k.eq(wt, 0u32);
                k.if_(lead, |k| k.fence_proxy_tensormap_acquire(tm));
            }
            let st = PipeState::new(k);
            // the stage of the previous K block (BF16 releases it one block late)
            let prev = PipeState::new(k);
            let release = |k: &mut KernelBuilder, s: &PipeState| match rank {
                None => pipe.consumer_release(k, s),
                Some(_) => {
                    pipe.consumer_release_cluster(k, s, 0u32);
                    pipe.consumer_release_cluster(k, s, 1u32);
                }
            };
            let epi = |k: &mut KernelBuilder,
                       tc: &TileCoord,
                       r0: Reg<u32>,
                       r1: Reg<u32>,
                       col0: Reg<u32>,
                       vals: &[Reg<f32>]| match (tmap_d, d_stage) {
                (Some(tm), Some(buf)) => {
                    let lanes = StoreLanes { wg, wt, warp, lane };
                    store_tile_tma(
                        k,
                        spec,
                        tm,
                        buf,
                        lanes,
                        tc.m0,
                        tc.n0,
                        [r0, r1],
                        tc.row_end,
                        m_indices,
                        vals,
                    )
                }
                _ => store_tile(k, spec, d, n, r0, r1, col0, tc.row_end, m_indices, vals),
            };
            k.for_range(cta, num_tiles, ncta, |k, tile| {
                let tc = decode(k, tile);
                let r0 = k.add(tc.m0, row_in_tile);
                let r1 = k.add(r0, 8u32);
                let col0 = k.mad_lo(q, 2u32, tc.n0);
                k.if_else(
                    tc.skip,
                    |k| {
                        // contiguous-layout padding segment: write zeros; masked: nothing
                        if spec.layout == Layout::Contiguous {
                            let z = k.mov(0.0f32);
                            epi(k, &tc, r0, r1, col0, &vec![z; nacc]);
                        }
                    },
                    |k| {
                        let sp = if let Some((sa, sb)) = scale_params {
                            // clamp rows for the scale reads (rows past M are not stored)
                            let last = k.sub(tc.row_end, 1u32);
                            let c0 = k.min(r0, last);
                            let c1 = k.min(r1, last);
                            let o0 = k.mul(c0, sb_kb);
                            let o1 = k.mul(c1, sb_kb);
                            let p0 = k.addr(sa.offset(o0));
                            let p1 = k.addr(sa.offset(o1));
                            let nb0 = k.shr(tc.n0, 7u32);
                            let gb = k.mad_lo(tc.grp, n_blocks, nb0);
                            let ob = k.mul(gb, sb_kb);
                            let pb = k.addr(sb.offset(ob));
                            let rem = k.and(tc.n0, 127u32);
                            for r in &acc {
                                k.mov_to(*r, 0.0f32);
                            }
                            Some(ScalePtrs {
                                p0,
                                p1,
                                pb,
                                nb0,
                                rem,
                            })
                        } else {
                            None
                        };
                        k.for_range(0u32, num_kb, 1u32, |k, kb| {
                            // scales first (global latency overlaps the barrier wait)
                            let scales = if let Some(ScalePtrs {
                                p0,
                                p1,
                                pb,
                                nb0,
                                rem,
                            }) = sp
                            {
                                let s0 = k.ld_nc(p0.offset(kb));
                                let s1 = k.ld_nc(p1.offset(kb));
                                let mut sbs = Vec::new();
                                for i in 0..spec.b_scale_blocks() {
                                    // clamp the block index to N/128 - 1
                                    let lastb = k.sub(n_blocks, 1u32);
                                    let bi = k.add(nb0, i);
                                    let bi = k.min(bi, lastb);
                                    let di = k.sub(bi, nb0);
                                    let off = k.mad_lo(di, sb_kb, kb);
                                    sbs.push(k.ld_nc(pb.offset(off)));
                                }
                                Some((s0, s1, sbs, rem))
                            } else {
                                None
                            };
                            pipe.consumer_wait(k, &st);
                            let sbase = k.mad_lo(st.stage, stage_bytes, smem_base);
                            let a_t = a_tile0.rebase(sbase);
                            let b_t = b_tile0.rebase(sbase);
                            let a_base = k.add(a_t.base.reg(), a_row_off);
                            let a_t = SmemTile {
                                base: SharedPtr::from_reg(a_base).add_bytes(a_t.base.byte_offset()),
                                rows: 64,
                                ..a_t
                            };
                            let adesc = k.tile_desc(&a_t, 0, 0);
                            let bdesc = k.tile_desc(&b_t, 0, 0);
                            // scale-d of the block's first wgmma: FP8 starts a fresh fragment
                            // every K block; BF16 accumulates from the second block on
                            let sd0 = if fp8 { p_false } else { k.ne(kb, 0u32) };
                            k.wgmma_fence();
                            for kk in 0..4u32 {
                                let (ad, bd) = if kk == 0 {
                                    (adesc, bdesc)
                                } else {
                                    (k.desc_add(adesc, 32 * kk), k.desc_add(bdesc, 32 * kk))
                                };
                                if fp8 {
                                    let sd = if kk == 0 { sd0 } else { p_true };
                                    k.wgmma_mma_async_fp8(
                                        bn as u16,
                                        &tmp,
                                        ad,
                                        bd,
                                        sd,
                                        Fp8::E4m3,
                                        Fp8::E4m3,
                                    );
                                } else {
                                    let sd = if kk == 0 { sd0 } else { p_true };
                                    k.wgmma_mma_async::<Bf16>(
                                        bn as u16, &acc, ad, bd, sd, false, false,
                                    );
                                }
                            }
                            k.wgmma_commit_group();
                            if fp8 {
                                // promotion needs this block's products: wait, release, promote
                                k.wgmma_wait_group(0);
                                release(k, &st);
                            } else {
                                // BF16 keeps one group in flight: once the previous block's
                                // group has completed, its stage goes back to the producer
                                k.wgmma_wait_group(1);
                                let later = k.ne(kb, 0u32);
                                k.if_(later, |k| release(k, &prev));
                                k.mov_to(prev.stage, st.stage);
                            }
                            if let Some((s0, s1, sbs, rem)) = scales {
                                promote(k, spec, &acc, &tmp, s0, s1, &sbs, rem);
                            }
                            st.advance(k, stages);
                        });
                        if !fp8 {
                            k.wgmma_wait_group(0);
                            release(k, &prev);
                        }
                        epi(k, &tc, r0, r1, col0, &acc);
                    },
                );
            });
            if spec.tma_store() {
                // the last tile's TMA store must finish before the CTA's shared memory goes
                let one = k.eq(wt, 0u32);
                k.if_(one, |k| k.cp_async_bulk_wait_group(0, false));
            }
        },
    );
    if cluster > 1 {
        // keep both CTAs' shared memory alive until remote arrivals are done
        k.barrier_cluster_arrive();
        k.barrier_cluster_wait();
    }
    let _ = lay;
    k.finish().map_err(Into::into)
}

/// FP8 promotion: `acc[i] += tmp[i] * sa(row(i)) * sb(block(col(i)))`.
#[allow(clippy::too_many_arguments)]
fn promote(
    k: &mut KernelBuilder,
    spec: &HopperSpec,
    acc: &[Reg<f32>],
    tmp: &[Reg<f32>],
    s0: Reg<f32>,
    s1: Reg<f32>,
    sbs: &[Reg<f32>],
    rem: Reg<u32>,
) {
    let bn = spec.bn;
    for j in 0..bn / 8 {
        // which B scale block holds columns n0 + 8j .. +7 (n0 % 128 = rem)
        let sb = if sbs.len() == 1 {
            sbs[0]
        } else if bn % 128 == 0 {
            sbs[(8 * j / 128) as usize]
        } else {
            let mut cur = sbs[0];
            for (i, s) in sbs.iter().enumerate().skip(1) {
                let bound = 128 * i as i64 - 8 * j as i64;
                if bound <= 0 {
                    cur = *s;
                } else {
                    let p = k.ge(rem, bound as u32);
                    cur = k.selp(*s, cur, p);
                }
            }
            cur
        };
        let f0 = k.mul(s0, sb);
        let f1 = k.mul(s1, sb);
        for i in 0..4usize {
            let r = 4 * j as usize + i;
            let f = if i < 2 { f0 } else { f1 };
            k.fma_to(acc[r], tmp[r], f, acc[r]);
        }
    }
}

/// Epilogue: bf16x2 stores of rows r0 / r1, columns col0 + 8j (+1), bounded by N, `row_end`
/// and (contiguous layout) `m_indices[row] >= 0` (padding rows get zeros).
#[allow(clippy::too_many_arguments)]
fn store_tile(
    k: &mut KernelBuilder,
    spec: &HopperSpec,
    d: GlobalPtr<u16>,
    n: Reg<u32>,
    r0: Reg<u32>,
    r1: Reg<u32>,
    col0: Reg<u32>,
    row_end: Reg<u32>,
    m_indices: Option<GlobalPtr<i32>>,
    acc: &[Reg<f32>],
) {
    for (half, row) in [r0, r1].into_iter().enumerate() {
        let ok = k.lt(row, row_end);
        k.if_(ok, |k| {
            let zero_row = match m_indices {
                Some(p) => {
                    let e = k.ld(p.offset(row));
                    Some(k.lt(e, 0i32))
                }
                None => None,
            };
            let base = k.mul(row, n);
            let base = k.add(base, col0);
            let rowp = k.addr(d.offset(base));
            let z = k.mov(0.0f32);
            for j in 0..spec.bn / 8 {
                let col = k.add(col0, 8 * j);
                let inb = k.lt(col, n);
                let (a, b) = (
                    acc[(4 * j + 2 * half as u32) as usize],
                    acc[(4 * j + 2 * half as u32 + 1) as usize],
                );
                let (a, b) = match zero_row {
                    Some(p) => (k.selp(z, a, p), k.selp(z, b, p)),
                    None => (a, b),
                };
                let v = k.cvt_bf16x2(b, a);
                let pj = rowp.cast::<Bf16x2>().add_bytes(16 * j as i64);
                k.when(inb, |k| k.st(pj, v));
            }
        });
    }
}

/// The row-layout parameter of a spec: none, contiguous `m_indices` or masked `masked_m`.
#[derive(Clone, Copy)]
enum Rows {
    Normal,
    Contiguous(GlobalPtr<i32>),
    Masked(GlobalPtr<i32>),
}

impl Rows {
    /// `m_indices` of the contiguous layout (padding rows are written as zeros).
    fn m_indices(self) -> Option<GlobalPtr<i32>> {
        match self {
            Rows::Contiguous(p) => Some(p),
            _ => None,
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

/// A math thread's place in its warpgroup (for the TMA-store epilogue).
#[derive(Clone, Copy)]
struct StoreLanes {
    wg: Reg<u32>,
    wt: Reg<u32>,
    warp: Reg<u32>,
    lane: Reg<u32>,
}

/// TMA-store epilogue of one warpgroup's 64 x BN tile (rows `m0 + 64*wg ..`, columns `n0 ..`):
/// wait until the previous store has read the staging buffer, `stmatrix` the BF16 values
/// (contiguous layout: padding rows as zeros), fence the async proxy, and one thread stores the
/// box through `tmap_d` (clipped to the tensor's M x N).
#[allow(clippy::too_many_arguments)]
fn store_tile_tma(
    k: &mut KernelBuilder,
    spec: &HopperSpec,
    tmap_d: Reg<u64>,
    stage: SharedPtr<u8>,
    l: StoreLanes,
    m0: Reg<u32>,
    n0: Reg<u32>,
    rows: [Reg<u32>; 2],
    row_end: Reg<u32>,
    m_indices: Option<GlobalPtr<i32>>,
    acc: &[Reg<f32>],
) {
    let leader = k.eq(l.wt, 0u32);
    let bar_id = k.add(l.wg, 1u32);
    k.if_(leader, |k| k.cp_async_bulk_wait_group(0, true));
    k.bar_sync_count(bar_id, 128u32);
    // BF16 pairs; contiguous padding rows (m_indices < 0) become zeros
    let z = k.mov(0.0f32);
    let zero_row: Vec<Option<Reg<Pred>>> = rows
        .iter()
        .map(|&r| {
            m_indices.map(|p| {
                let last = k.sub(row_end, 1u32);
                let rc = k.min(r, last);
                let e = k.ld(p.offset(rc));
                k.lt(e, 0i32)
            })
        })
        .collect();
    let chunks = spec.bn / 8;
    let words: Vec<[Reg<Bf16x2>; 2]> = (0..chunks)
        .map(|j| {
            let mut w = Vec::new();
            for half in 0..2usize {
                let (a, b) = (
                    acc[(4 * j + 2 * half as u32) as usize],
                    acc[(4 * j + 2 * half as u32 + 1) as usize],
                );
                let (a, b) = match zero_row[half] {
                    Some(p) => (k.selp(z, a, p), k.selp(z, b, p)),
                    None => (a, b),
                };
                w.push(k.cvt_bf16x2(b, a));
            }
            [w[0], w[1]]
        })
        .collect();
    // This warpgroup's buffer is BN*2/W column panels, each 64 rows x W bytes (W = panel width)
    // with W's TMA swizzle: 16-byte chunk c of row r sits at r*W + 16*(c ^ f(r)), f(r) = the
    // row's bits above the 128-byte line (r % 8 for 128 B, (r/2) % 4 for 64 B, (r/4) % 2 for
    // 32 B, 0 without swizzle). A `stmatrix` phase writes 8 rows x 16 bytes; swizzled, those land
    // in 8 distinct 16-byte bank groups (unswizzled rows BN*2 bytes apart would all share one).
    // lane -> row address of matrix i = lane / 8 (x4: i&1 = row half, i>>1 = chunk j or j+1;
    // x2: lanes 0..15, chunk j)
    let w = spec.epilogue_panel_bytes();
    let cpp = w / 16; // chunks per panel
    let wg_off = k.mul(l.wg, 64 * spec.bn * 2);
    let base = k.add(stage.reg(), wg_off);
    let i = k.shr(l.lane, 3u32);
    let r = k.and(l.lane, 7u32);
    let hi = k.and(i, 1u32);
    let row = {
        let x = k.mul(l.warp, 16u32);
        let y = k.mad_lo(hi, 8u32, x);
        k.add(y, r)
    };
    let row_base = {
        let rb = k.mul(row, w);
        k.add(base, rb)
    };
    // f(r): 0..cpp-1
    let f = match w {
        128 => k.and(row, 7u32),
        64 => {
            let x = k.shr(row, 1u32);
            k.and(x, 3u32)
        }
        32 => {
            let x = k.shr(row, 2u32);
            k.and(x, 1u32)
        }
        _ => k.mov(0u32),
    };
    // x4: this lane's matrix is chunk j + c1 (j even). With cpp even that chunk is in j's panel
    // at (j % cpp) ^ c1 before the swizzle; with one chunk per panel it is the next panel.
    let c1 = k.shr(i, 1u32);
    let (g4, row_base4) = if cpp == 1 {
        let off = k.mul(c1, 64 * w);
        (f, k.add(row_base, off))
    } else {
        (k.xor(f, c1), row_base)
    };
    let mut j = 0;
    while j < chunks {
        let ju = j as usize;
        let panel_off = stage.byte_offset() + ((j / cpp) * 64 * w) as i64;
        let x4 = j + 1 < chunks;
        let (g, rb) = if x4 { (g4, row_base4) } else { (f, row_base) };
        let sw = if cpp == 1 {
            rb
        } else {
            let c = k.xor(g, j % cpp);
            let c = k.shl(c, 4u32);
            k.add(rb, c)
        };
        let a = SharedPtr::<u8>::from_reg(sw).add_bytes(panel_off);
        if x4 {
            let v = [
                words[ju][0],
                words[ju][1],
                words[ju + 1][0],
                words[ju + 1][1],
            ];
            k.stmatrix(a, v, false);
            j += 2;
        } else {
            k.stmatrix(a, [words[ju][0], words[ju][1]], false);
            j += 1;
        }
    }
    k.fence_proxy_async();
    k.bar_sync_count(bar_id, 128u32);
    k.if_(leader, |k| {
        let row0 = k.mad_lo(l.wg, 64u32, m0);
        let c1 = k.bitcast::<i32, u32>(row0);
        // one box per panel; a panel wholly right of N is clipped away by the tensor map
        for p in 0..spec.bn * 2 / w {
            let col = k.add(n0, p * w / 2);
            let c0 = k.bitcast::<i32, u32>(col);
            let src = SharedPtr::<u8>::from_reg(base)
                .add_bytes(stage.byte_offset() + (p * 64 * w) as i64);
            k.cp_async_bulk_tensor_s2g(tmap_d, &[c0, c1], src);
        }
        k.cp_async_bulk_commit_group();
    });
}

/// Checks a spec (typed error, never a panic).
pub(crate) fn validate(spec: &HopperSpec) -> Result<()> {
    let name = spec.name();
    if spec.input == InTy::Fp8Unpromoted || spec.layout == Layout::KGrouped {
        return shape_err(
            &name,
            "the Hopper kernels take BF16 or promoted FP8 in the normal, contiguous or masked layout",
        );
    }
    if !(1..=2).contains(&spec.math_wgs) {
        return shape_err(&name, "1 or 2 math warpgroups");
    }
    if spec.bn == 0 || spec.bn > 256 || spec.bn % 8 != 0 {
        return shape_err(
            &name,
            format!("BN = {}: a multiple of 8 in 8..=256", spec.bn),
        );
    }
    if spec.input == InTy::Fp8 && spec.bn % 16 != 0 && spec.bn > 128 {
        return shape_err(&name, "FP8 BN above 128 must be a multiple of 16");
    }
    if spec.stages < 2 {
        return shape_err(&name, "at least 2 stages");
    }
    if spec.shared_bytes() > 227 * 1024 {
        return shape_err(
            &name,
            format!("{} bytes of shared memory (> 227 KiB)", spec.shared_bytes()),
        );
    }
    let budget = RegBudget {
        producer: spec.producer_regs,
        consumer: spec.consumer_regs,
    };
    budget.check(1, spec.math_wgs)?;
    Ok(())
}
