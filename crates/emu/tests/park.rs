//! Parking of quiet workers (`emu::park`): a kernel polling a flag that another launch sets
//! after a long computation sleeps on the host instead of spinning, and still sees the flag
//! (the setter never signals: the park's bound wakes it).
//!
//! Its own binary: it measures the process's CPU time, which other tests would add to.

use emu::{launch, Allocation, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use std::sync::Arc;
use std::time::Instant;

const TEXT: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
    .visible .entry waiter(.param .u64 flag, .param .u64 out)\n{\n\
    .reg .pred %p<2>;\n.reg .b32 %r<2>;\n.reg .b64 %rd<3>;\n\
    ld.param.u64 %rd1, [flag];\nld.param.u64 %rd2, [out];\n\
    LOOP:\nld.volatile.global.u32 %r1, [%rd1];\nsetp.eq.u32 %p1, %r1, 0;\n\
    @!%p1 bra DONE;\nnanosleep.u32 64;\nbra LOOP;\n\
    DONE:\nadd.u32 %r1, %r1, 1;\nst.global.u32 [%rd2], %r1;\nret;\n}\n\
    .visible .entry setter(.param .u64 flag, .param .u32 n, .param .u32 v)\n{\n\
    .reg .pred %p<2>;\n.reg .b32 %r<5>;\n.reg .b64 %rd<2>;\n\
    ld.param.u64 %rd1, [flag];\nld.param.u32 %r1, [n];\nld.param.u32 %r4, [v];\n\
    mov.u32 %r2, 0;\nmov.u32 %r3, 0;\n\
    LOOP:\nmad.lo.u32 %r3, %r3, 7, %r2;\nadd.u32 %r2, %r2, 1;\nsetp.lt.u32 %p1, %r2, %r1;\n\
    @%p1 bra LOOP;\n\
    setp.eq.u32 %p1, %r3, 12345;\nselp.u32 %r4, 0, %r4, %p1;\nst.volatile.global.u32 [%rd1], %r4;\n\
    ret;\n}\n";

/// User + system CPU seconds of this process so far (all threads, `/proc/self/stat`, in clock
/// ticks of 1/100 s).
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // fields after the command name (which ends with the last ')'): utime is the 12th, stime 13th
    let rest = &s[s.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0
}

struct Setup {
    mem: GlobalMemory,
    module: LoadedModule,
    flag: Arc<Allocation>,
    out: Arc<Allocation>,
}

fn setup() -> Setup {
    let mem = GlobalMemory::new();
    let module = LoadedModule::load(&mem, ptx::parse(TEXT).expect("parse"), 0).expect("load");
    let flag = mem.alloc(4, 0).expect("alloc");
    let out = mem.alloc(4, 0).expect("alloc");
    flag.write_bytes(0, &0u32.to_le_bytes());
    out.write_bytes(0, &[0xAB; 4]); // poisoned
    Setup {
        mem,
        module,
        flag,
        out,
    }
}

/// `hold`: emulated time held until the setter's workers run (a lone waiter would otherwise be
/// quiescent, fast-forward time and report a deadlock before the setter starts).
fn run_setter(s: &Setup, n: u32, v: u32, hold: Option<emu::clock::Hold>) {
    let mut p = s.flag.base.to_le_bytes().to_vec();
    p.extend_from_slice(&n.to_le_bytes());
    p.extend_from_slice(&v.to_le_bytes());
    launch(
        s.module.kernel("setter").expect("kernel"),
        s.mem.snapshot(),
        p,
        &LaunchConfig::linear(1, 32),
        &LaunchOptions {
            hold: Some(Arc::new(std::sync::Mutex::new(hold))),
            ..LaunchOptions::default()
        },
    )
    .expect("setter");
}

fn run_waiter(s: &Setup) {
    let mut p = s.flag.base.to_le_bytes().to_vec();
    p.extend_from_slice(&s.out.base.to_le_bytes());
    launch(
        s.module.kernel("waiter").expect("kernel"),
        s.mem.snapshot(),
        p,
        &LaunchConfig::linear(1, 32),
        &LaunchOptions::default(),
    )
    .expect("waiter");
}

#[test]
fn a_waiting_kernel_sleeps_while_the_kernel_it_waits_for_computes() {
    let n = 3_000_000u32;
    // the setter alone: its CPU time
    let s = setup();
    let c0 = cpu_seconds();
    run_setter(&s, n, 41, None);
    let alone = cpu_seconds() - c0;
    let mut b = [0u8; 4];
    s.flag.read_bytes(0, &mut b);
    assert_eq!(u32::from_le_bytes(b), 41, "the setter ran to its store");
    // waiter and setter together: a spinning waiter would about double the CPU time
    let s = setup();
    let (c0, t0) = (cpu_seconds(), Instant::now());
    let hold = emu::clock::Hold::new();
    std::thread::scope(|sc| {
        let w = sc.spawn(|| run_waiter(&s));
        // the waiter is polling (and parking) before the setter starts
        std::thread::sleep(std::time::Duration::from_millis(50));
        run_setter(&s, n, 41, Some(hold));
        w.join().expect("waiter thread");
    });
    let (both, wall) = (cpu_seconds() - c0, t0.elapsed().as_secs_f64());
    s.out.read_bytes(0, &mut b);
    assert_eq!(u32::from_le_bytes(b), 42, "the waiter saw the flag");
    assert!(
        both < alone * 1.5 + 0.1,
        "setter alone {alone:.2} s CPU, with a waiter {both:.2} s CPU ({wall:.2} s wall)"
    );
}
