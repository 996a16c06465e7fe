//! Training forward of MLA attention, FlashAttention-2 style: causal, variable lengths
//! (`cu_seqlens`), q/k head dim `d_qk` (nope + rope, concatenated) and v head dim `d_v`.
//!
//! Layouts (row = token of the packed batch): Q, K `[total, heads, d_qk]`, V `[total, heads,
//! d_v]`, O `[total, heads, d_v]` (bf16), LSE `[total, heads]` (f32, natural log of
//! `sum_j exp(scale * q.k_j)`). With a shared RoPE key (`k_rope` = r > 0), K is
//! `[total, heads, d_qk - r]` and the last r columns of every head's key come from
//! `k_rope` `[total, r]`.
//!
//! Tiling: a CTA of 4 warps owns 64 query rows of one (sequence, head), 16 per warp; Q stays in
//! shared memory (fragments re-read with `ldmatrix`, so `d_qk` = 256 fits the registers), K/V
//! tiles of `BN` keys (64, or 32 when `d_v` > 128) stream through single shared buffers with
//! `cp.async`, the next tile's K copy overlapping this tile's softmax and PV and its V copy
//! overlapping the next S = Q K^T. Scores live only in registers: the online softmax (base 2,
//! `ex2.approx`) rescales the O accumulators, and P is re-packed from the S accumulators into
//! A fragments for O += P V. The causal mask is applied only on tiles that reach the diagonal.

use super::*;
use crate::host::{check_target, function};
use half::bf16;
use runtime::{args, LaunchConfig, Stream};

/// Query rows per CTA (4 warps x 16).
pub const BM: u32 = 64;
const WARPS: u32 = 4;

/// One generated forward kernel (the head dims are compiled in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct FwdSpec {
    pub d_qk: u32,
    pub d_v: u32,
    /// sm_90a variant: S = Q K^T and O += P V with `wgmma` (one warpgroup per CTA; Q, K, V
    /// shared-memory descriptors over the same 128B-swizzled panels, P from registers)
    pub wgmma: bool,
    /// width of a RoPE key shared by all heads (`k_rope` `[total, k_rope]`, K then holds the
    /// other `d_qk - k_rope` columns per head); 0 = K concatenated per head
    pub k_rope: u32,
}

impl FwdSpec {
    /// The `mma.sync` kernel of a head-dim pair.
    pub fn mma(d_qk: u32, d_v: u32) -> FwdSpec {
        FwdSpec {
            d_qk,
            d_v,
            wgmma: false,
            k_rope: 0,
        }
    }
    pub fn name(&self) -> String {
        let w = if self.wgmma { "_wgmma" } else { "" };
        let r = rope_tag(self.k_rope);
        format!("mla_attn_fwd{w}_qk{}_v{}{r}", self.d_qk, self.d_v)
    }
    pub fn targets(&self) -> &'static [&'static str] {
        if self.wgmma {
            &["sm_90a"]
        } else {
            TARGETS
        }
    }
    /// Keys per K/V tile.
    pub fn bn(&self) -> u32 {
        if self.d_v <= 128 {
            64
        } else {
            32
        }
    }
    pub fn shared_bytes(&self) -> u32 {
        if self.wgmma {
            return super::fwd90::Layout90::new(self).total();
        }
        tile_bytes(BM, self.d_qk)
            + tile_bytes(self.bn(), self.d_qk)
            + tile_bytes(self.bn(), self.d_v)
    }
    /// Parameters in launch order: (name, type).
    pub fn params(&self) -> &'static [(&'static str, &'static str)] {
        if self.wgmma {
            return super::fwd90::PARAMS;
        }
        &[
            ("q", "bf16*"),
            ("k", "bf16*"),
            ("k_rope", "bf16* (k_rope > 0)"),
            ("v", "bf16*"),
            ("o", "bf16*"),
            ("lse", "f32*"),
            ("cu_seqlens", "i32*"),
            ("heads", "u32"),
            ("scale_log2", "f32"),
        ]
    }
    pub fn launch_rule(&self) -> String {
        format!(
            "grid = (ceil(max_seqlen/{BM}), heads, batch), block = {}, dynamic shared = {} bytes",
            if self.wgmma {
                super::fwd90::THREADS
            } else {
                WARPS * 32
            },
            self.shared_bytes()
        )
    }
}

