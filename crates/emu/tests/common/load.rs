//! Checking and loading a test kernel, shared by test files that include it with
//! `#[path = "common/load.rs"] mod load;`.

use emu::{GlobalMemory, LoadedModule};

/// Checks `text` (validator, printer round trip, and ptxas with 0 spills for each of `archs`
/// when installed; `label` names the test in ptxas's skip message) and loads it.
pub fn load_checked(mem: &GlobalMemory, text: &str, archs: &[&str], label: &str) -> LoadedModule {
    let module = ptx::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let errors: Vec<_> = ptx::validate(&module)
        .into_iter()
        .filter(|d| d.is_error())
        .collect();
    assert!(errors.is_empty(), "validator: {errors:?}\n{text}");
    assert_eq!(ptx::parse(&ptx::print(&module)).unwrap(), module);
    if ptx::ptxas::ptxas_for_tests(label).is_some() {
        for arch in archs {
            let t = text.replace("sm_90a", arch);
            let rep = ptx::ptxas::assemble(&t, arch, &Default::default())
                .unwrap_or_else(|e| panic!("ptxas ({arch}) rejects the test PTX: {e}\n{t}"));
            for k in &rep.kernels {
                let spills = k.spill_stores_bytes + k.spill_loads_bytes;
                assert_eq!(spills, 0, "ptxas ({arch}): {} spills", k.name);
            }
        }
    }
    LoadedModule::load(mem, module, 0).unwrap()
}
