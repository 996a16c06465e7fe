//! FP8 (E4M3) quantisation kernels of the DeepSeek-V3 recipe, their host wrappers and bit-exact
//! CPU references.
//!
//! - `fp8_quant_1x128_*`: per token, per 128 channels. x [T, H] (bf16 or f32, H % 128 == 0) ->
//!   q [T, H] e4m3 + scales [T, H/128] (f32; UE8M0: one byte each, rows padded to a multiple of
//!   4 bytes = DeepGEMM's packed-int32 layout). 16 threads per group, 8 elements (one or two
//!   16-byte loads) each; amax by `shfl.bfly` over the 16 lanes; one pass.
//! - `fp8_quant_128x128_*`: per 128x128 weight block. w [N, K] -> q [N, K] + scales
//!   [ceil(N/128), K/128]; one CTA (256 threads) per block holds its 64 values per thread in
//!   registers (one pass): warp amax, then a CTA max through shared memory.
//! - `fp8_dequant_1x128_{f32,bf16}`: q + 1x128 scales -> f32 / bf16.
//! - `fp8_requant_1x128_to_128x1_t`: q [T, H] with 1x128 scales -> q^T [H, T] with scales
//!   [H, T/128] (one scale per channel per 128 tokens): the backward-pass re-tiling. One CTA per
//!   128x128 tile staged in shared memory; thread c owns channel c.
//!
//! Scales: `s = max(amax, 1e-4) / 448` (`div.rn`), optionally rounded up to a power of two;
//! `q = cvt.rn.satfinite.e4m3(x * rcp.rn(s))`. References mirror these f32 operations exactly.

use crate::host::{check_target, fp8_ptx, function};
use crate::tile::*;
use crate::{shape_err, Result};
use builder::*;
use half::bf16;
use runtime::{args, Buffer, LaunchConfig, Pod, Stream};

pub use crate::tile::ScaleMode;

/// Targets of the quantisation kernels (e4m3 conversions need sm_89).
pub const QUANT_TARGETS: &[&str] = &["sm_89", "sm_90a"];

/// Element types the quantisers read.
pub trait QuantSrc: Pod {
    const NAME: &'static str;
    const IS_BF16: bool;
    fn to_f32(self) -> f32;
}
impl QuantSrc for bf16 {
    const NAME: &'static str = "bf16";
    const IS_BF16: bool = true;
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
}
impl QuantSrc for f32 {
    const NAME: &'static str = "f32";
    const IS_BF16: bool = false;
    fn to_f32(self) -> f32 {
        self
    }
}

