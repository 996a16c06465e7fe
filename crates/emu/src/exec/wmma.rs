//! Execution of the warp matrix functions (`wmma.*`), `mma.sp`, the Volta `mma.m8n8k4` f16
//! forms and `movmatrix`
//! ([`crate::wmma`] has the layouts and arithmetic).

use super::*;
use crate::mma_volta::VoltaNumerics;
use crate::wmma::{self as wm, Frag, WmmaOp};

impl Cta {
    /// Executes [`Op::Wmma`] ([`Cta::exec`] sends it here); every op is warp-wide (`.aligned`).
    #[inline(never)]
    pub(super) fn exec_wmma(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        op: &WmmaOp,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        if self.wait_converged(wi) {
            return Ok(Flow::Stay);
        }
        match op {
            WmmaOp::LdSt {
                load: true,
                frag,
                row,
                regs,
                addr,
                off,
                stride,
                space,
            } => {
                let out = self.wmma_load(ctx, wi, (frag, *row), (*addr, *off, *stride), *space)?;
                let w = &mut self.warps[wi];
                for (k, s) in regs.iter().enumerate() {
                    Cta::write_masked(w, *s, m, &out[k]);
                }
            }
            WmmaOp::LdSt {
                load: false,
                frag,
                row,
                regs,
                addr,
                off,
                stride,
                space,
            } => self.wmma_store(ctx, wi, (frag, *row, regs), (*addr, *off, *stride), *space)?,
            WmmaOp::Mma { spec, d, a, b, c } => {
                let model = ctx.numerics.model(ctx.prog.target_sm, spec.aty);
                let w = &mut self.warps[wi];
                let ra: Vec<&Lanes> = a.iter().map(|s| &w.regs[*s as usize]).collect();
                let rb: Vec<&Lanes> = b.iter().map(|s| &w.regs[*s as usize]).collect();
                let rc: Vec<&Lanes> = c.iter().map(|s| &w.regs[*s as usize]).collect();
                let mut out = vec![[0u64; 32]; d.len()];
                wm::wmma_mma(spec, model.as_ref(), (&ra, &rb, &rc), &mut out);
                for (k, s) in d.iter().enumerate() {
                    Cta::write_masked(w, *s, m, &out[k]);
                }
            }
            WmmaOp::Sparse {
                spec,
                d,
                a,
                b,
                c,
                meta,
                sel,
            } => {
                let model = ctx.numerics.model(ctx.prog.target_sm, spec.dense.aty);
                let w = &mut self.warps[wi];
                let ra: Vec<&Lanes> = a.iter().map(|s| &w.regs[*s as usize]).collect();
                let dense = spec.expand(&ra, &w.regs[*meta as usize], *sel);
                let da: Vec<&Lanes> = dense.iter().collect();
                let rb: Vec<&Lanes> = b.iter().map(|s| &w.regs[*s as usize]).collect();
                let rc: Vec<&Lanes> = c.iter().map(|s| &w.regs[*s as usize]).collect();
                let mut out = vec![[0u64; 32]; d.len()];
                crate::mma_any::mma_any(&spec.dense, model.as_ref(), (&da, &rb, &rc), &mut out);
                for (k, s) in d.iter().enumerate() {
                    Cta::write_masked(w, *s, m, &out[k]);
                }
            }
            WmmaOp::Any { spec, d, a, b, c } => {
                let model = ctx.numerics.model(ctx.prog.target_sm, spec.aty);
                let w = &mut self.warps[wi];
                let ra: Vec<&Lanes> = a.iter().map(|s| &w.regs[*s as usize]).collect();
                let rb: Vec<&Lanes> = b.iter().map(|s| &w.regs[*s as usize]).collect();
                let rc: Vec<&Lanes> = c.iter().map(|s| &w.regs[*s as usize]).collect();
                let mut out = vec![[0u64; 32]; d.len()];
                crate::mma_any::mma_any(spec, model.as_ref(), (&ra, &rb, &rc), &mut out);
                for (k, s) in d.iter().enumerate() {
                    Cta::write_masked(w, *s, m, &out[k]);
                }
            }
            WmmaOp::Volta { spec, d, a, b, c } => {
                let num = VoltaNumerics::select(ctx.numerics, ctx.prog.target_sm);
                let w = &mut self.warps[wi];
                let ra: Vec<&Lanes> = a.iter().map(|s| &w.regs[*s as usize]).collect();
                let rb: Vec<&Lanes> = b.iter().map(|s| &w.regs[*s as usize]).collect();
                let rc: Vec<&Lanes> = c.iter().map(|s| &w.regs[*s as usize]).collect();
                let mut out = vec![[0u64; 32]; d.len()];
                crate::mma_volta::mma_volta(spec, num, (&ra, &rb, &rc), &mut out);
                for (k, s) in d.iter().enumerate() {
                    Cta::write_masked(w, *s, m, &out[k]);
                }
            }
            WmmaOp::Movmatrix { d, a } => {
                let w = &mut self.warps[wi];
                let out = wm::movmatrix(&w.regs[*a as usize]);
                Cta::write_masked(w, *d, m, &out);
            }
        }
        Ok(Flow::Next)
    }

