//! MoE expert-layer kernels around the grouped GEMMs (DeepSeek-V3 style, rows in the contiguous
//! layout: `m_indices[row] < 0` marks a padding row):
//!
//! - `swiglu_fwd_fp8`: act = silu(gate) * up from gu [m, 2I] bf16 (gate columns 0..I, up I..2I),
//!   quantised 1x128 into e4m3 act_q [m, I] + power-of-two scales act_s [m, I/128] (the input of
//!   the down-projection GEMM). 16 lanes per 128-value group, 8 values each (16-byte loads of
//!   gate and up), amax by `shfl.bfly`.
//! - `swiglu_bwd_fp8`: from gu, dh `[m, I]` and the routing weight row_w `[m]`:
//!   dG = dh * up * silu'(gate), dU = dh * silu(gate); writes dGU = [dG | dU] quantised 1x128
//!   (dgrad GEMM input), row_w * dGU in bf16 (weight-gradient input) and the recomputed,
//!   weighted activation row_w * silu(gate) * up in bf16 (input of dW_down). Same team layout,
//!   two amax reductions per team.
//! - `fp8_quant_1x128_t_bf16_pow2`: x [m, C] bf16 -> q [C, m] e4m3 + scales [C, m/128]: 1x128
//!   groups along the token dimension of the transpose ("128x1 tiles"), the K-major operands of
//!   the K-grouped weight-gradient GEMM. One CTA per 128x128 tile: coalesced 16-byte loads into
//!   shared memory, thread c owns column c (amax pass + quantise pass over shared), the e4m3
//!   bytes go back through a swizzled shared tile so the stores are coalesced 16-byte rows too.
//!
//! Scales are powers of two: `s = pow2_roundup(max(amax, 1e-4) / 448)` exactly as
//! `quantize_fp8_1x128(.., ScaleMode::Pow2)`, except that an all-zero group (every padding row)
//! gets s = 1.0. Values: `cvt.rn.satfinite.e4m3x2.f32(x * (1/s))` (exact: 1/s is a power of two).
//! SiLU: e = ex2.approx(-g log2 e), s = rcp.approx(1 + e), silu = g * s (f32).
//! Padding rows never read their gu / dh / row_w values into any result: outputs are 0, scales 1.

use crate::host::{check_target, fp8_ptx, function};
use crate::quant::{load8, need, quant8};
use crate::reference as r;
use crate::tile::*;
use crate::{shape_err, Result};
use builder::*;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use runtime::{args, Arg, Buffer, LaunchConfig, Stream};
use std::time::Instant;

/// Targets (e4m3 conversions need sm_89).
pub const MOE_TARGETS: &[&str] = &["sm_89", "sm_90a"];
/// Kernel names.
pub const SWIGLU_FWD_NAME: &str = "swiglu_fwd_fp8";
pub const SWIGLU_BWD_NAME: &str = "swiglu_bwd_fp8";
pub const QUANT_T_NAME: &str = "fp8_quant_1x128_t_bf16_pow2";

const LOG2E: f32 = std::f32::consts::LOG2_E;

/// Power-of-two FP8 scale and its inverse from a group amax; 1.0 for an all-zero group.
pub fn pow2_scale(k: &mut KernelBuilder, amax: Reg<f32>) -> (Reg<f32>, Reg<f32>) {
    let (s, inv) = fp8_scale(k, amax, ScaleMode::Pow2);
    let z = k.eq(amax, 0f32);
    let s = k.selp(1f32, s, z);
    let inv = k.selp(1f32, inv, z);
    (s, inv)
}

/// CPU mirror of [`pow2_scale`] (bit-identical).
pub fn pow2_scale_host(amax: f32) -> (f32, f32) {
    if amax == 0.0 {
        (1.0, 1.0)
    } else {
        fp8_scale_host(amax, ScaleMode::Pow2)
    }
}

/// (sigmoid(g), silu(g)) in f32: `e = ex2.approx(-g*log2e)`, `s = rcp.approx(1 + e)`, `g * s`.
fn sigmoid_silu(k: &mut KernelBuilder, g: Reg<f32>) -> (Reg<f32>, Reg<f32>) {
    let t = k.mul(g, -LOG2E);
    let e = k.ex2(t);
    let den = k.add(e, 1f32);
    let s = k.rcp_approx(den);
    let silu = k.mul(g, s);
    (s, silu)
}

/// A team of 16 lanes owns one 128-wide group (row, block) of the I columns.
struct Team {
    g: Reg<u32>,
    sub: Reg<u32>,
    valid: Reg<Pred>,
    row: Reg<u32>,
    blk: Reg<u32>,
    pad: Reg<Pred>,
}

fn team(k: &mut KernelBuilder, groups: Reg<u32>, gpr: Reg<u32>, idx: GlobalPtr<i32>) -> Team {
    let tid = k.tid_x();
    let cta = k.ctaid_x();
    let half = k.shr(tid, 4u32);
    let g = k.mad_lo(cta, 16u32, half);
    let sub = k.and(tid, 15u32);
    let valid = k.lt(g, groups);
    let last = k.sub(groups, 1u32);
    let gc = k.min(g, last);
    let row = k.div(gc, gpr);
    let blk = k.rem(gc, gpr);
    let e = k.ld_nc(idx.offset(row));
    let pad = k.lt(e, 0i32);
    Team {
        g,
        sub,
        valid,
        row,
        blk,
        pad,
    }
}

