//! `ptxforge fmt FILE.ptx [-o OUT] [--json]`: parse a PTX file and print it back, formatted.

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The PTX file to format.
    pub file: PathBuf,
    /// Write the formatted text here instead of stdout.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Emit a JSON summary (`{"file", "ok", "functions", "instructions"}`) instead of the text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let file = a.file.display().to_string();
    if let Some(out) = &a.output {
        crate::out::preflight("-o", out)?;
    }
    let text = crate::out::read_text(&a.file)?;
    let m = match ptx::parse(&text) {
        Ok(m) => m,
        Err(e) => {
            if a.json {
                let j = serde_json::json!({
                    "file": file,
                    "ok": false,
                    "error": { "line": e.line, "col": e.col, "message": e.message },
                });
                println!("{j}");
            }
            let msg = format!("{file}:{}:{}: {}", e.line, e.col, e.message);
            if a.json {
                return Err(crate::out::reported(msg));
            }
            anyhow::bail!(msg);
        }
    };
    let printed = ptx::print(&m);
    if let Some(out) = &a.output {
        crate::out::write(out, printed.as_bytes())?;
    }
    if a.json {
        let instructions: usize = m.functions().map(|f| f.instructions().len()).sum();
        let j = serde_json::json!({
            "file": file,
            "ok": true,
            "functions": m.functions().count(),
            "instructions": instructions,
        });
        println!("{j}");
    } else if a.output.is_none() {
        print!("{printed}");
    }
    Ok(())
}
