//! `ptxforge devices [--json]`: the devices this process can use (emulated devices always; CUDA
//! devices when a driver is present, otherwise a line saying why not).

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Emit one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let (devs, why) = runtime::Device::list();
    if a.json {
        let j = serde_json::json!({ "devices": devs, "cuda_unavailable": why });
        println!("{j}");
        return Ok(());
    }
    for d in &devs {
        let b = match d.backend {
            runtime::Backend::Emu => "emu",
            runtime::Backend::Cuda => "cuda",
        };
        let p = &d.props;
        println!(
            "{b}:{}  {}  sm_{}  {} SMs  {} KiB smem/block  {:.1} GiB",
            d.index,
            p.name,
            p.sm_version,
            p.sms,
            p.max_shared_per_block / 1024,
            p.total_memory as f64 / (1u64 << 30) as f64
        );
    }
    if let Some(w) = why {
        println!("cuda: unavailable: {w}");
    }
    Ok(())
}