/// Word (b32) index of this lane's 8 gate values in gu [m, 2I] (bf16): row * I/2 + blk*64 + sub*4.
fn gate_word(k: &mut KernelBuilder, t: &Team, gpr: Reg<u32>) -> Reg<u32> {
    let rw = k.mul(t.row, gpr);
    let w = k.shl(rw, 7u32);
    let w = k.mad_lo(t.blk, 64u32, w);
    k.mad_lo(t.sub, 4u32, w)
}

/// Packs 8 f32 into 4 bf16x2 words (element 2i in the low half).
fn pack_bf16x8(k: &mut KernelBuilder, v: &[Reg<f32>]) -> [Reg<B32>; 4] {
    std::array::from_fn(|i| k.cvt_bf16x2(v[2 * i + 1], v[2 * i]).reinterpret())
}

/// SwiGLU forward + FP8 1x128 quantisation: params (gu, m_indices, act_q, act_s, groups,
/// groups_per_row); groups = m*I/128, grid ceil(groups/16) x 256.
pub fn gen_swiglu_fwd(t: &Target) -> Result<ptx::Module> {
    let name = SWIGLU_FWD_NAME;
    check_target(name, t, MOE_TARGETS)?;
    let mut k = KernelBuilder::new(name, fp8_ptx(t));
    k.reqntid(&[256]);
    let gu = k.param_ptr_aligned::<B32>("gu", 16);
    let idx = k.param_ptr_aligned::<i32>("m_indices", 4);
    let q = k.param_ptr_aligned::<B32>("act_q", 8);
    let s = k.param_ptr_aligned::<f32>("act_s", 4);
    let groups = k.param::<u32>("groups");
    let gpr = k.param::<u32>("groups_per_row");
    let tm = team(&mut k, groups, gpr, idx);
    let gw = gate_word(&mut k, &tm, gpr);
    let half_row = k.shl(gpr, 6u32);
    let uw = k.add(gw, half_row);
    let gate = load8(&mut k, gu, gw, true);
    let up = load8(&mut k, gu, uw, true);
    let mut act = Vec::new();
    for i in 0..8 {
        let (_, silu) = sigmoid_silu(&mut k, gate[i]);
        let a = k.mul(silu, up[i]);
        act.push(k.selp(0f32, a, tm.pad));
    }
    let amax = k.mov(0f32);
    amax_into(&mut k, amax, &act);
    let amax = warp_max(&mut k, amax, 16);
    let (sc, inv) = pow2_scale(&mut k, amax);
    let words = quant8(&mut k, &act, inv);
    let qb = k.mul(tm.g, 32u32);
    let qi = k.mad_lo(tm.sub, 2u32, qb);
    k.when(tm.valid, |k| k.st_v(q.offset(qi), words));
    let first = k.eq(tm.sub, 0u32);
    let st = k.and(tm.valid, first);
    k.when(st, |k| k.st(s.offset(tm.g), sc));
    Ok(k.finish()?)
}

