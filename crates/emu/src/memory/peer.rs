//! Address slots and peer segments: what makes one emulated pointer valid in every process of
//! a node. Each process allocates inside its own slot, `[GLOBAL_BASE + slot * SLOT_BYTES,
//! +SLOT_BYTES)` (slot = the rank), and maps a peer's segment at the peer's address; a peer
//! range that would overlap anything mapped here is refused, never silently aliased.

use super::shm::{Segment, SegmentSpec};
use super::{Allocation, GlobalMemory, Words, GLOBAL_BASE};
use crate::error::EmuError;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Bytes of address space per slot (16 TiB; addresses are never reused within a slot).
pub const SLOT_BYTES: u64 = 1 << 44;
/// Number of slots (ranks of a job) the address space has room for.
pub const SLOT_COUNT: u32 = 4096;

/// First address of `slot`.
pub(super) fn slot_base(slot: u32) -> u64 {
    GLOBAL_BASE + slot as u64 * SLOT_BYTES
}

/// The slot an address lies in (None below [`GLOBAL_BASE`] or past the last slot).
pub fn slot_of(addr: u64) -> Option<u32> {
    let s = addr.checked_sub(GLOBAL_BASE)? / SLOT_BYTES;
    (s < SLOT_COUNT as u64).then_some(s as u32)
}

/// A peer segment mapped here and how many open handles use it.
pub(super) struct PeerMapping {
    alloc: Arc<Allocation>,
    opens: usize,
}

fn lock_err() -> EmuError {
    EmuError::Memory("memory lock poisoned".into())
}

impl GlobalMemory {
    /// Moves this address space to `slot` (the rank): allocations are then made inside
    /// `[GLOBAL_BASE + slot * SLOT_BYTES, +SLOT_BYTES)`. Only before the first allocation.
    pub fn set_address_slot(&self, slot: u32) -> Result<(), EmuError> {
        if slot >= SLOT_COUNT {
            return Err(EmuError::Memory(format!(
                "slot: {slot} is not below {SLOT_COUNT}"
            )));
        }
        let mut g = self.inner.write().map_err(|_| lock_err())?;
        if g.next != slot_base(g.slot) || !g.map.is_empty() {
            return Err(EmuError::Memory(format!(
                "slot: cannot move to slot {slot} after allocating in slot {}",
                g.slot
            )));
        }
        g.slot = slot;
        g.next = slot_base(slot);
        Ok(())
    }

    /// This address space's slot.
    pub fn address_slot(&self) -> u32 {
        self.inner.read().map(|g| g.slot).unwrap_or(0)
    }

    /// Maps a peer's shared allocation (exported by another process) read-write at the peer's
    /// address. Opening the same segment again returns the same allocation (counted; see
    /// [`GlobalMemory::close_shared`]). Errors: the range lies in this process's own slot or
    /// overlaps a mapped allocation, or the segment is gone, freed, or not what `spec` says.
    pub fn open_shared(&self, spec: &SegmentSpec) -> Result<Arc<Allocation>, EmuError> {
        let name = spec.id.name();
        let mut g = self.inner.write().map_err(|_| lock_err())?;
        let own = g.slot;
        let end = spec.base.checked_add(spec.size.max(1));
        let slot = slot_of(spec.base).filter(|&s| end.is_some_and(|e| slot_of(e - 1) == Some(s)));
        match slot {
            None => {
                return Err(EmuError::Memory(format!(
                    "address: segment `{name}` at [{:#x}, +{}) is not inside one address slot",
                    spec.base, spec.size
                )))
            }
            Some(s) if s == own => {
                return Err(EmuError::Memory(format!(
                    "address: segment `{name}` at {:#x} lies in this process's own slot {own} \
                     (two processes with the same slot? set RANK or PTXFORGE_EMU_SLOT apart)",
                    spec.base
                )))
            }
            Some(_) => {}
        }
        if let Some(p) = g.peers.iter_mut().find(|p| {
            p.alloc.base == spec.base && p.alloc.segment().is_some_and(|s| s.id() == &spec.id)
        }) {
            if !p.alloc.peer_freed() {
                p.opens += 1;
                return Ok(p.alloc.clone());
            }
        }
        check_free_range(&g.map, spec, &name)?;
        let seg = Segment::open(spec)?;
        let words = Words::shm(seg);
        let a = Arc::new(Allocation::with_words(
            spec.base,
            spec.size,
            spec.device,
            false,
            words,
        ));
        let mut v: Vec<Arc<Allocation>> = g.map.as_ref().clone();
        let at = v.partition_point(|x| x.base < spec.base);
        v.insert(at, a.clone());
        g.map = Arc::new(v);
        g.peers.push(PeerMapping {
            alloc: a.clone(),
            opens: 1,
        });
        self.has_peers.store(true, Ordering::Relaxed);
        crate::clock::progress_from_other_processes();
        Ok(a)
    }

