//! Hopper (sm_90a) building blocks in the CuTe / DeepGEMM style, on top of the one-instruction
//! methods of [`crate::ops`]:
//!
//! - warpgroups and warp-specialised roles with register budgets ([`RegBudget`],
//!   [`KernelBuilder::warp_specialize`]: `setmaxnreg.dec` for the producer, `.inc` for the
//!   consumers);
//! - wgmma shared-memory matrix descriptors ([`MatrixDesc`] -> a `u64` register with
//!   [`KernelBuilder::matrix_desc`]) and the FP8 `wgmma ... k32` form
//!   ([`KernelBuilder::wgmma_mma_async_fp8`]);
//! - swizzled shared tiles ([`SmemTile`]: rows x row bytes with a swizzle; knows its descriptor
//!   and is a TMA destination) and a bump allocator for dynamic shared memory ([`SmemLayout`]);
//! - tensor-map parameters passed through global memory ([`KernelBuilder::param_tensormap_ptr`])
//!   and 2-D TMA loads, optionally multicast across a cluster; im2col loads
//!   ([`KernelBuilder::tma_load_im2col`]); editing a map in the kernel
//!   ([`KernelBuilder::tensormap_replace`], [`KernelBuilder::tensormap_cp_fenceproxy`],
//!   [`KernelBuilder::fence_proxy_tensormap_release`]);
//! - an mbarrier pipeline ([`Pipeline`] + [`PipeState`]: stage index and phase bit,
//!   `producer_acquire` / `producer_commit_tx`, `consumer_wait` / `consumer_release`).
//!
//! Phase convention (CUTLASS's): consumers wait on `full[stage]` with parity `phase`, producers
//! wait on `empty[stage]` with parity `phase ^ 1`, so the first pass over the ring does not block
//! the producer (an mbarrier reports the phase "before" its first one as complete).

use crate::error::BuildError;
use crate::kernel::KernelBuilder;
use crate::ty::*;
/// Swizzles and wgmma matrix descriptors are `ptx`'s (one definition for builder, emulator and
/// runtime).
pub use ptx::ops::{MatrixDesc, Swizzle};
pub use ptx::ops::{Scope, TensormapField};
use ptx::{Flag, Mod, Opcode, Operand, Ty};

/// Where a tensor map that `tensormap.replace` edits lives.
#[derive(Clone, Copy, Debug)]
pub enum TensormapAt {
    /// 128 bytes of this CTA's shared memory (`.shared::cta`).
    Shared(SharedPtr<u8>),
    /// A global-memory map at this generic address (`.global`).
    Global(Reg<u64>),
}

/// The new value `tensormap.replace` writes: 64-bit for `global_address` and `global_stride`,
/// 32-bit otherwise; the coded fields (`elemtype`, `interleave_layout`, `swizzle_mode`,
/// `fill_mode`) take an immediate.
#[derive(Clone, Copy, Debug)]
pub enum TensormapValue {
    Imm(u64),
    B32(Reg<u32>),
    B64(Reg<u64>),
}

/// A shared-memory tile of `rows` rows of `row_bytes` bytes with a swizzle, laid out as TMA
/// writes it (row-major inside `rows x width` slabs, slabs one after the other).
#[derive(Clone, Copy, Debug)]
pub struct SmemTile {
    pub base: SharedPtr<u8>,
    pub rows: u32,
    pub row_bytes: u32,
    pub swizzle: Swizzle,
}

impl SmemTile {
    /// Bytes the tile occupies.
    pub fn bytes(&self) -> u32 {
        self.rows * self.row_bytes
    }
    /// The tile moved by a constant number of bytes (another pipeline stage).
    pub fn add_bytes(self, bytes: i64) -> SmemTile {
        SmemTile {
            base: self.base.add_bytes(bytes),
            ..self
        }
    }
    /// The tile re-based on a runtime stage base register (plus this tile's constant offset).
    pub fn rebase(self, base: Reg<u32>) -> SmemTile {
        SmemTile {
            base: SharedPtr::from_reg(base).add_bytes(self.base.byte_offset()),
            ..self
        }
    }
    /// Descriptor constants of this tile as a K-major wgmma operand.
    pub fn desc(&self) -> MatrixDesc {
        MatrixDesc::k_major(self.swizzle, self.rows)
    }
    /// TMA box of this tile for a 2-D tensor map with `elem_bytes`-byte elements:
    /// `[width / elem_bytes, rows]` (one box per slab).
    pub fn tma_box(&self, elem_bytes: u32) -> [u32; 2] {
        [self.swizzle.width() / elem_bytes, self.rows]
    }
    /// Number of `rows x width` slabs (TMA boxes) that make up the tile.
    pub fn slabs(&self) -> u32 {
        self.row_bytes / self.swizzle.width()
    }
}

