//! A stage's parameter gradients: one record per micro-batch (replicated parameters summed
//! over the EP ranks in rank order, expert weights from their owning rank), reduced over the
//! micro-batches in index order by [`GradStore::take`], so the result does not depend on the
//! order the backward passes ran in. The sums are f32 additions in a fixed order, run by the
//! `f32_add` kernel on the stage's first device (the host only moves the gradients there and
//! back).

use super::linear::{Ctx, Result};
use super::Dims;
use crate::moe::Backward;
use crate::params::{specs, ParamKind};
use crate::stage::{ExpertLoad, NamedGrads, StageSpec};
use crate::TrainError;
use std::collections::BTreeMap;

/// Gradients of one micro-batch's backward, being collected.
pub(crate) struct MbGrads {
    /// name -> rank -> partial.
    per_rank: BTreeMap<String, BTreeMap<usize, Vec<f32>>>,
    /// name -> already reduced over ranks.
    reduced: BTreeMap<String, Vec<f32>>,
}

/// `acc += v` (f32) on `cx`'s device.
pub(crate) fn add_into(cx: &Ctx, acc: &mut Vec<f32>, v: &[f32]) -> Result<()> {
    let n = acc.len();
    if v.len() != n {
        return Err(TrainError::Shape(format!(
            "gradient sum: {} values added to {n}",
            v.len()
        )));
    }
    let (a, b) = (cx.dev.upload(acc)?, cx.dev.upload(v)?);
    let mut o = cx.f32(n)?;
    kernels::train::ops::f32_add(&cx.st, &a, &b, &mut o, n)?;
    cx.sync()?;
    *acc = o.to_vec()?;
    acc.truncate(n);
    Ok(())
}

/// The sum of `parts` in order (f32, on the device); `None` for no parts.
fn sum_in_order<'a>(
    cx: &Ctx,
    mut parts: impl Iterator<Item = &'a Vec<f32>>,
) -> Result<Option<Vec<f32>>> {
    let Some(first) = parts.next() else {
        return Ok(None);
    };
    let mut acc = first.clone();
    for v in parts {
        add_into(cx, &mut acc, v)?;
    }
    Ok(Some(acc))
}

impl MbGrads {
    fn put(&mut self, name: String, rank: usize, v: Vec<f32>) {
        self.per_rank.entry(name).or_default().insert(rank, v);
    }

