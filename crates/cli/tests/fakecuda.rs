//! The CUDA backend of the `ptxforge` binary on the fake driver (`crates/fakecuda`, the driver API
//! on the emulator): devices, every library kernel against its CPU reference, and a small
//! two-device MoE step with green-context partitions, peer access and TMA kernels.

use std::process::Output;

/// A temporary directory holding the fake driver (`crates/fakecuda`) as `libcuda.so` and
/// `libcuda.so.1`, plus a cubin cache, removed on drop. `None` (with a note) off Linux or when
/// `PTXFORGE_TEST_CUDA=1` already selects a real driver.
struct FakeCuda {
    dir: std::path::PathBuf,
}

impl FakeCuda {
    fn new(tag: &str) -> Option<FakeCuda> {
        if !cfg!(target_os = "linux") {
            eprintln!("skip: the fake driver is built for Linux only");
            return None;
        }
        if std::env::var("PTXFORGE_TEST_CUDA").as_deref() == Ok("1") {
            eprintln!("skip: PTXFORGE_TEST_CUDA=1 (a real driver is expected)");
            return None;
        }
        let lib = fake_lib();
        let dir =
            std::env::temp_dir().join(format!("ptxforge-fakecuda-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("cache")).expect("temp dir");
        for name in ["libcuda.so", "libcuda.so.1"] {
            std::fs::copy(&lib, dir.join(name)).expect("copy the fake driver");
        }
        Some(FakeCuda { dir })
    }

    /// `cmd` set up to load the fake driver.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
        let mut c = std::process::Command::new(program);
        let mut path = self.dir.as_os_str().to_owned();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        c.env("LD_LIBRARY_PATH", path)
            .env("PTXFORGE_TEST_CUDA", "1")
            .env("PTXFORGE_CACHE", self.dir.join("cache"))
            .env_remove("PTXFORGE_NO_CUDA");
        c
    }
}

impl Drop for FakeCuda {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The fake driver's cdylib: next to this test's profile directory (`cargo test --workspace`
/// builds it with every other target), else built now with `cargo build -p fakecuda` into a
/// separate target directory (the outer cargo may hold the lock of this one).
fn fake_lib() -> std::path::PathBuf {
    const NAME: &str = "libptxforge_fakecuda.so";
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/<profile>/deps/<test>-<hash>
    let profile = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let lib = profile.join(NAME);
    if lib.exists() {
        return lib;
    }
    let target = profile.join("fakecuda-build");
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    eprintln!(
        "note: {} missing; building the fake driver into {}",
        lib.display(),
        target.display()
    );
    let st = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "-p", "fakecuda", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("run cargo build -p fakecuda");
    assert!(st.success(), "cargo build -p fakecuda failed");
    target.join("debug").join(NAME)
}

fn run(f: &FakeCuda, args: &[&str]) -> String {
    let Output {
        status,
        stdout,
        stderr,
    } = f
        .command(env!("CARGO_BIN_EXE_ptxforge"))
        .args(args)
        .output()
        .expect("run ptxforge");
    let out = String::from_utf8_lossy(&stdout).into_owned();
    let err = String::from_utf8_lossy(&stderr);
    assert!(
        status.success(),
        "ptxforge {args:?} failed: {status}\n{out}\n{err}"
    );
    out
}

#[test]
fn ptxforge_runs_on_the_fake_cuda_driver() {
    let Some(f) = FakeCuda::new("cli") else {
        return;
    };
    let devices = run(&f, &["devices"]);
    assert!(
        devices.contains("cuda:0") && devices.contains("cuda:1"),
        "{devices}"
    );
    assert!(devices.contains("fakecuda"), "{devices}");

    let kernels = run(&f, &["kernels", "--check", "--device", "cuda"]);
    let last = kernels.lines().last().unwrap_or_default();
    assert!(
        last.contains("on cuda") && last.contains(" 0 failed"),
        "{kernels}"
    );

    // the main job with each grouped-GEMM kernel: mma.sync, and the sm_90a TMA/wgmma one
    // (tensor maps encoded by the driver, clusters off, persistent grid on the compute partition)
    for gemm in ["mma", "wgmma"] {
        let moe = run(
            &f,
            &[
                "moe",
                "--gemm",
                gemm,
                "--device",
                "cuda",
                "--nodes",
                "1",
                "--gpus-per-node",
                "2",
                "--experts",
                "8",
                "--hidden",
                "512",
                "--intermediate",
                "256",
                "--tokens",
                "128",
                "--topk",
                "2",
                "--groups",
                "2",
                "--topk-groups",
                "1",
                "--check-tokens",
                "16",
            ],
        );
        assert!(
            moe.contains("SM partitions disjoint: true"),
            "{gemm}: {moe}"
        );
        assert!(
            !moe.lines().any(|l| l.trim_end().ends_with(" no")),
            "{gemm}: {moe}"
        );
    }
}
