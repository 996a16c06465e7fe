//! Execution of asynchronous copies and mbarriers: `cp.async`, `cp.async.bulk[.tensor]`,
//! `mbarrier.*`.

use super::*;

impl Cta {
    /// Executes the mbarrier ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_mbarrier(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::MbarInit { addr, off, count } => {
                for l in lanes_of(m) {
                    let key = self.mbar_key(wi, *addr, *off, l)?;
                    let c = self.warps[wi].regs[*count as usize][l] as u32;
                    self.mbars.insert(key, crate::hopper::Mbarrier::init(c));
                    if let Some(s) = self.san.as_mut() {
                        s.mbar_init(key);
                    }
                }
            }
            Op::MbarInval { addr, off } => {
                for l in lanes_of(m) {
                    let key = self.mbar_key(wi, *addr, *off, l)?;
                    self.mbars.remove(&key);
                }
            }
            Op::MbarArrive {
                d,
                addr,
                off,
                count,
                tx,
                drop,
                remote: _,
            } => {
                for l in lanes_of(m) {
                    let (peer, key) = self.mbar_key_any(wi, *addr, *off, l)?;
                    let regs = &self.warps[wi].regs;
                    let c = if *count != NONE {
                        regs[*count as usize][l] as u32
                    } else {
                        1
                    };
                    let t = if *tx != NONE {
                        Some(regs[*tx as usize][l] as u32)
                    } else {
                        None
                    };
                    let mb = self
                        .mbar_home(peer)
                        .0
                        .get_mut(&key)
                        .ok_or_else(|| uninit(key))?;
                    if let Some(t) = t {
                        mb.expect_tx(t);
                    }
                    let (pending, phase) = (mb.pending, mb.phase);
                    let token = mb.arrive(c, *drop);
                    let after = mb.phase;
                    self.warps[wi].regs[*d as usize][l] = token;
                    if let (Some(s), None) = (self.san.as_mut(), peer) {
                        let pc = self.warps[wi].group_pc;
                        let who = crate::sanitize::cta::Who { wi, lane: l, pc };
                        s.mbar_arrive(ctx, who, key, (c, pending), (phase, after));
                    }
                }
                // A plain arrive (a consumer releasing a stage) yields: the waiters (a producer
                // blocked on the released stage) run right away, as they would concurrently on
                // hardware, instead of after this warp has run ahead. This is what lets the
                // wgmma operand check see a stage released before the wgmma reading it
                // completed. Producers' `expect_tx` arrives do not yield, so they run ahead and
                // keep the ring full, as a TMA producer does.
                if *tx == NONE {
                    return Ok(Flow::Yield);
                }
            }
            Op::MbarTx {
                addr,
                off,
                bytes,
                complete,
            } => {
                for l in lanes_of(m) {
                    let key = self.mbar_key(wi, *addr, *off, l)?;
                    let b = self.warps[wi].regs[*bytes as usize][l] as u32;
                    let mb = self.mbars.get_mut(&key).ok_or_else(|| uninit(key))?;
                    if *complete {
                        mb.complete_tx(b);
                    } else {
                        mb.expect_tx(b);
                    }
                }
            }
            Op::MbarWait {
                d,
                addr,
                off,
                arg,
                parity,
            } => {
                let mut all_done = true;
                for l in lanes_of(m) {
                    let key = self.mbar_key(wi, *addr, *off, l)?;
                    self.land_copies(ctx, wi, key)?;
                    let x = self.warps[wi].regs[*arg as usize][l];
                    let mb = self.mbars.get(&key).ok_or_else(|| uninit(key))?;
                    let done = if *parity {
                        mb.parity_done(x as u32)
                    } else {
                        mb.token_done(x)
                    };
                    all_done &= done;
                    self.warps[wi].regs[*d as usize][l] = done as u64;
                    if let (Some(s), true) = (self.san.as_mut(), done) {
                        s.mbar_acquire(wi, key, mb.phase);
                    }
                }
                if !all_done {
                    // A waiting warp gives the others (the producer) a turn.
                    self.warps[wi].wait_pc = self.warps[wi].group_pc;
                    self.waits += 1;
                    return Ok(Flow::Yield);
                }
            }
            Op::MbarPending { d, state: _ } => {
                let w = &mut self.warps[wi];
                for l in lanes_of(m) {
                    w.regs[*d as usize][l] = 0;
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// Executes the async copy ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_async_copy(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::Bulk {
                dst,
                doff,
                dspace,
                src,
                soff,
                sspace,
                size,
                mbar,
            } => {
                for l in lanes_of(m) {
                    let regs = &self.warps[wi].regs;
                    let da = regs[*dst as usize][l].wrapping_add(*doff as u64);
                    let sa = regs[*src as usize][l].wrapping_add(*soff as u64);
                    let n = regs[*size as usize][l] as u32;
                    if !n.is_multiple_of(16) {
                        return Err(FaultKind::Other(format!(
                            "cp.async.bulk size {n} is not a multiple of 16"
                        )));
                    }
                    match mbar {
                        Some((ma, mo)) => {
                            let key = self.mbar_key(wi, *ma, *mo, l)?;
                            let dsh = self.shared_offset(*dspace, da);
                            let (peer, off) = self.split_rank(dsh);
                            let peer = peer.filter(|&r| r as u32 != self.rank);
                            self.check_wgmma_war(peer, off, n as u64, "cp.async.bulk")?;
                            self.pending_tma.push(PendingCopy {
                                mbar: key,
                                bytes: n,
                                kind: PendingKind::Bulk {
                                    src: sa,
                                    sspace: *sspace,
                                    dst: dsh,
                                },
                            });
                        }
                        None => self.copy_bytes(ctx, wi, *dspace, da, *sspace, sa, n, l)?,
                    }
                }
            }
            Op::CpAsync {
                dst,
                doff,
                src,
                soff,
                size,
                src_size,
                dspace,
            } => {
                if self.banks.is_some() {
                    self.profile_lanes(wi, inst.src, m, *dspace, (*dst, *doff), *size);
                }
                if self.san.is_some() {
                    self.san_cp_async(
                        ctx,
                        wi,
                        m,
                        (*dspace, *dst, *doff),
                        (*src, *soff, *src_size),
                        *size,
                    );
                }
                for l in lanes_of(m) {
                    let w = &self.warps[wi];
                    let da = w.regs[*dst as usize][l].wrapping_add(*doff as u64);
                    let sa = w.regs[*src as usize][l].wrapping_add(*soff as u64);
                    let n_src = (w.regs[*src_size as usize][l] as u32).min(*size);
                    if self.cp_async_row(ctx, wi, l, (*dspace, da), (sa, n_src), *size) {
                        continue;
                    }
                    let mut k = 0u32;
                    while k < *size {
                        let chunk = if k + 4 <= *size { 4 } else { 1 };
                        let v = if k < n_src {
                            let loc = self.locate(
                                ctx,
                                MSpace::Global,
                                sa + k as u64,
                                chunk.min(n_src - k).max(1),
                                l,
                                0,
                            )?;
                            self.load(
                                ctx,
                                wi,
                                &loc,
                                chunk.min(n_src - k).max(1),
                                Ordering::Relaxed,
                            )
                        } else {
                            0
                        };
                        let loc = self.locate(ctx, *dspace, da + k as u64, chunk, l, 0)?;
                        self.store(wi, &loc, chunk, v, Ordering::Relaxed);
                        k += chunk;
                    }
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// Executes the TMA (`cp.async.bulk.tensor`) ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_bulk_tensor(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let prog = &*ctx.prog;
        match &inst.op {
            Op::BulkTensor {
                load,
                smem,
                soff,
                tmap,
                toff,
                tspace,
                coords,
                mbar,
                cta_mask,
            } => {
                for l in lanes_of(m) {
                    let ta = self.warps[wi].regs[*tmap as usize][l].wrapping_add(*toff as u64);
                    let mut raw = [0u8; 128];
                    for (k, chunk) in raw.chunks_mut(8).enumerate() {
                        let loc =
                            self.locate(ctx, *tspace, ta + 8 * k as u64, 8, l, prog.local_bytes)?;
                        chunk.copy_from_slice(
                            &self.load(ctx, wi, &loc, 8, Ordering::Relaxed).to_le_bytes(),
                        );
                    }
                    let desc =
                        crate::hopper::TensorMapDesc::from_bytes(&raw).map_err(FaultKind::Other)?;
                    let cs: Vec<i64> = coords
                        .iter()
                        .map(|c| self.warps[wi].regs[*c as usize][l] as u32 as i32 as i64)
                        .collect();
                    let sa = self.warps[wi].regs[*smem as usize][l].wrapping_add(*soff as u64);
                    let sa = self.split_rank(self.shared_offset(MSpace::Generic, sa)).1;
                    if *load {
                        let (ma, mo) = mbar.unwrap_or((ZERO, 0));
                        let key = self.mbar_key(wi, ma, mo, l)?;
                        let bytes = desc.box_bytes() as u32;
                        // Multicast: the same box lands at the same offsets in every CTA named by
                        // the mask and completes on each one's mbarrier at the same offset.
                        let mask = if *cta_mask != NONE {
                            self.warps[wi].regs[*cta_mask as usize][l] as u32 & 0xffff
                        } else {
                            1 << self.rank
                        };
                        for r in (0..16u32).filter(|r| mask >> r & 1 != 0) {
                            let peer = (r != self.rank).then_some(r as usize);
                            self.check_wgmma_war(
                                peer,
                                sa,
                                desc.box_bytes(),
                                "cp.async.bulk.tensor",
                            )?;
                        }
                        for r in 0..16usize {
                            if mask >> r & 1 == 0 {
                                continue;
                            }
                            let peer = if r as u32 == self.rank { None } else { Some(r) };
                            if peer.is_some_and(|p| p >= self.peers.len()) {
                                return Err(FaultKind::Other(format!(
                                    "TMA multicast to CTA rank {r} outside the cluster"
                                )));
                            }
                            self.mbar_home(peer).1.push(PendingCopy {
                                mbar: key,
                                bytes,
                                kind: PendingKind::Tensor {
                                    desc: Box::new(desc.clone()),
                                    coords: cs.clone(),
                                    smem: sa,
                                },
                            });
                        }
                    } else {
                        let mut err = None;
                        let mut buf = Vec::new();
                        desc.for_each_run(&cs, |o, g, len| {
                            let Some(g) = g else { return };
                            if err.is_some() {
                                return;
                            }
                            // gather the run from (swizzled) shared memory, 16-byte pieces
                            buf.clear();
                            let mut done = 0u64;
                            while done < len {
                                let so = sa + o + done;
                                let piece = (16 - so % 16).min(len - done);
                                let s_addr = desc.swizzle.apply(so) as usize;
                                let Some(src) = self.shared.get(s_addr..s_addr + piece as usize)
                                else {
                                    err = Some(FaultKind::OutOfBounds {
                                        space: "shared",
                                        addr: s_addr as u64,
                                        size: piece as u32,
                                    });
                                    return;
                                };
                                buf.extend_from_slice(src);
                                done += piece;
                            }
                            match ctx.mem.find(g, len) {
                                Some(a) => a.write_bytes(g - a.base, &buf),
                                None => {
                                    err = Some(FaultKind::OutOfBounds {
                                        space: "global",
                                        addr: g,
                                        size: len as u32,
                                    })
                                }
                            }
                        });
                        if let Some(e) = err {
                            LAST_LANE.with(|c| c.set(l as u32));
                            return Err(e);
                        }
                    }
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }
}

impl Cta {
    /// One lane's `cp.async` in the common case, as one row: aligned addresses, global source
    /// copied whole (or not at all: zero fill), destination in this CTA's shared memory. Returns
    /// false (nothing done) for anything else, including faulting addresses: the per-chunk path
    /// then runs with its exact semantics and diagnostics. Same bytes as that path.
    pub(super) fn cp_async_row(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        lane: usize,
        (dspace, da): (MSpace, u64),
        (sa, n_src): (u64, u32),
        size: u32,
    ) -> bool {
        let aligned = da.is_multiple_of(size as u64) && sa.is_multiple_of(size as u64);
        if size > 16 || !aligned || (n_src != size && n_src != 0) {
            return false;
        }
        let Ok(Loc::Shared(o)) = self.locate(ctx, dspace, da, size, lane, 0) else {
            return false;
        };
        let mut row = [0u8; 16];
        if n_src == size {
            let Ok(Loc::Global(a, off)) = self.locate(ctx, MSpace::Global, sa, size, lane, 0)
            else {
                return false;
            };
            let step = size.min(8);
            for i in (0..size).step_by(step as usize) {
                let loc = Loc::Global(a, off + i as u64);
                let v = self.load(ctx, wi, &loc, step, Ordering::Relaxed);
                row[i as usize..(i + step) as usize]
                    .copy_from_slice(&v.to_le_bytes()[..step as usize]);
            }
        }
        self.shared[o..o + size as usize].copy_from_slice(&row[..size as usize]);
        true
    }
}

pub(super) fn uninit(key: u32) -> FaultKind {
    FaultKind::Other(format!(
        "mbarrier at shared offset {key:#x} used before mbarrier.init"
    ))
}

impl Cta {
    /// The mbarrier table and pending-copy list of this CTA or of a cluster peer.
    #[allow(clippy::type_complexity)]
    pub(super) fn mbar_home(
        &mut self,
        peer: Option<usize>,
    ) -> (
        &mut std::collections::HashMap<u32, crate::hopper::Mbarrier>,
        &mut Vec<PendingCopy>,
    ) {
        match peer {
            Some(r) if r < self.peers.len() => {
                let p = &mut self.peers[r];
                (&mut p.mbars, &mut p.pending)
            }
            _ => (&mut self.mbars, &mut self.pending_tma),
        }
    }

    /// Like `mbar_key` but for addresses that may name a cluster peer's mbarrier.
    pub(super) fn mbar_key_any(
        &self,
        wi: usize,
        addr: u32,
        off: i64,
        lane: usize,
    ) -> Result<(Option<usize>, u32), FaultKind> {
        let a = self.warps[wi].regs[addr as usize][lane].wrapping_add(off as u64);
        let o = self.shared_offset(MSpace::Generic, a);
        let (peer, o) = self.split_rank(o);
        let len = match peer {
            Some(r) => self.peers.get(r).map(|p| p.shared.len()).unwrap_or(0),
            None => self.shared.len(),
        };
        if !o.is_multiple_of(8) || o + 8 > len as u64 {
            LAST_LANE.with(|c| c.set(lane as u32));
            return Err(FaultKind::OutOfBounds {
                space: "shared::cluster (mbarrier)",
                addr: a,
                size: 8,
            });
        }
        Ok((peer, o as u32))
    }

    pub(super) fn mbar_key(
        &self,
        wi: usize,
        addr: u32,
        off: i64,
        lane: usize,
    ) -> Result<u32, FaultKind> {
        let a = self.warps[wi].regs[addr as usize][lane].wrapping_add(off as u64);
        let o = self.shared_offset(MSpace::Generic, a);
        let o = self.split_rank(o).1;
        if !o.is_multiple_of(8) || o + 8 > self.shared.len() as u64 {
            LAST_LANE.with(|c| c.set(lane as u32));
            return Err(FaultKind::OutOfBounds {
                space: "shared (mbarrier)",
                addr: a,
                size: 8,
            });
        }
        Ok(o as u32)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_bytes(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        dspace: MSpace,
        da: u64,
        sspace: MSpace,
        sa: u64,
        n: u32,
        lane: usize,
    ) -> Result<(), FaultKind> {
        let lb = ctx.prog.local_bytes;
        let mut k = 0u32;
        while k < n {
            let c = if (da + k as u64).is_multiple_of(8)
                && (sa + k as u64).is_multiple_of(8)
                && k + 8 <= n
            {
                8
            } else {
                1
            };
            let sl = self.locate(ctx, sspace, sa + k as u64, c, lane, lb)?;
            let v = self.load(ctx, wi, &sl, c, Ordering::Relaxed);
            let dl = self.locate(ctx, dspace, da + k as u64, c, lane, lb)?;
            self.store(wi, &dl, c, v, Ordering::Relaxed);
            if let (Some(s), Loc::Shared(o)) = (self.san.as_mut(), &dl) {
                s.mark_written(*o as u64, c as u64);
            }
            k += c;
        }
        Ok(())
    }

    /// Lands the asynchronous copies that complete on mbarrier `key`.
    pub(super) fn land_copies(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        key: u32,
    ) -> Result<(), FaultKind> {
        if !self.pending_tma.iter().any(|p| p.mbar == key) {
            return Ok(());
        }
        let (mine, rest): (Vec<PendingCopy>, Vec<PendingCopy>) =
            std::mem::take(&mut self.pending_tma)
                .into_iter()
                .partition(|p| p.mbar == key);
        self.pending_tma = rest;
        for p in mine {
            match p.kind {
                PendingKind::Bulk { src, sspace, dst } => {
                    self.copy_bytes(ctx, wi, MSpace::Shared, dst, sspace, src, p.bytes, 0)?
                }
                PendingKind::Tensor { desc, coords, smem } => {
                    // out-of-bounds elements: zeros, or all-ones bytes (NaN) with NaN fill
                    let fill = if desc.oob_nan { 0xffu8 } else { 0 };
                    let mut err = None;
                    let shared = &mut self.shared;
                    let san = &mut self.san;
                    let mut buf = Vec::new();
                    desc.for_each_run(&coords, |o, g, len| {
                        if err.is_some() {
                            return;
                        }
                        buf.clear();
                        buf.resize(len as usize, fill);
                        if let Some(g) = g {
                            match ctx.mem.find(g, len) {
                                Some(a) => a.read_bytes(g - a.base, &mut buf),
                                None => {
                                    err = Some(FaultKind::OutOfBounds {
                                        space: "global (TMA)",
                                        addr: g,
                                        size: len as u32,
                                    });
                                    return;
                                }
                            }
                        }
                        // scatter into (swizzled) shared memory in 16-byte pieces
                        let mut done = 0u64;
                        while done < len {
                            let so = smem + o + done;
                            let piece = (16 - so % 16).min(len - done);
                            let s_addr = desc.swizzle.apply(so) as usize;
                            let Some(dst) = shared.get_mut(s_addr..s_addr + piece as usize) else {
                                err = Some(FaultKind::OutOfBounds {
                                    space: "shared (TMA)",
                                    addr: s_addr as u64,
                                    size: piece as u32,
                                });
                                return;
                            };
                            dst.copy_from_slice(&buf[done as usize..(done + piece) as usize]);
                            if let Some(s) = san.as_mut() {
                                s.mark_written(s_addr as u64, piece);
                            }
                            done += piece;
                        }
                    });
                    if let Some(e) = err {
                        return Err(e);
                    }
                }
            }
            if let Some(mb) = self.mbars.get_mut(&p.mbar) {
                mb.complete_tx(p.bytes);
            } else {
                return Err(uninit(p.mbar));
            }
        }
        Ok(())
    }
}
