//! Every kernel of the crate (routing, layout, dispatch, combine, gate backward) assembles with ptxas (sm_90a and sm_80) without spills.
use builder::Target;
use ep::comm::{combine_kernel, dispatch_kernel, EpConfig, Payload};
use ep::grad::{route_bwd_kernel, topk_grad_kernel};
use ep::layout::{layout_kernel, slots_kernel, LayoutCfg};
use ep::routing::{route_kernel, RoutingCfg};

#[test]
fn kernels_assemble_without_spills() {
    if ptx::ptxas::ptxas_for_tests("ep kernels").is_none() {
        return;
    }
    let cfg = EpConfig::new(8, 4, 64, 1024, 8, 512);
    let rc = RoutingCfg {
        experts: 64,
        groups: 8,
        topk_groups: 4,
        topk: 8,
        scaling: 2.5,
    };
    let lc = LayoutCfg {
        experts: 64,
        ranks: 8,
        gpus_per_node: 4,
        topk: 8,
    };
    for arch in ["sm_90a", "sm_80"] {
        let t = Target::new(arch);
        let mods = vec![
            ("ep_route", route_kernel(&t, &rc).unwrap()),
            ("ep_layout", layout_kernel(&t, &lc).unwrap()),
            ("ep_slots", slots_kernel(&t, &lc).unwrap()),
            (
                "ep_dispatch",
                dispatch_kernel(&t, &cfg, Payload::Fp8).unwrap(),
            ),
            (
                "ep_dispatch",
                dispatch_kernel(&t, &cfg, Payload::Bf16).unwrap(),
            ),
            ("ep_combine", combine_kernel(&t, &cfg).unwrap()),
            ("ep_topk_grad", topk_grad_kernel(&t, 1024, 8, 4).unwrap()),
            ("ep_route_bwd", route_bwd_kernel(&t, &rc).unwrap()),
        ];
        for (name, m) in mods {
            let text = ptx::print(&m);
            let rep = ptx::ptxas::assemble(&text, arch, &Default::default())
                .unwrap_or_else(|e| panic!("{name} {arch}: {e}"));
            let k = rep.kernel(name).unwrap();
            assert_eq!(
                k.spill_stores_bytes + k.spill_loads_bytes,
                0,
                "{name} {arch} spills: {k:?}"
            );
        }
    }
}