/// SwiGLU backward: params (gu, dh, row_w, m_indices, dgu_q, dgu_s, dgu_w, act_w, groups,
/// groups_per_row); groups = m*I/128, grid ceil(groups/16) x 256.
pub fn gen_swiglu_bwd(t: &Target) -> Result<ptx::Module> {
    let name = SWIGLU_BWD_NAME;
    check_target(name, t, MOE_TARGETS)?;
    let mut k = KernelBuilder::new(name, fp8_ptx(t));
    k.reqntid(&[256]);
    let gu = k.param_ptr_aligned::<B32>("gu", 16);
    let dh = k.param_ptr_aligned::<B32>("dh", 16);
    let roww = k.param_ptr_aligned::<f32>("row_w", 4);
    let idx = k.param_ptr_aligned::<i32>("m_indices", 4);
    let q = k.param_ptr_aligned::<B32>("dgu_q", 8);
    let s = k.param_ptr_aligned::<f32>("dgu_s", 4);
    let dguw = k.param_ptr_aligned::<B32>("dgu_w", 16);
    let actw = k.param_ptr_aligned::<B32>("act_w", 16);
    let groups = k.param::<u32>("groups");
    let gpr = k.param::<u32>("groups_per_row");
    let tm = team(&mut k, groups, gpr, idx);
    let gw = gate_word(&mut k, &tm, gpr);
    let half_row = k.shl(gpr, 6u32);
    let uw = k.add(gw, half_row);
    // dh / act_w [m, I]: word g*64 + sub*4
    let db = k.mul(tm.g, 64u32);
    let dw = k.mad_lo(tm.sub, 4u32, db);
    let last = k.sub(groups, 1u32);
    let gcl = k.min(tm.g, last);
    let dbc = k.mul(gcl, 64u32);
    let dwc = k.mad_lo(tm.sub, 4u32, dbc);
    let gate = load8(&mut k, gu, gw, true);
    let up = load8(&mut k, gu, uw, true);
    let d = load8(&mut k, dh, dwc, true);
    let w = k.ld_nc(roww.offset(tm.row));
    let w = k.selp(0f32, w, tm.pad);
    let (mut dg, mut du, mut act) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..8 {
        let (sg, silu) = sigmoid_silu(&mut k, gate[i]);
        let one_m_s = k.sub(1f32, sg);
        let t1 = k.fma(gate[i], one_m_s, 1f32);
        let dsilu = k.mul(sg, t1);
        let dxu = k.mul(d[i], up[i]);
        let vg = k.mul(dxu, dsilu);
        let vu = k.mul(d[i], silu);
        let va = k.mul(silu, up[i]);
        dg.push(k.selp(0f32, vg, tm.pad));
        du.push(k.selp(0f32, vu, tm.pad));
        act.push(k.selp(0f32, va, tm.pad));
    }
    let ag = k.mov(0f32);
    amax_into(&mut k, ag, &dg);
    let ag = warp_max(&mut k, ag, 16);
    let au = k.mov(0f32);
    amax_into(&mut k, au, &du);
    let au = warp_max(&mut k, au, 16);
    let (sg, ig) = pow2_scale(&mut k, ag);
    let (su, iu) = pow2_scale(&mut k, au);
    let wg = quant8(&mut k, &dg, ig);
    let wu = quant8(&mut k, &du, iu);
    // dgu_q [m, 2I] e4m3: row * I/2 + blk*32 + sub*2 words; the up half I/4 words further
    let rw = k.mul(tm.row, gpr);
    let qb = k.shl(rw, 6u32);
    let qb = k.mad_lo(tm.blk, 32u32, qb);
    let qg = k.mad_lo(tm.sub, 2u32, qb);
    let qoff = k.shl(gpr, 5u32);
    let qu = k.add(qg, qoff);
    // weighted bf16 outputs
    let wdg: Vec<Reg<f32>> = dg.iter().map(|&v| k.mul(w, v)).collect();
    let wdu: Vec<Reg<f32>> = du.iter().map(|&v| k.mul(w, v)).collect();
    let wact: Vec<Reg<f32>> = act.iter().map(|&v| k.mul(w, v)).collect();
    let pg = pack_bf16x8(&mut k, &wdg);
    let pu = pack_bf16x8(&mut k, &wdu);
    let pa = pack_bf16x8(&mut k, &wact);
    k.when(tm.valid, |k| {
        k.st_v(q.offset(qg), wg);
        k.st_v(q.offset(qu), wu);
        k.st_v(dguw.offset(gw), pg);
        k.st_v(dguw.offset(uw), pu);
        k.st_v(actw.offset(dw), pa);
    });
    // dgu_s [m, 2I/128]: row*2*gpr + blk, up half gpr further
    let si = k.shl(rw, 1u32);
    let si = k.add(si, tm.blk);
    let siu = k.add(si, gpr);
    let first = k.eq(tm.sub, 0u32);
    let st = k.and(tm.valid, first);
    k.when(st, |k| {
        k.st(s.offset(si), sg);
        k.st(s.offset(siu), su);
    });
    Ok(k.finish()?)
}

