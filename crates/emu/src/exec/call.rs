//! Executing device-function calls: every lane has its own call stack ([`LaneStack`]) of
//! frames in local memory above [`STACK_BASE`] (return values, parameters, `.local` variables
//! and call-site `.param` variables of each invocation, laid out by the decoder's `call`
//! module), the return addresses, and the registers of recursive callees saved at each call.
//! The bytes a lane's stack holds (frames plus saved registers, 8 bytes each) are limited by
//! [`crate::LaunchOptions::stack_bytes`] (CUDA's `cudaLimitStackSize`); a call past it stops
//! the launch with [`FaultKind::StackOverflow`].

use super::*;

/// Local-memory address where each thread's call stack begins (the kernel's static local
/// variables lie below `Program::local_bytes`, far under it).
pub const STACK_BASE: u64 = 1 << 31;

/// One lane's call stack.
#[derive(Clone, Debug, Default)]
pub struct LaneStack {
    frames: Vec<CallFrame>,
    /// Saved registers of recursive callees, innermost last.
    saved: Vec<u64>,
    /// Frame memory (grows on demand; `sp` bytes are in use).
    mem: Vec<u8>,
    sp: u32,
}

#[derive(Clone, Copy, Debug)]
struct CallFrame {
    ret_pc: u32,
    /// The `call` instruction (its [`CallSite`] names the saved registers).
    call_pc: u32,
    /// Which of an indirect call's sites this lane took (0 for a direct call).
    site: u32,
    base: u32,
}

/// The call site frame `fr` was pushed by.
fn site_of<'p>(prog: &'p Program, fr: &CallFrame) -> Option<&'p CallSite> {
    match &prog.insts.get(fr.call_pc as usize)?.op {
        Op::Call(site) => Some(site),
        Op::CallIndirect(ic) => ic.sites.get(fr.site as usize).map(|s| &s.1),
        _ => None,
    }
}

/// `n` bytes of lane `l`'s stack memory at offset `o` (grown on demand).
#[cold]
#[inline(never)]
pub(super) fn stack_mem(w: &mut Warp, l: usize, o: usize, n: u32) -> &mut [u8] {
    let st = &mut stacks(w)[l];
    let end = o + n as usize;
    if st.mem.len() < end {
        st.mem.resize(end, 0);
    }
    &mut st.mem[o..end]
}

/// A local-memory access above the kernel's static local memory: the lane's call stack.
#[cold]
#[inline(never)]
pub(super) fn locate_stack(
    ctx: &LaunchCtx,
    addr: u64,
    size: u32,
    lane: usize,
) -> Result<Loc, FaultKind> {
    let end = addr.saturating_add(size as u64);
    if addr >= STACK_BASE && end - STACK_BASE <= ctx.stack_bytes as u64 {
        return Ok(Loc::Stack(lane, (addr - STACK_BASE) as usize));
    }
    LAST_LANE.with(|c| c.set(lane as u32));
    Err(FaultKind::OutOfBounds {
        space: "local",
        addr,
        size,
    })
}

/// Reads `n` bytes of lane `l`'s stack memory at offset `o` (zero where never written).
#[cold]
#[inline(never)]
pub(super) fn stack_load(w: &Warp, l: usize, o: usize, n: u32) -> u64 {
    w.calls
        .get(l)
        .and_then(|s| s.mem_at(o, n as usize))
        .map_or(0, read_le)
}

impl LaneStack {
    /// `n` bytes at offset `o` when they were ever written (else they read as zero).
    pub(super) fn mem_at(&self, o: usize, n: usize) -> Option<&[u8]> {
        self.mem.get(o..o + n)
    }

    /// Bytes of stack this lane uses.
    fn used(&self) -> u64 {
        self.sp as u64 + 8 * self.saved.len() as u64
    }
}

/// Lane `l`'s stack pointer, the bytes its stack uses and the base of its innermost frame
/// (0 in the kernel): what `stacksave`/`alloca` (`exec/stack.rs`) work with.
pub(super) fn stack_state(w: &mut Warp, l: usize) -> (u32, u64, u32) {
    let st = &stacks(w)[l];
    (st.sp, st.used(), st.frames.last().map_or(0, |f| f.base))
}

