//! Calibration from a user's own machine: fit the GEMM tile model and the communication
//! bandwidths to benchmark results, and write a hardware profile the simulator loads.
//!
//! Inputs (JSON files, recognised by shape):
//! - `ptxforge bench gemm --json`: an array of rows with `m`, `n`, `k`, `groups` and `seconds`
//!   (or `tflops`); a `kernel` name containing `bf16` marks a BF16 GEMM.
//! - `ptxforge moe --json`: an object with `ranks`, `num_sms` and `phases`; every phase whose
//!   name starts with `dispatch` or `combine` and that moved bytes is one normal-mode sample
//!   (`seconds`, `inter_bytes`, `intra_bytes` summed over ranks).
//! - `ptxforge bench attn --json`: an array of rows with a `stage` (`train fwd`, `train bwd`,
//!   `decode`), `flops`, `bytes` and `seconds`. Training rows give the attention efficiencies
//!   against the BF16 peak (the backward row counts 3.5x the forward's FLOPs, the recomputed
//!   scores included; the simulator's backward model counts 2.5x, so its efficiency is 2.5/3.5
//!   of the row's); decode rows give the FlashMLA-class decode model's bandwidth (rows the
//!   base model calls memory-bound) or its compute rate (the others). Medians over rows.
//!
//! Fit: coordinate descent in log space on the squared log error of the predicted times,
//! starting from the base hardware. GEMM rows fit `GemmCal`; communication rows fit
//! `inter_node_gbps`, `intra_node_gbps`, `comm_gbps_per_sm` and the two latencies (each only
//! when some sample exercises it: a parameter no sample depends on keeps its base value).

use crate::comm::{self, CommLoad};
use crate::compute::{self, Gemm, GemmCal, MlaDecodeCal};
use crate::config::HardwareConfig;
use crate::error::{Result, SimError};
use serde::{Deserialize, Serialize};

/// A hardware description fitted to benchmarks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    pub hardware: HardwareConfig,
    pub gemm: GemmCal,
    /// Files the profile was fitted from.
    pub sources: Vec<String>,
    pub gemm_samples: usize,
    pub comm_samples: usize,
    /// Root-mean-square relative error of the fitted model on its samples.
    pub gemm_rms_error: f64,
    pub comm_rms_error: f64,
    /// Attention efficiencies from `bench attn` (absent: the configuration's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn: Option<AttnCal>,
    /// The MLA decode model from `bench attn`'s decode rows (absent: the configuration's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla_decode: Option<MlaDecodeCal>,
}

/// Attention efficiencies of a profile (fractions of the BF16 peak), as the training model and
/// the serving prefill model use them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttnCal {
    pub fwd_eff: f64,
    pub bwd_eff: f64,
}

impl HardwareProfile {
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    pub fn from_toml(text: &str, source_name: &str) -> Result<HardwareProfile> {
        let p: HardwareProfile = toml::from_str(text).map_err(|e| SimError::Parse {
            source_name: source_name.into(),
            message: e.to_string().replace('\n', " "),
        })?;
        crate::config::validate_hardware(&p.hardware)?;
        Ok(p)
    }

    pub fn load(path: &str) -> Result<HardwareProfile> {
        let text = crate::read_config_file(path)?;
        Self::from_toml(&text, path)
    }
}

/// One GEMM measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmSample {
    pub gemm: Gemm,
    pub seconds: f64,
}

/// One normal-mode dispatch/combine measurement (per rank).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommSample {
    pub load: CommLoad,
    pub sms: usize,
    pub seconds: f64,
}

/// One `bench attn` row: FLOPs (as the row counts them), bytes and seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnSample {
    pub stage: AttnStage,
    pub flops: f64,
    pub bytes: f64,
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnStage {
    TrainFwd,
    TrainBwd,
    Decode,
}

/// Samples read from benchmark files.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    pub gemm: Vec<GemmSample>,
    pub comm: Vec<CommSample>,
    pub attn: Vec<AttnSample>,
}

fn bad(file: &str, message: impl Into<String>) -> SimError {
    SimError::Parse {
        source_name: file.into(),
        message: message.into(),
    }
}

