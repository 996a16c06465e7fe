//! The sm_90a backward kernels `mla_attn_bwd_{dkdv,dq}_wgmma_*`: the tiles, loops, masks,
//! statistics and stores of [`super::bwd`] (its `Dkdv` / `Dq` per-tile code, shared with
//! the `mma.sync` kernels), with every product a warpgroup `wgmma` (`WgProducts`) and every
//! operand tile loaded by TMA through mbarriers, warp-specialised like [`super::fwd90`].
//!
//! A CTA is the math warpgroup(s) plus one producer warp whose elected thread issues the TMA
//! copies (`sm90::load_panels`: [64 columns, rows] boxes with the 128-byte swizzle, one per
//! panel, the layout the wgmma descriptors read). Two tiles are *resident* (loaded once, on
//! their own mbarrier) and two are *streamed* through a 2-stage ring (`full` / `empty`
//! mbarrier pairs, `builder::Pipeline`), so tile i+1's copies run under tile i's math; a
//! stage is released by every math thread after the last wgmma reading it has completed
//! (`wgmma.wait_group 0`), so no TMA write lands under an in-flight wgmma.
//!
//! - dK/dV (64 keys per CTA, `splits` math warpgroups + the producer warp): K and V resident,
//!   Q and dO (`bq` query rows) streamed over the query tiles at or after the diagonal.
//!   S^T = K Q^T, dP^T = V dO^T as `wgmma m64n{bq}k16` (both operands K-major); dV += P^T dO
//!   and dK += dS^T Q as `wgmma m64n{cols}k16` with P^T / dS^T from registers and dO / Q
//!   MN-major; with 2 warpgroups each owns a panel-aligned part of the dK and dV columns
//!   (`col_split`), S^T and dP^T computed by both.
//! - dQ (64 queries per CTA, one math warpgroup + the producer warp): Q and dO resident, K and
//!   V (32 keys) streamed over the key tiles up to the diagonal. S = Q K^T, dP = dO V^T
//!   (`m64n32k16`), dQ += dS K (`m64n{d_qk}k16`, K MN-major; with a shared RoPE key the K tile
//!   is [nope panels | rope panels] and the product is one wgmma per part).
//!
//! Boxes past a sequence's end bring the next sequence's rows (zeros past the tensor) where the
//! `cp.async` kernels zero-fill: in dK/dV such queries have lse = +inf, so P = dS = 0 for them
//! and keys past the end are not stored; in dQ such keys are masked (the last key tile always
//! reaches the diagonal) and query rows past the end are not stored. Tensor maps (Q, K, the
//! shared RoPE key, V, dO; two sets, the box rows differ) are built per call, uploaded in one
//! buffer, and the call synchronises the stream before freeing it, like the forward.

use super::bwd::{
    declare_tail, dkdv_grid, dq_grid, new_kernel, BwdArgs, BwdSpec, Dkdv, Dq, Products, Warps, BKV,
    BM_DQ, BN_DQ,
};
use super::fwd::AttnShape;
use super::sm90::{self, k_panels, panels, KMaps, PanelDst};
use super::*;
use half::bf16;
use runtime::{args, LaunchConfig, Stream};

/// Depth of the streamed-tile ring.
pub const STAGES: u32 = 2;

/// The tensor-map parameters that replace the `mma.sync` kernels' Q/K/V/dO pointers.
pub(crate) const MAP_PARAMS: &[(&str, &str)] = &[
    (
        "tmap_q",
        "tensormap* (Q [total, heads*d_qk], box [64, rows])",
    ),
    (
        "tmap_k",
        "tensormap* (K [total, heads*(d_qk-k_rope)], box [64, rows])",
    ),
    (
        "tmap_kr",
        "tensormap* (k_rope [total, k_rope], box [64, rows]; = tmap_k when k_rope = 0)",
    ),
    (
        "tmap_v",
        "tensormap* (V [total, heads*d_v], box [64, rows])",
    ),
    (
        "tmap_dout",
        "tensormap* (dO [total, heads*d_v], box [64, rows])",
    ),
];

/// wgmma products over panel tiles (one warpgroup computes 64 rows).
struct WgProducts {
    /// (false, true): wgmma's scale-d for overwrite / accumulate
    preds: (Reg<Pred>, Reg<Pred>),
}

