//! Inference serving of a DeepSeek-V3-style model with prefill/decode disaggregation, as
//! DeepSeek published it for V3/R1 (Feb 2025): prefill units with expert parallelism over a few
//! nodes and normal-mode (SM-resident) dispatch/combine; decode units with a wide EP group,
//! low-latency dispatch/combine that holds no SM while data is in flight, MLA attention over a
//! paged BF16 KV cache (FlashMLA-class), MTP speculative decoding; both running two
//! micro-batches whose communication hides behind the other's computation.
//!
//! The model is the kernel chain of one forward per micro-batch ([`crate::compute`] GEMM tile
//! model, [`crate::comm`] dispatch/combine), two chains list-scheduled on a compute and a
//! communication stream ([`crate::overlap`]). Prefill reports input tokens/s per node (cache
//! hits included: they cost no compute); decode picks the largest batch per GPU that still
//! meets the per-user speed target and fits the KV cache in HBM.

use crate::comm::{self, CommLoad};
use crate::compute::{self, Gemm, GemmCal, MlaDecodeCal};
use crate::config::{self, HardwareConfig, ModelConfig, ParallelConfig};
use crate::cost::{Kernel, Resource};
use crate::error::{Result, SimError};
use crate::routing::{self, FanOut};
use crate::traffic::{EpShape, Payload};
use serde::{Deserialize, Serialize};

/// One prefill deployment unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillConfig {
    /// Nodes per unit (EP degree = nodes x gpus_per_node).
    pub nodes: usize,
    pub gpus_per_node: usize,
    /// Extra physical copies of hot experts (EPLB), spread over the unit.
    pub redundant_experts: usize,
    /// SMs held by the normal-mode dispatch/combine kernels.
    pub comm_sms: usize,
    /// Uncached prompt tokens one GPU processes per forward (both micro-batches).
    pub tokens_per_gpu: usize,
    /// Micro-batches overlapped (1 or 2).
    pub micro_batches: usize,
    /// Units deployed (for the cluster totals).
    pub units: usize,
}

/// One decode deployment unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeConfig {
    pub nodes: usize,
    pub gpus_per_node: usize,
    pub redundant_experts: usize,
    /// Micro-batches overlapped (1 or 2).
    pub micro_batches: usize,
    /// Largest batch (sequences per GPU) the search considers.
    pub max_batch_per_gpu: usize,
    /// Draft tokens per step from the MTP module (0: no speculative decoding).
    pub mtp_draft_tokens: usize,
    pub units: usize,
}

/// What users send.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Average prompt length (tokens).
    pub avg_prompt_tokens: f64,
    /// Coefficient of variation of prompt lengths: a prompt token attends on average to
    /// `E[P^2] / E[P]` = `avg (1 + cv^2)` positions weighted by its prompt's length.
    pub prompt_len_cv: f64,
    /// Fraction of prompt tokens served from the KV cache (no prefill compute).
    pub cache_hit_rate: f64,
    /// Average KV length seen by a decoded token.
    pub avg_kv_len: f64,
    /// Per-user output speed the decode batch must still meet, tokens/s.
    pub target_tokens_per_s_per_user: f64,
    /// Probability an MTP draft token is accepted.
    pub mtp_acceptance: f64,
}

/// Serving-specific efficiency constants (sources in docs/SIM.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeCalibration {
    pub gemm: GemmCal,
    pub mla_decode: MlaDecodeCal,
    /// Prefill attention core (BF16) fraction of the BF16 peak.
    pub attn_prefill_eff: f64,
    /// max/mean core-attention work per GPU in prefill (data-parallel attention, after the
    /// prefill load balancer); every MoE layer waits for the slowest GPU.
    pub attn_imbalance_prefill: f64,
    /// max/mean routed rows per GPU after EPLB, prefill and decode.
    pub expert_imbalance_prefill: f64,
    pub expert_imbalance_decode: f64,
    /// max/mean KV tokens per GPU in decode (data-parallel attention).
    pub attn_imbalance_decode: f64,
    /// HBM bytes of memory-bound kernels per token per layer, in units of `hidden`.
    pub mem_bytes_per_token_hidden: f64,
    pub hbm_eff: f64,
    /// Per-kernel overhead, microseconds (decode runs under CUDA graphs).
    pub kernel_overhead_us_prefill: f64,
    pub kernel_overhead_us_decode: f64,
    /// Compute slowdown while communication kernels run.
    pub overlap_slowdown: f64,
    /// HBM kept for activations, buffers and fragmentation, GB.
    pub hbm_reserve_gb: f64,
    /// Fraction of the day a deployment delivers its simulated throughput (request
    /// arrival gaps, batch formation, scheduling), applied to both phases.
    pub delivered_fraction: f64,
    pub router_samples: usize,
    pub router_seed: u64,
}

/// A serving deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    pub model: ModelConfig,
    pub hardware: HardwareConfig,
    pub prefill: PrefillConfig,
    pub decode: DecodeConfig,
    pub workload: Workload,
    pub calibration: ServeCalibration,
}

