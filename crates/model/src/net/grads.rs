//! A stage's parameter gradients: one record per micro-batch (replicated parameters summed
//! over the EP ranks in rank order, expert weights from their owning rank), reduced over the
//! micro-batches in index order by [`GradStore::take`], so the result does not depend on the
//! order the backward passes ran in. The sums are f32, in a fixed order.

use super::linear::Result;
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

fn add_into(acc: &mut [f32], v: &[f32]) {
    acc.iter_mut().zip(v).for_each(|(a, b)| *a += b);
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

    /// The MoE layer `l`'s gradients: the gate's and the shared expert's partials summed over
    /// ranks in rank order, each routed expert's from the rank that owns it.
    pub fn add_moe(&mut self, l: usize, d: &Dims, b: &Backward) -> Result<()> {
        let mut gate = vec![0f32; d.experts * d.h];
        for g in &b.gate {
            add_into(&mut gate, &g.dw);
        }
        self.reduced.insert(format!("layers.{l}.moe.gate"), gate);
        if let Some((w1, w2)) = b.shared_dw_sum() {
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
    /// The stage's gradient parameters in `params::specs` order, with their lengths.
    names: Vec<(String, usize)>,
    per_mb: BTreeMap<usize, BTreeMap<String, Vec<f32>>>,
    loads: BTreeMap<usize, ExpertLoad>,
}

impl GradStore {
    pub fn new(spec: &StageSpec) -> GradStore {
        let names = specs(&spec.config.model)
            .into_iter()
            .filter(|s| s.kind != ParamKind::RouteBias)
            .filter(|s| match s.layer {
                Some(l) => spec.layers.contains(&l),
                None if s.name == "embed" => spec.is_first(),
                None => spec.is_last(),
            })
            .map(|s| (s.name.clone(), s.len()))
            .collect();
        GradStore {
            names,
            per_mb: BTreeMap::new(),
            loads: BTreeMap::new(),
        }
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
            let mut it = ranks.into_values();
            let mut acc = it.next().unwrap_or_default();
            for v in it {
                add_into(&mut acc, &v);
            }
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
    pub fn take(&mut self) -> (NamedGrads, ExpertLoad) {
        let per_mb = std::mem::take(&mut self.per_mb);
        let grads = self
            .names
            .iter()
            .map(|(name, len)| {
                let mut acc = vec![0f32; *len];
                for g in per_mb.values() {
                    if let Some(v) = g.get(name) {
                        add_into(&mut acc, v);
                    }
                }
                (name.clone(), acc)
            })
            .collect();
        let mut loads: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for l in std::mem::take(&mut self.loads).into_values() {
            for (layer, c) in l {
                let acc = loads.entry(layer).or_insert_with(|| vec![0; c.len()]);
                acc.iter_mut().zip(&c).for_each(|(a, b)| *a += b);
            }
        }
        (grads, loads.into_iter().collect())
    }
}
