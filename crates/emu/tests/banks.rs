//! Shared-memory bank-conflict profile: one warp runs textbook access patterns, each on its own
//! PTX line, and the per-line wavefront counts must match the counts worked out by hand from
//! the 32-bank x 4-byte model (phases by access width, one phase per ldmatrix matrix).

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};

const KERNEL: &str = r#".version 8.0
.target sm_90
.address_size 64
.shared .align 1024 .b8 tile[16384];
.visible .entry banks(.param .u64 src)
{
    .reg .pred %p<2>;
    .reg .b32 %r<40>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [src];
    mov.u32 %r1, %tid.x;
    mov.u32 %r20, tile;
    shl.b32 %r2, %r1, 2;
    add.u32 %r2, %r2, %r20;
    st.shared.u32 [%r2], %r1; // UNIT
    shl.b32 %r3, %r1, 3;
    add.u32 %r3, %r3, %r20;
    st.shared.u32 [%r3], %r1; // STRIDE2
    shl.b32 %r4, %r1, 7;
    add.u32 %r4, %r4, %r20;
    st.shared.u32 [%r4], %r1; // STRIDE32
    ld.shared.u32 %r5, [tile+64]; // BROADCAST
    shl.b32 %r6, %r1, 4;
    add.u32 %r6, %r6, %r20;
    ld.shared.v4.u32 {%r7, %r8, %r9, %r10}, [%r6]; // V4UNIT
    shl.b32 %r11, %r1, 8;
    add.u32 %r11, %r11, %r20;
    ld.shared.v4.u32 {%r7, %r8, %r9, %r10}, [%r11]; // V4PITCH256
    ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r12, %r13, %r14, %r15}, [%r11]; // LDM_PLAIN
    shl.b32 %r16, %r1, 7;
    and.b32 %r17, %r1, 7;
    shl.b32 %r17, %r17, 4;
    add.u32 %r16, %r16, %r17;
    add.u32 %r16, %r16, %r20;
    stmatrix.sync.aligned.m8n8.x4.shared.b16 [%r16], {%r12, %r13, %r14, %r15}; // STM_SWZ
    cvta.shared.u64 %rd2, tile;
    mul.wide.u32 %rd3, %r1, 8;
    add.s64 %rd4, %rd2, %rd3;
    st.u32 [%rd4], %r1; // GENERIC
    mul.wide.u32 %rd5, %r1, 16;
    add.s64 %rd5, %rd1, %rd5;
    cp.async.cg.shared.global [%r6], [%rd5], 16; // CPASYNC
    cp.async.wait_all;
    setp.lt.u32 %p1, %r1, 16;
    @%p1 st.shared.u32 [%r4], %r1; // HALF32
    ld.global.u32 %r30, [%rd1]; // GLOBAL
    ret;
}
"#;

fn line_of(tag: &str) -> u32 {
    KERNEL
        .lines()
        .position(|l| l.ends_with(&format!("// {tag}")))
        .map(|i| i as u32 + 1)
        .unwrap_or_else(|| panic!("no line tagged {tag}"))
}

fn run(profile: bool) -> emu::LaunchStats {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(KERNEL).unwrap(), 0).unwrap();
    let src = mem.alloc(512, 0).unwrap();
    let cfg = LaunchConfig {
        sms: 1,
        ..LaunchConfig::linear(1, 32)
    };
    let opts = LaunchOptions {
        bank_profile: profile,
        ..Default::default()
    };
    launch(
        m.kernel("banks").unwrap(),
        mem.snapshot(),
        src.base.to_le_bytes().to_vec(),
        &cfg,
        &opts,
    )
    .unwrap()
}

#[test]
fn wavefronts_per_line_match_the_bank_model() {
    let st = run(true);
    let rep = st.banks.expect("profile requested");
    let get = |tag: &str| {
        let line = line_of(tag);
        rep.lines
            .iter()
            .find(|l| l.line == line)
            .unwrap_or_else(|| panic!("line {line} ({tag}) not profiled: {:?}", rep.lines))
            .counts
    };
    // (tag, wavefronts, ideal) for one request each
    let want = [
        ("UNIT", 1, 1),
        ("STRIDE2", 2, 1),
        ("STRIDE32", 32, 1),
        ("BROADCAST", 1, 1),
        // 16-byte vectors: 4 quarter-warp phases; 256-byte pitch puts each quarter's 8 rows on
        // the same 4 banks (8-way)
        ("V4UNIT", 4, 4),
        ("V4PITCH256", 32, 4),
        // ldmatrix rows 256 B apart: 8 wavefronts per matrix; 128B-swizzled rows: 1
        ("LDM_PLAIN", 32, 4),
        ("STM_SWZ", 4, 4),
        // a generic address into shared memory counts; 8-byte pitch on 4-byte stores: 2-way
        ("GENERIC", 2, 1),
        ("CPASYNC", 4, 4),
        // only the 16 active lanes take part
        ("HALF32", 16, 1),
    ];
    let mut total = (0u64, 0u64, 0u64);
    for (tag, wf, ideal) in want {
        let c = get(tag);
        assert_eq!(
            (c.requests, c.wavefronts, c.ideal),
            (1, wf, ideal),
            "{tag} (line {})",
            line_of(tag)
        );
        total = (total.0 + 1, total.1 + wf, total.2 + ideal);
    }
    assert!(
        !rep.lines.iter().any(|l| l.line == line_of("GLOBAL")),
        "global loads are not shared requests"
    );
    assert_eq!(
        (rep.total.requests, rep.total.wavefronts, rep.total.ideal),
        total
    );
    // most conflicting first: the 32-way store, then the 28-extra vector/matrix lines
    assert_eq!(rep.lines[0].line, line_of("STRIDE32"));
    assert!(rep.lines[0].instruction.contains("st.shared.u32"));
    // without the option there is no profile
    assert!(run(false).banks.is_none());
}
