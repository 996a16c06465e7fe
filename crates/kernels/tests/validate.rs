//! Every registered kernel on every target it supports passes `ptx::validate` without errors
//! (operand types, immediates' kinds, state spaces, target requirements).

#[test]
fn every_kernel_validates_clean() {
    let mut errors = Vec::new();
    for info in kernels::registry() {
        for arch in info.targets {
            let t = builder::Target::new(arch);
            let m = match info.generate(&t, &info.test_shapes[0]) {
                Ok(m) => m,
                Err(e) => {
                    errors.push(format!("{} {arch}: generate: {e}", info.name));
                    continue;
                }
            };
            let diags = ptx::validate::validate(&m);
            for d in diags.iter().filter(|d| d.is_error()) {
                errors.push(format!("{} {arch}: {d}", info.name));
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
