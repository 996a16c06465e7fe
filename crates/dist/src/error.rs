//! The crate's one error type. Every variant names what was wrong (the variable, the rank,
//! the field, the address) so a failed multi-process job says why in one line.

use std::time::Duration;

/// A field that differs between two ranks' configurations (see [`DistError::ConfigMismatch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDiff {
    /// The rank whose value differs from rank 0's.
    pub rank: usize,
    /// Dotted path of the field (`version`, `config.hidden`, `config.layers[1].experts`).
    pub field: String,
    /// The value on `rank` (JSON text; `<absent>` when the field is missing there).
    pub value: String,
    /// The value on rank 0.
    pub rank0_value: String,
}

impl std::fmt::Display for FieldDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} has `{}` = {} where rank 0 has {}",
            self.rank, self.field, self.value, self.rank0_value
        )
    }
}

fn list_diffs(d: &[FieldDiff]) -> String {
    const SHOWN: usize = 8;
    let mut s: Vec<String> = d.iter().take(SHOWN).map(|x| x.to_string()).collect();
    if d.len() > SHOWN {
        s.push(format!("and {} more", d.len() - SHOWN));
    }
    s.join("; ")
}

fn list_ranks(r: &[usize]) -> String {
    let s: Vec<String> = r.iter().map(|x| x.to_string()).collect();
    s.join(", ")
}

/// Errors of bootstrap, the store, liveness and the launcher.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A launcher variable is missing.
    #[error("environment variable {var} is not set ({hint})")]
    MissingVar {
        var: &'static str,
        hint: &'static str,
    },
    /// A launcher variable has a value that cannot be used.
    #[error("environment variable {var}={value:?} is invalid: {reason}")]
    BadVar {
        var: String,
        value: String,
        reason: String,
    },
    /// A builder or launcher option that cannot be used.
    #[error("invalid {field}: {reason}")]
    BadOption { field: &'static str, reason: String },
    /// MASTER_ADDR:MASTER_PORT does not resolve to an address.
    #[error("cannot resolve MASTER_ADDR:MASTER_PORT {addr}: {reason}")]
    Resolve { addr: String, reason: String },
    /// Rank 0 cannot listen on MASTER_ADDR:MASTER_PORT (typically: the port is in use).
    #[error("rank 0 cannot listen on MASTER_ADDR:MASTER_PORT {addr}: {source} (is another job using the port? choose another MASTER_PORT)")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// No store answered at MASTER_ADDR:MASTER_PORT within the bootstrap timeout.
    #[error("rank {rank}: no rendezvous store at MASTER_ADDR:MASTER_PORT {addr} after {waited:?} (bootstrap timeout; last error: {last_error})")]
    MasterUnreachable {
        rank: usize,
        addr: String,
        waited: Duration,
        last_error: String,
    },
    /// Some ranks did not join within the bootstrap timeout.
    #[error("bootstrap timed out after {waited:?}: rank(s) {} never joined (raise PTXFORGE_BOOTSTRAP_TIMEOUT if they start late)", list_ranks(missing))]
    BootstrapTimeout {
        waited: Duration,
        missing: Vec<usize>,
    },
    /// The store refused this rank (another job on the port, a rank taken twice, sizes differ).
    #[error("rendezvous store at {addr} refused rank {rank}: {reason}")]
    Rejected {
        rank: usize,
        addr: String,
        reason: String,
    },
    /// The ranks' fingerprints (version + caller config) differ.
    #[error("configuration differs between ranks: {}", list_diffs(diffs))]
    ConfigMismatch { diffs: Vec<FieldDiff> },
    /// A peer rank died (its connection closed or its heartbeat stopped).
    #[error("rank {rank} died during `{op}` (peer lost; the job cannot continue)")]
    PeerDied { rank: usize, op: String },
    /// A mesh peer's connection ended without a goodbye (it died, reset, or sent a bad frame).
    #[error("rank {rank}: connection lost ({reason}; the job cannot continue)")]
    PeerLost { rank: usize, reason: String },
    /// A mesh frame over the size limit.
    #[error("mesh frame of {bytes} bytes exceeds the {limit}-byte limit")]
    FrameTooLarge { bytes: usize, limit: usize },
    /// A mesh peer answered the handshake with a refusal.
    #[error("mesh peer rank {peer} at {addr} refused the connection: {reason}")]
    MeshRefused {
        peer: usize,
        addr: String,
        reason: String,
    },
    /// A mesh peer's listener did not answer within the bootstrap timeout.
    #[error("cannot connect to mesh peer rank {peer} at {addr} after {waited:?} (bootstrap timeout; last error: {last_error})")]
    MeshConnect {
        peer: usize,
        addr: String,
        waited: Duration,
        last_error: String,
    },
    /// Lower ranks did not connect to this rank's mesh listener within the bootstrap timeout.
    #[error("rank {rank}: mesh connection(s) from rank(s) {} not made after {waited:?} (bootstrap timeout)", list_ranks(missing))]
    MeshTimeout {
        rank: usize,
        waited: Duration,
        missing: Vec<usize>,
    },
    /// A `wait` on a key timed out.
    #[error("timed out after {waited:?} waiting for key `{key}`")]
    WaitTimeout { key: String, waited: Duration },
    /// A message on the wire could not be read or written.
    #[error("rendezvous protocol error: {0}")]
    Protocol(String),
    /// An I/O error talking to the store.
    #[error("rendezvous connection: {0}")]
    Io(#[from] std::io::Error),
    /// The launcher could not start a rank's command.
    #[error("cannot start rank {rank} (`{cmd}`): {source}")]
    Spawn {
        rank: usize,
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    /// The launched job failed: a rank exited non-zero or by a signal, or the launcher was
    /// interrupted.
    #[error("{0}")]
    JobFailed(String),
}

/// Shorthand for the crate's results.
pub type Result<T, E = DistError> = std::result::Result<T, E>;
