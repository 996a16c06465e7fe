//! The cross-process expert-parallel check shared by the engines' check programs
//! (`netmpi::check` behind `ptxforge comm`, `netnccl::epcheck`): every rank's inputs derived
//! from one seed (so every process regenerates any rank's), the group over the direct in-process
//! transport or one process per node through the proxy transport over an [`Engine`], the expert
//! outputs as a function of each row's source, the per-operation report, output hashes, and the
//! check that every received row is its source token's row.

use crate::comm::{EpConfig, EpGroup};
use crate::{Engine, InProcessTransport, ProxyTransport};
use half::bf16;
use runtime::{Buffer, Device};
use serde::{Deserialize, Serialize};
use std::error::Error;
use std::time::Duration;

/// Check programs' errors: any error, reported as text.
pub type Res<T> = Result<T, Box<dyn Error>>;

/// Sizes of the check (`validate` names a bad field).
#[derive(Clone, Debug, Serialize)]
pub struct CheckCfg {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub experts: u32,
    pub hidden: usize,
    pub topk: usize,
    /// Tokens of rank 0; rank r has `tokens + 3 r` (capped at `max_tokens`).
    pub tokens: usize,
    pub max_tokens: u32,
    pub seed: u64,
    /// Communication timeout (wall time of the proxies, emulated time of the kernels).
    pub timeout: Duration,
}

impl Default for CheckCfg {
    fn default() -> CheckCfg {
        CheckCfg {
            nodes: 2,
            gpus_per_node: 2,
            experts: 16,
            hidden: 256,
            topk: 4,
            tokens: 20,
            max_tokens: 32,
            seed: 1,
            timeout: Duration::from_secs(60),
        }
    }
}

impl CheckCfg {
    pub fn ranks(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
    pub fn tokens_of(&self, r: u32) -> usize {
        (self.tokens + 3 * r as usize).min(self.max_tokens as usize)
    }
    pub fn ep_config(&self) -> Res<EpConfig> {
        let mut c = EpConfig::new(
            self.ranks(),
            self.gpus_per_node,
            self.experts,
            self.hidden as u32,
            self.topk as u32,
            self.max_tokens,
        );
        (c.num_sms, c.ring_slots, c.chunk, c.sm_offset) = (4, 4, 2, 112);
        c.timeout = self.timeout;
        c.validate()?;
        if self.topk > self.experts as usize {
            return Err(format!("topk {} exceeds experts {}", self.topk, self.experts).into());
        }
        Ok(c)
    }
}

/// Time and bytes of one operation, for the hosted ranks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpReport {
    pub op: String,
    pub seconds: f64,
    pub inter_node_bytes: u64,
    pub intra_node_bytes: u64,
    /// Bytes this process's proxies put during the operation (0 without a proxy).
    pub proxy_put_bytes: u64,
}

/// What one process ran.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub process: u32,
    pub processes: u32,
    pub hosted: Vec<u32>,
    pub transport: String,
    pub ops: Vec<OpReport>,
    /// (rank, output, FNV-1a 64 of its bytes).
    pub hashes: Vec<(u32, String, String)>,
}

/// xorshift64*: the same stream in every process.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// FNV-1a 64.
pub fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Rank `r`'s inputs: BF16 rows, FP8 bytes + scales, distinct top-k experts, weights.
pub struct RankIn {
    pub x: Vec<bf16>,
    pub q: Vec<u8>,
    pub s: Vec<f32>,
    pub idx: Vec<i32>,
    pub w: Vec<f32>,
}

