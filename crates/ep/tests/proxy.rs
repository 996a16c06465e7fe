//! The host-proxy transport (send windows + proxy threads over the in-process engine) against
//! the direct in-process transport on the same random inputs: dispatch (BF16 and FP8), weighted
//! and unweighted combine, cached dispatch and the top-k weight gradients must be bit-identical,
//! and each is checked against an f64/host reference too; the proxies carry exactly the device-counted
//! inter-node bytes. Devices 800..
#![allow(clippy::needless_range_loop)]
mod common;
use common::{rng, routing};
use ep::comm::{EpConfig, EpGroup, XRef};
use ep::{EpError, InProcessEngine, InProcessTransport, ProxyTransport, Transport};
use half::bf16;
use rand::Rng;
use runtime::{Buffer, Device};
use std::time::{Duration, Instant};

const NODES: u32 = 2;
const GPN: u32 = 2;
const EXPERTS: u32 = 16;
const HIDDEN: usize = 256;
const TOPK: usize = 4;

fn cfg(ranks: u32, gpn: u32) -> EpConfig {
    let mut c = EpConfig::new(ranks, gpn, EXPERTS, HIDDEN as u32, TOPK as u32, 32);
    c.num_sms = 4;
    c.ring_slots = 4;
    c.chunk = 2;
    c
}

fn group(base: u32, proxy: bool, timeout: Duration) -> EpGroup {
    let r_n = NODES * GPN;
    let devs: Vec<Device> = (0..r_n).map(|i| Device::emu(base + i)).collect();
    let mut c = cfg(r_n, GPN);
    c.timeout = timeout;
    let tr: Box<dyn Transport> = if proxy {
        let engines = InProcessEngine::mesh(NODES)
            .into_iter()
            .map(|e| Box::new(e) as Box<dyn ep::Engine>)
            .collect();
        let hosted = devs.iter().cloned().map(Some).collect();
        Box::new(ProxyTransport::new(hosted, GPN, engines, timeout).unwrap())
    } else {
        Box::new(InProcessTransport {
            devices: devs.clone(),
            gpus_per_node: GPN,
        })
    };
    EpGroup::new(c, devs, tr).unwrap()
}

/// Random inputs of every rank: BF16 rows, FP8 bytes + scales, routing, weights.
struct Inputs {
    x: Vec<Vec<bf16>>,
    q: Vec<Vec<u8>>,
    s: Vec<Vec<f32>>,
    idx: Vec<Vec<i32>>,
    w: Vec<Vec<f32>>,
    /// Seed of the random "expert outputs" (one row per received row).
    seed: u64,
}

fn inputs(seed: u64) -> Inputs {
    let mut g = rng(seed);
    let r_n = (NODES * GPN) as usize;
    let epr = EXPERTS as usize / r_n;
    let mut inp = Inputs {
        x: vec![],
        q: vec![],
        s: vec![],
        idx: vec![],
        w: vec![],
        seed,
    };
    for r in 0..r_n {
        let t = 20 + 3 * r; // different token counts per rank
        let (idx, _) = routing(&mut g, t, TOPK, EXPERTS as usize, 0, epr, 0);
        inp.x.push(
            (0..t * HIDDEN)
                .map(|_| bf16::from_f32(g.gen_range(-2.0f32..2.0)))
                .collect(),
        );
        // E4M3 bytes without the NaN encodings (0x7f, 0xff)
        inp.q.push(
            (0..t * HIDDEN)
                .map(|_| g.gen_range(0u8..0x7f) | (g.gen::<u8>() & 0x80))
                .collect(),
        );
        inp.s.push(
            (0..t * HIDDEN / 128)
                .map(|_| g.gen_range(0.01f32..4.0))
                .collect(),
        );
        inp.w
            .push((0..t * TOPK).map(|_| g.gen_range(0.05f32..1.0)).collect());
        inp.idx.push(idx);
    }
    inp
}

/// Everything one run produces, as bytes (compared bit for bit between transports).
#[derive(PartialEq, Debug)]
struct Results {
    rows_bf16: Vec<Vec<u8>>,
    rows_fp8: Vec<Vec<u8>>,
    scales_fp8: Vec<Vec<f32>>,
    combined: Vec<Vec<u16>>,
    combined_unweighted: Vec<Vec<u16>>,
    cached_rows: Vec<Vec<u8>>,
    dw: Vec<Vec<u32>>,
    inter_bytes: Vec<u64>,
    /// Bytes the host proxies put during each operation of `inter_bytes` (0 for the direct
    /// transport).
    proxy_put_bytes: Vec<u64>,
}

