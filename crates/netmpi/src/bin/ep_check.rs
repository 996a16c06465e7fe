//! `netmpi-ep-check`: expert-parallel dispatch, combine and the top-k weight gradients of a
//! 2 nodes x 2 GPUs group, either in one process (`--single`: every rank here, the direct
//! in-process transport) or under `mpirun -np 2` (one process per node, each hosting only its
//! node's ranks; other nodes through the proxy transport over MPI). Every process derives every
//! rank's inputs from the same seed and uploads only its own. Prints one
//! `hash <rank> <output> <fnv64>` line per hosted rank and output (the test compares the lines of
//! both modes: bit-identical results), a `stats` line per operation (seconds, bytes of the
//! hosted ranks, proxy bytes) and checks on the way that every received row is its source row.

use ep::comm::{EpConfig, EpGroup, XRef};
use ep::{InProcessTransport, ProxyTransport};
use half::bf16;
use netmpi::Mpi;
use runtime::{Buffer, Device};
use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

const NODES: u32 = 2;
const GPN: u32 = 2;
const EXPERTS: u32 = 16;
const HIDDEN: usize = 256;
const TOPK: usize = 4;

type Res<T> = Result<T, Box<dyn Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("netmpi-ep-check: {e}");
            ExitCode::FAILURE
        }
    }
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

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Rank `r`'s inputs: BF16 rows, FP8 bytes + scales, distinct top-k experts, weights.
struct RankIn {
    x: Vec<bf16>,
    q: Vec<u8>,
    s: Vec<f32>,
    idx: Vec<i32>,
    w: Vec<f32>,
}