/// Sets lane `l`'s stack pointer (`alloca`, `stackrestore`; checked by the caller).
pub(super) fn set_stack_sp(w: &mut Warp, l: usize, sp: u32) {
    stacks(w)[l].sp = sp;
}

fn stacks(w: &mut Warp) -> &mut Vec<LaneStack> {
    if w.calls.is_empty() {
        w.calls = vec![LaneStack::default(); 32];
    }
    &mut w.calls
}

impl Cta {
    /// Bytes of per-lane local memory at local address `addr`: the kernel's static local memory
    /// or the lane's call stack.
    pub(super) fn local_slice(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        lane: usize,
        addr: u64,
        n: usize,
    ) -> Result<&mut [u8], FaultKind> {
        let lb = ctx.prog.local_bytes as u64;
        let end = addr.checked_add(n as u64);
        let w = &mut self.warps[wi];
        if end.is_some_and(|e| e <= lb) {
            let o = lane * lb as usize + addr as usize;
            return Ok(&mut w.local[o..o + n]);
        }
        if addr >= STACK_BASE && end.is_some_and(|e| e - STACK_BASE <= ctx.stack_bytes as u64) {
            let st = &mut stacks(w)[lane];
            let o = (addr - STACK_BASE) as usize;
            if st.mem.len() < o + n {
                st.mem.resize(o + n, 0);
            }
            return Ok(&mut st.mem[o..o + n]);
        }
        LAST_LANE.with(|c| c.set(lane as u32));
        Err(FaultKind::OutOfBounds {
            space: "local",
            addr,
            size: n as u32,
        })
    }

    /// Copies `n` bytes of one lane's local memory.
    fn local_copy(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        lane: usize,
        (dst, src): (u64, u64),
        n: usize,
    ) -> Result<(), FaultKind> {
        let tmp = self.local_slice(ctx, wi, lane, src, n)?.to_vec();
        self.local_slice(ctx, wi, lane, dst, n)?
            .copy_from_slice(&tmp);
        Ok(())
    }

    /// The local address of a place for one lane.
    pub(super) fn place_addr(&self, wi: usize, lane: usize, p: Place) -> u64 {
        self.warps[wi].regs[p.base as usize][lane].wrapping_add(p.off as u64)
    }

    /// Pushes lane `l`'s frame for call site `site` (index `k` among the instruction's sites):
    /// arguments copied in, a recursive callee's registers saved.
    fn push_frame(
        &mut self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        (site, k): (&CallSite, u32),
    ) -> Result<(), FaultKind> {
        let pc = self.warps[wi].group_pc;
        let st = &stacks(&mut self.warps[wi])[l];
        let base = st.sp;
        let need = st.used() + site.frame_bytes as u64 + 8 * site.save.len() as u64;
        if need > ctx.stack_bytes as u64 {
            LAST_LANE.with(|c| c.set(l as u32));
            return Err(FaultKind::StackOverflow {
                depth: st.frames.len() as u32 + 1,
                limit: ctx.stack_bytes,
            });
        }
        let fb = STACK_BASE + base as u64;
        for a in &site.args {
            let src = self.place_addr(wi, l, a.caller);
            let dst = fb + a.callee_off as u64;
            self.local_copy(ctx, wi, l, (dst, src), a.bytes as usize)?;
        }
        let w = &mut self.warps[wi];
        stacks(w);
        let st = &mut w.calls[l];
        for &s in &site.save {
            st.saved.push(w.regs[s as usize][l]);
        }
        st.frames.push(CallFrame {
            ret_pc: pc + 1,
            call_pc: pc,
            site: k,
            base,
        });
        st.sp = base + site.frame_bytes;
        w.regs[site.frame_slot as usize][l] = fb;
        // `.reg` arguments: all read before any is written (a recursive call may pass its
        // own parameters in another order).
        let vals: Vec<u64> = site
            .reg_args
            .iter()
            .map(|&(s, _)| w.regs[s as usize][l])
            .collect();
        for (&(_, d), v) in site.reg_args.iter().zip(vals) {
            w.regs[d as usize][l] = v & reg_mask(ctx.prog.reg_bits[d as usize]);
        }
        Ok(())
    }

