//! One pipeline rank's worker thread of [`super::exec::Executor::run_pipelined`]: runs the
//! rank's ops in schedule order, waits for its inputs (polling the shared abort flag), runs an
//! overlapped F&B op's two passes on two threads, and moves each output to the neighbour
//! stage's devices and rank (across processes, when that rank runs elsewhere: over the link).

use super::exec::{exec_err, no_input_grad, secs, wrong_output, Executor, ABORTED};
use super::link::{self, Link, Tag};
use super::timing::{Span, SpanKind};
use crate::stage::{Boundary, MicroBatch, Stage, StageOut};
use crate::TrainError;
use pipeline::{Pass, PassKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// How often a waiting rank checks whether another rank failed.
const POLL: Duration = Duration::from_millis(5);
/// How often a rank waiting for another process's boundary polls the link.
const REMOTE_POLL: Duration = Duration::from_millis(1);

/// A stage as one pipeline thread borrows it.
pub(super) type Leg<'a> = &'a mut (dyn Stage + 'static);

/// Sets the abort flag when a rank thread unwinds, so its peers stop waiting for it.
pub(super) struct AbortOnPanic<'a>(pub(super) &'a AtomicBool);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// What crosses between ranks: an activation for (`stage`, `mb`) or the gradient of stage
/// `stage`'s output for `mb`.
pub(super) struct Msg {
    key: Key,
    b: Boundary,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    grad: bool,
    stage: usize,
    mb: usize,
}

impl Key {
    /// Its tag on the link (across processes).
    fn tag(&self) -> Result<u32, TrainError> {
        let kind = if self.grad { Tag::Grad } else { Tag::Act };
        link::tag(kind, self.stage, self.mb)
    }

    /// What it is, for errors.
    fn describe(&self) -> String {
        match self.grad {
            true => format!(
                "gradient of stage {}'s output (micro-batch {})",
                self.stage, self.mb
            ),
            false => format!(
                "activation into stage {} (micro-batch {})",
                self.stage, self.mb
            ),
        }
    }
}

pub(super) struct RankOut {
    pub(super) losses: Vec<(usize, f64)>,
    pub(super) spans: Vec<Span>,
}

/// One pipeline rank's worker.
pub(super) struct Rank<'a> {
    ex: &'a Executor,
    rank: usize,
    mbs: &'a [MicroBatch],
    tx: Vec<Sender<Msg>>,
    rx: Receiver<Msg>,
    inbox: HashMap<Key, Boundary>,
    pub(super) abort: &'a AtomicBool,
    t0: Instant,
}

/// What one pass produced, to be sent on by the thread that ran it.
struct PassOut {
    loss: Option<(usize, f64)>,
    spans: Vec<Span>,
}

impl<'a> Rank<'a> {
    pub(super) fn new(
        ex: &'a Executor,
        rank: usize,
        mbs: &'a [MicroBatch],
        (tx, rx): (Vec<Sender<Msg>>, Receiver<Msg>),
        abort: &'a AtomicBool,
        t0: Instant,
    ) -> Rank<'a> {
        Rank {
            ex,
            rank,
            mbs,
            tx,
            rx,
            inbox: HashMap::new(),
            abort,
            t0,
        }
    }

    pub(super) fn run(&mut self, mut legs: [Leg<'_>; 2]) -> Result<RankOut, TrainError> {
        let mut out = RankOut {
            losses: Vec::new(),
            spans: Vec::new(),
        };
        let ops = self.ex.schedule.ranks[self.rank].clone();
        for (k, op) in ops.iter().enumerate() {
            let outs = match op.passes.as_slice() {
                [p] => {
                    let input = self.input(p)?;
                    let leg = &mut *legs[p.dir.min(1)];
                    vec![self.pass_ctx().run(leg, p, input, None)?]
                }
                [f, b] => self.overlapped(&mut legs, (f, b), k)?,
                _ => return Err(exec_err(format!("rank {} op {k} is empty", self.rank))),
            };
            for o in outs {
                out.losses.extend(o.loss);
                out.spans.extend(o.spans);
            }
        }
        Ok(out)
    }

    fn pass_ctx(&self) -> PassCtx<'_> {
        PassCtx {
            ex: self.ex,
            rank: self.rank,
            mbs: self.mbs,
            tx: self.tx.clone(),
            t0: self.t0,
        }
    }

    /// Runs a forward and a backward of different stages concurrently on two threads.
    fn overlapped(
        &mut self,
        legs: &mut [Leg<'_>; 2],
        (a, b): (&Pass, &Pass),
        k: usize,
    ) -> Result<Vec<PassOut>, TrainError> {
        if a.dir == b.dir || a.dir > 1 || b.dir > 1 {
            return Err(exec_err(format!(
                "rank {} op {k}: overlapped passes {a:?} and {b:?} need the two different stages",
                self.rank
            )));
        }
        let (ia, ib) = (self.input(a)?, self.input(b)?);
        let (c1, c2) = (self.pass_ctx(), self.pass_ctx());
        let pair = Some((self.rank, k));
        let [l0, l1] = legs;
        let (la, lb) = if a.dir == 0 { (l0, l1) } else { (l1, l0) };
        let abort = self.abort;
        let (ra, rb) = std::thread::scope(|sc| {
            let h = sc.spawn(move || {
                let _g = AbortOnPanic(abort);
                c1.run(&mut **la, a, ia, pair)
            });
            let rb = c2.run(&mut **lb, b, ib, pair);
            let ra = h.join().unwrap_or_else(|_| {
                Err(TrainError::Panicked(format!(
                    "pipeline rank {} pass {a:?}",
                    self.rank
                )))
            });
            (ra, rb)
        });
        Ok(vec![ra?, rb?])
    }

    /// The input a pass needs: `None` for a first-stage forward and a last-stage backward, a
    /// W pass or an input from a neighbour (waited for).
    fn input(&mut self, p: &Pass) -> Result<Option<Boundary>, TrainError> {
        let stage = self.stage_of(p)?;
        let last = self.ex.stages() - 1;
        let key = match p.kind {
            PassKind::F if stage == 0 => return Ok(None),
            PassKind::F => Key {
                grad: false,
                stage,
                mb: p.mb,
            },
            PassKind::B | PassKind::I if stage == last => return Ok(None),
            PassKind::B | PassKind::I => Key {
                grad: true,
                stage,
                mb: p.mb,
            },
            PassKind::W => return Ok(None),
        };
        self.wait(key).map(Some)
    }

    fn stage_of(&self, p: &Pass) -> Result<usize, TrainError> {
        self.ex
            .schedule
            .locate(self.rank, p.dir)
            .map(|(_, s)| s)
            .ok_or_else(|| exec_err(format!("rank {}: pass {p:?} has no stage", self.rank)))
    }

    /// The input `key`, from this process's channel or (across processes, when its producer
    /// runs elsewhere) the link.
    fn wait(&mut self, key: Key) -> Result<Boundary, TrainError> {
        let producer = match key.grad {
            true => key.stage + 1,
            false => key.stage.saturating_sub(1),
        };
        let from = self.ex.rank_of(producer);
        match self.ex.link() {
            Some(link) if from != self.rank => self.wait_remote(link, from, key),
            _ => self.wait_local(key),
        }
    }

    fn wait_remote(&self, link: &Link, from: usize, key: Key) -> Result<Boundary, TrainError> {
        let t = key.tag()?;
        let deadline = Instant::now() + link.me.timeout;
        loop {
            if self.abort.load(Ordering::SeqCst) {
                return Err(exec_err(ABORTED.into()));
            }
            if let Some(b) = link.try_take(from, t)? {
                return self
                    .ex
                    .decode_boundary(&b, from, key.stage, &key.describe());
            }
            if Instant::now() > deadline {
                return Err(link.timed_out(from, &key.describe()));
            }
            std::thread::sleep(REMOTE_POLL);
        }
    }

    fn wait_local(&mut self, key: Key) -> Result<Boundary, TrainError> {
        loop {
            if let Some(b) = self.inbox.remove(&key) {
                return Ok(b);
            }
            if self.abort.load(Ordering::SeqCst) {
                return Err(exec_err(ABORTED.into()));
            }
            match self.rx.recv_timeout(POLL) {
                Ok(m) => {
                    self.inbox.insert(m.key, m.b);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(exec_err(format!(
                        "rank {} never received {key:?}: every sender is gone",
                        self.rank
                    )))
                }
            }
        }
    }
}

