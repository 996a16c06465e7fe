//! `synccheck` and the happens-before edges of barriers, warp synchronisation, mbarriers and the
//! cluster barrier (for `racecheck`), on [`CtaSan`].

use super::cta::{join, CtaSan};
use super::{code, Report, Tool};
use crate::exec::LaunchCtx;

/// One `bar`/`barrier` arrival, as the interpreter sees it.
pub struct BarArrival {
    pub wi: usize,
    /// Lanes arriving / lanes of the warp still running.
    pub lanes: u32,
    pub live: u32,
    pub bid: usize,
    pub count: Option<u32>,
    pub pc: u32,
}

impl CtaSan {
    fn sync_report(
        &self,
        ctx: &LaunchCtx,
        key: (u8, u32),
        kind: &str,
        r: SyncSite,
        detail: String,
    ) {
        let Some(ls) = ctx.san.as_ref() else { return };
        ls.push((key.0, key.1, 0), || Report {
            tool: Tool::Synccheck,
            kind: kind.into(),
            kernel: ctx.prog.name.clone(),
            cta: self.id,
            accesses: vec![super::access(ctx, self.id, r.what, r.pc, r.tid)],
            space: None,
            addr: None,
            size: 0,
            detail,
        });
    }

    /// A barrier arrival: synccheck (divergent `.aligned` barrier, thread counts) and the
    /// release half of the barrier's happens-before edge.
    pub fn bar_arrive(&mut self, ctx: &LaunchCtx, a: &BarArrival) {
        let aligned = ctx
            .san
            .as_ref()
            .and_then(|s| s.info.get(a.pc as usize))
            .is_some_and(|i| i.aligned);
        let site = SyncSite {
            what: "barrier",
            pc: a.pc,
            tid: a.wi as u32 * 32 + a.lanes.trailing_zeros(),
        };
        if self.sync && aligned && a.lanes != a.live {
            self.sync_report(
                ctx,
                (code::DIVERGENT_BAR, a.pc),
                "barrier reached by only part of a warp",
                site,
                format!(
                    "lanes {:#010x} of warp {} arrive at this aligned barrier; lanes {:#010x} \
                     of the warp are still running (bar.sync in divergent code)",
                    a.lanes, a.wi, a.live
                ),
            );
        }
        if self.sync {
            self.check_count(ctx, a, site);
        }
        let b = &mut self.bars[a.bid];
        join(&mut b.acc, &self.vc[a.wi]);
        self.vc[a.wi][a.wi] += 1;
    }

    fn check_count(&mut self, ctx: &LaunchCtx, a: &BarArrival, site: SyncSite) {
        if let Some(c) = a.count {
            if !c.is_multiple_of(32) || c < a.lanes.count_ones() {
                self.sync_report(
                    ctx,
                    (code::BAR_COUNT, a.pc),
                    "invalid barrier thread count",
                    site,
                    format!(
                        "thread count {c} of barrier {} is not a multiple of 32 or smaller \
                         than the {} arriving threads",
                        a.bid,
                        a.lanes.count_ones()
                    ),
                );
            }
        }
        match self.bars[a.bid].first {
            None => self.bars[a.bid].first = Some((a.count, a.pc)),
            Some((prev, prev_pc)) if prev != a.count => {
                let show = |c: Option<u32>| c.map_or("all threads".into(), |c| c.to_string());
                let detail = format!(
                    "barrier {} is used with thread count {} here and {} at PTX line {} in \
                     the same phase",
                    a.bid,
                    show(a.count),
                    show(prev),
                    ctx.prog.line_of(prev_pc)
                );
                self.sync_report(
                    ctx,
                    (code::BAR_COUNT, a.pc),
                    "mismatched barrier thread counts",
                    site,
                    detail,
                );
            }
            _ => {}
        }
    }

    /// Barrier `bid` released the waiting warps `warps`: they acquire every arrival's clock.
    pub fn bar_release(&mut self, bid: usize, warps: &[u32]) {
        let b = std::mem::take(&mut self.bars[bid]);
        for &w in warps {
            if let Some(v) = self.vc.get_mut(w as usize) {
                join(v, &b.acc);
                v[w as usize] += 1;
            }
        }
    }

    /// A `.sync` warp operation with member masks `masks` (per lane) executed by lanes `m`:
    /// synccheck (executing lanes outside the mask, lanes disagreeing on the mask), then the
    /// warp's lanes are ordered across it.
    pub fn warp_sync(&mut self, ctx: &LaunchCtx, wi: usize, op: &WarpOp) {
        if self.sync && op.m != 0 {
            if let Some((kind, detail)) = op.problem() {
                let site = SyncSite {
                    what: "warp-sync",
                    pc: op.pc,
                    tid: wi as u32 * 32 + op.m.trailing_zeros(),
                };
                self.sync_report(ctx, (code::SYNC_MASK, op.pc), kind, site, detail);
            }
        }
        self.vc[wi][wi] += 1;
    }

