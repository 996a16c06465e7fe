//! "A new Cargo project written from the README alone" (issue 22): writes a fresh Cargo project
//! into a temporary directory whose `Cargo.toml` is the README's dependency block (the
//! `../ptxforge/` paths pointed at this checkout) and whose `src/main.rs` is the README's
//! host-side example, then builds and runs it with `cargo run --offline`.
//!
//! Ignored by default: it compiles the emulator and its dependencies from scratch at the
//! README's `opt-level = 3` (measured: 258 s from scratch on two shared cores, 1.6 s on a rerun,
//! as the build directory is kept). Run it with
//! `cargo test -p builder --test readme_project -- --ignored --nocapture`; the build goes to
//! `target/readme-project` so a rerun is incremental. Needs no network: the workspace crates
//! are path dependencies and the others come from Cargo's local cache (`--offline`, with this
//! workspace's `Cargo.lock` copied in so the same versions resolve).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The first fenced block of `lang` after the heading `heading` in `text`.
fn fenced_block(text: &str, heading: &str, lang: &str) -> String {
    let start = text.find(heading).expect("README heading");
    let rest = &text[start..];
    let open = format!("```{lang}\n");
    let b = rest.find(&open).expect("fenced block") + open.len();
    let e = rest[b..].find("```").expect("closing fence") + b;
    rest[b..e].to_string()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[test]
#[ignore = "builds a fresh project with the emulator at opt-level 3 (minutes); see module docs"]
fn new_project_from_the_readme_builds_and_runs() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = "## Using ptxforge as a Rust library";
    let deps = fenced_block(&readme, section, "toml");
    let main_rs = fenced_block(&readme, section, "rust");
    assert!(
        deps.contains("../ptxforge/"),
        "README dependency block changed:\n{deps}"
    );
    let deps = deps.replace("../ptxforge/", &format!("{}/", root.display()));

    let dir = std::env::temp_dir().join(format!("ptxforge-readme-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"readme_user\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [workspace]\n\n{deps}"
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.join("src/main.rs"), main_rs).unwrap();
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();

    let out = Command::new(env!("CARGO"))
        .args(["run", "--offline", "--quiet"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", root.join("target/readme-project"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "the README project failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
