//! Checkpoints of a run: every parameter (FP32 master weights and route biases) under its
//! name, each AdamW parameter's BF16 moments as `<name>.adam_m` / `<name>.adam_v`, the step,
//! the sampler state (`rng`), and in `meta` the corpus fingerprint and the loss history.
//! Resuming restores all of it, so the continued run is the uninterrupted one bit for bit.

use super::Trainer;
use crate::checkpoint::{self, Checkpoint, CheckpointError, Mismatch, Tensor, TensorData};
use crate::data::SamplerState;
use crate::params::Params;
use crate::TrainError;
use half::bf16;
use serde_json::{json, Value};
use std::path::Path;

fn tensor_err(name: &str, msg: String) -> TrainError {
    TrainError::Checkpoint(CheckpointError::Tensor {
        name: name.to_string(),
        msg,
    })
}

fn curve_json(c: &[(u32, f64)]) -> Value {
    Value::Array(c.iter().map(|(s, l)| json!([s, l])).collect())
}

fn curve_from(v: Option<&Value>) -> Vec<(u32, f64)> {
    let pts = v.and_then(Value::as_array).cloned().unwrap_or_default();
    pts.iter()
        .filter_map(|p| Some((p.get(0)?.as_u64()? as u32, p.get(1)?.as_f64()?)))
        .collect()
}

impl Trainer {
    /// Writes the run's state to `path` atomically (the previous file survives any failure).
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        let mut ck = Checkpoint::new(&self.cfg, self.step);
        ck.rng = self.sampler.to_words().to_vec();
        let params = self.params()?;
        for (spec, data) in params.specs.iter().zip(&params.data) {
            let t = Tensor {
                shape: spec.shape.clone(),
                data: TensorData::F32(data.clone()),
            };
            ck.params.insert(spec.name.clone(), t);
        }
        for mo in self.opt.moments()? {
            let spec = &self.specs[mo.index];
            for (suffix, d) in [("adam_m", mo.m), ("adam_v", mo.v)] {
                let t = Tensor {
                    shape: spec.shape.clone(),
                    data: TensorData::Bf16(d),
                };
                ck.optimizer.insert(format!("{}.{suffix}", spec.name), t);
            }
        }
        ck.meta
            .insert("corpus".into(), json!(self.corpus_fingerprint.clone()));
        ck.meta
            .insert("train_loss".into(), curve_json(&self.train_curve));
        ck.meta
            .insert("valid_loss".into(), curve_json(&self.valid_curve));
        checkpoint::save(path, &ck)?;
        Ok(())
    }

    /// Continues from the checkpoint at `path`: refused (naming the fields) if it was written
    /// for another model/parallel shape or other data; otherwise parameters, moments, step,
    /// sampler and loss history are restored and every stage reloads its parameters.
    pub fn resume(&mut self, path: &Path) -> Result<(), TrainError> {
        let ck = checkpoint::load(path)?;
        ck.check_config(&self.cfg)?;
        let corpus = ck.meta.get("corpus").and_then(Value::as_str);
        if corpus != Some(self.corpus_fingerprint.as_str()) {
            return Err(CheckpointError::ConfigMismatch(vec![Mismatch {
                field: "data (corpus fingerprint)".into(),
                checkpoint: corpus.unwrap_or("absent").to_string(),
                current: self.corpus_fingerprint.clone(),
            }])
            .into());
        }
        let words: [u64; 3] = ck.rng.as_slice().try_into().map_err(|_| {
            tensor_err("rng", format!("{} sampler words, expected 3", ck.rng.len()))
        })?;
        let data = self
            .specs
            .iter()
            .map(|spec| f32_tensor(&ck, &spec.name, spec.len()))
            .collect::<Result<_, _>>()?;
        let params = Params {
            specs: self.specs.clone(),
            data,
        };
        let moments = |i: usize| {
            let name = &params.specs[i].name;
            let n = params.specs[i].len();
            Ok((
                bf16_tensor(&ck, &format!("{name}.adam_m"), n)?,
                bf16_tensor(&ck, &format!("{name}.adam_v"), n)?,
            ))
        };
        self.opt.restore(&params, &moments)?;
        for s in &mut self.stages {
            s.load_params(&params)?;
        }
        self.host = std::cell::OnceCell::from(params);
        self.step = ck.step;
        self.sampler = SamplerState::from_words(words);
        self.train_curve = curve_from(ck.meta.get("train_loss"));
        self.valid_curve = curve_from(ck.meta.get("valid_loss"));
        Ok(())
    }
}

fn f32_tensor(ck: &Checkpoint, name: &str, n: usize) -> Result<Vec<f32>, TrainError> {
    match ck.params.get(name).map(|t| &t.data) {
        Some(TensorData::F32(v)) if v.len() == n => Ok(v.clone()),
        Some(TensorData::F32(v)) => Err(tensor_err(
            name,
            format!("{} values, expected {n}", v.len()),
        )),
        Some(_) => Err(tensor_err(name, "not f32".into())),
        None => Err(tensor_err(name, "missing from the checkpoint".into())),
    }
}

fn bf16_tensor(ck: &Checkpoint, name: &str, n: usize) -> Result<Vec<bf16>, TrainError> {
    match ck.optimizer.get(name).map(|t| &t.data) {
        Some(TensorData::Bf16(v)) if v.len() == n => Ok(v.clone()),
        Some(TensorData::Bf16(v)) => Err(tensor_err(
            name,
            format!("{} values, expected {n}", v.len()),
        )),
        Some(_) => Err(tensor_err(name, "not bf16".into())),
        None => Err(tensor_err(name, "missing from the checkpoint".into())),
    }
}
