//! Typed errors of the crate.

use crate::schedule::Method;
use thiserror::Error;

/// Why a schedule could not be generated, checked, timed or executed.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ScheduleError {
    #[error("unknown method '{0}' (expected one of: 1f1b, zb1p, dualpipe, dualpipev)")]
    UnknownMethod(String),
    #[error("{method} cannot serve this request: {rule}")]
    Unsupported { method: Method, rule: String },
    #[error("invalid costs: {0}")]
    BadCosts(String),
    #[error("invalid schedule: {0}")]
    Invalid(String),
    #[error("schedule deadlocks: {0}")]
    Deadlock(String),
    #[error("executor failed: {0}")]
    Exec(String),
    #[error("internal generator error: {0}")]
    Internal(&'static str),
}