impl ServeConfig {
    /// DeepSeek-V3/R1 serving as published (Feb 2025, H800): prefill EP32 over 4 nodes, decode
    /// EP144 over 18 nodes, 32 redundant experts, two micro-batches; the day's workload.
    pub fn v3() -> ServeConfig {
        ServeConfig {
            model: config::v3_model(),
            hardware: config::h800(),
            prefill: PrefillConfig {
                nodes: 4,
                gpus_per_node: 8,
                redundant_experts: 32,
                comm_sms: 20,
                tokens_per_gpu: 16384,
                micro_batches: 2,
                units: 14,
            },
            decode: DecodeConfig {
                nodes: 18,
                gpus_per_node: 8,
                redundant_experts: 32,
                micro_batches: 2,
                max_batch_per_gpu: 512,
                mtp_draft_tokens: 1,
                units: 9,
            },
            workload: Workload {
                // 608B input / 168B output tokens and an average KV length of 4,989 per
                // output token give prompt P, output O with P/O = 3.62 and P + O/2 = 4,989.
                avg_prompt_tokens: 4383.0,
                prompt_len_cv: 1.0,
                cache_hit_rate: 0.563,
                avg_kv_len: 4989.0,
                target_tokens_per_s_per_user: 21.0,
                mtp_acceptance: 0.85,
            },
            calibration: ServeCalibration {
                gemm: GemmCal::h800(),
                mla_decode: MlaDecodeCal {
                    gbps: 3000.0,
                    tflops: 580.0,
                    kv_bytes: 2.0,
                    page_tokens: 64.0,
                },
                attn_prefill_eff: 0.4,
                attn_imbalance_prefill: 1.2,
                expert_imbalance_prefill: 1.15,
                expert_imbalance_decode: 1.2,
                attn_imbalance_decode: 1.1,
                mem_bytes_per_token_hidden: 40.0,
                hbm_eff: 0.8,
                kernel_overhead_us_prefill: 4.0,
                kernel_overhead_us_decode: 1.5,
                overlap_slowdown: 0.05,
                hbm_reserve_gb: 10.0,
                delivered_fraction: 0.85,
                router_samples: 4096,
                router_seed: 8,
            },
        }
    }

    pub fn preset(name: &str) -> Result<ServeConfig> {
        match name {
            "v3-serve" => Ok(Self::v3()),
            _ => Err(SimError::UnknownPreset(name.to_string())),
        }
    }

