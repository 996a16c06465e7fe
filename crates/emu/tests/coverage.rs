//! The emulator's coverage report ([`emu::coverage`]) against what the decoder really does:
//! every opcode the parser knows is emulated or listed here as not emulated (the list cannot go
//! stale either way), and `unsupported` finds exactly the instructions `LoadedModule::kernel`
//! refuses, with their lines.

use emu::coverage::{coverage, unsupported};
use emu::{GlobalMemory, LoadedModule};

/// Opcodes the parser knows and the emulator does not run yet (issue 16 item 3 adds them).
const NOT_EMULATED: &[&str] = &[];

#[test]
fn every_parsed_opcode_is_emulated_or_listed() {
    let rows = coverage();
    assert_eq!(rows.len(), ptx::Opcode::ALL.len());
    let mut wrong = Vec::new();
    for r in &rows {
        assert!(ptx::Opcode::from_name(r.opcode).is_some(), "{}", r.opcode);
        let listed = NOT_EMULATED.contains(&r.opcode);
        if r.emulated == listed {
            wrong.push(format!(
                "{}: emulated={} listed={} ({})",
                r.opcode, r.emulated, listed, r.note
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "coverage disagrees with the list:\n{}",
        wrong.join("\n")
    );
}

fn module(body: &str) -> ptx::Module {
    let text = format!(
        ".version 8.1\n.target sm_90a\n.address_size 64\n\
         .visible .entry k(.param .u64 p)\n{{\n{body}\n}}\n"
    );
    ptx::parse(&text).unwrap()
}

/// What `LoadedModule::kernel` (the path `run` takes) says about kernel `k`.
fn loads(m: &ptx::Module) -> bool {
    let mem = GlobalMemory::new();
    let lm = LoadedModule::load(&mem, m.clone(), 0).unwrap();
    lm.kernel("k").is_ok()
}

#[test]
fn unsupported_names_every_refused_line_and_agrees_with_load() {
    // lines: 5 .version... header is 5 lines, then the body starts at line 6
    let bad = module(
        "    .reg .b64 %rd<4>;\n    .reg .b32 %r<4>;\n    .reg .f32 %f<4>;\n    ld.param.u64 %rd1, [p];\n\
         \x20   redux.sync.min.f32 %f1, %f2, 0xffffffff;\n\
         \x20   add.u32 %r2, %r1, 1;\n\
         \x20   redux.sync.min.f32 %f1, %f2, 0xffffffff;\n    ret;",
    );
    let refused = unsupported(&bad);
    let lines: Vec<u32> = refused.iter().map(|r| r.line).collect();
    assert_eq!(lines, vec![10, 12], "{refused:?}");
    assert!(refused.iter().all(|r| r.kernel == "k" && !r.why.is_empty()));
    assert!(!loads(&bad));

    let good = module(
        "    .reg .b64 %rd<4>;\n    .reg .b32 %r<4>;\n    ld.param.u64 %rd1, [p];\n\
         \x20   ld.global.u32 %r1, [%rd1];\n    add.u32 %r2, %r1, 1;\n\
         \x20   st.global.u32 [%rd1], %r2;\n    ret;",
    );
    assert!(unsupported(&good).is_empty());
    assert!(loads(&good));
}