/// Loads 8 consecutive source elements starting at word index `w` (16 bytes for bf16, 2x16 for f32).
pub(crate) fn load8(
    k: &mut KernelBuilder,
    x: GlobalPtr<B32>,
    w: Reg<u32>,
    bf: bool,
) -> [Reg<f32>; 8] {
    let p = k.addr(x.offset(w));
    if bf {
        let v: [Reg<B32>; 4] = k.ld_v_with(MemOpts::nc(), p);
        let mut out = Vec::new();
        for r in v {
            out.extend(bf16x2_to_f32(k, r));
        }
        out.try_into().unwrap_or_else(|_| unreachable!())
    } else {
        let pf = p.cast::<f32>();
        let a: [Reg<f32>; 4] = k.ld_v_with(MemOpts::nc(), pf);
        let b: [Reg<f32>; 4] = k.ld_v_with(MemOpts::nc(), pf.add_bytes(16));
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
}

/// Quantises 8 values with `inv` into two e4m3x4 words.
pub(crate) fn quant8(k: &mut KernelBuilder, v: &[Reg<f32>], inv: Reg<f32>) -> [Reg<B32>; 2] {
    let s: Vec<Reg<f32>> = v.iter().map(|&x| mul_rn(k, x, inv)).collect();
    [
        f32x4_to_e4m3x4(k, [s[0], s[1], s[2], s[3]]),
        f32x4_to_e4m3x4(k, [s[4], s[5], s[6], s[7]]),
    ]
}

/// Kernel name of the 1x128 quantiser.
pub fn quant_1x128_name(bf: bool, mode: ScaleMode) -> String {
    let m = match mode {
        ScaleMode::Float => "",
        ScaleMode::Pow2 => "_pow2",
        ScaleMode::Ue8m0 => "_ue8m0",
    };
    format!("fp8_quant_1x128_{}{m}", if bf { "bf16" } else { "f32" })
}

/// 1x128 quantiser: params (x, q, s, groups, groups_per_row, s_pitch); grid ceil(groups/16) x 256.
pub fn gen_quant_1x128(t: &Target, bf: bool, mode: ScaleMode) -> Result<ptx::Module> {
    let name = quant_1x128_name(bf, mode);
    check_target(&name, t, QUANT_TARGETS)?;
    let mut k = KernelBuilder::new(&name, fp8_ptx(t));
    k.reqntid(&[256]);
    let x = k.param_ptr_aligned::<B32>("x", 16);
    let q = k.param_ptr_aligned::<B32>("q", 8);
    let s32 = k.param_ptr_aligned::<f32>("s", 4);
    let groups = k.param::<u32>("groups");
    let gpr = k.param::<u32>("groups_per_row");
    let pitch = k.param::<u32>("s_pitch");
    let tid = k.tid_x();
    let cta = k.ctaid_x();
    let half = k.shr(tid, 4u32);
    let g = k.mad_lo(cta, 16u32, half);
    let sub = k.and(tid, 15u32);
    let valid = k.lt(g, groups);
    let last = k.sub(groups, 1u32);
    let gc = k.min(g, last);
    // word index of this thread's 8 elements
    let wpg = if bf { 64u32 } else { 128u32 };
    let base = k.mul(gc, wpg);
    let w = k.mad_lo(sub, wpg / 16, base);
    let v = load8(&mut k, x, w, bf);
    let amax = k.mov(0f32);
    amax_into(&mut k, amax, &v);
    let amax = warp_max(&mut k, amax, 16);
    let (sc, inv) = fp8_scale(&mut k, amax, mode);
    let words = quant8(&mut k, &v, inv);
    let qi = k.mul(g, 32u32);
    let qi = k.mad_lo(sub, 2u32, qi);
    k.when(valid, |k| k.st_v(q.offset(qi), words));
    let first = k.eq(sub, 0u32);
    let st = k.and(valid, first);
    let tok = k.div(g, gpr);
    let grp = k.rem(g, gpr);
    let si = k.mad_lo(tok, pitch, grp);
    if mode == ScaleMode::Ue8m0 {
        let b = ue8m0_byte(&mut k, sc);
        let s8 = s32.cast::<u8>();
        k.when(st, |k| k.st(s8.offset(si), b));
    } else {
        k.when(st, |k| k.st(s32.offset(si), sc));
    }
    Ok(k.finish()?)
}

/// Kernel name of the 128x128 block quantiser.
pub fn quant_128x128_name(bf: bool, mode: ScaleMode) -> String {
    let m = if mode == ScaleMode::Pow2 { "_pow2" } else { "" };
    format!("fp8_quant_128x128_{}{m}", if bf { "bf16" } else { "f32" })
}

/// 128x128 block quantiser: params (x, q, s, rows, cols); grid (cols/128, ceil(rows/128)) x 256.
pub fn gen_quant_128x128(t: &Target, bf: bool, mode: ScaleMode) -> Result<ptx::Module> {
    let name = quant_128x128_name(bf, mode);
    check_target(&name, t, QUANT_TARGETS)?;
    if mode == ScaleMode::Ue8m0 {
        return shape_err(
            &name,
            "UE8M0 scales are produced by the 1x128 quantiser only",
        );
    }
    let mut k = KernelBuilder::new(&name, fp8_ptx(t));
    k.reqntid(&[256]);
    let x = k.param_ptr_aligned::<B32>("x", 16);
    let q = k.param_ptr_aligned::<B32>("q", 8);
    let s = k.param_ptr_aligned::<f32>("s", 4);
    let rows = k.param::<u32>("rows");
    let cols = k.param::<u32>("cols");
    let red = k.shared_array::<f32>(8, 16);
    let tid = k.tid_x();
    let (bx, by) = (k.ctaid_x(), k.ctaid_y());
    let r0 = k.shr(tid, 4u32);
    let sub = k.and(tid, 15u32);
    let wpe = if bf { 2u32 } else { 1u32 }; // elements per source word
    let row_words = k.div(cols, wpe);
    let colw0 = k.mul(bx, 128 / wpe);
    let colw = k.mad_lo(sub, 8 / wpe, colw0);
    let row0 = k.mad_lo(by, 128u32, r0);
    let last = k.sub(rows, 1u32);
    let amax = k.mov(0f32);
    let mut vals = Vec::new();
    let mut valids = Vec::new();
    for p in 0..8u32 {
        let row = k.add(row0, p * 16);
        let valid = k.lt(row, rows);
        let rc = k.min(row, last);
        let w = k.mad_lo(rc, row_words, colw);
        let v = load8(&mut k, x, w, bf);
        let m = k.mov(0f32);
        amax_into(&mut k, m, &v);
        let m = k.selp(m, 0f32, valid);
        k.max_to(amax, amax, m);
        vals.push(v);
        valids.push((valid, row));
    }
    let wmax = warp_max(&mut k, amax, 32);
    let warp = k.shr(tid, 5u32);
    let lane = k.and(tid, 31u32);
    let l0 = k.eq(lane, 0u32);
    k.when(l0, |k| k.st(red.offset(warp), wmax));
    k.sync_threads();
    let all = k.mov(0f32);
    for i in 0..8 {
        let v = k.ld(red.at(i));
        k.max_to(all, all, v);
    }
    let (sc, inv) = fp8_scale(&mut k, all, mode);
    let qrow_words = k.shr(cols, 2u32);
    let qcol0 = k.mul(bx, 32u32);
    let qcol = k.mad_lo(sub, 2u32, qcol0);
    for (v, (valid, row)) in vals.iter().zip(valids) {
        let words = quant8(&mut k, v, inv);
        let qi = k.mad_lo(row, qrow_words, qcol);
        k.when(valid, |k| k.st_v(q.offset(qi), words));
    }
    let t0 = k.eq(tid, 0u32);
    let kb = k.shr(cols, 7u32);
    let si = k.mad_lo(by, kb, bx);
    k.when(t0, |k| k.st(s.offset(si), sc));
    Ok(k.finish()?)
}

/// Kernel name of the dequantiser.
pub fn dequant_name(out_bf16: bool) -> String {
    format!(
        "fp8_dequant_1x128_{}",
        if out_bf16 { "bf16" } else { "f32" }
    )
}

/// Dequantiser: params (q, s, out, groups); grid ceil(groups/16) x 256.
pub fn gen_dequant_1x128(t: &Target, out_bf16: bool) -> Result<ptx::Module> {
    let name = dequant_name(out_bf16);
    check_target(&name, t, QUANT_TARGETS)?;
    let mut k = KernelBuilder::new(&name, fp8_ptx(t));
    k.reqntid(&[256]);
    let q = k.param_ptr_aligned::<B32>("q", 8);
    let s = k.param_ptr_aligned::<f32>("s", 4);
    let out = k.param_ptr_aligned::<B32>("out", 16);
    let groups = k.param::<u32>("groups");
    let tid = k.tid_x();
    let cta = k.ctaid_x();
    let half = k.shr(tid, 4u32);
    let g = k.mad_lo(cta, 16u32, half);
    let sub = k.and(tid, 15u32);
    let valid = k.lt(g, groups);
    k.if_(valid, |k| {
        let sc = k.ld_nc(s.offset(g));
        let qb = k.mul(g, 32u32);
        let qi = k.mad_lo(sub, 2u32, qb);
        let w: [Reg<B32>; 2] = k.ld_v_with(MemOpts::nc(), q.offset(qi));
        let mut v = Vec::new();
        for r in w {
            for e in e4m3x4_to_f32(k, r) {
                v.push(mul_rn(k, e, sc));
            }
        }
        if out_bf16 {
            let ob = k.mul(g, 64u32);
            let oi = k.mad_lo(sub, 4u32, ob);
            let p: Vec<Reg<B32>> = (0..4)
                .map(|i| k.cvt_bf16x2(v[2 * i + 1], v[2 * i]).reinterpret())
                .collect();
            k.st_v(out.offset(oi), [p[0], p[1], p[2], p[3]]);
        } else {
            let ob = k.mul(g, 128u32);
            let oi = k.mad_lo(sub, 8u32, ob);
            let o = k.addr(out.cast::<f32>().offset(oi));
            k.st_v(o, [v[0], v[1], v[2], v[3]]);
            k.st_v(o.add_bytes(16), [v[4], v[5], v[6], v[7]]);
        }
    });
    Ok(k.finish()?)
}

/// Name of the transposing re-quantiser.
pub const REQUANT_T_NAME: &str = "fp8_requant_1x128_to_128x1_t";

/// 1x128 -> 128x1 transposing re-quantiser: params (q, s, qt, st, tokens, hidden);
/// grid (hidden/128, tokens/128) x 128.
pub fn gen_requant_t(t: &Target) -> Result<ptx::Module> {
    let name = REQUANT_T_NAME;
    check_target(name, t, QUANT_TARGETS)?;
    let mut k = KernelBuilder::new(name, fp8_ptx(t));
    k.reqntid(&[128]);
    let q = k.param_ptr_aligned::<B32>("q", 16);
    let s = k.param_ptr_aligned::<f32>("s", 4);
    let qt = k.param_ptr_aligned::<B32>("qt", 16);
    let st = k.param_ptr_aligned::<f32>("st", 4);
    let tokens = k.param::<u32>("tokens");
    let hidden = k.param::<u32>("hidden");
    let tile = k.shared_array::<B32>(128 * 32, 16);
    let ssc = k.shared_array::<f32>(128, 16);
    let tid = k.tid_x();
    let (bx, by) = (k.ctaid_x(), k.ctaid_y());
    let t0 = k.shl(by, 7u32);
    let hw = k.shr(hidden, 2u32); // words per source row
    let hb = k.shr(hidden, 7u32); // scale groups per source row
    let colw0 = k.shl(bx, 5u32);
    for i in 0..8u32 {
        let c = k.add(tid, i * 128);
        let row = k.shr(c, 3u32);
        let ch = k.and(c, 7u32);
        let trow = k.add(t0, row);
        let cw = k.mad_lo(ch, 4u32, colw0);
        let gw = k.mad_lo(trow, hw, cw);
        let v: [Reg<B32>; 4] = k.ld_v_with(MemOpts::nc(), q.offset(gw));
        let rw = k.shl(row, 5u32);
        let sw = k.mad_lo(ch, 4u32, rw);
        k.st_v(tile.offset(sw), v);
    }
    let trow = k.add(t0, tid);
    let si = k.mad_lo(trow, hb, bx);
    let sv = k.ld_nc(s.offset(si));
    k.st(ssc.offset(tid), sv);
    k.sync_threads();
    let bytes = tile.cast::<u8>();
    let col = k.addr(bytes.offset(tid));
    // pass 1: amax of channel `tid` over the 128 tokens
    let amax = k.mov(0f32);
    k.for_range(0u32, 128u32, 1u32, |k, t| {
        let off = k.shl(t, 7u32);
        let b = k.ld(col.offset(off));
        let e = e4m3_to_f32(k, b);
        let sct = k.ld(ssc.offset(t));
        let v = mul_rn(k, e, sct);
        amax_into(k, amax, &[v]);
    });
    let (sc, inv) = fp8_scale(&mut k, amax, ScaleMode::Float);
    // pass 2: quantise 16 tokens at a time into one 16-byte store
    let h = k.shl(bx, 7u32);
    let h = k.add(h, tid);
    let tw = k.shr(tokens, 2u32);
    let t0w = k.shl(by, 5u32);
    let ob = k.mad_lo(h, tw, t0w);
    k.for_range(0u32, 8u32, 1u32, |k, j| {
        let row16 = k.shl(j, 4u32);
        let jo = k.shl(j, 11u32);
        let cj = k.addr(col.offset(jo));
        let sj = k.addr(ssc.offset(row16));
        let mut v = Vec::new();
        for u in 0..16i64 {
            let b = k.ld(cj.add_bytes(u * 128));
            let e = e4m3_to_f32(k, b);
            let sct = k.ld(sj.at(u));
            let x = mul_rn(k, e, sct);
            v.push(mul_rn(k, x, inv));
        }
        let w: Vec<Reg<B32>> = (0..4)
            .map(|i| f32x4_to_e4m3x4(k, [v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]]))
            .collect();
        let oi = k.mad_lo(j, 4u32, ob);
        k.st_v(qt.offset(oi), [w[0], w[1], w[2], w[3]]);
    });
    let tb = k.shr(tokens, 7u32);
    let sti = k.mad_lo(h, tb, by);
    k.st(st.offset(sti), sc);
    Ok(k.finish()?)
}

