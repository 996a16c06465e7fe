//! Schedule generators: turn (method, PP, micro-batches) into a [`Schedule`].
//!
//! Generators only decide *order*; they know nothing about costs. Every generated schedule is
//! meant to pass [`crate::verify()`], and the test-suite checks that it does.

use std::collections::VecDeque;

use crate::schedule::{Layout, Method, Op, Pass, PassKind, Schedule};
use crate::ScheduleError;

/// Generate the schedule of `method` for `pp` pipeline stages/ranks and `chunks` micro-batches.
///
/// * 1F1B, ZB1P: `pp >= 1` ranks, one stage each; `chunks >= 1`.
/// * DualPipe: `pp` ranks, even, `>= 2`; `chunks` even and `>= 2*pp` (half per direction).
/// * DualPipeV: `pp` *stages*, even, `>= 2`, on `pp/2` devices; `chunks >= pp`.
pub fn generate(method: Method, pp: usize, chunks: usize) -> Result<Schedule, ScheduleError> {
    check_request(method, pp, chunks)?;
    let ranks = match method {
        Method::OneFOneB => (0..pp).map(|r| one_f_one_b(r, pp, chunks)).collect(),
        Method::Zb1p => (0..pp)
            .map(|r| zb_h1(r, pp, chunks))
            .collect::<Result<_, _>>()?,
        Method::DualPipe => {
            let half = pp / 2;
            (0..pp)
                .map(|r| {
                    // Ranks in the second half see direction 1 as their "early" stage.
                    let (h, phase_dir) = if r < half {
                        (r, [0, 1])
                    } else {
                        (pp - 1 - r, [1, 0])
                    };
                    dual_rank(h, half, chunks / 2, phase_dir)
                })
                .collect::<Result<_, _>>()?
        }
        Method::DualPipeV => {
            let devices = pp / 2;
            (0..devices)
                .map(|r| dual_rank(r, devices, chunks, [0, 1]))
                .collect::<Result<_, _>>()?
        }
    };
    let layout = match method {
        Method::OneFOneB | Method::Zb1p => Layout::Linear,
        Method::DualPipe => Layout::Bidirectional,
        Method::DualPipeV => Layout::V,
    };
    Ok(Schedule {
        method,
        pp,
        chunks,
        layout,
        ranks,
    })
}

/// Refuse requests a method cannot serve, naming the rule broken.
pub fn check_request(method: Method, pp: usize, chunks: usize) -> Result<(), ScheduleError> {
    let bad = |rule: String| Err(ScheduleError::Unsupported { method, rule });
    if pp == 0 {
        return bad("PP must be at least 1".into());
    }
    if chunks == 0 {
        return bad("at least one micro-batch is needed".into());
    }
    use crate::limits::{MAX_CHUNKS, MAX_PASSES, MAX_PP};
    if pp > MAX_PP {
        return bad(format!("PP = {pp} is above the limit of {MAX_PP}"));
    }
    if chunks > MAX_CHUNKS {
        return bad(format!(
            "{chunks} micro-batches are above the limit of {MAX_CHUNKS}"
        ));
    }
    if pp * chunks > MAX_PASSES {
        return bad(format!(
            "PP x micro-batches = {} is above the limit of {MAX_PASSES} passes",
            pp * chunks
        ));
    }
    match method {
        Method::OneFOneB | Method::Zb1p => Ok(()),
        Method::DualPipe => {
            if pp < 2 || !pp.is_multiple_of(2) {
                return bad(format!("DualPipe needs an even PP >= 2 (got PP={pp})"));
            }
            if !chunks.is_multiple_of(2) {
                return bad(format!(
                    "DualPipe splits micro-batches half per direction, so their number must be even (got {chunks})"
                ));
            }
            if chunks < 2 * pp {
                return bad(format!(
                    "DualPipe needs at least 2*PP = {} micro-batches (got {chunks})",
                    2 * pp
                ));
            }
            Ok(())
        }
        Method::DualPipeV => {
            if pp < 2 || !pp.is_multiple_of(2) {
                return bad(format!(
                    "DualPipeV folds PP stages onto PP/2 devices, so PP must be even and >= 2 (got PP={pp})"
                ));
            }
            if chunks < pp {
                return bad(format!(
                    "DualPipeV needs at least 2 micro-batches per device, i.e. PP = {pp} (got {chunks})"
                ));
            }
            Ok(())
        }
    }
}

