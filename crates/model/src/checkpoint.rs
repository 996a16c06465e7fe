//! Checkpoints: named FP32/BF16 tensors (parameters and optimizer state), the step, RNG and
//! sampler state words, the configuration's shape and fingerprint, in one self-describing file.
//!
//! Format (all integers little-endian):
//!
//! ```text
//! "PTXFCKPT"            8 bytes magic
//! version               u32 (1)
//! header_len            u64
//! header                header_len bytes of JSON: fingerprint, shape, step, rng, meta and
//!                       per tensor {name, group, dtype, shape, offset, bytes}
//! data                  the tensors' raw little-endian elements, back to back at their offsets
//! crc32                 u32 (IEEE) of every byte before it
//! ```
//!
//! [`save`] writes through [`crate::atomic`] (temp file + rename: a failed or interrupted save
//! leaves the previous checkpoint intact). [`load`] refuses a truncated or corrupt file (size,
//! checksum and header checked before anything is used) and [`Checkpoint::check_config`] a
//! checkpoint of another model/parallel shape, naming the fields that differ.

use crate::atomic::IoError;
use crate::config::{fingerprint_of, TrainConfig};
use half::bf16;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

const MAGIC: &[u8; 8] = b"PTXFCKPT";
const VERSION: u32 = 1;
const PREFIX: usize = 8 + 4 + 8;

/// Errors of saving or loading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("{path}: not a checkpoint or damaged: {msg}")]
    Corrupt { path: String, msg: String },
    #[error("{path}: truncated: {msg}")]
    Truncated { path: String, msg: String },
    #[error("checkpoint of another configuration: {}", mismatch_list(.0))]
    ConfigMismatch(Vec<Mismatch>),
    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },
}

/// One field whose value differs between the checkpoint and the current configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    pub field: String,
    pub checkpoint: String,
    pub current: String,
}

fn mismatch_list(v: &[Mismatch]) -> String {
    v.iter()
        .map(|m| {
            format!(
                "{} is {} in the checkpoint, {} now",
                m.field, m.checkpoint, m.current
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A tensor's elements.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
}

impl TensorData {
    fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::Bf16(v) => v.len(),
        }
    }
    fn dtype(&self) -> &'static str {
        match self {
            TensorData::F32(_) => "f32",
            TensorData::Bf16(_) => "bf16",
        }
    }
    fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        match self {
            TensorData::F32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
            TensorData::Bf16(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        }
    }
    fn bytes(&self) -> usize {
        match self {
            TensorData::F32(v) => 4 * v.len(),
            TensorData::Bf16(v) => 2 * v.len(),
        }
    }
}

/// A named tensor: its shape and elements (`shape` multiplies out to the element count).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

/// Everything a run needs to continue bit for bit.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// [`TrainConfig::fingerprint`] and [`TrainConfig::shape`] of the run that wrote it.
    pub fingerprint: String,
    pub shape: BTreeMap<String, Value>,
    /// Optimizer steps completed.
    pub step: u64,
    /// RNG and sampler state words.
    pub rng: Vec<u64>,
    /// FP32 master weights (and any BF16 parameters).
    pub params: BTreeMap<String, Tensor>,
    /// Optimizer state (AdamW moments), by name.
    pub optimizer: BTreeMap<String, Tensor>,
    /// Free-form extras (loss history, corpus name, ...).
    pub meta: BTreeMap<String, Value>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    fingerprint: String,
    shape: BTreeMap<String, Value>,
    step: u64,
    rng: Vec<u64>,
    meta: BTreeMap<String, Value>,
    tensors: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    name: String,
    group: String,
    dtype: String,
    shape: Vec<usize>,
    offset: u64,
    bytes: u64,
}

impl Checkpoint {
    /// An empty checkpoint of `cfg` at `step`.
    pub fn new(cfg: &TrainConfig, step: u64) -> Checkpoint {
        Checkpoint {
            fingerprint: cfg.fingerprint(),
            shape: cfg.shape(),
            step,
            rng: Vec::new(),
            params: BTreeMap::new(),
            optimizer: BTreeMap::new(),
            meta: BTreeMap::new(),
        }
    }

