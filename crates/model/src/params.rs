//! The trainable state of the V3-shaped model: every parameter's name, shape, kind and
//! deterministic initial value. The device model (`net`), the f64 reference trainer
//! (`reference`) and the checkpoint all address parameters through this one list, so a
//! gradient or a checkpoint tensor means the same thing everywhere.
//!
//! Conventions: matrices are `[out, in]` row-major (`y = x W^T`); an FFN's `w1` is
//! `[2I, H]` with the gate rows `0..I` then the up rows `I..2I` (the MoE layer's layout);
//! `w2` is `[H, I]`. Names:
//!
//! ```text
//! embed                                  [vocab, H]
//! layers.{l}.attn_norm                   [H]
//! layers.{l}.attn.wq_a                   [q_lora, H]           (W_DQ)
//! layers.{l}.attn.q_norm                 [q_lora]
//! layers.{l}.attn.wq_b                   [heads*(nope+rope), q_lora]   (W_UQ | W_QR per head)
//! layers.{l}.attn.wkv_a                  [kv_lora+rope, H]     (W_DKV, then W_KR)
//! layers.{l}.attn.kv_norm                [kv_lora]
//! layers.{l}.attn.wkv_b                  [heads*(nope+v), kv_lora]     (W_UK | W_UV per head)
//! layers.{l}.attn.wo                     [H, heads*v]
//! layers.{l}.ffn_norm                    [H]
//! layers.{l}.ffn.w1, .ffn.w2             dense layers (l < dense_layers)
//! layers.{l}.moe.gate                    [E, H]                MoE layers
//! layers.{l}.moe.bias                    [E]                   (aux-loss-free, not AdamW)
//! layers.{l}.moe.experts.{e}.w1, .w2     routed experts
//! layers.{l}.moe.shared.w1, .w2          the shared expert (shared_experts = 1)
//! final_norm                             [H]
//! head                                   [vocab, H]
//! mtp.hnorm, mtp.enorm                   [H]                   MTP (model.mtp_depth = 1):
//! mtp.proj                               [H, 2H]               M of [hnorm(h) ; enorm(emb)]
//! mtp.attn_norm, mtp.attn.*, mtp.ffn_norm, mtp.ffn.w1, mtp.ffn.w2   its block (dense FFN)
//! mtp.norm                               [H]                   before the shared head
//! ```
//!
//! The MTP module (`layer: None`) shares `embed` and `head` with the main model.

use crate::config::ModelConfig;

/// How the optimizer treats a parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A weight matrix (AdamW with weight decay).
    Matrix,
    /// The embedding table (AdamW with weight decay).
    Embedding,
    /// An RMSNorm scale (AdamW, no weight decay).
    Norm,
    /// The MoE selection bias: not a gradient parameter; updated by the aux-loss-free rule.
    RouteBias,
}

/// One parameter's name, shape and role.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: ParamKind,
    /// Decoder layer (`None`: embedding, final norm, head, the MTP module).
    pub layer: Option<usize>,
    /// Used by an FP8 GEMM (dense FFN and expert weights: quantised 128x128 on the device).
    pub fp8: bool,
}

impl ParamSpec {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether AdamW applies weight decay to it.
    pub fn decays(&self) -> bool {
        matches!(self.kind, ParamKind::Matrix | ParamKind::Embedding)
    }
}

/// Every parameter of `m`, in the canonical order (embedding, layers in order, final norm,
/// head, then the MTP module's): the order of checkpoints, gradient norms and fixed-order
/// reductions.
pub fn specs(m: &ModelConfig) -> Vec<ParamSpec> {
    let (h, v) = (m.hidden as usize, m.vocab as usize);
    let mut out = vec![spec("embed", &[v, h], ParamKind::Embedding, None, false)];
    for l in 0..m.layers as usize {
        let dense = l < m.dense_layers as usize;
        block_specs(m, &format!("layers.{l}."), Some(l), dense, &mut out);
    }
    out.push(spec("final_norm", &[h], ParamKind::Norm, None, false));
    out.push(spec("head", &[v, h], ParamKind::Matrix, None, false));
    if m.mtp_depth >= 1 {
        mtp_specs(m, &mut out);
    }
    out
}

