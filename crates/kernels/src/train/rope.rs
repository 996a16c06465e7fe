//! Rotary position embedding on MLA's decoupled RoPE part, in place, BF16.
//!
//! Convention: DeepSeek-V3's own (`apply_rotary_emb` on `view_as_complex` of the last dim as
//! pairs): **interleaved pairs** — elements (2i, 2i+1) of the rope part are rotated together by
//! angle `pos * inv_freq[i]`. (HF checkpoints permute q_pe/k_pe weights to use the half-split
//! `rotate_half` form instead; this kernel does not.)
//!
//! Frequencies: [`RopeConfig`] computes `inv_freq` on the host in f64 — `theta^(-2i/d)`, with
//! YaRN when `yarn.factor > 1`: `inv_freq / factor * (1 - s) + inv_freq * s`, where `s` is 1 for
//! dimensions rotating more than `beta_fast` times over `original_max_pos` and 0 for those rotating
//! fewer than `beta_slow` times (linear ramp between, over the rounded correction range). The
//! kernel reads a cos/sin table [max_pos, d/2] (f32, built in f64 and multiplied by the YaRN
//! magnitude `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` with
//! `mscale(s, m) = 0.1 m ln(s) + 1`; V3 has mscale = mscale_all_dim, so 1). The attention-side
//! factor (V3 multiplies the softmax scale by mscale(factor, mscale_all_dim)^2) belongs to the
//! attention kernel, not here.
//!
//! Layout: token t, head h, pair i live at element `t*row_stride + h*head_stride + col0 + 2i` of
//! a bf16 tensor (so q [T, H, 192] with the rope part at col0 = 128, or k_pe [T, 64]); one thread
//! per pair (one b32 word), 256 threads per CTA. Forward (x0, x1) -> (x0 c - x1 s, x0 s + x1 c);
//! backward applies the transpose (rotation by -angle) to the gradient, also in place.

use super::*;
use crate::host::{check_target, function};
use crate::reference as r;
use crate::tile::bf16x2_to_f32;
use rand::Rng;
use runtime::{args, LaunchConfig};
use std::time::Instant;

pub const FWD_NAME: &str = "rope_fwd_bf16";
pub const BWD_NAME: &str = "rope_bwd_bf16";

/// Which rotation [`rope_apply`] applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeDir {
    /// Rotate the activations by +angle.
    Forward,
    /// Rotate the gradient by -angle (the transpose of the forward rotation).
    Backward,
}

/// YaRN context-extension parameters (DeepSeek-V3: factor 40, original_max_pos 4096,
/// beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_pos: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: f64,
    pub mscale_all_dim: f64,
}

/// Frequencies of one RoPE: rotary dim (even), base theta, optional YaRN scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub dim: usize,
    pub theta: f64,
    pub yarn: Option<Yarn>,
}

fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

impl RopeConfig {
    /// DeepSeek-V3's rope: dim 64, theta 10000, YaRN factor 40 over 4096 positions.
    pub fn deepseek_v3() -> RopeConfig {
        RopeConfig {
            dim: 64,
            theta: 10000.0,
            yarn: Some(Yarn {
                factor: 40.0,
                original_max_pos: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: 1.0,
                mscale_all_dim: 1.0,
            }),
        }
    }

    fn validate(&self) -> Result<()> {
        if self.dim == 0 || self.dim % 2 != 0 {
            return shape_err(
                FWD_NAME,
                format!("rope dim = {} must be even and > 0", self.dim),
            );
        }
        if !(self.theta.is_finite() && self.theta > 1.0) {
            return shape_err(FWD_NAME, format!("theta = {} must be > 1", self.theta));
        }
        if let Some(y) = self.yarn {
            let ok = y.factor.is_finite()
                && y.factor >= 1.0
                && y.original_max_pos > 0
                && y.beta_fast > 0.0
                && y.beta_slow > 0.0
                && y.mscale.is_finite()
                && y.mscale_all_dim.is_finite();
            if !ok {
                return shape_err(FWD_NAME, format!("bad YaRN parameters {y:?}"));
            }
        }
        Ok(())
    }

    /// The d/2 inverse frequencies (f64), YaRN-corrected when configured.
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.dim as f64;
        let base: Vec<f64> = (0..self.dim / 2)
            .map(|i| self.theta.powf(-((2 * i) as f64) / d))
            .collect();
        let Some(y) = self.yarn.filter(|y| y.factor > 1.0) else {
            return base;
        };
        // dimension index rotating `rot` times over the original context
        let corr = |rot: f64| {
            d * (y.original_max_pos as f64 / (rot * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * self.theta.ln())
        };
        let low = corr(y.beta_fast).floor().max(0.0);
        let high = corr(y.beta_slow).ceil().min(d - 1.0);
        let high = if high == low { high + 0.001 } else { high };
        base.iter()
            .enumerate()
            .map(|(i, f)| {
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let keep = 1.0 - ramp; // 1 for fast (low-index) dims: not interpolated
                f / y.factor * (1.0 - keep) + f * keep
            })
            .collect()
    }

