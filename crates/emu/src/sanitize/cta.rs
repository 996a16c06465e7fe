//! Sanitizer state of one CTA.
//!
//! Happens-before is tracked per warp with vector clocks (one clock per warp of the CTA): a
//! release (barrier arrival, mbarrier arrival, cluster-barrier arrival) joins the warp's clock
//! into the synchronisation object and advances the warp's own component; an acquire (leaving
//! a barrier, an mbarrier wait that succeeds, a cluster-barrier wait) joins the object's clock
//! into the warp's. A `.sync` warp operation advances the warp's own component, which orders
//! the accesses of its lanes before it with those after it. Two accesses of different threads
//! race when neither is ordered before the other this way.
//!
//! Shared memory has a shadow per 4-byte granule: the last write and one earlier read not yet
//! ordered before it, each with the bytes it touched. Keeping one read (not all) can miss a
//! hazard; it never invents one. `initcheck` keeps one bit per shared byte.

use super::{code, Report, Tool};
use crate::exec::LaunchCtx;
use std::collections::HashMap;

/// How an access touches memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
    /// Atomic read-modify-write (never races with another atomic).
    Atomic,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Atomic => "atomic",
        }
    }
}

/// Who accesses: lane `lane` of warp `wi`, at instruction `pc`.
#[derive(Clone, Copy, Debug)]
pub struct Who {
    pub wi: usize,
    pub lane: usize,
    pub pc: u32,
}

/// An access of `size` bytes at `addr` (a shared offset or a global address).
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub addr: u64,
    pub size: u32,
    pub kind: Kind,
}

/// One recorded shared access: `mask` bits 0..4 are the bytes of the granule, bit 4 atomic;
/// mask 0 means none.
#[derive(Clone, Copy, Default)]
struct Acc {
    clock: u32,
    pc: u32,
    warp: u16,
    lane: u8,
    mask: u8,
}

#[derive(Clone, Copy, Default)]
struct Cell {
    w: Acc,
    r: Acc,
}

#[derive(Default)]
pub(super) struct BarSan {
    pub(super) acc: Vec<u32>,
    /// Thread count (None: all) and PTX pc of the first arrival of the current phase.
    pub(super) first: Option<(Option<u32>, u32)>,
}

#[derive(Default)]
pub(super) struct MbarSan {
    pub(super) phase: u32,
    pub(super) acc: Vec<u32>,
    pub(super) done: Vec<u32>,
}

/// The sanitizer state of a CTA.
pub struct CtaSan {
    pub(super) race: bool,
    pub(super) init: bool,
    pub(super) sync: bool,
    pub(crate) id: [u32; 3],
    pub(super) vc: Vec<Vec<u32>>,
    shadow: Vec<Cell>,
    pub(super) written: Vec<u64>,
    pub(super) bars: Vec<BarSan>,
    pub(super) mbars: HashMap<u32, MbarSan>,
    pub(super) cluster_acc: Vec<u32>,
    /// The CTA took part in inter-CTA synchronisation (fence, global atomic, strong access):
    /// its global accesses are not race-checked.
    pub(crate) synced: bool,
}

pub(super) fn join(into: &mut Vec<u32>, from: &[u32]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a = (*a).max(*b);
    }
}

impl CtaSan {
    pub fn new(ctx: &LaunchCtx, id: [u32; 3], nwarps: usize, shared: usize) -> CtaSan {
        let t = ctx.san.as_ref().map(|s| s.tools).unwrap_or_default();
        let vc = (0..nwarps)
            .map(|w| {
                let mut v = vec![0u32; nwarps];
                v[w] = 1;
                v
            })
            .collect();
        CtaSan {
            race: t.racecheck,
            init: t.initcheck,
            sync: t.synccheck,
            id,
            vc,
            shadow: if t.racecheck {
                vec![Cell::default(); shared.div_ceil(4)]
            } else {
                Vec::new()
            },
            written: if t.initcheck {
                vec![0u64; shared.div_ceil(64)]
            } else {
                Vec::new()
            },
            bars: (0..16).map(|_| BarSan::default()).collect(),
            mbars: HashMap::new(),
            cluster_acc: Vec::new(),
            synced: false,
        }
    }

    /// Marks shared bytes [off, off+len) written (stores, landed asynchronous copies).
    pub fn mark_written(&mut self, off: u64, len: u64) {
        if !self.init {
            return;
        }
        for b in off..off + len {
            if let Some(w) = self.written.get_mut((b / 64) as usize) {
                *w |= 1 << (b % 64);
            }
        }
    }

    fn first_unwritten(&self, off: u64, len: u64) -> Option<u64> {
        (off..off + len).find(|b| {
            self.written
                .get((b / 64) as usize)
                .is_some_and(|w| w >> (b % 64) & 1 == 0)
        })
    }

