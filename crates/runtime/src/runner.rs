//! Run one kernel from a PTX file with arguments given as text — the engine behind
//! `ptxforge run` and the corpus tests.
//!
//! An argument spec is one of
//! * `in:PATH.npy` — a device buffer initialised from a `.npy` file (its address is passed),
//! * `out:DTYPE:COUNT` — a zero-initialised buffer of COUNT elements of DTYPE
//!   (`u8 i8 u16 i16 u32 i32 u64 i64 f16 bf16 f32 f64`),
//! * `u32:V`, `i32:V`, `u64:V`, `i64:V`, `f32:V`, `f64:V` — a scalar passed by value.
//!
//! [`run`] loads the module, builds the buffers, launches, waits and reads every buffer back.
//! Arguments are checked against the kernel's parameters by [`crate::args::resolve`], the rules
//! the Python package's `Module.launch` shares. [`Manifest`] and [`apply_check`] implement the corpus
//! test-case format of `docs/TOOLS.md` (reference: `scripts/corpus/interp-check.py`).

use crate::args::Given;
use crate::{Arg, Buffer, Device, LaunchConfig, Module, RuntimeError};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Errors of the runner: bad specs, unreadable files, runtime failures, failed checks.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("argument spec `{spec}`: {msg}")]
    Spec { spec: String, msg: String },
    #[error("{path}: {msg}")]
    Npy { path: String, msg: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, RunError>;

/// Element types of buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    Bf16,
    F32,
    F64,
}

impl DType {
    pub const ALL: [DType; 12] = [
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::Bf16,
        DType::F32,
        DType::F64,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::U64 => "u64",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::Bf16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// The numpy type string a buffer of this type is saved as (16-bit floats as `uint16`
    /// bit patterns, since numpy has no bf16 and tools disagree on f16).
    pub fn npy_descr(self) -> &'static str {
        match self {
            DType::U8 => "|u1",
            DType::I8 => "|i1",
            DType::U16 | DType::F16 | DType::Bf16 => "<u2",
            DType::I16 => "<i2",
            DType::U32 => "<u4",
            DType::I32 => "<i4",
            DType::U64 => "<u8",
            DType::I64 => "<i8",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
        }
    }

    /// Element `i` of raw little-endian data as f64 (16-bit floats decoded by their type).
    pub fn decode_f64(self, data: &[u8], i: usize) -> f64 {
        let s = self.size();
        let b = &data[i * s..(i + 1) * s];
        match self {
            DType::U8 => b[0] as f64,
            DType::I8 => b[0] as i8 as f64,
            DType::U16 => u16::from_le_bytes([b[0], b[1]]) as f64,
            DType::I16 => i16::from_le_bytes([b[0], b[1]]) as f64,
            DType::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
            DType::Bf16 => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
            DType::U32 => u32::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DType::I32 => i32::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DType::F32 => f32::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DType::U64 => u64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DType::I64 => i64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            DType::F64 => f64::from_le_bytes(b.try_into().unwrap_or_default()),
        }
    }

    /// Element `i` as an exact integer (floats by their bit pattern, unsigned).
    pub fn decode_int(self, data: &[u8], i: usize) -> i128 {
        let s = self.size();
        let b = &data[i * s..(i + 1) * s];
        let mut a = [0u8; 8];
        a[..s].copy_from_slice(b);
        let u = u64::from_le_bytes(a);
        match self {
            DType::I8 => u as u8 as i8 as i128,
            DType::I16 => u as u16 as i16 as i128,
            DType::I32 => u as u32 as i32 as i128,
            DType::I64 => u as i64 as i128,
            _ => u as i128,
        }
    }

