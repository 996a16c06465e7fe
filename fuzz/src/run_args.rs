//! Fuzz entry for `ptxforge run`'s argument and `.npy` handling (`runtime::runner`).
//!
//! The first byte chooses what the rest is:
//! - odd: a `.npy` file for [`runtime::runner::parse_npy`] (what `--arg in:FILE.npy` reads).
//!   Oracles: the data holds exactly the elements the shape promises (checked product), never
//!   more bytes than follow the header, every element decodes, and encoding the array and
//!   parsing it back gives the same array.
//! - even: lines of text: `--grid`, then `--block` ([`runtime::runner::parse_dim3`]), then
//!   `--arg` specs ([`runtime::runner::ArgSpec::parse`]), with `save INDEX=PATH` lines for
//!   [`runtime::runner::parse_save`] and `timeout SECS` lines for
//!   [`runtime::runner::parse_timeout`]. Oracles: accepted dimensions are positive, a save
//!   names an existing buffer argument, an accepted timeout is the duration asked for.

use runtime::runner::{self, ArgSpec};
use std::path::Path;

/// Runs one input; panics when an oracle is violated.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 1 {
        npy(rest);
    } else {
        args(&String::from_utf8_lossy(rest));
    }
}

/// The length of a `.npy` preamble and header (magic, version, header length, header), when
/// the file is long enough to say.
fn header_len(bytes: &[u8]) -> Option<usize> {
    let major = *bytes.get(6)?;
    let (len, pre) = if major == 1 {
        (
            u16::from_le_bytes([*bytes.get(8)?, *bytes.get(9)?]) as usize,
            10,
        )
    } else {
        let b = bytes.get(8..12)?;
        (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 12)
    };
    Some(pre + len)
}

fn npy(bytes: &[u8]) {
    let Ok(a) = runner::parse_npy(bytes) else {
        return;
    };
    let size = a.dtype.size();
    assert_eq!(a.data.len() % size, 0, "data is not whole elements");
    let n = a.shape.iter().try_fold(1u64, |p, &d| p.checked_mul(d));
    assert_eq!(
        n,
        Some(a.len() as u64),
        "shape {:?} but {} elements",
        a.shape,
        a.len()
    );
    let after_header = bytes.len() - header_len(bytes).expect("accepted without a header");
    assert!(
        a.data.len() <= after_header,
        "{} data bytes but only {after_header} follow the header",
        a.data.len()
    );
    for i in [0, a.len() / 2, a.len().wrapping_sub(1)] {
        if i < a.len() {
            let _ = a.get_f64(i);
        }
    }
    let mut out = Vec::new();
    runner::encode_npy(&mut out, &a).expect("encoding an accepted array");
    let back = runner::parse_npy(&out).expect("parsing an encoded array");
    assert_eq!(back, a, "encode/parse round trip");
}

fn args(text: &str) {
    let mut lines = text.lines();
    for flag in ["--grid", "--block"] {
        let Some(l) = lines.next() else { return };
        if let Ok(d) = runner::parse_dim3(l) {
            assert!(d.iter().all(|&x| x > 0), "{flag} `{l}` gave {d:?}");
        }
    }
    let mut specs: Vec<ArgSpec> = Vec::new();
    for l in lines {
        if let Some(s) = l.strip_prefix("save ") {
            if let Ok((i, _)) = runner::parse_save(s, &specs) {
                assert!(
                    matches!(specs.get(i), Some(ArgSpec::In(_) | ArgSpec::Out { .. })),
                    "--save `{s}` accepted for {:?}",
                    specs.get(i)
                );
            }
        } else if let Some(t) = l.strip_prefix("timeout ") {
            if let Ok(secs) = t.trim().parse::<f64>() {
                if let Ok(d) = runner::parse_timeout(secs) {
                    let err = (d.as_secs_f64() - secs).abs();
                    assert!(err <= secs * 1e-9 + 1e-9, "--timeout {secs} gave {d:?}");
                }
            }
        } else {
            match ArgSpec::parse(l, None) {
                Ok(a) => {
                    let based = ArgSpec::parse(l, Some(Path::new("/base")));
                    assert!(based.is_ok(), "`{l}` parses without a base only");
                    specs.push(a);
                }
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        }
    }
}
