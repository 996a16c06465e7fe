//! The reference's layers: helpers (BF16/FP8 rounding models, GEMMs, RMSNorm, RoPE), MLA
//! attention, the FP8 FFN and the MoE block, forward and backward in f64.

use half::bf16;
use kernels::ScaleMode;
use model::config::ModelConfig;
use model::params::Params;

pub struct Dm {
    pub h: usize,
    pub nh: usize,
    pub dn: usize,
    pub dr: usize,
    pub dv: usize,
    pub ql: usize,
    pub kvl: usize,
    pub di: usize,
    pub ei: usize,
    pub eps: f64,
    pub seq: usize,
    pub t: usize,
    pub vocab: usize,
    pub experts: usize,
    pub dense: usize,
    pub theta: f64,
    pub m: ModelConfig,
}

impl Dm {
    pub fn new(m: &ModelConfig, seq: usize, t: usize) -> Dm {
        Dm {
            h: m.hidden as usize,
            nh: m.heads as usize,
            dn: m.qk_nope_head_dim as usize,
            dr: m.qk_rope_head_dim as usize,
            dv: m.v_head_dim as usize,
            ql: m.q_lora_rank as usize,
            kvl: m.kv_lora_rank as usize,
            di: m.dense_intermediate as usize,
            ei: m.expert_intermediate as usize,
            eps: m.norm_eps as f64,
            seq,
            t,
            vocab: m.vocab as usize,
            experts: m.routed_experts as usize,
            dense: m.dense_layers as usize,
            theta: m.rope_theta as f64,
            m: m.clone(),
        }
    }
    fn dqk(&self) -> usize {
        self.dn + self.dr
    }
}

// ---------------------------------------------------------------------------------------------
// helpers

pub fn bfr(v: f64) -> f64 {
    bf16::from_f32(v as f32).to_f64()
}
pub fn bfv(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| bfr(x)).collect()
}

/// `a [m, k] b [n, k]^T`
pub fn mm_nt(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut o = vec![0f64; m * n];
    for i in 0..m {
        let ar = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let br = &b[j * k..(j + 1) * k];
            o[i * n + j] = ar.iter().zip(br).map(|(x, y)| x * y).sum();
        }
    }
    o
}
/// `dy [m, n] w [n, k]`
pub fn mm_nn(dy: &[f64], w: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut o = vec![0f64; m * k];
    for i in 0..m {
        for j in 0..n {
            let g = dy[i * n + j];
            if g != 0.0 {
                for c in 0..k {
                    o[i * k + c] += g * w[j * k + c];
                }
            }
        }
    }
    o
}
/// `dy [m, n]^T x [m, k]`
pub fn mm_tn(dy: &[f64], x: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut o = vec![0f64; n * k];
    for i in 0..m {
        for j in 0..n {
            let g = dy[i * n + j];
            if g != 0.0 {
                for c in 0..k {
                    o[j * k + c] += g * x[i * k + c];
                }
            }
        }
    }
    o
}

/// RMSNorm rows: (y, rstd).
pub fn rms(x: &[f64], w: &[f64], n: usize, h: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; n * h];
    let mut rs = vec![0f64; n];
    for t in 0..n {
        let row = &x[t * h..(t + 1) * h];
        let r = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / h as f64 + eps).sqrt();
        rs[t] = r;
        for c in 0..h {
            y[t * h + c] = row[c] * r * w[c];
        }
    }
    (y, rs)
}
/// RMSNorm backward: (dx, dw).
pub fn rms_bwd(
    x: &[f64],
    w: &[f64],
    dy: &[f64],
    rs: &[f64],
    n: usize,
    h: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut dx = vec![0f64; n * h];
    let mut dw = vec![0f64; h];
    for (t, &r) in rs.iter().enumerate().take(n) {
        let o = t * h;
        let dot: f64 = (0..h).map(|c| w[c] * dy[o + c] * x[o + c]).sum();
        for c in 0..h {
            dx[o + c] = r * w[c] * dy[o + c] - x[o + c] * r * r * r * dot / h as f64;
            dw[c] += dy[o + c] * x[o + c] * r;
        }
    }
    (dx, dw)
}

/// Interleaved-pair RoPE of columns `col0..col0+dr` of every `stride` block of each row
/// (`sign` -1: the inverse rotation).
fn rope(d: &Dm, v: &mut [f64], row: usize, heads: usize, stride: usize, col0: usize, sign: f64) {
    let n = v.len() / row;
    for t in 0..n {
        let pos = (t % d.seq) as f64;
        for hh in 0..heads {
            for i in 0..d.dr / 2 {
                let f = d.theta.powf(-2.0 * i as f64 / d.dr as f64);
                let (s, c) = (pos * f).sin_cos();
                let s = s * sign;
                let b = t * row + hh * stride + col0 + 2 * i;
                let (x0, x1) = (v[b], v[b + 1]);
                v[b] = x0 * c - x1 * s;
                v[b + 1] = x0 * s + x1 * c;
            }
        }
    }
}

