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
    let mut rp = Replay::new(s, costs);
    let pp = lists.len();
    let mut idx = vec![0usize; pp];
    loop {
        let mut progress = false;
        for r in 0..pp {
            while let Some(&op) = lists[r].get(idx[r]) {
                let Some(ready) = rp.ready(r, op)? else { break };
                rp.place(r, op, ready)?;
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
    Ok(rp.finish())
}

/// (end time, rank) of a pass; NaN end = not yet run.
type Done = (f64, usize);

/// The replay's state: when each forward / input-gradient finished and where, and each
/// rank's clock and accounting.
struct Replay<'a> {
    s: &'a pipeline::Schedule,
    costs: &'a dyn OpCosts,
    /// Per chain, stage, micro-batch.
    f_done: Vec<Vec<Vec<Done>>>,
    b_done: Vec<Vec<Vec<Done>>>,
    free: Vec<f64>,
    busy: Vec<f64>,
    exposed: Vec<f64>,
    ops: Vec<Vec<PlacedOp>>,
}

impl<'a> Replay<'a> {
    fn new(s: &'a pipeline::Schedule, costs: &'a dyn OpCosts) -> Self {
        let pp = s.num_ranks();
        let done =
            vec![vec![vec![(f64::NAN, 0usize); s.mbs_per_chain()]; s.num_stages()]; s.num_chains()];
        Replay {
            s,
            costs,
            f_done: done.clone(),
            b_done: done,
            free: vec![0.0; pp],
            busy: vec![0.0; pp],
            exposed: vec![0.0; pp],
            ops: vec![Vec::new(); pp],
        }
    }

    /// The (chain, stage) `w` names on rank `r`.
    fn locate(&self, r: usize, w: Work) -> Result<(usize, usize)> {
        match self.s.locate(r, w.dir) {
            Some((c, st)) if w.mb < self.s.mbs_per_chain() => Ok((c, st)),
            _ => Err(SimError::Deadlock(format!(
                "rank {r}: op refers to {w:?} outside the schedule"
            ))),
        }
    }

    /// When a result `v` is available on rank `r` (None: not produced yet).
    fn arrive(&self, r: usize, v: Done) -> Option<f64> {
        if v.0.is_nan() {
            None
        } else if v.1 == r {
            Some(v.0)
        } else {
            Some(v.0 + self.costs.p2p())
        }
    }

    /// A forward's input: the previous stage's output (stage 0 reads the batch).
    fn fdep(&self, r: usize, w: Work) -> Result<Option<f64>> {
        let (c, st) = self.locate(r, w)?;
        Ok(if st == 0 {
            Some(0.0)
        } else {
            self.arrive(r, self.f_done[c][st - 1][w.mb])
        })
    }

    /// A backward's inputs: its own forward and the next stage's input gradient.
    fn bdep(&self, r: usize, w: Work) -> Result<Option<f64>> {
        let (c, st) = self.locate(r, w)?;
        let own = self.arrive(r, self.f_done[c][st][w.mb]);
        if st == self.s.num_stages() - 1 {
            return Ok(own);
        }
        Ok(both(own, self.arrive(r, self.b_done[c][st + 1][w.mb])))
    }

    /// When `op`'s inputs are all on rank `r` (None: some are not produced yet).
    fn ready(&self, r: usize, op: Op) -> Result<Option<f64>> {
        Ok(match op {
            Op::F(w) => self.fdep(r, w)?,
            Op::B(w) | Op::BW(w) => self.bdep(r, w)?,
            Op::W(w) => {
                let (c, st) = self.locate(r, w)?;
                self.arrive(r, self.b_done[c][st][w.mb])
            }
            Op::FB(a, b, _) => both(self.fdep(r, a)?, self.bdep(r, b)?),
        })
    }

    /// Runs `op` on rank `r` once it is free and its inputs arrived (`ready`).
    fn place(&mut self, r: usize, op: Op, ready: f64) -> Result<()> {
        let start = ready.max(self.free[r]);
        let (t, stages) = match op {
            Op::F(w) => {
                let (c, st) = self.locate(r, w)?;
                let t = self.costs.f(st)?;
                self.f_done[c][st][w.mb] = (start + t.dur, r);
                (t, (st, st))
            }
            Op::B(w) | Op::BW(w) => {
                let (c, st) = self.locate(r, w)?;
                let t = if matches!(op, Op::B(_)) {
                    self.costs.b(st)?
                } else {
                    self.costs.bw(st)?
                };
                self.b_done[c][st][w.mb] = (start + t.dur, r);
                (t, (st, st))
            }
            Op::W(w) => {
                let (_, st) = self.locate(r, w)?;
                (self.costs.w(st)?, (st, st))
            }
            Op::FB(a, b, full) => {
                let ((ca, sa), (cb, sb)) = (self.locate(r, a)?, self.locate(r, b)?);
                let t = self.costs.fb(sa, sb, full)?;
                self.f_done[ca][sa][a.mb] = (start + t.f_end, r);
                self.b_done[cb][sb][b.mb] = (start + t.b_end, r);
                (t, (sa, sb))
            }
        };
        let end = start + t.dur;
        self.free[r] = end;
        self.busy[r] += t.dur;
        self.exposed[r] += t.exposed_comm;
        self.ops[r].push(PlacedOp {
            op,
            stages,
            start,
            end,
        });
        Ok(())
    }

    fn finish(self) -> Timeline {
        Timeline {
            makespan: self.free.iter().cloned().fold(0.0, f64::max),
            busy: self.busy,
            exposed_comm: self.exposed,
            ops: self.ops,
        }
    }
}

/// The later of two arrival times, once both are known.
fn both(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a?.max(b?))
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
