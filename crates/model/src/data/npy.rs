//! Reading a NumPy `.npy` array of integer token ids (format versions 1-3).
//!
//! Accepted: little-endian or byte-sized signed/unsigned integers of 1, 2, 4 or 8 bytes
//! (`<i4`, `|u1`, ...), any shape (flattened in C order; Fortran order only for 1-D), every id in
//! `0..vocab`. Refused with a message: a bad magic or header, another dtype (floats,
//! big-endian), a header that promises more data than the file holds (or less: trailing bytes),
//! a negative or out-of-vocabulary id (its index is named).

/// Errors of [`tokens`]: a format problem, or an id outside the vocabulary.
#[derive(Debug, PartialEq)]
pub enum NpyError {
    Format(String),
    Vocab { index: usize, id: i64 },
}

fn bad<T>(msg: impl Into<String>) -> Result<T, NpyError> {
    Err(NpyError::Format(msg.into()))
}

/// The parsed header: element type, C/Fortran order and shape.
#[derive(Debug, PartialEq)]
pub struct Header {
    pub descr: String,
    pub fortran_order: bool,
    pub shape: Vec<usize>,
}

/// Token ids of a `.npy` file's bytes, each checked against `vocab`.
pub fn tokens(bytes: &[u8], vocab: u32) -> Result<Vec<u32>, NpyError> {
    let (h, data) = parse(bytes)?;
    let (size, signed) = dtype(&h.descr)?;
    if h.fortran_order && h.shape.len() > 1 {
        return bad("Fortran-ordered arrays of more than one dimension are not supported");
    }
    let n = h
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(size).map(|b| (n, b)));
    let Some((n, want)) = n else {
        return bad(format!("shape {:?} overflows", h.shape));
    };
    if data.len() != want {
        return bad(format!(
            "header promises {n} elements of {size} bytes ({want} bytes) but the file holds {} data bytes",
            data.len()
        ));
    }
    let mut out = Vec::with_capacity(n);
    for (index, c) in data.chunks_exact(size).enumerate() {
        let mut b = [0u8; 8];
        b[..size].copy_from_slice(c);
        let id = if signed {
            let shift = 64 - 8 * size as u32;
            (i64::from_le_bytes(b) << shift) >> shift
        } else {
            let u = u64::from_le_bytes(b);
            i64::try_from(u).unwrap_or(i64::MAX)
        };
        if id < 0 || id >= vocab as i64 {
            return Err(NpyError::Vocab { index, id });
        }
        out.push(id as u32);
    }
    Ok(out)
}

/// Splits a file into its header and its data bytes.
pub fn parse(bytes: &[u8]) -> Result<(Header, &[u8]), NpyError> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return bad("not a .npy file (bad magic)");
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return bad(format!("unsupported .npy version {v}")),
    };
    let end = start + len;
    if bytes.len() < end {
        return bad(format!(
            "header of {len} bytes is longer than the {}-byte file",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| NpyError::Format("header is not text".into()))?;
    Ok((header(text)?, &bytes[end..]))
}

/// Parses the header's Python dict literal (`{'descr': '<i4', 'fortran_order': False,
/// 'shape': (10,), }`).
fn header(text: &str) -> Result<Header, NpyError> {
    let value = |key: &str| -> Result<&str, NpyError> {
        let k = format!("'{key}':");
        let at = text
            .find(&k)
            .ok_or_else(|| NpyError::Format(format!("header has no '{key}'")))?;
        Ok(text[at + k.len()..].trim_start())
    };
    let d = value("descr")?;
    let descr = d
        .strip_prefix('\'')
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| NpyError::Format("bad 'descr'".into()))?
        .to_string();
    let f = value("fortran_order")?;
    let fortran_order = if f.starts_with("True") {
        true
    } else if f.starts_with("False") {
        false
    } else {
        return bad("bad 'fortran_order'");
    };
    let s = value("shape")?;
    let inner = s
        .strip_prefix('(')
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| NpyError::Format("bad 'shape'".into()))?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| NpyError::Format(format!("bad dimension '{p}' in 'shape'")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Header {
        descr,
        fortran_order,
        shape,
    })
}

/// (bytes, signed) of an integer dtype; anything else is refused.
fn dtype(descr: &str) -> Result<(usize, bool), NpyError> {
    let b = descr.as_bytes();
    if b.len() != 3 || !matches!(b[1], b'i' | b'u') {
        return bad(format!(
            "dtype '{descr}' is not an integer type (token ids must be integers)"
        ));
    }
    let size = match b[2] {
        b'1' => 1,
        b'2' => 2,
        b'4' => 4,
        b'8' => 8,
        _ => return bad(format!("dtype '{descr}' has an unsupported size")),
    };
    match (b[0], size) {
        (b'<', _) | (b'|', 1) => Ok((size, b[1] == b'i')),
        (b'=', _) if cfg!(target_endian = "little") => Ok((size, b[1] == b'i')),
        _ => bad(format!("dtype '{descr}' is not little-endian")),
    }
}

/// A `.npy` file (version 1) of `data` with dtype `descr` and `shape`; for tests and tools.
pub fn encode(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}