impl Products for WgProducts {
    fn scores(&self, k: &mut KernelBuilder, a: &Tile, b: &Tile, d: u32, acc: &[[Reg<f32>; 4]]) {
        sm90::ss_wgmma(k, (a, b), d, acc, self.preds);
    }
    fn accumulate(
        &self,
        k: &mut KernelBuilder,
        p: &[[Reg<f32>; 4]],
        b: &Tile,
        cols: (u32, u32),
        acc: &[[Reg<f32>; 4]],
    ) {
        sm90::rs_wgmma(k, p, b, cols, acc, self.preds.1);
    }
}

/// Column ranges `(c0, n)` of a `d`-wide accumulator owned by each of `sp` warpgroups: all of
/// it for one; for two, the first ceil(panels / 2) 64-column panels and the rest (n may be 0):
/// an MN-major wgmma operand range starts on a panel.
pub(crate) fn col_split(d: u32, sp: u32) -> Vec<(u32, u32)> {
    if sp == 1 {
        return vec![(0, d)];
    }
    let c = (64 * d.div_ceil(64).div_ceil(2)).min(d);
    vec![(0, c), (c, d - c)]
}

/// Which tensor a tile comes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Src {
    Q,
    K,
    V,
    Dout,
}

/// One tile of a plan: `rows` rows of tensor `src`.
#[derive(Clone, Copy, Debug)]
struct Part {
    src: Src,
    rows: u32,
}

/// Shared memory of a TMA backward kernel (byte offsets from the 1024-aligned window): the two
/// resident tiles, `STAGES` stages of the two streamed tiles, then the mbarriers (resident,
/// ring full x STAGES, ring empty x STAGES). Every tile is whole panels, so 1024-aligned.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    resident: [Part; 2],
    streamed: [Part; 2],
    s: BwdSpec,
}

impl Plan {
    fn new(s: &BwdSpec, resident: [(Src, u32); 2], streamed: [(Src, u32); 2]) -> Plan {
        let part = |(src, rows)| Part { src, rows };
        Plan {
            resident: resident.map(part),
            streamed: streamed.map(part),
            s: *s,
        }
    }
    /// dK/dV: K, V resident (64 keys); Q, dO streamed (`bq` queries).
    pub(crate) fn dkdv(s: &BwdSpec) -> Plan {
        let bq = s.bq();
        Plan::new(
            s,
            [(Src::K, BKV), (Src::V, BKV)],
            [(Src::Q, bq), (Src::Dout, bq)],
        )
    }
    /// dQ: Q, dO resident (64 queries); K, V streamed (32 keys).
    pub(crate) fn dq(s: &BwdSpec) -> Plan {
        let (rq, rk) = (BM_DQ, BN_DQ);
        Plan::new(
            s,
            [(Src::Q, rq), (Src::Dout, rq)],
            [(Src::K, rk), (Src::V, rk)],
        )
    }
    fn panels(&self, p: Part) -> u32 {
        match p.src {
            Src::Q => panels(self.s.d_qk),
            Src::K => k_panels(self.s.d_qk, self.s.k_rope),
            Src::V | Src::Dout => panels(self.s.d_v),
        }
    }
    fn bytes(&self, p: Part) -> u32 {
        self.panels(p) * p.rows * ROW_BYTES
    }
    fn resident_bytes(&self) -> u32 {
        self.resident.iter().map(|&p| self.bytes(p)).sum()
    }
    fn stage_bytes(&self) -> u32 {
        self.streamed.iter().map(|&p| self.bytes(p)).sum()
    }
    fn bars(&self) -> u32 {
        self.resident_bytes() + STAGES * self.stage_bytes()
    }
    /// Dynamic shared memory of a launch.
    pub(crate) fn total(&self) -> u32 {
        self.bars() + 8 * (1 + 2 * STAGES)
    }
    /// The tile of `p` at `base` (the K tile with a shared RoPE key: [nope | rope] panels).
    fn tile(&self, p: Part, base: Reg<u32>) -> Tile {
        let (d, split) = match p.src {
            Src::Q => (self.s.d_qk, 0),
            Src::K if self.s.k_rope > 0 => (self.s.d_qk, self.s.d_qk - self.s.k_rope),
            Src::K => (self.s.d_qk, 0),
            Src::V | Src::Dout => (self.s.d_v, 0),
        };
        Tile {
            base,
            rows: p.rows,
            d,
            split,
        }
    }
}