/// Bump allocator over the dynamic shared-memory window, with alignment.
#[derive(Clone, Copy, Debug)]
pub struct SmemLayout {
    base: SharedPtr<u8>,
    off: u32,
}

impl SmemLayout {
    /// Starts at the `dyn_smem` window (declared 1024-byte aligned for 128B-swizzled tiles).
    #[track_caller]
    pub fn new(k: &mut KernelBuilder) -> SmemLayout {
        SmemLayout {
            base: k.dynamic_shared::<u8>(1024),
            off: 0,
        }
    }
    /// The window's base pointer.
    pub fn base(&self) -> SharedPtr<u8> {
        self.base
    }
    /// Bytes used so far.
    pub fn used(&self) -> u32 {
        self.off
    }
    /// Reserves `bytes` at `align`; returns the byte offset from the base.
    #[track_caller]
    pub fn reserve(&mut self, bytes: u32, align: u32) -> u32 {
        let a = align.max(1);
        self.off = self.off.div_ceil(a) * a;
        let o = self.off;
        self.off += bytes;
        o
    }
    /// A swizzled tile (`row_bytes` must be a multiple of the swizzle width).
    #[track_caller]
    pub fn tile(&mut self, rows: u32, row_bytes: u32, swizzle: Swizzle) -> SmemTile {
        let o = self.reserve(rows * row_bytes, swizzle.align());
        SmemTile {
            base: self.base.add_bytes(o as i64),
            rows,
            row_bytes,
            swizzle,
        }
    }
    /// `n` elements of `T` (e.g. scales).
    #[track_caller]
    pub fn array<T: PtxType>(&mut self, n: u32, align: u32) -> SharedPtr<T> {
        let o = self.reserve(n * T::SIZE, align.max(T::SIZE));
        self.base.add_bytes(o as i64).cast()
    }
    /// `n` mbarriers (8 bytes each).
    #[track_caller]
    pub fn barriers(&mut self, n: u32) -> SharedPtr<u64> {
        self.array::<u64>(n, 8)
    }
}

/// Registers per thread of the two roles of a warp-specialised kernel (`setmaxnreg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegBudget {
    /// TMA producer warpgroup (`setmaxnreg.dec`), e.g. 40.
    pub producer: u32,
    /// Math (consumer) warpgroups (`setmaxnreg.inc`), e.g. 232.
    pub consumer: u32,
}

impl RegBudget {
    /// DeepGEMM's split: 40 for the producer, 232 for the math warpgroups.
    pub const DEEPGEMM: RegBudget = RegBudget {
        producer: 40,
        consumer: 232,
    };
    /// Checks the budgets and that `producer_wgs` + `consumer_wgs` warpgroups fit in one SM's
    /// 64K registers.
    pub fn check(&self, producer_wgs: u32, consumer_wgs: u32) -> Result<(), BuildError> {
        for n in [self.producer, self.consumer] {
            if !(24..=256).contains(&n) || n % 8 != 0 {
                return Err(BuildError::Invalid(format!(
                    "setmaxnreg count {n}: must be a multiple of 8 in 24..=256"
                )));
            }
        }
        let total = 128 * (producer_wgs * self.producer + consumer_wgs * self.consumer);
        if total > 65536 {
            return Err(BuildError::Invalid(format!(
                "register budget {self:?} for {producer_wgs}+{consumer_wgs} warpgroups needs {total} registers (> 65536)"
            )));
        }
        Ok(())
    }
}

/// FP8 element kinds of `wgmma ... k32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8 {
    E4m3,
    E5m2,
}

impl Fp8 {
    fn ty(self) -> Ty {
        match self {
            Fp8::E4m3 => Ty::E4m3,
            Fp8::E5m2 => Ty::E5m2,
        }
    }
}

