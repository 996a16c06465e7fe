//! [`NcclEngine`]: the proxy transport's inter-node engine over NCCL point-to-point.
//!
//! NCCL has no one-sided messages: a receive must be posted with its size. So a progress
//! thread moves messages in *rounds*, all ranks in step: each round is one group of 8-byte
//! `ncclSend`/`ncclRecv`s carrying, per peer, how many bytes follow (and whether this endpoint is
//! closing), then one group of payload sends/receives between device staging buffers. A
//! payload is the endpoint's queued messages for that peer, each [`Msg::encode`]d behind a u32
//! length, in the order they were sent: per-pair FIFO order is kept. Idle rounds sleep
//! [`IDLE`] before the next. Dropping the engine marks it closing; the thread runs rounds
//! until every endpoint has closed (so a closing endpoint never strands a peer mid-round).
//! A failure (a lost peer, reported by `ncclCommGetAsyncError`, or a round that does not
//! complete within the communicator's [`Comm::timeout`]) aborts the communicator, stops the
//! thread, and every later `send`/`poll` returns it, naming the `engine round` and, where
//! NCCL's error names one, the peer.

use crate::comm::Comm;
use crate::Result;
use ep::engine::{Engine, Msg};
use ep::EpError;
use runtime::Buffer;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Pause after a round that moved nothing.
pub const IDLE: Duration = Duration::from_micros(200);
const CLOSING: u64 = 1 << 63;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Shared {
    /// Per peer: queued framed messages.
    out: Mutex<Vec<Vec<u8>>>,
    inbox: Mutex<VecDeque<Msg>>,
    closing: AtomicBool,
    failed: Mutex<Option<String>>,
    rounds: AtomicU64,
    bytes_sent: AtomicU64,
}

