//! Atomic file output: everything the trainer writes (checkpoints, plots, traces) goes to a
//! temporary file in the destination's directory, is flushed and synced, and is then renamed
//! over the destination. A reader therefore sees the old file or the new one, never half of
//! one; a failed write removes the temporary and leaves the old file untouched.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A failed file operation, naming the path and what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct IoError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl IoError {
    pub fn new(op: &'static str, path: &Path, source: std::io::Error) -> IoError {
        IoError {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The temporary file `write` uses for `path`: `.<name>.tmp` in the same directory (same file
/// system, so the rename is atomic).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Writes `path` atomically with `fill` (which streams the contents into a buffered writer).
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), IoError> {
    let tmp = temp_path(path);
    let res = write_temp(&tmp, fill).and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|e| IoError::new("renaming into", path, e))
    });
    if res.is_err() {
        // best effort: the temporary may not exist (creation failed) or be a directory
        let _ = std::fs::remove_file(&tmp);
        return res;
    }
    sync_dir(path);
    Ok(())
}

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), IoError> {
    write_with(path, |w| w.write_all(bytes))
}

fn write_temp(
    tmp: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), IoError> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .map_err(|e| IoError::new("creating", tmp, e))?;
    let mut w = BufWriter::new(f);
    fill(&mut w).map_err(|e| IoError::new("writing", tmp, e))?;
    let f = w
        .into_inner()
        .map_err(|e| IoError::new("flushing", tmp, e.into_error()))?;
    f.sync_all().map_err(|e| IoError::new("syncing", tmp, e))
}

/// Makes the rename durable (the directory entry); a failure here cannot lose the new file's
/// contents, so it is not an error.
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
}

/// Checks, before any work, that `path` can be written: its directory exists and accepts a new
/// file (a probe is created and removed), and `path` itself is not a directory.
pub fn preflight(path: &Path) -> Result<(), IoError> {
    let not = |m: &str| std::io::Error::other(m.to_string());
    if path.is_dir() {
        return Err(IoError::new("checking", path, not("is a directory")));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(IoError::new(
            "checking the directory of",
            path,
            not(&format!("{} is not an existing directory", dir.display())),
        ));
    }
    let probe = path.with_file_name(format!(
        ".{}.preflight",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    File::create(&probe).map_err(|e| IoError::new("creating a file next to", path, e))?;
    std::fs::remove_file(&probe).map_err(|e| IoError::new("removing", &probe, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ptxforge-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).ok();
        d
    }

    #[test]
    fn failed_write_keeps_the_old_file() {
        let d = dir("fail");
        let p = d.join("out.bin");
        write(&p, b"old contents").unwrap();
        // the writer fails half way: the old file must be intact and no temporary left
        let r = write_with(&p, |w| {
            w.write_all(b"new, half")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"old contents");
        assert!(!temp_path(&p).exists());
        write(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn preflight_refuses_missing_dirs_and_directories() {
        let d = dir("pre");
        assert!(preflight(&d.join("ok.bin")).is_ok());
        assert!(!d.join(".ok.bin.preflight").exists());
        let e = preflight(&d.join("missing/x.bin")).unwrap_err();
        assert!(e.to_string().contains("not an existing directory"), "{e}");
        assert!(preflight(&d).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
