//! Traffic model = our kernels' traffic: route with the `ep` crate's reference router (the
//! simulator's router must pick the same experts), run its
//! hierarchical dispatch (FP8 and BF16 payloads) and combine on emulated nodes, and compare the
//! bytes the kernels counted per link class with the simulator's exact record count and with
//! its fan-out based byte model, byte for byte.

use ep::comm::{EpConfig, EpGroup, XRef};
use ep::routing::{route_ref, RoutingCfg};
use ep::transport::InProcessTransport;
use half::bf16;
use rand::{Rng, SeedableRng};
use runtime::{Buffer, Device};
use sim::comm::CommLoad;
use sim::traffic::{self, EpShape, Payload, Traffic};

struct Case {
    base: u32,
    nodes: u32,
    gpn: u32,
    experts: u32,
    topk: u32,
    groups: u32,
    topk_groups: u32,
    tokens: usize,
    seed: u64,
}

fn group(c: &Case, hidden: u32) -> EpGroup {
    let ranks = c.nodes * c.gpn;
    let devs: Vec<Device> = (0..ranks).map(|i| Device::emu(c.base + i)).collect();
    let mut cfg = EpConfig::new(ranks, c.gpn, c.experts, hidden, c.topk, c.tokens as u32);
    cfg.num_sms = 4;
    cfg.ring_slots = 4;
    cfg.chunk = 2;
    let tr = InProcessTransport {
        devices: devs.clone(),
        gpus_per_node: c.gpn,
    };
    EpGroup::new(cfg, devs, Box::new(tr)).expect("ep group")
}

fn same(got: &ep::comm::CommStats, want: Traffic, what: &str) {
    assert_eq!(
        got.inter_node_bytes, want.inter_node_bytes,
        "{what}: inter-node"
    );
    assert_eq!(
        got.intra_node_bytes, want.intra_node_bytes,
        "{what}: intra-node"
    );
}

fn run_case(c: &Case) {
    let hidden = 128usize;
    let ranks = (c.nodes * c.gpn) as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(c.seed);
    let rc = RoutingCfg {
        experts: c.experts,
        groups: c.groups,
        topk_groups: c.topk_groups,
        topk: c.topk,
        scaling: 2.5,
    };
    let bias: Vec<f32> = (0..c.experts).map(|_| rng.gen_range(-0.1..0.1)).collect();
    let dev = |r: usize| Device::emu(c.base + r as u32);
    let (mut idx, mut q, mut sc, mut xb, mut ib, mut wb) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for r in 0..ranks {
        // Uneven token counts per rank; rank 1 sends nothing.
        let t = if r == 1 { 0 } else { c.tokens - r };
        let logits: Vec<f32> = (0..t * c.experts as usize)
            .map(|_| rng.gen_range(-4.0f32..4.0))
            .collect();
        let out = route_ref(&logits, &bias, &rc).expect("routing");
        // The simulator's router picks the same experts as the ep crate's.
        for (row, want) in logits
            .chunks(c.experts as usize)
            .zip(out.idx.chunks(c.topk as usize))
        {
            let got = sim::routing::route(
                row,
                &bias,
                c.groups as usize,
                c.topk_groups as usize,
                c.topk as usize,
            );
            let want: Vec<usize> = want.iter().map(|&e| e as usize).collect();
            assert_eq!(got, want, "router disagreement");
        }
        let x: Vec<f32> = (0..t * hidden)
            .map(|_| rng.gen_range(-2.0f32..2.0))
            .collect();
        let (qb, s) = ep::comm::quantize_1x128_ref(&x, hidden);
        let xbf: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        q.push(dev(r).upload(&qb).unwrap());
        sc.push(dev(r).upload(&s).unwrap());
        xb.push(dev(r).upload(&xbf).unwrap());
        ib.push(dev(r).upload(&out.idx).unwrap());
        wb.push(dev(r).upload(&out.weights).unwrap());
        idx.push(out.idx);
    }
    let shape = EpShape {
        ranks,
        gpus_per_node: c.gpn as usize,
        experts: c.experts as usize,
        hidden,
        topk: c.topk as usize,
    };
    let rec = traffic::records(&shape, &idx).unwrap();
    assert!(
        rec.inter_node > 0 || c.nodes == 1,
        "case routes across nodes"
    );
    assert!(rec.intra_node > 0);

    let mut g = group(c, hidden as u32);
    let ibr: Vec<&Buffer<i32>> = ib.iter().collect();
    let wbr: Vec<&Buffer<f32>> = wb.iter().collect();
    let xr: Vec<XRef> = (0..ranks).map(|r| XRef::Fp8(&q[r], &sc[r])).collect();
    let (outs, handle) = g.dispatch(&xr, &ibr, &wbr, None).expect("dispatch");
    let handle = handle.expect("handle");
    same(&g.last, rec.dispatch(&shape, Payload::Fp8), "fp8 dispatch");

    // The fan-out the timing model uses gives the same bytes.
    let fan = sim::routing::fanout_from_indices(
        shape.experts,
        ranks,
        shape.gpus_per_node,
        shape.topk,
        &idx,
    );
    let load = CommLoad::normal(
        rec.tokens as f64,
        &fan,
        shape.dispatch_record_bytes(Payload::Fp8) as f64,
    );
    assert!((load.ib - g.last.inter_node_bytes as f64).abs() < 1e-6 * load.ib.max(1.0));
    assert!((load.nvl - g.last.intra_node_bytes as f64).abs() < 1e-6 * load.nvl);
    assert_eq!(
        (fan.gpus_touched * rec.tokens as f64).round() as u64,
        rec.gpu_copies
    );

    // Combine of random expert outputs, weighted.
    let ys: Vec<Buffer<bf16>> = outs
        .iter()
        .enumerate()
        .map(|(r, o)| {
            let v: Vec<bf16> = (0..o.m_pad * hidden)
                .map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0)))
                .collect();
            dev(r).upload(&v).unwrap()
        })
        .collect();
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    g.combine(&ys.iter().collect::<Vec<_>>(), Some(&rw), &handle)
        .expect("combine");
    same(&g.last, rec.combine(&shape), "combine");

    // BF16 dispatch reusing the layout (the backward's combine^T).
    let xr: Vec<XRef> = xb.iter().map(XRef::Bf16).collect();
    g.dispatch(&xr, &ibr, &wbr, Some(&handle))
        .expect("bf16 dispatch");
    same(
        &g.last,
        rec.dispatch(&shape, Payload::Bf16),
        "bf16 dispatch",
    );
}

#[test]
fn two_nodes_of_two() {
    run_case(&Case {
        base: 400,
        nodes: 2,
        gpn: 2,
        experts: 16,
        topk: 4,
        groups: 4,
        topk_groups: 2,
        tokens: 24,
        seed: 1,
    });
}

#[test]
fn one_node_of_four() {
    run_case(&Case {
        base: 410,
        nodes: 1,
        gpn: 4,
        experts: 16,
        topk: 3,
        groups: 2,
        topk_groups: 2,
        tokens: 20,
        seed: 2,
    });
}

#[test]
fn four_nodes_of_two_node_limited() {
    run_case(&Case {
        base: 420,
        nodes: 4,
        gpn: 2,
        experts: 32,
        topk: 4,
        groups: 8,
        topk_groups: 3,
        tokens: 16,
        seed: 3,
    });
}
