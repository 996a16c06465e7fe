//! The trainer across processes: one process per DualPipeV pipeline rank ([`PipeRank`]), joined
//! by an [`ep::Engine`]. This module owns the small tag + bytes protocol those processes speak
//! over the engine's all-gather messages ([`ep::Engine::blob`]: `seq` is the tag, `from` the
//! sender): stage-boundary activations and gradients ([`Tag::Act`], [`Tag::Grad`]), the
//! evaluation forward's activations ([`Tag::Eval`]) and the step's collectives (losses, gradient
//! norms, the validation loss, checkpoint parts), each carrying a status so a rank that failed
//! stops its peers with its own message instead of a timeout; [`Tag::Abort`] tells the peers a
//! rank gave up mid-pipeline.
//!
//! Messages between two processes arrive in the order they were sent (the engine's guarantee)
//! and every tag is taken exactly once per step, so tags need no step number. Every receive
//! waits at most [`PipeRank::timeout`] and its error names the peer rank and what was awaited.

use crate::TrainError;
use ep::engine::{Msg, Op};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a receive waits by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// How often a waiting receive polls the engine.
const POLL: Duration = Duration::from_millis(1);

/// Announces the phase a rank is in (`ptxforge train` passes the process group's `set_op`, so
/// a rank's death names the operation).
pub type PhaseHook = dyn Fn(&str) + Send + Sync;

/// This process's place in a multi-process run: pipeline rank `rank` of `engine.endpoints()`
/// (which must be `parallel.pp`), engine endpoint = pipeline rank.
#[derive(Clone)]
pub struct PipeRank {
    pub rank: usize,
    pub engine: Arc<dyn ep::Engine>,
    /// The longest wait for a peer's message.
    pub timeout: Duration,
    /// Called with the phase's name as the trainer enters it (`None`: nothing to tell).
    pub on_phase: Option<Arc<PhaseHook>>,
}

impl PipeRank {
    /// Rank `rank` over `engine` with the default timeout and no phase hook.
    pub fn new(rank: usize, engine: Arc<dyn ep::Engine>) -> PipeRank {
        PipeRank {
            rank,
            engine,
            timeout: DEFAULT_TIMEOUT,
            on_phase: None,
        }
    }
}

impl std::fmt::Debug for PipeRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipeRank")
            .field("rank", &self.rank)
            .field("engine", &self.engine.name())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What a message is (the tag's top 4 bits); `stage` and `index` fill the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tag {
    /// Activation into `stage` for micro-batch `index`.
    Act = 1,
    /// Gradient of `stage`'s output for micro-batch `index`.
    Grad = 2,
    /// Evaluation forward: activation into `stage` for validation batch `index`.
    Eval = 3,
    /// The step's losses (rank 0's).
    Losses = 4,
    /// Every rank's per-stage gradient norms.
    Norms = 5,
    /// The validation loss (rank 0's).
    Valid = 6,
    /// A rank's parameters and moments for the checkpoint (to rank 0).
    Ckpt = 7,
    /// A rank stopped; the bytes are its error.
    Abort = 8,
}

const STAGE_BITS: u32 = 8;
const INDEX_BITS: u32 = 20;

/// The engine tag of (`tag`, `stage`, `index`); an error when they do not fit.
pub(super) fn tag(kind: Tag, stage: usize, index: usize) -> Result<u32, TrainError> {
    if stage >= 1 << STAGE_BITS || index >= 1 << INDEX_BITS {
        return Err(TrainError::Unsupported(format!(
            "multi-process training: stage {stage} / index {index} exceed the message tag \
             ({} stages, {} micro-batches at most)",
            1 << STAGE_BITS,
            1 << INDEX_BITS
        )));
    }
    Ok(
        ((kind as u32) << (STAGE_BITS + INDEX_BITS))
            | ((stage as u32) << INDEX_BITS)
            | index as u32,
    )
}

fn peer(rank: usize, msg: String) -> TrainError {
    TrainError::Peer { rank, msg }
}

/// Arrived messages by (sender, tag), oldest first.
type Inbox = HashMap<(usize, u32), VecDeque<Vec<u8>>>;

/// The receiving side of the protocol: messages polled from the engine wait here by
/// (sender, tag) until taken.
pub(super) struct Link {
    pub(super) me: PipeRank,
    inbox: Mutex<Inbox>,
    abort_tag: u32,
}