/// Transposing 1x128 quantiser: params (x, m_indices (0 = none), q, s, m, c);
/// grid (c/128, m/128) x 128, 32 KiB static shared.
pub fn gen_quant_t(t: &Target) -> Result<ptx::Module> {
    let name = QUANT_T_NAME;
    check_target(name, t, MOE_TARGETS)?;
    let mut k = KernelBuilder::new(name, fp8_ptx(t));
    k.reqntid(&[128]);
    let x = k.param_ptr_aligned::<B32>("x", 16);
    let idx = k.param_ptr_aligned::<i32>("m_indices", 4);
    let q = k.param_ptr_aligned::<B32>("q", 16);
    let s = k.param_ptr_aligned::<f32>("s", 4);
    let m = k.param::<u32>("m");
    let c = k.param::<u32>("c");
    // 128 rows x 256 bytes (bf16); later reused for the 128 x 128-byte e4m3 tile
    let tile = k.shared_array::<B32>(128 * 64, 16);
    let tid = k.tid_x();
    let (bx, by) = (k.ctaid_x(), k.ctaid_y());
    let r0 = k.shl(by, 7u32);
    let use_idx = k.ne(idx.reg(), 0u64);
    // ---- stage: thread loads 16-byte chunk (tid & 15) of rows (tid >> 4) + 8i
    let cw = k.shr(c, 1u32); // words per source row
    let chunk = k.and(tid, 15u32);
    let rsub = k.shr(tid, 4u32);
    let colw = k.shl(bx, 6u32);
    let colw = k.mad_lo(chunk, 4u32, colw);
    let c4 = k.shl(chunk, 2u32);
    let sw0 = k.mad_lo(rsub, 64u32, c4);
    let sbase = k.addr(tile.offset(sw0));
    let grow0 = k.add(r0, rsub);
    for i in 0..16u32 {
        let grow = k.add(grow0, 8 * i);
        let gw = k.mad_lo(grow, cw, colw);
        let v: [Reg<B32>; 4] = k.ld_v_with(MemOpts::nc(), x.offset(gw));
        let e = k.mov(0i32);
        k.when(use_idx, |k| {
            let ev = k.ld_nc(idx.offset(grow));
            k.mov_to(e, ev);
        });
        let pad = k.lt(e, 0i32);
        let v: [Reg<B32>; 4] = std::array::from_fn(|j| {
            let w: Reg<u32> = v[j].reinterpret();
            k.selp(0u32, w, pad).reinterpret()
        });
        k.st_v(sbase.add_bytes(i64::from(i * 8 * 256)), v);
    }
    k.sync_threads();
    // ---- pass 1: amax of column `tid` over the 128 rows
    let col = k.addr(tile.cast::<u16>().offset(tid));
    let bf = |k: &mut KernelBuilder, h: Reg<u16>| -> Reg<f32> {
        let w: Reg<u32> = k.cvt(h);
        let w = k.shl(w, 16u32);
        k.bitcast(w)
    };
    let amax = k.mov(0f32);
    k.for_range(0u32, 16u32, 1u32, |k, r8| {
        let off = k.shl(r8, 10u32); // 8 rows of 128 u16
        let p = k.addr(col.offset(off));
        for u in 0..8i64 {
            let h = k.ld(p.add_bytes(u * 256));
            let f = bf(k, h);
            amax_into(k, amax, &[f]);
        }
    });
    let (sc, inv) = pow2_scale(&mut k, amax);
    // ---- pass 2: quantise the column into 32 words (128 e4m3, row order)
    let mut words = Vec::new();
    for j in 0..32i64 {
        let v: Vec<Reg<f32>> = (0..4)
            .map(|u| {
                let h = k.ld(col.add_bytes((4 * j + u) * 256));
                let f = bf(&mut k, h);
                mul_rn(&mut k, f, inv)
            })
            .collect();
        words.push(f32x4_to_e4m3x4(&mut k, [v[0], v[1], v[2], v[3]]));
    }
    k.sync_threads();
    // ---- output tile row `tid` (= q row bx*128 + tid), swizzled 16-byte chunks
    let bytes = tile.cast::<u8>();
    for j in 0..8u32 {
        let jr = k.mov(j);
        let off = swz_reg(&mut k, tid, jr);
        let p = bytes.offset(off).cast::<B32>();
        k.st_v(
            p,
            [
                words[4 * j as usize],
                words[4 * j as usize + 1],
                words[4 * j as usize + 2],
                words[4 * j as usize + 3],
            ],
        );
    }
    k.sync_threads();
    // ---- coalesced copy-out: thread handles chunk (tid & 7) of tile rows (tid >> 3) + 16i
    let orow0 = k.shr(tid, 3u32);
    let ch = k.and(tid, 7u32);
    let soff = swz_reg(&mut k, orow0, ch);
    let sp = k.addr(bytes.offset(soff)).cast::<B32>();
    let mw = k.shr(m, 2u32); // words per q row
    let qrow = k.shl(bx, 7u32);
    let qrow = k.add(qrow, orow0);
    let qw0 = k.shl(by, 5u32);
    let qw0 = k.mad_lo(ch, 4u32, qw0);
    let qw = k.mad_lo(qrow, mw, qw0);
    let step = k.shl(mw, 4u32); // 16 rows
    for i in 0..8u32 {
        let v: [Reg<B32>; 4] = k.ld_v(sp.add_bytes(i64::from(i * 16 * 128)));
        let qi = k.mad_lo(step, i, qw);
        k.st_v(q.offset(qi), v);
    }
    // ---- scale of (column, token block)
    let mb = k.shr(m, 7u32);
    let ccol = k.shl(bx, 7u32);
    let ccol = k.add(ccol, tid);
    let si = k.mad_lo(ccol, mb, by);
    k.st(s.offset(si), sc);
    Ok(k.finish()?)
}

// ---------------------------------------------------------------------------------------------
// host wrappers

fn check_mi(kernel: &str, m: usize, i: usize) -> Result<usize> {
    if i == 0 || i % 128 != 0 {
        return shape_err(
            kernel,
            format!("i = {i} (intermediate size) must be a positive multiple of 128"),
        );
    }
    if m.saturating_mul(2 * i) >= u32::MAX as usize {
        return shape_err(kernel, "tensor too large for 32-bit indexing");
    }
    Ok(m * i / 128)
}

/// SwiGLU forward fused with FP8 1x128 quantisation: gu [m, 2I] bf16 (gate columns 0..I, up
/// columns I..2I), m_indices `[m]` (< 0 = padding row) -> act_q `[m, I]` e4m3 and power-of-two
/// scales act_s [m, I/128] of act = silu(gate) * up (f32). Padding rows: bytes 0, scales 1.0.
pub fn swiglu_fwd_fp8(
    stream: &Stream,
    gu: &Buffer<bf16>,
    m_indices: &Buffer<i32>,
    act_q: &mut Buffer<u8>,
    act_s: &mut Buffer<f32>,
    m: usize,
    i: usize,
) -> Result<()> {
    let name = SWIGLU_FWD_NAME;
    let groups = check_mi(name, m, i)?;
    need(name, "gu", gu, m * 2 * i)?;
    need(name, "m_indices", m_indices, m)?;
    need(name, "act_q", act_q, m * i)?;
    need(name, "act_s", act_s, groups)?;
    if m == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", gen_swiglu_fwd)?;
    let cfg = LaunchConfig::linear(groups.div_ceil(16) as u32, 256);
    stream.launch(
        &f,
        &cfg,
        &args![
            gu,
            m_indices,
            &*act_q,
            &*act_s,
            groups as u32,
            (i / 128) as u32
        ],
    )?;
    Ok(())
}