    /// Rank `r`'s partials of layer `l`'s replicated parameters (`suffix`, values).
    pub fn add_rank(&mut self, l: usize, r: usize, g: Vec<(&'static str, Vec<f32>)>) {
        for (s, v) in g {
            self.put(format!("layers.{l}.{s}"), r, v);
        }
    }

    /// Rank `r`'s partials of non-layer parameters (embedding, final norm, head).
    pub fn add_global(&mut self, r: usize, g: Vec<(&'static str, Vec<f32>)>) {
        for (s, v) in g {
            self.put(s.to_string(), r, v);
        }
    }

    /// Rank `r`'s partials named in full (the MTP module's, `model::net::mtp`).
    pub fn add_named(&mut self, r: usize, g: Vec<(String, Vec<f32>)>) {
        for (s, v) in g {
            self.put(s, r, v);
        }
    }

    /// The MoE layer `l`'s gradients: the gate's and the shared expert's partials summed over
    /// ranks in rank order (and over each rank's wgrad chunks in token order: an EP-1 layer
    /// with `ep` chunks sums like `ep` ranks), each routed expert's from the rank that owns it.
    pub fn add_moe(&mut self, cx: &Ctx, l: usize, d: &Dims, b: &Backward) -> Result<()> {
        let gate = sum_in_order(cx, b.gate.iter().flat_map(|g| &g.dw))?;
        let gate = gate.unwrap_or_else(|| vec![0f32; d.experts * d.h]);
        self.reduced.insert(format!("layers.{l}.moe.gate"), gate);
        let shared: Vec<&(Vec<f32>, Vec<f32>)> = b.shared_dw.iter().flatten().flatten().collect();
        let w1 = sum_in_order(cx, shared.iter().map(|s| &s.0))?;
        let w2 = sum_in_order(cx, shared.iter().map(|s| &s.1))?;
        if let (Some(w1), Some(w2)) = (w1, w2) {
            self.reduced.insert(format!("layers.{l}.moe.shared.w1"), w1);
            self.reduced.insert(format!("layers.{l}.moe.shared.w2"), w2);
        }
        let ranks = b.routed_dw.len().max(1);
        let el = d.experts / ranks;
        let (n1, n2) = (2 * d.ei * d.h, d.h * d.ei);
        for (r, (w1, w2)) in b.routed_dw.iter().enumerate() {
            let empty = w1.is_empty() && w2.is_empty();
            if !empty && (w1.len() != el * n1 || w2.len() != el * n2) {
                return Err(TrainError::Shape(format!(
                    "layer {l}: rank {r}'s expert gradients have {} and {} values for {el} experts",
                    w1.len(),
                    w2.len()
                )));
            }
            for le in 0..el {
                let e = r * el + le;
                let (g1, g2) = match empty {
                    true => (vec![0f32; n1], vec![0f32; n2]),
                    false => (
                        w1[le * n1..(le + 1) * n1].to_vec(),
                        w2[le * n2..(le + 1) * n2].to_vec(),
                    ),
                };
                self.reduced
                    .insert(format!("layers.{l}.moe.experts.{e}.w1"), g1);
                self.reduced
                    .insert(format!("layers.{l}.moe.experts.{e}.w2"), g2);
            }
        }
        Ok(())
    }
}

/// Every finished micro-batch's gradients and expert loads since the last [`GradStore::take`].
pub(crate) struct GradStore {
    /// Where the sums run (the stage's first device).
    cx: Ctx,
    /// The stage's gradient parameters in `params::specs` order, with their lengths.
    names: Vec<(String, usize)>,
    per_mb: BTreeMap<usize, BTreeMap<String, Vec<f32>>>,
    loads: BTreeMap<usize, ExpertLoad>,
}

impl GradStore {
    pub fn new(spec: &StageSpec) -> Result<GradStore> {
        let names = specs(&spec.config.model)
            .into_iter()
            .filter(|s| s.kind != ParamKind::RouteBias)
            .filter(|s| match s.layer {
                Some(l) => spec.layers.contains(&l),
                // the MTP module on the last stage reads the shared embedding too
                None if s.name == "embed" => {
                    spec.is_first() || (spec.is_last() && spec.config.model.mtp_depth > 0)
                }
                None => spec.is_last(),
            })
            .map(|s| (s.name.clone(), s.len()))
            .collect();
        Ok(GradStore {
            cx: Ctx::new(&spec.devices[0], spec.config.parallel.comm_sms)?,
            names,
            per_mb: BTreeMap::new(),
            loads: BTreeMap::new(),
        })
    }

    pub fn begin(&self) -> MbGrads {
        MbGrads {
            per_rank: BTreeMap::new(),
            reduced: BTreeMap::new(),
        }
    }

    /// Reduces `g` over ranks (rank order) and records it as micro-batch `index`'s.
    pub fn finish(&mut self, index: usize, g: MbGrads) -> Result<()> {
        if self.per_mb.contains_key(&index) {
            return Err(TrainError::Shape(format!(
                "micro-batch {index}: gradients already recorded since the last take_grads"
            )));
        }
        let mut out = g.reduced;
        for (name, ranks) in g.per_rank {
            let acc = sum_in_order(&self.cx, ranks.values())?.unwrap_or_default();
            out.insert(name, acc);
        }
        for (name, len) in &self.names {
            match out.get(name) {
                Some(v) if v.len() == *len => {}
                got => {
                    return Err(TrainError::Shape(format!(
                        "gradient `{name}`: {} values, the parameter has {len}",
                        got.map_or(0, Vec::len)
                    )))
                }
            }
        }
        self.per_mb.insert(index, out);
        Ok(())
    }

    pub fn add_loads(&mut self, index: usize, loads: ExpertLoad) {
        self.loads.insert(index, loads);
    }

    pub fn drop_loads(&mut self, index: usize) {
        self.loads.remove(&index);
    }

    /// The gradients summed over micro-batches in index order, and the summed expert loads;
    /// clears both.
    pub fn take(&mut self) -> Result<(NamedGrads, ExpertLoad)> {
        let per_mb = std::mem::take(&mut self.per_mb);
        let mut grads = Vec::new();
        for (name, len) in &self.names {
            let parts = per_mb.values().filter_map(|g| g.get(name));
            let acc = sum_in_order(&self.cx, parts)?.unwrap_or_else(|| vec![0f32; *len]);
            grads.push((name.clone(), acc));
        }
        let mut loads: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for l in std::mem::take(&mut self.loads).into_values() {
            for (layer, c) in l {
                let acc = loads.entry(layer).or_insert_with(|| vec![0; c.len()]);
                acc.iter_mut().zip(&c).for_each(|(a, b)| *a += b);
            }
        }
        Ok((grads, loads.into_iter().collect()))
    }
}
