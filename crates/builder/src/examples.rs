//! Example kernels, written with the builder (also run by the tests and the emulator).

use crate::*;
use ptx::Module;

/// `out[i] = a[i] + b[i]` for `i < n`; one thread per element (any 1-D launch).
pub fn vector_add(t: Target) -> Result<Module, BuildError> {
    let mut k = KernelBuilder::new("vector_add", t);
    let (a, b) = (
        k.param::<GlobalPtr<f32>>("a"),
        k.param::<GlobalPtr<f32>>("b"),
    );
    let out = k.param::<GlobalPtr<f32>>("out");
    let n = k.param::<u32>("n");
    let i = k.global_index_x();
    let p = k.lt(i, n);
    k.if_(p, |k| {
        let x = k.ld(a.offset(i));
        let y = k.ld(b.offset(i));
        let s = k.add(x, y);
        k.st(out.offset(i), s);
    });
    k.finish()
}

/// Warp sums: thread `i = ctaid.x*ntid.x+tid.x` contributes `x[i]` (0 when `i >= n`); lane 0 of
/// every warp writes the sum of its 32 values to `out[i / 32]` (butterfly `shfl.sync.bfly`, so
/// every lane ends with the full sum). Launch with `ntid.x` a multiple of 32; `out` holds one
/// f32 per launched warp.
pub fn warp_reduce_sum(t: Target) -> Result<Module, BuildError> {
    let mut k = KernelBuilder::new("warp_reduce_sum", t);
    let x = k.param::<GlobalPtr<f32>>("x");
    let out = k.param::<GlobalPtr<f32>>("out");
    let n = k.param::<u32>("n");
    let i = k.global_index_x();
    let v = k.mov(0.0f32);
    let p = k.lt(i, n);
    k.if_(p, |k| {
        let xi = k.ld(x.offset(i));
        k.mov_to(v, xi);
    });
    k.unroll(5, |k, s| {
        let o = k.shfl_bfly(v, 16u32 >> s);
        k.add_to(v, v, o);
    });
    let lane = k.lane_id();
    let first = k.eq(lane, 0u32);
    k.if_(first, |k| {
        let w = k.shr(i, 5u32);
        k.st(out.offset(w), v);
    });
    k.finish()
}

/// `out[c][r] = in[r][c]` for a `rows x cols` row-major f32 matrix, through a 32x33
/// (`+1` padding against bank conflicts) shared tile. Launch with 32x8 threads per CTA and a
/// `(ceil(cols/32), ceil(rows/32))` grid.
pub fn transpose_tiled(t: Target) -> Result<Module, BuildError> {
    const TILE: u32 = 32;
    const ROWS: u32 = 8;
    let mut k = KernelBuilder::new("transpose_tiled", t);
    k.reqntid(&[TILE, ROWS]);
    let input = k.param::<GlobalPtr<f32>>("in");
    let out = k.param::<GlobalPtr<f32>>("out");
    let rows = k.param::<u32>("rows");
    let cols = k.param::<u32>("cols");
    let tile = k.shared_array::<f32>((TILE * (TILE + 1)) as u64, 16);
    let tx = k.tid_x();
    let ty = k.tid_y();
    let bx = k.ctaid_x();
    let by = k.ctaid_y();
    // Load phase: tile[ty+j][tx] = in[(by*32+ty+j)*cols + bx*32+tx]
    let x = k.mad_lo(bx, TILE, tx);
    let y0 = k.mad_lo(by, TILE, ty);
    let xin = k.lt(x, cols);
    k.unroll(TILE / ROWS, |k, s| {
        let j = s * ROWS;
        let y = if j == 0 { y0 } else { k.add(y0, j) };
        let yin = k.lt(y, rows);
        let ok = k.and(xin, yin);
        k.if_(ok, |k| {
            let src = k.mad_lo(y, cols, x);
            let v = k.ld(input.offset(src));
            let r = if j == 0 { ty } else { k.add(ty, j) };
            let dst = k.mad_lo(r, TILE + 1, tx);
            k.st(tile.offset(dst), v);
        });
    });
    k.sync_threads();
    // Store phase: out[(bx*32+ty+j)*rows + by*32+tx] = tile[tx][ty+j]
    let ox = k.mad_lo(by, TILE, tx);
    let oy0 = k.mad_lo(bx, TILE, ty);
    let oxin = k.lt(ox, rows);
    k.unroll(TILE / ROWS, |k, s| {
        let j = s * ROWS;
        let oy = if j == 0 { oy0 } else { k.add(oy0, j) };
        let oyin = k.lt(oy, cols);
        let ok = k.and(oxin, oyin);
        k.if_(ok, |k| {
            let c = if j == 0 { ty } else { k.add(ty, j) };
            let src = k.mad_lo(tx, TILE + 1, c);
            let v = k.ld(tile.offset(src));
            let dst = k.mad_lo(oy, rows, ox);
            k.st(out.offset(dst), v);
        });
    });
    k.finish()
}
