//! First-principles cost of one micro-batch through one layer: FLOPs and bytes turned into
//! kernel durations (compute at an efficiency scaled by the SMs left for compute, memory-bound
//! kernels from HBM bytes, dispatch/combine from the all-to-all bytes over the IB and NVLink
//! legs capped by what the communication SMs can drive). Also owns the stage partition of the
//! layers, the model FLOPs used for MFU and the per-GPU memory estimate.

use crate::comm::{self, CommLoad};
use crate::compute::{self, Gemm};
use crate::config::{Config, Precision, ScheduleKind};
use crate::error::{Result, SimError};
use crate::routing::{self, FanOut};
use serde::Serialize;

/// Which stream a kernel runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Resource {
    Compute,
    Comm,
}

/// One kernel (or fused group of kernels) with its duration in seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Kernel {
    pub name: &'static str,
    pub res: Resource,
    pub dur: f64,
    /// Global block index (usize::MAX for the output head).
    pub layer: usize,
}

/// Kind of a transformer block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BlockKind {
    Dense,
    Moe,
    /// Multi-token prediction module: projection + MoE block + second head.
    Mtp,
    /// Output head + loss.
    Head,
}

/// Per-layer kernel times (ms) of one micro-batch, as reported.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LayerBreakdown {
    pub kind: String,
    pub dispatch_ms: f64,
    pub combine_ms: f64,
    pub attn_ms: f64,
    pub moe_gemm_ms: f64,
    pub bwd_dispatch_ms: f64,
    pub bwd_combine_ms: f64,
    pub bwd_attn_ms: f64,
    pub bwd_moe_gemm_ms: f64,
    pub wgrad_ms: f64,
}

/// Forward, backward (input gradient) and weight-gradient kernel chains of one block.
#[derive(Debug, Clone)]
pub struct BlockCost {
    pub kind: BlockKind,
    pub fwd: Vec<Kernel>,
    pub bwd: Vec<Kernel>,
    pub wgrad: Vec<Kernel>,
    pub breakdown: LayerBreakdown,
}

impl BlockCost {
    pub fn compute_time(&self) -> f64 {
        let s = |v: &Vec<Kernel>| {
            v.iter()
                .filter(|k| k.res == Resource::Compute)
                .map(|k| k.dur)
                .sum::<f64>()
        };
        s(&self.fwd) + s(&self.bwd) + s(&self.wgrad)
    }
}

/// The cost model for one configuration and communication budget.
pub struct CostModel<'a> {
    pub cfg: &'a Config,
    pub fanout: FanOut,
    comm_sms: usize,
}

/// Bytes one GPU moves over each leg for one all-to-all of one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CommBytes {
    pub ib: f64,
    pub nvl: f64,
}

impl<'a> CostModel<'a> {
    pub fn new(cfg: &'a Config) -> Self {
        let fanout = match cfg.comm.routing {
            crate::config::RoutingMode::Sampled => routing::sampled_fanout(
                &cfg.model,
                &cfg.parallelism,
                cfg.comm.router_samples,
                cfg.comm.router_seed,
            ),
            crate::config::RoutingMode::Estimate => {
                routing::estimated_fanout(&cfg.model, &cfg.parallelism)
            }
        };
        Self::with_fanout(cfg, fanout)
    }

    pub fn with_fanout(cfg: &'a Config, fanout: FanOut) -> Self {
        CostModel {
            cfg,
            fanout,
            comm_sms: cfg.comm.sms,
        }
    }

