//! Host-proxy transport modelled on NVSHMEM / IBGDA: the dispatch and combine kernels stay the
//! code that writes a peer's ring directly, but for a peer on another node the address they get
//! is a local **send window** (a shadow of the remote window, on the sender's own device).
//!
//! ```text
//!   node A (process / endpoint a)                      node B (process / endpoint b)
//!   kernel on rank r                                   kernel on rank d
//!     stores records into shadow[r->d] slots             polls tail (ld.acquire), reads slots,
//!     st.release shadow tail ("doorbell")                st.release head
//!            |                                                  |
//!   proxy a: ld.acquire shadow tails ---- put(slots) ---->  proxy b: writes the real ring slots
//!            (new records only)       -- signal(tail) -->            st.release real tail
//!   proxy a: st.release shadow head <--- signal(head) ---  proxy b: ld.acquire real heads
//! ```
//!
//! The kernel's stores plus the release store of the tail are its "WQE + doorbell"; a proxy
//! thread per endpoint polls the doorbells of the send windows it hosts, ships the new records
//! through an [`Engine`] (`put` then `signal`, delivered in order; only the bytes of each slot
//! the operation's records fill, [`ProxyTransport::set_record_bytes`]), and the receiving proxy writes
//! them into the real ring and release-stores the tail. Heads (flow control) travel back the
//! same way into the shadows. Windows without doorbells ([`WindowKind::Sparse`]: single-word
//! puts such as the top-k weight gradients) are shipped at the end of the operation: the shadow
//! starts filled with a poison byte pattern the kernels never write, and every 4-byte word that
//! differs from it is put.
//!
//! Operations are bracketed by [`crate::Transport::begin`] (new epoch, shadows and proxy state
//! reset, a fence with every other endpoint so no record lands in a ring before its owner reset
//! it) and [`crate::Transport::end`] (remaining doorbells and sparse windows shipped, then a
//! fence: every put of every endpoint has landed). Messages of older epochs are dropped.
//!
//! Time and faults: while an operation with inter-node windows is active the proxy holds
//! emulated time ([`emu::clock::Hold`]): a kernel waiting for records that are in flight on the
//! host is not late. If nothing moves (no doorbell, no message) for the configured timeout of
//! wall time the proxy lets go, so the kernels' own `%globaltimer` timeouts fire and the group
//! reports [`EpError::Timeout`]. A peer that never reaches a fence or all-gather is reported
//! the same way, naming it, after the *peer timeout* (default 10 minutes: a process still busy
//! with compute before the operation is not dead). A proxy thread stops when the transport is
//! dropped.

use crate::engine::{Engine, Msg, Op, Target};
use crate::transport::Transport;
use crate::{EpError, Result};
use runtime::{Buffer, Device, HostView};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Window key of the dispatch/combine workspaces (counters + rings).
pub const WIN_WS: u32 = 0;
/// Window key of the top-k weight gradient buffers.
pub const WIN_DW: u32 = 1;

const FIN: u32 = 0x8000_0000;
const PHASE_BEGIN: u32 = 0;
const PHASE_END: u32 = 1;

/// One ring of a window: byte offsets of its tail and head counters (u32) and its slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingSpec {
    pub tail_off: u64,
    pub head_off: u64,
    pub data_off: u64,
    pub slots: u32,
    pub slot_bytes: u32,
}

/// How the proxy finds what a kernel wrote into a send window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowKind {
    /// Ring buffers with doorbells (tails, bit 31 = finished) and heads flowing back.
    Rings(Vec<RingSpec>),
    /// Plain word stores, shipped at the end of the operation: words still equal to
    /// `poison` repeated were not written.
    Sparse { poison: u8 },
}

/// A window as the caller registers it: `key` names the window family (the same on every
/// process, e.g. [`WIN_WS`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub key: u32,
    pub kind: WindowKind,
}

