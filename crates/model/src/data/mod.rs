//! Training data: token streams, the train/validation split, the seeded batch sampler and the
//! unigram entropy the learning test compares against.
//!
//! Sources: the built-in byte-level corpus ([`builtin_corpus`]: the project's own docs and a
//! few sources, embedded in the binary so a fresh machine needs no download), any file given
//! with `--data` ([`load_file`]: text/bytes, one token per byte, or a `.npy` array of integer
//! token ids, see [`npy`]).
//!
//! The split is per document: the last 10% (at least one window) of each document is
//! validation, the rest training, so both splits see every kind of text. Documents are joined
//! without separators (the byte stream simply continues).

pub mod npy;

use std::path::Path;

/// Label of a position that has no next token (the loss ignores it).
pub const IGNORE_INDEX: i32 = -100;

/// Errors of loading data or sampling batches.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(transparent)]
    Io(#[from] crate::atomic::IoError),
    #[error("{path}: {msg}")]
    Npy { path: String, msg: String },
    #[error("{what}: token id {id} at index {index} is outside the vocabulary 0..{vocab}")]
    Vocab {
        what: String,
        index: usize,
        id: i64,
        vocab: u32,
    },
    #[error("{what}: {tokens} tokens are too few (need at least {need})")]
    TooSmall {
        what: String,
        tokens: usize,
        need: usize,
    },
    #[error("batch shape: {0}")]
    Shape(String),
}

/// One document of the built-in corpus.
struct Doc {
    name: &'static str,
    bytes: &'static [u8],
}

macro_rules! docs {
    ($($p:literal),* $(,)?) => {
        &[$(Doc { name: $p, bytes: include_bytes!(concat!("../../../../", $p)) }),*]
    };
}

/// The built-in corpus, in this order (paths from the repository root; ~250 KB in all).
const BUILTIN: &[Doc] = docs![
    "README.md",
    "docs/ARCHITECTURE.md",
    "docs/BUILDER.md",
    "docs/CUDA.md",
    "docs/EP.md",
    "docs/KERNELS.md",
    "docs/PERF.md",
    "docs/PIPELINE.md",
    "docs/SIM.md",
    "docs/TOOLS.md",
    "crates/pipeline/src/generate.rs",
    "crates/pipeline/src/schedule.rs",
    "crates/pipeline/src/verify.rs",
    "crates/model/src/moe/mod.rs",
    "crates/model/src/moe/exec.rs",
    "crates/ep/src/routing.rs",
];

/// Names of the built-in corpus's documents, in order.
pub fn builtin_names() -> Vec<&'static str> {
    BUILTIN.iter().map(|d| d.name).collect()
}

/// A tokenised corpus as documents of token ids, with its vocabulary size.
#[derive(Clone, Debug, PartialEq)]
pub struct Corpus {
    pub name: String,
    pub vocab: u32,
    pub docs: Vec<Vec<u32>>,
}

/// The built-in corpus: one token per byte (vocabulary 256).
pub fn builtin_corpus() -> Corpus {
    Corpus {
        name: "built-in (project docs and sources)".into(),
        vocab: 256,
        docs: BUILTIN
            .iter()
            .map(|d| d.bytes.iter().map(|&b| b as u32).collect())
            .collect(),
    }
}

/// A `--data` file: `.npy` of integer token ids (checked against `vocab`), anything else as
/// bytes (one token per byte; needs `vocab >= 256`). One document.
pub fn load_file(path: &Path, vocab: u32) -> Result<Corpus, DataError> {
    let is_npy = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("npy"));
    let bytes = std::fs::read(path).map_err(|e| crate::atomic::IoError::new("reading", path, e))?;
    let shown = path.display().to_string();
    let tokens = if is_npy {
        npy::tokens(&bytes, vocab).map_err(|e| match e {
            npy::NpyError::Format(msg) => DataError::Npy {
                path: shown.clone(),
                msg,
            },
            npy::NpyError::Vocab { index, id } => DataError::Vocab {
                what: shown.clone(),
                index,
                id,
                vocab,
            },
        })?
    } else {
        if vocab < 256 {
            return Err(DataError::Shape(format!(
                "{shown}: a byte-level text file needs a vocabulary of at least 256, not {vocab}"
            )));
        }
        bytes.iter().map(|&b| b as u32).collect()
    };
    Ok(Corpus {
        name: shown,
        vocab,
        docs: vec![tokens],
    })
}

