//! Issue 20 item 8: the workspace's declared `rust-version` is no lower than what any locked
//! dependency declares (their sources in Cargo's registry cache say so). That the workspace's
//! own code builds with the declared toolchain is checked by `scripts/msrv.sh` (run by hand);
//! docs/RELIABILITY.md says how the version was found.

use std::path::{Path, PathBuf};

fn version(s: &str) -> (u32, u32, u32) {
    let mut it = s.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

fn registry_sources() -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    std::fs::read_dir(home.join("registry/src"))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// `package.rust-version` of a registry package's manifest, when it declares one.
fn declared_by(dirs: &[PathBuf], name: &str, ver: &str) -> Option<Option<String>> {
    let manifest = dirs
        .iter()
        .map(|d| d.join(format!("{name}-{ver}/Cargo.toml")))
        .find(|p| p.exists())?;
    let t: toml::Value = toml::from_str(&std::fs::read_to_string(manifest).ok()?).ok()?;
    Some(
        t.get("package")
            .and_then(|p| p.get("rust-version"))
            .and_then(|v| v.as_str())
            .map(str::to_string),
    )
}

#[test]
fn declared_rust_version_covers_every_locked_dependency() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ws: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let declared = ws["workspace"]["package"]["rust-version"]
        .as_str()
        .expect("workspace.package.rust-version")
        .to_string();
    let lock: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.lock")).unwrap()).unwrap();
    let dirs = registry_sources();
    let (mut found, mut too_new) = (0, Vec::new());
    for p in lock["package"].as_array().unwrap() {
        let from_registry = p
            .get("source")
            .and_then(|s| s.as_str())
            .is_some_and(|s| s.starts_with("registry+"));
        if !from_registry {
            continue;
        }
        let (name, ver) = (p["name"].as_str().unwrap(), p["version"].as_str().unwrap());
        // packages of other platforms (windows-sys, ...) are locked but never downloaded here
        let Some(rv) = declared_by(&dirs, name, ver) else {
            continue;
        };
        found += 1;
        if let Some(rv) = rv.filter(|rv| version(rv) > version(&declared)) {
            too_new.push(format!("{name} {ver} needs {rv}"));
        }
    }
    assert!(
        found >= 50,
        "only {found} locked packages found in Cargo's registry cache ({dirs:?}): build once first"
    );
    assert!(
        too_new.is_empty(),
        "Cargo.toml declares rust-version {declared}, but: {}",
        too_new.join("; ")
    );
}
