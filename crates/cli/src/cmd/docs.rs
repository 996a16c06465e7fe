//! `ptxforge docs [--check | --write]`: the documents' generated blocks.
//!
//! Tables of figures the code can produce (crate dependencies, kernel registers and spills per
//! target, the `kernels --check` list, schedule bubbles, simulator presets, dispatch record sizes)
//! live in `README.md` and `docs/*.md` between two marker lines:
//!
//! ```text
//! <!-- generated: NAME (ptxforge docs --write) -->
//! ...
//! <!-- end generated -->
//! ```
//!
//! This module owns the markers, the comparison and the rewrite; `docs/tables.rs` owns what each
//! NAME produces, computed in-process from the libraries (and `ptxas` for registers). `--check`
//! exits non-zero naming every document and block that differs from the code's output (with a
//! short diff) and every generator without a block; `--write` rewrites the blocks in place (only
//! once every document parsed and every block generated). Without either flag it reports the
//! stale blocks and exits 0.

mod tables;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Compare every generated block with the code's output; exit non-zero if one differs.
    #[arg(long, conflicts_with = "write")]
    pub check: bool,
    /// Rewrite every generated block with the code's output.
    #[arg(long)]
    pub write: bool,
    /// Repository root holding README.md, docs/ and the crates' Cargo.toml files (default: the
    /// workspace that contains the current directory).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Only these blocks (comma-separated names; default: all).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Emit JSON.
    #[arg(long)]
    pub json: bool,
}

/// One generated block of a document: the marker lines' indices and the text between them.
#[derive(Debug)]
struct Block {
    name: String,
    /// Line index of the opening marker.
    open: usize,
    /// Line index of the closing marker.
    close: usize,
}

const OPEN: &str = "<!-- generated: ";
const CLOSE: &str = "<!-- end generated -->";

/// Finds the blocks of `text` (lines as split by `lines()`); malformed markers are errors naming
/// the line.
fn parse_blocks(doc: &str, lines: &[&str]) -> Result<Vec<Block>> {
    let mut out = Vec::new();
    let mut open: Option<(String, usize)> = None;
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix(OPEN) {
            if let Some((name, at)) = &open {
                bail!(
                    "{doc}:{}: block `{name}` (line {}) is not closed",
                    i + 1,
                    at + 1
                );
            }
            let name = rest.split_whitespace().next().unwrap_or("");
            if name.is_empty() || name == "-->" || !t.ends_with("-->") {
                bail!("{doc}:{}: malformed marker `{t}`", i + 1);
            }
            open = Some((name.to_string(), i));
        } else if t == CLOSE {
            let Some((name, at)) = open.take() else {
                bail!("{doc}:{}: `{CLOSE}` without an opening marker", i + 1);
            };
            out.push(Block {
                name,
                open: at,
                close: i,
            });
        }
    }
    if let Some((name, at)) = open {
        bail!("{doc}:{}: block `{name}` is not closed", at + 1);
    }
    Ok(out)
}

/// The text a block holds between its markers: a blank line, the table, a blank line (so the
/// Markdown around an HTML comment renders the same on every viewer).
fn body(generated: &str) -> String {
    format!("\n{}\n", generated.trim_end())
}

/// The documents: README.md and docs/*.md, sorted.
fn documents(root: &Path) -> Result<Vec<PathBuf>> {
    let mut docs = vec![root.join("README.md")];
    let dir = root.join("docs");
    let mut md: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    md.sort();
    docs.extend(md);
    Ok(docs)
}

/// The workspace root above the current directory (a Cargo.toml with `[workspace]`).
fn find_root() -> Result<PathBuf> {
    let cwd = std::env::current_dir()?;
    for dir in cwd.ancestors() {
        let manifest = dir.join("Cargo.toml");
        if std::fs::read_to_string(&manifest).is_ok_and(|t| t.contains("[workspace]")) {
            return Ok(dir.to_path_buf());
        }
    }
    bail!(
        "no Cargo workspace above {} (run inside the repository or pass --root)",
        cwd.display()
    )
}

/// A stale block: where it is and a short diff.
#[derive(serde::Serialize)]
struct Stale {
    document: String,
    block: String,
    line: usize,
    diff: String,
}

/// What one run found.
#[derive(serde::Serialize, Default)]
struct Outcome {
    blocks: usize,
    stale: Vec<Stale>,
    /// Generators that have no block in any document.
    unused: Vec<String>,
    written: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    let root = match &a.root {
        Some(r) => r.clone(),
        None => find_root()?,
    };
    for n in &a.only {
        if !tables::GENERATORS.iter().any(|g| g.name == n) {
            bail!("--only {n}: no such block (known: {})", tables::names());
        }
    }
    let want = |n: &str| a.only.is_empty() || a.only.iter().any(|o| o == n);
    let mut cache = tables::Cache::new(&root);
    let mut out = Outcome::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut changed = Vec::new();
    for path in documents(&root)? {
        let doc = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let new = process(&doc, &text, &mut cache, &want, &mut out, &mut seen)?;
        if new != text {
            changed.push((doc, path, new));
        }
    }
    // Written only once every document parsed and every block generated.
    if a.write {
        for (doc, path, new) in changed {
            crate::out::write(&path, new.as_bytes())?;
            out.written.push(doc);
        }
    }
    out.unused = tables::GENERATORS
        .iter()
        .map(|g| g.name.to_string())
        .filter(|n| want(n) && !seen.contains(n))
        .collect();
    report(&a, &out)
}

