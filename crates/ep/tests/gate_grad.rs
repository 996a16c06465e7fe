//! Gate backward: per-(token, k) weight gradients put back to the home ranks (`ep_topk_grad`)
//! and the routing backward (`ep_route_bwd`), against f64 CPU references on random inputs.
mod common;
use common::*;
use ep::comm::XRef;
use ep::grad::{route_backward, route_backward_ref};
use ep::routing::{route, RoutingCfg};
use half::bf16;
use rand::Rng;
use runtime::{Buffer, Device};

#[test]
fn topk_weight_grad_reaches_every_home_slot() {
    let (nodes, gpn) = (2u32, 2u32);
    let (experts, hidden, topk, t) = (16u32, 256u32, 4usize, 48usize);
    let base = 600;
    let mut g = group(base, nodes, gpn, experts, hidden, topk as u32, 64, 4);
    let r_n = (nodes * gpn) as usize;
    let epr = experts as usize / r_n;
    let h = hidden as usize;
    let mut rng = rng(7);
    let dev = |r: usize| Device::emu(base + r as u32);
    let mut dys = Vec::new();
    let mut idxs = Vec::new();
    let mut ib = Vec::new();
    let mut wb = Vec::new();
    let mut ntok = Vec::new();
    for r in 0..r_n {
        // rank 2 receives nothing (mode 2 skips it for everyone)
        let tr = t - 4 * r;
        let dy: Vec<bf16> = (0..tr * h)
            .map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0)))
            .collect();
        let (idx, w) = routing(&mut rng, tr, topk, experts as usize, 2, epr, 2);
        ib.push(dev(r).upload(&idx).unwrap());
        wb.push(dev(r).upload(&w).unwrap());
        dys.push(dy);
        idxs.push(idx);
        ntok.push(tr);
    }
    let dyb: Vec<Buffer<bf16>> = (0..r_n).map(|r| dev(r).upload(&dys[r]).unwrap()).collect();
    let xr: Vec<XRef> = dyb.iter().map(XRef::Bf16).collect();
    let (outs, _) = g
        .dispatch(
            &xr,
            &ib.iter().collect::<Vec<_>>(),
            &wb.iter().collect::<Vec<_>>(),
            None,
        )
        .unwrap();
    // random expert outputs per received row
    let ys: Vec<Vec<bf16>> = outs
        .iter()
        .map(|o| {
            (0..o.m_pad.max(1) * h)
                .map(|_| bf16::from_f32(rng.gen_range(-2.0f32..2.0)))
                .collect()
        })
        .collect();
    let yb: Vec<Buffer<bf16>> = (0..r_n).map(|r| dev(r).upload(&ys[r]).unwrap()).collect();
    let got = g
        .topk_weight_grad(
            &yb.iter().collect::<Vec<_>>(),
            &outs.iter().map(|o| &o.recv_x).collect::<Vec<_>>(),
            &outs,
            &ntok,
        )
        .unwrap();
    // reference: dw[t, k] = <dY_t, y of the row holding (t, k)>, found through the expert's
    // rank and segment (independent of recv_src/recv_k: search the rank's rows by content)
    let mut inter = 0u64;
    let mut intra = 0u64;
    for home in 0..r_n {
        let dw = got.to_vec(home).unwrap();
        assert_eq!(dw.len(), ntok[home] * topk);
        for tok in 0..ntok[home] {
            for k in 0..topk {
                let e = idxs[home][tok * topk + k] as usize;
                let er = e / epr;
                let le = e % epr;
                let o = &outs[er];
                let src = ((home as i32) << 24) | tok as i32;
                let srcs = o.recv_src.to_vec().unwrap();
                let b = o.expert_base[le] as usize;
                let rows: Vec<usize> = (b..b + o.counts[le] as usize)
                    .filter(|&r| srcs[r] == src)
                    .collect();
                assert_eq!(rows.len(), 1, "token {tok} of rank {home} at expert {e}");
                let row = rows[0];
                let want: f64 = (0..h)
                    .map(|c| dys[home][tok * h + c].to_f64() * ys[er][row * h + c].to_f64())
                    .sum();
                let v = dw[tok * topk + k] as f64;
                assert!(
                    (v - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "rank {home} token {tok} k {k}: {v} vs {want}"
                );
                if er != home {
                    if er / gpn as usize == home / gpn as usize {
                        intra += 4;
                    } else {
                        inter += 4;
                    }
                }
            }
        }
    }
    assert_eq!(got.inter_node_bytes, inter);
    assert_eq!(got.intra_node_bytes, intra);
    assert!(inter > 0 && intra > 0);
}

