//! The sanitizers on planted bugs: each kernel has exactly one bug, reported exactly once by the
//! right tool at the PTX line(s) marked `// @` in its body; the fixed variants report nothing.

use emu::{launch, EmuError, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule, Tool, Tools};
use std::collections::BTreeSet;

/// Buffer p0: 1024 bytes written by the host (random). Buffer p1: 1024 bytes, only the first
/// 512 written by the host.
fn run(body: &str, grid: u32, block: u32) -> (String, Result<(), EmuError>) {
    let text = format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n.shared .align 16 .b8 sm[1024];\n\
         .visible .entry k(.param .u64 p0, .param .u64 p1)\n{{\n.reg .pred %p<8>;\n\
         .reg .b32 %r<32>;\n.reg .b64 %rd<16>;\nld.param.u64 %rd1, [p0];\n\
         ld.param.u64 %rd2, [p1];\nmov.u32 %r1, %tid.x;\nmov.u32 %r2, sm;\n\
         shl.b32 %r3, %r1, 2;\nadd.u32 %r4, %r2, %r3;\n{body}\nDONE:\nret;\n}}\n"
    );
    let mem = GlobalMemory::new();
    mem.set_track_writes(true);
    let m = LoadedModule::load(&mem, ptx::parse(&text).expect("parse"), 0).expect("load");
    let a = mem.alloc(1024, 0).unwrap();
    let b = mem.alloc(1024, 0).unwrap();
    let bytes: Vec<u8> = (0..1024).map(|_| rand::random::<u8>() | 1).collect();
    a.write_bytes(0, &bytes);
    b.write_bytes(0, &bytes[..512]);
    let mut p = a.base.to_le_bytes().to_vec();
    p.extend_from_slice(&b.base.to_le_bytes());
    let mut cfg = LaunchConfig::linear(grid, block);
    cfg.sms = 4;
    let opts = LaunchOptions {
        sanitize: Tools::ALL,
        threads: 2,
        ..LaunchOptions::default()
    };
    let r = launch(m.kernel("k").unwrap(), mem.snapshot(), p, &cfg, &opts).map(|_| ());
    (text, r)
}

/// The one report of a planted bug: right tool, exactly the marked lines.
fn planted(body: &str, grid: u32, block: u32, tool: Tool) {
    let (text, r) = run(body, grid, block);
    let e = r.expect_err("the planted bug was not found");
    let f = e
        .findings()
        .unwrap_or_else(|| panic!("not a sanitizer report: {e}"));
    assert_eq!(f.reports.len(), 1, "{f}");
    let rep = &f.reports[0];
    assert_eq!(rep.tool, tool, "{f}");
    let want: BTreeSet<u32> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("// @"))
        .map(|(i, _)| i as u32 + 1)
        .collect();
    let got: BTreeSet<u32> = rep.accesses.iter().map(|a| a.line).collect();
    assert_eq!(got, want, "{f}");
    assert!(f.to_string().contains(tool.name()), "{f}");
    let j = serde_json::to_value(f).unwrap();
    assert_eq!(j["reports"][0]["tool"], tool.name());
}

fn clean(body: &str, grid: u32, block: u32) {
    let (_, r) = run(body, grid, block);
    if let Err(e) = r {
        panic!("false report on a correct kernel: {e}");
    }
}

// ---- racecheck, shared memory ----

const EXCHANGE: &str = "mov.u32 %r9, 0;\nst.shared.u32 [%r4], %r9;\nbar.sync 0;\n\
    st.shared.u32 [%r4], %r1; // @\nFIX\nxor.b32 %r5, %r3, 128;\nadd.u32 %r6, %r2, %r5;\n\
    ld.shared.u32 %r7, [%r6]; // @";

#[test]
fn race_missing_barrier_between_warps() {
    planted(&EXCHANGE.replace("FIX", ""), 1, 64, Tool::Racecheck);
    clean(&EXCHANGE.replace("FIX", "bar.sync 0;"), 1, 64);
}

#[test]
fn race_write_write_two_warps() {
    planted(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 st.shared.u32 [%r2], %r1; // @\n\
         setp.eq.u32 %p2, %r1, 32;\n@%p2 st.shared.u32 [%r2], %r1; // @",
        1,
        64,
        Tool::Racecheck,
    );
}

