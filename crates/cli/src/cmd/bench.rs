//! `ptxforge bench <TARGET>`: benchmarks. `train`: training steps (tokens/s, phases). `emu`: emulator throughput (ALU-bound kernel, the
//! corpus mma.sync GEMM) and a 512³ bf16 GEMM against a naive CPU reference (`emu::bench`).

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub target: Target,
}

#[derive(clap::Subcommand)]
pub enum Target {
    /// Emulator throughput: lane-instructions/s, and emulated vs CPU-reference GEMM time.
    Emu(EmuArgs),
    /// DeepGEMM shape table: library GEMMs (vs cuBLAS via PyTorch on a GPU; emulated cost on emu).
    Gemm(super::bench_gemm::GemmArgs),
    /// MLA attention: training forward/backward and paged decoding.
    Attn(super::bench_attn::AttnArgs),
    /// Training steps of `ptxforge train`: tokens/s and the per-phase breakdown.
    Train(super::train::BenchArgs),
}

#[derive(clap::Args)]
pub struct EmuArgs {
    /// Host threads for the emulator (default: all).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// GEMM size M=N=K (a multiple of 64).
    #[arg(long, default_value_t = 512)]
    pub size: u32,
    /// Loop iterations of the ALU kernel.
    #[arg(long, default_value_t = 256)]
    pub alu_iters: u32,
    /// Emit one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl Target {
    /// Whether the benchmark was given `--json`.
    pub fn json(&self) -> bool {
        match self {
            Target::Emu(e) => e.json,
            Target::Gemm(g) => g.json,
            Target::Attn(a) => a.json,
            Target::Train(t) => t.json,
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    match a.target {
        Target::Gemm(g) => super::bench_gemm::run(g),
        Target::Attn(a) => super::bench_attn::run(a),
        Target::Train(t) => super::train::bench(t),
        Target::Emu(e) => {
            let o = emu::bench::BenchOptions {
                threads: e.threads,
                alu_iters: e.alu_iters,
                gemm_size: e.size,
                ..Default::default()
            };
            let r = emu::bench::run(&o)?;
            if e.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("{r}");
            }
            Ok(())
        }
    }
}
