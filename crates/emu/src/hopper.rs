//! Hopper-class asynchronous machinery: `wgmma` shared-memory matrix descriptors and the
//! warpgroup MMA itself, `mbarrier` objects with transaction counts and phases, and tensor maps
//! for `cp.async.bulk.tensor` (TMA).
//!
//! Asynchrony is modelled so that incorrect programs see what hardware may show them:
//! `wgmma.mma_async` results sit in a per-warp pending set until `wgmma.wait_group` retires their
//! group (reading the accumulator registers earlier yields the stale values), and TMA copies that
//! complete on an mbarrier land in shared memory only when a thread observes that barrier
//! (`mbarrier.try_wait` / `test_wait`), so reading the tile before waiting reads stale data.

use crate::fp;
pub use crate::tensormap::Im2colParams;
use ptx::Ty;

/// Swizzles and matrix descriptors are `ptx`'s (one definition for builder, emulator and
/// runtime); the emulator adds element addressing ([`DescAddr`]).
pub use ptx::ops::{MatrixDesc, Swizzle};

/// Element addressing through a wgmma shared-memory matrix descriptor.
pub trait DescAddr {
    /// Shared-memory byte address of element (`row`, `col`) of an operand whose rows are the
    /// strided ("outer") dimension in 8-row core-matrix groups and whose `col` runs along the
    /// contiguous dimension (`esize` bytes per element).
    ///
    /// K-major operand (A: row = m, col = k; B: row = n, col = k), or MN-major with the roles
    /// swapped (row = k, col = m/n). Layout: 8-row groups are `sbo` apart; within a group rows
    /// are one swizzle width apart (16 bytes without swizzle); the contiguous dimension
    /// continues in the next chunk of width bytes at `lbo`. Swizzling is applied to the
    /// absolute address.
    fn addr(&self, row: u64, col: u64, esize: u64) -> u64;
}

impl DescAddr for MatrixDesc {
    #[inline]
    fn addr(&self, row: u64, col: u64, esize: u64) -> u64 {
        let w = self.swizzle.width() as u64;
        let cb = col * esize;
        let linear = self.start as u64
            + (row / 8) * self.sbo as u64
            + (row % 8) * w
            + (cb / w) * self.lbo as u64
            + cb % w;
        self.swizzle.apply(linear)
    }
}

/// [`DescAddr::addr`] with the descriptor's fields and swizzle decoded once, for reading a
/// whole operand: the part of a row's address that does not depend on the column
/// ([`RowAddr::row`]), then each column's byte offset ([`RowAddr::at`]). Same addresses
/// (tested against [`DescAddr::addr`]).
#[derive(Clone, Copy, Debug)]
pub struct RowAddr {
    start: u64,
    lbo: u64,
    sbo: u64,
    /// log2 of the swizzle width (16..128 bytes), and the swizzle's XOR mask of row bits.
    wshift: u32,
    xor: u64,
}

impl RowAddr {
    pub fn new(d: &MatrixDesc) -> RowAddr {
        RowAddr {
            start: d.start as u64,
            lbo: d.lbo as u64,
            sbo: d.sbo as u64,
            wshift: d.swizzle.width().trailing_zeros(),
            xor: match d.swizzle {
                Swizzle::None => 0,
                Swizzle::B32 => 1,
                Swizzle::B64 => 3,
                Swizzle::B128 => 7,
            },
        }
    }

    /// The unswizzled address of byte 0 of row `row`.
    #[inline]
    pub fn row(&self, row: u64) -> u64 {
        self.start + (row >> 3) * self.sbo + ((row & 7) << self.wshift)
    }

    /// The address of byte `cb` of the row whose [`RowAddr::row`] is `row`.
    #[inline]
    pub fn at(&self, row: u64, cb: u64) -> u64 {
        let lin = row + (cb >> self.wshift) * self.lbo + (cb & ((1 << self.wshift) - 1));
        lin ^ (((lin >> 7) & self.xor) << 4)
    }
}

/// Element width in bytes of a wgmma/mma input type.
pub fn esize(t: Ty) -> u64 {
    match t {
        Ty::E4m3 | Ty::E5m2 | Ty::S8 | Ty::U8 => 1,
        Ty::F16 | Ty::Bf16 => 2,
        _ => 4,
    }
}

