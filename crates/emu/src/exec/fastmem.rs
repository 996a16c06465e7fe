//! Warp-wide memory fast paths: `cp.async`, `ld` and `st` of a whole warp in the common case,
//! checked for every active lane first and then copied, instead of resolving each lane's
//! access (and each element of a vector) separately. The common case is an aligned, in-bounds
//! access by every lane of one memory: this CTA's own shared memory ([`Cta::own_shared`]),
//! one global allocation ([`Cta::global_span`]: the last one hit, or found and cached), the
//! lanes' local memory or the parameter buffer. It is first decided from the lanes' address
//! range (lowest and highest address, and the OR of all for the alignment: one bounds check
//! per warp), and lane by lane only when that fails; `cp.async` checks each lane in one
//! branch-free pass against the shared-memory size and the allocation of the first row read.
//! When any active lane falls outside it, nothing has been done and the general per-lane path
//! runs, with all its checks and diagnostics; the fast paths give the same bytes, registers
//! and poll hash in the same lane and element order. Vector accesses run with the element
//! size as a constant (one fixed-size load or store per element, no `memcpy` call), and
//! global vector stores whole words when each lane's access covers them.

use super::*;
use crate::memory::Allocation;

/// The memory every active lane of one `ld`/`st` accesses (lanes spread over several
/// memories or allocations take the general path), at a byte offset per lane.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mem {
    Shared,
    Global(*const Allocation),
    /// This warp's local memory (all lanes' spans, lane-major).
    Local,
    Param,
}

/// The register slots and shape of a `cp.async` (destination `(space, slot, offset)`, source
/// `(slot, offset, src-size slot)`, row bytes).
pub(super) struct CpAsyncArgs {
    pub dst: (MSpace, u32, i64),
    pub src: (u32, i64, u32),
    pub size: u32,
}

impl Cta {
    /// `cp.async` of the lanes in `m` when every row is aligned, lands in this CTA's shared
    /// memory and copies a whole global row (or none: zero fill), decided from the lanes'
    /// address ranges as [`Cta::warp_range`] does for `ld`/`st`: one bounds check for the
    /// destinations and one for the sources that are read (every address aligned iff the OR
    /// of all is). Returns false (nothing done) otherwise; the per-lane path
    /// ([`Cta::cp_async_row`], then per chunk) then gives the same bytes or the fault.
    pub(super) fn cp_async_warp(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        m: u32,
        c: CpAsyncArgs,
    ) -> bool {
        match c.size {
            4 => self.cp_async_rows::<4>(ctx, wi, m, c),
            8 => self.cp_async_rows::<8>(ctx, wi, m, c),
            16 => self.cp_async_rows::<16>(ctx, wi, m, c),
            _ => false,
        }
    }