/// The NCCL engine of one endpoint (= NCCL rank).
pub struct NcclEngine {
    me: u32,
    n: u32,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl NcclEngine {
    /// Starts the engine's progress thread on `comm` (which it owns from now on; use a
    /// communicator of its own, not one that also runs collectives).
    pub fn new(comm: Comm) -> Result<NcclEngine> {
        let (me, n) = (comm.rank(), comm.nranks());
        let shared = Arc::new(Shared {
            out: Mutex::new(vec![Vec::new(); n as usize]),
            inbox: Mutex::default(),
            closing: AtomicBool::new(false),
            failed: Mutex::default(),
            rounds: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nccl-engine-{me}"))
            .spawn(move || progress(comm, &sh))
            .map_err(|e| crate::NcclError::Engine(format!("spawn the progress thread: {e}")))?;
        Ok(NcclEngine {
            me,
            n,
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Rounds run so far and payload bytes sent (for measurements).
    pub fn stats(&self) -> (u64, u64) {
        (
            self.shared.rounds.load(Ordering::Relaxed),
            self.shared.bytes_sent.load(Ordering::Relaxed),
        )
    }

    fn check(&self) -> ep::Result<()> {
        match &*lock(&self.shared.failed) {
            Some(e) => Err(EpError::Engine(format!("NCCL engine: {e}"))),
            None => Ok(()),
        }
    }
}

impl Drop for NcclEngine {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Engine for NcclEngine {
    fn endpoint(&self) -> u32 {
        self.me
    }
    fn endpoints(&self) -> u32 {
        self.n
    }
    fn send(&self, to: u32, msg: Msg) -> ep::Result<()> {
        self.check()?;
        if to >= self.n {
            return Err(EpError::Engine(format!("no endpoint {to} of {}", self.n)));
        }
        if to == self.me {
            lock(&self.shared.inbox).push_back(msg);
            return Ok(());
        }
        let b = msg.encode();
        let mut out = lock(&self.shared.out);
        let q = &mut out[to as usize];
        q.extend_from_slice(&(b.len() as u32).to_le_bytes());
        q.extend_from_slice(&b);
        Ok(())
    }
    fn poll(&self) -> ep::Result<Option<Msg>> {
        if let Some(m) = lock(&self.shared.inbox).pop_front() {
            return Ok(Some(m));
        }
        self.check()?;
        Ok(None)
    }
    fn name(&self) -> &'static str {
        "nccl"
    }
}

/// Device staging of the progress thread, grown on demand.
struct Staging {
    hdr_out: Buffer<u64>,
    hdr_in: Buffer<u64>,
    data_out: Buffer<u8>,
    data_in: Buffer<u8>,
}

fn progress(comm: Comm, sh: &Shared) {
    let r = (|| -> Result<()> {
        let n = comm.nranks() as usize;
        let d = comm.device().clone();
        let mut st = Staging {
            hdr_out: d.alloc(n)?,
            hdr_in: d.alloc(n)?,
            data_out: d.alloc(4096)?,
            data_in: d.alloc(4096)?,
        };
        loop {
            let (done, moved) = round(&comm, &mut st, sh)?;
            sh.rounds.fetch_add(1, Ordering::Relaxed);
            if done {
                return Ok(());
            }
            if !moved {
                std::thread::sleep(IDLE);
            }
        }
    })();
    if let Err(e) = r {
        *lock(&sh.failed) = Some(e.to_string());
    }
}

/// One round; returns (every endpoint is closing, any payload moved).
fn round(comm: &Comm, st: &mut Staging, sh: &Shared) -> Result<(bool, bool)> {
    let (me, n) = (comm.rank() as usize, comm.nranks() as usize);
    let closing = sh.closing.load(Ordering::Acquire);
    let outs: Vec<Vec<u8>> = std::mem::replace(&mut *lock(&sh.out), vec![Vec::new(); n]);
    let flag = if closing { CLOSING } else { 0 };
    let hdr: Vec<u64> = outs.iter().map(|o| o.len() as u64 | flag).collect();
    st.hdr_out.copy_from_host(&hdr)?;
    let peers: Vec<u32> = (0..n as u32).filter(|&p| p as usize != me).collect();
    let slot = |b: &Buffer<u64>, p: u32| (p, b.device_ptr() + 8 * p as u64, 8usize);
    let sends: Vec<_> = peers.iter().map(|&p| slot(&st.hdr_out, p)).collect();
    let recvs: Vec<_> = peers.iter().map(|&p| slot(&st.hdr_in, p)).collect();
    comm.exchange("engine round", &sends, &recvs)?;
    let got = st.hdr_in.to_vec()?;
    let all_closing = closing && peers.iter().all(|&p| got[p as usize] & CLOSING != 0);
    let sizes_in: Vec<usize> = (0..n)
        .map(|p| {
            if p == me {
                0
            } else {
                (got[p] & !CLOSING) as usize
            }
        })
        .collect();
    let moved = payloads(comm, st, &outs, &sizes_in, sh)?;
    Ok((all_closing, moved))
}

/// The payload group of a round; decoded messages go to the inbox in peer order.
fn payloads(
    comm: &Comm,
    st: &mut Staging,
    outs: &[Vec<u8>],
    sizes_in: &[usize],
    sh: &Shared,
) -> Result<bool> {
    let me = comm.rank() as usize;
    let total_out: usize = outs.iter().map(Vec::len).sum();
    let total_in: usize = sizes_in.iter().sum();
    if total_out + total_in == 0 {
        return Ok(false);
    }
    let d = comm.device().clone();
    if st.data_out.len() < total_out {
        st.data_out = d.alloc(total_out.next_power_of_two())?;
    }
    if st.data_in.len() < total_in {
        st.data_in = d.alloc(total_in.next_power_of_two())?;
    }
    st.data_out.copy_from_bytes(&outs.concat())?;
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    let (mut off_out, mut off_in) = (0u64, 0u64);
    for p in (0..outs.len()).filter(|&p| p != me) {
        if !outs[p].is_empty() {
            sends.push((p as u32, st.data_out.device_ptr() + off_out, outs[p].len()));
        }
        off_out += outs[p].len() as u64;
        if sizes_in[p] > 0 {
            recvs.push((p as u32, st.data_in.device_ptr() + off_in, sizes_in[p]));
        }
        off_in += sizes_in[p] as u64;
    }
    comm.exchange("engine round", &sends, &recvs)?;
    sh.bytes_sent.fetch_add(total_out as u64, Ordering::Relaxed);
    let bytes = st.data_in.to_bytes()?;
    let mut inbox = lock(&sh.inbox);
    let mut at = 0usize;
    for &len in sizes_in {
        decode_frames(&bytes[at..at + len], &mut inbox)?;
        at += len;
    }
    Ok(true)
}

/// Splits one peer's payload into messages.
fn decode_frames(mut b: &[u8], inbox: &mut VecDeque<Msg>) -> Result<()> {
    while !b.is_empty() {
        let bad = || crate::NcclError::Engine("a truncated message frame arrived".into());
        let len = u32::from_le_bytes(b.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
        let body = b.get(4..4 + len as usize).ok_or_else(bad)?;
        inbox.push_back(Msg::decode(body).map_err(|e| crate::NcclError::Engine(e.to_string()))?);
        b = &b[4 + len as usize..];
    }
    Ok(())
}