/// The position in an mbarrier ring: stage index and phase bit (both runtime registers, updated
/// in place by [`PipeState::advance`]).
#[derive(Clone, Copy, Debug)]
pub struct PipeState {
    pub stage: Reg<u32>,
    pub phase: Reg<u32>,
}

impl PipeState {
    /// Stage 0, phase 0.
    #[track_caller]
    pub fn new(k: &mut KernelBuilder) -> PipeState {
        PipeState {
            stage: k.mov(0u32),
            phase: k.mov(0u32),
        }
    }
    /// Next stage; the phase flips when the ring wraps.
    #[track_caller]
    pub fn advance(&self, k: &mut KernelBuilder, stages: u32) {
        k.add_to(self.stage, self.stage, 1u32);
        let wrap = k.eq(self.stage, stages);
        let s = k.selp(0u32, self.stage, wrap);
        k.mov_to(self.stage, s);
        let flip = k.selp(1u32, 0u32, wrap);
        let ph = k.xor(self.phase, flip);
        k.mov_to(self.phase, ph);
    }
}

/// A `stages`-deep producer/consumer ring of `full` / `empty` mbarrier pairs.
#[derive(Clone, Copy, Debug)]
pub struct Pipeline {
    pub full: SharedPtr<u64>,
    pub empty: SharedPtr<u64>,
    pub stages: u32,
}

impl Pipeline {
    /// Reserves the barriers in `layout`.
    pub fn new(layout: &mut SmemLayout, stages: u32) -> Pipeline {
        let full = layout.barriers(stages);
        let empty = layout.barriers(stages);
        Pipeline {
            full,
            empty,
            stages,
        }
    }
    /// Initialises every barrier (`full` expects `producer_arrivals`, `empty`
    /// `consumer_arrivals`) from the threads where `leader` holds, then
    /// `fence.mbarrier_init` + a CTA barrier so every thread sees them.
    #[track_caller]
    pub fn init(
        &self,
        k: &mut KernelBuilder,
        leader: Reg<Pred>,
        producer_arrivals: u32,
        consumer_arrivals: u32,
    ) {
        k.if_(leader, |k| {
            for s in 0..self.stages as i64 {
                k.mbarrier_init(self.full.at(s), producer_arrivals);
                k.mbarrier_init(self.empty.at(s), consumer_arrivals);
            }
            k.fence_mbarrier_init();
        });
        k.sync_threads();
    }
    #[track_caller]
    fn bar(k: &mut KernelBuilder, base: SharedPtr<u64>, st: &PipeState) -> SharedPtr<u64> {
        let a = k.mad_lo(st.stage, 8u32, base.reg());
        SharedPtr::from_reg(a).add_bytes(base.byte_offset())
    }
    /// `full[stage]` (the barrier TMA loads of this stage complete on).
    #[track_caller]
    pub fn full_bar(&self, k: &mut KernelBuilder, st: &PipeState) -> SharedPtr<u64> {
        Self::bar(k, self.full, st)
    }
    /// `empty[stage]`.
    #[track_caller]
    pub fn empty_bar(&self, k: &mut KernelBuilder, st: &PipeState) -> SharedPtr<u64> {
        Self::bar(k, self.empty, st)
    }
    /// Producer: waits until the consumers released this stage.
    #[track_caller]
    pub fn producer_acquire(&self, k: &mut KernelBuilder, st: &PipeState) {
        let b = self.empty_bar(k, st);
        let par = k.xor(st.phase, 1u32);
        k.mbarrier_wait_parity(b, par);
    }
    /// Producer (one thread): arrives on `full[stage]` announcing `bytes` of transactions; returns
    /// the barrier for the TMA copies.
    #[track_caller]
    pub fn producer_commit_tx(
        &self,
        k: &mut KernelBuilder,
        st: &PipeState,
        bytes: u32,
    ) -> SharedPtr<u64> {
        let b = self.full_bar(k, st);
        k.mbarrier_arrive_expect_tx(b, bytes);
        b
    }
    /// Consumer: waits until this stage's data has landed.
    #[track_caller]
    pub fn consumer_wait(&self, k: &mut KernelBuilder, st: &PipeState) {
        let b = self.full_bar(k, st);
        k.mbarrier_wait_parity(b, st.phase);
    }
    /// Consumer: releases this stage to the producer (one arrival from each calling thread;
    /// size `consumer_arrivals` of [`Pipeline::init`] accordingly).
    #[track_caller]
    pub fn consumer_release(&self, k: &mut KernelBuilder, st: &PipeState) {
        let b = self.empty_bar(k, st);
        k.mbarrier_arrive(b);
    }
    /// Consumer: releases this stage on the `empty` barrier of CTA `rank` of the cluster
    /// (`mapa` + `mbarrier.arrive.shared::cluster`), for multicast pipelines.
    #[track_caller]
    pub fn consumer_release_cluster(
        &self,
        k: &mut KernelBuilder,
        st: &PipeState,
        rank: impl Src<u32>,
    ) {
        let b = self.empty_bar(k, st);
        let remote = k.mapa(b, rank);
        let a = k.addr_operand(remote);
        k.emit(
            Opcode::MbarrierArrive,
            [
                Mod::Flag(Flag::Release),
                Mod::Flag(Flag::Cluster),
                Mod::Space(ptx::Space::SharedCluster),
                Mod::Type(Ty::B64),
            ],
            [Operand::Sink, a],
        );
    }
}

