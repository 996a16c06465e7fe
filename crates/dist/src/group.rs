//! Bootstrap and the process group. [`Bootstrap`] reads the rank environment, takes options
//! (timeouts, the config to check, the fault action and hook) and [`Bootstrap::connect`]s:
//! rank 0 starts the store, every rank joins it (waiting for late ranks up to the bootstrap
//! timeout), starts its watchdog, and all ranks check each other's fingerprints. The
//! resulting [`Group`] offers the store (`set`/`get`/`wait`), collectives (`barrier`,
//! `all_gather`) and `set_op`, and ends with [`Group::finish`].

use crate::client;
use crate::env::DistEnv;
use crate::error::{DistError, Result};
use crate::fingerprint;
use crate::server::Server;
use crate::watchdog::{self, DeathHook, FaultAction, Liveness, Watch};
use crate::wire::{Kind, Reply, Request};
use serde::Serialize;
use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Heartbeats are sent this often at most (and at least four times per peer timeout).
const MAX_HEARTBEAT: Duration = Duration::from_secs(1);
/// Names the operation of a rank that announced none after bootstrap.
const RUNNING: &str = "running (no operation announced)";

/// Bootstrap options; [`connect`](Self::connect) joins the job.
pub struct Bootstrap {
    env: DistEnv,
    config: serde_json::Value,
    action: FaultAction,
    hook: Option<DeathHook>,
}

impl Bootstrap {
    /// From the process environment (see [`crate::env`]).
    pub fn from_env() -> Result<Self> {
        Ok(Self::new(DistEnv::from_env()?))
    }

    /// From an environment read elsewhere.
    pub fn new(env: DistEnv) -> Self {
        Bootstrap {
            env,
            config: serde_json::Value::Null,
            action: FaultAction::Exit,
            hook: None,
        }
    }

    /// How long ranks wait for each other at bootstrap (overrides PTXFORGE_BOOTSTRAP_TIMEOUT).
    pub fn bootstrap_timeout(mut self, t: Duration) -> Result<Self> {
        self.env.bootstrap_timeout = positive("bootstrap_timeout", t)?;
        Ok(self)
    }

    /// How long a silent peer lives (overrides PTXFORGE_PEER_TIMEOUT).
    pub fn peer_timeout(mut self, t: Duration) -> Result<Self> {
        self.env.peer_timeout = positive("peer_timeout", t)?;
        Ok(self)
    }

    /// The configuration every rank must agree on (checked at bootstrap with the version).
    pub fn config<T: Serialize>(mut self, config: &T) -> Result<Self> {
        self.config = serde_json::to_value(config).map_err(|e| DistError::BadOption {
            field: "config",
            reason: format!("not serialisable as JSON: {e}"),
        })?;
        Ok(self)
    }

    /// What the watchdog does on a peer's death (default [`FaultAction::Exit`]).
    pub fn fault_action(mut self, a: FaultAction) -> Self {
        self.action = a;
        self
    }

    /// Runs `f` before the watchdog acts on a peer's death.
    pub fn on_peer_death(mut self, f: impl Fn(&DistError) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(f));
        self
    }

    /// The environment as configured.
    pub fn env(&self) -> &DistEnv {
        &self.env
    }

    /// Joins the job: store, watchdog, config check. Errors are the same on every rank for a
    /// config mismatch; a rank that never comes is named in [`DistError::BootstrapTimeout`].
    pub fn connect(self) -> Result<Group> {
        let env = self.env;
        check_env(&env)?;
        let deadline = Instant::now() + env.bootstrap_timeout;
        let server = match env.rank {
            0 => Some(Arc::new(Server::start(&env)?)),
            _ => None,
        };
        let store = client::connect(&env, Kind::Store, deadline)?;
        let hb = client::connect(&env, Kind::Heartbeat, deadline)?;
        hb.set_read_timeout(Some(env.peer_timeout))?;
        let live = Arc::new(Liveness::new("bootstrap"));
        let watch = Watch {
            rank: env.rank,
            node: env.node(),
            interval: (env.peer_timeout / 4).min(MAX_HEARTBEAT),
            peer_timeout: env.peer_timeout,
            action: self.action,
            hook: self.hook,
            server: server.clone(),
        };
        let l = live.clone();
        let watchdog = std::thread::Builder::new()
            .name("dist-watchdog".into())
            .spawn(move || watchdog::run(hb, l, watch))?;
        let mut group = Group {
            env,
            store: Mutex::new(store),
            live,
            watchdog: Some(watchdog),
            server,
            counters: Mutex::new(HashMap::new()),
        };
        if let Err(e) = group.check_config(&self.config, deadline) {
            // every rank knows this error: leave cleanly, so nobody reports a death
            group.leave(true);
            return Err(e);
        }
        group.live.set_op(RUNNING);
        Ok(group)
    }
}

