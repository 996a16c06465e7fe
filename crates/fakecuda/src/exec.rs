//! Streams (one worker thread and FIFO queue each), the operations they run, events and graphs.

use crate::state::{fail, lock, sticky, Ctx, Driver, Res};
use cudarc::driver::sys::CUresult;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// A kernel launch, checked and packed, ready to run on the emulator.
pub(crate) struct LaunchJob {
    pub prog: Arc<emu::Program>,
    pub params: Vec<u8>,
    pub cfg: emu::LaunchConfig,
    /// Keeps the module's variables alive while the launch is queued.
    pub _module: Arc<crate::jit::Module>,
}

/// One queued operation.
#[derive(Clone)]
pub(crate) enum Op {
    Launch(Arc<LaunchJob>),
    HtoD {
        dst: u64,
        src: usize,
        len: usize,
    },
    DtoH {
        dst: usize,
        src: u64,
        len: usize,
    },
    DtoD {
        dst: u64,
        src: u64,
        len: usize,
    },
    Memset {
        dst: u64,
        len: usize,
        pattern: Vec<u8>,
    },
    Record(Arc<Event>, u64),
    Wait(Arc<Event>, u64),
}

/// Completion counters of a stream.
#[derive(Default)]
pub(crate) struct Progress {
    pub m: Mutex<(u64, u64)>, // (queued, done)
    pub cv: Condvar,
    /// Emulated time stands still while work is queued and no kernel of the stream runs (as
    /// the runtime's emulator streams do: `emu::clock::Hold`).
    pub hold: Arc<Mutex<Option<emu::clock::Hold>>>,
}