    fn tokens(&self) -> f64 {
        self.cfg.training.micro_batch_tokens as f64
    }
    fn compute_frac(&self) -> f64 {
        let h = &self.cfg.hardware;
        (h.sms - self.comm_sms) as f64 / h.sms as f64
    }
    fn peak(&self, p: Precision) -> f64 {
        let h = &self.cfg.hardware;
        match p {
            Precision::Fp8 => h.tflops_fp8 * 1e12,
            Precision::Bf16 => h.tflops_bf16 * 1e12,
        }
    }
    fn gemm(&self, flops: f64, prec: Precision, eff: f64) -> f64 {
        flops / (self.peak(prec) * eff * self.compute_frac())
    }
    /// One GEMM `[m, k] x [n, k]^T` in the training precision on the compute SMs
    /// ([`compute::gemm_time`], the DeepGEMM-fitted tile model); `groups` weight matrices.
    fn tile(&self, m: f64, n: usize, k: usize, groups: usize) -> f64 {
        let cfg = self.cfg;
        let g = Gemm {
            m: m.ceil() as usize,
            n,
            k,
            in_bytes: if cfg.training.precision == Precision::Fp8 {
                1
            } else {
                2
            },
            weights: groups,
        };
        let sms = cfg.hardware.sms - self.comm_sms;
        compute::gemm_time(&cfg.hardware, &cfg.calibration.gemm, sms, &g)
    }
    /// Forward GEMMs of `rows` rows through weight matrices `[out, in]`.
    fn fwd_gemms(&self, rows: f64, mats: &[(usize, usize)], groups: usize) -> f64 {
        mats.iter()
            .map(|&(o, i)| self.tile(rows, o, i, groups))
            .sum()
    }
    /// Input-gradient GEMMs: `dX [rows, in] = dY [rows, out] W`.
    fn dgrad_gemms(&self, rows: f64, mats: &[(usize, usize)], groups: usize) -> f64 {
        mats.iter()
            .map(|&(o, i)| self.tile(rows, i, o, groups))
            .sum()
    }
    /// Weight-gradient GEMMs: `dW [out, in] = dY^T X` over the rows (k-grouped per group).
    fn wgrad_gemms(&self, rows: f64, mats: &[(usize, usize)], groups: usize) -> f64 {
        let g = groups.max(1);
        let k = (rows / g as f64).ceil().max(1.0) as usize;
        mats.iter()
            .map(|&(o, i)| self.tile((o * g) as f64, i, k, 1))
            .sum::<f64>()
            / self.cfg.calibration.wgrad_rel_speed
    }
    /// Attention projection weights `[out, in]` (plus the MTP input projection).
    fn attn_mats(&self, mtp: bool) -> Vec<(usize, usize)> {
        let m = &self.cfg.model;
        let dqk = m.qk_nope_head_dim + m.qk_rope_head_dim;
        let mut v = if m.q_lora_rank > 0 {
            vec![(m.q_lora_rank, m.hidden), (m.heads * dqk, m.q_lora_rank)]
        } else {
            vec![(m.heads * dqk, m.hidden)]
        };
        v.push((m.kv_lora_rank + m.qk_rope_head_dim, m.hidden));
        v.push((
            m.heads * (m.qk_nope_head_dim + m.v_head_dim),
            m.kv_lora_rank,
        ));
        v.push((m.hidden, m.heads * m.v_head_dim));
        if mtp {
            v.push((m.hidden, 2 * m.hidden));
        }
        v
    }
    /// The up-projections the backward recomputes (q_b, kv_b).
    fn up_mats(&self) -> Vec<(usize, usize)> {
        let m = &self.cfg.model;
        let mut v = vec![(
            m.heads * (m.qk_nope_head_dim + m.v_head_dim),
            m.kv_lora_rank,
        )];
        if m.q_lora_rank > 0 {
            v.push((
                m.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim),
                m.q_lora_rank,
            ));
        }
        v
    }
    /// SwiGLU MLP weights (gate+up fused, down) of intermediate size `i`.
    fn mlp_mats(&self, i: usize) -> [(usize, usize); 2] {
        let h = self.cfg.model.hidden;
        [(2 * i, h), (h, i)]
    }
    fn hbm(&self, bytes: f64) -> f64 {
        let h = &self.cfg.hardware;
        // Memory-bound kernels saturate HBM with a fraction of the SMs; treat as unscaled.
        bytes / (h.hbm_gbps * 1e9 * self.cfg.calibration.hbm_eff)
    }
    fn overhead(&self, kernels: f64) -> f64 {
        kernels * self.cfg.calibration.kernel_overhead_us * 1e-6
    }

    /// Whether the EP group spans more than one node (tokens cross IB).
    pub fn ep_nodes(&self) -> usize {
        let p = &self.cfg.parallelism;
        (p.ep / p.gpus_per_node).max(1)
    }

    /// Bytes per token of one record on a link, as the `ep` kernels lay it out
    /// ([`crate::traffic`]): FP8 dispatch (metadata + FP8 hidden + f32 scales per 128) or the
    /// BF16 combine record.
    pub fn payload(&self, fp8: bool) -> f64 {
        let m = &self.cfg.model;
        let shape = crate::traffic::EpShape {
            ranks: self.cfg.parallelism.ep,
            gpus_per_node: self.cfg.parallelism.gpus_per_node,
            experts: m.routed_experts,
            hidden: m.hidden,
            topk: m.top_k,
        };
        if fp8 {
            shape.dispatch_record_bytes(crate::traffic::Payload::Fp8) as f64
        } else {
            shape.combine_record_bytes() as f64
        }
    }

    /// Bytes one GPU moves per leg for one dispatch (`fp8`) or combine of a micro-batch,
    /// scaled by the expert imbalance (the busiest GPU sets the pace).
    pub fn comm_load(&self, fp8: bool) -> CommLoad {
        let t = self.tokens() * self.cfg.calibration.expert_imbalance;
        CommLoad::normal(t, &self.fanout, self.payload(fp8))
    }

    pub fn comm_bytes(&self, fp8: bool) -> CommBytes {
        let l = self.comm_load(fp8);
        CommBytes {
            ib: l.ib,
            nvl: l.nvl,
        }
    }

    /// Duration of one dispatch or combine (normal-mode kernels, [`crate::comm`]). `None`
    /// when it cannot progress (no SMs).
    pub fn comm_time(&self, fp8: bool) -> Option<f64> {
        comm::normal_time(&self.cfg.hardware, self.comm_sms, &self.comm_load(fp8))
    }

    /// Pipeline point-to-point transfer of one micro-batch's activations (or gradients).
    pub fn p2p_time(&self) -> f64 {
        let p = &self.cfg.parallelism;
        let h = &self.cfg.hardware;
        let bytes = self.tokens() * self.cfg.model.hidden as f64 * 2.0;
        if p.pp == 1 {
            0.0
        } else if p.dp >= p.gpus_per_node {
            h.inter_node_latency_us * 1e-6 + bytes / (h.inter_node_gbps * 1e9)
        } else {
            h.intra_node_latency_us * 1e-6 + bytes / (h.intra_node_gbps * 1e9)
        }
    }

    /// Attention parameters (MLA) of one block.
    pub fn attn_params(&self) -> f64 {
        let m = &self.cfg.model;
        let (h, hd) = (m.hidden as f64, m.heads as f64);
        let dqk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
        let q = if m.q_lora_rank > 0 {
            h * m.q_lora_rank as f64 + m.q_lora_rank as f64 * hd * dqk
        } else {
            h * hd * dqk
        };
        let kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim) as f64;
        let kv_b = m.kv_lora_rank as f64 * hd * (m.qk_nope_head_dim + m.v_head_dim) as f64;
        let o = hd * m.v_head_dim as f64 * h;
        q + kv_a + kv_b + o
    }
    pub fn expert_params(&self) -> f64 {
        let m = &self.cfg.model;
        3.0 * m.hidden as f64 * m.expert_intermediate as f64
    }
    pub fn dense_mlp_params(&self) -> f64 {
        let m = &self.cfg.model;
        3.0 * m.hidden as f64 * m.dense_intermediate as f64
    }
    pub fn head_params(&self) -> f64 {
        let m = &self.cfg.model;
        m.hidden as f64 * m.vocab as f64
    }
    /// Causal attention-core FLOPs per token, forward.
    pub fn attn_core_flops_per_token(&self) -> f64 {
        let m = &self.cfg.model;
        let d = (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) as f64;
        m.seq_len as f64 * m.heads as f64 * d
    }

    /// Model FLOPs per token for one training step (forward + backward, 3x forward GEMMs,
    /// attention core 3x causal forward), without recomputation. Used for MFU.
    pub fn model_flops_per_token(&self) -> f64 {
        let m = &self.cfg.model;
        let moe_layers = (m.layers - m.dense_layers + m.mtp_layers) as f64;
        let attn_layers = (m.layers + m.mtp_layers) as f64;
        let act_experts = (m.top_k + m.shared_experts) as f64;
        let router = m.hidden as f64 * m.routed_experts as f64;
        let fwd_params = attn_layers * self.attn_params()
            + m.dense_layers as f64 * self.dense_mlp_params()
            + moe_layers * (act_experts * self.expert_params() + router)
            + (1 + m.mtp_layers) as f64 * self.head_params()
            + m.mtp_layers as f64 * 2.0 * (m.hidden * m.hidden) as f64;
        6.0 * fwd_params + 3.0 * attn_layers * self.attn_core_flops_per_token()
    }

    fn mem_attn_bytes_per_token(&self) -> f64 {
        let m = &self.cfg.model;
        let h = m.hidden as f64;
        let hd = m.heads as f64;
        let quant = if self.cfg.training.precision == Precision::Fp8 {
            1.0
        } else {
            0.0
        };
        4.0 * h                                                  // rmsnorm read + write
            + quant * 3.0 * h                                    // quantize norm output
            + 4.0 * (m.q_lora_rank + m.kv_lora_rank) as f64      // latent norms
            + 8.0 * hd * m.qk_rope_head_dim as f64               // rope on q and k
            + quant * 3.0 * hd * m.v_head_dim as f64             // quantize o_proj input
            + 6.0 * h // residual add
    }
    fn mem_moe_bytes_per_token(&self, dense: bool) -> f64 {
        let m = &self.cfg.model;
        let h = m.hidden as f64;
        let quant = if self.cfg.training.precision == Precision::Fp8 {
            1.0
        } else {
            0.0
        };
        let (n, inter) = if dense {
            (1.0, m.dense_intermediate as f64)
        } else {
            (
                m.top_k as f64 * self.cfg.calibration.expert_imbalance + m.shared_experts as f64,
                m.expert_intermediate as f64,
            )
        };
        let combine = if dense {
            0.0
        } else {
            (m.top_k as f64 + 1.0) * 2.0 * h + 8.0 * m.routed_experts as f64
        };
        4.0 * h + quant * 3.0 * h + n * (4.0 * inter + (1.0 + quant) * inter) + combine + 6.0 * h
    }

    fn comm_or_err(&self, fp8: bool, what: &str) -> Result<f64> {
        self.comm_time(fp8).ok_or_else(|| {
            SimError::CannotComplete(format!(
                "{what} must move tokens between GPUs but comm.sms = 0: communication cannot progress"
            ))
        })
    }

    /// Output head + loss (BF16 GEMMs, vocabulary-sized memory-bound loss).
    fn head_block(&self, layer: usize) -> BlockCost {
        let m = &self.cfg.model;
        let k = &self.cfg.calibration;
        let t = self.tokens();
        let oh = |n: f64| self.overhead(n);
        let kind = BlockKind::Head;
        let f = 2.0 * t * self.head_params();
        let loss_bytes = t * m.vocab as f64 * 4.0 * 3.0;
        let fwd = self.gemm(f, Precision::Bf16, k.bf16_gemm_eff) + self.hbm(loss_bytes) + oh(4.0);
        let bwd = self.gemm(f, Precision::Bf16, k.bf16_gemm_eff) + self.hbm(loss_bytes) + oh(3.0);
        let w = self.gemm(f, Precision::Bf16, k.bf16_gemm_eff) + oh(1.0);
        let kk = |name, dur| Kernel {
            name,
            res: Resource::Compute,
            dur,
            layer,
        };
        BlockCost {
            kind,
            fwd: vec![kk("head", fwd)],
            bwd: vec![kk("head_bwd", bwd)],
            wgrad: vec![kk("head_wgrad", w)],
            breakdown: LayerBreakdown {
                kind: "head".into(),
                attn_ms: 0.0,
                moe_gemm_ms: fwd * 1e3,
                bwd_moe_gemm_ms: bwd * 1e3,
                wgrad_ms: w * 1e3,
                ..Default::default()
            },
        }
    }

    /// Attention forward, input-gradient and weight-gradient times of one block.
    fn attn_times(&self, mtp: bool) -> (f64, f64, f64) {
        let m = &self.cfg.model;
        let k = &self.cfg.calibration;
        let t = self.tokens();
        let h = m.hidden as f64;
        let oh = |n: f64| self.overhead(n);
        // Attention: projections (tile-model GEMMs), core (BF16), memory-bound kernels.
        let mats = self.attn_mats(mtp);
        let core_f = t * self.attn_core_flops_per_token();
        let attn_mem = self.hbm(t * self.mem_attn_bytes_per_token());
        let attn_fwd = self.fwd_gemms(t, &mats, 1)
            + core_f / (self.peak(Precision::Bf16) * k.attn_fwd_eff * self.compute_frac())
            + attn_mem
            + oh(12.0);
        let recompute = self.fwd_gemms(t, &self.up_mats(), 1);
        let attn_bwd = self.dgrad_gemms(t, &mats, 1)
            + 2.5 * core_f / (self.peak(Precision::Bf16) * k.attn_bwd_eff * self.compute_frac())
            + recompute
            + 2.0 * attn_mem
            + oh(20.0);
        let quant_t = if self.cfg.training.precision == Precision::Fp8 {
            2.0
        } else {
            0.0
        };
        let attn_w = self.wgrad_gemms(t, &mats, 1)
            + self.hbm(
                t * quant_t
                    * (h + (m.q_lora_rank + m.kv_lora_rank) as f64
                        + (m.heads * m.v_head_dim) as f64),
            )
            + oh(5.0);

        (attn_fwd, attn_bwd, attn_w)
    }

    /// Kernel chains of one block (micro-batch of `training.micro_batch_tokens`).
    pub fn block(&self, kind: BlockKind, layer: usize) -> Result<BlockCost> {
        let cfg = self.cfg;
        let m = &cfg.model;
        let k = &cfg.calibration;
        let t = self.tokens();
        let prec = cfg.training.precision;
        let fp8 = prec == Precision::Fp8;
        let h = m.hidden as f64;
        let oh = |n: f64| self.overhead(n);

        if kind == BlockKind::Head {
            return Ok(self.head_block(layer));
        }
        let (attn_fwd, attn_bwd, attn_w) = self.attn_times(kind == BlockKind::Mtp);
        let quant_t = if fp8 { 2.0 } else { 0.0 };

        let ck = |name, dur| Kernel {
            name,
            res: Resource::Compute,
            dur,
            layer,
        };
        let mk = |name, dur| Kernel {
            name,
            res: Resource::Comm,
            dur,
            layer,
        };

        if kind == BlockKind::Dense {
            let dm = self.mlp_mats(m.dense_intermediate);
            let mem = self.hbm(t * self.mem_moe_bytes_per_token(true));
            let mlp_f = self.fwd_gemms(t, &dm, 1) + mem + oh(6.0);
            let mlp_b = self.dgrad_gemms(t, &dm, 1) + 2.0 * mem + oh(8.0);
            let mlp_w = self.wgrad_gemms(t, &dm, 1)
                + self.hbm(t * quant_t * (h + m.dense_intermediate as f64))
                + oh(3.0);
            return Ok(BlockCost {
                kind,
                fwd: vec![ck("attn", attn_fwd), ck("mlp", mlp_f)],
                bwd: vec![ck("mlp_bwd", mlp_b), ck("attn_bwd", attn_bwd)],
                wgrad: vec![ck("mlp_wgrad", mlp_w), ck("attn_wgrad", attn_w)],
                breakdown: LayerBreakdown {
                    kind: "dense".into(),
                    attn_ms: attn_fwd * 1e3,
                    moe_gemm_ms: mlp_f * 1e3,
                    bwd_attn_ms: attn_bwd * 1e3,
                    bwd_moe_gemm_ms: mlp_b * 1e3,
                    wgrad_ms: (mlp_w + attn_w) * 1e3,
                    ..Default::default()
                },
            });
        }

        // MoE: router (BF16), routed experts on the most loaded GPU (grouped GEMMs over its
        // local experts), shared experts.
        let rows = t * m.top_k as f64 * k.expert_imbalance;
        let local = (m.routed_experts / cfg.parallelism.ep).max(1);
        let em = self.mlp_mats(m.expert_intermediate);
        let sm = self.mlp_mats(m.expert_intermediate * m.shared_experts);
        // With no shared expert `sm` has a zero dimension and its GEMMs cost nothing.
        let router_f = 2.0 * t * h * m.routed_experts as f64;
        let router = self.gemm(router_f, Precision::Bf16, k.bf16_gemm_eff);
        let mem = self.hbm(t * self.mem_moe_bytes_per_token(false));
        let moe_f =
            self.fwd_gemms(rows, &em, local) + self.fwd_gemms(t, &sm, 1) + router + mem + oh(10.0);
        let moe_b = self.dgrad_gemms(rows, &em, local)
            + self.dgrad_gemms(t, &sm, 1)
            + router
            + 2.0 * mem
            + oh(14.0);
        let routed_shared = m.top_k as f64 * k.expert_imbalance + m.shared_experts as f64;
        let moe_w = self.wgrad_gemms(rows, &em, local)
            + self.wgrad_gemms(t, &sm, 1)
            + router
            + self.hbm(t * quant_t * routed_shared * (h + m.expert_intermediate as f64))
            + oh(6.0);
        let (dispatch, combine, bwd_combine, bwd_dispatch) =
            if self.ep_nodes() > 1 || cfg.parallelism.ep > 1 {
                (
                    self.comm_or_err(fp8, "dispatch")?,
                    self.comm_or_err(false, "combine")?,
                    // Backward of combine scatters output gradients to the experts (FP8 in V3),
                    // backward of dispatch gathers input gradients back (BF16).
                    self.comm_or_err(fp8, "combine backward")?,
                    self.comm_or_err(false, "dispatch backward")?,
                )
            } else {
                (0.0, 0.0, 0.0, 0.0)
            };
        Ok(BlockCost {
            kind,
            fwd: vec![
                ck("attn", attn_fwd),
                mk("dispatch", dispatch),
                ck("moe_gemm", moe_f),
                mk("combine", combine),
            ],
            bwd: vec![
                mk("combine_bwd", bwd_combine),
                ck("moe_gemm_bwd", moe_b),
                mk("dispatch_bwd", bwd_dispatch),
                ck("attn_bwd", attn_bwd),
            ],
            wgrad: vec![ck("moe_wgrad", moe_w), ck("attn_wgrad", attn_w)],
            breakdown: LayerBreakdown {
                kind: if kind == BlockKind::Mtp { "mtp" } else { "moe" }.into(),
                dispatch_ms: dispatch * 1e3,
                combine_ms: combine * 1e3,
                attn_ms: attn_fwd * 1e3,
                moe_gemm_ms: moe_f * 1e3,
                bwd_dispatch_ms: bwd_dispatch * 1e3,
                bwd_combine_ms: bwd_combine * 1e3,
                bwd_attn_ms: attn_bwd * 1e3,
                bwd_moe_gemm_ms: moe_b * 1e3,
                wgrad_ms: (moe_w + attn_w) * 1e3,
            },
        })
    }

    /// Blocks of the whole model in order: dense, MoE, MTP modules, then the head.
    pub fn blocks(&self) -> Vec<BlockKind> {
        let m = &self.cfg.model;
        let mut v = vec![BlockKind::Dense; m.dense_layers];
        v.extend(std::iter::repeat_n(
            BlockKind::Moe,
            m.layers - m.dense_layers,
        ));
        v.extend(std::iter::repeat_n(BlockKind::Mtp, m.mtp_layers));
        v.push(BlockKind::Head);
        if m.mtp_layers > 0 {
            v.push(BlockKind::Head);
        }
        v
    }
}

