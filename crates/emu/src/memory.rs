//! Device memory of the emulator. Global memory is one unified address space shared by every
//! emulated device of the process (so a pointer obtained for device 3 works from a kernel on
//! device 0, as with CUDA P2P). Allocations are arrays of `AtomicU64`, so kernels running on
//! several host threads — and the host itself — access them without undefined behaviour;
//! narrower accesses are masked word operations, read-modify-writes are CAS loops.
//!
//! Across processes (one rank per process, issue 17): an allocation's words are either owned
//! heap memory or a `MAP_SHARED` mapping of a POSIX shared-memory segment ([`shm`]), the same
//! `AtomicU64` slice either way, so loads, stores and atomics cost the same. Each process hands
//! out addresses from its own slot of the address space ([`GLOBAL_BASE`] + slot x
//! [`SLOT_BYTES`]), and a peer's segment opened here ([`GlobalMemory::open_shared`]) is mapped at
//! the peer's address, so one pointer is valid in every process of the node ([`peer`]).

mod peer;
pub mod shm;

use crate::error::EmuError;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

pub use peer::{SLOT_BYTES, SLOT_COUNT};

/// First global address handed out (slot 0); far from 0 so null-pointer bugs fault.
pub const GLOBAL_BASE: u64 = 0x0000_7f00_0000_0000;
/// Generic-address window of shared memory (`cvta.shared`): [SHARED_WINDOW, +4 GiB).
pub const SHARED_WINDOW: u64 = 0x0000_1000_0000_0000;
/// Generic-address window of local memory (`cvta.local`).
pub const LOCAL_WINDOW: u64 = 0x0000_2000_0000_0000;
/// Generic-address window of the kernel parameter space (`cvta.param`).
pub const PARAM_WINDOW: u64 = 0x0000_3000_0000_0000;
/// Addresses of device functions (`mov.u64 %rd, fname;`), used by indirect calls; nothing is
/// mapped there, so loads and stores through them fault.
pub const FUNC_BASE: u64 = 0x0000_4000_0000_0000;
/// Gap left between allocations so small overruns land in no allocation.
const GUARD: u64 = 4096;

/// The words of an allocation: a heap slice or a shared segment's, behind one fat pointer so
/// the hot path indexes a plain `&[AtomicU64]` whichever it is.
struct Words {
    ptr: NonNull<[AtomicU64]>,
    backing: Backing,
}

enum Backing {
    /// `ptr` came from `Box::into_raw` (freed in `Drop`).
    Heap,
    /// `ptr` points into the segment's mapping (unmapped when the segment drops).
    Shm(shm::Segment),
}

// SAFETY: Words owns its memory (heap box or mapping) exclusively and only ever hands out
// `&[AtomicU64]`, which is Send and Sync.
unsafe impl Send for Words {}
// SAFETY: as above.
unsafe impl Sync for Words {}

impl Words {
    fn heap(n: usize) -> Words {
        let b: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        Words {
            ptr: NonNull::from(Box::leak(b)),
            backing: Backing::Heap,
        }
    }

    fn shm(seg: shm::Segment) -> Words {
        Words {
            ptr: seg.words(),
            backing: Backing::Shm(seg),
        }
    }
}

impl std::ops::Deref for Words {
    type Target = [AtomicU64];
    #[inline(always)]
    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is valid for the life of `self` (heap box or live mapping), aligned,
        // and only shared references to it are ever made.
        unsafe { self.ptr.as_ref() }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        if let Backing::Heap = self.backing {
            // SAFETY: `ptr` came from `Box::leak` in `Words::heap` and is dropped once, here.
            drop(unsafe { Box::from_raw(self.ptr.as_ptr()) });
        }
    }
}

/// One device allocation.
pub struct Allocation {
    pub base: u64,
    pub size: u64,
    pub device: u32,
    words: Words,
    /// `initcheck`: one bit per byte, set when the byte is written (host copies, fills, kernel
    /// stores and atomics). Only allocations made while tracking was on have it. Always
    /// process-local, also for shared allocations: a peer's writes do not set it.
    written: Option<Box<[AtomicU64]>>,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("base", &format_args!("{:#x}", self.base))
            .field("size", &self.size)
            .field("device", &self.device)
            .field("segment", &self.segment().map(|s| s.id().name()))
            .finish()
    }
}

impl Allocation {
    fn new(base: u64, size: u64, device: u32, track: bool) -> Allocation {
        Allocation::with_words(
            base,
            size,
            device,
            track,
            Words::heap(size.div_ceil(8) as usize),
        )
    }

