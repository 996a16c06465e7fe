//! The TCP mesh (`dist::Mesh`): ranks as threads of this process (random frames of every size
//! between all pairs, per-sender order, oversize and bad destinations refused, an orderly end
//! that is no error), and as processes under `ptxforge-dist launch` (the selftest's mesh check,
//! and a SIGKILLed rank named by every other rank's mesh).

use dist::mesh::MAX_FRAME;
use dist::{Bootstrap, DistError, FaultAction, Mesh};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ptxforge-dist");

fn free_port() -> u16 {
    dist::testing::free_port().unwrap()
}

fn boot(rank: usize, world: usize, port: u16, job: &str) -> Bootstrap {
    let mut env = dist::testing::local_env(rank, world, port, job).unwrap();
    (env.peer_timeout, env.bootstrap_timeout) = (Duration::from_secs(5), Duration::from_secs(20));
    Bootstrap::new(env).fault_action(FaultAction::Report)
}

/// Fresh random bytes (std's randomly keyed hasher; no extra dependency).
fn random_bytes(n: usize) -> Vec<u8> {
    let mut h = RandomState::new().build_hasher();
    (0..n.div_ceil(8))
        .flat_map(|i| {
            h.write_usize(i);
            h.finish().to_le_bytes()
        })
        .take(n)
        .collect()
}

/// `frames[from][to]`: what rank `from` sends rank `to`, in order (0 bytes and ~1 MiB among
/// random sizes).
fn plan(world: usize) -> Vec<Vec<Vec<Vec<u8>>>> {
    let sizes = |k: usize| match k {
        0 => 0,
        1 => (1 << 20) + random_bytes(1)[0] as usize,
        _ => random_bytes(2)
            .iter()
            .map(|&b| b as usize * 37)
            .sum::<usize>(),
    };
    (0..world)
        .map(|_| {
            (0..world)
                .map(|_| (0..8).map(|k| random_bytes(sizes(k % 5))).collect())
                .collect()
        })
        .collect()
}

/// Every rank sends its planned frames to every rank, then receives and checks its own.
fn exchange(mesh: &Mesh, frames: &[Vec<Vec<Vec<u8>>>]) {
    let (me, w) = (mesh.rank(), mesh.world_size());
    for i in 0..frames[me][0].len() {
        for (to, f) in frames[me].iter().enumerate() {
            mesh.send(to, f[i].clone()).unwrap();
        }
    }
    let mut next = vec![0; w];
    let total: usize = (0..w).map(|from| frames[from][me].len()).sum();
    for _ in 0..total {
        let (from, b) = mesh
            .recv_timeout(Duration::from_secs(20))
            .unwrap()
            .unwrap_or_else(|| panic!("rank {me}: frames missing after {next:?}"));
        let want = &frames[from][me][next[from]];
        assert!(
            b == *want,
            "rank {me}: frame {} from {from} differs ({} bytes, sent {})",
            next[from],
            b.len(),
            want.len()
        );
        next[from] += 1;
    }
    assert_eq!(mesh.try_recv().unwrap(), None, "rank {me}: extra frames");
}

