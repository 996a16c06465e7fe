//! The sparse A of `wgmma.mma_async.sp`: the warp's 16 compressed rows, from registers (the
//! `mma` m16n8 byte layout of [`crate::mma_sp`] on the compressed matrix) or from a
//! shared-memory descriptor (laid out as a dense A of half the k), expanded with the warp's
//! metadata register into the dense 16 x k rows the dense path multiplies.

use super::*;

impl Cta {
    /// The dense A rows (16 x k, row-major) of warp `wi`'s slice of a `wgmma.mma_async.sp`;
    /// `(meta, sel)` are the metadata slot and selector, `(wr, l0)` the warp's rank in its
    /// warpgroup and a live lane; the shared chunks read go to `chunks`.
    pub(super) fn wgmma_sparse_a(
        &self,
        wi: usize,
        op: &WgmmaOp,
        (meta, sel): (u32, u32),
        (wr, l0): (usize, usize),
        chunks: &mut Vec<u32>,
    ) -> Result<Vec<f64>, FaultKind> {
        let spec = &op.spec;
        let kc = spec.k as usize / 2;
        let es = crate::hopper::esize(spec.aty) as usize;
        let mut comp = vec![0f64; 16 * kc];
        if spec.a_regs {
            let w = &self.warps[wi];
            for (i, &slot) in op.a.iter().enumerate() {
                for lane in 0..32 {
                    let (g, q) = (lane >> 2, lane & 3);
                    let (row, byte) = (g + 8 * (i & 1), 16 * (i >> 1) + 4 * q);
                    let v = w.regs[slot as usize][lane];
                    for e in 0..4 / es {
                        let bits = (v >> (8 * es * e)) & ((1u64 << (8 * es)) - 1);
                        comp[row * kc + byte / es + e] = wg_decode(spec.aty, bits);
                    }
                }
            }
        } else {
            let rd = OperandRead {
                desc: crate::hopper::MatrixDesc::decode(
                    self.warps[wi].regs[op.a_desc as usize][l0],
                ),
                trans: op.trans_a,
                o0: 16 * wr as u64,
                no: 16,
                k: kc,
                ty: spec.aty,
            };
            self.wg_operand(&rd, chunks, |r, kk, v| comp[r * kc + kk] = v)?;
        }
        let layout = crate::mma_sp::SparseLayout::for_wgmma(spec.aty);
        let meta = &self.warps[wi].regs[meta as usize];
        Ok(layout.expand_values(&comp, kc, es, meta, sel))
    }
}
