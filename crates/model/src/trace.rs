//! Chrome/Perfetto trace files (the JSON "trace event" format Perfetto and `chrome://tracing`
//! open): one complete event (`"ph": "X"`) per kernel or kernel sequence, on a track per
//! (device, stream, SM partition). The device is the process (`pid`); the thread (`tid`) is
//! the stream's name, followed by the SM partition in brackets when one is given (e.g.
//! `"comm [SMs 112..131]"`), so each partition of a device gets its own row.
//!
//! `ptxforge moe --trace` writes its layer's spans through [`Trace::from_spans`]; the trainer
//! adds events with [`Trace::push`]. Files are written atomically ([`crate::atomic`]).

use crate::atomic::IoError;
use crate::moe::TraceSpan;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

/// Where an event runs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Track {
    pub device: usize,
    pub stream: String,
    /// SM partition (e.g. `"SMs 0..111"`), if the stream runs on one.
    pub partition: Option<String>,
}

impl Track {
    /// The `tid` of the track's events.
    pub fn thread(&self) -> String {
        match &self.partition {
            Some(p) => format!("{} [{p}]", self.stream),
            None => self.stream.clone(),
        }
    }
}

/// One complete event: `start_us` and `dur_us` in microseconds from the trace's origin.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub name: String,
    pub track: Track,
    pub start_us: f64,
    pub dur_us: f64,
}

/// A trace under construction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub events: Vec<Event>,
    /// Optional process names (`"device 3 (node 0)"`), emitted as metadata events.
    pub device_names: Vec<(usize, String)>,
}

impl Trace {
    pub fn new() -> Trace {
        Trace::default()
    }

    /// Adds an event.
    pub fn push(&mut self, name: &str, track: Track, start_us: f64, dur_us: f64) {
        self.events.push(Event {
            name: name.to_string(),
            track,
            start_us,
            dur_us,
        });
    }

    /// The MoE layer's spans (host timestamps, microseconds since `t0`; no partition names).
    pub fn from_spans(t0: Instant, spans: &[TraceSpan]) -> Trace {
        let mut t = Trace::new();
        for s in spans {
            let start = s.span.start.duration_since(t0).as_secs_f64() * 1e6;
            let track = Track {
                device: s.device,
                stream: s.stream.to_string(),
                partition: None,
            };
            t.push(&s.name, track, start, s.span.secs() * 1e6);
        }
        t
    }

    /// The trace as a JSON value: `{"traceEvents": [...]}` (process-name metadata first,
    /// when any).
    pub fn to_json(&self) -> Value {
        let meta = self.device_names.iter().map(
            |(d, n)| json!({"name": "process_name", "ph": "M", "pid": d, "args": {"name": n}}),
        );
        let ev = self.events.iter().map(|e| {
            json!({"name": e.name, "ph": "X", "ts": e.start_us, "dur": e.dur_us,
                   "pid": e.track.device, "tid": e.track.thread()})
        });
        json!({"traceEvents": meta.chain(ev).collect::<Vec<Value>>()})
    }

    /// Writes the trace to `path` atomically.
    pub fn write(&self, path: &Path) -> Result<(), IoError> {
        let text = self.to_json().to_string();
        crate::atomic::write(path, text.as_bytes())
    }
}
