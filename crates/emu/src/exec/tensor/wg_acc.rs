//! The accumulators of in-flight `wgmma.mma_async`s: a warp's `wg_open` / `wg_groups`.
//!
//! Each result is kept as a [`WgAcc`]: the column-major 16 x n tile of the warp's rows that the
//! tile kernels read and write (`tile[col * 16 + row]`), not as register lanes. A wgmma finds its
//! C in the newest pending result for its registers; when that result has the same registers
//! (a chain of wgmmas on one accumulator, the common case) the tile is taken as it is, and
//! within one open group updated in place (the group retires at once, so an overwritten value
//! was never observable). The register layout ([`crate::hopper::acc_pos`]) is produced once per
//! result, when `wgmma.wait_group` retires its group, instead of twice per wgmma. Register sets
//! that partly overlap a pending result take the per-register path.

use super::*;

/// Tile index of accumulator register `i` of lane 0: [`crate::hopper::acc_pos`] gives
/// (row, col) = (g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * q + (i & 1)) for lane 4g + q,
/// so the index col * 16 + row splits into a part of `i` and a part of the lane ([`LANE_OFF`]).
#[inline]
fn reg_base(i: usize) -> usize {
    128 * (i >> 2) + 16 * (i & 1) + 8 * ((i >> 1) & 1)
}

/// One register's values lie within this many positions from its [`reg_base`] (the largest
/// [`LANE_OFF`] is 32 * 3 + 7; the last register's window ends at the end of the tile, as n
/// is a multiple of 8).
const REG_SPAN: usize = 32 * 3 + 7 + 1;

/// Tile offset of lane `l` = 4g + q: 32 q + g (see [`reg_base`]).
const LANE_OFF: [usize; 32] = {
    let mut t = [0; 32];
    let mut l = 0;
    while l < 32 {
        t[l] = 32 * (l & 3) + (l >> 2);
        l += 1;
    }
    t
};

/// Where the C of a wgmma on registers `d` is: the newest pending result holding any of them.
enum Source {
    /// No pending result: the register file.
    Regs,
    /// A result on exactly these registers, in the open group at this index.
    Open(usize),
    /// A result on exactly these registers, in committed group `g` at index `i`.
    Group(usize, usize),
    /// A result on some of these registers and others: per register.
    Mixed,
}

impl WgAcc {
    /// Sets the register list (the tile is sized for it, its values unspecified).
    fn set_regs(&mut self, d: &[u32]) {
        self.d.clear();
        self.d.extend_from_slice(d);
        self.lo = d.iter().copied().min().unwrap_or(0);
        self.hi = d.iter().copied().max().unwrap_or(0);
        self.tile.resize(32 * d.len(), 0.0);
    }

    fn overlaps(&self, lo: u32, hi: u32) -> bool {
        !self.d.is_empty() && self.lo <= hi && lo <= self.hi
    }

    /// Writes register `i` of every lane into the tile.
    fn put_lanes(&mut self, i: usize, v: &Lanes) {
        let t = &mut self.tile[reg_base(i)..][..REG_SPAN];
        for (lane, &off) in LANE_OFF.iter().enumerate() {
            t[off] = f32::from_bits(v[lane] as u32);
        }
    }

    /// Register `i` of every lane from the tile (32-bit values, zero-extended).
    fn get_lanes(&self, i: usize, v: &mut Lanes) {
        // (a fixed-length window: the constant offsets need no bounds checks)
        let t = &self.tile[reg_base(i)..][..REG_SPAN];
        for (lane, &off) in LANE_OFF.iter().enumerate() {
            v[lane] = t[off].to_bits() as u64;
        }
    }

    /// Position `i` of slot `slot` in this result, if it holds it.
    fn find(&self, slot: u32) -> Option<usize> {
        if slot < self.lo || slot > self.hi {
            return None;
        }
        self.d.iter().rposition(|&s| s == slot)
    }

    /// Sets every value of the lanes in `lanes` to `v`.
    fn fill_lanes(&mut self, lanes: u32, v: f32) {
        if lanes == 0 {
            return;
        }
        for i in 0..self.d.len() {
            let t = &mut self.tile[reg_base(i)..];
            for lane in lanes_of(lanes) {
                t[LANE_OFF[lane]] = v;
            }
        }
    }

    /// Copies the values of the lanes in `lanes` from `from` (a tile of the same registers).
    fn copy_lanes(&mut self, lanes: u32, from: &[f32]) {
        for i in 0..self.d.len() {
            let b = reg_base(i);
            for lane in lanes_of(lanes) {
                self.tile[b + LANE_OFF[lane]] = from[b + LANE_OFF[lane]];
            }
        }
    }
}

/// The values a wgmma run on lanes `m` must not change: with a partial mask, the tile of the
/// other lanes (their positions are zeroed while the kernel runs, as C of lanes that do not
/// take part).
pub(super) struct Kept(Option<Vec<f32>>);

