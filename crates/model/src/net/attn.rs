//! The MLA attention block on one rank, forward and backward:
//! `x1 = x + MLA(RMSNorm(x; attn_norm))` (DeepSeek-V3's multi-head latent attention with the
//! decoupled, shared RoPE key; `/tmp/mathspec.md` step 2).
//!
//! `wkv_a` is held as its two row blocks (`W_DKV` -> `ckv`, `W_KR` -> the RoPE key) and `wkv_b`
//! as its per-head `k_nope` rows and `v` rows gathered into two matrices, so every projection
//! writes exactly the layout the attention kernels read (`q [T, heads, nope+rope]`,
//! `k [T, heads, nope]`, `k_rope [T, rope]`, `v [T, heads, v]`); the gradients are put back into
//! the parameters' own row order on the host (a permutation).

use super::linear::{rows_of, Ctx, Lin, Result, WithGrads};
use super::Dims;
use half::bf16;
use kernels::attn::bwd::{mla_attn_bwd, BwdArgs};
use kernels::attn::fwd::{mla_attn_fwd, AttnShape, FwdArgs};
use kernels::train::ops::{self, HeadSum};
use kernels::{rope_apply, Positions, RmsNormBwd, RmsNormSpec, RopeDir, RopeLayout, RopeTables};
use runtime::Buffer;

/// Per-rank constants of the attention: RoPE tables, token positions, sequence offsets.
pub(crate) struct AttnConst {
    pub rope: RopeTables,
    pub pos: Positions,
    pub cu: Buffer<i32>,
}

/// One layer's attention weights on one rank.
pub(crate) struct AttnW {
    pub attn_norm: Buffer<f32>,
    pub q_norm: Buffer<f32>,
    pub kv_norm: Buffer<f32>,
    pub wq_a: Lin,
    pub wq_b: Lin,
    /// `wkv_a` rows `0..kv_lora` (-> ckv) and `kv_lora..` (-> the RoPE key).
    pub wc: Lin,
    pub wr: Lin,
    /// `wkv_b`'s per-head `k_nope` rows and `v` rows.
    pub wk: Lin,
    pub wv: Lin,
    pub wo: Lin,
}

/// The parameters of one layer's attention, by name suffix (`attn_norm`, `attn.wq_a`, ...).
pub(crate) type Named<'a> = &'a dyn Fn(&str) -> Result<&'a [f32]>;

/// Row permutation of `wkv_b` `[heads*(nope+v), kv_lora]`: (k rows, v rows) as indices.
pub(crate) fn kv_b_rows(d: &Dims) -> (Vec<usize>, Vec<usize>) {
    let per = d.dn + d.dv;
    let k = (0..d.nh)
        .flat_map(|h| (0..d.dn).map(move |j| h * per + j))
        .collect();
    let v = (0..d.nh)
        .flat_map(|h| (0..d.dv).map(move |j| h * per + d.dn + j))
        .collect();
    (k, v)
}

fn gather_rows(w: &[f32], cols: usize, rows: &[usize]) -> Vec<f32> {
    rows.iter()
        .flat_map(|&r| w[r * cols..(r + 1) * cols].iter().copied())
        .collect()
}

impl AttnW {
    pub fn upload(cx: &Ctx, d: &Dims, p: Named) -> Result<AttnW> {
        let dev = &cx.dev;
        let (h, dqk) = (d.h, d.dn + d.dr);
        let wkv_a = p("attn.wkv_a")?;
        let wkv_b = p("attn.wkv_b")?;
        let (kr, vr) = kv_b_rows(d);
        Ok(AttnW {
            attn_norm: dev.upload(p("attn_norm")?)?,
            q_norm: dev.upload(p("attn.q_norm")?)?,
            kv_norm: dev.upload(p("attn.kv_norm")?)?,
            wq_a: Lin::upload(dev, p("attn.wq_a")?, d.ql, h)?,
            wq_b: Lin::upload(dev, p("attn.wq_b")?, d.nh * dqk, d.ql)?,
            wc: Lin::upload(dev, rows_of(wkv_a, h, 0..d.kvl), d.kvl, h)?,
            wr: Lin::upload(dev, rows_of(wkv_a, h, d.kvl..d.kvl + d.dr), d.dr, h)?,
            wk: Lin::upload(dev, &gather_rows(wkv_b, d.kvl, &kr), d.nh * d.dn, d.kvl)?,
            wv: Lin::upload(dev, &gather_rows(wkv_b, d.kvl, &vr), d.nh * d.dv, d.kvl)?,
            wo: Lin::upload(dev, p("attn.wo")?, h, d.nh * d.dv)?,
        })
    }
}