/// A registered window on one endpoint: the real one (owner hosted here), or the send window of
/// a hosted source rank.
struct Win {
    kind: WindowKind,
    real: Option<HostView>,
    shadow: Option<(Buffer<u8>, HostView)>,
    sent_tail: Vec<u32>,
    sent_head: Vec<u32>,
}

/// (key, owner, src)
type WinId = (u32, u32, u32);

struct State {
    epoch: u32,
    wins: HashMap<WinId, Win>,
    /// Endpoints whose fence of (epoch, phase) arrived.
    fences: HashMap<(u32, u32), BTreeSet<u32>>,
    /// All-gather parts by (seq, sending endpoint).
    blobs: HashMap<(u32, u32), Vec<u8>>,
    gather_seq: u32,
    hold: Option<emu::clock::Hold>,
    last_progress: Instant,
    error: Option<String>,
    stats: ProxyStats,
    /// Bytes of the current operation's records by window key
    /// ([`ProxyTransport::set_record_bytes`]); a ring without an entry ships whole slots.
    record_bytes: HashMap<u32, u32>,
}

/// What one endpoint's proxy moved (since the transport was created).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProxyStats {
    /// Bytes of records and sparse words put to other endpoints.
    pub put_bytes: u64,
    pub puts: u64,
    /// Tail and head signals sent.
    pub signals: u64,
    /// Messages received and applied (older epochs' dropped ones not counted).
    pub applied: u64,
}

struct Shared {
    engine: Box<dyn Engine>,
    /// Ranks per endpoint: GPUs per node (one endpoint per node) or 1 (one per rank).
    per_ep: u32,
    timeout: Duration,
    /// Longest wait for another endpoint at a fence or all-gather (nanoseconds).
    peer_timeout: AtomicU64,
    st: Mutex<State>,
    cv: Condvar,
    stop: AtomicBool,
}

struct Endpoint {
    sh: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// The proxy transport (see the module docs). One endpoint per node, or per rank, hosted by
/// this process.
pub struct ProxyTransport {
    ranks: u32,
    gpus_per_node: u32,
    /// Ranks per endpoint (see [`ProxyTransport::new`]).
    per_ep: u32,
    /// Devices of the hosted ranks (index = rank).
    devices: Vec<Option<Device>>,
    eps: Vec<Endpoint>,
}

fn lock(sh: &Shared) -> Result<MutexGuard<'_, State>> {
    sh.st
        .lock()
        .map_err(|_| EpError::Engine("proxy state lock poisoned".into()))
}

impl ProxyTransport {
    /// A transport for `devices` (index = rank; `None` for ranks other processes host), one
    /// endpoint per node or one per rank, as the engines span (`endpoints()` = nodes or
    /// ranks): `engines` are the endpoints this process hosts (engine endpoint id = node, or
    /// rank). One endpoint per rank is the one-process-per-rank layout: each rank's process
    /// runs its own proxy (as each GPU drives its own RDMA queue pairs in DeepEP), and its
    /// node peers in other processes are reached through IPC, not through the proxy.
    /// `timeout`: wall time without progress inside an operation before the proxy lets the
    /// kernels time out. Waits for another process to *reach* an operation
    /// (fences, all-gathers) get [`default_peer_timeout`] (see [`ProxyTransport::set_peer_timeout`]).
    pub fn new(
        devices: Vec<Option<Device>>,
        gpus_per_node: u32,
        engines: Vec<Box<dyn Engine>>,
        timeout: Duration,
    ) -> Result<ProxyTransport> {
        let ranks = devices.len() as u32;
        if gpus_per_node == 0 || ranks % gpus_per_node != 0 {
            return Err(EpError::Config(format!(
                "gpus_per_node {gpus_per_node} must divide the {ranks} ranks"
            )));
        }
        let mut eps = Vec::new();
        let mut per_ep = gpus_per_node;
        for engine in engines {
            per_ep = endpoint_ranks(engine.endpoints(), ranks, gpus_per_node)?;
            let sh = Arc::new(Shared {
                engine,
                per_ep,
                timeout,
                peer_timeout: AtomicU64::new(default_peer_timeout(timeout).as_nanos() as u64),
                st: Mutex::new(State {
                    epoch: 0,
                    wins: HashMap::new(),
                    fences: HashMap::new(),
                    blobs: HashMap::new(),
                    gather_seq: 0,
                    hold: None,
                    last_progress: Instant::now(),
                    error: None,
                    stats: ProxyStats::default(),
                    record_bytes: HashMap::new(),
                }),
                cv: Condvar::new(),
                stop: AtomicBool::new(false),
            });
            let s2 = sh.clone();
            let thread = std::thread::Builder::new()
                .name(format!("ep-proxy-{}", sh.engine.endpoint()))
                .spawn(move || proxy_loop(&s2))
                .map_err(|e| EpError::Engine(format!("spawning the proxy thread: {e}")))?;
            eps.push(Endpoint {
                sh,
                thread: Some(thread),
            });
        }
        Ok(ProxyTransport {
            ranks,
            gpus_per_node,
            per_ep,
            devices,
            eps,
        })
    }