    /// Refuses a checkpoint written for another model/parallel shape, naming every field that
    /// differs (a field only one side has counts as differing).
    pub fn check_config(&self, cfg: &TrainConfig) -> Result<(), CheckpointError> {
        let now = cfg.shape();
        if self.fingerprint == cfg.fingerprint() && self.shape == now {
            return Ok(());
        }
        let show = |v: Option<&Value>| v.map_or("absent".to_string(), |v| v.to_string());
        let mut keys: Vec<&String> = self.shape.keys().chain(now.keys()).collect();
        keys.sort();
        keys.dedup();
        let diff: Vec<Mismatch> = keys
            .into_iter()
            .filter(|k| self.shape.get(*k) != now.get(*k))
            .map(|k| Mismatch {
                field: k.clone(),
                checkpoint: show(self.shape.get(k)),
                current: show(now.get(k)),
            })
            .collect();
        if diff.is_empty() {
            // same fields, yet another fingerprint: the file's fingerprint does not match its shape
            return Err(CheckpointError::ConfigMismatch(vec![Mismatch {
                field: "fingerprint".into(),
                checkpoint: self.fingerprint.clone(),
                current: cfg.fingerprint(),
            }]));
        }
        Err(CheckpointError::ConfigMismatch(diff))
    }

    fn entries(&self) -> Result<Vec<(Entry, &TensorData)>, CheckpointError> {
        let mut out = Vec::new();
        let mut offset = 0u64;
        for (group, map) in [("param", &self.params), ("optimizer", &self.optimizer)] {
            for (name, t) in map {
                let n = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                if n != Some(t.data.len()) {
                    return Err(CheckpointError::Tensor {
                        name: name.clone(),
                        msg: format!(
                            "shape {:?} does not hold {} elements",
                            t.shape,
                            t.data.len()
                        ),
                    });
                }
                let bytes = t.data.bytes() as u64;
                out.push((
                    Entry {
                        name: name.clone(),
                        group: group.into(),
                        dtype: t.data.dtype().into(),
                        shape: t.shape.clone(),
                        offset,
                        bytes,
                    },
                    &t.data,
                ));
                offset += bytes;
            }
        }
        Ok(out)
    }
}

/// Writes `ck` to `path` atomically (temp file in the same directory, then rename).
pub fn save(path: &Path, ck: &Checkpoint) -> Result<(), CheckpointError> {
    let entries = ck.entries()?;
    let header = Header {
        fingerprint: ck.fingerprint.clone(),
        shape: ck.shape.clone(),
        step: ck.step,
        rng: ck.rng.clone(),
        meta: ck.meta.clone(),
        tensors: entries.iter().map(|(e, _)| clone_entry(e)).collect(),
    };
    let json = serde_json::to_vec(&header).map_err(|e| CheckpointError::Tensor {
        name: "header".into(),
        msg: e.to_string(),
    })?;
    crate::atomic::write_with(path, |w| {
        let mut w = CrcWriter {
            inner: w,
            crc: crc32fast::Hasher::new(),
        };
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&(json.len() as u64).to_le_bytes())?;
        w.write_all(&json)?;
        for (_, data) in &entries {
            data.write(&mut w)?;
        }
        let crc = w.crc.finalize();
        w.inner.write_all(&crc.to_le_bytes())
    })?;
    Ok(())
}

fn clone_entry(e: &Entry) -> Entry {
    Entry {
        name: e.name.clone(),
        group: e.group.clone(),
        dtype: e.dtype.clone(),
        shape: e.shape.clone(),
        offset: e.offset,
        bytes: e.bytes,
    }
}

/// A writer that checksums what passes through it.
struct CrcWriter<'a, W: Write> {
    inner: &'a mut W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for CrcWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Reads a checkpoint, checking magic, version, sizes, checksum and every tensor's extent
