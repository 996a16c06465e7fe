//! `netmpi`: MPI (Open MPI through the `mpi` crate) for multi-process runs: the bootstrap a job
//! started by `mpirun` gets for free (rank, size, collectives) and [`MpiEngine`], the inter-node
//! engine of `ep`'s proxy transport ([`ep::proxy`]).
//!
//! **Why two-sided messages, not MPI RMA.** The proxy's target memory is emulator device memory
//! (words the emulated kernels access atomically), not host memory MPI could expose in a
//! window, and a signal must end in a *release store* that the polling kernel acquires: with
//! `MPI_Put` + `MPI_Win_flush` the target side would still need a thread to turn the landed
//! bytes into that store. So each put/signal/fence is one `MPI_Send` on `MPI_COMM_WORLD` with a
//! dedicated tag, received by the target's engine thread and applied by its proxy. MPI's
//! non-overtaking rule (same sender, communicator and tag) gives the one ordering the protocol
//! needs: a put lands before the signal sent after it.
//!
//! Threads: MPI is initialised with `MPI_THREAD_MULTIPLE`; an engine runs a sender thread
//! (blocking sends from a queue, so `Engine::send` never blocks the proxy) and a receiver
//! thread (`MPI_Improbe` + matched receive, sleeping briefly when idle instead of spinning in a
//! blocking probe). The main thread keeps using collectives for bootstrap. Dropping the engine
//! stops both threads; the [`Mpi`] value finalises MPI when dropped, after every engine.

use ep::engine::{Engine, Msg};
use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use mpi;

pub mod check;

/// The MPI tag of proxy traffic (collectives of the bootstrap never match point-to-point).
pub const PROXY_TAG: i32 = 0x5e7;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("MPI was already initialised in this process")]
    AlreadyInitialised,
    #[error(
        "this MPI library gives thread level {0:?}; the proxy engine needs MPI_THREAD_MULTIPLE"
    )]
    Threading(mpi::Threading),
    #[error("MPI: {0}")]
    Mpi(String),
}

/// An initialised MPI environment (finalised on drop).
pub struct Mpi {
    _universe: mpi::environment::Universe,
    world: SimpleCommunicator,
}

impl Mpi {
    /// `MPI_Init_thread(MPI_THREAD_MULTIPLE)`.
    pub fn init() -> Result<Mpi, NetError> {
        let (universe, level) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or(NetError::AlreadyInitialised)?;
        if level != mpi::Threading::Multiple {
            return Err(NetError::Threading(level));
        }
        let world = universe.world();
        Ok(Mpi {
            _universe: universe,
            world,
        })
    }
    pub fn rank(&self) -> u32 {
        self.world.rank() as u32
    }
    pub fn size(&self) -> u32 {
        self.world.size() as u32
    }
    pub fn barrier(&self) {
        self.world.barrier();
    }
    /// Every process's `v` (same length everywhere), concatenated in rank order.
    pub fn all_gather_u64(&self, v: &[u64]) -> Vec<u64> {
        let mut out = vec![0u64; v.len() * self.size() as usize];
        self.world.all_gather_into(v, &mut out[..]);
        out
    }
    /// Every process's byte string (any lengths), in rank order.
    pub fn all_gather_bytes(&self, v: &[u8]) -> Vec<Vec<u8>> {
        let lens = self.all_gather_u64(&[v.len() as u64]);
        let counts: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
        let displs: Vec<i32> = counts
            .iter()
            .scan(0, |acc, &c| {
                let d = *acc;
                *acc += c;
                Some(d)
            })
            .collect();
        let total = lens.iter().sum::<u64>() as usize;
        let mut buf = vec![0u8; total];
        {
            let mut part = mpi::datatype::PartitionMut::new(&mut buf[..], counts, &displs[..]);
            self.world.all_gather_varcount_into(v, &mut part);
        }
        let mut out = Vec::new();
        let mut off = 0usize;
        for l in lens {
            out.push(buf[off..off + l as usize].to_vec());
            off += l as usize;
        }
        out
    }
    /// The proxy engine of this process (endpoint = MPI rank).
    pub fn engine(&self) -> Result<MpiEngine, NetError> {
        MpiEngine::start(self.rank(), self.size())
    }
}

