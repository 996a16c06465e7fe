//! Simulator inputs: the model, training, parallelism, hardware, communication budget, schedule
//! and calibration constants; the built-in presets (`v3`, `h200-node`); loading from TOML/JSON;
//! and validation that refuses a bad configuration with the offending field and the rule.

use crate::compute::GemmCal;
use crate::error::{Result, SimError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Model shape (MLA attention + DeepSeekMoE).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub name: String,
    /// Transformer blocks (dense + MoE), excluding MTP modules.
    pub layers: usize,
    /// The first `dense_layers` blocks use a dense MLP instead of MoE.
    pub dense_layers: usize,
    pub hidden: usize,
    pub heads: usize,
    /// 0 means no query compression (q projected directly from the hidden state).
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub routed_experts: usize,
    pub shared_experts: usize,
    pub top_k: usize,
    /// Expert groups (node-limited routing: a token may use at most `top_groups` of them).
    pub groups: usize,
    pub top_groups: usize,
    pub expert_intermediate: usize,
    /// Intermediate size of the dense MLP of the first `dense_layers` blocks.
    pub dense_intermediate: usize,
    pub vocab: usize,
    pub seq_len: usize,
    /// Multi-token-prediction modules (each: one MoE block + projection + shared head).
    pub mtp_layers: usize,
}

/// Numeric precision of the GEMMs (and the dispatch payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp8,
    Bf16,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingConfig {
    /// Tokens per micro-batch on one data-parallel rank (a multiple of `model.seq_len`).
    pub micro_batch_tokens: usize,
    /// Micro-batches per step per pipeline (for DualPipe: both directions together).
    pub micro_batches: usize,
    pub precision: Precision,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelConfig {
    pub pp: usize,
    /// Expert-parallel degree: experts of one layer are spread over `ep` GPUs.
    pub ep: usize,
    /// Data-parallel degree (GPUs per pipeline stage). `pp * dp` must equal the GPU count.
    pub dp: usize,
    pub gpus_per_node: usize,
    pub nodes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareConfig {
    pub name: String,
    pub sms: usize,
    /// Dense tensor-core peak, TFLOP/s.
    pub tflops_bf16: f64,
    pub tflops_fp8: f64,
    pub hbm_gb: f64,
    /// HBM bandwidth, GB/s (10^9 bytes/s).
    pub hbm_gbps: f64,
    /// Achievable NVLink bandwidth per GPU per direction, GB/s.
    pub intra_node_gbps: f64,
    pub intra_node_latency_us: f64,
    /// Achievable inter-node (RDMA) bandwidth per GPU per direction, GB/s.
    pub inter_node_gbps: f64,
    pub inter_node_latency_us: f64,
    /// Bytes one communication SM copies into destination buffers per second, GB/s (normal-mode
    /// dispatch/combine: one copy per destination GPU, landing GPU included).
    pub comm_gbps_per_sm: f64,
    /// Fixed cost of one low-latency (decode) dispatch or combine, microseconds.
    pub ll_latency_us: f64,
}

/// How the node/GPU fan-out of a token is obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoutingMode {
    /// Sample the group-limited sigmoid top-k router on random gate scores.
    Sampled,
    /// Closed-form estimate from the routing rule (experts spread uniformly over chosen groups).
    Estimate,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommConfig {
    /// SMs reserved for dispatch/combine kernels (the rest run computation).
    pub sms: usize,
    pub routing: RoutingMode,
    /// Tokens sampled by the router sampler.
    pub router_samples: usize,
    pub router_seed: u64,
}

/// Pipeline schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScheduleKind {
    #[serde(rename = "1f1b")]
    OneFOneB,
    #[serde(rename = "zb1p")]
    Zb1p,
    #[serde(rename = "dualpipe")]
    DualPipe,
    #[serde(rename = "dualpipev")]
    DualPipeV,
}

impl FromStr for ScheduleKind {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "1f1b" => Ok(Self::OneFOneB),
            "zb1p" | "zbh1" => Ok(Self::Zb1p),
            "dualpipe" => Ok(Self::DualPipe),
            "dualpipev" => Ok(Self::DualPipeV),
            _ => Err(SimError::config(
                "schedule",
                format!("`{s}` is not one of dualpipe, dualpipev, 1f1b, zb1p"),
            )),
        }
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::OneFOneB => "1f1b",
            Self::Zb1p => "zb1p",
            Self::DualPipe => "dualpipe",
            Self::DualPipeV => "dualpipev",
        })
    }
}

