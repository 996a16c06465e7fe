//! Sparse `mma.sp` / `mma.sp::ordered_metadata`: every shape and type ptxas 13.5 accepts on
//! sm_80..sm_90a (f16/bf16 m16n8k16 and m16n8k32, tf32 m16n8k8 and m16n8k16, e4m3/e5m2
//! m16n8k64 on sm_89+, s8/u8 m16n8k32 and m16n8k64, s4/u4 m16n8k64 and m16n8k128, the integer
//! forms with or without `.satfinite`). The compressed A fragment is expanded with the metadata
//! into the dense A fragment of the same shape, which [`crate::mma_any`] multiplies. On hardware
//! the sparse tensor core adds the same products as the dense form on the decompressed
//! operand (the zeros of A contribute nothing), so the float forms use the dense form's
//! numerics: the target's tensor-core model or the exact mode. `::ordered_metadata` only
//! promises that the two indices of a chunk are in increasing order; both variants expand the
//! same way.
//!
//! # Sparse storage (PTX ISA, "Sparse matrix storage", "Matrix fragments for mma.sp")
//! Every form keeps half of each row of A. Counted in *units* of 16 bits (f16, bf16, and tf32,
//! whose 1:2 sparsity is written as two 2-bit indices of 16-bit halves: `0b0100` selects the
//! first tf32 of a pair, `0b1110` the second) or of 8 bits (s8, u8, e4m3, e5m2, and s4/u4,
//! whose 4:8 pair-wise sparsity keeps whole bytes), each chunk of four units keeps two; a 4-bit
//! metadata field holds their positions in the chunk, the first kept unit's in the low two bits.
//! - Compressed A: register `i` of lane `(g, q)` holds bytes `16*(i >> 1) + 4q ..+4` of
//!   compressed row `g + 8*(i & 1)` (the dense m16n8 A rule of [`crate::mma_any`] applied to
//!   the compressed `16 x k/2` matrix), and the dense fragment has the same byte mapping for
//!   the dense row.
//! - Metadata, 16-bit units: a thread holds four chunks of rows `g` (bits 0..15) and `g + 8`
//!   (bits 16..31), chunk `c` at bits `4c`; with `t` threads per group of four (1 for
//!   m16n8k16 f16/bf16 and m16n8k8 tf32, 2 for m16n8k32 f16/bf16 and m16n8k16 tf32), lane
//!   `4g + t*sel + j` holds chunks `4j ..`.
//! - Metadata, 8-bit units: a thread holds eight chunks of one row at bits `4c`; with `t`
//!   threads (2 for s8/u8 m16n8k32 and s4/u4 m16n8k64, 4 for m16n8k64 s8/u8/e4m3/e5m2 and
//!   m16n8k128 s4/u4), lane `4g + t*sel + j` holds row `g + 8*(j & 1)`, chunks `8*(j >> 1) ..`.
//!
//! The metadata thread layouts are those of CUTLASS's `ELayout_64x32` / `_64x16` / `_64x64`
//! (cute `mma_traits_sm90_gmma_sparse.hpp`), which the PTX ISA draws with the same figures for
//! `mma.sp` and `wgmma.mma_async.sp`.

use crate::mma_any::{shape, AnySpec};
use crate::Lanes;
use ptx::{Flag, Instruction, Ty};

/// How a sparse A is compressed and where its metadata lives (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SparseLayout {
    /// Bytes per storage unit: 2 (f16/bf16/tf32) or 1 (8- and 4-bit types).
    pub unit: usize,
    /// Threads per group of four that hold metadata.
    pub threads: usize,
}

/// A decoded sparse mma: the dense form it computes and how its A is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SparseSpec {
    /// The dense form (shape as written: k counts the dense A columns).
    pub dense: AnySpec,
    pub layout: SparseLayout,
}

impl SparseSpec {
    /// Decodes `mma.sp{::ordered_metadata}.sync.aligned.shape.row.col{.satfinite}.d.a.b.c`.
    pub fn from_instruction(ins: &Instruction) -> Result<SparseSpec, String> {
        if !(ins.has(Flag::Row) && ins.has(Flag::Col)) {
            return Err("mma.sp needs .row.col".into());
        }
        let tys: Vec<Ty> = ins.types().collect();
        let [dty, aty, bty, cty] = tys[..] else {
            return Err("mma.sp needs four types (d, a, b, c)".into());
        };
        let (m, n, k) = shape(ins)?;
        let dense = AnySpec::new((m, n, k), [dty, aty, bty, cty], ins)?;
        let (unit, threads) = match (m, n, k, aty) {
            (16, 8, 16, Ty::F16 | Ty::Bf16) | (16, 8, 8, Ty::Tf32) => (2, 1),
            (16, 8, 32, Ty::F16 | Ty::Bf16) | (16, 8, 16, Ty::Tf32) => (2, 2),
            (16, 8, 32, Ty::S8 | Ty::U8) | (16, 8, 64, Ty::S4 | Ty::U4) => (1, 2),
            (16, 8, 64, Ty::S8 | Ty::U8 | Ty::E4m3 | Ty::E5m2) => (1, 4),
            (16, 8, 128, Ty::S4 | Ty::U4) => (1, 4),
            _ => {
                return Err(format!(
                    "unsupported mma.sp form .m{m}n{n}k{k}.{dty}.{aty}.{bty}.{cty}"
                ))
            }
        };
        if matches!(aty, Ty::E4m3 | Ty::E5m2) && dty != Ty::F32 {
            return Err("mma.sp with .e4m3/.e5m2 inputs needs .f32 accumulators".into());
        }
        Ok(SparseSpec {
            dense,
            layout: SparseLayout { unit, threads },
        })
    }