    /// [`Cta::cp_async_warp`] for rows of `S` bytes: one pass checks every lane (aligned
    /// addresses; destination in this CTA's shared memory, as [`Cta::own_shared`] checks;
    /// source row whole in the allocation of the first lane that reads one, or none of it)
    /// without writing anything, then a second pass copies the rows.
    #[inline(always)]
    fn cp_async_rows<const S: usize>(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        m: u32,
        c: CpAsyncArgs,
    ) -> bool {
        let ((dspace, dst, doff), (src, soff, src_size)) = (c.dst, c.src);
        let (doff, soff, size) = (doff as u64, soff as u64, S as u32);
        let window = match dspace {
            MSpace::Shared => 0,
            MSpace::Generic => SHARED_WINDOW,
            _ => return false,
        };
        // offsets below `dlimit` are in bounds and carry no cluster rank
        let dlimit = (self.shared.len() as u64 + 1)
            .saturating_sub(S as u64)
            .min(1 << CLUSTER_RANK_SHIFT);
        let regs = &self.warps[wi].regs;
        let (rd, rs, rn) = (
            &regs[dst as usize],
            &regs[src as usize],
            &regs[src_size as usize],
        );
        // the allocation of the first lane that reads its row (the others must read theirs
        // there), and the first offset a row does not fit at
        let alloc = match lanes_of(m).find(|&l| rn[l] as u32 >= size) {
            Some(l) => match self.global_span(ctx, rs[l].wrapping_add(soff), size, l) {
                // SAFETY: the pointer comes from an Arc held by `ctx.mem` for the launch.
                Some((p, _)) => Some(unsafe { &*p }),
                None => return false,
            },
            None => None,
        };
        let (sbase, slimit) = alloc.map_or((0, 0), |a| (a.base, a.size + 1 - S as u64));
        let k = RowCheck {
            off: (doff, soff),
            window,
            limits: (dlimit, slimit),
            sbase,
            size: S as u64,
        };
        if k.bad(m, (rd, rs, rn)) {
            return false;
        }
        let shared = &mut self.shared;
        for l in lanes_of(m) {
            let o = (rd[l].wrapping_add(doff) - window) as usize;
            // every row read is in `alloc` (checked above), so `read_row` finds it
            let row = match alloc {
                Some(a) if rn[l] as u32 >= size => {
                    a.read_row::<S>(rs[l].wrapping_add(soff) - sbase)
                }
                _ => None,
            };
            shared[o..o + S].copy_from_slice(&row.unwrap_or([0u8; S]));
        }
        true
    }
}

/// The checks of one `cp.async`'s rows (see [`Cta::cp_async_rows`]): address offsets
/// (destination, source), shared window, limits (first destination offset and first source
/// offset a row does not fit at), the read rows' allocation base and the row size.
#[derive(Clone, Copy)]
struct RowCheck {
    off: (u64, u64),
    window: u64,
    limits: (u64, u64),
    sbase: u64,
    size: u64,
}

impl RowCheck {
    /// Whether any lane of `m` fails (a full warp through [`RowCheck::full_warp`]).
    #[inline(always)]
    fn bad(&self, m: u32, rows: (&Lanes, &Lanes, &Lanes)) -> bool {
        if m == u32::MAX {
            return self.full_warp(rows) != 0;
        }
        let mut bad = 0u64;
        for l in lanes_of(m) {
            bad |= self.lane(rows, l);
        }
        bad != 0
    }

    /// Non-zero when lane `l` fails: a misaligned address, a destination outside this CTA's
    /// shared memory, a row read outside the allocation, or a src-size other than 0 or the
    /// whole row. Branch-free, so the full-warp loop vectorises.
    #[inline(always)]
    fn lane(&self, (rd, rs, rn): (&Lanes, &Lanes, &Lanes), l: usize) -> u64 {
        let (da, sa) = (
            rd[l].wrapping_add(self.off.0),
            rs[l].wrapping_add(self.off.1),
        );
        let n = rn[l] & 0xffff_ffff;
        let whole = (n >= self.size) as u64;
        let none = (n == 0) as u64;
        let d_out = (da.wrapping_sub(self.window) >= self.limits.0) as u64;
        let s_out = whole & (sa.wrapping_sub(self.sbase) >= self.limits.1) as u64;
        (da | sa) & (self.size - 1) | d_out | s_out | (1 ^ (whole | none))
    }

    /// [`RowCheck::lane`] ORed over all 32 lanes: the AVX2 build when the CPU has it (four
    /// lanes per vector compare), else the baseline one.
    #[inline(always)]
    fn full_warp(&self, rows: (&Lanes, &Lanes, &Lanes)) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU reports AVX2.
            return unsafe { self.full_warp_avx2(rows) };
        }
        self.full_warp_base(rows)
    }

    #[inline(always)]
    fn full_warp_base(&self, rows: (&Lanes, &Lanes, &Lanes)) -> u64 {
        (0..32).fold(0, |b, l| b | self.lane(rows, l))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn full_warp_avx2(&self, rows: (&Lanes, &Lanes, &Lanes)) -> u64 {
        self.full_warp_base(rows)
    }
}