/// The problem an attention call solves (shared by forward, backward and their checks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    pub heads: usize,
    /// q/k head dim (MLA: nope + rope, e.g. 128 + 64)
    pub d_qk: usize,
    /// v head dim
    pub d_v: usize,
    /// softmax scale (MLA: 1/sqrt(d_qk), times YaRN's mscale when extended)
    pub scale: f32,
    /// longest sequence of the batch (bounds the grid)
    pub max_seqlen: usize,
    /// width of MLA's decoupled RoPE key when it is passed once for all heads (`k_rope`
    /// `[total, k_rope]`, K `[total, heads, d_qk - k_rope]`); 0 = K concatenated per head
    pub k_rope: usize,
}

impl AttnShape {
    pub(crate) fn validate(&self, kernel: &str) -> Result<()> {
        check_head_dim(kernel, "d_qk", self.d_qk)?;
        check_head_dim(kernel, "d_v", self.d_v)?;
        check_scale(kernel, self.scale)?;
        if self.heads == 0 || self.heads > 65535 {
            return shape_err(
                kernel,
                format!("heads = {} must be in [1, 65535]", self.heads),
            );
        }
        Ok(())
    }
}

/// Device buffers of the forward.
pub struct FwdArgs<'a> {
    pub q: &'a Buffer<bf16>,
    pub k: &'a Buffer<bf16>,
    /// the shared RoPE key (with `AttnShape::k_rope > 0`)
    pub k_rope: Option<&'a Buffer<bf16>>,
    pub v: &'a Buffer<bf16>,
    pub cu_seqlens: &'a Buffer<i32>,
    pub o: &'a mut Buffer<bf16>,
    pub lse: &'a mut Buffer<f32>,
}

/// Per-warp state of the online softmax over one 16-row slice (rows g and g+8 of this lane).
pub(crate) struct Softmax {
    pub m: [Reg<f32>; 2],
    pub l: [Reg<f32>; 2],
}

/// Everything one forward CTA's tile loop works with.
struct FwdCtx {
    s: FwdSpec,
    ln: Lanes,
    tid: Reg<u32>,
    tq: Tile,
    tk: Tile,
    tv: Tile,
    ks: KSrc,
    vp: GlobalPtr<u8>,
    /// sequence start (token), length, head, heads
    start: Reg<u32>,
    len: Reg<u32>,
    h: Reg<u32>,
    heads: Reg<u32>,
    q0: Reg<u32>,
    /// this warp's first row in the Q tile, and this lane's two sequence rows
    wrow: Reg<u32>,
    rows: [Reg<u32>; 2],
    col_q: Reg<u32>,
    /// scale * log2(e)
    c: Reg<f32>,
    sm: Softmax,
    o: Vec<[Reg<f32>; 4]>,
    s_acc: Vec<[Reg<f32>; 4]>,
}

impl FwdCtx {
    /// Global address of sequence row `row` of tensor `p` (`[total, heads, d]` bf16).
    fn row_ptr(&self, k: &mut KernelBuilder, p: GlobalPtr<u8>, row: Reg<u32>, d: u32) -> Reg<u64> {
        let r = k.add(self.start, row);
        let rh = k.mad_lo(r, self.heads, self.h);
        wide_off(k, p.reg(), rh, d * 2)
    }
    /// Issues the `cp.async` copy of key tile `j` of K (`v = false`) or V into its buffer and
    /// commits a group (an empty one when `j` is past the last tile, to keep group counts uniform).
    fn issue(&self, k: &mut KernelBuilder, j: Reg<u32>, ntiles: Reg<u32>, v: bool) {
        let live = k.lt(j, ntiles);
        k.if_(live, |k| {
            let kv0 = k.mul(j, self.s.bn());
            let valid = k.sub(self.len, kv0);
            if v {
                let t = &self.tv;
                let src = self.row_ptr(k, self.vp, kv0, t.d);
                let stride = k.mul(self.heads, t.d * 2);
                load_tile(k, self.tid, WARPS * 32, t, src, stride, valid);
            } else {
                let tok0 = k.add(self.start, kv0);
                let at = (tok0, self.heads, self.h);
                load_k(k, self.tid, WARPS * 32, &self.tk, &self.ks, at, valid);
            }
        });
        k.cp_async_commit_group();
    }
    /// Waits until at most `n` copy groups are pending and makes the tiles visible to every
    /// warp.
    fn arrive(&self, k: &mut KernelBuilder, n: u32) {
        k.cp_async_wait_group(n);
        k.sync_threads();
    }
}