    fn endpoint_of(&self, rank: u32) -> Option<&Shared> {
        let e = rank / self.per_ep;
        self.eps
            .iter()
            .map(|ep| &*ep.sh)
            .find(|s| s.engine.endpoint() == e)
    }

    /// Registers rank `owner`'s real window `buf` (hosted here) for puts from rank `src`.
    pub fn expose_window(
        &self,
        owner: u32,
        src: u32,
        buf: &Buffer<u8>,
        spec: &WindowSpec,
    ) -> Result<()> {
        let sh = self
            .endpoint_of(owner)
            .ok_or_else(|| EpError::Config(format!("rank {owner} is not hosted here")))?;
        let win = Win::new(spec, Some(buf.host_view()?), None);
        lock(sh)?.wins.insert((spec.key, owner, src), win);
        Ok(())
    }

    /// Allocates rank `src`'s send window for rank `dst`'s window of `bytes` and returns the
    /// address `src`'s kernels write through.
    pub fn attach_window(
        &self,
        src: u32,
        dst: u32,
        bytes: usize,
        spec: &WindowSpec,
    ) -> Result<u64> {
        let sh = self
            .endpoint_of(src)
            .ok_or_else(|| EpError::Config(format!("rank {src} is not hosted here")))?;
        let dev = self
            .devices
            .get(src as usize)
            .and_then(|d| d.as_ref())
            .ok_or_else(|| EpError::Config(format!("no device for rank {src}")))?;
        let buf = dev.alloc::<u8>(bytes.max(4))?;
        let view = buf.host_view()?;
        let fill = match spec.kind {
            WindowKind::Rings(_) => 0,
            WindowKind::Sparse { poison } => poison,
        };
        view.fill(0, view.len(), fill)?;
        let ptr = buf.device_ptr();
        let win = Win::new(spec, None, Some((buf, view)));
        lock(sh)?.wins.insert((spec.key, dst, src), win);
        Ok(ptr)
    }

    /// The next operation's records in ring windows `key` are `bytes` long (the rest of each
    /// slot is not written): the proxies put only those bytes of each slot.
    pub fn set_record_bytes(&self, key: u32, bytes: u32) -> Result<()> {
        if bytes == 0 {
            return Err(EpError::Config("records of 0 bytes".into()));
        }
        for sh in self.shared() {
            lock(sh)?.record_bytes.insert(key, bytes);
        }
        Ok(())
    }