    fn with_words(base: u64, size: u64, device: u32, track: bool, words: Words) -> Allocation {
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        Allocation {
            base,
            size,
            device,
            words,
            written: track.then(|| zeros(size.div_ceil(64) as usize)),
        }
    }

    /// The shared-memory segment behind this allocation (None for a process-local one).
    pub fn segment(&self) -> Option<&shm::Segment> {
        match &self.words.backing {
            Backing::Shm(s) => Some(s),
            Backing::Heap => None,
        }
    }

    /// What another process needs to map this allocation ([`GlobalMemory::open_shared`]);
    /// None for a process-local one.
    pub fn shared_spec(&self) -> Option<shm::SegmentSpec> {
        self.segment().map(|s| shm::SegmentSpec {
            id: s.id().clone(),
            base: self.base,
            size: self.size,
            device: self.device,
        })
    }

    /// Whether this is a peer's segment mapped here whose owner has since freed it (or exited
    /// normally); launches no longer map it.
    pub fn peer_freed(&self) -> bool {
        self.segment()
            .is_some_and(|s| !s.is_owner() && s.peer_freed())
    }

    /// Whether this allocation records which bytes were written (`initcheck`).
    pub fn tracks_writes(&self) -> bool {
        self.written.is_some()
    }

    /// Marks bytes [off, off+len) written (no-op unless tracked).
    #[inline]
    pub fn mark_written(&self, off: u64, len: u64) {
        let Some(bits) = &self.written else { return };
        let end = (off + len).min(self.size);
        let mut b = off;
        while b < end {
            let (w, sh) = ((b / 64) as usize, b % 64);
            let n = (64 - sh).min(end - b);
            let m = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << sh
            };
            bits[w].fetch_or(m, Ordering::Relaxed);
            b += n;
        }
    }

    /// The first byte of [off, off+len) nothing has written (None when all were written or the
    /// allocation is not tracked).
    pub fn first_unwritten(&self, off: u64, len: u64) -> Option<u64> {
        let bits = self.written.as_ref()?;
        (off..(off + len).min(self.size))
            .find(|b| bits[(b / 64) as usize].load(Ordering::Relaxed) >> (b % 64) & 1 == 0)
    }

    /// Reads `size` (1, 2, 4, 8) bytes at byte offset `off` (naturally aligned).
    #[inline]
    pub fn read(&self, off: u64, size: u32, ord: Ordering) -> u64 {
        let w = self.words[(off >> 3) as usize].load(ord);
        if size == 8 {
            return w;
        }
        let sh = (off & 7) * 8;
        (w >> sh) & mask(size)
    }

    /// The `S` bytes (4, 8 or 16) at byte offset `off`, aligned to `S` (to 8 for 16: the
    /// caller checks), as relaxed loads of the words holding them; `None` past the end.
    #[inline(always)]
    pub fn read_row<const S: usize>(&self, off: u64) -> Option<[u8; S]> {
        let w = (off >> 3) as usize;
        let words = self.words.get(w..w + S.div_ceil(8))?;
        let mut row = [0u8; S];
        if S >= 8 {
            for (ch, word) in row.chunks_exact_mut(8).zip(words) {
                ch.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
            }
        } else {
            let v = words[0].load(Ordering::Relaxed) >> ((off & 7) * 8);
            row.copy_from_slice(&v.to_le_bytes()[..S]);
        }
        Some(row)
    }

    /// Writes `size` (1, 2, 4, 8) bytes at byte offset `off` (naturally aligned).
    #[inline]
    pub fn write(&self, off: u64, size: u32, val: u64, ord: Ordering) {
        if self.written.is_some() {
            self.mark_written(off, size as u64);
        }
        let word = &self.words[(off >> 3) as usize];
        if size == 8 {
            word.store(val, ord);
            return;
        }
        let sh = (off & 7) * 8;
        let m = mask(size) << sh;
        let v = (val << sh) & m;
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let new = (cur & !m) | v;
            match word.compare_exchange_weak(cur, new, ord, Ordering::Relaxed) {
                Ok(_) => return,
                Err(x) => cur = x,
            }
        }
    }

    /// Writes the bytes of `val` that `mask` selects into word `w` (byte offset `8 * w`): one
    /// store when the mask covers the word, else a compare-and-swap loop as in [`Self::write`].
    /// For allocations that do not track writes (the caller checks [`Self::tracks_writes`]).
    #[inline]
    pub fn write_word_masked(&self, w: u64, mask: u64, val: u64, ord: Ordering) {
        let word = &self.words[w as usize];
        if mask == u64::MAX {
            word.store(val, ord);
            return;
        }
        let v = val & mask;
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let new = (cur & !mask) | v;
            match word.compare_exchange_weak(cur, new, ord, Ordering::Relaxed) {
                Ok(_) => return,
                Err(x) => cur = x,
            }
        }
    }

    /// Atomic read-modify-write of `size` (4 or 8; 2 for f16 packs) bytes; returns the old value.
    #[inline]
    pub fn rmw(&self, off: u64, size: u32, ord: Ordering, f: impl Fn(u64) -> u64) -> u64 {
        if self.written.is_some() {
            self.mark_written(off, size as u64);
        }
        let word = &self.words[(off >> 3) as usize];
        let sh = (off & 7) * 8;
        let m = if size == 8 {
            u64::MAX
        } else {
            mask(size) << sh
        };
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let old = (cur & m) >> sh;
            let new_v = f(old) & mask(size);
            let new = (cur & !m) | (new_v << sh);
            match word.compare_exchange_weak(cur, new, ord, Ordering::Relaxed) {
                Ok(_) => return old,
                Err(x) => cur = x,
            }
        }
    }

    /// Copies bytes out; whole words where possible.
    pub fn read_bytes(&self, off: u64, out: &mut [u8]) {
        let mut i = 0usize;
        while i < out.len() {
            let a = off + i as u64;
            if a.is_multiple_of(8) && i + 8 <= out.len() {
                let w = self.words[(a >> 3) as usize].load(Ordering::Relaxed);
                out[i..i + 8].copy_from_slice(&w.to_le_bytes());
                i += 8;
            } else {
                out[i] = self.read(a, 1, Ordering::Relaxed) as u8;
                i += 1;
            }
        }
    }

    /// Copies bytes in (host side); whole words where possible.
    pub fn write_bytes(&self, off: u64, data: &[u8]) {
        self.mark_written(off, data.len() as u64);
        let mut i = 0usize;
        while i < data.len() {
            let a = off + i as u64;
            if a.is_multiple_of(8) && i + 8 <= data.len() {
                let mut w = [0u8; 8];
                w.copy_from_slice(&data[i..i + 8]);
                self.words[(a >> 3) as usize].store(u64::from_le_bytes(w), Ordering::Relaxed);
                i += 8;
            } else {
                self.write(a, 1, data[i] as u64, Ordering::Relaxed);
                i += 1;
            }
        }
    }

    /// Fills bytes with a repeating pattern.
    pub fn fill(&self, off: u64, len: u64, pattern: &[u8]) {
        let data: Vec<u8> = (0..len as usize)
            .map(|i| pattern[i % pattern.len()])
            .collect();
        self.write_bytes(off, &data);
    }
}