/// SwiGLU backward. Inputs gu [m, 2I] bf16, dh `[m, I]` bf16 (gradient of act), row_w `[m]` f32
/// (routing weight of each row), m_indices `[m]`. With s = sigmoid(g):
/// dG = dh * u * s * (1 + g (1 - s)), dU = dh * silu(g). Outputs:
/// dgu_q [m, 2I] e4m3 + dgu_s [m, 2I/128] = 1x128 power-of-two quantisation of [dG | dU]
/// (unweighted), dgu_w [m, 2I] bf16 = row_w * [dG | dU], act_w [m, I] bf16 = row_w * silu(g) * u.
/// Padding rows: every output 0, scales 1.0; their gu / dh / row_w are never used.
pub fn swiglu_bwd(
    stream: &Stream,
    gu: &Buffer<bf16>,
    dh: &Buffer<bf16>,
    row_w: &Buffer<f32>,
    m_indices: &Buffer<i32>,
    dgu_q: &mut Buffer<u8>,
    dgu_s: &mut Buffer<f32>,
    dgu_w: &mut Buffer<bf16>,
    act_w: &mut Buffer<bf16>,
    m: usize,
    i: usize,
) -> Result<()> {
    let name = SWIGLU_BWD_NAME;
    let groups = check_mi(name, m, i)?;
    need(name, "gu", gu, m * 2 * i)?;
    need(name, "dh", dh, m * i)?;
    need(name, "row_w", row_w, m)?;
    need(name, "m_indices", m_indices, m)?;
    need(name, "dgu_q", dgu_q, m * 2 * i)?;
    need(name, "dgu_s", dgu_s, 2 * groups)?;
    need(name, "dgu_w", dgu_w, m * 2 * i)?;
    need(name, "act_w", act_w, m * i)?;
    if m == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", gen_swiglu_bwd)?;
    let cfg = LaunchConfig::linear(groups.div_ceil(16) as u32, 256);
    stream.launch(
        &f,
        &cfg,
        &args![
            gu,
            dh,
            row_w,
            m_indices,
            &*dgu_q,
            &*dgu_s,
            &*dgu_w,
            &*act_w,
            groups as u32,
            (i / 128) as u32
        ],
    )?;
    Ok(())
}

