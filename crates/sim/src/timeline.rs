//! Discrete-event timeline of one training step over the pipeline ranks. The per-rank op
//! orders come from the `pipeline` crate (1F1B, ZB1P, DualPipe, DualPipeV: the same schedules
//! the real system runs); this module replays them with per-stage, per-op durations from an
//! [`OpCosts`] implementation (the cost + overlap model, or uniform costs in tests), cross-rank
//! dependencies with point-to-point delays, and per-rank busy/idle/exposed-communication time.

use crate::config::ScheduleKind;
use crate::error::{Result, SimError};
use serde::Serialize;

/// A micro-batch in a direction (the `pipeline` crate's `dir` on a rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Work {
    pub dir: usize,
    pub mb: usize,
}

/// One entry of a rank's op list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Op {
    /// Forward chunk.
    F(Work),
    /// Backward for inputs only (the weight gradient runs in a later `W`).
    B(Work),
    /// Full backward (inputs and weights).
    BW(Work),
    /// Weight gradient of a micro-batch.
    W(Work),
    /// Forward of one micro-batch overlapped with the backward of another (DualPipe F&B);
    /// the flag says whether the backward is full (true) or input-only.
    FB(Work, Work, bool),
}

/// Duration of an op and what part of it is exposed communication.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OpTime {
    pub dur: f64,
    /// For FB: when (from the op start) the forward output is ready; else `dur`.
    pub f_end: f64,
    /// For FB: when the backward output is ready; else `dur`.
    pub b_end: f64,
    pub exposed_comm: f64,
}

/// Durations of ops for given stages.
pub trait OpCosts {
    fn f(&self, stage: usize) -> Result<OpTime>;
    fn b(&self, stage: usize) -> Result<OpTime>;
    fn bw(&self, stage: usize) -> Result<OpTime>;
    fn w(&self, stage: usize) -> Result<OpTime>;
    fn fb(&self, f_stage: usize, b_stage: usize, full_backward: bool) -> Result<OpTime>;
    fn p2p(&self) -> f64;
}

/// An op placed on a rank.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PlacedOp {
    pub op: Op,
    /// Stage(s) the op works on: (forward-or-only stage, backward stage for FB).
    pub stages: (usize, usize),
    pub start: f64,
    pub end: f64,
}

/// Timeline of one step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    pub makespan: f64,
    pub busy: Vec<f64>,
    pub exposed_comm: Vec<f64>,
    pub ops: Vec<Vec<PlacedOp>>,
}

impl Timeline {
    /// Index of the rank with the most busy time (the critical rank).
    pub fn critical_rank(&self) -> usize {
        let mut r = 0;
        for i in 0..self.busy.len() {
            if self.busy[i] > self.busy[r] {
                r = i;
            }
        }
        r
    }
    /// Pipeline bubble: idle time of the critical rank.
    pub fn bubble(&self) -> f64 {
        self.makespan - self.busy[self.critical_rank()]
    }
    /// Largest idle time of any rank (the `pipeline` crate's bubble definition).
    pub fn max_idle(&self) -> f64 {
        self.busy
            .iter()
            .map(|b| self.makespan - b)
            .fold(0.0, f64::max)
    }
}

/// The `pipeline` method for a schedule kind.
pub fn method(kind: ScheduleKind) -> pipeline::Method {
    match kind {
        ScheduleKind::OneFOneB => pipeline::Method::OneFOneB,
        ScheduleKind::Zb1p => pipeline::Method::Zb1p,
        ScheduleKind::DualPipe => pipeline::Method::DualPipe,
        ScheduleKind::DualPipeV => pipeline::Method::DualPipeV,
    }
}

/// The `pipeline` crate's `pp` argument for `ranks` pipeline ranks (DualPipeV counts stages:
/// two per rank).
pub fn pipeline_pp(kind: ScheduleKind, ranks: usize) -> usize {
    if kind == ScheduleKind::DualPipeV {
        2 * ranks
    } else {
        ranks
    }
}

/// Generate the schedule for `ranks` pipeline ranks with the `pipeline` crate.
pub fn generate(kind: ScheduleKind, ranks: usize, n: usize) -> Result<pipeline::Schedule> {
    pipeline::generate(method(kind), pipeline_pp(kind, ranks), n)
        .map_err(|e| SimError::config("schedule", e.to_string()))
}