fn inputs(r: u32) -> RankIn {
    let mut g = Rng(0x9e37_79b9_7f4a_7c15 ^ (r as u64 + 1) * 0x1000_0001);
    let t = 20 + 3 * r as usize;
    let x = (0..t * HIDDEN)
        .map(|_| bf16::from_f32(g.unit() * 4.0 - 2.0))
        .collect();
    let q = (0..t * HIDDEN).map(|_| (g.next() % 0x7f) as u8).collect();
    let s = (0..t * HIDDEN / 128)
        .map(|_| 0.01 + g.unit() * 4.0)
        .collect();
    let mut idx = Vec::new();
    for _ in 0..t {
        let mut chosen: Vec<i32> = Vec::new();
        while chosen.len() < TOPK {
            let e = (g.next() % EXPERTS as u64) as i32;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        idx.extend(chosen);
    }
    let w = (0..t * TOPK).map(|_| 0.05 + g.unit() * 0.95).collect();
    RankIn { x, q, s, idx, w }
}

fn group(mpi: Option<&Mpi>) -> Res<EpGroup> {
    let ranks = NODES * GPN;
    let mut cfg = EpConfig::new(ranks, GPN, EXPERTS, HIDDEN as u32, TOPK as u32, 32);
    (cfg.num_sms, cfg.ring_slots, cfg.chunk) = (4, 4, 2);
    let Some(mpi) = mpi else {
        let devs: Vec<Device> = (0..ranks).map(Device::emu).collect();
        let tr = InProcessTransport {
            devices: devs.clone(),
            gpus_per_node: GPN,
        };
        return Ok(EpGroup::new(cfg, devs, Box::new(tr))?);
    };
    if mpi.size() != NODES {
        return Err(format!(
            "run with {NODES} processes (one per node), not {}",
            mpi.size()
        )
        .into());
    }
    let node = mpi.rank();
    let hosted: Vec<u32> = (node * GPN..(node + 1) * GPN).collect();
    let devs: Vec<Device> = hosted.iter().map(|&r| Device::emu(r)).collect();
    let mut all = vec![None; ranks as usize];
    for (&r, d) in hosted.iter().zip(&devs) {
        all[r as usize] = Some(d.clone());
    }
    let engines: Vec<Box<dyn ep::Engine>> = vec![Box::new(mpi.engine()?)];
    let tr = ProxyTransport::new(all, GPN, engines, Duration::from_secs(60))?;
    Ok(EpGroup::hosting(cfg, hosted, devs, Box::new(tr))?)
}

fn stats(g: &EpGroup, op: &str) {
    let proxy: u64 = g
        .transport
        .proxy_stats()
        .iter()
        .map(|(_, s)| s.put_bytes)
        .sum();
    let l = &g.last;
    println!(
        "stats {op} ranks {:?} seconds {:.3} inter_bytes {} intra_bytes {} proxy_put_bytes_total {proxy}",
        g.hosted, l.seconds, l.inter_node_bytes, l.intra_node_bytes
    );
}

fn run() -> Res<()> {
    let single = std::env::args().any(|a| a == "--single");
    let mpi = if single { None } else { Some(Mpi::init()?) };
    let mut g = group(mpi.as_ref())?;
    let hosted = g.hosted.clone();
    let ins: Vec<RankIn> = hosted.iter().map(|&r| inputs(r)).collect();
    let devs = g.devices.clone();
    let dev = |i: usize| devs[i].clone();
    let n = hosted.len();
    let xb: Vec<Buffer<bf16>> = (0..n)
        .map(|i| dev(i).upload(&ins[i].x))
        .collect::<Result<_, _>>()?;
    let qb: Vec<Buffer<u8>> = (0..n)
        .map(|i| dev(i).upload(&ins[i].q))
        .collect::<Result<_, _>>()?;
    let sb: Vec<Buffer<f32>> = (0..n)
        .map(|i| dev(i).upload(&ins[i].s))
        .collect::<Result<_, _>>()?;
    let ib: Vec<Buffer<i32>> = (0..n)
        .map(|i| dev(i).upload(&ins[i].idx))
        .collect::<Result<_, _>>()?;
    let wb: Vec<Buffer<f32>> = (0..n)
        .map(|i| dev(i).upload(&ins[i].w))
        .collect::<Result<_, _>>()?;
    let (ir, wr): (Vec<_>, Vec<_>) = (ib.iter().collect(), wb.iter().collect());
    let mut hashes: Vec<(u32, &str, u64)> = Vec::new();

    let xr: Vec<XRef> = xb.iter().map(XRef::Bf16).collect();
    let (outs, handle) = g.dispatch(&xr, &ir, &wr, None)?;
    let handle = handle.ok_or("a fresh dispatch returns a handle")?;
    stats(&g, "dispatch-bf16");
    check_rows(&hosted, &outs)?;
    let qr: Vec<XRef> = qb.iter().zip(&sb).map(|(q, s)| XRef::Fp8(q, s)).collect();
    let (outs8, _) = g.dispatch(&qr, &ir, &wr, None)?;
    stats(&g, "dispatch-fp8");
    // expert outputs: a function of the row's source token and slot, so every mode agrees
    let mut ys = Vec::new();
    for (i, o) in outs.iter().enumerate() {
        let src = o.recv_src.to_vec()?;
        let rk = o.recv_k.to_vec()?;
        let v: Vec<bf16> = (0..o.m_pad.max(1) * HIDDEN)
            .map(|j| {
                let row = j / HIDDEN;
                let (s, k) = (
                    src.get(row).copied().unwrap_or(-1),
                    rk.get(row).copied().unwrap_or(0),
                );
                let u = (s as i64 * 31 + k as i64 * 7 + (j % HIDDEN) as i64 * 13) % 97;
                bf16::from_f32(u as f32 / 48.0 - 1.0)
            })
            .collect();
        ys.push(dev(i).upload(&v)?);
    }
    let yr: Vec<&Buffer<bf16>> = ys.iter().collect();
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    let comb = g.combine(&yr, Some(&rw), &handle)?;
    stats(&g, "combine-weighted");
    let comb2 = g.combine(&yr, None, &handle)?;
    stats(&g, "combine-unweighted");
    let (cached, _) = g.dispatch(&xr, &ir, &wr, Some(&handle))?;
    stats(&g, "dispatch-cached");
    let dy: Vec<&Buffer<u8>> = cached.iter().map(|o| &o.recv_x).collect();
    let ntok: Vec<usize> = ins.iter().map(|r| r.idx.len() / TOPK).collect();
    let tg = g.topk_weight_grad(&yr, &dy, &outs, &ntok)?;
    println!(
        "stats topk-grad ranks {hosted:?} inter_bytes {} intra_bytes {}",
        tg.inter_node_bytes, tg.intra_node_bytes
    );
    for (i, &r) in hosted.iter().enumerate() {
        hashes.push((r, "rows-bf16", fnv(&outs[i].recv_x.to_bytes()?)));
        hashes.push((r, "rows-fp8", fnv(&outs8[i].recv_x.to_bytes()?)));
        hashes.push((r, "scales-fp8", fnv(&outs8[i].recv_scales.to_bytes()?)));
        hashes.push((r, "recv-src", fnv(&outs[i].recv_src.to_bytes()?)));
        hashes.push((r, "combine", fnv(&comb[i].to_bytes()?)));
        hashes.push((r, "combine-unweighted", fnv(&comb2[i].to_bytes()?)));
        hashes.push((r, "cached-rows", fnv(&cached[i].recv_x.to_bytes()?)));
        hashes.push((r, "topk-dw", fnv(&tg.dw[i].to_bytes()?)));
    }
    for (r, what, h) in hashes {
        println!("hash {r} {what} {h:016x}");
    }
    drop(g);
    if let Some(m) = &mpi {
        m.barrier();
    }
    Ok(())
}

/// Every received BF16 row equals its source token's row (sources regenerated from the seed).
fn check_rows(hosted: &[u32], outs: &[ep::DispatchOut]) -> Res<()> {
    let all: Vec<RankIn> = (0..NODES * GPN).map(inputs).collect();
    for (i, o) in outs.iter().enumerate() {
        let src = o.recv_src.to_vec()?;
        let rx = o.recv_x.to_bytes()?;
        for row in 0..o.m_pad {
            if src[row] < 0 {
                continue;
            }
            let (sr, tok) = ((src[row] >> 24) as usize, (src[row] & 0xff_ffff) as usize);
            let want: Vec<u8> = all[sr].x[tok * HIDDEN..(tok + 1) * HIDDEN]
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect();
            if rx[row * 2 * HIDDEN..(row + 1) * 2 * HIDDEN] != want[..] {
                return Err(format!(
                    "rank {}: row {row} is not rank {sr}'s token {tok}",
                    hosted[i]
                )
                .into());
            }
        }
    }
    Ok(())
}
