//! The pipeline executor: runs one step's micro-batches through the `2 pp` stages, either as
//! DualPipeV schedules them ([`Executor::run_pipelined`]: one host thread per pipeline rank) or
//! unpipelined ([`Executor::run_unpipelined`]: every micro-batch forward through every stage,
//! then every backward, on one thread), and forward-only for evaluation
//! ([`Executor::forward_only`]).
//!
//! Schedule semantics relied on (`pipeline::generate(DualPipeV, 2 pp, micro_batches)`): rank `r`
//! holds stage `r` (`dir` 0) and stage `2 pp - 1 - r` (`dir` 1); each rank runs its ops in
//! order; an op is one pass or an overlapped forward + backward of *different* stages whose
//! inputs both come from earlier ops (the verifier's model, under which the schedule cannot
//! deadlock). A split backward (`I`, then `W` later) runs the stage's whole backward at `I` (the
//! [`Stage`] contract has no separate weight pass) and `W` is a no-op.
//!
//! Boundaries move between stages over channels: the producing thread copies each EP rank's
//! buffer to the receiving stage's device of the same EP rank (allocated there, a stream copy on
//! that device; no copy when both stages sit on the same devices, as stages `pp - 1` and `pp`
//! do) and sends it to the receiving rank. The copy runs on its own stream, so a stage must
//! return boundary buffers whose contents are complete (the kernels writing them synchronised):
//! the executor cannot wait for the stage's streams without also waiting for the other pass of
//! an overlapped pair on the same devices. A failing pass sets a shared abort flag; every wait
//! polls it, so the other ranks stop instead of waiting forever.
//!
//! An overlapped op receives both inputs, then runs its forward and its backward on two host
//! threads at once (different [`Stage`] objects on the same devices) and records both spans.
//!
//! Exactness: losses are kept per micro-batch and summed in index order by the caller, and each
//! stage sums its per-micro-batch gradients in index order ([`Stage::take_grads`]), so the
//! pipelined step is bit-identical to the unpipelined one.

