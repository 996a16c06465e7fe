//! Faults are diagnostics naming kernel, CTA, thread, PTX line and address — never crashes.

use emu::{launch, EmuError, FaultKind, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};

fn run(body: &str, params: &[u64], block: u32, shared: u32) -> Result<(), EmuError> {
    let text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.extern .shared .align 16 .b8 smem[];\n.visible .entry k(.param .u64 p0, .param .u64 p1)\n{{\n.reg .pred %p<4>;\n.reg .b32 %r<16>;\n.reg .b64 %rd<16>;\n.reg .f32 %f<4>;\nld.param.u64 %rd1, [p0];\nld.param.u64 %rd2, [p1];\nmov.u32 %r1, %tid.x;\n{body}\nret;\n}}\n"
    );
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&text).map_err(EmuError::from)?, 0)?;
    let mut p = Vec::new();
    for v in params {
        p.extend_from_slice(&v.to_le_bytes());
    }
    while p.len() < 16 {
        p.extend_from_slice(&0u64.to_le_bytes());
    }
    let cfg = LaunchConfig {
        grid: [2, 1, 1],
        block: [block, 1, 1],
        shared_bytes: shared,
        sms: 132,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    launch(
        m.kernel("k")?,
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .map(|_| ())
}

#[test]
fn misaligned_global_access() {
    let mem_text = "add.s64 %rd3, %rd1, 2;\nld.global.u32 %r2, [%rd3];";
    // p0 is a valid global allocation; +2 is misaligned for a 4-byte load.
    let mem = GlobalMemory::new();
    let a = mem.alloc(64, 0).unwrap();
    let text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p0)\n{{\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\nld.param.u64 %rd1, [p0];\n{mem_text}\nret;\n}}\n"
    );
    let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        sms: 132,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    let e = launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        a.base.to_le_bytes().to_vec(),
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap_err();
    let s = e.to_string();
    assert!(
        matches!(e.fault(), Some(FaultKind::Misaligned { size: 4, .. })),
        "{s}"
    );
    let line = text
        .lines()
        .position(|l| l.starts_with("ld.global.u32"))
        .unwrap()
        + 1;
    assert!(
        s.contains(&format!("PTX line {line}")) && s.contains(&format!("{:#x}", a.base + 2)),
        "{s}"
    );
}

#[test]
fn shared_memory_overflow_and_out_of_range() {
    // Beyond the dynamic shared memory the launch provides.
    let e = run(
        "mov.u32 %r2, smem;\nst.shared.u32 [%r2+256], %r1;",
        &[],
        32,
        128,
    )
    .unwrap_err();
    assert!(
        matches!(
            e.fault(),
            Some(FaultKind::OutOfBounds {
                space: "shared",
                ..
            })
        ),
        "{e}"
    );
    // More shared memory than the target allows is refused at launch.
    let e = run("", &[], 32, 200 * 1024).unwrap_err();
    assert!(
        e.to_string().contains("shared memory") && e.to_string().contains("sm_80"),
        "{e}"
    );
}

#[test]
fn integer_division_by_zero() {
    let e = run("sub.u32 %r2, %r1, 5;\nsetp.eq.u32 %p1, %r2, 0;\nselp.u32 %r3, 0, 1, %p1;\ndiv.u32 %r4, 100, %r3;", &[], 32, 0).unwrap_err();
    let s = e.to_string();
    assert!(matches!(e.fault(), Some(FaultKind::DivideByZero)), "{s}");
    assert!(s.contains("thread (5,0,0)"), "{s}");
}

#[test]
fn unsupported_instruction_is_named() {
    let e = run("tcgen05.fence::before_thread_sync;", &[], 32, 0);
    // Unknown to the parser (a Blackwell-only instruction): a parse error naming it.
    let s = e.unwrap_err().to_string();
    assert!(s.contains("tcgen05"), "{s}");
    // Known to the IR but not to the emulator: a decode error naming line and instruction.
    let e = run("redux.sync.min.f32 %f1, %f2, 0xffffffff;", &[], 32, 0).unwrap_err();
    let s = e.to_string();
    assert!(
        matches!(e, EmuError::Unsupported { .. })
            && s.contains("redux")
            && s.contains("floating-point")
            && s.contains("line"),
        "{s}"
    );
}

#[test]
fn trap_is_reported() {
    let e = run("setp.eq.u32 %p1, %r1, 3;\n@%p1 trap;", &[], 32, 0).unwrap_err();
    assert!(
        matches!(e.fault(), Some(FaultKind::Trap)) && e.to_string().contains("thread (3,0,0)"),
        "{e}"
    );
}