/// Transposed 1x128 quantisation ("128x1 tiles"): x [m, c] bf16 row-major ->
/// q `[c, m]` e4m3 with `q[col][row] = e4m3(x[row][col] / s[col][row/128])` and power-of-two scales
/// s `[c, m/128]` from the amax of `x[128b .. 128b+128][col]`. Rows with m_indices < 0 count as
/// zeros (their x is never used). m and c must be multiples of 128.
pub fn quantize_fp8_1x128_t(
    stream: &Stream,
    x: &Buffer<bf16>,
    m_indices: Option<&Buffer<i32>>,
    q: &mut Buffer<u8>,
    s: &mut Buffer<f32>,
    m: usize,
    c: usize,
) -> Result<()> {
    let name = QUANT_T_NAME;
    if m % 128 != 0 || c % 128 != 0 {
        return shape_err(
            name,
            format!("m = {m} and c = {c} must be multiples of 128 (pad the token dimension)"),
        );
    }
    if m.saturating_mul(c) >= u32::MAX as usize {
        return shape_err(name, "tensor too large for 32-bit indexing");
    }
    need(name, "x", x, m * c)?;
    if let Some(ib) = m_indices {
        need(name, "m_indices", ib, m)?;
    }
    need(name, "q", q, m * c)?;
    need(name, "s", s, m * c / 128)?;
    if m == 0 || c == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", gen_quant_t)?;
    let cfg = LaunchConfig::grid3([(c / 128) as u32, (m / 128) as u32, 1], [128, 1, 1]);
    let idx_arg = match m_indices {
        Some(b) => Arg::from(b),
        None => Arg::Ptr(0),
    };
    let mut a = args![x];
    a.push(idx_arg);
    a.extend(args![&*q, &*s, m as u32, c as u32]);
    stream.launch(&f, &cfg, &a)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// CPU references

/// f64 SwiGLU pieces of one (g, u): (sigmoid, silu).
pub fn sigmoid_silu_f64(g: f64) -> (f64, f64) {
    let s = 1.0 / (1.0 + (-g).exp());
    (s, g * s)
}

/// Bit-exact reference of [`quantize_fp8_1x128_t`] (the kernel does exact f32 operations):
/// (q [c, m], s [c, m/128]).
pub fn ref_quant_t(x: &[f32], idx: Option<&[i32]>, m: usize, c: usize) -> (Vec<u8>, Vec<f32>) {
    let mb = m / 128;
    let mut q = vec![0u8; m * c];
    let mut s = vec![0f32; c * mb];
    let val = |r: usize, col: usize| -> f32 {
        if idx.is_some_and(|ix| ix[r] < 0) {
            0.0
        } else {
            x[r * c + col]
        }
    };
    for col in 0..c {
        for b in 0..mb {
            let amax = (0..128).fold(0f32, |a, i| a.max(val(b * 128 + i, col).abs()));
            let (sc, inv) = pow2_scale_host(amax);
            s[col * mb + b] = sc;
            for i in 0..128 {
                let r = b * 128 + i;
                q[col * m + r] = emu::fp::f32_to_e4m3(val(r, col) * inv, true);
            }
        }
    }
    (q, s)
}

/// Half an e4m3 ulp at |v| (in the scaled domain; subnormals below 2^-6 have ulp 2^-9).
pub fn e4m3_half_ulp(v: f64) -> f64 {
    let v = v.abs().max(2f64.powi(-6));
    2f64.powf(v.log2().floor() - 3.0) / 2.0
}

/// Relative f32 slack of the SwiGLU kernels for gate value g (ex2.approx of a rounded argument
/// loses ~|g| 2^-24 relative): applied to the sum of the magnitudes of the terms.
pub fn swiglu_eps(g: f64) -> f64 {
    1e-5 + 2e-7 * g.abs()
}

/// Result of checking FP8 1x128 output against f64 values with error bounds.
#[derive(Clone, Debug, Default)]
pub struct Fp8Check {
    /// Elements outside their bound + scales outside the allowed set + padding outputs that are
    /// not exactly 0 / 1.0.
    pub mismatches: usize,
    /// Groups whose f64 amax interval straddles a power-of-two boundary (either scale accepted).
    pub boundary_groups: usize,
    /// Largest |got - want| / bound over the elements (<= 1 passes).
    pub worst: f64,
    /// Relative Frobenius error of the dequantised output (information).
    pub rel_fro: f64,
}

/// Checks one set of 1x128 groups. `want[g][j]` are the f64 values (with `mag[g][j]` the sum of
/// the magnitudes of their terms and `eps[g][j]` the relative slack), `q[g][j]` the e4m3 bytes,
/// `s[g]` the scales, `pad[g]` = group of a padding row (q must be 0, s exactly 1.0).
/// Element bound: |q*s - want| <= half_ulp_e4m3(|want|(1+eps)/s) * s + eps * mag.
/// Scale: the pow2 rule applied to max(|want| -/+ eps*mag) gives [lo, hi]; s must be lo or hi.
pub fn check_fp8_groups(
    q: &dyn Fn(usize, usize) -> u8,
    s: &dyn Fn(usize) -> f32,
    want: &dyn Fn(usize, usize) -> (f64, f64, f64),
    pad: &dyn Fn(usize) -> bool,
    groups: usize,
) -> Fp8Check {
    let mut c = Fp8Check::default();
    let (mut num, mut den) = (0f64, 0f64);
    for g in 0..groups {
        let sg = s(g);
        if pad(g) {
            let bad = (0..128).filter(|&j| q(g, j) != 0).count();
            c.mismatches += bad + (sg.to_bits() != 1f32.to_bits()) as usize;
            continue;
        }
        let (mut lo, mut hi) = (0f64, 0f64);
        for j in 0..128 {
            let (w, mag, eps) = want(g, j);
            lo = lo.max(w.abs() - eps * mag);
            hi = hi.max(w.abs() + eps * mag);
        }
        let s_lo = pow2_scale_host(lo as f32).0;
        let s_hi = pow2_scale_host(hi as f32).0;
        if s_lo != s_hi {
            c.boundary_groups += 1;
        }
        if !(sg == s_lo || sg == s_hi) {
            c.mismatches += 1;
        }
        let s64 = sg as f64;
        for j in 0..128 {
            let (w, mag, eps) = want(g, j);
            let got = emu::fp::e4m3_to_f32(q(g, j)) as f64 * s64;
            let bound = e4m3_half_ulp(w.abs() * (1.0 + eps) / s64) * s64 + eps * mag;
            let err = (got - w).abs();
            let ratio = if err.is_nan() {
                f64::INFINITY
            } else {
                err / bound
            };
            c.worst = c.worst.max(ratio);
            if ratio > 1.0 {
                c.mismatches += 1;
            }
            num += (got - w) * (got - w);
            den += w * w;
        }
    }
    c.rel_fro = if den > 0.0 {
        (num / den).sqrt()
    } else {
        num.sqrt()
    };
    c
}

/// Bound check of bf16 outputs: |got - want| <= 2^-8 |want| (1+eps) + eps * mag + 1e-30 (half a
/// bf16 ulp, the f32 slack, and an absolute floor for values beyond the f32 range of exp).
/// Returns (mismatches, worst ratio).
pub fn check_bf16(got: bf16, want: f64, mag: f64, eps: f64) -> (usize, f64) {
    let g = got.to_f64();
    let bound = 2f64.powi(-8) * want.abs() * (1.0 + eps) + eps * mag + 1e-30;
    let err = (g - want).abs();
    let ratio = if err.is_nan() {
        f64::INFINITY
    } else {
        err / bound
    };
    ((ratio > 1.0) as usize, ratio)
}

/// Outcome of a MoE kernel check (see [`check_swiglu_fwd`], [`check_swiglu_bwd`], [`check_quant_t`]).
#[derive(Clone, Debug, Default)]
pub struct MoeCheck {
    pub mismatches: usize,
    pub boundary_groups: usize,
    /// Worst error / bound ratio (bounded kernels; 0 for bit-exact).
    pub worst: f64,
    /// Relative Frobenius error of the (dequantised) FP8 output (information).
    pub rel_fro: f64,
    pub seconds: f64,
    pub lane_instructions: Option<u64>,
}

/// Random m_indices for `m` rows: about one row in four is padding (-1; never row 0), the rest
/// experts 0..8.
pub fn random_pad_indices(rg: &mut StdRng, m: usize) -> Vec<i32> {
    (0..m)
        .map(|row| {
            if row > 0 && rg.gen_range(0..4) == 0 {
                -1
            } else {
                rg.gen_range(0..8)
            }
        })
        .collect()
}

/// Garbage for padding rows: NaN, +-Inf and huge finite bf16 values.
fn garbage(rg: &mut StdRng) -> bf16 {
    match rg.gen_range(0..4) {
        0 => bf16::from_bits(0x7fc0),
        1 => bf16::INFINITY,
        2 => bf16::NEG_INFINITY,
        _ => bf16::from_f32(3e38),
    }
}

/// Random bf16 [rows, cols] (per-row magnitudes and outliers, see
/// [`r::random_activations`]) with padding rows overwritten by garbage.
pub fn random_bf16_rows(rg: &mut StdRng, rows: usize, cols: usize, idx: &[i32]) -> Vec<bf16> {
    let v = r::random_activations(rg, rows * cols, cols);
    let mut out: Vec<bf16> = v.iter().map(|x| bf16::from_f32(*x)).collect();
    for row in 0..rows {
        if idx[row] < 0 {
            for x in &mut out[row * cols..(row + 1) * cols] {
                *x = garbage(rg);
            }
        }
    }
    out
}

/// Runs [`swiglu_fwd_fp8`] on random inputs (padding rows hold garbage, outputs poisoned) and
/// checks it against the f64 reference with the bounds of [`check_fp8_groups`].
pub fn check_swiglu_fwd(stream: &Stream, m: usize, i: usize, seed: u64) -> Result<MoeCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let idx = random_pad_indices(&mut rg, m);
    let gu = random_bf16_rows(&mut rg, m, 2 * i, &idx);
    let gub = dev.upload(&gu)?;
    let ib = dev.upload(&idx)?;
    let mut q = dev.alloc::<u8>((m * i).max(1))?;
    q.fill(0xff)?;
    let mut s = dev.alloc::<f32>((m * i / 128).max(1))?;
    s.fill(f32::NAN)?;
    let t0 = Instant::now();
    swiglu_fwd_fp8(stream, &gub, &ib, &mut q, &mut s, m, i)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let (qv, sv) = (q.to_vec()?, s.to_vec()?);
    let gpr = i / 128;
    let want = |g: usize, j: usize| {
        let (row, col) = (g / gpr, (g % gpr) * 128 + j);
        let gv = gu[row * 2 * i + col].to_f64();
        let uv = gu[row * 2 * i + i + col].to_f64();
        let w = sigmoid_silu_f64(gv).1 * uv;
        (w, w.abs(), swiglu_eps(gv))
    };
    let c = check_fp8_groups(
        &|g, j| qv[g * 128 + j],
        &|g| sv[g],
        &want,
        &|g| idx[g / gpr] < 0,
        m * gpr,
    );
    Ok(MoeCheck {
        mismatches: c.mismatches,
        boundary_groups: c.boundary_groups,
        worst: c.worst,
        rel_fro: c.rel_fro,
        seconds,
        lane_instructions: stream.last_stats().map(|st| st.lane_instructions),
    })
}