use super::link::{self, Link, Reader, Tag};
use super::timing::{Span, SpanKind};
use super::worker::{AbortOnPanic, Leg, Msg, Rank, RankOut};
use crate::stage::{Boundary, MicroBatch, Stage, StageOut, StageSpec};
use crate::TrainError;
use pipeline::{Method, Schedule, ScheduleError};
use runtime::{Device, Stream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Instant;

/// What one executed step produced.
pub struct ExecOut {
    /// Summed loss of each micro-batch, by index.
    pub losses: Vec<f64>,
    /// Every pass and transfer, seconds since `t0`.
    pub spans: Vec<Span>,
    pub t0: Instant,
    pub wall: f64,
}

/// The pipeline of one job: its schedule and per stage the devices and their copy streams.
pub struct Executor {
    pub schedule: Schedule,
    /// Per stage: its devices (EP rank order).
    devices: Vec<Vec<Device>>,
    /// Per stage, per EP rank: the stream that copies boundaries *into* that device (and, across
    /// processes, out of it); empty for the stages of other processes.
    streams: Vec<Vec<Stream>>,
    /// Across processes: this process's pipeline rank and its link to the others (`None`:
    /// every rank runs in this process).
    link: Option<Arc<Link>>,
}

pub(super) fn exec_err(msg: String) -> TrainError {
    TrainError::Pipeline(ScheduleError::Exec(msg))
}

impl Executor {
    /// The DualPipeV schedule of `specs.len()` stages and `micro_batches` chunks.
    pub fn new(specs: &[StageSpec], micro_batches: usize) -> Result<Executor, TrainError> {
        Executor::build(specs, micro_batches, None)
    }

    /// The executor of pipeline rank `link.rank()` of a multi-process run: it runs that rank's
    /// two stages; boundaries to and from the other ranks cross the link.
    pub(super) fn for_rank(
        specs: &[StageSpec],
        micro_batches: usize,
        link: Arc<Link>,
    ) -> Result<Executor, TrainError> {
        Executor::build(specs, micro_batches, Some(link))
    }

    fn build(
        specs: &[StageSpec],
        micro_batches: usize,
        link: Option<Arc<Link>>,
    ) -> Result<Executor, TrainError> {
        let schedule = pipeline::generate(Method::DualPipeV, specs.len(), micro_batches)?;
        pipeline::verify(&schedule)?;
        let devices: Vec<Vec<Device>> = specs.iter().map(|s| s.devices.clone()).collect();
        let mut ex = Executor {
            schedule,
            devices,
            streams: Vec::new(),
            link,
        };
        ex.streams = (0..specs.len())
            .map(|s| match ex.is_local(s) {
                true => ex.devices[s].iter().map(|d| d.stream(0)).collect(),
                false => Vec::new(),
            })
            .collect();
        Ok(ex)
    }

    pub fn stages(&self) -> usize {
        self.devices.len()
    }

    /// Whether `stage` runs in this process.
    pub fn is_local(&self, stage: usize) -> bool {
        match &self.link {
            None => true,
            Some(l) => self.rank_of(stage) == l.rank(),
        }
    }

    /// The stages this process runs, in stage order.
    pub fn local_stages(&self) -> Vec<usize> {
        (0..self.stages()).filter(|&s| self.is_local(s)).collect()
    }

    /// Stage `s`'s devices (EP rank order).
    pub fn devices_of(&self, s: usize) -> &[Device] {
        self.devices.get(s).map_or(&[], Vec::as_slice)
    }

    pub(super) fn link(&self) -> Option<&Arc<Link>> {
        self.link.as_ref()
    }

    /// The pipeline rank holding `stage`.
    pub fn rank_of(&self, stage: usize) -> usize {
        self.schedule.rank_of(0, stage)
    }

    /// Moves `b` (stage `from`'s output) onto the devices of stage `to`.
    pub(super) fn transfer(
        &self,
        b: Boundary,
        from: usize,
        to: usize,
    ) -> Result<Boundary, TrainError> {
        let (dst, streams) = (&self.devices[to], &self.streams[to]);
        if b.ranks.len() != dst.len() {
            return Err(TrainError::Shape(format!(
                "stage {from} produced {} EP-rank buffers, stage {to} has {} devices",
                b.ranks.len(),
                dst.len()
            )));
        }
        let mut copies = Vec::with_capacity(dst.len());
        for (i, src) in b.ranks.iter().enumerate() {
            if src.device().same(&dst[i]) {
                copies.push(None);
                continue;
            }
            let buf = dst[i].alloc::<f32>(src.len())?;
            src.peer_ptr(&dst[i])?;
            streams[i].copy_bytes(src, &buf)?;
            copies.push(Some(buf));
        }
        for (i, c) in copies.iter().enumerate() {
            if c.is_some() {
                streams[i].synchronize()?;
            }
        }
        // the sources are dropped only after the copies completed
        let ranks = b
            .ranks
            .into_iter()
            .zip(copies)
            .map(|(src, c)| c.unwrap_or(src))
            .collect();
        Ok(Boundary { ranks })
    }

    /// Across processes: sends stage `from`'s output `b` to the rank of stage `to` under tag
    /// `t`, each EP rank's buffer read on `from`'s copy stream (the stage returns complete
    /// buffers, see the module docs).
    pub(super) fn send_remote(
        &self,
        b: &Boundary,
        from: usize,
        to: usize,
        t: u32,
    ) -> Result<(), TrainError> {
        let link = self.link.as_ref().ok_or_else(|| no_link("send_remote"))?;
        let streams = &self.streams[from];
        if b.ranks.len() != streams.len() {
            return Err(TrainError::Shape(format!(
                "stage {from} produced {} EP-rank buffers on {} devices",
                b.ranks.len(),
                streams.len()
            )));
        }
        let mut bytes = (b.ranks.len() as u64).to_le_bytes().to_vec();
        for (buf, st) in b.ranks.iter().zip(streams) {
            link::put_f32s(&mut bytes, &st.read(buf)?);
        }
        link.send(self.rank_of(to), t, bytes)
    }

    /// Across processes: a boundary received from rank `from` for stage `to`, uploaded to that
    /// stage's devices (`what` names it in errors).
    pub(super) fn decode_boundary(
        &self,
        bytes: &[u8],
        from: usize,
        to: usize,
        what: &str,
    ) -> Result<Boundary, TrainError> {
        let (dst, streams) = (&self.devices[to], &self.streams[to]);
        let mut r = Reader::new(bytes, from, what);
        let n = r.u64()? as usize;
        if n != dst.len() || n != streams.len() {
            return Err(TrainError::Peer {
                rank: from,
                msg: format!(
                    "its {what} has {n} EP-rank buffers, stage {to} has {} devices here",
                    streams.len()
                ),
            });
        }
        let mut ranks = Vec::with_capacity(n);
        for (d, st) in dst.iter().zip(streams) {
            let v = r.f32s()?;
            let buf = d.alloc::<f32>(v.len())?;
            st.copy_to_device(&buf, &v)?;
            ranks.push(buf);
        }
        r.done()?;
        for st in streams {
            st.synchronize()?;
        }
        Ok(Boundary { ranks })
    }

    /// Every micro-batch forward through all stages, then every backward (last stage first),
    /// on this thread: the reference order.
    pub fn run_unpipelined(
        &self,
        stages: &mut [Box<dyn Stage>],
        mbs: &[MicroBatch],
    ) -> Result<ExecOut, TrainError> {
        if self.link.is_some() {
            return Err(TrainError::Unsupported(
                "the unpipelined order runs in one process; across processes the step is \
                 pipelined (DualPipeV)"
                    .into(),
            ));
        }
        self.check_shape(stages, mbs)?;
        let t0 = Instant::now();
        let mut spans = Vec::new();
        let mut losses = vec![0.0; mbs.len()];
        for mb in mbs {
            losses[mb.index] = self.forward_chain(stages, mb, t0, &mut spans)?;
        }
        for mb in mbs {
            let mut dy = None;
            for s in (0..stages.len()).rev() {
                let start = secs(t0);
                let dx = stages[s].backward(mb.index, dy.take())?;
                spans.push(self.span(SpanKind::Backward, s, mb.index, start, secs(t0)));
                if s > 0 {
                    let dx = dx.ok_or_else(|| no_input_grad(s))?;
                    let start = secs(t0);
                    dy = Some(self.transfer(dx, s, s - 1)?);
                    spans.push(self.span(SpanKind::Transfer, s, mb.index, start, secs(t0)));
                }
            }
        }
        Ok(ExecOut {
            losses,
            spans,
            t0,
            wall: secs(t0),
        })
    }

    /// Forward of `mb` through every stage; returns its summed loss.
    fn forward_chain(
        &self,
        stages: &mut [Box<dyn Stage>],
        mb: &MicroBatch,
        t0: Instant,
        spans: &mut Vec<Span>,
    ) -> Result<f64, TrainError> {
        let mut x = None;
        let last = stages.len() - 1;
        for (s, stage) in stages.iter_mut().enumerate() {
            let start = secs(t0);
            let out = stage.forward(mb, x.take())?;
            spans.push(self.span(SpanKind::Forward, s, mb.index, start, secs(t0)));
            match (out, s == last) {
                (StageOut::Loss(l), true) => return Ok(l),
                (StageOut::Hidden(b), false) => {
                    let start = secs(t0);
                    x = Some(self.transfer(b, s, s + 1)?);
                    spans.push(self.span(SpanKind::Transfer, s, mb.index, start, secs(t0)));
                }
                (_, last) => return Err(wrong_output(s, last)),
            }
        }
        Err(TrainError::Shape("a pipeline without stages".into()))
    }

    /// Forward only (evaluation): the summed loss of `mb`; every stage then discards what its
    /// forward kept.
    pub fn forward_only(
        &self,
        stages: &mut [Box<dyn Stage>],
        mb: &MicroBatch,
    ) -> Result<f64, TrainError> {
        self.forward_local(stages, mb)?
            .ok_or_else(|| no_link("forward_only of a multi-process pipeline"))
    }

    /// [`Executor::forward_only`] of this process's stages: across processes each stage's input
    /// comes from the previous stage's rank and its output goes to the next one's; the loss is
    /// `Some` where the last stage runs.
    pub(super) fn forward_local(
        &self,
        stages: &mut [Box<dyn Stage>],
        mb: &MicroBatch,
    ) -> Result<Option<f64>, TrainError> {
        let r = match &self.link {
            None => self
                .forward_chain(stages, mb, Instant::now(), &mut Vec::new())
                .map(Some),
            Some(link) => self.forward_linked(stages, mb, link),
        };
        for s in stages.iter_mut() {
            s.discard(mb.index);
        }
        r
    }

    /// The forward chain over this process's stages (see [`Executor::forward_local`]).
    fn forward_linked(
        &self,
        stages: &mut [Box<dyn Stage>],
        mb: &MicroBatch,
        link: &Link,
    ) -> Result<Option<f64>, TrainError> {
        let last = self.stages() - 1;
        let mut x: Option<Boundary> = None;
        for (k, s) in self.local_stages().into_iter().enumerate() {
            if s > 0 && x.is_none() {
                let from = self.rank_of(s - 1);
                let what = format!("evaluation activation into stage {s} (batch {})", mb.index);
                let b = link.recv(from, link::tag(Tag::Eval, s, mb.index)?, &|| what.clone())?;
                x = Some(self.decode_boundary(&b, from, s, &what)?);
            }
            let stage = stages.get_mut(k).ok_or_else(|| no_link("a local stage"))?;
            match (stage.forward(mb, x.take())?, s == last) {
                (StageOut::Loss(l), true) => return Ok(Some(l)),
                (StageOut::Hidden(b), false) if self.is_local(s + 1) => {
                    x = Some(self.transfer(b, s, s + 1)?);
                }
                (StageOut::Hidden(b), false) => {
                    self.send_remote(&b, s, s + 1, link::tag(Tag::Eval, s + 1, mb.index)?)?;
                }
                (_, last) => return Err(wrong_output(s, last)),
            }
        }
        Ok(None)
    }

    /// The stages and micro-batches the schedule was built for, indices `0..n` in order.
    fn check_shape(&self, stages: &[Box<dyn Stage>], mbs: &[MicroBatch]) -> Result<(), TrainError> {
        let here = self.local_stages().len();
        if stages.len() != here || mbs.len() != self.schedule.chunks {
            return Err(TrainError::Shape(format!(
                "{} stages and {} micro-batches for a schedule of {here} stages (in this \
                 process) and {} chunks",
                stages.len(),
                mbs.len(),
                self.schedule.chunks
            )));
        }
        if mbs.iter().enumerate().any(|(i, m)| m.index != i) {
            return Err(TrainError::Shape(
                "micro-batch indices must be 0..n in order".into(),
            ));
        }
        Ok(())
    }

    pub(super) fn span(
        &self,
        kind: SpanKind,
        stage: usize,
        mb: usize,
        start: f64,
        end: f64,
    ) -> Span {
        Span {
            kind,
            rank: self.rank_of(stage),
            stage,
            mb,
            start,
            end,
            pair: None,
        }
    }

    /// The step as DualPipeV schedules it: one thread per pipeline rank.
    pub fn run_pipelined(
        &self,
        stages: &mut [Box<dyn Stage>],
        mbs: &[MicroBatch],
    ) -> Result<ExecOut, TrainError> {
        self.check_shape(stages, mbs)?;
        let n = self.schedule.num_ranks();
        let t0 = Instant::now();
        let abort = AtomicBool::new(false);
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel::<Msg>()).unzip();
        // across processes only this process's rank runs here (its two stages, in stage order)
        let ranks: Vec<usize> = match &self.link {
            None => (0..n).collect(),
            Some(l) => vec![l.rank()],
        };
        let mut legs = split_legs(stages, ranks.len());
        let rxs: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .filter(|(r, _)| ranks.contains(r))
            .collect();
        let results: Vec<Result<RankOut, TrainError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = rxs
                .into_iter()
                .zip(legs.drain(..))
                .map(|((rank, rx), legs)| {
                    let mut w = Rank::new(self, rank, mbs, (txs.clone(), rx), &abort, t0);
                    sc.spawn(move || {
                        let _guard = AbortOnPanic(w.abort);
                        let r = w.run(legs);
                        if r.is_err() {
                            w.abort.store(true, Ordering::SeqCst);
                        }
                        r
                    })
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(r, h)| {
                    h.join()
                        .unwrap_or_else(|_| Err(TrainError::Panicked(format!("pipeline rank {r}"))))
                })
                .collect()
        });
        drop(txs);
        let losses_here = self.is_local(self.stages() - 1);
        collect(results, mbs.len(), losses_here, t0)
    }
}