const INTRA: &str = "setp.eq.u32 %p1, %r1, 0;\n@%p1 st.shared.u32 [%r2], %r1; // @\nFIX\n\
    ld.shared.u32 %r7, [%r2]; // @";

#[test]
fn race_inside_a_warp_without_syncwarp() {
    planted(&INTRA.replace("FIX", ""), 1, 32, Tool::Racecheck);
    clean(&INTRA.replace("FIX", "bar.warp.sync -1;"), 1, 32);
}

#[test]
fn race_atomic_against_plain_store() {
    planted(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 st.shared.u32 [%r2], %r1; // @\n\
         setp.ge.u32 %p2, %r1, 32;\n@%p2 atom.shared.add.u32 %r7, [%r2], 1; // @",
        1,
        64,
        Tool::Racecheck,
    );
    // atomics alone do not race
    clean(
        "mov.u32 %r9, 0;\nsetp.eq.u32 %p1, %r1, 0;\n@%p1 st.shared.u32 [%r2], %r9;\n\
         bar.sync 0;\natom.shared.add.u32 %r7, [%r2], 1;",
        1,
        64,
    );
}

#[test]
fn race_named_barrier_leaves_out_a_warp() {
    planted(
        "setp.lt.u32 %p1, %r1, 32;\n@%p1 st.shared.u32 [%r4], %r1; // @\n\
         setp.lt.u32 %p2, %r1, 64;\n@%p2 bar.sync 1, 64;\nand.b32 %r5, %r3, 127;\n\
         add.u32 %r6, %r2, %r5;\nsetp.ge.u32 %p3, %r1, 32;\n\
         @%p3 ld.shared.u32 %r7, [%r6]; // @",
        1,
        96,
        Tool::Racecheck,
    );
}

/// Warp 0 fills sm[64..] and arrives on an mbarrier; warp 1 reads (after WAIT).
const MBAR: &str = "setp.eq.u32 %p1, %r1, 0;\n@%p1 mbarrier.init.shared::cta.b64 [%r2], 32;\n\
    st.shared.u32 [%r4+256], %r1;\nbar.sync 0;\nsetp.lt.u32 %p2, %r1, 32;\n@!%p2 bra CONSUMER;\n\
    st.shared.u32 [%r4+256], %r1; // @\nmbarrier.arrive.shared::cta.b64 %rd6, [%r2];\nbra DONE;\n\
    CONSUMER:\nWAIT\nld.shared.u32 %r7, [%r4+128]; // @";

#[test]
fn race_consumer_skips_the_mbarrier_wait() {
    planted(&MBAR.replace("WAIT", ""), 1, 64, Tool::Racecheck);
    clean(
        &MBAR.replace(
            "WAIT",
            "LOOP:\nmbarrier.try_wait.parity.shared::cta.b64 %p3, [%r2], 0;\n@!%p3 bra LOOP;",
        ),
        1,
        64,
    );
}

// ---- racecheck, global memory between CTAs ----

#[test]
fn race_read_modify_write_between_ctas() {
    planted(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 ld.global.u32 %r7, [%rd1]; // @\n\
         add.u32 %r7, %r7, 1;\n@%p1 st.global.u32 [%rd1], %r7; // @",
        4,
        32,
        Tool::Racecheck,
    );
    // the same counter with an atomic: no race
    clean(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 atom.global.add.u32 %r7, [%rd1], 1;",
        4,
        32,
    );
}

#[test]
fn race_ctas_write_the_same_elements() {
    planted(
        "cvt.u64.u32 %rd3, %r3;\nadd.u64 %rd4, %rd1, %rd3;\nst.global.u32 [%rd4], %r1; // @",
        2,
        32,
        Tool::Racecheck,
    );
    // each CTA its own elements
    clean(
        "mov.u32 %r8, %ctaid.x;\nshl.b32 %r9, %r8, 7;\nadd.u32 %r9, %r9, %r3;\n\
         cvt.u64.u32 %rd3, %r9;\nadd.u64 %rd4, %rd1, %rd3;\nst.global.u32 [%rd4], %r1;\n\
         ld.global.u32 %r7, [%rd4];",
        2,
        32,
    );
}