/// The tensor-map parameters.
struct Maps {
    q: Reg<u64>,
    k: KMaps,
    v: Reg<u64>,
    dout: Reg<u64>,
}

fn declare_maps(k: &mut KernelBuilder, rope: u32) -> Maps {
    Maps {
        q: k.param_tensormap_ptr("tmap_q"),
        k: KMaps {
            k: k.param_tensormap_ptr("tmap_k"),
            kr: k.param_tensormap_ptr("tmap_kr"),
            rope,
        },
        v: k.param_tensormap_ptr("tmap_v"),
        dout: k.param_tensormap_ptr("tmap_dout"),
    }
}

/// What producer and consumers share.
struct Cta {
    plan: Plan,
    base: Reg<u32>,
    /// the resident tiles' barrier
    res_bar: SharedPtr<u64>,
    ring: Pipeline,
}

impl Cta {
    /// Barriers initialised (`math` consumer threads release each stage) and visible.
    fn setup(k: &mut KernelBuilder, plan: Plan, math: u32) -> Cta {
        let base = k.dynamic_shared::<u8>(1024).reg();
        let bars = k.add(base, plan.bars());
        let bar = |i: u32| SharedPtr::<u64>::from_reg(bars).add_bytes(8 * i as i64);
        let ring = Pipeline {
            full: bar(1),
            empty: bar(1 + STAGES),
            stages: STAGES,
        };
        let tid = k.tid_x();
        let leader = k.eq(tid, 0u32);
        let res_bar = bar(0);
        k.if_(leader, |k| k.mbarrier_init(res_bar, 1u32));
        ring.init(k, leader, 1, math);
        Cta {
            plan,
            base,
            res_bar,
            ring,
        }
    }
    fn resident(&self, k: &mut KernelBuilder) -> [Tile; 2] {
        let [a, b] = self.plan.resident;
        let second = k.add(self.base, self.plan.bytes(a));
        [self.plan.tile(a, self.base), self.plan.tile(b, second)]
    }
    /// The streamed tiles of ring stage `stage`.
    fn stage(&self, k: &mut KernelBuilder, stage: Reg<u32>) -> [Tile; 2] {
        let [a, b] = self.plan.streamed;
        let b0 = k.add(self.base, self.plan.resident_bytes());
        let b0 = k.mad_lo(stage, self.plan.stage_bytes(), b0);
        let b1 = k.add(b0, self.plan.bytes(a));
        [self.plan.tile(a, b0), self.plan.tile(b, b1)]
    }
}

/// TMA copies of tile `t` (of `src`) from sequence row `r0`, completing on `bar`.
fn load(
    k: &mut KernelBuilder,
    (maps, sq, s): (&Maps, &Seq, &BwdSpec),
    (src, t): (Src, &Tile),
    r0: Reg<u32>,
    bar: SharedPtr<u64>,
) {
    let row = k.add(sq.start, r0);
    let (map, d) = match src {
        Src::K => {
            let kcol = k.mul(sq.h, s.d_qk - s.k_rope);
            let at = (t.base, t.rows, s.d_qk);
            return sm90::load_k_panels(k, &maps.k, at, (kcol, row), bar);
        }
        Src::Q => (maps.q, s.d_qk),
        Src::V => (maps.v, s.d_v),
        Src::Dout => (maps.dout, s.d_v),
    };
    let col = k.mul(sq.h, d);
    let dst = PanelDst {
        dst: t.base,
        rows: t.rows,
        panels: panels(d),
    };
    sm90::load_panels(k, map, dst, (col, row), bar);
}