pub(super) fn wrong_output(s: usize, last: bool) -> TrainError {
    TrainError::Shape(if last {
        format!("stage {s} is the last stage but its forward returned activations, not a loss")
    } else {
        format!("stage {s} is not the last stage but its forward returned a loss")
    })
}

pub(super) fn no_input_grad(s: usize) -> TrainError {
    TrainError::Shape(format!(
        "stage {s} is not the first stage but its backward returned no input gradient"
    ))
}

fn no_link(what: &str) -> TrainError {
    exec_err(format!("{what}: the executor is not set up for it"))
}

pub(super) fn secs(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64()
}

/// Per pipeline rank its two stages: `[stage r, stage 2n-1-r]` (`dir` 0 and 1).
fn split_legs<'a>(stages: &'a mut [Box<dyn Stage>], n: usize) -> Vec<[Leg<'a>; 2]> {
    let (down, up) = stages.split_at_mut(n);
    down.iter_mut()
        .zip(up.iter_mut().rev())
        .map(|(a, b)| [a.as_mut(), b.as_mut()])
        .collect()
}

/// The first real error wins over the "aborted" errors it caused elsewhere.
/// `losses_here`: the last stage ran in this process (else `losses` is empty).
fn collect(
    results: Vec<Result<RankOut, TrainError>>,
    mbs: usize,
    losses_here: bool,
    t0: Instant,
) -> Result<ExecOut, TrainError> {
    let mut losses = vec![None; mbs];
    let mut spans = Vec::new();
    let mut aborted = None;
    for r in results {
        match r {
            Ok(out) => {
                spans.extend(out.spans);
                for (mb, l) in out.losses {
                    losses[mb] = Some(l);
                }
            }
            Err(e) if is_abort(&e) => aborted = Some(e),
            Err(e) => return Err(e),
        }
    }
    if let Some(e) = aborted {
        return Err(e);
    }
    if !losses_here {
        losses.clear();
    }
    let losses = losses
        .into_iter()
        .enumerate()
        .map(|(i, l)| l.ok_or_else(|| exec_err(format!("micro-batch {i} produced no loss"))))
        .collect::<Result<_, _>>()?;
    spans.sort_by(|a: &Span, b: &Span| a.start.total_cmp(&b.start));
    Ok(ExecOut {
        losses,
        spans,
        t0,
        wall: secs(t0),
    })
}

pub(super) const ABORTED: &str = "stopped: another pipeline rank failed";

fn is_abort(e: &TrainError) -> bool {
    matches!(e, TrainError::Pipeline(ScheduleError::Exec(m)) if m == ABORTED)
}
