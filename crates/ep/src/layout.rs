//! Dispatch layout: for each token its destination ranks and nodes, tokens per rank / node /
//! expert, the token-in-rank mask, and the slot of every (token, k) copy inside its expert's
//! segment (the order in which a source rank's copies of one expert land at the destination).
//!
//! `ep_layout`: one thread per token, a 64-bit rank mask in a register (at most 64 ranks),
//! `red.add` into the per-rank / per-node / per-expert counters. `ep_slots`: one thread per
//! expert scans the tokens in order, so slots are deterministic (token order). Indices `< 0`
//! mean "no expert" and are skipped.

use crate::kutil;
use crate::{cfg_err, EpError, Result};
use builder::{GlobalPtr, KernelBuilder, Target};
use runtime::{Buffer, LaunchConfig, Stream};
use serde::Serialize;

/// Shape of the expert-parallel group as the layout sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LayoutCfg {
    /// Experts in total (physical experts when EPLB replicates).
    pub experts: u32,
    pub ranks: u32,
    pub gpus_per_node: u32,
    pub topk: u32,
}

impl LayoutCfg {
    pub fn validate(&self) -> Result<()> {
        let c = self;
        if c.ranks == 0 || c.ranks > 64 {
            return cfg_err(format!("{} ranks (1..=64 supported)", c.ranks));
        }
        if c.gpus_per_node == 0 || c.ranks % c.gpus_per_node != 0 {
            return cfg_err(format!(
                "{} ranks do not split into nodes of {}",
                c.ranks, c.gpus_per_node
            ));
        }
        if c.experts == 0 || c.experts % c.ranks != 0 {
            return cfg_err(format!(
                "{} experts do not split over {} ranks",
                c.experts, c.ranks
            ));
        }
        if c.topk == 0 || c.topk > 32 {
            return cfg_err("topk must be 1..=32");
        }
        Ok(())
    }
    pub fn nodes(&self) -> u32 {
        self.ranks / self.gpus_per_node
    }
    pub fn experts_per_rank(&self) -> u32 {
        self.experts / self.ranks
    }
    fn key(&self) -> String {
        format!(
            "{}-{}-{}-{}",
            self.experts, self.ranks, self.gpus_per_node, self.topk
        )
    }
}

/// Host copy of a dispatch layout of one rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DispatchLayout {
    pub tokens_per_rank: Vec<u32>,
    pub tokens_per_node: Vec<u32>,
    pub tokens_per_expert: Vec<u32>,
    /// `[T, ranks]`, 1 when the token goes to that rank.
    pub token_in_rank: Vec<i32>,
    /// `[T, topk]` position of the copy inside its expert's list from this rank (-1: none).
    pub slots: Vec<i32>,
}

/// `ep_layout(topk_idx, T, per_rank, per_node, per_expert, in_rank)`.
pub fn layout_kernel(t: &Target, c: &LayoutCfg) -> Result<ptx::Module> {
    c.validate()?;
    let epr = c.experts_per_rank();
    let mut k = KernelBuilder::new("ep_layout", t.clone());
    let idx = k.param::<GlobalPtr<i32>>("topk_idx");
    let ntok = k.param::<u32>("num_tokens");
    let per_rank = k.param::<GlobalPtr<u32>>("per_rank");
    let per_node = k.param::<GlobalPtr<u32>>("per_node");
    let per_exp = k.param::<GlobalPtr<u32>>("per_expert");
    let in_rank = k.param::<GlobalPtr<i32>>("in_rank");
    let tok = k.global_index_x();
    let inb = k.lt(tok, ntok);
    k.if_(inb, |k| {
        let mask = k.mov(0u64);
        let krow = k.mul(tok, c.topk);
        k.for_range(0u32, c.topk, 1u32, |k, kk| {
            let i = k.add(krow, kk);
            let e = k.ld(idx.offset(i));
            let eu = k.bitcast::<u32, i32>(e);
            // unsigned compare: negative indices become huge and fail `< experts`
            let valid = k.lt(eu, c.experts);
            k.if_(valid, |k| {
                k.red_add(per_exp.offset(eu), 1u32);
                let r = k.div(eu, epr);
                let bit = k.shl(1u64, r);
                let nm = k.or(mask, bit);
                k.mov_to(mask, nm);
            });
        });
        let rrow = k.mul(tok, c.ranks);
        let nmask = k.mov(0u32);
        k.for_range(0u32, c.ranks, 1u32, |k, r| {
            let sh = k.shr(mask, r);
            let b = k.and(sh, 1u64);
            let bu = k.cvt::<u32, u64>(b);
            let bi = k.bitcast::<i32, u32>(bu);
            let o = k.add(rrow, r);
            k.st(in_rank.offset(o), bi);
            let p = k.ne(bu, 0u32);
            k.if_(p, |k| {
                k.red_add(per_rank.offset(r), 1u32);
                let node = k.div(r, c.gpus_per_node);
                let nb = k.shl(1u32, node);
                let nn = k.or(nmask, nb);
                k.mov_to(nmask, nn);
            });
        });
        k.for_range(0u32, c.nodes(), 1u32, |k, n| {
            let sh = k.shr(nmask, n);
            let b = k.and(sh, 1u32);
            let p = k.ne(b, 0u32);
            k.if_(p, |k| k.red_add(per_node.offset(n), 1u32));
        });
    });
    Ok(k.finish()?)
}

