//! Hashes of every output and gradient of a `ptxforge moe` step (`--dump-hash`), per rank: what
//! the single-process and the multi-process (`mpirun`, feature `mpi`) runs compare.
use model::moe::{Backward, Forward};
use serde::{Deserialize, Serialize};

/// One hashed output: (rank, what, FNV-1a 64 of its little-endian bytes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutHash {
    pub rank: u32,
    pub what: String,
    pub fnv64: String,
}

fn fnv<'a>(words: impl IntoIterator<Item = &'a f32>) -> String {
    let h = words
        .into_iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
            (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
        });
    format!("{h:016x}")
}

/// Y, dX, routed dW, the shared expert's and the gate's per-rank gradient partials of the
/// hosted ranks (`hosted[i]` is the rank of every vector's entry `i`).
pub fn hashes(hosted: &[u32], f: &Forward, b: &Backward) -> Vec<OutHash> {
    let mut out = Vec::new();
    let mut add = |rank: u32, what: &str, h: String| {
        out.push(OutHash {
            rank,
            what: what.into(),
            fnv64: h,
        })
    };
    for (i, &r) in hosted.iter().enumerate() {
        add(r, "y", fnv(&f.y[i]));
        add(r, "dx", fnv(&b.dx[i]));
        add(r, "routed_dw_gate_up", fnv(&b.routed_dw[i].0));
        add(r, "routed_dw_down", fnv(&b.routed_dw[i].1));
        let sh = b.shared_dw[i].iter().flatten();
        add(r, "shared_dw", fnv(sh.flat_map(|p| p.0.iter().chain(&p.1))));
        let g = &b.gate[i];
        add(r, "gate_dlogits", fnv(&g.dlogits));
        add(r, "gate_dx", fnv(&g.dx));
        add(r, "gate_dw", fnv(g.dw.iter().flatten()));
    }
    out
}

/// The replicated weights' gradients summed over every rank (the data-parallel all-reduce), as
/// `Backward::dw_gate_sum` (f64, rank then chunk order) and `Backward::shared_dw_sum` (f32,
/// same order) compute them: `gate` and `shared` are every rank's per-chunk partials in rank
/// order, from one process or gathered from all.
pub fn sum_hashes(gate: &[Vec<f32>], shared: &[(Vec<f32>, Vec<f32>)]) -> Vec<OutHash> {
    let mut g = vec![0f64; gate.first().map_or(0, |d| d.len())];
    for d in gate {
        g.iter_mut().zip(d).for_each(|(a, v)| *a += *v as f64);
    }
    let gh = g
        .iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
            (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
        });
    let mut out = vec![OutHash {
        rank: u32::MAX,
        what: "dw_gate_sum".into(),
        fnv64: format!("{gh:016x}"),
    }];
    if let Some(first) = shared.first() {
        let (mut s1, mut s2) = (vec![0f32; first.0.len()], vec![0f32; first.1.len()]);
        for b in shared {
            s1.iter_mut().zip(&b.0).for_each(|(a, v)| *a += v);
            s2.iter_mut().zip(&b.1).for_each(|(a, v)| *a += v);
        }
        out.push(OutHash {
            rank: u32::MAX,
            what: "shared_dw_sum".into(),
            fnv64: fnv(s1.iter().chain(&s2)),
        });
    }
    out
}

/// Gradient partials of the replicated weights: per rank and wgrad chunk (rank order), the
/// gate's dW and the shared expert's (dW_gate|up, dW_down); `T` = f32, or its bits (u32) to
/// cross JSON exactly.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Partials<T> {
    pub gate: Vec<Vec<T>>,
    pub shared: Vec<(Vec<T>, Vec<T>)>,
}

impl Partials<f32> {
    /// This process's partials of `b` (its ranks, in rank order).
    pub fn of(b: &Backward) -> Partials<f32> {
        Partials {
            gate: b.gate.iter().flat_map(|g| g.dw.iter().cloned()).collect(),
            shared: b.shared_dw.iter().flatten().flatten().cloned().collect(),
        }
    }
    /// The bits, to cross JSON exactly (the multi-process run gathers them).
    #[cfg(feature = "mpi")]
    pub fn to_bits(&self) -> Partials<u32> {
        let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect();
        Partials {
            gate: self.gate.iter().map(bits).collect(),
            shared: self
                .shared
                .iter()
                .map(|(a, b)| (bits(a), bits(b)))
                .collect(),
        }
    }
}

#[cfg(feature = "mpi")]
impl Partials<u32> {
    pub fn to_f32(&self) -> Partials<f32> {
        let f = |v: &Vec<u32>| v.iter().map(|&x| f32::from_bits(x)).collect();
        Partials {
            gate: self.gate.iter().map(f).collect(),
            shared: self.shared.iter().map(|(a, b)| (f(a), f(b))).collect(),
        }
    }
}