    /// Lane `l`'s base address and leading dimension (elements) of a wmma access.
    fn wmma_base(
        &self,
        wi: usize,
        l: usize,
        (addr, off, stride): (u32, i64, Option<u32>),
        def: u64,
    ) -> (u64, u64) {
        let r = &self.warps[wi].regs;
        let base = r[addr as usize][l].wrapping_add(off as u64);
        let ld = stride.map_or(def, |s| r[s as usize][l] & 0xffff_ffff);
        (base, ld)
    }

    /// `wmma.load`: every lane of the warp reads its fragment elements (each copy).
    fn wmma_load(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        (frag, row): (&Frag, bool),
        at: (u32, i64, Option<u32>),
        space: MSpace,
    ) -> Result<Vec<Lanes>, FaultKind> {
        if wm::is_sub_byte(frag.ty) {
            return self.wmma_load_packed(ctx, wi, (frag, row), at, space);
        }
        let size = frag.ty.size();
        let mut out = vec![[0u64; 32]; frag.regs()];
        for l in lanes_of(self.warps[wi].live) {
            let (base, ld) = self.wmma_base(wi, l, at, wm::default_ld(frag, row));
            for e in 0..frag.elems() {
                let i = wm::mem_index(row, frag.pos(l, e), ld);
                let a = base.wrapping_add(i * size as u64);
                let loc = self.locate(ctx, space, a, size, l, ctx.prog.local_bytes)?;
                let v = self.load(ctx, wi, &loc, size, Ordering::Relaxed);
                frag.put(&mut out, l, e, v);
            }
        }
        Ok(out)
    }

    /// `wmma.load` of a sub-byte or `.b1` A (row-major) or B (column-major) fragment: each
    /// lane's one register is the 32 consecutive bits of memory holding its elements (element
    /// `i` of a row at bit `i * bits` counted from the row's first byte, low bits first).
    fn wmma_load_packed(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        (frag, row): (&Frag, bool),
        at: (u32, i64, Option<u32>),
        space: MSpace,
    ) -> Result<Vec<Lanes>, FaultKind> {
        let bits = u64::from(frag.ty.bits());
        let mut out = vec![[0u64; 32]; 1];
        for l in lanes_of(self.warps[wi].live) {
            let (base, ld) = self.wmma_base(wi, l, at, wm::default_ld(frag, row));
            let i = wm::mem_index(row, frag.pos(l, 0), ld);
            let a = base.wrapping_add(i * bits / 8);
            let loc = self.locate(ctx, space, a, 4, l, ctx.prog.local_bytes)?;
            out[0][l] = self.load(ctx, wi, &loc, 4, Ordering::Relaxed);
        }
        Ok(out)
    }

    /// `wmma.store.d`: every lane writes its distinct fragment elements.
    fn wmma_store(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        (frag, row, regs): (&Frag, bool, &[u32]),
        at: (u32, i64, Option<u32>),
        space: MSpace,
    ) -> Result<(), FaultKind> {
        let size = frag.ty.size();
        let vals: Vec<Lanes> = regs
            .iter()
            .map(|s| self.warps[wi].regs[*s as usize])
            .collect();
        let refs: Vec<&Lanes> = vals.iter().collect();
        for l in lanes_of(self.warps[wi].live) {
            let (base, ld) = self.wmma_base(wi, l, at, wm::default_ld(frag, row));
            for e in 0..frag.distinct() {
                let i = wm::mem_index(row, frag.pos(l, e), ld);
                let a = base.wrapping_add(i * size as u64);
                let loc = self.locate(ctx, space, a, size, l, ctx.prog.local_bytes)?;
                self.store(wi, &loc, size, frag.get(&refs, l, e), Ordering::Relaxed);
            }
        }
        Ok(())
    }
}