/// Whether an access of `size` bytes at offset `off` lies within `len` bytes, computed without
/// wrapping (an offset near 2^64, e.g. a negative one, never fits).
#[inline]
pub(crate) fn fits(off: u64, size: u64, len: u64) -> bool {
    off.checked_add(size).is_some_and(|end| end <= len)
}

#[inline]
pub(crate) fn mask(size: u32) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (size * 8)) - 1
    }
}

/// The process-wide global address space.
pub struct GlobalMemory {
    inner: RwLock<MemInner>,
    /// New allocations record which bytes are written (for `initcheck`); also on when the
    /// process default sanitizers include initcheck ([`crate::sanitize::process_default`]).
    track_writes: AtomicBool,
    /// [`GlobalMemory::alloc`] makes shared-memory allocations ([`GlobalMemory::alloc_shared`]).
    shared_default: AtomicBool,
    /// Some peer segment was opened: snapshots check whether their owners freed them.
    has_peers: AtomicBool,
}

impl Default for GlobalMemory {
    fn default() -> GlobalMemory {
        GlobalMemory::new()
    }
}

struct MemInner {
    /// Next address handed out, inside this process's slot.
    next: u64,
    /// This process's slot of the address space ([`GlobalMemory::set_address_slot`]).
    slot: u32,
    /// Peer segments opened here ([`GlobalMemory::open_shared`]), with their open counts.
    peers: Vec<peer::PeerMapping>,
    /// Sorted by base; replaced wholesale (copy on write) so launches hold a cheap snapshot.
    map: Arc<Vec<Arc<Allocation>>>,
    /// Multicast address ranges ([`crate::multicast`]), copy on write like `map`.
    multicast: Arc<Vec<crate::multicast::McMapping>>,
    /// Next multicast range's offset above [`crate::multicast::MULTICAST_WINDOW`].
    mc_next: u64,
}

