//! One SwiGLU MLP on a device, grouped over experts (rows in the contiguous grouped layout):
//! forward, dgrad and k-grouped FP8 wgrad, all device kernels from crate `kernels`.

use super::host::ExpertQ;
use super::Result;
use half::bf16;
use kernels::{hopper, GemmBufs, GemmProblem, InTy, KernelChoice, Layout, ScaleMode};
use runtime::{Buffer, Device, Stream};

/// One MLP's FP8 weights on a device: W_gate|up `[G, 2I, H]`, W_down `[G, H, I]` and their
/// transposes (128x128 blocks, scales `[G, rows/128, cols/128]`).
pub(crate) struct MlpW {
    b1: Buffer<u8>,
    sb1: Buffer<f32>,
    b2: Buffer<u8>,
    sb2: Buffer<f32>,
    b1t: Buffer<u8>,
    sb1t: Buffer<f32>,
    b2t: Buffer<u8>,
    sb2t: Buffer<f32>,
}

impl MlpW {
    /// Uploads the experts `ex` (in order: group `g` is `ex[g]`) to `dev`.
    pub fn upload(dev: &Device, ex: &[&ExpertQ]) -> Result<MlpW> {
        let cat = |f: &dyn Fn(&ExpertQ) -> &[u8]| {
            ex.iter().flat_map(|e| f(e).to_vec()).collect::<Vec<u8>>()
        };
        let catf = |f: &dyn Fn(&ExpertQ) -> &[f32]| {
            ex.iter().flat_map(|e| f(e).to_vec()).collect::<Vec<f32>>()
        };
        Ok(MlpW {
            b1: dev.upload(&cat(&|e| &e.w1.0))?,
            sb1: dev.upload(&catf(&|e| &e.w1.1))?,
            b2: dev.upload(&cat(&|e| &e.w2.0))?,
            sb2: dev.upload(&catf(&|e| &e.w2.1))?,
            b1t: dev.upload(&cat(&|e| &e.w1t.0))?,
            sb1t: dev.upload(&catf(&|e| &e.w1t.1))?,
            b2t: dev.upload(&cat(&|e| &e.w2t.0))?,
            sb2t: dev.upload(&catf(&|e| &e.w2t.1))?,
        })
    }
}

/// One expert's FP32 master weights on a device: W_gate|up `[2I, H]`, W_down `[H, I]`.
pub(crate) type ExpertF32<'a> = (&'a Buffer<f32>, &'a Buffer<f32>);

/// One quantised operand's bytes and 128x128 scales.
type QuantOut = (Buffer<u8>, Buffer<f32>);

/// Device buffers `[g, rows, cols]` FP8 and `[g, rows/128, cols/128]` scales.
fn quant_alloc(dev: &Device, g: usize, rows: usize, cols: usize) -> Result<QuantOut> {
    Ok((
        dev.alloc::<u8>(g * rows * cols)?,
        dev.alloc::<f32>(g * (rows / 128) * (cols / 128))?,
    ))
}