impl Link {
    /// Checks the rank against the engine and the pipeline size.
    pub(super) fn new(me: PipeRank, pp: usize) -> Result<Link, TrainError> {
        let n = me.engine.endpoints() as usize;
        if n != pp || me.rank >= pp || me.engine.endpoint() as usize != me.rank {
            return Err(TrainError::Unsupported(format!(
                "multi-process training runs one process per pipeline rank: parallel.pp = {pp}, \
                 but this is rank {} (engine endpoint {}) of {n}",
                me.rank,
                me.engine.endpoint()
            )));
        }
        Ok(Link {
            me,
            inbox: Mutex::new(HashMap::new()),
            abort_tag: tag(Tag::Abort, 0, 0)?,
        })
    }

    pub(super) fn rank(&self) -> usize {
        self.me.rank
    }
    pub(super) fn ranks(&self) -> usize {
        self.me.engine.endpoints() as usize
    }

    /// Tells the phase hook.
    pub(super) fn phase(&self, name: &str) {
        if let Some(h) = &self.me.on_phase {
            h(name);
        }
    }

    /// Sends (`tag`, `data`) to `to`. A peer that stopped has usually sent its abort before
    /// its endpoint went away: that error, if it has arrived, is the one reported.
    pub(super) fn send(&self, to: usize, tag: u32, data: Vec<u8>) -> Result<(), TrainError> {
        let sent = self.me.engine.blob(to as u32, tag, data);
        sent.map_err(|e| match self.drain() {
            Err(stopped) => stopped,
            Ok(()) => peer(to, format!("sending to it failed: {e}")),
        })
    }

    /// Tells every peer this rank stopped with `err` (best effort: a peer may be gone).
    pub(super) fn abort(&self, err: &TrainError) {
        let text = err.to_string().into_bytes();
        for r in (0..self.ranks()).filter(|&r| r != self.rank()) {
            let _ = self.me.engine.blob(r as u32, self.abort_tag, text.clone());
        }
    }

    /// Moves every arrived message into the inbox; an abort from a peer is its error.
    fn drain(&self) -> Result<(), TrainError> {
        let mut inbox = self
            .inbox
            .lock()
            .map_err(|_| TrainError::Panicked("the message inbox".into()))?;
        while let Some(m) = self.poll_engine()? {
            if let Msg {
                from,
                op: Op::Blob { seq, data },
                ..
            } = m
            {
                inbox
                    .entry((from as usize, seq))
                    .or_default()
                    .push_back(data);
            }
        }
        let aborted = inbox
            .iter()
            .find(|((_, t), q)| *t == self.abort_tag && !q.is_empty());
        if let Some(((from, _), q)) = aborted {
            let msg = String::from_utf8_lossy(&q[0]).into_owned();
            return Err(peer(*from, format!("stopped: {msg}")));
        }
        Ok(())
    }

    fn poll_engine(&self) -> Result<Option<Msg>, TrainError> {
        self.me
            .engine
            .poll()
            .map_err(|e| peer(self.rank(), format!("the engine failed: {e}")))
    }

    /// The message (`from`, `tag`) if it has arrived.
    pub(super) fn try_take(&self, from: usize, tag: u32) -> Result<Option<Vec<u8>>, TrainError> {
        self.drain()?;
        let mut inbox = self
            .inbox
            .lock()
            .map_err(|_| TrainError::Panicked("the message inbox".into()))?;
        Ok(inbox.get_mut(&(from, tag)).and_then(VecDeque::pop_front))
    }