impl KernelBuilder {
    /// `%tid.x >> 7`: the warpgroup of this thread.
    #[track_caller]
    pub fn warpgroup_index(&mut self) -> Reg<u32> {
        let t = self.tid_x();
        self.shr(t, 7u32)
    }
    /// `%tid.x & 127`: the thread's index within its warpgroup.
    #[track_caller]
    pub fn warpgroup_thread(&mut self) -> Reg<u32> {
        let t = self.tid_x();
        self.and(t, 127u32)
    }
    /// Warp specialisation: threads where `is_producer` holds run `producer` after
    /// `setmaxnreg.dec budget.producer`, the others run `consumer` after
    /// `setmaxnreg.inc budget.consumer`. `is_producer` must be uniform per warpgroup.
    #[track_caller]
    pub fn warp_specialize(
        &mut self,
        is_producer: Reg<Pred>,
        budget: RegBudget,
        producer: impl FnOnce(&mut Self),
        consumer: impl FnOnce(&mut Self),
    ) {
        for n in [budget.producer, budget.consumer] {
            if !(24..=256).contains(&n) || n % 8 != 0 {
                self.fail(BuildError::Invalid(format!(
                    "setmaxnreg count {n}: must be a multiple of 8 in 24..=256"
                )));
            }
        }
        self.if_else(
            is_producer,
            |k| {
                k.setmaxnreg_dec(budget.producer);
                producer(k);
            },
            |k| {
                k.setmaxnreg_inc(budget.consumer);
                consumer(k);
            },
        );
    }

    /// A wgmma descriptor for the shared byte address `addr` with the constants of `d`
    /// (`d.start` is added to `addr`): `cvt.u64.u32`, `shr`, `and`, `or`.
    #[track_caller]
    pub fn matrix_desc(&mut self, addr: Reg<u32>, d: MatrixDesc) -> Reg<u64> {
        let a = if d.start != 0 {
            self.add(addr, d.start)
        } else {
            addr
        };
        let w = self.cvt::<u64, u32>(a);
        let s = self.shr(w, 4u32);
        let s = self.and(s, 0x3fffu64);
        let c = MatrixDesc { start: 0, ..d }.encode();
        self.or(s, c)
    }
    /// The descriptor of a tile as a K-major operand starting at row `row` (a multiple of 8)
    /// and K byte `kbyte` (within one swizzle row, or at a slab boundary).
    #[track_caller]
    pub fn tile_desc(&mut self, t: &SmemTile, row: u32, kbyte: u32) -> Reg<u64> {
        let d = t.desc();
        let w = t.swizzle.width();
        let off = t.base.byte_offset() as u32 + (row / 8) * d.sbo + (kbyte / w) * d.lbo + kbyte % w;
        let base = t.base.reg();
        self.matrix_desc(base, MatrixDesc { start: off, ..d })
    }
    /// Advances a descriptor by `bytes` (a multiple of 16) along its start address.
    #[track_caller]
    pub fn desc_add(&mut self, desc: Reg<u64>, bytes: u32) -> Reg<u64> {
        self.add(desc, (bytes as u64 >> 4) as i64 as u64)
    }

