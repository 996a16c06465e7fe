//! The persistent tile scheduler, identical in both roles: tile and K-block counts, and the
//! decoding of a linear tile id into its group, rows and columns (rasterised in groups of
//! [`RASTER_GROUP`] M-blocks; over N-pairs with multicast).

use super::{cluster_size, Gemm, Params, Rows, RASTER_GROUP};
use crate::hopper::{HopperSpec, Layout};
use builder::*;

/// Tile and K-block counts, and this CTA's walk `cta, cta + ncta, .. < num_tiles`.
#[derive(Clone, Copy)]
pub(super) struct Sched {
    num_m: Reg<u32>,
    num_n: Reg<u32>,
    per_group_tiles: Reg<u32>,
    pub num_tiles: Reg<u32>,
    /// K blocks of [`super::BK_BYTES`] bytes.
    pub num_kb: Reg<u32>,
    /// K / 128 scale blocks.
    pub sb_kb: Reg<u32>,
    /// N / 128 scale blocks per group.
    pub n_blocks: Reg<u32>,
    pub cta: Reg<u32>,
    pub ncta: Reg<u32>,
}

/// A decoded tile: group, first row in A/D, first column, row bound, and whether to skip it.
#[derive(Clone, Copy)]
pub(super) struct TileCoord {
    pub grp: Reg<u32>,
    pub m0: Reg<u32>,
    pub n0: Reg<u32>,
    /// First row index past this tile's group (rows >= this are not written).
    pub row_end: Reg<u32>,
    /// No MMA for this tile: contiguous padding segment, or masked rows all past `masked_m`.
    pub skip: Reg<Pred>,
}

impl Sched {
    pub fn new(k: &mut KernelBuilder, spec: &HopperSpec, p: &Params) -> Sched {
        let (bm, bn) = (spec.bm(), spec.bn);
        let num_m = {
            let x = k.add(p.m, bm - 1);
            k.div(x, bm)
        };
        let num_n = {
            let x = k.add(p.n, bn - 1);
            k.div(x, bn)
        };
        let per_group_tiles = k.mul(num_m, num_n);
        let num_tiles = if spec.layout == Layout::Masked {
            k.mul(per_group_tiles, p.groups)
        } else {
            per_group_tiles
        };
        Sched {
            num_m,
            num_n,
            per_group_tiles,
            num_tiles,
            num_kb: k.div(p.kdim, super::BK_BYTES / spec.input.esize()),
            sb_kb: k.shr(p.kdim, 7u32),
            n_blocks: k.shr(p.n, 7u32),
            cta: k.ctaid_x(),
            ncta: k.nctaid_x(),
        }
    }

    /// Decodes linear tile id `tile` (both roles walk the same ids).
    pub fn decode(&self, k: &mut KernelBuilder, g: &Gemm, tile: Reg<u32>) -> TileCoord {
        let (grp, t) = if g.spec.layout == Layout::Masked {
            let gi = k.div(tile, self.per_group_tiles);
            let r = k.rem(tile, self.per_group_tiles);
            (gi, r)
        } else {
            (k.mov(0u32), tile)
        };
        let (mb, nb) = self.raster(k, g.spec, t);
        let mloc = k.mul(mb, g.spec.bm());
        let n0 = k.mul(nb, g.spec.bn);
        place_rows(k, g, grp, mloc, n0)
    }

    /// (M block, N block) of tile `t` within its group, rasterised in groups of RASTER_GROUP
    /// M blocks.
    fn raster(
        &self,
        k: &mut KernelBuilder,
        spec: &HopperSpec,
        t: Reg<u32>,
    ) -> (Reg<u32>, Reg<u32>) {
        // With a cluster of 2 along N, tiles 2p and 2p+1 are the two halves of N-pair p and
        // share their M block (the multicast A tile): rasterise over pairs, then pick the half.
        let (t, half, pairs_n) = if cluster_size(spec) > 1 {
            let h = k.and(t, 1u32);
            let tp = k.shr(t, 1u32);
            let pn = k.shr(self.num_n, 1u32);
            (tp, Some(h), pn)
        } else {
            (t, None, self.num_n)
        };
        let per = k.mul(pairs_n, RASTER_GROUP);
        let gi = k.div(t, per);
        let first_m = k.mul(gi, RASTER_GROUP);
        let left = k.sub(self.num_m, first_m);
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
        (mb, nb)
    }
}

/// The rows of a tile at row `mloc` of group `grp` (the group of a contiguous tile comes from
/// `m_indices`; a masked tile's rows are offset by `grp * m_max` and bounded by `masked_m`).
fn place_rows(
    k: &mut KernelBuilder,
    g: &Gemm,
    grp: Reg<u32>,
    mloc: Reg<u32>,
    n0: Reg<u32>,
) -> TileCoord {
    let m = g.p.m;
    match g.p.rows {
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
}