fn f(mb: usize, dir: usize) -> Op {
    Op::single(Pass::new(PassKind::F, mb, dir))
}
fn b(mb: usize, dir: usize) -> Op {
    Op::single(Pass::new(PassKind::B, mb, dir))
}
fn i(mb: usize, dir: usize) -> Op {
    Op::single(Pass::new(PassKind::I, mb, dir))
}
fn w(mb: usize, dir: usize) -> Op {
    Op::single(Pass::new(PassKind::W, mb, dir))
}

/// 1F1B on rank `r`: `pp-1-r` warm-up forwards, then alternate F/B, then drain the Bs.
fn one_f_one_b(r: usize, pp: usize, m: usize) -> Vec<Op> {
    let warm = (pp - 1 - r).min(m);
    let mut ops = Vec::with_capacity(2 * m);
    ops.extend((0..warm).map(|k| f(k, 0)));
    for k in 0..m - warm {
        ops.push(f(warm + k, 0));
        ops.push(b(k, 0));
    }
    ops.extend((m - warm..m).map(|k| b(k, 0)));
    ops
}

/// ZB-H1 on rank `r`: 1F1B's order with every B split into I and W, where rank `r` keeps up
/// to `r` weight passes deferred. Deferring keeps the I chain (the critical path of the drain)
/// free of W work; the deferred Ws then fill the drain's waiting gaps. Rank `r` therefore
/// holds at most `(pp-1-r) + 1 + r = pp` activations, the same peak as 1F1B's rank 0.
fn zb_h1(r: usize, pp: usize, m: usize) -> Result<Vec<Op>, ScheduleError> {
    let warm = (pp - 1 - r).min(m);
    let mut ops = Vec::with_capacity(3 * m);
    let mut pending: VecDeque<usize> = VecDeque::new();
    ops.extend((0..warm).map(|k| f(k, 0)));
    for k in 0..m - warm {
        ops.push(f(warm + k, 0));
        ops.push(i(k, 0));
        pending.push_back(k);
        if pending.len() > r {
            let mb = pending.pop_front().expect("non-empty: len > r >= 0");
            ops.push(w(mb, 0));
        }
    }
    for k in m - warm..m {
        ops.push(i(k, 0));
        pending.push_back(k);
        if pending.len() > r {
            let mb = pending.pop_front().expect("non-empty");
            ops.push(w(mb, 0));
        }
    }
    ops.extend(pending.into_iter().map(|mb| w(mb, 0)));
    Ok(ops)
}

