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
//!
//! Structure (one role per function; the kernel-wide values travel in a `Gemm` context of
//! spec, parameters, shared-memory layout, scheduler, warpgroup and cluster rank):
//! - `gen_hopper_gemm` (this file): declares the parameters (`Params::declare`), lays out
//!   shared memory (`Smem::layout`: stage ring, barriers, epilogue staging), initialises the
//!   barriers and the scheduler, and splits the CTA into the two roles with `setmaxnreg`;
//! - `sched`: tile and K-block counts (`Sched::new`) and the decoding of a linear tile id into
//!   group, rows, columns and skip flag (`Sched::decode`: rasterisation, then per-layout rows);
//! - `producer`: the TMA thread (`run`, per tile `load_tile`, per stage `load_k_block`, and the
//!   multicast half-box load `load_a_multicast`);
//! - `math`: a math thread's registers (`MathThread`), the tile loop (`run`, `one_tile`), one
//!   K block (`k_block`: scales, wait, `issue_wgmma`, `release`, `promote`) and FP8 scales
//!   (`scale_ptrs`, `load_scales`);
//! - `epilogue`: `store` picks the TMA-store path (`bf16_words`, `stmatrix_tile` with
//!   `lane_rows`, then TMA boxes) or direct stores (`store_direct`, masked layout).
//!
//! `tests/hopper_ptx_snapshot.rs` pins the emitted PTX of every configuration (a hash each).

mod epilogue;
mod math;
mod producer;
mod sched;

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
    let cluster = cluster_size(spec);
    let mut k = KernelBuilder::new(&spec.name(), t.clone());
    k.maxntid(&[spec.threads(), 1, 1]).minnctapersm(1);
    if cluster > 1 {
        k.cluster_dims(&[cluster, 1, 1]);
    }
    let p = Params::declare(&mut k, spec);
    let smem = Smem::layout(&mut k, spec);
    let tid = k.tid_x();
    let wg = k.warpgroup_index();
    let is_leader = k.eq(tid, 0u32);
    // full: one producer arrival (+ tx); empty: every math thread of the cluster's CTAs
    smem.pipe
        .init(&mut k, is_leader, 1, 128 * spec.math_wgs * cluster);
    if cluster > 1 {
        k.barrier_cluster_arrive();
        k.barrier_cluster_wait();
    }
    let sched = sched::Sched::new(&mut k, spec, &p);
    let budget = RegBudget {
        producer: spec.producer_regs,
        consumer: spec.consumer_regs,
    };
    let is_producer = k.eq(wg, spec.math_wgs);
    let rank = if cluster > 1 {
        Some(k.cluster_ctarank())
    } else {
        None
    };
    let g = Gemm {
        spec,
        p,
        smem,
        sched,
        wg,
        rank,
    };
    k.warp_specialize(
        is_producer,
        budget,
        |k| producer::run(k, &g),
        |k| math::run(k, &g),
    );
    if cluster > 1 {
        // keep both CTAs' shared memory alive until remote arrivals are done
        k.barrier_cluster_arrive();
        k.barrier_cluster_wait();
    }
    k.finish().map_err(Into::into)
}

/// Everything the roles share: the spec, parameters, shared memory, scheduler, and the thread's
/// warpgroup and cluster rank (multicast only).
struct Gemm<'a> {
    spec: &'a HopperSpec,
    p: Params,
    smem: Smem,
    sched: sched::Sched,
    wg: Reg<u32>,
    rank: Option<Reg<u32>>,
}

impl Gemm<'_> {
    fn fp8(&self) -> bool {
        self.spec.input == InTy::Fp8
    }
    /// Elements of K per pipeline stage.
    fn bk(&self) -> u32 {
        BK_BYTES / self.spec.input.esize()
    }
}

/// CTAs per cluster (2 with A multicast).
fn cluster_size(spec: &HopperSpec) -> u32 {
    if spec.multicast_a {
        2
    } else {
        1
    }
}