/// The 1-depth MTP module: its two input norms, the projection `M [H, 2H]` (columns `0..H`
/// read the normed hidden state, `H..2H` the normed embedding), one block with a dense FFN,
/// and the norm before the shared head.
fn mtp_specs(m: &ModelConfig, out: &mut Vec<ParamSpec>) {
    let h = m.hidden as usize;
    out.push(spec("mtp.hnorm", &[h], ParamKind::Norm, None, false));
    out.push(spec("mtp.enorm", &[h], ParamKind::Norm, None, false));
    out.push(spec(
        "mtp.proj",
        &[h, 2 * h],
        ParamKind::Matrix,
        None,
        false,
    ));
    block_specs(m, "mtp.", None, true, out);
    out.push(spec("mtp.norm", &[h], ParamKind::Norm, None, false));
}

/// One decoder block's parameters named `{prefix}{suffix}` (a layer, or the MTP block).
fn block_specs(
    m: &ModelConfig,
    prefix: &str,
    layer: Option<usize>,
    dense: bool,
    out: &mut Vec<ParamSpec>,
) {
    let h = m.hidden as usize;
    let (nh, nope, rope, vd) = (
        m.heads as usize,
        m.qk_nope_head_dim as usize,
        m.qk_rope_head_dim as usize,
        m.v_head_dim as usize,
    );
    let (ql, kvl) = (m.q_lora_rank as usize, m.kv_lora_rank as usize);
    let p = |n: &str| format!("{prefix}{n}");
    let mut push = |n: String, shape: &[usize], kind, fp8| {
        out.push(spec(&n, shape, kind, layer, fp8));
    };
    use ParamKind::*;
    push(p("attn_norm"), &[h], Norm, false);
    push(p("attn.wq_a"), &[ql, h], Matrix, false);
    push(p("attn.q_norm"), &[ql], Norm, false);
    push(p("attn.wq_b"), &[nh * (nope + rope), ql], Matrix, false);
    push(p("attn.wkv_a"), &[kvl + rope, h], Matrix, false);
    push(p("attn.kv_norm"), &[kvl], Norm, false);
    push(p("attn.wkv_b"), &[nh * (nope + vd), kvl], Matrix, false);
    push(p("attn.wo"), &[h, nh * vd], Matrix, false);
    push(p("ffn_norm"), &[h], Norm, false);
    if dense {
        let i = m.dense_intermediate as usize;
        push(p("ffn.w1"), &[2 * i, h], Matrix, true);
        push(p("ffn.w2"), &[h, i], Matrix, true);
        return;
    }
    let (e_n, i) = (m.routed_experts as usize, m.expert_intermediate as usize);
    push(p("moe.gate"), &[e_n, h], Matrix, false);
    push(p("moe.bias"), &[e_n], RouteBias, false);
    for e in 0..e_n {
        push(p(&format!("moe.experts.{e}.w1")), &[2 * i, h], Matrix, true);
        push(p(&format!("moe.experts.{e}.w2")), &[h, i], Matrix, true);
    }
    if m.shared_experts > 0 {
        push(p("moe.shared.w1"), &[2 * i, h], Matrix, true);
        push(p("moe.shared.w2"), &[h, i], Matrix, true);
    }
}

fn spec(
    name: &str,
    shape: &[usize],
    kind: ParamKind,
    layer: Option<usize>,
    fp8: bool,
) -> ParamSpec {
    ParamSpec {
        name: name.to_string(),
        shape: shape.to_vec(),
        kind,
        layer,
        fp8,
    }
}

/// Errors of addressing parameters by name.
#[derive(Debug, thiserror::Error)]
pub enum ParamError {
    #[error("no parameter named `{0}`")]
    Unknown(String),
    #[error("parameter `{name}`: {got} values for shape {shape:?}")]
    Len {
        name: String,
        got: usize,
        shape: Vec<usize>,
    },
}

/// FP32 values of every parameter of a model, in [`specs`] order.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub specs: Vec<ParamSpec>,
    pub data: Vec<Vec<f32>>,
}