/// The address and shape of one `ld`/`st`: each lane accesses `n` elements of `elem` bytes at
/// `regs[addr][lane] + off` in `space`.
#[derive(Clone, Copy)]
pub(super) struct Access {
    pub space: MSpace,
    pub addr: u32,
    pub off: i64,
    pub elem: u32,
    pub n: u32,
}

impl Cta {
    /// The memory all lanes of `m` access `a` in, with each lane's byte offset in `off`, when
    /// every one is aligned to the whole access (a vector's full size) and in bounds of the
    /// same memory: this CTA's shared memory, one global allocation, the lanes' local memory or
    /// the parameter buffer. `None` when any lane needs the general path.
    #[inline(always)]
    fn warp_sites(
        &self,
        ctx: &LaunchCtx,
        (wi, m): (usize, u32),
        a: Access,
        off: &mut [usize; 32],
    ) -> Option<Mem> {
        let total = a.elem.checked_mul(a.n)?;
        if a.n == 0 || a.n > 8 || total == 0 {
            return None;
        }
        let t = total as u64;
        if let Some(mem) = self.warp_range(ctx, (wi, m), a, t, off) {
            return Some(mem);
        }
        let row = &self.warps[wi].regs[a.addr as usize];
        let mut mem = None;
        for l in lanes_of(m) {
            let base = row[l].wrapping_add(a.off as u64);
            if !base.is_multiple_of(t) {
                return None;
            }
            let global = || {
                let (alloc, o) = self.global_span(ctx, base, total, l)?;
                Some((Mem::Global(alloc), o as usize))
            };
            let (here, o) = match a.space {
                MSpace::Global => global()?,
                MSpace::Shared => (Mem::Shared, self.own_shared(a.space, base, total)?),
                MSpace::Generic => match self.own_shared(a.space, base, total) {
                    Some(o) => (Mem::Shared, o),
                    // allocations lie above every generic window (shared, local, param): lower
                    // addresses take the general path
                    None if base >= crate::memory::GLOBAL_BASE => global()?,
                    None => return None,
                },
                MSpace::Local => {
                    let lb = ctx.prog.local_bytes as u64;
                    if !crate::memory::fits(base, t, lb) {
                        return None;
                    }
                    (Mem::Local, l * lb as usize + base as usize)
                }
                MSpace::Param => {
                    if !crate::memory::fits(base, t, ctx.params.len() as u64) {
                        return None;
                    }
                    (Mem::Param, base as usize)
                }
            };
            if *mem.get_or_insert(here) != here {
                return None;
            }
            off[l] = o;
        }
        mem
    }