    /// Magnitude applied to cos/sin (HF YaRN convention; 1 for V3).
    pub fn table_scale(&self) -> f64 {
        match self.yarn {
            Some(y) => yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim),
            None => 1.0,
        }
    }

    /// (cos, sin) tables [max_pos, dim/2], computed in f64 and rounded to f32.
    pub fn tables(&self, max_pos: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        self.validate()?;
        let (f, m) = (self.inv_freq(), self.table_scale());
        let mut c = Vec::with_capacity(max_pos * f.len());
        let mut s = Vec::with_capacity(max_pos * f.len());
        for p in 0..max_pos {
            for fi in &f {
                let a = p as f64 * fi;
                c.push((a.cos() * m) as f32);
                s.push((a.sin() * m) as f32);
            }
        }
        Ok((c, s))
    }
}

/// Device cos/sin tables of one [`RopeConfig`] for positions 0..max_pos.
pub struct RopeTables {
    pub cos: Buffer<f32>,
    pub sin: Buffer<f32>,
    pub dim: usize,
    pub max_pos: usize,
}

impl RopeTables {
    pub fn new(dev: &Device, cfg: &RopeConfig, max_pos: usize) -> Result<RopeTables> {
        fits_u32(FWD_NAME, max_pos.saturating_mul(cfg.dim))?;
        let (c, s) = cfg.tables(max_pos)?;
        Ok(RopeTables {
            cos: dev.upload(&c)?,
            sin: dev.upload(&s)?,
            dim: cfg.dim,
            max_pos,
        })
    }
}

/// Per-token positions, validated against the tables' range on the host before upload.
pub struct Positions {
    pub buf: Buffer<i32>,
    pub tokens: usize,
}

impl Positions {
    pub fn new(dev: &Device, pos: &[i32], tables: &RopeTables) -> Result<Positions> {
        if let Some((t, p)) = pos
            .iter()
            .enumerate()
            .find(|(_, &p)| p < 0 || p as usize >= tables.max_pos)
        {
            return shape_err(
                FWD_NAME,
                format!(
                    "position {p} of token {t} is outside the table [0, {})",
                    tables.max_pos
                ),
            );
        }
        Ok(Positions {
            buf: dev.upload(pos)?,
            tokens: pos.len(),
        })
    }
}

/// Where the rope part sits in the tensor (element strides, all even).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeLayout {
    pub heads: usize,
    pub row_stride: usize,
    pub head_stride: usize,
    pub col0: usize,
}

/// In-place rotation: params (x, pos, cos, sin, tokens, heads, row_stride, head_stride, col0,
/// half); grid ceil(tokens*heads*half/256) x 256.
pub fn gen_rope(t: &Target, dir: RopeDir) -> Result<ptx::Module> {
    let backward = dir == RopeDir::Backward;
    let name = if backward { BWD_NAME } else { FWD_NAME };
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[256]);
    let x = k.param_ptr_aligned::<B32>("x", 4);
    let pos = k.param_ptr_aligned::<i32>("pos", 4);
    let cos = k.param_ptr_aligned::<f32>("cos", 4);
    let sin = k.param_ptr_aligned::<f32>("sin", 4);
    let tokens = k.param::<u32>("tokens");
    let heads = k.param::<u32>("heads");
    let rs = k.param::<u32>("row_stride");
    let hs = k.param::<u32>("head_stride");
    let col0 = k.param::<u32>("col0");
    let half = k.param::<u32>("half");
    let gi = k.global_index_x();
    let per_tok = k.mul(heads, half);
    let total = k.mul(tokens, per_tok);
    let valid = k.lt(gi, total);
    k.if_(valid, |k| {
        let tok = k.div(gi, per_tok);
        let rem = k.rem(gi, per_tok);
        let head = k.div(rem, half);
        let i = k.rem(rem, half);
        let e = k.mul(tok, rs);
        let e = k.mad_lo(head, hs, e);
        let e = k.add(e, col0);
        let wi = k.shr(e, 1u32);
        let wi = k.add(wi, i);
        let p: Reg<u32> = k.ld_nc(pos.offset(tok)).reinterpret();
        let ti = k.mad_lo(p, half, i);
        let c = k.ld_nc(cos.offset(ti));
        let s = k.ld_nc(sin.offset(ti));
        let s = if backward { k.neg(s) } else { s };
        let w = k.ld(x.offset(wi));
        let [a, b] = bf16x2_to_f32(k, w);
        // (a c - b s, a s + b c)
        let bs = k.mul(b, s);
        let bc = k.mul(b, c);
        let ns = k.neg(bs);
        let y0 = k.fma(a, c, ns);
        let y1 = k.fma(a, s, bc);
        let o: Reg<B32> = k.cvt_bf16x2(y1, y0).reinterpret();
        k.st(x.offset(wi), o);
    });
    Ok(k.finish()?)
}