    /// `wgmma.mma_async.sync.aligned.m64nNk32.f32.A.B {d..}, adesc, bdesc, scale_d, 1, 1;` —
    /// the FP8 form (both operands K-major from shared memory; `d` holds `N/2` f32).
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn wgmma_mma_async_fp8(
        &mut self,
        n: u16,
        d: &[Reg<f32>],
        a_desc: Reg<u64>,
        b_desc: Reg<u64>,
        scale_d: Reg<Pred>,
        a: Fp8,
        b: Fp8,
    ) {
        if n == 0 || n > 256 || n & 7 != 0 || d.len() != n as usize / 2 {
            self.fail(BuildError::Invalid(format!(
                "wgmma m64n{n}k32: N must be a multiple of 8 in 8..=256 with N/2 accumulators (got {})",
                d.len()
            )));
            return;
        }
        let mods = [
            Mod::Flag(Flag::Sync),
            Mod::Flag(Flag::Aligned),
            Mod::Shape {
                m: 64,
                n,
                k: Some(32),
            },
            Mod::Type(Ty::F32),
            Mod::Type(a.ty()),
            Mod::Type(b.ty()),
        ];
        let one = Operand::Imm(ptx::Imm::Int(1));
        self.emit(
            Opcode::WgmmaMmaAsync,
            mods,
            [
                Operand::Vec(d.iter().map(|r| r.op()).collect()),
                a_desc.op(),
                b_desc.op(),
                scale_d.op(),
                one.clone(),
                one,
            ],
        );
    }

    /// A tensor map passed through global memory: a `u64` parameter holding the device address
    /// of a 128-byte, 64-byte-aligned tensor-map object (`CUtensorMap` on CUDA,
    /// `emu::hopper::TensorMapDesc` on the emulator). Returns the generic address TMA
    /// instructions take. (Use [`KernelBuilder::param_tensormap`] for a by-value
    /// `.param .b8 [128]` map.)
    #[track_caller]
    pub fn param_tensormap_ptr(&mut self, name: &str) -> Reg<u64> {
        self.param::<u64>(name)
    }

    /// 2-D TMA load of box `(c0, c1)` of `tmap` into `dst`, completing on `bar`.
    #[track_caller]
    pub fn tma_load_2d(
        &mut self,
        dst: SharedPtr<u8>,
        tmap: Reg<u64>,
        c0: impl Src<i32>,
        c1: impl Src<i32>,
        bar: SharedPtr<u64>,
    ) {
        let x = self.mov(c0);
        let y = self.mov(c1);
        self.cp_async_bulk_tensor_g2s(dst, tmap, &[x, y], bar);
    }

    /// 2-D TMA load multicast to the CTAs of the cluster in `mask` (same shared offset and
    /// barrier offset in each): `cp.async.bulk.tensor.2d...multicast::cluster`.
    #[track_caller]
    pub fn tma_load_2d_multicast(
        &mut self,
        dst: SharedPtr<u8>,
        tmap: Reg<u64>,
        c0: impl Src<i32>,
        c1: impl Src<i32>,
        bar: SharedPtr<u64>,
        mask: Reg<u16>,
    ) {
        let x = self.mov(c0);
        let y = self.mov(c1);
        let d = self.addr_operand(dst);
        let m = self.addr_operand(bar);
        let ta = Operand::TensorAddr {
            base: ptx::AddrBase::Reg(tmap.name()),
            coords: vec![x.op(), y.op()],
        };
        self.emit(
            Opcode::CpAsyncBulkTensor,
            [
                Mod::Dim(2),
                Mod::Space(ptx::Space::SharedCluster),
                Mod::Space(ptx::Space::Global),
                Mod::Flag(Flag::Tile),
                Mod::Flag(Flag::CompleteTxBytes),
                Mod::Flag(Flag::MulticastCluster),
            ],
            [d, ta, m, mask.op()],
        );
    }
}

