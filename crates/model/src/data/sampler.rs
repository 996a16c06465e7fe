//! Batches of next-token prediction windows.
//!
//! A stream of `n` tokens is cut into `ceil((n - 1) / L)` chunks at multiples of `L` (the
//! sequence length); chunk `k` has inputs `tokens[kL .. kL+L]` and labels `tokens[kL+1 ..
//! kL+L+1]`, the last chunk padded (input 0, label [`IGNORE_INDEX`]). Every label position
//! `1..n` belongs to exactly one chunk, so one epoch of the sampler predicts every training
//! token once. The sampler visits the chunks of each epoch in a seeded permutation
//! (splitmix64 + Fisher-Yates, so the order is the same on every machine and Rust version) and
//! its state (seed, epoch, position) is three integers a checkpoint saves.

use super::{DataError, IGNORE_INDEX};

/// `batch` sequences of `seq_len` inputs and next-token labels, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub batch: usize,
    pub seq_len: usize,
    pub inputs: Vec<u32>,
    pub labels: Vec<i32>,
    /// The chunk of each row (`None`: an all-ignored padding row).
    pub chunks: Vec<Option<usize>>,
}

impl Batch {
    /// Labels that count in the loss.
    pub fn label_count(&self) -> usize {
        self.labels.iter().filter(|&&l| l != IGNORE_INDEX).count()
    }

    fn new(batch: usize, seq_len: usize) -> Batch {
        Batch {
            batch,
            seq_len,
            inputs: Vec::with_capacity(batch * seq_len),
            labels: Vec::with_capacity(batch * seq_len),
            chunks: Vec::with_capacity(batch),
        }
    }

    fn push_chunk(&mut self, tokens: &[u32], k: Option<usize>) {
        let l = self.seq_len;
        let (start, end) = match k {
            Some(k) => (k * l, (k * l + l + 1).min(tokens.len())),
            None => (0, 0),
        };
        let w = &tokens[start..end];
        for i in 0..l {
            self.inputs
                .push(w.get(i).copied().filter(|_| i + 1 < w.len()).unwrap_or(0));
            self.labels
                .push(w.get(i + 1).map(|&t| t as i32).unwrap_or(IGNORE_INDEX));
        }
        self.chunks.push(k);
    }
}

fn chunk_count(len: usize, seq_len: usize) -> usize {
    len.saturating_sub(1).div_ceil(seq_len)
}

/// The sampler's resumable state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SamplerState {
    pub seed: u64,
    pub epoch: u64,
    /// Chunks of the current epoch already served.
    pub pos: u64,
}

impl SamplerState {
    /// As words for a checkpoint's RNG state.
    pub fn to_words(self) -> [u64; 3] {
        [self.seed, self.epoch, self.pos]
    }
    pub fn from_words(w: [u64; 3]) -> SamplerState {
        SamplerState {
            seed: w[0],
            epoch: w[1],
            pos: w[2],
        }
    }
}

/// Seeded, deterministic sampler of training batches over a token stream.
pub struct Sampler<'a> {
    tokens: &'a [u32],
    seq_len: usize,
    batch: usize,
    state: SamplerState,
    perm: Vec<usize>,
}

impl<'a> Sampler<'a> {
    /// Starts at epoch 0. Errors if the stream has no full window or a size is 0.
    pub fn new(
        tokens: &'a [u32],
        seq_len: usize,
        batch: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        Self::resume(
            tokens,
            seq_len,
            batch,
            SamplerState {
                seed,
                epoch: 0,
                pos: 0,
            },
        )
    }

    /// Continues from a saved state.
    pub fn resume(
        tokens: &'a [u32],
        seq_len: usize,
        batch: usize,
        state: SamplerState,
    ) -> Result<Self, DataError> {
        if seq_len == 0 || batch == 0 {
            return Err(DataError::Shape(format!(
                "seq_len {seq_len} and batch {batch} must be positive"
            )));
        }
        if tokens.len() <= seq_len {
            return Err(DataError::TooSmall {
                what: "sampler stream".into(),
                tokens: tokens.len(),
                need: seq_len + 1,
            });
        }
        let n = chunk_count(tokens.len(), seq_len);
        if state.pos > n as u64 {
            return Err(DataError::Shape(format!(
                "saved position {} is past the {n} chunks of an epoch",
                state.pos
            )));
        }
        let perm = permutation(n, state.seed, state.epoch);
        Ok(Sampler {
            tokens,
            seq_len,
            batch,
            state,
            perm,
        })
    }

    /// Chunks per epoch.
    pub fn chunks(&self) -> usize {
        self.perm.len()
    }

    pub fn state(&self) -> SamplerState {
        self.state
    }

    /// The next `batch` chunks (continuing into the next epoch's permutation when one ends).
    pub fn next_batch(&mut self) -> Batch {
        let mut b = Batch::new(self.batch, self.seq_len);
        for _ in 0..self.batch {
            if self.state.pos as usize >= self.perm.len() {
                self.state.epoch += 1;
                self.state.pos = 0;
                self.perm = permutation(self.perm.len(), self.state.seed, self.state.epoch);
            }
            let k = self.perm[self.state.pos as usize];
            self.state.pos += 1;
            b.push_chunk(self.tokens, Some(k));
        }
        b
    }
}

/// All chunks of `tokens` in order, `batch` per batch; the last batch is filled with
/// all-ignored rows. Deterministic (validation uses every token once).
pub fn eval_batches(tokens: &[u32], seq_len: usize, batch: usize) -> Result<Vec<Batch>, DataError> {
    if seq_len == 0 || batch == 0 {
        return Err(DataError::Shape(format!(
            "seq_len {seq_len} and batch {batch} must be positive"
        )));
    }
    let n = chunk_count(tokens.len(), seq_len);
    let mut out = Vec::new();
    for first in (0..n).step_by(batch) {
        let mut b = Batch::new(batch, seq_len);
        for k in first..first + batch {
            b.push_chunk(tokens, (k < n).then_some(k));
        }
        out.push(b);
    }
    Ok(out)
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The chunk order of `epoch`: Fisher-Yates driven by splitmix64 of (seed, epoch).
fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut s = seed ^ epoch.wrapping_mul(0xd1b5_4a32_d192_ed03);
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (splitmix64(&mut s) % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    p
}
