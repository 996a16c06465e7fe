//! The TCP mesh: one connection per pair of ranks of a [`Group`], the byte transport under
//! `ep::MeshEngine` (the inter-node engine of processes that have no MPI world). This module
//! owns the connections, their framing, their threads and their faults.
//!
//! - **Setup** ([`Mesh::connect`]): every rank listens on an ephemeral port of the interface
//!   its store connection uses (so the address family and interface of MASTER_ADDR), the
//!   addresses are exchanged with [`Group::all_gather`], each rank dials the higher ranks and
//!   accepts the lower ones. A dialer sends a hello (magic, job id, its rank, the rank it
//!   wants, the world size); the acceptor answers ok or refuses a foreign, misaddressed or
//!   duplicate connection with the reason, which the dialer returns as
//!   [`DistError::MeshRefused`]. Dialing retries until the bootstrap timeout.
//! - **Frames**: a u32 LE length, then that many bytes; frames over [`MAX_FRAME`] are refused
//!   on both sides. The length `u32::MAX` alone is the goodbye frame.
//! - **Threads**: per link a writer fed by a queue ([`Mesh::send`] never blocks on the
//!   receiver) and a reader pushing `(from, bytes)` into the one inbox; a rank's frames to
//!   itself go to the inbox directly. Frames of one sender arrive in the order it sent them.
//! - **Faults**: a link that ends without a goodbye (the peer died, a reset, a bad frame) makes
//!   the next [`Mesh::send`] to that peer and every later receive return
//!   [`DistError::PeerLost`] naming the rank. Dropping the mesh sends goodbyes, so an orderly
//!   end is not a fault: frames for a peer that said goodbye are dropped (it reads no more).

