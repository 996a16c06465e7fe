//! `ptxforge emit NAME [--arch sm_90a] [--shape m,n,k] [--annotate]`: prints a library kernel's
//! PTX (with `--annotate`, each instruction followed by the Rust builder call that emitted it).

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Kernel name (see `ptxforge kernels`).
    pub name: String,
    /// Target architecture.
    #[arg(long, default_value = "sm_90a")]
    pub arch: String,
    /// Problem shape m,n,k (kernels here take sizes at run time; accepted for uniformity).
    #[arg(long)]
    pub shape: Option<String>,
    /// Emit JSON ({name, arch, ptx}).
    #[arg(long)]
    pub json: bool,
    /// Append the Rust source location (`// file.rs:line`) of the builder call that emitted
    /// each instruction; line numbers stay those of the plain output.
    #[arg(long)]
    pub annotate: bool,
}

pub fn run(a: Args) -> Result<()> {
    let info = kernels::registry::find(&a.name)?;
    let mut shape = info
        .test_shapes
        .first()
        .copied()
        .unwrap_or(kernels::Shape::new(128, 128, 128));
    if let Some(s) = &a.shape {
        let v: Vec<usize> = s
            .split(',')
            .map(|x| x.trim().parse())
            .collect::<Result<_, _>>()?;
        if v.len() != 3 {
            bail!("--shape takes m,n,k");
        }
        shape = kernels::Shape::new(v[0], v[1], v[2]);
    }
    let m = info.generate(&builder::Target::new(&a.arch), &shape)?;
    let text = if a.annotate {
        ptx::printer::print_annotated(&m)
    } else {
        ptx::print(&m)
    };
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "name": info.name, "arch": a.arch, "ptx": text })
        );
    } else {
        print!("{text}");
    }
    Ok(())
}
