//! The `run_args` fuzz target's entry function (`fuzz/src/run_args.rs`: `ptxforge run`'s
//! `--grid`/`--block`/`--arg`/`--save`/`--timeout` parsing and `.npy` reading) over its seed
//! corpus — the hand-written argument lists in `fuzz/seeds/run_args/` and every `.npy` file of
//! the repository — and the inputs the fuzzer found (`tests/fuzz/run_args/`), so CI exercises
//! the target on stable. The fuzzer itself: docs/RELIABILITY.md ("Fuzzing").

#[path = "../../../fuzz/src/run_args.rs"]
mod run_args;

#[path = "../../../fuzz/src/repo_files.rs"]
mod repo_files;

use repo_files::{files, root};

#[test]
fn seed_corpus_passes_the_oracles() {
    let r = root();
    let args = files(&r.join("fuzz/seeds/run_args"), "");
    assert!(args.len() >= 3, "{} argument seeds", args.len());
    for p in &args {
        run_args::check(&std::fs::read(p).unwrap());
    }
    let npys = files(&r.join("tests-data/corpus"), ".npy");
    assert!(npys.len() >= 90, "{} .npy seeds", npys.len());
    for p in &npys {
        let bytes = std::fs::read(p).unwrap();
        // numpy wrote these: they must be read, not just survive the oracles.
        if let Err(e) = runtime::runner::parse_npy(&bytes) {
            panic!("{}: {e}", p.display());
        }
        // Mode byte 1: the rest is a `.npy` file.
        let mut data = vec![1u8];
        data.extend(bytes);
        run_args::check(&data);
    }
}

#[test]
fn fuzzer_findings_pass_the_oracles() {
    let found = files(&root().join("crates/runtime/tests/fuzz/run_args"), "");
    for p in &found {
        run_args::check(&std::fs::read(p).unwrap());
    }
}

/// `.npy` bytes: version 1 (2-byte header length) or 2 (4-byte), the header dict, the data.
fn npy(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = b"\x93NUMPY".to_vec();
    b.extend([version, 0]);
    if version == 1 {
        b.extend((header.len() as u16).to_le_bytes());
    } else {
        b.extend((header.len() as u32).to_le_bytes());
    }
    b.extend(header.as_bytes());
    b.extend(data);
    b
}

fn npy_err(bytes: &[u8]) -> String {
    let e = runtime::runner::parse_npy(bytes).expect_err("must be rejected");
    let mut framed = vec![1u8];
    framed.extend(bytes);
    run_args::check(&framed);
    e
}

#[test]
fn npy_well_formed_is_read() {
    let data: Vec<u8> = [1.5f32, -2.0, 3.25]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }\n";
    let a = runtime::runner::parse_npy(&npy(1, h, &data)).unwrap();
    assert_eq!(a.shape, vec![3]);
    assert_eq!(a.data, data);
    let h = "{'descr': '>i2', 'fortran_order': False, 'shape': [1, 2], }";
    let a = runtime::runner::parse_npy(&npy(2, h, &[0x01, 0x02, 0xff, 0xfe])).unwrap();
    assert_eq!(a.data, vec![0x02, 0x01, 0xfe, 0xff], "big endian swapped");
}

/// Found while writing the fuzz oracles: a header length of up to 4 GiB was allocated as given
/// (npyz reads the header into a buffer of that size) before anything checked it.
#[test]
fn npy_header_length_past_the_file_is_rejected() {
    let mut b = npy(
        2,
        "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }",
        &[],
    );
    b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = npy_err(&b);
    assert!(e.contains("header runs past the end"), "{e}");
    assert!(npy_err(b"\x93NUMPY\x01").contains("truncated"));
    assert!(npy_err(b"\x93NUMPY\x07\x00\x00\x00").contains("version 7"));
    assert!(npy_err(b"PK\x03\x04").contains("magic"));
}

/// Found while writing the fuzz oracles: npyz multiplies the dimensions unchecked (a panic
/// with overflow checks, a wrapped small element count without them).
#[test]
fn npy_shape_overflowing_64_bits_is_rejected() {
    for shape in [
        "(4294967296, 4294967296)",
        "(0, 4294967296, 4294967297)",
        "[18446744073709551615, 2]",
    ] {
        let h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        let e = npy_err(&npy(1, &h, &[0; 16]));
        assert!(
            e.contains("more elements than fit in 64 bits"),
            "{shape}: {e}"
        );
    }
    let e = npy_err(&npy(1, "{'descr': '<f4', 'shape': (1, -2)}", &[0; 8]));
    assert!(e.contains("bad dimension `-2`"), "{e}");
    let e = npy_err(&npy(1, "{'descr': '<f4', 'fortran_order': False}", &[0; 8]));
    assert!(e.contains("'shape' exactly once"), "{e}");
}

