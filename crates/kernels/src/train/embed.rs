//! Token embedding: gather forward and deterministic scatter-add backward.
//!
//! - `embed_fwd_{bf16,f32}`: out[t, :] = table[ids[t], :]; one warp per token (4 per 128-thread
//!   CTA), 16-byte word copies (bit-exact).
//! - `embed_bwd_{bf16,f32}` (by the type of dout): dtable[v, :] += sum over the tokens t with
//!   ids[t] == v of dout[t, :], into an FP32 table gradient. Sort-free and atomic-free: the host
//!   builds a CSR of token positions per id ([`TokenBatch::new`], ids are host data: one pass
//!   over them), and one warp owns each id present in the batch, adding its tokens in ascending
//!   position order, so the result is bitwise deterministic; rows of ids absent from the batch are
//!   never touched.
//!
//! Ids are validated on the host against the vocabulary before anything is launched.
//! Limits: H a positive multiple of 8, vocab * H and tokens * H < 2^32.

use super::*;
use crate::host::{check_target, function};
use crate::reference as r;
use rand::Rng;
use runtime::{args, LaunchConfig};
use std::time::Instant;

pub fn fwd_name(bf: bool) -> &'static str {
    if bf {
        "embed_fwd_bf16"
    } else {
        "embed_fwd_f32"
    }
}
pub fn bwd_name(bf: bool) -> &'static str {
    if bf {
        "embed_bwd_bf16"
    } else {
        "embed_bwd_f32"
    }
}

/// Table shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbedSpec {
    pub vocab: usize,
    pub hidden: usize,
}

impl EmbedSpec {
    fn validate(&self, kernel: &str) -> Result<()> {
        if self.hidden == 0 || self.hidden % 8 != 0 {
            return shape_err(
                kernel,
                format!("hidden = {} must be a positive multiple of 8", self.hidden),
            );
        }
        fits_u32(kernel, self.vocab.saturating_mul(self.hidden))
    }
}

/// Token ids of a batch on the device, validated on the host, with the CSR of positions per id.
pub struct TokenBatch {
    pub ids: Buffer<i32>,
    pub tokens: usize,
    /// Distinct ids present, ascending.
    uniq: Buffer<i32>,
    /// starts[u]..starts[u+1] index `positions` for uniq[u].
    starts: Buffer<u32>,
    positions: Buffer<i32>,
    nuniq: usize,
    spec: EmbedSpec,
}

impl TokenBatch {
    pub fn new(dev: &Device, ids: &[i32], spec: &EmbedSpec) -> Result<TokenBatch> {
        let name = fwd_name(true);
        spec.validate(name)?;
        fits_u32(name, ids.len().saturating_mul(spec.hidden))?;
        if let Some((t, id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &i)| i < 0 || i as usize >= spec.vocab)
        {
            return shape_err(
                name,
                format!(
                    "token {t} has id {id}, outside the vocabulary [0, {})",
                    spec.vocab
                ),
            );
        }
        // counting sort by id: stable, so positions stay ascending within an id
        let mut count = std::collections::BTreeMap::<i32, u32>::new();
        for &i in ids {
            *count.entry(i).or_default() += 1;
        }
        let uniq: Vec<i32> = count.keys().copied().collect();
        let mut starts = Vec::with_capacity(uniq.len() + 1);
        let mut next = std::collections::HashMap::new();
        let mut acc = 0u32;
        for (&id, &c) in &count {
            starts.push(acc);
            next.insert(id, acc as usize);
            acc += c;
        }
        starts.push(acc);
        let mut positions = vec![0i32; ids.len()];
        for (t, id) in ids.iter().enumerate() {
            if let Some(slot) = next.get_mut(id) {
                positions[*slot] = t as i32;
                *slot += 1;
            }
        }
        Ok(TokenBatch {
            ids: dev.upload(ids)?,
            tokens: ids.len(),
            uniq: dev.upload(&uniq)?,
            starts: dev.upload(&starts)?,
            positions: dev.upload(&positions)?,
            nuniq: uniq.len(),
            spec: *spec,
        })
    }
    pub fn spec(&self) -> &EmbedSpec {
        &self.spec
    }
}

/// This warp's index (4 warps per CTA) and lane.
fn warp_index(k: &mut KernelBuilder) -> (Reg<u32>, Reg<u32>) {
    let tid = k.tid_x();
    let warp = k.shr(tid, 5u32);
    let lane = k.and(tid, 31u32);
    let cta = k.ctaid_x();
    (k.mad_lo(cta, 4u32, warp), lane)
}

