//! The fake NCCL's transport between ranks: TCP, one connection per pair of ranks.
//!
//! Bootstrap: `ncclGetUniqueId` binds a listener and writes its address into the 128-byte id
//! (magic `PTXFNCCL`, IPv4 address, port, a random nonce). In `ncclCommInitRank`, rank 0 takes
//! that listener (it must run in the process that created the id) and every other rank connects
//! to it, announcing the port of its own listener; rank 0 answers with the table of all ranks'
//! addresses, and each rank then connects to every lower rank other than 0 and accepts from the
//! higher ones. Sends are queued to a writer thread per link (a send never blocks on the peer,
//! so pairwise exchanges cannot deadlock on full socket buffers); receives read the link on the
//! caller's thread, with a timeout (`PTXFORGE_FAKENCCL_TIMEOUT`, seconds, default 120).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"PTXFNCCL";
/// Frame kinds on a link.
pub(crate) const P2P: u8 = 1;
pub(crate) const COLL: u8 = 2;

/// A failure with its `ncclResult_t` and the reason (for `ncclGetLastError`).
pub(crate) type NetResult<T> = Result<T, (i32, String)>;
pub(crate) const SYSTEM_ERROR: i32 = 2;
pub(crate) const INVALID_ARGUMENT: i32 = 4;
pub(crate) const INVALID_USAGE: i32 = 5;
pub(crate) const REMOTE_ERROR: i32 = 6;
/// `ncclInProgress`: a non-blocking communicator's operation is still running.
pub(crate) const IN_PROGRESS: i32 = 7;

fn sys(what: &str) -> impl FnOnce(std::io::Error) -> (i32, String) + '_ {
    move |e| (SYSTEM_ERROR, format!("{what}: {e}"))
}

/// Listeners created by `ncclGetUniqueId`, by port, until rank 0 takes one.
fn listeners() -> &'static Mutex<HashMap<u16, TcpListener>> {
    static L: OnceLock<Mutex<HashMap<u16, TcpListener>>> = OnceLock::new();
    L.get_or_init(Default::default)
}

