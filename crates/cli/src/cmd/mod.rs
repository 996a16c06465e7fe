//! One module per verb.
pub mod bench;
pub mod bench_attn;
pub mod bench_gemm;
pub mod check;
#[cfg(feature = "mpi")]
pub mod comm;
pub mod devices;
pub mod docs;
pub mod emit;
mod fault;
pub mod fmt;
pub mod gemm;
pub mod isa;
pub mod kernels;
pub mod launch;
pub mod moe;
mod moe_hash;
mod moe_procs;
pub mod procs;
pub mod run;
pub mod schedule;
pub mod sim;
pub mod train;

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

/// Parses a duration flag: a number with an optional unit `ns`, `us`, `ms`, `s` (seconds when
/// none), e.g. `50ms`, `2s`, `0.5`. Zero, negative, non-finite and absurdly large values are
/// refused with a message.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" => 1e-6,
        "ns" => 1e-9,
        _ => return Err(format!("unknown unit `{unit}` (use ns, us, ms or s)")),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 50ms, 2s)"))?;
    let secs = v * scale;
    if secs.is_nan() || secs <= 0.0 || secs > 1e6 {
        return Err(format!(
            "`{s}` is out of range (must be above 0 and at most 1e6 s)"
        ));
    }
    std::time::Duration::try_from_secs_f64(secs).map_err(|e| format!("`{s}`: {e}"))
}

/// `--sanitize LIST` (None when the flag is absent).
pub fn parse_sanitize(s: Option<&str>) -> anyhow::Result<Option<emu::Tools>> {
    match s {
        None => Ok(None),
        Some(s) => emu::Tools::parse(s)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--sanitize: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        for bad in ["0", "-1s", "1e300", "nan", "5 parsecs", "ms", ""] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
    }
}
