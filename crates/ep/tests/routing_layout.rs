//! Routing, layout and EPLB against their CPU references. Devices 100..
use ep::eplb::{imbalance, rebalance, static_gpu_loads};
use ep::layout::{get_dispatch_layout, layout_ref, LayoutCfg};
use ep::routing::{route, route_ref, RoutingCfg};
use rand::Rng;
use rand::SeedableRng;
use runtime::Device;

#[test]
fn routing_matches_reference_exactly() {
    let dev = Device::emu(100);
    let s = dev.stream(0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for (c, t) in [
        (
            RoutingCfg {
                experts: 64,
                groups: 8,
                topk_groups: 4,
                topk: 8,
                scaling: 2.5,
            },
            96usize,
        ),
        (
            RoutingCfg {
                experts: 32,
                groups: 4,
                topk_groups: 1,
                topk: 4,
                scaling: 1.0,
            },
            33,
        ),
    ] {
        let logits: Vec<f32> = (0..t * c.experts as usize)
            .map(|_| rng.gen_range(-4.0f32..4.0))
            .collect();
        let mut bias: Vec<f32> = (0..c.experts)
            .map(|_| rng.gen_range(-0.1f32..0.1))
            .collect();
        // plant exact ties: two experts with identical logits and bias
        bias[5] = bias[3];
        let mut logits = logits;
        for tok in 0..t {
            logits[tok * c.experts as usize + 5] = logits[tok * c.experts as usize + 3];
        }
        let lb = dev.upload(&logits).unwrap();
        let bb = dev.upload(&bias).unwrap();
        let out = route(&s, &lb, &bb, &c).unwrap();
        let r = route_ref(&logits, &bias, &c).unwrap();
        assert_eq!(out.idx.to_vec().unwrap()[..t * c.topk as usize], r.idx[..]);
        let w = out.weights.to_vec().unwrap();
        for (a, b) in w.iter().zip(&r.weights) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
        // group limit: every token's experts lie in at most topk_groups groups
        let eg = (c.experts / c.groups) as i32;
        for tok in 0..t {
            let mut gs: Vec<i32> = r.idx[tok * c.topk as usize..(tok + 1) * c.topk as usize]
                .iter()
                .map(|e| e / eg)
                .collect();
            gs.sort();
            gs.dedup();
            assert!(gs.len() <= c.topk_groups as usize);
        }
    }
    assert!(RoutingCfg {
        experts: 10,
        groups: 4,
        topk_groups: 1,
        topk: 1,
        scaling: 1.0
    }
    .validate()
    .is_err());
}

#[test]
fn layout_matches_reference() {
    let dev = Device::emu(101);
    let s = dev.stream(0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let c = LayoutCfg {
        experts: 32,
        ranks: 8,
        gpus_per_node: 4,
        topk: 4,
    };
    let t = 77;
    let idx: Vec<i32> = (0..t * 4)
        .map(|i| {
            if i % 13 == 0 {
                -1
            } else {
                rng.gen_range(0..32)
            }
        })
        .collect();
    let b = dev.upload(&idx).unwrap();
    let l = get_dispatch_layout(&s, &b, t, &c)
        .unwrap()
        .to_host()
        .unwrap();
    assert_eq!(l, layout_ref(&idx, &c).unwrap());
}

#[test]
fn eplb_balances_skewed_loads() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let loads: Vec<f64> = (0..64)
        .map(|e| {
            if e % 9 == 0 {
                500.0
            } else {
                rng.gen_range(1.0..20.0)
            }
        })
        .collect();
    for (groups, nodes) in [(8usize, 2usize), (1, 1)] {
        let p = rebalance(&loads, 80, groups, nodes, 8).unwrap();
        assert!(p.replica_count.iter().all(|&c| c >= 1));
        assert_eq!(p.replica_count.iter().sum::<usize>(), 80);
        for (l, ps) in p.log2phy.iter().enumerate() {
            assert_eq!(ps.len(), p.replica_count[l]);
            assert!(ps.iter().all(|&q| p.phy2log[q] == l));
        }
        let before = imbalance(&static_gpu_loads(&loads, 8));
        let after = imbalance(&p.gpu_loads(&loads, 8));
        assert!(after < before, "imbalance {after} vs {before}");
        let mapped = p.map_to_physical(&[0, 9, -1, 63], 2);
        assert_eq!(p.phy2log[mapped[0] as usize], 0);
        assert_eq!(p.phy2log[mapped[1] as usize], 9);
        assert_eq!(mapped[2], -1);
    }
    assert!(rebalance(&loads, 60, 8, 2, 8).is_err());
}