/// Generates the forward kernel of `s` for `t`.
pub fn gen_fwd(t: &Target, s: &FwdSpec) -> Result<ptx::Module> {
    let name = s.name();
    check_target(&name, t, s.targets())?;
    check_head_dim(&name, "d_qk", s.d_qk as usize)?;
    check_head_dim(&name, "d_v", s.d_v as usize)?;
    check_k_rope(&name, s.d_qk as usize, s.k_rope as usize)?;
    if s.wgmma {
        return super::fwd90::gen(t, s);
    }
    let mut k = KernelBuilder::new(&name, t.clone());
    k.reqntid(&[WARPS * 32]);
    k.maxnreg(255); // (without it ptxas trades registers for small spills on some head dims)
    let qp = k.param_ptr_aligned::<u8>("q", 16);
    let kp = k.param_ptr_aligned::<u8>("k", 16);
    let krp = k.param_ptr_aligned::<u8>("k_rope", 16);
    let vp = k.param_ptr_aligned::<u8>("v", 16);
    let op = k.param_ptr_aligned::<u8>("o", 4);
    let lsep = k.param_ptr_aligned::<f32>("lse", 4);
    let cup = k.param_ptr_aligned::<i32>("cu_seqlens", 4);
    let heads = k.param::<u32>("heads");
    let c = k.param::<f32>("scale_log2");
    let ks = KSrc {
        k: kp,
        k_rope: krp,
        rope: s.k_rope,
    };
    let cx = prologue(&mut k, s, (qp, ks, vp), cup, heads, c);
    // key tiles up to the CTA's last row (causal); K/V of tile 0 are in flight
    let bn = s.bn();
    let qe = k.add(cx.q0, BM);
    let kend = k.min(qe, cx.len);
    let ntiles = k.add(kend, bn - 1);
    let ntiles = k.div(ntiles, bn);
    let zero = k.mov(0u32);
    cx.issue(&mut k, zero, ntiles, false);
    cx.issue(&mut k, zero, ntiles, true);
    k.for_range(0u32, ntiles, 1u32, |k, j| fwd_tile(k, &cx, j, ntiles));
    let out_row = |k: &mut KernelBuilder, row: Reg<u32>| {
        let r = k.add(cx.start, row);
        k.mad_lo(r, cx.heads, cx.h)
    };
    epilogue(
        &mut k, &cx.ln, &cx.sm, &cx.o, cx.rows, cx.len, out_row, op, lsep, s.d_v,
    );
    Ok(k.finish()?)
}

