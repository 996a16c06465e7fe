//! Hostile inputs to the CLI (issue 20, items 1-3): each class of input that used to panic,
//! hang, allocate without bound or run silently wrong is refused with a one-line error naming
//! the field (or, for kernels, faults with the address). docs/RELIABILITY.md lists the limits.

use std::path::PathBuf;
use std::process::{Command, Output};

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ptxforge-limits-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ptxforge(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(args)
        .current_dir(dir())
        .output()
        .expect("spawn ptxforge")
}

/// The command failed with a one-line `ptxforge: error:` message containing every needle.
#[track_caller]
fn fails_with(args: &[&str], needles: &[&str]) {
    let o = ptxforge(args);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success(),
        "{args:?} succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{args:?}: exit {:?}: {err}",
        o.status
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: `{n}` not in: {err}");
    }
}

/// Writes `body` as a one-kernel module `k(.param .u64 p)` and returns its file name.
fn kernel(name: &str, decls: &str, body: &str) -> String {
    let text = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n{decls}\n\
         .visible .entry k(.param .u64 p)\n{{\n\
         .reg .b64 %rd<8>;\n.reg .b32 %r<8>;\n{body}\nret;\n}}\n"
    );
    let file = format!("{name}.ptx");
    std::fs::write(dir().join(&file), text).unwrap();
    file
}

