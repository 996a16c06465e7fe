//! The rendezvous store, bootstrap and liveness in one process: each rank is a thread with its
//! own `Group` (watchdogs in `FaultAction::Report` mode, so a death is observed, not exited
//! on). The multi-process behaviour is in `launch.rs`.

use dist::{Bootstrap, DistEnv, DistError, FaultAction, Group};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    dist::testing::free_port().unwrap()
}

/// Rank `rank` of a one-node job, with short timeouts.
fn env(rank: usize, world: usize, port: u16, job: &str) -> DistEnv {
    let mut e = dist::testing::local_env(rank, world, port, job).unwrap();
    (e.peer_timeout, e.bootstrap_timeout) = (Duration::from_secs(3), Duration::from_secs(10));
    e
}

fn boot(rank: usize, world: usize, port: u16, job: &str) -> Bootstrap {
    Bootstrap::new(env(rank, world, port, job)).fault_action(FaultAction::Report)
}

/// Fresh random bytes (std's randomly keyed hasher; no extra dependency).
fn random_bytes(n: usize) -> Vec<u8> {
    let mut h = RandomState::new().build_hasher();
    (0..n)
        .map(|i| {
            h.write_usize(i);
            h.finish() as u8
        })
        .collect()
}

/// Runs `f(rank, group)` on `world` threads, each bootstrapping its own rank.
fn ranks<T: Send + 'static>(
    world: usize,
    f: impl Fn(usize, Bootstrap) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let port = free_port();
    let job = format!("st{port}");
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let (f, job) = (f.clone(), job.clone());
            std::thread::spawn(move || f(r, boot(r, world, port, &job)))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn store_and_collectives_agree_on_every_rank() {
    let out = ranks(3, |r, b| {
        let g = b.connect().unwrap();
        let mine = random_bytes(5 + r);
        let all = g.all_gather(&mine).unwrap();
        assert_eq!(all[r], mine);
        g.set(&format!("x{r}"), &mine).unwrap();
        let next = (r + 1) % 3;
        let theirs = g.wait(&format!("x{next}"), Duration::from_secs(5)).unwrap();
        assert_eq!(
            theirs, all[next],
            "rank {r}: set/wait disagrees with all_gather"
        );
        assert_eq!(g.get(&format!("x{next}")).unwrap(), Some(theirs));
        assert_eq!(g.get("never-set").unwrap(), None);
        g.barrier("b").unwrap();
        g.barrier("b").unwrap();
        let again = g.all_gather(&[r as u8]).unwrap();
        assert_eq!(again, vec![vec![0], vec![1], vec![2]]);
        g.finish().unwrap();
        all
    });
    assert!(
        out.iter().all(|a| *a == out[0]),
        "ranks gathered different data"
    );
}

#[test]
fn a_late_rank_is_waited_for() {
    let t0 = Instant::now();
    let waited = ranks(3, move |r, b| {
        if r == 2 {
            std::thread::sleep(Duration::from_millis(1200));
        }
        let g = b.connect().unwrap();
        let t = t0.elapsed();
        g.finish().unwrap();
        t
    });
    assert!(
        waited.iter().all(|t| *t >= Duration::from_millis(1200)),
        "{waited:?}"
    );
}

#[test]
fn a_rank_that_never_comes_is_named_after_the_bootstrap_timeout() {
    let port = free_port();
    let t0 = Instant::now();
    let e = boot(0, 3, port, "never")
        .bootstrap_timeout(Duration::from_millis(600))
        .unwrap()
        .connect()
        .err()
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    match &e {
        DistError::BootstrapTimeout { missing, .. } => assert_eq!(missing, &[1, 2]),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("rank(s) 1, 2 never joined"), "{e}");
}

#[test]
fn unreachable_master_times_out_without_hanging() {
    let port = free_port(); // nobody listens there now
    let t0 = Instant::now();
    let e = boot(1, 2, port, "unreach")
        .bootstrap_timeout(Duration::from_millis(700))
        .unwrap()
        .connect()
        .err()
        .unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(
        matches!(e, DistError::MasterUnreachable { rank: 1, .. }),
        "{e}"
    );
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
}