impl MemInner {
    /// `[base, base+size)` lies in the reserved part of the multicast window and overlaps no
    /// multicast mapping or allocation (what may be mapped there).
    fn check_reserved_free(&self, base: u64, size: u64) -> Result<(), EmuError> {
        let window = crate::multicast::MULTICAST_WINDOW;
        if size == 0 || base < window || !fits(base - window, size, self.mc_next) {
            return Err(EmuError::Memory(format!(
                "address: [{base:#x}, +{size:#x}) is not inside a reserved range"
            )));
        }
        let end = base + size;
        let mapped = self
            .multicast
            .iter()
            .any(|m| base < m.base + m.obj.size && m.base < end);
        let allocated = self
            .map
            .iter()
            .any(|a| base < a.base + a.size && a.base < end);
        if mapped || allocated {
            return Err(EmuError::Memory(format!(
                "address: [{base:#x}, +{size:#x}) overlaps a mapped range"
            )));
        }
        Ok(())
    }
}

/// An immutable view of the allocations, taken at launch.
#[derive(Clone)]
pub struct MemMap {
    pub allocs: Arc<Vec<Arc<Allocation>>>,
    /// Multicast address ranges mapped at the snapshot ([`crate::multicast`]).
    pub multicast: Arc<Vec<crate::multicast::McMapping>>,
}

impl MemMap {
    /// Finds the allocation containing [addr, addr+size).
    #[inline]
    pub fn find(&self, addr: u64, size: u64) -> Option<&Arc<Allocation>> {
        let v = &self.allocs;
        let i = v.partition_point(|a| a.base <= addr);
        if i == 0 {
            return None;
        }
        let a = &v[i - 1];
        // checked: an address near 2^64 must not wrap into the allocation
        if fits(addr - a.base, size, a.size) {
            Some(a)
        } else {
            None
        }
    }

    /// The multicast range containing [addr, addr+size), if any.
    pub fn find_multicast(&self, addr: u64, size: u64) -> Option<&crate::multicast::McMapping> {
        self.multicast.iter().find(|m| m.contains(addr, size))
    }
}

impl GlobalMemory {
    pub fn new() -> GlobalMemory {
        GlobalMemory {
            inner: RwLock::new(MemInner {
                next: GLOBAL_BASE,
                slot: 0,
                peers: Vec::new(),
                map: Arc::new(Vec::new()),
                multicast: Arc::new(Vec::new()),
                mc_next: 0,
            }),
            track_writes: Default::default(),
            shared_default: Default::default(),
            has_peers: Default::default(),
        }
    }

    /// Makes later allocations record which bytes are written (`initcheck` of global memory).
    pub fn set_track_writes(&self, on: bool) {
        self.track_writes.store(on, Ordering::Relaxed);
    }

    /// Makes [`GlobalMemory::alloc`] allocate shared memory (as [`GlobalMemory::alloc_shared`])
    /// from now on, or process-local memory again.
    pub fn set_shared_default(&self, on: bool) {
        self.shared_default.store(on, Ordering::Relaxed);
    }

    /// Whether [`GlobalMemory::alloc`] allocates shared memory.
    pub fn shared_default(&self) -> bool {
        self.shared_default.load(Ordering::Relaxed)
    }

    /// Allocates `size` bytes (zeroed) owned by `device`, 256-byte aligned: process-local
    /// memory, or a shared segment when [`GlobalMemory::set_shared_default`] is on.
    pub fn alloc(&self, size: u64, device: u32) -> Result<Arc<Allocation>, EmuError> {
        self.alloc_in_slot(size, device, self.shared_default())
    }

    /// Allocates `size` bytes (zeroed) owned by `device` in a new POSIX shared-memory segment
    /// `/ptxforge-{job}-p{pid}-{n}` that other processes can map ([`GlobalMemory::open_shared`]);
    /// freeing the allocation (or exiting) unlinks it.
    pub fn alloc_shared(&self, size: u64, device: u32) -> Result<Arc<Allocation>, EmuError> {
        self.alloc_in_slot(size, device, true)
    }