/// Runs [`swiglu_bwd`] on random inputs (padding rows: garbage gu / dh and a NaN row weight;
/// outputs poisoned) against the f64 reference: FP8 dGU with [`check_fp8_groups`], the bf16
/// outputs with [`check_bf16`], padding outputs exactly 0 (scales 1.0).
pub fn check_swiglu_bwd(stream: &Stream, m: usize, i: usize, seed: u64) -> Result<MoeCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let idx = random_pad_indices(&mut rg, m);
    let gu = random_bf16_rows(&mut rg, m, 2 * i, &idx);
    let dh = random_bf16_rows(&mut rg, m, i, &idx);
    let roww: Vec<f32> = idx
        .iter()
        .map(|&e| {
            if e < 0 {
                f32::NAN
            } else {
                rg.gen_range(0.01f32..1.0)
            }
        })
        .collect();
    let (gub, dhb, wb, ib) = (
        dev.upload(&gu)?,
        dev.upload(&dh)?,
        dev.upload(&roww)?,
        dev.upload(&idx)?,
    );
    let n2 = (m * 2 * i).max(1);
    let mut q = dev.alloc::<u8>(n2)?;
    q.fill(0xff)?;
    let mut s = dev.alloc::<f32>((m * 2 * i / 128).max(1))?;
    s.fill(f32::NAN)?;
    let poison = bf16::from_bits(0x7fc1);
    let mut dw = dev.alloc::<bf16>(n2)?;
    dw.fill(poison)?;
    let mut aw = dev.alloc::<bf16>((m * i).max(1))?;
    aw.fill(poison)?;
    let t0 = Instant::now();
    swiglu_bwd(
        stream, &gub, &dhb, &wb, &ib, &mut q, &mut s, &mut dw, &mut aw, m, i,
    )?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let lane_instructions = stream.last_stats().map(|st| st.lane_instructions);
    let (qv, sv, dwv, awv) = (q.to_vec()?, s.to_vec()?, dw.to_vec()?, aw.to_vec()?);
    // f64 values per (row, column of [dG | dU]) and per (row, column of act)
    let pieces = |row: usize, col: usize| {
        let gv = gu[row * 2 * i + col].to_f64();
        let uv = gu[row * 2 * i + i + col].to_f64();
        let d = dh[row * i + col].to_f64();
        let (sg, silu) = sigmoid_silu_f64(gv);
        let dsil = sg * (1.0 + gv * (1.0 - sg));
        let dg = d * uv * dsil;
        let dg_mag = (d * uv).abs() * sg * (1.0 + gv.abs() * (1.0 - sg));
        let du = d * silu;
        let act = silu * uv;
        (dg, dg_mag, du, act, swiglu_eps(gv))
    };
    let gpr2 = 2 * i / 128;
    let want = |g: usize, j: usize| {
        let (row, col) = (g / gpr2, (g % gpr2) * 128 + j);
        let (dg, dg_mag, du, _, eps) = pieces(row, col % i);
        if col < i {
            (dg, dg_mag, eps)
        } else {
            (du, du.abs(), eps)
        }
    };
    let c = check_fp8_groups(
        &|g, j| qv[g * 128 + j],
        &|g| sv[g],
        &want,
        &|g| idx[g / gpr2] < 0,
        m * gpr2,
    );
    let mut mismatches = c.mismatches;
    let mut worst = c.worst;
    for row in 0..m {
        let w = roww[row] as f64;
        for col in 0..i {
            if idx[row] < 0 {
                mismatches += [
                    dwv[row * 2 * i + col],
                    dwv[row * 2 * i + i + col],
                    awv[row * i + col],
                ]
                .iter()
                .filter(|x| x.to_bits() != 0)
                .count();
                continue;
            }
            let (dg, dg_mag, du, act, eps) = pieces(row, col);
            for (got, want, mag) in [
                (dwv[row * 2 * i + col], w * dg, w * dg_mag),
                (dwv[row * 2 * i + i + col], w * du, (w * du).abs()),
                (awv[row * i + col], w * act, (w * act).abs()),
            ] {
                let (bad, ratio) = check_bf16(got, want, mag, eps);
                mismatches += bad;
                worst = worst.max(ratio);
            }
        }
    }
    Ok(MoeCheck {
        mismatches,
        boundary_groups: c.boundary_groups,
        worst,
        rel_fro: c.rel_fro,
        seconds,
        lane_instructions,
    })
}

