//! How the layer runs work on the host: one thread per rank (each device's stream is its own
//! emulator thread, so the devices' kernels run concurrently), overlapped communication and
//! compute pairs, wall-clock spans, progress reporting and trace spans.

use super::{MoeError, Result};
use std::sync::Mutex;
use std::time::Instant;

/// Progress of the layer's phases (a CLI draws bars; a library user may ignore it).
pub trait Progress: Sync {
    /// A phase of `units` per-rank jobs starts; the returned handle is ticked once per job and
    /// dropped when the phase ends.
    fn phase(&self, _name: &str, _units: usize) -> Box<dyn ProgressPhase + '_> {
        Box::new(NoPhase)
    }
    /// A phase finished in `secs` wall seconds.
    fn note(&self, _name: &str, _secs: f64) {}
}

/// One running phase of a [`Progress`].
pub trait ProgressPhase: Sync {
    fn tick(&self) {}
}

struct NoPhase;
impl ProgressPhase for NoPhase {}

/// No progress output.
pub struct Quiet;
impl Progress for Quiet {}

/// Wall-clock span of one side of an overlapped pair (or of a phase).
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub start: Instant,
    pub end: Instant,
}

impl Span {
    pub fn secs(&self) -> f64 {
        self.end.duration_since(self.start).as_secs_f64()
    }
    /// Seconds both spans were running.
    pub fn overlap(&self, o: &Span) -> f64 {
        let s = self.start.max(o.start);
        let e = self.end.min(o.end);
        if e > s {
            e.duration_since(s).as_secs_f64()
        } else {
            0.0
        }
    }
}

/// A kernel (or kernel sequence) of one device on one of its streams (`"comm"`, `"compute"`),
/// host timestamps.
#[derive(Clone, Debug)]
pub struct TraceSpan {
    pub name: String,
    pub device: usize,
    pub stream: &'static str,
    pub span: Span,
}

/// Collects trace spans from the rank threads.
#[derive(Default)]
pub(crate) struct Trace(Mutex<Vec<TraceSpan>>);

impl Trace {
    pub fn push(&self, name: &str, device: usize, stream: &'static str, span: Span) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.push(TraceSpan {
            name: name.to_string(),
            device,
            stream,
            span,
        });
    }
    /// The same span on the communication stream of every rank (a collective).
    pub fn comm_all(&self, name: &str, ranks: usize, span: Span) {
        for r in 0..ranks {
            self.push(name, r, "comm", span);
        }
    }
    pub fn take(&self) -> Vec<TraceSpan> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Runs `f` and the wall-clock span it took.
pub(crate) fn timed<T>(f: impl FnOnce() -> T) -> (T, Span) {
    let start = Instant::now();
    let v = f();
    (
        v,
        Span {
            start,
            end: Instant::now(),
        },
    )
}

/// Runs `f(r)` for every rank on its own host thread; one progress tick per finished rank.
/// Errors name the phase and the rank.
pub(crate) fn per_rank<T: Send>(
    ranks: usize,
    phase: &str,
    progress: &dyn Progress,
    f: impl Fn(usize) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let pb = progress.phase(phase, ranks);
    let res: Vec<Result<T>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..ranks)
            .map(|r| {
                let (f, pb) = (&f, &pb);
                s.spawn(move || {
                    let v = f(r).map_err(|e| MoeError::Rank {
                        phase: phase.to_string(),
                        rank: r,
                        source: Box::new(e),
                    });
                    pb.tick();
                    v
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(MoeError::Panicked(phase.to_string())))
            })
            .collect()
    });
    drop(pb);
    res.into_iter().collect()
}

/// Runs `comm` (communication kernels of every rank) and `compute` (compute-partition kernels
/// of every rank) concurrently, or one after the other with `sequential`.
pub(crate) fn overlapped<A: Send, B>(
    sequential: bool,
    comm: impl FnOnce() -> A + Send,
    compute: impl FnOnce() -> B,
) -> (A, B, Span, Span) {
    if sequential {
        let (a, sa) = timed(comm);
        let (b, sb) = timed(compute);
        return (a, b, sa, sb);
    }
    std::thread::scope(|s| {
        let h = s.spawn(move || timed(comm));
        let (b, sb) = timed(compute);
        // a panic on the communication thread is re-raised here, as if it were this thread's
        let (a, sa) = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (a, b, sa, sb)
    })
}
