//! Shared-memory bank-conflict profiling (opt-in: [`crate::LaunchOptions::bank_profile`]).
//!
//! Shared memory has 32 banks of 4-byte words; a warp's request is served in *wavefronts*, one
//! per set of words that hit distinct banks. The model follows NVIDIA's (and Nsight Compute's
//! `l1tex__data_bank_conflicts_pipe_lsu_mem_shared`): a request is split into *phases* by access
//! width (accesses of up to 4 bytes: one phase of 32 lanes; 8 bytes: two half-warps; 16 bytes:
//! four quarter-warps; `ldmatrix`/`stmatrix`: one phase per 8x8 matrix, 8 rows of 16 bytes).
//! A phase takes as many wavefronts as the largest number of *distinct* words any bank holds
//! (lanes reading the same word are served by one broadcast). The ideal is one wavefront per
//! active phase; everything above it is a conflict.
//!
//! Data flow: the executor calls [`BankProfile::record`] with the lanes' shared-window byte
//! addresses of each `ld`/`st`/`atom`/`cp.async` (shared destination), `ldmatrix` and
//! `stmatrix` request, keyed by the instruction's source index; each CTA keeps its own profile,
//! merged into the launch's when the CTA finishes and reported per PTX line in
//! [`crate::LaunchStats::banks`]. wgmma descriptor reads and TMA run in the async proxy and are
//! not modelled.

use std::collections::HashMap;

/// Wavefront counts of one instruction (or of a whole launch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BankCounts {
    /// Warp-level requests.
    pub requests: u64,
    /// Wavefronts the requests took.
    pub wavefronts: u64,
    /// Wavefronts without conflicts (one per active phase).
    pub ideal: u64,
}

impl BankCounts {
    /// Extra wavefronts caused by bank conflicts.
    pub fn conflicts(&self) -> u64 {
        self.wavefronts - self.ideal
    }
    fn add(&mut self, o: &BankCounts) {
        self.requests += o.requests;
        self.wavefronts += o.wavefronts;
        self.ideal += o.ideal;
    }
}

/// Counts of one PTX instruction of the kernel.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BankLine {
    /// PTX source line (0 for modules built in memory, e.g. by the builder).
    pub line: u32,
    /// Position of the instruction in the kernel body (0-based; what `line` is to parsed text).
    pub index: u32,
    /// The instruction as printed.
    pub instruction: String,
    #[serde(flatten)]
    pub counts: BankCounts,
}

/// A launch's shared-memory bank profile.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct BankReport {
    pub total: BankCounts,
    /// Every profiled instruction, most conflicting first.
    pub lines: Vec<BankLine>,
}

/// Per-CTA (then per-launch) accumulator, keyed by instruction source index.
#[derive(Clone, Debug, Default)]
pub struct BankProfile {
    per_src: HashMap<u32, BankCounts>,
}

/// One lane's access of a request: shared-window byte address and width in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    pub lane: u8,
    pub addr: u64,
    pub bytes: u32,
}

/// Wavefronts of one phase: the most distinct 4-byte words any bank holds (at least 1).
pub fn phase_wavefronts(acc: impl Iterator<Item = (u64, u32)>) -> u64 {
    let mut words: Vec<u64> = Vec::with_capacity(64);
    for (a, b) in acc {
        let first = a / 4;
        let last = (a + b.max(1) as u64 - 1) / 4;
        words.extend(first..=last);
    }
    if words.is_empty() {
        return 0;
    }
    words.sort_unstable();
    words.dedup();
    let mut per_bank = [0u64; 32];
    for w in words {
        per_bank[(w % 32) as usize] += 1;
    }
    per_bank.into_iter().max().unwrap_or(1).max(1)
}

impl BankProfile {
    /// Records one warp request of per-lane accesses (`ld`/`st`/`atom`/`cp.async`), split into
    /// phases by access width.
    pub fn record(&mut self, src: u32, acc: &[Access]) {
        if acc.is_empty() {
            return;
        }
        let width = acc.iter().map(|a| a.bytes).max().unwrap_or(4);
        let phases: u8 = match width {
            0..=4 => 1,
            5..=8 => 2,
            _ => 4,
        };
        let per = 32 / phases;
        let mut c = BankCounts {
            requests: 1,
            ..Default::default()
        };
        for p in 0..phases {
            let lo = p * per;
            let mut it = acc
                .iter()
                .filter(|a| a.lane >= lo && a.lane < lo + per)
                .peekable();
            if it.peek().is_none() {
                continue;
            }
            c.wavefronts += phase_wavefronts(it.map(|a| (a.addr, a.bytes)));
            c.ideal += 1;
        }
        self.per_src.entry(src).or_default().add(&c);
    }

