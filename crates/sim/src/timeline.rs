//! Discrete-event timeline of one training step over the pipeline ranks: per-rank op orders
//! for 1F1B, ZB1P and DualPipe (following the published DualPipe reference order), cross-rank
//! dependencies with point-to-point transfer delays, and per-rank busy/idle/exposed time.
//! Op durations come from an [`OpCosts`] implementation (the cost + overlap model, or uniform
//! costs in tests).

use crate::config::ScheduleKind;
use crate::error::{Result, SimError};
use serde::Serialize;
use std::collections::VecDeque;

/// A micro-batch in a direction (DualPipe has two; the others use direction 0).
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
    /// Backward for inputs only; the weight gradient is queued for a later `W`.
    B(Work),
    /// Full backward (inputs and weights).
    BW(Work),
    /// Weight gradient of the oldest queued `B`.
    W,
    /// Forward of one micro-batch overlapped with the full backward of another (DualPipe F&B).
    FB(Work, Work),
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
    fn fb(&self, f_stage: usize, b_stage: usize) -> Result<OpTime>;
    fn p2p(&self) -> f64;
}

/// An op placed on a rank.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PlacedOp {
    pub op: Op,
    /// Stage(s) the op works on: (forward-or-only stage, backward stage for FB).
    pub stages: (usize, usize),
    /// For W: the work whose weight gradient it computes.
    pub w_of: Option<Work>,
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
}

/// Stage a rank holds for a direction: direction 0 enters at rank 0, direction 1 at rank pp-1.
pub fn stage_of(pp: usize, rank: usize, dir: usize) -> usize {
    if dir == 0 {
        rank
    } else {
        pp - 1 - rank
    }
}

/// Per-rank op lists of a schedule.
pub fn op_lists(kind: ScheduleKind, pp: usize, n: usize) -> Vec<Vec<Op>> {
    (0..pp)
        .map(|r| match kind {
            ScheduleKind::OneFOneB | ScheduleKind::Zb1p => {
                let zb = kind == ScheduleKind::Zb1p;
                let w = (pp - 1 - r).min(n);
                let wk = |mb| Work { dir: 0, mb };
                let bk = |mb| if zb { Op::B(wk(mb)) } else { Op::BW(wk(mb)) };
                let mut v: Vec<Op> = (0..w).map(|i| Op::F(wk(i))).collect();
                for i in 0..n - w {
                    v.push(Op::F(wk(w + i)));
                    v.push(bk(i));
                }
                for i in n - w..n {
                    v.push(bk(i));
                }
                v
            }
            ScheduleKind::DualPipe => dualpipe_rank(pp, n, r),
        })
        .collect()
}