fn deq(q: &[u8], s: &[f32], idx: impl Fn(usize) -> usize) -> Vec<f64> {
    (0..q.len())
        .map(|i| emu::fp::e4m3_to_f32(q[i]) as f64 * s[idx(i)] as f64)
        .collect()
}
/// FP8 1x128 along rows (pow2 scales), dequantised.
pub fn fp8_rows(v: &[f64], n: usize, c: usize) -> Vec<f64> {
    fp8_rows_mode(v, n, c, ScaleMode::Pow2)
}
fn fp8_rows_mode(v: &[f64], n: usize, c: usize, mode: ScaleMode) -> Vec<f64> {
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    let (q, s) = kernels::quant::ref_quant_1x128(&f, n, c, mode);
    deq(&q, &s, |i| i / 128)
}
/// FP8 along the token dimension (each column's 128-row blocks share a scale), dequantised
/// (`mode`: the transposing quantiser's Pow2 scales, or the Float scales of the 1x128 -> 128x1
/// re-tiling of a cached FP8 input).
pub fn fp8_cols(v: &[f64], n: usize, c: usize, mode: ScaleMode) -> Vec<f64> {
    let t = transpose(v, n, c);
    // each transposed row (a column) in 128-token groups; rows padded to a multiple of 128
    let np = n.div_ceil(128) * 128;
    let mut padded = vec![0f64; c * np];
    for j in 0..c {
        padded[j * np..j * np + n].copy_from_slice(&t[j * n..(j + 1) * n]);
    }
    let q = fp8_rows_mode(&padded, c, np, mode);
    let mut out = vec![0f64; c * n];
    for j in 0..c {
        out[j * n..(j + 1) * n].copy_from_slice(&q[j * np..j * np + n]);
    }
    transpose(&out, c, n)
}
/// FP8 128x128 weight blocks, dequantised.
pub fn fp8_w(w: &[f64], r: usize, c: usize) -> Vec<f64> {
    let f: Vec<f32> = w.iter().map(|&x| x as f32).collect();
    let (q, s) = kernels::quant::ref_quant_128x128(&f, r, c, ScaleMode::Pow2);
    let cb = c / 128;
    deq(&q, &s, |i| (i / c / 128) * cb + (i % c) / 128)
}
pub fn transpose(v: &[f64], r: usize, c: usize) -> Vec<f64> {
    let mut o = vec![0f64; r * c];
    for i in 0..r {
        for j in 0..c {
            o[j * r + i] = v[i * c + j];
        }
    }
    o
}
fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

fn get(p: &Params, name: &str) -> Vec<f64> {
    p.get(name).unwrap().iter().map(|&v| v as f64).collect()
}

// ---------------------------------------------------------------------------------------------
// weights

/// One FFN's dequantised FP8 weights.
pub struct FfnW {
    w1: Vec<f64>,
    w2: Vec<f64>,
    i: usize,
}
impl FfnW {
    fn load(p: &Params, pre: &str, h: usize, i: usize) -> FfnW {
        FfnW {
            w1: fp8_w(&get(p, &format!("{pre}.w1")), 2 * i, h),
            w2: fp8_w(&get(p, &format!("{pre}.w2")), h, i),
            i,
        }
    }
}

pub struct LayerW {
    an: Vec<f64>,
    qn: Vec<f64>,
    kvn: Vec<f64>,
    fnw: Vec<f64>,
    wqa: Vec<f64>,
    wqb: Vec<f64>,
    wkva: Vec<f64>,
    wkvb: Vec<f64>,
    wo: Vec<f64>,
    dense: Option<FfnW>,
    gate: Vec<f64>,
    bias: Vec<f32>,
    experts: Vec<FfnW>,
    shared: Option<FfnW>,
}

impl LayerW {
    pub fn load(p: &Params, m: &ModelConfig, l: usize) -> LayerW {
        let g = |s: &str| get(p, &format!("layers.{l}.{s}"));
        let gb = |s: &str| bfv(&g(s));
        let h = m.hidden as usize;
        let moe = l >= m.dense_layers as usize;
        let ei = m.expert_intermediate as usize;
        let pre = format!("layers.{l}.moe");
        LayerW {
            an: g("attn_norm"),
            qn: g("attn.q_norm"),
            kvn: g("attn.kv_norm"),
            fnw: g("ffn_norm"),
            wqa: gb("attn.wq_a"),
            wqb: gb("attn.wq_b"),
            wkva: gb("attn.wkv_a"),
            wkvb: gb("attn.wkv_b"),
            wo: gb("attn.wo"),
            dense: (!moe).then(|| {
                FfnW::load(
                    p,
                    &format!("layers.{l}.ffn"),
                    h,
                    m.dense_intermediate as usize,
                )
            }),
            gate: if moe { gb("moe.gate") } else { Vec::new() },
            bias: if moe {
                p.get(&format!("{pre}.bias")).unwrap().to_vec()
            } else {
                Vec::new()
            },
            experts: match moe {
                true => (0..m.routed_experts)
                    .map(|e| FfnW::load(p, &format!("{pre}.experts.{e}"), h, ei))
                    .collect(),
                false => Vec::new(),
            },
            shared: (moe && m.shared_experts > 0)
                .then(|| FfnW::load(p, &format!("{pre}.shared"), h, ei)),
        }
    }
}

mod layer;
pub use layer::{layer_bwd, layer_fwd};