/// Contiguous partition of weighted blocks into `parts` non-empty stages minimising the heaviest
/// stage (exact DP). Returns the number of blocks per stage.
pub fn partition(weights: &[f64], parts: usize) -> Vec<usize> {
    let n = weights.len();
    let parts = parts.min(n).max(1);
    let mut prefix = vec![0.0; n + 1];
    for i in 0..n {
        prefix[i + 1] = prefix[i] + weights[i];
    }
    // best[p][i]: min max-stage cost for the first i blocks in p stages.
    let inf = f64::INFINITY;
    let mut best = vec![vec![inf; n + 1]; parts + 1];
    let mut cut = vec![vec![0usize; n + 1]; parts + 1];
    best[0][0] = 0.0;
    for p in 1..=parts {
        for i in p..=n {
            for j in (p - 1)..i {
                let c = best[p - 1][j].max(prefix[i] - prefix[j]);
                if c < best[p][i] {
                    best[p][i] = c;
                    cut[p][i] = j;
                }
            }
        }
    }
    let mut sizes = vec![0; parts];
    let mut i = n;
    for p in (1..=parts).rev() {
        let j = cut[p][i];
        sizes[p - 1] = i - j;
        i = j;
    }
    sizes
}

/// Per-GPU memory estimate (bytes).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Memory {
    pub params_gb: f64,
    pub grads_gb: f64,
    pub optimizer_gb: f64,
    pub activations_gb: f64,
    pub total_gb: f64,
    pub capacity_gb: f64,
    pub fits: bool,
}