use crate::error::{DistError, Result};
use crate::group::Group;
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest frame sent or accepted (1 GiB).
pub const MAX_FRAME: usize = 1 << 30;
/// The length that marks a goodbye frame.
const GOODBYE: u32 = u32::MAX;
/// First bytes of a hello: a connection from anything else is refused.
const MAGIC: &[u8; 8] = b"ptxmesh1";
/// Largest hello or handshake answer read (a foreign peer cannot make us allocate more).
const MAX_HELLO: usize = 4096;
/// Longest single connect or handshake read (a silent peer must not hold the setup).
const ATTEMPT: Duration = Duration::from_secs(5);
/// How long a failed writer waits for its reader to see the peer's goodbye.
const SETTLE: Duration = Duration::from_secs(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a link ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fate {
    Open,
    Goodbye,
    Lost(String),
}

/// A link's fate, shared by its threads and the mesh; the first end recorded wins.
struct LinkState {
    fate: Mutex<Fate>,
    changed: Condvar,
}

impl LinkState {
    fn new() -> Arc<LinkState> {
        Arc::new(LinkState {
            fate: Mutex::new(Fate::Open),
            changed: Condvar::new(),
        })
    }
    fn get(&self) -> Fate {
        lock(&self.fate).clone()
    }
    fn end(&self, f: Fate) {
        let mut g = lock(&self.fate);
        if *g == Fate::Open {
            *g = f;
        }
        self.changed.notify_all();
    }
    /// The fate once it is not open, or open after `within`.
    fn settle(&self, within: Duration) -> Fate {
        let g = lock(&self.fate);
        let (g, _) = self
            .changed
            .wait_timeout_while(g, within, |f| *f == Fate::Open)
            .unwrap_or_else(|p| p.into_inner());
        g.clone()
    }
}

/// What a reader puts into the inbox.
enum Event {
    Frame(usize, Vec<u8>),
    Lost(usize, String),
}

/// One peer's connection and its two threads.
struct Link {
    stream: TcpStream,
    queue: Option<Sender<Vec<u8>>>,
    state: Arc<LinkState>,
    threads: Vec<JoinHandle<()>>,
}

/// A full mesh of TCP connections between the ranks of a [`Group`] (see the module docs).
pub struct Mesh {
    rank: usize,
    world: usize,
    /// Indexed by peer rank; `None` at this rank.
    links: Vec<Option<Link>>,
    /// This rank's frames to itself.
    loopback: Sender<Event>,
    inbox: Mutex<Receiver<Event>>,
    /// The first lost peer a receive reported: every later receive reports it again.
    lost: Mutex<Option<(usize, String)>>,
    closing: Arc<AtomicBool>,
}

/// What the setup needs of the group.
struct Setup {
    rank: usize,
    world: usize,
    job: String,
    deadline: Instant,
    /// Set when dialing failed: the acceptor stops waiting (the dial error is reported).
    abandoned: AtomicBool,
}

impl Mesh {
    /// Connects every pair of ranks of `group` (every rank calls it, as a collective).
    pub fn connect(group: &Group) -> Result<Mesh> {
        let env = group.env();
        let setup = Setup {
            rank: env.rank,
            world: env.world_size,
            job: env.job_id.clone(),
            deadline: Instant::now() + env.bootstrap_timeout,
            abandoned: AtomicBool::new(false),
        };
        let ip = group.local_addr()?.ip();
        let listener = TcpListener::bind((ip, 0)).map_err(|source| DistError::Bind {
            addr: format!("{ip}:0 (mesh listener)"),
            source,
        })?;
        let mine = listener.local_addr()?.to_string();
        let addrs = parse_addrs(&group.all_gather(mine.as_bytes())?)?;
        let streams = std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_lower(&listener, &setup));
            let dialed = dial_higher(&addrs, &setup);
            if dialed.is_err() {
                setup.abandoned.store(true, Ordering::SeqCst);
            }
            let accepted = acceptor
                .join()
                .unwrap_or_else(|_| Err(DistError::Protocol("mesh acceptor panicked".into())));
            Ok::<_, DistError>((dialed?, accepted?))
        })?;
        let mut all: Vec<Option<TcpStream>> = (0..setup.world).map(|_| None).collect();
        for (peer, s) in streams.0.into_iter().chain(streams.1) {
            all[peer] = Some(s);
        }
        Mesh::start(&setup, all, env.peer_timeout)
    }

    /// Starts the threads of every link.
    fn start(
        setup: &Setup,
        streams: Vec<Option<TcpStream>>,
        write_timeout: Duration,
    ) -> Result<Mesh> {
        let (tx, rx) = channel();
        let closing = Arc::new(AtomicBool::new(false));
        let mut links = Vec::with_capacity(streams.len());
        for (peer, s) in streams.into_iter().enumerate() {
            let link = match s {
                Some(s) => Some(start_link(peer, s, &tx, &closing, write_timeout)?),
                None => None,
            };
            links.push(link);
        }
        Ok(Mesh {
            rank: setup.rank,
            world: setup.world,
            links,
            loopback: tx,
            inbox: Mutex::new(rx),
            lost: Mutex::new(None),
            closing,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the mesh.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Queues `bytes` for rank `to` (never waits for the receiver). Frames for a peer that
    /// left with a goodbye are dropped; a lost peer is [`DistError::PeerLost`].
    pub fn send(&self, to: usize, bytes: Vec<u8>) -> Result<()> {
        if bytes.len() > MAX_FRAME {
            return Err(DistError::FrameTooLarge {
                bytes: bytes.len(),
                limit: MAX_FRAME,
            });
        }
        if to == self.rank {
            return self
                .loopback
                .send(Event::Frame(to, bytes))
                .map_err(|_| DistError::Protocol("mesh inbox closed".into()));
        }
        let link =
            self.links
                .get(to)
                .and_then(Option::as_ref)
                .ok_or_else(|| DistError::BadOption {
                    field: "mesh destination",
                    reason: format!("rank {to} is not in a mesh of {} ranks", self.world),
                })?;
        if link.state.get() == Fate::Open {
            if let Some(Ok(())) = link.queue.as_ref().map(|q| q.send(bytes)) {
                return Ok(());
            }
        }
        // the writer has stopped: it recorded why before dropping its queue
        match link.state.get() {
            Fate::Goodbye => Ok(()),
            Fate::Lost(reason) => Err(DistError::PeerLost { rank: to, reason }),
            Fate::Open => Err(DistError::PeerLost {
                rank: to,
                reason: "its writer thread stopped".into(),
            }),
        }
    }

    /// The next frame that arrived, if any, with its sender.
    pub fn try_recv(&self) -> Result<Option<(usize, Vec<u8>)>> {
        let rx = lock(&self.inbox);
        self.check_lost()?;
        match rx.try_recv() {
            Ok(ev) => self.event(ev).map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(DistError::Protocol("mesh inbox closed".into())),
        }
    }

    /// The next frame, waiting up to `timeout` (`None` when none came).
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<(usize, Vec<u8>)>> {
        let rx = lock(&self.inbox);
        self.check_lost()?;
        match rx.recv_timeout(timeout) {
            Ok(ev) => self.event(ev).map(Some),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                Err(DistError::Protocol("mesh inbox closed".into()))
            }
        }
    }

    fn check_lost(&self) -> Result<()> {
        match lock(&self.lost).clone() {
            Some((rank, reason)) => Err(DistError::PeerLost { rank, reason }),
            None => Ok(()),
        }
    }

    fn event(&self, ev: Event) -> Result<(usize, Vec<u8>)> {
        match ev {
            Event::Frame(from, b) => Ok((from, b)),
            Event::Lost(rank, reason) => {
                *lock(&self.lost) = Some((rank, reason.clone()));
                Err(DistError::PeerLost { rank, reason })
            }
        }
    }
}

impl Drop for Mesh {
    /// Goodbyes after every queued frame, then the readers are woken and every thread joined.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        // every writer flushes and says goodbye at once, then each is joined
        for l in self.links.iter_mut().flatten() {
            l.queue.take();
        }
        for l in self.links.iter_mut().flatten() {
            if let Some(w) = l.threads.pop() {
                // a writer that panicked has nothing left to flush
                let _ = w.join();
            }
            // wakes the reader blocked in read (it returns end of file)
            let _ = l.stream.shutdown(Shutdown::Both);
            for t in l.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

/// The ranks' `ip:port` addresses from the all-gather.
fn parse_addrs(raw: &[Vec<u8>]) -> Result<Vec<SocketAddr>> {
    raw.iter()
        .enumerate()
        .map(|(r, b)| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    DistError::Protocol(format!(
                        "rank {r} published the mesh address {:?}",
                        String::from_utf8_lossy(b)
                    ))
                })
        })
        .collect()
}