impl Progress {
    fn wait_for(&self, target: u64) {
        let mut g = lock(&self.m);
        while g.1 < target {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

pub(crate) struct Capture {
    pub ops: Vec<Op>,
    pub mode: u32,
    pub thread: std::thread::ThreadId,
    pub invalidated: bool,
}

pub(crate) struct Stream {
    pub id: usize,
    pub ctx: Arc<Ctx>,
    pub blocking: bool,
    tx: Mutex<Option<Sender<Op>>>,
    pub progress: Arc<Progress>,
    pub capture: Mutex<Option<Capture>>,
}

impl Stream {
    pub fn new(d: &'static Driver, ctx: Arc<Ctx>, blocking: bool) -> Res<Arc<Stream>> {
        let (tx, rx) = channel::<Op>();
        let progress = Arc::new(Progress::default());
        let p = progress.clone();
        let dev = ctx.dev;
        let id = d.new_id();
        std::thread::Builder::new()
            .name(format!("fakecuda-stream-{dev}"))
            .spawn(move || {
                while let Ok(op) = rx.recv() {
                    run_op(d, dev, &op, Some(&p.hold));
                    let mut g = lock(&p.m);
                    g.1 += 1;
                    let mut h = lock(&p.hold);
                    if g.1 == g.0 {
                        h.take();
                    } else {
                        h.get_or_insert_with(emu::clock::Hold::new);
                    }
                    drop(h);
                    p.cv.notify_all();
                }
            })
            .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let s = Arc::new(Stream {
            id,
            ctx,
            blocking,
            tx: Mutex::new(Some(tx)),
            progress,
            capture: Mutex::new(None),
        });
        lock(&d.streams).insert(id, s.clone());
        Ok(s)
    }

    /// Queues `op` (or records it, while capturing).
    pub fn push(&self, op: Op) -> Res {
        if let Some(c) = lock(&self.capture).as_mut() {
            c.ops.push(op);
            return Ok(());
        }
        let tx = lock(&self.tx);
        let tx = tx.as_ref().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let mut g = lock(&self.progress.m);
        g.0 += 1;
        lock(&self.progress.hold).get_or_insert_with(emu::clock::Hold::new);
        drop(g);
        tx.send(op).map_err(|_| CUresult::CUDA_ERROR_LAUNCH_FAILED)
    }

    pub fn is_capturing(&self) -> bool {
        lock(&self.capture).is_some()
    }

    pub fn invalidate_capture(&self) {
        if let Some(c) = lock(&self.capture).as_mut() {
            c.invalidated = true;
        }
    }

    /// Waits for everything queued so far.
    pub fn drain(&self) {
        let _waiting = emu::clock::HostWait::begin();
        let target = lock(&self.progress.m).0;
        self.progress.wait_for(target);
    }

    /// Stops accepting work; the worker finishes what is queued, then exits.
    pub fn close(&self) {
        lock(&self.tx).take();
    }
}

/// Runs one operation on the calling thread (a stream worker, or the caller for the legacy
/// stream). Errors become the device's sticky error.
pub(crate) fn run_op(
    d: &Driver,
    dev: u32,
    op: &Op,
    hold: Option<&Arc<Mutex<Option<emu::clock::Hold>>>>,
) {
    let faulted = sticky(d, dev).is_err();
    let set_sticky = |e: CUresult| {
        let mut g = lock(&d.devs[dev as usize].sticky);
        if g.is_none() {
            *g = Some(e);
        }
    };
    match op {
        Op::Record(ev, gen) => ev.complete(*gen),
        Op::Wait(ev, gen) => ev.wait_for(*gen),
        _ if faulted => {}
        Op::Launch(j) => {
            let opts = emu::LaunchOptions {
                hold: hold.cloned(),
                ..Default::default()
            };
            let r = emu::launch(
                j.prog.clone(),
                d.mem.snapshot(),
                j.params.clone(),
                &j.cfg,
                &opts,
            );
            if let Err(e) = r {
                let code = match &e {
                    emu::EmuError::Fault { kind, .. } => match kind {
                        emu::FaultKind::OutOfBounds { .. } => CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
                        emu::FaultKind::Misaligned { .. } => {
                            CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
                        }
                        emu::FaultKind::Hang(_) => CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,
                        // a failed device-side assert (`__assertfail`): the driver's own code
                        emu::FaultKind::Assert { .. } => CUresult::CUDA_ERROR_ASSERT,
                        _ => CUresult::CUDA_ERROR_LAUNCH_FAILED,
                    },
                    _ => CUresult::CUDA_ERROR_LAUNCH_FAILED,
                };
                eprintln!("fakecuda: device {dev}: kernel failed ({code:?}, sticky): {e}");
                set_sticky(code);
            }
        }
        Op::HtoD { dst, src, len } => {
            let Some(a) = d.mem.snapshot().find(*dst, *len as u64).cloned() else {
                eprintln!("fakecuda: device {dev}: host-to-device copy into freed memory {dst:#x}");
                return set_sticky(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
            };
            // SAFETY: the caller of cuMemcpyHtoDAsync promised `len` readable bytes at `src`
            // until the copy completes (which is now).
            let data = unsafe { std::slice::from_raw_parts(*src as *const u8, *len) };
            a.write_bytes(dst - a.base, data);
        }
        Op::DtoH { dst, src, len } => {
            let Some(a) = d.mem.snapshot().find(*src, *len as u64).cloned() else {
                eprintln!("fakecuda: device {dev}: device-to-host copy from freed memory {src:#x}");
                return set_sticky(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
            };
            // SAFETY: the caller of cuMemcpyDtoHAsync promised `len` writable bytes at `dst`
            // until the copy completes (which is now).
            let out = unsafe { std::slice::from_raw_parts_mut(*dst as *mut u8, *len) };
            a.read_bytes(src - a.base, out);
        }
        Op::DtoD { dst, src, len } => {
            let snap = d.mem.snapshot();
            let (Some(a), Some(b)) = (
                snap.find(*src, *len as u64).cloned(),
                snap.find(*dst, *len as u64).cloned(),
            ) else {
                eprintln!("fakecuda: device {dev}: device copy on freed memory");
                return set_sticky(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
            };
            let mut tmp = vec![0u8; *len];
            a.read_bytes(src - a.base, &mut tmp);
            b.write_bytes(dst - b.base, &tmp);
        }
        Op::Memset { dst, len, pattern } => {
            let Some(a) = d.mem.snapshot().find(*dst, *len as u64).cloned() else {
                eprintln!("fakecuda: device {dev}: memset of freed memory {dst:#x}");
                return set_sticky(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
            };
            a.fill(dst - a.base, *len as u64, pattern);
        }
    }
}

/// An event: records are numbered; the event is complete when its latest record has run.
pub(crate) struct Event {
    pub timing: bool,
    pub dev: u32,
    pub st: Mutex<EventState>,
    pub cv: Condvar,
}

#[derive(Default)]
pub(crate) struct EventState {
    pub recorded: u64,
    pub completed: u64,
    pub time: Option<Instant>,
}

impl Event {
    pub fn new(timing: bool, dev: u32) -> Event {
        Event {
            timing,
            dev,
            st: Mutex::new(EventState::default()),
            cv: Condvar::new(),
        }
    }
    pub fn complete(&self, gen: u64) {
        let mut g = lock(&self.st);
        if gen > g.completed {
            g.completed = gen;
            g.time = Some(Instant::now());
        }
        self.cv.notify_all();
    }
    pub fn wait_for(&self, gen: u64) {
        let mut g = lock(&self.st);
        while g.completed < gen {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The streams of a context (`blocking_only`: only those the legacy stream synchronises with).
pub(crate) fn streams_of(d: &Driver, ctx: usize, blocking_only: bool) -> Vec<Arc<Stream>> {
    lock(&d.streams)
        .values()
        .filter(|s| s.ctx.id == ctx && (!blocking_only || s.blocking))
        .cloned()
        .collect()
}

/// The stream an API call names: `None` for the legacy NULL stream (0 or `CU_STREAM_LEGACY`).
pub(crate) fn stream(d: &Driver, h: usize) -> Res<Option<Arc<Stream>>> {
    if h == 0 || h == 1 {
        return Ok(None);
    }
    if h == 2 {
        return Err(fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
            "CU_STREAM_PER_THREAD is not modelled".into()
        }));
    }
    lock(&d.streams).get(&h).cloned().map(Some).ok_or_else(|| {
        fail(CUresult::CUDA_ERROR_INVALID_HANDLE, || {
            format!("stream {h:#x}")
        })
    })
}

/// Queues `op` on stream `h`; on the legacy stream, waits for the context's blocking streams and
/// runs it on the calling thread.
pub(crate) fn submit(d: &'static Driver, h: usize, op: Op) -> Res {
    match stream(d, h)? {
        Some(s) => {
            sticky(d, s.ctx.dev)?;
            s.push(op)
        }
        None => {
            let ctx = crate::state::current(d)?;
            sticky(d, ctx.dev)?;
            for s in streams_of(d, ctx.id, true) {
                s.drain();
            }
            // the calling thread runs the operation: it adds no work meanwhile
            let _waiting = emu::clock::HostWait::begin();
            run_op(d, ctx.dev, &op, None);
            Ok(())
        }
    }
}

/// Waits for every stream of `dev` (all its contexts), as `cuMemFree` does implicitly.
pub(crate) fn drain_device(d: &Driver, dev: u32) {
    let all: Vec<Arc<Stream>> = lock(&d.streams)
        .values()
        .filter(|s| s.ctx.dev == dev)
        .cloned()
        .collect();
    for s in all {
        if !s.is_capturing() {
            s.drain();
        }
    }
}
