//! The sm_90a building blocks the `wgmma` attention kernels ([`super::fwd90`],
//! [`super::bwd90`]) share: TMA loads of panel tiles, their tensor maps, and warpgroup
//! products over panel tiles through 128B-swizzle descriptors.
//!
//! A panel tile (`super::Tile`) is exactly what a 2-D `cp.async.bulk.tensor` of a
//! [64 columns, rows] box with the 128-byte swizzle writes: 8-row groups 1024 bytes apart,
//! panels `rows * 128` apart, every panel 1024-aligned, which is also the 128B-swizzle canonical
//! layout of `wgmma` descriptors. A K tile fed by a shared RoPE key is [nope panels | rope
//! panels] (`Tile::split` = d_nope): each source starts on a panel, so its TMA boxes stay
//! panel-aligned whatever d_nope is; `col_off` maps a column to its place.

use super::*;
use builder::hopper::Swizzle;
use runtime::tensor_map::{Swizzle as TSwizzle, TensorDataType};
use runtime::{Backend, TensorMap};

/// Columns of one panel / TMA box.
pub(crate) const PANEL: u32 = 64;

/// 64-column panels of a `d`-wide source.
pub(crate) fn panels(d: u32) -> u32 {
    d.div_ceil(PANEL)
}

/// Panels of a K tile with a shared RoPE key of `rope` columns (0: K concatenated).
pub(crate) fn k_panels(d_qk: u32, rope: u32) -> u32 {
    panels(d_qk - rope) + panels(rope)
}

/// Byte offset of column `c` (a multiple of 8) in row 0 of panel tile `t`, following its split.
pub(crate) fn col_off(t: &Tile, c: u32) -> u32 {
    let (c, p0) = if t.split > 0 && c >= t.split {
        (c - t.split, panels(t.split))
    } else {
        (c, 0)
    };
    (p0 + c / PANEL) * t.rows * ROW_BYTES + (c % PANEL) * 2
}

/// wgmma descriptor at byte `start` of a 128B-swizzled panel tile of `rows` rows: 8-row
/// groups 1024 bytes apart (SBO), panels `rows * 128` apart (LBO; the MN-major operand's
/// next 64 columns).
pub(crate) fn panel_desc(k: &mut KernelBuilder, base: Reg<u32>, rows: u32, start: u32) -> Reg<u64> {
    let d = MatrixDesc {
        start,
        lbo: rows * ROW_BYTES,
        sbo: 8 * ROW_BYTES,
        base_offset: 0,
        swizzle: Swizzle::B128,
    };
    k.matrix_desc(base, d)
}

/// (false, true) predicates (wgmma's scale-d: overwrite / accumulate).
pub(crate) fn preds(k: &mut KernelBuilder) -> (Reg<Pred>, Reg<Pred>) {
    let zero = k.mov(0u32);
    (k.ne(zero, 0u32), k.eq(zero, 0u32))
}

/// `acc = A B^T` over `d` columns with `wgmma m64n{b.rows}k16`: A the 64-row panel tile `a`, B
/// the panel tile `b`, both K-major (k-step columns placed by `col_off`). Waits for the
/// group, so the tiles may be released after it.
pub(crate) fn ss_wgmma(
    k: &mut KernelBuilder,
    (a, b): (&Tile, &Tile),
    d: u32,
    acc: &[[Reg<f32>; 4]],
    preds: (Reg<Pred>, Reg<Pred>),
) {
    let flat: Vec<Reg<f32>> = acc.iter().flatten().copied().collect();
    k.wgmma_fence();
    for ks in 0..d / 16 {
        let ad = panel_desc(k, a.base, a.rows, col_off(a, 16 * ks));
        let bd = panel_desc(k, b.base, b.rows, col_off(b, 16 * ks));
        let scale_d = if ks == 0 { preds.0 } else { preds.1 };
        k.wgmma_mma_async::<Bf16>(b.rows as u16, &flat, ad, bd, scale_d, false, false);
    }
    k.wgmma_commit_group();
    k.wgmma_wait_group(0);
}

/// `acc += P B` with `wgmma m64n{n}k16`: P (64 x 16 * `p.len() / 2`) from accumulator-layout
/// registers, B columns `c0..c0 + n` of the [k][n] panel tile `b` as MN-major descriptors (one
/// product per side of `b.split` when the range crosses it; every part must start on a panel,
/// so `c0` is a multiple of 64). `acc` holds the `n / 8` n-tiles of the range. Waits for the
/// group.
pub(crate) fn rs_wgmma(
    k: &mut KernelBuilder,
    p: &[[Reg<f32>; 4]],
    b: &Tile,
    (c0, n): (u32, u32),
    acc: &[[Reg<f32>; 4]],
    always: Reg<Pred>,
) {
    let parts = if b.split > c0 && b.split < c0 + n {
        vec![(c0, b.split - c0), (b.split, c0 + n - b.split)]
    } else {
        vec![(c0, n)]
    };
    let flats: Vec<Vec<Reg<f32>>> = parts
        .iter()
        .map(|&(c, w)| {
            let a = &acc[((c - c0) / 8) as usize..][..(w / 8) as usize];
            a.iter().flatten().copied().collect()
        })
        .collect();
    k.wgmma_fence();
    for kk in 0..p.len() / 2 {
        let af = acc_to_a(k, p[2 * kk], p[2 * kk + 1]);
        let af: [Reg<B32>; 4] = af.map(|x| x.reinterpret());
        for (&(c, w), flat) in parts.iter().zip(&flats) {
            let start = col_off(b, c) + kk as u32 * 16 * ROW_BYTES;
            let bd = panel_desc(k, b.base, b.rows, start);
            k.wgmma_mma_async_rs::<Bf16>(w as u16, flat, af, bd, always, true);
        }
    }
    k.wgmma_commit_group();
    k.wgmma_wait_group(0);
}

