//! Execution of the video instructions ([`Op::Video`]), following the PTX ISA pseudo-code of
//! each form: operands are extracted (byte, half-word or word, sign- or zero-extended by their
//! type), the primary operation runs on exact integers (i128, so no intermediate overflows),
//! then saturation, the secondary operation or the merge. Where the manual's pseudo-code leaves
//! a width open (`vshl` results, `vmad` before `.sat`), the exact value is clamped.

use super::*;
use ptx::video::{Part, SecOp, VCmp, VOp, VideoForm};

impl Cta {
    /// Executes a video op ([`Cta::exec`] sends it here).
    #[inline(always)]
    pub(super) fn exec_video(
        &mut self,
        _ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let Op::Video { form, d, a, b, c } = &inst.op else {
            return Err(misrouted(inst));
        };
        let w = &mut self.warps[wi];
        for l in lanes_of(m) {
            let r = &w.regs;
            let (x, y, z) = (
                r[*a as usize][l] as u32,
                r[*b as usize][l] as u32,
                r[*c as usize][l] as u32,
            );
            w.regs[*d as usize][l] = video(form, x, y, z) as u64;
        }
        Ok(Flow::Next)
    }
}

/// The result of a video instruction for one thread's `a`, `b`, `c`.
pub fn video(f: &VideoForm, a: u32, b: u32, c: u32) -> u32 {
    if f.lanes == 1 {
        scalar(f, a, b, c)
    } else {
        simd(f, a, b, c)
    }
}

/// `partSelectSignExtend`: a byte, half-word or the word of `x`, sign-extended when `signed`.
fn part(x: u32, signed: bool, p: Part) -> i128 {
    let (v, bits) = match p {
        Part::Word => (x, 32),
        Part::Byte(k) => ((x >> (8 * k)) & 0xff, 8),
        Part::Half(k) => ((x >> (16 * k)) & 0xffff, 16),
    };
    sext(v as u64, bits, signed)
}

fn sext(v: u64, bits: u32, signed: bool) -> i128 {
    if signed && (v >> (bits - 1)) & 1 == 1 {
        v as i128 - (1i128 << bits)
    } else {
        v as i128
    }
}

/// Clamps to the signed or unsigned range of `bits` bits.
fn saturate(v: i128, bits: u32, signed: bool) -> i128 {
    let (lo, hi) = if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    };
    v.clamp(lo, hi)
}

fn compare(c: Option<VCmp>, x: i128, y: i128) -> bool {
    match c {
        Some(VCmp::Eq) => x == y,
        Some(VCmp::Ne) => x != y,
        Some(VCmp::Lt) => x < y,
        Some(VCmp::Le) => x <= y,
        Some(VCmp::Gt) => x > y,
        Some(VCmp::Ge) => x >= y,
        None => false,
    }
}

/// The primary operation of the arithmetic forms (not shifts, not `vmad`).
fn primary(f: &VideoForm, x: i128, y: i128) -> i128 {
    match f.op {
        VOp::Add => x + y,
        VOp::Sub => x - y,
        VOp::Absdiff => (x - y).abs(),
        VOp::Min => x.min(y),
        VOp::Max => x.max(y),
        VOp::Avrg => {
            let s = x + y;
            if s >= 0 {
                (s + 1) >> 1
            } else {
                s >> 1
            }
        }
        VOp::Set => compare(f.cmp, x, y) as i128,
        VOp::Shl | VOp::Shr | VOp::Mad => 0,
    }
}

fn scalar(f: &VideoForm, a: u32, b: u32, c: u32) -> u32 {
    let ta = part(a, f.signed[1], f.asel);
    let tmp = match f.op {
        VOp::Mad => return mad(f, ta, part(b, f.signed[2], f.bsel), c),
        VOp::Shl | VOp::Shr => {
            let tb = part(b, false, f.bsel) as u32;
            let n = if f.wrap { tb & 0x1f } else { tb.min(32) };
            if f.op == VOp::Shl {
                ta << n
            } else {
                ta >> n
            }
        }
        _ => primary(f, ta, part(b, f.signed[2], f.bsel)),
    };
    // optSaturate: the destination's range, or the merged part's
    let tmp = if f.sat {
        let bits = match f.dsel {
            Some(Part::Byte(_)) => 8,
            Some(Part::Half(_)) => 16,
            _ => 32,
        };
        saturate(tmp, bits, f.signed[0])
    } else {
        tmp
    };
    let tc = sext(c as u64, 32, f.signed[0]);
    let d = match (f.second, f.dsel) {
        (Some(SecOp::Add), _) => tmp + tc,
        (Some(SecOp::Min), _) => tmp.min(tc),
        (Some(SecOp::Max), _) => tmp.max(tc),
        (None, Some(Part::Byte(k))) => ((tmp & 0xff) << (8 * k)) | (c & !(0xff << (8 * k))) as i128,
        (None, Some(Part::Half(k))) => {
            ((tmp & 0xffff) << (16 * k)) | (c & !(0xffff << (16 * k))) as i128
        }
        (None, _) => tmp,
    };
    d as u32
}

/// `vmad`: `(+-a*b) + (+-c)` with `.po`, scaling and saturation, after the manual's pseudo-code
/// (negation as one's complement plus a carried-in one).
fn mad(f: &VideoForm, ta: i128, tb: i128, c: u32) -> u32 {
    let [na, nb, nc] = f.neg;
    let signed_final = f.signed[1] || f.signed[2] || (na ^ nb) || nc;
    let mut tmp = ta * tb;
    let mut c = c;
    let lsb = if f.po {
        1
    } else if na ^ nb {
        tmp = !tmp;
        1
    } else if nc {
        c = !c;
        1
    } else {
        0
    };
    let c128 = sext(c as u64, 32, signed_final);
    let mut r = (tmp + c128 + lsb) >> f.shr;
    if f.sat {
        r = saturate(r, 32, signed_final);
    }
    r as u32
}

/// The SIMD forms: `lanes` lanes of 32/lanes bits each, sources picked from `{b, a}`.
fn simd(f: &VideoForm, a: u32, b: u32, c: u32) -> u32 {
    let n = f.lanes as u32;
    let bits = 32 / n;
    let lane_mask = (1u64 << bits) - 1;
    let src = ((b as u64) << 32) | a as u64;
    let pick = |sel: u8, signed: bool| sext((src >> (bits * sel as u32)) & lane_mask, bits, signed);
    let mut d: u32 = if f.second.is_some() { c } else { 0 };
    for i in 0..n {
        let va = pick(f.alanes[i as usize], f.signed[1]);
        let vb = pick(f.blanes[i as usize], f.signed[2]);
        let mut t = primary(f, va, vb);
        if f.sat {
            t = saturate(t, bits, f.signed[0]);
        }
        let on = (f.mask >> i) & 1 == 1;
        if f.second.is_some() {
            if on {
                d = d.wrapping_add(t as u32);
            }
        } else {
            let m = (lane_mask as u32) << (bits * i);
            let v = if on { (t as u32) << (bits * i) } else { c };
            d |= v & m;
        }
    }
    d
}