// ---------------------------------------------------------------------------------------------
// host wrappers

pub(crate) fn need<T: Pod>(kernel: &str, what: &str, b: &Buffer<T>, len: usize) -> Result<()> {
    if b.len() < len {
        return shape_err(
            kernel,
            format!("`{what}` holds {} elements, needs {len}", b.len()),
        );
    }
    Ok(())
}

fn check_1x128(kernel: &str, tokens: usize, hidden: usize) -> Result<usize> {
    if hidden == 0 || hidden % 128 != 0 {
        return shape_err(
            kernel,
            format!("hidden = {hidden} must be a positive multiple of 128"),
        );
    }
    let groups = tokens * hidden / 128;
    if groups > u32::MAX as usize / 128 {
        return shape_err(kernel, "tensor too large for 32-bit indexing");
    }
    Ok(groups)
}

fn launch_1x128<T: QuantSrc, S: Pod>(
    stream: &Stream,
    x: &Buffer<T>,
    q: &mut Buffer<u8>,
    s: &mut Buffer<S>,
    tokens: usize,
    hidden: usize,
    mode: ScaleMode,
    pitch: usize,
) -> Result<()> {
    let name = quant_1x128_name(T::IS_BF16, mode);
    let groups = check_1x128(&name, tokens, hidden)?;
    need(&name, "x", x, tokens * hidden)?;
    need(&name, "q", q, tokens * hidden)?;
    need(&name, "s", s, tokens * pitch)?;
    if groups == 0 {
        return Ok(());
    }
    let f = function(stream.device(), &name, "", |t| {
        gen_quant_1x128(t, T::IS_BF16, mode)
    })?;
    let cfg = LaunchConfig::linear(groups.div_ceil(16) as u32, 256);
    stream.launch(
        &f,
        &cfg,
        &args![
            x,
            &*q,
            &*s,
            groups as u32,
            (hidden / 128) as u32,
            pitch as u32
        ],
    )?;
    Ok(())
}

