//! Execution of asynchronous copies and mbarriers: `cp.async`, `cp.async.bulk[.tensor]`
//! (tile and im2col), `tensormap.replace`, `mbarrier.*`.

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
            Op::CpAsyncArrive { addr, off, noinc } => {
                self.cp_async_arrive(wi, (*addr, *off), *noinc, m)?
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
                let args = fastmem::CpAsyncArgs {
                    dst: (*dspace, *dst, *doff),
                    src: (*src, *soff, *src_size),
                    size: *size,
                };
                if self.cp_async_warp(ctx, wi, m, args) {
                    return Ok(Flow::Next);
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
                        // a chunk the source ends in reads its bytes one by one (src-size
                        // need not be a multiple of 4; the rest of the chunk is zero)
                        let whole = if k + chunk <= n_src { chunk } else { 1 };
                        let mut v = 0u64;
                        for b in (0..chunk).step_by(whole as usize) {
                            if k + b < n_src {
                                let at = sa + (k + b) as u64;
                                let loc = self.locate(ctx, MSpace::Global, at, whole, l, 0)?;
                                let x = self.load(ctx, wi, &loc, whole, Ordering::Relaxed);
                                v |= x << (8 * b);
                            }
                        }
                        let loc = self.locate(ctx, *dspace, da + k as u64, chunk, l, 0)?;
                        self.store(wi, &loc, chunk, v, Ordering::Relaxed);
                        k += chunk;
                    }
                }
            }
            Op::AsyncRemote { .. } => {
                for l in lanes_of(m) {
                    self.async_remote_lane(ctx, wi, &inst.op, l)?;
                }
            }
            Op::BulkReduce { .. } => {
                for l in lanes_of(m) {
                    self.bulk_reduce_lane(ctx, wi, &inst.op, l)?;
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// `cp.async.mbarrier.arrive[.noinc]`. The emulator completes a `cp.async` when it is
    /// issued, so the thread's prior copies are done and the arrive-on happens now. Without
    /// `.noinc` the pending count was first incremented by one, so the net change is zero.
    fn cp_async_arrive(
        &mut self,
        wi: usize,
        (addr, off): (u32, i64),
        noinc: bool,
        m: u32,
    ) -> Result<(), FaultKind> {
        for l in lanes_of(m) {
            let key = self.mbar_key(wi, addr, off, l)?;
            let mb = self.mbars.get_mut(&key).ok_or_else(|| uninit(key))?;
            if noinc {
                mb.arrive(1, false);
            }
        }
        Ok(())
    }

    /// One lane's `st.async` / `red.async`: the store or reduction lands at once, then its bytes
    /// complete on the mbarrier, which must be in the same CTA as the destination.
    fn async_remote_lane(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        op: &Op,
        l: usize,
    ) -> Result<(), FaultKind> {
        let Op::AsyncRemote {
            red,
            ty,
            elem,
            srcs,
            addr,
            off,
            mbar,
            moff,
        } = op
        else {
            return Ok(());
        };
        let a = self.warps[wi].regs[*addr as usize][l].wrapping_add(*off as u64);
        let a = self.shared_offset(MSpace::Generic, a);
        let bytes = elem * srcs.len() as u32;
        // the whole vector is naturally aligned and lies in one CTA's shared memory
        self.locate(ctx, MSpace::Shared, a, bytes, l, 0)?;
        for (k, s) in srcs.iter().enumerate() {
            let loc = self.locate(
                ctx,
                MSpace::Shared,
                a + (k as u32 * elem) as u64,
                *elem,
                l,
                0,
            )?;
            let v = self.warps[wi].regs[*s as usize][l];
            match red {
                Some(r) => {
                    self.rmw_at(ctx, wi, &loc, (*r, *ty), v, Ordering::Relaxed);
                }
                None => self.store(wi, &loc, *elem, v, Ordering::Relaxed),
            }
            if let (Some(s), Loc::Shared(o)) = (self.san.as_mut(), &loc) {
                s.mark_written(*o as u64, *elem as u64);
            }
        }
        let dest = self.split_rank(a).0;
        self.complete_remote(wi, (*mbar, *moff), l, dest, bytes)
    }

    /// Completes `bytes` on the mbarrier at `reg[mbar] + moff`, which must live in the CTA
    /// `dest` (None: this one) the data went to.
    fn complete_remote(
        &mut self,
        wi: usize,
        (mbar, moff): (u32, i64),
        l: usize,
        dest: Option<usize>,
        bytes: u32,
    ) -> Result<(), FaultKind> {
        let (peer, key) = self.mbar_key_any(wi, mbar, moff, l)?;
        if peer != dest {
            LAST_LANE.with(|c| c.set(l as u32));
            return Err(FaultKind::Other(
                "the mbarrier of an asynchronous store/reduction must be in the destination's CTA"
                    .into(),
            ));
        }
        let mb = self
            .mbar_home(peer)
            .0
            .get_mut(&key)
            .ok_or_else(|| uninit(key))?;
        mb.complete_tx(bytes);
        Ok(())
    }

    /// One lane's `cp.reduce.async.bulk`: `size` bytes of this CTA's shared memory reduced
    /// element by element (each element atomically) into global or shared::cluster memory.
    fn bulk_reduce_lane(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        op: &Op,
        l: usize,
    ) -> Result<(), FaultKind> {
        let Op::BulkReduce {
            op,
            ty,
            dst,
            doff,
            dspace,
            src,
            soff,
            size,
            mbar,
        } = op
        else {
            return Ok(());
        };
        let regs = &self.warps[wi].regs;
        let da = regs[*dst as usize][l].wrapping_add(*doff as u64);
        let sa = regs[*src as usize][l].wrapping_add(*soff as u64);
        let n = regs[*size as usize][l] as u32;
        if !n.is_multiple_of(16) || !da.is_multiple_of(16) || !sa.is_multiple_of(16) {
            LAST_LANE.with(|c| c.set(l as u32));
            return Err(FaultKind::Other(format!(
                "cp.reduce.async.bulk needs 16-byte aligned addresses and a size that is a \
                 multiple of 16 (dst {da:#x}, src {sa:#x}, size {n})"
            )));
        }
        let (da, sa) = match dspace {
            MSpace::Shared => (self.shared_offset(MSpace::Generic, da), sa),
            _ => (da, sa),
        };
        let sa = self.shared_offset(MSpace::Generic, sa);
        let es = ty.size();
        for k in (0..n).step_by(es as usize) {
            let sl = self.locate(ctx, MSpace::Shared, sa + k as u64, es, l, 0)?;
            let v = self.load(ctx, wi, &sl, es, Ordering::Relaxed);
            let dl = self.locate(ctx, *dspace, da + k as u64, es, l, 0)?;
            self.rmw_at(ctx, wi, &dl, (*op, *ty), v, Ordering::Relaxed);
        }
        match mbar {
            Some(mb) => {
                let dest = self.split_rank(da).0;
                self.complete_remote(wi, *mb, l, dest, n)
            }
            None => Ok(()),
        }
    }

    /// Executes the TMA ops, tensor copies and `tensormap.replace` ([`Cta::exec`] sends them
    /// here).
    #[inline(always)]
    pub(super) fn exec_bulk_tensor(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::BulkTensor { .. } => {
                for l in lanes_of(m) {
                    self.tensor_copy_lane(ctx, wi, &inst.op, l)
                        .inspect_err(|_| {
                            LAST_LANE.with(|c| c.set(l as u32));
                        })?;
                }
            }
            Op::TensormapReplace {
                field,
                addr,
                off,
                space,
                ord,
                value,
            } => {
                for l in lanes_of(m) {
                    let a = self.warps[wi].regs[*addr as usize][l].wrapping_add(*off as u64);
                    let v = self.warps[wi].regs[*value as usize][l];
                    let raw = self.read_tensor_map_bytes(ctx, wi, *space, a, l)?;
                    let mut desc = crate::hopper::TensorMapDesc::from_bytes_or_blank(&raw)
                        .map_err(FaultKind::Other)?;
                    desc.replace(*field, *ord, v).map_err(FaultKind::Other)?;
                    self.write_tensor_map(ctx, wi, *space, a, l, &desc.to_bytes())?;
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// The tensor map at `addr` in `space` (128 bytes, decoded; a fault names what is wrong).
    fn read_tensor_map(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        space: MSpace,
        addr: u64,
        l: usize,
    ) -> Result<crate::hopper::TensorMapDesc, FaultKind> {
        let raw = self.read_tensor_map_bytes(ctx, wi, space, addr, l)?;
        crate::hopper::TensorMapDesc::from_bytes(&raw).map_err(FaultKind::Other)
    }

    /// The 128 bytes of the tensor map object at `addr` in `space`.
    fn read_tensor_map_bytes(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        space: MSpace,
        addr: u64,
        l: usize,
    ) -> Result<[u8; 128], FaultKind> {
        let mut raw = [0u8; 128];
        for (k, chunk) in raw.chunks_mut(8).enumerate() {
            let loc = self.locate(ctx, space, addr + 8 * k as u64, 8, l, ctx.prog.local_bytes)?;
            chunk.copy_from_slice(&self.load(ctx, wi, &loc, 8, Ordering::Relaxed).to_le_bytes());
        }
        Ok(raw)
    }

    /// Writes the 128 bytes of a tensor map at `addr` in `space`.
    fn write_tensor_map(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        space: MSpace,
        addr: u64,
        l: usize,
        raw: &[u8; 128],
    ) -> Result<(), FaultKind> {
        for (k, chunk) in raw.chunks(8).enumerate() {
            let loc = self.locate(ctx, space, addr + 8 * k as u64, 8, l, ctx.prog.local_bytes)?;
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.store(wi, &loc, 8, u64::from_le_bytes(w), Ordering::Relaxed);
        }
        Ok(())
    }

    /// One lane's tensor copy: a load is queued on its mbarrier(s) (it lands when a thread
    /// observes the barrier), a store or reduction happens at once.
    fn tensor_copy_lane(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        op: &Op,
        l: usize,
    ) -> Result<(), FaultKind> {
        let Op::BulkTensor {
            load,
            smem,
            soff,
            tmap,
            toff,
            tspace,
            coords,
            mbar,
            cta_mask,
            red,
            im2col,
            offsets,
        } = op
        else {
            return Ok(());
        };
        let regs = &self.warps[wi].regs;
        let ta = regs[*tmap as usize][l].wrapping_add(*toff as u64);
        let cs: Vec<i64> = coords
            .iter()
            .map(|c| regs[*c as usize][l] as u32 as i32 as i64)
            .collect();
        let offs: Vec<i64> = offsets
            .iter()
            .map(|o| regs[*o as usize][l] as u16 as i64) // unsigned filter taps
            .collect();
        let sa = regs[*smem as usize][l].wrapping_add(*soff as u64);
        let sa = self.split_rank(self.shared_offset(MSpace::Generic, sa)).1;
        let desc = self.read_tensor_map(ctx, wi, *tspace, ta, l)?;
        check_tensor_map(&desc, *im2col, cs.len())?;
        if *load {
            let mask = if *cta_mask != NONE {
                self.warps[wi].regs[*cta_mask as usize][l] as u32 & 0xffff
            } else {
                1 << self.rank
            };
            let key = self.mbar_key(wi, mbar.map_or(ZERO, |m| m.0), mbar.map_or(0, |m| m.1), l)?;
            let what = TmaBox {
                desc,
                coords: cs,
                offsets: offs,
                smem: sa,
            };
            self.queue_tensor_load(what, key, mask)
        } else if let Some(r) = red {
            self.tensor_reduce(ctx, &desc, &cs, sa, *r)
        } else {
            self.tensor_store(ctx, &desc, &cs, sa)
        }
    }

    /// Queues a tensor load on the mbarrier `key` of every CTA of `mask` (multicast: the same
    /// box lands at the same offsets in each and completes on each one's mbarrier at the same
    /// offset).
    fn queue_tensor_load(&mut self, b: TmaBox, key: u32, mask: u32) -> Result<(), FaultKind> {
        let bytes = b.desc.box_bytes();
        for r in (0..16u32).filter(|r| mask >> r & 1 != 0) {
            let peer = (r != self.rank).then_some(r as usize);
            if peer.is_some_and(|p| p >= self.peers.len()) {
                return Err(FaultKind::Other(format!(
                    "TMA multicast to CTA rank {r} outside the cluster"
                )));
            }
            self.check_wgmma_war(peer, b.smem, bytes, "cp.async.bulk.tensor")?;
        }
        for r in (0..16u32).filter(|r| mask >> r & 1 != 0) {
            let peer = (r != self.rank).then_some(r as usize);
            self.mbar_home(peer).1.push(PendingCopy {
                mbar: key,
                bytes: bytes as u32,
                kind: PendingKind::Tensor {
                    desc: Box::new(b.desc.clone()),
                    coords: b.coords.clone(),
                    offsets: b.offsets.clone(),
                    smem: b.smem,
                },
            });
        }
        Ok(())
    }

    /// `cp.async.bulk.tensor` store: the box at `coords`, gathered from this CTA's (swizzled)
    /// shared memory at `smem`, written to the tensor; out-of-bounds elements are not written.
    fn tensor_store(
        &mut self,
        ctx: &LaunchCtx,
        desc: &crate::hopper::TensorMapDesc,
        coords: &[i64],
        smem: u64,
    ) -> Result<(), FaultKind> {
        let mut err = None;
        let mut buf = Vec::new();
        desc.for_each_box_run(coords, &[], |o, g, len| {
            let Some(g) = g else { return };
            if err.is_some() {
                return;
            }
            // gather the run from (swizzled) shared memory, 16-byte pieces
            buf.clear();
            let mut done = 0u64;
            while done < len {
                let so = smem + o + done;
                let piece = (16 - so % 16).min(len - done);
                let s_addr = desc.swizzle.apply(so) as usize;
                let Some(src) = self.shared.get(s_addr..s_addr + piece as usize) else {
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
        err.map_or(Ok(()), Err)
    }
}

/// A tensor load's box: the map, coordinates, im2col offsets and shared-memory destination.
struct TmaBox {
    desc: crate::hopper::TensorMapDesc,
    coords: Vec<i64>,
    offsets: Vec<i64>,
    smem: u64,
}

/// Whether a tensor copy of `ncoords` coordinates in mode `im2col` can go through `desc`: the
/// instruction's mode and dimension count must be the map's, and the emulator must model the
/// map ([`crate::hopper::TensorMapDesc::unsupported`]).
fn check_tensor_map(
    desc: &crate::hopper::TensorMapDesc,
    im2col: bool,
    ncoords: usize,
) -> Result<(), FaultKind> {
    if let Some(why) = desc.unsupported() {
        return Err(FaultKind::Other(why));
    }
    if desc.im2col.is_some() != im2col {
        let (i, m) = if im2col {
            ("an im2col", "a tiled")
        } else {
            ("a tile-mode", "an im2col")
        };
        return Err(FaultKind::Other(format!(
            "{i} tensor copy through {m} tensor map"
        )));
    }
    if ncoords != desc.rank as usize {
        return Err(FaultKind::Other(format!(
            "a {ncoords}d tensor copy through a tensor map of rank {}",
            desc.rank
        )));
    }
    Ok(())
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
        let Some(o) = self.own_shared(dspace, da, size) else {
            return false;
        };
        let mut row = [0u8; 16];
        if n_src == size {
            let Some((a, off)) = self.global_span(ctx, sa, size, lane) else {
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
                PendingKind::Tensor {
                    desc,
                    coords,
                    offsets,
                    smem,
                } => {
                    // out-of-bounds elements: zeros, or all-ones bytes (NaN) with NaN fill
                    let fill = if desc.oob_nan { 0xffu8 } else { 0 };
                    let mut err = None;
                    let shared = &mut self.shared;
                    let san = &mut self.san;
                    let mut buf = Vec::new();
                    desc.for_each_box_run(&coords, &offsets, |o, g, len| {
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

impl Cta {
    /// `cp.reduce.async.bulk.tensor` (`.tile` or `.im2col_no_offs`): reduces the box at `coords`, read from this
    /// CTA's (swizzled) shared memory at `smem`, into the tensor element by element with `op`
    /// on the tensor map's element type; out-of-bounds elements are not written.
    fn tensor_reduce(
        &mut self,
        ctx: &LaunchCtx,
        desc: &crate::hopper::TensorMapDesc,
        coords: &[i64],
        smem: u64,
        op: AtomOp,
    ) -> Result<(), FaultKind> {
        use crate::hopper::TmaType as T;
        let ty = match desc.dtype {
            T::U8 => Ty::U8,
            T::U16 => Ty::U16,
            T::U32 => Ty::U32,
            T::I32 => Ty::S32,
            T::U64 => Ty::U64,
            T::I64 => Ty::S64,
            T::F16 => Ty::F16,
            T::F32 => Ty::F32,
            T::F64 => Ty::F64,
            T::Bf16 => Ty::Bf16,
        };
        if !tensor_reduce_ok(op, ty) {
            return Err(FaultKind::Other(format!(
                "cp.reduce.async.bulk.tensor: {op:?} is not defined on tensor maps of .{ty}"
            )));
        }
        let es = ty.size() as u64;
        let mut err = None;
        desc.for_each_box_run(coords, &[], |o, g, len| {
            let Some(g) = g else { return };
            if err.is_some() {
                return;
            }
            let Some(a) = ctx.mem.find(g, len) else {
                err = Some(FaultKind::OutOfBounds {
                    space: "global (TMA)",
                    addr: g,
                    size: len as u32,
                });
                return;
            };
            for k in (0..len).step_by(es as usize) {
                let s_addr = desc.swizzle.apply(smem + o + k) as usize;
                let Some(src) = self.shared.get(s_addr..s_addr + es as usize) else {
                    err = Some(FaultKind::OutOfBounds {
                        space: "shared",
                        addr: s_addr as u64,
                        size: es as u32,
                    });
                    return;
                };
                let mut x = [0u8; 8];
                x[..es as usize].copy_from_slice(src);
                let v = u64::from_le_bytes(x);
                a.rmw(g + k - a.base, es as u32, Ordering::Relaxed, |old| {
                    atom_apply(op, ty, old, v, 0)
                });
            }
        });
        err.map_or(Ok(()), Err)
    }
}

/// The reductions `cp.reduce.async.bulk.tensor` defines per element type: `.add` on
/// .u32/.s32/.u64/.f32/.f16/.bf16, `.min/.max` on .u32/.s32/.u64/.s64/.f16/.bf16, `.inc/.dec`
/// on .u32, `.and/.or/.xor` on .u32/.s32/.u64/.s64 (as bits).
fn tensor_reduce_ok(op: AtomOp, ty: Ty) -> bool {
    use AtomOp as A;
    match op {
        A::Add => matches!(
            ty,
            Ty::U32 | Ty::S32 | Ty::U64 | Ty::F32 | Ty::F16 | Ty::Bf16
        ),
        A::Min | A::Max => matches!(
            ty,
            Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64 | Ty::F16 | Ty::Bf16
        ),
        A::Inc | A::Dec => ty == Ty::U32,
        A::And | A::Or | A::Xor => matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64),
        A::Exch | A::Cas => false,
    }
}
