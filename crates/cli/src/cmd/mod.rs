//! One module per verb.
pub mod bench;
pub mod bench_gemm;
pub mod check;
pub mod devices;
pub mod emit;
pub mod fmt;
pub mod gemm;
pub mod kernels;
pub mod moe;
pub mod run;
pub mod schedule;
pub mod sim;

/// Shared-memory wavefronts of a launch and its `top` most conflicting lines.
pub fn print_banks(b: &emu::banks::BankReport, top: usize) {
    let t = &b.total;
    println!(
        "    shared: {} requests, {} wavefronts (ideal {}), {} from bank conflicts ({:.1}%)",
        t.requests,
        t.wavefronts,
        t.ideal,
        t.conflicts(),
        100.0 * t.conflicts() as f64 / t.wavefronts.max(1) as f64
    );
    for l in b
        .lines
        .iter()
        .take(top)
        .filter(|l| l.counts.conflicts() > 0)
    {
        let at = if l.line > 0 {
            format!("line {:>5}", l.line)
        } else {
            format!("inst {:>5}", l.index)
        };
        println!(
            "      {at}: {:.2} wavefronts/request (ideal {:.2})  {}",
            l.counts.wavefronts as f64 / l.counts.requests as f64,
            l.counts.ideal as f64 / l.counts.requests as f64,
            l.instruction
        );
    }
}

/// Parses a `--numerics` flag (`exact` | `hw`); `None` when the flag is absent.
pub fn parse_numerics(s: Option<&str>) -> anyhow::Result<Option<emu::Numerics>> {
    s.map(|v| emu::Numerics::parse(v).map_err(|e| anyhow::anyhow!("--numerics: {e}")))
        .transpose()
}
