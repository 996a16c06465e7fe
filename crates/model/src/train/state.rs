//! Checkpoints of a run: every parameter (FP32 master weights and route biases) under its
//! name, each AdamW parameter's BF16 moments as `<name>.adam_m` / `<name>.adam_v`, the step,
//! the sampler state (`rng`), and in `meta` the corpus fingerprint and the loss history.
//! Resuming restores all of it, so the continued run is the uninterrupted one bit for bit.
//! Across processes rank 0 gathers every rank's part and writes the file; on resume every rank
//! reads the file (it must be readable by each process) and restores its own stages.

use super::link::{self, Reader, Tag};
use super::optim::Moments;
use super::Trainer;
use crate::checkpoint::{self, Checkpoint, CheckpointError, Mismatch, Tensor, TensorData};
use crate::data::SamplerState;
use crate::params::{ParamSpec, Params};
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
    ///
    /// Across processes (collective): every rank sends its parameters and moments to rank 0,
    /// which writes the file the single-process run would (the same bytes); every rank returns
    /// the write's outcome.
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        let Some(l) = &self.link else {
            return self.write_checkpoint(path, self.params()?, self.opt.moments()?);
        };
        self.phase("checkpoint");
        let t = link::tag(Tag::Ckpt, 0, 0)?;
        let written = match l.gather(WRITER, t, self.checkpoint_part(), "checkpoint part") {
            Ok(Some(parts)) => self.write_gathered(path, &parts),
            Ok(None) => Ok(()),
            Err(e) if l.rank() != WRITER => return Err(e),
            Err(e) => Err(e),
        };
        let t = link::tag(Tag::Ckpt, 0, 1)?;
        l.broadcast(WRITER, t, written.map(|_| Vec::new()), "checkpoint write")?;
        Ok(())
    }

    /// This process's parameters and moments: u64 count, then (u64 index, f32s) each; u64
    /// count, then (u64 index, m, v as BF16 bits) each.
    fn checkpoint_part(&self) -> Result<Vec<u8>, TrainError> {
        let params = self.owned_params()?;
        let mut b = (params.len() as u64).to_le_bytes().to_vec();
        for (i, d) in params {
            b.extend((i as u64).to_le_bytes());
            link::put_f32s(&mut b, &d);
        }
        let moments = self.opt.moments()?;
        b.extend((moments.len() as u64).to_le_bytes());
        for mo in moments {
            b.extend((mo.index as u64).to_le_bytes());
            link::put_u16s(&mut b, mo.m.iter().map(|x| x.to_bits()));
            link::put_u16s(&mut b, mo.v.iter().map(|x| x.to_bits()));
        }
        Ok(b)
    }

    /// Rank 0: every rank's part (see [`Trainer::checkpoint_part`]) assembled and written.
    fn write_gathered(&self, path: &Path, parts: &[Vec<u8>]) -> Result<(), TrainError> {
        let mut data: Vec<Option<Vec<f32>>> = vec![None; self.specs.len()];
        let mut moments = Vec::new();
        for (r, p) in parts.iter().enumerate() {
            let mut rd = Reader::new(p, r, "checkpoint part");
            for _ in 0..rd.u64()? {
                let i = index_in(&self.specs, rd.u64()?, r)?;
                data[i] = Some(rd.f32s()?);
            }
            for _ in 0..rd.u64()? {
                let index = index_in(&self.specs, rd.u64()?, r)?;
                let bf = |v: Vec<u16>| v.into_iter().map(bf16::from_bits).collect();
                let (m, v) = (bf(rd.u16s()?), bf(rd.u16s()?));
                moments.push(Moments { index, m, v });
            }
            rd.done()?;
        }
        let data = data
            .into_iter()
            .zip(&self.specs)
            .map(|(d, s)| d.ok_or_else(|| tensor_err(&s.name, "no rank holds it".into())))
            .collect::<Result<_, _>>()?;
        let params = Params {
            specs: self.specs.clone(),
            data,
        };
        self.write_checkpoint(path, &params, moments)
    }

    fn write_checkpoint(
        &self,
        path: &Path,
        params: &Params,
        moments: Vec<Moments>,
    ) -> Result<(), TrainError> {
        let mut ck = Checkpoint::new(&self.cfg, self.step);
        ck.rng = self.sampler.to_words().to_vec();
        for (spec, data) in params.specs.iter().zip(&params.data) {
            let t = Tensor {
                shape: spec.shape.clone(),
                data: TensorData::F32(data.clone()),
            };
            ck.params.insert(spec.name.clone(), t);
        }
        for mo in moments {
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

/// Rank 0 writes the checkpoint of a multi-process run (it holds the first and last stage).
const WRITER: usize = 0;

/// Parameter index `i` sent by rank `r`, checked.
fn index_in(specs: &[ParamSpec], i: u64, r: usize) -> Result<usize, TrainError> {
    let i = i as usize;
    match i < specs.len() {
        true => Ok(i),
        false => Err(TrainError::Peer {
            rank: r,
            msg: format!("its checkpoint part names parameter {i} of {}", specs.len()),
        }),
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