/// Decodes one input element to f64 (exact for all supported types).
#[inline]
pub fn elem_f64(t: Ty, bits: u64) -> f64 {
    match t {
        Ty::F16 => fp::f16_to_f32(bits as u16) as f64,
        Ty::Bf16 => fp::bf16_to_f32(bits as u16) as f64,
        Ty::E4m3 => fp::e4m3_to_f32(bits as u8) as f64,
        Ty::E5m2 => fp::e5m2_to_f32(bits as u8) as f64,
        Ty::Tf32 => f32::from_bits((bits as u32) & !0x1fff) as f64,
        Ty::S8 => bits as u8 as i8 as f64,
        Ty::U8 => bits as u8 as f64,
        _ => f32::from_bits(bits as u32) as f64,
    }
}

/// Static description of a `wgmma.mma_async` instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct WgmmaSpec {
    pub n: u32,
    pub k: u32,
    pub dty: Ty,
    pub aty: Ty,
    pub bty: Ty,
    /// A comes from registers (else from a shared-memory descriptor).
    pub a_regs: bool,
}

impl WgmmaSpec {
    pub fn from_instruction(ins: &ptx::Instruction) -> Result<WgmmaSpec, String> {
        let (m, n, k) = match ins.shape() {
            Some(ptx::Mod::Shape { m, n, k: Some(k) }) => (m as u32, n as u32, k as u32),
            _ => return Err("wgmma needs a .mMnNkK shape".into()),
        };
        let tys: Vec<Ty> = ins.types().collect();
        if m != 64 || tys.len() != 3 {
            return Err("wgmma needs shape m64nNkK and .dtype.atype.btype".into());
        }
        let (dty, aty, bty) = (tys[0], tys[1], tys[2]);
        let want_k = match aty {
            Ty::F16 | Ty::Bf16 => 16,
            Ty::E4m3 | Ty::E5m2 | Ty::S8 | Ty::U8 => 32,
            Ty::Tf32 => 8,
            _ => return Err(format!("wgmma input type .{aty} is not supported")),
        };
        // sparse: k counts the dense A columns (twice the dense form's; `crate::mma_sp`)
        let sparse = ins.op == ptx::Opcode::WgmmaMmaAsyncSp;
        let want_k = if sparse { 2 * want_k } else { want_k };
        if k != want_k || n % 8 != 0 || !(8..=256).contains(&n) {
            return Err(format!("wgmma shape m64n{n}k{k} is not valid for .{aty}"));
        }
        if dty != Ty::F32 && !(dty == Ty::S32 && matches!(aty, Ty::S8 | Ty::U8)) {
            return Err(format!(
                "wgmma accumulator .{dty} is not supported by the emulator (use .f32)"
            ));
        }
        let a_regs = matches!(ins.operand(ptx::Role::A), Some(ptx::Operand::Vec(_)));
        Ok(WgmmaSpec {
            n,
            k,
            dty,
            aty,
            bty,
            a_regs,
        })
    }

    /// Accumulator registers per thread.
    pub fn d_regs(&self) -> usize {
        (self.n / 2) as usize
    }
    /// A-fragment registers per thread when A comes from registers.
    pub fn a_regs_count(&self) -> usize {
        4
    }

    /// Row (0..16 within the warp's slice) and k of element `i` of lane `lane`'s A fragment.
    pub fn a_frag_pos(&self, lane: usize, i: usize) -> (usize, usize) {
        let (g, q) = (lane >> 2, lane & 3);
        if esize(self.aty) == 4 {
            // tf32 (m64nNk8): one element per register, as mma m16n8k8
            (g + 8 * (i & 1), q + 4 * (i >> 1))
        } else if esize(self.aty) == 2 {
            (g + 8 * ((i >> 1) & 1), 2 * q + (i & 1) + 8 * (i >> 2))
        } else {
            (g + 8 * ((i >> 2) & 1), 4 * q + (i & 3) + 16 * (i >> 3))
        }
    }
}

/// `(row within the warp's 16-row slice, column)` of accumulator register `i` of lane `lane`.
pub fn acc_pos(lane: usize, i: usize) -> (usize, usize) {
    let (g, q) = (lane >> 2, lane & 3);
    (g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * q + (i & 1))
}

/// An mbarrier object (kept beside shared memory, keyed by its shared address).
#[derive(Clone, Debug, Default)]
pub struct Mbarrier {
    pub expected: u32,
    pub pending: u32,
    pub tx: i64,
    /// Number of completed phases (the current phase's parity is `phase & 1`).
    pub phase: u32,
}