/// The train and validation token streams.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub train: Vec<u32>,
    pub valid: Vec<u32>,
}

impl Corpus {
    /// Total tokens.
    pub fn len(&self) -> usize {
        self.docs.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Per document: the last `max(10%, seq_len + 1)` tokens are validation (documents shorter
    /// than two such windows go whole to training). Errors if either split cannot hold one
    /// window of `seq_len + 1` tokens.
    pub fn split(&self, seq_len: usize) -> Result<Split, DataError> {
        let win = seq_len + 1;
        let (mut train, mut valid) = (Vec::new(), Vec::new());
        for d in &self.docs {
            let v = (d.len() / 10).max(win);
            if d.len() < 2 * win {
                train.extend_from_slice(d);
                continue;
            }
            let cut = d.len() - v;
            train.extend_from_slice(&d[..cut]);
            valid.extend_from_slice(&d[cut..]);
        }
        for (what, s) in [("training split", &train), ("validation split", &valid)] {
            if s.len() < win {
                return Err(DataError::TooSmall {
                    what: format!("{} {what}", self.name),
                    tokens: s.len(),
                    need: win,
                });
            }
        }
        Ok(Split { train, valid })
    }
}

/// Unigram entropy of a token stream: the loss of the best context-free predictor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entropy {
    pub nats: f64,
    pub bits: f64,
}

/// Exact unigram entropy `-sum p log p` of `tokens` (f64, counts over the whole stream).
pub fn unigram_entropy(tokens: &[u32]) -> Entropy {
    let mut counts = std::collections::HashMap::<u32, u64>::new();
    for &t in tokens {
        *counts.entry(t).or_default() += 1;
    }
    let n = tokens.len() as f64;
    let mut c: Vec<u64> = counts.into_values().collect();
    c.sort_unstable(); // fixed summation order: the same value on every run
    let nats = -c
        .iter()
        .map(|&k| {
            let p = k as f64 / n;
            p * p.ln()
        })
        .sum::<f64>();
    Entropy {
        nats,
        bits: nats / std::f64::consts::LN_2,
    }
}

/// Cross-entropy of `eval` under the unigram distribution of `fit` with add-one (Laplace)
/// smoothing over `vocab` ids: the validation loss of the best context-free predictor trained
/// on `fit` (finite even for ids `fit` never contains). Ids `>= vocab` count as unseen.
pub fn unigram_cross_entropy(fit: &[u32], eval: &[u32], vocab: u32) -> Entropy {
    let mut counts = vec![0u64; vocab as usize];
    for &t in fit {
        if let Some(c) = counts.get_mut(t as usize) {
            *c += 1;
        }
    }
    let total = fit.len() as f64 + vocab as f64;
    let nats = eval
        .iter()
        .map(|&t| {
            let c = counts.get(t as usize).copied().unwrap_or(0) as f64 + 1.0;
            -(c / total).ln()
        })
        .sum::<f64>()
        / eval.len().max(1) as f64;
    Entropy {
        nats,
        bits: nats / std::f64::consts::LN_2,
    }
}

impl Corpus {
    /// FNV-1a 64 (hex) of the token stream and document boundaries, for a checkpoint's meta
    /// (resuming on other data can then be detected).
    pub fn fingerprint(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |v: u64| {
            for b in v.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        eat(self.vocab as u64);
        for d in &self.docs {
            eat(d.len() as u64);
            d.iter().for_each(|&t| eat(t as u64));
        }
        format!("{h:016x}")
    }
}

mod sampler;
pub use sampler::{eval_batches, Batch, Sampler, SamplerState};