/// Longest timeout accepted (as for the environment variables).
const MAX_TIMEOUT: Duration = Duration::from_secs(1_000_000);

fn positive(field: &'static str, t: Duration) -> Result<Duration> {
    if t.is_zero() || t > MAX_TIMEOUT {
        return Err(DistError::BadOption {
            field,
            reason: format!("{t:?} must be above zero and at most 1e6 s"),
        });
    }
    Ok(t)
}

/// Checks an environment built by hand (its fields are public) as `DistEnv::from_vars` would.
fn check_env(e: &DistEnv) -> Result<()> {
    let bad = |field, reason: String| Err(DistError::BadOption { field, reason });
    if e.world_size == 0 || e.rank >= e.world_size {
        return bad("rank", format!("{} of world size {}", e.rank, e.world_size));
    }
    if e.local_world_size == 0
        || e.local_world_size > e.world_size
        || !e.world_size.is_multiple_of(e.local_world_size)
        || e.local_rank != e.rank % e.local_world_size
    {
        return bad(
            "local_rank",
            format!(
                "local rank {} of {} does not fit rank {} of {}",
                e.local_rank, e.local_world_size, e.rank, e.world_size
            ),
        );
    }
    positive("bootstrap_timeout", e.bootstrap_timeout)?;
    positive("peer_timeout", e.peer_timeout)?;
    Ok(())
}

/// A joined job: this rank's view of the process group.
pub struct Group {
    env: DistEnv,
    store: Mutex<TcpStream>,
    live: Arc<Liveness>,
    watchdog: Option<JoinHandle<()>>,
    server: Option<Arc<Server>>,
    /// Per-name call counts, so repeated collectives of one name get distinct keys.
    counters: Mutex<HashMap<String, u64>>,
}

impl Group {
    pub fn env(&self) -> &DistEnv {
        &self.env
    }
    pub fn rank(&self) -> usize {
        self.env.rank
    }
    pub fn world_size(&self) -> usize {
        self.env.world_size
    }
    pub fn local_rank(&self) -> usize {
        self.env.local_rank
    }
    pub fn local_world_size(&self) -> usize {
        self.env.local_world_size
    }
    pub fn node(&self) -> usize {
        self.env.node()
    }
    pub fn job_id(&self) -> &str {
        &self.env.job_id
    }

    /// This rank's end of its store connection: the interface (and address family) that
    /// reaches MASTER_ADDR, where the mesh listens.
    pub(crate) fn local_addr(&self) -> Result<std::net::SocketAddr> {
        Ok(self.lock_store().local_addr()?)
    }

    fn check_config(&self, config: &serde_json::Value, deadline: Instant) -> Result<()> {
        let fp = serde_json::to_vec(&fingerprint::fingerprint(config))
            .map_err(|e| DistError::Protocol(e.to_string()))?;
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = (left.as_millis() as u64).max(1);
        match self.call(Request::Gather {
            name: "ptxforge.fingerprint".into(),
            value: fp,
            timeout_ms: ms,
        })? {
            Reply::Gathered { values } => fingerprint::check(&values),
            Reply::Timeout { missing } => Err(DistError::BootstrapTimeout {
                waited: self.env.bootstrap_timeout,
                missing,
            }),
            other => Err(unexpected(other)),
        }
    }

