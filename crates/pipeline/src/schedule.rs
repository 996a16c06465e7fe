//! The schedule model: what a pipeline schedule *is*, independent of how it was produced,
//! checked, timed or drawn.
//!
//! A [`Schedule`] is, per pipeline rank (device), an ordered list of [`Op`]s. An op is either
//! one [`Pass`] or two passes run overlapped (DualPipe's F&B). Sends and receives are
//! **implied** by the stage mapping ([`Layout`]): the output of `F` at stage `s` goes to the
//! rank holding stage `s+1` of the same chain, the input gradient of `B`/`I` at stage `s` goes
//! to the rank holding stage `s-1`. Nothing else is communicated.
//!
//! Vocabulary used throughout the crate:
//! * **chain**: the sequence of stages one micro-batch flows through. 1F1B, ZB1P and DualPipeV
//!   have one chain; DualPipe has two (direction 0 enters at rank 0, direction 1 at rank PP-1).
//! * **stage**: position along a chain, `0..num_stages`.
//! * **dir** (in a [`Pass`]): which of a rank's two stages the pass runs. For DualPipe it is
//!   the direction (= chain); for DualPipeV it is the leg of the V (0: stage `r`, 1: stage
//!   `PP-1-r`); for 1F1B/ZB1P always 0.
//! * **mb**: micro-batch index *within its chain* (DualPipe numbers each direction from 0).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::ScheduleError;

/// The scheduling methods this crate generates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Method {
    /// One-forward-one-backward (PipeDream-flush / Megatron).
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Zero-bubble ZB-H1: backward split into I and W, W deferred into the drain.
    #[serde(rename = "zb1p")]
    Zb1p,
    /// DeepSeek DualPipe: two directions over PP ranks.
    #[serde(rename = "dualpipe")]
    DualPipe,
    /// DeepSeek DualPipeV: PP stages folded into a V over PP/2 devices.
    #[serde(rename = "dualpipev")]
    DualPipeV,
}

impl Method {
    /// All methods, in the order the CLI lists them.
    pub const ALL: [Method; 4] = [
        Method::OneFOneB,
        Method::Zb1p,
        Method::DualPipe,
        Method::DualPipeV,
    ];

    /// The canonical lowercase name (what [`FromStr`] accepts).
    pub fn name(self) -> &'static str {
        match self {
            Method::OneFOneB => "1f1b",
            Method::Zb1p => "zb1p",
            Method::DualPipe => "dualpipe",
            Method::DualPipeV => "dualpipev",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = ScheduleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "1f1b" => Ok(Method::OneFOneB),
            "zb1p" | "zb-h1" | "zbh1" => Ok(Method::Zb1p),
            "dualpipe" => Ok(Method::DualPipe),
            "dualpipev" | "dualpipe-v" => Ok(Method::DualPipeV),
            _ => Err(ScheduleError::UnknownMethod(s.to_string())),
        }
    }
}

/// Kind of one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PassKind {
    /// Forward.
    F,
    /// Full backward (input and weight gradients together).
    B,
    /// Backward for inputs only; its W must follow later on the same rank.
    I,
    /// Backward for weights only (deferred part of a B).
    W,
}

impl PassKind {
    /// One-letter name used in JSON, SVG and traces.
    pub fn letter(self) -> &'static str {
        match self {
            PassKind::F => "F",
            PassKind::B => "B",
            PassKind::I => "I",
            PassKind::W => "W",
        }
    }
}

/// One pass: a kind, a micro-batch and the rank-local stage selector `dir`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pass {
    pub kind: PassKind,
    pub mb: usize,
    pub dir: usize,
}

impl Pass {
    pub fn new(kind: PassKind, mb: usize, dir: usize) -> Self {
        Pass { kind, mb, dir }
    }
}

/// One scheduled operation: one pass, or two run overlapped (a forward with a backward).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub passes: Vec<Pass>,
}

impl Op {
    pub fn single(p: Pass) -> Self {
        Op { passes: vec![p] }
    }
    pub fn overlapped(a: Pass, b: Pass) -> Self {
        Op { passes: vec![a, b] }
    }
    pub fn is_overlapped(&self) -> bool {
        self.passes.len() == 2
    }
}

/// How stages are placed on ranks; determines the implied communication.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    /// One chain, stage `s` on rank `s` (1F1B, ZB1P).
    Linear,
    /// Two chains over the same ranks: chain 0 stage `s` on rank `s`, chain 1 stage `s` on
    /// rank `ranks-1-s` (DualPipe). A pass's `dir` is its chain.
    Bidirectional,
    /// One chain of `2*ranks` stages folded into a V: stage `s` on rank `s` for
    /// `s < ranks`, else on rank `2*ranks-1-s` (DualPipeV). `dir` 0 is the descending leg.
    V,
}

/// A global identity of one stage of one micro-batch: (chain, micro-batch, stage).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StageRef {
    pub chain: usize,
    pub mb: usize,
    pub stage: usize,
}

/// A complete schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub method: Method,
    /// Pipeline size as requested: ranks for 1F1B/ZB1P/DualPipe, *stages* for DualPipeV.
    pub pp: usize,
    /// Total micro-batches (DualPipe: both directions together, half each).
    pub chunks: usize,
    pub layout: Layout,
    /// Per rank, its operations in execution order.
    pub ranks: Vec<Vec<Op>>,
}

impl Schedule {
    /// Number of devices (rows).
    pub fn num_ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Number of chains (1, or 2 for DualPipe).
    pub fn num_chains(&self) -> usize {
        match self.layout {
            Layout::Bidirectional => 2,
            _ => 1,
        }
    }

    /// Stages per chain.
    pub fn num_stages(&self) -> usize {
        match self.layout {
            Layout::V => 2 * self.num_ranks(),
            _ => self.num_ranks(),
        }
    }

    /// Micro-batches per chain.
    pub fn mbs_per_chain(&self) -> usize {
        self.chunks / self.num_chains()
    }

    /// Number of distinct `dir` values a rank uses (stages held per rank).
    pub fn dirs_per_rank(&self) -> usize {
        match self.layout {
            Layout::Linear => 1,
            _ => 2,
        }
    }

    /// Which chain and stage a pass with `dir` on `rank` runs; `None` if `dir` is invalid.
    pub fn locate(&self, rank: usize, dir: usize) -> Option<(usize, usize)> {
        let n = self.num_ranks();
        if rank >= n {
            return None;
        }
        match (self.layout, dir) {
            (Layout::Linear, 0) => Some((0, rank)),
            (Layout::Bidirectional, 0) => Some((0, rank)),
            (Layout::Bidirectional, 1) => Some((1, n - 1 - rank)),
            (Layout::V, 0) => Some((0, rank)),
            (Layout::V, 1) => Some((0, 2 * n - 1 - rank)),
            _ => None,
        }
    }

    /// The rank that holds `stage` of `chain` (inverse of [`Schedule::locate`]).
    pub fn rank_of(&self, chain: usize, stage: usize) -> usize {
        let n = self.num_ranks();
        match self.layout {
            Layout::Linear => stage,
            Layout::Bidirectional => {
                if chain == 0 {
                    stage
                } else {
                    n - 1 - stage
                }
            }
            Layout::V => {
                if stage < n {
                    stage
                } else {
                    2 * n - 1 - stage
                }
            }
        }
    }

    /// Total number of passes in the schedule.
    pub fn num_passes(&self) -> usize {
        self.ranks
            .iter()
            .flat_map(|r| r.iter())
            .map(|o| o.passes.len())
            .sum()
    }
}