    /// Sets how long a fence or all-gather waits for another endpoint (a process still busy
    /// with its compute between two operations is not late; one that never arrives is).
    pub fn set_peer_timeout(&self, d: Duration) {
        for sh in self.shared() {
            sh.peer_timeout
                .store(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
        }
    }

    /// Host view of rank `src`'s send window for rank `dst`'s window `key` (diagnostics, and
    /// tests that play the kernel's part from the host).
    pub fn send_window(&self, src: u32, dst: u32, key: u32) -> Result<HostView> {
        let sh = self
            .endpoint_of(src)
            .ok_or_else(|| EpError::Config(format!("rank {src} is not hosted here")))?;
        lock(sh)?
            .wins
            .get(&(key, dst, src))
            .and_then(|w| w.shadow.as_ref().map(|s| s.1.clone()))
            .ok_or_else(|| EpError::Config(format!("no send window {key} of rank {src} for {dst}")))
    }

    /// What each hosted endpoint's proxy moved so far (node, stats).
    pub fn stats(&self) -> Result<Vec<(u32, ProxyStats)>> {
        self.shared()
            .map(|sh| Ok((sh.engine.endpoint(), lock(sh)?.stats)))
            .collect()
    }

    /// [`Transport::all_gather`] over the engine: each hosted endpoint sends the rows of its
    /// node's ranks to every other endpoint and collects theirs.
    fn gather_rows(&self, hosted: &[u32], mine: Vec<Vec<u32>>) -> Result<Vec<Vec<u32>>> {
        if hosted.len() != mine.len() {
            return Err(EpError::Shape(format!(
                "{} rows for {} hosted ranks",
                mine.len(),
                hosted.len()
            )));
        }
        let mut all: Vec<Option<Vec<u32>>> = vec![None; self.ranks as usize];
        for (&r, row) in hosted.iter().zip(mine) {
            *all.get_mut(r as usize)
                .ok_or_else(|| EpError::Shape(format!("rank {r} of {}", self.ranks)))? = Some(row);
        }
        for sh in self.shared() {
            let node = sh.engine.endpoint();
            let part = encode_rows(&all, node * sh.per_ep..(node + 1) * sh.per_ep);
            let mut st = lock(sh)?;
            st.gather_seq += 1;
            for to in (0..sh.engine.endpoints()).filter(|&t| t != node) {
                sh.engine.blob(to, st.gather_seq, part.clone())?;
            }
        }
        for sh in self.shared() {
            for (from, data) in wait_blobs(sh)? {
                let hosted_here = self.endpoint_of(from * sh.per_ep).is_some();
                if !hosted_here {
                    decode_rows(&data, &mut all)?;
                }
            }
        }
        all.into_iter()
            .enumerate()
            .map(|(r, row)| {
                row.ok_or_else(|| EpError::Engine(format!("no row of rank {r} arrived")))
            })
            .collect()
    }

    fn shared(&self) -> impl Iterator<Item = &Shared> {
        self.eps.iter().map(|e| &*e.sh)
    }

    /// Sends a fence of `phase` from every hosted endpoint to every other endpoint and waits
    /// for theirs.
    fn fence_all(&self, phase: u32) -> Result<()> {
        for sh in self.shared() {
            let st = lock(sh)?;
            let (me, n) = (sh.engine.endpoint(), sh.engine.endpoints());
            for to in (0..n).filter(|&t| t != me) {
                sh.engine.fence(to, st.epoch, phase)?;
            }
        }
        for sh in self.shared() {
            wait_fences(sh, phase)?;
        }
        Ok(())
    }
}

impl Win {
    fn new(
        spec: &WindowSpec,
        real: Option<HostView>,
        shadow: Option<(Buffer<u8>, HostView)>,
    ) -> Win {
        let n = match &spec.kind {
            WindowKind::Rings(r) => r.len(),
            WindowKind::Sparse { .. } => 0,
        };
        Win {
            kind: spec.kind.clone(),
            real,
            shadow,
            sent_tail: vec![0; n],
            sent_head: vec![0; n],
        }
    }
}

/// Ranks per endpoint of an engine of `endpoints` endpoints: one per node or one per rank.
fn endpoint_ranks(endpoints: u32, ranks: u32, gpus_per_node: u32) -> Result<u32> {
    match endpoints {
        e if e == ranks / gpus_per_node => Ok(gpus_per_node),
        e if e == ranks => Ok(1),
        e => Err(EpError::Config(format!(
            "engine of {e} endpoints: want one per node ({}) or one per rank ({ranks})",
            ranks / gpus_per_node
        ))),
    }
}

/// The default [`ProxyTransport::set_peer_timeout`]: 10 minutes (NCCL's and PyTorch's usual
/// collective timeout), or `timeout` when that is longer.
pub fn default_peer_timeout(timeout: Duration) -> Duration {
    timeout.max(Duration::from_secs(600))
}

impl Shared {
    fn peer_wait(&self) -> Duration {
        Duration::from_nanos(self.peer_timeout.load(Ordering::Relaxed))
    }
}

/// Waits until every other endpoint's fence of the current epoch and `phase` arrived.
fn wait_fences(sh: &Shared, phase: u32) -> Result<()> {
    let (me, n) = (sh.engine.endpoint(), sh.engine.endpoints());
    let wait = sh.peer_wait();
    let deadline = Instant::now() + wait;
    let mut st = lock(sh)?;
    loop {
        if let Some(e) = &st.error {
            return Err(EpError::Engine(e.clone()));
        }
        let got = st
            .fences
            .get(&(st.epoch, phase))
            .cloned()
            .unwrap_or_default();
        let missing = (0..n).find(|&e| e != me && !got.contains(&e));
        let Some(peer) = missing else {
            let e = st.epoch;
            st.fences.remove(&(e, phase));
            return Ok(());
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(EpError::Timeout {
                rank: peer * sh.per_ep,
                channel: 0,
                role: format!(
                    "proxy of node {me}: no {} fence from node {peer} (ranks {}..{}) within {:?}",
                    if phase == PHASE_BEGIN { "begin" } else { "end" },
                    peer * sh.per_ep,
                    (peer + 1) * sh.per_ep - 1,
                    wait
                ),
                head: got.len() as u32,
                tail: 0,
                expected: n - 1,
            });
        }
        st = sh
            .cv
            .wait_timeout(st, deadline - now)
            .map_err(|_| EpError::Engine("proxy state lock poisoned".into()))?
            .0;
    }
}

/// `(rank, len, values...)` of the rows of `ranks` present in `all`.
fn encode_rows(all: &[Option<Vec<u32>>], ranks: std::ops::Range<u32>) -> Vec<u8> {
    let mut b = Vec::new();
    for r in ranks {
        if let Some(Some(row)) = all.get(r as usize) {
            for v in [r, row.len() as u32].iter().chain(row) {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    b
}

fn decode_rows(b: &[u8], all: &mut [Option<Vec<u32>>]) -> Result<()> {
    let w: Vec<u32> = b
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut i = 0;
    while i + 2 <= w.len() {
        let (r, n) = (w[i] as usize, w[i + 1] as usize);
        let row = w.get(i + 2..i + 2 + n);
        match (all.get_mut(r), row) {
            (Some(slot), Some(row)) => *slot = Some(row.to_vec()),
            _ => {
                return Err(EpError::Engine(format!(
                    "malformed all-gather part (rank {r})"
                )))
            }
        }
        i += 2 + n;
    }
    Ok(())
}

/// Waits for every other endpoint's part of this endpoint's current all-gather.
fn wait_blobs(sh: &Shared) -> Result<Vec<(u32, Vec<u8>)>> {
    let (me, n) = (sh.engine.endpoint(), sh.engine.endpoints());
    let wait = sh.peer_wait();
    let deadline = Instant::now() + wait;
    let mut st = lock(sh)?;
    loop {
        if let Some(e) = &st.error {
            return Err(EpError::Engine(e.clone()));
        }
        let seq = st.gather_seq;
        let missing = (0..n).find(|&e| e != me && !st.blobs.contains_key(&(seq, e)));
        let Some(peer) = missing else {
            let parts = (0..n)
                .filter(|&e| e != me)
                .filter_map(|e| st.blobs.remove(&(seq, e)).map(|d| (e, d)))
                .collect();
            return Ok(parts);
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(EpError::Timeout {
                rank: peer * sh.per_ep,
                channel: 0,
                role: format!(
                    "proxy of node {me}: all-gather {seq} got nothing from node {peer} within {:?}",
                    wait
                ),
                head: 0,
                tail: 0,
                expected: n - 1,
            });
        }
        st = sh
            .cv
            .wait_timeout(st, deadline - now)
            .map_err(|_| EpError::Engine("proxy state lock poisoned".into()))?
            .0;
    }
}

/// The proxy thread of one endpoint: pump doorbells and heads, apply incoming messages.
fn proxy_loop(sh: &Shared) {
    while !sh.stop.load(Ordering::Acquire) {
        let progress = match lock(sh) {
            Ok(mut st) => {
                if st.error.is_some() {
                    false
                } else {
                    match step(sh, &mut st) {
                        Ok(p) => p,
                        Err(e) => {
                            st.error = Some(e.to_string());
                            st.hold = None;
                            sh.cv.notify_all();
                            false
                        }
                    }
                }
            }
            Err(_) => return,
        };
        if !progress {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// One round: ship doorbells and heads, apply what arrived, watch for a stall.
fn step(sh: &Shared, st: &mut State) -> Result<bool> {
    let mut progress = pump(sh, st)?;
    for _ in 0..256 {
        match sh.engine.poll()? {
            Some(m) => {
                apply(sh, st, m)?;
                progress = true;
            }
            None => break,
        }
    }
    if progress {
        st.last_progress = Instant::now();
    } else if st.hold.is_some() && st.last_progress.elapsed() > sh.timeout {
        // Nothing moved for the timeout: let emulated time run so the kernels' own timeouts
        // fire and name the waiting rank, channel and role.
        st.hold = None;
    }
    Ok(progress)
}

/// Ships new records of every send window (put, then signal the tail) and new heads of every
/// real window back to the sources' send windows.
fn pump(sh: &Shared, st: &mut State) -> Result<bool> {
    let epoch = st.epoch;
    let mut progress = false;
    let stats = &mut st.stats;
    for (&(key, owner, src), w) in st.wins.iter_mut() {
        let rec = st.record_bytes.get(&key).copied();
        let WindowKind::Rings(rings) = &w.kind else {
            continue;
        };
        if let Some((_, view)) = &w.shadow {
            let target = Target {
                key,
                owner,
                src,
                shadow: false,
            };
            let to = owner / sh.per_ep;
            for (i, r) in rings.iter().enumerate() {
                let t = view.load_acquire_u32(r.tail_off)?;
                if t != w.sent_tail[i] {
                    let span = (w.sent_tail[i], t);
                    ship_ring(sh, stats, (view, r, rec), span, (to, epoch, target))?;
                    w.sent_tail[i] = t;
                    progress = true;
                }
            }
        }
        if let Some(view) = &w.real {
            let target = Target {
                key,
                owner,
                src,
                shadow: true,
            };
            for (i, r) in rings.iter().enumerate() {
                let h = view.load_acquire_u32(r.head_off)?;
                if h != w.sent_head[i] {
                    sh.engine
                        .signal(src / sh.per_ep, epoch, target, r.head_off, h)?;
                    stats.signals += 1;
                    w.sent_head[i] = h;
                    progress = true;
                }
            }
        }
    }
    Ok(progress)
}

/// Puts records `old..new` (counts without the finished bit) of ring `r` (the first `rec`
/// bytes of each slot, or whole slots), then signals `new`.
fn ship_ring(
    sh: &Shared,
    stats: &mut ProxyStats,
    (view, r, rec): (&HostView, &RingSpec, Option<u32>),
    (old, new): (u32, u32),
    (to, epoch, target): (u32, u32, Target),
) -> Result<()> {
    let (mut c, end) = (old & !FIN, new & !FIN);
    if end < c || end - c > r.slots {
        return Err(EpError::Engine(format!(
            "ring tail moved from {old:#x} to {new:#x} (ring of {} slots)",
            r.slots
        )));
    }
    let len = rec.map_or(r.slot_bytes, |b| b.min(r.slot_bytes)) as usize;
    while c < end {
        let pos = c % r.slots;
        let run = (end - c).min(r.slots - pos);
        let offset = r.data_off + pos as u64 * r.slot_bytes as u64;
        let mut data = vec![0u8; run as usize * r.slot_bytes as usize];
        view.read(offset, &mut data)?;
        let op = if len == r.slot_bytes as usize {
            Op::Put { offset, data }
        } else {
            let data = data
                .chunks(r.slot_bytes as usize)
                .flat_map(|slot| &slot[..len])
                .copied()
                .collect();
            let (stride, len) = (r.slot_bytes, len as u32);
            Op::PutRecords {
                offset,
                stride,
                len,
                data,
            }
        };
        stats.put_bytes += run as u64 * len as u64;
        stats.puts += 1;
        sh.engine.send_op(to, epoch, target, op)?;
        c += run;
    }
    stats.signals += 1;
    sh.engine.signal(to, epoch, target, r.tail_off, new)
}

/// Applies one incoming message (older epochs' messages are dropped).
fn apply(sh: &Shared, st: &mut State, m: Msg) -> Result<()> {
    match m.op {
        Op::Fence { phase } => {
            st.fences
                .entry((m.epoch, phase))
                .or_default()
                .insert(m.from);
            sh.cv.notify_all();
            return Ok(());
        }
        Op::Blob { seq, data } => {
            st.blobs.insert((seq, m.from), data);
            sh.cv.notify_all();
            return Ok(());
        }
        _ => {}
    }
    if m.epoch < st.epoch {
        return Ok(());
    }
    let t = m.target;
    let w = st.wins.get(&(t.key, t.owner, t.src)).ok_or_else(|| {
        EpError::Engine(format!(
            "message for unregistered window {} of rank {} from rank {}",
            t.key, t.owner, t.src
        ))
    })?;
    let view = if t.shadow {
        w.shadow.as_ref().map(|s| &s.1)
    } else {
        w.real.as_ref()
    }
    .ok_or_else(|| EpError::Engine(format!("window {:?} has no such side here", t)))?;
    st.stats.applied += 1;
    match m.op {
        Op::Put { offset, data } => view.write(offset, &data)?,
        Op::PutRecords {
            offset,
            stride,
            len,
            data,
        } => write_records(view, offset, stride, len, &data)?,
        Op::Signal { offset, value } => view.store_release_u32(offset, value)?,
        Op::Fence { .. } | Op::Blob { .. } => {}
    }
    Ok(())
}

/// Writes records of `len` bytes (back to back in `data`) at `offset + i * stride`.
fn write_records(view: &HostView, offset: u64, stride: u32, len: u32, data: &[u8]) -> Result<()> {
    if len == 0 || len > stride || data.len() % len as usize != 0 {
        return Err(EpError::Engine(format!(
            "malformed record put: {} bytes of {len}-byte records, stride {stride}",
            data.len()
        )));
    }
    for (i, rec) in data.chunks(len as usize).enumerate() {
        view.write(offset + i as u64 * stride as u64, rec)?;
    }
    Ok(())
}

/// Puts every written word (not the poison pattern) of the sparse send windows.
fn flush_sparse(sh: &Shared, st: &mut State) -> Result<()> {
    let epoch = st.epoch;
    for (&(key, owner, src), w) in &st.wins {
        let (WindowKind::Sparse { poison }, Some((_, view))) = (&w.kind, &w.shadow) else {
            continue;
        };
        let mut bytes = vec![0u8; view.len() as usize];
        view.read(0, &mut bytes)?;
        let target = Target {
            key,
            owner,
            src,
            shadow: false,
        };
        let words: Vec<bool> = bytes
            .chunks(4)
            .map(|c| c.iter().any(|b| b != poison))
            .collect();
        let mut i = 0;
        while i < words.len() {
            if !words[i] {
                i += 1;
                continue;
            }
            let j = (i..words.len()).find(|&j| !words[j]).unwrap_or(words.len());
            let (a, b) = (i * 4, (j * 4).min(bytes.len()));
            st.stats.put_bytes += (b - a) as u64;
            st.stats.puts += 1;
            sh.engine.put(
                owner / sh.per_ep,
                epoch,
                target,
                a as u64,
                bytes[a..b].to_vec(),
            )?;
            i = j;
        }
    }
    Ok(())
}

impl Transport for ProxyTransport {
    fn ranks(&self) -> u32 {
        self.ranks
    }
    fn gpus_per_node(&self) -> u32 {
        self.gpus_per_node
    }
    fn remote_ptr(&self, _src: u32, _dst: u32, _buf: &Buffer<u8>) -> runtime::Result<u64> {
        Err(runtime::RuntimeError::Buffer(
            "the proxy transport needs the window's layout: use Transport::window".into(),
        ))
    }
    fn window(&self, src: u32, dst: u32, buf: &Buffer<u8>, spec: &WindowSpec) -> Result<u64> {
        self.expose_window(dst, src, buf, spec)?;
        self.attach_window(src, dst, buf.len(), spec)
    }
    fn expose(&self, owner: u32, src: u32, buf: &Buffer<u8>, spec: &WindowSpec) -> Result<()> {
        self.expose_window(owner, src, buf, spec)
    }
    fn attach(&self, src: u32, dst: u32, bytes: usize, spec: &WindowSpec) -> Result<u64> {
        self.attach_window(src, dst, bytes, spec)
    }
    fn all_gather(&self, hosted: &[u32], mine: Vec<Vec<u32>>) -> Result<Vec<Vec<u32>>> {
        self.gather_rows(hosted, mine)
    }
    fn record_bytes(&self, key: u32, bytes: u32) -> Result<()> {
        self.set_record_bytes(key, bytes)
    }
    fn begin(&self) -> Result<()> {
        for sh in self.shared() {
            let mut st = lock(sh)?;
            if let Some(e) = &st.error {
                return Err(EpError::Engine(e.clone()));
            }
            st.epoch += 1;
            let mut rings = false;
            for w in st.wins.values_mut() {
                if let (WindowKind::Rings(rs), Some((_, v))) = (&w.kind, &w.shadow) {
                    for r in rs {
                        v.store_release_u32(r.tail_off, 0)?;
                        v.store_release_u32(r.head_off, 0)?;
                    }
                }
                rings |= matches!(w.kind, WindowKind::Rings(_));
                w.sent_tail.iter_mut().for_each(|t| *t = 0);
                w.sent_head.iter_mut().for_each(|t| *t = 0);
            }
            st.hold = rings.then(emu::clock::Hold::new);
            st.last_progress = Instant::now();
        }
        let r = self.fence_all(PHASE_BEGIN);
        if r.is_err() {
            self.abort(); // no operation follows: let emulated time go on
        }
        r
    }
    fn end(&self) -> Result<()> {
        for sh in self.shared() {
            let mut st = lock(sh)?;
            pump(sh, &mut st)?;
            flush_sparse(sh, &mut st)?;
        }
        let r = self.fence_all(PHASE_END);
        self.abort();
        r
    }
    fn abort(&self) {
        for sh in self.shared() {
            if let Ok(mut st) = lock(sh) {
                st.hold = None;
                // sparse windows serve one operation (their buffers are per call)
                st.wins
                    .retain(|_, w| !matches!(w.kind, WindowKind::Sparse { .. }));
            }
        }
    }
    fn proxy_stats(&self) -> Vec<(u32, ProxyStats)> {
        self.stats().unwrap_or_default()
    }
    fn name(&self) -> &'static str {
        "proxy (send windows + host proxy threads over an engine)"
    }
}

impl Drop for ProxyTransport {
    fn drop(&mut self) {
        for ep in &self.eps {
            ep.sh.stop.store(true, Ordering::Release);
        }
        for ep in &mut self.eps {
            if let Some(t) = ep.thread.take() {
                // a proxy thread that panicked has nothing left to clean up
                let _ = t.join();
            }
        }
    }
}