fn timeout() -> Duration {
    let s = std::env::var("PTXFORGE_FAKENCCL_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .unwrap_or(120.0);
    Duration::from_secs_f64(s)
}

/// The decoded unique id.
pub(crate) struct Id {
    addr: SocketAddr,
    nonce: u64,
}

/// A fresh unique id: binds the root listener (`PTXFORGE_FAKENCCL_ADDR`, default 127.0.0.1).
pub(crate) fn new_id() -> NetResult<[u8; 128]> {
    let ip: Ipv4Addr = std::env::var("PTXFORGE_FAKENCCL_ADDR")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(Ipv4Addr::LOCALHOST);
    let l = TcpListener::bind((ip, 0)).map_err(sys("bind the bootstrap listener"))?;
    let port = l.local_addr().map_err(sys("listener address"))?.port();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ ((std::process::id() as u64) << 32)
        ^ port as u64;
    let mut id = [0u8; 128];
    id[..8].copy_from_slice(MAGIC);
    id[8..12].copy_from_slice(&ip.octets());
    id[12..14].copy_from_slice(&port.to_le_bytes());
    id[16..24].copy_from_slice(&nonce.to_le_bytes());
    super::lock(listeners()).insert(port, l);
    Ok(id)
}

pub(crate) fn parse_id(id: &[u8; 128]) -> NetResult<Id> {
    if &id[..8] != MAGIC {
        return Err((
            INVALID_ARGUMENT,
            "the unique id was not made by this (fake) NCCL's ncclGetUniqueId".into(),
        ));
    }
    let ip = Ipv4Addr::new(id[8], id[9], id[10], id[11]);
    let port = u16::from_le_bytes([id[12], id[13]]);
    let mut n = [0u8; 8];
    n.copy_from_slice(&id[16..24]);
    Ok(Id {
        addr: SocketAddr::new(IpAddr::V4(ip), port),
        nonce: u64::from_le_bytes(n),
    })
}

/// One rank's connection to a peer.
pub(crate) struct Link {
    peer: usize,
    tx: Mutex<Option<Sender<Vec<u8>>>>,
    rd: Mutex<TcpStream>,
    /// A handle of the socket outside `rd`'s lock: [`Link::interrupt`] shuts it down while a
    /// receive blocks holding that lock.
    ctl: TcpStream,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Link {
    fn new(peer: usize, s: TcpStream) -> NetResult<Link> {
        s.set_nodelay(true).map_err(sys("TCP_NODELAY"))?;
        s.set_read_timeout(Some(timeout()))
            .map_err(sys("read timeout"))?;
        let mut w = s.try_clone().map_err(sys("clone a socket"))?;
        let ctl = s.try_clone().map_err(sys("clone a socket"))?;
        let (tx, rx) = channel::<Vec<u8>>();
        let writer = std::thread::Builder::new()
            .name(format!("fakenccl-w{peer}"))
            .spawn(move || {
                for frame in rx {
                    if w.write_all(&frame).is_err() {
                        break; // the reader side reports the broken link
                    }
                }
            })
            .map_err(sys("spawn a writer thread"))?;
        Ok(Link {
            peer,
            tx: Mutex::new(Some(tx)),
            rd: Mutex::new(s),
            ctl,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Queues a frame (kind, sequence number, payload).
    pub fn send(&self, kind: u8, seq: u64, data: &[u8]) -> NetResult<()> {
        let mut f = Vec::with_capacity(17 + data.len());
        f.push(kind);
        f.extend_from_slice(&seq.to_le_bytes());
        f.extend_from_slice(&(data.len() as u64).to_le_bytes());
        f.extend_from_slice(data);
        let g = super::lock(&self.tx);
        let tx = g
            .as_ref()
            .ok_or((INVALID_USAGE, "the communicator was destroyed".to_string()))?;
        tx.send(f).map_err(|_| {
            (
                REMOTE_ERROR,
                format!("the connection to rank {} is closed", self.peer),
            )
        })
    }

    /// Receives the next frame, which must be of `kind`, number `seq` and `len` bytes.
    pub fn recv(&self, kind: u8, seq: u64, len: usize) -> NetResult<Vec<u8>> {
        let mut s = super::lock(&self.rd);
        let peer = self.peer;
        let lost = |e: std::io::Error| {
            (
                REMOTE_ERROR,
                format!("receiving from rank {peer}: {e} (peer died, or timed out)"),
            )
        };
        let mut h = [0u8; 17];
        s.read_exact(&mut h).map_err(lost)?;
        let got_seq = u64::from_le_bytes(h[1..9].try_into().unwrap_or_default());
        let got_len = u64::from_le_bytes(h[9..17].try_into().unwrap_or_default()) as usize;
        if h[0] != kind || got_seq != seq || got_len != len {
            return Err((
                INVALID_USAGE,
                format!(
                    "rank {peer} sent {} #{got_seq} of {got_len} bytes where this rank expects \
                     {} #{seq} of {len} bytes (mismatched operations or counts)",
                    kind_name(h[0]),
                    kind_name(kind)
                ),
            ));
        }
        let mut data = vec![0u8; len];
        s.read_exact(&mut data).map_err(lost)?;
        Ok(data)
    }

    /// Shuts the socket down now (`ncclCommAbort`): a receive blocked on it fails at once.
    pub fn interrupt(&self) {
        let _ = self.ctl.shutdown(Shutdown::Both);
    }

    /// Flushes queued frames (destroy) or drops them (abort), then closes the socket.
    pub fn close(&self, flush: bool) {
        super::lock(&self.tx).take();
        if !flush {
            let _ = super::lock(&self.rd).shutdown(Shutdown::Both);
        }
        if let Some(w) = super::lock(&self.writer).take() {
            let _ = w.join();
        }
        let _ = super::lock(&self.rd).shutdown(Shutdown::Both);
    }
}

fn kind_name(k: u8) -> &'static str {
    match k {
        P2P => "a send",
        COLL => "a collective",
        _ => "an unknown frame",
    }
}

/// The hello a rank sends on a new connection: nonce, rank, nranks, listener port.
fn hello(s: &mut TcpStream, nonce: u64, rank: usize, nranks: usize, port: u16) -> NetResult<()> {
    let mut b = Vec::with_capacity(18);
    b.extend_from_slice(&nonce.to_le_bytes());
    b.extend_from_slice(&(rank as u32).to_le_bytes());
    b.extend_from_slice(&(nranks as u32).to_le_bytes());
    b.extend_from_slice(&port.to_le_bytes());
    s.write_all(&b).map_err(sys("send the hello"))
}

/// Reads and checks a hello; returns the sender's rank and listener port.
fn read_hello(s: &mut TcpStream, nonce: u64, nranks: usize) -> NetResult<(usize, u16)> {
    let mut b = [0u8; 18];
    s.read_exact(&mut b).map_err(sys("read a hello"))?;
    let n = u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
    let r = u32::from_le_bytes(b[8..12].try_into().unwrap_or_default()) as usize;
    let nr = u32::from_le_bytes(b[12..16].try_into().unwrap_or_default()) as usize;
    let port = u16::from_le_bytes([b[16], b[17]]);
    if n != nonce {
        return Err((INVALID_USAGE, "a peer joined with another unique id".into()));
    }
    if nr != nranks || r >= nranks {
        return Err((
            INVALID_USAGE,
            format!("rank {r} joined with nranks {nr}, this rank has {nranks}"),
        ));
    }
    Ok((r, port))
}

/// How long joining may take, and the flag that aborts it (`ncclCommAbort` of a communicator
/// still initialising).
pub(crate) struct Join<'a> {
    pub deadline: Instant,
    pub stop: &'a AtomicBool,
}

impl Join<'_> {
    fn check(&self) -> NetResult<()> {
        if self.stop.load(Ordering::Acquire) {
            return Err((
                REMOTE_ERROR,
                "aborted while joining the communicator".into(),
            ));
        }
        Ok(())
    }
}

fn connect(addr: SocketAddr, j: &Join) -> NetResult<TcpStream> {
    loop {
        j.check()?;
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= j.deadline => {
                return Err((REMOTE_ERROR, format!("connect to {addr}: {e}")))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn accept(l: &TcpListener, j: &Join) -> NetResult<TcpStream> {
    l.set_nonblocking(true).map_err(sys("listener mode"))?;
    loop {
        j.check()?;
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(sys("socket mode"))?;
                s.set_read_timeout(Some(timeout()))
                    .map_err(sys("read timeout"))?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= j.deadline {
                    return Err((REMOTE_ERROR, "timed out waiting for peers to join".into()));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(sys("accept")(e)),
        }
    }
}

/// Connects this rank to every other rank of the communicator; index = peer rank. `stop`
/// aborts the waits for peers.
pub(crate) fn connect_all(
    id: &Id,
    nranks: usize,
    rank: usize,
    stop: &AtomicBool,
) -> NetResult<Vec<Option<Link>>> {
    let j = Join {
        deadline: Instant::now() + timeout(),
        stop,
    };
    let mut socks: Vec<Option<TcpStream>> = (0..nranks).map(|_| None).collect();
    if rank == 0 {
        let l = super::lock(listeners())
            .remove(&id.addr.port())
            .ok_or_else(|| {
                (
                    INVALID_USAGE,
                    "rank 0 must call ncclCommInitRank in the process that called \
                     ncclGetUniqueId (once per id)"
                        .to_string(),
                )
            })?;
        root(&l, id, nranks, &j, &mut socks)?;
    } else {
        let mut s = connect(id.addr, &j)?;
        let me = s.local_addr().map_err(sys("local address"))?.ip();
        let l = TcpListener::bind((me, 0)).map_err(sys("bind a listener"))?;
        let port = l.local_addr().map_err(sys("listener address"))?.port();
        hello(&mut s, id.nonce, rank, nranks, port)?;
        let table = read_table(&mut s, nranks)?;
        socks[0] = Some(s);
        for (q, addr) in table.iter().enumerate().take(rank).skip(1) {
            let mut c = connect(*addr, &j)?;
            hello(&mut c, id.nonce, rank, nranks, 0)?;
            socks[q] = Some(c);
        }
        for _ in rank + 1..nranks {
            let mut c = accept(&l, &j)?;
            let (q, _) = read_hello(&mut c, id.nonce, nranks)?;
            if q <= rank || socks[q].is_some() {
                return Err((INVALID_USAGE, format!("rank {q} connected twice")));
            }
            socks[q] = Some(c);
        }
    }
    socks
        .into_iter()
        .enumerate()
        .map(|(q, s)| s.map(|s| Link::new(q, s)).transpose())
        .collect()
}

/// Rank 0: accepts every other rank and sends each the table of listener addresses.
fn root(
    l: &TcpListener,
    id: &Id,
    nranks: usize,
    j: &Join,
    socks: &mut [Option<TcpStream>],
) -> NetResult<()> {
    let mut table = vec![id.addr; nranks];
    for _ in 1..nranks {
        let mut s = accept(l, j)?;
        let (r, port) = read_hello(&mut s, id.nonce, nranks)?;
        if r == 0 || socks[r].is_some() {
            return Err((INVALID_USAGE, format!("two processes joined as rank {r}")));
        }
        let ip = s.peer_addr().map_err(sys("peer address"))?.ip();
        table[r] = SocketAddr::new(ip, port);
        socks[r] = Some(s);
    }
    let mut b = Vec::new();
    for a in &table {
        let ip = match a.ip() {
            IpAddr::V4(v) => v.octets(),
            IpAddr::V6(_) => return Err((SYSTEM_ERROR, "IPv6 peers are not supported".into())),
        };
        b.extend_from_slice(&ip);
        b.extend_from_slice(&a.port().to_le_bytes());
    }
    for s in socks.iter_mut().flatten() {
        s.write_all(&b).map_err(sys("send the address table"))?;
    }
    Ok(())
}

fn read_table(s: &mut TcpStream, nranks: usize) -> NetResult<Vec<SocketAddr>> {
    let mut b = vec![0u8; 6 * nranks];
    s.read_exact(&mut b)
        .map_err(sys("read the address table"))?;
    Ok(b.chunks_exact(6)
        .map(|c| {
            let ip = Ipv4Addr::new(c[0], c[1], c[2], c[3]);
            SocketAddr::new(IpAddr::V4(ip), u16::from_le_bytes([c[4], c[5]]))
        })
        .collect())
}
