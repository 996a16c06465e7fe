//! Emulated time (`emu::clock`): what a kernel measures does not depend on how busy the host
//! is, and a launch in which every warp only waits is reported as a deadlock at once.
//!
//! This binary holds the only tests that read `%globaltimer` deltas: the timeline is
//! process-wide, so other tests' launches running concurrently would advance it.

use emu::{launch, EmuError, FaultKind, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The timeline is process-wide: these tests run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// Thread 0 of the one CTA times a loop of `n` iterations (each with a 100 ns `nanosleep`) with
/// both clocks and stores (clock64 delta, globaltimer delta).
fn timed_loop(n: u32) -> [u64; 2] {
    let text = format!(
        "{HEADER}.visible .entry timed(.param .u64 out, .param .u32 n)\n{{\n\
         .reg .pred %p<2>;\n.reg .b32 %r<4>;\n.reg .b64 %rd<12>;\n\
         ld.param.u64 %rd1, [out];\nld.param.u32 %r1, [n];\n\
         mov.u64 %rd2, %clock64;\nmov.u64 %rd3, %globaltimer;\nmov.u32 %r2, 0;\n\
         LOOP:\nnanosleep.u32 100;\nadd.u32 %r2, %r2, 1;\nsetp.lt.u32 %p1, %r2, %r1;\n@%p1 bra LOOP;\n\
         mov.u64 %rd4, %clock64;\nmov.u64 %rd5, %globaltimer;\n\
         sub.u64 %rd6, %rd4, %rd2;\nsub.u64 %rd7, %rd5, %rd3;\n\
         mov.u32 %r3, %tid.x;\nsetp.ne.u32 %p1, %r3, 0;\n@%p1 bra DONE;\n\
         st.global.u64 [%rd1], %rd6;\nst.global.u64 [%rd1+8], %rd7;\nDONE:\nret;\n}}\n"
    );
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&text).expect("parse"), 0).expect("load");
    let out = mem.alloc(16, 0).expect("alloc");
    out.write_bytes(0, &[0xAB; 16]);
    let mut p = out.base.to_le_bytes().to_vec();
    p.extend_from_slice(&n.to_le_bytes());
    launch(
        m.kernel("timed").expect("kernel"),
        mem.snapshot(),
        p,
        &LaunchConfig::linear(1, 64),
        &LaunchOptions::default(),
    )
    .expect("launch");
    let mut b = [0u8; 16];
    out.read_bytes(0, &mut b);
    [
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(b[8..].try_into().expect("8 bytes")),
    ]
}

/// Runs `f` while `2 x cores` host threads burn CPU beside it.
fn on_busy_host<T>(f: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..2 * cores {
            s.spawn(|| {
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                std::hint::black_box(x);
            });
        }
        let r = f();
        stop.store(true, Ordering::Relaxed);
        r
    })
}

#[test]
fn a_kernel_measures_the_same_time_on_an_idle_and_a_busy_host() {
    let _serial = serial();
    let n = 20_000u32;
    let idle = timed_loop(n);
    let busy = on_busy_host(|| timed_loop(n));
    // %clock64: 1 per warp-instruction issued + the nanoseconds slept: about 100 ns and a few
    // instructions per iteration, and exactly the same however busy the host is.
    assert_eq!(idle[0], busy[0], "clock64 deltas");
    let expect = n as u64 * (4 + 100);
    assert!(
        idle[0] >= expect && idle[0] <= n as u64 * (6 + 100),
        "clock64 delta {} for {n} iterations (expected {expect})",
        idle[0]
    );
    // %globaltimer: published once per scheduling round, so it agrees with the warp's own
    // clock to within a round; the same on a busy host.
    for g in [idle[1], busy[1]] {
        assert!(
            g.abs_diff(idle[0]) <= idle[0] / 20 + 50_000,
            "globaltimer delta {g} vs clock64 delta {}",
            idle[0]
        );
    }
}

fn expect_deadlock(r: Result<emu::LaunchStats, EmuError>, line: u32) -> String {
    match r {
        Err(EmuError::Fault {
            kind: FaultKind::Deadlock(why),
            site,
        }) => {
            assert!(why.contains(&format!("PTX line {line}")), "{why}");
            assert!(site.line > 0, "{site:?}");
            why
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
}

#[test]
fn ctas_waiting_on_each_other_are_a_deadlock_reported_at_once() {
    let _serial = serial();
    // CTA 0 waits for a flag CTA 1 sets only after CTA 0's flag, and vice versa.
    let text = format!(
        "{HEADER}.visible .entry k(.param .u64 flags)\n{{\n\
         .reg .pred %p<2>;\n.reg .b32 %r<6>;\n.reg .b64 %rd<6>;\n\
         ld.param.u64 %rd1, [flags];\nmov.u32 %r1, %ctaid.x;\nxor.b32 %r2, %r1, 1;\n\
         mul.wide.u32 %rd2, %r2, 4;\nadd.s64 %rd3, %rd1, %rd2;\n\
         WAIT:\nld.acquire.gpu.global.u32 %r3, [%rd3];\nsetp.eq.u32 %p1, %r3, 0;\n\
         @%p1 nanosleep.u32 64;\n@%p1 bra WAIT;\n\
         mul.wide.u32 %rd4, %r1, 4;\nadd.s64 %rd5, %rd1, %rd4;\nst.global.u32 [%rd5], 1;\nret;\n}}\n"
    );
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&text).expect("parse"), 0).expect("load");
    let flags = mem.alloc(8, 0).expect("alloc");
    flags.write_bytes(0, &[0; 8]);
    let t0 = Instant::now();
    let r = launch(
        m.kernel("k").expect("kernel"),
        mem.snapshot(),
        flags.base.to_le_bytes().to_vec(),
        &LaunchConfig::linear(2, 32),
        &LaunchOptions::default(),
    );
    // the wait loop's `nanosleep` is PTX line 17 of this module
    let why = expect_deadlock(r, 17);
    assert!(
        why.contains("CTA [0, 0, 0]") && why.contains("CTA [1, 0, 0]"),
        "{why}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}

#[test]
fn an_mbarrier_phase_that_never_completes_is_a_deadlock() {
    let _serial = serial();
    // the mbarrier expects 2 arrivals; the one warp arrives once, then waits for the phase
    let text = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n\
         .shared .align 8 .b64 bar;\n.reg .pred %p<2>;\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n\
         mov.u32 %r1, bar;\nmbarrier.init.shared.b64 [%r1], 2;\n\
         mbarrier.arrive.shared.b64 %rd1, [%r1];\n\
         WAIT:\nmbarrier.try_wait.shared.b64 %p1, [%r1], %rd1;\n@!%p1 bra WAIT;\nret;\n}\n";
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(text).expect("parse"), 0).expect("load");
    let t0 = Instant::now();
    let r = launch(
        m.kernel("k").expect("kernel"),
        mem.snapshot(),
        Vec::new(),
        &LaunchConfig::linear(1, 1),
        &LaunchOptions::default(),
    );
    // the `mbarrier.try_wait` is PTX line 14 of this module
    expect_deadlock(r, 14);
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}