/// Achieved fractions of peak and other calibration constants (see docs/SIM.md for sources).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Tile model of the FP8/BF16 GEMMs (projections, MLPs, experts), fitted on DeepGEMM's
    /// published H800 table (`compute::GemmCal::h800`).
    pub gemm: GemmCal,
    /// Speed of the weight-gradient GEMMs relative to the tile model (transposed 128x1
    /// re-quantised operands, k-grouped expert GEMMs).
    pub wgrad_rel_speed: f64,
    /// BF16 GEMMs (output head, router) fraction of the BF16 peak.
    pub bf16_gemm_eff: f64,
    /// Causal attention core (BF16) forward / backward fraction of the BF16 peak.
    pub attn_fwd_eff: f64,
    pub attn_bwd_eff: f64,
    /// Fraction of HBM bandwidth reached by memory-bound kernels.
    pub hbm_eff: f64,
    /// max/mean tokens per GPU after routing (applies to expert GEMMs and all-to-all bytes).
    pub expert_imbalance: f64,
    /// Fractional slowdown of compute kernels while communication kernels run concurrently.
    pub overlap_slowdown: f64,
    /// Host/launch overhead per kernel, microseconds.
    pub kernel_overhead_us: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub model: ModelConfig,
    pub training: TrainingConfig,
    pub parallelism: ParallelConfig,
    pub hardware: HardwareConfig,
    pub comm: CommConfig,
    pub schedule: ScheduleKind,
    pub calibration: Calibration,
}

/// H800 SXM with the communication parameters fitted to DeepEP's published tables (see
/// `comm::deepep_table` and docs/SIM.md).
pub fn h800() -> HardwareConfig {
    HardwareConfig {
        name: "H800 SXM".into(),
        sms: 132,
        tflops_bf16: 989.0,
        tflops_fp8: 1979.0,
        hbm_gb: 80.0,
        hbm_gbps: 3350.0,
        intra_node_gbps: 152.0,
        intra_node_latency_us: 3.0,
        inter_node_gbps: 44.0,
        inter_node_latency_us: 10.0,
        comm_gbps_per_sm: 6.1,
        ll_latency_us: 27.0,
    }
}

fn default_calibration() -> Calibration {
    Calibration {
        gemm: GemmCal::h800(),
        wgrad_rel_speed: 0.8,
        bf16_gemm_eff: 0.70,
        attn_fwd_eff: 0.40,
        attn_bwd_eff: 0.30,
        hbm_eff: 0.80,
        expert_imbalance: 1.15,
        overlap_slowdown: 0.05,
        kernel_overhead_us: 4.0,
    }
}

/// DeepSeek-V3 model shape (V3 technical report, Table/Sec. 4.2).
pub fn v3_model() -> ModelConfig {
    ModelConfig {
        name: "DeepSeek-V3".into(),
        layers: 61,
        dense_layers: 3,
        hidden: 7168,
        heads: 128,
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        routed_experts: 256,
        shared_experts: 1,
        top_k: 8,
        groups: 8,
        top_groups: 4,
        expert_intermediate: 2048,
        dense_intermediate: 18432,
        vocab: 129280,
        seq_len: 4096,
        mtp_layers: 1,
    }
}

impl Config {
    /// The DeepSeek-V3 pre-training run: 2048 H800, PP16 (DualPipe), EP64 over 8 nodes,
    /// ZeRO-1 DP128, FP8, 15360 x 4K-token sequences per step (120 micro-batches of 4096 tokens).
    pub fn v3() -> Config {
        Config {
            model: v3_model(),
            training: TrainingConfig {
                micro_batch_tokens: 4096,
                micro_batches: 120,
                precision: Precision::Fp8,
            },
            parallelism: ParallelConfig {
                pp: 16,
                ep: 64,
                dp: 128,
                gpus_per_node: 8,
                nodes: 256,
            },
            hardware: h800(),
            comm: CommConfig {
                sms: 20,
                routing: RoutingMode::Sampled,
                router_samples: 4096,
                router_seed: 8,
            },
            schedule: ScheduleKind::DualPipe,
            calibration: default_calibration(),
        }
    }

