//! What a step's timeline says: the spans the executor recorded, summed per phase, the overlap
//! the F&B pairs achieved, and the step as a Perfetto trace (every stage pass on each of its
//! devices' tracks).

use crate::trace::{Trace, Track};
use runtime::Device;
use serde::Serialize;

/// What a span timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SpanKind {
    Forward,
    Backward,
    /// Moving a boundary to the neighbour stage's devices.
    Transfer,
    /// Gradient norm, AdamW, bias update and parameter reload.
    Optimizer,
}

impl SpanKind {
    fn track(self) -> &'static str {
        match self {
            SpanKind::Forward => "forward",
            SpanKind::Backward => "backward",
            SpanKind::Transfer => "transfer",
            SpanKind::Optimizer => "optimizer",
        }
    }
    fn letter(self) -> &'static str {
        match self {
            SpanKind::Forward => "F",
            SpanKind::Backward => "B",
            SpanKind::Transfer => "copy",
            SpanKind::Optimizer => "optimizer",
        }
    }
}

/// One timed piece of work of a step: seconds since the step's origin.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Span {
    pub kind: SpanKind,
    /// Pipeline rank (EP group) it ran on.
    pub rank: usize,
    pub stage: usize,
    pub mb: usize,
    pub start: f64,
    pub end: f64,
    /// The overlapped F&B op it belongs to, as (pipeline rank, op index): both passes of the
    /// op carry it.
    pub pair: Option<(usize, usize)>,
}

impl Span {
    pub fn secs(&self) -> f64 {
        (self.end - self.start).max(0.0)
    }
}

/// Busy seconds per phase, summed over ranks (not wall time), and the step's wall time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Phases {
    pub forward: f64,
    pub backward: f64,
    pub transfer: f64,
    pub optimizer: f64,
    /// Wall time of the pipeline part (all ranks).
    pub pipeline_wall: f64,
    /// Wall time of the whole step (sampling to reloaded parameters).
    pub step_wall: f64,
}

/// How much the F&B pairs overlapped: `ratio` = seconds both passes of a pair ran at once /
/// seconds from the pair's first start to its last end, over all pairs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Overlap {
    pub pairs: usize,
    pub concurrent: f64,
    pub paired: f64,
    pub ratio: f64,
}

/// Sums `spans` per phase (optimizer and walls are filled in by the caller).
pub fn phases(spans: &[Span]) -> Phases {
    let mut p = Phases::default();
    for s in spans {
        let slot = match s.kind {
            SpanKind::Forward => &mut p.forward,
            SpanKind::Backward => &mut p.backward,
            SpanKind::Transfer => &mut p.transfer,
            SpanKind::Optimizer => &mut p.optimizer,
        };
        *slot += s.secs();
    }
    p
}

/// The overlap achieved by the overlapped F&B ops among `spans`.
pub fn overlap(spans: &[Span]) -> Overlap {
    let mut by_pair: std::collections::BTreeMap<(usize, usize), Vec<&Span>> = Default::default();
    for s in spans.iter().filter(|s| s.kind != SpanKind::Transfer) {
        if let Some(p) = s.pair {
            by_pair.entry(p).or_default().push(s);
        }
    }
    let mut o = Overlap::default();
    for v in by_pair.values().filter(|v| v.len() == 2) {
        let (a, b) = (v[0], v[1]);
        o.pairs += 1;
        o.concurrent += (a.end.min(b.end) - a.start.max(b.start)).max(0.0);
        o.paired += a.end.max(b.end) - a.start.min(b.start);
    }
    o.ratio = if o.paired > 0.0 {
        o.concurrent / o.paired
    } else {
        0.0
    };
    o
}

/// The step as a trace: each span on every device of its stage (`devices[stage]`), on a track
/// named after its phase (forward and backward get separate rows, so an overlapped pair shows
/// as two bars at once).
pub fn trace(spans: &[Span], devices: &[Vec<Device>]) -> Trace {
    let mut t = Trace::new();
    for s in spans {
        let Some(ds) = devices.get(s.stage) else {
            continue;
        };
        let name = match s.kind {
            SpanKind::Optimizer => "optimizer".to_string(),
            k => format!("{}{} stage {}", k.letter(), s.mb, s.stage),
        };
        for d in ds {
            let track = Track {
                device: d.index() as usize,
                stream: s.kind.track().to_string(),
                partition: None,
            };
            t.push(&name, track, s.start * 1e6, s.secs() * 1e6);
        }
    }
    let mut named: Vec<(usize, String)> = Vec::new();
    for (stage, ds) in devices.iter().enumerate() {
        for (ep, d) in ds.iter().enumerate() {
            let i = d.index() as usize;
            match named.iter_mut().find(|(j, _)| *j == i) {
                Some((_, n)) => n.push_str(&format!(", stage {stage}")),
                None => named.push((i, format!("device {i} (EP rank {ep}): stage {stage}"))),
            }
        }
    }
    named.sort();
    t.device_names = named;
    t
}

/// Adds every captured kernel launch to `t` on its device's track: the stream (`stream N`) and
/// its SM range (`SMs a..b`, the communication or compute partition), host time since `t0`.
pub fn add_kernels(
    t: &mut Trace,
    t0: std::time::Instant,
    kernels: &[runtime::profile::KernelSpan],
) {
    for k in kernels {
        let (off, n) = k.sms;
        let track = Track {
            device: k.device as usize,
            stream: format!("stream {}", k.stream),
            partition: Some(format!("SMs {off}..{}", off + n.max(1) - 1)),
        };
        let start = k.start.saturating_duration_since(t0).as_secs_f64() * 1e6;
        let dur = k.end.saturating_duration_since(k.start).as_secs_f64() * 1e6;
        t.push(&k.kernel, track, start, dur);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(kind: SpanKind, start: f64, end: f64, pair: Option<(usize, usize)>) -> Span {
        Span {
            kind,
            rank: 0,
            stage: 0,
            mb: 0,
            start,
            end,
            pair,
        }
    }

    #[test]
    fn overlap_is_the_concurrent_share_of_the_paired_time() {
        let spans = [
            // pair A: F 0..4, B 1..3 -> concurrent 2 of 4
            span(SpanKind::Forward, 0.0, 4.0, Some((0, 1))),
            span(SpanKind::Backward, 1.0, 3.0, Some((0, 1))),
            // pair B: disjoint, 0 of 2
            span(SpanKind::Forward, 5.0, 6.0, Some((1, 4))),
            span(SpanKind::Backward, 6.0, 7.0, Some((1, 4))),
            // a transfer of a pair and an unpaired pass do not count
            span(SpanKind::Transfer, 0.0, 9.0, Some((0, 1))),
            span(SpanKind::Forward, 0.0, 9.0, None),
        ];
        let o = overlap(&spans);
        assert_eq!((o.pairs, o.concurrent, o.paired), (2, 2.0, 6.0));
        assert!((o.ratio - 1.0 / 3.0).abs() < 1e-12);
        let p = phases(&spans);
        assert_eq!((p.forward, p.backward, p.transfer), (14.0, 3.0, 9.0));
    }
}
