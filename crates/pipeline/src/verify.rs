//! The verifier: proves a [`Schedule`] is complete, respects data dependencies, cannot
//! deadlock, and measures its memory footprint.
//!
//! Communication model (the one the executor implements): sends are non-blocking (buffered),
//! receives block, and each rank runs its ops strictly in order. An op may start once every
//! pass in it has its inputs from *earlier* ops (passes overlapped in one op cannot feed each
//! other). Under this model the schedule is deadlock-free iff the in-order walk below reaches
//! the end of every rank.
//!
//! Memory accounting: one *activation* is what one stage keeps for one micro-batch between
//! its forward and the end of its backward. It is taken when an F starts and released when
//! the matching B (or, for a split backward, the W — the weight gradient needs the stored
//! input) finishes; within an overlapped op the forward allocates before the backward frees.
//! Parameters are counted in stage-sized slices (1/PP of the model for every method).

use crate::schedule::{PassKind, Schedule, StageRef};
use crate::ScheduleError;

/// What the verifier measured on a valid schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    /// Peak activations held per rank, in stage-activations.
    pub peak_activations: Vec<usize>,
    /// Parameter slices held per rank (1 = one pipeline stage; DualPipe holds 2).
    pub param_stages: Vec<usize>,
    /// Number of passes checked.
    pub passes: usize,
}

/// Dense index of (chain, mb, stage, kind-slot): slot 0 = F, 1 = B or I, 2 = W.
pub(crate) struct Index {
    mbs: usize,
    stages: usize,
}

impl Index {
    pub(crate) fn new(s: &Schedule) -> Self {
        Index {
            mbs: s.mbs_per_chain(),
            stages: s.num_stages(),
        }
    }
    pub(crate) fn len(&self, chains: usize) -> usize {
        chains * self.mbs * self.stages * 3
    }
    pub(crate) fn at(&self, r: StageRef, slot: usize) -> usize {
        ((r.chain * self.mbs + r.mb) * self.stages + r.stage) * 3 + slot
    }
}

pub(crate) fn slot(kind: PassKind) -> usize {
    match kind {
        PassKind::F => 0,
        PassKind::B | PassKind::I => 1,
        PassKind::W => 2,
    }
}

