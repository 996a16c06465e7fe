//! Shared by tests that run the CUDA backend on the fake driver (`crates/fakecuda`): included
//! with `#[path]` from `crates/runtime/tests/backend.rs` and `crates/cli/tests/fakecuda.rs`.

/// A temporary directory holding the fake driver (`crates/fakecuda`) behind `libcuda.so`,
/// `libcuda.so.1`, `libnccl.so` and `libnccl.so.2` (the fake NCCL is in the same library),
/// plus a cubin cache, removed on drop. The names are symbolic links to one copy: the loader
/// maps it once, so the driver and NCCL share one emulator (NCCL's device pointers are the
/// driver's addresses). `None` (with a note) off Linux or when `PTXFORGE_TEST_CUDA=1` already
/// selects a real driver.
pub struct FakeCuda {
    dir: std::path::PathBuf,
}

impl FakeCuda {
    pub fn new(tag: &str) -> Option<FakeCuda> {
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
        let one = "libptxforge_fakecuda.so";
        std::fs::copy(&lib, dir.join(one)).expect("copy the fake driver");
        for name in ["libcuda.so", "libcuda.so.1", "libnccl.so", "libnccl.so.2"] {
            std::os::unix::fs::symlink(one, dir.join(name)).expect("link the fake driver");
        }
        Some(FakeCuda { dir })
    }

    /// `cmd` set up to load the fake driver.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
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

/// The fake driver's cdylib ([`artifact`]; `scripts/test.sh` builds it before the tests).
fn fake_lib() -> std::path::PathBuf {
    artifact("libptxforge_fakecuda.so", &["-p", "fakecuda"])
}

/// A build output at `rel` under this test's profile directory (`<target>/<profile>`), or, when
/// it is missing (`cargo test` builds neither cdylibs as such nor plain examples with
/// `--all-targets`), built now with `cargo build ARGS` into a separate target directory (the
/// outer cargo may hold this one's lock).
pub fn artifact(rel: &str, args: &[&str]) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/<profile>/deps/<test>-<hash>
    let profile = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let out = profile.join(rel);
    if out.exists() {
        return out;
    }
    let target = profile.join("fakecuda-build");
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    eprintln!(
        "note: {} missing; building it into {}",
        out.display(),
        target.display()
    );
    let st = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .arg("build")
        .args(args)
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("run cargo build");
    assert!(st.success(), "cargo build {args:?} failed");
    target.join("debug").join(rel)
}
