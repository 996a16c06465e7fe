//! Expert-parallel load balancer (EPLB): from observed per-expert loads choose how many replicas
//! each logical expert gets and where every replica (physical expert) lives.
//!
//! Hierarchical policy (when groups divide over nodes and GPUs over nodes): (1) pack expert
//! groups onto nodes, heaviest group first onto the lightest node with room; (2) inside each
//! node, start every expert with one replica and repeatedly give one more to the expert with the
//! highest load per replica until the node's replicas are used; (3) pack the replicas onto the
//! node's GPUs, heaviest first onto the lightest GPU with room. Otherwise the global policy: the
//! same with one group and one node. Ties break towards the lowest index.

use crate::{cfg_err, Result};
use serde::Serialize;

/// The placement EPLB chose.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EplbPlan {
    /// Physical expert `p` (GPU `p / (replicas / gpus)`) runs logical expert `phy2log[p]`.
    pub phy2log: Vec<usize>,
    /// Physical replicas of each logical expert.
    pub log2phy: Vec<Vec<usize>>,
    pub replica_count: Vec<usize>,
    /// Whether the hierarchical policy was used.
    pub hierarchical: bool,
}

/// Balanced packing: `weights.len()` items into `bins` bins of exactly `weights.len()/bins`
/// items each; returns the bin of every item.
fn pack(weights: &[f64], bins: usize) -> Vec<usize> {
    let per = weights.len() / bins;
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    let mut load = vec![0f64; bins];
    let mut cnt = vec![0usize; bins];
    let mut out = vec![0; weights.len()];
    for i in order {
        let mut best = usize::MAX;
        for b in 0..bins {
            if cnt[b] < per && (best == usize::MAX || load[b] < load[best]) {
                best = b;
            }
        }
        out[i] = best;
        load[best] += weights[i];
        cnt[best] += 1;
    }
    out
}

/// Computes a plan for `loads` (one per logical expert) over `replicas` physical experts,
/// `groups` expert groups, `nodes` nodes and `gpus` GPUs in total.
pub fn rebalance(
    loads: &[f64],
    replicas: usize,
    groups: usize,
    nodes: usize,
    gpus: usize,
) -> Result<EplbPlan> {
    let e = loads.len();
    if e == 0 || replicas < e {
        return cfg_err(format!("{replicas} replicas for {e} experts"));
    }
    if gpus == 0 || replicas % gpus != 0 {
        return cfg_err(format!("{replicas} replicas do not split over {gpus} GPUs"));
    }
    if groups == 0 || e % groups != 0 || nodes == 0 || gpus % nodes != 0 {
        return cfg_err("experts must split into groups and GPUs into nodes");
    }
    if loads.iter().any(|l| !l.is_finite() || *l < 0.0) {
        return cfg_err("loads must be finite and non-negative");
    }
    let hier = groups % nodes == 0 && (e / groups) * (groups / nodes) <= replicas / nodes;
    let (groups, nodes) = if hier { (groups, nodes) } else { (1, 1) };
    let gsize = e / groups;
    let gl: Vec<f64> = (0..groups)
        .map(|g| loads[g * gsize..(g + 1) * gsize].iter().sum())
        .collect();
    let gnode = pack(&gl, nodes);
    let phys_per_node = replicas / nodes;
    let gpus_per_node = gpus / nodes;
    let mut phy2log = vec![0usize; replicas];
    let mut replica_count = vec![0usize; e];
    for n in 0..nodes {
        let experts: Vec<usize> = (0..groups)
            .filter(|&g| gnode[g] == n)
            .flat_map(|g| g * gsize..(g + 1) * gsize)
            .collect();
        let mut cnt = vec![1usize; experts.len()];
        for _ in experts.len()..phys_per_node {
            let mut best = 0;
            for i in 1..experts.len() {
                if loads[experts[i]] / cnt[i] as f64 > loads[experts[best]] / cnt[best] as f64 {
                    best = i;
                }
            }
            cnt[best] += 1;
        }
        let mut items = Vec::new();
        let mut w = Vec::new();
        for (i, &x) in experts.iter().enumerate() {
            replica_count[x] = cnt[i];
            for _ in 0..cnt[i] {
                items.push(x);
                w.push(loads[x] / cnt[i] as f64);
            }
        }
        let bin = pack(&w, gpus_per_node);
        let per_gpu = phys_per_node / gpus_per_node;
        let mut fill = vec![0usize; gpus_per_node];
        for (j, &x) in items.iter().enumerate() {
            let g = bin[j];
            phy2log[n * phys_per_node + g * per_gpu + fill[g]] = x;
            fill[g] += 1;
        }
    }
    let mut log2phy = vec![Vec::new(); e];
    for (p, &l) in phy2log.iter().enumerate() {
        log2phy[l].push(p);
    }
    Ok(EplbPlan {
        phy2log,
        log2phy,
        replica_count,
        hierarchical: hier,
    })
}

impl EplbPlan {
    /// Maps logical top-k indices to physical experts: token `t` uses replica `t % count`.
    pub fn map_to_physical(&self, topk_idx: &[i32], topk: usize) -> Vec<i32> {
        topk_idx
            .iter()
            .enumerate()
            .map(|(i, &e)| {
                if e < 0 || e as usize >= self.log2phy.len() {
                    return -1;
                }
                let r = &self.log2phy[e as usize];
                r[(i / topk) % r.len()] as i32
            })
            .collect()
    }
    /// Load of every GPU when logical loads are split evenly over replicas.
    pub fn gpu_loads(&self, loads: &[f64], gpus: usize) -> Vec<f64> {
        let per = self.phy2log.len() / gpus;
        let mut out = vec![0f64; gpus];
        for (p, &l) in self.phy2log.iter().enumerate() {
            out[p / per] += loads[l] / self.replica_count[l] as f64;
        }
        out
    }
}

/// max / mean of per-GPU loads (1.0 = perfect balance).
pub fn imbalance(gpu_loads: &[f64]) -> f64 {
    let mean = gpu_loads.iter().sum::<f64>() / gpu_loads.len().max(1) as f64;
    if mean == 0.0 {
        return 1.0;
    }
    gpu_loads.iter().cloned().fold(0.0, f64::max) / mean
}

/// Per-GPU loads with no rebalancing (expert `e` on GPU `e / (E / gpus)`).
pub fn static_gpu_loads(loads: &[f64], gpus: usize) -> Vec<f64> {
    let per = loads.len().div_ceil(gpus);
    let mut out = vec![0f64; gpus];
    for (e, &l) in loads.iter().enumerate() {
        out[(e / per).min(gpus - 1)] += l;
    }
    out
}