    pub fn is_int(self) -> bool {
        !matches!(self, DType::F16 | DType::Bf16 | DType::F32 | DType::F64)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A host array: element type, shape and raw little-endian data.
#[derive(Clone, Debug, PartialEq)]
pub struct HostArray {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

impl HostArray {
    pub fn len(&self) -> usize {
        self.data.len() / self.dtype.size()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    pub fn get_f64(&self, i: usize) -> f64 {
        self.dtype.decode_f64(&self.data, i)
    }
}

/// Reads a `.npy` file (C order, little endian, numeric dtypes; `bool` reads as u8).
pub fn read_npy(path: &Path) -> Result<HostArray> {
    let err = |msg: String| RunError::Npy {
        path: path.display().to_string(),
        msg,
    };
    let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    parse_npy(&bytes).map_err(err)
}

/// Parses `.npy` bytes: the data must be exactly what the header declares.
pub fn parse_npy(bytes: &[u8]) -> std::result::Result<HostArray, String> {
    let data_start = npy_preflight(bytes)?;
    let header = npyz::NpyHeader::from_reader(&bytes[..data_start])
        .map_err(|e| format!("not a .npy file: {e}"))?;
    let file = npyz::NpyFile::with_header(header, std::io::empty());
    let ts = match file.dtype() {
        npyz::DType::Plain(ts) => ts,
        d => {
            return Err(format!(
                "unsupported dtype {} (structured arrays are not supported)",
                d.descr()
            ))
        }
    };
    let size = ts.num_bytes().unwrap_or(0);
    let big = ts.endianness() == npyz::Endianness::Big && size > 1;
    let dtype = match (ts.type_char(), size) {
        (npyz::TypeChar::Uint, 1) | (npyz::TypeChar::Bool, 1) => DType::U8,
        (npyz::TypeChar::Int, 1) => DType::I8,
        (npyz::TypeChar::Uint, 2) => DType::U16,
        (npyz::TypeChar::Int, 2) => DType::I16,
        (npyz::TypeChar::Uint, 4) => DType::U32,
        (npyz::TypeChar::Int, 4) => DType::I32,
        (npyz::TypeChar::Uint, 8) => DType::U64,
        (npyz::TypeChar::Int, 8) => DType::I64,
        (npyz::TypeChar::Float, 2) => DType::F16,
        (npyz::TypeChar::Float, 4) => DType::F32,
        (npyz::TypeChar::Float, 8) => DType::F64,
        _ => return Err(format!("unsupported dtype `{ts}`")),
    };
    let shape = file.shape().to_vec();
    if shape.len() > 1 && file.order() == npyz::Order::Fortran {
        return Err(
            "Fortran-order arrays are not supported (save with np.ascontiguousarray)".into(),
        );
    }
    // checked: a shape whose product wraps must not become a small accepted array
    let nbytes = shape
        .iter()
        .try_fold(size as u64, |acc, &d| acc.checked_mul(d))
        .filter(|&b| b <= crate::limits::MAX_BUFFER_BYTES)
        .ok_or_else(|| {
            format!(
                "shape {shape:?} of {size}-byte elements exceeds the {} GiB buffer limit",
                crate::limits::MAX_BUFFER_BYTES >> 30
            )
        })? as usize;
    // The data follows the header (numpy writes nothing after it): exactly `nbytes` bytes.
    let held = bytes.len() - data_start;
    if held != nbytes {
        return Err(format!(
            "the header declares {} elements of {size} bytes ({nbytes} bytes of data), the file \
             holds {held} bytes of data after the header",
            nbytes / size.max(1)
        ));
    }
    let mut data = bytes[data_start..].to_vec();
    if big {
        for c in data.chunks_exact_mut(size) {
            c.reverse();
        }
    }
    Ok(HostArray { dtype, shape, data })
}

/// Checks what `npyz` trusts before it reads a header: the magic, a header length that lies
/// within the file (npyz allocates it as given, up to 4 GiB), and a shape whose element count
/// fits in 64 bits (npyz multiplies the dimensions unchecked). Returns where the data starts.
fn npy_preflight(bytes: &[u8]) -> std::result::Result<usize, String> {
    if !bytes.starts_with(b"\x93NUMPY") {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (len, pre) = match bytes.get(6) {
        Some(1) => (
            bytes
                .get(8..10)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize),
            10,
        ),
        Some(2 | 3) => (
            bytes
                .get(8..12)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize),
            12,
        ),
        Some(v) => return Err(format!("unsupported .npy format version {v}")),
        None => (None, 0),
    };
    let end = len
        .and_then(|l| l.checked_add(pre))
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| {
            format!(
                "truncated: the header runs past the end of the file ({} bytes)",
                bytes.len()
            )
        })?;
    let header = String::from_utf8_lossy(&bytes[pre..end]);
    npy_check_nesting(&header)?;
    npy_check_shape(&header)?;
    Ok(end)
}

/// The deepest bracket nesting a header may have: numpy writes `{'shape': (2, 3)}` (2) for
/// the plain dtypes read here.
const NPY_MAX_NESTING: usize = 4;

/// Refuses headers that nest brackets deeper than [`NPY_MAX_NESTING`]: npyz's literal parser
/// backtracks exponentially on unclosed nested brackets (found by fuzzing: 19 `[` took
/// minutes).
fn npy_check_nesting(header: &str) -> std::result::Result<(), String> {
    let mut depth = 0usize;
    for c in header.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth > NPY_MAX_NESTING {
            return Err(format!(
                "the header nests brackets deeper than {NPY_MAX_NESTING} (not a numpy header \
                 of a plain array)"
            ));
        }
    }
    Ok(())
}

/// Finds the header's `'shape'` tuple (or list) and checks that its element count fits in 64
/// bits and within the buffer limit; a zero dimension counts as 1, since npyz also multiplies
/// the other dimensions alone.
fn npy_check_shape(header: &str) -> std::result::Result<(), String> {
    let keys: Vec<usize> = ["'shape'", "\"shape\""]
        .iter()
        .flat_map(|k| header.match_indices(k).map(|(i, k)| i + k.len()))
        .collect();
    let [at] = keys[..] else {
        return Err("the header must name 'shape' exactly once".into());
    };
    let dims = header[at..]
        .trim_start()
        .strip_prefix(':')
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix('(').or_else(|| r.strip_prefix('[')))
        .and_then(|r| r.split_once([')', ']']))
        .map(|(dims, _)| dims)
        .ok_or("the header's 'shape' is not a tuple")?;
    let mut count = 1u64;
    for d in dims.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let d: u64 = d
            .parse()
            .map_err(|_| format!("the header's 'shape' has a bad dimension `{d}`"))?;
        count = count.checked_mul(d.max(1)).ok_or_else(|| {
            format!(
                "the header's 'shape' has more elements than fit in 64 bits: it exceeds the {} \
                 GiB buffer limit",
                crate::limits::MAX_BUFFER_BYTES >> 30
            )
        })?;
    }
    if count > crate::limits::MAX_BUFFER_BYTES {
        return Err(format!(
            "the header's 'shape' has {count} elements: it exceeds the {} GiB buffer limit",
            crate::limits::MAX_BUFFER_BYTES >> 30
        ));
    }
    Ok(())
}