    /// Closes one open of the peer allocation at `base`; the last close unmaps it.
    pub fn close_shared(&self, base: u64) {
        let Ok(mut g) = self.inner.write() else {
            return;
        };
        let Some(i) = g.peers.iter().position(|p| p.alloc.base == base) else {
            return;
        };
        g.peers[i].opens -= 1;
        if g.peers[i].opens > 0 {
            return;
        }
        let p = g.peers.swap_remove(i);
        let v: Vec<Arc<Allocation>> = g
            .map
            .iter()
            .filter(|a| !Arc::ptr_eq(a, &p.alloc))
            .cloned()
            .collect();
        g.map = Arc::new(v);
        self.has_peers.store(!g.peers.is_empty(), Ordering::Relaxed);
    }

    /// Takes the peer allocations whose owners freed them out of the address space, so kernels
    /// launched from now on fault on them (a typed out-of-bounds fault, not a SIGBUS: the
    /// pages themselves stay mapped until the opener closes them).
    pub(super) fn unmap_freed_peers(&self) {
        let any = self
            .inner
            .read()
            .map(|g| g.map.iter().any(|a| a.peer_freed()))
            .unwrap_or(false);
        if !any {
            return;
        }
        if let Ok(mut g) = self.inner.write() {
            let v: Vec<Arc<Allocation>> =
                g.map.iter().filter(|a| !a.peer_freed()).cloned().collect();
            g.map = Arc::new(v);
        }
    }
}

/// `spec`'s range (with a guard on each side) overlaps no allocation of `map`.
fn check_free_range(
    map: &[Arc<Allocation>],
    spec: &SegmentSpec,
    name: &str,
) -> Result<(), EmuError> {
    let end = spec.base + spec.size.max(1);
    match map
        .iter()
        .find(|a| spec.base < a.base + a.size.max(1) && a.base < end)
    {
        Some(a) => Err(EmuError::Memory(format!(
            "address: segment `{name}` at [{:#x}, +{}) overlaps the allocation at [{:#x}, +{}) \
             already mapped here",
            spec.base, spec.size, a.base, a.size
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_slot_is_an_error_not_an_overlap_with_the_next() {
        let mem = GlobalMemory::new();
        mem.set_address_slot(7).unwrap();
        let end = slot_base(8);
        // as if nearly 16 TiB had been allocated and freed (addresses are never reused)
        mem.inner.write().unwrap().next = end - 8192;
        let last = mem.alloc(4096, 0).unwrap();
        assert_eq!(last.base, end - 8192);
        let e = mem.alloc(1, 0).unwrap_err().to_string();
        assert!(e.contains("address slot 7"), "{e}");
        assert_eq!(slot_of(last.base + last.size - 1), Some(7));
        assert_eq!(slot_of(end), Some(8));
        assert_eq!(slot_of(GLOBAL_BASE - 1), None);
        assert_eq!(slot_of(slot_base(SLOT_COUNT - 1) + SLOT_BYTES), None);
    }
}