    /// Parse TOML (JSON when `source_name` ends in `.json`) and validate.
    pub fn from_str_named(text: &str, source_name: &str) -> Result<ServeConfig> {
        let cfg: ServeConfig = if source_name.ends_with(".json") {
            serde_json::from_str(text).map_err(|e| SimError::Parse {
                source_name: source_name.into(),
                message: e.to_string(),
            })?
        } else {
            toml::from_str(text).map_err(|e| SimError::Parse {
                source_name: source_name.into(),
                message: e.to_string().replace('\n', " "),
            })?
        };
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// GPUs of all units.
    pub fn gpus(&self) -> usize {
        let p = &self.prefill;
        let d = &self.decode;
        p.units * p.nodes * p.gpus_per_node + d.units * d.nodes * d.gpus_per_node
    }

    /// Check every rule; the first broken one is returned with its field.
    pub fn validate(&self) -> Result<()> {
        config::validate_model(&self.model)?;
        config::validate_hardware(&self.hardware)?;
        let p = &self.prefill;
        let d = &self.decode;
        let pos = |f: &str, v: usize| -> Result<()> {
            if v == 0 {
                Err(SimError::config(f, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        for (f, v) in [
            ("prefill.nodes", p.nodes),
            ("prefill.gpus_per_node", p.gpus_per_node),
            ("prefill.tokens_per_gpu", p.tokens_per_gpu),
            ("prefill.micro_batches", p.micro_batches),
            ("prefill.units", p.units),
            ("decode.units", d.units),
            ("decode.nodes", d.nodes),
            ("decode.gpus_per_node", d.gpus_per_node),
            ("decode.micro_batches", d.micro_batches),
            ("decode.max_batch_per_gpu", d.max_batch_per_gpu),
            (
                "calibration.router_samples",
                self.calibration.router_samples,
            ),
        ] {
            pos(f, v)?;
        }
        self.validate_sizes()?;
        self.validate_numbers()
    }

    fn validate_sizes(&self) -> Result<()> {
        let (p, d, m) = (&self.prefill, &self.decode, &self.model);
        const MAX_GPUS: usize = 10_000_000;
        for (f, nodes, g, units, red) in [
            (
                "prefill",
                p.nodes,
                p.gpus_per_node,
                p.units,
                p.redundant_experts,
            ),
            (
                "decode",
                d.nodes,
                d.gpus_per_node,
                d.units,
                d.redundant_experts,
            ),
        ] {
            let unit = nodes.checked_mul(g).filter(|&x| x <= MAX_GPUS);
            let Some(unit) = unit else {
                return Err(SimError::config(
                    &format!("{f}.nodes"),
                    format!("nodes x gpus_per_node must be at most {MAX_GPUS}"),
                ));
            };
            if unit.checked_mul(units).is_none_or(|x| x > MAX_GPUS) {
                return Err(SimError::config(
                    &format!("{f}.units"),
                    format!("units x GPUs per unit must be at most {MAX_GPUS}"),
                ));
            }
            let Some(phys) = m.routed_experts.checked_add(red).filter(|&x| x <= 1 << 20) else {
                return Err(SimError::config(
                    &format!("{f}.redundant_experts"),
                    "routed + redundant experts must be at most 2^20",
                ));
            };
            if !phys.is_multiple_of(unit) {
                return Err(SimError::config(
                    &format!("{f}.redundant_experts"),
                    format!(
                        "routed ({}) + redundant ({red}) experts must split evenly over the unit's {unit} GPUs",
                        m.routed_experts
                    ),
                ));
            }
        }
        if p.micro_batches > 2 || d.micro_batches > 2 {
            return Err(SimError::config(
                "prefill.micro_batches",
                "1 or 2 micro-batches (prefill and decode)",
            ));
        }
        if p.comm_sms >= self.hardware.sms {
            return Err(SimError::config(
                "prefill.comm_sms",
                format!("must be below the SM count ({})", self.hardware.sms),
            ));
        }
        if p.tokens_per_gpu > 1 << 24 || d.max_batch_per_gpu > 1 << 20 || d.mtp_draft_tokens > 8 {
            return Err(SimError::config(
                "prefill.tokens_per_gpu",
                "tokens_per_gpu <= 2^24, decode.max_batch_per_gpu <= 2^20, mtp_draft_tokens <= 8",
            ));
        }
        Ok(())
    }

    fn validate_numbers(&self) -> Result<()> {
        let w = &self.workload;
        let c = &self.calibration;
        let pos = |f: &str, v: f64| -> Result<()> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(SimError::config(
                    f,
                    format!("must be a finite number > 0, got {v}"),
                ))
            }
        };
        let frac = |f: &str, v: f64, hi_open: bool| -> Result<()> {
            let ok = v.is_finite() && v >= 0.0 && if hi_open { v < 1.0 } else { v <= 1.0 };
            if ok {
                Ok(())
            } else {
                Err(SimError::config(
                    f,
                    format!(
                        "must be a fraction in [0, 1{}, got {v}",
                        if hi_open { ")" } else { "]" }
                    ),
                ))
            }
        };
        pos("workload.avg_prompt_tokens", w.avg_prompt_tokens)?;
        pos("workload.avg_kv_len", w.avg_kv_len)?;
        if !(w.prompt_len_cv.is_finite() && (0.0..=10.0).contains(&w.prompt_len_cv)) {
            return Err(SimError::config(
                "workload.prompt_len_cv",
                format!("must be in [0, 10], got {}", w.prompt_len_cv),
            ));
        }
        pos(
            "workload.target_tokens_per_s_per_user",
            w.target_tokens_per_s_per_user,
        )?;
        frac("workload.cache_hit_rate", w.cache_hit_rate, true)?;
        frac("workload.mtp_acceptance", w.mtp_acceptance, false)?;
        for (f, v) in [
            ("calibration.gemm.tile_eff", c.gemm.tile_eff),
            ("calibration.gemm.hbm_eff", c.gemm.hbm_eff),
            ("calibration.attn_prefill_eff", c.attn_prefill_eff),
            ("calibration.hbm_eff", c.hbm_eff),
            ("calibration.delivered_fraction", c.delivered_fraction),
        ] {
            pos(f, v)?;
            frac(f, v, false)?;
        }
        for (f, v) in [
            ("calibration.mla_decode.gbps", c.mla_decode.gbps),
            ("calibration.mla_decode.tflops", c.mla_decode.tflops),
            ("calibration.mla_decode.kv_bytes", c.mla_decode.kv_bytes),
            (
                "calibration.mla_decode.page_tokens",
                c.mla_decode.page_tokens,
            ),
            (
                "calibration.mem_bytes_per_token_hidden",
                c.mem_bytes_per_token_hidden,
            ),
        ] {
            pos(f, v)?;
        }
        for (f, v) in [
            (
                "calibration.expert_imbalance_prefill",
                c.expert_imbalance_prefill,
            ),
            (
                "calibration.attn_imbalance_prefill",
                c.attn_imbalance_prefill,
            ),
            (
                "calibration.expert_imbalance_decode",
                c.expert_imbalance_decode,
            ),
            ("calibration.attn_imbalance_decode", c.attn_imbalance_decode),
        ] {
            if !(v.is_finite() && (1.0..=100.0).contains(&v)) {
                return Err(SimError::config(
                    f,
                    format!("max/mean must be in [1, 100], got {v}"),
                ));
            }
        }
        for (f, v) in [
            ("calibration.gemm.tile_overhead_us", c.gemm.tile_overhead_us),
            ("calibration.gemm.launch_us", c.gemm.launch_us),
            (
                "calibration.kernel_overhead_us_prefill",
                c.kernel_overhead_us_prefill,
            ),
            (
                "calibration.kernel_overhead_us_decode",
                c.kernel_overhead_us_decode,
            ),
            ("calibration.overlap_slowdown", c.overlap_slowdown),
            ("calibration.hbm_reserve_gb", c.hbm_reserve_gb),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(SimError::config(
                    f,
                    format!("must be a finite number >= 0, got {v}"),
                ));
            }
        }
        Ok(())
    }
}

/// Per-layer forward times of one micro-batch (ms), as reported.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServeLayer {
    pub attn_ms: f64,
    pub dispatch_ms: f64,
    pub experts_ms: f64,
    pub combine_ms: f64,
}

/// Prefill results for one unit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefillReport {
    pub ep: usize,
    pub micro_batch_tokens: usize,
    /// One forward of `tokens_per_gpu` uncached tokens (all micro-batches), seconds.
    pub forward_s: f64,
    pub exposed_comm_s: f64,
    pub computed_tokens_per_s_per_gpu: f64,
    /// Input tokens/s per node, cache hits included, times the delivered fraction.
    pub input_tokens_per_s_per_node: f64,
    pub moe_layer: ServeLayer,
    pub fanout: FanOut,
}