/// Writes a `.npy` file (16-bit floats as uint16 bit patterns).
pub fn write_npy(path: &Path, a: &HostArray) -> Result<()> {
    let err = |msg: String| RunError::Npy {
        path: path.display().to_string(),
        msg,
    };
    let out = npy_bytes(a).map_err(|e| err(e.to_string()))?;
    std::fs::write(path, out).map_err(|e| err(e.to_string()))
}

/// The bytes of `a` as a `.npy` file (what [`write_npy`] writes), for callers that write files
/// their own way (the CLI writes them atomically).
pub fn npy_bytes(a: &HostArray) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(a.data.len() + 128);
    encode_npy(&mut out, a)?;
    Ok(out)
}

/// Appends `a` as `.npy` bytes to `out` (what [`write_npy`] writes).
pub fn encode_npy(out: &mut Vec<u8>, a: &HostArray) -> std::io::Result<()> {
    fn go<T: npyz::Serialize + Copy>(
        out: &mut Vec<u8>,
        descr: &str,
        shape: &[u64],
        vals: impl Iterator<Item = T>,
    ) -> std::io::Result<()> {
        use npyz::WriterBuilder;
        let ts: npyz::TypeStr = descr
            .parse()
            .map_err(|e| std::io::Error::other(format!("{e}")))?;
        let mut w = npyz::WriteOptions::new()
            .dtype(npyz::DType::Plain(ts))
            .shape(shape)
            .writer(std::io::Cursor::new(out))
            .begin_nd()?;
        for v in vals {
            w.push(&v)?;
        }
        w.finish()
    }
    let d = a.dtype;
    let descr = d.npy_descr();
    let s = d.size();
    let c = a.data.chunks_exact(s);
    let shape: Vec<u64> = if a.shape.iter().product::<u64>() as usize == a.len() {
        a.shape.clone()
    } else {
        vec![a.len() as u64]
    };
    match d {
        DType::U8 => go(out, descr, &shape, a.data.iter().copied()),
        DType::I8 => go(out, descr, &shape, a.data.iter().map(|&b| b as i8)),
        DType::U16 | DType::F16 | DType::Bf16 => go(
            out,
            descr,
            &shape,
            c.map(|b| u16::from_le_bytes([b[0], b[1]])),
        ),
        DType::I16 => go(
            out,
            descr,
            &shape,
            c.map(|b| i16::from_le_bytes([b[0], b[1]])),
        ),
        DType::U32 => go(
            out,
            descr,
            &shape,
            c.map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        DType::I32 => go(
            out,
            descr,
            &shape,
            c.map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        DType::F32 => go(
            out,
            descr,
            &shape,
            c.map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        DType::U64 => go(
            out,
            descr,
            &shape,
            c.map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default())),
        ),
        DType::I64 => go(
            out,
            descr,
            &shape,
            c.map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default())),
        ),
        DType::F64 => go(
            out,
            descr,
            &shape,
            c.map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default())),
        ),
    }
}

