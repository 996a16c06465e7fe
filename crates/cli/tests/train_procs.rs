//! `ptxforge train` across processes, one per pipeline rank, under `ptxforge launch --nodes 2
//! --procs-per-node 1` (the TCP mesh engine) and, with the `mpi` feature, under `mpirun -np 2`
//! (the MPI engine): per-step losses and gradient norms, the validation loss and the
//! checkpoint file are bit-identical to the single-process run of the same configuration and a
//! fresh seed; a rank SIGKILLed mid-step (`PTXFORGE_TEST_DIE`) makes the job exit non-zero
//! with the dead rank and its operation named, leaving no process and no
//! `/dev/shm/ptxforge-{job}-*` segment; a process count other than `parallel.pp` and ranks that
//! disagree on the options are refused. The mpirun cases run with
//! `cargo test -p ptxforge-cli --features mpi --test train_procs`.
mod leftovers;
use leftovers::assert_nothing_left;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// PP `pp` x EP 1, one layer per stage, one 128-token sequence per micro-batch, `steps`
/// steps; `seed` fresh.
fn config_pp(dir: &Path, seed: u64, pp: u32, steps: u32) -> PathBuf {
    let p = dir.join(format!("pp{pp}.toml"));
    let text = format!(
        "[model]\nhidden = 128\nlayers = {layers}\ndense_layers = 1\nheads = 2\n\
         q_lora_rank = 32\nkv_lora_rank = 32\nqk_nope_head_dim = 32\nqk_rope_head_dim = 16\n\
         v_head_dim = 32\nexpert_intermediate = 128\ndense_intermediate = 128\n\n[train]\n\
         seq_len = 128\nmicro_batch = 1\nmicro_batches = {layers}\nsteps = {steps}\n\
         seed = {seed}\n\n[parallel]\npp = {pp}\nep = 1\nep_nodes = 1\nnodes = 1\n\
         devices_per_node = {pp}\n",
        layers = 2 * pp
    );
    std::fs::write(&p, text).expect("write config");
    p
}

/// PP 2, two steps.
fn config(dir: &Path, seed: u64) -> PathBuf {
    config_pp(dir, seed, 2, 2)
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

/// How the ranks are started.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Launcher {
    /// `ptxforge launch --nodes N --procs-per-node 1` (TCP mesh engine).
    Launch,
    /// `mpirun -np N` (feature `mpi`: MPI engine).
    #[cfg(feature = "mpi")]
    Mpirun,
}

/// The variables every rank gets (besides the launcher's own).
const JOB_ENV: [(&str, &str); 2] = [
    ("PTXFORGE_BOOTSTRAP_TIMEOUT", "30"),
    ("PTXFORGE_PEER_TIMEOUT", "20"),
];

/// `n` ranks of `ptxforge train ARGS` (`per_rank`: an extra option whose value is the rank
/// plus one, the ranks then disagree), with `env` added; checks nothing of the job is left.
fn start(
    how: Launcher,
    tag: u16,
    n: u32,
    args: &[String],
    per_rank: Option<&str>,
    env: &[(&str, &str)],
) -> Output {
    let (job, port) = job(tag);
    let bin = env!("CARGO_BIN_EXE_ptxforge");
    let mut c = match how {
        Launcher::Launch => {
            // one process per node, except an even count above 2: two nodes of n / 2
            let (nodes, per) = match n {
                n if n > 2 && n % 2 == 0 => (2, n / 2),
                n => (n, 1),
            };
            let mut c = Command::new(bin);
            c.args(["launch", "--nodes", &nodes.to_string()])
                .args(["--procs-per-node", &per.to_string()])
                .args(["--job-id", &job, "--master-port", &port, "--"]);
            c
        }
        #[cfg(feature = "mpi")]
        Launcher::Mpirun => {
            let mut c = Command::new("mpirun");
            c.args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                &n.to_string(),
            ])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("PTXFORGE_JOB_ID", &job)
            .env("MASTER_PORT", &port);
            for k in ["PTXFORGE_JOB_ID", "MASTER_PORT"]
                .iter()
                .chain(JOB_ENV.iter().map(|(k, _)| k))
                .chain(env.iter().map(|(k, _)| k))
            {
                c.args(["-x", k]);
            }
            c
        }
    };
    c.envs(JOB_ENV).envs(env.iter().copied());
    let rank = match how {
        Launcher::Launch => "RANK",
        #[cfg(feature = "mpi")]
        Launcher::Mpirun => "OMPI_COMM_WORLD_RANK",
    };
    match per_rank {
        // a shell reads the rank from the launcher's variable
        Some(opt) => c.args([
            "sh",
            "-c",
            &format!("exec {bin} train {} {opt} $(({rank} + 1))", args.join(" ")),
        ]),
        None => c.arg(bin).arg("train").args(args),
    };
    let out = c.output().expect("spawn the launcher");
    assert_nothing_left(&job, "");
    out
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