/// 1x128 quantisation of x [tokens, hidden] (bf16 or f32) into q [tokens, hidden] e4m3 and
/// f32 scales s [tokens, hidden/128]. `mode` is [`ScaleMode::Float`] or [`ScaleMode::Pow2`].
pub fn quantize_fp8_1x128<T: QuantSrc>(
    stream: &Stream,
    x: &Buffer<T>,
    q: &mut Buffer<u8>,
    s: &mut Buffer<f32>,
    tokens: usize,
    hidden: usize,
    mode: ScaleMode,
) -> Result<()> {
    if mode == ScaleMode::Ue8m0 {
        return shape_err(
            &quant_1x128_name(T::IS_BF16, mode),
            "UE8M0 scales are bytes: use quantize_fp8_1x128_ue8m0",
        );
    }
    launch_1x128(stream, x, q, s, tokens, hidden, mode, hidden / 128)
}

/// Row pitch (bytes) of UE8M0 scales: hidden/128 rounded up to 4 (packed-int32 layout).
pub fn ue8m0_pitch(hidden: usize) -> usize {
    (hidden / 128).div_ceil(4) * 4
}

/// 1x128 quantisation with power-of-two scales stored as UE8M0 bytes s [tokens, ue8m0_pitch(hidden)].
pub fn quantize_fp8_1x128_ue8m0<T: QuantSrc>(
    stream: &Stream,
    x: &Buffer<T>,
    q: &mut Buffer<u8>,
    s: &mut Buffer<u8>,
    tokens: usize,
    hidden: usize,
) -> Result<()> {
    launch_1x128(
        stream,
        x,
        q,
        s,
        tokens,
        hidden,
        ScaleMode::Ue8m0,
        ue8m0_pitch(hidden),
    )
}