    /// Waits for (`from`, `tag`) up to the timeout; `what` names it in the error.
    pub(super) fn recv(
        &self,
        from: usize,
        tag: u32,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, TrainError> {
        let deadline = Instant::now() + self.me.timeout;
        loop {
            if let Some(b) = self.try_take(from, tag)? {
                return Ok(b);
            }
            if Instant::now() > deadline {
                return Err(self.timed_out(from, &what()));
            }
            std::thread::sleep(POLL);
        }
    }

    pub(super) fn timed_out(&self, from: usize, what: &str) -> TrainError {
        peer(
            from,
            format!(
                "no {what} from it within {:.1} s (pipeline rank {} waiting)",
                self.me.timeout.as_secs_f64(),
                self.rank()
            ),
        )
    }

    /// Sends `mine` (or this rank's error) to every peer with tag `t` and returns every rank's
    /// part in rank order (this rank's included); a peer's error is returned as its error.
    pub(super) fn all_gather(
        &self,
        t: u32,
        mine: Result<Vec<u8>, TrainError>,
        what: &str,
    ) -> Result<Vec<Vec<u8>>, TrainError> {
        let wire = status_bytes(&mine);
        for r in (0..self.ranks()).filter(|&r| r != self.rank()) {
            self.send(r, t, wire.clone())?;
        }
        let mine = mine?;
        let mut out = Vec::with_capacity(self.ranks());
        for r in 0..self.ranks() {
            if r == self.rank() {
                out.push(mine.clone());
                continue;
            }
            let b = self.recv(r, t, &|| what.to_string())?;
            out.push(from_status(r, b, what)?);
        }
        Ok(out)
    }

    /// Rank `root`'s part (`mine` on the root) to every rank.
    pub(super) fn broadcast(
        &self,
        root: usize,
        t: u32,
        mine: Result<Vec<u8>, TrainError>,
        what: &str,
    ) -> Result<Vec<u8>, TrainError> {
        if self.rank() == root {
            let wire = status_bytes(&mine);
            for r in (0..self.ranks()).filter(|&r| r != root) {
                self.send(r, t, wire.clone())?;
            }
            return mine;
        }
        let b = self.recv(root, t, &|| what.to_string())?;
        from_status(root, b, what)
    }
}

impl Link {
    /// Every rank's part to rank `root` (`Some` there, in rank order; `None` elsewhere).
    pub(super) fn gather(
        &self,
        root: usize,
        t: u32,
        mine: Result<Vec<u8>, TrainError>,
        what: &str,
    ) -> Result<Option<Vec<Vec<u8>>>, TrainError> {
        if self.rank() != root {
            self.send(root, t, status_bytes(&mine))?;
            return mine.map(|_| None);
        }
        let mine = mine?;
        let mut out = Vec::with_capacity(self.ranks());
        for r in 0..self.ranks() {
            if r == root {
                out.push(mine.clone());
                continue;
            }
            let b = self.recv(r, t, &|| what.to_string())?;
            out.push(from_status(r, b, what)?);
        }
        Ok(Some(out))
    }
}

/// `0` + bytes, or `1` + the error's text.
fn status_bytes(v: &Result<Vec<u8>, TrainError>) -> Vec<u8> {
    match v {
        Ok(b) => [&[0u8][..], b].concat(),
        Err(e) => [&[1u8][..], e.to_string().as_bytes()].concat(),
    }
}

fn from_status(from: usize, b: Vec<u8>, what: &str) -> Result<Vec<u8>, TrainError> {
    match b.split_first() {
        Some((0, rest)) => Ok(rest.to_vec()),
        Some((1, rest)) => Err(peer(
            from,
            format!(
                "failed before sending its {what}: {}",
                String::from_utf8_lossy(rest)
            ),
        )),
        _ => Err(peer(from, format!("sent a malformed {what}"))),
    }
}

/// Little-endian f32s.
pub(super) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian f64s.
pub(super) fn f64_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A cursor over a received message; every read checks the length.
pub(super) struct Reader<'a> {
    b: &'a [u8],
    from: usize,
    what: &'a str,
}

impl<'a> Reader<'a> {
    pub(super) fn new(b: &'a [u8], from: usize, what: &'a str) -> Reader<'a> {
        Reader { b, from, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TrainError> {
        if self.b.len() < n {
            return Err(peer(
                self.from,
                format!("its {} is {} bytes short", self.what, n - self.b.len()),
            ));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    pub(super) fn u64(&mut self) -> Result<u64, TrainError> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(w))
    }

    pub(super) fn f64(&mut self) -> Result<f64, TrainError> {
        Ok(f64::from_bits(self.u64()?))
    }

    pub(super) fn f32(&mut self) -> Result<f32, TrainError> {
        let mut w = [0u8; 4];
        w.copy_from_slice(self.take(4)?);
        Ok(f32::from_le_bytes(w))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.b.is_empty()
    }

    /// A u64 length, then that many little-endian 4-byte values.
    pub(super) fn f32s(&mut self) -> Result<Vec<f32>, TrainError> {
        let n = self.u64()? as usize;
        let b = self.take(n.saturating_mul(4))?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// A u64 length, then that many little-endian 2-byte values.
    pub(super) fn u16s(&mut self) -> Result<Vec<u16>, TrainError> {
        let n = self.u64()? as usize;
        let b = self.take(n.saturating_mul(2))?;
        Ok(b.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect())
    }

    pub(super) fn done(&self) -> Result<(), TrainError> {
        match self.b.is_empty() {
            true => Ok(()),
            false => Err(peer(
                self.from,
                format!("its {} has {} extra bytes", self.what, self.b.len()),
            )),
        }
    }
}

/// Appends a u64 length and `v`'s little-endian values.
pub(super) fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    out.extend(f32_bytes(v));
}

/// Appends a u64 length and `v`'s little-endian values.
pub(super) fn put_u16s(out: &mut Vec<u8>, v: impl ExactSizeIterator<Item = u16>) {
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}