    /// An indirect call: each lane in `m` calls the site its function pointer names (lanes
    /// calling different functions diverge and meet again after the call).
    #[inline(never)]
    pub(super) fn exec_call_indirect(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        ic: &IndirectCall,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let mut target = None;
        let mut same = true;
        for l in lanes_of(m) {
            let addr = self.warps[wi].regs[ic.fptr as usize][l];
            let Some(k) = ic.sites.iter().position(|s| s.0 == addr) else {
                LAST_LANE.with(|c| c.set(l as u32));
                return Err(FaultKind::Other(format!(
                    "indirect call through {addr:#x}, which is not the address of a function \
                     this call may reach (through `{}`)",
                    ic.proto
                )));
            };
            let site = &ic.sites[k].1;
            self.push_frame(ctx, (wi, l), (site, k as u32))?;
            self.warps[wi].pc[l] = site.target;
            match target {
                None => target = Some(site.target),
                Some(t) if t != site.target => same = false,
                _ => {}
            }
        }
        let w = &mut self.warps[wi];
        match target {
            None => Ok(Flow::Next),
            Some(t) if same && m == w.group => {
                w.group_pc = t;
                Ok(Flow::Stay)
            }
            Some(_) => {
                for l in lanes_of(w.group & !m) {
                    w.pc[l] = w.group_pc + 1;
                }
                w.group = 0;
                Ok(Flow::Stay)
            }
        }
    }

    /// `call`: a new frame per lane in `m`, arguments copied in, a recursive callee's registers
    /// saved, then the jump.
    #[inline(never)]
    pub(super) fn exec_call(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        site: &CallSite,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        for l in lanes_of(m) {
            self.push_frame(ctx, (wi, l), (site, 0))?;
        }
        let w = &mut self.warps[wi];
        if m == w.group {
            w.group_pc = site.target;
            return Ok(Flow::Stay);
        }
        if m != 0 {
            for l in lanes_of(m) {
                w.pc[l] = site.target;
            }
            for l in lanes_of(w.group & !m) {
                w.pc[l] = w.group_pc + 1;
            }
            w.group = 0;
            return Ok(Flow::Stay);
        }
        Ok(Flow::Next)
    }

    /// `ret`: pops each lane's frame (restoring a recursive callee's registers); lanes without
    /// a frame (the kernel's own `ret`) exit.
    #[inline(never)]
    pub(super) fn exec_ret(&mut self, ctx: &LaunchCtx, wi: usize, m: u32) -> Flow {
        let prog = &*ctx.prog;
        let w = &mut self.warps[wi];
        let mut gone = 0u32;
        let mut target = None;
        let mut same = true;
        for l in lanes_of(m) {
            let Some(fr) = w.calls.get_mut(l).and_then(|s| s.frames.pop()) else {
                gone |= 1 << l;
                continue;
            };
            if let Some(site) = site_of(prog, &fr) {
                // `.reg` return values are read before the callee's registers are restored
                let vals: Vec<u64> = (site.reg_rets.iter())
                    .map(|&(s, _)| w.regs[s as usize][l])
                    .collect();
                let st = &mut w.calls[l];
                for &s in site.save.iter().rev() {
                    w.regs[s as usize][l] = st.saved.pop().unwrap_or(0);
                }
                for (&(_, d), v) in site.reg_rets.iter().zip(vals) {
                    w.regs[d as usize][l] = v & reg_mask(prog.reg_bits[d as usize]);
                }
            }
            w.calls[l].sp = fr.base;
            w.pc[l] = fr.ret_pc;
            match target {
                None => target = Some(fr.ret_pc),
                Some(t) if t != fr.ret_pc => same = false,
                _ => {}
            }
        }
        if gone != 0 {
            w.live &= !gone;
            self.exited_threads += gone.count_ones();
        }
        let w = &mut self.warps[wi];
        if gone == 0 && same && m == w.group {
            if let Some(t) = target {
                w.group_pc = t;
                return Flow::Stay;
            }
        }
        // Lanes in m carry their own return pcs: keep regroup from overwriting them.
        w.group &= !m;
        for l in lanes_of(w.group) {
            w.pc[l] = w.group_pc + 1;
        }
        w.group = 0;
        if gone != 0 {
            Cta::lanes_exited(&mut self.warps[wi]);
            self.release_ready_barriers();
        }
        Flow::Stay
    }

