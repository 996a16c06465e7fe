//! f64 CPU references of the attention kernels (inputs given as the f64 values of the bf16
//! operands the kernels read).

/// Packed-batch problem: `cu` offsets, `heads`, head dims, scale.
#[derive(Clone, Debug)]
pub struct RefProblem {
    pub cu: Vec<usize>,
    pub heads: usize,
    pub d_qk: usize,
    pub d_v: usize,
    pub scale: f64,
}

/// Forward outputs: O `[total, heads, d_v]`, LSE `[total, heads]` (natural log).
pub struct RefFwd {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Backward outputs (same layouts as Q, K, V).
pub struct RefBwd {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

impl RefProblem {
    fn at(&self, row: usize, h: usize, d: usize) -> std::ops::Range<usize> {
        let s = (row * self.heads + h) * d;
        s..s + d
    }

    /// Causal softmax probabilities of one (sequence, head): `p[i][j]`, j <= i.
    fn probs(
        &self,
        q: &[f64],
        k: &[f64],
        s0: usize,
        n: usize,
        h: usize,
    ) -> (Vec<Vec<f64>>, Vec<f64>) {
        let mut p = Vec::with_capacity(n);
        let mut lse = Vec::with_capacity(n);
        for i in 0..n {
            let qi = &q[self.at(s0 + i, h, self.d_qk)];
            let sc: Vec<f64> = (0..=i)
                .map(|j| {
                    let kj = &k[self.at(s0 + j, h, self.d_qk)];
                    self.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>()
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            lse.push(m + z.ln());
            p.push(sc.iter().map(|x| (x - m).exp() / z).collect());
        }
        (p, lse)
    }

    /// Causal attention forward.
    pub fn forward(&self, q: &[f64], k: &[f64], v: &[f64]) -> RefFwd {
        let total = *self.cu.last().unwrap_or(&0);
        let mut o = vec![0f64; total * self.heads * self.d_v];
        let mut lse = vec![0f64; total * self.heads];
        for w in self.cu.windows(2) {
            let (s0, n) = (w[0], w[1] - w[0]);
            for h in 0..self.heads {
                let (p, l) = self.probs(q, k, s0, n, h);
                for i in 0..n {
                    lse[(s0 + i) * self.heads + h] = l[i];
                    let oi = self.at(s0 + i, h, self.d_v);
                    for (j, pj) in p[i].iter().enumerate() {
                        let vj = self.at(s0 + j, h, self.d_v);
                        for (x, y) in oi.clone().zip(vj) {
                            o[x] += pj * v[y];
                        }
                    }
                }
            }
        }
        RefFwd { o, lse }
    }

    /// Causal attention backward for upstream gradient `dout` (of O).
    pub fn backward(&self, q: &[f64], k: &[f64], v: &[f64], dout: &[f64]) -> RefBwd {
        let dqk = self.d_qk;
        let mut dq = vec![0f64; q.len()];
        let mut dk = vec![0f64; k.len()];
        let mut dv = vec![0f64; v.len()];
        for w in self.cu.windows(2) {
            let (s0, n) = (w[0], w[1] - w[0]);
            for h in 0..self.heads {
                let (p, _) = self.probs(q, k, s0, n, h);
                for i in 0..n {
                    let doi = &dout[self.at(s0 + i, h, self.d_v)];
                    let dp: Vec<f64> = (0..=i)
                        .map(|j| {
                            let vj = &v[self.at(s0 + j, h, self.d_v)];
                            doi.iter().zip(vj).map(|(a, b)| a * b).sum()
                        })
                        .collect();
                    let d: f64 = p[i].iter().zip(&dp).map(|(a, b)| a * b).sum();
                    for j in 0..=i {
                        let ds = p[i][j] * (dp[j] - d) * self.scale;
                        let (qr, kr) = (self.at(s0 + i, h, dqk), self.at(s0 + j, h, dqk));
                        for (x, y) in qr.clone().zip(kr.clone()) {
                            dq[x] += ds * k[y];
                            dk[y] += ds * q[x];
                        }
                        let (orow, vr) =
                            (self.at(s0 + i, h, self.d_v), self.at(s0 + j, h, self.d_v));
                        for (x, y) in orow.zip(vr) {
                            dv[y] += p[i][j] * dout[x];
                        }
                    }
                }
            }
        }
        RefBwd { dq, dk, dv }
    }
}

/// Absorbed-MLA decoding reference: for batch `b`, query token `t` (of `s_q`) and head `h`,
/// attention over the first `len_b - s_q + t + 1` cached tokens (causal among the new tokens),
/// keys = all `d_k` columns, values = the first `d_v`. `kv(b, pos)` returns a cached row.
pub struct RefDecode<'a> {
    pub s_q: usize,
    pub heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub scale: f64,
    pub kv: &'a dyn Fn(usize, usize) -> Vec<f64>,
}

impl RefDecode<'_> {
    /// (O `[b, s_q, heads, d_v]`, LSE `[b, s_q, heads]`) for queries `q` `[b, s_q, heads, d_k]`.
    pub fn run(&self, q: &[f64], lens: &[usize]) -> (Vec<f64>, Vec<f64>) {
        let rows = self.s_q * self.heads;
        let mut o = vec![0f64; lens.len() * rows * self.d_v];
        let mut lse = vec![0f64; lens.len() * rows];
        for (b, &len) in lens.iter().enumerate() {
            let keys: Vec<Vec<f64>> = (0..len).map(|p| (self.kv)(b, p)).collect();
            for r in 0..rows {
                let t = r / self.heads;
                let visible = (len + t + 1).saturating_sub(self.s_q);
                let qi = &q[(b * rows + r) * self.d_k..][..self.d_k];
                let sc: Vec<f64> = keys[..visible]
                    .iter()
                    .map(|kr| self.scale * qi.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>())
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                lse[b * rows + r] = m + z.ln();
                let out = &mut o[(b * rows + r) * self.d_v..][..self.d_v];
                for (s, kr) in sc.iter().zip(&keys) {
                    let p = (s - m).exp() / z;
                    for (x, y) in out.iter_mut().zip(kr) {
                        *x += p * y;
                    }
                }
            }
        }
        (o, lse)
    }
}
