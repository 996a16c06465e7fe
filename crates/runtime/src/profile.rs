//! Per-kernel host-time profile of emulator launches: with `PTXFORGE_PROFILE=1` (or
//! [`enable`]) every emulated launch adds its wall time to its kernel's row, and [`rows`] lists
//! the totals, slowest first (`ptxforge train` prints them). Between [`start_capture`] and
//! [`stop_capture`] every emulated launch is also kept as a [`KernelSpan`] (kernel, device,
//! stream, SM range, host start and end): the kernels of a trace. Off, both cost one relaxed
//! atomic load per launch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// 0: not decided yet, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static ROWS: Mutex<Option<HashMap<String, (u64, Duration)>>> = Mutex::new(None);

/// Turns profiling on for the rest of the process.
pub fn enable() {
    STATE.store(2, Ordering::Relaxed);
}

/// Whether launches are being profiled (`PTXFORGE_PROFILE=1` or [`enable`]).
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("PTXFORGE_PROFILE").as_deref() == Ok("1");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    }
}

/// One emulated launch, for traces.
#[derive(Clone, Debug)]
pub struct KernelSpan {
    pub kernel: String,
    /// `Device::index` of the launching device.
    pub device: u32,
    /// The stream's process-unique number.
    pub stream: u64,
    /// SM range `(offset, count)` the launch was confined to (a partition's, or the device's).
    pub sms: (u32, u32),
    pub start: Instant,
    pub end: Instant,
}

static CAPTURING: AtomicBool = AtomicBool::new(false);
static SPANS: Mutex<Vec<KernelSpan>> = Mutex::new(Vec::new());

/// Starts keeping every emulated launch as a [`KernelSpan`] (drops earlier ones).
pub fn start_capture() {
    SPANS.lock().unwrap_or_else(|p| p.into_inner()).clear();
    CAPTURING.store(true, Ordering::Relaxed);
}

/// Stops capturing and returns the spans kept since [`start_capture`], in completion order.
pub fn stop_capture() -> Vec<KernelSpan> {
    CAPTURING.store(false, Ordering::Relaxed);
    std::mem::take(&mut *SPANS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Whether launches are being captured.
pub fn capturing() -> bool {
    CAPTURING.load(Ordering::Relaxed)
}

/// Keeps `s` while capturing.
pub fn record_span(s: KernelSpan) {
    if capturing() {
        SPANS.lock().unwrap_or_else(|p| p.into_inner()).push(s);
    }
}

/// Adds one launch of `kernel` that took `d` of host time (when profiling is on).
pub fn record(kernel: &str, d: Duration) {
    if !enabled() {
        return;
    }
    let mut g = ROWS.lock().unwrap_or_else(|p| p.into_inner());
    let row = g
        .get_or_insert_with(HashMap::new)
        .entry(kernel.to_string())
        .or_default();
    row.0 += 1;
    row.1 += d;
}

/// One kernel's launches and total host time.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub kernel: String,
    pub launches: u64,
    pub seconds: f64,
}

/// Every profiled kernel, most total time first.
pub fn rows() -> Vec<Row> {
    let g = ROWS.lock().unwrap_or_else(|p| p.into_inner());
    let mut v: Vec<Row> = g
        .iter()
        .flatten()
        .map(|(k, (n, d))| Row {
            kernel: k.clone(),
            launches: *n,
            seconds: d.as_secs_f64(),
        })
        .collect();
    v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_sum_launches_per_kernel_slowest_first() {
        enable();
        record("a", Duration::from_millis(3));
        record("b", Duration::from_millis(10));
        record("a", Duration::from_millis(4));
        let r = rows();
        let a = r.iter().find(|r| r.kernel == "a").unwrap();
        assert_eq!(a.launches, 2);
        assert!((a.seconds - 0.007).abs() < 1e-9);
        let ia = r.iter().position(|r| r.kernel == "a").unwrap();
        let ib = r.iter().position(|r| r.kernel == "b").unwrap();
        assert!(ib < ia, "b took longer");
    }
}

#[cfg(test)]
mod capture_tests {
    use super::*;

    #[test]
    fn spans_are_kept_only_while_capturing() {
        let span = |k: &str| KernelSpan {
            kernel: k.into(),
            device: 1,
            stream: 7,
            sms: (0, 4),
            start: Instant::now(),
            end: Instant::now(),
        };
        record_span(span("before"));
        start_capture();
        record_span(span("during"));
        let got = stop_capture();
        record_span(span("after"));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].kernel, "during");
        assert!(stop_capture().is_empty());
    }
}
