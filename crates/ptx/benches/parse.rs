//! Parse / print throughput on a ~10 MB module made by repeating the Triton corpus kernels
//! (renamed). Run with `cargo bench -p ptx --bench parse`; prints MB/s. No criterion: one
//! warm-up and a few timed runs, best and median reported.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests-data/corpus");
    let mut funcs = Vec::new();
    let mut globals = Vec::new();
    let mut seen = HashSet::new();
    for t in ["sm_80", "sm_89", "sm_90a"] {
        let Ok(rd) = std::fs::read_dir(dir.join(t)) else {
            continue;
        };
        let mut paths: Vec<_> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "ptx"))
            .collect();
        paths.sort();
        for p in paths {
            let m = ptx::parse(&std::fs::read_to_string(&p).unwrap()).expect("corpus parses");
            for item in m.items {
                match item {
                    ptx::Item::Var(v) => {
                        if seen.insert(v.name.clone()) {
                            globals.push(ptx::Item::Var(v));
                        }
                    }
                    ptx::Item::Func(f) => funcs.push(f),
                    ptx::Item::Alias { .. } => {}
                }
            }
        }
    }
    assert!(!funcs.is_empty(), "no corpus under {}", dir.display());
    let mut m = ptx::Module::new(84, ptx::Target::new("sm_90a"));
    m.items = globals;
    let target = 10 << 20;
    let mut size = 0;
    let mut n = 0usize;
    while size < target {
        let mut f = funcs[n % funcs.len()].clone();
        f.name = format!("{}_{n}", f.name);
        let mut one = ptx::Module::new(84, ptx::Target::new("sm_90a"));
        one.items.push(ptx::Item::Func(f.clone()));
        size += ptx::print(&one).len();
        m.items.push(ptx::Item::Func(f));
        n += 1;
    }
    let text = ptx::print(&m);
    let mb = text.len() as f64 / 1e6;
    let instrs: usize = m.functions().map(|f| f.instructions().len()).sum();
    println!("module: {n} kernels, {instrs} instructions, {mb:.1} MB");

    let runs = 5;
    // The machine may be shared: report process CPU time (from /proc) next to wall time.
    let report = |what: &str, mut wall: Vec<Duration>, mut cpu: Vec<f64>| {
        wall.sort();
        cpu.sort_by(|a, b| a.total_cmp(b));
        let w = mb / wall[0].as_secs_f64();
        let wm = mb / wall[wall.len() / 2].as_secs_f64();
        let c = if cpu[0] > 0.0 {
            format!("{:7.1}", mb / cpu[cpu.len() / 2])
        } else {
            "    n/a".into()
        };
        println!("{what:8} wall best {w:7.1} MB/s  median {wm:7.1} MB/s | cpu median {c} MB/s");
    };
    let measure = |what: &str, f: &mut dyn FnMut()| {
        f(); // warm-up
        let (mut wall, mut cpu) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let c0 = cpu_seconds();
            let t = Instant::now();
            f();
            wall.push(t.elapsed());
            cpu.push(cpu_seconds() - c0);
        }
        report(what, wall, cpu);
    };
    // Parse: each result is dropped outside the timed region, so freeing is not measured.
    let mut slot = None;
    measure("parse", &mut || {
        let old = slot.take();
        slot = Some(ptx::parse(&text).expect("parses"));
        std::hint::black_box(&slot);
        drop(std::hint::black_box(old));
    });
    let parsed = slot.take().unwrap();
    assert_eq!(parsed, m);
    if std::env::var_os("BENCH_PARSE_ONLY").is_some() {
        return;
    }
    let mut out = String::new();
    measure("print", &mut || {
        out = ptx::print(&parsed);
    });
    assert_eq!(out.len(), text.len());
    measure("validate", &mut || {
        let d = ptx::validate(&parsed);
        assert!(d.iter().all(|d| !d.is_error()));
    });
}

/// User + system CPU seconds of this process (0 where /proc is missing).
fn cpu_seconds() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the `(comm)`: state is field 3; utime/stime are fields 14/15.
    let Some(rest) = s.rsplit_once(')').map(|x| x.1) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}