/// Decode results for one unit at the chosen batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeReport {
    pub ep: usize,
    /// Sequences per GPU.
    pub batch_per_gpu: usize,
    /// Why the batch is not larger: `speed target`, `KV cache memory` or `max_batch_per_gpu`.
    pub limited_by: String,
    pub step_s: f64,
    pub exposed_comm_s: f64,
    pub tokens_per_s_per_user: f64,
    /// Time between two output tokens of one user, seconds.
    pub latency_per_token_s: f64,
    pub output_tokens_per_s_per_node: f64,
    pub kv_cache_gb_per_gpu: f64,
    pub weights_gb_per_gpu: f64,
    pub max_batch_by_memory: usize,
    pub moe_layer: ServeLayer,
}

/// Everything one serving simulation produces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServeReport {
    pub model: String,
    pub hardware: String,
    pub gpus: usize,
    pub prefill: PrefillReport,
    pub decode: DecodeReport,
    /// All units together: input tokens/s (prefill) and output tokens/s (decode).
    pub cluster_input_tokens_per_s: f64,
    pub cluster_output_tokens_per_s: f64,
}

/// Builds kernel chains of one phase.
struct Phase<'a> {
    cfg: &'a ServeConfig,
    /// SMs left to compute kernels.
    sms: usize,
    overhead: f64,
}

impl Phase<'_> {
    fn gemm(&self, m: f64, n: usize, k: usize, fp8: bool, weights: usize) -> f64 {
        let g = Gemm {
            m: m.ceil() as usize,
            n,
            k,
            in_bytes: if fp8 { 1 } else { 2 },
            weights,
        };
        compute::gemm_time(&self.cfg.hardware, &self.cfg.calibration.gemm, self.sms, &g)
            + self.overhead
    }
    fn hbm(&self, bytes: f64) -> f64 {
        let h = &self.cfg.hardware;
        bytes / (h.hbm_gbps * 1e9 * self.cfg.calibration.hbm_eff) + self.overhead
    }
    /// Projections shared by prefill and decode (q, kv compression, output).
    fn projections(&self, n: f64) -> f64 {
        let m = &self.cfg.model;
        let dqk = m.qk_nope_head_dim + m.qk_rope_head_dim;
        let q = if m.q_lora_rank > 0 {
            self.gemm(n, m.q_lora_rank, m.hidden, true, 1)
                + self.gemm(n, m.heads * dqk, m.q_lora_rank, true, 1)
        } else {
            self.gemm(n, m.heads * dqk, m.hidden, true, 1)
        };
        q + self.gemm(n, m.kv_lora_rank + m.qk_rope_head_dim, m.hidden, true, 1)
            + self.gemm(n, m.hidden, m.heads * m.v_head_dim, true, 1)
            + self.hbm(n * m.hidden as f64 * self.cfg.calibration.mem_bytes_per_token_hidden)
    }
    /// Routed experts (grouped GEMMs over `rows` rows and `local` experts), shared experts
    /// and the router for `n` tokens.
    fn experts(&self, n: f64, rows: f64, local: usize) -> f64 {
        let m = &self.cfg.model;
        let (h, i) = (m.hidden, m.expert_intermediate);
        let mut t = self.gemm(n, m.routed_experts, h, false, 1)
            + self.gemm(rows, 2 * i, h, true, local)
            + self.gemm(rows, h, i, true, local);
        if m.shared_experts > 0 {
            let si = i * m.shared_experts;
            t += self.gemm(n, 2 * si, h, true, 1) + self.gemm(n, h, si, true, 1);
        }
        t
    }
    fn dense_mlp(&self, n: f64) -> f64 {
        let m = &self.cfg.model;
        self.gemm(n, 2 * m.dense_intermediate, m.hidden, true, 1)
            + self.gemm(n, m.hidden, m.dense_intermediate, true, 1)
    }
}

/// One micro-batch's forward chain: per block attention, then dispatch, experts, combine (MoE)
/// or the dense MLP, then the head.
struct Chain {
    attn: f64,
    dispatch: f64,
    experts: f64,
    combine: f64,
    dense_mlp: f64,
    head: f64,
}

