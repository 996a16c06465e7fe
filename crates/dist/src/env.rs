//! The rank environment: which process this is in the job, read from the variables a launcher
//! sets. Two conventions are accepted:
//!
//! - torchrun's (and `ptxforge launch`'s): `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!   `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`;
//! - Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
//!   `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE`, with `MASTER_ADDR` /
//!   `MASTER_PORT` when set and [`DEFAULT_MASTER_ADDR`] / [`DEFAULT_MASTER_PORT`] otherwise.
//!
//! Ranks are laid out node by node: node index = rank / LOCAL_WORLD_SIZE, and
//! LOCAL_RANK = rank % LOCAL_WORLD_SIZE (checked). `PTXFORGE_JOB_ID` names the job's
//! shared-memory segments (`/dev/shm/ptxforge-{job}-...`); without it the id is derived from
//! MASTER_ADDR and MASTER_PORT, which every rank of a job shares. `PTXFORGE_BOOTSTRAP_TIMEOUT`
//! and `PTXFORGE_PEER_TIMEOUT` (seconds) set the timeouts.

use crate::error::{DistError, Result};
use std::collections::HashMap;
use std::time::Duration;

/// MASTER_ADDR when an MPI launcher does not set it.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
/// MASTER_PORT when an MPI launcher does not set it (torchrun's default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// How long ranks wait for each other at bootstrap unless told otherwise.
pub const DEFAULT_BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a silent peer is given before it is declared dead unless told otherwise.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// One rank's place in the job, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// Names the job's shared-memory segments: `/dev/shm/ptxforge-{job_id}-...`.
    pub job_id: String,
    pub bootstrap_timeout: Duration,
    pub peer_timeout: Duration,
}

/// The variable names of one launcher convention.
struct Names {
    rank: &'static str,
    world: &'static str,
    local_rank: &'static str,
    local_world: &'static str,
}

const TORCHRUN: Names = Names {
    rank: "RANK",
    world: "WORLD_SIZE",
    local_rank: "LOCAL_RANK",
    local_world: "LOCAL_WORLD_SIZE",
};

const OMPI: Names = Names {
    rank: "OMPI_COMM_WORLD_RANK",
    world: "OMPI_COMM_WORLD_SIZE",
    local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
    local_world: "OMPI_COMM_WORLD_LOCAL_SIZE",
};

const HINT: &str = "start the job with `ptxforge launch`, torchrun or mpirun";