/// What a pass's thread needs (cloned per thread of an overlapped op).
struct PassCtx<'a> {
    ex: &'a Executor,
    rank: usize,
    mbs: &'a [MicroBatch],
    tx: Vec<Sender<Msg>>,
    t0: Instant,
}

impl PassCtx<'_> {
    /// Runs `p` on `stage` with its input, then moves its output to the neighbour stage's
    /// devices and sends it there.
    fn run(
        &self,
        stage: &mut dyn Stage,
        p: &Pass,
        input: Option<Boundary>,
        pair: Option<(usize, usize)>,
    ) -> Result<PassOut, TrainError> {
        let s = self
            .ex
            .schedule
            .locate(self.rank, p.dir)
            .map(|(_, s)| s)
            .ok_or_else(|| exec_err(format!("rank {}: pass {p:?} has no stage", self.rank)))?;
        let mut out = PassOut {
            loss: None,
            spans: Vec::new(),
        };
        let last = s + 1 == self.ex.stages();
        let start = secs(self.t0);
        let (kind, sent) = match p.kind {
            PassKind::F => {
                let mb = self
                    .mbs
                    .get(p.mb)
                    .ok_or_else(|| exec_err(format!("no micro-batch {}", p.mb)))?;
                match (stage.forward(mb, input)?, last) {
                    (StageOut::Loss(l), true) => {
                        out.loss = Some((p.mb, l));
                        (SpanKind::Forward, None)
                    }
                    (StageOut::Hidden(b), false) => (SpanKind::Forward, Some((b, s + 1, false))),
                    (_, last) => return Err(wrong_output(s, last)),
                }
            }
            PassKind::B | PassKind::I => match (stage.backward(p.mb, input)?, s > 0) {
                (Some(dx), true) => (SpanKind::Backward, Some((dx, s - 1, true))),
                (None, true) => return Err(no_input_grad(s)),
                (_, false) => (SpanKind::Backward, None),
            },
            PassKind::W => return Ok(out),
        };
        let mut span = self.ex.span(kind, s, p.mb, start, secs(self.t0));
        span.pair = pair;
        out.spans.push(span);
        if let Some((b, to, grad)) = sent {
            let start = secs(self.t0);
            let key = Key {
                grad,
                stage: to,
                mb: p.mb,
            };
            let dest = self.ex.rank_of(to);
            match self.ex.link() {
                Some(_) if dest != self.rank => self.ex.send_remote(&b, s, to, key.tag()?)?,
                _ => {
                    let b = self.ex.transfer(b, s, to)?;
                    // a closed receiver means that rank already failed; its error is reported
                    let _ = self.tx[dest].send(Msg { key, b });
                }
            }
            out.spans.push(
                self.ex
                    .span(SpanKind::Transfer, s, p.mb, start, secs(self.t0)),
            );
        }
        Ok(out)
    }
}