    /// One 8-GPU H200 node training a DeepSeek-V2-Lite-shaped MoE: PP2 x DP4, EP4 (NVLink only).
    pub fn h200_node() -> Config {
        Config {
            model: ModelConfig {
                name: "DeepSeek-V2-Lite".into(),
                layers: 27,
                dense_layers: 1,
                hidden: 2048,
                heads: 16,
                q_lora_rank: 0,
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
                routed_experts: 64,
                shared_experts: 2,
                top_k: 6,
                groups: 1,
                top_groups: 1,
                expert_intermediate: 1408,
                dense_intermediate: 10944,
                vocab: 102400,
                seq_len: 4096,
                mtp_layers: 0,
            },
            training: TrainingConfig {
                micro_batch_tokens: 8192,
                micro_batches: 16,
                precision: Precision::Fp8,
            },
            parallelism: ParallelConfig {
                pp: 2,
                ep: 4,
                dp: 4,
                gpus_per_node: 8,
                nodes: 1,
            },
            hardware: HardwareConfig {
                name: "H200 SXM".into(),
                sms: 132,
                tflops_bf16: 989.0,
                tflops_fp8: 1979.0,
                hbm_gb: 141.0,
                hbm_gbps: 4800.0,
                intra_node_gbps: 360.0,
                intra_node_latency_us: 3.0,
                inter_node_gbps: 50.0,
                inter_node_latency_us: 10.0,
                comm_gbps_per_sm: 6.1,
                ll_latency_us: 27.0,
            },
            comm: CommConfig {
                sms: 20,
                routing: RoutingMode::Sampled,
                router_samples: 4096,
                router_seed: 8,
            },
            schedule: ScheduleKind::DualPipe,
            calibration: Calibration {
                // Measured cuBLAS bf16 8192^3 on H200: ~790 of 989 TFLOP/s.
                bf16_gemm_eff: 0.80,
                ..default_calibration()
            },
        }
    }

    pub fn preset(name: &str) -> Result<Config> {
        match name {
            "v3" => Ok(Self::v3()),
            "h200-node" | "h200" => Ok(Self::h200_node()),
            _ => Err(SimError::UnknownPreset(name.to_string())),
        }
    }