impl DistEnv {
    /// Reads the process environment; an error names the variable and its bad value.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(std::env::vars())
    }

    /// Like [`from_env`](Self::from_env) over the given variables; `None` when neither
    /// `RANK` nor `OMPI_COMM_WORLD_RANK` is set (the process was not started as a rank).
    pub fn detect<I: IntoIterator<Item = (String, String)>>(vars: I) -> Result<Option<Self>> {
        let v: HashMap<String, String> = vars.into_iter().collect();
        if !v.contains_key(TORCHRUN.rank) && !v.contains_key(OMPI.rank) {
            return Ok(None);
        }
        Self::parse(&v).map(Some)
    }

    /// Reads the given variables (for tests and embedding); errors as [`from_env`](Self::from_env).
    pub fn from_vars<I: IntoIterator<Item = (String, String)>>(vars: I) -> Result<Self> {
        let v: HashMap<String, String> = vars.into_iter().collect();
        Self::parse(&v)
    }

    fn parse(v: &HashMap<String, String>) -> Result<Self> {
        let (names, mpi) = if v.contains_key(TORCHRUN.rank) {
            (&TORCHRUN, false)
        } else if v.contains_key(OMPI.rank) {
            (&OMPI, true)
        } else {
            return Err(DistError::MissingVar {
                var: "RANK",
                hint: "neither RANK nor OMPI_COMM_WORLD_RANK is set; start the job with `ptxforge launch`, torchrun or mpirun",
            });
        };
        let world_size = count(v, names.world)?;
        let rank = index(v, names.rank, names.world, world_size)?;
        let local_world_size = count(v, names.local_world)?;
        let local_rank = index(v, names.local_rank, names.local_world, local_world_size)?;
        check_layout(names, rank, world_size, local_rank, local_world_size)?;
        let (master_addr, master_port) = master(v, mpi)?;
        let job_id = match v.get("PTXFORGE_JOB_ID") {
            Some(j) => check_job_id(j)?,
            None => derived_job_id(&master_addr, master_port),
        };
        Ok(DistEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            job_id,
            bootstrap_timeout: seconds(v, "PTXFORGE_BOOTSTRAP_TIMEOUT", DEFAULT_BOOTSTRAP_TIMEOUT)?,
            peer_timeout: seconds(v, "PTXFORGE_PEER_TIMEOUT", DEFAULT_PEER_TIMEOUT)?,
        })
    }

    /// This rank's node: rank / LOCAL_WORLD_SIZE.
    pub fn node(&self) -> usize {
        self.rank / self.local_world_size
    }

    /// Number of nodes: WORLD_SIZE / LOCAL_WORLD_SIZE.
    pub fn nodes(&self) -> usize {
        self.world_size / self.local_world_size
    }

    /// `MASTER_ADDR:MASTER_PORT` as text (IPv6 addresses bracketed).
    pub fn master(&self) -> String {
        if self.master_addr.contains(':') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

fn bad(var: &str, value: &str, reason: impl Into<String>) -> DistError {
    DistError::BadVar {
        var: var.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn required<'a>(v: &'a HashMap<String, String>, var: &'static str) -> Result<&'a str> {
    v.get(var)
        .map(|s| s.as_str())
        .ok_or(DistError::MissingVar { var, hint: HINT })
}

/// A size variable: an integer >= 1.
fn count(v: &HashMap<String, String>, var: &'static str) -> Result<usize> {
    let s = required(v, var)?;
    match s.trim().parse::<usize>() {
        Ok(0) => Err(bad(var, s, "must be at least 1")),
        Ok(n) if n > 1 << 20 => Err(bad(var, s, "larger than 1048576 ranks")),
        Ok(n) => Ok(n),
        Err(_) => Err(bad(var, s, "not a non-negative integer")),
    }
}

/// An index variable: an integer below the size variable `of`.
fn index(v: &HashMap<String, String>, var: &'static str, of: &str, size: usize) -> Result<usize> {
    let s = required(v, var)?;
    let i: usize = s
        .trim()
        .parse()
        .map_err(|_| bad(var, s, "not a non-negative integer"))?;
    if i >= size {
        return Err(bad(var, s, format!("must be below {of}={size}")));
    }
    Ok(i)
}

fn check_layout(n: &Names, rank: usize, world: usize, local: usize, lws: usize) -> Result<()> {
    if lws > world || !world.is_multiple_of(lws) {
        return Err(bad(
            n.local_world,
            &lws.to_string(),
            format!(
                "must divide {}={world} (every node runs the same number of ranks)",
                n.world
            ),
        ));
    }
    if local != rank % lws {
        return Err(bad(
            n.local_rank,
            &local.to_string(),
            format!(
                "must equal {}={rank} mod {}={lws} = {} (ranks are laid out node by node)",
                n.rank,
                n.local_world,
                rank % lws
            ),
        ));
    }
    Ok(())
}

fn master(v: &HashMap<String, String>, mpi: bool) -> Result<(String, u16)> {
    let addr = match (v.get("MASTER_ADDR"), mpi) {
        (Some(a), _) => a.trim().to_string(),
        (None, true) => DEFAULT_MASTER_ADDR.to_string(),
        (None, false) => required(v, "MASTER_ADDR")?.to_string(),
    };
    if addr.is_empty() || addr.contains(char::is_whitespace) {
        return Err(bad(
            "MASTER_ADDR",
            &addr,
            "must be a host name or IP address",
        ));
    }
    let port = match v.get("MASTER_PORT") {
        None if mpi => DEFAULT_MASTER_PORT,
        None => {
            return Err(DistError::MissingVar {
                var: "MASTER_PORT",
                hint: HINT,
            })
        }
        Some(p) => p
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad("MASTER_PORT", p, "must be a TCP port, 1..=65535"))?,
    };
    Ok((addr, port))
}

/// Longest job id: the emulator stores it in its 64-byte IPC handles
/// (`emu::memory::shm::MAX_JOB_ID`, which must stay equal).
pub const MAX_JOB_ID: usize = 40;

/// 1 to [`MAX_JOB_ID`] characters of `A-Za-z0-9_.` (ids name `/dev/shm/ptxforge-{job}-*`
/// segments, whose names use `-` as the separator).
pub fn valid_job_id(j: &str) -> bool {
    !j.is_empty()
        && j.len() <= MAX_JOB_ID
        && j.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

fn check_job_id(j: &str) -> Result<String> {
    if !valid_job_id(j) {
        return Err(bad(
            "PTXFORGE_JOB_ID",
            j,
            "must be 1 to 40 characters of A-Z, a-z, 0-9, `_` or `.` (it names /dev/shm/ptxforge-{job}-* segments)",
        ));
    }
    Ok(j.to_string())
}

/// The job id every rank derives alike when no launcher set one.
fn derived_job_id(addr: &str, port: u16) -> String {
    let a: String = addr
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(MAX_JOB_ID - 7) // room for `m` and `_{port}`
        .collect();
    format!("m{a}_{port}")
}

fn seconds(v: &HashMap<String, String>, var: &str, default: Duration) -> Result<Duration> {
    let Some(s) = v.get(var) else {
        return Ok(default);
    };
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| bad(var, s, "not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 || secs > 1e6 {
        return Err(bad(var, s, "must be above 0 and at most 1e6 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn torchrun(rank: &str) -> Vec<(String, String)> {
        vars(&[
            ("RANK", rank),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29511"),
        ])
    }

    #[test]
    fn torchrun_variables_give_the_layout() {
        let e = DistEnv::from_vars(torchrun("3")).unwrap();
        assert_eq!((e.rank, e.world_size, e.node(), e.nodes()), (3, 4, 1, 2));
        assert_eq!(e.job_id, "m127_0_0_1_29511");
        assert_eq!(e.peer_timeout, DEFAULT_PEER_TIMEOUT);
        assert_eq!(e.master(), "127.0.0.1:29511");
    }

    #[test]
    fn mpi_variables_with_default_master() {
        let e = DistEnv::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("PTXFORGE_PEER_TIMEOUT", "2.5"),
        ]))
        .unwrap();
        assert_eq!((e.rank, e.local_rank, e.node()), (2, 0, 1));
        assert_eq!(
            (e.master_addr.as_str(), e.master_port),
            ("127.0.0.1", 29500)
        );
        assert_eq!(e.peer_timeout, Duration::from_millis(2500));
        assert_eq!(DistEnv::detect(vars(&[("HOME", "/")])).unwrap(), None);
    }

    /// Each bad value gives an error naming its variable and the value.
    #[test]
    fn bad_values_name_the_variable_and_value() {
        let cases: &[(&str, &str)] = &[
            ("RANK", "4"),
            ("RANK", "-1"),
            ("WORLD_SIZE", "0"),
            ("LOCAL_WORLD_SIZE", "3"),
            ("LOCAL_RANK", "0"),
            ("MASTER_PORT", "70000"),
            ("MASTER_PORT", "0"),
            ("MASTER_ADDR", ""),
            ("PTXFORGE_JOB_ID", "a/b"),
            ("PTXFORGE_BOOTSTRAP_TIMEOUT", "-3"),
            ("PTXFORGE_PEER_TIMEOUT", "soon"),
        ];
        for (var, value) in cases {
            let mut v = torchrun("3");
            v.retain(|(k, _)| k != var);
            v.push((var.to_string(), value.to_string()));
            let e = DistEnv::from_vars(v).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(value), "{var}={value}: {e}");
        }
        let mut v = torchrun("1");
        v.retain(|(k, _)| k != "MASTER_PORT");
        let e = DistEnv::from_vars(v).unwrap_err().to_string();
        assert!(e.contains("MASTER_PORT is not set"), "{e}");
        let e = DistEnv::from_vars(vars(&[])).unwrap_err().to_string();
        assert!(e.contains("RANK"), "{e}");
    }
}