fn num(v: &serde_json::Value, key: &str, file: &str) -> Result<f64> {
    v.get(key)
        .and_then(|x| x.as_f64())
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| bad(file, format!("`{key}` missing or not a finite number >= 0")))
}

fn gemm_row(r: &serde_json::Value, file: &str) -> Result<GemmSample> {
    let dim = |k: &str| -> Result<usize> {
        let v = num(r, k, file)?;
        if !(1.0..=1e9).contains(&v) {
            return Err(bad(file, format!("`{k}` = {v} is not a GEMM dimension")));
        }
        Ok(v as usize)
    };
    let (m, n, k) = (dim("m")?, dim("n")?, dim("k")?);
    let groups = r.get("groups").map_or(Ok(1), |_| dim("groups"))?;
    let bf16 = r
        .get("kernel")
        .and_then(|x| x.as_str())
        .is_some_and(|s| s.contains("bf16"));
    let gemm = Gemm {
        m,
        n,
        k,
        in_bytes: if bf16 { 2 } else { 1 },
        weights: groups,
    };
    let seconds = match r.get("seconds") {
        Some(_) => num(r, "seconds", file)?,
        None => gemm.flops() / (num(r, "tflops", file)? * 1e12),
    };
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(bad(file, "a GEMM row with a non-positive time"));
    }
    Ok(GemmSample { gemm, seconds })
}

fn moe_rows(v: &serde_json::Value, file: &str, out: &mut Samples) -> Result<()> {
    let ranks = num(v, "ranks", file)?.max(1.0);
    let sms = num(v, "num_sms", file)? as usize;
    let phases = v["phases"]
        .as_array()
        .ok_or_else(|| bad(file, "`phases` is not an array"))?;
    for p in phases {
        let name = p["phase"].as_str().unwrap_or("");
        if !(name.starts_with("dispatch") || name.starts_with("combine")) {
            continue;
        }
        let (ib, nvl) = (num(p, "inter_bytes", file)?, num(p, "intra_bytes", file)?);
        let seconds = num(p, "seconds", file)?;
        if ib + nvl <= 0.0 || seconds <= 0.0 {
            continue;
        }
        // Bytes the SMs copy: every record that crosses a link lands in a buffer.
        let load = CommLoad {
            ib: ib / ranks,
            nvl: nvl / ranks,
            sm: (ib + nvl) / ranks,
        };
        out.comm.push(CommSample { load, sms, seconds });
    }
    Ok(())
}

fn attn_row(r: &serde_json::Value, file: &str) -> Result<AttnSample> {
    let stage = match r["stage"].as_str().unwrap_or("") {
        "train fwd" => AttnStage::TrainFwd,
        "train bwd" => AttnStage::TrainBwd,
        "decode" => AttnStage::Decode,
        other => return Err(bad(file, format!("unknown attention stage `{other}`"))),
    };
    let s = AttnSample {
        stage,
        flops: num(r, "flops", file)?,
        bytes: num(r, "bytes", file)?,
        seconds: num(r, "seconds", file)?,
    };
    if s.seconds <= 0.0 || s.flops <= 0.0 {
        return Err(bad(file, "an attention row with no time or no FLOPs"));
    }
    Ok(s)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// Attention efficiencies from training rows (both stages needed; a missing one keeps `base`).
fn fit_attn(hw: &HardwareConfig, base: AttnCal, s: &[AttnSample]) -> Option<AttnCal> {
    let peak = hw.tflops_bf16 * 1e12;
    let eff = |st: AttnStage, scale: f64| {
        median(
            s.iter()
                .filter(|x| x.stage == st)
                .map(|x| scale * x.flops / x.seconds / peak)
                .collect(),
        )
    };
    let fwd = eff(AttnStage::TrainFwd, 1.0);
    let bwd = eff(AttnStage::TrainBwd, 2.5 / 3.5);
    (fwd.is_some() || bwd.is_some()).then(|| AttnCal {
        fwd_eff: fwd.unwrap_or(base.fwd_eff),
        bwd_eff: bwd.unwrap_or(base.bwd_eff),
    })
}

/// The decode model from decode rows: rows the base model calls memory-bound set the
/// bandwidth, the others the compute rate.
fn fit_decode(base: &MlaDecodeCal, s: &[AttnSample]) -> Option<MlaDecodeCal> {
    let rows: Vec<&AttnSample> = s.iter().filter(|x| x.stage == AttnStage::Decode).collect();
    if rows.is_empty() {
        return None;
    }
    let mem_bound =
        |x: &&&AttnSample| x.bytes / (base.gbps * 1e9) >= x.flops / (base.tflops * 1e12);
    let gbps = median(
        rows.iter()
            .filter(mem_bound)
            .map(|x| x.bytes / x.seconds / 1e9)
            .collect(),
    );
    let tflops = median(
        rows.iter()
            .filter(|x| !mem_bound(x))
            .map(|x| x.flops / x.seconds / 1e12)
            .collect(),
    );
    Some(MlaDecodeCal {
        gbps: gbps.unwrap_or(base.gbps),
        tflops: tflops.unwrap_or(base.tflops),
        ..*base
    })
}

/// Read one benchmark file's samples into `out`.
pub fn read_file(path: &str, out: &mut Samples) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(path, e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(path, format!("not JSON: {e}")))?;
    match &v {
        serde_json::Value::Array(rows) => {
            for r in rows {
                if r.get("stage").is_some() {
                    out.attn.push(attn_row(r, path)?);
                } else {
                    out.gemm.push(gemm_row(r, path)?);
                }
            }
            Ok(())
        }
        serde_json::Value::Object(o) if o.contains_key("phases") => moe_rows(&v, path, out),
        _ => Err(bad(
            path,
            "neither `ptxforge bench gemm --json` rows nor `ptxforge moe --json` output",
        )),
    }
}