/// What the attention forward keeps for its backward.
pub(crate) struct AttnAct {
    x: Buffer<bf16>,
    a: Buffer<bf16>,
    r1: Buffer<f32>,
    cq_raw: Buffer<bf16>,
    cq: Buffer<bf16>,
    r2: Buffer<f32>,
    ckv: Buffer<bf16>,
    ckvn: Buffer<bf16>,
    r3: Buffer<f32>,
    q: Buffer<bf16>,
    kr: Buffer<bf16>,
    k: Buffer<bf16>,
    v: Buffer<bf16>,
    o: Buffer<bf16>,
    lse: Buffer<f32>,
}

/// RMSNorm of `x [rows, hid]`: (y bf16, rstd).
pub(crate) fn norm_fwd(
    cx: &Ctx,
    x: &Buffer<bf16>,
    w: &Buffer<f32>,
    (rows, hid, eps): (usize, usize, f32),
) -> Result<(Buffer<bf16>, Buffer<f32>)> {
    let (mut y, mut r) = (cx.bf(rows * hid)?, cx.f32(rows)?);
    let spec = RmsNormSpec {
        rows,
        hidden: hid,
        eps,
    };
    kernels::rmsnorm_fwd(&cx.st, &spec, x, w, &mut y, &mut r)?;
    Ok((y, r))
}

/// RMSNorm backward: (dx bf16, dweight downloaded).
pub(crate) fn norm_bwd(
    cx: &Ctx,
    (x, w, dy, rstd): (&Buffer<bf16>, &Buffer<f32>, &Buffer<bf16>, &Buffer<f32>),
    (rows, hid, eps): (usize, usize, f32),
) -> Result<(Buffer<bf16>, Vec<f32>)> {
    let spec = RmsNormSpec {
        rows,
        hidden: hid,
        eps,
    };
    let mut dx = cx.bf(rows * hid)?;
    let mut dw = cx.f32(hid)?;
    let mut ws = cx.f32(spec.dw_workspace_len())?;
    let b = RmsNormBwd {
        x,
        weight: w,
        dy,
        rstd,
        dx: &mut dx,
        dweight: &mut dw,
        accumulate: false,
        workspace: &mut ws,
    };
    kernels::rmsnorm_bwd(&cx.st, &spec, b)?;
    cx.sync()?;
    Ok((dx, dw.to_vec()?))
}

fn shape(d: &Dims) -> AttnShape {
    let dqk = d.dn + d.dr;
    AttnShape {
        heads: d.nh,
        d_qk: dqk,
        d_v: d.dv,
        scale: (1.0 / (dqk as f64).sqrt()) as f32,
        max_seqlen: d.seq,
        k_rope: d.dr,
    }
}

fn q_layout(d: &Dims) -> RopeLayout {
    RopeLayout {
        heads: d.nh,
        row_stride: d.nh * (d.dn + d.dr),
        head_stride: d.dn + d.dr,
        col0: d.dn,
    }
}

fn k_layout(d: &Dims) -> RopeLayout {
    RopeLayout {
        heads: 1,
        row_stride: d.dr,
        head_stride: d.dr,
        col0: 0,
    }
}