impl Params {
    /// Deterministic initial values (independent of the `rand` crate's version): matrices and
    /// the embedding N(0, 0.02^2) by splitmix64 + Box-Muller, `attn.wo` and `w2`s scaled by
    /// 1/sqrt(2 layers) (GPT-2), norms 1, route biases 0.
    pub fn init(m: &ModelConfig, seed: u64) -> Params {
        let specs = specs(m);
        let mut rng = SplitMix(seed ^ 0x005e_ed0f_7a1e);
        let out_scale = 1.0 / (2.0 * m.layers.max(1) as f64).sqrt();
        let data = specs
            .iter()
            .map(|s| match s.kind {
                ParamKind::Norm => vec![1.0; s.len()],
                ParamKind::RouteBias => vec![0.0; s.len()],
                ParamKind::Matrix | ParamKind::Embedding => {
                    let sd = if s.name.ends_with("attn.wo") || s.name.ends_with("w2") {
                        0.02 * out_scale
                    } else {
                        0.02
                    };
                    (0..s.len()).map(|_| (rng.normal() * sd) as f32).collect()
                }
            })
            .collect();
        Params { specs, data }
    }

    /// Zeros of every parameter's shape (gradient accumulators).
    pub fn zeros(m: &ModelConfig) -> Params {
        let specs = specs(m);
        let data = specs.iter().map(|s| vec![0.0; s.len()]).collect();
        Params { specs, data }
    }

    pub fn index(&self, name: &str) -> Result<usize, ParamError> {
        self.specs
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| ParamError::Unknown(name.to_string()))
    }

    pub fn get(&self, name: &str) -> Result<&[f32], ParamError> {
        Ok(&self.data[self.index(name)?])
    }

    pub fn get_mut(&mut self, name: &str) -> Result<&mut Vec<f32>, ParamError> {
        let i = self.index(name)?;
        Ok(&mut self.data[i])
    }

    /// Replaces a parameter's values (length checked against its shape).
    pub fn set(&mut self, name: &str, v: Vec<f32>) -> Result<(), ParamError> {
        let i = self.index(name)?;
        if v.len() != self.specs[i].len() {
            return Err(ParamError::Len {
                name: name.to_string(),
                got: v.len(),
                shape: self.specs[i].shape.clone(),
            });
        }
        self.data[i] = v;
        Ok(())
    }

    /// Total number of values.
    pub fn numel(&self) -> usize {
        self.data.iter().map(Vec::len).sum()
    }
}

/// splitmix64 with a Box-Muller normal: the initialiser's stream.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.unit(), self.unit());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_model_has_its_v3_parameters_in_order() {
        let m = ModelConfig::default();
        let p = Params::init(&m, 1);
        assert_eq!(p.specs[0].name, "embed");
        assert_eq!(p.specs.last().map(|s| s.name.as_str()), Some("head"));
        assert!(p.index("layers.0.ffn.w1").is_ok(), "layer 0 is dense");
        assert!(p.index("layers.1.moe.experts.7.w2").is_ok());
        assert!(p.index("layers.0.moe.gate").is_err());
        assert!(p.specs.iter().zip(&p.data).all(|(s, d)| s.len() == d.len()));
        // deterministic, and a different seed gives different values
        assert_eq!(p, Params::init(&m, 1));
        assert_ne!(p.data[0], Params::init(&m, 2).data[0]);
        let sd = (p.data[0].iter().map(|v| (*v as f64).powi(2)).sum::<f64>()
            / p.data[0].len() as f64)
            .sqrt();
        assert!((sd - 0.02).abs() < 0.001, "embedding sd {sd}");
    }

    #[test]
    fn the_mtp_module_appends_its_parameters_and_leaves_the_rest_unchanged() {
        let m = ModelConfig::default();
        let mtp = ModelConfig {
            mtp_depth: 1,
            ..m.clone()
        };
        let (p, q) = (Params::init(&m, 3), Params::init(&mtp, 3));
        let n = p.specs.len();
        assert_eq!(&q.specs[..n], &p.specs[..]);
        assert_eq!(&q.data[..n], &p.data[..], "the main model's initial values");
        let names: Vec<&str> = q.specs[n..].iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names[..3], ["mtp.hnorm", "mtp.enorm", "mtp.proj"]);
        assert_eq!(names.last(), Some(&"mtp.norm"));
        assert!(names.contains(&"mtp.attn.wkv_b") && names.contains(&"mtp.ffn.w2"));
        let h = m.hidden as usize;
        assert_eq!(q.specs[n + 2].shape, vec![h, 2 * h]);
        assert!(q.specs[n..].iter().all(|s| s.layer.is_none()));
        assert!(q
            .index("mtp.ffn.w1")
            .map(|i| q.specs[i].fp8)
            .unwrap_or(false));
    }
}