/// One kernel argument, as given on the command line.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgSpec {
    /// A buffer initialised from a `.npy` file.
    In(PathBuf),
    /// A zero-initialised buffer.
    Out { dtype: DType, count: usize },
    /// A value.
    Scalar(Arg),
}

impl ArgSpec {
    /// The argument as [`crate::args::resolve`] checks it (buffers at address 0).
    pub fn given(&self) -> Given {
        match self {
            ArgSpec::Scalar(v) => Given::Value(*v),
            ArgSpec::In(_) | ArgSpec::Out { .. } => Given::Buffer(0),
        }
    }

    /// Parses `in:PATH`, `out:DTYPE:COUNT` or `TYPE:VALUE`; relative `in:` paths are taken
    /// relative to `base` when given.
    pub fn parse(spec: &str, base: Option<&Path>) -> Result<ArgSpec> {
        let bad = |msg: String| RunError::Spec {
            spec: spec.to_string(),
            msg,
        };
        let (kind, rest) = spec.split_once(':').ok_or_else(|| {
            bad("expected KIND:VALUE (in:FILE.npy, out:DTYPE:COUNT, u32:V, ...)".into())
        })?;
        let int_err = |e: std::num::ParseIntError| bad(format!("bad integer: {e}"));
        let float_err = |e: std::num::ParseFloatError| bad(format!("bad number: {e}"));
        Ok(match kind {
            "in" => {
                if rest.is_empty() {
                    return Err(bad("missing file name".into()));
                }
                let p = PathBuf::from(rest);
                ArgSpec::In(match base {
                    Some(b) if p.is_relative() => b.join(p),
                    _ => p,
                })
            }
            "out" => {
                let (d, n) = rest
                    .split_once(':')
                    .ok_or_else(|| bad("expected out:DTYPE:COUNT".into()))?;
                let dtype = DType::parse(d).ok_or_else(|| {
                    bad(format!(
                        "unknown dtype `{d}` (one of {})",
                        DType::ALL.map(|d| d.name()).join(" ")
                    ))
                })?;
                let count = parse_u64(n).map_err(int_err)?;
                let bytes = count.checked_mul(dtype.size() as u64);
                if !matches!(bytes, Some(b) if b <= crate::limits::MAX_BUFFER_BYTES) {
                    return Err(bad(format!(
                        "{count} elements of {dtype} exceed the {} GiB buffer limit",
                        crate::limits::MAX_BUFFER_BYTES >> 30
                    )));
                }
                ArgSpec::Out {
                    dtype,
                    count: count as usize,
                }
            }
            "u32" => ArgSpec::Scalar(Arg::U32(
                parse_u64(rest)
                    .map_err(int_err)?
                    .try_into()
                    .map_err(|_| bad("out of range for u32".into()))?,
            )),
            "i32" => ArgSpec::Scalar(Arg::I32(
                parse_i64(rest)
                    .map_err(int_err)?
                    .try_into()
                    .map_err(|_| bad("out of range for i32".into()))?,
            )),
            "u64" => ArgSpec::Scalar(Arg::U64(parse_u64(rest).map_err(int_err)?)),
            "i64" => ArgSpec::Scalar(Arg::I64(parse_i64(rest).map_err(int_err)?)),
            "f32" => ArgSpec::Scalar(Arg::F32(rest.trim().parse::<f32>().map_err(float_err)?)),
            "f64" => ArgSpec::Scalar(Arg::F64(rest.trim().parse::<f64>().map_err(float_err)?)),
            _ => {
                return Err(bad(format!(
                    "unknown kind `{kind}` (in, out, u32, i32, u64, i64, f32, f64)"
                )))
            }
        })
    }
}

fn parse_u64(s: &str) -> std::result::Result<u64, std::num::ParseIntError> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
}

fn parse_i64(s: &str) -> std::result::Result<i64, std::num::ParseIntError> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).map(|v| v as i64);
    }
    s.parse()
}

/// Parses `X[,Y[,Z]]` (missing dimensions are 1).
pub fn parse_dim3(s: &str) -> Result<[u32; 3]> {
    let bad = |msg: &str| RunError::Spec {
        spec: s.to_string(),
        msg: msg.to_string(),
    };
    let parts: Vec<&str> = s.split([',', 'x']).collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(bad("expected X[,Y[,Z]]"));
    }
    let mut d = [1u32; 3];
    for (i, p) in parts.iter().enumerate() {
        d[i] = p
            .trim()
            .parse()
            .map_err(|_| bad("expected X[,Y[,Z]] of positive integers"))?;
        if d[i] == 0 {
            return Err(bad("dimensions must be positive"));
        }
    }
    Ok(d)
}