/// DualPipe op order of one rank (8 steps of the reference implementation). Phase 0 is the
/// direction the rank is nearer the entry of; phase 1 the other.
fn dualpipe_rank(pp: usize, n: usize, rank: usize) -> Vec<Op> {
    let half = pp / 2;
    let second = rank >= half;
    let half_rank = rank.min(pp - 1 - rank);
    let half_chunks = n / 2;
    let dir = |phase: usize| phase ^ (second as usize);
    let mut fnext = [0usize; 2];
    let mut bnext = [0usize; 2];
    let mut v = Vec::new();
    let f = |phase: usize, fnext: &mut [usize; 2]| {
        let w = Work {
            dir: dir(phase),
            mb: fnext[phase],
        };
        fnext[phase] += 1;
        w
    };
    let b = |phase: usize, bnext: &mut [usize; 2]| {
        let w = Work {
            dir: dir(phase),
            mb: bnext[phase],
        };
        bnext[phase] += 1;
        w
    };
    // Step 1: nF0
    for _ in 0..(half - half_rank - 1) * 2 {
        v.push(Op::F(f(0, &mut fnext)));
    }
    // Step 2: nF0F1
    for _ in 0..half_rank + 1 {
        v.push(Op::F(f(0, &mut fnext)));
        v.push(Op::F(f(1, &mut fnext)));
    }
    // Step 3: nB1W1F1 (zero bubble)
    for _ in 0..half - half_rank - 1 {
        v.push(Op::B(b(1, &mut bnext)));
        v.push(Op::W);
        v.push(Op::F(f(1, &mut fnext)));
    }
    // Step 4: nF0B1F1B0 (main step)
    let step4 = half_chunks + half_rank + 1 - pp;
    for i in 0..step4 {
        if i == 0 && rank == pp - 1 {
            // The last rank cannot overlap its first pair (the B depends on this F).
            v.push(Op::F(f(0, &mut fnext)));
            v.push(Op::BW(b(1, &mut bnext)));
        } else {
            let fw = f(0, &mut fnext);
            let bw = b(1, &mut bnext);
            v.push(Op::FB(fw, bw));
        }
        let fw = f(1, &mut fnext);
        let bw = b(0, &mut bnext);
        v.push(Op::FB(fw, bw));
    }
    // Step 5: nB1F1B0
    for _ in 0..half - half_rank - 1 {
        v.push(Op::BW(b(1, &mut bnext)));
        let fw = f(1, &mut fnext);
        let bw = b(0, &mut bnext);
        v.push(Op::FB(fw, bw));
    }
    // Step 6: nB1B0 (the second half uses zero bubble)
    let step6 = half_rank + 1;
    let mut zb = false;
    for i in 0..step6 {
        if i == step6 / 2 && half_rank % 2 == 1 {
            zb = true;
        }
        let w = b(1, &mut bnext);
        v.push(if zb { Op::B(w) } else { Op::BW(w) });
        if i == step6 / 2 && half_rank % 2 == 0 {
            zb = true;
        }
        let w = b(0, &mut bnext);
        v.push(if zb { Op::B(w) } else { Op::BW(w) });
    }
    // Step 7: nWB0 (zero bubble)
    for _ in 0..half - half_rank - 1 {
        v.push(Op::W);
        v.push(Op::B(b(0, &mut bnext)));
    }
    // Step 8: nW
    for _ in 0..half_rank + 1 {
        v.push(Op::W);
    }
    v
}