#[test]
fn frames_of_every_size_reach_every_rank_in_order() {
    let world = 4;
    let port = free_port();
    let job = format!("mesh{port}");
    let frames = Arc::new(plan(world));
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let (frames, job) = (frames.clone(), job.clone());
            std::thread::spawn(move || {
                let g = boot(r, world, port, &job).connect().unwrap();
                let mesh = Mesh::connect(&g).unwrap();
                exchange(&mesh, &frames);
                g.barrier("received").unwrap();
                if r != 0 {
                    drop(mesh);
                    g.barrier("dropped").unwrap();
                } else {
                    g.barrier("dropped").unwrap();
                    // the others left with goodbyes: no error, and frames to them are dropped
                    assert!(mesh
                        .recv_timeout(Duration::from_millis(300))
                        .unwrap()
                        .is_none());
                    mesh.send(1, vec![7; 5]).unwrap();
                    assert!(mesh.try_recv().unwrap().is_none());
                }
                g.finish().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn oversize_frames_and_unknown_ranks_are_refused() {
    let port = free_port();
    let job = format!("meshbig{port}");
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let job = job.clone();
            std::thread::spawn(move || {
                let g = boot(r, 2, port, &job).connect().unwrap();
                let mesh = Mesh::connect(&g).unwrap();
                // zeroed memory: the pages are never touched
                let big = vec![0u8; MAX_FRAME + 1];
                let e = mesh.send(1 - r, big).unwrap_err();
                assert!(matches!(e, DistError::FrameTooLarge { .. }), "{e}");
                assert!(e.to_string().contains("1073741825 bytes"), "{e}");
                let e = mesh.send(2, vec![1]).unwrap_err();
                assert!(
                    e.to_string().contains("rank 2 is not in a mesh of 2"),
                    "{e}"
                );
                // the refused sends left the link usable
                mesh.send(1 - r, vec![r as u8; 3]).unwrap();
                let got = mesh.recv_timeout(Duration::from_secs(10)).unwrap();
                assert_eq!(got, Some((1 - r, vec![1 - r as u8; 3])));
                drop(mesh);
                g.finish().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// The documented hello: `ptxmesh1`, from, to, world (u32 LE), the job id; as one frame.
fn hello_frame(from: u32, to: u32, world: u32, job: &str) -> Vec<u8> {
    let mut b = b"ptxmesh1".to_vec();
    for v in [from, to, world] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(job.as_bytes());
    let mut f = (b.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&b);
    f
}

/// The acceptor's answer frame: status byte, then the reason.
fn answer(c: &mut TcpStream) -> (u8, String) {
    let mut h = [0u8; 4];
    c.read_exact(&mut h).unwrap();
    let mut b = vec![0; u32::from_le_bytes(h) as usize];
    c.read_exact(&mut b).unwrap();
    (b[0], String::from_utf8_lossy(&b[1..]).into_owned())
}

/// Rank 0 is this test speaking the wire format by hand: a hello of another job is refused
/// with the reason, the right hello accepted, then a frame header over 1 GiB makes the real
/// rank 1 report rank 0's connection as lost.
#[test]
fn foreign_hellos_are_refused_and_oversize_frames_end_the_link() {
    let port = free_port();
    let job = format!("meshwire{port}");
    let j1 = job.clone();
    let real = std::thread::spawn(move || {
        let g = boot(1, 2, port, &j1).connect().unwrap();
        let mesh = Mesh::connect(&g).unwrap();
        let e = mesh.recv_timeout(Duration::from_secs(20)).unwrap_err();
        assert!(matches!(e, DistError::PeerLost { rank: 0, .. }), "{e}");
        assert!(e.to_string().contains("1073741825 bytes"), "{e}");
        // the loss stays reported
        assert!(mesh.try_recv().is_err());
        drop(mesh);
        g.finish().unwrap();
    });
    let g = boot(0, 2, port, &job).connect().unwrap();
    let addrs = g.all_gather(b"127.0.0.1:9").unwrap();
    let addr = String::from_utf8(addrs[1].clone()).unwrap();
    let mut c = TcpStream::connect(&addr).unwrap();
    c.write_all(&hello_frame(0, 1, 2, "someone_else")).unwrap();
    let (status, why) = answer(&mut c);
    assert_eq!(status, 1);
    assert!(why.contains("job `someone_else`"), "{why}");
    let mut c = TcpStream::connect(&addr).unwrap();
    c.write_all(&hello_frame(0, 1, 2, &job)).unwrap();
    assert_eq!(answer(&mut c).0, 0);
    c.write_all(&((MAX_FRAME + 1) as u32).to_le_bytes())
        .unwrap();
    // both ranks' finish barrier; rank 1's own failure first if it has one
    let fin = g.finish();
    real.join().unwrap();
    fin.unwrap();
}

/// Runs `ptxforge-dist launch` 2 nodes x 2 processes of the selftest with `--mesh`.
fn launch(job: &str, extra: &[&str]) -> (Option<i32>, String, String, Duration) {
    let t0 = Instant::now();
    let mut c = Command::new(BIN);
    c.args(["launch", "--nodes", "2", "--procs-per-node", "2"])
        .args(["--job-id", job, "--timeout", "5", "--", BIN, "selftest"])
        .args(["--rounds", "1", "--mesh"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let f = dist::testing::finish_within(c.spawn().unwrap(), t0, Duration::from_secs(60)).unwrap();
    (f.status.code(), f.stdout, f.stderr, t0.elapsed())
}

fn job(name: &str) -> String {
    format!("mesh_t{}_{name}", std::process::id())
}

#[test]
fn processes_exchange_frames_over_the_mesh() {
    let (code, out, err, _) = launch(&job("ok"), &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    for r in 0..4 {
        let line = format!("[rank {r}] rank {r}: mesh ok (12 frames with each of 4 ranks)");
        assert!(out.contains(&line), "{out}");
        assert!(out.contains(&format!("[rank {r}] rank {r}: ok")), "{out}");
    }
}

#[test]
fn a_sigkilled_rank_is_named_by_every_other_rank_s_mesh() {
    let (code, out, err, took) = launch(&job("kill"), &["--die-rank", "2"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    for r in [0, 1, 3] {
        let named = format!("[rank {r}] ptxforge-dist: rank {r}: error: rank 2: connection lost");
        assert!(err.contains(&named), "rank {r} did not name rank 2:\n{err}");
    }
    assert!(dist::shm::job_segments(&job("kill")).is_empty());
}