/// Parses `--save INDEX=PATH.npy` against the parsed argument list: the index must name a
/// buffer argument (`in:` or `out:`), not a scalar.
pub fn parse_save(spec: &str, args: &[ArgSpec]) -> Result<(usize, PathBuf)> {
    let bad = |msg: String| RunError::Other(format!("--save `{spec}`: {msg}"));
    let (i, p) = spec
        .split_once('=')
        .ok_or_else(|| bad("expected INDEX=PATH.npy".into()))?;
    let i: usize = i
        .trim()
        .parse()
        .map_err(|_| bad(format!("bad index `{i}`")))?;
    if p.is_empty() {
        return Err(bad("missing file name".into()));
    }
    match args.get(i) {
        None => Err(bad(format!(
            "argument {i} does not exist ({} arguments given)",
            args.len()
        ))),
        Some(ArgSpec::Scalar(_)) => Err(bad(format!("argument {i} is a scalar, not a buffer"))),
        Some(_) => Ok((i, PathBuf::from(p))),
    }
}

/// Checks a `--timeout` in seconds: positive, finite and representable as a [`Duration`].
pub fn parse_timeout(secs: f64) -> Result<Duration> {
    if !(secs > 0.0 && secs <= MAX_TIMEOUT_S) {
        return Err(RunError::Other(format!(
            "--timeout {secs}: must be above 0 and at most {MAX_TIMEOUT_S:e} seconds"
        )));
    }
    Duration::try_from_secs_f64(secs)
        .map_err(|_| RunError::Other(format!("--timeout {secs}: too large")))
}

/// Largest `--timeout` (about 11.6 days), as for every duration flag of the CLI.
pub const MAX_TIMEOUT_S: f64 = 1e6;

/// How `out:` buffers start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutInit {
    /// Zero-filled (what the corpus manifests assume).
    #[default]
    Zero,
    /// Every byte set to this value (to catch elements a kernel should write but does not).
    Poison(u8),
}

/// Everything needed for one launch.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// PTX source text.
    pub ptx: String,
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shared: u32,
    pub args: Vec<ArgSpec>,
    pub out_init: OutInit,
    pub timeout: Option<Duration>,
    /// Incremented as CTAs complete.
    pub progress: Option<Arc<AtomicU64>>,
    /// Emulator: count shared-memory bank conflicts per PTX line (`stats.banks`).
    pub banks: bool,
    /// Emulator tensor-core numerics (None: the device's setting, else `PTXFORGE_TC_NUMERICS`,
    /// else the hardware model of the kernel's target).
    pub numerics: Option<emu::Numerics>,
}

impl RunSpec {
    pub fn ctas(&self) -> u64 {
        self.grid.iter().map(|&x| x as u64).product()
    }
}

/// The result of a launch.
#[derive(Debug)]
pub struct RunOutput {
    /// Per argument: the buffer contents after the launch (None for scalars).
    pub buffers: Vec<Option<HostArray>>,
    pub stats: Option<emu::LaunchStats>,
    /// Wall time of the launch including the wait, seconds.
    pub seconds: f64,
}