    fn alloc_in_slot(
        &self,
        size: u64,
        device: u32,
        shared: bool,
    ) -> Result<Arc<Allocation>, EmuError> {
        crate::limits::check_alloc(size)?;
        let mut g = self
            .inner
            .write()
            .map_err(|_| EmuError::Memory("memory lock poisoned".into()))?;
        let base = g.next;
        let next = (base + size.max(1) + GUARD).div_ceil(256) * 256;
        let end = peer::slot_base(g.slot) + SLOT_BYTES;
        if next > end {
            return Err(EmuError::Memory(format!(
                "size: {size} bytes do not fit in address slot {} (its {SLOT_BYTES:#x} bytes \
                 are used up; addresses are not reused)",
                g.slot
            )));
        }
        let track = self.track_writes.load(Ordering::Relaxed)
            || crate::sanitize::process_default().initcheck;
        let words = if shared {
            let id = shm::SegmentId {
                job: shm::job_id()?,
                pid: std::process::id(),
                n: shm::next_segment_number(),
            };
            Words::shm(shm::Segment::create(id, base, size, device)?)
        } else {
            Words::heap(size.div_ceil(8) as usize)
        };
        g.next = next;
        let a = Arc::new(Allocation::with_words(base, size, device, track, words));
        let mut v: Vec<Arc<Allocation>> = g.map.as_ref().clone();
        // sorted by base: peer segments of higher slots may lie above this slot's allocations
        let at = v.partition_point(|x| x.base < base);
        v.insert(at, a.clone());
        g.map = Arc::new(v);
        Ok(a)
    }

    /// Allocates `size` bytes (zeroed) owned by `device` at `base`, inside a range reserved
    /// with [`GlobalMemory::multicast_reserve`] and overlapping no allocation or multicast
    /// mapping (`cuMemMap` of `cuMemCreate` memory at a reserved address).
    pub fn alloc_at(&self, base: u64, size: u64, device: u32) -> Result<Arc<Allocation>, EmuError> {
        crate::limits::check_alloc(size)?;
        let mut g = self
            .inner
            .write()
            .map_err(|_| EmuError::Memory("memory lock poisoned".into()))?;
        g.check_reserved_free(base, size)?;
        let track = self.track_writes.load(Ordering::Relaxed)
            || crate::sanitize::process_default().initcheck;
        let a = Arc::new(Allocation::new(base, size, device, track));
        let mut v: Vec<Arc<Allocation>> = g.map.as_ref().clone();
        let at = v.partition_point(|x| x.base < base);
        v.insert(at, a.clone());
        g.map = Arc::new(v);
        Ok(a)
    }

    /// Removes an allocation from the address space (kernels launched later fault on it). A
    /// shared allocation's segment is marked freed for its openers and unlinked now; its pages
    /// stay mapped (here and in openers) until the last reference drops.
    pub fn free(&self, base: u64) {
        if let Ok(mut g) = self.inner.write() {
            let (gone, kept): (Vec<_>, Vec<_>) =
                g.map.iter().cloned().partition(|a| a.base == base);
            for seg in gone.iter().filter_map(|a| a.segment()) {
                seg.retire();
            }
            g.map = Arc::new(kept);
        }
    }

    pub fn snapshot(&self) -> MemMap {
        if self.has_peers.load(Ordering::Relaxed) {
            self.unmap_freed_peers();
        }
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        MemMap {
            allocs: g.map.clone(),
            multicast: g.multicast.clone(),
        }
    }

    /// Reserves `size` bytes of the multicast window (never handed out again); returns the base.
    pub(crate) fn reserve_mc_range(&self, size: u64) -> Result<u64, EmuError> {
        let mut g = self
            .inner
            .write()
            .map_err(|_| EmuError::Memory("memory lock poisoned".into()))?;
        let base = crate::multicast::MULTICAST_WINDOW + g.mc_next;
        // a granule of guard between ranges, so an overrun of one is never another's access
        g.mc_next += size + crate::multicast::GRANULARITY;
        Ok(base)
    }

    /// Adds a multicast range for `obj` at `base`, which must lie in a reserved part of the
    /// window and overlap no mapped range (see [`GlobalMemory::multicast_map_at`]).
    pub(crate) fn add_mc_mapping(
        &self,
        obj: &Arc<crate::multicast::MulticastObject>,
        device: u32,
        base: u64,
    ) -> Result<(), EmuError> {
        let mut g = self
            .inner
            .write()
            .map_err(|_| EmuError::Memory("memory lock poisoned".into()))?;
        g.check_reserved_free(base, obj.size)?;
        let mut v = g.multicast.as_ref().clone();
        v.push(crate::multicast::McMapping {
            base,
            device,
            obj: obj.clone(),
        });
        g.multicast = Arc::new(v);
        Ok(())
    }

    /// Removes the multicast range at `base`.
    pub(crate) fn remove_mc_mapping(&self, base: u64) {
        if let Ok(mut g) = self.inner.write() {
            let v = g
                .multicast
                .iter()
                .filter(|m| m.base != base)
                .cloned()
                .collect();
            g.multicast = Arc::new(v);
        }
    }
}