/// PP 2: two processes against one.
fn bit_identical(how: Launcher, tag: u16) {
    let dir = tempdir(&format!("same{tag}"));
    let cfg = config(&dir, fresh_seed());
    same_as_one(how, tag, &dir, &cfg, 2);
}

/// `n` processes (2 nodes of `n / 2` under `ptxforge launch`) against one: per-step losses and
/// gradient norms, validation losses, checkpoint bytes.
fn same_as_one(how: Launcher, tag: u16, dir: &Path, cfg: &Path, n: u32) {
    let t0 = std::time::Instant::now();
    let (a, b) = (dir.join("one.ckpt"), dir.join("two.ckpt"));
    let one = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .arg("train")
        .args(args(cfg, &a, &["--json"]))
        .output()
        .expect("spawn ptxforge");
    let one = json(one);
    let out = start(how, tag, n, &args(cfg, &b, &["--json"]), None, &[]);
    assert!(out.status.success(), "{}", text(&out));
    // under `ptxforge launch` rank 0's lines carry a `[rank 0] ` prefix
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("{\""))
        .expect("a JSON line");
    let two: Value = serde_json::from_str(&line[line.find('{').unwrap_or(0)..]).expect("JSON");
    assert_eq!(numbers(&one)[..], numbers(&two)[..], "{one}\n{two}");
    assert!(
        numbers(&one).len() >= 3,
        "steps x (loss, |g|) + a validation loss"
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
    let _ = std::fs::remove_dir_all(dir);
    eprintln!(
        "{how:?}, {n} processes: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// Rank 1 SIGKILLs itself in the first step's pipeline.
fn killed(how: Launcher, tag: u16) {
    let dir = tempdir(&format!("kill{tag}"));
    let cfg = config(&dir, 5);
    let save = dir.join("k.ckpt");
    let die = [("PTXFORGE_TEST_DIE", "1:pipeline")];
    let out = start(how, tag, 2, &args(&cfg, &save, &[]), None, &die);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rank 1 died during `train: pipeline"),
        "{}",
        text(&out)
    );
    assert!(!save.exists(), "no checkpoint of the failed step");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn train_under_launch_is_bit_identical_to_one_process() {
    bit_identical(Launcher::Launch, 1);
}

#[test]
fn pp4_on_two_nodes_of_two_processes_is_bit_identical_to_one_process() {
    // node peers: the emulator's memory in shared segments, all removed at the end
    let dir = tempdir("pp4");
    let cfg = config_pp(&dir, fresh_seed(), 4, 1);
    same_as_one(Launcher::Launch, 7, &dir, &cfg, 4);
}

#[test]
fn a_rank_killed_mid_step_under_launch_is_named_with_its_operation() {
    killed(Launcher::Launch, 2);
}

#[test]
fn a_process_count_other_than_pp_is_refused() {
    let dir = tempdir("np");
    let cfg = config(&dir, 6);
    let out = start(
        Launcher::Launch,
        3,
        3,
        &args(&cfg, &dir.join("n.ckpt"), &[]),
        None,
        &[],
    );
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
fn ranks_that_disagree_on_the_options_are_refused_at_bootstrap() {
    let dir = tempdir("mismatch");
    let cfg = config(&dir, 7);
    let save = dir.join("m.ckpt");
    let a = args(&cfg, &save, &[]);
    let out = start(Launcher::Launch, 4, 2, &a, Some("--stop-after"), &[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("configuration differs between ranks: rank 1 has `config[1].stop_after` = 2"),
        "{}",
        text(&out)
    );
    assert!(!save.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "mpi")]
#[test]
fn train_under_mpirun_is_bit_identical_to_one_process() {
    bit_identical(Launcher::Mpirun, 5);
}

#[cfg(feature = "mpi")]
#[test]
fn a_rank_killed_mid_step_under_mpirun_is_named_with_its_operation() {
    killed(Launcher::Mpirun, 6);
}