pub fn inputs(c: &CheckCfg, r: u32) -> RankIn {
    let mut g = Rng((c.seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_add((r as u64 + 1) * 0x1000_0001));
    let (t, h) = (c.tokens_of(r), c.hidden);
    let x = (0..t * h)
        .map(|_| bf16::from_f32(g.unit() * 4.0 - 2.0))
        .collect();
    let q = (0..t * h).map(|_| (g.next() % 0x7f) as u8).collect();
    let s = (0..t * h / 128).map(|_| 0.01 + g.unit() * 4.0).collect();
    let mut idx = Vec::new();
    for _ in 0..t {
        let mut chosen: Vec<i32> = Vec::new();
        while chosen.len() < c.topk {
            let e = (g.next() % c.experts as u64) as i32;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        idx.extend(chosen);
    }
    let w = (0..t * c.topk).map(|_| 0.05 + g.unit() * 0.95).collect();
    RankIn { x, q, s, idx, w }
}

/// The group: every rank in this process over the direct transport (`engine` None), or the
/// ranks of `engine`'s endpoint (one process per node, or one per rank with the node peers in
/// other processes reached through IPC) with the other nodes through the proxy.
pub fn group(c: &CheckCfg, engine: Option<Box<dyn Engine>>) -> Res<EpGroup> {
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
    let (me, procs) = (engine.endpoint(), engine.endpoints());
    let per = match procs {
        p if p == c.nodes => gpn,
        p if p == ranks => 1,
        p => {
            return Err(format!(
                "nodes: {} nodes of {gpn} need {} processes (one per node) or {ranks} (one per rank), got {p}",
                c.nodes, c.nodes
            )
            .into())
        }
    };
    let hosted: Vec<u32> = (me * per..(me + 1) * per).collect();
    let devs: Vec<Device> = hosted.iter().map(|&r| Device::emu(r)).collect();
    let mut all = vec![None; ranks as usize];
    for (&r, d) in hosted.iter().zip(&devs) {
        all[r as usize] = Some(d.clone());
    }
    let tr = ProxyTransport::new(all, gpn, vec![engine], c.timeout)?;
    Ok(EpGroup::hosting(cfg, hosted, devs, Box::new(tr))?)
}

pub fn op(g: &EpGroup, name: &str) -> OpReport {
    OpReport {
        op: name.into(),
        seconds: g.last.seconds,
        inter_node_bytes: g.last.inter_node_bytes,
        intra_node_bytes: g.last.intra_node_bytes,
        proxy_put_bytes: g
            .transport
            .proxy_stats()
            .iter()
            .map(|(_, s)| s.put_bytes)
            .sum(),
    }
}

pub fn upload<T: runtime::Pod>(devs: &[Device], v: &[&[T]]) -> Res<Vec<Buffer<T>>> {
    Ok(devs
        .iter()
        .zip(v)
        .map(|(d, x)| d.upload(x))
        .collect::<Result<_, _>>()?)
}

/// The hosted ranks' inputs on their devices (index = position in `hosted`).
pub struct Uploaded {
    pub inputs: Vec<RankIn>,
    pub x: Vec<Buffer<bf16>>,
    pub q: Vec<Buffer<u8>>,
    pub s: Vec<Buffer<f32>>,
    pub idx: Vec<Buffer<i32>>,
    pub w: Vec<Buffer<f32>>,
}

/// Derives and uploads the inputs of the hosted ranks.
pub fn upload_inputs(c: &CheckCfg, hosted: &[u32], devs: &[Device]) -> Res<Uploaded> {
    let ins: Vec<RankIn> = hosted.iter().map(|&r| inputs(c, r)).collect();
    fn each<'a, T: runtime::Pod>(
        devs: &[Device],
        ins: &'a [RankIn],
        f: impl Fn(&'a RankIn) -> &'a [T],
    ) -> Res<Vec<Buffer<T>>> {
        upload(devs, &ins.iter().map(f).collect::<Vec<_>>())
    }
    Ok(Uploaded {
        x: each(devs, &ins, |i| &i.x)?,
        q: each(devs, &ins, |i| &i.q)?,
        s: each(devs, &ins, |i| &i.s)?,
        idx: each(devs, &ins, |i| &i.idx)?,
        w: each(devs, &ins, |i| &i.w)?,
        inputs: ins,
    })
}

/// Expert outputs: a function of each row's source token and slot, so every mode agrees.
pub fn expert_outputs(
    c: &CheckCfg,
    devs: &[Device],
    outs: &[crate::DispatchOut],
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

/// Every received BF16 row equals its source token's row (sources regenerated from the seed).
pub fn check_rows(c: &CheckCfg, hosted: &[u32], outs: &[crate::DispatchOut]) -> Res<()> {
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

/// Dispatch (BF16, then FP8) and weighted combine of the hosted ranks, every received row
/// checked with [`check_rows`]; returns `hash <rank> <output> <fnv64>` lines, bit-identical
/// across modes (`engine` None: every rank here over the direct transport).
pub fn dispatch_combine_hashes(c: &CheckCfg, engine: Option<Box<dyn Engine>>) -> Res<Vec<String>> {
    use crate::comm::XRef;
    let mut g = group(c, engine)?;
    let (hosted, devs) = (g.hosted.clone(), g.devices.clone());
    let u = upload_inputs(c, &hosted, &devs)?;
    let (ir, wr): (Vec<_>, Vec<_>) = (u.idx.iter().collect(), u.w.iter().collect());
    let xr: Vec<XRef> = u.x.iter().map(XRef::Bf16).collect();
    let (outs, handle) = g.dispatch(&xr, &ir, &wr, None)?;
    let handle = handle.ok_or("a fresh dispatch returns a handle")?;
    check_rows(c, &hosted, &outs)?;
    let qr: Vec<XRef> = u.q.iter().zip(&u.s).map(|(q, s)| XRef::Fp8(q, s)).collect();
    let (outs8, _) = g.dispatch(&qr, &ir, &wr, None)?;
    let ys = expert_outputs(c, &devs, &outs)?;
    let yr: Vec<&Buffer<bf16>> = ys.iter().collect();
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    let comb = g.combine(&yr, Some(&rw), &handle)?;
    let mut lines = Vec::new();
    for (i, &r) in hosted.iter().enumerate() {
        for (what, b) in [
            ("rows-bf16", outs[i].recv_x.to_bytes()?),
            ("recv-src", outs[i].recv_src.to_bytes()?),
            ("rows-fp8", outs8[i].recv_x.to_bytes()?),
            ("scales-fp8", outs8[i].recv_scales.to_bytes()?),
            ("combine", comb[i].to_bytes()?),
        ] {
            lines.push(format!("hash {r} {what} {:016x}", fnv(&b)));
        }
    }
    Ok(lines)
}