impl<'a> CostModel<'a> {
    /// Activation bytes cached per token for one block (FP8 caching, norm and MLA
    /// up-projection recomputation as in V3).
    pub fn activation_bytes_per_token(&self, kind: BlockKind) -> f64 {
        let m = &self.cfg.model;
        let h = m.hidden as f64;
        let hd = m.heads as f64;
        let a = if self.cfg.training.precision == Precision::Fp8 {
            1.0
        } else {
            2.0
        };
        // The attention output is the input of the output projection and is needed by the
        // attention backward too; V3 caches it once in its 12-bit E5M6 format (report section
        // 3.3.2), BF16 without FP8 training.
        let e5m6 = if a == 1.0 { 1.5 } else { 2.0 };
        let attn = 2.0 * h
            + a * h
            + 2.0 * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim) as f64
            + e5m6 * hd * m.v_head_dim as f64
            + 4.0 * hd;
        match kind {
            BlockKind::Head => h * 2.0 + m.vocab as f64 * 2.0 / 8.0,
            BlockKind::Dense => attn + 2.0 * h + a * h + m.dense_intermediate as f64 * (4.0 + a),
            BlockKind::Moe | BlockKind::Mtp => {
                // Per routed/shared expert copy: FP8 input with 1x128 scales, and the SwiGLU
                // input (gate and up outputs) also cached in FP8 with 1x128 scales while the
                // SwiGLU output is recomputed (V3 report, section 3.3.2, "Low-Precision Storage").
                let n = (m.top_k + m.shared_experts) as f64;
                let inter = m.expert_intermediate as f64;
                attn + 2.0 * h
                    + a * h
                    + n * (a * h + h / 32.0 + 2.0 * inter * a + 2.0 * inter / 32.0)
            }
        }
    }

    /// Params, gradients, ZeRO-1 optimizer states and activations of the busiest rank.
    pub fn memory(&self, stage_blocks: &[Vec<BlockKind>], ranks_stages: &[Vec<usize>]) -> Memory {
        let cfg = self.cfg;
        let p = &cfg.parallelism;
        let m = &cfg.model;
        let dp_e = (p.dp / p.ep).max(1) as f64;
        let experts_local = m.routed_experts as f64 / p.ep as f64;
        let mut worst = Memory::default();
        for (rank, stages) in ranks_stages.iter().enumerate() {
            let (mut ne, mut ex, mut act) = (0.0, 0.0, 0.0);
            for &s in stages {
                for &b in &stage_blocks[s] {
                    act += self.activation_bytes_per_token(b);
                    match b {
                        BlockKind::Head => ne += self.head_params(),
                        BlockKind::Dense => ne += self.attn_params() + self.dense_mlp_params(),
                        BlockKind::Moe | BlockKind::Mtp => {
                            ne += self.attn_params()
                                + m.shared_experts as f64 * self.expert_params()
                                + (m.hidden * m.routed_experts) as f64;
                            ex += experts_local * self.expert_params();
                        }
                    }
                }
                if s == 0 {
                    ne += self.head_params(); // embedding
                }
            }
            let act_per_stage = act / stages.len().max(1) as f64;
            let in_flight = match cfg.schedule {
                ScheduleKind::DualPipe | ScheduleKind::DualPipeV => (p.pp + 1) as f64,
                ScheduleKind::OneFOneB | ScheduleKind::Zb1p => (p.pp - rank.min(p.pp - 1)) as f64,
            }
            .min(cfg.training.micro_batches as f64);
            let gb = 1e-9;
            let params = (ne + ex) * 2.0 * gb;
            let grads = (ne + ex) * 4.0 * gb;
            let opt = (ne / p.dp as f64 + ex / dp_e) * 8.0 * gb;
            let acts = act_per_stage * self.tokens() * in_flight * gb;
            let total = params + grads + opt + acts;
            if total > worst.total_gb {
                worst = Memory {
                    params_gb: params,
                    grads_gb: grads,
                    optimizer_gb: opt,
                    activations_gb: acts,
                    total_gb: total,
                    capacity_gb: cfg.hardware.hbm_gb,
                    fits: total <= cfg.hardware.hbm_gb,
                };
            }
        }
        worst
    }

    /// Exposed end-of-step time: ZeRO-1 gradient reduce-scatter (FP32) and parameter
    /// all-gather (BF16) over the data-parallel group, plus the optimizer update (HBM-bound).
    pub fn step_end_time(
        &self,
        stage_blocks: &[Vec<BlockKind>],
        ranks_stages: &[Vec<usize>],
    ) -> f64 {
        let cfg = self.cfg;
        let p = &cfg.parallelism;
        let m = &cfg.model;
        let h = &cfg.hardware;
        let dp_e = (p.dp / p.ep).max(1) as f64;
        let experts_local = m.routed_experts as f64 / p.ep as f64;
        let mut worst: f64 = 0.0;
        for stages in ranks_stages {
            let (mut ne, mut ex) = (0.0, 0.0);
            for &s in stages {
                for &b in &stage_blocks[s] {
                    match b {
                        BlockKind::Head => ne += self.head_params(),
                        BlockKind::Dense => ne += self.attn_params() + self.dense_mlp_params(),
                        BlockKind::Moe | BlockKind::Mtp => {
                            ne +=
                                self.attn_params() + m.shared_experts as f64 * self.expert_params();
                            ex += experts_local * self.expert_params();
                        }
                    }
                }
            }
            let dp = p.dp as f64;
            let bw = if p.dp > p.gpus_per_node {
                h.inter_node_gbps
            } else {
                h.intra_node_gbps
            } * 1e9;
            let sync = 6.0 * (ne * (dp - 1.0) / dp + ex * (dp_e - 1.0) / dp_e) / bw;
            let opt = self.hbm((ne / dp + ex / dp_e) * 24.0);
            worst = worst.max(sync + opt);
        }
        worst
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn v3_parameter_count_matches_report() {
        // 671B total, 37B activated (V3 report), MTP excluded from both.
        let mut c = Config::v3();
        c.model.mtp_layers = 0;
        let cm = CostModel::new(&c);
        let m = &c.model;
        let moe = (m.layers - m.dense_layers) as f64;
        let attn = m.layers as f64 * cm.attn_params();
        let total = attn
            + 3.0 * cm.dense_mlp_params()
            + moe * ((m.routed_experts + 1) as f64 * cm.expert_params() + (m.hidden * 256) as f64)
            + 2.0 * cm.head_params();
        let active = attn
            + 3.0 * cm.dense_mlp_params()
            + moe * (9.0 * cm.expert_params())
            + 2.0 * cm.head_params();
        assert!((total / 1e9 - 671.0).abs() < 5.0, "total {}", total / 1e9);
        assert!((active / 1e9 - 37.0).abs() < 1.5, "active {}", active / 1e9);
    }

    #[test]
    fn partition_is_balanced_and_exact() {
        let w = [1.0, 1.0, 1.0, 1.0, 4.0];
        assert_eq!(partition(&w, 2), vec![4, 1]);
        let w = vec![1.0; 10];
        let s = partition(&w, 3);
        assert_eq!(s.iter().sum::<usize>(), 10);
        assert_eq!(*s.iter().max().unwrap(), 4);
    }

    #[test]
    fn fp8_dispatch_payload() {
        let c = Config::v3();
        let cm = CostModel::new(&c);
        // ep record layout: 112 B metadata (top-8) + FP8 hidden + 56 f32 scales; combine
        // record: 16 B header + BF16 hidden.
        assert_eq!(cm.payload(true), 112.0 + 7168.0 + 56.0 * 4.0);
        assert_eq!(cm.payload(false), 16.0 + 14336.0);
    }
}