    /// [`Cta::warp_sites`] from the lanes' address range: when the lowest and highest access
    /// (and every address aligned to `t`, tested on the OR of the addresses) lie in one memory,
    /// so does every lane's, and one bounds check replaces a lookup per lane. `None` (nothing
    /// decided) otherwise: the caller then checks each lane. Accepts only what the per-lane
    /// check accepts, with the same offsets.
    #[inline(always)]
    fn warp_range(
        &self,
        ctx: &LaunchCtx,
        (wi, m): (usize, u32),
        a: Access,
        t: u64,
        off: &mut [usize; 32],
    ) -> Option<Mem> {
        if m == 0 || !t.is_power_of_two() {
            return None;
        }
        let row = &self.warps[wi].regs[a.addr as usize];
        let (lo, hi, or) = lane_bounds(row, m, a.off as u64);
        if or & (t - 1) != 0 {
            return None;
        }
        // (memory, address of its byte 0, bytes per lane of lane-major memory)
        let (mem, base, stride) = match a.space {
            MSpace::Global => (self.global_range(ctx, (lo, hi), t)?, 0, 0),
            MSpace::Shared => (self.shared_range((lo, hi), t, 0)?, 0, 0),
            MSpace::Generic if lo >= SHARED_WINDOW && hi < SHARED_WINDOW + (1 << 32) => {
                let mem = self.shared_range((lo, hi), t, SHARED_WINDOW)?;
                (mem, SHARED_WINDOW, 0)
            }
            // allocations lie above every generic window
            MSpace::Generic if lo >= crate::memory::GLOBAL_BASE => {
                (self.global_range(ctx, (lo, hi), t)?, 0, 0)
            }
            MSpace::Generic => return None,
            MSpace::Local => {
                let lb = ctx.prog.local_bytes as u64;
                crate::memory::fits(hi, t, lb).then_some((Mem::Local, 0, lb as usize))?
            }
            MSpace::Param => {
                let fits = crate::memory::fits(hi, t, ctx.params.len() as u64);
                fits.then_some((Mem::Param, 0, 0))?
            }
        };
        let base = match mem {
            // SAFETY: the pointer comes from an Arc held by `ctx.mem` for the whole launch.
            Mem::Global(p) => unsafe { &*p }.base,
            _ => base,
        };
        for l in lanes_of(m) {
            off[l] = l * stride + (row[l].wrapping_add(a.off as u64) - base) as usize;
        }
        Some(mem)
    }

    /// The allocation holding every access of `t` bytes at `lo..=hi` (`None`: look per lane).
    #[inline(always)]
    fn global_range(&self, ctx: &LaunchCtx, (lo, hi): (u64, u64), t: u64) -> Option<Mem> {
        let (p, _) = self.global_span(ctx, lo, t as u32, 0)?;
        // SAFETY: the pointer comes from an Arc held by `ctx.mem` for the whole launch.
        let alloc = unsafe { &*p };
        let end = hi.checked_add(t)?;
        (end - alloc.base <= alloc.size).then_some(Mem::Global(p))
    }

    /// This CTA's shared memory when every access of `t` bytes at `lo..=hi` (addresses
    /// `window` above the offsets) is in it, as [`Cta::own_shared`] checks per lane.
    #[inline(always)]
    fn shared_range(&self, (lo, hi): (u64, u64), t: u64, window: u64) -> Option<Mem> {
        let (lo, hi) = (lo.checked_sub(window)?, hi.checked_sub(window)?);
        let fits = lo <= hi && hi >> CLUSTER_RANK_SHIFT == 0 && hi + t <= self.shared.len() as u64;
        fits.then_some(Mem::Shared)
    }

    /// `ld` of the lanes in `m` when [`Cta::warp_sites`] resolves them all: the same values,
    /// register writes and poll hash as the per-lane path. Returns false (nothing done)
    /// otherwise.
    pub(super) fn ld_warp(
        &mut self,
        ctx: &LaunchCtx,
        (wi, m): (usize, u32),
        a: Access,
        (ds, sx, o): (&[u32], bool, Ordering),
    ) -> bool {
        if ds.len() != a.n as usize {
            return false;
        }
        let mut off = [0usize; 32];
        let Some(mem) = self.warp_sites(ctx, (wi, m), a, &mut off) else {
            return false;
        };
        if let [d] = *ds {
            self.ld_scalar(ctx, (wi, m), (mem, &off, a.elem), (d, sx, o));
            return true;
        }
        match a.elem {
            1 => self.ld_vector::<1>(ctx, (wi, m), (mem, &off), (ds, sx, o)),
            2 => self.ld_vector::<2>(ctx, (wi, m), (mem, &off), (ds, sx, o)),
            4 => self.ld_vector::<4>(ctx, (wi, m), (mem, &off), (ds, sx, o)),
            8 => self.ld_vector::<8>(ctx, (wi, m), (mem, &off), (ds, sx, o)),
            _ => return false,
        }
        true
    }

