//! `ptxforge schedule`: generate, verify, time, draw (and optionally execute) a
//! pipeline-parallel schedule. All the work lives in the `pipeline` crate; this file maps
//! flags onto it and prints.

use anyhow::Result;
use pipeline::{Costs, Method, Report};

#[derive(clap::Args)]
pub struct Args {
    /// Method: 1f1b, zb1p, dualpipe or dualpipev.
    #[arg(value_parser = parse_method)]
    pub method: Method,
    /// Pipeline size: ranks (1f1b, zb1p, dualpipe) or stages (dualpipev, on PP/2 devices).
    #[arg(long, default_value_t = 8)]
    pub pp: usize,
    /// Micro-batches (dualpipe: total over both directions).
    #[arg(long, default_value_t = 20)]
    pub chunks: usize,
    /// Cost of a forward chunk.
    #[arg(long, default_value_t = 1.0)]
    pub f: f64,
    /// Cost of a full backward chunk.
    #[arg(long, default_value_t = 2.0)]
    pub b: f64,
    /// Cost of the weight-gradient part of a backward chunk.
    #[arg(long, default_value_t = 0.5)]
    pub w: f64,
    /// Cost of a forward and a backward chunk run overlapped.
    #[arg(long, default_value_t = 2.6)]
    pub fb: f64,
    /// Point-to-point latency between ranks.
    #[arg(long, default_value_t = 0.0)]
    pub p2p: f64,
    /// Emit JSON.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG timeline.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<std::path::PathBuf>,
    /// Write a PNG timeline.
    #[arg(long, value_name = "FILE")]
    pub png: Option<std::path::PathBuf>,
    /// Write a Chrome/Perfetto trace (JSON).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    /// Sweep PP and micro-batch counts instead of one schedule.
    #[arg(long)]
    pub sweep: bool,
    /// PP values of the sweep.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16")]
    pub sweep_pp: Vec<usize>,
    /// Micro-batch counts of the sweep.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64")]
    pub sweep_chunks: Vec<usize>,
    /// Also run the schedule for real on a small MLP and compare with the unpipelined gradients.
    #[arg(long)]
    pub execute: bool,
}

pub fn run(a: Args) -> Result<()> {
    let method = a.method;
    let costs = Costs {
        f: a.f,
        b: a.b,
        w: a.w,
        fb: a.fb,
        p2p: a.p2p,
    };
    costs.validate()?;
    for (flag, p) in [("--svg", &a.svg), ("--png", &a.png), ("--trace", &a.trace)] {
        if let Some(p) = p {
            crate::out::preflight(flag, p)?;
        }
    }
    if a.sweep {
        return run_sweep(method, &a, &costs);
    }
    let schedule = pipeline::generate(method, a.pp, a.chunks)?;
    let mut report = Report::new(&schedule, &costs)?;
    if let Some(p) = &a.svg {
        crate::out::write(p, pipeline::draw::svg(&report).as_bytes())?;
    }
    if let Some(p) = &a.png {
        let bytes = pipeline::draw::png(&report)?;
        crate::out::write(p, &bytes)?;
    }
    if let Some(p) = &a.trace {
        let t = serde_json::to_string(&pipeline::draw::chrome_trace(&report))?;
        crate::out::write(p, t.as_bytes())?;
    }
    let exec = if a.execute {
        Some(pipeline::exec::check_against_reference(
            &schedule,
            &pipeline::exec::ExecConfig::default(),
        )?)
    } else {
        None
    };
    if a.json {
        report.execute = exec;
        println!("{}", report.to_json_string());
        if let Some(e) = &report.execute {
            anyhow::ensure!(e.exact, "pipelined gradients differ from the reference");
        }
        return Ok(());
    }
    println!(
        "{} pp={} chunks={} devices={} costs: F={} B={} W={} F&B={} p2p={}",
        method,
        report.pp,
        report.chunks,
        report.devices,
        costs.f,
        costs.b,
        costs.w,
        costs.fb,
        costs.p2p
    );
    println!("schedule verified: every pass once, dependencies hold, deadlock-free");
    println!("makespan {:.4}", report.makespan);
    println!("rank   busy        idle        peak-act  params");
    for r in 0..report.devices {
        println!(
            "{:<6} {:<11.4} {:<11.4} {:<9} {}x",
            r, report.busy[r], report.bubble[r], report.peak_activations[r], report.param_copies[r]
        );
    }
    println!(
        "bubble (critical rank) {:.4}; closed form {} = {:.4}",
        report.bubble_max, report.bubble_formula_text, report.bubble_formula
    );
    if let Some(e) = exec {
        println!(
            "executed on {} worker threads: loss {:.6} (reference {:.6}), max |grad diff| {:.3e} -> {}",
            e.workers,
            e.loss,
            e.reference_loss,
            e.max_grad_diff,
            if e.exact { "bit-identical" } else { "MISMATCH" }
        );
        anyhow::ensure!(e.exact, "pipelined gradients differ from the reference");
    }
    Ok(())
}

fn parse_method(s: &str) -> Result<Method, String> {
    s.parse()
        .map_err(|e: pipeline::ScheduleError| e.to_string())
}

fn run_sweep(method: Method, a: &Args, costs: &Costs) -> Result<()> {
    let rows = pipeline::sweep(method, &a.sweep_pp, &a.sweep_chunks, costs)?;
    if a.json {
        let v = serde_json::json!({ "method": method.name(), "costs": costs, "rows": rows });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{method} sweep, formula {}",
        pipeline::bubble_formula_text(method)
    );
    println!("pp    chunks  makespan    bubble      formula     fraction  peak-act");
    for r in rows {
        match (
            r.makespan,
            r.bubble_max,
            r.bubble_fraction,
            r.peak_activations,
        ) {
            (Some(m), Some(b), Some(fr), Some(p)) => println!(
                "{:<5} {:<7} {:<11.4} {:<11.4} {:<11.4} {:<9.4} {}",
                r.pp, r.chunks, m, b, r.bubble_formula, fr, p
            ),
            _ => println!(
                "{:<5} {:<7} refused: {}",
                r.pp,
                r.chunks,
                r.refused.unwrap_or_default()
            ),
        }
    }
    Ok(())
}
