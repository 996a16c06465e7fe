//! Emulated time: the clocks a kernel reads (`%clock`, `%clock64`, `%globaltimer`) advance with
//! the emulated device's progress, never with host wall time, so a busy or single-core host
//! changes how long a launch takes but not what its kernels measure.
//!
//! The model (documented in `docs/ARCHITECTURE.md`, "Emulated time"):
//!
//! - **Warp clock** (`%clock64`, `%clock`; 1 cycle = 1 ns): a warp starts at its CTA's admission
//!   time and advances by 1 per warp-instruction it issues and by `t` for `nanosleep t`. Warps
//!   leaving a CTA barrier continue from the latest arrival's time. Deterministic per thread.
//! - **Global time** (`%globaltimer`, ns): one process-wide timeline shared by every emulated
//!   device. It is the minimum over the *active* emulator workers (host threads running CTAs of
//!   any launch on any device) of the oldest clock among their resident CTAs, and it never goes
//!   back. A worker that the host does not schedule holds global time still; a worker that
//!   finishes pushes it to at least its final clock (so later kernels start after earlier ones
//!   ended). Workers publish once per scheduling round (every <= 4096 warp-instructions per CTA).
//!
//! - **Quiescence**: a worker's round is *quiet* when its CTAs only waited (`nanosleep`, failed
//!   mbarrier or cluster waits) and wrote nothing (no store, atomic, copy, arrive or exit). When
//!   every active worker is quiet and nothing holds time ([`Hold`]), no emulated device can make
//!   progress any more, so global time fast-forwards (doubling steps from 1 us): wait loops with
//!   a timeout reach it at once instead of spinning through it on the host, and a launch still
//!   quiescent after [`DEADLOCK_HORIZON_NS`] of emulated time reports a deadlock.
//!
//! Consequence: a wait loop that measures elapsed `%globaltimer` only sees time pass while some
//! emulated device makes progress, or when none can. A peer delayed by host scheduling is not
//! "late"; a peer that stopped (exited, never launched, or is itself waiting forever) is. Host
//! threads that write device memory directly (not through a stream) while a kernel polls it are
//! outside this model.
//!
//! Across processes: a process that maps another process's memory never fast-forwards
//! ([`progress_from_other_processes`]): the peer it waits for runs on a timeline this one
//! cannot see.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Emulated time after which a process in which nothing but waiting happens is a deadlock.
pub const DEADLOCK_HORIZON_NS: u64 = 1_000_000_000_000;

/// One participant of a timeline: a worker's clock, or a hold.
#[derive(Debug)]
struct Slot {
    clock: AtomicU64,
    /// The quiescence generation in which this worker last finished a round that only waited
    /// (`NOT_QUIET` otherwise; always for holds).
    quiet_gen: AtomicU64,
}

const NOT_QUIET: u64 = u64::MAX;

/// A timeline: the process has one ([`global_ns`]); tests make their own.
pub(crate) struct Timeline {
    /// Time never falls below this (monotonic).
    floor: AtomicU64,
    /// When the current all-quiet stretch began (`u64::MAX`: not quiescent).
    quiet_since: AtomicU64,
    /// Bumped at every fast-forward step: each step needs a fresh quiet round of every worker.
    quiet_gen: AtomicU64,
    /// Every active worker and hold.
    workers: Mutex<Vec<Arc<Slot>>>,
    /// Fast-forward also needs a host thread waiting for the devices ([`HostWait`]); set by
    /// drivers whose host may enqueue more work at any moment ([`gate_fast_forward_on_host_waits`]).
    gated: AtomicBool,
    /// Host threads inside a synchronising call.
    host_waits: AtomicUsize,
    /// Another process may write this process's memory ([`progress_from_other_processes`]):
    /// quiescence here proves nothing, so time never fast-forwards.
    external: AtomicBool,
}

static TIMELINE: Timeline = Timeline::new();

/// Current global emulated time in ns (`%globaltimer`).
#[inline]
pub fn global_ns() -> u64 {
    TIMELINE.now()
}

impl Timeline {
    pub(crate) const fn new() -> Timeline {
        Timeline {
            floor: AtomicU64::new(0),
            quiet_since: AtomicU64::new(u64::MAX),
            quiet_gen: AtomicU64::new(0),
            workers: Mutex::new(Vec::new()),
            gated: AtomicBool::new(false),
            host_waits: AtomicUsize::new(0),
            external: AtomicBool::new(false),
        }
    }

    /// Whether quiescence may turn into a fast-forward step: the host cannot add work that
    /// would end it (ungated, or some host thread waits for the devices).
    fn may_fast_forward(&self) -> bool {
        !self.external.load(Ordering::Acquire)
            && (!self.gated.load(Ordering::Acquire) || self.host_waits.load(Ordering::Acquire) > 0)
    }