/// Gather: params (table, ids, out, tokens, h); grid ceil(tokens/4) x 128.
pub fn gen_embed_fwd(t: &Target, bf: bool) -> Result<ptx::Module> {
    let name = fwd_name(bf);
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[128]);
    let table = k.param_ptr_aligned::<B32>("table", 16);
    let ids = k.param_ptr_aligned::<i32>("ids", 4);
    let out = k.param_ptr_aligned::<B32>("out", 16);
    let tokens = k.param::<u32>("tokens");
    let h = k.param::<u32>("h");
    let (tok, lane) = warp_index(&mut k);
    let valid = k.lt(tok, tokens);
    // words per 8 elements: 4 (bf16) or 8 (f32)
    let wsh = if bf { 1u32 } else { 0u32 };
    k.if_(valid, |k| {
        let id: Reg<u32> = k.ld_nc(ids.offset(tok)).reinterpret();
        let hw = k.shr(h, wsh);
        let src = k.mul(id, hw);
        let dst = k.mul(tok, hw);
        let c0 = k.shl(lane, 3u32 - wsh);
        k.for_range(c0, hw, 256u32 >> wsh, |k, c| {
            for half in 0..(2 - wsh) {
                let o = half * 4;
                let si = k.add(src, c);
                let si = k.add(si, o);
                let v: [Reg<B32>; 4] = k.ld_v_with(MemOpts::nc(), table.offset(si));
                let di = k.add(dst, c);
                let di = k.add(di, o);
                k.st_v(out.offset(di), v);
            }
        });
    });
    Ok(k.finish()?)
}

/// Scatter-add: params (dout, uniq, starts, positions, dtable, nuniq, h); grid ceil(nuniq/4) x 128.
pub fn gen_embed_bwd(t: &Target, bf: bool) -> Result<ptx::Module> {
    let name = bwd_name(bf);
    check_target(name, t, TRAIN_TARGETS)?;
    let mut k = KernelBuilder::new(name, t.clone());
    k.reqntid(&[128]);
    let dout = k.param_ptr_aligned::<B32>("dout", 16);
    let uniq = k.param_ptr_aligned::<i32>("uniq", 4);
    let starts = k.param_ptr_aligned::<u32>("starts", 4);
    let positions = k.param_ptr_aligned::<i32>("positions", 4);
    let dtable = k.param_ptr_aligned::<f32>("dtable", 16);
    let nuniq = k.param::<u32>("nuniq");
    let h = k.param::<u32>("h");
    let (u, lane) = warp_index(&mut k);
    let valid = k.lt(u, nuniq);
    k.if_(valid, |k| {
        let id: Reg<u32> = k.ld_nc(uniq.offset(u)).reinterpret();
        let s0 = k.ld_nc(starts.offset(u));
        let u1 = k.add(u, 1u32);
        let s1 = k.ld_nc(starts.offset(u1));
        let row = k.mul(id, h);
        let c0 = k.shl(lane, 3u32);
        k.for_range(c0, h, 256u32, |k, c| {
            let di = k.add(row, c);
            let a = k.addr(dtable.offset(di));
            let x: [Reg<f32>; 4] = k.ld_v(a);
            let y: [Reg<f32>; 4] = k.ld_v(a.add_bytes(16));
            let acc = [x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3]];
            k.for_range(s0, s1, 1u32, |k, j| {
                let t: Reg<u32> = k.ld_nc(positions.offset(j)).reinterpret();
                let ti = k.mad_lo(t, h, c);
                let d = load8_any(k, dout, ti, bf);
                for e in 0..8 {
                    k.add_to(acc[e], acc[e], d[e]);
                }
            });
            k.st_v(a, [acc[0], acc[1], acc[2], acc[3]]);
            k.st_v(a.add_bytes(16), [acc[4], acc[5], acc[6], acc[7]]);
        });
    });
    Ok(k.finish()?)
}

// ---------------------------------------------------------------------------------------------
// host wrappers

/// Gather: out [tokens, H] = table [vocab, H] rows of the batch's ids (bf16 or f32).
pub fn embed_fwd<T: Elem>(
    stream: &Stream,
    batch: &TokenBatch,
    table: &Buffer<T>,
    out: &mut Buffer<T>,
) -> Result<()> {
    let name = fwd_name(T::IS_BF16);
    let sp = batch.spec;
    need(name, "table", table, sp.vocab * sp.hidden)?;
    need(name, "out", out, batch.tokens * sp.hidden)?;
    if batch.tokens == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", |t| gen_embed_fwd(t, T::IS_BF16))?;
    let a = args![
        table,
        &batch.ids,
        &*out,
        batch.tokens as u32,
        sp.hidden as u32
    ];
    stream.launch(
        &f,
        &LaunchConfig::linear(batch.tokens.div_ceil(4) as u32, 128),
        &a,
    )?;
    Ok(())
}

