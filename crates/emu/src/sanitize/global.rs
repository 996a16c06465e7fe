//! `racecheck` of global memory between the CTAs of one launch.
//!
//! Every plain (weak, non-atomic) global access of the launch is recorded per 4-byte granule:
//! the last write and up to two reads from different CTAs. A read and a write, or two writes,
//! of the same byte by two different CTAs are a candidate race. At the end of the launch a
//! candidate is reported only when neither CTA took part in any inter-CTA synchronisation
//! during the launch (a fence, a global atomic, a strong `.volatile`/`.relaxed`/`.acquire`/
//! `.release` access, a cluster barrier): ordering through those is not modelled, so such CTAs
//! are trusted rather than reported. Races between threads of one CTA, between launches, and
//! of asynchronous copies (TMA, bulk copies) are not checked.

use super::{code, LaunchSan, Report, Tool};
use crate::exec::LaunchCtx;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

const SHARDS: usize = 64;
/// Candidates kept per pair of instructions.
const PER_PAIR: usize = 8;

/// One recorded global access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GAcc {
    cta: [u32; 3],
    tid: u32,
    pc: u32,
    mask: u8,
}

#[derive(Clone, Copy, Default)]
struct GEntry {
    w: Option<GAcc>,
    r: [Option<GAcc>; 2],
}

/// A candidate race: (earlier, later, later is a write, earlier is a write, address).
type Cand = (GAcc, GAcc, bool, bool, u64);

/// The global-memory race table of one launch.
pub struct GlobalRaces {
    shards: Vec<Mutex<HashMap<u64, GEntry>>>,
    cands: Mutex<HashMap<(u32, u32), Vec<Cand>>>,
    synced: Mutex<HashSet<[u32; 3]>>,
}

impl Default for GlobalRaces {
    fn default() -> Self {
        GlobalRaces {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            cands: Mutex::default(),
            synced: Mutex::default(),
        }
    }
}

impl GlobalRaces {
    /// CTA `cta` synchronises with other CTAs: its accesses are not reported.
    pub fn mark_synced(&self, cta: [u32; 3]) {
        self.synced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cta);
    }

    /// A plain global access of `size` bytes at `addr` by thread `tid` of `cta` at `pc`.
    pub fn access(&self, cta: [u32; 3], tid: u32, pc: u32, addr: u64, size: u32, write: bool) {
        let mut g = addr / 4;
        while g * 4 < addr + size as u64 {
            let lo = addr.max(g * 4) - g * 4;
            let hi = (addr + size as u64).min(g * 4 + 4) - g * 4;
            let mask = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u8;
            let me = GAcc { cta, tid, pc, mask };
            self.granule(g, me, write);
            g += 1;
        }
    }

    fn granule(&self, g: u64, me: GAcc, write: bool) {
        let shard = &self.shards[(g as usize ^ (g >> 12) as usize) % SHARDS];
        let mut found: Vec<Cand> = Vec::new();
        {
            let mut s = shard.lock().unwrap_or_else(|p| p.into_inner());
            let e = s.entry(g).or_default();
            let clash = |p: &GAcc| p.cta != me.cta && p.mask & me.mask != 0;
            if let Some(w) = e.w.filter(clash) {
                found.push((w, me, write, true, g * 4 + me.mask.trailing_zeros() as u64));
            }
            if write {
                for r in e.r.iter().flatten().filter(|r| clash(r)) {
                    found.push((*r, me, true, false, g * 4 + me.mask.trailing_zeros() as u64));
                }
                e.w = Some(me);
            } else if !e.r.iter().flatten().any(|r| r.cta == me.cta) {
                match e.r {
                    [None, _] => e.r[0] = Some(me),
                    [_, None] => e.r[1] = Some(me),
                    _ => {}
                }
            }
        }
        if found.is_empty() {
            return;
        }
        let mut c = self.cands.lock().unwrap_or_else(|p| p.into_inner());
        for f in found {
            let v = c
                .entry((f.0.pc.min(f.1.pc), f.0.pc.max(f.1.pc)))
                .or_default();
            if v.len() < PER_PAIR {
                v.push(f);
            }
        }
    }

    /// Turns the candidates whose CTAs never synchronised into reports: one per pair of
    /// instructions and per address (a read-modify-write race is one report, not three).
    pub fn report(&self, ls: &LaunchSan, ctx: &LaunchCtx) {
        let synced = self
            .synced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let cands = std::mem::take(&mut *self.cands.lock().unwrap_or_else(|p| p.into_inner()));
        let mut all: Vec<Cand> = cands
            .into_values()
            .flatten()
            .filter(|c| !synced.contains(&c.0.cta) && !synced.contains(&c.1.cta))
            .collect();
        // read/write pairs first (they name the read of a read-modify-write), then by line
        all.sort_by_key(|c| (c.2 && c.3, c.0.pc.min(c.1.pc), c.0.pc.max(c.1.pc), c.4));
        let mut addrs = HashSet::new();
        for (a, b, b_writes, a_writes, addr) in all {
            if !addrs.insert(addr / 4) {
                continue;
            }
            let what = |w: bool| if w { "write" } else { "read" };
            let kind = match (a_writes, b_writes) {
                (true, true) => "write-write",
                _ => "read-write",
            };
            ls.push((code::GLOBAL_RACE, a.pc.min(b.pc), a.pc.max(b.pc)), || {
                Report {
                    tool: Tool::Racecheck,
                    kind: format!("global-memory {kind} race between CTAs"),
                    kernel: ctx.prog.name.clone(),
                    cta: a.cta,
                    accesses: vec![
                        super::access(ctx, a.cta, what(a_writes), a.pc, a.tid),
                        super::access(ctx, b.cta, what(b_writes), b.pc, b.tid),
                    ],
                    space: Some("global".into()),
                    addr: Some(addr),
                    size: 1,
                    detail: "plain accesses of two CTAs, at least one a write, with no atomic, \
                         fence or strong access in either CTA to order them"
                        .into(),
                }
            });
        }
    }
}