    /// A shared-memory access (`sp.addr`: the offset in this CTA's shared memory).
    pub fn shared_access(&mut self, ctx: &LaunchCtx, who: Who, sp: Span) {
        let Some(ls) = ctx.san.as_ref() else { return };
        let Who { wi, lane, pc } = who;
        let (off, size, kind) = (sp.addr, sp.size, sp.kind);
        if self.init {
            if kind != Kind::Write {
                if let Some(b) = self.first_unwritten(off, size as u64) {
                    let tid = wi as u32 * 32 + lane as u32;
                    ls.push((code::INIT, pc, 0), || Report {
                        tool: Tool::Initcheck,
                        kind: "read of uninitialized shared memory".into(),
                        kernel: ctx.prog.name.clone(),
                        cta: self.id,
                        accesses: vec![super::access(ctx, self.id, kind.name(), pc, tid)],
                        space: Some("shared".into()),
                        addr: Some(b),
                        size,
                        detail: "no thread or copy of this CTA wrote this byte before".into(),
                    });
                }
            }
            if kind != Kind::Read {
                self.mark_written(off, size as u64);
            }
        }
        if self.race {
            let mut g = off / 4;
            while g * 4 < off + size as u64 {
                let lo = off.max(g * 4) - g * 4;
                let hi = (off + size as u64).min(g * 4 + 4) - g * 4;
                let bytes = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u8;
                self.race_granule(ctx, who, (g, bytes), kind);
                g += 1;
            }
        }
    }

    /// Whether `prev` is ordered before an access of lane `lane` of warp `wi` at `pc`.
    fn ordered(&self, prev: Acc, wi: usize, lane: usize, pc: u32) -> bool {
        if prev.mask == 0 {
            return true;
        }
        let cur = &self.vc[wi];
        if prev.warp as usize == wi {
            // same thread; a warp-sync since; or the same instruction instance of one warp
            prev.lane as usize == lane
                || prev.clock < cur[wi]
                || (prev.pc == pc && prev.clock == cur[wi])
        } else {
            prev.clock <= cur.get(prev.warp as usize).copied().unwrap_or(0)
        }
    }

    /// The race check of granule `g` (bytes `bytes` of it).
    fn race_granule(&mut self, ctx: &LaunchCtx, who: Who, (g, bytes): (u64, u8), kind: Kind) {
        let Who { wi, lane, pc } = who;
        let Some(cell) = self.shadow.get(g as usize).copied() else {
            return;
        };
        let atomic = kind == Kind::Atomic;
        let me = Acc {
            clock: self.vc[wi][wi],
            pc,
            warp: wi as u16,
            lane: lane as u8,
            mask: bytes | if atomic { 0x10 } else { 0 },
        };
        let conflicts = |p: Acc| p.mask & bytes & 0xf != 0 && !(atomic && p.mask & 0x10 != 0);
        let w_race = conflicts(cell.w) && !self.ordered(cell.w, wi, lane, pc);
        if w_race {
            let what = if kind == Kind::Read {
                "read-after-write"
            } else {
                "write-after-write"
            };
            self.report_race(ctx, cell.w, me, what, g * 4 + bytes.trailing_zeros() as u64);
        }
        if kind != Kind::Read {
            if conflicts(cell.r) && !self.ordered(cell.r, wi, lane, pc) {
                let at = g * 4 + bytes.trailing_zeros() as u64;
                self.report_race(ctx, cell.r, me, "write-after-read", at);
            }
            self.shadow[g as usize] = Cell {
                w: me,
                r: Acc::default(),
            };
        } else if self.ordered(cell.r, wi, lane, pc) {
            self.shadow[g as usize].r = me;
        }
    }

    fn report_race(&self, ctx: &LaunchCtx, prev: Acc, me: Acc, what: &str, addr: u64) {
        let Some(ls) = ctx.san.as_ref() else { return };
        let (a, b) = (prev.pc.min(me.pc), prev.pc.max(me.pc));
        let label = |x: Acc, plain: &'static str| if x.mask & 0x10 != 0 { "atomic" } else { plain };
        let kinds = match what {
            "read-after-write" => (label(prev, "write"), label(me, "read")),
            "write-after-read" => (label(prev, "read"), label(me, "write")),
            _ => (label(prev, "write"), label(me, "write")),
        };
        let tid = |x: Acc| x.warp as u32 * 32 + x.lane as u32;
        ls.push((code::RACE, a, b), || Report {
            tool: Tool::Racecheck,
            kind: format!("shared-memory {what} hazard"),
            kernel: ctx.prog.name.clone(),
            cta: self.id,
            accesses: vec![
                super::access(ctx, self.id, kinds.0, prev.pc, tid(prev)),
                super::access(ctx, self.id, kinds.1, me.pc, tid(me)),
            ],
            space: Some("shared".into()),
            addr: Some(addr),
            size: 1,
            detail: "no barrier, mbarrier or warp synchronisation orders the two accesses".into(),
        });
    }
}