/// Runs [`quantize_fp8_1x128_t`] (with random padding rows holding garbage when `with_idx`, and
/// for m >= 256 an all-padding last 128-row block) against [`ref_quant_t`]: bit-exact.
pub fn check_quant_t(
    stream: &Stream,
    m: usize,
    c: usize,
    with_idx: bool,
    seed: u64,
) -> Result<MoeCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let mut idx = if with_idx {
        random_pad_indices(&mut rg, m)
    } else {
        vec![0; m]
    };
    if with_idx && m >= 256 {
        // one all-padding 128-row block: its scales must be 1.0
        idx[m - 128..].fill(-1);
    }
    let x = random_bf16_rows(&mut rg, m, c, &idx);
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let (qw, sw) = ref_quant_t(&xf, with_idx.then_some(&idx[..]), m, c);
    let xb = dev.upload(&x)?;
    let ib = dev.upload(&idx)?;
    let mut q = dev.alloc::<u8>((m * c).max(1))?;
    q.fill(0xff)?;
    let mut s = dev.alloc::<f32>((m * c / 128).max(1))?;
    s.fill(f32::NAN)?;
    let t0 = Instant::now();
    quantize_fp8_1x128_t(stream, &xb, with_idx.then_some(&ib), &mut q, &mut s, m, c)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let (qv, sv) = (q.to_vec()?, s.to_vec()?);
    let mismatches = qv[..m * c].iter().zip(&qw).filter(|(a, b)| a != b).count()
        + sv[..c * m / 128]
            .iter()
            .zip(&sw)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
    Ok(MoeCheck {
        mismatches,
        seconds,
        lane_instructions: stream.last_stats().map(|st| st.lane_instructions),
        ..Default::default()
    })
}
