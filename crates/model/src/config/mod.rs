//! The training job's configuration: model sizes (a scaled-down DeepSeek-V3 shape), training
//! hyper-parameters, parallelism (DualPipeV pipeline x expert parallel x data parallel over
//! `nodes x devices_per_node` devices) and the device kind. Loaded from TOML or JSON (by file
//! extension; missing fields take the default preset's values, unknown fields are refused),
//! validated before any work ([`TrainConfig::validate`] names every offending field), and
//! fingerprinted ([`TrainConfig::fingerprint`]) so a checkpoint can refuse another shape.
//!
//! The default preset and the reasoning behind its sizes are in `docs/TRAIN.md`.

mod placement;
mod validate;

pub use placement::DeviceRole;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub use validate::FieldError;

/// Errors of loading or validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Io(#[from] crate::atomic::IoError),
    #[error("{path}: {msg}")]
    Parse { path: String, msg: String },
    #[error("{path}: unknown config format (expected a .toml or .json file)")]
    Format { path: String },
    #[error("invalid configuration: {}", list(.0))]
    Invalid(Vec<FieldError>),
}

fn list(v: &[FieldError]) -> String {
    v.iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

impl ConfigError {
    /// The fields an [`ConfigError::Invalid`] names (empty for other errors).
    pub fn fields(&self) -> Vec<&str> {
        match self {
            ConfigError::Invalid(v) => v.iter().map(|e| e.field.as_str()).collect(),
            _ => Vec::new(),
        }
    }
}

/// Model sizes: a DeepSeek-V3 decoder (MLA attention, dense FFN first, then DeepSeekMoE).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Token ids `0..vocab` (byte-level corpus: 256).
    pub vocab: u32,
    pub hidden: u32,
    /// Decoder layers in total, of which the first `dense_layers` use a dense FFN.
    pub layers: u32,
    pub dense_layers: u32,
    pub heads: u32,
    /// Rank of the compressed query (MLA's W_DQ) and of the compressed key/value (W_DKV).
    pub q_lora_rank: u32,
    pub kv_lora_rank: u32,
    /// Per-head query/key dims without and with RoPE (the decoupled RoPE part), value dim.
    pub qk_nope_head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub v_head_dim: u32,
    pub routed_experts: u32,
    /// Shared experts per MoE layer (0 or 1: the MoE layer replicates one on every rank).
    pub shared_experts: u32,
    /// Routed experts per token, expert groups, and groups a token may route to.
    pub topk: u32,
    pub groups: u32,
    pub topk_groups: u32,
    /// Routed weights are multiplied by this after normalisation (V3: 2.5).
    pub route_scaling: f32,
    pub expert_intermediate: u32,
    pub dense_intermediate: u32,
    /// Multi-token prediction depth (0: none, 1: one MTP module as V3).
    pub mtp_depth: u32,
    pub rope_theta: f32,
    pub norm_eps: f32,
}

/// Learning-rate schedule: linear warm-up to `peak`, then cosine decay to `min` at the last step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LrSchedule {
    pub peak: f32,
    pub min: f32,
    pub warmup_steps: u32,
}

/// Training hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainingConfig {
    /// Tokens per sequence.
    pub seq_len: u32,
    /// Sequences per micro-batch (per data-parallel replica; spread over the EP ranks).
    pub micro_batch: u32,
    /// Micro-batches per optimizer step (per data-parallel replica).
    pub micro_batches: u32,
    pub steps: u32,
    pub lr: LrSchedule,
    pub adam_beta1: f32,
    pub adam_beta2: f32,
    pub adam_eps: f32,
    pub weight_decay: f32,
    /// Global gradient-norm clip.
    pub grad_clip: f32,
    /// Aux-loss-free balancing: per-step bias change (V3's gamma).
    pub bias_update_speed: f32,
    /// Weight of the MTP loss (V3's lambda); unused with `mtp_depth = 0`.
    pub mtp_loss_weight: f32,
    /// Validation every N steps (and after the last).
    pub eval_every: u32,
    pub seed: u64,
}

/// Parallelism: `pp * ep * dp` devices on `nodes x devices_per_node`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ParallelConfig {
    /// Pipeline ranks, scheduled by DualPipeV (each holds 2 of the `2 * pp` stages).
    pub pp: u32,
    /// Expert-parallel ranks within one pipeline stage.
    pub ep: u32,
    /// Nodes one EP group spans (`ep / ep_nodes` devices on each; see [`DeviceRole`]).
    pub ep_nodes: u32,
    /// Data-parallel (ZeRO-1) replicas.
    pub dp: u32,
    pub nodes: u32,
    pub devices_per_node: u32,
    /// SMs of each device given to dispatch/combine (even).
    pub comm_sms: u32,
}

/// Where the kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The CPU emulator.
    #[default]
    Emu,
    /// CUDA GPUs.
    Cuda,
}

/// The whole training job's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub model: ModelConfig,
    pub train: TrainingConfig,
    pub parallel: ParallelConfig,
    pub device: DeviceKind,
}

impl ModelConfig {
    /// The smallest preset the tests train: 2 layers (1 dense), 2 MLA heads with LoRA ranks 32,
    /// 8 routed experts of 128 + 1 shared in 2 groups, top-2 of 1 group, dense FFN 128.
    pub fn tiny() -> Self {
        ModelConfig {
            layers: 2,
            heads: 2,
            q_lora_rank: 32,
            kv_lora_rank: 32,
            groups: 2,
            topk_groups: 1,
            dense_intermediate: 128,
            ..ModelConfig::default()
        }
    }
}

