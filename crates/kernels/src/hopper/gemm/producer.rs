//! The TMA producer warpgroup: one thread walks the CTA's tiles and, per K block, waits for a
//! free stage, arms its `full` barrier with the transaction bytes and issues the A and B loads.

use super::sched::TileCoord;
use super::{Gemm, BK_BYTES};
use crate::hopper::Layout;
use builder::*;

/// The producer role (after `setmaxnreg.dec`).
pub(super) fn run(k: &mut KernelBuilder, g: &Gemm) {
    let wt = k.warpgroup_thread();
    let one = k.eq(wt, 0u32);
    k.if_(one, |k| {
        // the maps were written by host copies: acquire them for the tensor-map proxy in the
        // thread that issues the TMA loads
        k.fence_proxy_tensormap_acquire(g.p.tmap_a);
        k.fence_proxy_tensormap_acquire(g.p.tmap_b);
        let st = PipeState::new(k);
        let s = g.sched;
        k.for_range(s.cta, s.num_tiles, s.ncta, |k, tile| {
            let tc = s.decode(k, g, tile);
            k.if_not(tc.skip, |k| load_tile(k, g, &st, &tc));
        });
    });
}

/// All K blocks of one tile: A rows from `m0`, B rows from the tile's group and `n0`.
fn load_tile(k: &mut KernelBuilder, g: &Gemm, st: &PipeState, tc: &TileCoord) {
    let brow = if g.spec.layout == Layout::Normal {
        tc.n0
    } else {
        k.mad_lo(tc.grp, g.p.n, tc.n0)
    };
    let b = k.bitcast::<i32, u32>(brow);
    let rows = TileRows {
        a: k.bitcast::<i32, u32>(tc.m0),
        b,
    };
    k.for_range(0u32, g.sched.num_kb, 1u32, |k, kb| {
        load_k_block(k, g, st, rows, kb)
    });
}

/// First rows of a tile's A and B boxes (TMA coordinates).
#[derive(Clone, Copy)]
struct TileRows {
    a: Reg<i32>,
    b: Reg<i32>,
}

/// One stage: wait until the consumers freed it, expect the bytes, load A and B.
fn load_k_block(k: &mut KernelBuilder, g: &Gemm, st: &PipeState, rows: TileRows, kb: Reg<u32>) {
    let pipe = g.smem.pipe;
    pipe.producer_acquire(k, st);
    let bar = pipe.producer_commit_tx(k, st, g.smem.tx_bytes);
    let (a_t, b_t) = g.smem.stage_tiles(k, st.stage);
    let kx = k.mul(kb, g.bk());
    let kx = k.bitcast::<i32, u32>(kx);
    match g.rank {
        None => k.tma_load_2d(a_t.base, g.p.tmap_a, kx, rows.a, bar),
        Some(r) => load_a_multicast(k, g, r, a_t, kx, rows.a, bar),
    }
    k.tma_load_2d(b_t.base, g.p.tmap_b, kx, rows.b, bar);
    st.advance(k, g.spec.stages);
}

/// Multicast: CTA `rank` of the pair loads its half of the A box (rows `arow + rank * BM/2`)
/// into both CTAs' stage.
fn load_a_multicast(
    k: &mut KernelBuilder,
    g: &Gemm,
    rank: Reg<u32>,
    a_t: SmemTile,
    kx: Reg<i32>,
    arow: Reg<i32>,
    bar: SharedPtr<u64>,
) {
    let bm = g.spec.bm();
    let half = (bm / 2) as i32;
    let ri = k.bitcast::<i32, u32>(rank);
    let off = k.mul(ri, half);
    let row = k.add(arow, off);
    let sm = k.mul(rank, bm / 2 * BK_BYTES);
    let dst = k.add(a_t.base.reg(), sm);
    let dst = SharedPtr::<u8>::from_reg(dst).add_bytes(a_t.base.byte_offset());
    let mask = k.mov(3u16);
    k.tma_load_2d_multicast(dst, g.p.tmap_a, kx, row, bar, mask);
}