/// Found while writing the fuzz oracles: the data was taken as the last `n * size` bytes of
/// the whole file, so a header promising more data than follows it read its own header bytes
/// as data, and a product that wrapped passed the length check.
#[test]
fn npy_data_must_match_the_header() {
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (8,), }";
    // 8 floats promised, 4 present: the header is longer than the missing 16 bytes.
    let e = npy_err(&npy(1, h, &[0; 16]));
    assert!(
        e.contains(
            "declares 8 elements of 4 bytes (32 bytes of data), the file holds 16 bytes of data"
        ),
        "{e}"
    );
    let e = npy_err(&npy(1, h, &[0; 40]));
    assert!(e.contains("the file holds 40 bytes of data"), "{e}");
    // 2^62 elements of 4 bytes wrap to 0 bytes in 64-bit arithmetic.
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }";
    let e = npy_err(&npy(1, h, &[]));
    assert!(
        e.contains("4611686018427387904") && e.contains("exceeds the 64 GiB buffer limit"),
        "{e}"
    );
}

/// `--timeout 1e300` passed the positive-and-finite check and then panicked in
/// `Duration::from_secs_f64` (issue 20); now a typed error.
#[test]
fn timeout_too_large_for_a_duration_is_rejected() {
    use runtime::runner::parse_timeout;
    assert_eq!(
        parse_timeout(2.5).unwrap(),
        std::time::Duration::from_millis(2500)
    );
    for bad in [1e300, 1.9e19, f64::INFINITY, 1e6 + 1.0] {
        let e = parse_timeout(bad).unwrap_err().to_string();
        assert!(e.contains("at most 1e6 seconds"), "{bad}: {e}");
    }
    for bad in [0.0, -1.0, f64::NAN] {
        let e = parse_timeout(bad).unwrap_err().to_string();
        assert!(e.contains("must be above 0"), "{bad}: {e}");
    }
}

#[test]
fn save_must_name_a_buffer_argument() {
    use runtime::runner::{parse_save, ArgSpec};
    let args: Vec<ArgSpec> = ["out:f32:4", "u32:3"]
        .iter()
        .map(|s| ArgSpec::parse(s, None).unwrap())
        .collect();
    let (i, p) = parse_save("0=o.npy", &args).unwrap();
    assert_eq!((i, p.to_str().unwrap()), (0, "o.npy"));
    for (bad, msg) in [
        ("1=o.npy", "argument 1 is a scalar"),
        ("2=o.npy", "argument 2 does not exist (2 arguments given)"),
        ("x=o.npy", "bad index `x`"),
        ("o.npy", "expected INDEX=PATH.npy"),
        ("0=", "missing file name"),
        ("99999999999999999999999=o.npy", "bad index"),
    ] {
        let e = parse_save(bad, &args).unwrap_err().to_string();
        assert!(e.contains(msg) && e.contains("--save"), "{bad}: {e}");
    }
}

/// Found by the `run_args` fuzzer (crates/runtime/tests/fuzz/run_args/npy-nested-brackets-hang,
/// a 157-byte file with 19 `[` in its header): npyz's header parser backtracks exponentially
/// on unclosed nested brackets, so `ptxforge run --arg in:FILE.npy` hung for minutes. Headers
/// nesting deeper than numpy's own are now refused before npyz sees them.
#[test]
fn npy_deeply_nested_header_is_refused_at_once() {
    let t = std::time::Instant::now();
    let found =
        std::fs::read(root().join("crates/runtime/tests/fuzz/run_args/npy-nested-brackets-hang"))
            .unwrap();
    let e = npy_err(&found[1..]);
    assert!(e.contains("nests brackets deeper than 4"), "{e}");
    let h = format!(
        "{{'descr': '<f4', {} 'fortran_order': False, 'shape': (1,), }}",
        "[".repeat(40)
    );
    let e = npy_err(&npy(1, &h, &[0; 4]));
    assert!(e.contains("nests brackets deeper than 4"), "{e}");
    // numpy's own nesting passes
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
    assert!(runtime::runner::parse_npy(&npy(1, h, &[0; 4])).is_ok());
    assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
}