impl MlpW {
    /// The experts `ex` (group `g` is `ex[g]`) quantised on `st`'s device from their FP32
    /// masters there: W by the 128x128 quantiser, W^T by the same quantiser on the exact f32
    /// transpose (a block of W^T is a block of W transposed: same amax, scale and roundings),
    /// so the bytes and scales are [`super::host::quant_expert`]'s bit for bit. `h` and `i_n`
    /// must be multiples of 128. Synchronises `st` (the temporaries die here).
    pub fn quantise(st: &Stream, ex: &[ExpertF32], h: usize, i_n: usize) -> Result<MlpW> {
        if !h.is_multiple_of(128) || !i_n.is_multiple_of(128) || h == 0 || i_n == 0 {
            return Err(super::MoeError::Shape(format!(
                "on-device weight quantisation needs hidden ({h}) and intermediate ({i_n}) \
                 to be positive multiples of 128"
            )));
        }
        let (dev, g) = (st.device(), ex.len());
        let (n1, n2) = (2 * i_n * h, h * i_n);
        if let Some(e) = ex.iter().position(|(a, b)| a.len() != n1 || b.len() != n2) {
            return Err(super::MoeError::Shape(format!(
                "expert {e}: weights of {} and {} values, expected [{}, {h}] and [{h}, {i_n}]",
                ex[e].0.len(),
                ex[e].1.len(),
                2 * i_n
            )));
        }
        // (rows, cols) of W1, W2, W1^T, W2^T
        let shapes = [(2 * i_n, h), (h, i_n), (h, 2 * i_n), (i_n, h)];
        let mk = |(r, c): (usize, usize)| quant_alloc(dev, g, r, c);
        let outs = [
            mk(shapes[0])?,
            mk(shapes[1])?,
            mk(shapes[2])?,
            mk(shapes[3])?,
        ];
        // temporaries stay alive until the stream is synchronised
        let (mut keep_q, mut keep_t) = (Vec::new(), Vec::new());
        for (e, &(w1, w2)) in ex.iter().enumerate() {
            let mut t1 = dev.alloc::<f32>(n1)?;
            let mut t2 = dev.alloc::<f32>(n2)?;
            kernels::train::relayout::transpose_f32(st, w1, &mut t1, 2 * i_n, h)?;
            kernels::train::relayout::transpose_f32(st, w2, &mut t2, h, i_n)?;
            for (k, src) in [w1, w2, &t1, &t2].into_iter().enumerate() {
                let (r, c) = shapes[k];
                let (mut q, mut s) = quant_alloc(dev, 1, r, c)?;
                kernels::quantize_fp8_128x128(st, src, &mut q, &mut s, r, c, ScaleMode::Pow2)?;
                st.copy_range((&q, 0), (&outs[k].0, e * q.len()), q.len())?;
                st.copy_range((&s, 0), (&outs[k].1, e * s.len()), s.len())?;
                keep_q.push((q, s));
            }
            keep_t.extend([t1, t2]);
        }
        st.synchronize()?;
        drop((keep_q, keep_t));
        let [(b1, sb1), (b2, sb2), (b1t, sb1t), (b2t, sb2t)] = outs;
        Ok(MlpW {
            b1,
            sb1,
            b2,
            sb2,
            b1t,
            sb1t,
            b2t,
            sb2t,
        })
    }
}

/// The row layout an MLP runs over: `m` rows (a multiple of 128), `m_indices` `[m]` (group of
/// each row, -1 for padding), `groups` experts.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub mi: &'a Buffer<i32>,
    pub m: usize,
    pub groups: usize,
}

/// An FP8 operand: bytes and 1x128 (or 128x128) scales.
pub(crate) type Fp8<'a> = (&'a Buffer<u8>, &'a Buffer<f32>);

/// Forward state of one MLP kept for backward.
pub(crate) struct MlpFwd {
    /// `[m, 2I]` gate|up GEMM output (the SwiGLU input, cached for backward).
    pub gu: Buffer<bf16>,
    /// `[m, H]`
    pub y: Buffer<bf16>,
}

/// Dgrad results of one MLP, and what its wgrad needs.
pub(crate) struct MlpDgrad {
    /// `[m, H]` (unweighted; combine applies the top-k weights).
    pub dx: Buffer<bf16>,
    /// `[m, H]` the MLP's output gradient (unweighted).
    pub dy: Buffer<bf16>,
    /// `[m, 2I]` row weight x dGate|dUp.
    pub dgu_w: Buffer<bf16>,
    /// `[m, I]` row weight x recomputed SwiGLU output.
    pub act_w: Buffer<bf16>,
}

/// The device side of one MLP shape.
pub(crate) struct Mlp {
    pub h: usize,
    pub i_n: usize,
    pub wgmma: bool,
}

impl Mlp {
    /// `D [m, n] = A [m, k] x (B[g] [n, k])^T` per row group, BF16 out.
    fn gemm(
        &self,
        st: &Stream,
        a: Fp8,
        b: Fp8,
        rows: Rows,
        n: usize,
        k: usize,
    ) -> Result<Buffer<bf16>> {
        let (m, g) = (rows.m, rows.groups);
        let d = st.device().alloc::<bf16>(m * n)?;
        let mut p = GemmProblem::new(InTy::Fp8, m, n, k).contiguous(g);
        if self.wgmma {
            let spec = hopper::choose_spec(InTy::Fp8, Layout::Contiguous, m, n, st.sm_count());
            p = p.kernel(KernelChoice::Wgmma(spec));
        }
        let bufs = GemmBufs::new(a.0, b.0, &d).scales(a.1, b.1).index(rows.mi);
        kernels::gemm(st, &p, bufs)?;
        Ok(d)
    }

