//! placeholder verb, filled in by its crate's work.
#[derive(clap::Args)]
pub struct Args {
    /// Emit JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: Args) -> anyhow::Result<()> {
    anyhow::bail!("this verb is not built yet")
}