    fn lock_store(&self) -> MutexGuard<'_, TcpStream> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One request to the store; a death (announced or the store's own) becomes PeerDied.
    fn call(&self, req: Request) -> Result<Reply> {
        if let Some(e) = self.live.error() {
            return Err(e);
        }
        let mut s = self.lock_store();
        match client::request(&mut s, &req) {
            Ok(Some(Reply::Dead { rank, op })) => Err(self.live.died(rank, &op)),
            Ok(Some(Reply::Rejected { reason })) => Err(DistError::Protocol(reason)),
            Ok(Some(r)) => Ok(r),
            Ok(None) | Err(DistError::Io(_)) => Err(self.live.store_lost()),
            Err(e) => Err(e),
        }
    }

    /// Stores `value` under `key` (visible to every rank).
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let key = format!("u/{key}");
        match self.call(Request::Set {
            key,
            value: value.to_vec(),
        })? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// The value under `key`, if any rank set it.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let key = format!("u/{key}");
        match self.call(Request::Get { key })? {
            Reply::Value { value } => Ok(value),
            other => Err(unexpected(other)),
        }
    }

    /// Blocks until some rank sets `key` (or `timeout`, or a peer's death).
    pub fn wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let req = Request::Wait {
            key: format!("u/{key}"),
            timeout_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
        };
        match self.call(req)? {
            Reply::Value { value: Some(v) } => Ok(v),
            Reply::Timeout { .. } | Reply::Value { value: None } => Err(DistError::WaitTimeout {
                key: key.to_string(),
                waited: timeout,
            }),
            other => Err(unexpected(other)),
        }
    }

    fn next_name(&self, kind: &str, name: &str) -> String {
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let n = c.entry(format!("{kind}/{name}")).or_insert(0);
        *n += 1;
        format!("{kind}/{name}/{n}")
    }

    fn gather(&self, name: String, value: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        match self.call(Request::Gather {
            name,
            value,
            timeout_ms: 0,
        })? {
            Reply::Gathered { values } => Ok(values),
            other => Err(unexpected(other)),
        }
    }

    /// Waits until every rank reached the barrier `name` (or a peer dies).
    pub fn barrier(&self, name: &str) -> Result<()> {
        self.gather(self.next_name("b", name), Vec::new())
            .map(|_| ())
    }

    /// Every rank's `bytes`, in rank order (every rank calls it the same number of times).
    pub fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.gather(self.next_name("ag", ""), bytes.to_vec())
    }

    /// Announces the operation this rank is entering; peers name it if this rank dies.
    pub fn set_op(&self, op: &str) -> Result<()> {
        self.live.set_op(op);
        match self.call(Request::SetOp { op: op.to_string() })? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// The peer death the watchdog saw, if any (with [`FaultAction::Report`]).
    pub fn check(&self) -> Result<()> {
        self.live.error().map_or(Ok(()), Err)
    }

    /// Ends this rank's part in the job: a last barrier, then a goodbye, so nobody mistakes
    /// the exit for a death. Rank 0 keeps the store up until the others have left.
    pub fn finish(mut self) -> Result<()> {
        self.set_op("finish")?;
        self.barrier("ptxforge.finish")?;
        self.leave(true);
        Ok(())
    }

    /// Stops the watchdog (with a goodbye when `clean`), then on rank 0 waits for the
    /// others to disconnect before the store goes.
    fn leave(&mut self, clean: bool) {
        let flag = if clean {
            &self.live.closing
        } else {
            &self.live.stop
        };
        flag.store(true, Ordering::SeqCst);
        if let Some(w) = self.watchdog.take() {
            w.thread().unpark();
            let _ = w.join();
        }
        if let Some(s) = self.server.take() {
            s.linger(self.env.peer_timeout);
        }
    }
}

impl Drop for Group {
    /// Dropped without [`Group::finish`]: the heartbeat closes without a goodbye, which the
    /// other ranks see as this rank's death (a rank that bails out with an error is lost).
    fn drop(&mut self) {
        self.leave(false);
    }
}

fn unexpected(r: Reply) -> DistError {
    DistError::Protocol(format!("unexpected reply from the store: {r:?}"))
}