/// Scatter-add backward: dtable [vocab, H] f32 += the batch's dout [tokens, H] rows summed per
/// id (deterministic; rows of absent ids untouched).
pub fn embed_bwd<T: Elem>(
    stream: &Stream,
    batch: &TokenBatch,
    dout: &Buffer<T>,
    dtable: &mut Buffer<f32>,
) -> Result<()> {
    let name = bwd_name(T::IS_BF16);
    let sp = batch.spec;
    need(name, "dout", dout, batch.tokens * sp.hidden)?;
    need(name, "dtable", dtable, sp.vocab * sp.hidden)?;
    if batch.nuniq == 0 {
        return Ok(());
    }
    let f = function(stream.device(), name, "", |t| gen_embed_bwd(t, T::IS_BF16))?;
    let a = args![
        dout,
        &batch.uniq,
        &batch.starts,
        &batch.positions,
        &*dtable,
        batch.nuniq as u32,
        sp.hidden as u32
    ];
    stream.launch(
        &f,
        &LaunchConfig::linear(batch.nuniq.div_ceil(4) as u32, 128),
        &a,
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// checks

/// Random ids: ids drawn from the first half of the vocabulary (so repeats are common and some
/// rows are absent).
fn random_ids(rg: &mut impl Rng, tokens: usize, vocab: usize) -> Vec<i32> {
    (0..tokens)
        .map(|_| rg.gen_range(0..vocab.div_ceil(2)) as i32)
        .collect()
}

/// Gather on random tables and ids (output poisoned): bit-exact.
pub fn check_fwd(
    stream: &Stream,
    tokens: usize,
    vocab: usize,
    h: usize,
    bf: bool,
    seed: u64,
) -> Result<OpCheck> {
    if bf {
        run_fwd::<bf16>(stream, tokens, EmbedSpec { vocab, hidden: h }, seed)
    } else {
        run_fwd::<f32>(stream, tokens, EmbedSpec { vocab, hidden: h }, seed)
    }
}

fn run_fwd<T: Elem>(stream: &Stream, tokens: usize, sp: EmbedSpec, seed: u64) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let table: Vec<T> = r::random_activations(&mut rg, sp.vocab * sp.hidden, sp.hidden)
        .into_iter()
        .map(T::from_f32)
        .collect();
    let ids = random_ids(&mut rg, tokens, sp.vocab);
    let batch = TokenBatch::new(&dev, &ids, &sp)?;
    let tb = dev.upload(&table)?;
    let mut out = poisoned(&dev, tokens * sp.hidden, T::from_f32(f32::NAN))?;
    let t0 = Instant::now();
    embed_fwd(stream, &batch, &tb, &mut out)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let got = out.to_vec()?;
    let mut c = OpCheck::default();
    for (t, &id) in ids.iter().enumerate() {
        let src = &table[id as usize * sp.hidden..][..sp.hidden];
        let dst = &got[t * sp.hidden..][..sp.hidden];
        c.mismatches += src
            .iter()
            .zip(dst)
            .filter(|(a, b)| a.to_f64().to_bits() != b.to_f64().to_bits())
            .count();
    }
    Ok(c.finish(stream, seconds))
}

/// Scatter-add on random dout into a random (non-zero) table gradient, against f64 sums:
/// each touched element within (count + 2) 2^-24 (|initial| + sum |terms|); untouched rows
/// bitwise unchanged.
pub fn check_bwd(
    stream: &Stream,
    tokens: usize,
    vocab: usize,
    h: usize,
    bf: bool,
    seed: u64,
) -> Result<OpCheck> {
    if bf {
        run_bwd::<bf16>(stream, tokens, EmbedSpec { vocab, hidden: h }, seed)
    } else {
        run_bwd::<f32>(stream, tokens, EmbedSpec { vocab, hidden: h }, seed)
    }
}

fn run_bwd<T: Elem>(stream: &Stream, tokens: usize, sp: EmbedSpec, seed: u64) -> Result<OpCheck> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let h = sp.hidden;
    let dout: Vec<T> = r::random_activations(&mut rg, tokens * h, h)
        .into_iter()
        .map(T::from_f32)
        .collect();
    let init: Vec<f32> = (0..sp.vocab * h)
        .map(|_| rg.gen_range(-1.0f32..1.0))
        .collect();
    let ids = random_ids(&mut rg, tokens, sp.vocab);
    let batch = TokenBatch::new(&dev, &ids, &sp)?;
    let db = dev.upload(&dout)?;
    let mut dt = dev.upload(&init)?;
    let t0 = Instant::now();
    embed_bwd(stream, &batch, &db, &mut dt)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let got = dt.to_vec()?;
    let mut want: Vec<f64> = init.iter().map(|v| f64::from(*v)).collect();
    let mut mag: Vec<f64> = want.iter().map(|v| v.abs()).collect();
    let mut count = vec![0usize; sp.vocab];
    for (t, &id) in ids.iter().enumerate() {
        count[id as usize] += 1;
        for j in 0..h {
            let d = dout[t * h + j].to_f64();
            want[id as usize * h + j] += d;
            mag[id as usize * h + j] += d.abs();
        }
    }
    let mut c = OpCheck::default();
    for v in 0..sp.vocab {
        for j in 0..h {
            let i = v * h + j;
            if count[v] == 0 {
                c.mismatches += (got[i].to_bits() != init[i].to_bits()) as usize;
            } else {
                let bound = (count[v] as f64 + 2.0) * 2f64.powi(-24) * mag[i] + 1e-30;
                c.bound(f64::from(got[i]), want[i], bound);
            }
        }
    }
    Ok(c.finish(stream, seconds))
}