fn run(file: &str, grid: &str, block: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["run", file, "--grid", grid, "--block", block, "--arg"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.push("out:u32:64".into());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

#[track_caller]
fn run_fails(file: &str, grid: &str, block: &str, extra: &[&str], needles: &[&str]) {
    let v = run(file, grid, block, extra);
    let args: Vec<&str> = v.iter().map(|s| s.as_str()).collect();
    fails_with(&args, needles);
}

/// Addresses near 2^64 (a negative offset) in the global, local and param spaces are
/// out-of-bounds faults naming the address, not an index past the emulator's tables; a
/// negative local offset never lands in another thread's local memory.
#[test]
fn wrapping_addresses_fault_with_the_address() {
    let g = kernel(
        "wrap_global",
        "",
        "mov.u64 %rd1, 0xfffffffffffffffc;\nld.global.u32 %r1, [%rd1];\nst.global.u32 [%rd1], %r1;",
    );
    run_fails(
        &g,
        "1",
        "32",
        &[],
        &["out-of-bounds global access of 4 bytes at address 0xfffffffffffffffc"],
    );
    let l = kernel(
        "wrap_local",
        "",
        ".local .align 4 .b8 buf[16];\nmov.u64 %rd1, buf;\nadd.s64 %rd2, %rd1, -4;\n\
         mov.u32 %r1, 7;\nst.local.u32 [%rd2], %r1;",
    );
    run_fails(
        &l,
        "1",
        "64",
        &[],
        &["out-of-bounds local access of 4 bytes at address 0xfffffffffffffffc"],
    );
    let p = kernel(
        "wrap_param",
        "",
        "mov.u64 %rd1, 0xfffffffffffffffc;\nld.param.u32 %r1, [%rd1];",
    );
    run_fails(
        &p,
        "1",
        "32",
        &[],
        &["out-of-bounds param access of 4 bytes at address 0xfffffffffffffffc"],
    );
}

/// Launch shapes whose products wrap in 32 bits, and grid dimensions past the hardware's.
#[test]
fn launch_shapes_are_checked_in_64_bits() {
    let k = kernel("shape", "", "");
    run_fails(
        &k,
        "1",
        "134217729,32",
        &[],
        &["134217729x32x1", "4294967328 threads", "1..=1024"],
    );
    run_fails(
        &k,
        "2147483648",
        "32",
        &[],
        &["grid x dimension 2147483648", "2147483647"],
    );
    run_fails(&k, "1,65536", "32", &[], &["grid y/z", "65535"]);
    // static + dynamic shared memory must not wrap to a small size
    let s = kernel(
        "shared_wrap",
        ".extern .shared .align 16 .b8 dyn[];\n.shared .align 16 .b8 st[1024];",
        "mov.u64 %rd1, dyn;",
    );
    run_fails(
        &s,
        "1",
        "32",
        &["--shared", "4294967040"],
        &["dynamic shared memory", "227 KiB"],
    );
}

/// Sizes declared in the PTX are checked against the emulator's limits before any allocation.
#[test]
fn declared_sizes_are_bounded() {
    let r = kernel(
        "regs",
        ".visible .func f()\n{\n.reg .b32 %x<100000000>;\nret;\n}",
        "",
    );
    run_fails(
        &r,
        "1",
        "32",
        &[],
        &["registers declared", "100000000", "65536"],
    );
    let l = kernel(
        "local_big",
        "",
        ".local .b8 big[4294967312];\nmov.u64 %rd1, big;",
    );
    run_fails(
        &l,
        "1",
        "32",
        &[],
        &[".local bytes per thread", "4294967312", "524288"],
    );
    let s = kernel(
        "shared_big",
        ".shared .b8 sm[4294967312];",
        "mov.u64 %rd1, sm;",
    );
    run_fails(&s, "1", "32", &[], &[".shared variables", "4294967312"]);
    let g = kernel(
        "global_big",
        ".global .b8 gm[1099511627776];",
        "mov.u64 %rd1, gm;",
    );
    run_fails(
        &g,
        "1",
        "32",
        &[],
        &["allocation of 1099511627776 bytes", "limit"],
    );
    let o = kernel("outs", "", "");
    run_fails(
        &o,
        "1",
        "32",
        &["--arg", "out:u64:18446744073709551615"],
        &["out:u64:18446744073709551615", "buffer limit"],
    );
}

/// Counts and alignments that do not fit their type are parse errors, not truncated.
#[test]
fn oversized_counts_and_alignments_are_parse_errors() {
    let r = kernel("reg_u32", "", ".reg .b32 %q<4294967296>;");
    fails_with(
        &["fmt", &r],
        &["register count 4294967296 does not fit in 32 bits"],
    );
    run_fails(&r, "1", "32", &[], &["register count 4294967296"]);
    let a = kernel("align3", ".global .align 3 .b32 g;", "");
    fails_with(&["fmt", &a], &[".align 3 is not a power of two"]);
    let a = kernel("align_big", ".global .align 8589934592 .b32 g;", "");
    fails_with(&["fmt", &a], &[".align 8589934592 does not fit in 32 bits"]);
}

/// `run` refuses what `check` refuses: a store to the read-only constant space.
#[test]
fn run_refuses_what_check_refuses() {
    let k = kernel(
        "st_const",
        ".const .b32 c;",
        "mov.u32 %r1, 5;\nst.const.u32 [c], %r1;",
    );
    let o = ptxforge(&["check", "--no-ptxas", &k]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !o.status.success() && out.contains("read-only .const space"),
        "{out}"
    );
    run_fails(&k, "1", "32", &[], &["does not validate", "const"]);
}

/// An `.npy` whose header promises more data than the file holds, or a shape whose byte count
/// overflows, is refused.
#[test]
fn npy_headers_must_match_the_data() {
    let k = kernel("npy", "", "");
    let npy = |name: &str, shape: &str, data: usize| {
        let mut h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({shape}), }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        b.extend(vec![0u8; data]);
        std::fs::write(dir().join(name), b).unwrap();
        format!("in:{name}")
    };
    let short = npy("short.npy", "64,", 64 * 4 - 16);
    run_fails(
        &k,
        "1",
        "32",
        &["--arg", &short],
        &["short.npy", "256 bytes of data", "holds 240 bytes"],
    );
    let huge = npy("huge.npy", "4611686018427387905, 4", 16);
    run_fails(
        &k,
        "1",
        "32",
        &["--arg", &huge],
        &["huge.npy", "exceeds the 64 GiB buffer limit"],
    );
    // a shape whose byte count (not element count) passes 2^64
    let wide = npy("wide.npy", "2305843009213693953,", 16);
    run_fails(
        &k,
        "1",
        "32",
        &["--arg", &wide],
        &["wide.npy", "exceeds the 64 GiB buffer limit"],
    );
}

/// Durations and sizes from flags: no overflow, no division by zero, no unbounded request.
#[test]
fn flag_values_are_bounded() {
    let k = kernel("timeout", "", "");
    run_fails(
        &k,
        "1",
        "32",
        &["--timeout", "1e300"],
        &["--timeout", "at most 1e6"],
    );
    fails_with(&["bench", "gemm", "--scale", "0"], &["--scale 0"]);
    fails_with(
        &["bench", "attn", "--seqlen", "18446744073709551615"],
        &["--seqlen 18446744073709551615", "limit of 1048576"],
    );
    fails_with(
        &[
            "bench",
            "attn",
            "--decode-batch",
            "4096",
            "--decode-len",
            "1048576",
        ],
        &["operands would hold", "limit of 4294967296"],
    );
    fails_with(&["bench", "attn", "--reps", "0"], &["--reps 0"]);
    fails_with(
        &["bench", "emu", "--size", "4294967232"],
        &["GEMM size 4294967232", "4096"],
    );
    fails_with(
        &[
            "gemm", "--m", "128", "--n", "128", "--k", "128", "--groups", "0",
        ],
        &["--groups 0"],
    );
    fails_with(
        &["schedule", "1f1b", "--pp", "1000000", "--chunks", "8"],
        &["PP = 1000000", "1024"],
    );
    fails_with(
        &["schedule", "1f1b", "--chunks", "1000000000"],
        &["1000000000 micro-batches", "65536"],
    );
    // a 1024-rank timeline would be a 12,000 x 42,000-pixel PNG
    fails_with(
        &[
            "schedule", "1f1b", "--pp", "1024", "--chunks", "1", "--png", "big.png",
        ],
        &["PNG of", "above the limit of 67108864 pixels"],
    );
    assert!(!dir().join("big.png").exists());
    fails_with(
        &[
            "schedule", "1f1b", "--f", "1e300", "--b", "1e300", "--fb", "1e300",
        ],
        &["invalid costs: f = ", "must be between 0 and 1e9"],
    );
}

/// Library GEMM shapes the host API does not support are refused before any launch or
/// reference work, naming the rule.
#[test]
fn unsupported_gemm_shapes_are_refused() {
    fails_with(
        &[
            "gemm", "--m", "128", "--n", "128", "--k", "100", "--dtype", "fp8",
        ],
        &["FP8 GEMMs need n and k multiples of 128", "k = 100"],
    );
    fails_with(
        &[
            "gemm",
            "--m",
            "200",
            "--n",
            "128",
            "--k",
            "128",
            "--groups",
            "2",
            "--layout",
            "contiguous",
        ],
        &["m = 200 must be a multiple of 128"],
    );
    fails_with(
        &[
            "gemm", "--m", "128", "--n", "128", "--k", "128", "--dtype", "fp8", "--kernel", "mma",
            "--groups", "3",
        ],
        &["--groups 3 needs --layout"],
    );
}

/// MoE configurations: sizes that multiply past u32, and DeepSeek-V3's full size, are refused
/// up front with what they need.
#[test]
fn moe_sizes_are_refused_up_front() {
    fails_with(
        &["moe", "--nodes", "65536", "--gpus-per-node", "65536"],
        &["nodes", "65536", "limit of 64"],
    );
    let o = ptxforge(&["moe", "--config", "v3"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success());
    assert!(
        err.contains("memory: this configuration needs about") && err.contains("GiB"),
        "{err}"
    );
}