impl Mbarrier {
    pub fn init(count: u32) -> Mbarrier {
        Mbarrier {
            expected: count,
            pending: count,
            tx: 0,
            phase: 0,
        }
    }
    fn maybe_complete(&mut self) {
        if self.pending == 0 && self.tx <= 0 {
            self.phase = self.phase.wrapping_add(1);
            self.pending = self.expected;
            self.tx = 0;
        }
    }
    /// Arrives `count` times; returns the state token (the phase arrived on).
    pub fn arrive(&mut self, count: u32, drop: bool) -> u64 {
        let token = self.phase as u64;
        if drop {
            self.expected = self.expected.saturating_sub(count);
        }
        self.pending = self.pending.saturating_sub(count);
        self.maybe_complete();
        token
    }
    pub fn expect_tx(&mut self, bytes: u32) {
        self.tx += bytes as i64;
    }
    pub fn complete_tx(&mut self, bytes: u32) {
        self.tx -= bytes as i64;
        self.maybe_complete();
    }
    /// Has the phase with this parity completed (the current phase has the other parity)?
    pub fn parity_done(&self, parity: u32) -> bool {
        (self.phase & 1) != (parity & 1)
    }
    /// Has the phase named by a state token completed?
    pub fn token_done(&self, token: u64) -> bool {
        self.phase as u64 != token
    }
}

/// Element types of tensor maps (values of `CUtensorMapDataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TmaType {
    U8 = 0,
    U16 = 1,
    U32 = 2,
    I32 = 3,
    U64 = 4,
    I64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    Bf16 = 9,
}

impl TmaType {
    pub fn size(self) -> u32 {
        match self {
            TmaType::U8 => 1,
            TmaType::U16 | TmaType::F16 | TmaType::Bf16 => 2,
            TmaType::U32 | TmaType::I32 | TmaType::F32 => 4,
            _ => 8,
        }
    }
    pub fn from_code(c: u8) -> Option<TmaType> {
        Some(match c {
            0 => TmaType::U8,
            1 => TmaType::U16,
            2 => TmaType::U32,
            3 => TmaType::I32,
            4 => TmaType::U64,
            5 => TmaType::I64,
            6 => TmaType::F16,
            7 => TmaType::F32,
            8 => TmaType::F64,
            9 => TmaType::Bf16,
            _ => return None,
        })
    }
}

/// The emulator's 128-byte tensor-map object: the parameters of `cuTensorMapEncodeTiled` or
/// `cuTensorMapEncodeIm2col`, in a layout of our own (the driver's is opaque).
/// `runtime::TensorMap` encodes into it; `tensormap.replace` edits it in place
/// ([`crate::tensormap`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMapDesc {
    pub dtype: TmaType,
    pub rank: u32,
    pub global_address: u64,
    pub dims: [u32; 5],
    /// Byte strides of dimensions 1..rank (dimension 0 is contiguous).
    pub strides: [u64; 4],
    pub box_dims: [u32; 5],
    pub elem_strides: [u32; 5],
    pub swizzle: Swizzle,
    /// Fill out-of-bounds elements with NaN (else zero).
    pub oob_nan: bool,
    /// Interleave layout code (0 none, 1 16B, 2 32B; only 0 is emulated).
    pub interleave: u8,
    /// Im2col mode parameters; None for a tiled map.
    pub im2col: Option<Im2colParams>,
}

const MAGIC: u32 = 0x4d54_5850; // "PXTM"

impl TensorMapDesc {
    pub fn to_bytes(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.dtype as u8;
        b[5] = self.rank as u8;
        b[6] = match self.swizzle {
            Swizzle::None => 0,
            Swizzle::B32 => 1,
            Swizzle::B64 => 2,
            Swizzle::B128 => 3,
        };
        // bit 0: NaN fill, bit 1: im2col, bits 2-3: interleave
        b[7] = self.oob_nan as u8 | (self.im2col.is_some() as u8) << 1 | (self.interleave & 3) << 2;
        b[8..16].copy_from_slice(&self.global_address.to_le_bytes());
        for i in 0..5 {
            b[16 + 4 * i..20 + 4 * i].copy_from_slice(&self.dims[i].to_le_bytes());
            b[36 + 4 * i..40 + 4 * i].copy_from_slice(&self.box_dims[i].to_le_bytes());
            b[56 + 4 * i..60 + 4 * i].copy_from_slice(&self.elem_strides[i].to_le_bytes());
        }
        for i in 0..4 {
            b[80 + 8 * i..88 + 8 * i].copy_from_slice(&self.strides[i].to_le_bytes());
        }
        if let Some(p) = &self.im2col {
            p.write(&mut b);
        }
        b
    }

