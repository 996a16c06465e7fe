//! `ptxforge kernels`: every library kernel with its parameters (launch order), launch-shape rule
//! and targets, from `kernels::registry()`.

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Emit JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let reg = kernels::registry();
    if a.json {
        println!("{}", serde_json::to_string_pretty(reg)?);
        return Ok(());
    }
    for k in reg {
        println!("{}  [{}]", k.name, k.targets.join(", "));
        println!("    {}", k.summary);
        let params: Vec<String> = k
            .params
            .iter()
            .map(|p| format!("{}: {}", p.name, p.ty))
            .collect();
        println!("    params: ({})", params.join(", "));
        println!("    launch: {}", k.launch);
        println!("    host:   kernels::{}", k.host);
    }
    Ok(())
}
