//! The CLI's input/output plumbing, shared by every verb:
//!
//! - **Standard output.** `println!`/`print!`/`eprintln!` are redefined for the whole crate
//!   (the macros below shadow std's, so every verb's printing goes through [`stdout`]): a closed
//!   pipe (`ptxforge fmt big.ptx | head -1`) ends the process quietly with status 0, as if the
//!   output had been read to the end; any other write error (`> /dev/full`) ends it with status
//!   1 and `ptxforge: error: writing to standard output: ...`. std's macros would panic instead.
//!   [`finish`] flushes what a `print!` left buffered, so that error is not lost at exit.
//! - **Errors as JSON.** [`json_error`] is the object `main` prints for a failed verb run with
//!   `--json`; [`Reported`] marks an error whose verb already printed its own JSON object.
//! - **Output files.** [`preflight`] checks, before the work starts, that a path can be written;
//!   [`write`] writes through `model::atomic` (temporary file in the same directory, then
//!   rename), so a failed run never leaves a truncated file or destroys the previous one.
//! - **Text input.** [`read_text`] reports invalid UTF-8 with its line and column.

use anyhow::{Context, Result};
use std::fmt;
use std::io::Write;
use std::path::Path;

/// `println!` through [`stdout`] (see the module docs).
macro_rules! println {
    () => {
        $crate::out::stdout(format_args!("\n"))
    };
    ($($t:tt)*) => {
        $crate::out::stdout(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// `print!` through [`stdout`].
macro_rules! print {
    ($($t:tt)*) => {
        $crate::out::stdout(format_args!($($t)*))
    };
}

/// `eprintln!` that never panics (a closed standard error has nobody left to tell).
macro_rules! eprintln {
    ($($t:tt)*) => {
        $crate::out::stderr(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// Writes to standard output; on failure ends the process (see the module docs).
pub fn stdout(args: fmt::Arguments) {
    let r = std::io::stdout().lock().write_fmt(args);
    if let Err(e) = r {
        stdout_failed(&e)
    }
}

/// Writes to standard error, ignoring failures.
pub fn stderr(args: fmt::Arguments) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// Flushes standard output at the end of a run; a failure ends the process like a failed write.
pub fn finish() {
    if let Err(e) = std::io::stdout().lock().flush() {
        stdout_failed(&e)
    }
}

fn stdout_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // the reader has all it wanted (`| head`): nothing is wrong, and nothing more is read
        std::process::exit(0);
    }
    stderr(format_args!(
        "ptxforge: error: writing to standard output: {e}\n"
    ));
    std::process::exit(1);
}

/// Marks an error whose verb has already printed its JSON object (e.g. `check`'s diagnostics),
/// so `main` does not print a second one.
#[derive(Debug)]
pub struct Reported(pub String);

impl fmt::Display for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Reported {}

/// An error already printed as JSON by the verb (its message still goes to standard error).
pub fn reported(msg: impl Into<String>) -> anyhow::Error {
    Reported(msg.into()).into()
}

/// Whether `e` was already printed as JSON by its verb.
pub fn is_reported(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Reported>().is_some()
}

/// The JSON object a failed verb prints with `--json`: `{"ok": false, "verb", "error":
/// {"message"}}`, plus the location when the error is an input's (`"file"`, `"line"`, `"col"`).
pub fn json_error(verb: &str, message: &str, e: Option<&anyhow::Error>) -> serde_json::Value {
    let mut err = serde_json::json!({ "message": message });
    if let Some(loc) = e.and_then(|e| e.downcast_ref::<BadText>()) {
        err["file"] = loc.file.clone().into();
        err["line"] = loc.line.into();
        err["col"] = loc.col.into();
    }
    serde_json::json!({ "ok": false, "verb": verb, "error": err })
}

/// A text input that is not UTF-8, located at its first bad byte.
#[derive(Debug)]
pub struct BadText {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub byte: u8,
}

impl fmt::Display for BadText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: invalid UTF-8 (byte 0x{:02x}); the file must be UTF-8 text",
            self.file, self.line, self.col, self.byte
        )
    }
}

impl std::error::Error for BadText {}

/// Reads a text file; invalid UTF-8 is an error naming the file, line and column (1-based) of
/// the first bad byte.
pub fn read_text(path: &Path) -> Result<String> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).with_context(|| format!("reading {file}"))?;
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let before = &bytes[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        // the column counts characters, as an editor shows them
        let col = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        BadText {
            file,
            line,
            col,
            byte: bytes[at],
        }
        .into()
    })
}

/// Checks before any work that `path` can be written (its directory exists and takes a new
/// file; the path is not a directory). `flag` names the option in the error.
pub fn preflight(flag: &str, path: &Path) -> Result<()> {
    model::atomic::preflight(path).with_context(|| format!("{flag} {}", path.display()))
}

/// Writes `bytes` to `path` atomically (temporary file in the same directory, then rename).
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(model::atomic::write(path, bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad_text(bytes: &[u8]) -> BadText {
        let p = std::env::temp_dir().join(format!("ptxforge-out-{}.txt", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        let e = read_text(&p).unwrap_err();
        let _ = std::fs::remove_file(&p);
        let b = e.downcast::<BadText>().unwrap();
        BadText {
            file: String::new(),
            ..b
        }
    }

    #[test]
    fn invalid_utf8_is_located() {
        let b = bad_text(b"line one\nab\xffcd\n");
        assert_eq!((b.line, b.col, b.byte), (2, 3, 0xff));
        // multi-byte characters before the bad byte count as one column each
        let b = bad_text(
            "é\u{e9}x"
                .as_bytes()
                .iter()
                .copied()
                .chain([0xc0])
                .collect::<Vec<_>>()
                .as_slice(),
        );
        assert_eq!((b.line, b.col, b.byte), (1, 4, 0xc0));
    }

    #[test]
    fn json_error_carries_the_location() {
        let e: anyhow::Error = BadText {
            file: "k.ptx".into(),
            line: 7,
            col: 2,
            byte: 0xfe,
        }
        .into();
        let e = e.context("while formatting");
        let j = json_error("fmt", "m", Some(&e));
        assert_eq!(j["ok"], false);
        assert_eq!(j["verb"], "fmt");
        assert_eq!(j["error"]["line"], 7);
        assert_eq!(j["error"]["col"], 2);
    }
}