/// 128x128 block quantisation of w [rows, cols] (cols % 128 == 0) into q [rows, cols] and scales
/// [ceil(rows/128), cols/128].
pub fn quantize_fp8_128x128<T: QuantSrc>(
    stream: &Stream,
    w: &Buffer<T>,
    q: &mut Buffer<u8>,
    s: &mut Buffer<f32>,
    rows: usize,
    cols: usize,
    mode: ScaleMode,
) -> Result<()> {
    let name = quant_128x128_name(T::IS_BF16, mode);
    if cols == 0 || cols % 128 != 0 {
        return shape_err(
            &name,
            format!("cols = {cols} must be a positive multiple of 128"),
        );
    }
    if rows * cols >= u32::MAX as usize {
        return shape_err(&name, "tensor too large for 32-bit indexing");
    }
    need(&name, "w", w, rows * cols)?;
    need(&name, "q", q, rows * cols)?;
    need(&name, "s", s, rows.div_ceil(128) * cols / 128)?;
    if rows == 0 {
        return Ok(());
    }
    let f = function(stream.device(), &name, "", |t| {
        gen_quant_128x128(t, T::IS_BF16, mode)
    })?;
    let cfg = LaunchConfig::grid3(
        [(cols / 128) as u32, rows.div_ceil(128) as u32, 1],
        [256, 1, 1],
    );
    stream.launch(&f, &cfg, &args![w, &*q, &*s, rows as u32, cols as u32])?;
    Ok(())
}