/// Loads, builds buffers, launches on `device`, waits and reads all buffers back.
pub fn run(device: &Device, spec: &RunSpec) -> Result<RunOutput> {
    refuse_invalid(&spec.ptx)?;
    crate::limits::check_launch(spec.grid, spec.block, spec.shared)?;
    let module = Module::load_ptx(device, &spec.ptx)?;
    let func = module.function(&spec.entry)?;
    check_kinds(&func, &spec.args)?;
    // Host data first (file errors before any device work).
    let mut hosts: Vec<Option<HostArray>> = Vec::with_capacity(spec.args.len());
    for a in &spec.args {
        hosts.push(match a {
            ArgSpec::In(p) => Some(read_npy(p)?),
            ArgSpec::Out { dtype, count } => {
                let fill = match spec.out_init {
                    OutInit::Zero => 0u8,
                    OutInit::Poison(b) => b,
                };
                let n = count
                    .checked_mul(dtype.size())
                    .ok_or_else(|| RunError::Other(format!("out:{dtype}:{count} is too large")))?;
                Some(HostArray {
                    dtype: *dtype,
                    shape: vec![*count as u64],
                    data: vec![fill; n],
                })
            }
            ArgSpec::Scalar(_) => None,
        });
    }
    let mut bufs: Vec<Option<Buffer<u8>>> = Vec::with_capacity(hosts.len());
    let mut args = Vec::with_capacity(hosts.len());
    for (a, h) in spec.args.iter().zip(&hosts) {
        match (a, h) {
            (ArgSpec::Scalar(v), _) => {
                args.push(*v);
                bufs.push(None);
            }
            (_, Some(h)) => {
                let b = device.alloc::<u8>(h.data.len())?;
                if !h.data.iter().all(|&x| x == 0) {
                    b.copy_from_bytes(&h.data)?;
                }
                args.push(Arg::Ptr(b.device_ptr()));
                bufs.push(Some(b));
            }
            (_, None) => return Err(RunError::Other("internal: buffer without host data".into())),
        }
    }
    // count, kinds and sizes: the rules the Python package's launch shares
    let given: Vec<Given> = args
        .iter()
        .map(|a| match a {
            Arg::Ptr(p) => Given::Buffer(*p),
            v => Given::Value(*v),
        })
        .collect();
    let args = crate::args::resolve(&func, &given).map_err(RuntimeError::from)?;
    let mut cfg = LaunchConfig::grid3(spec.grid, spec.block).shared(spec.shared);
    cfg.timeout = spec.timeout;
    cfg.progress = spec.progress.clone();
    cfg.numerics = spec.numerics;
    let stream = device.stream(0);
    stream.set_bank_profile(spec.banks);
    let t0 = std::time::Instant::now();
    stream.launch(&func, &cfg, &args)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let stats = stream.last_stats();
    let mut buffers = Vec::with_capacity(hosts.len());
    for (h, b) in hosts.into_iter().zip(&bufs) {
        buffers.push(match (h, b) {
            (Some(mut h), Some(b)) => {
                h.data = b.to_bytes()?;
                Some(h)
            }
            _ => None,
        });
    }
    Ok(RunOutput {
        buffers,
        stats,
        seconds,
    })
}

/// Refuses a module the validator rejects (what `ptxforge check` reports as errors), e.g. a
/// store to the read-only `.const` space, which the emulator would otherwise run.
fn refuse_invalid(ptx: &str) -> Result<()> {
    let m = ptx::parse(ptx).map_err(RuntimeError::from)?;
    match validation_failure(&m) {
        None => Ok(()),
        Some(f) => Err(RunError::Other(f.message)),
    }
}

/// Why the validator rejects a module: the message `ptxforge run` (and the Python package's
/// `Module`) give, and the first error's position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationFailure {
    pub message: String,
    pub line: u32,
    pub col: u32,
}

/// The validator's verdict on a parsed module: None when it has no errors.
pub fn validation_failure(m: &ptx::Module) -> Option<ValidationFailure> {
    let errs = ptx::validate::validate_errors(m);
    let first = errs.first()?;
    Some(ValidationFailure {
        message: format!(
            "the PTX does not validate ({} error(s), as `ptxforge check` reports); first: line {}",
            errs.len(),
            first
        ),
        line: first.line,
        col: first.col,
    })
}

/// The note `ptxforge run` and the Python package's `Module.launch` add to a shared-memory
/// out-of-bounds fault of a launch without dynamic shared memory (`shared == 0`) when the
/// kernel declares unsized `extern .shared` arrays: the launch forgot their size.
pub fn missing_dynamic_shared(
    e: &RuntimeError,
    m: &ptx::Module,
    entry: &str,
    shared: u32,
) -> Option<String> {
    let shared_fault = matches!(
        e,
        RuntimeError::Emu(emu::EmuError::Fault {
            kind: emu::FaultKind::OutOfBounds {
                space: "shared",
                ..
            },
            ..
        })
    );
    if !shared_fault || shared != 0 {
        return None;
    }
    let names = extern_shared(m, entry);
    (!names.is_empty()).then(|| {
        format!(
            "the kernel uses dynamic shared memory, `extern .shared` {}, but the launch gave none",
            names.join(", ")
        )
    })
}

/// The unsized (`extern .shared`) arrays the module and the entry declare.
fn extern_shared(m: &ptx::Module, entry: &str) -> Vec<String> {
    fn walk(b: &[ptx::Statement], out: &mut Vec<String>) {
        for s in b {
            match s {
                ptx::Statement::Var(v) if is_dynamic_shared(v) => out.push(v.name.clone()),
                ptx::Statement::Block(b) => walk(b, out),
                _ => {}
            }
        }
    }
    let mut out: Vec<String> = m
        .globals()
        .filter(|v| is_dynamic_shared(v))
        .map(|v| v.name.clone())
        .collect();
    if let Some(body) = m.function(entry).and_then(|f| f.body.as_deref()) {
        walk(body, &mut out);
    }
    out
}

fn is_dynamic_shared(v: &ptx::VarDecl) -> bool {
    v.space.is_shared() && v.dims.iter().any(|d| d.is_none())
}