    pub fn from_bytes(b: &[u8]) -> Result<TensorMapDesc, String> {
        if b.len() < 128 || u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != MAGIC {
            return Err("not a ptxforge tensor map (encode it with runtime::TensorMap)".into());
        }
        let u32at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64at = |o: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(x)
        };
        let mut d = TensorMapDesc {
            dtype: TmaType::from_code(b[4]).ok_or("bad tensor map data type")?,
            rank: b[5] as u32,
            global_address: u64at(8),
            dims: [0; 5],
            strides: [0; 4],
            box_dims: [0; 5],
            elem_strides: [0; 5],
            swizzle: match b[6] {
                1 => Swizzle::B32,
                2 => Swizzle::B64,
                3 => Swizzle::B128,
                _ => Swizzle::None,
            },
            oob_nan: b[7] & 1 != 0,
            interleave: (b[7] >> 2) & 3,
            im2col: (b[7] & 2 != 0).then(|| Im2colParams::read(b)),
        };
        if !(1..=5).contains(&d.rank) {
            return Err(format!("tensor map rank {} (must be 1..5)", d.rank));
        }
        for i in 0..5 {
            d.dims[i] = u32at(16 + 4 * i);
            d.box_dims[i] = u32at(36 + 4 * i);
            d.elem_strides[i] = u32at(56 + 4 * i);
        }
        for i in 0..4 {
            d.strides[i] = u64at(80 + 8 * i);
        }
        Ok(d)
    }

    /// Bytes of one box (an im2col box: pixels times channels).
    pub fn box_bytes(&self) -> u64 {
        if let Some(p) = &self.im2col {
            return p.pixels_per_column as u64
                * p.channels_per_pixel as u64
                * self.dtype.size() as u64;
        }
        (0..self.rank as usize)
            .map(|i| self.box_dims[i] as u64)
            .product::<u64>()
            * self.dtype.size() as u64
    }

    /// Visits the box a copy at `coords` (with im2col `offsets`, empty for a tile or
    /// `.im2col_no_offs`) moves, as runs: [`TensorMapDesc::for_each_run`] for a tiled map,
    /// [`TensorMapDesc::for_each_run_im2col`] for an im2col one.
    pub fn for_each_box_run(
        &self,
        coords: &[i64],
        offsets: &[i64],
        f: impl FnMut(u64, Option<u64>, u64),
    ) {
        match &self.im2col {
            Some(p) => self.for_each_run_im2col(p, coords, offsets, f),
            None => self.for_each_run(coords, f),
        }
    }

    /// Visits the box at `coords` as runs along the innermost dimension: (shared byte offset
    /// within the box before swizzling, global address of the run or None when out of bounds,
    /// run length in bytes). In-bounds runs are contiguous in global memory; expanded, they are
    /// the box's elements in order (innermost dimension fastest).
    pub fn for_each_run(&self, coords: &[i64], mut f: impl FnMut(u64, Option<u64>, u64)) {
        let r = self.rank as usize;
        let es = self.dtype.size() as u64;
        let inner = self.box_dims[0] as u64;
        let rows: u64 = (1..r).map(|i| self.box_dims[i] as u64).product();
        let c0 = coords.first().copied().unwrap_or(0);
        // in-bounds element range of a row: [lo, hi) of 0..inner
        let lo = (-c0).clamp(0, inner as i64) as u64;
        let hi = (self.dims[0] as i64 - c0).clamp(lo as i64, inner as i64) as u64;
        let mut idx = [0u64; 5];
        for row in 0..rows {
            let mut rem = row;
            for i in 1..r {
                idx[i] = rem % self.box_dims[i] as u64;
                rem /= self.box_dims[i] as u64;
            }
            let mut inb = true;
            let mut ga = self.global_address;
            for i in 1..r {
                let c = coords.get(i).copied().unwrap_or(0) + idx[i] as i64;
                if c < 0 || c >= self.dims[i] as i64 {
                    inb = false;
                    break;
                }
                ga += c as u64 * self.strides[i - 1];
            }
            let base = row * inner * es;
            if !inb || lo == hi {
                f(base, None, inner * es);
                continue;
            }
            if lo > 0 {
                f(base, None, lo * es);
            }
            let g = ga + (c0 + lo as i64) as u64 * es;
            f(base + lo * es, Some(g), (hi - lo) * es);
            if hi < inner {
                f(base + hi * es, None, (inner - hi) * es);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// `RowAddr` gives `DescAddr::addr`'s address for random descriptors of every swizzle,
    /// rows, columns and element sizes.
    #[test]
    fn row_addr_matches_addr() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for sw in [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128] {
            for _ in 0..200 {
                let d = MatrixDesc {
                    start: rng.gen_range(0..1 << 14) << 4,
                    lbo: rng.gen_range(0..1 << 14) << 4,
                    sbo: rng.gen_range(0..1 << 14) << 4,
                    swizzle: sw,
                    ..MatrixDesc::default()
                };
                let ra = RowAddr::new(&d);
                for _ in 0..20 {
                    let (row, col) = (rng.gen_range(0..512u64), rng.gen_range(0..512u64));
                    let es = [1u64, 2, 4][rng.gen_range(0..3)];
                    let want = d.addr(row, col, es);
                    assert_eq!(ra.at(ra.row(row), col * es), want, "{d:?} {row} {col} {es}");
                }
            }
        }
    }

    /// Element-by-element reference traversal: (shared byte offset within the box before
    /// swizzling, global address or None when out of bounds).
    fn for_each(d: &TensorMapDesc, coords: &[i64], mut f: impl FnMut(u64, Option<u64>)) {
        let r = d.rank as usize;
        let es = d.dtype.size() as u64;
        let total: u64 = (0..r).map(|i| d.box_dims[i] as u64).product();
        let mut idx = [0u64; 5];
        for lin in 0..total {
            let mut rem = lin;
            for i in 0..r {
                idx[i] = rem % d.box_dims[i] as u64;
                rem /= d.box_dims[i] as u64;
            }
            let mut inb = true;
            let mut ga = d.global_address;
            for i in 0..r {
                let c = coords.get(i).copied().unwrap_or(0) + idx[i] as i64;
                if c < 0 || c >= d.dims[i] as i64 {
                    inb = false;
                    break;
                }
                ga += if i == 0 {
                    c as u64 * es
                } else {
                    c as u64 * d.strides[i - 1]
                };
            }
            f(lin * es, if inb { Some(ga) } else { None });
        }
    }

    /// `for_each_run` visits exactly the elements of the element-wise traversal, in order, with
    /// the same shared offsets and global addresses (boxes of rank 1-5 straddling every edge).
    #[test]
    fn runs_expand_to_the_elements() {
        let mut rg = rand::rngs::StdRng::seed_from_u64(5);
        for _ in 0..300 {
            let rank = rg.gen_range(1..=5u32);
            let dtype =
                [TmaType::U8, TmaType::Bf16, TmaType::F32, TmaType::F64][rg.gen_range(0..4)];
            let es = dtype.size() as u64;
            let mut d = TensorMapDesc {
                dtype,
                rank,
                global_address: 1 << 20,
                dims: [1; 5],
                strides: [0; 4],
                box_dims: [1; 5],
                elem_strides: [1; 5],
                swizzle: Swizzle::None,
                oob_nan: false,
                interleave: 0,
                im2col: None,
            };
            let mut stride = 0u64;
            for i in 0..rank as usize {
                d.dims[i] = rg.gen_range(1..40);
                d.box_dims[i] = rg.gen_range(1..12);
                if i == 0 {
                    stride = d.dims[0] as u64 * es + 16 * rg.gen_range(0..3);
                } else {
                    d.strides[i - 1] = stride;
                    stride *= d.dims[i] as u64 + rg.gen_range(0..2);
                }
            }
            let coords: Vec<i64> = (0..rank as usize)
                .map(|i| rg.gen_range(-(d.box_dims[i] as i64)..d.dims[i] as i64 + 2))
                .collect();
            let mut want = Vec::new();
            for_each(&d, &coords, |o, g| want.push((o, g)));
            let mut got = Vec::new();
            d.for_each_run(&coords, |o, g, len| {
                assert_eq!(len % es, 0);
                for e in 0..len / es {
                    got.push((o + e * es, g.map(|g| g + e * es)));
                }
            });
            assert_eq!(got, want, "{d:?} at {coords:?}");
        }
    }
}