/// Dequantisation of q [tokens, hidden] with 1x128 f32 scales into f32 (`T = f32`) or bf16.
pub fn dequantize_fp8_1x128<T: QuantSrc>(
    stream: &Stream,
    q: &Buffer<u8>,
    s: &Buffer<f32>,
    out: &mut Buffer<T>,
    tokens: usize,
    hidden: usize,
) -> Result<()> {
    let name = dequant_name(T::IS_BF16);
    let groups = check_1x128(&name, tokens, hidden)?;
    need(&name, "q", q, tokens * hidden)?;
    need(&name, "s", s, groups)?;
    need(&name, "out", out, tokens * hidden)?;
    if groups == 0 {
        return Ok(());
    }
    let f = function(stream.device(), &name, "", |t| {
        gen_dequant_1x128(t, T::IS_BF16)
    })?;
    let cfg = LaunchConfig::linear(groups.div_ceil(16) as u32, 256);
    stream.launch(&f, &cfg, &args![q, s, &*out, groups as u32])?;
    Ok(())
}

/// Re-tiles 1x128-quantised activations q [tokens, hidden] (scales [tokens, hidden/128]) into
/// the transposed 128x1 form qt [hidden, tokens] with scales st [hidden, tokens/128]
/// (tokens and hidden multiples of 128).
pub fn requantize_fp8_1x128_to_128x1_t(
    stream: &Stream,
    q: &Buffer<u8>,
    s: &Buffer<f32>,
    qt: &mut Buffer<u8>,
    st: &mut Buffer<f32>,
    tokens: usize,
    hidden: usize,
) -> Result<()> {
    let name = REQUANT_T_NAME;
    if tokens % 128 != 0 || hidden % 128 != 0 {
        return shape_err(name, format!("tokens = {tokens} and hidden = {hidden} must be multiples of 128 (pad the token dimension)"));
    }
    if tokens * hidden >= u32::MAX as usize {
        return shape_err(name, "tensor too large for 32-bit indexing");
    }
    need(name, "q", q, tokens * hidden)?;
    need(name, "s", s, tokens * hidden / 128)?;
    need(name, "qt", qt, tokens * hidden)?;
    need(name, "st", st, tokens * hidden / 128)?;
    if tokens == 0 || hidden == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", gen_requant_t)?;
    let cfg = LaunchConfig::grid3(
        [(hidden / 128) as u32, (tokens / 128) as u32, 1],
        [128, 1, 1],
    );
    stream.launch(
        &f,
        &cfg,
        &args![q, s, &*qt, &*st, tokens as u32, hidden as u32],
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// CPU references (the same f32 operations as the kernels, so results are bit-identical)

fn q8(x: f32) -> u8 {
    e4m3_satfinite(x)
}

/// f32 -> e4m3 with round-to-nearest-even and `satfinite` (what `cvt.rn.satfinite.e4m3x2.f32`
/// does per element), by bit arithmetic: the host quantisers run it for every weight, and the
/// emulator's general float encoder ([`emu::fp::f32_to_e4m3`]) costs several times more (the
/// emulator's own `cvt` fast path, `emu::alu::e4m3_satfinite`, does the same for kernels).
/// Non-finite inputs take the general encoder. Bit-identical to it (test
/// `e4m3_satfinite_matches_the_emulator`).
pub fn e4m3_satfinite(x: f32) -> u8 {
    if !x.is_finite() {
        return emu::fp::f32_to_e4m3(x, true);
    }
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = f32::from_bits(bits & 0x7fff_ffff);
    let code = if a >= 448.0 {
        0x7e // the largest finite e4m3 (satfinite clamps everything above)
    } else if a < 2f32.powi(-6) {
        // subnormals are the multiples of 2^-9 (a * 512 is exact); 8 is the smallest normal
        (a * 512.0).round_ties_even() as u8
    } else {
        // normal: exponent field and the top 3 mantissa bits, rounded to nearest even on the
        // 20 dropped bits (a carry moves into the exponent); f32 bias 127, e4m3 bias 7
        let ab = a.to_bits();
        let r = (ab + 0x7ffff + ((ab >> 20) & 1)) >> 20;
        (r - (120 << 3)) as u8
    };
    sign | code
}

/// Reference 1x128 quantisation: (q, scales as f32, one per group, row-major [tokens, hidden/128]).
pub fn ref_quant_1x128(
    x: &[f32],
    tokens: usize,
    hidden: usize,
    mode: ScaleMode,
) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![0u8; tokens * hidden];
    let mut s = vec![0f32; tokens * hidden / 128];
    for (g, chunk) in x[..tokens * hidden].chunks(128).enumerate() {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (sc, inv) = fp8_scale_host(amax, mode);
        s[g] = sc;
        for (i, v) in chunk.iter().enumerate() {
            q[g * 128 + i] = q8(v * inv);
        }
    }
    (q, s)
}

/// Reference 128x128 block quantisation: (q, scales [ceil(rows/128), cols/128]).
pub fn ref_quant_128x128(
    w: &[f32],
    rows: usize,
    cols: usize,
    mode: ScaleMode,
) -> (Vec<u8>, Vec<f32>) {
    let (rb, cb) = (rows.div_ceil(128), cols / 128);
    let mut q = vec![0u8; rows * cols];
    let mut s = vec![0f32; rb * cb];
    for bi in 0..rb {
        for bj in 0..cb {
            let rr = bi * 128..(bi * 128 + 128).min(rows);
            let mut amax = 0f32;
            for r in rr.clone() {
                for c in bj * 128..bj * 128 + 128 {
                    amax = amax.max(w[r * cols + c].abs());
                }
            }
            let (sc, inv) = fp8_scale_host(amax, mode);
            s[bi * cb + bj] = sc;
            for r in rr {
                for c in bj * 128..bj * 128 + 128 {
                    q[r * cols + c] = q8(w[r * cols + c] * inv);
                }
            }
        }
    }
    (q, s)
}

/// Reference dequantisation (f32 products, as the kernel computes them).
pub fn ref_dequant_1x128(q: &[u8], s: &[f32], tokens: usize, hidden: usize) -> Vec<f32> {
    (0..tokens * hidden)
        .map(|i| emu::fp::e4m3_to_f32(q[i]) * s[i / 128])
        .collect()
}

/// Reference transposing re-quantisation: (qt [hidden, tokens], st [hidden, tokens/128]).
pub fn ref_requant_t(q: &[u8], s: &[f32], tokens: usize, hidden: usize) -> (Vec<u8>, Vec<f32>) {
    let deq = ref_dequant_1x128(q, s, tokens, hidden);
    let tb = tokens / 128;
    let mut qt = vec![0u8; tokens * hidden];
    let mut st = vec![0f32; hidden * tb];
    for h in 0..hidden {
        for b in 0..tb {
            let amax = (0..128).fold(0f32, |m, i| m.max(deq[(b * 128 + i) * hidden + h].abs()));
            let (sc, inv) = fp8_scale_host(amax, ScaleMode::Float);
            st[h * tb + b] = sc;
            for i in 0..128 {
                let t = b * 128 + i;
                qt[h * tokens + t] = q8(deq[t * hidden + h] * inv);
            }
        }
    }
    (qt, st)
}

#[cfg(test)]
mod e4m3_tests {
    use super::e4m3_satfinite;

    fn check(bits: u32) {
        let x = f32::from_bits(bits);
        let (got, want) = (e4m3_satfinite(x), emu::fp::f32_to_e4m3(x, true));
        assert_eq!(got, want, "x = {x:e} ({bits:#010x})");
    }

    /// Every exponent with every pattern of the top 8 mantissa bits and several low-bit tails
    /// (exact halfway points, just below and above them, sticky bits), both signs, plus a
    /// strided sweep over all 2^32 bit patterns (NaN and infinities included).
    #[test]
    fn e4m3_satfinite_matches_the_emulator() {
        for sign in [0u32, 1 << 31] {
            for exp in 0u32..256 {
                for top in 0u32..256 {
                    for tail in [0u32, 1, 0x2aaa, 0x3fff, 0x4000, 0x4001, 0x7fff] {
                        check(sign | (exp << 23) | (top << 15) | tail);
                    }
                }
            }
        }
        let mut b = 0u64;
        while b < 1u64 << 32 {
            check(b as u32);
            b += 997;
        }
    }
}
