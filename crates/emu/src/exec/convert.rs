//! Execution of conversions and moves: `cvt`, `cvta`, `isspacep`, pack/unpack, special
//! registers.

use super::*;

impl Cta {
    /// Executes the conversion/move ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_convert(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let prog = &*ctx.prog;
        match &inst.op {
            Op::Cvt { spec, d, a, b } => {
                let w = &mut self.warps[wi];
                let dm = reg_mask(prog.reg_bits[*d as usize]);
                // signed results fill a wider register with their sign
                let sx = if spec.dst.is_signed() {
                    spec.dst.bits()
                } else {
                    64
                };
                for l in lanes_of(m) {
                    let v = fp::cvt(spec, w.regs[*a as usize][l], w.regs[*b as usize][l]);
                    w.regs[*d as usize][l] = sext(v, sx) & dm;
                }
            }
            Op::Isspacep { space, d, a } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    let x = w.regs[*a as usize][l];
                    let sh = (SHARED_WINDOW..SHARED_WINDOW + (1 << 32)).contains(&x);
                    let lo = (LOCAL_WINDOW..LOCAL_WINDOW + (1 << 32)).contains(&x);
                    let pa = (PARAM_WINDOW..PARAM_WINDOW + (1 << 32)).contains(&x);
                    let v = match space {
                        MSpace::Shared => sh,
                        MSpace::Local => lo,
                        MSpace::Param => pa,
                        MSpace::Global => !sh && !lo && !pa,
                        _ => false,
                    };
                    w.regs[*d as usize][l] = v as u64;
                }
            }
            Op::Cvta { dir, d, a, bits } => {
                let w = &mut self.warps[wi];
                let mk = if *bits >= 64 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                };
                for l in lanes_of(m) {
                    let x = w.regs[*a as usize][l];
                    let v = match dir {
                        CvtaDir::ToGeneric(win) => x.wrapping_add(*win),
                        CvtaDir::FromGeneric(win) => x.wrapping_sub(*win),
                    };
                    w.regs[*d as usize][l] = v & mk;
                }
            }
            Op::Pack {
                part_bits,
                d,
                parts,
            } => {
                let w = &mut self.warps[wi];
                let pm = reg_mask(*part_bits as u8);
                if parts.len() as u32 * part_bits > 64 {
                    // 128-bit: two destination slots (low, high)
                    for l in lanes_of(m) {
                        let mut v = [0u64; 2];
                        for (k, p) in parts.iter().enumerate() {
                            let bit = k as u32 * part_bits;
                            v[(bit / 64) as usize] |= (w.regs[*p as usize][l] & pm) << (bit % 64);
                        }
                        w.regs[*d as usize][l] = v[0];
                        w.regs[*d as usize + 1][l] = v[1];
                    }
                    return Ok(Flow::Next);
                }
                for ch in chunks_of(m) {
                    let mut v = [0u64; CHUNK];
                    for (k, p) in parts.iter().enumerate() {
                        let x = chunk(&w.regs, *p, ch);
                        let sh = k as u32 * part_bits;
                        v = std::array::from_fn(|i| v[i] | (x[i] & pm) << sh);
                    }
                    put_chunk(&mut w.regs, *d, ch, m, v);
                }
            }
            Op::Unpack { part_bits, ds, a } => {
                let w = &mut self.warps[wi];
                let pm = reg_mask(*part_bits as u8);
                if ds.len() as u32 * part_bits > 64 {
                    // 128-bit source: a slot pair (low, high)
                    for l in lanes_of(m) {
                        let x = [w.regs[*a as usize][l], w.regs[*a as usize + 1][l]];
                        for (k, p) in ds.iter().enumerate() {
                            let bit = k as u32 * part_bits;
                            w.regs[*p as usize][l] = (x[(bit / 64) as usize] >> (bit % 64)) & pm;
                        }
                    }
                    return Ok(Flow::Next);
                }
                if unpack_rows(&mut w.regs, (*a, ds), (*part_bits, pm), m) {
                    return Ok(Flow::Next);
                }
                for ch in chunks_of(m) {
                    let x = chunk(&w.regs, *a, ch);
                    for (k, p) in ds.iter().enumerate() {
                        let sh = k as u32 * part_bits;
                        put_chunk(&mut w.regs, *p, ch, m, x.map(|v| (v >> sh) & pm));
                    }
                }
            }
            Op::SReg { d, r } => {
                for l in lanes_of(m) {
                    let v = self.sreg(ctx, &self.warps[wi], *r, l);
                    self.warps[wi].regs[*d as usize][l] = v;
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }
}

/// A split of register `a` into the parts `ds` (`part_bits` each, `pm` their mask; at most 64
/// bits in all) for the lanes in `m`, row by row: part `k` of every lane, then part `k + 1`
/// (the same values as lane by lane, since no part is the source). False (nothing done) when
/// a part is the source register, or a slot is out of range.
#[inline(always)]
fn unpack_rows(
    regs: &mut [Lanes],
    (a, ds): (u32, &[u32]),
    (part_bits, pm): (u32, u64),
    m: u32,
) -> bool {
    let n = regs.len();
    if ds.iter().any(|&p| p == a || p as usize >= n) || a as usize >= n {
        return false;
    }
    for (k, p) in ds.iter().enumerate() {
        let sh = k as u32 * part_bits;
        let Ok([src, dst]) = regs.get_disjoint_mut([a as usize, *p as usize]) else {
            return false;
        };
        if m == u32::MAX {
            for (d, x) in dst.iter_mut().zip(src.iter()) {
                *d = (x >> sh) & pm;
            }
        } else {
            for (l, (d, x)) in dst.iter_mut().zip(src.iter()).enumerate() {
                if m >> l & 1 != 0 {
                    *d = (x >> sh) & pm;
                }
            }
        }
    }
    true
}
