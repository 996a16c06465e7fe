//! Builder-made kernels carry the Rust location of every emitting call: emulator faults name it
//! together with the (nonzero) line of the printed PTX, and `print_annotated` shows it.

use builder::*;
use runtime::{Device, LaunchConfig};

/// A kernel whose store lands 1 GiB past its buffer; returns it with the line of the `st` call.
fn faulting_kernel() -> (TypedKernel<(GlobalPtr<f32>,)>, u32) {
    let k = KernelBuilder::new("oob_store", Target::sm80()).typed();
    let (mut k, out) = k.param::<GlobalPtr<f32>>("out");
    let i = k.global_index_x();
    let far = k.add(i, 1u32 << 28);
    let v = k.cvt::<f32, u32>(i);
    let st_line = line!() + 1;
    k.st(out.offset(far), v);
    (k.finish().unwrap(), st_line)
}

#[test]
fn fault_names_rust_file_line_and_ptx_line() {
    let (kernel, st_line) = faulting_kernel();
    let dev = Device::emu(41);
    let f = dev.load_kernel(&kernel).unwrap();
    let buf = dev.alloc::<f32>(32).unwrap();
    let s = dev.stream(0);
    s.launch_typed(&f, &LaunchConfig::linear(1, 32), (&buf,))
        .unwrap();
    let err = s.synchronize().unwrap_err();
    let msg = err.to_string();
    let here = format!("{}:{st_line}", file!());
    assert!(msg.contains("out-of-bounds"), "{msg}");
    assert!(msg.contains(&here), "fault should name {here}: {msg}");
    // The PTX line is that of the `st` in the printed module, not 0.
    let text = ptx::print(kernel.module());
    let ptx_line = text
        .lines()
        .position(|l| l.trim_start().starts_with("st.global.f32"))
        .unwrap()
        + 1;
    assert!(msg.contains(&format!("PTX line {ptx_line}:")), "{msg}");
    let runtime::RuntimeError::Emu(emu::EmuError::Fault { site, .. }) = err else {
        panic!("not a fault: {msg}");
    };
    assert_eq!(site.line as usize, ptx_line);
    assert_eq!(site.rust.as_deref(), Some(here.as_str()));
}

/// Sanitizer reports of builder-made kernels name the Rust call too: memcheck on the same
/// out-of-bounds store reports it (and lets the launch finish) with the `st` call's file:line.
#[test]
fn sanitizer_report_names_rust_file_and_line() {
    let (kernel, st_line) = faulting_kernel();
    let dev = Device::emu(42);
    let f = dev.load_kernel(&kernel).unwrap();
    let buf = dev.alloc::<f32>(32).unwrap();
    let s = dev.stream(0);
    let mut cfg = LaunchConfig::linear(1, 32);
    cfg.sanitize = Some(emu::Tools::parse("memcheck").unwrap());
    s.launch_typed(&f, &cfg, (&buf,)).unwrap();
    let err = s.synchronize().unwrap_err();
    let here = format!("{}:{st_line}", file!());
    let runtime::RuntimeError::Emu(e) = &err else {
        panic!("not an emulator error: {err}");
    };
    let findings = e
        .findings()
        .unwrap_or_else(|| panic!("not a sanitizer report: {err}"));
    let a = &findings.reports[0].accesses[0];
    assert_eq!(a.rust.as_deref(), Some(here.as_str()), "{err}");
    assert!(a.line > 0, "{err}");
    assert!(
        err.to_string().contains(&format!("(emitted at {here})")),
        "{err}"
    );
}

#[test]
fn annotated_print_shows_locations_and_keeps_lines() {
    let (kernel, st_line) = faulting_kernel();
    let plain = ptx::print(kernel.module());
    let ann = ptx::printer::print_annotated(kernel.module());
    assert_eq!(plain.lines().count(), ann.lines().count());
    let st = ann
        .lines()
        .find(|l| l.trim_start().starts_with("st.global.f32"))
        .unwrap();
    assert!(st.ends_with(&format!("// {}:{st_line}", file!())), "{st}");
    // Every instruction line has a location; other lines are unchanged.
    for (p, a) in plain.lines().zip(ann.lines()) {
        assert!(a.starts_with(p), "{a}");
    }
    // The annotated text is still PTX that parses to the same module.
    assert_eq!(ptx::parse(&ann).unwrap(), *kernel.module());
}

/// Validator diagnostics of builder-made kernels name the printed-PTX line and the Rust line.
#[test]
fn validator_diagnostics_name_both_lines() {
    let mut k = KernelBuilder::new("bad_imm", Target::sm80());
    let x = k.param::<f32>("x");
    let out = k.param::<GlobalPtr<f32>>("out");
    let y = k.reg::<f32>();
    let line = line!() + 1;
    k.emit(
        ptx::Opcode::Add,
        [ptx::Mod::Type(ptx::Ty::F32)],
        [y.op(), x.op(), ptx::Operand::Imm(ptx::Imm::Int(1))],
    );
    k.st(out, y);
    let m = k.finish().unwrap();
    let diags = ptx::validate::validate(&m);
    let d = diags.iter().find(|d| d.is_error()).expect("an error");
    let text = ptx::print(&m);
    let ptx_line = text
        .lines()
        .position(|l| l.trim_start().starts_with("add.f32"))
        .unwrap()
        + 1;
    assert_eq!(d.line as usize, ptx_line, "{d}");
    let here = format!("{}:{line}", file!());
    assert_eq!(d.rust.as_deref(), Some(here.as_str()), "{d}");
    assert!(d.to_string().contains(&here), "{d}");
}
