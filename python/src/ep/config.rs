//! The configuration of an `EpBuffer`, checked with errors that name the constructor keyword.

use crate::kernels::convert;
use ep::comm::EpConfig;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::Device;
use std::time::Duration;

/// The constructor's keywords as `ptxforge.ep.Buffer` passes them (a dict with every key).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct RawConfig<'py> {
    num_ranks: i64,
    hidden: i64,
    num_experts: i64,
    gpus_per_node: Option<i64>,
    num_sms: i64,
    max_tokens_per_rank: i64,
    devices: Option<Vec<Bound<'py, PyAny>>>,
    timeout_s: f64,
}

/// A checked configuration: everything but top-k (known at the first dispatch).
#[derive(Clone, Debug)]
pub struct Config {
    pub ranks: u32,
    pub gpus_per_node: u32,
    pub hidden: u32,
    pub experts: u32,
    pub num_sms: u32,
    pub max_tokens: u32,
    pub timeout: Duration,
}

fn bad(field: &str, msg: String) -> PyErr {
    PyValueError::new_err(format!("{field}: {msg}"))
}

/// `v` in `lo..=hi`, as u32.
fn range(field: &str, v: i64, lo: i64, hi: i64) -> PyResult<u32> {
    if v < lo || v > hi {
        return Err(bad(field, format!("{v} outside {lo}..={hi}")));
    }
    Ok(v as u32)
}

impl RawConfig<'_> {
    /// Checks every field; returns the configuration and the rank devices.
    pub fn check(&self) -> PyResult<(Config, Vec<Device>)> {
        let ranks = range("num_ranks", self.num_ranks, 1, 64)?;
        let gpn = range(
            "gpus_per_node",
            self.gpus_per_node.unwrap_or(ranks as i64),
            1,
            32,
        )?;
        if !ranks.is_multiple_of(gpn) {
            return Err(bad(
                "gpus_per_node",
                format!("{gpn} does not divide num_ranks = {ranks}"),
            ));
        }
        if ranks / gpn > 32 {
            return Err(bad(
                "gpus_per_node",
                format!("{} nodes (at most 32)", ranks / gpn),
            ));
        }
        let hidden = range("hidden", self.hidden, 1, 1 << 20)?;
        if !hidden.is_multiple_of(128) {
            return Err(bad("hidden", format!("{hidden} is not a multiple of 128")));
        }
        let experts = range("num_experts", self.num_experts, 1, 1 << 16)?;
        if !experts.is_multiple_of(ranks) {
            return Err(bad(
                "num_experts",
                format!("{experts} do not split over {ranks} ranks"),
            ));
        }
        let num_sms = range("num_sms", self.num_sms, 2, 132)?;
        if !num_sms.is_multiple_of(2) {
            return Err(bad(
                "num_sms",
                format!("{num_sms} is odd (one sender and one receiver CTA per channel)"),
            ));
        }
        let max_tokens = range(
            "max_tokens_per_rank",
            self.max_tokens_per_rank,
            1,
            (1 << 24) - 1,
        )?;
        if !(self.timeout_s > 0.0 && self.timeout_s.is_finite()) {
            return Err(bad(
                "timeout_s",
                format!("{} must be a positive number of seconds", self.timeout_s),
            ));
        }
        let cfg = Config {
            ranks,
            gpus_per_node: gpn,
            hidden,
            experts,
            num_sms,
            max_tokens,
            timeout: Duration::from_secs_f64(self.timeout_s),
        };
        // the group's own validation with top-k 1, so that nothing is left to fail later
        cfg.ep_config(1).validate().map_err(convert::ep_err)?;
        Ok((cfg, self.devices(ranks)?))
    }

    fn devices(&self, ranks: u32) -> PyResult<Vec<Device>> {
        let Some(list) = &self.devices else {
            return Ok((0..ranks).map(Device::emu).collect());
        };
        if list.len() != ranks as usize {
            return Err(bad(
                "devices",
                format!("{} devices for num_ranks = {ranks}", list.len()),
            ));
        }
        let devs = list
            .iter()
            .map(|d| convert::device(Some(d), "devices"))
            .collect::<PyResult<Vec<_>>>()?;
        for (i, d) in devs.iter().enumerate() {
            if devs[..i].iter().any(|o| o.same(d)) {
                return Err(bad("devices", format!("rank {i}'s device is listed twice")));
            }
        }
        Ok(devs)
    }
}

impl Config {
    /// The group configuration for `topk`: the communication kernels on the last `num_sms`
    /// SMs of the 132 (compute keeps the first ones, as in DeepSeek-V3's 112 + 20 split).
    pub fn ep_config(&self, topk: u32) -> EpConfig {
        let mut c = EpConfig::new(
            self.ranks,
            self.gpus_per_node,
            self.experts,
            self.hidden,
            topk,
            self.max_tokens,
        );
        c.num_sms = self.num_sms;
        c.sm_offset = 132 - self.num_sms;
        c.timeout = self.timeout;
        c
    }
    pub fn nodes(&self) -> u32 {
        self.ranks / self.gpus_per_node
    }
}