    /// A warp-collective operation without a member mask (`.aligned` mma, ldmatrix): orders
    /// the warp's lanes.
    pub fn warp_converged(&mut self, wi: usize) {
        self.vc[wi][wi] += 1;
    }

    /// `mbarrier.init` at `key`.
    pub fn mbar_init(&mut self, key: u32) {
        self.mbars.insert(key, Default::default());
    }

    fn mbar_phase(&mut self, key: u32, phase: u32) {
        let mb = self.mbars.entry(key).or_default();
        if mb.phase != phase {
            let acc = std::mem::take(&mut mb.acc);
            join(&mut mb.done, &acc);
            mb.phase = phase;
        }
    }

    /// An arrival of `count` on the mbarrier at `key` that had `pending` arrivals outstanding in
    /// phase `phase` (`after`: its phase afterwards).
    pub fn mbar_arrive(
        &mut self,
        ctx: &LaunchCtx,
        who: super::cta::Who,
        key: u32,
        (count, pending): (u32, u32),
        (phase, after): (u32, u32),
    ) {
        let super::cta::Who { wi, lane, pc } = who;
        if self.sync && count > pending {
            let site = SyncSite {
                what: "arrive",
                pc,
                tid: wi as u32 * 32 + lane as u32,
            };
            self.sync_report(
                ctx,
                (code::MBAR_OVERFLOW, pc),
                "mbarrier arrive-count overflow",
                site,
                format!(
                    "arrive of {count} on the mbarrier at shared offset {key:#x} when only \
                     {pending} arrivals are pending in its current phase"
                ),
            );
        }
        self.mbar_phase(key, phase);
        let v = self.vc[wi].clone();
        join(&mut self.mbars.entry(key).or_default().acc, &v);
        self.vc[wi][wi] += 1;
        self.mbar_phase(key, after);
    }

    /// A wait on the mbarrier at `key` succeeded (its phase is now `phase`): acquire.
    pub fn mbar_acquire(&mut self, wi: usize, key: u32, phase: u32) {
        self.mbar_phase(key, phase);
        let done = self
            .mbars
            .get(&key)
            .map(|m| m.done.clone())
            .unwrap_or_default();
        join(&mut self.vc[wi], &done);
    }

    /// `barrier.cluster.arrive` by warp `wi` (release).
    pub fn cluster_arrive(&mut self, wi: usize) {
        let v = self.vc[wi].clone();
        join(&mut self.cluster_acc, &v);
        self.vc[wi][wi] += 1;
    }

    /// `barrier.cluster.wait` passed (acquire).
    pub fn cluster_acquire(&mut self, wi: usize) {
        let acc = self.cluster_acc.clone();
        join(&mut self.vc[wi], &acc);
        self.vc[wi][wi] += 1;
    }
}

/// A `.sync` warp operation as executed: lanes `m`, each lane's member mask, the lanes of the
/// warp that exist and those still running.
pub struct WarpOp<'a> {
    pub m: u32,
    pub masks: &'a crate::Lanes,
    pub exists: u32,
    pub live: u32,
    pub pc: u32,
}

impl WarpOp<'_> {
    /// What is wrong with the member masks, if anything.
    fn problem(&self) -> Option<(&'static str, String)> {
        let m = self.m;
        let l0 = m.trailing_zeros() as usize;
        let member = self.masks[l0] as u32;
        let mask = |l: usize| self.masks[l] as u32;
        // lanes l, k both executing, k named in l's mask, different masks
        for l in (0..32).filter(|&l| m >> l & 1 != 0) {
            let named = mask(l) & m;
            if let Some(k) = (0..32).find(|&k| named >> k & 1 != 0 && mask(k) != mask(l)) {
                return Some((
                    "lanes disagree on a .sync member mask",
                    format!(
                        "lane {l} passes member mask {:#010x} naming lane {k}, which passes \
                         {:#010x}",
                        mask(l),
                        mask(k)
                    ),
                ));
            }
        }
        if let Some(l) = (0..32).find(|&l| m >> l & 1 != 0 && mask(l) >> l & 1 == 0) {
            return Some((
                ".sync member mask disagrees with the executing lanes",
                format!(
                    "lane {l} executes it but is not in its member mask {:#010x}",
                    mask(l)
                ),
            ));
        }
        let gone = member & self.exists & !self.live;
        if gone != 0 {
            return Some((
                ".sync member mask names exited lanes",
                format!("member mask {member:#010x} names lanes {gone:#010x}, which have exited"),
            ));
        }
        None
    }
}

/// The thread and instruction a synccheck report names.
#[derive(Clone, Copy)]
struct SyncSite {
    what: &'static str,
    pc: u32,
    tid: u32,
}