/// CTA setup: sequence bounds (exits past the end), shared tiles, the Q tile's copy (one
/// commit group), per-lane rows, accumulators.
fn prologue(
    k: &mut KernelBuilder,
    s: &FwdSpec,
    (qp, ks, vp): (GlobalPtr<u8>, KSrc, GlobalPtr<u8>),
    cup: GlobalPtr<i32>,
    heads: Reg<u32>,
    c: Reg<f32>,
) -> FwdCtx {
    let (dqk, dv, bn) = (s.d_qk, s.d_v, s.bn());
    let smem = k.dynamic_shared::<u8>(128);
    let tid = k.tid_x();
    let lane = k.and(tid, 31u32);
    let warp = k.shr(tid, 5u32);
    let ln = Lanes::new(k, lane);
    let (bx, h, b) = (k.ctaid_x(), k.ctaid_y(), k.ctaid_z());
    let q0 = k.mul(bx, BM);
    let st = k.ld_nc(cup.offset(b));
    let b1 = k.add(b, 1u32);
    let en = k.ld_nc(cup.offset(b1));
    let start: Reg<u32> = st.reinterpret();
    let en: Reg<u32> = en.reinterpret();
    let len = k.sub(en, start);
    let done = k.ge(q0, len);
    k.when(done, |k| k.exit());
    let [tq, tk, tv] = tiles(k, smem.reg(), [(BM, dqk), (bn, dqk), (bn, dv)]);
    let wrow = k.mul(warp, 16u32);
    let r0 = k.add(q0, wrow);
    let r0 = k.add(r0, ln.g);
    let rows = [r0, k.add(r0, 8u32)];
    let col_q = k.shl(ln.q, 1u32);
    let cx = FwdCtx {
        s: *s,
        tid,
        tq,
        tk,
        tv,
        ks,
        vp,
        start,
        len,
        h,
        heads,
        q0,
        wrow,
        rows,
        col_q,
        c,
        sm: Softmax {
            m: [k.mov(f32::NEG_INFINITY), k.mov(f32::NEG_INFINITY)],
            l: [k.mov(0f32), k.mov(0f32)],
        },
        o: zero_acc(k, (dv / 8) as usize),
        s_acc: zero_acc(k, (bn / 8) as usize),
        ln,
    };
    let qsrc = cx.row_ptr(k, qp, q0, dqk);
    let qvalid = k.sub(len, q0);
    let sq = k.mul(heads, dqk * 2);
    load_tile(k, tid, WARPS * 32, &cx.tq, qsrc, sq, qvalid);
    k.cp_async_commit_group();
    cx
}

/// One key tile `j`: S = Q K_j, then K_{j+1}'s copy starts (overlapping the softmax and PV),
/// then O += P V_j, then V_{j+1}'s copy starts (overlapping the next S). Pending groups at
/// entry: [K_j, V_j] (plus Q at j = 0).
fn fwd_tile(k: &mut KernelBuilder, cx: &FwdCtx, j: Reg<u32>, ntiles: Reg<u32>) {
    let (dqk, dv, bn) = (cx.s.d_qk, cx.s.d_v, cx.s.bn());
    let (ln, sacc, oacc) = (&cx.ln, &cx.s_acc, &cx.o);
    cx.arrive(k, 1); // K_j (and Q) landed
    clear(k, sacc);
    qk_tile(k, ln, &cx.tq, Some(cx.wrow), &cx.tk, dqk, bn, sacc);
    k.sync_threads(); // every warp is done with K_j
    let next = k.add(j, 1u32);
    cx.issue(k, next, ntiles, false);
    // causal mask on tiles reaching the diagonal (covers keys past the end too)
    let kv0 = k.mul(j, bn);
    let kv_end = k.add(kv0, bn);
    let diag = k.gt(kv_end, cx.q0);
    k.if_(diag, |k| causal_mask(k, sacc, kv0, cx.col_q, cx.rows));
    online_softmax(k, &cx.sm, sacc, oacc, cx.c);
    cx.arrive(k, 1); // V_j landed (K_{j+1} may still be in flight)
    pv_tile(k, ln, sacc, &cx.tv, bn, dv, oacc);
    k.sync_threads(); // every warp is done with V_j
    cx.issue(k, next, ntiles, true);
}

/// `acc[n-tile] += A(rows) x B(keys)^T` over `d` for a 16-row warp slice of `ta` (rows at
/// `row_reg`) against all `bn` rows of `tb` (the S = Q K^T of a tile).
pub(crate) fn qk_tile(
    k: &mut KernelBuilder,
    ln: &Lanes,
    ta: &Tile,
    row_reg: Option<Reg<u32>>,
    tb: &Tile,
    d: u32,
    bn: u32,
    acc: &[[Reg<f32>; 4]],
) {
    for ks in 0..d / 16 {
        let a = ld_x4(k, ln, ta, row_reg, 0, 2 * ks, Style::A, false);
        for j in 0..bn / 16 {
            let b = ld_x4(k, ln, tb, None, 16 * j, 2 * ks, Style::B, false);
            let (i0, i1) = (2 * j as usize, 2 * j as usize + 1);
            k.mma_to::<Mma>(acc[i0], a, [b[0], b[1]], acc[i0]);
            k.mma_to::<Mma>(acc[i1], a, [b[2], b[3]], acc[i1]);
        }
    }
}