/// Forward of `x [T, H]`: returns `x1 = x + attn` and what the backward needs.
pub(crate) fn forward(
    cx: &Ctx,
    w: &AttnW,
    c: &AttnConst,
    d: &Dims,
    x: Buffer<bf16>,
) -> Result<(Buffer<bf16>, AttnAct)> {
    let t = d.t;
    let (a, r1) = norm_fwd(cx, &x, &w.attn_norm, (t, d.h, d.eps))?;
    let cq_raw = w.wq_a.fwd(cx, &a, t, None)?;
    let (cq, r2) = norm_fwd(cx, &cq_raw, &w.q_norm, (t, d.ql, d.eps))?;
    let mut q = w.wq_b.fwd(cx, &cq, t, None)?;
    rope_apply(
        &cx.st,
        RopeDir::Forward,
        &mut q,
        &q_layout(d),
        &c.pos,
        &c.rope,
    )?;
    let ckv = w.wc.fwd(cx, &a, t, None)?;
    let mut kr = w.wr.fwd(cx, &a, t, None)?;
    rope_apply(
        &cx.st,
        RopeDir::Forward,
        &mut kr,
        &k_layout(d),
        &c.pos,
        &c.rope,
    )?;
    let (ckvn, r3) = norm_fwd(cx, &ckv, &w.kv_norm, (t, d.kvl, d.eps))?;
    let k = w.wk.fwd(cx, &ckvn, t, None)?;
    let v = w.wv.fwd(cx, &ckvn, t, None)?;
    let (mut o, mut lse) = (cx.bf(t * d.nh * d.dv)?, cx.f32(t * d.nh)?);
    let args = FwdArgs {
        q: &q,
        k: &k,
        k_rope: Some(&kr),
        v: &v,
        cu_seqlens: &c.cu,
        o: &mut o,
        lse: &mut lse,
    };
    mla_attn_fwd(&cx.st, &shape(d), args)?;
    let x1 = w.wo.fwd(cx, &o, t, Some(&x))?;
    cx.sync()?;
    let act = AttnAct {
        x,
        a,
        r1,
        cq_raw,
        cq,
        r2,
        ckv,
        ckvn,
        r3,
        q,
        kr,
        k,
        v,
        o,
        lse,
    };
    Ok((x1, act))
}

