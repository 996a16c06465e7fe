//! The epilogue: a math warpgroup's 64 x BN FP32 accumulators to BF16 in D. Normal and
//! contiguous layouts stage the tile in shared memory with `stmatrix` and store it with TMA
//! (clipped to M x N by the tensor map); the masked layout stores bf16x2 pairs directly, guarded
//! by the row bound (rows past `masked_m[g]` must stay untouched).

use super::math::{MathThread, ThreadTile};
use super::Gemm;
use builder::*;

/// Stores `vals` (the thread's accumulator fragment, or zeros) of tile `tt`.
pub(super) fn store(
    k: &mut KernelBuilder,
    g: &Gemm,
    m: &MathThread,
    tt: &ThreadTile,
    vals: &[Reg<f32>],
) {
    match (g.p.tmap_d, g.smem.d_stage) {
        (Some(tm), Some(buf)) => store_tma(k, g, m, tt, TmaStore { tmap_d: tm, buf }, vals),
        _ => store_direct(k, g, tt, vals),
    }
}

/// Direct stores: bf16x2 pairs of rows r0 / r1, columns col0 + 8j (+1), bounded by N,
/// `row_end` and (contiguous layout) `m_indices[row] >= 0` (padding rows get zeros).
fn store_direct(k: &mut KernelBuilder, g: &Gemm, tt: &ThreadTile, acc: &[Reg<f32>]) {
    let (d, n) = (g.p.d, g.p.n);
    let m_indices = g.p.rows.m_indices();
    for (half, row) in [tt.r0, tt.r1].into_iter().enumerate() {
        let ok = k.lt(row, tt.tc.row_end);
        k.if_(ok, |k| {
            let zero_row = match m_indices {
                Some(p) => {
                    let e = k.ld(p.offset(row));
                    Some(k.lt(e, 0i32))
                }
                None => None,
            };
            let base = k.mul(row, n);
            let base = k.add(base, tt.col0);
            let rowp = k.addr(d.offset(base));
            let z = k.mov(0.0f32);
            for j in 0..g.spec.bn / 8 {
                let col = k.add(tt.col0, 8 * j);
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

/// The TMA-store resources: D's tensor map and the staging buffers.
#[derive(Clone, Copy)]
struct TmaStore {
    tmap_d: Reg<u64>,
    buf: SharedPtr<u8>,
}

/// TMA-store epilogue of one warpgroup's 64 x BN tile (rows `m0 + 64*wg ..`, columns `n0 ..`):
/// wait until the previous store has read the staging buffer, `stmatrix` the BF16 values
/// (contiguous layout: padding rows as zeros), fence the async proxy, and one thread stores the
/// boxes through `tmap_d` (clipped to the tensor's M x N). The store runs while the warpgroup
/// starts the next tile.
fn store_tma(
    k: &mut KernelBuilder,
    g: &Gemm,
    m: &MathThread,
    tt: &ThreadTile,
    ts: TmaStore,
    acc: &[Reg<f32>],
) {
    let leader = k.eq(m.wt, 0u32);
    let bar_id = k.add(g.wg, 1u32);
    k.if_(leader, |k| k.cp_async_bulk_wait_group(0, true));
    k.bar_sync_count(bar_id, 128u32);
    let words = bf16_words(k, g, tt, acc);
    let base = stmatrix_tile(k, g, m, ts.buf, &words);
    k.fence_proxy_async();
    k.bar_sync_count(bar_id, 128u32);
    let w = g.spec.epilogue_panel_bytes();
    k.if_(leader, |k| {
        let row0 = k.mad_lo(g.wg, 64u32, tt.tc.m0);
        let c1 = k.bitcast::<i32, u32>(row0);
        // one box per panel; a panel wholly right of N is clipped away by the tensor map
        for p in 0..g.spec.bn * 2 / w {
            let col = k.add(tt.tc.n0, p * w / 2);
            let c0 = k.bitcast::<i32, u32>(col);
            let src = SharedPtr::<u8>::from_reg(base)
                .add_bytes(ts.buf.byte_offset() + (p * 64 * w) as i64);
            k.cp_async_bulk_tensor_s2g(ts.tmap_d, &[c0, c1], src);
        }
        k.cp_async_bulk_commit_group();
    });
}

/// The fragment as BF16 pairs: `[chunk j][row half]` (contiguous padding rows, where
/// `m_indices < 0`, become zeros).
fn bf16_words(
    k: &mut KernelBuilder,
    g: &Gemm,
    tt: &ThreadTile,
    acc: &[Reg<f32>],
) -> Vec<[Reg<Bf16x2>; 2]> {
    let z = k.mov(0.0f32);
    let zero_row: Vec<Option<Reg<Pred>>> = [tt.r0, tt.r1]
        .iter()
        .map(|&r| {
            g.p.rows.m_indices().map(|p| {
                let last = k.sub(tt.tc.row_end, 1u32);
                let rc = k.min(r, last);
                let e = k.ld(p.offset(rc));
                k.lt(e, 0i32)
            })
        })
        .collect();
    (0..g.spec.bn / 8)
        .map(|j| {
            let mut w = Vec::new();
            for (half, zr) in zero_row.iter().enumerate() {
                let (a, b) = (
                    acc[(4 * j + 2 * half as u32) as usize],
                    acc[(4 * j + 2 * half as u32 + 1) as usize],
                );
                let (a, b) = match zr {
                    Some(p) => (k.selp(z, a, *p), k.selp(z, b, *p)),
                    None => (a, b),
                };
                w.push(k.cvt_bf16x2(b, a));
            }
            [w[0], w[1]]
        })
        .collect()
}

/// Writes the BF16 words into this warpgroup's staging buffer with `stmatrix` (x4 for chunk
/// pairs, x2 for an odd last chunk); returns the buffer's base register.
///
/// The buffer is BN*2/W column panels, each 64 rows x W bytes (W = panel width) with W's TMA
/// swizzle: 16-byte chunk c of row r sits at r*W + 16*(c ^ f(r)), f(r) = the row's bits above
/// the 128-byte line (r % 8 for 128 B, (r/2) % 4 for 64 B, (r/4) % 2 for 32 B, 0 without
/// swizzle). A `stmatrix` phase writes 8 rows x 16 bytes; swizzled, those land in 8 distinct
/// 16-byte bank groups (unswizzled rows BN*2 bytes apart would all share one).
fn stmatrix_tile(
    k: &mut KernelBuilder,
    g: &Gemm,
    m: &MathThread,
    stage: SharedPtr<u8>,
    words: &[[Reg<Bf16x2>; 2]],
) -> Reg<u32> {
    let w = g.spec.epilogue_panel_bytes();
    let cpp = w / 16; // chunks per panel
    let wg_off = k.mul(g.wg, 64 * g.spec.bn * 2);
    let base = k.add(stage.reg(), wg_off);
    let lanes = lane_rows(k, m, base, w);
    let chunks = g.spec.bn / 8;
    let mut j = 0;
    while j < chunks {
        let ju = j as usize;
        let panel_off = stage.byte_offset() + ((j / cpp) * 64 * w) as i64;
        let x4 = j + 1 < chunks;
        let (sel, rb) = if x4 {
            (lanes.f4, lanes.row_base4)
        } else {
            (lanes.f, lanes.row_base)
        };
        let sw = if cpp == 1 {
            rb
        } else {
            let c = k.xor(sel, j % cpp);
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
    base
}

/// A lane's `stmatrix` row address within a panel and its swizzle selector, for x2 (`f`,
/// `row_base`) and x4 (`f4`, `row_base4`).
struct LaneRows {
    f: Reg<u32>,
    row_base: Reg<u32>,
    f4: Reg<u32>,
    row_base4: Reg<u32>,
}

/// Lane -> row address of matrix i = lane / 8 (x4: i&1 = row half, i>>1 = chunk j or j+1;
/// x2: lanes 0..15, chunk j), for panels `w` bytes wide starting at `base`.
fn lane_rows(k: &mut KernelBuilder, m: &MathThread, base: Reg<u32>, w: u32) -> LaneRows {
    let cpp = w / 16;
    let i = k.shr(m.lane, 3u32);
    let r = k.and(m.lane, 7u32);
    let hi = k.and(i, 1u32);
    let row = {
        let x = k.mul(m.warp, 16u32);
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
    let (f4, row_base4) = if cpp == 1 {
        let off = k.mul(c1, 64 * w);
        (f, k.add(row_base, off))
    } else {
        (k.xor(f, c1), row_base)
    };
    LaneRows {
        f,
        row_base,
        f4,
        row_base4,
    }
}