/// Catches a float given for an integer parameter and vice versa before any file is read
/// ([`crate::args::check_kinds`]); the count and sizes are checked at the launch
/// ([`crate::args::resolve`]).
fn check_kinds(func: &crate::Function, args: &[ArgSpec]) -> Result<()> {
    let given: Vec<Given> = args.iter().map(ArgSpec::given).collect();
    crate::args::check_kinds(func, &given).map_err(RuntimeError::from)?;
    Ok(())
}

/// A corpus test case (`tests-data/corpus/<target>/<kernel>.json`; see docs/TOOLS.md).
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Manifest {
    pub ptx: String,
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    #[serde(default)]
    pub shared: u32,
    pub args: Vec<String>,
    #[serde(default)]
    pub checks: Vec<Check>,
    #[serde(default)]
    pub description: String,
}

/// One output check of a manifest.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Check {
    /// Index into the arguments.
    pub arg: usize,
    /// Expected contents (`.npy`, relative to the manifest).
    pub expect: String,
    #[serde(default)]
    pub rtol: f64,
    #[serde(default)]
    pub atol: f64,
    #[serde(default)]
    pub exact: bool,
    /// Bit-pattern decoding of the output: `bf16`, `f16` or `e4m3`.
    #[serde(default)]
    pub decode: Option<String>,
}

impl Manifest {
    /// The launch this manifest describes (`dir` is the manifest's directory).
    pub fn run_spec(&self, dir: &Path) -> Result<RunSpec> {
        let ptx_path = dir.join(&self.ptx);
        let ptx = std::fs::read_to_string(&ptx_path)
            .map_err(|e| RunError::Other(format!("{}: {e}", ptx_path.display())))?;
        let args = self
            .args
            .iter()
            .map(|a| ArgSpec::parse(a, Some(dir)))
            .collect::<Result<Vec<_>>>()?;
        Ok(RunSpec {
            ptx,
            entry: self.entry.clone(),
            grid: self.grid,
            block: self.block,
            shared: self.shared,
            args,
            out_init: OutInit::Zero,
            timeout: None,
            progress: None,
            banks: false,
            numerics: None,
        })
    }
}

/// Decodes an e4m3 (fn: no infinities, 0x7f/0xff NaN) bit pattern.
pub fn e4m3_to_f64(b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f64;
    if e == 0xf && b & 7 == 7 {
        return f64::NAN;
    }
    if e == 0 {
        sign * m / 8.0 * 2f64.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f64.powi(e - 7)
    }
}

/// The outcome of one check: elements that failed, out of how many, and the first failure.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckResult {
    pub arg: usize,
    pub total: usize,
    pub mismatches: usize,
    /// First failing element: (index, got, expected).
    pub first: Option<(usize, f64, f64)>,
    /// Elements accepted because they still hold the poison pattern where 0 is expected.
    pub untouched: usize,
}

impl CheckResult {
    pub fn ok(&self) -> bool {
        self.mismatches == 0
    }
}

impl std::fmt::Display for CheckResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "arg {}: {}/{} mismatches",
            self.arg, self.mismatches, self.total
        )?;
        if let Some((i, g, e)) = self.first {
            write!(f, ", first at [{i}]: got {g:?} expected {e:?}")?;
        }
        Ok(())
    }
}

/// Applies a check to an output buffer (semantics of `apply_check` in
/// `scripts/corpus/interp-check.py`). With `poison = Some(byte)`, elements whose bytes all
/// still equal the poison byte and whose expectation is 0 count as untouched, not as failures
/// (kernels with masked tails leave them unwritten).
pub fn apply_check(
    ck: &Check,
    out: &HostArray,
    expect: &HostArray,
    poison: Option<u8>,
) -> std::result::Result<CheckResult, String> {
    let n = out.len();
    if expect.len() != n {
        return Err(format!(
            "arg {}: output has {n} elements, expectation {} has {}",
            ck.arg,
            ck.expect,
            expect.len()
        ));
    }
    let s = out.dtype.size();
    let mut r = CheckResult {
        arg: ck.arg,
        total: n,
        ..Default::default()
    };
    let decode = ck.decode.as_deref();
    let get: Box<dyn Fn(usize) -> f64 + '_> = match decode {
        None => Box::new(|i| out.get_f64(i)),
        Some("bf16") if s == 2 => Box::new(|i| {
            half::bf16::from_bits(u16::from_le_bytes([out.data[2 * i], out.data[2 * i + 1]]))
                .to_f64()
        }),
        Some("f16") if s == 2 => Box::new(|i| {
            half::f16::from_bits(u16::from_le_bytes([out.data[2 * i], out.data[2 * i + 1]]))
                .to_f64()
        }),
        Some("e4m3") if s == 1 => Box::new(|i| e4m3_to_f64(out.data[i])),
        Some(d) => {
            return Err(format!(
                "arg {}: cannot decode a {} buffer as `{d}`",
                ck.arg, out.dtype
            ))
        }
    };
    let int_exact = ck.exact && expect.dtype.is_int();
    for i in 0..n {
        let ok = if int_exact {
            out.dtype.decode_int(&out.data, i) == expect.dtype.decode_int(&expect.data, i)
        } else {
            let (g, e) = (get(i), expect.get_f64(i));
            if ck.exact {
                g == e
            } else {
                (g - e).abs() <= ck.atol + ck.rtol * e.abs()
            }
        };
        if ok {
            continue;
        }
        if let Some(p) = poison {
            if out.data[i * s..(i + 1) * s].iter().all(|&b| b == p) && expect.get_f64(i) == 0.0 {
                r.untouched += 1;
                continue;
            }
        }
        r.mismatches += 1;
        if r.first.is_none() {
            r.first = Some((i, get(i), expect.get_f64(i)));
        }
    }
    Ok(r)
}