fn build_chain(m: &ModelConfig, c: &Chain) -> Vec<Kernel> {
    let mut v = Vec::with_capacity(4 * (m.layers + m.mtp_layers) + 1);
    let ck = |name, dur, layer| Kernel {
        name,
        res: Resource::Compute,
        dur,
        layer,
    };
    let mk = |name, dur, layer| Kernel {
        name,
        res: Resource::Comm,
        dur,
        layer,
    };
    for l in 0..m.layers + m.mtp_layers {
        v.push(ck("attn", c.attn, l));
        if l < m.dense_layers {
            v.push(ck("mlp", c.dense_mlp, l));
        } else {
            v.push(mk("dispatch", c.dispatch, l));
            v.push(ck("experts", c.experts, l));
            v.push(mk("combine", c.combine, l));
        }
    }
    v.push(ck("head", c.head, usize::MAX));
    v
}

/// Makespan and exposed communication of `mb` identical chains on two streams.
fn run_chains(m: &ModelConfig, c: &Chain, mb: usize, slowdown: f64) -> (f64, f64) {
    let chain = build_chain(m, c);
    let chains: Vec<&[Kernel]> = (0..mb).map(|_| chain.as_slice()).collect();
    let s = crate::overlap::schedule(&chains, slowdown);
    (s.makespan, s.exposed_comm())
}

fn ep_shape(m: &ModelConfig, ranks: usize, gpn: usize) -> EpShape {
    EpShape {
        ranks,
        gpus_per_node: gpn,
        experts: m.routed_experts,
        hidden: m.hidden,
        topk: m.top_k,
    }
}

/// Fan-out of the V3 router over the prefill unit (logical experts placed contiguously).
pub fn prefill_fanout(cfg: &ServeConfig) -> FanOut {
    let p = &cfg.prefill;
    let ep = p.nodes * p.gpus_per_node;
    let par = ParallelConfig {
        pp: 1,
        ep,
        dp: ep,
        gpus_per_node: p.gpus_per_node,
        nodes: p.nodes,
    };
    let c = &cfg.calibration;
    routing::sampled_fanout(&cfg.model, &par, c.router_samples, c.router_seed)
}

/// Simulate one prefill forward of the unit.
pub fn prefill(cfg: &ServeConfig, fan: &FanOut) -> Result<PrefillReport> {
    let (m, p, w, c) = (&cfg.model, &cfg.prefill, &cfg.workload, &cfg.calibration);
    let hw = &cfg.hardware;
    let ep = p.nodes * p.gpus_per_node;
    let ph = Phase {
        cfg,
        sms: hw.sms - p.comm_sms,
        overhead: c.kernel_overhead_us_prefill * 1e-6,
    };
    let n = p.tokens_per_gpu as f64 / p.micro_batches as f64;
    let hit = w.cache_hit_rate;
    // Cached prefix tokens per computed token, and the mean context a new token attends to.
    let prefix = hit / (1.0 - hit);
    let att_len = w.avg_prompt_tokens * (1.0 + w.prompt_len_cv.powi(2)) * (1.0 + hit) / 2.0;
    let dqk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
    let core = 2.0 * n * m.heads as f64 * att_len * (dqk + m.v_head_dim as f64);
    let frac = ph.sms as f64 / hw.sms as f64;
    let kv_up = ph.gemm(
        n * (1.0 + prefix),
        m.heads * (m.qk_nope_head_dim + m.v_head_dim),
        m.kv_lora_rank,
        true,
        1,
    );
    let prefix_load = ph.hbm(n * prefix * (m.kv_lora_rank + m.qk_rope_head_dim) as f64 * 2.0);
    let attn = ph.projections(n)
        + kv_up
        + prefix_load
        + core * c.attn_imbalance_prefill / (hw.tflops_bf16 * 1e12 * c.attn_prefill_eff * frac);
    let local = (m.routed_experts + p.redundant_experts) / ep;
    let rows = n * m.top_k as f64 * c.expert_imbalance_prefill;
    let shape = ep_shape(m, ep, p.gpus_per_node);
    let tok = n * c.expert_imbalance_prefill;
    let comm_t = |bytes: usize, what: &str| -> Result<f64> {
        let load = CommLoad::normal(tok, fan, bytes as f64);
        comm::normal_time(hw, p.comm_sms, &load).ok_or_else(|| {
            SimError::CannotComplete(format!(
                "prefill {what} must move tokens but prefill.comm_sms = 0"
            ))
        })
    };
    let requests = n / (w.avg_prompt_tokens * (1.0 - hit)).max(1.0);
    let chain = Chain {
        attn,
        dispatch: comm_t(shape.dispatch_record_bytes(Payload::Fp8), "dispatch")?,
        experts: ph.experts(n, rows, local),
        combine: comm_t(shape.combine_record_bytes(), "combine")?,
        dense_mlp: ph.dense_mlp(n),
        head: ph.gemm(requests, m.vocab, m.hidden, false, 1),
    };
    let (forward, exposed) = run_chains(m, &chain, p.micro_batches, c.overlap_slowdown);
    let computed = p.tokens_per_gpu as f64 / forward;
    Ok(PrefillReport {
        ep,
        micro_batch_tokens: n as usize,
        forward_s: forward,
        exposed_comm_s: exposed,
        computed_tokens_per_s_per_gpu: computed,
        input_tokens_per_s_per_node: computed / (1.0 - hit)
            * p.gpus_per_node as f64
            * c.delivered_fraction,
        moe_layer: layer_ms(&chain),
        fanout: *fan,
    })
}

