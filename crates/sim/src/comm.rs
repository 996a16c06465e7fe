//! Kernel-level timing of expert-parallel dispatch and combine, in DeepEP's two modes.
//!
//! **Normal mode** (training, prefill; hierarchical: one IB crossing per destination node, then
//! NVLink forwarding): the kernels run on `sms` SMs for their whole duration and every byte is
//! moved by those SMs. Time = fixed latency + the slowest of three limits:
//! IB bytes / inter-node bandwidth, NVLink bytes / intra-node bandwidth, and the bytes the SMs
//! copy into GPU buffers (one copy per destination GPU, the landing GPU included) / (`sms` ×
//! per-SM copy throughput). Bandwidth therefore grows linearly with the SM budget until a link
//! saturates (the knee DeepEP's tables and the V3 report describe).
//!
//! **Low-latency mode** (decode): one message per (token, top-k choice), sent directly to the
//! expert's GPU (NVLink inside the node, RDMA across), no node deduplication, all SMs used for
//! the short send/receive phases and none while the data is in flight. Time = fixed latency +
//! the slower of the IB and NVLink legs.
//!
//! One parameter set (`HardwareConfig`: `inter_node_gbps`, `intra_node_gbps`,
//! `comm_gbps_per_sm`, the latencies) reproduces every figure DeepEP published for H800
//! ([`deepep_table`]); the table and the errors are in `docs/SIM.md`.

use crate::config::HardwareConfig;
use crate::routing::{FanOut, Placement};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

/// Bytes one rank moves in one dispatch or combine, per leg.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CommLoad {
    /// Bytes over InfiniBand (RDMA).
    pub ib: f64,
    /// Bytes over NVLink (to other GPUs of a node).
    pub nvl: f64,
    /// Bytes the communication SMs copy into destination buffers (normal mode).
    pub sm: f64,
}

impl CommLoad {
    /// Normal-mode load of `tokens` source tokens with the given fan-out and record size.
    pub fn normal(tokens: f64, fan: &FanOut, record_bytes: f64) -> CommLoad {
        CommLoad {
            ib: tokens * fan.ib_copies * record_bytes,
            nvl: tokens * fan.nvl_copies * record_bytes,
            sm: tokens * fan.gpus_touched * record_bytes,
        }
    }

    /// Low-latency load: `tokens x copies` messages, `remote_frac` of them across nodes.
    pub fn low_latency(tokens: f64, copies: f64, remote_frac: f64, msg_bytes: f64) -> CommLoad {
        let all = tokens * copies * msg_bytes;
        CommLoad {
            ib: all * remote_frac,
            nvl: all * (1.0 - remote_frac),
            sm: all,
        }
    }
}

/// Normal-mode kernel time (s). `None` when bytes must move but no SM is given to it.
pub fn normal_time(hw: &HardwareConfig, sms: usize, load: &CommLoad) -> Option<f64> {
    if load.ib + load.nvl + load.sm <= 0.0 {
        return Some(0.0);
    }
    if sms == 0 {
        return None;
    }
    let lat = if load.ib > 0.0 {
        hw.inter_node_latency_us + hw.intra_node_latency_us
    } else {
        hw.intra_node_latency_us
    } * 1e-6;
    let ib = load.ib / (hw.inter_node_gbps * 1e9);
    let nvl = load.nvl / (hw.intra_node_gbps * 1e9);
    let sm = load.sm / (sms as f64 * hw.comm_gbps_per_sm * 1e9);
    Some(lat + ib.max(nvl).max(sm))
}

/// Low-latency kernel time (s): send + transfer + receive of one dispatch or combine.
pub fn low_latency_time(hw: &HardwareConfig, load: &CommLoad) -> f64 {
    if load.ib + load.nvl <= 0.0 {
        return 0.0;
    }
    let ib = load.ib / (hw.inter_node_gbps * 1e9);
    let nvl = load.nvl / (hw.intra_node_gbps * 1e9);
    hw.ll_latency_us * 1e-6 + ib.max(nvl)
}

/// Which DeepEP kernel family a published figure measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Normal kernels inside one node (NVLink bandwidth figure).
    Intranode,
    /// Normal kernels across nodes (RDMA bandwidth figure).
    Internode,
    /// Low-latency kernels (latency figure).
    LowLatency,
}

/// One published DeepEP figure (H800, CX7 400 Gb/s IB) and its reproduction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeepEpRow {
    pub mode: Mode,
    /// `dispatch` or `combine`.
    pub op: &'static str,
    pub ep: usize,
    /// `GB/s` for normal mode, `us` for low-latency mode.
    pub unit: &'static str,
    pub published: f64,
    pub simulated: f64,
    /// (simulated - published) / published.
    pub error: f64,
}

/// DeepEP README figures: (mode, EP, dispatch, combine). Normal: GB/s; low latency: us.
pub const DEEPEP_PUBLISHED: [(Mode, usize, f64, f64); 10] = [
    (Mode::Intranode, 8, 153.0, 158.0),
    (Mode::Internode, 16, 43.0, 43.0),
    (Mode::Internode, 32, 58.0, 57.0),
    (Mode::Internode, 64, 51.0, 50.0),
    (Mode::LowLatency, 8, 77.0, 114.0),
    (Mode::LowLatency, 16, 118.0, 195.0),
    (Mode::LowLatency, 32, 155.0, 273.0),
    (Mode::LowLatency, 64, 173.0, 314.0),
    (Mode::LowLatency, 128, 192.0, 369.0),
    (Mode::LowLatency, 256, 194.0, 360.0),
];