    /// gate/up GEMM -> SwiGLU fused with 1x128 quantisation -> down GEMM.
    pub fn fwd(&self, st: &Stream, x: Fp8, w: &MlpW, rows: Rows) -> Result<MlpFwd> {
        let (h, i_n, m, dev) = (self.h, self.i_n, rows.m, st.device());
        let gu = self.gemm(st, x, (&w.b1, &w.sb1), rows, 2 * i_n, h)?;
        let mut aq = dev.alloc::<u8>(m * i_n)?;
        let mut asc = dev.alloc::<f32>(m * i_n / 128)?;
        kernels::swiglu_fwd_fp8(st, &gu, rows.mi, &mut aq, &mut asc, m, i_n)?;
        let y = self.gemm(st, (&aq, &asc), (&w.b2, &w.sb2), rows, h, i_n)?;
        st.synchronize()?;
        Ok(MlpFwd { gu, y })
    }

    /// quantise dY -> dgrad through down -> SwiGLU backward (+ quantise) -> dgrad through
    /// gate/up. `row_w` `[m]` weighs each row's dGate|dUp and activation for the wgrad.
    pub fn dgrad(
        &self,
        st: &Stream,
        dy: Buffer<bf16>,
        f: &MlpFwd,
        row_w: &Buffer<f32>,
        w: &MlpW,
        rows: Rows,
    ) -> Result<MlpDgrad> {
        let (h, i_n, m, dev) = (self.h, self.i_n, rows.m, st.device());
        let mut dyq = dev.alloc::<u8>(m * h)?;
        let mut dys = dev.alloc::<f32>(m * h / 128)?;
        kernels::quantize_fp8_1x128(st, &dy, &mut dyq, &mut dys, m, h, ScaleMode::Pow2)?;
        // dH [m, I] = dY [m, H] x (W_down^T [I, H])^T
        let dh = self.gemm(st, (&dyq, &dys), (&w.b2t, &w.sb2t), rows, i_n, h)?;
        let mut gq = dev.alloc::<u8>(m * 2 * i_n)?;
        let mut gs = dev.alloc::<f32>(m * 2 * i_n / 128)?;
        let mut dgu_w = dev.alloc::<bf16>(m * 2 * i_n)?;
        let mut act_w = dev.alloc::<bf16>(m * i_n)?;
        kernels::swiglu_bwd(
            st, &f.gu, &dh, row_w, rows.mi, &mut gq, &mut gs, &mut dgu_w, &mut act_w, m, i_n,
        )?;
        // dX [m, H] = dGU [m, 2I] x (W_gu^T [H, 2I])^T
        let dx = self.gemm(st, (&gq, &gs), (&w.b1t, &w.sb1t), rows, h, 2 * i_n)?;
        st.synchronize()?;
        Ok(MlpDgrad {
            dx,
            dy,
            dgu_w,
            act_w,
        })
    }