/// The hello a dialer sends: magic, from, to, world (u32 LE), then the job id.
fn hello(from: usize, to: usize, world: usize, job: &str) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    for v in [from, to, world] {
        b.extend_from_slice(&(v as u32).to_le_bytes());
    }
    b.extend_from_slice(job.as_bytes());
    b
}

/// The dialer's rank from a hello, or why the connection is refused. `taken`: ranks already
/// connected.
fn check_hello(b: &[u8], s: &Setup, taken: &[bool]) -> std::result::Result<usize, String> {
    if b.len() < 20 || &b[..8] != MAGIC {
        return Err("not a ptxforge mesh hello".into());
    }
    let at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as usize;
    let (from, to, world) = (at(8), at(12), at(16));
    let job = String::from_utf8_lossy(&b[20..]);
    if job != s.job {
        return Err(format!("job `{job}` dialed the mesh of job `{}`", s.job));
    }
    if to != s.rank || world != s.world {
        return Err(format!(
            "addressed to rank {to} of {world}; this is rank {} of {}",
            s.rank, s.world
        ));
    }
    if from >= s.rank {
        return Err(format!(
            "rank {from} must not dial rank {} (lower ranks dial)",
            s.rank
        ));
    }
    if taken[from] {
        return Err(format!(
            "rank {from} is already connected to rank {}",
            s.rank
        ));
    }
    Ok(from)
}

/// Dials every higher rank (retrying until the deadline); returns the connections.
fn dial_higher(addrs: &[SocketAddr], s: &Setup) -> Result<Vec<(usize, TcpStream)>> {
    (s.rank + 1..s.world)
        .map(|peer| dial(peer, addrs[peer], s).map(|c| (peer, c)))
        .collect()
}

fn dial(peer: usize, addr: SocketAddr, s: &Setup) -> Result<TcpStream> {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(10);
    let mut c = loop {
        let left = s.deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.clamp(Duration::from_millis(10), ATTEMPT)) {
            Ok(c) => break c,
            Err(e) if Instant::now() >= s.deadline => {
                return Err(DistError::MeshConnect {
                    peer,
                    addr: addr.to_string(),
                    waited: start.elapsed(),
                    last_error: e.to_string(),
                })
            }
            Err(_) => std::thread::sleep(backoff.min(left)),
        }
        backoff = (backoff * 2).min(Duration::from_millis(500));
    };
    c.set_nodelay(true)?;
    c.set_read_timeout(Some(handshake_wait(s)))?;
    write_frame(&mut c, &hello(s.rank, peer, s.world, &s.job))?;
    let answer = read_small(&mut c)?;
    c.set_read_timeout(None)?;
    match answer.split_first() {
        Some((0, _)) => Ok(c),
        Some((_, why)) => Err(DistError::MeshRefused {
            peer,
            addr: addr.to_string(),
            reason: String::from_utf8_lossy(why).into_owned(),
        }),
        None => Err(DistError::Protocol(format!(
            "empty handshake answer from rank {peer}"
        ))),
    }
}