    /// Records an `ldmatrix`/`stmatrix` request: `rows[mat]` holds the 8 row addresses (16
    /// bytes each) of matrix `mat`; each matrix is one phase.
    pub fn record_matrices(&mut self, src: u32, rows: &[[u64; 8]]) {
        let mut c = BankCounts {
            requests: 1,
            ..Default::default()
        };
        for m in rows {
            c.wavefronts += phase_wavefronts(m.iter().map(|&a| (a, 16)));
            c.ideal += 1;
        }
        self.per_src.entry(src).or_default().add(&c);
    }

    /// Adds another profile (a finished CTA's) into this one.
    pub fn merge(&mut self, o: &BankProfile) {
        for (k, v) in &o.per_src {
            self.per_src.entry(*k).or_default().add(v);
        }
    }

    /// The per-line report of `prog`'s instructions, most conflicting first.
    pub fn report(&self, prog: &crate::Program) -> BankReport {
        let mut total = BankCounts::default();
        let mut lines: Vec<BankLine> = self
            .per_src
            .iter()
            .map(|(&src, c)| {
                total.add(c);
                let (line, instruction) = prog
                    .source
                    .get(src as usize)
                    .map(|s| (s.loc.line, s.to_string()))
                    .unwrap_or((0, String::new()));
                BankLine {
                    line,
                    index: src,
                    instruction,
                    counts: *c,
                }
            })
            .collect();
        lines.sort_by(|a, b| {
            b.counts
                .conflicts()
                .cmp(&a.counts.conflicts())
                .then(a.line.cmp(&b.line))
        });
        BankReport { total, lines }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes(f: impl Fn(u64) -> u64, bytes: u32) -> Vec<Access> {
        (0..32u8)
            .map(|l| Access {
                lane: l,
                addr: f(l as u64),
                bytes,
            })
            .collect()
    }

    #[test]
    fn classic_patterns() {
        let mut p = BankProfile::default();
        // unit stride: 1 wavefront; stride 2 words: 2-way; stride 32 words: 32-way; broadcast: 1
        p.record(0, &lanes(|l| 4 * l, 4));
        p.record(1, &lanes(|l| 8 * l, 4));
        p.record(2, &lanes(|l| 128 * l, 4));
        p.record(3, &lanes(|_| 64, 4));
        // 16-byte vectors, contiguous: 4 phases of 8 lanes x 16 B = 4 wavefronts, ideal 4
        p.record(4, &lanes(|l| 16 * l, 16));
        // 16-byte vectors 256 B apart: each quarter-warp puts 8 rows on the same 4 banks
        p.record(5, &lanes(|l| 256 * l, 16));
        let c = |s| p.per_src[&s];
        assert_eq!((c(0).wavefronts, c(0).ideal), (1, 1));
        assert_eq!(c(1).wavefronts, 2);
        assert_eq!(c(2).wavefronts, 32);
        assert_eq!(c(3).wavefronts, 1);
        assert_eq!((c(4).wavefronts, c(4).ideal), (4, 4));
        assert_eq!((c(5).wavefronts, c(5).ideal), (32, 4));
    }

    #[test]
    fn matrices() {
        let mut p = BankProfile::default();
        // rows 256 B apart: all 8 rows on banks 0..3 -> 8 wavefronts; 128B-swizzled: 1
        let plain: [u64; 8] = std::array::from_fn(|r| 256 * r as u64);
        let swz: [u64; 8] = std::array::from_fn(|r| 128 * r as u64 + 16 * r as u64);
        p.record_matrices(0, &[plain]);
        p.record_matrices(1, &[swz, swz]);
        assert_eq!(p.per_src[&0].wavefronts, 8);
        assert_eq!((p.per_src[&1].wavefronts, p.per_src[&1].ideal), (2, 2));
    }
}