    /// A vector `ld` of `E`-byte elements of the lanes in `m` from the checked sites `off` of
    /// `mem`: lane by lane, element by element (the per-lane path's order for the registers
    /// and the poll hash), with the element size and the destinations' sign-extension masks
    /// fixed outside the loop.
    #[inline(always)]
    fn ld_vector<const E: usize>(
        &mut self,
        ctx: &LaunchCtx,
        (wi, m): (usize, u32),
        (mem, off): (Mem, &[usize; 32]),
        (ds, sx, o): (&[u32], bool, Ordering),
    ) {
        let mut masks = [u64::MAX; 8];
        for (mk, d) in masks.iter_mut().zip(ds) {
            *mk = reg_mask(ctx.prog.reg_bits[*d as usize]);
        }
        let put = PutVec {
            m,
            off,
            ds,
            sx: sx.then_some(masks),
        };
        let Cta { warps, shared, .. } = self;
        let w = &mut warps[wi];
        match mem {
            Mem::Shared => put.run::<E>(w, |at, _| read_n::<E>(&shared[at..at + E])),
            Mem::Global(p) => {
                // SAFETY: the pointer comes from an Arc held by `ctx.mem` for the whole launch.
                let a = unsafe { &*p };
                put.run::<E>(w, |at, _| a.read(at as u64, E as u32, o))
            }
            Mem::Local => put.run::<E>(w, |at, local| read_n::<E>(&local[at..at + E])),
            Mem::Param => put.run::<E>(w, |at, _| read_n::<E>(&ctx.params[at..at + E])),
        }
    }

    /// A scalar `ld` of the lanes in `m` from the checked sites `off` of `mem`, straight into
    /// register `d`: one loop per memory (and for relaxed global loads, the ordering fixed), so
    /// the per-lane work is the read, the sign extension and the poll hash.
    #[inline(always)]
    fn ld_scalar(
        &mut self,
        ctx: &LaunchCtx,
        (wi, m): (usize, u32),
        (mem, off, elem): (Mem, &[usize; 32], u32),
        (d, sx, o): (u32, bool, Ordering),
    ) {
        let mask = reg_mask(ctx.prog.reg_bits[d as usize]);
        let put = Put {
            m,
            off,
            d: d as usize,
            sx: sx.then_some((elem * 8, mask)),
        };
        let e = elem as usize;
        let Cta { warps, shared, .. } = self;
        let w = &mut warps[wi];
        match mem {
            Mem::Shared => put.run(w, |at, _| read_le(&shared[at..at + e])),
            Mem::Global(p) => {
                // SAFETY: the pointer comes from an Arc held by `ctx.mem` for the whole launch.
                let a = unsafe { &*p };
                match o {
                    Ordering::Relaxed => {
                        put.run(w, |at, _| a.read(at as u64, elem, Ordering::Relaxed))
                    }
                    _ => put.run(w, |at, _| a.read(at as u64, elem, o)),
                }
            }
            Mem::Local => put.run(w, |at, local| read_le(&local[at..at + e])),
            Mem::Param => put.run(w, |at, _| read_le(&ctx.params[at..at + e])),
        }
    }

    /// `st` of the lanes in `m` when [`Cta::warp_sites`] resolves them all: the same bytes,
    /// stored in the same lane and element order as the per-lane path. Returns false (nothing
    /// done) otherwise.
    pub(super) fn st_warp(
        &mut self,
        ctx: &LaunchCtx,
        (wi, m): (usize, u32),
        a: Access,
        (srcs, o): (&[u32], Ordering),
    ) -> bool {
        if srcs.len() != a.n as usize {
            return false;
        }
        let mut off = [0usize; 32];
        let Some(mem) = self.warp_sites(ctx, (wi, m), a, &mut off) else {
            return false;
        };
        match a.elem {
            1 => self.st_vector::<1>((wi, m), (mem, &off), (srcs, o)),
            2 => self.st_vector::<2>((wi, m), (mem, &off), (srcs, o)),
            4 => self.st_vector::<4>((wi, m), (mem, &off), (srcs, o)),
            8 => self.st_vector::<8>((wi, m), (mem, &off), (srcs, o)),
            _ => return false,
        }
        true
    }