/// Minimise `err` over positive parameters (kept within the hardware description's bounds) by
/// coordinate descent in log space.
fn descend(params: &mut [f64], fixed: &[bool], err: &dyn Fn(&[f64]) -> f64) {
    let mut step = 0.5f64;
    let mut best = err(params);
    while step > 1e-4 {
        let mut improved = false;
        for i in 0..params.len() {
            if fixed[i] {
                continue;
            }
            for dir in [1.0, -1.0] {
                let old = params[i];
                // inside the range `validate_hardware` accepts: a rate no sample depends on
                // (latency-bound samples) must not drift to one the profile cannot load
                params[i] = (old * (dir * step).exp())
                    .clamp(crate::config::HARDWARE_MIN, crate::config::HARDWARE_MAX);
                let e = err(params);
                if e < best {
                    best = e;
                    improved = true;
                } else {
                    params[i] = old;
                }
            }
        }
        if !improved {
            step *= 0.5;
        }
    }
}

fn rms(errs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = errs.fold((0.0, 0usize), |(s, n), e| (s + e * e, n + 1));
    if n == 0 {
        0.0
    } else {
        (s / n as f64).sqrt()
    }
}

fn log_err(model: f64, measured: f64) -> f64 {
    (model.max(1e-15) / measured).ln()
}

fn fit_gemm(hw: &HardwareConfig, base: &GemmCal, s: &[GemmSample]) -> (GemmCal, f64) {
    if s.is_empty() {
        return (*base, 0.0);
    }
    let cal = |p: &[f64]| GemmCal {
        tile_eff: p[0].min(1.0),
        tile_overhead_us: p[1],
        hbm_eff: p[2].min(1.0),
        launch_us: p[3],
    };
    let err = |p: &[f64]| {
        let c = cal(p);
        s.iter()
            .map(|x| log_err(compute::gemm_time(hw, &c, hw.sms, &x.gemm), x.seconds).powi(2))
            .sum::<f64>()
    };
    let mut p = [
        base.tile_eff,
        base.tile_overhead_us.max(0.01),
        base.hbm_eff,
        base.launch_us.max(0.01),
    ];
    descend(&mut p, &[false; 4], &err);
    let c = cal(&p);
    let e = rms(s
        .iter()
        .map(|x| compute::gemm_time(hw, &c, hw.sms, &x.gemm) / x.seconds - 1.0));
    (c, e)
}