/// Compares (and regenerates) every wanted block of one document; returns the new text.
fn process(
    doc: &str,
    text: &str,
    cache: &mut tables::Cache,
    want: &dyn Fn(&str) -> bool,
    out: &mut Outcome,
    seen: &mut std::collections::BTreeSet<String>,
) -> Result<String> {
    let lines: Vec<&str> = text.lines().collect();
    let blocks = parse_blocks(doc, &lines)?;
    let mut new = String::with_capacity(text.len());
    let mut next = 0;
    for b in &blocks {
        if !tables::GENERATORS.iter().any(|g| g.name == b.name) {
            bail!(
                "{doc}:{}: unknown block `{}` (known: {})",
                b.open + 1,
                b.name,
                tables::names()
            );
        }
        seen.insert(b.name.clone());
        if !want(&b.name) {
            continue;
        }
        out.blocks += 1;
        let have: String = lines[b.open + 1..b.close]
            .iter()
            .map(|l| format!("{l}\n"))
            .collect();
        let fresh = body(cache.get(&b.name)?);
        if have != fresh {
            out.stale.push(Stale {
                document: doc.to_string(),
                block: b.name.clone(),
                line: b.open + 1,
                diff: short_diff(&have, &fresh),
            });
        }
        for l in &lines[next..=b.open] {
            new.push_str(l);
            new.push('\n');
        }
        new.push_str(&fresh);
        next = b.close;
    }
    for l in &lines[next..] {
        new.push_str(l);
        new.push('\n');
    }
    if !text.ends_with('\n') {
        new.pop();
    }
    Ok(new)
}

/// The lines that differ between the common head and tail of `have` and `want` (at most 8 of
/// each side), `-` for the document's, `+` for the code's.
fn short_diff(have: &str, want: &str) -> String {
    let h: Vec<&str> = have.lines().collect();
    let w: Vec<&str> = want.lines().collect();
    let head = h.iter().zip(&w).take_while(|(a, b)| a == b).count();
    let tail = h[head..]
        .iter()
        .rev()
        .zip(w[head..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let mut s = String::new();
    for (sign, side) in [('-', &h), ('+', &w)] {
        let mid = &side[head..side.len() - tail];
        for l in mid.iter().take(8) {
            s.push_str(&format!("{sign} {l}\n"));
        }
        if mid.len() > 8 {
            s.push_str(&format!("{sign} ... ({} more lines)\n", mid.len() - 8));
        }
    }
    s
}

fn report(a: &Args, out: &Outcome) -> Result<()> {
    if a.json {
        println!("{}", serde_json::to_string_pretty(out)?);
    } else {
        for s in &out.stale {
            let verb = if a.write { "rewritten" } else { "stale" };
            println!("{}:{}: block `{}` {verb}:", s.document, s.line, s.block);
            print!("{}", s.diff);
        }
        for n in &out.unused {
            println!("block `{n}` appears in no document");
        }
        let state = match (a.write, out.stale.len()) {
            (true, n) => format!("{n} rewritten in {} file(s)", out.written.len()),
            (false, 0) => "all up to date".to_string(),
            (false, n) => format!("{n} stale (run `ptxforge docs --write`)"),
        };
        println!("{} generated block(s): {state}", out.blocks);
    }
    if !out.unused.is_empty() {
        bail!("{} generator(s) without a block", out.unused.len());
    }
    if a.check && !out.stale.is_empty() {
        let names: Vec<String> = out
            .stale
            .iter()
            .map(|s| format!("{} `{}`", s.document, s.block))
            .collect();
        bail!("stale generated blocks: {}", names.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_found_and_malformed_markers_refused() {
        let t =
            "a\n<!-- generated: x (ptxforge docs --write) -->\n\nold\n\n<!-- end generated -->\nb";
        let lines: Vec<&str> = t.lines().collect();
        let b = parse_blocks("d.md", &lines).unwrap();
        assert_eq!((b[0].name.as_str(), b[0].open, b[0].close), ("x", 1, 5));
        for bad in [
            "<!-- generated: x -->\n",
            "<!-- end generated -->\n",
            "<!-- generated: x -->\n<!-- generated: y -->\n<!-- end generated -->\n",
            "<!-- generated: -->\n<!-- end generated -->\n",
        ] {
            let lines: Vec<&str> = bad.lines().collect();
            assert!(parse_blocks("d.md", &lines).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn short_diff_shows_only_the_changed_lines() {
        let d = short_diff("a\nb\nc\n", "a\nB\nc\n");
        assert_eq!(d, "- b\n+ B\n");
    }
}