/// Per-rank program of DualPipe / DualPipeV (they share it; DualPipeV is DualPipe with the
/// mirrored rank pairs folded onto one device).
///
/// * `h`: the rank's distance from the nearer pipeline end (`min(r, PP-1-r)`; DualPipeV: `r`).
/// * `half`: PP/2 (DualPipeV: number of devices).
/// * `n`: micro-batches per direction (DualPipeV: all of them).
/// * `phase_dir`: the `dir` of phase 0 (the stage early in its chain) and phase 1.
///
/// The eight phases follow DeepSeek's published schedule: warm-up forwards of phase 0,
/// forward pairs, zero-bubble I/W/F of phase 1, the steady overlapped F&B pairs, drain pairs,
/// backward pairs (the later half of them deferring W), and the deferred Ws.
fn dual_rank(
    h: usize,
    half: usize,
    n: usize,
    phase_dir: [usize; 2],
) -> Result<Vec<Op>, ScheduleError> {
    let mut g = DualGen {
        phase_dir,
        next_f: [0, 0],
        next_b: [0, 0],
        w_queue: VecDeque::new(),
        ops: Vec::with_capacity(6 * n),
    };
    let outer = half - h - 1; // distance from the middle of the pipeline
                              // Step 1: nF0.
    for _ in 0..2 * outer {
        g.fwd(0);
    }
    // Step 2: nF0F1.
    for _ in 0..h + 1 {
        g.fwd(0);
        g.fwd(1);
    }
    // Step 3: nI1W1F1 — zero bubble: the W runs right after its I.
    for _ in 0..outer {
        g.bwd(1, true);
        g.weight()?;
        g.fwd(1);
    }
    // Step 4 (main): nF0B1F1B0 as two overlapped pairs.
    let steady = (n + h + 1)
        .checked_sub(2 * half)
        .ok_or(ScheduleError::Internal(
            "too few micro-batches for the steady phase",
        ))?;
    for k in 0..steady {
        if k == 0 && h == half - 1 {
            // The middle ranks run their first F0 and B1 back to back, not overlapped: the B1
            // depends on the neighbouring middle rank's forward that this F0 feeds.
            g.fwd(0);
            g.bwd(1, false);
        } else {
            g.fwd_bwd(0, 1);
        }
        g.fwd_bwd(1, 0);
    }
    // Step 5: nB1F1B0.
    for _ in 0..outer {
        g.bwd(1, false);
        g.fwd_bwd(1, 0);
    }
    // Step 6: nB1B0, the second half of these backwards deferring their W.
    let mut zb = false;
    let s6 = h + 1;
    for k in 0..s6 {
        if k == s6 / 2 && !h.is_multiple_of(2) {
            zb = true;
        }
        g.bwd(1, zb);
        if k == s6 / 2 && h.is_multiple_of(2) {
            zb = true;
        }
        g.bwd(0, zb);
    }
    // Step 7: nWB0 (zero bubble).
    for _ in 0..outer {
        g.weight()?;
        g.bwd(0, true);
    }
    // Step 8: nW.
    for _ in 0..s6 {
        g.weight()?;
    }
    if !g.w_queue.is_empty() {
        return Err(ScheduleError::Internal(
            "DualPipe generator left W passes unscheduled",
        ));
    }
    Ok(g.ops)
}

struct DualGen {
    phase_dir: [usize; 2],
    next_f: [usize; 2],
    next_b: [usize; 2],
    /// Deferred weight passes, run first-in first-out (as DeepSeek's WeightGradStore).
    w_queue: VecDeque<Pass>,
    ops: Vec<Op>,
}

impl DualGen {
    fn take_f(&mut self, phase: usize) -> Pass {
        let mb = self.next_f[phase];
        self.next_f[phase] += 1;
        Pass::new(PassKind::F, mb, self.phase_dir[phase])
    }
    fn take_b(&mut self, phase: usize, zb: bool) -> Pass {
        let mb = self.next_b[phase];
        self.next_b[phase] += 1;
        let dir = self.phase_dir[phase];
        if zb {
            self.w_queue.push_back(Pass::new(PassKind::W, mb, dir));
            Pass::new(PassKind::I, mb, dir)
        } else {
            Pass::new(PassKind::B, mb, dir)
        }
    }
    fn fwd(&mut self, phase: usize) {
        let p = self.take_f(phase);
        self.ops.push(Op::single(p));
    }
    fn bwd(&mut self, phase: usize, zb: bool) {
        let p = self.take_b(phase, zb);
        self.ops.push(Op::single(p));
    }
    fn fwd_bwd(&mut self, fp: usize, bp: usize) {
        let a = self.take_f(fp);
        let c = self.take_b(bp, false);
        self.ops.push(Op::overlapped(a, c));
    }
    fn weight(&mut self) -> Result<(), ScheduleError> {
        let p = self.w_queue.pop_front().ok_or(ScheduleError::Internal(
            "W popped with no deferred backward",
        ))?;
        self.ops.push(Op::single(p));
        Ok(())
    }
}