/// Applies RoPE (forward) or its transpose (backward, on the gradient) in place to the rope part
/// of `x` at `layout`, for each of `positions.tokens` tokens.
pub fn rope_apply(
    stream: &Stream,
    dir: RopeDir,
    x: &mut Buffer<bf16>,
    layout: &RopeLayout,
    positions: &Positions,
    tables: &RopeTables,
) -> Result<()> {
    let name = if dir == RopeDir::Backward {
        BWD_NAME
    } else {
        FWD_NAME
    };
    let l = layout;
    let half = tables.dim / 2;
    if l.row_stride % 2 != 0 || l.head_stride % 2 != 0 || l.col0 % 2 != 0 {
        return shape_err(name, format!("strides and col0 must be even: {l:?}"));
    }
    if l.heads == 0 || (l.heads - 1) * l.head_stride + l.col0 + tables.dim > l.row_stride {
        return shape_err(
            name,
            format!("rope part (dim {}) does not fit a row: {l:?}", tables.dim),
        );
    }
    let t = positions.tokens;
    need(name, "x", x, t * l.row_stride)?;
    fits_u32(name, t.saturating_mul(l.row_stride))?;
    if t == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", |tg| gen_rope(tg, dir))?;
    let n = t * l.heads * half;
    let cfg = LaunchConfig::linear(n.div_ceil(256) as u32, 256);
    let a = args![
        &*x,
        &positions.buf,
        &tables.cos,
        &tables.sin,
        t as u32,
        l.heads as u32,
        l.row_stride as u32,
        l.head_stride as u32,
        l.col0 as u32,
        half as u32
    ];
    stream.launch(&f, &cfg, &a)?;
    Ok(())
}

/// Runs [`rope_apply`] on q-shaped rows [tokens, heads, 32 + dim + 8] (rope part at col0 = 32)
/// with V3's YaRN parameters but mscale 0.707 (a non-trivial magnitude) against f64 rotations
/// from [`RopeConfig::inv_freq`]: every rope element within half a bf16 ulp + 1e-6 of its term
/// magnitudes; every element outside the rope part bitwise unchanged.
pub fn check_rope(
    stream: &Stream,
    tokens: usize,
    heads: usize,
    dim: usize,
    dir: RopeDir,
    seed: u64,
) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let mut cfg = RopeConfig::deepseek_v3();
    cfg.dim = dim;
    if let Some(y) = cfg.yarn.as_mut() {
        y.mscale = 0.707;
    }
    let max_pos = 8192;
    let tables = RopeTables::new(&dev, &cfg, max_pos)?;
    let pos: Vec<i32> = (0..tokens)
        .map(|_| rg.gen_range(0..max_pos as i32))
        .collect();
    let positions = Positions::new(&dev, &pos, &tables)?;
    let hs = 32 + dim + 8;
    let layout = RopeLayout {
        heads,
        row_stride: heads * hs,
        head_stride: hs,
        col0: 32,
    };
    let n = tokens * layout.row_stride;
    let x: Vec<bf16> = r::random_activations(&mut rg, n, dim)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let mut xb = dev.upload(&x)?;
    let t0 = Instant::now();
    rope_apply(stream, dir, &mut xb, &layout, &positions, &tables)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let got = xb.to_vec()?;
    let (f, m) = (cfg.inv_freq(), cfg.table_scale());
    let mut c = OpCheck::default();
    let (mut g_all, mut w_all) = (Vec::new(), Vec::new());
    for t in 0..tokens {
        for h in 0..heads {
            let base = t * layout.row_stride + h * hs;
            for e in (0..hs).filter(|e| *e < 32 || *e >= 32 + dim) {
                c.mismatches += (got[base + e].to_bits() != x[base + e].to_bits()) as usize;
            }
            for (i, fi) in f.iter().enumerate() {
                let ang = pos[t] as f64 * fi;
                let (s, co) = (ang.sin() * m, ang.cos() * m);
                let s = if dir == RopeDir::Backward { -s } else { s };
                let j = base + 32 + 2 * i;
                let (a, b) = (x[j].to_f64(), x[j + 1].to_f64());
                let mag = (a.abs() + b.abs()) * m;
                for (o, want) in [(0, a * co - b * s), (1, a * s + b * co)] {
                    c.bf16(got[j + o], want, 1e-6 * mag);
                    g_all.push(got[j + o].to_f64());
                    w_all.push(want);
                }
            }
        }
    }
    c.rel_fro = rel_fro(&g_all, &w_all);
    Ok(c.finish(stream, seconds))
}