    /// Registers per lane of the compressed A, B, C and D fragments.
    pub fn frag_counts(&self) -> (usize, usize, usize, usize) {
        let (a, b, c, d) = self.dense.frag_counts();
        (a / 2, b, c, d)
    }

    /// The largest valid sparsity selector.
    pub fn max_selector(&self) -> u32 {
        self.layout.max_selector()
    }

    /// Expands compressed A registers `a` into the dense A fragment of [`SparseSpec::dense`]
    /// with the metadata register `meta` and selector `sel`.
    pub fn expand(&self, a: &[&Lanes], meta: &Lanes, sel: u32) -> Vec<Lanes> {
        self.layout.expand(a, meta, sel)
    }
}

impl SparseLayout {
    /// The layout of `wgmma.mma_async.sp` with input type `aty`: each warp's 16 rows are
    /// stored as the `mma.sp` of the same k per row (f16/bf16 k32, tf32 k16: two threads;
    /// 8-bit k64: four threads).
    pub fn for_wgmma(aty: Ty) -> SparseLayout {
        match aty {
            Ty::F16 | Ty::Bf16 | Ty::Tf32 => SparseLayout {
                unit: 2,
                threads: 2,
            },
            _ => SparseLayout {
                unit: 1,
                threads: 4,
            },
        }
    }

    /// The largest valid sparsity selector (selectors past it are undefined behaviour in PTX;
    /// the decoders reject them).
    pub fn max_selector(&self) -> u32 {
        (4 / self.threads as u32) - 1
    }

    /// The metadata nibble of chunk `c` of row `row` (0..16) for selector `sel`.
    fn nibble(&self, meta: &Lanes, row: usize, c: usize, sel: u32) -> u32 {
        let (j, bit) = self.meta_at(row, c, sel as usize);
        ((meta[4 * (row % 8) + j] as u32) >> bit) & 0xf
    }

    /// Expands a compressed A of decoded values (16 rows of `kc` elements of `esize` bytes,
    /// row-major) into the dense 16 x 2`kc` A with the metadata register `meta` and selector
    /// `sel` (a tf32 element is two 16-bit units: it moves with the first of them).
    pub fn expand_values(
        &self,
        comp: &[f64],
        kc: usize,
        esize: usize,
        meta: &Lanes,
        sel: u32,
    ) -> Vec<f64> {
        let u = self.unit;
        let mut dense = vec![0f64; 32 * kc];
        for row in 0..16 {
            for c in 0..kc * esize / (2 * u) {
                let md = self.nibble(meta, row, c, sel);
                for slot in 0..2 {
                    let (from, to) = (
                        (2 * c + slot) * u,
                        (4 * c + ((md >> (2 * slot)) & 3) as usize) * u,
                    );
                    if from % esize == 0 && to % esize == 0 {
                        dense[row * 2 * kc + to / esize] = comp[row * kc + from / esize];
                    }
                }
            }
        }
        dense
    }

    /// Lane (within group `g`'s four) and bit offset of the metadata of chunk `c` of dense row
    /// `row` for selector `sel` (module docs).
    fn meta_at(&self, row: usize, c: usize, sel: usize) -> (usize, u32) {
        let base = self.threads * sel;
        if self.unit == 2 {
            let j = c / 4;
            let bit = 16 * (row / 8) + 4 * (c % 4);
            (base + j, bit as u32)
        } else {
            let j = (row / 8) + 2 * (c / 8);
            (base + j, 4 * (c % 8) as u32)
        }
    }

    /// Expands compressed A registers `a` (2 or 4 per lane) into the dense A fragment (twice
    /// as many) with the metadata register `meta` and selector `sel`.
    pub fn expand(&self, a: &[&Lanes], meta: &Lanes, sel: u32) -> Vec<Lanes> {
        let nc = a.len();
        let row_bytes = 8 * nc; // compressed bytes per row: 16 (2 registers) or 32 (4)
        let mut comp = vec![vec![0u8; row_bytes]; 16];
        for (i, r) in a.iter().enumerate() {
            for (lane, v) in r.iter().enumerate() {
                let (g, q) = (lane >> 2, lane & 3);
                let at = 16 * (i >> 1) + 4 * q;
                comp[g + 8 * (i & 1)][at..at + 4].copy_from_slice(&(*v as u32).to_le_bytes());
            }
        }
        let u = self.unit;
        let mut dense = vec![vec![0u8; 2 * row_bytes]; 16];
        for (row, (src, dst)) in comp.iter().zip(dense.iter_mut()).enumerate() {
            for c in 0..row_bytes / (2 * u) {
                let md = self.nibble(meta, row, c, sel);
                for slot in 0..2 {
                    let idx = ((md >> (2 * slot)) & 3) as usize;
                    let from = (2 * c + slot) * u;
                    let to = (4 * c + idx) * u;
                    dst[to..to + u].copy_from_slice(&src[from..from + u]);
                }
            }
        }
        let mut out = vec![[0u64; 32]; 2 * nc];
        for (i, reg) in out.iter_mut().enumerate() {
            for (lane, v) in reg.iter_mut().enumerate() {
                let (g, q) = (lane >> 2, lane & 3);
                let at = 16 * (i >> 1) + 4 * q;
                let row = &dense[g + 8 * (i & 1)];
                *v = u32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]) as u64;
            }
        }
        out
    }
}