impl Default for ModelConfig {
    /// The default preset (`docs/TRAIN.md`, *Sizes*): hidden 128, 4 layers (1 dense), 4 MLA
    /// heads, 8 routed experts of 128 + 1 shared, top-2 of 4 groups (2 used).
    fn default() -> Self {
        ModelConfig {
            vocab: 256,
            hidden: 128,
            layers: 4,
            dense_layers: 1,
            heads: 4,
            q_lora_rank: 64,
            kv_lora_rank: 64,
            qk_nope_head_dim: 32,
            qk_rope_head_dim: 16,
            v_head_dim: 32,
            routed_experts: 8,
            shared_experts: 1,
            topk: 2,
            groups: 4,
            topk_groups: 2,
            route_scaling: 2.5,
            expert_intermediate: 128,
            dense_intermediate: 256,
            mtp_depth: 0,
            rope_theta: 10000.0,
            norm_eps: 1e-6,
        }
    }
}

impl Default for LrSchedule {
    fn default() -> Self {
        LrSchedule {
            peak: 1e-2,
            min: 1e-3,
            warmup_steps: 5,
        }
    }
}

impl Default for TrainingConfig {
    /// 4 micro-batches of 2 sequences of 128 bytes per step (1024 tokens), 30 steps.
    fn default() -> Self {
        TrainingConfig {
            seq_len: 128,
            micro_batch: 2,
            micro_batches: 4,
            steps: 30,
            lr: LrSchedule::default(),
            adam_beta1: 0.9,
            adam_beta2: 0.95,
            adam_eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            bias_update_speed: 1e-3,
            mtp_loss_weight: 0.3,
            eval_every: 10,
            seed: 1,
        }
    }
}

impl Default for ParallelConfig {
    /// PP 2 x EP 2 (over 2 nodes) x DP 1 on 2 nodes x 2 devices (docs/TRAIN.md: the 5-minute
    /// budget on 2 host cores; EP 4 over 2 nodes x 4 devices is a config change).
    fn default() -> Self {
        ParallelConfig {
            pp: 2,
            ep: 2,
            ep_nodes: 2,
            dp: 1,
            nodes: 2,
            devices_per_node: 2,
            comm_sms: 20,
        }
    }
}

impl TrainConfig {
    /// Reads a `.toml` or `.json` file (by extension), then validates it.
    pub fn load(path: &Path) -> Result<TrainConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| crate::atomic::IoError::new("reading", path, e))?;
        let shown = path.display().to_string();
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        let cfg = match ext.as_deref() {
            Some("toml") => Self::from_toml(&text),
            Some("json") => Self::from_json(&text),
            _ => return Err(ConfigError::Format { path: shown }),
        }
        .map_err(|msg| ConfigError::Parse { path: shown, msg })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses TOML text (no validation).
    pub fn from_toml(text: &str) -> Result<TrainConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Parses JSON text (no validation).
    pub fn from_json(text: &str) -> Result<TrainConfig, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// The configuration as TOML text (what `load` reads back).
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string(self).map_err(|e| e.to_string())
    }

    /// Checks every constraint before any work; the error lists each offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let errs = validate::check(self);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(errs))
        }
    }

    /// The model and parallel sizes as flat `section.field -> value` pairs: what a checkpoint
    /// records and compares field by field.
    pub fn shape(&self) -> BTreeMap<String, serde_json::Value> {
        let mut out = BTreeMap::new();
        // through text, not `to_value`: an f32 then reads as its shortest decimal (1e-6), not
        // as its f64 widening (9.999999974752427e-7), in the fingerprint and in messages
        let value = |t: serde_json::Result<String>| {
            t.and_then(|t| serde_json::from_str::<serde_json::Value>(&t))
        };
        for (sec, v) in [
            ("model", value(serde_json::to_string(&self.model))),
            ("parallel", value(serde_json::to_string(&self.parallel))),
        ] {
            if let Ok(serde_json::Value::Object(m)) = v {
                for (k, v) in m {
                    out.insert(format!("{sec}.{k}"), v);
                }
            }
        }
        out
    }

    /// A stable 64-bit FNV-1a hash (hex) of [`TrainConfig::shape`]'s canonical text (sorted
    /// keys): equal shapes have equal fingerprints on every machine and build.
    pub fn fingerprint(&self) -> String {
        fingerprint_of(&self.shape())
    }

    /// Devices in the job (`pp * ep * dp`).
    pub fn devices(&self) -> u32 {
        self.parallel.pp * self.parallel.ep * self.parallel.dp
    }

    /// Tokens per optimizer step over all replicas.
    pub fn tokens_per_step(&self) -> u64 {
        let t = &self.train;
        t.seq_len as u64 * t.micro_batch as u64 * t.micro_batches as u64 * self.parallel.dp as u64
    }

    /// Learning rate at `step` (0-based): linear warm-up, then cosine to `lr.min` at the end.
    pub fn lr_at(&self, step: u32) -> f32 {
        let s = &self.train.lr;
        if step < s.warmup_steps {
            return s.peak * (step + 1) as f32 / s.warmup_steps as f32;
        }
        let span = self.train.steps.saturating_sub(s.warmup_steps).max(1) as f64;
        let t = ((step - s.warmup_steps) as f64 / span).min(1.0);
        let c = 0.5 * (1.0 + (std::f64::consts::PI * t).cos());
        (s.min as f64 + (s.peak - s.min) as f64 * c) as f32
    }
}

/// FNV-1a 64 of the canonical JSON of `shape` (a `BTreeMap`, so keys are sorted).
pub fn fingerprint_of(shape: &BTreeMap<String, serde_json::Value>) -> String {
    let text = serde_json::to_string(shape).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}
