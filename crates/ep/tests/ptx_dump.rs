//! Dumps the dispatch/combine PTX for several configs into `$EP_PTX_DUMP` (refactor check).
use builder::Target;
use ep::comm::{combine_kernel, dispatch_kernel, EpConfig, Payload};

#[test]
fn dump_ptx() {
    let Ok(dir) = std::env::var("EP_PTX_DUMP") else {
        return;
    };
    let mut cfgs = [
        EpConfig::new(8, 4, 64, 1024, 8, 512),
        EpConfig::new(1, 1, 8, 128, 2, 16),
        EpConfig::new(4, 2, 16, 256, 4, 64),
        EpConfig::new(2, 2, 32, 384, 6, 100),
        EpConfig::new(16, 8, 256, 7168, 8, 4096),
    ];
    cfgs[2].num_sms = 4;
    cfgs[2].ring_slots = 8;
    cfgs[2].chunk = 3;
    cfgs[3].ring_slots = 1;
    cfgs[3].chunk = 1;
    for arch in ["sm_80", "sm_90a"] {
        let t = Target::new(arch);
        for (i, cfg) in cfgs.iter().enumerate() {
            for (p, name) in [(Payload::Fp8, "fp8"), (Payload::Bf16, "bf16")] {
                let m = dispatch_kernel(&t, cfg, p).unwrap();
                std::fs::write(
                    format!("{dir}/dispatch-{arch}-{i}-{name}.ptx"),
                    ptx::print(&m),
                )
                .unwrap();
            }
            let m = combine_kernel(&t, cfg).unwrap();
            std::fs::write(format!("{dir}/combine-{arch}-{i}.ptx"), ptx::print(&m)).unwrap();
        }
    }
}
