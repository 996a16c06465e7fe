//! `ptxforge train` across processes, one per pipeline rank, under `mpirun -np 2` (feature
//! `mpi`; the MPI engine carries the stage boundaries): per-step losses and gradient norms, the
//! validation loss and the checkpoint file are bit-identical to the single-process run of the
//! same configuration and a fresh seed; a rank SIGKILLed mid-step (`PTXFORGE_TEST_DIE`) makes
//! the job exit non-zero with the dead rank and its operation named, leaving no process and no
//! `/dev/shm/ptxforge-{job}-*` segment; `-np` other than `parallel.pp` and ranks that disagree on
//! the configuration are refused. Run with
//! `cargo test -p ptxforge-cli --features mpi --test train_procs`.
#![cfg(feature = "mpi")]
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// PP 2 x EP 1, one layer per stage, one 128-token sequence per micro-batch; `seed` fresh.
fn config(dir: &Path, seed: u64) -> PathBuf {
    let p = dir.join("small.toml");
    let text = format!(
        "[model]\nhidden = 128\nlayers = 4\ndense_layers = 1\nheads = 2\nq_lora_rank = 32\n\
         kv_lora_rank = 32\nqk_nope_head_dim = 32\nqk_rope_head_dim = 16\nv_head_dim = 32\n\
         expert_intermediate = 128\ndense_intermediate = 128\n\n[train]\nseq_len = 128\n\
         micro_batch = 1\nmicro_batches = 4\nsteps = 2\nseed = {seed}\n\n[parallel]\npp = 2\n\
         ep = 1\nep_nodes = 1\nnodes = 1\ndevices_per_node = 2\n"
    );
    std::fs::write(&p, text).expect("write config");
    p
}

fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    t % (1 << 40) + 1
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ptxforge-train-procs-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A job id and rendezvous port of this test process's own (unique per test `tag`).
fn job(tag: u16) -> (String, String) {
    let pid = std::process::id();
    (
        format!("trainp{pid}x{tag}"),
        (20000 + (pid % 4000) as u16 * 10 + tag).to_string(),
    )
}

/// `mpirun` with every app context (`:`-separated argument lists) given the job's variables.
fn mpirun(tag: u16, contexts: &[(u32, Vec<String>)], env: &[(&str, &str)]) -> Output {
    let (job, port) = job(tag);
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("PTXFORGE_JOB_ID", &job)
        .env("MASTER_PORT", &port)
        .env("PTXFORGE_BOOTSTRAP_TIMEOUT", "30")
        .env("PTXFORGE_PEER_TIMEOUT", "20");
    let mut names = vec![
        "PTXFORGE_JOB_ID",
        "MASTER_PORT",
        "PTXFORGE_BOOTSTRAP_TIMEOUT",
        "PTXFORGE_PEER_TIMEOUT",
    ];
    for (k, v) in env {
        c.env(k, v);
        names.push(k);
    }
    for (i, (np, args)) in contexts.iter().enumerate() {
        if i > 0 {
            c.arg(":");
        }
        c.args(["-np", &np.to_string()]);
        for n in &names {
            c.args(["-x", n]);
        }
        c.arg(env!("CARGO_BIN_EXE_ptxforge"))
            .arg("train")
            .args(args);
    }
    let out = c.output().expect("spawn mpirun");
    assert_clean(&job);
    out
}

/// No segment of the job left in /dev/shm and no process of it running.
fn assert_clean(job: &str) {
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("ptxforge-{job}-")))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "segments left: {left:?}");
    let needle = format!("PTXFORGE_JOB_ID={job}\0");
    let alive: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
            env.windows(needle.len()).any(|w| w == needle.as_bytes())
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(alive.is_empty(), "processes of job {job} left: {alive:?}");
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: Output) -> Value {
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

fn args(cfg: &Path, save: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--config",
        cfg.to_str().unwrap(),
        "--save",
        save.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(["--eval-batches", "1"].iter().map(|s| s.to_string()));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Each step's (loss, grad_norm) and the validation losses, as f64 bits.
fn numbers(v: &Value) -> Vec<u64> {
    let mut out = Vec::new();
    for s in v["steps"].as_array().expect("steps") {
        out.push(s["loss"].as_f64().expect("loss").to_bits());
        out.push(s["grad_norm"].as_f64().expect("grad_norm").to_bits());
    }
    for s in v["valid"].as_array().expect("valid") {
        out.push(s["loss"].as_f64().expect("loss").to_bits());
    }
    out
}

#[test]
fn train_across_two_processes_is_bit_identical_to_one() {
    let t0 = std::time::Instant::now();
    let dir = tempdir("same");
    let cfg = config(&dir, fresh_seed());
    let (a, b) = (dir.join("one.ckpt"), dir.join("two.ckpt"));
    let one = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .arg("train")
        .args(args(&cfg, &a, &["--json"]))
        .output()
        .expect("spawn ptxforge");
    let one = json(one);
    let two = json(mpirun(1, &[(2, args(&cfg, &b, &["--json"]))], &[]));
    assert_eq!(numbers(&one)[..], numbers(&two)[..], "{one}\n{two}");
    assert_eq!(
        numbers(&one).len(),
        5,
        "2 steps x (loss, |g|) + 1 validation loss"
    );
    let (ca, cb) = (
        std::fs::read(&a).expect("one"),
        std::fs::read(&b).expect("two"),
    );
    assert!(
        ca == cb,
        "checkpoints differ ({} vs {} bytes)",
        ca.len(),
        cb.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn a_rank_killed_mid_step_is_named_with_its_operation() {
    let dir = tempdir("kill");
    let cfg = config(&dir, 5);
    let save = dir.join("k.ckpt");
    let out = mpirun(
        2,
        &[(2, args(&cfg, &save, &[]))],
        &[("PTXFORGE_TEST_DIE", "1:pipeline")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        err.contains("rank 1 died during `train: pipeline"),
        "{}",
        text(&out)
    );
    assert!(!save.exists(), "no checkpoint of the failed step");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_process_count_other_than_pp_is_refused() {
    let dir = tempdir("np");
    let cfg = config(&dir, 6);
    let out = mpirun(3, &[(3, args(&cfg, &dir.join("n.ckpt"), &[]))], &[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "WORLD_SIZE 3: `ptxforge train` across processes runs one process per pipeline rank \
             (parallel.pp = 2)"
        ),
        "{}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranks_that_disagree_on_the_configuration_are_refused_at_bootstrap() {
    let dir = tempdir("mismatch");
    let cfg = config(&dir, 7);
    let save = dir.join("m.ckpt");
    let out = mpirun(
        4,
        &[
            (1, args(&cfg, &save, &[])),
            (1, args(&cfg, &save, &["--stop-after", "1"])),
        ],
        &[],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("configuration differs between ranks: rank 1 has `config[1].stop_after`"),
        "{}",
        text(&out)
    );
    assert!(!save.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
