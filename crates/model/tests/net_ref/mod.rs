//! An f64 host reference of a range of the model (optionally with the embedding and the head),
//! forward and backward, written independently of the device code from `/tmp/mathspec.md`.
//! It models where the device stores values (BF16 storage of GEMM/norm/RoPE/attention outputs
//! and of the residual stream, BF16 weights of the BF16 GEMMs, the FP8 1x128 / 128x128 / 128x1
//! quantisation points of the FFN GEMMs) but computes everything else in f64, so what remains
//! is accumulation order and the rounding flips it causes.
//!
//! Tokens are all ranks' rows concatenated, rank-major (`ranks x T` rows; sequences of `S`).

#![allow(dead_code)]

mod blocks;

use blocks::*;
use model::config::ModelConfig;
use model::params::Params;
use std::collections::BTreeMap;
use std::ops::Range;

/// What to run.
pub struct RefRun<'a> {
    pub m: &'a ModelConfig,
    pub p: &'a Params,
    pub layers: Range<usize>,
    pub seq: usize,
    /// Rows per rank.
    pub t: usize,
    /// Token ids (embedding) or the input activations `[N, H]`.
    pub ids: Option<&'a [i32]>,
    pub x: Option<&'a [f64]>,
    /// Labels (head) or the output gradient `[N, H]`.
    pub labels: Option<&'a [i32]>,
    pub dy: Option<&'a [f64]>,
    pub loss_scale: f64,
}

/// Its results.
pub struct RefOut {
    /// The stage output `[N, H]` (no head) or the summed loss (head).
    pub y: Vec<f64>,
    pub loss: f64,
    /// Input gradient `[N, H]` (no embedding).
    pub dx: Vec<f64>,
    pub grads: BTreeMap<String, Vec<f64>>,
}

fn get(p: &Params, name: &str) -> Vec<f64> {
    p.get(name).unwrap().iter().map(|&v| v as f64).collect()
}

pub fn run(r: &RefRun) -> RefOut {
    let (m, p) = (r.m, r.p);
    let d = Dm::new(m, r.seq, r.t);
    let n = r.ids.map_or_else(|| r.x.unwrap().len() / d.h, |i| i.len());
    let x0 = match r.ids {
        Some(ids) => {
            let e = get(p, "embed");
            let e = bfv(&e);
            ids.iter()
                .flat_map(|&i| e[i as usize * d.h..(i as usize + 1) * d.h].to_vec())
                .collect()
        }
        None => r.x.unwrap().to_vec(),
    };
    let mut x = x0;
    let mut saved = Vec::new();
    for l in r.layers.clone() {
        let lw = LayerW::load(p, m, l);
        let (y, s) = layer_fwd(&d, &lw, &x, n);
        saved.push((lw, s));
        x = y;
    }
    let mut grads = BTreeMap::new();
    let (y, loss, mut dx) = match r.labels {
        Some(labels) => {
            let (loss, dxh, g) = head(&d, p, &x, labels, r.loss_scale);
            grads.extend(g);
            (Vec::new(), loss, dxh)
        }
        None => (x.clone(), 0.0, r.dy.unwrap().to_vec()),
    };
    for (l, (lw, s)) in r.layers.clone().zip(saved.iter()).rev() {
        let (dxl, g) = layer_bwd(&d, lw, s, &dx, n);
        for (k, v) in g {
            grads.insert(format!("layers.{l}.{k}"), v);
        }
        dx = dxl;
    }
    if let Some(ids) = r.ids {
        let mut ge = vec![0f64; d.vocab * d.h];
        for (t, &i) in ids.iter().enumerate() {
            for c in 0..d.h {
                ge[i as usize * d.h + c] += dx[t * d.h + c];
            }
        }
        grads.insert("embed".into(), ge);
    }
    RefOut { y, loss, dx, grads }
}

/// The head's (summed loss, dx, gradients).
type HeadRef = (f64, Vec<f64>, Vec<(String, Vec<f64>)>);

/// Final norm, head, summed cross-entropy and its backward (gradient scaled by `scale`).
fn head(d: &Dm, p: &Params, x: &[f64], labels: &[i32], scale: f64) -> HeadRef {
    let n = labels.len();
    let (fw, hw) = (get(p, "final_norm"), bfv(&get(p, "head")));
    let (hn, rs) = rms(x, &fw, n, d.h, d.eps);
    let hn = bfv(&hn);
    let logits = mm_nt(&hn, &hw, n, d.vocab, d.h);
    let mut loss = 0.0;
    let mut dl = vec![0f64; n * d.vocab];
    for t in 0..n {
        if labels[t] < 0 {
            continue;
        }
        let row = &logits[t * d.vocab..(t + 1) * d.vocab];
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = mx + row.iter().map(|v| (v - mx).exp()).sum::<f64>().ln();
        loss += lse - row[labels[t] as usize];
        for j in 0..d.vocab {
            let pj = (row[j] - lse).exp();
            let oh = (j == labels[t] as usize) as i32 as f64;
            dl[t * d.vocab + j] = (pj - oh) * scale;
        }
    }
    let dlb = bfv(&dl);
    let dh = bfv(&mm_nn(&dlb, &hw, n, d.vocab, d.h));
    let g_head = mm_tn(&dlb, &hn, n, d.vocab, d.h);
    let (dx, g_fn) = rms_bwd(x, &fw, &dh, &rs, n, d.h);
    let dx = bfv(&dx);
    let g = vec![("final_norm".into(), g_fn), ("head".into(), g_head)];
    (loss, dx, g)
}