/// Resolve every pass to its stage, rejecting out-of-range `dir`/`mb` values.
pub(crate) fn resolve(s: &Schedule) -> Result<Vec<Vec<Vec<StageRef>>>, ScheduleError> {
    let mbs = s.mbs_per_chain();
    s.ranks
        .iter()
        .enumerate()
        .map(|(r, ops)| {
            ops.iter()
                .enumerate()
                .map(|(k, op)| {
                    if op.passes.is_empty() || op.passes.len() > 2 {
                        return Err(ScheduleError::Invalid(format!(
                            "rank {r} op {k} has {} passes (1 or 2 allowed)",
                            op.passes.len()
                        )));
                    }
                    if op.is_overlapped() {
                        let kinds = (op.passes[0].kind, op.passes[1].kind);
                        let ok = matches!(
                            kinds,
                            (PassKind::F, PassKind::B | PassKind::I)
                                | (PassKind::B | PassKind::I, PassKind::F)
                        );
                        if !ok {
                            return Err(ScheduleError::Invalid(format!(
                                "rank {r} op {k}: only a forward with a backward may overlap"
                            )));
                        }
                    }
                    op.passes
                        .iter()
                        .map(|p| {
                            let (chain, stage) = s.locate(r, p.dir).ok_or_else(|| {
                                ScheduleError::Invalid(format!(
                                    "rank {r} op {k}: dir {} does not name a stage of this rank",
                                    p.dir
                                ))
                            })?;
                            if p.mb >= mbs {
                                return Err(ScheduleError::Invalid(format!(
                                    "rank {r} op {k}: micro-batch {} out of range (< {mbs})",
                                    p.mb
                                )));
                            }
                            Ok(StageRef {
                                chain,
                                mb: p.mb,
                                stage,
                            })
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The producers a pass needs before it can start: (slot index, description).
pub(crate) fn deps(s: &Schedule, r: StageRef, kind: PassKind, idx: &Index) -> Vec<usize> {
    let last = s.num_stages() - 1;
    let mut d = Vec::with_capacity(2);
    match kind {
        PassKind::F => {
            if r.stage > 0 {
                d.push(idx.at(
                    StageRef {
                        stage: r.stage - 1,
                        ..r
                    },
                    0,
                ));
            }
        }
        PassKind::B | PassKind::I => {
            d.push(idx.at(r, 0));
            if r.stage < last {
                d.push(idx.at(
                    StageRef {
                        stage: r.stage + 1,
                        ..r
                    },
                    1,
                ));
            }
        }
        PassKind::W => d.push(idx.at(r, 1)),
    }
    d
}

fn describe(s: &Schedule, i: usize, idx: &Index) -> String {
    let slot = i % 3;
    let stage = (i / 3) % idx.stages;
    let mb = (i / 3 / idx.stages) % idx.mbs;
    let chain = i / 3 / idx.stages / idx.mbs;
    let k = ["F", "B/I", "W"][slot];
    let rank = s.rank_of(chain, stage);
    format!("{k}(mb {mb}, chain {chain}, stage {stage}) on rank {rank}")
}

/// Check `s` and measure it. Errors name the first violated rule.
pub fn verify(s: &Schedule) -> Result<VerifyReport, ScheduleError> {
    if s.ranks.is_empty() {
        return Err(ScheduleError::Invalid("schedule has no ranks".into()));
    }
    let refs = resolve(s)?;
    let idx = Index::new(s);
    let seen = coverage(s, &refs, &idx)?;
    check_complete(s, &seen, &idx)?;
    check_same_rank_order(s, &refs, &seen, &idx)?;
    check_deadlock_free(s, &refs, &idx)?;
    let (peak_activations, param_stages) = memory(s);
    Ok(VerifyReport {
        peak_activations,
        param_stages,
        passes: s.num_passes(),
    })
}

/// Resolved stages of every pass: rank -> op -> pass.
type Refs = [Vec<Vec<StageRef>>];
/// Which kind filled each slot, and where: (kind, rank, op).
type Seen = Vec<Option<(PassKind, usize, usize)>>;

/// Where each (chain, mb, stage, slot) runs; a slot filled twice is an error.
fn coverage(s: &Schedule, refs: &Refs, idx: &Index) -> Result<Seen, ScheduleError> {
    let mut seen: Seen = vec![None; idx.len(s.num_chains())];
    for (r, ops) in s.ranks.iter().enumerate() {
        for (k, op) in ops.iter().enumerate() {
            for (p, sr) in op.passes.iter().zip(&refs[r][k]) {
                let i = idx.at(*sr, slot(p.kind));
                if let Some((prev, pr, pk)) = seen[i] {
                    return Err(ScheduleError::Invalid(format!(
                        "{} appears twice: {:?} at rank {pr} op {pk} and {:?} at rank {r} op {k}",
                        describe(s, i, idx),
                        prev,
                        p.kind
                    )));
                }
                seen[i] = Some((p.kind, r, k));
            }
        }
    }
    Ok(seen)
}

/// Every F and B/I present; W exactly when the backward was split (I), never after a full B.
fn check_complete(s: &Schedule, seen: &Seen, idx: &Index) -> Result<(), ScheduleError> {
    let invalid = |i: usize, what: &str| {
        Err(ScheduleError::Invalid(format!(
            "{} {what}",
            describe(s, i, idx)
        )))
    };
    for base in (0..seen.len()).step_by(3) {
        let (fw, bw, wg) = (seen[base], seen[base + 1], seen[base + 2]);
        if fw.is_none() {
            return invalid(base, "is missing");
        }
        match (bw.map(|x| x.0), wg.is_some()) {
            (None, _) => return invalid(base + 1, "is missing"),
            (Some(PassKind::B), true) => {
                return invalid(
                    base + 2,
                    "follows a full backward B, which already computed weight gradients",
                )
            }
            (Some(PassKind::I), false) => {
                return invalid(
                    base + 2,
                    "is missing (its I ran, weight gradients never computed)",
                )
            }
            _ => {}
        }
    }
    Ok(())
}

/// Same-rank dependencies are order constraints: report them as such, not as deadlock.
fn check_same_rank_order(
    s: &Schedule,
    refs: &Refs,
    seen: &Seen,
    idx: &Index,
) -> Result<(), ScheduleError> {
    for (r, ops) in s.ranks.iter().enumerate() {
        for (k, op) in ops.iter().enumerate() {
            for (p, sr) in op.passes.iter().zip(&refs[r][k]) {
                for d in deps(s, *sr, p.kind, idx) {
                    let (_, dr, dk) = seen[d].expect("coverage checked");
                    if dr == r && dk >= k {
                        return Err(ScheduleError::Invalid(format!(
                            "rank {r} op {k}: {:?}(mb {}, dir {}) needs {} which runs later or in the same op",
                            p.kind,
                            p.mb,
                            p.dir,
                            describe(s, d, idx)
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Deadlock freedom: walk all ranks in order with blocking receives until every rank ends or
/// none can move.
fn check_deadlock_free(s: &Schedule, refs: &Refs, idx: &Index) -> Result<(), ScheduleError> {
    let mut done = vec![false; idx.len(s.num_chains())];
    let mut pc = vec![0usize; s.ranks.len()];
    let ready = |done: &[bool], r: usize, k: usize| {
        s.ranks[r][k]
            .passes
            .iter()
            .zip(&refs[r][k])
            .all(|(p, sr)| deps(s, *sr, p.kind, idx).iter().all(|&d| done[d]))
    };
    loop {
        let mut progress = false;
        for (r, ops) in s.ranks.iter().enumerate() {
            while pc[r] < ops.len() && ready(&done, r, pc[r]) {
                let k = pc[r];
                for (p, sr) in ops[k].passes.iter().zip(&refs[r][k]) {
                    done[idx.at(*sr, slot(p.kind))] = true;
                }
                pc[r] += 1;
                progress = true;
            }
        }
        let Some(r) = (0..s.ranks.len()).find(|&r| pc[r] < s.ranks[r].len()) else {
            return Ok(());
        };
        if !progress {
            return Err(blocked(s, refs, idx, &done, (r, pc[r])));
        }
    }
}

/// The deadlock report for rank `r` stuck at op `k`: what it waits for.
fn blocked(
    s: &Schedule,
    refs: &Refs,
    idx: &Index,
    done: &[bool],
    (r, k): (usize, usize),
) -> ScheduleError {
    let waits: Vec<String> = s.ranks[r][k]
        .passes
        .iter()
        .zip(&refs[r][k])
        .flat_map(|(p, sr)| deps(s, *sr, p.kind, idx))
        .filter(|d| !done[*d])
        .map(|d| describe(s, d, idx))
        .collect();
    ScheduleError::Deadlock(format!(
        "rank {r} blocks at op {k} waiting for {}",
        waits.join(", ")
    ))
}

/// Peak activations and parameter slices per rank (the module doc's accounting).
fn memory(s: &Schedule) -> (Vec<usize>, Vec<usize>) {
    let mut peak_activations = Vec::with_capacity(s.ranks.len());
    let mut param_stages = Vec::with_capacity(s.ranks.len());
    for ops in &s.ranks {
        let (mut live, mut peak) = (0usize, 0usize);
        let mut dirs = std::collections::BTreeSet::new();
        for op in ops {
            for p in &op.passes {
                dirs.insert(p.dir);
                if p.kind == PassKind::F {
                    live += 1;
                }
            }
            peak = peak.max(live);
            for p in &op.passes {
                if matches!(p.kind, PassKind::B | PassKind::W) {
                    live -= 1;
                }
            }
        }
        peak_activations.push(peak);
        param_stages.push(dirs.len());
    }
    (peak_activations, param_stages)
}