    fn join(&self) -> Arc<Slot> {
        let mut ws = self.workers();
        let slot = Arc::new(Slot {
            clock: AtomicU64::new(self.now()),
            quiet_gen: AtomicU64::new(NOT_QUIET),
        });
        ws.push(slot.clone());
        slot
    }

    fn leave(&self, slot: &Arc<Slot>) {
        self.workers().retain(|s| !Arc::ptr_eq(s, slot));
    }

    /// The process-wide timeline.
    pub(crate) fn global() -> &'static Timeline {
        &TIMELINE
    }

    pub(crate) fn now(&self) -> u64 {
        self.floor.load(Ordering::Acquire)
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Slot>>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An emulator worker's membership in a timeline; leaving (drop) pushes the timeline to the
/// worker's last published clock.
pub(crate) struct WorkerClock<'t> {
    timeline: &'t Timeline,
    slot: Arc<Slot>,
}

impl<'t> WorkerClock<'t> {
    /// Joins the timeline at its current time.
    pub(crate) fn join(timeline: &'t Timeline) -> WorkerClock<'t> {
        WorkerClock {
            timeline,
            slot: timeline.join(),
        }
    }

    /// Publishes this worker's clock (the oldest clock among its resident CTAs) and whether its
    /// last round only waited; advances the timeline to the minimum over all participants, or
    /// fast-forwards it when every participant is a quiet worker. Returns how long (emulated ns)
    /// the whole process has been quiescent, if it is.
    pub(crate) fn publish(&self, clock: u64, quiet: bool) -> Option<u64> {
        let t = self.timeline;
        // One lock for the whole decision: a fast-forward step is taken only when every
        // participant has finished a quiet round since the previous step.
        let ws = t.workers();
        self.slot.clock.fetch_max(clock, Ordering::AcqRel);
        let gen = t.quiet_gen.load(Ordering::Acquire);
        self.slot
            .quiet_gen
            .store(if quiet { gen } else { NOT_QUIET }, Ordering::Release);
        let min = ws.iter().map(|s| s.clock.load(Ordering::Acquire)).min();
        t.floor.fetch_max(min.unwrap_or(clock), Ordering::AcqRel);
        if !quiet || !t.may_fast_forward() {
            t.quiet_since.store(u64::MAX, Ordering::Release);
            return None;
        }
        if !ws
            .iter()
            .all(|s| s.quiet_gen.load(Ordering::Acquire) == gen)
        {
            // quiet, but not everyone has had a quiet round since the last step
            return match t.quiet_since.load(Ordering::Acquire) {
                u64::MAX => None,
                since => Some(t.now().saturating_sub(since)),
            };
        }
        let now = t.now();
        let since = match t.quiet_since.load(Ordering::Acquire) {
            u64::MAX => {
                t.quiet_since.store(now, Ordering::Release);
                now
            }
            v => v.min(now),
        };
        let step = (now - since).max(1_000);
        t.floor.fetch_add(step, Ordering::AcqRel);
        t.quiet_gen.store(gen + 1, Ordering::Release);
        Some(now + step - since)
    }
}

impl Drop for WorkerClock<'_> {
    fn drop(&mut self) {
        self.timeline.leave(&self.slot);
        self.timeline
            .floor
            .fetch_max(self.slot.clock.load(Ordering::Acquire), Ordering::AcqRel);
    }
}

/// Holds global time still while work that will run on an emulated device is queued but not yet
/// running (a stream with pending launches, a collective being enqueued on every rank), so
/// host-side delays before a launch never count as emulated time. Dropping it lets time go on.
#[derive(Debug)]
pub struct Hold {
    slot: Arc<Slot>,
}

impl Hold {
    /// Holds the process-wide timeline at its current time.
    pub fn new() -> Hold {
        Hold::on(Timeline::global())
    }

    fn on(timeline: &Timeline) -> Hold {
        Hold {
            slot: timeline.join(),
        }
    }

    fn release(&self, timeline: &Timeline) {
        timeline.leave(&self.slot);
    }
}

impl Default for Hold {
    fn default() -> Self {
        Hold::new()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release(Timeline::global());
    }
}

/// Makes fast-forward on quiescence wait until some host thread waits for the devices
/// ([`HostWait`]). For a driver (the fake CUDA driver) whose host enqueues launches one device
/// at a time with no [`Hold`] around them: a kernel already waiting for a peer whose launch the
/// host has not issued yet is quiet, but the peer is coming. While the host is outside a
/// synchronising call, global time still advances with the workers' clocks; it only never
/// jumps.
pub fn gate_fast_forward_on_host_waits() {
    Timeline::global().gated.store(true, Ordering::Release);
}

/// Another process shares memory with this one (a peer's segment was mapped:
/// [`crate::GlobalMemory::open_shared`]): from now on a process whose workers only wait is
/// never quiescent, since the write they wait for may come from the peer process, which this
/// timeline cannot see. Global time then only advances with the workers' clocks (waiting warps
/// still advance theirs per poll and `nanosleep`), so `%globaltimer` timeouts still fire, later
/// in host time, and the emulator reports no deadlock: a dead peer process is the launcher's
/// to detect.
pub fn progress_from_other_processes() {
    Timeline::global().external.store(true, Ordering::Release);
}