fn layer_ms(c: &Chain) -> ServeLayer {
    ServeLayer {
        attn_ms: c.attn * 1e3,
        dispatch_ms: c.dispatch * 1e3,
        experts_ms: c.experts * 1e3,
        combine_ms: c.combine * 1e3,
    }
}

/// One decode step at `batch` sequences per GPU: (chain times, step seconds, exposed comm).
fn decode_step(cfg: &ServeConfig, batch: usize) -> (Chain, f64, f64) {
    let (m, d, w, c) = (&cfg.model, &cfg.decode, &cfg.workload, &cfg.calibration);
    let hw = &cfg.hardware;
    let ep = d.nodes * d.gpus_per_node;
    // Low-latency kernels hold no SM while data is in flight: compute keeps every SM.
    let ph = Phase {
        cfg,
        sms: hw.sms,
        overhead: c.kernel_overhead_us_decode * 1e-6,
    };
    let q = (1 + d.mtp_draft_tokens) as f64;
    let seqs = batch as f64 / d.micro_batches as f64;
    let n = seqs * q;
    let (heads, rank) = (m.heads, m.kv_lora_rank);
    // Absorbed MLA: W_UK folded into the query, W_UV applied to the latent output (BF16).
    let absorb = ph.gemm(n, heads * rank, m.qk_nope_head_dim, false, 1)
        + ph.gemm(n, heads * m.v_head_dim, rank, false, 1);
    let mla = compute::mla_decode_time(
        &c.mla_decode,
        seqs * c.attn_imbalance_decode,
        w.avg_kv_len,
        q,
        heads as f64,
        rank as f64,
        m.qk_rope_head_dim as f64,
    ) + ph.overhead;
    let local = (m.routed_experts + d.redundant_experts) / ep;
    let rows = n * m.top_k as f64 * c.expert_imbalance_decode;
    let remote = (ep - d.gpus_per_node.min(ep)) as f64 / ep as f64;
    let h = m.hidden as f64;
    let ll = |bytes: f64| {
        let load =
            CommLoad::low_latency(n * c.expert_imbalance_decode, m.top_k as f64, remote, bytes);
        comm::low_latency_time(hw, &load)
    };
    let chain = Chain {
        attn: ph.projections(n) + absorb + mla,
        dispatch: ll(h + h / 128.0 * 4.0 + 16.0),
        experts: ph.experts(n, rows, local),
        combine: ll(2.0 * h),
        dense_mlp: ph.dense_mlp(n),
        // Logits for every query token, main and MTP heads.
        head: ph.gemm(n, m.vocab, m.hidden, false, 1) * (1 + m.mtp_layers.min(1)) as f64,
    };
    let (step, exposed) = run_chains(m, &chain, d.micro_batches, c.overlap_slowdown);
    (chain, step, exposed)
}

/// Weights held by one decode GPU (GB): attention, dense MLPs and shared experts replicated
/// (data parallel), routed experts split over the unit, embedding and head(s) in BF16.
fn decode_weights_gb(cfg: &ServeConfig) -> f64 {
    let m = &cfg.model;
    let d = &cfg.decode;
    let (h, hd) = (m.hidden as f64, m.heads as f64);
    let dqk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
    let q = if m.q_lora_rank > 0 {
        h * m.q_lora_rank as f64 + m.q_lora_rank as f64 * hd * dqk
    } else {
        h * hd * dqk
    };
    let attn = q
        + h * (m.kv_lora_rank + m.qk_rope_head_dim) as f64
        + m.kv_lora_rank as f64 * hd * (m.qk_nope_head_dim + m.v_head_dim) as f64
        + hd * m.v_head_dim as f64 * h;
    let expert = 3.0 * h * m.expert_intermediate as f64;
    let blocks = (m.layers + m.mtp_layers) as f64;
    let moe = blocks - m.dense_layers as f64;
    let local = ((m.routed_experts + d.redundant_experts) / (d.nodes * d.gpus_per_node)) as f64;
    let fp8 = blocks * attn
        + m.dense_layers as f64 * 3.0 * h * m.dense_intermediate as f64
        + moe * (m.shared_experts as f64 + local) * expert;
    (fp8 + 2.0 * 2.0 * h * m.vocab as f64) / 1e9
}

/// KV-cache bytes per cached token (latent + RoPE key, every layer).
fn kv_bytes_per_token(cfg: &ServeConfig) -> f64 {
    let m = &cfg.model;
    (m.kv_lora_rank + m.qk_rope_head_dim) as f64
        * cfg.calibration.mla_decode.kv_bytes
        * (m.layers + m.mtp_layers) as f64
}

/// Tokens per step a user gets (1 + accepted drafts).
fn tokens_per_step(cfg: &ServeConfig) -> f64 {
    1.0 + cfg.decode.mtp_draft_tokens as f64 * cfg.workload.mtp_acceptance
}

