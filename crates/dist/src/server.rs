//! The rendezvous store rank 0 hosts at MASTER_ADDR:MASTER_PORT: a key-value map, gathers
//! (all-gather and barrier), each rank's announced operation, and each rank's liveness.
//!
//! One thread accepts connections and one thread serves each connection. A rank holds two:
//! a store connection (requests that may block) and a heartbeat connection. The heartbeat
//! connection *is* the liveness signal: when it closes without [`Request::Bye`] (the process
//! died, and the kernel closed its sockets) or stays silent for the peer timeout (the process
//! hangs), the rank is marked dead, every blocked wait and gather returns
//! [`Reply::Dead`], and every other rank's next heartbeat is answered with it.

use crate::env::DistEnv;
use crate::error::{DistError, Result};
use crate::wire::{recv, send, Kind, Reply, Request};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest sleep of a blocked request between checks of its deadline.
const POLL: Duration = Duration::from_millis(200);

/// A rank's liveness as the store sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    NotJoined,
    Alive,
    Left,
    Dead,
}

#[derive(Default)]
struct Gather {
    values: Vec<Option<Vec<u8>>>,
    fetched: usize,
}

struct State {
    kv: HashMap<String, Vec<u8>>,
    gathers: HashMap<String, Gather>,
    ops: Vec<String>,
    life: Vec<Life>,
    store_joined: Vec<bool>,
    dead: Option<(usize, String)>,
    /// Open connections from ranks other than 0 (rank 0 lingers until they are gone).
    open_others: usize,
}

struct Shared {
    job: String,
    world: usize,
    peer_timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // a serving thread never panics while holding the lock, but a poisoned lock still
        // holds consistent data (every update is a single assignment)
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The running store; dropping it stops accepting connections.
pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

/// MASTER_ADDR:MASTER_PORT resolved.
pub fn resolve(env: &DistEnv) -> Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = (env.master_addr.as_str(), env.master_port)
        .to_socket_addrs()
        .map_err(|e| DistError::Resolve {
            addr: env.master(),
            reason: e.to_string(),
        })?
        .collect();
    if addrs.is_empty() {
        return Err(DistError::Resolve {
            addr: env.master(),
            reason: "no address".into(),
        });
    }
    Ok(addrs)
}