/// The attention kernel's backward: (dq with RoPE undone, dk_nope, dk_rope raw, dv).
fn core_bwd(
    cx: &Ctx,
    c: &AttnConst,
    d: &Dims,
    s: &AttnAct,
    dout: &Buffer<bf16>,
) -> Result<[Buffer<bf16>; 4]> {
    let (t, dqk) = (d.t, d.dn + d.dr);
    let mut delta = cx.f32(t * d.nh)?;
    let (mut dq, mut dk) = (cx.bf(t * d.nh * dqk)?, cx.bf(t * d.nh * dqk)?);
    let mut dv = cx.bf(t * d.nh * d.dv)?;
    let args = BwdArgs {
        q: &s.q,
        k: &s.k,
        k_rope: Some(&s.kr),
        v: &s.v,
        o: &s.o,
        lse: &s.lse,
        dout,
        cu_seqlens: &c.cu,
        delta: &mut delta,
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    mla_attn_bwd(&cx.st, &shape(d), args)?;
    rope_apply(
        &cx.st,
        RopeDir::Backward,
        &mut dq,
        &q_layout(d),
        &c.pos,
        &c.rope,
    )?;
    let per_head = HeadSum {
        rows: t,
        w: d.dn,
        groups: d.nh,
        row_in: d.nh * dqk,
        blk: dqk,
        off: 0,
        nsum: 1,
        sstride: 0,
    };
    let mut dk_nope = cx.bf(per_head.output_len())?;
    ops::head_sum(&cx.st, &per_head, &dk, &mut dk_nope)?;
    let shared = HeadSum {
        w: d.dr,
        groups: 1,
        blk: 0,
        off: d.dn,
        nsum: d.nh,
        sstride: dqk,
        ..per_head
    };
    let mut dkr = cx.bf(shared.output_len())?;
    ops::head_sum(&cx.st, &shared, &dk, &mut dkr)?;
    rope_apply(
        &cx.st,
        RopeDir::Backward,
        &mut dkr,
        &k_layout(d),
        &c.pos,
        &c.rope,
    )?;
    cx.sync()?;
    Ok([dq, dk_nope, dkr, dv])
}

/// Backward of the block from `dx1` (gradient of `x1`): returns `dx` and the weight gradients
/// `(name suffix, f32)`.
pub(crate) fn backward(
    cx: &Ctx,
    w: &AttnW,
    c: &AttnConst,
    d: &Dims,
    s: &AttnAct,
    dx1: &Buffer<bf16>,
) -> Result<WithGrads> {
    let t = d.t;
    let d_o = w.wo.dgrad(cx, dx1, t, None)?;
    let g_wo = w.wo.wgrad(cx, dx1, &s.o, t)?;
    let [dq, dk_nope, dkr, dv] = core_bwd(cx, c, d, s, &d_o)?;
    // k/v up-projections: d ckvn = dk_nope W_k + dv W_v
    let dckvn = w.wk.dgrad(cx, &dk_nope, t, None)?;
    let dckvn = w.wv.dgrad(cx, &dv, t, Some(&dckvn))?;
    let g_wk = w.wk.wgrad(cx, &dk_nope, &s.ckvn, t)?;
    let g_wv = w.wv.wgrad(cx, &dv, &s.ckvn, t)?;
    let (dckv, g_kvn) = norm_bwd(cx, (&s.ckv, &w.kv_norm, &dckvn, &s.r3), (t, d.kvl, d.eps))?;
    // q path
    let dcq = w.wq_b.dgrad(cx, &dq, t, None)?;
    let g_wqb = w.wq_b.wgrad(cx, &dq, &s.cq, t)?;
    let (dcq_raw, g_qn) = norm_bwd(cx, (&s.cq_raw, &w.q_norm, &dcq, &s.r2), (t, d.ql, d.eps))?;
    // da = dckv W_c + dkr W_r + dcq_raw W_qa
    let da = w.wc.dgrad(cx, &dckv, t, None)?;
    let da = w.wr.dgrad(cx, &dkr, t, Some(&da))?;
    let da = w.wq_a.dgrad(cx, &dcq_raw, t, Some(&da))?;
    let g_wc = w.wc.wgrad(cx, &dckv, &s.a, t)?;
    let g_wr = w.wr.wgrad(cx, &dkr, &s.a, t)?;
    let g_wqa = w.wq_a.wgrad(cx, &dcq_raw, &s.a, t)?;
    let (dxn, g_an) = norm_bwd(cx, (&s.x, &w.attn_norm, &da, &s.r1), (t, d.h, d.eps))?;
    let dx = cx.add(dx1, &dxn, t * d.h)?;
    cx.sync()?;
    let grads = vec![
        ("attn_norm", g_an),
        ("attn.wq_a", g_wqa),
        ("attn.q_norm", g_qn),
        ("attn.wq_b", g_wqb),
        ("attn.wkv_a", [g_wc, g_wr].concat()),
        ("attn.kv_norm", g_kvn),
        ("attn.wkv_b", scatter_kv_b(d, &g_wk, &g_wv)),
        ("attn.wo", g_wo),
    ];
    Ok((dx, grads))
}

/// The gradients of the `k_nope` and `v` row blocks put back into `wkv_b`'s per-head order.
fn scatter_kv_b(d: &Dims, gk: &[f32], gv: &[f32]) -> Vec<f32> {
    let (kr, vr) = kv_b_rows(d);
    let cols = d.kvl;
    let mut out = vec![0f32; d.nh * (d.dn + d.dv) * cols];
    for (src, rows) in [(gk, &kr), (gv, &vr)] {
        for (i, &r) in rows.iter().enumerate() {
            out[r * cols..(r + 1) * cols].copy_from_slice(&src[i * cols..(i + 1) * cols]);
        }
    }
    out
}
