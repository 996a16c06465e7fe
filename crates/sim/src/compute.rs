//! Per-kernel compute timing: FP8 GEMMs (dense and grouped, DeepGEMM-class) with a tile model
//! calibrated on DeepGEMM's published H800 table, the MLA decode kernel (FlashMLA-class) and
//! memory-bound kernels.
//!
//! GEMM model: the kernel picks the output tile (BM in {64, 128}, BN a multiple of 16 up to 256)
//! that finishes first. Each tile takes `2 BM BN K / (per-SM peak x tile_eff) + tile_overhead`
//! (prologue, pipeline fill, epilogue); tiles run in waves over the SMs given to compute; the
//! kernel cannot beat its HBM traffic (`(M K + N K) B_in + 2 M N` bytes at `hbm_eff`) and pays a
//! launch cost. The constants ([`GemmCal::h800`]) are fitted on DeepGEMM's seven published
//! shapes ([`DEEPGEMM_PUBLISHED`]); [`deepgemm_table`] reproduces them (worst error ~11%).

use crate::config::HardwareConfig;
use serde::{Deserialize, Serialize};

/// GEMM efficiency constants (fitted; see the module docs and docs/SIM.md).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmCal {
    /// Fraction of the per-SM tensor peak reached inside a tile's main loop.
    pub tile_eff: f64,
    /// Fixed time per tile (prologue, pipeline fill, epilogue), microseconds.
    pub tile_overhead_us: f64,
    /// Fraction of HBM bandwidth a memory-bound GEMM reaches.
    pub hbm_eff: f64,
    /// Launch cost per GEMM, microseconds.
    pub launch_us: f64,
}

impl GemmCal {
    /// Fitted on DeepGEMM's H800 table (FP8, 132 SMs).
    pub fn h800() -> GemmCal {
        GemmCal {
            tile_eff: 0.72,
            tile_overhead_us: 2.0,
            hbm_eff: 0.84,
            launch_us: 3.8,
        }
    }
}

/// One GEMM: `[m, k] x [n, k]^T`, `groups` independent problems of that size (grouped GEMM
/// with the rows of all groups concatenated: `m` is the total).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Bytes per input element (1 for FP8, 2 for BF16).
    pub in_bytes: usize,
    /// Weight matrices read (1 for a dense GEMM, the number of experts for a grouped one).
    pub weights: usize,
}

impl Gemm {
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
    fn bytes(&self) -> f64 {
        let (m, n, k) = (self.m as f64, self.n as f64, self.k as f64);
        (m * k + self.weights.max(1) as f64 * n * k) * self.in_bytes as f64 + 2.0 * m * n
    }
}

/// Time (s) of one GEMM on `sms` SMs.
pub fn gemm_time(hw: &HardwareConfig, cal: &GemmCal, sms: usize, g: &Gemm) -> f64 {
    if g.m == 0 || g.n == 0 || g.k == 0 {
        return 0.0;
    }
    let peak = if g.in_bytes == 1 {
        hw.tflops_fp8
    } else {
        hw.tflops_bf16
    } * 1e12;
    let per_sm = peak / hw.sms as f64 * cal.tile_eff;
    let sms = sms.max(1);
    let mut best = f64::INFINITY;
    for bm in [64usize, 128] {
        for bn in (16..=256).step_by(16) {
            let tiles = g.m.div_ceil(bm) * g.n.div_ceil(bn);
            let waves = tiles.div_ceil(sms) as f64;
            let tile = 2.0 * (bm * bn) as f64 * g.k as f64 / per_sm + cal.tile_overhead_us * 1e-6;
            best = best.min(waves * tile);
        }
    }
    let mem = g.bytes() / (hw.hbm_gbps * 1e9 * cal.hbm_eff);
    best.max(mem) + cal.launch_us * 1e-6
}

/// DeepGEMM README, H800 FP8 (M, N, K, TFLOP/s); the last row is the grouped contiguous GEMM
/// (4 groups of 8192 rows).
pub const DEEPGEMM_PUBLISHED: [(usize, usize, usize, usize, f64); 7] = [
    (4096, 7168, 16384, 1, 1520.0),
    (4096, 4096, 7168, 1, 1410.0),
    (4096, 2112, 7168, 1, 1127.0),
    (4096, 24576, 1536, 1, 1212.0),
    (128, 7168, 16384, 1, 645.0),
    (64, 2112, 7168, 1, 206.0),
    (32768, 4096, 7168, 4, 1346.0),
];

/// One row of the DeepGEMM reproduction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GemmRow {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub groups: usize,
    pub published_tflops: f64,
    pub simulated_tflops: f64,
    pub error: f64,
}

/// Reproduce DeepGEMM's table with `cal` on all of `hw`'s SMs.
pub fn deepgemm_table(hw: &HardwareConfig, cal: &GemmCal) -> Vec<GemmRow> {
    DEEPGEMM_PUBLISHED
        .iter()
        .map(|&(m, n, k, groups, published)| {
            let g = Gemm {
                m,
                n,
                k,
                in_bytes: 1,
                weights: groups,
            };
            let tf = g.flops() / gemm_time(hw, cal, hw.sms, &g) / 1e12;
            GemmRow {
                m,
                n,
                k,
                groups,
                published_tflops: published,
                simulated_tflops: tf,
                error: (tf - published) / published,
            }
        })
        .collect()
}

/// FlashMLA-class decode attention (absorbed MLA, BF16 paged KV cache): one layer for
/// `seqs` sequences of `kv_len` cached tokens with `q_tokens` query tokens each.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlaDecodeCal {
    /// Memory-bound throughput, GB/s (FlashMLA: up to 3000 on H800).
    pub gbps: f64,
    /// Compute-bound throughput, TFLOP/s (FlashMLA: 580, later 660, on H800).
    pub tflops: f64,
    /// Bytes per cached value (2: BF16).
    pub kv_bytes: f64,
    /// Tokens per KV-cache page (FlashMLA: 64); a sequence occupies whole pages.
    pub page_tokens: f64,
}

impl MlaDecodeCal {
    /// Cached tokens a sequence of `kv_len` occupies (and the kernel reads): whole pages, on
    /// average half a page more than the length.
    pub fn paged_len(&self, kv_len: f64) -> f64 {
        kv_len + self.page_tokens / 2.0
    }
}

/// Time (s) of one MLA decode layer. `heads` query heads, latent `kv_rank`, RoPE `rope` dims.
pub fn mla_decode_time(
    cal: &MlaDecodeCal,
    seqs: f64,
    kv_len: f64,
    q_tokens: f64,
    heads: f64,
    kv_rank: f64,
    rope: f64,
) -> f64 {
    let bytes = seqs * cal.paged_len(kv_len) * (kv_rank + rope) * cal.kv_bytes;
    // Scores over K (latent + RoPE) and the weighted sum over V (latent), per head and query.
    let flops = 2.0 * seqs * q_tokens * heads * kv_len * (2.0 * kv_rank + rope);
    (bytes / (cal.gbps * 1e9)).max(flops / (cal.tflops * 1e12))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::h800;

    #[test]
    fn fewer_sms_never_faster() {
        let hw = h800();
        let cal = GemmCal::h800();
        let g = Gemm {
            m: 4096,
            n: 7168,
            k: 2048,
            in_bytes: 1,
            weights: 1,
        };
        let a = gemm_time(&hw, &cal, 132, &g);
        let b = gemm_time(&hw, &cal, 112, &g);
        assert!(b > a * 1.05 && b < a * 1.3, "{a} {b}");
    }
}