/// The most sequences per GPU whose KV cache fits next to the weights.
pub fn decode_memory_limit(cfg: &ServeConfig) -> Result<(usize, f64)> {
    let weights = decode_weights_gb(cfg);
    let free = cfg.hardware.hbm_gb - weights - cfg.calibration.hbm_reserve_gb;
    let per_seq = kv_bytes_per_token(cfg)
        * cfg
            .calibration
            .mla_decode
            .paged_len(cfg.workload.avg_kv_len)
        * cfg.calibration.attn_imbalance_decode
        / 1e9;
    let n = if free > 0.0 {
        (free / per_seq).floor()
    } else {
        0.0
    };
    if n < 1.0 {
        return Err(SimError::CannotComplete(format!(
            "decode: {weights:.1} GB of weights + {:.1} GB reserve leave no room in \
             hardware.hbm_gb = {} for one sequence's KV cache ({per_seq:.2} GB)",
            cfg.calibration.hbm_reserve_gb, cfg.hardware.hbm_gb
        )));
    }
    Ok((n.min(1e9) as usize, weights))
}

/// Simulate decode at a given batch per GPU.
pub fn decode_at(cfg: &ServeConfig, batch: usize, limited_by: &str) -> Result<DecodeReport> {
    let d = &cfg.decode;
    let (max_mem, weights) = decode_memory_limit(cfg)?;
    let (chain, step, exposed) = decode_step(cfg, batch.max(1));
    let speed = tokens_per_step(cfg) / step;
    Ok(DecodeReport {
        ep: d.nodes * d.gpus_per_node,
        batch_per_gpu: batch,
        limited_by: limited_by.to_string(),
        step_s: step,
        exposed_comm_s: exposed,
        tokens_per_s_per_user: speed,
        latency_per_token_s: 1.0 / speed,
        output_tokens_per_s_per_node: batch as f64
            * speed
            * d.gpus_per_node as f64
            * cfg.calibration.delivered_fraction,
        kv_cache_gb_per_gpu: batch as f64
            * kv_bytes_per_token(cfg)
            * cfg
                .calibration
                .mla_decode
                .paged_len(cfg.workload.avg_kv_len)
            / 1e9,
        weights_gb_per_gpu: weights,
        max_batch_by_memory: max_mem,
        moe_layer: layer_ms(&chain),
    })
}

/// The largest batch per GPU meeting the per-user speed target within memory.
pub fn decode(cfg: &ServeConfig) -> Result<DecodeReport> {
    let target = cfg.workload.target_tokens_per_s_per_user;
    let (max_mem, _) = decode_memory_limit(cfg)?;
    let hi = max_mem.min(cfg.decode.max_batch_per_gpu);
    let speed = |b: usize| tokens_per_step(cfg) / decode_step(cfg, b).1;
    if speed(1) < target {
        return Err(SimError::CannotComplete(format!(
            "decode: even one sequence per GPU gets {:.1} tokens/s, below \
             workload.target_tokens_per_s_per_user = {target}",
            speed(1)
        )));
    }
    // Speed falls with the batch: bisect for the last batch that meets the target.
    let (mut lo, mut up) = (1usize, hi);
    if speed(up) >= target {
        lo = up;
    }
    while up - lo > 1 {
        let mid = lo + (up - lo) / 2;
        if speed(mid) >= target {
            lo = mid;
        } else {
            up = mid;
        }
    }
    let why = if lo < hi {
        "speed target"
    } else if hi == max_mem {
        "KV cache memory"
    } else {
        "max_batch_per_gpu"
    };
    decode_at(cfg, lo, why)
}

/// Simulate both phases of the deployment.
pub fn simulate(cfg: &ServeConfig) -> Result<ServeReport> {
    cfg.validate()?;
    let fan = prefill_fanout(cfg);
    let pre = prefill(cfg, &fan)?;
    let dec = decode(cfg)?;
    let (p, d) = (&cfg.prefill, &cfg.decode);
    Ok(ServeReport {
        model: cfg.model.name.clone(),
        hardware: cfg.hardware.name.clone(),
        gpus: cfg.gpus(),
        cluster_input_tokens_per_s: pre.input_tokens_per_s_per_node * (p.units * p.nodes) as f64,
        cluster_output_tokens_per_s: dec.output_tokens_per_s_per_node * (d.units * d.nodes) as f64,
        prefill: pre,
        decode: dec,
    })
}

/// One line of the comparison with DeepSeek's published day of service.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Published {
    pub what: &'static str,
    pub published: f64,
    pub simulated: f64,
    pub error: f64,
}

/// DeepSeek's published figures (Feb 2025, per H800 node) next to the simulation.
pub fn compare_published(r: &ServeReport) -> Vec<Published> {
    let row = |what, published: f64, simulated: f64| Published {
        what,
        published,
        simulated,
        error: (simulated - published) / published,
    };
    vec![
        row(
            "prefill input tokens/s per node (56.3% cache hits included)",
            73_700.0,
            r.prefill.input_tokens_per_s_per_node,
        ),
        row(
            "decode output tokens/s per node",
            14_800.0,
            r.decode.output_tokens_per_s_per_node,
        ),
        row(
            "decode tokens/s per user (published 20-22)",
            21.0,
            r.decode.tokens_per_s_per_user,
        ),
    ]
}