/// before returning it. Use [`Checkpoint::check_config`] to compare it with the current run.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|e| IoError::new("reading", path, e))?;
    decode(&bytes, &path.display().to_string())
}

/// [`load`] on bytes already read (`what` names them in errors).
pub fn decode(bytes: &[u8], what: &str) -> Result<Checkpoint, CheckpointError> {
    let corrupt = |msg: String| CheckpointError::Corrupt {
        path: what.into(),
        msg,
    };
    let truncated = |msg: String| CheckpointError::Truncated {
        path: what.into(),
        msg,
    };
    if bytes.len() < PREFIX + 4 {
        return Err(truncated(format!(
            "{} bytes is shorter than the fixed header",
            bytes.len()
        )));
    }
    if &bytes[..8] != MAGIC {
        return Err(corrupt("bad magic (not a ptxforge checkpoint)".into()));
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != VERSION {
        return Err(corrupt(format!(
            "format version {version}, this build reads {VERSION}"
        )));
    }
    let mut hl = [0u8; 8];
    hl.copy_from_slice(&bytes[12..20]);
    let header_len = u64::from_le_bytes(hl);
    let body = bytes.len() - 4;
    if header_len > (body - PREFIX) as u64 {
        return Err(truncated(format!(
            "header of {header_len} bytes does not fit in the {}-byte file",
            bytes.len()
        )));
    }
    let data_start = PREFIX + header_len as usize;
    let header: Header = serde_json::from_slice(&bytes[PREFIX..data_start])
        .map_err(|e| corrupt(format!("header: {e}")))?;
    let need = header
        .tensors
        .iter()
        .try_fold(0u64, |a, t| a.checked_add(t.bytes));
    let have = (body - data_start) as u64;
    let Some(need) = need.filter(|&n| n <= have) else {
        return Err(truncated(format!(
            "the tensors need more than the {have} data bytes the file holds"
        )));
    };
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&bytes[body..]);
    if crc32fast::hash(&bytes[..body]) != u32::from_le_bytes(crc) {
        return Err(corrupt("checksum mismatch".into()));
    }
    if need != have {
        return Err(corrupt(format!(
            "{} data bytes follow the tensors",
            have - need
        )));
    }
    tensors(header, &bytes[data_start..body]).map_err(corrupt)
}

fn tensors(h: Header, data: &[u8]) -> Result<Checkpoint, String> {
    let mut ck = Checkpoint {
        fingerprint: h.fingerprint,
        shape: h.shape,
        step: h.step,
        rng: h.rng,
        params: BTreeMap::new(),
        optimizer: BTreeMap::new(),
        meta: h.meta,
    };
    if ck.fingerprint != fingerprint_of(&ck.shape) {
        return Err("the fingerprint does not match the recorded shape".into());
    }
    for e in h.tensors {
        let n = e.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let end = e.offset.checked_add(e.bytes);
        let raw = end
            .and_then(|end| data.get(usize::try_from(e.offset).ok()?..usize::try_from(end).ok()?))
            .ok_or_else(|| format!("tensor {} lies outside the data", e.name))?;
        let t = match e.dtype.as_str() {
            "f32" => TensorData::F32(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            "bf16" => TensorData::Bf16(
                raw.chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            d => return Err(format!("tensor {}: unknown dtype {d}", e.name)),
        };
        if n != Some(t.len()) || t.bytes() != raw.len() {
            return Err(format!(
                "tensor {}: shape {:?} does not match {} bytes",
                e.name, e.shape, e.bytes
            ));
        }
        let map = match e.group.as_str() {
            "param" => &mut ck.params,
            "optimizer" => &mut ck.optimizer,
            g => return Err(format!("tensor {}: unknown group {g}", e.name)),
        };
        map.insert(
            e.name,
            Tensor {
                shape: e.shape,
                data: t,
            },
        );
    }
    Ok(ck)
}

/// Checks before training that the checkpoint path can be written (see
/// [`crate::atomic::preflight`]).
pub fn preflight(path: &Path) -> Result<(), CheckpointError> {
    Ok(crate::atomic::preflight(path)?)
}
