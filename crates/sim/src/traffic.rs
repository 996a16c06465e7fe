//! Exact traffic of the `ep` crate's hierarchical dispatch and combine kernels: the bytes each
//! link class carries for a given routing, record for record.
//!
//! The kernels (crates/ep/src/comm.rs) move one *record* per hop:
//! - dispatch record = metadata (16-byte header + top-k indices, weights and slots, 12 B per
//!   choice, rounded up to 16) + payload (FP8: `hidden` bytes + `hidden/128` f32 scales; BF16:
//!   `2 hidden`), rounded up to 16 bytes;
//! - combine record = 16-byte header + BF16 hidden.
//!
//! A token of rank `(n, l)` crosses IB once per distinct *remote* node `m` holding one of its
//! experts (to rank `(m, l)`), and the forwarder on each touched node (the source itself on its
//! own node) copies it over NVLink to every GPU of that node holding one of its experts, except
//! itself. The combine retraces the same hops with combine records. Indices outside
//! `0..experts` mean "no expert" and are skipped, as in the kernels.
//!
//! The test `tests/traffic.rs` runs the real kernels on the emulator and checks equality.

use crate::error::{Result, SimError};
use serde::Serialize;

/// Shape of an expert-parallel group as the traffic sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EpShape {
    pub ranks: usize,
    pub gpus_per_node: usize,
    /// Physical experts (a multiple of `ranks`).
    pub experts: usize,
    pub hidden: usize,
    pub topk: usize,
}

/// Payload format of a dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Payload {
    Fp8,
    Bf16,
}

fn round16(x: usize) -> usize {
    x.div_ceil(16) * 16
}

impl EpShape {
    /// Refuse shapes the kernels refuse (naming the field).
    pub fn validate(&self) -> Result<()> {
        let bad = |f: &str, r: String| Err(SimError::config(f, r));
        if self.ranks == 0 {
            return bad("ranks", "must be at least 1".into());
        }
        if self.gpus_per_node == 0 || !self.ranks.is_multiple_of(self.gpus_per_node) {
            return bad(
                "gpus_per_node",
                format!("must be >= 1 and divide ranks ({})", self.ranks),
            );
        }
        if self.experts == 0 || !self.experts.is_multiple_of(self.ranks) {
            return bad(
                "experts",
                format!("must be a positive multiple of ranks ({})", self.ranks),
            );
        }
        if self.hidden == 0 || !self.hidden.is_multiple_of(128) {
            return bad(
                "hidden",
                format!("must be a positive multiple of 128, got {}", self.hidden),
            );
        }
        if self.topk == 0 || self.topk > 32 {
            return bad("topk", format!("must be 1..=32, got {}", self.topk));
        }
        Ok(())
    }

    /// Metadata block of a dispatch record.
    pub fn meta_bytes(&self) -> usize {
        round16(16 + 12 * self.topk)
    }

    /// Bytes of one dispatch record on a link.
    pub fn dispatch_record_bytes(&self, p: Payload) -> usize {
        let (pay, scales) = match p {
            Payload::Fp8 => (self.hidden, self.hidden / 128 * 4),
            Payload::Bf16 => (2 * self.hidden, 0),
        };
        round16(self.meta_bytes() + pay + scales)
    }

    /// Bytes of one combine record on a link.
    pub fn combine_record_bytes(&self) -> usize {
        16 + 2 * self.hidden
    }
}

/// Record counts of one dispatch (the combine moves the same number of records back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Records {
    /// (token, remote destination node) pairs: one IB record each.
    pub inter_node: u64,
    /// NVLink forwards: (token, destination GPU other than the landing GPU) pairs.
    pub intra_node: u64,
    /// (token, destination GPU) pairs: every copy written into a GPU's receive buffer.
    pub gpu_copies: u64,
    /// (token, node) pairs, the source's own node included.
    pub node_pairs: u64,
    pub tokens: u64,
}

/// Bytes per link class of one communication call, summed over ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    pub inter_node_bytes: u64,
    pub intra_node_bytes: u64,
}