/// The producer thread: the resident tiles from sequence row `r0`, then the streamed tiles of
/// indices `range` (tile i from row `i * rows`) through the ring.
fn producer(
    k: &mut KernelBuilder,
    cta: &Cta,
    (maps, sq): (&Maps, &Seq),
    r0: Reg<u32>,
    range: (Reg<u32>, Reg<u32>),
) {
    sm90::acquire_maps(k, &[maps.q, maps.k.k, maps.k.kr, maps.v, maps.dout]);
    let (plan, s) = (&cta.plan, &cta.plan.s);
    k.mbarrier_arrive_expect_tx(cta.res_bar, plan.resident_bytes());
    let res = cta.resident(k);
    for (p, t) in plan.resident.iter().zip(&res) {
        load(k, (maps, sq, s), (p.src, t), r0, cta.res_bar);
    }
    let st = PipeState::new(k);
    k.for_range(range.0, range.1, 1u32, |k, i| {
        let ri = k.mul(i, plan.streamed[0].rows);
        cta.ring.producer_acquire(k, &st);
        let bar = cta.ring.producer_commit_tx(k, &st, plan.stage_bytes());
        let tiles = cta.stage(k, st.stage);
        for (p, t) in plan.streamed.iter().zip(&tiles) {
            load(k, (maps, sq, s), (p.src, t), ri, bar);
        }
        st.advance(k, STAGES);
    });
}

/// Generates the wgmma dK/dV kernel (`s.wgmma`; checked by the caller).
pub(crate) fn gen_dkdv(t: &Target, s: &BwdSpec) -> Result<ptx::Module> {
    let math = 128 * s.splits();
    let mut k = new_kernel(&s.dkdv_name(), t, s.dkdv_threads());
    let maps = declare_maps(&mut k, s.k_rope);
    let p = declare_tail(&mut k, &["dk", "dv"]);
    let w = Warps::new(&mut k);
    let (sq, kv0) = start_cta(&mut k, p.cu, p.heads, BKV);
    let cta = Cta::setup(&mut k, Plan::dkdv(s), math);
    let it0 = k.div(kv0, s.bq());
    let iend = k.add(sq.len, s.bq() - 1);
    let iend = k.div(iend, s.bq());
    let prod = |k: &mut KernelBuilder| producer(k, &cta, (&maps, &sq), kv0, (it0, iend));
    let cons = |k: &mut KernelBuilder| {
        let cols = col_split(s.d_qk, s.splits())
            .into_iter()
            .zip(col_split(s.d_v, s.splits()))
            .map(|(a, b)| [a, b])
            .collect();
        let cx = Dkdv::new(k, (w, sq, kv0), s, cols);
        let m = WgProducts {
            preds: sm90::preds(k),
        };
        let [tk, tv] = cta.resident(k);
        k.mbarrier_wait_parity(cta.res_bar, 0u32);
        let st = PipeState::new(k);
        k.for_range(it0, iend, 1u32, |k, it| {
            let q0 = k.mul(it, s.bq());
            let [tq, tdo] = cta.stage(k, st.stage);
            let mut ready = |k: &mut KernelBuilder| cta.ring.consumer_wait(k, &st);
            cx.tile(k, &m, &p, [&tk, &tv, &tq, &tdo], q0, &mut ready);
            cta.ring.consumer_release(k, &st);
            st.advance(k, STAGES);
        });
        cx.store(k, &p);
    };
    sm90::specialise(&mut k, math, prod, cons);
    Ok(k.finish()?)
}

/// Generates the wgmma dQ kernel (`s.wgmma`; checked by the caller).
pub(crate) fn gen_dq(t: &Target, s: &BwdSpec) -> Result<ptx::Module> {
    let math = 128;
    let mut k = new_kernel(&s.dq_name(), t, s.dq_threads());
    let maps = declare_maps(&mut k, s.k_rope);
    let p = declare_tail(&mut k, &["dq"]);
    let w = Warps::new(&mut k);
    let (sq, q0) = start_cta(&mut k, p.cu, p.heads, BM_DQ);
    let cta = Cta::setup(&mut k, Plan::dq(s), math);
    let ntiles = causal_key_tiles(&mut k, q0, BM_DQ, sq.len, BN_DQ);
    let zero = k.mov(0u32);
    let prod = |k: &mut KernelBuilder| producer(k, &cta, (&maps, &sq), q0, (zero, ntiles));
    let cons = |k: &mut KernelBuilder| {
        let cx = Dq::new(k, (w, sq, q0), s, &p);
        let m = WgProducts {
            preds: sm90::preds(k),
        };
        let [tq, tdo] = cta.resident(k);
        k.mbarrier_wait_parity(cta.res_bar, 0u32);
        let st = PipeState::new(k);
        k.for_range(0u32, ntiles, 1u32, |k, j| {
            let kv0 = k.mul(j, BN_DQ);
            let [tk, tv] = cta.stage(k, st.stage);
            cta.ring.consumer_wait(k, &st);
            cx.tile(k, &m, p.c, [&tq, &tdo, &tk, &tv], kv0);
            cta.ring.consumer_release(k, &st);
            st.advance(k, STAGES);
        });
        cx.store(k, &p);
    };
    sm90::specialise(&mut k, math, prod, cons);
    Ok(k.finish()?)
}