impl KernelBuilder {
    /// Im2col TMA load (sm_90): `cp.async.bulk.tensor.Nd.shared::cluster.global.im2col
    /// .mbarrier::complete_tx::bytes [dst], [tmap, {coords}], [bar], {offsets}` with coordinates
    /// `c, w[, h[, d]], n` (3..=5 of them) and one 16-bit offset per spatial dimension.
    #[track_caller]
    pub fn tma_load_im2col(
        &mut self,
        dst: SharedPtr<u8>,
        tmap: Reg<u64>,
        coords: &[Reg<i32>],
        offsets: &[Reg<u16>],
        bar: SharedPtr<u64>,
    ) {
        if !(3..=5).contains(&coords.len()) || offsets.len() + 2 != coords.len() {
            self.fail(BuildError::Invalid(format!(
                "an im2col TMA load takes 3..=5 coordinates and two fewer offsets, not {} and {}",
                coords.len(),
                offsets.len()
            )));
            return;
        }
        let d = self.addr_operand(dst);
        let m = self.addr_operand(bar);
        let ta = Operand::TensorAddr {
            base: ptx::AddrBase::Reg(tmap.name()),
            coords: coords.iter().map(|c| c.op()).collect(),
        };
        let offs = Operand::Vec(offsets.iter().map(|o| o.op()).collect());
        self.emit(
            Opcode::CpAsyncBulkTensor,
            [
                Mod::Dim(coords.len() as u8),
                Mod::Space(ptx::Space::SharedCluster),
                Mod::Space(ptx::Space::Global),
                Mod::Flag(Flag::Im2col),
                Mod::Flag(Flag::CompleteTxBytes),
            ],
            [d, ta, m, offs],
        );
    }

    /// `tensormap.replace.tile.FIELD.SPACE.b1024.bN [map], {ord,} value` (sm_90a, PTX 8.3):
    /// `ord` (0..4) is written only for the per-dimension fields.
    #[track_caller]
    pub fn tensormap_replace(
        &mut self,
        map: TensormapAt,
        field: TensormapField,
        ord: u32,
        value: TensormapValue,
    ) {
        let wide = matches!(
            field,
            TensormapField::GlobalAddress | TensormapField::GlobalStride
        );
        let coded = matches!(
            field,
            TensormapField::Elemtype
                | TensormapField::InterleaveLayout
                | TensormapField::SwizzleMode
                | TensormapField::FillMode
        );
        let v = match value {
            TensormapValue::Imm(x) => Operand::Imm(ptx::Imm::Int(x as i64)),
            TensormapValue::B64(r) if wide && !coded => r.op(),
            TensormapValue::B32(r) if !wide && !coded => r.op(),
            _ => {
                self.fail(BuildError::Invalid(format!(
                    "tensormap.replace.{field}: wrong value kind {value:?}"
                )));
                return;
            }
        };
        let (a, space) = match map {
            TensormapAt::Shared(p) => (self.addr_operand(p), ptx::Space::SharedCta),
            TensormapAt::Global(r) => (
                self.addr_operand(GenericPtr::<u8>::from_reg(r)),
                ptx::Space::Global,
            ),
        };
        let mut args = vec![a];
        if field.has_ord() {
            args.push(Operand::Imm(ptx::Imm::Int(ord as i64)));
        }
        args.push(v);
        let ty = if wide { Ty::B64 } else { Ty::B32 };
        self.emit(
            Opcode::TensormapReplace,
            [
                Mod::Flag(Flag::Tile),
                Mod::Flag(field.flag()),
                Mod::Space(space),
                Mod::Flag(Flag::B1024),
                Mod::Type(ty),
            ],
            args,
        );
    }

    /// `tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.SCOPE.sync.aligned
    /// [global], [smem], 128` (sm_90, PTX 8.3): copies an edited map to global memory and
    /// releases it to the tensormap proxy; the whole warp executes it.
    #[track_caller]
    pub fn tensormap_cp_fenceproxy(&mut self, global: Reg<u64>, smem: SharedPtr<u8>, scope: Scope) {
        let g = self.addr_operand(GenericPtr::<u8>::from_reg(global));
        let s = self.addr_operand(smem);
        self.emit(
            Opcode::TensormapCpFenceproxy,
            [
                Mod::Space(ptx::Space::Global),
                Mod::Space(ptx::Space::SharedCta),
                Mod::Flag(Flag::TensormapGeneric),
                Mod::Flag(Flag::Release),
                Mod::Flag(scope.flag()),
                Mod::Flag(Flag::Sync),
                Mod::Flag(Flag::Aligned),
            ],
            [g, s, Operand::Imm(ptx::Imm::Int(128))],
        );
    }