/// The time left for a handshake read (at least a little, so a late setup still reads).
fn handshake_wait(s: &Setup) -> Duration {
    s.deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100))
}

/// Accepts the lower ranks until all came or the deadline; foreign connections are refused.
fn accept_lower(l: &TcpListener, s: &Setup) -> Result<Vec<(usize, TcpStream)>> {
    l.set_nonblocking(true)?;
    let mut got: Vec<Option<TcpStream>> = (0..s.rank).map(|_| None).collect();
    let start = Instant::now();
    while got.iter().any(Option::is_none) {
        match l.accept() {
            Ok((c, _)) => {
                let taken: Vec<bool> = got.iter().map(Option::is_some).collect();
                if let Some((from, c)) = greet(c, s, &taken) {
                    got[from] = Some(c);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if s.abandoned.load(Ordering::SeqCst) {
                    return Err(DistError::Protocol("mesh setup abandoned".into()));
                }
                if Instant::now() >= s.deadline {
                    return Err(DistError::MeshTimeout {
                        rank: s.rank,
                        waited: start.elapsed(),
                        missing: (0..s.rank).filter(|&r| got[r].is_none()).collect(),
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got
        .into_iter()
        .enumerate()
        .filter_map(|(r, c)| Some((r, c?)))
        .collect())
}

/// Reads a dialer's hello and answers it; `None` for a refused or broken connection (the
/// dialer hears why; this rank keeps waiting for its real peers).
fn greet(mut c: TcpStream, s: &Setup, taken: &[bool]) -> Option<(usize, TcpStream)> {
    c.set_nonblocking(false).ok()?;
    c.set_nodelay(true).ok()?;
    c.set_read_timeout(Some(handshake_wait(s).min(ATTEMPT)))
        .ok()?;
    let b = read_small(&mut c).ok()?;
    match check_hello(&b, s, taken) {
        Ok(from) => {
            write_frame(&mut c, &[0]).ok()?;
            c.set_read_timeout(None).ok()?;
            Some((from, c))
        }
        Err(why) => {
            let mut answer = vec![1];
            answer.extend_from_slice(why.as_bytes());
            // the dialer may have gone already; it is refused either way
            let _ = write_frame(&mut c, &answer);
            None
        }
    }
}

fn write_frame(c: &mut TcpStream, b: &[u8]) -> Result<()> {
    let mut f = (b.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(b);
    c.write_all(&f)?;
    Ok(())
}

/// One handshake frame (at most [`MAX_HELLO`] bytes).
fn read_small(c: &mut TcpStream) -> Result<Vec<u8>> {
    let mut h = [0u8; 4];
    c.read_exact(&mut h)?;
    let n = u32::from_le_bytes(h) as usize;
    if n > MAX_HELLO {
        return Err(DistError::Protocol(format!(
            "handshake frame of {n} bytes (at most {MAX_HELLO})"
        )));
    }
    let mut b = vec![0; n];
    c.read_exact(&mut b)?;
    Ok(b)
}

fn start_link(
    peer: usize,
    s: TcpStream,
    inbox: &Sender<Event>,
    closing: &Arc<AtomicBool>,
    write_timeout: Duration,
) -> Result<Link> {
    s.set_write_timeout(Some(write_timeout))?;
    let state = LinkState::new();
    let (tx, rx) = channel();
    let (ws, st) = (s.try_clone()?, state.clone());
    let writer = std::thread::Builder::new()
        .name(format!("mesh-write-{peer}"))
        .spawn(move || write_loop(ws, rx, &st))?;
    let (rs, st, ib, cl) = (
        s.try_clone()?,
        state.clone(),
        inbox.clone(),
        closing.clone(),
    );
    let reader = std::thread::Builder::new()
        .name(format!("mesh-read-{peer}"))
        .spawn(move || read_loop(rs, peer, &ib, &st, &cl))?;
    Ok(Link {
        stream: s,
        queue: Some(tx),
        state,
        // the writer last: the drop joins it first
        threads: vec![reader, writer],
    })
}

/// Writes queued frames (flushing when the queue runs dry) until the queue closes, then the
/// goodbye. A failure is the link's end unless the reader sees the peer's goodbye meanwhile.
fn write_loop(s: TcpStream, q: Receiver<Vec<u8>>, state: &LinkState) {
    if let Err(e) = write_frames(&s, &q) {
        if state.settle(SETTLE) == Fate::Open {
            state.end(Fate::Lost(format!("writing to it: {e}")));
        }
    }
}

fn write_frames(s: &TcpStream, q: &Receiver<Vec<u8>>) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(256 << 10, s);
    loop {
        let frame = match q.try_recv() {
            Ok(f) => f,
            Err(TryRecvError::Empty) => {
                w.flush()?;
                match q.recv() {
                    Ok(f) => f,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        w.write_all(&(frame.len() as u32).to_le_bytes())?;
        w.write_all(&frame)?;
    }
    w.write_all(&GOODBYE.to_le_bytes())?;
    w.flush()?;
    s.shutdown(Shutdown::Write)
}

/// Reads frames into the inbox until the goodbye, an error or this mesh's drop.
fn read_loop(
    s: TcpStream,
    peer: usize,
    inbox: &Sender<Event>,
    state: &LinkState,
    closing: &AtomicBool,
) {
    let fate = match read_frames(s, peer, inbox, closing) {
        Ok(()) => Fate::Goodbye,
        Err(_) if closing.load(Ordering::SeqCst) => Fate::Goodbye,
        Err(reason) => {
            // after the frames that came before it; a closed inbox has nobody to tell
            let _ = inbox.send(Event::Lost(peer, reason.clone()));
            Fate::Lost(reason)
        }
    };
    state.end(fate);
}

fn read_frames(
    mut s: TcpStream,
    peer: usize,
    inbox: &Sender<Event>,
    closing: &AtomicBool,
) -> std::result::Result<(), String> {
    loop {
        let n = match read_header(&mut s)? {
            GOODBYE => return Ok(()),
            n => n as usize,
        };
        if n > MAX_FRAME {
            return Err(format!(
                "it sent a frame of {n} bytes, over the {MAX_FRAME}-byte limit"
            ));
        }
        let mut b = vec![0; n];
        s.read_exact(&mut b)
            .map_err(|e| format!("reading a frame of {n} bytes: {e}"))?;
        if inbox.send(Event::Frame(peer, b)).is_err() || closing.load(Ordering::SeqCst) {
            return Ok(());
        }
    }
}

/// The next frame's length; the end of the stream here is a close without a goodbye.
fn read_header(s: &mut TcpStream) -> std::result::Result<u32, String> {
    let mut h = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match s.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Err("closed without a goodbye".into()),
            Ok(0) => return Err("closed in the middle of a frame header".into()),
            Ok(k) => got += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading: {e}")),
        }
    }
    Ok(u32::from_le_bytes(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(rank: usize) -> Setup {
        Setup {
            rank,
            world: 4,
            job: "jobA".into(),
            deadline: Instant::now(),
            abandoned: AtomicBool::new(false),
        }
    }

    #[test]
    fn hellos_of_other_jobs_ranks_or_duplicates_are_refused() {
        let s = setup(2);
        let free = [false, false];
        assert_eq!(check_hello(&hello(1, 2, 4, "jobA"), &s, &free), Ok(1));
        let refused = |b: Vec<u8>, taken: &[bool]| check_hello(&b, &s, taken).unwrap_err();
        assert!(refused(hello(1, 2, 4, "jobB"), &free).contains("job `jobB`"));
        assert!(refused(hello(1, 3, 4, "jobA"), &free).contains("addressed to rank 3"));
        assert!(refused(hello(1, 2, 5, "jobA"), &free).contains("of 5"));
        assert!(refused(hello(3, 2, 4, "jobA"), &free).contains("must not dial"));
        assert!(refused(hello(0, 2, 4, "jobA"), &[true, false]).contains("already connected"));
        assert!(refused(b"GET / HTTP/1.1\r\n\r\n".to_vec(), &free).contains("not a ptxforge"));
        assert!(refused(Vec::new(), &free).contains("not a ptxforge"));
    }

    #[test]
    fn addresses_that_do_not_parse_name_the_rank() {
        let ok = parse_addrs(&[b"127.0.0.1:5".to_vec(), b"[::1]:7".to_vec()]).unwrap();
        assert_eq!(ok[1].port(), 7);
        let e = parse_addrs(&[b"127.0.0.1:5".to_vec(), b"nowhere".to_vec()]).unwrap_err();
        assert!(e.to_string().contains("rank 1"), "{e}");
    }
}