/// Bytes the proxies of `g` put so far.
fn put_bytes(g: &EpGroup) -> u64 {
    g.transport
        .proxy_stats()
        .iter()
        .map(|(_, s)| s.put_bytes)
        .sum()
}

fn to_bf16(b: &[u8]) -> Vec<bf16> {
    b.chunks(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

fn run(base: u32, proxy: bool, inp: &Inputs) -> Results {
    let mut g = group(base, proxy, EpConfig::default_timeout());
    let r_n = (NODES * GPN) as usize;
    let dev = |r: usize| Device::emu(base + r as u32);
    let up = |r: usize, v: &[bf16]| dev(r).upload(v).unwrap();
    let xb: Vec<Buffer<bf16>> = (0..r_n).map(|r| up(r, &inp.x[r])).collect();
    let qb: Vec<Buffer<u8>> = (0..r_n)
        .map(|r| dev(r).upload(&inp.q[r]).unwrap())
        .collect();
    let sb: Vec<Buffer<f32>> = (0..r_n)
        .map(|r| dev(r).upload(&inp.s[r]).unwrap())
        .collect();
    let ib: Vec<Buffer<i32>> = (0..r_n)
        .map(|r| dev(r).upload(&inp.idx[r]).unwrap())
        .collect();
    let wb: Vec<Buffer<f32>> = (0..r_n)
        .map(|r| dev(r).upload(&inp.w[r]).unwrap())
        .collect();
    let (ir, wr): (Vec<_>, Vec<_>) = (ib.iter().collect(), wb.iter().collect());
    let (mut inter, mut put) = (Vec::new(), Vec::new());
    let mut shipped = |g: &EpGroup| {
        let before: u64 = put.iter().sum();
        put.push(put_bytes(g) - before);
    };
    let xr: Vec<XRef> = xb.iter().map(XRef::Bf16).collect();
    let (outs, handle) = g.dispatch(&xr, &ir, &wr, None).unwrap();
    let handle = handle.unwrap();
    inter.push(g.last.inter_node_bytes);
    shipped(&g);
    let qr: Vec<XRef> = qb.iter().zip(&sb).map(|(q, s)| XRef::Fp8(q, s)).collect();
    let (outs8, _) = g.dispatch(&qr, &ir, &wr, None).unwrap();
    inter.push(g.last.inter_node_bytes);
    shipped(&g);
    // random expert outputs, one row per received row
    let mut gr = rng(inp.seed ^ 0x5eed);
    let ys: Vec<Buffer<bf16>> = outs
        .iter()
        .enumerate()
        .map(|(r, o)| {
            let v: Vec<bf16> = (0..o.m_pad.max(1) * HIDDEN)
                .map(|_| bf16::from_f32(gr.gen_range(-1.0f32..1.0)))
                .collect();
            up(r, &v)
        })
        .collect();
    let yr: Vec<&Buffer<bf16>> = ys.iter().collect();
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    let comb = g.combine(&yr, Some(&rw), &handle).unwrap();
    inter.push(g.last.inter_node_bytes);
    shipped(&g);
    let comb2 = g.combine(&yr, None, &handle).unwrap();
    inter.push(g.last.inter_node_bytes);
    shipped(&g);
    let (cached, _) = g.dispatch(&xr, &ir, &wr, Some(&handle)).unwrap();
    inter.push(g.last.inter_node_bytes);
    shipped(&g);
    let dy: Vec<&Buffer<u8>> = cached.iter().map(|o| &o.recv_x).collect();
    let ntok: Vec<usize> = (0..r_n).map(|r| inp.idx[r].len() / TOPK).collect();
    let tg = g.topk_weight_grad(&yr, &dy, &outs, &ntok).unwrap();
    inter.push(tg.inter_node_bytes);
    shipped(&g);
    Results {
        rows_bf16: outs.iter().map(|o| o.recv_x.to_bytes().unwrap()).collect(),
        rows_fp8: outs8.iter().map(|o| o.recv_x.to_bytes().unwrap()).collect(),
        scales_fp8: outs8
            .iter()
            .map(|o| o.recv_scales.to_vec().unwrap())
            .collect(),
        combined: comb
            .iter()
            .map(|c| c.to_vec().unwrap().iter().map(|v| v.to_bits()).collect())
            .collect(),
        combined_unweighted: comb2
            .iter()
            .map(|c| c.to_vec().unwrap().iter().map(|v| v.to_bits()).collect())
            .collect(),
        cached_rows: cached
            .iter()
            .map(|o| o.recv_x.to_bytes().unwrap())
            .collect(),
        dw: (0..r_n)
            .map(|r| tg.to_vec(r).unwrap().iter().map(|v| v.to_bits()).collect())
            .collect(),
        inter_bytes: inter,
        proxy_put_bytes: put,
    }
    .checked(&outs, &ys, inp)
}

impl Results {
    /// Host references: rows are their sources, combine is the f64 weighted sum of the rows,
    /// dw the f64 dot products.
    fn checked(self, outs: &[ep::DispatchOut], ys: &[Buffer<bf16>], inp: &Inputs) -> Results {
        let r_n = outs.len();
        let mut comb_ref: Vec<Vec<f64>> = inp.x.iter().map(|x| vec![0.0; x.len()]).collect();
        for (d, o) in outs.iter().enumerate() {
            let src = o.recv_src.to_vec().unwrap();
            let rk = o.recv_k.to_vec().unwrap();
            let y = ys[d].to_vec().unwrap();
            let dy = to_bf16(&self.cached_rows[d]);
            for row in 0..o.m_pad {
                if src[row] < 0 {
                    continue;
                }
                let (sr, tok) = ((src[row] >> 24) as usize, (src[row] & 0xff_ffff) as usize);
                let xs = &inp.x[sr][tok * HIDDEN..(tok + 1) * HIDDEN];
                let got = to_bf16(&self.rows_bf16[d][row * 2 * HIDDEN..(row + 1) * 2 * HIDDEN]);
                assert_eq!(got, xs, "rank {d} row {row}");
                let q = &self.rows_fp8[d][row * HIDDEN..(row + 1) * HIDDEN];
                assert_eq!(q, &inp.q[sr][tok * HIDDEN..(tok + 1) * HIDDEN]);
                let k = rk[row] as usize;
                let w = inp.w[sr][tok * TOPK + k] as f64;
                let (mut dot, mut mag) = (0f64, 0f64);
                for i in 0..HIDDEN {
                    let yv = y[row * HIDDEN + i].to_f64();
                    comb_ref[sr][tok * HIDDEN + i] += w * yv;
                    dot += yv * dy[row * HIDDEN + i].to_f64();
                    mag += (yv * dy[row * HIDDEN + i].to_f64()).abs();
                }
                let dw = f32::from_bits(self.dw[sr][tok * TOPK + k]) as f64;
                assert!((dw - dot).abs() <= 3e-5 * mag + 1e-6, "dw {dw} vs {dot}");
            }
        }
        for r in 0..r_n {
            let m = comb_ref[r].iter().fold(0f64, |a, v| a.max(v.abs()));
            for (i, &b) in self.combined[r].iter().enumerate() {
                let got = bf16::from_bits(b).to_f64();
                assert!(
                    (got - comb_ref[r][i]).abs() <= 2e-2 * m,
                    "rank {r} elem {i}"
                );
            }
        }
        self
    }
}

#[test]
fn proxy_matches_direct_transport_bit_for_bit() {
    let inp = inputs(77);
    let t0 = Instant::now();
    let direct = run(800, false, &inp);
    let t1 = Instant::now();
    let proxied = run(810, true, &inp);
    eprintln!(
        "direct {:?}, proxy {:?}; inter-node bytes {:?}",
        t1 - t0,
        t1.elapsed(),
        proxied.inter_bytes
    );
    assert!(proxied.inter_bytes.iter().all(|&b| b > 0));
    // each operation's proxies carried exactly the bytes its kernels counted as inter-node:
    // the written part of each ring slot (BF16 / FP8 dispatch and combine records are of
    // different sizes in one slot size), and each top-k weight gradient as its 4 bytes
    assert_eq!(proxied.proxy_put_bytes, proxied.inter_bytes);
    assert!(direct.proxy_put_bytes.iter().all(|&b| b == 0));
    let proxied = Results {
        proxy_put_bytes: direct.proxy_put_bytes.clone(),
        ..proxied
    };
    assert_eq!(direct, proxied);
}

/// On fresh random routing, the bytes the proxies put for each operation equal the
/// operation's device-counted inter-node bytes (records x record bytes), for BF16 and FP8
/// dispatch, weighted and unweighted combine, cached dispatch and the weight gradients; the
/// records themselves are checked against their sources (`Results::checked`).
#[test]
fn proxies_ship_exactly_the_inter_node_bytes() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    let r = run(840, true, &inputs(seed));
    assert!(r.inter_bytes.iter().all(|&b| b > 0), "seed {seed}");
    assert_eq!(r.proxy_put_bytes, r.inter_bytes, "seed {seed}");
    let c = cfg(NODES * GPN, GPN);
    // FP8 records are shorter than a slot: shipping whole slots would have moved more
    assert!(c.record_bytes(ep::Payload::Fp8) < c.slot_bytes());
}

#[test]
fn stalled_peer_times_out_through_the_proxy() {
    let timeout = Duration::from_millis(500);
    let mut g = group(820, true, timeout);
    let r_n = (NODES * GPN) as usize;
    let d = |r: usize| Device::emu(820 + r as u32);
    let x: Vec<Buffer<bf16>> = (0..r_n)
        .map(|r| d(r).upload(&vec![bf16::from_f32(1.5); 4 * HIDDEN]).unwrap())
        .collect();
    // every token goes to an expert of the other node
    let idx: Vec<Buffer<i32>> = (0..r_n)
        .map(|r| {
            let e = if r < 2 { 12 } else { 0 };
            d(r).upload(&[e, -1, -1, -1].repeat(4)).unwrap()
        })
        .collect();
    let w: Vec<Buffer<f32>> = (0..r_n)
        .map(|r| d(r).upload(&[1.0f32; 16]).unwrap())
        .collect();
    let xr: Vec<XRef> = x.iter().map(XRef::Bf16).collect();
    let t0 = Instant::now();
    let e = g
        .dispatch_ranks(
            &xr,
            &idx.iter().collect::<Vec<_>>(),
            &w.iter().collect::<Vec<_>>(),
            None,
            Some(&[0, 1]), // node 1 never launches
        )
        .err()
        .expect("must time out");
    assert!(matches!(e, EpError::Timeout { rank: 0 | 1, .. }), "{e}");
    eprintln!("{e} after {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(30));
}

#[test]
fn missing_fence_names_the_peer() {
    let timeout = Duration::from_millis(300);
    let mut engines = InProcessEngine::mesh(2);
    let _peer = engines.pop(); // node 1's endpoint exists but nobody runs it
    let devs = vec![Some(Device::emu(830)), None];
    let engines: Vec<Box<dyn ep::Engine>> = vec![Box::new(engines.pop().unwrap())];
    let tr = ProxyTransport::new(devs, 1, engines, timeout).unwrap();
    tr.set_peer_timeout(timeout);
    let t0 = Instant::now();
    match tr.begin() {
        Err(EpError::Timeout { rank, role, .. }) => {
            assert_eq!(rank, 1);
            assert!(role.contains("node 1"), "{role}");
        }
        other => panic!("expected a fence timeout, got {other:?}"),
    }
    assert!(t0.elapsed() >= timeout && t0.elapsed() < timeout * 20);
    drop(tr); // the proxy thread stops
}

/// A proxy transport takes engines of one endpoint per node or one per rank (one process per
/// rank), and names both choices when given anything else.
#[test]
fn endpoints_are_per_node_or_per_rank() {
    let devs = || -> Vec<Option<Device>> { (0..4).map(|r| Some(Device::emu(700 + r))).collect() };
    let t = Duration::from_secs(1);
    for n in [2, 4] {
        let mut engines = InProcessEngine::mesh(n);
        let mine: Vec<Box<dyn ep::Engine>> = vec![Box::new(engines.remove(0))];
        assert!(
            ProxyTransport::new(devs(), 2, mine, t).is_ok(),
            "{n} endpoints"
        );
    }
    let mut engines = InProcessEngine::mesh(3);
    let mine: Vec<Box<dyn ep::Engine>> = vec![Box::new(engines.remove(0))];
    let e = ProxyTransport::new(devs(), 2, mine, t)
        .err()
        .expect("3 endpoints");
    assert!(
        e.to_string()
            .contains("one per node (2) or one per rank (4)"),
        "{e}"
    );
}
