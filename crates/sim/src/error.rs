//! Typed errors of the simulator: configuration refusals (naming the field and the rule) and
//! simulation failures (a configuration that is valid but cannot complete a step).

use thiserror::Error;

/// Everything the simulator can refuse or fail with. Never a panic, never a nonsense number.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SimError {
    /// A configuration value breaks a rule. `field` is the dotted path (`parallelism.ep`).
    #[error("invalid configuration: `{field}`: {rule}")]
    Config { field: String, rule: String },
    /// The configuration file could not be read or parsed (missing field, wrong type, ...).
    #[error("cannot parse configuration {source_name}: {message}")]
    Parse {
        source_name: String,
        message: String,
    },
    /// Unknown preset name (not a path either).
    #[error("unknown preset `{0}` (presets: v3, h200-node, v3-serve; or a .toml/.json file)")]
    UnknownPreset(String),
    /// A configuration or profile file that does not exist.
    #[error("configuration file `{0}` not found")]
    FileNotFound(String),
    /// The step cannot complete: e.g. zero SMs for communication while tokens must cross GPUs.
    #[error("step cannot complete: {0}")]
    CannotComplete(String),
    /// The pipeline timeline got stuck (a schedule whose dependencies cannot be satisfied).
    #[error("pipeline schedule deadlocked: {0}")]
    Deadlock(String),
    /// A sweep specification such as `comm-sms=0..40` is malformed.
    #[error("bad sweep `{spec}`: {rule}")]
    Sweep { spec: String, rule: String },
    /// Writing an output file failed.
    #[error("cannot write {path}: {message}")]
    Io { path: String, message: String },
}

impl SimError {
    pub(crate) fn config(field: &str, rule: impl Into<String>) -> Self {
        SimError::Config {
            field: field.to_string(),
            rule: rule.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, SimError>;
