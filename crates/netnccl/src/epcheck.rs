//! Expert-parallel dispatch (BF16) and weighted combine of a `nodes x gpus_per_node` group,
//! either in one process (every rank here, the direct in-process transport) or one process per
//! node with the other nodes reached through the proxy transport over [`NcclEngine`]. Every
//! process derives every rank's inputs from the seed and uploads only its own; the result is a
//! hash of every output of every hosted rank, which must be bit-identical across the modes.
//! Every received row is also checked against its source token. (The same check as
//! `netmpi::check`, at smaller sizes, with the NCCL engine instead of MPI.)

use crate::check::{Res, Rng};
use crate::NcclEngine;
use ep::comm::{EpConfig, EpGroup, XRef};
use ep::{InProcessTransport, ProxyTransport};
use half::bf16;
use runtime::{Buffer, Device};
use std::time::Duration;

/// Sizes of the check.
#[derive(Clone, Debug)]
pub struct EpCheckCfg {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub experts: u32,
    pub hidden: usize,
    pub topk: usize,
    /// Tokens of rank 0; rank r has `tokens + 2 r` (capped at `max_tokens`).
    pub tokens: usize,
    pub max_tokens: u32,
    pub seed: u64,
}

impl Default for EpCheckCfg {
    fn default() -> EpCheckCfg {
        EpCheckCfg {
            nodes: 2,
            gpus_per_node: 1,
            experts: 8,
            hidden: 128,
            topk: 2,
            tokens: 6,
            max_tokens: 16,
            seed: 1,
        }
    }
}