impl Warp {
    /// The accumulator tile for wgmma `op` on lanes `m`, taken out of the pending state: C of
    /// every lane (0 for lanes in `m` whose `scale-d` predicate is false, and for lanes outside
    /// `m` while the kernel runs: [`Warp::wg_acc_end`] puts their values back).
    pub(super) fn wg_acc_begin(&mut self, op: &WgmmaOp, m: u32) -> (WgAcc, Kept) {
        let scale = &self.regs[op.scale_d as usize];
        let keep_c = lanes_of(m).fold(0u32, |s, l| s | (((scale[l] & 1) as u32) << l));
        let need_c = keep_c != 0 || m != u32::MAX;
        let lo = op.d.iter().copied().min().unwrap_or(0);
        let hi = op.d.iter().copied().max().unwrap_or(0);
        let mut acc = match self.wg_source(&op.d, lo, hi) {
            Source::Open(p) => self.wg_open.remove(p),
            src => {
                let mut acc = self.wg_free.pop().unwrap_or_default();
                acc.set_regs(&op.d);
                if need_c {
                    self.wg_gather(&mut acc, src);
                }
                acc
            }
        };
        if !need_c {
            acc.tile.fill(0.0);
            return (acc, Kept(None));
        }
        acc.fill_lanes(m & !keep_c, 0.0);
        if m == u32::MAX {
            return (acc, Kept(None));
        }
        let kept = acc.tile.clone();
        acc.fill_lanes(!m, 0.0);
        (acc, Kept(Some(kept)))
    }

    /// Puts the finished tile of [`Warp::wg_acc_begin`] into the open group.
    pub(super) fn wg_acc_end(&mut self, mut acc: WgAcc, m: u32, kept: Kept) {
        if let Kept(Some(t)) = kept {
            acc.copy_lanes(!m, &t);
        }
        self.wg_open.push(acc);
    }

    /// The newest pending result holding any of the registers `d` (slots `lo..=hi`).
    fn wg_source(&self, d: &[u32], lo: u32, hi: u32) -> Source {
        let hit = |a: &WgAcc| a.overlaps(lo, hi).then(|| a.d == d);
        if let Some((p, same)) = self
            .wg_open
            .iter()
            .enumerate()
            .rev()
            .find_map(|(p, a)| hit(a).map(|s| (p, s)))
        {
            return if same { Source::Open(p) } else { Source::Mixed };
        }
        for (g, grp) in self.wg_groups.iter().enumerate().rev() {
            if let Some((i, same)) = grp
                .iter()
                .enumerate()
                .rev()
                .find_map(|(i, a)| hit(a).map(|s| (i, s)))
            {
                return if same {
                    Source::Group(g, i)
                } else {
                    Source::Mixed
                };
            }
        }
        Source::Regs
    }

    /// Fills `acc`'s tile with the current values of its registers from `src`.
    fn wg_gather(&self, acc: &mut WgAcc, src: Source) {
        match src {
            Source::Group(g, i) => acc.tile.copy_from_slice(&self.wg_groups[g][i].tile),
            _ => {
                let mut v = [0u64; 32];
                for i in 0..acc.d.len() {
                    self.wg_current(acc.d[i], &mut v);
                    acc.put_lanes(i, &v);
                }
            }
        }
    }

    /// Current value of accumulator register `slot`: the newest pending wgmma result holding
    /// it, else the register file.
    fn wg_current(&self, slot: u32, v: &mut Lanes) {
        let groups = self.wg_groups.iter().rev();
        for grp in std::iter::once(&self.wg_open).chain(groups) {
            for a in grp.iter().rev() {
                if let Some(i) = a.find(slot) {
                    return a.get_lanes(i, v);
                }
            }
        }
        *v = self.regs[slot as usize];
    }

    /// `wgmma.commit_group`: the open results become a group.
    pub(super) fn wg_commit(&mut self) {
        let spare = self.wg_spare.pop().unwrap_or_default();
        let g = std::mem::replace(&mut self.wg_open, spare);
        self.wg_groups.push_back(g);
    }

    /// Retires the oldest committed group: its results reach the registers in order (a result
    /// followed by one on the same registers in the same group is skipped: the later one
    /// overwrites it).
    pub(super) fn wg_retire_oldest(&mut self) {
        let Some(mut g) = self.wg_groups.pop_front() else {
            return;
        };
        for (x, acc) in g.iter().enumerate() {
            if g[x + 1..].iter().any(|b| b.d == acc.d) {
                continue;
            }
            for (i, &slot) in acc.d.iter().enumerate() {
                if let Some(r) = self.regs.get_mut(slot as usize) {
                    acc.get_lanes(i, r);
                }
            }
        }
        self.wg_free.append(&mut g);
        self.wg_spare.push(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split index of `reg_base` + `LANE_OFF` is `hopper::acc_pos`'s column-major position
    /// for every register of an n = 256 accumulator and every lane, and the `REG_SPAN` window
    /// of each register stays inside the tile.
    #[test]
    fn tile_index_is_acc_pos() {
        for i in 0..128 {
            for lane in 0..32 {
                let (r, c) = crate::hopper::acc_pos(lane, i);
                assert_eq!(
                    reg_base(i) + LANE_OFF[lane],
                    c * 16 + r,
                    "reg {i} lane {lane}"
                );
                assert!(LANE_OFF[lane] < REG_SPAN);
            }
        }
        // the window of the last register of every n ends within the tile
        for regs in (4..=128).step_by(4) {
            assert_eq!(reg_base(regs - 1) + REG_SPAN, 32 * regs, "{regs} registers");
        }
    }
}