/// `-inf` where key `kv0 + 8 n + 2q + e` > query row (rows[0] for e < 2, rows[1] otherwise).
pub(crate) fn causal_mask(
    k: &mut KernelBuilder,
    s: &[[Reg<f32>; 4]],
    kv0: Reg<u32>,
    col_q: Reg<u32>,
    rows: [Reg<u32>; 2],
) {
    let c0 = k.add(kv0, col_q);
    for (n, a) in s.iter().enumerate() {
        for e in 0..4 {
            let key = k.add(c0, (8 * n + (e & 1)) as u32);
            let bad = k.gt(key, rows[e >> 1]);
            let v = k.selp(f32::NEG_INFINITY, a[e], bad);
            k.mov_to(a[e], v);
        }
    }
}

/// Online softmax of one tile: new row max (of `s * c`), P = 2^(s c - m) in place of S, the
/// O accumulators and the per-lane partial row sums rescaled by 2^(m_old - m_new).
pub(super) fn online_softmax(
    k: &mut KernelBuilder,
    sm: &Softmax,
    s: &[[Reg<f32>; 4]],
    o: &[[Reg<f32>; 4]],
    c: Reg<f32>,
) {
    for h in 0..2 {
        let mut mx = k.mov(f32::NEG_INFINITY);
        for a in s {
            mx = k.max(mx, a[2 * h]);
            mx = k.max(mx, a[2 * h + 1]);
        }
        let mx = quad_reduce(k, mx, true);
        let mx = k.mul(mx, c);
        let mnew = k.max(sm.m[h], mx);
        let dm = k.sub(sm.m[h], mnew);
        let alpha = k.ex2(dm);
        k.mov_to(sm.m[h], mnew);
        let neg = k.neg(mnew);
        let mut sum = k.mov(0f32);
        for a in s {
            for e in [2 * h, 2 * h + 1] {
                let x = k.fma(a[e], c, neg);
                let p = k.ex2(x);
                k.mov_to(a[e], p);
                sum = k.add(sum, p);
            }
        }
        k.fma_to(sm.l[h], sm.l[h], alpha, sum);
        for a in o {
            k.mul_to(a[2 * h], a[2 * h], alpha);
            k.mul_to(a[2 * h + 1], a[2 * h + 1], alpha);
        }
    }
}

/// `o += P V` for a tile: P from the S accumulators (bn keys), V rows from `tv`.
pub(crate) fn pv_tile(
    k: &mut KernelBuilder,
    ln: &Lanes,
    p: &[[Reg<f32>; 4]],
    tv: &Tile,
    bn: u32,
    dv: u32,
    o: &[[Reg<f32>; 4]],
) {
    for kk in 0..bn / 16 {
        let a = acc_to_a(k, p[2 * kk as usize], p[2 * kk as usize + 1]);
        let b = ld_b_trans(k, ln, tv, 16 * kk, 0, dv / 8);
        for (n, bb) in b.iter().enumerate() {
            k.mma_to::<Mma>(o[n], a, *bb, o[n]);
        }
    }
}