// ---- initcheck ----

#[test]
fn init_shared_read_before_any_write() {
    planted("ld.shared.u32 %r7, [%r4]; // @", 1, 32, Tool::Initcheck);
}

#[test]
fn init_global_never_written() {
    planted(
        "ld.global.u32 %r7, [%rd2+512]; // @",
        1,
        32,
        Tool::Initcheck,
    );
    clean("ld.global.u32 %r7, [%rd2+508];", 1, 32);
}

#[test]
fn init_global_partly_written_buffer() {
    planted(
        "shl.b32 %r5, %r1, 5;\ncvt.u64.u32 %rd3, %r5;\nadd.u64 %rd4, %rd2, %rd3;\n\
         ld.global.u32 %r7, [%rd4]; // @",
        1,
        32,
        Tool::Initcheck,
    );
}

#[test]
fn init_shared_off_by_one() {
    planted(
        "st.shared.u32 [%r4], %r1;\nbar.sync 0;\nld.shared.u32 %r7, [%r4+4]; // @",
        1,
        32,
        Tool::Initcheck,
    );
    // a kernel's own global store counts as written
    clean(
        "st.global.u32 [%rd2+600], %r1;\nbar.sync 0;\nld.global.u32 %r7, [%rd2+600];",
        1,
        32,
    );
}

// ---- synccheck ----

#[test]
fn sync_barrier_in_divergent_code() {
    planted(
        "setp.lt.u32 %p1, %r1, 16;\n@!%p1 bra DONE;\nbar.sync 0; // @",
        1,
        32,
        Tool::Synccheck,
    );
}

#[test]
fn sync_predicated_barrier() {
    planted(
        "and.b32 %r5, %r1, 1;\nsetp.eq.u32 %p1, %r5, 0;\n@%p1 bar.sync 0; // @",
        1,
        32,
        Tool::Synccheck,
    );
}

#[test]
fn sync_mismatched_barrier_counts() {
    planted(
        "setp.lt.u32 %p1, %r1, 32;\n@%p1 bar.sync 1, 64;\n@!%p1 bar.sync 1; // @",
        1,
        64,
        Tool::Synccheck,
    );
}

#[test]
fn sync_barrier_count_not_a_multiple_of_the_warp() {
    planted("bar.sync 1, 16; // @", 1, 32, Tool::Synccheck);
}

#[test]
fn sync_barrier_never_completes() {
    planted(
        "setp.ge.u32 %p1, %r1, 32;\n@%p1 bra DONE;\nbar.sync 1, 64; // @",
        1,
        64,
        Tool::Synccheck,
    );
}

#[test]
fn sync_shfl_mask_excludes_executing_lanes() {
    planted(
        "shfl.sync.bfly.b32 %r7, %r1, 1, 31, 0xffff; // @",
        1,
        32,
        Tool::Synccheck,
    );
    clean("shfl.sync.bfly.b32 %r7, %r1, 1, 31, -1;", 1, 32);
}

#[test]
fn sync_lanes_disagree_on_the_mask() {
    planted(
        "setp.eq.u32 %p1, %r1, 0;\nselp.b32 %r8, -1, -2, %p1;\n\
         vote.sync.ballot.b32 %r7, %p1, %r8; // @",
        1,
        32,
        Tool::Synccheck,
    );
}

#[test]
fn sync_syncwarp_names_exited_lanes() {
    planted(
        "setp.ge.u32 %p1, %r1, 16;\n@%p1 exit;\nbar.warp.sync -1; // @",
        1,
        32,
        Tool::Synccheck,
    );
}

#[test]
fn sync_syncwarp_waits_for_lanes_that_leave() {
    planted(
        "setp.ge.u32 %p1, %r1, 16;\n@%p1 bra DONE;\nbar.warp.sync -1; // @",
        1,
        32,
        Tool::Synccheck,
    );
}

#[test]
fn sync_mbarrier_arrive_overflow() {
    planted(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 mbarrier.init.shared::cta.b64 [%r2], 1;\n\
         @%p1 mbarrier.arrive.expect_tx.shared::cta.b64 %rd5, [%r2], 16;\n\
         @%p1 mbarrier.arrive.shared::cta.b64 %rd6, [%r2]; // @",
        1,
        32,
        Tool::Synccheck,
    );
}