/// Runs a manifest's checks on the buffers of a run. Returns one result per check.
pub fn check_outputs(
    m: &Manifest,
    dir: &Path,
    out: &RunOutput,
    poison: Option<u8>,
) -> Result<Vec<CheckResult>> {
    let mut v = Vec::new();
    for ck in &m.checks {
        let buf = out
            .buffers
            .get(ck.arg)
            .and_then(|b| b.as_ref())
            .ok_or_else(|| {
                RunError::Other(format!(
                    "check of argument {}: not a buffer argument",
                    ck.arg
                ))
            })?;
        let exp = read_npy(&dir.join(&ck.expect))?;
        v.push(apply_check(ck, buf, &exp, poison).map_err(RunError::Other)?);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trip() {
        let a = HostArray {
            dtype: DType::F32,
            shape: vec![2, 2],
            data: [1.0f32, 2.0, -3.5, 4.25]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        };
        let mut v = Vec::new();
        encode_npy(&mut v, &a).unwrap();
        assert_eq!(parse_npy(&v).unwrap(), a);
        let b = HostArray {
            dtype: DType::Bf16,
            shape: vec![2],
            data: vec![0x80, 0x3f, 0, 0x40],
        };
        let mut v = Vec::new();
        encode_npy(&mut v, &b).unwrap();
        let back = parse_npy(&v).unwrap();
        assert_eq!(back.dtype, DType::U16);
        assert_eq!(back.data, b.data);
    }

    #[test]
    fn arg_specs() {
        assert_eq!(
            ArgSpec::parse("u32:7", None).unwrap(),
            ArgSpec::Scalar(Arg::U32(7))
        );
        assert_eq!(
            ArgSpec::parse("i32:-7", None).unwrap(),
            ArgSpec::Scalar(Arg::I32(-7))
        );
        assert_eq!(
            ArgSpec::parse("u64:0x10", None).unwrap(),
            ArgSpec::Scalar(Arg::U64(16))
        );
        assert_eq!(
            ArgSpec::parse("f32:1e-05", None).unwrap(),
            ArgSpec::Scalar(Arg::F32(1e-5))
        );
        assert_eq!(
            ArgSpec::parse("out:bf16:8", None).unwrap(),
            ArgSpec::Out {
                dtype: DType::Bf16,
                count: 8
            }
        );
        assert_eq!(
            ArgSpec::parse("in:x.npy", Some(Path::new("/d"))).unwrap(),
            ArgSpec::In(PathBuf::from("/d/x.npy"))
        );
        for bad in [
            "u32:-1",
            "i32:3000000000",
            "out:f8:3",
            "out:f32",
            "q:1",
            "f32:abc",
            "nocolon",
            "in:",
        ] {
            assert!(ArgSpec::parse(bad, None).is_err(), "{bad}");
        }
        assert_eq!(parse_dim3("4,2").unwrap(), [4, 2, 1]);
        assert!(parse_dim3("0").is_err());
        assert!(parse_dim3("1,2,3,4").is_err());
    }

    #[test]
    fn e4m3_decode() {
        assert_eq!(e4m3_to_f64(0x38), 1.0);
        assert_eq!(e4m3_to_f64(0x7e), 448.0);
        assert_eq!(e4m3_to_f64(0xfe), -448.0);
        assert_eq!(e4m3_to_f64(0x01), 2f64.powi(-9));
        assert!(e4m3_to_f64(0x7f).is_nan());
    }
}
