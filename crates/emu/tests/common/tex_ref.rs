//! Host-side pieces the texture fetch and surface tests (`isa_tex`, `isa_tex_geom`) share:
//! random texel data, f16 decoding, the bilinear footprint's weights, u32-word buffers, and
//! the check that the validator and ptxas both reject a kernel.

use emu::texture::TexFormat;
use emu::{Allocation, GlobalMemory};
use rand::rngs::StdRng;
use rand::Rng;
use std::sync::Arc;

/// The value of IEEE binary16 bits `h` (finite).
pub fn f16_value(h: u16) -> f64 {
    let e = (h >> 10 & 31) as i32;
    let f = (h & 0x3ff) as f64;
    let v = if e == 0 {
        f * 2f64.powi(-24)
    } else {
        (1.0 + f / 1024.0) * 2f64.powi(e - 15)
    };
    if h >> 15 == 1 {
        -v
    } else {
        v
    }
}

/// The float a fetch returns for stored channel bits `raw` of `format` (normalized integers
/// in [0, 1]; `U32` as its value).
pub fn float_value(format: TexFormat, raw: u64) -> f64 {
    match format {
        TexFormat::U8 => raw as f64 / 255.0,
        TexFormat::U16 => raw as f64 / 65535.0,
        TexFormat::F16 => f16_value(raw as u16),
        TexFormat::F32 => f32::from_bits(raw as u32) as f64,
        TexFormat::U32 => raw as f64,
        f => panic!("no fetch test reads {f:?}"),
    }
}

/// Random texel bytes: finite f16/f32 values in [-4, 4], any integers.
pub fn texel_data(rng: &mut StdRng, format: TexFormat, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|_| match format {
            TexFormat::F32 => rng.gen_range(-4.0f32..4.0).to_le_bytes().to_vec(),
            TexFormat::F16 => {
                let e: u16 = rng.gen_range(0..17);
                let h = (rng.gen::<u16>() & 0x83ff) | e << 10;
                h.to_le_bytes().to_vec()
            }
            TexFormat::U8 => vec![rng.gen()],
            TexFormat::U16 => rng.gen::<u16>().to_le_bytes().to_vec(),
            TexFormat::U32 => rng.gen::<u32>().to_le_bytes().to_vec(),
            f => panic!("no fetch test reads {f:?}"),
        })
        .collect()
}

/// Per texel-space coordinate of a linear fetch: the lower texel of the footprint and the
/// upper one's weight, quantized to 8 fractional bits as the hardware's.
pub fn linear_base(u: &[f64]) -> Vec<(i64, f64)> {
    u.iter()
        .map(|&x| {
            let xb = x - 0.5;
            let i = xb.floor();
            (i as i64, ((xb - i) * 256.0).round() / 256.0)
        })
        .collect()
}

/// A global buffer holding `rows` of little-endian u32 words.
pub fn word_buffer<const N: usize>(mem: &GlobalMemory, rows: &[[u32; N]]) -> Arc<Allocation> {
    let bytes: Vec<u8> = rows
        .iter()
        .flatten()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    super::common::buffer(mem, &bytes)
}

/// The first `n` little-endian u32 words of `a`.
pub fn words(a: &Allocation, n: usize) -> Vec<u32> {
    super::common::read(a, n * 4)
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Asserts that the validator rejects `text` with an error containing `msg` and that ptxas
/// (when installed; `label` names the test in its skip message) rejects it too; `what` names
/// the case in failure messages.
pub fn assert_rejected(text: &str, what: &str, msg: &str, label: &str) {
    let errs = super::common::validator_errors(text);
    assert!(errs.iter().any(|e| e.contains(msg)), "`{what}`: {errs:?}");
    if ptx::ptxas::ptxas_for_tests(label).is_some() {
        assert!(
            ptx::ptxas::assemble(text, "sm_90a", &Default::default()).is_err(),
            "ptxas accepts `{what}`"
        );
    }
}