    /// `st` of `E`-byte elements of the lanes in `m` at the checked sites `off` of `mem`, lane
    /// by lane and element by element (the per-lane path's order: a later lane's bytes win).
    #[inline(always)]
    fn st_vector<const E: usize>(
        &mut self,
        (wi, m): (usize, u32),
        (mem, off): (Mem, &[usize; 32]),
        (srcs, o): (&[u32], Ordering),
    ) {
        let Cta { warps, shared, .. } = self;
        let w = &mut warps[wi];
        match mem {
            Mem::Shared => store_lanes::<E>(shared, &w.regs, m, off, srcs),
            Mem::Local => store_lanes::<E>(&mut w.local, &w.regs, m, off, srcs),
            Mem::Global(p) => {
                // SAFETY: the pointer comes from an Arc held by `ctx.mem` for the whole launch.
                let a = unsafe { &*p };
                if !a.tracks_writes() && (E * srcs.len()).is_multiple_of(8) {
                    store_words::<E>(a, &w.regs, (m, off), srcs, o);
                    return;
                }
                let mut words = WordMerge::new(a);
                for l in lanes_of(m) {
                    for (k, r) in srcs.iter().enumerate() {
                        let v = w.regs[*r as usize][l];
                        words.write((off[l] + k * E) as u64, (E as u32, v), o);
                    }
                }
                words.flush(o);
            }
            // stores to the parameter buffer are dropped, as in `Cta::store`
            Mem::Param => {}
        }
    }
}

/// The `E` (1, 2, 4 or 8) bytes of `b` (exactly `E` long) as a little-endian value.
#[inline(always)]
fn read_n<const E: usize>(b: &[u8]) -> u64 {
    let mut x = [0u8; 8];
    x[..E].copy_from_slice(&b[..E]);
    u64::from_le_bytes(x)
}

/// Global stores of whole words: each lane's access (aligned to its size, a multiple of 8
/// bytes) is assembled into words from its elements and each word stored at once, lane by
/// lane (the bytes of the per-element stores in their order: a later lane's word wins).
#[inline(always)]
fn store_words<const E: usize>(
    a: &Allocation,
    regs: &[Lanes],
    (m, off): (u32, &[usize; 32]),
    srcs: &[u32],
    o: Ordering,
) {
    let mask = crate::memory::mask(E as u32);
    for l in lanes_of(m) {
        for (k, part) in srcs.chunks_exact(8 / E).enumerate() {
            let mut v = 0u64;
            for (j, r) in part.iter().enumerate() {
                v |= (regs[*r as usize][l] & mask) << (8 * E * j);
            }
            a.write_word_masked((off[l] / 8 + k) as u64, u64::MAX, v, o);
        }
    }
}

/// Stores element `k` (register `srcs[k]`) of each lane `l` of `m` at `off[l] + k E` in `dst`
/// (`E` bytes, little-endian), lane by lane.
#[inline(always)]
fn store_lanes<const E: usize>(
    dst: &mut [u8],
    regs: &[Lanes],
    m: u32,
    off: &[usize; 32],
    srcs: &[u32],
) {
    for l in lanes_of(m) {
        for (k, r) in srcs.iter().enumerate() {
            let at = off[l] + k * E;
            let v = regs[*r as usize][l];
            dst[at..at + E].copy_from_slice(&v.to_le_bytes()[..E]);
        }
    }
}