/// `ep_slots(topk_idx, T, slots)`: one thread per expert.
pub fn slots_kernel(t: &Target, c: &LayoutCfg) -> Result<ptx::Module> {
    c.validate()?;
    let mut k = KernelBuilder::new("ep_slots", t.clone());
    let idx = k.param::<GlobalPtr<i32>>("topk_idx");
    let ntok = k.param::<u32>("num_tokens");
    let slots = k.param::<GlobalPtr<i32>>("slots");
    let e = k.global_index_x();
    let inb = k.lt(e, c.experts);
    k.if_(inb, |k| {
        let ei = k.bitcast::<i32, u32>(e);
        let n = k.mov(0i32);
        let total = k.mul(ntok, c.topk);
        k.for_range(0u32, total, 1u32, |k, i| {
            let v = k.ld(idx.offset(i));
            let p = k.eq(v, ei);
            k.if_(p, |k| {
                k.st(slots.offset(i), n);
                let n2 = k.add(n, 1i32);
                k.mov_to(n, n2);
            });
        });
    });
    Ok(k.finish()?)
}

/// Device buffers of a layout.
pub struct LayoutBufs {
    pub tokens_per_rank: Buffer<u32>,
    pub tokens_per_node: Buffer<u32>,
    pub tokens_per_expert: Buffer<u32>,
    pub token_in_rank: Buffer<i32>,
    pub slots: Buffer<i32>,
}

impl LayoutBufs {
    pub fn to_host(&self) -> Result<DispatchLayout> {
        Ok(DispatchLayout {
            tokens_per_rank: self.tokens_per_rank.to_vec()?,
            tokens_per_node: self.tokens_per_node.to_vec()?,
            tokens_per_expert: self.tokens_per_expert.to_vec()?,
            token_in_rank: self.token_in_rank.to_vec()?,
            slots: self.slots.to_vec()?,
        })
    }
}

/// Computes the layout of `topk_idx` (`[T, topk]`, on the stream's device).
pub fn get_dispatch_layout(
    stream: &Stream,
    topk_idx: &Buffer<i32>,
    num_tokens: usize,
    c: &LayoutCfg,
) -> Result<LayoutBufs> {
    c.validate()?;
    if topk_idx.len() < num_tokens * c.topk as usize {
        return Err(EpError::Shape(format!(
            "topk_idx has {} entries, need {}x{}",
            topk_idx.len(),
            num_tokens,
            c.topk
        )));
    }
    let dev = stream.device();
    let fl = kutil::function(dev, "ep_layout", &c.key(), |t| layout_kernel(t, c))?;
    let fs = kutil::function(dev, "ep_slots", &c.key(), |t| slots_kernel(t, c))?;
    let b = LayoutBufs {
        tokens_per_rank: dev.alloc(c.ranks as usize)?,
        tokens_per_node: dev.alloc(c.nodes() as usize)?,
        tokens_per_expert: dev.alloc(c.experts as usize)?,
        token_in_rank: dev.alloc((num_tokens * c.ranks as usize).max(1))?,
        slots: dev.alloc((num_tokens * c.topk as usize).max(1))?,
    };
    stream.fill(&b.slots, -1)?;
    if num_tokens > 0 {
        let t = num_tokens as u32;
        stream.launch(
            &fl,
            &LaunchConfig::linear(t.div_ceil(128), 128),
            &runtime::args![
                topk_idx,
                t,
                &b.tokens_per_rank,
                &b.tokens_per_node,
                &b.tokens_per_expert,
                &b.token_in_rank
            ],
        )?;
        stream.launch(
            &fs,
            &LaunchConfig::linear(c.experts.div_ceil(64), 64),
            &runtime::args![topk_idx, t, &b.slots],
        )?;
        stream.synchronize()?;
    }
    Ok(b)
}

/// CPU reference of the layout.
pub fn layout_ref(topk_idx: &[i32], c: &LayoutCfg) -> Result<DispatchLayout> {
    c.validate()?;
    let kk = c.topk as usize;
    let t_n = topk_idx.len() / kk;
    let (r_n, n_n, e_n) = (c.ranks as usize, c.nodes() as usize, c.experts as usize);
    let mut l = DispatchLayout {
        tokens_per_rank: vec![0; r_n],
        tokens_per_node: vec![0; n_n],
        tokens_per_expert: vec![0; e_n],
        token_in_rank: vec![0; t_n * r_n],
        slots: vec![-1; t_n * kk],
    };
    let mut next = vec![0i32; e_n];
    for t in 0..t_n {
        let mut ranks = vec![false; r_n];
        for k in 0..kk {
            let e = topk_idx[t * kk + k];
            if e < 0 || e as usize >= e_n {
                continue;
            }
            let e = e as usize;
            l.tokens_per_expert[e] += 1;
            l.slots[t * kk + k] = next[e];
            next[e] += 1;
            ranks[e / c.experts_per_rank() as usize] = true;
        }
        let mut nodes = vec![false; n_n];
        for r in 0..r_n {
            if ranks[r] {
                l.token_in_rank[t * r_n + r] = 1;
                l.tokens_per_rank[r] += 1;
                nodes[r / c.gpus_per_node as usize] = true;
            }
        }
        for n in 0..n_n {
            if nodes[n] {
                l.tokens_per_node[n] += 1;
            }
        }
    }
    Ok(l)
}