/// The benchmark DeepEP's test scripts run (`tests/test_intranode.py`, `test_internode.py`,
/// `test_low_latency.py`): tokens per rank, hidden, top-k, SMs of the normal kernels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DeepEpBench {
    pub normal_tokens: usize,
    pub ll_tokens: usize,
    pub hidden: usize,
    pub topk: usize,
    pub experts: usize,
    pub gpus_per_node: usize,
    pub normal_sms: usize,
    pub seed: u64,
}

impl Default for DeepEpBench {
    fn default() -> Self {
        DeepEpBench {
            normal_tokens: 4096,
            ll_tokens: 128,
            hidden: 7168,
            topk: 8,
            experts: 256,
            gpus_per_node: 8,
            normal_sms: 24,
            seed: 7,
        }
    }
}

/// Fan-out of DeepEP's normal-mode benchmark routing for an EP group: scores are i.i.d., the
/// group (= node) limit keeps `min(nodes, 4)` nodes chosen uniformly, then `topk` distinct
/// experts are chosen uniformly among the kept nodes' experts.
pub fn bench_fanout(b: &DeepEpBench, ep: usize, tokens: usize, node_limited: bool) -> FanOut {
    let gpn = b.gpus_per_node.min(ep);
    let nodes = (ep / gpn).max(1);
    let pl = Placement::raw(b.experts, ep, gpn);
    let keep = if node_limited { nodes.min(4) } else { nodes };
    let per_node = b.experts / nodes;
    let mut rng = StdRng::seed_from_u64(b.seed ^ ep as u64);
    let mut node_ids: Vec<usize> = (0..nodes).collect();
    let mut acc = crate::routing::Acc::new(ep);
    let mut cand: Vec<usize> = Vec::with_capacity(b.experts);
    for t in 0..tokens {
        node_ids.shuffle(&mut rng);
        cand.clear();
        for &n in &node_ids[..keep] {
            cand.extend(n * per_node..(n + 1) * per_node);
        }
        let (chosen, _) = cand.partial_shuffle(&mut rng, b.topk);
        acc.add(&pl, t % ep, chosen);
    }
    acc.finish()
}

/// Remote fraction of low-latency messages (uniform top-k over all experts, no node limit).
fn ll_remote_frac(b: &DeepEpBench, ep: usize) -> f64 {
    let gpn = b.gpus_per_node.min(ep);
    (ep - gpn) as f64 / ep as f64
}

/// Reproduce every published DeepEP figure with the hardware parameters `hw`.
pub fn deepep_table(hw: &HardwareConfig, b: &DeepEpBench) -> Vec<DeepEpRow> {
    let h = b.hidden as f64;
    let fp8 = h + h / 128.0 * 4.0; // DeepEP counts FP8 payload + scales
    let bf16 = 2.0 * h;
    let mut rows = Vec::new();
    for &(mode, ep, pub_d, pub_c) in DEEPEP_PUBLISHED.iter() {
        for (op, published, bytes) in [("dispatch", pub_d, fp8), ("combine", pub_c, bf16)] {
            let simulated = match mode {
                Mode::Intranode | Mode::Internode => {
                    let t = b.normal_tokens as f64;
                    let fan = bench_fanout(b, ep, b.normal_tokens, true);
                    let load = CommLoad::normal(t, &fan, bytes);
                    let time = normal_time(hw, b.normal_sms, &load).unwrap_or(f64::INFINITY);
                    // DeepEP's figures: NVLink = bytes received per rank (own copy included);
                    // RDMA = (token, node) pairs sent, own node included ("logical" bandwidth).
                    let counted = if mode == Mode::Intranode {
                        t * fan.gpus_touched * bytes
                    } else {
                        t * fan.nodes_touched * bytes
                    };
                    counted / time / 1e9
                }
                Mode::LowLatency => {
                    let msg = if op == "dispatch" { fp8 + 16.0 } else { bf16 };
                    let load = CommLoad::low_latency(
                        b.ll_tokens as f64,
                        b.topk as f64,
                        ll_remote_frac(b, ep),
                        msg,
                    );
                    low_latency_time(hw, &load) * 1e6
                }
            };
            rows.push(DeepEpRow {
                mode,
                op,
                ep,
                unit: if mode == Mode::LowLatency {
                    "us"
                } else {
                    "GB/s"
                },
                published,
                simulated,
                error: (simulated - published) / published,
            });
        }
    }
    rows
}

/// Markdown table of [`deepep_table`].
pub fn deepep_markdown(rows: &[DeepEpRow]) -> String {
    use std::fmt::Write;
    let mut s = String::from(
        "| mode | op | EP | published | simulated | error |\n| --- | --- | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        let mode = match r.mode {
            Mode::Intranode => "normal, NVLink",
            Mode::Internode => "normal, RDMA",
            Mode::LowLatency => "low latency",
        };
        let _ = writeln!(
            s,
            "| {mode} | {} | {} | {:.0} {} | {:.1} {} | {:+.1}% |",
            r.op,
            r.ep,
            r.published,
            r.unit,
            r.simulated,
            r.unit,
            r.error * 100.0
        );
    }
    s
}