/// Count the records of a dispatch. `topk_idx[r]` is rank `r`'s `[T_r, topk]` routing.
pub fn records(shape: &EpShape, topk_idx: &[Vec<i32>]) -> Result<Records> {
    shape.validate()?;
    if topk_idx.len() != shape.ranks {
        return Err(SimError::config(
            "topk_idx",
            format!(
                "{} rows of routing for {} ranks",
                topk_idx.len(),
                shape.ranks
            ),
        ));
    }
    let (g, k) = (shape.gpus_per_node, shape.topk);
    let epr = shape.experts / shape.ranks;
    let mut rec = Records::default();
    let mut dest: Vec<usize> = Vec::with_capacity(k);
    for (src, idx) in topk_idx.iter().enumerate() {
        if !idx.len().is_multiple_of(k) {
            return Err(SimError::config(
                "topk_idx",
                format!(
                    "rank {src}: {} indices is not a multiple of top-k {k}",
                    idx.len()
                ),
            ));
        }
        let (home, local) = (src / g, src % g);
        for row in idx.chunks(k) {
            dest.clear();
            dest.extend(
                row.iter()
                    .filter(|&&e| e >= 0 && (e as usize) < shape.experts)
                    .map(|&e| e as usize / epr),
            );
            dest.sort_unstable();
            dest.dedup();
            let mut last_node = usize::MAX;
            for &r in &dest {
                let node = r / g;
                if node != last_node {
                    last_node = node;
                    rec.node_pairs += 1;
                    rec.inter_node += u64::from(node != home);
                }
                rec.gpu_copies += 1;
                rec.intra_node += u64::from(r % g != local);
            }
            rec.tokens += 1;
        }
    }
    Ok(rec)
}

impl Records {
    /// Bytes of the dispatch with payload `p`.
    pub fn dispatch(&self, shape: &EpShape, p: Payload) -> Traffic {
        let b = shape.dispatch_record_bytes(p) as u64;
        Traffic {
            inter_node_bytes: self.inter_node * b,
            intra_node_bytes: self.intra_node * b,
        }
    }

    /// Bytes of the combine that reverses it.
    pub fn combine(&self, shape: &EpShape) -> Traffic {
        let b = shape.combine_record_bytes() as u64;
        Traffic {
            inter_node_bytes: self.inter_node * b,
            intra_node_bytes: self.intra_node * b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_sizes_match_the_kernels_layout() {
        let s = EpShape {
            ranks: 64,
            gpus_per_node: 8,
            experts: 256,
            hidden: 7168,
            topk: 8,
        };
        assert_eq!(s.meta_bytes(), 112);
        assert_eq!(s.dispatch_record_bytes(Payload::Fp8), 112 + 7168 + 224);
        assert_eq!(s.dispatch_record_bytes(Payload::Bf16), 112 + 14336);
        assert_eq!(s.combine_record_bytes(), 14352);
    }

    #[test]
    fn hand_counted_routing() {
        // 2 nodes x 2 GPUs, 8 experts (2 per rank). Rank 0 token: experts 1 (rank 0), 3
        // (rank 1), 5 (rank 2), 7 (rank 3): one IB record to node 1 (landing on rank 2),
        // NVLink forwards to rank 1 (own node) and rank 3 (node 1): 2.
        let s = EpShape {
            ranks: 4,
            gpus_per_node: 2,
            experts: 8,
            hidden: 128,
            topk: 4,
        };
        let idx = vec![vec![1, 3, 5, 7], vec![], vec![], vec![-1, 0, 9, 1]];
        let r = records(&s, &idx).unwrap();
        // Rank 3 token: experts 0, 1 (both rank 0, node 0): one IB record, lands on rank 1
        // (same local index 1), forwarded to rank 0: 1 NVLink record.
        assert_eq!(r.inter_node, 2);
        assert_eq!(r.intra_node, 3);
        assert_eq!(r.gpu_copies, 5);
        assert_eq!(r.node_pairs, 3);
        assert!(records(&s, &idx[..3]).is_err());
    }
}
