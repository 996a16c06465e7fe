//! # pipeline — pipeline-parallel schedules as first-class objects
//!
//! This crate owns pipeline schedules: their model ([`Schedule`]), their generation
//! ([`mod@generate`]: 1F1B, ZB1P, DualPipe, DualPipeV), their verification ([`mod@verify`]), their
//! timing ([`simulate`], [`bubble_formula`]), drawing (SVG, PNG, Chrome trace) and a real
//! multi-threaded executor that trains a small MLP with them.
//!
//! Stable API (used by `crates/sim` and the CLI):
//! * `Method: FromStr` — `"1f1b"`, `"zb1p"`, `"dualpipe"`, `"dualpipev"`.
//! * `generate(method, pp, chunks) -> Result<Schedule, ScheduleError>`.
//! * `verify(&Schedule) -> Result<VerifyReport, ScheduleError>`.
//! * `simulate(&Schedule, &Costs) -> Result<Timeline, ScheduleError>`; `Timeline` has
//!   per-rank `busy`/`idle`, `makespan`, per-op `times`.
//! * `bubble_formula(method, pp, &Costs) -> f64` and `bubble_formula_text(method)`.
//!
//! See docs/PIPELINE.md for the exact definition of the bubble and the regime in which the
//! simulated bubble equals the closed form.

pub mod draw;
pub mod error;
pub mod exec;
pub mod generate;
pub mod limits;
pub mod report;
pub mod schedule;
pub mod timing;
pub mod verify;

pub use error::ScheduleError;
pub use exec::{
    check_against_reference, execute, reference_step, ExecCheck, ExecConfig, StepResult,
};
pub use generate::{check_request, generate};
pub use report::{sweep, Report, SweepRow, TimedOp};
pub use schedule::{Layout, Method, Op, Pass, PassKind, Schedule, StageRef};
pub use timing::{bubble_formula, bubble_formula_text, simulate, Costs, Timeline};
pub use verify::{verify, VerifyReport};
