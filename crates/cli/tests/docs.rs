//! `ptxforge docs`: the repository's generated blocks equal the code's output (CI fails on a
//! stale document), and on a temporary copy of the documents an altered block is reported with
//! its document, name and diff, then rewritten by `--write`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn docs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .arg("docs")
        .args(args)
        .current_dir(repo())
        .output()
        .expect("spawn ptxforge")
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every block but the register tables when ptxas is missing (as the ptxas tests skip), unless
/// `PTXFORGE_REQUIRE_PTXAS=1`.
#[test]
fn every_generated_block_is_up_to_date() {
    let no_ptxas = ptx::ptxas::find_ptxas().is_none()
        && std::env::var("PTXFORGE_REQUIRE_PTXAS").as_deref() != Ok("1");
    let only = "crate-graph,kernel-checks,schedule-bubbles,schedule-json,sim-presets,ep-records";
    // (the two register tables, kernel-registers and ep-registers, need ptxas)
    let args: &[&str] = if no_ptxas {
        eprintln!("ptxas not found (scripts/setup-ptxas.sh): skipping the register tables");
        &["--check", "--only", only]
    } else {
        &["--check"]
    };
    let o = docs(args);
    assert!(
        o.status.success(),
        "documents disagree with the code; run `cargo run -p ptxforge-cli -- docs --write` and \
         review the diff\n{}",
        text(&o)
    );
}

/// A copy of what the generators read: README.md, docs/*.md and the Cargo.toml files.
fn copy_repo(tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("ptxforge-docs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(dst.join("docs")).expect("temp dir");
    let src = repo();
    std::fs::copy(src.join("README.md"), dst.join("README.md")).expect("copy README.md");
    std::fs::copy(src.join("Cargo.toml"), dst.join("Cargo.toml")).expect("copy Cargo.toml");
    for e in std::fs::read_dir(src.join("docs")).expect("docs/") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, dst.join("docs").join(p.file_name().expect("name"))).expect("copy");
    }
    // the workspace members: crates/* and the Python package's crate (python/)
    let mut members: Vec<PathBuf> = std::fs::read_dir(src.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("entry").path())
        .collect();
    members.push(src.join("python"));
    for p in members {
        if p.join("Cargo.toml").is_file() {
            let d = dst.join(p.strip_prefix(&src).expect("inside the repository"));
            std::fs::create_dir_all(&d).expect("crate dir");
            std::fs::copy(p.join("Cargo.toml"), d.join("Cargo.toml")).expect("copy manifest");
        }
    }
    dst
}

/// Replaces the first occurrence of `from` after the marker of `block` in `doc`.
fn alter(root: &Path, doc: &str, block: &str, from: &str, to: &str) {
    let p = root.join(doc);
    let t = std::fs::read_to_string(&p).expect("read doc");
    let at = t
        .find(&format!("<!-- generated: {block} "))
        .unwrap_or_else(|| panic!("no block {block} in {doc}"));
    let rel = t[at..]
        .find(from)
        .unwrap_or_else(|| panic!("{from:?} not in {block}"));
    let mut s = t.clone();
    s.replace_range(at + rel..at + rel + from.len(), to);
    std::fs::write(&p, s).expect("write doc");
}

#[test]
fn an_altered_block_fails_the_check_and_write_restores_it() {
    let root = copy_repo("stale");
    let r = root.to_str().expect("utf-8 temp path");
    let only = "schedule-bubbles,ep-records,crate-graph";
    let pipeline_md = std::fs::read_to_string(root.join("docs/PIPELINE.md")).expect("read");
    // The stale figure, and a wrong record size.
    alter(
        &root,
        "docs/PIPELINE.md",
        "schedule-bubbles",
        "| 9.3 |",
        "| 10.5 |",
    );
    alter(&root, "docs/EP.md", "ep-records", "1,168", "1,200");
    let o = docs(&["--check", "--root", r, "--only", only]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("docs/PIPELINE.md:"), "{out}");
    assert!(out.contains("block `schedule-bubbles` stale"), "{out}");
    assert!(
        out.contains("- | dualpipe | defaults") && out.contains("| 10.5 |"),
        "{out}"
    );
    assert!(
        out.contains("+ | dualpipe | defaults") && out.contains("| 9.3 |"),
        "{out}"
    );
    assert!(
        out.contains("docs/EP.md:") && out.contains("`ep-records`"),
        "{out}"
    );
    assert!(!out.contains("crate-graph` stale"), "{out}");
    assert!(
        out.contains("stale generated blocks: docs/EP.md `ep-records`, docs/PIPELINE.md"),
        "{out}"
    );

    let o = docs(&["--write", "--root", r, "--only", only]);
    assert!(o.status.success(), "{}", text(&o));
    let o = docs(&["--check", "--root", r, "--only", only]);
    assert!(o.status.success(), "{}", text(&o));
    let restored = std::fs::read_to_string(root.join("docs/PIPELINE.md")).expect("read");
    assert_eq!(restored, pipeline_md);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn unknown_and_unclosed_blocks_are_errors() {
    let root = copy_repo("bad");
    let r = root.to_str().expect("utf-8 temp path");
    let readme = root.join("README.md");
    let orig = std::fs::read_to_string(&readme).expect("read");
    std::fs::write(
        &readme,
        format!("{orig}\n<!-- generated: no-such-table -->\n<!-- end generated -->\n"),
    )
    .expect("write");
    let o = docs(&["--check", "--root", r, "--only", "ep-records"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("README.md:"), "{}", text(&o));
    assert!(
        text(&o).contains("unknown block `no-such-table`"),
        "{}",
        text(&o)
    );

    let unclosed = format!("{orig}\n<!-- generated: ep-records -->\n");
    std::fs::write(&readme, &unclosed).expect("write");
    let o = docs(&["--write", "--root", r, "--only", "ep-records"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("is not closed"), "{}", text(&o));
    // Nothing is written when a document cannot be parsed.
    assert_eq!(std::fs::read_to_string(&readme).expect("read"), unclosed);
    let _ = std::fs::remove_dir_all(&root);
}