    /// After a call returned: copies the return values out of the popped frame (it starts at
    /// the lane's stack pointer) into the caller's `.param` variables.
    #[inline(never)]
    pub(super) fn exec_call_ret(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        copies: &[ParamCopy],
        m: u32,
    ) -> Result<(), FaultKind> {
        for l in lanes_of(m) {
            let fb = STACK_BASE + stacks(&mut self.warps[wi])[l].sp as u64;
            for c in copies {
                let dst = self.place_addr(wi, l, c.caller);
                let src = fb + c.callee_off as u64;
                self.local_copy(ctx, wi, l, (dst, src), c.bytes as usize)?;
            }
        }
        Ok(())
    }

    /// Reads `n` (≤ 8) bytes of a lane's local memory at a place.
    pub(super) fn place_read(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        lane: usize,
        p: Place,
        n: usize,
    ) -> Result<u64, FaultKind> {
        let a = self.place_addr(wi, lane, p);
        Ok(read_le(self.local_slice(ctx, wi, lane, a, n)?))
    }

    /// Writes `n` (≤ 8) bytes of a lane's local memory at a place.
    pub(super) fn place_write(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        lane: usize,
        p: Place,
        n: usize,
        v: u64,
    ) -> Result<(), FaultKind> {
        let a = self.place_addr(wi, lane, p);
        write_le(self.local_slice(ctx, wi, lane, a, n)?, v);
        Ok(())
    }
}

impl Cta {
    /// Carry-flag arithmetic (kept out of line: the executor's main match stays small).
    #[inline(never)]
    pub(super) fn exec_carry(&mut self, ctx: &LaunchCtx, wi: usize, op: &CarryOp, m: u32) {
        let w = &mut self.warps[wi];
        let dm = reg_mask(ctx.prog.reg_bits[op.d as usize]);
        for l in lanes_of(m) {
            let r = |s: u32| w.regs[s as usize][l];
            let (d, cf) = op.eval(r(op.a), r(op.b), r(op.c), r(op.cc));
            w.regs[op.d as usize][l] = d & dm;
            if op.cout {
                w.regs[op.cc as usize][l] = cf;
            }
        }
    }
}

impl Cta {
    /// CUDA's `__assertfail` for `lane` (the first lane whose assertion failed): the fault that
    /// carries the message, or the fault reading it raised.
    #[inline(never)]
    pub(super) fn exec_assertfail(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        a: &AssertFail,
        lane: usize,
    ) -> FaultKind {
        let mut read = || -> Result<FaultKind, FaultKind> {
            Ok(FaultKind::Assert {
                message: self.place_cstr(ctx, wi, lane, a.message)?,
                file: self.place_cstr(ctx, wi, lane, a.file)?,
                line: self.place_read(ctx, wi, lane, a.line, 4)? as u32,
                function: self.place_cstr(ctx, wi, lane, a.function)?,
            })
        };
        match read() {
            Ok(fault) | Err(fault) => fault,
        }
    }

    /// The NUL-terminated string whose generic address a lane's `.param` place holds.
    fn place_cstr(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        lane: usize,
        p: Place,
    ) -> Result<String, FaultKind> {
        let addr = self.place_read(ctx, wi, lane, p, 8)?;
        self.read_cstr(ctx, wi, addr, lane)
    }

    /// CUDA's `vprintf(format, args)` for the lanes in `m` (out of line: rare).
    #[inline(never)]
    pub(super) fn exec_vprintf(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        (fmt, args, ret): (Place, Place, Option<Place>),
        m: u32,
    ) -> Result<(), FaultKind> {
        let mut text = String::new();
        for l in lanes_of(m) {
            let fp = self.place_read(ctx, wi, l, fmt, 8)?;
            let ap = self.place_read(ctx, wi, l, args, 8)?;
            let fmt_s = self.read_cstr(ctx, wi, fp, l)?;
            let out = self.format_printf(ctx, wi, &fmt_s, ap, l)?;
            if let Some(r) = ret {
                self.place_write(ctx, wi, l, r, 4, out.len() as u64)?;
            }
            text.push_str(&out);
        }
        match &ctx.printf {
            Some(sink) => sink
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_str(&text),
            None => {
                use std::io::Write;
                let mut so = std::io::stdout().lock();
                let _ = so.write_all(text.as_bytes());
                let _ = so.flush();
            }
        }
        Ok(())
    }
}
