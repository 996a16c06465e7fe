//! Execution of tensor-core ops: `mma`, `ldmatrix`/`stmatrix`, `wgmma.*`, `setmaxnreg`.

use super::*;
use crate::tc_numerics::TcModel;
use crate::tc_simd::Cols16Fn;

mod wg_acc;
mod wgmma_sp;
use crate::hopper::DescAddr;

impl Cta {
    /// Executes the tensor-core ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_tensor(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let prog = &*ctx.prog;
        match &inst.op {
            Op::Mma { spec, d, a, b, c } => {
                // mma.sync.aligned needs the whole warp converged.
                if self.wait_converged(wi) {
                    return Ok(Flow::Stay);
                }
                let model = ctx.numerics.model(prog.target_sm, spec.aty);
                let w = &mut self.warps[wi];
                let slots = crate::mma::MmaSlots { a, b, c, d, m };
                let cache = w.frag.get_or_insert_with(Default::default);
                if crate::mma::mma_in_place(spec, model.as_ref(), &mut w.regs, slots, cache) {
                    return Ok(Flow::Next);
                }
                // Fragments have at most 4 registers each (decode checked the counts): gather
                // references on the stack, no allocation on this hot path.
                const Z: Lanes = [0; 32];
                let (mut ar, mut br, mut cr) = ([&Z; 8], [&Z; 8], [&Z; 8]);
                for (dst, src) in [(&mut ar, a), (&mut br, b), (&mut cr, c)] {
                    for (k, s) in src.iter().take(8).enumerate() {
                        dst[k] = &w.regs[*s as usize];
                    }
                }
                let mut outs = [[0u64; 32]; 8];
                let nd = d.len().min(8);
                crate::mma::mma_sync_with(
                    spec,
                    model.as_ref(),
                    &ar[..a.len().min(8)],
                    &br[..b.len().min(8)],
                    &cr[..c.len().min(8)],
                    &mut outs[..nd],
                );
                for (k, s) in d.iter().take(nd).enumerate() {
                    Cta::write_masked(w, *s, m, &outs[k]);
                }
            }
            Op::Wgmma(op) => {
                let model = ctx.numerics.model(ctx.prog.target_sm, op.spec.aty);
                self.wgmma(wi, op, m, model)?
            }
            Op::WgmmaCommit => {
                let w = &mut self.warps[wi];
                w.wg_commit();
                let r = std::mem::take(&mut w.wg_reads_open);
                w.wg_read_groups.push_back(r);
            }
            Op::WgmmaWait { n } => {
                let w = &mut self.warps[wi];
                while w.wg_groups.len() > *n as usize {
                    w.wg_retire_oldest();
                    if let Some(r) = w.wg_read_groups.pop_front() {
                        for c in r {
                            if let Some(x) = self.wg_lock.get_mut(c as usize) {
                                *x = x.saturating_sub(1);
                            }
                        }
                    }
                }
            }
            Op::Setmaxnreg { inc, n } => {
                // `.dec` always succeeds. `.inc` takes registers from the SM's pool, waiting
                // (as on hardware) until other warps' `.dec`s have released enough: warp-
                // specialised kernels (Triton's, CUTLASS's) let the consumers' `.inc` race the
                // producers' `.dec`. A wait that never ends is reported as a hang.
                let old = std::mem::replace(&mut self.warps[wi].maxnreg, *n);
                let total: u64 = self.warps.iter().map(|w| w.maxnreg as u64 * 32).sum();
                if *inc && total > 65536 {
                    self.warps[wi].maxnreg = old;
                    self.warps[wi].wait_pc = self.warps[wi].group_pc;
                    return Ok(Flow::Spin);
                }
            }
            _ => return Err(misrouted(inst)),
        }
        Ok(Flow::Next)
    }

    /// Executes the matrix load/store ops ([`Cta::exec`] sends them here).
    #[inline(always)]
    pub(super) fn exec_ldst_matrix(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let prog = &*ctx.prog;
        match &inst.op {
            Op::Ldmatrix {
                count,
                trans,
                ds,
                addr,
                off,
                space,
            } => {
                if self.wait_converged(wi) {
                    return Ok(Flow::Stay);
                }
                if self.banks.is_some() {
                    self.profile_matrices(wi, inst.src, *count, *space, *addr, *off);
                }
                if self.san.is_some() {
                    self.san_matrix(ctx, wi, (*count, *space), (*addr, *off), SanKind::Read);
                }
                if self.ldmatrix_shared(wi, (*count, *trans, *space), (*addr, *off), ds, m) {
                    return Ok(Flow::Next);
                }
                let mut out = [[0u64; 32]; 4];
                for mat in 0..*count as usize {
                    for row in 0..8usize {
                        let src_lane = mat * 8 + row;
                        let ra =
                            self.warps[wi].regs[*addr as usize][src_lane].wrapping_add(*off as u64);
                        let mut rowv = [0u64; 8];
                        // Rows are 16 contiguous, 16-byte-aligned bytes: locate the whole row
                        // once (which checks bounds and alignment) and read it directly.
                        let loc = self.locate(ctx, *space, ra, 16, src_lane, prog.local_bytes);
                        match loc {
                            Ok(Loc::Shared(o)) => {
                                for (e, rv) in rowv.iter_mut().enumerate() {
                                    *rv = u16::from_le_bytes([
                                        self.shared[o + 2 * e],
                                        self.shared[o + 2 * e + 1],
                                    ]) as u64;
                                }
                            }
                            _ => {
                                for (e, rv) in rowv.iter_mut().enumerate() {
                                    let loc = self.locate(
                                        ctx,
                                        *space,
                                        ra + 2 * e as u64,
                                        2,
                                        src_lane,
                                        prog.local_bytes,
                                    )?;
                                    *rv = self.load(ctx, wi, &loc, 2, Ordering::Relaxed);
                                }
                            }
                        }
                        for q in 0..4usize {
                            if !*trans {
                                let lane = row * 4 + q;
                                out[mat][lane] = rowv[2 * q] | (rowv[2 * q + 1] << 16);
                            } else {
                                // Transposed: lane (r, q) gets column r, rows 2q and 2q+1.
                                for half in 0..2usize {
                                    let col = 2 * q + half;
                                    let lane = col * 4 + row / 2;
                                    let shift = 16 * (row % 2);
                                    out[mat][lane] |= rowv[col] << shift;
                                }
                            }
                        }
                    }
                }
                let w = &mut self.warps[wi];
                for (k, dslot) in ds.iter().enumerate() {
                    Cta::write_masked(w, *dslot, m, &out[k]);
                }
            }
            Op::Stmatrix {
                count,
                trans,
                srcs,
                addr,
                off,
                space,
            } => {
                if self.wait_converged(wi) {
                    return Ok(Flow::Stay);
                }
                if self.banks.is_some() {
                    self.profile_matrices(wi, inst.src, *count, *space, *addr, *off);
                }
                if self.san.is_some() {
                    self.san_matrix(ctx, wi, (*count, *space), (*addr, *off), SanKind::Write);
                }
                for mat in 0..*count as usize {
                    let vals = self.warps[wi].regs[srcs[mat] as usize];
                    for row in 0..8usize {
                        let dst_lane = mat * 8 + row;
                        let ra =
                            self.warps[wi].regs[*addr as usize][dst_lane].wrapping_add(*off as u64);
                        for col in 0..8usize {
                            let v = if !*trans {
                                let lane = row * 4 + col / 2;
                                (vals[lane] >> (16 * (col % 2))) & 0xffff
                            } else {
                                let lane = col * 4 + row / 2;
                                (vals[lane] >> (16 * (row % 2))) & 0xffff
                            };
                            let loc = self.locate(
                                ctx,
                                *space,
                                ra + 2 * col as u64,
                                2,
                                dst_lane,
                                prog.local_bytes,
                            )?;
                            self.store(wi, &loc, 2, v, Ordering::Relaxed);
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
    /// The offset of a `size`-byte access at `a` (in `space`) when it is an aligned, in-bounds
    /// access of this CTA's own shared memory (anything else: `None`, and the general path,
    /// with its diagnostics, runs).
    #[inline(always)]
    pub(super) fn own_shared(&self, space: MSpace, a: u64, size: u32) -> Option<usize> {
        let off = match space {
            MSpace::Shared => a,
            MSpace::Generic if (SHARED_WINDOW..SHARED_WINDOW + (1 << 32)).contains(&a) => {
                a - SHARED_WINDOW
            }
            _ => return None,
        };
        let fits = off >> CLUSTER_RANK_SHIFT == 0
            && off.is_multiple_of(size as u64)
            && off + size as u64 <= self.shared.len() as u64;
        fits.then_some(off as usize)
    }

    /// `ldmatrix` when every row lies in this CTA's shared memory: each 8 x 8 b16 matrix is 8
    /// rows of 16 bytes, located once; lane `4 row + q` holds 32-bit word `q` of row `row` (the
    /// row's 16 bytes go to four consecutive lanes), and with `.trans` lane `4 col + r` holds
    /// column `col` of rows `2r` and `2r + 1` (a fixed 8 x 8 transpose of the rows;
    /// `frag_simd::ldmatrix`). The destination registers of the lanes in `m` get the words,
    /// zero-extended. Returns false (nothing done) when a row is elsewhere, misaligned or out
    /// of bounds.
    fn ldmatrix_shared(
        &mut self,
        wi: usize,
        (count, trans, space): (u32, bool, MSpace),
        (addr, off): (u32, i64),
        ds: &[u32],
        m: u32,
    ) -> bool {
        let simd = crate::frag_simd::Simd::detect();
        let mut offs = [[0usize; 8]; 4];
        if !self.matrix_rows(
            simd,
            wi,
            (count, space),
            (addr, off),
            offs.as_flattened_mut(),
        ) {
            return false;
        }
        let (shared, w) = (&self.shared, &mut self.warps[wi]);
        for (d, rows) in ds.iter().zip(&offs).take(count as usize) {
            let dst = &mut w.regs[*d as usize];
            // every row was checked: this cannot refuse after an earlier matrix was written
            if !crate::frag_simd::ldmatrix(simd, shared, rows, (trans, m), dst) {
                return false;
            }
        }
        true
    }

    /// The shared-memory offsets of the `8 count` rows of an `ldmatrix` (lane `i`'s address
    /// register plus `off`), when every row is a 16-byte aligned, in-bounds row of this CTA's
    /// shared memory (the conditions of [`Cta::own_shared`], checked for all rows at once), in
    /// `offs`; false when one is not.
    #[inline(always)]
    fn matrix_rows(
        &self,
        simd: Option<crate::frag_simd::Simd>,
        wi: usize,
        (count, space): (u32, MSpace),
        (addr, off): (u32, i64),
        offs: &mut [usize],
    ) -> bool {
        let base = match space {
            MSpace::Shared => 0,
            MSpace::Generic => SHARED_WINDOW,
            _ => return false,
        };
        let Some(last) = self.shared.len().checked_sub(16) else {
            return false;
        };
        let rows = (count as usize * 8).min(32).min(offs.len());
        let Some(regs) = self.warps[wi].regs.get(addr as usize) else {
            return false;
        };
        let delta = (off as u64).wrapping_sub(base);
        let limits = (delta, CLUSTER_RANK_SHIFT, last as u64);
        crate::frag_simd::row_offsets(simd, &regs[..rows], limits, &mut offs[..rows])
    }

    /// Reads one input element from shared memory.
    /// An asynchronous copy is about to write shared bytes [start, start + len) of this CTA (or
    /// of cluster peer `peer`): none of them may be an operand of a wgmma group that has not
    /// been retired by `wgmma.wait_group`.
    pub(super) fn check_wgmma_war(
        &self,
        peer: Option<usize>,
        start: u64,
        len: u64,
        what: &str,
    ) -> Result<(), FaultKind> {
        let lock = match peer {
            None => &self.wg_lock,
            Some(r) => match self.peers.get(r) {
                Some(p) => &p.wg_lock,
                None => return Ok(()),
            },
        };
        if lock.is_empty() || len == 0 {
            return Ok(());
        }
        let (c0, c1) = ((start / 16) as usize, (start + len).div_ceil(16) as usize);
        let Some(c) = (c0..c1.min(lock.len())).find(|&c| lock[c] > 0) else {
            return Ok(());
        };
        let readers = match peer {
            Some(r) => format!("warps of cluster CTA rank {r}"),
            None => {
                let ids: Vec<String> = self
                    .warps
                    .iter()
                    .filter(|w| {
                        w.wg_reads_open.contains(&(c as u32))
                            || w.wg_read_groups.iter().any(|g| g.contains(&(c as u32)))
                    })
                    .map(|w| w.id.to_string())
                    .collect();
                format!("warp(s) {}", ids.join(", "))
            }
        };
        Err(FaultKind::Other(format!(
            "{what} writes shared memory [{start:#x}, {:#x}) while wgmma operands at {:#x} are \
             still being read by {readers} (not yet retired by wgmma.wait_group): the stage was \
             released before the wgmma reading it completed",
            start + len,
            c * 16,
        )))
    }

    pub(super) fn smem_elem(&self, addr: u64, es: u64) -> Result<u64, FaultKind> {
        let a = addr as usize;
        if a + es as usize > self.shared.len() {
            return Err(FaultKind::OutOfBounds {
                space: "shared (wgmma operand)",
                addr,
                size: es as u32,
            });
        }
        Ok(read_le(&self.shared[a..a + es as usize]))
    }

    /// `wgmma.mma_async` for this warp's 16-row slice of the 64-row tile; results go to the
    /// warp's open group and reach the registers at `wgmma.wait_group`. Under a hardware model
    /// with 16- or 8-bit float inputs, A is decoded straight to f32 and the warpgroup's cached
    /// B is kept as f32 too, both in the layouts of the column kernel (`tc_simd`'s `cols16`);
    /// the exact mode, other forms and tiles that kernel declines (a non-finite input or C)
    /// take the f64 path.
    pub(super) fn wgmma(
        &mut self,
        wi: usize,
        op: &WgmmaOp,
        m: u32,
        model: Option<crate::tc_numerics::TcModel>,
    ) -> Result<(), FaultKind> {
        let wr = (self.warps[wi].id % 4) as usize;
        let l0 = m.trailing_zeros().min(31) as usize;
        // 16-byte chunks of shared memory this wgmma reads, and
        // A as f32: scratch kept in the CTA
        let mut chunks = std::mem::take(&mut self.wg_chunks);
        chunks.clear();
        let mut abuf = std::mem::take(&mut self.wg_abuf);
        let fast = model.as_ref().and_then(|md| wg_fast32(op, md));
        let a32 = match fast {
            Some(_) => self.wg_a32(wi, op, (wr, l0), &mut chunks, &mut abuf)?,
            None => false,
        };
        let mut a = Vec::new();
        if !a32 {
            a = self.wg_a64(wi, op, (wr, l0), &mut chunks)?;
        }
        let bop = self.wg_b(wi, op, l0, fast.is_some())?;
        chunks.extend_from_slice(&bop.chunks);
        self.wg_lock_chunks(&chunks);
        self.warps[wi].wg_reads_open.extend_from_slice(&chunks);
        self.wg_chunks = chunks;
        let (mut acc, kept) = self.warps[wi].wg_acc_begin(op, m);
        let done32 = match (fast, &bop.b32) {
            (Some(f), Some(b32)) if a32 => wgmma_model32(op, f, &abuf, b32, &mut acc.tile),
            _ => false,
        };
        self.wg_abuf = abuf;
        if !done32 {
            if a32 {
                // the f32 kernel declined the tile (C not finite): the f64 path needs A in f64
                a = self.wg_a64(wi, op, (wr, l0), &mut Vec::new())?;
            }
            let bt: std::borrow::Cow<[f64]> = match &bop.b32 {
                Some(b) if bop.bt.is_empty() => b.v.iter().map(|&x| x as f64).collect(),
                _ => std::borrow::Cow::Borrowed(&bop.bt),
            };
            match model {
                Some(model) => wgmma_model(op, &model, &a, &bt, &mut acc.tile),
                None => wgmma_exact(op, &a, &bt, &mut acc.tile),
            }
        }
        self.warps[wi].wg_acc_end(acc, m, kept);
        self.wg_b_return(wi, bop);
        Ok(())
    }

    /// A (16 x k, row-major, negated with `.neg_a`) of this warp's rows `(wr, l0)` = (warp in
    /// the warpgroup, first active lane) in f64, from the fragment registers, the sparse
    /// operand or shared memory (whose 16-byte chunks go to `chunks`).
    fn wg_a64(
        &self,
        wi: usize,
        op: &WgmmaOp,
        (wr, l0): (usize, usize),
        chunks: &mut Vec<u32>,
    ) -> Result<Vec<f64>, FaultKind> {
        let spec = &op.spec;
        let k = spec.k as usize;
        let mut a = vec![0f64; 16 * k];
        if let Some(sp) = op.sparse {
            a = self.wgmma_sparse_a(wi, op, sp, (wr, l0), chunks)?;
        } else if spec.a_regs {
            self.wg_a_regs(wi, op, |r, kk, bits| {
                a[r * k + kk] = crate::hopper::elem_f64(spec.aty, bits)
            });
        } else {
            let rd = self.wg_a_read(wi, op, (wr, l0));
            self.wg_operand(&rd, chunks, |r, kk, v| a[r * k + kk] = v)?;
        }
        if op.neg_a {
            a.iter_mut().for_each(|x| *x = -*x);
        }
        Ok(a)
    }

    /// A of [`Cta::wg_a64`] (not sparse) as f32 into `at`, transposed (`v[kk * 16 + row]`)
    /// with its magnitudes; false when a value is not finite (the f64 path then decodes it).
    fn wg_a32(
        &self,
        wi: usize,
        op: &WgmmaOp,
        (wr, l0): (usize, usize),
        chunks: &mut Vec<u32>,
        at: &mut F32Operand,
    ) -> Result<bool, FaultKind> {
        let ty = op.spec.aty;
        at.resize(16 * op.spec.k as usize);
        if op.spec.a_regs {
            let v = &mut at.v;
            self.wg_a_regs(wi, op, |r, kk, bits| v[kk * 16 + r] = wg_decode32(ty, bits));
        } else {
            let rd = self.wg_a_read(wi, op, (wr, l0));
            self.wg_operand32(&rd, chunks, &mut at.v)?;
        }
        Ok(at.finish(op.neg_a))
    }

    /// Calls `put(row, kk, bits)` for every element of this warp's A fragment registers.
    fn wg_a_regs(&self, wi: usize, op: &WgmmaOp, mut put: impl FnMut(usize, usize, u64)) {
        let spec = &op.spec;
        let ea = crate::hopper::esize(spec.aty);
        let w = &self.warps[wi];
        let per = (4 / ea) as usize;
        for lane in 0..32 {
            for i in 0..(4 * per) {
                let (r, kk) = spec.a_frag_pos(lane, i);
                let reg = w.regs[op.a[i / per] as usize][lane];
                let bits = (reg >> ((i % per) as u64 * ea * 8)) & ((1u64 << (ea * 8)) - 1);
                put(r, kk, bits);
            }
        }
    }

    /// The shared-memory read of this warp's 16 rows of A.
    fn wg_a_read(&self, wi: usize, op: &WgmmaOp, (wr, l0): (usize, usize)) -> OperandRead {
        OperandRead {
            desc: crate::hopper::MatrixDesc::decode(self.warps[wi].regs[op.a_desc as usize][l0]),
            trans: op.trans_a,
            o0: 16 * wr as u64,
            no: 16,
            k: op.spec.k as usize,
            ty: op.spec.aty,
        }
    }

    /// B of this wgmma, taken out of the warpgroup's cache: decoded once per warpgroup-wide
    /// wgmma (by the first of the four warps to get here), as f32 when `want32` and every value
    /// is finite, else as f64.
    /// The caller returns it with [`Cta::wg_b_return`].
    fn wg_b(
        &mut self,
        wi: usize,
        op: &WgmmaOp,
        l0: usize,
        want32: bool,
    ) -> Result<BOperand, FaultKind> {
        let (n, k) = (op.spec.n as usize, op.spec.k as usize);
        let bdesc = self.warps[wi].regs[op.b_desc as usize][l0];
        let seq = self.warps[wi].wg_seq;
        self.warps[wi].wg_seq += 1;
        let key = (seq, bdesc, op.spec.n, op.spec.k, op.trans_b, op.neg_b);
        let wgi = self.warps[wi].id as usize / 4;
        if self.wg_bcache.len() <= wgi {
            self.wg_bcache.resize_with(wgi + 1, Vec::new);
        }
        let list = &mut self.wg_bcache[wgi];
        if let Some(at) = list.iter().position(|c| c.key == key && c.users < 4) {
            return Ok(list.remove(at));
        }
        let rd = OperandRead {
            desc: crate::hopper::MatrixDesc::decode(bdesc),
            trans: op.trans_b,
            o0: 0,
            no: n,
            k,
            ty: op.spec.bty,
        };
        // a retired entry's buffers, reused
        let mut bop = self.wg_bfree.pop().unwrap_or_default();
        bop.chunks.clear();
        bop.bt.clear();
        let neg = op.neg_b;
        let mut b32 = bop.b32.take().unwrap_or_default();
        if want32 {
            b32.resize(n * k);
            self.wg_operand32(&rd, &mut bop.chunks, &mut b32.v)?;
            if b32.finish(neg) {
                bop.b32 = Some(b32);
            }
        }
        // f64 values only where the f32 path cannot take B (else made from `b32` if a
        // tile falls back: finite decoded inputs are f32 values, so that copy is exact)
        if bop.b32.is_none() {
            bop.chunks.clear();
            bop.bt = self.wg_b_decode(&rd, neg, &mut bop.chunks, wg_decode)?;
        }
        Ok(BOperand {
            key,
            users: 0,
            ..bop
        })
    }

    /// Puts B back into its warpgroup's cache ([`Cta::wg_b`]) while fewer than 4 warps have
    /// used it; the oldest entries go past [`WG_B_CACHED`].
    fn wg_b_return(&mut self, wi: usize, bop: BOperand) {
        let users = bop.users + 1;
        if users >= 4 {
            self.wg_b_free(bop);
            return;
        }
        let list = &mut self.wg_bcache[self.warps[wi].id as usize / 4];
        if list.len() >= WG_B_CACHED {
            let old = list.remove(0);
            self.wg_b_free(old);
        }
        self.wg_bcache[self.warps[wi].id as usize / 4].push(BOperand { users, ..bop });
    }

    /// Keeps a few finished B operands' buffers for reuse by [`Cta::wg_b`].
    fn wg_b_free(&mut self, bop: BOperand) {
        if self.wg_bfree.len() < WG_B_FREE {
            self.wg_bfree.push(bop);
        }
    }

    /// B (`rd`, negated with `neg`) decoded by `dec` into `bt[kk * n + col]`.
    fn wg_b_decode<T: Copy + Default + std::ops::Neg<Output = T>>(
        &self,
        rd: &OperandRead,
        neg: bool,
        chunks: &mut Vec<u32>,
        dec: impl Fn(Ty, u64) -> T,
    ) -> Result<Vec<T>, FaultKind> {
        let n = rd.no;
        let mut bt = vec![T::default(); n * rd.k];
        self.wg_operand_with(rd, chunks, dec, |col, kk, v| {
            bt[kk * n + col] = if neg { -v } else { v }
        })?;
        Ok(bt)
    }

    /// Marks shared-memory chunks as read by an open wgmma (the write-after-read check).
    fn wg_lock_chunks(&mut self, chunks: &[u32]) {
        if self.wg_lock.is_empty() {
            self.wg_lock = vec![0; self.shared.len().div_ceil(16)];
        }
        for &c in chunks {
            if let Some(x) = self.wg_lock.get_mut(c as usize) {
                *x = x.saturating_add(1);
            }
        }
    }
}

/// The exact-sum wgmma: 16 x n products, k outer (each (row, column) sum still runs in k
/// order from 0.0, as a dot product would, and the column loop vectorises), then C (the
/// column-major `tile`, 0 where `scale-d` is false) added and rounded once (s32 forms: wrapped
/// or saturated).
fn wgmma_exact(op: &WgmmaOp, a: &[f64], bt: &[f64], tile: &mut [f32]) {
    let spec = &op.spec;
    let (n, k) = (spec.n as usize, spec.k as usize);
    let mut sums = vec![0f64; 16 * n];
    crate::mma::rows_k_order_dispatch()(a, bt, k, n, &mut sums);
    for (c, col) in tile.chunks_exact_mut(16).enumerate().take(n) {
        for (r, x) in col.iter_mut().enumerate() {
            let sum = sums[r * n + c];
            *x = if spec.dty == Ty::S32 {
                f32::from_bits(add_s32(x.to_bits() as u64, sum, op.satfinite) as u32)
            } else {
                (sum + *x as f64) as f32
            };
        }
    }
}

/// An s32 accumulator `prev` (raw bits) plus an exact integer sum: clamped to the s32 range
/// with `.satfinite`, else wrapped.
fn add_s32(prev: u64, sum: f64, satfinite: bool) -> u64 {
    let v = (prev as u32 as i32 as i64).wrapping_add(sum as i64);
    let v = if satfinite {
        v.clamp(i32::MIN as i64, i32::MAX as i64)
    } else {
        v
    };
    v as i32 as u32 as u64
}

/// One wgmma shared-memory operand to decode: `no` rows of A (or columns of B) from `o0`, each
/// with `k` elements, laid out as `desc` describes (`trans`: MN-major).
struct OperandRead {
    desc: crate::hopper::MatrixDesc,
    trans: bool,
    o0: u64,
    no: usize,
    k: usize,
    ty: Ty,
}

/// Decoded B operands kept per warpgroup (wgmmas one warp may run ahead of its siblings).
const WG_B_CACHED: usize = 16;
/// Finished B operands whose buffers are kept for reuse.
const WG_B_FREE: usize = 4;

/// The model and f32 column kernel for a wgmma of this form, or `None` where the f64 path
/// runs: no kernel on this CPU, a sparse form, an f32 accumulator not used, or inputs other
/// than f16, bf16, e4m3 and e5m2 (the kernel needs finite inputs of at most 11 significant
/// bits, which every finite value of these types has).
fn wg_fast32(op: &WgmmaOp, model: &TcModel) -> Option<(TcModel, Cols16Fn)> {
    let small = |t| matches!(t, Ty::F16 | Ty::Bf16 | Ty::E4m3 | Ty::E5m2);
    let spec = &op.spec;
    if op.sparse.is_some() || spec.dty != Ty::F32 || !small(spec.aty) || !small(spec.bty) {
        return None;
    }
    Some((*model, crate::tc_simd::fast_cols16()?))
}

/// Decodes one f16, bf16, e4m3 or e5m2 wgmma input element to f32 (exact; the caller keeps
/// non-finite values off the f32 path, so NaN payloads do not matter here), other types as
/// [`wg_decode`] rounded to f32 (not used by the f32 path, see [`wg_fast32`]).
#[inline]
fn wg_decode32(ty: Ty, bits: u64) -> f32 {
    match ty {
        Ty::Bf16 => f32::from_bits(((bits as u32) & 0xffff) << 16),
        Ty::F16 => crate::mma::f16_to_f32(bits as u32 & 0xffff),
        Ty::E4m3 => crate::mma::fp8_table32()[0][(bits & 0xff) as usize],
        Ty::E5m2 => crate::mma::fp8_table32()[1][(bits & 0xff) as usize],
        _ => wg_decode(ty, bits) as f32,
    }
}

impl F32Operand {
    /// Sizes the operand for `len` values (unspecified until written: every decoder writes
    /// every position).
    fn resize(&mut self, len: usize) {
        self.v.resize(len, 0.0);
        self.abs.resize(len, 0.0);
    }

    /// Once the values are written: negates them with `neg` and sets the magnitudes; false
    /// when a value is not finite.
    fn finish(&mut self, neg: bool) -> bool {
        if neg {
            self.v.iter_mut().for_each(|x| *x = -*x);
        }
        let mut ok = true;
        for (a, x) in self.abs.iter_mut().zip(&self.v) {
            *a = x.abs();
            ok &= x.is_finite();
        }
        ok
    }
}

/// How the f32 path decodes a 16-byte chunk of an operand (chosen once per operand): as
/// [`wg_decode32`] does, element by element only for types it does not take.
#[derive(Clone, Copy)]
enum Dec32 {
    /// e4m3 / e5m2: the 256-entry tables of `mma`.
    Table(&'static [f32; 256]),
    Bf16,
    F16,
    /// Another type, with its element size in bytes.
    Elem(Ty, usize),
}

impl Dec32 {
    fn of(ty: Ty) -> Dec32 {
        match ty {
            Ty::E4m3 => Dec32::Table(&crate::mma::fp8_table32()[0]),
            Ty::E5m2 => Dec32::Table(&crate::mma::fp8_table32()[1]),
            Ty::Bf16 => Dec32::Bf16,
            Ty::F16 => Dec32::F16,
            _ => Dec32::Elem(ty, crate::hopper::esize(ty) as usize),
        }
    }

    /// Decodes the little-endian elements of `row` to `dst[0]`, `dst[stride]`, ...
    /// (`dst` holds them: checked by the caller).
    #[inline]
    fn chunk(self, row: &[u8; 16], dst: &mut [f32], stride: usize) {
        let half = |i: usize| u16::from_le_bytes([row[2 * i], row[2 * i + 1]]) as u32;
        match self {
            Dec32::Table(t) => {
                for (i, &b) in row.iter().enumerate() {
                    dst[i * stride] = t[b as usize];
                }
            }
            Dec32::Bf16 => (0..8).for_each(|i| dst[i * stride] = f32::from_bits(half(i) << 16)),
            Dec32::F16 => (0..8).for_each(|i| dst[i * stride] = crate::mma::f16_to_f32(half(i))),
            Dec32::Elem(ty, es) => {
                for i in 0..16 / es {
                    dst[i * stride] = wg_decode32(ty, read_le(&row[es * i..es * (i + 1)]));
                }
            }
        }
    }
}

/// Decodes one wgmma input element, as [`crate::hopper::elem_f64`] does (tested): fp8 through
/// the 256-entry tables of `mma`, bf16 by shifting into an f32 (the 256 KiB table of
/// `fp::bf16_to_f32` misses the cache when operands are decoded in bulk).
#[inline]
pub(super) fn wg_decode(ty: Ty, bits: u64) -> f64 {
    match ty {
        Ty::Bf16 => {
            let f = f32::from_bits(((bits as u32) & 0xffff) << 16);
            if f.is_nan() {
                f32::from_bits(f.to_bits() | 0x0040_0000) as f64 // quieted, payload kept
            } else {
                f as f64
            }
        }
        Ty::E4m3 => crate::mma::fp8_table()[0][(bits & 0xff) as usize],
        Ty::E5m2 => crate::mma::fp8_table()[1][(bits & 0xff) as usize],
        _ => crate::hopper::elem_f64(ty, bits),
    }
}

impl Cta {
    /// Decodes operand `rd`, calling `put(o, kk, value)` for every element (o relative to
    /// `rd.o0`) and recording the 16-byte shared chunks it reads in `chunks` (sorted, deduped).
    /// K-major operands are read a 16-byte chunk at a time (elements contiguous along k;
    /// swizzling moves whole chunks); MN-major operands and incomplete or out-of-bounds chunks
    /// go element by element, with the per-element diagnostics.
    fn wg_operand(
        &self,
        rd: &OperandRead,
        chunks: &mut Vec<u32>,
        put: impl FnMut(usize, usize, f64),
    ) -> Result<(), FaultKind> {
        self.wg_operand_with(rd, chunks, wg_decode, put)
    }

    /// [`Cta::wg_operand_with`] for the f32 path: element (o, kk) to `out[kk * rd.no + o]`
    /// (A transposed, B row-major: the column kernel's layouts), K-major chunks decoded whole
    /// by [`Dec32`]. The chunks are listed as read, not deduplicated (a chunk listed twice is
    /// held twice and released twice: the same write-after-read check).
    fn wg_operand32(
        &self,
        rd: &OperandRead,
        chunks: &mut Vec<u32>,
        out: &mut [f32],
    ) -> Result<(), FaultKind> {
        let no = rd.no;
        if rd.trans {
            return self.wg_operand_with(rd, chunks, wg_decode32, |o, kk, v| out[kk * no + o] = v);
        }
        let es = crate::hopper::esize(rd.ty);
        let per = (16 / es) as usize;
        let dec = Dec32::of(rd.ty);
        let ra = crate::hopper::RowAddr::new(&rd.desc);
        for o in 0..no {
            let row0 = ra.row(rd.o0 + o as u64);
            let mut kk = 0;
            while kk < rd.k {
                let n = per.min(rd.k - kk);
                let base = ra.at(row0, kk as u64 * es) as usize;
                let row = self
                    .shared
                    .get(base..base + 16)
                    .and_then(|r| <&[u8; 16]>::try_from(r).ok());
                let at = kk * no + o;
                match row {
                    Some(row)
                        if n == per
                            && base.is_multiple_of(16)
                            && at + (per - 1) * no < out.len() =>
                    {
                        chunks.push((base / 16) as u32);
                        dec.chunk(row, &mut out[at..], no);
                    }
                    _ => {
                        for i in 0..n {
                            let a = rd.desc.addr(rd.o0 + o as u64, (kk + i) as u64, es);
                            chunks.push((a / 16) as u32);
                            out[at + i * no] = wg_decode32(rd.ty, self.smem_elem(a, es)?);
                        }
                    }
                }
                kk += n;
            }
        }
        Ok(())
    }

    /// [`Cta::wg_operand`] with the element decoder `dec` (f64 or f32 values).
    fn wg_operand_with<T>(
        &self,
        rd: &OperandRead,
        chunks: &mut Vec<u32>,
        dec: impl Fn(Ty, u64) -> T,
        mut put: impl FnMut(usize, usize, T),
    ) -> Result<(), FaultKind> {
        let es = crate::hopper::esize(rd.ty);
        let per = (16 / es) as usize;
        // (outer index, k index) of element i of the chunk starting at (o, kk)
        let (inner, outer) = if rd.trans {
            (rd.no, rd.k)
        } else {
            (rd.k, rd.no)
        };
        let addr = |o: usize, kk: usize| {
            let (row, col) = if rd.trans {
                (kk as u64, rd.o0 + o as u64)
            } else {
                (rd.o0 + o as u64, kk as u64)
            };
            rd.desc.addr(row, col, es)
        };
        for x in 0..outer {
            let mut y = 0;
            while y < inner {
                let n = per.min(inner - y);
                let at = |i: usize| if rd.trans { (y + i, x) } else { (x, y + i) };
                let base = addr(at(0).0, at(0).1) as usize;
                // (MN-major operands, untested by the layout tests here, stay per element)
                if !rd.trans
                    && n == per
                    && base.is_multiple_of(16)
                    && base + 16 <= self.shared.len()
                {
                    chunks.push((base / 16) as u32);
                    let row = &self.shared[base..base + 16];
                    // little-endian elements of the chunk, by width (no 128-bit shifts)
                    let elem = |i: usize| -> u64 {
                        match es {
                            1 => row[i] as u64,
                            2 => u16::from_le_bytes([row[2 * i], row[2 * i + 1]]) as u64,
                            _ => read_le(&row[4 * i..4 * i + 4]),
                        }
                    };
                    for i in 0..per {
                        let (o, kk) = at(i);
                        put(o, kk, dec(rd.ty, elem(i)));
                    }
                } else {
                    for i in 0..n {
                        let (o, kk) = at(i);
                        let a = addr(o, kk);
                        chunks.push((a / 16) as u32);
                        put(o, kk, dec(rd.ty, self.smem_elem(a, es)?));
                    }
                }
                y += n;
            }
        }
        chunks.sort_unstable();
        chunks.dedup();
        Ok(())
    }
}

/// [`wgmma_model`] through the f32 column kernel `f` on the column-major accumulator `tile`
/// (C on entry, D on exit). Returns false (nothing written) when the kernel declines the tile
/// (C not finite); the kernel's results are finite (finite inputs and C), so there is no NaN
/// to canonicalise.
fn wgmma_model32(
    op: &WgmmaOp,
    (model, kernel): (TcModel, Cols16Fn),
    a: &F32Operand,
    b: &F32Operand,
    tile: &mut [f32],
) -> bool {
    let ops = crate::tc_simd::Cols {
        at: &a.v,
        at_abs: &a.abs,
        b: &b.v,
        b_abs: &b.abs,
        k: op.spec.k as usize,
        cols: op.spec.n as usize,
    };
    kernel(&model, &ops, tile)
}

/// The f32 accumulation of a wgmma under a hardware model: the accumulator (the column-major
/// `tile`, 0 where `scale-d` is false) is the C of the model's first block, so it is aligned
/// and truncated together with the products as on the tensor core.
fn wgmma_model(op: &WgmmaOp, model: &TcModel, a: &[f64], bt: &[f64], tile: &mut [f32]) {
    let (n, k) = (op.spec.n as usize, op.spec.k as usize);
    let mut acc = vec![0f64; 16 * n];
    for (c, col) in tile.chunks_exact(16).enumerate().take(n) {
        for (r, &x) in col.iter().enumerate() {
            acc[r * n + c] = x as f64;
        }
    }
    crate::tc_numerics::tile(model, a, bt, k, n, &mut acc);
    for (c, col) in tile.chunks_exact_mut(16).enumerate().take(n) {
        for (r, x) in col.iter_mut().enumerate() {
            *x = acc[r * n + c] as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bulk wgmma decoder agrees with `hopper::elem_f64` on every bf16, e4m3 and e5m2 code
    /// (bit patterns of the f64, NaN payloads included).
    #[test]
    fn wg_decode_matches_elem_f64() {
        for (ty, codes) in [(Ty::Bf16, 1u64 << 16), (Ty::E4m3, 256), (Ty::E5m2, 256)] {
            for bits in 0..codes {
                let want = crate::hopper::elem_f64(ty, bits).to_bits();
                assert_eq!(wg_decode(ty, bits).to_bits(), want, "{ty} {bits:#x}");
            }
        }
    }
}
