//! The liveness watchdog: one thread per rank that heartbeats the store on the rank's
//! heartbeat connection. An answer [`Reply::Dead`] (another rank died), a closed connection or
//! a missing answer within the peer timeout (rank 0, the store, died or hangs) is a peer death:
//! the watchdog records [`DistError::PeerDied`], runs the caller's `on_peer_death` hook (e.g.
//! remove the job's shared-memory segments), and with [`FaultAction::Exit`] prints one line
//! and exits the process with status 1 — a rank blocked in a kernel or a collective cannot be
//! trusted to notice by itself.

use crate::error::DistError;
use crate::server::Server;
use crate::wire::{recv, send, Reply, Request};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs before the watchdog acts on a peer's death (clean-up: shm segments, files).
pub type DeathHook = Arc<dyn Fn(&DistError) + Send + Sync>;

/// What the watchdog does when a peer dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Run the hook, print one line on standard error, exit the process with status 1.
    Exit,
    /// Run the hook and record the error: [`Group::check`](crate::Group::check) and every
    /// later operation return it (for embedding and in-process tests).
    Report,
}

/// State the group and its watchdog share.
pub(crate) struct Liveness {
    /// The first death seen: (rank, its announced op or ours).
    pub death: Mutex<Option<(usize, String)>>,
    /// The operation this rank announced last.
    pub local_op: Mutex<String>,
    /// What rank 0 announced, as of the last heartbeat (named if rank 0 dies).
    pub rank0_op: Mutex<String>,
    /// Finish: say goodbye on the heartbeat connection and stop.
    pub closing: AtomicBool,
    /// Stop without a goodbye (the group was dropped without finishing).
    pub stop: AtomicBool,
}

fn get(m: &Mutex<String>) -> String {
    m.lock().map(|s| s.clone()).unwrap_or_default()
}

impl Liveness {
    pub fn new(op: &str) -> Self {
        Liveness {
            death: Mutex::new(None),
            local_op: Mutex::new(op.to_string()),
            rank0_op: Mutex::new(String::new()),
            closing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    /// The error for `rank`'s death: its announced operation, else the one this rank is in.
    pub fn died(&self, rank: usize, op: &str) -> DistError {
        let op = if op.is_empty() {
            get(&self.local_op)
        } else {
            op.to_string()
        };
        if let Ok(mut d) = self.death.lock() {
            d.get_or_insert((rank, op.clone()));
        }
        DistError::PeerDied { rank, op }
    }

    /// The recorded death, if any.
    pub fn error(&self) -> Option<DistError> {
        let d = self.death.lock().ok()?.clone()?;
        Some(DistError::PeerDied { rank: d.0, op: d.1 })
    }

    /// The error for the store (rank 0) having gone away.
    pub fn store_lost(&self) -> DistError {
        self.died(0, &get(&self.rank0_op))
    }

    pub fn set_op(&self, op: &str) {
        if let Ok(mut s) = self.local_op.lock() {
            *s = op.to_string();
        }
    }
}

/// The watchdog thread's configuration.
pub(crate) struct Watch {
    pub rank: usize,
    pub node: usize,
    pub interval: Duration,
    pub peer_timeout: Duration,
    pub action: FaultAction,
    pub hook: Option<DeathHook>,
    /// Rank 0 keeps its store up until the others have heard of the death.
    pub server: Option<Arc<Server>>,
}

/// The watchdog loop (runs until a death, a goodbye or a stop).
pub(crate) fn run(mut hb: TcpStream, live: Arc<Liveness>, w: Watch) {
    loop {
        if live.stop.load(Ordering::SeqCst) {
            return;
        }
        if live.closing.load(Ordering::SeqCst) {
            // the store acknowledges; nothing is left to do if it does not
            if send(&mut hb, &Request::Bye).is_ok() {
                let _ = recv::<Reply>(&mut hb);
            }
            return;
        }
        let err = match beat(&mut hb, &live) {
            Ok(()) => {
                std::thread::park_timeout(w.interval);
                continue;
            }
            Err(e) => e,
        };
        if live.stop.load(Ordering::SeqCst) || live.closing.load(Ordering::SeqCst) {
            return;
        }
        return act(&err, &w);
    }
}

/// One heartbeat round trip; `Err` is a peer's death.
fn beat(hb: &mut TcpStream, live: &Liveness) -> Result<(), DistError> {
    if send(hb, &Request::Heartbeat).is_err() {
        return Err(live.store_lost());
    }
    match recv::<Reply>(hb) {
        Ok(Some(Reply::Alive { rank0_op })) => {
            if let Ok(mut s) = live.rank0_op.lock() {
                *s = rank0_op;
            }
            Ok(())
        }
        Ok(Some(Reply::Dead { rank, op })) => Err(live.died(rank, &op)),
        // closed, silent past the peer timeout, or garbage: the store is gone
        _ => Err(live.store_lost()),
    }
}

fn act(err: &DistError, w: &Watch) {
    if let Some(h) = &w.hook {
        h(err);
    }
    if w.action == FaultAction::Report {
        return;
    }
    eprintln_line(&format!(
        "ptxforge: rank {} (node {}): error: {err}",
        w.rank, w.node
    ));
    if let Some(s) = &w.server {
        s.linger(w.peer_timeout);
    }
    std::process::exit(1);
}

/// One line on standard error, ignoring a closed stream (there is nobody left to tell).
fn eprintln_line(s: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{s}");
}