/// The 5 tensor maps of one kernel, in [`MAP_PARAMS`] order: Q and dO read in boxes of `rq`
/// rows, K, the RoPE key and V in boxes of `rk` rows.
fn kernel_maps(
    stream: &Stream,
    sh: &AttnShape,
    a: &BwdArgs,
    total: usize,
    (rq, rk): (u32, u32),
) -> Result<Vec<u8>> {
    let be = stream.device().backend();
    let map = |b: &runtime::Buffer<bf16>, cols: usize, rows: u32| {
        sm90::tensor_map(be, b.device_ptr(), (total, cols), rows)
    };
    let h = sh.heads;
    let d_nope = sh.d_qk - sh.k_rope;
    let mut bytes = map(a.q, h * sh.d_qk, rq)?.to_vec();
    bytes.extend(map(a.k, h * d_nope, rk)?);
    match a.k_rope {
        Some(kr) => bytes.extend(map(kr, sh.k_rope, rk)?),
        None => bytes.extend(map(a.k, h * d_nope, rk)?),
    }
    bytes.extend(map(a.v, h * sh.d_v, rk)?);
    bytes.extend(map(a.dout, h * sh.d_v, rq)?);
    Ok(bytes)
}

/// Launches the checked dK/dV and dQ kernels of `spec` (after the pre-pass) and waits for them
/// (their tensor maps live in a buffer freed on return).
pub(crate) fn launch(
    stream: &Stream,
    spec: &BwdSpec,
    sh: &AttnShape,
    a: &BwdArgs,
    (total, batch): (usize, usize),
    after: &mut dyn FnMut(&str),
) -> Result<()> {
    let dev = stream.device();
    let mut bytes = kernel_maps(stream, sh, a, total, (spec.bq(), BKV))?;
    bytes.extend(kernel_maps(stream, sh, a, total, (BM_DQ, BN_DQ))?);
    let maps = dev.upload(&bytes)?;
    let m = maps.device_ptr();
    let (c, sc, h) = (sh.scale * LOG2E, sh.scale, sh.heads as u32);
    let name = spec.dkdv_name();
    let f = crate::host::function(dev, &name, "", |t| gen_dkdv(t, spec))?;
    let cfg = LaunchConfig::grid3(dkdv_grid(sh, batch), [spec.dkdv_threads(), 1, 1])
        .shared(spec.dkdv_shared());
    let mut v = args![m, m + 128, m + 256, m + 384, m + 512];
    v.extend(args![
        a.lse,
        &*a.delta,
        a.cu_seqlens,
        &*a.dk,
        &*a.dv,
        h,
        c,
        sc
    ]);
    stream.launch(&f, &cfg, &v)?;
    after(&name);
    let name = spec.dq_name();
    let f = crate::host::function(dev, &name, "", |t| gen_dq(t, spec))?;
    let cfg =
        LaunchConfig::grid3(dq_grid(sh, batch), [spec.dq_threads(), 1, 1]).shared(spec.dq_shared());
    let m = m + 640;
    let mut v = args![m, m + 128, m + 256, m + 384, m + 512];
    v.extend(args![a.lse, &*a.delta, a.cu_seqlens, &*a.dq, h, c, sc]);
    stream.launch(&f, &cfg, &v)?;
    after(&name);
    stream.synchronize()?;
    drop(maps);
    Ok(())
}