/// A host thread inside a synchronising call (stream, context or event synchronise): while one
/// exists the host adds no work from that thread, so quiescence may fast-forward global time.
#[derive(Debug)]
pub struct HostWait(());

impl HostWait {
    /// Marks the calling host thread as waiting for the devices until the value is dropped.
    pub fn begin() -> HostWait {
        Timeline::global().host_waits.fetch_add(1, Ordering::AcqRel);
        HostWait(())
    }
}

impl Drop for HostWait {
    fn drop(&mut self) {
        Timeline::global().host_waits.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_waits_for_the_slowest_active_worker() {
        let t = Timeline::new();
        let a = WorkerClock::join(&t);
        let b = WorkerClock::join(&t);
        a.publish(1_000_000, false);
        assert_eq!(t.now(), 0, "b has not advanced: time stays with it");
        b.publish(500, false);
        assert_eq!(t.now(), 500);
        b.publish(100, false); // a worker's clock never goes back
        assert_eq!(t.now(), 500);
        drop(b);
        assert_eq!(t.now(), 500, "b left at 500");
        a.publish(2_000_000, false);
        assert_eq!(t.now(), 2_000_000, "a alone defines the minimum");
        let c = WorkerClock::join(&t);
        assert_eq!(t.now(), 2_000_000);
        c.publish(2_000_010, false);
        a.publish(3_000_000, false);
        assert_eq!(t.now(), 2_000_010);
        drop(c);
        drop(a);
        assert_eq!(t.now(), 3_000_000, "leaving pushes time to the final clock");
    }

    #[test]
    fn a_hold_keeps_time_still_until_released() {
        let t = Timeline::new();
        let a = WorkerClock::join(&t);
        let h = Hold::on(&t);
        a.publish(1_000, false);
        assert_eq!(t.now(), 0, "held");
        h.release(&t);
        std::mem::forget(h); // released on `t`, not on the global timeline
        a.publish(2_000, false);
        assert_eq!(t.now(), 2_000);
    }

    #[test]
    fn quiescence_fast_forwards_in_doubling_steps_unless_held() {
        let t = Timeline::new();
        let a = WorkerClock::join(&t);
        let b = WorkerClock::join(&t);
        a.publish(100, true);
        assert_eq!(t.now(), 0, "b is not quiet yet");
        assert_eq!(b.publish(100, true), Some(1_000));
        assert_eq!(t.now(), 1_100);
        // each step needs a fresh quiet round of every worker (the others learn how long the
        // process has been quiescent)
        assert_eq!(a.publish(100, true), Some(1_000));
        assert_eq!(a.publish(100, true), Some(1_000));
        assert_eq!(b.publish(100, true), Some(2_000));
        assert_eq!(a.publish(100, true), Some(2_000));
        assert_eq!(b.publish(100, true), Some(4_000));
        // progress anywhere ends the stretch
        assert_eq!(b.publish(200, false), None);
        assert_eq!(t.now(), 4_100);
        // a hold (queued work) means progress may still come: no fast-forward
        let h = Hold::on(&t);
        assert_eq!(a.publish(100, true), None);
        assert_eq!(b.publish(300, true), None);
        assert_eq!(t.now(), 4_100);
        h.release(&t);
        std::mem::forget(h);
        // b's quiet round while held still counts: no step was taken since
        assert_eq!(a.publish(100, true), Some(1_000));
    }

    #[test]
    fn a_timeline_shared_with_other_processes_never_fast_forwards() {
        let t = Timeline::new();
        t.external.store(true, Ordering::Release);
        let a = WorkerClock::join(&t);
        for c in [100, 200, 300] {
            assert_eq!(
                a.publish(c, true),
                None,
                "a peer process may write the flag"
            );
        }
        assert_eq!(t.now(), 300, "time follows the waiting worker's clock");
    }

    #[test]
    fn a_gated_timeline_fast_forwards_only_while_the_host_waits() {
        let t = Timeline::new();
        t.gated.store(true, Ordering::Release);
        let a = WorkerClock::join(&t);
        assert_eq!(
            a.publish(100, true),
            None,
            "the host may still enqueue the peer"
        );
        assert_eq!(a.publish(200, true), None);
        assert_eq!(t.now(), 200, "time still follows the worker's clock");
        t.host_waits.fetch_add(1, Ordering::AcqRel); // the host synchronises
        assert_eq!(a.publish(200, true), Some(1_000));
        assert_eq!(t.now(), 1_200);
        t.host_waits.fetch_sub(1, Ordering::AcqRel);
        assert_eq!(a.publish(1_200, true), None);
    }
}