    /// `fence.proxy.tensormap::generic.release.SCOPE;` (sm_90, PTX 8.3): a map edited in place
    /// in global memory, released to the tensormap proxy.
    #[track_caller]
    pub fn fence_proxy_tensormap_release(&mut self, scope: Scope) {
        self.emit(
            Opcode::Fence,
            [
                Mod::Flag(Flag::Proxy),
                Mod::Flag(Flag::TensormapGeneric),
                Mod::Flag(Flag::Release),
                Mod::Flag(scope.flag()),
            ],
            [],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The im2col load and the tensor-map editing methods emit what the parser reads back,
    /// the validator accepts, and ptxas assembles for sm_90a.
    #[test]
    fn im2col_and_tensormap_methods_emit_valid_ptx() {
        let mut k = KernelBuilder::new("tm", crate::kernel::Target::sm90a());
        let tmap = k.param_tensormap_ptr("tmap");
        let gmap = k.param_tensormap_ptr("gmap");
        let stage = k.shared_array::<u8>(1024, 1024);
        let smap = k.shared_array::<u8>(128, 128);
        let bar = k.shared_array::<u64>(1, 8);
        let c = k.mov(0i32);
        let o = k.mov(1u16);
        k.tma_load_im2col(stage, tmap, &[c, c, c, c], &[o, o], bar);
        let addr = k.mov(0u64);
        let dim = k.mov(64u32);
        let at = TensormapAt::Shared(smap);
        k.tensormap_replace(
            at,
            TensormapField::GlobalAddress,
            0,
            TensormapValue::B64(addr),
        );
        k.tensormap_replace(at, TensormapField::BoxDim, 1, TensormapValue::B32(dim));
        k.tensormap_replace(at, TensormapField::Rank, 0, TensormapValue::Imm(1));
        k.tensormap_replace(at, TensormapField::SwizzleMode, 0, TensormapValue::Imm(3));
        k.tensormap_cp_fenceproxy(gmap, smap, Scope::Gpu);
        let at = TensormapAt::Global(gmap);
        k.tensormap_replace(at, TensormapField::FillMode, 0, TensormapValue::Imm(1));
        k.fence_proxy_tensormap_release(Scope::Gpu);
        k.fence_proxy_tensormap_acquire(gmap);
        let m = k.finish().unwrap();
        let text = ptx::print(&m);
        assert_eq!(ptx::parse(&text).unwrap(), m);
        assert!(ptx::validate::validate_errors(&m).is_empty(), "{text}");
        for want in [
            ".im2col.",
            "tensormap.replace.tile.box_dim.shared::cta.b1024.b32",
            "cp_fenceproxy",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
        if ptx::ptxas::ptxas_for_tests("builder tensormap methods").is_some() {
            ptx::ptxas::assemble(&text, "sm_90a", &Default::default())
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
        let mut k = KernelBuilder::new("bad", crate::kernel::Target::sm90a());
        let m = k.param_tensormap_ptr("m");
        let smap = k.shared_array::<u8>(128, 128);
        let r = k.mov(1u32);
        let at = TensormapAt::Shared(smap);
        k.tensormap_replace(at, TensormapField::Elemtype, 0, TensormapValue::B32(r));
        let bar = k.shared_array::<u64>(1, 8);
        k.tma_load_im2col(smap, m, &[], &[], bar);
        assert!(k.finish().is_err());
    }

    #[test]
    fn desc_encoding_matches_the_bit_layout() {
        let d = MatrixDesc {
            start: 0x1230,
            lbo: 16,
            sbo: 1024,
            base_offset: 0,
            swizzle: Swizzle::B128,
        };
        let v = d.encode();
        assert_eq!(v & 0x3fff, 0x123);
        assert_eq!((v >> 16) & 0x3fff, 1);
        assert_eq!((v >> 32) & 0x3fff, 64);
        assert_eq!(v >> 62, 1);
        assert_eq!(MatrixDesc::k_major(Swizzle::B128, 64).sbo, 1024);
        // Row 1, chunk 1 -> chunk 1 ^ 1 = 0; row 2, chunk 1 -> chunk 3.
        assert_eq!(Swizzle::B128.apply(128 + 16), 128);
        assert_eq!(Swizzle::B128.apply(256 + 16), 256 + 48);
    }

    #[test]
    fn budgets() {
        assert!(RegBudget::DEEPGEMM.check(1, 2).is_ok());
        assert!(RegBudget {
            producer: 40,
            consumer: 256
        }
        .check(1, 2)
        .is_err());
        assert!(RegBudget {
            producer: 41,
            consumer: 200
        }
        .check(1, 1)
        .is_err());
    }
}
