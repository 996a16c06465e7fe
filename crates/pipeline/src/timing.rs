//! Timing: replay a [`Schedule`] with pass costs and a point-to-point latency, and compare its
//! bubble with the method's closed form.
//!
//! Execution model: every rank runs its ops in order, each as early as possible: an op starts
//! when the rank is free and every input it receives has arrived. A value produced on another
//! rank arrives `p2p` after the producing op ends; on the same rank, at once. Ops of one rank
//! never overlap in time (an overlapped F&B is *one* op costing `fb`).
//!
//! **Bubble** of a rank = makespan − the rank's busy time, where the makespan runs from 0 (all
//! ranks start together) to the end of the last op on any rank. See docs/PIPELINE.md.

use serde::{Deserialize, Serialize};

use crate::schedule::{Method, Op, PassKind, Schedule};
use crate::verify::{deps, resolve, slot, Index};
use crate::ScheduleError;

/// Pass costs (any time unit) and point-to-point latency.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// Forward chunk.
    pub f: f64,
    /// Full backward chunk (I + W).
    pub b: f64,
    /// Weight-gradient part of the backward; the input part I costs `b - w`.
    pub w: f64,
    /// One forward and one full backward run overlapped.
    pub fb: f64,
    /// Latency of one point-to-point transfer between ranks.
    pub p2p: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            f: 1.0,
            b: 2.0,
            w: 0.5,
            fb: 2.6,
            p2p: 0.0,
        }
    }
}

impl Costs {
    /// Reject costs that describe no real machine, naming the rule.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let all = [
            ("f", self.f),
            ("b", self.b),
            ("w", self.w),
            ("fb", self.fb),
            ("p2p", self.p2p),
        ];
        for (n, v) in all {
            // bounded: sums of huge costs would overflow to inf in the timeline
            if !(0.0..=crate::limits::MAX_COST).contains(&v) {
                return Err(ScheduleError::BadCosts(format!(
                    "{n} = {v} must be between 0 and {:e}",
                    crate::limits::MAX_COST
                )));
            }
        }
        if self.f <= 0.0 || self.b <= 0.0 {
            return Err(ScheduleError::BadCosts(
                "forward and backward costs must be > 0".into(),
            ));
        }
        if self.w > self.b {
            return Err(ScheduleError::BadCosts(format!(
                "w = {} exceeds b = {}: W is a part of the full backward",
                self.w, self.b
            )));
        }
        if self.fb < self.f.max(self.b) || self.fb > self.f + self.b {
            return Err(ScheduleError::BadCosts(format!(
                "fb = {} must lie between max(f, b) = {} (perfect overlap) and f + b = {} (no overlap)",
                self.fb,
                self.f.max(self.b),
                self.f + self.b
            )));
        }
        Ok(())
    }

    /// Cost of one pass run alone.
    pub fn pass(&self, k: PassKind) -> f64 {
        match k {
            PassKind::F => self.f,
            PassKind::B => self.b,
            PassKind::I => self.b - self.w,
            PassKind::W => self.w,
        }
    }

    /// Cost of one op: a single pass, or an overlapped forward+backward (`fb`, less `w` when
    /// the backward is input-only).
    pub fn op(&self, op: &Op) -> f64 {
        if op.is_overlapped() {
            let bw = op
                .passes
                .iter()
                .find(|p| p.kind != PassKind::F)
                .map(|p| p.kind);
            match bw {
                Some(PassKind::I) => self.fb - self.w,
                _ => self.fb,
            }
        } else {
            self.pass(op.passes[0].kind)
        }
    }
}

/// The simulated timeline of a schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Per rank, per op (same indices as `Schedule::ranks`): `(start, end)`.
    pub times: Vec<Vec<(f64, f64)>>,
    /// Per rank: sum of op durations.
    pub busy: Vec<f64>,
    /// Per rank: `makespan - busy` (the rank's bubble).
    pub idle: Vec<f64>,
    /// End of the last op on any rank (all ranks start at 0).
    pub makespan: f64,
}

impl Timeline {
    /// The largest per-rank bubble (the critical rank's).
    pub fn bubble(&self) -> f64 {
        self.idle.iter().cloned().fold(0.0, f64::max)
    }
}

/// Simulate `s` under `c`. Fails on invalid costs or a schedule that cannot run.
pub fn simulate(s: &Schedule, c: &Costs) -> Result<Timeline, ScheduleError> {
    c.validate()?;
    let refs = resolve(s)?;
    let idx = Index::new(s);
    // Per produced slot: (rank, end time).
    let mut ready: Vec<Option<(usize, f64)>> = vec![None; idx.len(s.num_chains())];
    let nr = s.ranks.len();
    let mut times: Vec<Vec<(f64, f64)>> = s
        .ranks
        .iter()
        .map(|o| Vec::with_capacity(o.len()))
        .collect();
    let mut free = vec![0.0f64; nr];
    loop {
        let mut progress = false;
        for r in 0..nr {
            'ops: while times[r].len() < s.ranks[r].len() {
                let k = times[r].len();
                let op = &s.ranks[r][k];
                let mut start = free[r];
                for (p, sr) in op.passes.iter().zip(&refs[r][k]) {
                    for d in deps(s, *sr, p.kind, &idx) {
                        match ready[d] {
                            None => break 'ops,
                            Some((pr, t)) => {
                                let arrive = if pr == r { t } else { t + c.p2p };
                                start = start.max(arrive);
                            }
                        }
                    }
                }
                let end = start + c.op(op);
                for (p, sr) in op.passes.iter().zip(&refs[r][k]) {
                    ready[idx.at(*sr, slot(p.kind))] = Some((r, end));
                }
                times[r].push((start, end));
                free[r] = end;
                progress = true;
            }
        }
        if times.iter().zip(&s.ranks).all(|(t, o)| t.len() == o.len()) {
            break;
        }
        if !progress {
            return Err(ScheduleError::Deadlock(
                "timing replay stalled (run verify for details)".into(),
            ));
        }
    }
    let makespan = free.iter().cloned().fold(0.0, f64::max);
    let busy: Vec<f64> = s
        .ranks
        .iter()
        .map(|ops| ops.iter().map(|o| c.op(o)).sum())
        .collect();
    let idle = busy.iter().map(|b| makespan - b).collect();
    Ok(Timeline {
        times,
        busy,
        idle,
        makespan,
    })
}

/// The closed-form bubble of `method` at pipeline size `pp` (DualPipeV: stages), as printed
/// in DeepSeek's DualPipe comparison table. `B` there is the full backward.
pub fn bubble_formula(method: Method, pp: usize, c: &Costs) -> f64 {
    let p = pp as f64;
    match method {
        Method::OneFOneB => (p - 1.0) * (c.f + c.b),
        Method::Zb1p => (p - 1.0) * (c.f + c.b - 2.0 * c.w),
        Method::DualPipe | Method::DualPipeV => (p / 2.0 - 1.0) * (c.fb + c.b - 3.0 * c.w),
    }
}

/// The closed form as text, for reports and JSON.
pub fn bubble_formula_text(method: Method) -> &'static str {
    match method {
        Method::OneFOneB => "(PP-1)(F+B)",
        Method::Zb1p => "(PP-1)(F+B-2W)",
        Method::DualPipe | Method::DualPipeV => "(PP/2-1)(F&B+B-3W)",
    }
}
