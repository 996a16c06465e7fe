//! Hashes of every output and gradient of a `ptxforge moe` step (`--dump-hash`), per rank, and
//! the data-parallel sums of the replicated weights' gradients: what the single-process and the
//! multi-process (`moe_procs`) runs compare.
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
/// same order) compute them.
pub struct DpSums {
    pub gate: Vec<f64>,
    /// (dW_gate|up, dW_down) of the shared expert, if the layer has one.
    pub shared: Option<(Vec<f32>, Vec<f32>)>,
}

impl DpSums {
    /// Folds every rank's per-chunk partials in rank order (`p`: from one process, or every
    /// process's gathered and concatenated in process order).
    pub fn fold(p: &Partials) -> DpSums {
        let mut gate = vec![0f64; p.gate.first().map_or(0, |d| d.len())];
        for d in &p.gate {
            gate.iter_mut().zip(d).for_each(|(a, v)| *a += *v as f64);
        }
        let shared = p.shared.first().map(|first| {
            let (mut s1, mut s2) = (vec![0f32; first.0.len()], vec![0f32; first.1.len()]);
            for b in &p.shared {
                s1.iter_mut().zip(&b.0).for_each(|(a, v)| *a += v);
                s2.iter_mut().zip(&b.1).for_each(|(a, v)| *a += v);
            }
            (s1, s2)
        });
        DpSums { gate, shared }
    }

    /// `dw_gate_sum` (hash of the f64 bytes) and `shared_dw_sum`, under rank `u32::MAX`.
    pub fn hashes(&self) -> Vec<OutHash> {
        let gh = self
            .gate
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
        if let Some((s1, s2)) = &self.shared {
            out.push(OutHash {
                rank: u32::MAX,
                what: "shared_dw_sum".into(),
                fnv64: fnv(s1.iter().chain(s2)),
            });
        }
        out
    }
}

/// Gradient partials of the replicated weights: per rank and wgrad chunk (rank order), the
/// gate's dW and the shared expert's (dW_gate|up, dW_down).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Partials {
    pub gate: Vec<Vec<f32>>,
    pub shared: Vec<(Vec<f32>, Vec<f32>)>,
}

impl Partials {
    /// This process's partials of `b` (its ranks, in rank order).
    pub fn of(b: &Backward) -> Partials {
        Partials {
            gate: b.gate.iter().flat_map(|g| g.dw.iter().cloned()).collect(),
            shared: b.shared_dw.iter().flatten().flatten().cloned().collect(),
        }
    }

    /// `other`'s chunks after these (the next process's ranks).
    pub fn extend(&mut self, other: Partials) {
        self.gate.extend(other.gate);
        self.shared.extend(other.shared);
    }

    /// Little-endian bytes (every f32 exact): the gate chunk count, each chunk as a length
    /// and its values, then the shared chunk count and each chunk's two vectors alike.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let put = |v: &[f32], out: &mut Vec<u8>| {
            out.extend((v.len() as u64).to_le_bytes());
            v.iter().for_each(|x| out.extend(x.to_le_bytes()));
        };
        out.extend((self.gate.len() as u64).to_le_bytes());
        self.gate.iter().for_each(|g| put(g, &mut out));
        out.extend((self.shared.len() as u64).to_le_bytes());
        for (a, b) in &self.shared {
            put(a, &mut out);
            put(b, &mut out);
        }
        out
    }

    /// The inverse of [`to_bytes`](Self::to_bytes); an error says where the bytes end short
    /// or run long.
    pub fn from_bytes(b: &[u8]) -> anyhow::Result<Partials> {
        let mut r = Reader { b, at: 0 };
        let gate = (0..r.count()?)
            .map(|_| r.vec())
            .collect::<anyhow::Result<_>>()?;
        let shared = (0..r.count()?)
            .map(|_| Ok((r.vec()?, r.vec()?)))
            .collect::<anyhow::Result<_>>()?;
        if r.at != b.len() {
            anyhow::bail!("gradient partials: {} bytes after the end", b.len() - r.at);
        }
        Ok(Partials { gate, shared })
    }
}

/// A cursor over [`Partials::to_bytes`] output.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> anyhow::Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            anyhow::bail!(
                "gradient partials: {n} bytes wanted at offset {} of {}",
                self.at,
                self.b.len()
            );
        };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    /// A length, bounded by the bytes left (a corrupt length fails instead of allocating).
    fn count(&mut self) -> anyhow::Result<usize> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        let n = u64::from_le_bytes(w);
        match usize::try_from(n) {
            Ok(n) if n <= self.b.len() - self.at => Ok(n),
            _ => anyhow::bail!(
                "gradient partials: length {n} at offset {} runs past the end",
                self.at - 8
            ),
        }
    }
    fn vec(&mut self) -> anyhow::Result<Vec<f32>> {
        let n = self.count()?;
        let bytes = self.take(n.saturating_mul(4))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    }

    #[test]
    fn partials_cross_bytes_exactly_and_bad_bytes_are_refused() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let p = Partials {
            gate: (0..3).map(|_| random(&mut rng, 5)).collect(),
            shared: (0..2)
                .map(|_| (random(&mut rng, 4), random(&mut rng, 6)))
                .collect(),
        };
        let b = p.to_bytes();
        assert_eq!(Partials::from_bytes(&b).unwrap(), p);
        assert!(Partials::from_bytes(&b[..b.len() - 1]).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(Partials::from_bytes(&long).is_err());
        let mut huge = b;
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Partials::from_bytes(&huge).is_err());
    }

    /// Folding two processes' gathered partials equals folding them in one process, and the
    /// f64 gate sum equals an exact-order f64 reference sum.
    #[test]
    fn fold_of_gathered_partials_is_the_rank_order_sum() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mk = |rng: &mut rand::rngs::StdRng| Partials {
            gate: (0..2).map(|_| random(rng, 8)).collect(),
            shared: (0..2).map(|_| (random(rng, 3), random(rng, 3))).collect(),
        };
        let (a, b) = (mk(&mut rng), mk(&mut rng));
        let mut all = Partials::from_bytes(&a.to_bytes()).unwrap();
        all.extend(Partials::from_bytes(&b.to_bytes()).unwrap());
        let s = DpSums::fold(&all);
        let want: Vec<f64> = (0..8)
            .map(|i| {
                a.gate
                    .iter()
                    .chain(&b.gate)
                    .fold(0f64, |acc, g| acc + g[i] as f64)
            })
            .collect();
        assert_eq!(s.gate, want);
        let mut one = a.clone();
        one.extend(b);
        assert_eq!(DpSums::fold(&one).hashes(), s.hashes());
        assert_eq!(s.hashes().len(), 2);
    }
}