/// The lowest and highest of the active lanes' addresses `row[l] + off` and the OR of all.
#[inline(always)]
fn lane_bounds(row: &Lanes, m: u32, off: u64) -> (u64, u64, u64) {
    let (mut lo, mut hi, mut or) = (u64::MAX, 0u64, 0u64);
    let mut add = |b: u64| {
        lo = lo.min(b);
        hi = hi.max(b);
        or |= b;
    };
    if m == u32::MAX {
        // a full warp: a fixed-length loop the compiler vectorises
        row.iter().for_each(|r| add(r.wrapping_add(off)));
    } else {
        lanes_of(m).for_each(|l| add(row[l].wrapping_add(off)));
    }
    (lo, hi, or)
}

/// Where a scalar `ld` puts its lanes' values: lanes `m`, sites `off`, register `d`, and the
/// sign extension (source bits, register mask) when signed.
struct Put<'a> {
    m: u32,
    off: &'a [usize; 32],
    d: usize,
    sx: Option<(u32, u64)>,
}

impl Put<'_> {
    /// Reads each lane's value with `read(site, warp's local memory)` and writes it to the
    /// register, folding it into the poll hash in lane order (as the per-lane path does).
    #[inline(always)]
    fn run(&self, w: &mut Warp, read: impl Fn(usize, &[u8]) -> u64) {
        let mut poll = w.poll;
        let (regs, local) = (&mut w.regs, &w.local);
        let row = &mut regs[self.d];
        for l in lanes_of(self.m) {
            let v = read(self.off[l], local);
            let v = match self.sx {
                Some((bits, mask)) => sext(v, bits) & mask,
                None => v,
            };
            row[l] = v;
            poll = poll_step(poll, v);
        }
        w.poll = poll;
    }
}

/// Where a vector `ld` puts its lanes' values: lanes `m`, sites `off`, destination registers
/// `ds` (element `k` at `off[l] + k E`), and each one's register mask when sign-extending.
struct PutVec<'a> {
    m: u32,
    off: &'a [usize; 32],
    ds: &'a [u32],
    sx: Option<[u64; 8]>,
}

impl PutVec<'_> {
    /// Reads each lane's `E`-byte elements with `read(site, warp's local memory)` into the
    /// registers, folding each into the poll hash in lane, then register order (as the
    /// per-lane path does).
    #[inline(always)]
    fn run<const E: usize>(&self, w: &mut Warp, read: impl Fn(usize, &[u8]) -> u64) {
        let mut poll = w.poll;
        let (regs, local) = (&mut w.regs, &w.local);
        for l in lanes_of(self.m) {
            for (k, d) in self.ds.iter().enumerate() {
                let v = read(self.off[l] + k * E, local);
                let v = match &self.sx {
                    Some(masks) => sext(v, E as u32 * 8) & masks[k],
                    None => v,
                };
                regs[*d as usize][l] = v;
                poll = poll_step(poll, v);
            }
        }
        w.poll = poll;
    }
}

/// Writes lane `l`'s loaded elements `vals` to the destination registers `ds` (sign-extended
/// from `elem` bytes when `sx`) and folds each into the warp's poll hash, in register order.
#[inline(always)]
pub(super) fn put_loaded(
    w: &mut Warp,
    prog: &Program,
    l: usize,
    (ds, sx, elem): (&[u32], bool, u32),
    vals: &[u64; 8],
) {
    for (k, d) in ds.iter().enumerate() {
        let rb = prog.reg_bits[*d as usize];
        let v = if sx {
            sext(vals[k], elem * 8) & reg_mask(rb)
        } else {
            vals[k]
        };
        w.regs[*d as usize][l] = v;
        w.poll = poll_step(w.poll, v);
    }
}