impl ServeReport {
    /// Human-readable summary.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let (p, d) = (&self.prefill, &self.decode);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} serving on {} x {}",
            self.model, self.gpus, self.hardware
        );
        let _ = writeln!(
            s,
            "prefill EP{}: {:.0} input tokens/s per node ({:.0} computed tokens/s per GPU, forward {:.3} s, exposed comm {:.3} s)",
            p.ep, p.input_tokens_per_s_per_node, p.computed_tokens_per_s_per_gpu, p.forward_s, p.exposed_comm_s
        );
        let _ = writeln!(
            s,
            "decode EP{}: {:.0} output tokens/s per node at {:.1} tokens/s per user ({:.1} ms per token), batch {} per GPU (limited by {})",
            d.ep, d.output_tokens_per_s_per_node, d.tokens_per_s_per_user, d.latency_per_token_s * 1e3, d.batch_per_gpu, d.limited_by
        );
        let _ = writeln!(
            s,
            "decode memory per GPU: weights {:.1} GB, KV cache {:.1} GB (memory allows {} sequences)",
            d.weights_gb_per_gpu, d.kv_cache_gb_per_gpu, d.max_batch_by_memory
        );
        let _ = writeln!(
            s,
            "cluster: {:.3e} input tokens/s, {:.3e} output tokens/s",
            self.cluster_input_tokens_per_s, self.cluster_output_tokens_per_s
        );
        for (name, l) in [("prefill", &p.moe_layer), ("decode", &d.moe_layer)] {
            let _ = writeln!(
                s,
                "{name} MoE layer, one micro-batch (ms): attn {:.3}, dispatch {:.3}, experts {:.3}, combine {:.3}",
                l.attn_ms, l.dispatch_ms, l.experts_ms, l.combine_ms
            );
        }
        s
    }
}

/// One decode batch size of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServePoint {
    pub batch_per_gpu: usize,
    pub tokens_per_s_per_user: f64,
    pub output_tokens_per_s_per_node: f64,
    pub step_s: f64,
    /// Whether the batch's KV cache fits in HBM.
    pub fits_memory: bool,
}

/// Decode throughput per node against per-user speed over a range of batch sizes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServeSweep {
    pub points: Vec<ServePoint>,
    pub target_tokens_per_s_per_user: f64,
    /// The batch [`decode`] picks (none when the target is unreachable).
    pub chosen_batch: Option<usize>,
    /// DeepSeek's published operating point (tokens/s per user, output tokens/s per node).
    pub published: (f64, f64),
}

/// Parse `batch=LO..HI` (inclusive).
pub fn parse_batch_sweep(spec: &str) -> Result<(usize, usize)> {
    let bad = |rule: &str| SimError::Sweep {
        spec: spec.to_string(),
        rule: rule.to_string(),
    };
    let range = spec
        .strip_prefix("batch=")
        .ok_or_else(|| bad("expected batch=LO..HI for a serving configuration"))?;
    let (lo, hi) = range
        .split_once("..")
        .ok_or_else(|| bad("expected LO..HI"))?;
    let lo: usize = lo.trim().parse().map_err(|_| bad("LO is not a number"))?;
    let hi: usize = hi
        .trim_start_matches('=')
        .trim()
        .parse()
        .map_err(|_| bad("HI is not a number"))?;
    if lo == 0 || lo > hi {
        return Err(bad("need 1 <= LO <= HI"));
    }
    if hi - lo >= 100_000 {
        return Err(bad("at most 100000 points"));
    }
    Ok((lo, hi))
}

/// Simulate decode at every batch in `lo..=hi`.
pub fn decode_sweep(cfg: &ServeConfig, lo: usize, hi: usize) -> Result<ServeSweep> {
    cfg.validate()?;
    let (max_mem, _) = decode_memory_limit(cfg)?;
    let mut points = Vec::with_capacity(hi + 1 - lo);
    for b in lo..=hi {
        let (_, step, _) = decode_step(cfg, b);
        let speed = tokens_per_step(cfg) / step;
        points.push(ServePoint {
            batch_per_gpu: b,
            tokens_per_s_per_user: speed,
            output_tokens_per_s_per_node: b as f64
                * speed
                * cfg.decode.gpus_per_node as f64
                * cfg.calibration.delivered_fraction,
            step_s: step,
            fits_memory: b <= max_mem,
        });
    }
    Ok(ServeSweep {
        points,
        target_tokens_per_s_per_user: cfg.workload.target_tokens_per_s_per_user,
        chosen_batch: decode(cfg).ok().map(|d| d.batch_per_gpu),
        published: (21.0, 14_800.0),
    })
}

impl ServeSweep {
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::from("batch/GPU  tokens/s/user  output tokens/s/node  step_ms  fits\n");
        for p in &self.points {
            let _ = writeln!(
                s,
                "{:9} {:14.2} {:21.0} {:8.2}  {}",
                p.batch_per_gpu,
                p.tokens_per_s_per_user,
                p.output_tokens_per_s_per_node,
                p.step_s * 1e3,
                if p.fits_memory {
                    "yes"
                } else {
                    "no (KV cache)"
                }
            );
        }
        if let Some(b) = self.chosen_batch {
            let _ = writeln!(
                s,
                "chosen: batch {b} per GPU (largest meeting {} tokens/s per user within memory)",
                self.target_tokens_per_s_per_user
            );
        }
        s
    }
}