#[test]
fn port_in_use_is_a_clear_error_on_rank_0() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let e = boot(0, 2, port, "inuse").connect().err().unwrap();
    let msg = e.to_string();
    assert!(matches!(e, DistError::Bind { .. }), "{msg}");
    assert!(
        msg.contains(&port.to_string()) && msg.contains("MASTER_PORT"),
        "{msg}"
    );
}

#[test]
fn another_jobs_rank_and_a_duplicate_rank_are_refused() {
    let port = free_port();
    let host = std::thread::spawn(move || {
        boot(0, 2, port, "jobA")
            .bootstrap_timeout(Duration::from_secs(3))
            .unwrap()
            .connect()
    });
    std::thread::sleep(Duration::from_millis(200));
    let e = boot(1, 2, port, "jobB").connect().err().unwrap();
    assert!(e.to_string().contains("jobA"), "{e}");
    let g1 = boot(1, 2, port, "jobA").connect();
    let g0 = host.join().unwrap().unwrap();
    let g1 = g1.unwrap();
    let e = boot(1, 2, port, "jobA").connect().err().unwrap();
    assert!(e.to_string().contains("already joined"), "{e}");
    let t = std::thread::spawn(move || g1.finish());
    g0.finish().unwrap();
    t.join().unwrap().unwrap();
}

#[test]
fn wait_times_out_naming_the_key() {
    let out = ranks(1, |_, b| {
        let g = b.connect().unwrap();
        let e = g.wait("nobody", Duration::from_millis(300)).unwrap_err();
        g.finish().unwrap();
        e.to_string()
    });
    assert!(out[0].contains("`nobody`"), "{}", out[0]);
}

#[test]
fn config_mismatch_is_reported_on_every_rank() {
    let out = ranks(3, |r, b| {
        let hidden = if r == 1 { 96 } else { 64 };
        let cfg = serde_json::json!({ "hidden": hidden, "experts": 4 });
        b.config(&cfg).unwrap().connect().err().unwrap().to_string()
    });
    for m in &out {
        assert!(
            m.contains("rank 1 has `config.hidden` = 96 where rank 0 has 64"),
            "{m}"
        );
    }
}

/// A rank that goes away without finishing is a dead peer: the others' blocked barrier and
/// their watchdogs report it with the operation it announced.
#[test]
fn a_lost_rank_is_reported_with_its_operation() {
    let t0 = Instant::now();
    let out = ranks(3, |r, b| {
        let g: Group = b.connect().unwrap();
        g.set_op(if r == 2 { "dispatch" } else { "combine" })
            .unwrap();
        g.barrier("announced").unwrap();
        if r == 2 {
            drop(g); // closes its heartbeat without a goodbye
            return None;
        }
        let e = g.barrier("never-complete").unwrap_err();
        // the watchdog hears of it on its next heartbeat (every 0.75 s here)
        let t = Instant::now();
        while g.check().is_ok() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let watched = g.check().unwrap_err().to_string();
        Some((e, watched))
    });
    assert!(t0.elapsed() < Duration::from_secs(8));
    for (e, watched) in out.into_iter().flatten() {
        assert!(
            matches!(&e, DistError::PeerDied { rank: 2, op } if op == "dispatch"),
            "{e}"
        );
        assert!(
            watched.contains("rank 2 died during `dispatch`"),
            "{watched}"
        );
    }
}

#[test]
fn bad_builder_options_and_hand_built_environments_are_named() {
    let e = boot(0, 1, 1, "opt")
        .peer_timeout(Duration::ZERO)
        .err()
        .unwrap();
    assert!(e.to_string().contains("peer_timeout"), "{e}");
    let e = boot(0, 1, 1, "opt")
        .bootstrap_timeout(Duration::MAX)
        .err()
        .unwrap();
    assert!(e.to_string().contains("bootstrap_timeout"), "{e}");
    let mut env = env(0, 2, 1, "opt");
    env.rank = 2;
    let e = Bootstrap::new(env.clone()).connect().err().unwrap();
    assert!(
        e.to_string().contains("invalid rank: 2 of world size 2"),
        "{e}"
    );
    env.rank = 1;
    env.local_rank = 0;
    let e = Bootstrap::new(env).connect().err().unwrap();
    assert!(e.to_string().contains("local_rank"), "{e}");
}