    /// Parse TOML (or JSON when `source_name` ends in `.json`) and validate.
    pub fn from_str_named(text: &str, source_name: &str) -> Result<Config> {
        let cfg: Config = if source_name.ends_with(".json") {
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

    /// A preset name or a path to a TOML/JSON file.
    pub fn load(preset_or_path: &str) -> Result<Config> {
        match Self::preset(preset_or_path) {
            Ok(c) => Ok(c),
            Err(_) if crate::is_file_name(preset_or_path) => {
                let text = crate::read_config_file(preset_or_path)?;
                Self::from_str_named(&text, preset_or_path)
            }
            Err(e) => Err(e),
        }
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    pub fn gpus(&self) -> usize {
        self.parallelism.nodes * self.parallelism.gpus_per_node
    }

    /// Check every rule; the first broken one is returned with its field.
    pub fn validate(&self) -> Result<()> {
        validate_model(&self.model)?;
        validate_hardware(&self.hardware)?;
        self.validate_sizes()?;
        self.validate_layout()?;
        validate_calibration(&self.calibration)
    }

    /// Counts that must be positive and not absurd (products stay far from overflow).
    fn validate_sizes(&self) -> Result<()> {
        let (m, t, p, c) = (&self.model, &self.training, &self.parallelism, &self.comm);
        let pos = |field: &str, v: usize| -> Result<()> {
            if v == 0 {
                Err(SimError::config(field, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        for (f, v) in [
            ("training.micro_batch_tokens", t.micro_batch_tokens),
            ("training.micro_batches", t.micro_batches),
            ("parallelism.pp", p.pp),
            ("parallelism.ep", p.ep),
            ("parallelism.dp", p.dp),
            ("parallelism.gpus_per_node", p.gpus_per_node),
            ("parallelism.nodes", p.nodes),
            ("comm.router_samples", c.router_samples),
        ] {
            pos(f, v)?;
        }
        for (f, v, limit) in [
            ("training.micro_batch_tokens", t.micro_batch_tokens, 1 << 24),
            ("training.micro_batches", t.micro_batches, 1 << 20),
            ("parallelism.pp", p.pp, 1 << 12),
            ("parallelism.ep", p.ep, 1 << 20),
            ("parallelism.dp", p.dp, 1 << 24),
            ("parallelism.gpus_per_node", p.gpus_per_node, 1 << 10),
            ("parallelism.nodes", p.nodes, 1 << 24),
            ("comm.router_samples", c.router_samples, 1 << 20),
        ] {
            at_most(f, v, limit)?;
        }
        if c.router_samples * m.routed_experts > 1 << 28 {
            return Err(SimError::config(
                "comm.router_samples",
                format!(
                    "{} samples x {} experts is too much routing to sample (at most 2^28)",
                    c.router_samples, m.routed_experts
                ),
            ));
        }
        Ok(())
    }

    /// How the model, the batch and the parallelism fit together.
    fn validate_layout(&self) -> Result<()> {
        let m = &self.model;
        let t = &self.training;
        let p = &self.parallelism;
        let h = &self.hardware;
        let c = &self.comm;
        if !t.micro_batch_tokens.is_multiple_of(m.seq_len) {
            return Err(SimError::config(
                "training.micro_batch_tokens",
                format!(
                    "must be a multiple of model.seq_len ({}), got {}",
                    m.seq_len, t.micro_batch_tokens
                ),
            ));
        }
        let gpus = p.nodes * p.gpus_per_node;
        if p.pp * p.dp != gpus {
            return Err(SimError::config(
                "parallelism.dp",
                format!(
                    "pp ({}) x dp ({}) must equal the GPU count nodes x gpus_per_node = {}",
                    p.pp, p.dp, gpus
                ),
            ));
        }
        if !gpus.is_multiple_of(p.ep) || !p.dp.is_multiple_of(p.ep) {
            return Err(SimError::config(
                "parallelism.ep",
                format!(
                    "EP ({}) must divide the GPUs ({}) and the GPUs of one pipeline stage (dp = {})",
                    p.ep, gpus, p.dp
                ),
            ));
        }
        if p.ep > p.gpus_per_node && !p.ep.is_multiple_of(p.gpus_per_node) {
            return Err(SimError::config(
                "parallelism.ep",
                format!(
                    "an EP group larger than a node must span whole nodes ({} GPUs per node)",
                    p.gpus_per_node
                ),
            ));
        }
        if p.ep <= p.gpus_per_node && !p.gpus_per_node.is_multiple_of(p.ep) {
            return Err(SimError::config(
                "parallelism.ep",
                format!("must divide gpus_per_node ({})", p.gpus_per_node),
            ));
        }
        if !m.routed_experts.is_multiple_of(p.ep) {
            return Err(SimError::config(
                "parallelism.ep",
                format!(
                    "must divide model.routed_experts ({}), got {}",
                    m.routed_experts, p.ep
                ),
            ));
        }
        if m.layers < p.pp {
            return Err(SimError::config(
                "parallelism.pp",
                format!("{} stages for only {} layers", p.pp, m.layers),
            ));
        }
        if let Err(e) = pipeline::check_request(
            crate::timeline::method(self.schedule),
            crate::timeline::pipeline_pp(self.schedule, p.pp),
            t.micro_batches,
        ) {
            return Err(SimError::config(
                "training.micro_batches",
                format!("schedule {} with pp = {}: {e}", self.schedule, p.pp),
            ));
        }
        let stages = if self.schedule == ScheduleKind::DualPipeV {
            2 * p.pp
        } else {
            p.pp
        };
        if m.layers + m.mtp_layers < stages {
            return Err(SimError::config(
                "parallelism.pp",
                format!(
                    "{stages} pipeline stages for only {} blocks",
                    m.layers + m.mtp_layers
                ),
            ));
        }
        if c.sms >= h.sms {
            return Err(SimError::config(
                "comm.sms",
                format!(
                    "communication budget ({}) must be below the SM count ({}) so computation keeps at least one SM",
                    c.sms, h.sms
                ),
            ));
        }
        Ok(())
    }
}

fn at_most(field: &str, v: usize, limit: usize) -> Result<()> {
    if v > limit {
        Err(SimError::config(
            field,
            format!("{v} is beyond what the simulator accepts (at most {limit})"),
        ))
    } else {
        Ok(())
    }
}

fn positive(field: &str, v: usize) -> Result<()> {
    if v == 0 {
        Err(SimError::config(field, "must be at least 1"))
    } else {
        Ok(())
    }
}

/// Rules of the model shape alone (shared by training and serving configurations).
pub fn validate_model(m: &ModelConfig) -> Result<()> {
    for (f, v) in [
        ("model.layers", m.layers),
        ("model.hidden", m.hidden),
        ("model.heads", m.heads),
        ("model.kv_lora_rank", m.kv_lora_rank),
        ("model.qk_nope_head_dim", m.qk_nope_head_dim),
        ("model.v_head_dim", m.v_head_dim),
        ("model.routed_experts", m.routed_experts),
        ("model.top_k", m.top_k),
        ("model.groups", m.groups),
        ("model.top_groups", m.top_groups),
        ("model.expert_intermediate", m.expert_intermediate),
        ("model.vocab", m.vocab),
        ("model.seq_len", m.seq_len),
    ] {
        positive(f, v)?;
    }
    for (f, v, limit) in [
        ("model.layers", m.layers, 10_000),
        ("model.mtp_layers", m.mtp_layers, 100),
        ("model.hidden", m.hidden, 1 << 20),
        ("model.heads", m.heads, 1 << 16),
        ("model.q_lora_rank", m.q_lora_rank, 1 << 20),
        ("model.kv_lora_rank", m.kv_lora_rank, 1 << 20),
        ("model.qk_nope_head_dim", m.qk_nope_head_dim, 1 << 16),
        ("model.qk_rope_head_dim", m.qk_rope_head_dim, 1 << 16),
        ("model.v_head_dim", m.v_head_dim, 1 << 16),
        ("model.routed_experts", m.routed_experts, 1 << 16),
        ("model.shared_experts", m.shared_experts, 1 << 10),
        ("model.top_k", m.top_k, 1 << 10),
        ("model.groups", m.groups, 1 << 16),
        ("model.expert_intermediate", m.expert_intermediate, 1 << 22),
        ("model.dense_intermediate", m.dense_intermediate, 1 << 22),
        ("model.vocab", m.vocab, 1 << 24),
        ("model.seq_len", m.seq_len, 1 << 24),
    ] {
        at_most(f, v, limit)?;
    }
    if m.dense_layers > m.layers {
        return Err(SimError::config(
            "model.dense_layers",
            format!("{} exceeds model.layers = {}", m.dense_layers, m.layers),
        ));
    }
    if m.dense_layers > 0 && m.dense_intermediate == 0 {
        return Err(SimError::config(
            "model.dense_intermediate",
            "must be at least 1 when dense_layers > 0",
        ));
    }
    if m.top_groups > m.groups {
        return Err(SimError::config(
            "model.top_groups",
            format!(
                "top groups ({}) must not exceed groups ({})",
                m.top_groups, m.groups
            ),
        ));
    }
    if !m.routed_experts.is_multiple_of(m.groups) {
        return Err(SimError::config(
            "model.groups",
            format!(
                "must divide routed_experts ({}), got {}",
                m.routed_experts, m.groups
            ),
        ));
    }
    let per_group = m.routed_experts / m.groups;
    if m.top_k > m.top_groups * per_group {
        return Err(SimError::config(
            "model.top_k",
            format!(
                "{} experts cannot be chosen from {} groups of {} experts",
                m.top_k, m.top_groups, per_group
            ),
        ));
    }
    if m.top_groups < m.groups && per_group < 2 {
        return Err(SimError::config(
            "model.groups",
            "group scores use the top-2 experts of a group: groups need at least 2 experts",
        ));
    }
    Ok(())
}

/// Smallest and largest value of a hardware rate, size or latency (TFLOP/s, GB, GB/s, us):
/// nine orders of magnitude either side of today's GPUs keep every derived time finite.
pub const HARDWARE_MIN: f64 = 1e-6;
pub const HARDWARE_MAX: f64 = 1e9;

/// Rules of the hardware description alone.
pub fn validate_hardware(h: &HardwareConfig) -> Result<()> {
    positive("hardware.sms", h.sms)?;
    if h.sms > 100_000 {
        return Err(SimError::config(
            "hardware.sms",
            format!("{} SMs is absurd", h.sms),
        ));
    }
    // bounded on both sides: a rate of 1e-300 or a latency of 1e300 gives times that overflow
    // to inf (or print as 300-digit numbers) instead of an answer
    let fpos = |field: &str, v: f64| -> Result<()> {
        if (HARDWARE_MIN..=HARDWARE_MAX).contains(&v) {
            Ok(())
        } else {
            Err(SimError::config(
                field,
                format!("must be between {HARDWARE_MIN:e} and {HARDWARE_MAX:e}, got {v}"),
            ))
        }
    };
    let fnonneg = |field: &str, v: f64| -> Result<()> {
        if (0.0..=HARDWARE_MAX).contains(&v) {
            Ok(())
        } else {
            Err(SimError::config(
                field,
                format!("must be between 0 and {HARDWARE_MAX:e}, got {v}"),
            ))
        }
    };
    fpos("hardware.tflops_bf16", h.tflops_bf16)?;
    fpos("hardware.tflops_fp8", h.tflops_fp8)?;
    fpos("hardware.hbm_gb", h.hbm_gb)?;
    fpos("hardware.hbm_gbps", h.hbm_gbps)?;
    fpos("hardware.intra_node_gbps", h.intra_node_gbps)?;
    fpos("hardware.inter_node_gbps", h.inter_node_gbps)?;
    fpos("hardware.comm_gbps_per_sm", h.comm_gbps_per_sm)?;
    fnonneg("hardware.intra_node_latency_us", h.intra_node_latency_us)?;
    fnonneg("hardware.inter_node_latency_us", h.inter_node_latency_us)?;
    fnonneg("hardware.ll_latency_us", h.ll_latency_us)?;
    Ok(())
}

/// Efficiencies are fractions of peak, imbalances at least 1, overheads non-negative.
fn validate_calibration(k: &Calibration) -> Result<()> {
    let fpos = |field: &str, v: f64| -> Result<()> {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(SimError::config(
                field,
                format!("must be a finite number > 0, got {v}"),
            ))
        }
    };
    let fnonneg = |field: &str, v: f64| -> Result<()> {
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(SimError::config(
                field,
                format!("must be a finite number >= 0, got {v}"),
            ))
        }
    };
    for (f, v) in [
        ("calibration.gemm.tile_eff", k.gemm.tile_eff),
        ("calibration.gemm.hbm_eff", k.gemm.hbm_eff),
        ("calibration.wgrad_rel_speed", k.wgrad_rel_speed),
        ("calibration.bf16_gemm_eff", k.bf16_gemm_eff),
        ("calibration.attn_fwd_eff", k.attn_fwd_eff),
        ("calibration.attn_bwd_eff", k.attn_bwd_eff),
        ("calibration.hbm_eff", k.hbm_eff),
    ] {
        fpos(f, v)?;
        if v > 1.0 {
            return Err(SimError::config(
                f,
                format!("a fraction of peak must be <= 1, got {v}"),
            ));
        }
    }
    fpos("calibration.expert_imbalance", k.expert_imbalance)?;
    if k.expert_imbalance < 1.0 {
        return Err(SimError::config(
            "calibration.expert_imbalance",
            format!("max/mean load is at least 1, got {}", k.expert_imbalance),
        ));
    }
    fnonneg("calibration.overlap_slowdown", k.overlap_slowdown)?;
    fnonneg("calibration.gemm.tile_overhead_us", k.gemm.tile_overhead_us)?;
    fnonneg("calibration.gemm.launch_us", k.gemm.launch_us)?;
    fnonneg("calibration.kernel_overhead_us", k.kernel_overhead_us)?;
    Ok(())
}