impl Server {
    /// Listens on MASTER_ADDR:MASTER_PORT and serves in background threads.
    pub fn start(env: &DistEnv) -> Result<Server> {
        let addr = resolve(env)?[0];
        let listener = TcpListener::bind(addr).map_err(|source| DistError::Bind {
            addr: env.master(),
            source,
        })?;
        let w = env.world_size;
        let shared = Arc::new(Shared {
            job: env.job_id.clone(),
            world: w,
            peer_timeout: env.peer_timeout,
            state: Mutex::new(State {
                kv: HashMap::new(),
                gathers: HashMap::new(),
                ops: vec![String::new(); w],
                life: vec![Life::NotJoined; w],
                store_joined: vec![false; w],
                dead: None,
                open_others: 0,
            }),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("dist-store".into())
            .spawn(move || accept_loop(listener, s))?;
        Ok(Server {
            shared,
            addr,
            accept: Some(accept),
        })
    }

    /// Waits until no other rank holds a connection, or `timeout` passes: rank 0 keeps
    /// serving so that the others receive the last replies (an error, a death) before its
    /// process exits and closes the store.
    pub fn linger(&self, timeout: Duration) {
        let end = Instant::now() + timeout;
        let mut st = self.shared.lock();
        while st.open_others > 0 {
            let now = Instant::now();
            if now >= end {
                return;
            }
            st = match self.shared.cv.wait_timeout(st, (end - now).min(POLL)) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // wake the accept loop with a connection of our own
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        let s = shared.clone();
        // a connection that cannot get a thread is dropped; its rank sees the error
        let _ = std::thread::Builder::new()
            .name("dist-store-conn".into())
            .spawn(move || serve(stream, &s));
    }
}

fn serve(mut stream: TcpStream, sh: &Shared) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let Ok(Some(Request::Hello {
        job,
        rank,
        world_size,
        kind,
    })) = recv::<Request>(&mut stream)
    else {
        return;
    };
    if let Err(reason) = admit(sh, &job, rank, world_size, kind) {
        let _ = send(&mut stream, &Reply::Rejected { reason });
        return;
    }
    match (send(&mut stream, &Reply::Welcome), kind) {
        (Ok(()), Kind::Store) => serve_store(stream, sh, rank),
        (Ok(()), Kind::Heartbeat) => serve_heartbeat(stream, sh, rank),
        (Err(_), Kind::Heartbeat) => mark_dead(sh, rank),
        (Err(_), Kind::Store) => {}
    }
    let mut st = sh.lock();
    if rank != 0 {
        st.open_others -= 1;
    }
    sh.cv.notify_all();
}

/// Checks a hello against the job; on success records the connection.
fn admit(sh: &Shared, job: &str, rank: usize, world: usize, kind: Kind) -> Result<(), String> {
    if job != sh.job {
        return Err(format!(
            "the store serves job `{}`, not `{job}` (another job uses this MASTER_PORT)",
            sh.job
        ));
    }
    if world != sh.world || rank >= world {
        return Err(format!(
            "WORLD_SIZE differs: the store has {} ranks, this rank says rank {rank} of {world}",
            sh.world
        ));
    }
    let mut st = sh.lock();
    let taken = match kind {
        Kind::Store => std::mem::replace(&mut st.store_joined[rank], true),
        Kind::Heartbeat => st.life[rank] != Life::NotJoined,
    };
    if taken {
        return Err(format!(
            "rank {rank} has already joined (two processes with the same RANK?)"
        ));
    }
    if kind == Kind::Heartbeat {
        st.life[rank] = Life::Alive;
    }
    if rank != 0 {
        st.open_others += 1;
    }
    Ok(())
}

fn mark_dead(sh: &Shared, rank: usize) {
    let mut st = sh.lock();
    if st.life[rank] == Life::Alive {
        st.life[rank] = Life::Dead;
        if st.dead.is_none() {
            st.dead = Some((rank, st.ops[rank].clone()));
        }
    }
    sh.cv.notify_all();
}

fn serve_heartbeat(mut stream: TcpStream, sh: &Shared, rank: usize) {
    // a rank that is silent for the peer timeout is as dead as one whose socket closed
    let _ = stream.set_read_timeout(Some(sh.peer_timeout));
    loop {
        match recv::<Request>(&mut stream) {
            Ok(Some(Request::Heartbeat)) => {
                let reply = {
                    let st = sh.lock();
                    match &st.dead {
                        Some((r, op)) => Reply::Dead {
                            rank: *r,
                            op: op.clone(),
                        },
                        None => Reply::Alive {
                            rank0_op: st.ops[0].clone(),
                        },
                    }
                };
                if send(&mut stream, &reply).is_err() {
                    return mark_dead(sh, rank);
                }
            }
            Ok(Some(Request::Bye)) => {
                sh.lock().life[rank] = Life::Left;
                let _ = send(&mut stream, &Reply::Ok);
                return;
            }
            _ => return mark_dead(sh, rank),
        }
    }
}

fn serve_store(mut stream: TcpStream, sh: &Shared, rank: usize) {
    let _ = stream.set_read_timeout(None);
    while let Ok(Some(req)) = recv::<Request>(&mut stream) {
        let reply = handle(sh, rank, req);
        if send(&mut stream, &reply).is_err() {
            return;
        }
    }
}

fn handle(sh: &Shared, rank: usize, req: Request) -> Reply {
    match req {
        Request::Set { key, value } => {
            sh.lock().kv.insert(key, value);
            sh.cv.notify_all();
            Reply::Ok
        }
        Request::Get { key } => Reply::Value {
            value: sh.lock().kv.get(&key).cloned(),
        },
        Request::Wait { key, timeout_ms } => wait_key(sh, &key, timeout_ms),
        Request::Gather {
            name,
            value,
            timeout_ms,
        } => gather(sh, rank, name, value, timeout_ms),
        Request::SetOp { op } => {
            sh.lock().ops[rank] = op;
            Reply::Ok
        }
        Request::Hello { .. } | Request::Heartbeat | Request::Bye => Reply::Rejected {
            reason: "unexpected message on a store connection".into(),
        },
    }
}

fn dead_reply(st: &State) -> Option<Reply> {
    st.dead.as_ref().map(|(r, op)| Reply::Dead {
        rank: *r,
        op: op.clone(),
    })
}

fn wait_key(sh: &Shared, key: &str, timeout_ms: u64) -> Reply {
    // a deadline past what Instant can hold is no deadline
    let end = Instant::now().checked_add(Duration::from_millis(timeout_ms));
    let mut st = sh.lock();
    loop {
        if let Some(v) = st.kv.get(key) {
            return Reply::Value {
                value: Some(v.clone()),
            };
        }
        if let Some(d) = dead_reply(&st) {
            return d;
        }
        let now = Instant::now();
        let wait = match end {
            Some(e) if now >= e => return Reply::Timeout { missing: vec![] },
            Some(e) => (e - now).min(POLL),
            None => POLL,
        };
        st = match sh.cv.wait_timeout(st, wait) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
    }
}

fn gather(sh: &Shared, rank: usize, name: String, value: Vec<u8>, timeout_ms: u64) -> Reply {
    let end = match timeout_ms {
        0 => None,
        t => Instant::now().checked_add(Duration::from_millis(t)),
    };
    let mut st = sh.lock();
    let world = sh.world;
    let g = st.gathers.entry(name.clone()).or_insert_with(|| Gather {
        values: vec![None; world],
        fetched: 0,
    });
    g.values[rank] = Some(value);
    sh.cv.notify_all();
    loop {
        if let Some(done) = take_complete(&mut st, &name, world) {
            return done;
        }
        if let Some(d) = dead_reply(&st) {
            return d;
        }
        if let Some(left) = left_without(&st, &name) {
            return Reply::Rejected {
                reason: format!(
                    "rank {left} left the job (finished) without joining this collective"
                ),
            };
        }
        let now = Instant::now();
        let wait = match end {
            Some(e) if now >= e => return gather_timeout(&st, &name),
            Some(e) => (e - now).min(POLL),
            None => POLL,
        };
        st = match sh.cv.wait_timeout(st, wait) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
    }
}

/// The gathered values once every rank contributed; the entry is dropped after every rank
/// has fetched it.
fn take_complete(st: &mut State, name: &str, world: usize) -> Option<Reply> {
    let g = st.gathers.get_mut(name)?;
    if g.values.iter().any(|v| v.is_none()) {
        return None;
    }
    let values: Vec<Vec<u8>> = g.values.iter().flatten().cloned().collect();
    g.fetched += 1;
    if g.fetched == world {
        st.gathers.remove(name);
    }
    Some(Reply::Gathered { values })
}

/// A rank that said goodbye but never contributed to the gather `name` (it never will).
fn left_without(st: &State, name: &str) -> Option<usize> {
    let g = st.gathers.get(name)?;
    (0..g.values.len()).find(|&r| st.life[r] == Life::Left && g.values[r].is_none())
}

fn gather_timeout(st: &State, name: &str) -> Reply {
    let missing = st
        .gathers
        .get(name)
        .map(|g| {
            g.values
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_none())
                .map(|(r, _)| r)
                .collect()
        })
        .unwrap_or_default();
    Reply::Timeout { missing }
}
