//! Every registered kernel x every supported target assembles with ptxas, with 0 spills.

use kernels::registry;

#[test]
fn every_kernel_assembles_without_spills() {
    if ptx::ptxas::ptxas_for_tests("library kernels").is_none() {
        return;
    }
    let mut failures = Vec::new();
    for info in registry() {
        for arch in info.targets {
            let t = builder::Target::new(arch);
            let shape = info.test_shapes[0];
            let m = match info.generate(&t, &shape) {
                Ok(m) => m,
                Err(e) => {
                    failures.push(format!("{} {arch}: generate: {e}", info.name));
                    continue;
                }
            };
            let text = ptx::print(&m);
            match ptx::ptxas::assemble(&text, arch, &Default::default()) {
                Ok(rep) => {
                    let k = rep.kernel(&info.name).cloned().unwrap_or_default();
                    eprintln!(
                        "{:<44} {arch:<7} regs {:>3} spill st/ld {}/{} smem {}",
                        info.name,
                        k.registers,
                        k.spill_stores_bytes,
                        k.spill_loads_bytes,
                        k.shared_bytes
                    );
                    if k.spill_stores_bytes + k.spill_loads_bytes + k.stack_frame_bytes > 0 {
                        failures.push(format!("{} {arch}: spills {k:?}", info.name));
                    }
                }
                Err(e) => failures.push(format!("{} {arch}: ptxas: {e}", info.name)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn registry_params_match_the_generated_ptx() {
    for info in registry() {
        let t = builder::Target::new(info.targets[info.targets.len() - 1]);
        let m = info.generate(&t, &info.test_shapes[0]).unwrap();
        let f = m.entries().next().unwrap();
        assert_eq!(f.name, info.name);
        let names: Vec<&str> = f.params.iter().map(|p| p.name.as_str()).collect();
        let want: Vec<&str> = info.params.iter().map(|p| p.name).collect();
        assert_eq!(names, want, "{}", info.name);
    }
}