/// Run the step. For ZB1P, queued weight gradients also fill idle gaps greedily.
pub fn simulate(kind: ScheduleKind, pp: usize, n: usize, costs: &dyn OpCosts) -> Result<Timeline> {
    let lists = op_lists(kind, pp, n);
    let ndir = if kind == ScheduleKind::DualPipe { 2 } else { 1 };
    let per_dir = if kind == ScheduleKind::DualPipe {
        n / 2
    } else {
        n
    };
    let nan = f64::NAN;
    let mut f_done = vec![vec![vec![nan; per_dir]; pp]; ndir];
    let mut b_done = vec![vec![vec![nan; per_dir]; pp]; ndir];
    let mut idx = vec![0usize; pp];
    let mut free = vec![0.0f64; pp];
    let mut busy = vec![0.0f64; pp];
    let mut exposed = vec![0.0f64; pp];
    let mut wq: Vec<VecDeque<Work>> = vec![VecDeque::new(); pp];
    let mut ops: Vec<Vec<PlacedOp>> = vec![Vec::new(); pp];
    let p2p = costs.p2p();
    let greedy_w = kind == ScheduleKind::Zb1p;
    let mut inflight = vec![0usize; pp];

    let check = |w: Work, pp: usize| -> Result<()> {
        if w.mb >= per_dir || w.dir >= ndir || pp == 0 {
            Err(SimError::Deadlock(format!(
                "op refers to micro-batch {w:?} outside the step"
            )))
        } else {
            Ok(())
        }
    };

    loop {
        // Ready time of a rank's next op: Some(t) if all dependencies are known.
        let dep = |r: usize,
                   op: &Op,
                   f_done: &Vec<Vec<Vec<f64>>>,
                   b_done: &Vec<Vec<Vec<f64>>>|
         -> Option<f64> {
            let fdep = |w: Work| -> Option<f64> {
                let s = stage_of(pp, r, w.dir);
                if s == 0 {
                    Some(0.0)
                } else {
                    let t = f_done[w.dir][s - 1][w.mb];
                    (!t.is_nan()).then_some(t + p2p)
                }
            };
            let bdep = |w: Work| -> Option<f64> {
                let s = stage_of(pp, r, w.dir);
                let own = f_done[w.dir][s][w.mb];
                if own.is_nan() {
                    return None;
                }
                if s == pp - 1 {
                    Some(own)
                } else {
                    let t = b_done[w.dir][s + 1][w.mb];
                    (!t.is_nan()).then_some(t.max(own) + p2p)
                }
            };
            match *op {
                Op::F(w) => fdep(w),
                Op::B(w) | Op::BW(w) => bdep(w),
                Op::W => Some(0.0),
                Op::FB(a, b) => match (fdep(a), bdep(b)) {
                    (Some(x), Some(y)) => Some(x.max(y)),
                    _ => None,
                },
            }
        };
        // Pick the rank with the earliest possible action.
        let mut best: Option<(f64, usize, bool)> = None; // (start, rank, run_queued_w)
        let mut fallback: Option<(f64, usize, bool)> = None;
        let mut all_done = true;
        for r in 0..pp {
            let has_next = idx[r] < lists[r].len();
            let has_w = greedy_w && !wq[r].is_empty();
            if !has_next && !has_w {
                continue;
            }
            all_done = false;
            let w_dur = if has_w {
                costs.w(stage_of(pp, r, wq[r][0].dir))?.dur
            } else {
                0.0
            };
            let cand = if has_next {
                let op = lists[r][idx[r]];
                match dep(r, &op, &f_done, &b_done) {
                    Some(t) => {
                        let st = t.max(free[r]);
                        // ZB-H1 memory bound: at most pp micro-batches in flight (F done, W not).
                        let cap_hit = matches!(op, Op::F(_)) && greedy_w && inflight[r] >= pp;
                        // Fill a gap with a queued W only when it does not delay the next op.
                        if has_w && (cap_hit || free[r] + w_dur <= t + 1e-12) {
                            Some((free[r], r, true))
                        } else {
                            Some((st, r, false))
                        }
                    }
                    None => {
                        if has_w && fallback.is_none_or(|b: (f64, usize, bool)| free[r] < b.0) {
                            fallback = Some((free[r], r, true));
                        }
                        None
                    }
                }
            } else {
                Some((free[r], r, true))
            };
            if let Some(c) = cand {
                if best.is_none_or(|b| c.0 < b.0) {
                    best = Some(c);
                }
            }
        }
        let best = best.or(fallback);
        if all_done {
            break;
        }
        let Some((start, r, run_w)) = best else {
            let stuck: Vec<String> = (0..pp)
                .filter(|&r| idx[r] < lists[r].len())
                .map(|r| format!("rank {r} at {:?}", lists[r][idx[r]]))
                .collect();
            return Err(SimError::Deadlock(stuck.join(", ")));
        };
        let op = if run_w { Op::W } else { lists[r][idx[r]] };
        if !run_w {
            idx[r] += 1;
        }
        let placed = match op {
            Op::F(w) => {
                check(w, pp)?;
                let s = stage_of(pp, r, w.dir);
                let t = costs.f(s)?;
                inflight[r] += 1;
                f_done[w.dir][s][w.mb] = start + t.dur;
                (t, (s, s), None)
            }
            Op::B(w) | Op::BW(w) => {
                check(w, pp)?;
                let s = stage_of(pp, r, w.dir);
                let t = if matches!(op, Op::B(_)) {
                    wq[r].push_back(w);
                    costs.b(s)?
                } else {
                    inflight[r] = inflight[r].saturating_sub(1);
                    costs.bw(s)?
                };
                b_done[w.dir][s][w.mb] = start + t.dur;
                (t, (s, s), None)
            }
            Op::W => {
                let w = wq[r].pop_front().ok_or_else(|| {
                    SimError::Deadlock(format!("rank {r}: weight-gradient op with nothing queued"))
                })?;
                inflight[r] = inflight[r].saturating_sub(1);
                let s = stage_of(pp, r, w.dir);
                (costs.w(s)?, (s, s), Some(w))
            }
            Op::FB(a, b) => {
                check(a, pp)?;
                check(b, pp)?;
                let sf = stage_of(pp, r, a.dir);
                let sb = stage_of(pp, r, b.dir);
                let t = costs.fb(sf, sb)?;
                f_done[a.dir][sf][a.mb] = start + t.f_end;
                b_done[b.dir][sb][b.mb] = start + t.b_end;
                (t, (sf, sb), None)
            }
        };
        let (t, stages, w_of) = placed;
        let end = start + t.dur;
        free[r] = end;
        busy[r] += t.dur;
        exposed[r] += t.exposed_comm;
        ops[r].push(PlacedOp {
            op,
            stages,
            w_of,
            start,
            end,
        });
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

    /// Uniform stage costs; F&B = f + b (no overlap gain) unless `fb` set.
    struct Uniform {
        f: f64,
        b: f64,
        w: f64,
        fb: f64,
    }
    impl OpCosts for Uniform {
        fn f(&self, _: usize) -> Result<OpTime> {
            Ok(t(self.f))
        }
        fn b(&self, _: usize) -> Result<OpTime> {
            Ok(t(self.b))
        }
        fn bw(&self, _: usize) -> Result<OpTime> {
            Ok(t(self.b + self.w))
        }
        fn w(&self, _: usize) -> Result<OpTime> {
            Ok(t(self.w))
        }
        fn fb(&self, _: usize, _: usize) -> Result<OpTime> {
            Ok(t(self.fb))
        }
        fn p2p(&self) -> f64 {
            0.0
        }
    }
    fn t(d: f64) -> OpTime {
        OpTime {
            dur: d,
            f_end: d,
            b_end: d,
            exposed_comm: 0.0,
        }
    }

    #[test]
    fn one_f_one_b_bubble_matches_closed_form() {
        for (pp, n) in [(4, 8), (8, 16), (16, 120)] {
            let c = Uniform {
                f: 1.0,
                b: 1.5,
                w: 0.5,
                fb: 3.0,
            };
            let tl = simulate(ScheduleKind::OneFOneB, pp, n, &c).unwrap();
            let expect = (pp - 1) as f64 * (c.f + c.b + c.w);
            assert!(
                (tl.bubble() - expect).abs() < 1e-9,
                "pp {pp}: {} vs {expect}",
                tl.bubble()
            );
            assert!((tl.makespan - (n as f64 * 3.0 + expect)).abs() < 1e-9);
        }
    }

    #[test]
    fn zb1p_bubble_not_above_closed_form() {
        for (pp, n) in [(4, 8), (8, 24)] {
            let c = Uniform {
                f: 1.0,
                b: 1.0,
                w: 1.0,
                fb: 3.0,
            };
            let tl = simulate(ScheduleKind::Zb1p, pp, n, &c).unwrap();
            // (PP-1)(F+B-2W) with B the full backward (B+W here).
            let expect = (pp - 1) as f64 * (c.f + (c.b + c.w) - 2.0 * c.w);
            assert!(
                tl.bubble() <= expect + 1e-9,
                "pp {pp}: {} vs {expect}",
                tl.bubble()
            );
            let one = simulate(ScheduleKind::OneFOneB, pp, n, &c).unwrap();
            assert!(tl.makespan < one.makespan);
        }
    }

    #[test]
    fn dualpipe_runs_every_op_once() {
        let pp = 8;
        let n = 20;
        let lists = op_lists(ScheduleKind::DualPipe, pp, n);
        for (r, l) in lists.iter().enumerate() {
            let (mut f, mut b, mut w) = (0, 0, 0);
            for op in l {
                match op {
                    Op::F(_) => f += 1,
                    Op::B(_) => b += 1,
                    Op::BW(_) => {
                        b += 1;
                        w += 1
                    }
                    Op::W => w += 1,
                    Op::FB(_, _) => {
                        f += 1;
                        b += 1;
                        w += 1
                    }
                }
            }
            assert_eq!((f, b, w), (n, n, n), "rank {r}");
        }
        let c = Uniform {
            f: 1.0,
            b: 1.0,
            w: 1.0,
            fb: 3.0,
        };
        simulate(ScheduleKind::DualPipe, pp, n, &c).unwrap();
    }
}