#[test]
fn route_backward_matches_f64() {
    let c = RoutingCfg {
        experts: 64,
        groups: 8,
        topk_groups: 4,
        topk: 8,
        scaling: 2.5,
    };
    let t = 300usize;
    let d = Device::emu(700);
    let mut rng = rng(11);
    let logits: Vec<f32> = (0..t * 64).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
    let bias: Vec<f32> = (0..64).map(|_| rng.gen_range(-0.1f32..0.1)).collect();
    let st = d.stream(0);
    let lb = d.upload(&logits).unwrap();
    let out = route(&st, &lb, &d.upload(&bias).unwrap(), &c).unwrap();
    let dw: Vec<f32> = (0..t * 8).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let dwb: Vec<u8> = dw.iter().flat_map(|v| v.to_le_bytes()).collect();
    let g = route_backward(
        &st,
        &lb,
        &out.idx,
        &out.weights,
        &d.upload(&dwb).unwrap(),
        &c,
    )
    .unwrap();
    let (idx, w) = (out.idx.to_vec().unwrap(), out.weights.to_vec().unwrap());
    let want = route_backward_ref(&logits, &idx, &w, &dw, &c).unwrap();
    let mut bad = idx.clone();
    bad[5] = -1;
    assert!(route_backward_ref(&logits, &bad, &w, &dw, &c).is_err());
    let got = g.dlogits.to_vec().unwrap();
    let gb = g.dlogits_bf16.to_vec().unwrap();
    let gt = g.dlogits_t_bf16.to_vec().unwrap();
    let amax = want.iter().fold(0f64, |a, v| a.max(v.abs()));
    assert!(amax > 0.01);
    let mut nonzero = 0;
    for tok in 0..t {
        for e in 0..64 {
            let (v, r) = (got[tok * 64 + e] as f64, want[tok * 64 + e]);
            assert!(
                (v - r).abs() <= 2e-6 * amax,
                "token {tok} expert {e}: {v} vs {r}"
            );
            assert_eq!(gb[tok * 64 + e], bf16::from_f32(got[tok * 64 + e]));
            assert_eq!(gt[e * t + tok], gb[tok * 64 + e]);
            nonzero += (r != 0.0) as usize;
        }
    }
    // exactly the selected experts get a gradient
    assert_eq!(nonzero, t * 8);
    // finite-difference check of the formula itself on a few tokens (f64 forward)
    for tok in [0usize, 17, 299] {
        let fwd = |lg: &[f32]| -> f64 {
            let sg = |e: usize| 1.0 / (1.0 + (-(lg[e] as f64)).exp());
            let s: f64 = (0..8).map(|j| sg(idx[tok * 8 + j] as usize)).sum();
            (0..8)
                .map(|j| dw[tok * 8 + j] as f64 * 2.5 * sg(idx[tok * 8 + j] as usize) / s)
                .sum()
        };
        let row: Vec<f32> = logits[tok * 64..(tok + 1) * 64].to_vec();
        for j in 0..8 {
            let e = idx[tok * 8 + j] as usize;
            let (mut p, mut m) = (row.clone(), row.clone());
            let eps = 1e-2f32;
            p[e] += eps;
            m[e] -= eps;
            let fd = (fwd(&p) - fwd(&m)) / (2.0 * eps as f64);
            assert!(
                (fd - want[tok * 64 + e]).abs() < 1e-4,
                "finite difference {fd} vs {}",
                want[tok * 64 + e]
            );
        }
    }
}