/// The warp's poll hash after loading `v` (the per-lane path's formula).
#[inline(always)]
fn poll_step(poll: u64, v: u64) -> u64 {
    (poll.rotate_left(7) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Global stores of one warp instruction, merged per 8-byte word: consecutive lanes storing
/// into the same word (bf16 or byte outputs) become one store of the word, or one masked
/// compare-and-swap, instead of a compare-and-swap per lane. Later stores of the same bytes win,
/// as in lane order; the final memory is that of the per-lane stores (which other host threads
/// could observe one at a time; a warp's store lands at once on hardware).
struct WordMerge<'a> {
    alloc: &'a Allocation,
    /// (word index, byte mask, value) of the word being assembled.
    open: Option<(u64, u64, u64)>,
}

impl<'a> WordMerge<'a> {
    fn new(alloc: &'a Allocation) -> WordMerge<'a> {
        WordMerge { alloc, open: None }
    }

    /// Stores the `size` low bytes of `v` at byte `off` of the allocation.
    #[inline(always)]
    fn write(&mut self, off: u64, (size, v): (u32, u64), ord: Ordering) {
        if size > 8 || self.alloc.tracks_writes() {
            self.flush(ord);
            self.alloc.write(off, size, v, ord);
            return;
        }
        let (w, sh) = (off >> 3, (off & 7) * 8);
        let m = crate::memory::mask(size) << sh;
        let v = (v << sh) & m;
        match &mut self.open {
            Some((qw, qm, qv)) if *qw == w => {
                *qm |= m;
                *qv = (*qv & !m) | v;
            }
            _ => {
                self.flush(ord);
                self.open = Some((w, m, v));
            }
        }
    }

    /// Writes the word being assembled.
    #[inline(always)]
    fn flush(&mut self, ord: Ordering) {
        if let Some((w, m, v)) = self.open.take() {
            self.alloc.write_word_masked(w, m, v, ord);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The full-warp `cp.async` row check (its AVX2 build where the CPU has one, and the
    /// baseline build) gives the per-lane check's verdict on random rows: addresses at and
    /// around the limits, misaligned by a byte, src-sizes 0, partial, whole and above, with
    /// high bits set.
    #[test]
    fn full_warp_row_check_matches_per_lane() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        for _ in 0..2000 {
            let size = [4u64, 8, 16][rng.gen_range(0..3)];
            let k = RowCheck {
                off: (rng.gen_range(0..64), rng.gen_range(0..64)),
                window: [0, SHARED_WINDOW][rng.gen_range(0..2)],
                limits: (rng.gen_range(0..4096), rng.gen_range(0..4096)),
                sbase: rng.gen_range(0..1 << 40),
                size,
            };
            // mostly passing lanes, so a single failing one decides
            let fail = rng.gen_range(0..40);
            let mut rows: [Lanes; 3] = [[0; 32]; 3];
            for l in 0..32 {
                let bad = l == fail;
                let o = rng.gen_range(0..k.limits.0.max(1)) & !(size - 1);
                let s = rng.gen_range(0..k.limits.1.max(1)) & !(size - 1);
                let edge = if bad { rng.gen_range(0..5) } else { 0 };
                let (o, s) = match edge {
                    1 => (k.limits.0, s),
                    2 => (o, k.limits.1),
                    3 => (o | 1, s),
                    _ => (o, s),
                };
                rows[0][l] = (o + k.window).wrapping_sub(k.off.0);
                rows[1][l] = (s + k.sbase).wrapping_sub(k.off.1);
                let n = match rng.gen_range(0..4) {
                    0 => 0,
                    1 if bad => rng.gen_range(1..size),
                    _ => size + rng.gen_range(0..3) * size,
                };
                rows[2][l] = n | (rng.gen::<u64>() << 32);
            }
            let r = (&rows[0], &rows[1], &rows[2]);
            let want = (0..32).fold(0u64, |b, l| b | k.lane(r, l)) != 0;
            assert_eq!(k.full_warp_base(r) != 0, want, "baseline");
            assert_eq!(k.full_warp(r) != 0, want, "selected build");
            assert_eq!(k.bad(u32::MAX, r), want);
            let m = rng.gen::<u32>();
            let want_m = lanes_of(m).fold(0u64, |b, l| b | k.lane(r, l)) != 0;
            assert_eq!(k.bad(m, r), want_m, "mask {m:#x}");
        }
    }
}
