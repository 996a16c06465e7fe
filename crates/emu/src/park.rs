//! Parking of emulator workers whose CTAs only wait, so that kernels spinning on flags written
//! by other CTAs or devices (the dispatch/combine rings of `ep`, any `nanosleep` wait loop) stop
//! burning host CPU that the kernels they wait for need.
//!
//! A worker whose scheduling round was *quiet* ([`crate::clock`]: its CTAs only polled memory
//! that did not change, and wrote nothing) parks until another *polling launch* (a launch with
//! at least one quiet round: the kind that waits for peers, and so the kind whose progress
//! waiters wait for) makes progress, or at most [`MAX_PARK`]. The bound covers every writer
//! that does not signal: compute kernels, producer-only kernels and host writes while a kernel
//! polls (outside the emulated-time model anyway). Parking changes when a waiting warp polls
//! on the host, never what it computes; its clock advances per poll as before, so waits take
//! fewer emulated ns (fewer empty polls), which only makes timeouts later, not earlier.
//! Workers do not park while the whole process is quiescent (every emulated device only
//! waits): then global time fast-forwards ([`crate::clock`]) and every round counts.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Longest a quiet worker sleeps without a signal before polling again.
pub const MAX_PARK: Duration = Duration::from_millis(1);

/// Progress signals of polling launches and the workers parked on them.
pub(crate) struct Parking {
    /// Bumped by every round of a polling launch that made progress.
    epoch: AtomicU64,
    /// Workers inside [`Parking::park`] (a signal takes the lock only when some exist).
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

static PARKING: Parking = Parking::new();

impl Parking {
    pub(crate) const fn new() -> Parking {
        Parking {
            epoch: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// The process-wide parking place.
    pub(crate) fn global() -> &'static Parking {
        &PARKING
    }

    /// The current epoch: read before a round, passed to [`Parking::park`] after it.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// A polling launch made progress: wakes every parked worker.
    pub(crate) fn signal(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.cv.notify_all();
        }
    }

    /// Sleeps until the epoch moves past `seen` or `max` has passed; returns at once when it
    /// already has (a signal during the round just run). Returns whether a signal woke it.
    pub(crate) fn park(&self, seen: u64, max: Duration) -> bool {
        // sleepers before the epoch test (both SeqCst): a signal either sees this sleeper and
        // notifies under the lock, or happened before the test below and is seen by it
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let woke = if self.epoch.load(Ordering::SeqCst) != seen {
            true
        } else {
            let (_g, _) = self
                .cv
                .wait_timeout_while(g, max, |_| self.epoch.load(Ordering::SeqCst) == seen)
                .unwrap_or_else(PoisonError::into_inner);
            self.epoch.load(Ordering::SeqCst) != seen
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        woke
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_signal_after_the_round_returns_at_once() {
        let p = Parking::new();
        let seen = p.epoch();
        p.signal();
        let t0 = Instant::now();
        assert!(p.park(seen, Duration::from_secs(30)), "the epoch moved");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn without_a_signal_the_park_ends_at_its_bound() {
        let p = Parking::new();
        let t0 = Instant::now();
        assert!(!p.park(p.epoch(), Duration::from_millis(20)));
        assert!(t0.elapsed() >= Duration::from_millis(20));
        assert_eq!(p.sleepers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_signal_wakes_a_parked_worker() {
        let p = Parking::new();
        let seen = p.epoch();
        let t0 = Instant::now();
        std::thread::scope(|s| {
            let h = s.spawn(|| p.park(seen, Duration::from_secs(30)));
            // signal until the parked worker has seen it (it may not be asleep yet)
            while !h.is_finished() {
                p.signal();
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(h.join().unwrap(), "woken by the signal, not the bound");
        });
        assert!(t0.elapsed() < Duration::from_secs(20));
    }
}