fn fit_comm(base: &HardwareConfig, s: &[CommSample]) -> (HardwareConfig, f64) {
    if s.is_empty() {
        return (base.clone(), 0.0);
    }
    let hw = |p: &[f64]| HardwareConfig {
        inter_node_gbps: p[0],
        intra_node_gbps: p[1],
        comm_gbps_per_sm: p[2],
        inter_node_latency_us: p[3],
        intra_node_latency_us: p[4],
        ..base.clone()
    };
    let time = |h: &HardwareConfig, x: &CommSample| {
        comm::normal_time(h, x.sms, &x.load).unwrap_or(f64::INFINITY)
    };
    let err = |p: &[f64]| {
        let h = hw(p);
        s.iter()
            .map(|x| log_err(time(&h, x), x.seconds).powi(2))
            .sum::<f64>()
    };
    let no_ib = s.iter().all(|x| x.load.ib <= 0.0);
    let fixed = [
        no_ib,
        s.iter().all(|x| x.load.nvl <= 0.0),
        s.iter().all(|x| x.sms == 0),
        no_ib,
        s.iter().all(|x| x.load.ib > 0.0),
    ];
    let mut p = [
        base.inter_node_gbps,
        base.intra_node_gbps,
        base.comm_gbps_per_sm,
        base.inter_node_latency_us.max(0.1),
        base.intra_node_latency_us.max(0.1),
    ];
    descend(&mut p, &fixed, &err);
    let h = hw(&p);
    let e = rms(s.iter().map(|x| time(&h, x) / x.seconds - 1.0));
    (h, e)
}

/// Fit a profile to the samples of `files`, starting from `base`.
pub fn calibrate(
    base: &HardwareConfig,
    base_gemm: &GemmCal,
    files: &[String],
) -> Result<HardwareProfile> {
    if files.is_empty() {
        return Err(SimError::config(
            "calibrate",
            "give at least one benchmark file",
        ));
    }
    let mut s = Samples::default();
    for f in files {
        read_file(f, &mut s)?;
    }
    if s.gemm.is_empty() && s.comm.is_empty() && s.attn.is_empty() {
        return Err(SimError::config(
            "calibrate",
            "the files hold no GEMM row, no dispatch/combine phase that moved bytes and no \
             attention row",
        ));
    }
    let (mut hw, comm_err) = fit_comm(base, &s.comm);
    let (gemm, gemm_err) = fit_gemm(&hw, base_gemm, &s.gemm);
    hw.name = format!("{} (calibrated)", base.name);
    crate::config::validate_hardware(&hw)?;
    let train = crate::Config::v3().calibration;
    let attn = fit_attn(
        &hw,
        AttnCal {
            fwd_eff: train.attn_fwd_eff,
            bwd_eff: train.attn_bwd_eff,
        },
        &s.attn,
    );
    let mla_decode = fit_decode(
        &crate::serve::ServeConfig::v3().calibration.mla_decode,
        &s.attn,
    );
    Ok(HardwareProfile {
        attn,
        mla_decode,
        hardware: hw,
        gemm,
        sources: files.to_vec(),
        gemm_samples: s.gemm.len(),
        comm_samples: s.comm.len(),
        gemm_rms_error: gemm_err,
        comm_rms_error: comm_err,
    })
}

/// Use a profile for a training simulation: its hardware and GEMM tile model.
pub fn apply_to_training(cfg: &mut crate::Config, p: &HardwareProfile) {
    cfg.hardware = p.hardware.clone();
    cfg.calibration.gemm = p.gemm;
    if let Some(a) = p.attn {
        cfg.calibration.attn_fwd_eff = a.fwd_eff;
        cfg.calibration.attn_bwd_eff = a.bwd_eff;
    }
}

/// Use a profile for a serving simulation: its hardware and GEMM tile model.
pub fn apply_to_serving(cfg: &mut crate::serve::ServeConfig, p: &HardwareProfile) {
    cfg.hardware = p.hardware.clone();
    cfg.calibration.gemm = p.gemm;
    if let Some(a) = p.attn {
        cfg.calibration.attn_prefill_eff = a.fwd_eff;
    }
    if let Some(d) = p.mla_decode {
        cfg.calibration.mla_decode = d;
    }
}