/// The kernel parameters, declared in launch order (see [`HopperSpec::params`]).
#[derive(Clone, Copy)]
struct Params {
    tmap_a: Reg<u64>,
    tmap_b: Reg<u64>,
    /// TMA-store epilogue only.
    tmap_d: Option<Reg<u64>>,
    /// FP8 only: A's 1x128 and B's 128x128 scales.
    scales: Option<(GlobalPtr<f32>, GlobalPtr<f32>)>,
    d: GlobalPtr<u16>,
    rows: Rows,
    /// `m` (`m_max` for the masked layout).
    m: Reg<u32>,
    n: Reg<u32>,
    kdim: Reg<u32>,
    groups: Reg<u32>,
}

impl Params {
    fn declare(k: &mut KernelBuilder, spec: &HopperSpec) -> Params {
        let tmap_a = k.param_tensormap_ptr("tmap_a");
        let tmap_b = k.param_tensormap_ptr("tmap_b");
        let tmap_d = if spec.tma_store() {
            Some(k.param_tensormap_ptr("tmap_d"))
        } else {
            None
        };
        let scales = if spec.input == InTy::Fp8 {
            Some((
                k.param_ptr_aligned::<f32>("sa", 4),
                k.param_ptr_aligned::<f32>("sb", 4),
            ))
        } else {
            None
        };
        let d = k.param_ptr_aligned::<u16>("d", 4);
        let rows = match spec.layout {
            // K-grouped: refused by `validate` before anything is declared
            Layout::Normal | Layout::KGrouped => Rows::Normal,
            Layout::Contiguous => Rows::Contiguous(k.param_ptr_aligned::<i32>("m_indices", 4)),
            Layout::Masked => Rows::Masked(k.param_ptr_aligned::<i32>("masked_m", 4)),
        };
        let m = k.param::<u32>(if spec.layout == Layout::Masked {
            "m_max"
        } else {
            "m"
        });
        Params {
            tmap_a,
            tmap_b,
            tmap_d,
            scales,
            d,
            rows,
            m,
            n: k.param::<u32>("n"),
            kdim: k.param::<u32>("k"),
            groups: k.param::<u32>("groups"),
        }
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

/// Shared memory: per stage A [BM x 128 B] and B [BN x 128 B] (SW128) tiles, the ring's
/// barriers, then (TMA-store epilogue) one 64 x BN bf16 staging buffer per math warpgroup.
#[derive(Clone, Copy)]
struct Smem {
    /// Stage 0's tiles (stage `s` is `stage_bytes * s` further).
    a_tile0: SmemTile,
    b_tile0: SmemTile,
    stage_bytes: u32,
    pipe: Pipeline,
    d_stage: Option<SharedPtr<u8>>,
    /// Bytes one stage's two TMA loads deliver.
    tx_bytes: u32,
}

impl Smem {
    fn layout(k: &mut KernelBuilder, spec: &HopperSpec) -> Smem {
        let mut lay = SmemLayout::new(k);
        let a_tile0 = lay.tile(spec.bm(), BK_BYTES, Swizzle::B128);
        let b_tile0 = lay.tile(spec.bn, BK_BYTES, Swizzle::B128);
        let stage_bytes = lay.used().div_ceil(1024) * 1024;
        lay.reserve(stage_bytes * (spec.stages - 1), 1024);
        let pipe = Pipeline::new(&mut lay, spec.stages);
        let d_stage = if spec.tma_store() {
            Some(lay.array::<u8>(spec.epilogue_bytes(), 1024))
        } else {
            None
        };
        Smem {
            a_tile0,
            b_tile0,
            stage_bytes,
            pipe,
            d_stage,
            tx_bytes: (spec.bm() + spec.bn) * BK_BYTES,
        }
    }
    /// The A and B tiles of the ring stage `stage`.
    fn stage_tiles(&self, k: &mut KernelBuilder, stage: Reg<u32>) -> (SmemTile, SmemTile) {
        let sbase = k.mad_lo(stage, self.stage_bytes, self.a_tile0.base.reg());
        (self.a_tile0.rebase(sbase), self.b_tile0.rebase(sbase))
    }
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