/// O = acc / l (bf16) and LSE = (m + log2 l) ln 2 for this lane's valid rows; `out_row(row)`
/// gives the global (token, head) row index.
pub(super) fn epilogue(
    k: &mut KernelBuilder,
    ln: &Lanes,
    sm: &Softmax,
    o: &[[Reg<f32>; 4]],
    rows: [Reg<u32>; 2],
    len: Reg<u32>,
    out_row: impl Fn(&mut KernelBuilder, Reg<u32>) -> Reg<u32>,
    op: GlobalPtr<u8>,
    lsep: GlobalPtr<f32>,
    dv: u32,
) {
    let col = k.shl(ln.q, 2u32); // bytes of column 2q
    let col64: Reg<u64> = k.cvt(col);
    let q_is0 = k.eq(ln.q, 0u32);
    for h in 0..2 {
        let ok = k.lt(rows[h], len);
        let l = quad_reduce(k, sm.l[h], false);
        let inv = k.rcp(l);
        let gr = out_row(k, rows[h]);
        let rp = wide_off(k, op.reg(), gr, dv * 2);
        let rp = k.add(rp, col64);
        k.if_(ok, |k| {
            for (n, a) in o.iter().enumerate() {
                let v0 = k.mul(a[2 * h], inv);
                let v1 = k.mul(a[2 * h + 1], inv);
                let w = k.cvt_bf16x2(v1, v0);
                let p = GlobalPtr::<u8>::from_reg(rp).add_bytes(16 * n as i64);
                k.st(p.cast::<Bf16x2>(), w);
            }
            let lg = k.lg2(l);
            let m = k.add(sm.m[h], lg);
            let lse = k.mul(m, std::f32::consts::LN_2);
            k.when(q_is0, |k| k.st(lsep.offset(gr), lse));
        });
    }
}

/// Runs the forward: O and LSE for every token of every sequence (`cu_seqlens` [batch+1],
/// validated on the host before launch).
///
/// On an sm_90a device this runs the `wgmma` variant, elsewhere the `mma.sync` one.
pub fn mla_attn_fwd(stream: &Stream, sh: &AttnShape, a: FwdArgs) -> Result<()> {
    let wgmma = crate::host::target_for(stream.device()).arch == "sm_90a";
    mla_attn_fwd_with(stream, sh, a, wgmma)
}

/// [`mla_attn_fwd`] choosing the variant (`wgmma` needs an sm_90a device). The `mma.sync`
/// launch is asynchronous; the `wgmma` one synchronises the stream before returning (its
/// tensor maps live in a buffer freed then).
pub fn mla_attn_fwd_with(stream: &Stream, sh: &AttnShape, a: FwdArgs, wgmma: bool) -> Result<()> {
    let spec = FwdSpec {
        d_qk: sh.d_qk as u32,
        d_v: sh.d_v as u32,
        wgmma,
        k_rope: sh.k_rope as u32,
    };
    let name = spec.name();
    sh.validate(&name)?;
    let cu = check_cu_seqlens(&name, a.cu_seqlens, sh.max_seqlen, sh.heads)?;
    let total = *cu.last().unwrap_or(&0) as usize;
    let batch = cu.len() - 1;
    need(&name, "q", a.q, total * sh.heads * sh.d_qk)?;
    let kdims = (total, sh.heads, sh.d_qk, sh.k_rope);
    check_k_buffers(&name, a.k, a.k_rope, kdims)?;
    need(&name, "v", a.v, total * sh.heads * sh.d_v)?;
    need(&name, "o", a.o, total * sh.heads * sh.d_v)?;
    need(&name, "lse", a.lse, total * sh.heads)?;
    if total == 0 || sh.max_seqlen == 0 {
        return Ok(());
    }
    if wgmma {
        return super::fwd90::launch(stream, &spec, sh, a, (total, batch));
    }
    let f = function(stream.device(), &name, "", |t| gen_fwd(t, &spec))?;
    let grid = [
        sh.max_seqlen.div_ceil(BM as usize) as u32,
        sh.heads as u32,
        batch as u32,
    ];
    let cfg = LaunchConfig::grid3(grid, [WARPS * 32, 1, 1]).shared(spec.shared_bytes());
    let c = sh.scale * LOG2E;
    stream.launch(
        &f,
        &cfg,
        &args![
            a.q,
            a.k,
            a.k_rope.unwrap_or(a.k),
            a.v,
            &*a.o,
            &*a.lse,
            a.cu_seqlens,
            sh.heads as u32,
            c
        ],
    )?;
    Ok(())
}