#[test]
fn sync_mbarrier_phase_never_completes() {
    planted(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 mbarrier.init.shared::cta.b64 [%r2], 2;\nbar.sync 0;\n\
         @%p1 mbarrier.arrive.shared::cta.b64 %rd6, [%r2];\nLOOP:\n\
         mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r2], 0; // @\n@!%p2 bra LOOP;",
        1,
        32,
        Tool::Synccheck,
    );
}

// ---- memcheck ----

#[test]
fn mem_out_of_bounds_global_store() {
    planted(
        "st.global.u32 [%rd1+1024], %r1; // @",
        1,
        32,
        Tool::Memcheck,
    );
}

#[test]
fn mem_misaligned_global_load() {
    planted("ld.global.u32 %r7, [%rd1+2]; // @", 1, 32, Tool::Memcheck);
}

#[test]
fn mem_out_of_bounds_shared_load() {
    planted("ld.shared.u32 %r7, [%r4+4096]; // @", 1, 32, Tool::Memcheck);
}

#[test]
fn memcheck_reports_every_bad_instruction_and_goes_on() {
    let (text, r) = run(
        "st.global.u32 [%rd1+1024], %r1;\nld.global.u32 %r7, [%rd1+2];\n\
         atom.global.add.u32 %r8, [%rd1+4096], 1;\nld.shared.u32 %r7, [%r4+4096];",
        2,
        32,
    );
    let e = r.expect_err("bad accesses were not found");
    let f = e.findings().unwrap_or_else(|| panic!("{e}"));
    let lines: Vec<u32> = f.reports.iter().map(|r| r.accesses[0].line).collect();
    let first = text.lines().position(|l| l.contains("+1024")).unwrap() as u32 + 1;
    assert_eq!(lines, vec![first, first + 1, first + 2, first + 3], "{f}");
    assert!(f.reports.iter().all(|r| r.tool == Tool::Memcheck), "{f}");
    assert!(f.fault.is_none(), "{f}");
}

/// A module built in-process has no source lines; with the sanitizers on by default it gets the
/// lines of `ptx::print` (what `ptxforge emit` shows), so reports still name a line.
#[test]
fn in_process_modules_are_reported_with_printed_lines() {
    emu::sanitize::set_process_default(Tools::ALL);
    let text = ".version 8.0\n.target sm_90\n.address_size 64\n.shared .align 4 .b8 sm[4];\n\
        .visible .entry k()\n{\n.reg .pred %p<2>;\n.reg .b32 %r<4>;\nmov.u32 %r1, %tid.x;\n\
        mov.u32 %r2, sm;\nsetp.eq.u32 %p1, %r1, 0;\n@%p1 st.shared.u32 [%r2], %r1;\n\
        ld.shared.u32 %r3, [%r2];\nret;\n}\n";
    let mut m = ptx::parse(text).unwrap();
    for item in m.items.iter_mut() {
        if let ptx::Item::Func(f) = item {
            f.loc = Default::default();
            for st in f.body.iter_mut().flatten() {
                if let ptx::Statement::Instr(i) = st {
                    i.loc = Default::default();
                }
            }
        }
    }
    let printed = ptx::print(&m);
    let line = |needle: &str| printed.lines().position(|l| l.contains(needle)).unwrap() as u32 + 1;
    let mem = GlobalMemory::new();
    let lm = LoadedModule::load(&mem, m, 0).unwrap();
    let cfg = LaunchConfig::linear(1, 32);
    let e = launch(
        lm.kernel("k").unwrap(),
        mem.snapshot(),
        vec![],
        &cfg,
        &Default::default(),
    )
    .unwrap_err();
    let f = e.findings().unwrap_or_else(|| panic!("{e}"));
    let got: BTreeSet<u32> = f.reports[0].accesses.iter().map(|a| a.line).collect();
    let want: BTreeSet<u32> = [line("st.shared.u32"), line("ld.shared.u32")].into();
    assert_eq!(got, want, "{f}\n{printed}");
}
