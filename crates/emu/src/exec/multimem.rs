//! Execution of `multimem.ld_reduce`, `multimem.st` and `multimem.red` on multicast address
//! ranges ([`crate::multicast`]). Each lane's access reaches every member device's bound
//! memory, in the order the devices were added to the object:
//!
//! - `st` writes the value to each device; `red` is an atomic read-modify-write on each
//!   device (as `red` on each device's memory, with `atom`'s per-type arithmetic);
//! - `ld_reduce` reads every device's value and reduces them in device order with `red`'s
//!   arithmetic for the type (f32 `.add` rounds to nearest even and flushes subnormals as
//!   `red.add.f32` does; f16/bf16 round after each step), or with `.acc::f32` converts the
//!   f16/bf16 values exactly to f32, adds them in f32 in device order and rounds the sum once
//!   to the element type (round to nearest even). The hardware's reduction order is not
//!   specified by PTX; this one is fixed so results are reproducible.
//!
//! The vector is naturally aligned as a whole; an address outside every multicast range is
//! [`FaultKind::NotMulticast`], one where a member device has no memory bound a fault naming it.

use super::*;
use crate::multicast::McMapping;
use crate::program::{MultimemKind, MultimemOp};

impl Cta {
    /// Executes a multimem op ([`Cta::exec`] sends it here).
    pub(super) fn exec_multimem(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        op: &MultimemOp,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let size = op.ty.size();
        let whole = size * op.regs.len() as u32;
        for l in lanes_of(m) {
            let a = self.warps[wi].regs[op.addr as usize][l].wrapping_add(op.off as u64);
            let map = multicast_at(ctx, op.kind, a, whole).inspect_err(|_| {
                LAST_LANE.with(|c| c.set(l as u32));
            })?;
            let off = a - map.base;
            let vals: Vec<u64> = op
                .regs
                .iter()
                .map(|r| self.warps[wi].regs[*r as usize][l])
                .collect();
            let res = match op.kind {
                MultimemKind::St => store_all(map, off, op, &vals).map(|_| ()),
                MultimemKind::Red => reduce_into_all(map, off, op, &vals).map(|_| ()),
                MultimemKind::LdReduce => load_reduce(map, off, op).map(|out| {
                    for (r, v) in op.regs.iter().zip(out) {
                        self.warps[wi].regs[*r as usize][l] = v;
                    }
                }),
            };
            res.map_err(|why| {
                LAST_LANE.with(|c| c.set(l as u32));
                FaultKind::Other(format!("multimem at {a:#x}: {why}"))
            })?;
        }
        Ok(Flow::Next)
    }
}

/// The multicast range an access of `len` bytes at `a` lies in, or the fault.
fn multicast_at(
    ctx: &LaunchCtx,
    kind: MultimemKind,
    a: u64,
    len: u32,
) -> Result<&McMapping, FaultKind> {
    let what = match kind {
        MultimemKind::LdReduce => "multimem.ld_reduce",
        MultimemKind::St => "multimem.st",
        MultimemKind::Red => "multimem.red",
    };
    if !a.is_multiple_of(len as u64) {
        return Err(FaultKind::Misaligned {
            space: "multicast",
            addr: a,
            size: len,
        });
    }
    ctx.mem.find_multicast(a, len as u64).ok_or_else(|| {
        let why = if ctx.mem.find(a, len as u64).is_some() {
            "it is ordinary global memory (multimem needs a multicast range from \
             GlobalMemory::multicast_map / runtime Multicast::map)"
        } else {
            "no multicast range is mapped there"
        };
        FaultKind::NotMulticast {
            op: what,
            addr: a,
            why: why.into(),
        }
    })
}

/// `multimem.st`: every element to every member device.
fn store_all(map: &McMapping, off: u64, op: &MultimemOp, vals: &[u64]) -> Result<Vec<()>, String> {
    let size = op.ty.size();
    let ord = match op.ord {
        Ord::Release | Ord::AcqRel | Ord::Sc => Ordering::Release,
        _ => Ordering::Relaxed,
    };
    map.obj
        .for_each_target(off, size as u64 * vals.len() as u64, |t| {
            for (k, v) in vals.iter().enumerate() {
                t.alloc
                    .write(t.offset + k as u64 * size as u64, size, *v, ord);
            }
        })
}

/// `multimem.red`: every element reduced into every member device's memory, atomically.
fn reduce_into_all(
    map: &McMapping,
    off: u64,
    op: &MultimemOp,
    vals: &[u64],
) -> Result<Vec<()>, String> {
    let size = op.ty.size();
    let ord = rmw_ord(op.ord);
    map.obj
        .for_each_target(off, size as u64 * vals.len() as u64, |t| {
            for (k, v) in vals.iter().enumerate() {
                let at = t.offset + k as u64 * size as u64;
                t.alloc
                    .rmw(at, size, ord, |old| atom_apply(op.op, op.ty, old, *v, 0));
            }
        })
}

/// `multimem.ld_reduce`: every element read from every member device, reduced in device order.
fn load_reduce(map: &McMapping, off: u64, op: &MultimemOp) -> Result<Vec<u64>, String> {
    let size = op.ty.size();
    let n = op.regs.len();
    let ord = match op.ord {
        Ord::Acquire | Ord::AcqRel | Ord::Sc => Ordering::Acquire,
        _ => Ordering::Relaxed,
    };
    let per_device = map.obj.for_each_target(off, size as u64 * n as u64, |t| {
        (0..n)
            .map(|k| t.alloc.read(t.offset + (k as u32 * size) as u64, size, ord))
            .collect::<Vec<u64>>()
    })?;
    Ok((0..n)
        .map(|k| {
            let vals = per_device.iter().map(|d| d[k]);
            if op.acc_f32 {
                sum_in_f32(op.ty, vals)
            } else {
                vals.reduce(|acc, v| atom_apply(op.op, op.ty, acc, v, 0))
                    .unwrap_or(0)
            }
        })
        .collect())
}

/// `.acc::f32`: each 16-bit half of f16/bf16 values summed exactly converted in f32 (rounding
/// to nearest even per addition), the sum rounded once to the element type.
fn sum_in_f32(ty: Ty, vals: impl Iterator<Item = u64>) -> u64 {
    let bf = matches!(ty, Ty::Bf16 | Ty::Bf16x2);
    let halves = if matches!(ty, Ty::F16x2 | Ty::Bf16x2) {
        2
    } else {
        1
    };
    let to_f32 = |h: u16| {
        if bf {
            half::bf16::from_bits(h).to_f32()
        } else {
            half::f16::from_bits(h).to_f32()
        }
    };
    let from_f32 = |x: f32| {
        if bf {
            half::bf16::from_f32(x).to_bits()
        } else {
            half::f16::from_f32(x).to_bits()
        }
    };
    let vals: Vec<u64> = vals.collect();
    let mut out = 0u64;
    for h in 0..halves {
        let sum = vals
            .iter()
            .map(|v| to_f32((v >> (16 * h)) as u16))
            .reduce(|a, b| a + b)
            .unwrap_or(0.0);
        out |= u64::from(from_f32(sum)) << (16 * h);
    }
    out
}