    /// k-grouped FP8 wgrad: `dW_down[g] = dY^T (w act)`, `dW_gu[g] = (w dGU)^T X` over each
    /// group's token segment `k_starts[g]..k_starts[g+1]`; returns (dW_gu `[G, 2I, H]`, dW_down
    /// `[G, H, I]`) in f32.
    pub fn wgrad(
        &self,
        st: &Stream,
        d: &MlpDgrad,
        x: Fp8,
        rows: Rows,
        k_starts: &Buffer<i32>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (h, i_n, m, groups, dev) = (self.h, self.i_n, rows.m, rows.groups, st.device());
        let tq = |v: &Buffer<bf16>, cols: usize| -> Result<(Buffer<u8>, Buffer<f32>)> {
            let mut q = dev.alloc::<u8>(cols * m)?;
            let mut s = dev.alloc::<f32>(cols * m / 128)?;
            kernels::quantize_fp8_1x128_t(st, v, Some(rows.mi), &mut q, &mut s, m, cols)?;
            Ok((q, s))
        };
        let (dyt, dyts) = tq(&d.dy, h)?;
        let (actt, actts) = tq(&d.act_w, i_n)?;
        let dw2 = dev.alloc::<f32>(groups * h * i_n)?;
        let p = GemmProblem::new(InTy::Fp8, h, i_n, m).k_grouped(groups);
        let bufs = GemmBufs::new(&dyt, &actt, &dw2).scales(&dyts, &actts);
        kernels::gemm(st, &p, bufs.index(k_starts))?;
        let (dgt, dgts) = tq(&d.dgu_w, 2 * i_n)?;
        let mut xt = dev.alloc::<u8>(h * m)?;
        let mut xts = dev.alloc::<f32>(h * m / 128)?;
        kernels::requantize_fp8_1x128_to_128x1_t(st, x.0, x.1, &mut xt, &mut xts, m, h)?;
        let dw1 = dev.alloc::<f32>(groups * 2 * i_n * h)?;
        let p = GemmProblem::new(InTy::Fp8, 2 * i_n, h, m).k_grouped(groups);
        let bufs = GemmBufs::new(&dgt, &xt, &dw1).scales(&dgts, &xts);
        kernels::gemm(st, &p, bufs.index(k_starts))?;
        st.synchronize()?;
        Ok((st.read(&dw1)?, st.read(&dw2)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::host::quant_expert;
    use rand::{Rng, SeedableRng};

    /// Random weights: each 128x128 block its own magnitude (so the blocks get different
    /// power-of-two scales, some tiny enough for FP8 subnormals), the elements spread over
    /// several binades inside a block.
    fn weights(rg: &mut rand::rngs::StdRng, rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| {
                let block = (i / cols / 128) * 7 + (i % cols / 128) * 3;
                let exp = (block % 11) as i32 - 14;
                rg.gen_range(-1.0f32..1.0) * 2f32.powi(exp + rg.gen_range(0..6))
            })
            .collect()
    }

    #[test]
    fn on_device_quantisation_is_the_host_quantiser_bit_for_bit() {
        let dev = Device::emu(930);
        let st = dev.stream(0);
        let mut rg = rand::rngs::StdRng::seed_from_u64(14);
        let (h, i_n) = (256, 128);
        let host: Vec<(Vec<f32>, Vec<f32>)> = (0..3)
            .map(|_| (weights(&mut rg, 2 * i_n, h), weights(&mut rg, h, i_n)))
            .collect();
        let bufs: Vec<_> = host
            .iter()
            .map(|(a, b)| (dev.upload(a).unwrap(), dev.upload(b).unwrap()))
            .collect();
        let ex: Vec<ExpertF32> = bufs.iter().map(|(a, b)| (a, b)).collect();
        let w = MlpW::quantise(&st, &ex, h, i_n).unwrap();
        let q: Vec<_> = host
            .iter()
            .map(|(a, b)| quant_expert(a, b, h, i_n))
            .collect();
        let cat = |f: &dyn Fn(&crate::moe::host::ExpertQ) -> Vec<u8>| -> Vec<u8> {
            q.iter().flat_map(f).collect()
        };
        let catf = |f: &dyn Fn(&crate::moe::host::ExpertQ) -> Vec<f32>| -> Vec<u32> {
            q.iter().flat_map(f).map(f32::to_bits).collect()
        };
        let bits = |b: &Buffer<f32>| -> Vec<u32> {
            b.to_vec().unwrap().into_iter().map(f32::to_bits).collect()
        };
        assert_eq!(w.b1.to_vec().unwrap(), cat(&|e| e.w1.0.clone()), "W1 bytes");
        assert_eq!(w.b2.to_vec().unwrap(), cat(&|e| e.w2.0.clone()), "W2 bytes");
        assert_eq!(
            w.b1t.to_vec().unwrap(),
            cat(&|e| e.w1t.0.clone()),
            "W1^T bytes"
        );
        assert_eq!(
            w.b2t.to_vec().unwrap(),
            cat(&|e| e.w2t.0.clone()),
            "W2^T bytes"
        );
        assert_eq!(bits(&w.sb1), catf(&|e| e.w1.1.clone()), "W1 scales");
        assert_eq!(bits(&w.sb2), catf(&|e| e.w2.1.clone()), "W2 scales");
        assert_eq!(bits(&w.sb1t), catf(&|e| e.w1t.1.clone()), "W1^T scales");
        assert_eq!(bits(&w.sb2t), catf(&|e| e.w2t.1.clone()), "W2^T scales");
        // several distinct scales: the test exercises the per-block amax
        let mut sc = bits(&w.sb1);
        sc.sort_unstable();
        sc.dedup();
        assert!(sc.len() > 3, "{sc:?}");
        let Err(e) = MlpW::quantise(&st, &ex, h, 64) else {
            panic!("an intermediate size of 64 was accepted")
        };
        assert!(e.to_string().contains("intermediate (64)"), "{e}");
    }
}
