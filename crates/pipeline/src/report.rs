//! The machine-readable report of one schedule (the CLI's `--json`), and parameter sweeps.
//!
//! The JSON layout is a contract (see docs/PIPELINE.md): `method`, `pp`, `chunks`, `costs`,
//! `ranks` (per device, per op: `passes`, `start`, `end`), `bubble` (per-rank idle),
//! `bubble_formula`, `peak_activations`, plus a few extras that never change meaning.

use serde::{Deserialize, Serialize};

use crate::exec::ExecCheck;
use crate::schedule::{Method, Pass, Schedule};
use crate::timing::{bubble_formula, bubble_formula_text, simulate, Costs, Timeline};
use crate::verify::verify;
use crate::{generate, ScheduleError};

/// One op with its simulated times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimedOp {
    pub passes: Vec<Pass>,
    pub start: f64,
    pub end: f64,
}

/// Everything known about one schedule under one set of costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub method: Method,
    pub pp: usize,
    pub chunks: usize,
    /// Devices (rows): PP, or PP/2 for DualPipeV.
    pub devices: usize,
    pub costs: Costs,
    pub ranks: Vec<Vec<TimedOp>>,
    /// Per-rank idle time: makespan minus the rank's busy time.
    pub bubble: Vec<f64>,
    /// Closed-form bubble of the method at these costs.
    pub bubble_formula: f64,
    /// The closed form as text, e.g. `(PP/2-1)(F&B+B-3W)`.
    pub bubble_formula_text: String,
    /// Largest per-rank bubble (the critical rank's), comparable to `bubble_formula`.
    pub bubble_max: f64,
    pub makespan: f64,
    pub busy: Vec<f64>,
    /// Peak in-flight activations per rank, in stage-activations.
    pub peak_activations: Vec<usize>,
    /// Parameter slices held per rank (1x = one stage).
    pub param_copies: Vec<usize>,
    /// Outcome of running the schedule for real, when requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execute: Option<ExecCheck>,
}

impl Report {
    /// Verify and time `s` under `costs`.
    pub fn new(s: &Schedule, costs: &Costs) -> Result<Report, ScheduleError> {
        let v = verify(s)?;
        let t = simulate(s, costs)?;
        Ok(Self::assemble(
            s,
            costs,
            &t,
            v.peak_activations,
            v.param_stages,
        ))
    }

    fn assemble(
        s: &Schedule,
        costs: &Costs,
        t: &Timeline,
        peak_activations: Vec<usize>,
        param_copies: Vec<usize>,
    ) -> Report {
        let ranks = s
            .ranks
            .iter()
            .zip(&t.times)
            .map(|(ops, times)| {
                ops.iter()
                    .zip(times)
                    .map(|(op, &(start, end))| TimedOp {
                        passes: op.passes.clone(),
                        start,
                        end,
                    })
                    .collect()
            })
            .collect();
        Report {
            method: s.method,
            pp: s.pp,
            chunks: s.chunks,
            devices: s.num_ranks(),
            costs: *costs,
            ranks,
            bubble: t.idle.clone(),
            bubble_formula: bubble_formula(s.method, s.pp, costs),
            bubble_formula_text: bubble_formula_text(s.method).to_string(),
            bubble_max: t.bubble(),
            makespan: t.makespan,
            busy: t.busy.clone(),
            peak_activations,
            param_copies,
            execute: None,
        }
    }

    /// The report as a JSON value (keys sorted; use [`Report::to_json_string`] for the
    /// documented field order).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("report is plain data")
    }

    /// Pretty JSON text in the documented field order.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(self).expect("report is plain data")
    }
}

/// One row of a sweep: a (PP, micro-batches) point, or the rule that refused it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    pub pp: usize,
    pub chunks: usize,
    /// `None` when the method cannot serve this point; `refused` then says why.
    pub makespan: Option<f64>,
    pub bubble_max: Option<f64>,
    pub bubble_formula: f64,
    pub peak_activations: Option<usize>,
    /// Fraction of device time idle: bubble / makespan on the critical rank.
    pub bubble_fraction: Option<f64>,
    pub refused: Option<String>,
}

/// Time `method` at every (pp, chunks) point; refused points are kept with their rule.
/// Costs are validated once up front: invalid costs fail the whole sweep.
pub fn sweep(
    method: Method,
    pps: &[usize],
    chunk_counts: &[usize],
    costs: &Costs,
) -> Result<Vec<SweepRow>, ScheduleError> {
    costs.validate()?;
    let mut rows = Vec::new();
    for &pp in pps {
        for &chunks in chunk_counts {
            let formula = bubble_formula(method, pp, costs);
            let row = match generate(method, pp, chunks).and_then(|s| Report::new(&s, costs)) {
                Ok(r) => SweepRow {
                    pp,
                    chunks,
                    makespan: Some(r.makespan),
                    bubble_max: Some(r.bubble_max),
                    bubble_formula: formula,
                    peak_activations: r.peak_activations.iter().copied().max(),
                    bubble_fraction: Some(r.bubble_max / r.makespan),
                    refused: None,
                },
                Err(e) => SweepRow {
                    pp,
                    chunks,
                    makespan: None,
                    bubble_max: None,
                    bubble_formula: formula,
                    peak_activations: None,
                    bubble_fraction: None,
                    refused: Some(e.to_string()),
                },
            };
            rows.push(row);
        }
    }
    Ok(rows)
}