/// Convert the `pipeline` crate's per-rank ops into this module's ops.
pub fn op_lists(s: &pipeline::Schedule) -> Result<Vec<Vec<Op>>> {
    use pipeline::PassKind as K;
    let conv = |p: &pipeline::Pass| Work {
        dir: p.dir,
        mb: p.mb,
    };
    s.ranks
        .iter()
        .map(|ops| {
            ops.iter()
                .map(|o| match o.passes.as_slice() {
                    [p] => Ok(match p.kind {
                        K::F => Op::F(conv(p)),
                        K::B => Op::BW(conv(p)),
                        K::I => Op::B(conv(p)),
                        K::W => Op::W(conv(p)),
                    }),
                    [a, b] => {
                        let (f, bk) = if a.kind == K::F { (a, b) } else { (b, a) };
                        if f.kind != K::F || !matches!(bk.kind, K::B | K::I) {
                            return Err(SimError::Deadlock(format!(
                                "unsupported overlapped op {:?}",
                                o.passes
                            )));
                        }
                        Ok(Op::FB(conv(f), conv(bk), bk.kind == K::B))
                    }
                    _ => Err(SimError::Deadlock(format!("unsupported op {:?}", o.passes))),
                })
                .collect()
        })
        .collect()
}

/// Replay the schedule `s` with per-stage op costs. All ranks start at 0; an op starts when
/// its rank is free and every input has arrived (`p2p` later when produced on another rank).
pub fn simulate(s: &pipeline::Schedule, costs: &dyn OpCosts) -> Result<Timeline> {
    let lists = op_lists(s)?;
    let pp = s.num_ranks();
    let chains = s.num_chains();
    let stages = s.num_stages();
    let per_chain = s.mbs_per_chain();
    let nan = f64::NAN;
    // Per chain, stage, micro-batch: (end time, rank) of the forward / input-gradient.
    let mut f_done = vec![vec![vec![(nan, 0usize); per_chain]; stages]; chains];
    let mut b_done = vec![vec![vec![(nan, 0usize); per_chain]; stages]; chains];
    let mut idx = vec![0usize; pp];
    let mut free = vec![0.0f64; pp];
    let mut busy = vec![0.0f64; pp];
    let mut exposed = vec![0.0f64; pp];
    let mut ops: Vec<Vec<PlacedOp>> = vec![Vec::new(); pp];
    let p2p = costs.p2p();
    let locate = |r: usize, w: Work| -> Result<(usize, usize)> {
        match s.locate(r, w.dir) {
            Some((c, st)) if w.mb < per_chain => Ok((c, st)),
            _ => Err(SimError::Deadlock(format!(
                "rank {r}: op refers to {w:?} outside the schedule"
            ))),
        }
    };
    let arrive = |r: usize, v: (f64, usize)| -> Option<f64> {
        if v.0.is_nan() {
            None
        } else if v.1 == r {
            Some(v.0)
        } else {
            Some(v.0 + p2p)
        }
    };
    loop {
        let mut progress = false;
        for r in 0..pp {
            while idx[r] < lists[r].len() {
                let op = lists[r][idx[r]];
                let fdep = |w: Work| -> Result<Option<f64>> {
                    let (c, st) = locate(r, w)?;
                    Ok(if st == 0 {
                        Some(0.0)
                    } else {
                        arrive(r, f_done[c][st - 1][w.mb])
                    })
                };
                let bdep = |w: Work| -> Result<Option<f64>> {
                    let (c, st) = locate(r, w)?;
                    let own = arrive(r, f_done[c][st][w.mb]);
                    Ok(if st == stages - 1 {
                        own
                    } else {
                        match (own, arrive(r, b_done[c][st + 1][w.mb])) {
                            (Some(a), Some(b)) => Some(a.max(b)),
                            _ => None,
                        }
                    })
                };
                let ready = match op {
                    Op::F(w) => fdep(w)?,
                    Op::B(w) | Op::BW(w) => bdep(w)?,
                    Op::W(w) => {
                        let (c, st) = locate(r, w)?;
                        arrive(r, b_done[c][st][w.mb])
                    }
                    Op::FB(a, b, _) => match (fdep(a)?, bdep(b)?) {
                        (Some(x), Some(y)) => Some(x.max(y)),
                        _ => None,
                    },
                };
                let Some(ready) = ready else { break };
                let start = ready.max(free[r]);
                let (t, stages_of) = match op {
                    Op::F(w) => {
                        let (c, st) = locate(r, w)?;
                        let t = costs.f(st)?;
                        f_done[c][st][w.mb] = (start + t.dur, r);
                        (t, (st, st))
                    }
                    Op::B(w) | Op::BW(w) => {
                        let (c, st) = locate(r, w)?;
                        let t = if matches!(op, Op::B(_)) {
                            costs.b(st)?
                        } else {
                            costs.bw(st)?
                        };
                        b_done[c][st][w.mb] = (start + t.dur, r);
                        (t, (st, st))
                    }
                    Op::W(w) => {
                        let (_, st) = locate(r, w)?;
                        (costs.w(st)?, (st, st))
                    }
                    Op::FB(a, b, full) => {
                        let (ca, sa) = locate(r, a)?;
                        let (cb, sb) = locate(r, b)?;
                        let t = costs.fb(sa, sb, full)?;
                        f_done[ca][sa][a.mb] = (start + t.f_end, r);
                        b_done[cb][sb][b.mb] = (start + t.b_end, r);
                        (t, (sa, sb))
                    }
                };
                let end = start + t.dur;
                free[r] = end;
                busy[r] += t.dur;
                exposed[r] += t.exposed_comm;
                ops[r].push(PlacedOp {
                    op,
                    stages: stages_of,
                    start,
                    end,
                });
                idx[r] += 1;
                progress = true;
            }
        }
        if (0..pp).all(|r| idx[r] == lists[r].len()) {
            break;
        }
        if !progress {
            let stuck: Vec<String> = (0..pp)
                .filter(|&r| idx[r] < lists[r].len())
                .map(|r| format!("rank {r} at {:?}", lists[r][idx[r]]))
                .collect();
            return Err(SimError::Deadlock(stuck.join(", ")));
        }
    }
    let makespan = free.iter().cloned().fold(0.0, f64::max);
    Ok(Timeline {
        makespan,
        busy,
        exposed_comm: exposed,
        ops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uniform stage costs in the `pipeline` crate's terms.
    struct Uniform(pipeline::Costs);
    fn t(d: f64) -> OpTime {
        OpTime {
            dur: d,
            f_end: d,
            b_end: d,
            exposed_comm: 0.0,
        }
    }
    impl OpCosts for Uniform {
        fn f(&self, _: usize) -> Result<OpTime> {
            Ok(t(self.0.f))
        }
        fn b(&self, _: usize) -> Result<OpTime> {
            Ok(t(self.0.b - self.0.w))
        }
        fn bw(&self, _: usize) -> Result<OpTime> {
            Ok(t(self.0.b))
        }
        fn w(&self, _: usize) -> Result<OpTime> {
            Ok(t(self.0.w))
        }
        fn fb(&self, _: usize, _: usize, full: bool) -> Result<OpTime> {
            Ok(t(if full {
                self.0.fb
            } else {
                self.0.fb - self.0.w
            }))
        }
        fn p2p(&self) -> f64 {
            self.0.p2p
        }
    }

    /// The replay here must reproduce the schedule crate's own timing exactly when every stage
    /// costs the same: same makespan, same per-rank busy time, same bubble.
    #[test]
    fn bubble_equals_schedule_crate() {
        let costs = [
            pipeline::Costs {
                f: 1.0,
                b: 2.0,
                w: 0.5,
                fb: 2.6,
                p2p: 0.0,
            },
            pipeline::Costs {
                f: 1.0,
                b: 1.7,
                w: 0.6,
                fb: 2.2,
                p2p: 0.05,
            },
        ];
        for kind in [
            ScheduleKind::OneFOneB,
            ScheduleKind::Zb1p,
            ScheduleKind::DualPipe,
            ScheduleKind::DualPipeV,
        ] {
            for (pp, n) in [(4, 8), (8, 16), (16, 40)] {
                for c in costs {
                    let s = pipeline::generate(method(kind), pp, n).unwrap();
                    let theirs = pipeline::simulate(&s, &c).unwrap();
                    let ours = simulate(&s, &Uniform(c)).unwrap();
                    assert!(
                        (ours.makespan - theirs.makespan).abs() < 1e-9,
                        "{kind} pp {pp}: {} vs {}",
                        ours.makespan,
                        theirs.makespan
                    );
                    assert!(
                        (ours.max_idle() - theirs.bubble()).abs() < 1e-9,
                        "{kind} pp {pp}"
                    );
                    for r in 0..s.num_ranks() {
                        assert!((ours.busy[r] - theirs.busy[r]).abs() < 1e-9);
                    }
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_bubble_matches_closed_form() {
        let c = pipeline::Costs {
            f: 1.0,
            b: 2.0,
            w: 0.5,
            fb: 3.0,
            p2p: 0.0,
        };
        let s = generate(ScheduleKind::OneFOneB, 8, 24).unwrap();
        let tl = simulate(&s, &Uniform(c)).unwrap();
        assert!((tl.bubble() - 7.0 * 3.0).abs() < 1e-9, "{}", tl.bubble());
    }
}