/// Where a TMA copy goes: `panels` consecutive panels of `rows` rows from shared address `dst`.
#[derive(Clone, Copy)]
pub(crate) struct PanelDst {
    pub dst: Reg<u32>,
    pub rows: u32,
    pub panels: u32,
}

/// `dst.panels` TMA boxes of `map` into consecutive panels: box p at columns `col0 + 64 p`,
/// rows from `row`, completing on `bar`.
pub(crate) fn load_panels(
    k: &mut KernelBuilder,
    map: Reg<u64>,
    dst: PanelDst,
    (col0, row): (Reg<u32>, Reg<u32>),
    bar: SharedPtr<u64>,
) {
    let col0 = k.bitcast::<i32, u32>(col0);
    let row = k.bitcast::<i32, u32>(row);
    for p in 0..dst.panels {
        let off = (p * dst.rows * ROW_BYTES) as i64;
        let d = SharedPtr::<u8>::from_reg(dst.dst).add_bytes(off);
        let c = k.add(col0, (p * PANEL) as i32);
        k.tma_load_2d(d, map, c, row, bar);
    }
}

/// Tensor maps of K: per head `[total, heads * (d_qk - rope)]`, and the shared RoPE key
/// `[total, rope]` (the same as `k` when `rope` = 0).
#[derive(Clone, Copy)]
pub(crate) struct KMaps {
    pub k: Reg<u64>,
    pub kr: Reg<u64>,
    pub rope: u32,
}

/// TMA loads of the K rows from token `row` of head column `h * d_nope` into the K tile
/// `(dst, rows)` of head dim `d_qk`: the nope panels, then the rope panels.
pub(crate) fn load_k_panels(
    k: &mut KernelBuilder,
    m: &KMaps,
    (dst, rows, d_qk): (Reg<u32>, u32, u32),
    (kcol, row): (Reg<u32>, Reg<u32>),
    bar: SharedPtr<u64>,
) {
    let d_nope = d_qk - m.rope;
    let pk = panels(d_nope);
    let nope = PanelDst {
        dst,
        rows,
        panels: pk,
    };
    load_panels(k, m.k, nope, (kcol, row), bar);
    if m.rope > 0 {
        let rope = PanelDst {
            dst: k.add(dst, pk * rows * ROW_BYTES),
            rows,
            panels: panels(m.rope),
        };
        let zero = k.mov(0u32);
        load_panels(k, m.kr, rope, (zero, row), bar);
    }
}

/// Splits a warp-specialised CTA: the elected first thread of the producer warp (thread
/// `math`) runs `prod`, the `math` consumer threads (tid < `math`) run `cons`.
pub(crate) fn specialise(
    k: &mut KernelBuilder,
    math: u32,
    prod: impl FnOnce(&mut KernelBuilder),
    cons: impl FnOnce(&mut KernelBuilder),
) {
    let tid = k.tid_x();
    let is_producer = k.ge(tid, math);
    k.if_else(
        is_producer,
        |k| {
            let elected = k.eq(tid, math);
            k.if_(elected, prod);
        },
        cons,
    );
}

/// The tensor maps were written by host copies: acquire them for the tensor-map proxy.
pub(crate) fn acquire_maps(k: &mut KernelBuilder, maps: &[Reg<u64>]) {
    for &m in maps {
        k.fence_proxy_tensormap_acquire(m);
    }
}

/// The 128-byte map of a row-major bf16 `[rows, cols]` tensor at `addr`, read in
/// [64, `box_rows`] boxes with the 128-byte swizzle (zero fill out of bounds).
pub(crate) fn tensor_map(
    backend: Backend,
    addr: u64,
    (rows, cols): (usize, usize),
    box_rows: u32,
) -> Result<[u8; 128]> {
    let mut t = TensorMap::tiled(
        TensorDataType::BF16,
        addr,
        &[cols as u64, rows as u64],
        &[PANEL, box_rows],
    );
    t.swizzle = TSwizzle::B128;
    Ok(match backend {
        Backend::Emu => t.encode_emu()?,
        _ => t.encode_cuda()?,
    })
}