impl EpCheckCfg {
    fn ranks(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
    fn tokens_of(&self, r: u32) -> usize {
        (self.tokens + 2 * r as usize).min(self.max_tokens as usize)
    }
    fn ep_config(&self) -> Res<EpConfig> {
        let mut c = EpConfig::new(
            self.ranks(),
            self.gpus_per_node,
            self.experts,
            self.hidden as u32,
            self.topk as u32,
            self.max_tokens,
        );
        (c.num_sms, c.ring_slots, c.chunk, c.sm_offset) = (4, 4, 2, 112);
        c.timeout = Duration::from_secs(60);
        c.validate()?;
        if self.topk > self.experts as usize {
            return Err(format!("topk {} exceeds experts {}", self.topk, self.experts).into());
        }
        Ok(c)
    }
}

/// Rank `r`'s inputs: BF16 rows, distinct top-k experts, weights.
struct RankIn {
    x: Vec<bf16>,
    idx: Vec<i32>,
    w: Vec<f32>,
}

fn inputs(c: &EpCheckCfg, r: u32) -> RankIn {
    let mut g = Rng(c.seed ^ ((r as u64 + 1) * 0x1000_0001));
    let (t, h) = (c.tokens_of(r), c.hidden);
    let x = (0..t * h).map(|_| bf16::from_f32(g.value())).collect();
    let mut idx = Vec::new();
    for _ in 0..t {
        let mut chosen: Vec<i32> = Vec::new();
        while chosen.len() < c.topk {
            let e = (g.next_u64() % c.experts as u64) as i32;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        idx.extend(chosen);
    }
    let w = (0..t * c.topk).map(|_| 0.55 + g.value() / 4.0).collect();
    RankIn { x, idx, w }
}

/// The group: every rank here (`engine` None) or this process's node (`engine`'s endpoint).
fn group(c: &EpCheckCfg, engine: Option<NcclEngine>) -> Res<EpGroup> {
    let (ranks, gpn) = (c.ranks(), c.gpus_per_node);
    let cfg = c.ep_config()?;
    let Some(engine) = engine else {
        let devs: Vec<Device> = (0..ranks).map(Device::emu).collect();
        let tr = InProcessTransport {
            devices: devs.clone(),
            gpus_per_node: gpn,
        };
        return Ok(EpGroup::new(cfg, devs, Box::new(tr))?);
    };
    let (node, nodes) = (
        ep::Engine::endpoint(&engine),
        ep::Engine::endpoints(&engine),
    );
    if nodes != c.nodes {
        return Err(format!(
            "nodes: {} nodes need {} ranks of the job, got {nodes}",
            c.nodes, c.nodes
        )
        .into());
    }
    let hosted: Vec<u32> = (node * gpn..(node + 1) * gpn).collect();
    let devs: Vec<Device> = hosted.iter().map(|&r| Device::emu(r)).collect();
    let mut all = vec![None; ranks as usize];
    for (&r, d) in hosted.iter().zip(&devs) {
        all[r as usize] = Some(d.clone());
    }
    let engines: Vec<Box<dyn ep::Engine>> = vec![Box::new(engine)];
    let tr = ProxyTransport::new(all, gpn, engines, Duration::from_secs(60))?;
    Ok(EpGroup::hosting(cfg, hosted, devs, Box::new(tr))?)
}

fn upload<T: runtime::Pod>(devs: &[Device], v: &[&[T]]) -> Res<Vec<Buffer<T>>> {
    Ok(devs
        .iter()
        .zip(v)
        .map(|(d, x)| d.upload(x))
        .collect::<Result<_, _>>()?)
}

/// Expert outputs: a function of each row's source token and slot, so every mode agrees.
fn expert_outputs(
    c: &EpCheckCfg,
    devs: &[Device],
    outs: &[ep::DispatchOut],
) -> Res<Vec<Buffer<bf16>>> {
    let mut ys = Vec::new();
    for (d, o) in devs.iter().zip(outs) {
        let (src, rk) = (o.recv_src.to_vec()?, o.recv_k.to_vec()?);
        let v: Vec<bf16> = (0..o.m_pad.max(1) * c.hidden)
            .map(|j| {
                let row = j / c.hidden;
                let s = src.get(row).copied().unwrap_or(-1) as i64;
                let k = rk.get(row).copied().unwrap_or(0) as i64;
                let u = (s * 31 + k * 7 + (j % c.hidden) as i64 * 13).rem_euclid(97);
                bf16::from_f32(u as f32 / 48.0 - 1.0)
            })
            .collect();
        ys.push(d.upload(&v)?);
    }
    Ok(ys)
}

/// FNV-1a 64.
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Runs the check; returns `hash <rank> <output> <fnv64>` lines of the hosted ranks.
pub fn run(c: &EpCheckCfg, engine: Option<NcclEngine>) -> Res<Vec<String>> {
    let mut g = group(c, engine)?;
    let (hosted, devs) = (g.hosted.clone(), g.devices.clone());
    let ins: Vec<RankIn> = hosted.iter().map(|&r| inputs(c, r)).collect();
    let xb = upload(&devs, &ins.iter().map(|i| &i.x[..]).collect::<Vec<_>>())?;
    let ib = upload(&devs, &ins.iter().map(|i| &i.idx[..]).collect::<Vec<_>>())?;
    let wb = upload(&devs, &ins.iter().map(|i| &i.w[..]).collect::<Vec<_>>())?;
    let (ir, wr): (Vec<_>, Vec<_>) = (ib.iter().collect(), wb.iter().collect());
    let xr: Vec<XRef> = xb.iter().map(XRef::Bf16).collect();
    let (outs, handle) = g.dispatch(&xr, &ir, &wr, None)?;
    let handle = handle.ok_or("a fresh dispatch returns a handle")?;
    check_rows(c, &hosted, &outs)?;
    let ys = expert_outputs(c, &devs, &outs)?;
    let yr: Vec<&Buffer<bf16>> = ys.iter().collect();
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    let comb = g.combine(&yr, Some(&rw), &handle)?;
    let mut lines = Vec::new();
    for (i, &r) in hosted.iter().enumerate() {
        for (what, b) in [
            ("rows-bf16", outs[i].recv_x.to_bytes()?),
            ("recv-src", outs[i].recv_src.to_bytes()?),
            ("combine", comb[i].to_bytes()?),
        ] {
            lines.push(format!("hash {r} {what} {:016x}", fnv(&b)));
        }
    }
    Ok(lines)
}

/// Every received row equals its source token's row (sources regenerated from the seed).
fn check_rows(c: &EpCheckCfg, hosted: &[u32], outs: &[ep::DispatchOut]) -> Res<()> {
    let h = c.hidden;
    let all: Vec<RankIn> = (0..c.ranks()).map(|r| inputs(c, r)).collect();
    for (i, o) in outs.iter().enumerate() {
        let src = o.recv_src.to_vec()?;
        let rx = o.recv_x.to_bytes()?;
        for row in 0..o.m_pad {
            if src[row] < 0 {
                continue;
            }
            let (sr, tok) = ((src[row] >> 24) as usize, (src[row] & 0xff_ffff) as usize);
            let want: Vec<u8> = all[sr].x[tok * h..(tok + 1) * h]
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect();
            if rx[row * 2 * h..(row + 1) * 2 * h] != want[..] {
                let r = hosted[i];
                return Err(format!("rank {r}: row {row} is not rank {sr}'s token {tok}").into());
            }
        }
    }
    Ok(())
}