/// The queue of the sender thread: (destination MPI rank, encoded message).
type SendQueue = Sender<(u32, Vec<u8>)>;

/// [`Engine`] over MPI point-to-point messages (see the crate docs).
pub struct MpiEngine {
    me: u32,
    n: u32,
    out: Mutex<Option<SendQueue>>,
    inbox: Mutex<Receiver<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl MpiEngine {
    fn start(me: u32, n: u32) -> Result<MpiEngine, NetError> {
        let (otx, orx) = channel::<(u32, Vec<u8>)>();
        let (itx, irx) = channel::<Vec<u8>>();
        let stop = Arc::new(AtomicBool::new(false));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| NetError::Mpi(format!("spawning {name}: {e}")))
        };
        let sender = spawn("mpi-engine-send", Box::new(move || send_loop(orx)))?;
        let st = stop.clone();
        let receiver = spawn("mpi-engine-recv", Box::new(move || recv_loop(itx, &st)))?;
        Ok(MpiEngine {
            me,
            n,
            out: Mutex::new(Some(otx)),
            inbox: Mutex::new(irx),
            stop,
            threads: vec![sender, receiver],
        })
    }
}

/// Sends queued messages in order (ends when the queue's sender is dropped).
fn send_loop(q: Receiver<(u32, Vec<u8>)>) {
    let world = SimpleCommunicator::world();
    for (to, bytes) in q {
        world
            .process_at_rank(to as i32)
            .send_with_tag(&bytes[..], PROXY_TAG);
    }
}

/// Receives proxy messages until `stop`.
fn recv_loop(inbox: Sender<Vec<u8>>, stop: &AtomicBool) {
    let world = SimpleCommunicator::world();
    while !stop.load(Ordering::Acquire) {
        match world
            .any_process()
            .immediate_matched_probe_with_tag(PROXY_TAG)
        {
            Some(m) => {
                let (bytes, _) = m.matched_receive_vec::<u8>();
                if inbox.send(bytes).is_err() {
                    return;
                }
            }
            None => std::thread::sleep(Duration::from_micros(50)),
        }
    }
}

impl Engine for MpiEngine {
    fn endpoint(&self) -> u32 {
        self.me
    }
    fn endpoints(&self) -> u32 {
        self.n
    }
    fn send(&self, to: u32, msg: Msg) -> ep::Result<()> {
        if to >= self.n {
            return Err(ep::EpError::Engine(format!(
                "no MPI rank {to} (of {})",
                self.n
            )));
        }
        let out = self
            .out
            .lock()
            .map_err(|_| ep::EpError::Engine("send queue lock poisoned".into()))?;
        out.as_ref()
            .ok_or_else(|| ep::EpError::Engine("engine stopped".into()))?
            .send((to, msg.encode()))
            .map_err(|_| ep::EpError::Engine("the MPI sender thread has stopped".into()))
    }
    fn poll(&self) -> ep::Result<Option<Msg>> {
        let rx = self
            .inbox
            .lock()
            .map_err(|_| ep::EpError::Engine("inbox lock poisoned".into()))?;
        match rx.try_recv() {
            Ok(b) => Msg::decode(&b).map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(ep::EpError::Engine(
                "the MPI receiver thread has stopped".into(),
            )),
        }
    }
    fn name(&self) -> &'static str {
        "MPI point-to-point (Open MPI)"
    }
}

impl Drop for MpiEngine {
    fn drop(&mut self) {
        // closing the queue ends the sender after what is queued; the receiver stops polling
        if let Ok(mut o) = self.out.lock() {
            o.take();
        }
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            // a thread that panicked has nothing left to clean up
            let _ = t.join();
        }
    }
}
