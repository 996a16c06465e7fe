//! POSIX shared-memory segments behind shareable allocations (see `docs/SCALE.md`, "Intra-node
//! memory (IPC)"). This module owns the segment's life: naming (`/ptxforge-{job}-p{pid}-{n}`),
//! creation (`shm_open` + `ftruncate` + `mmap(MAP_SHARED)`), opening a peer's segment, the
//! header page that tells openers whether the owner freed it, unlinking, and the `atexit`
//! cleanup of segments a process still owns when it exits.
//!
//! Layout of a segment: one 4 KiB header page ([`Header`]) then the allocation's words. The
//! words start page-aligned, so the `AtomicU64` slice an [`crate::Allocation`] reads is the same
//! kind of memory whether it is owned or shared; x86 atomics on `MAP_SHARED` pages are coherent
//! across processes exactly as across threads (same physical pages, same cache coherence).

use crate::error::EmuError;
use std::collections::HashMap;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

/// Bytes before the words: the header page.
pub const HEADER_BYTES: usize = 4096;
/// Longest `PTXFORGE_JOB_ID` a segment name (and a 64-byte IPC handle) can carry.
pub const MAX_JOB_ID: usize = 40;
const MAGIC: u64 = u64::from_le_bytes(*b"PTXFSHM1");
const LIVE: u64 = 1;
const FREED: u64 = 2;

/// The header page at the start of every segment (written by the owner before anyone can know
/// the segment's name, so openers read it after `shm_open`).
#[repr(C)]
struct Header {
    magic: AtomicU64,
    base: AtomicU64,
    size: AtomicU64,
    pid: AtomicU64,
    device: AtomicU64,
    /// [`LIVE`] until the owner frees the allocation or exits, then [`FREED`].
    state: AtomicU64,
}

/// What names a segment: the job, the exporting process and its per-process counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentId {
    pub job: String,
    pub pid: u32,
    pub n: u64,
}

impl SegmentId {
    /// `/ptxforge-{job}-p{pid}-{n}` (`shm_open` name; the file is `/dev/shm/ptxforge-...`).
    pub fn name(&self) -> String {
        format!("/ptxforge-{}-p{}-{}", self.job, self.pid, self.n)
    }
}

/// What an opener expects to find in a segment (from the exporter's IPC handle).
#[derive(Clone, Debug)]
pub struct SegmentSpec {
    pub id: SegmentId,
    pub base: u64,
    pub size: u64,
    pub device: u32,
}

/// The job id of this process: `PTXFORGE_JOB_ID`, default `solo`; checked to be a valid piece of
/// a segment name (1 to [`MAX_JOB_ID`] characters of `[A-Za-z0-9._]`; no `-`, so the segment
/// name parses back unambiguously).
pub fn job_id() -> Result<String, EmuError> {
    let job = std::env::var("PTXFORGE_JOB_ID").unwrap_or_else(|_| "solo".into());
    check_job_id(&job)?;
    Ok(job)
}

/// Checks a job id for [`job_id`].
pub fn check_job_id(job: &str) -> Result<(), EmuError> {
    let ok = !job.is_empty()
        && job.len() <= MAX_JOB_ID
        && job
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(EmuError::Memory(format!(
            "PTXFORGE_JOB_ID `{job}`: must be 1 to {MAX_JOB_ID} characters of [A-Za-z0-9._]"
        )))
    }
}

/// A mapped segment: created by this process (the owner) or opened from a peer's handle.
pub struct Segment {
    id: SegmentId,
    map: NonNull<u8>,
    map_len: usize,
    words: usize,
    owner: bool,
    /// The owner retired it already (header FREED, name unlinked).
    retired: AtomicBool,
}

// SAFETY: the mapping is plain shared memory that lives until `Drop` unmaps it; everything
// read or written through it is an atomic (`Header` fields, the `AtomicU64` words).
unsafe impl Send for Segment {}
// SAFETY: as above: all access through `&Segment` is atomic.
unsafe impl Sync for Segment {}

fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

fn c_name(id: &SegmentId) -> Result<CString, EmuError> {
    CString::new(id.name())
        .map_err(|_| EmuError::Memory(format!("shared segment name `{}`", id.name())))
}

/// Maps `len` bytes of the open descriptor `fd` read-write and shared, then closes `fd`.
fn map_fd(fd: i32, len: usize, name: &str) -> Result<NonNull<u8>, EmuError> {
    // SAFETY: a fresh mapping chosen by the kernel (addr null) of an fd we own; no existing
    // memory is affected. The fd is closed right after (the mapping keeps the object alive).
    let p = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        let e = (p == libc::MAP_FAILED).then(errno_text);
        libc::close(fd);
        if let Some(e) = e {
            return Err(EmuError::Memory(format!(
                "mmap of shared segment `{name}` ({len} bytes): {e}"
            )));
        }
        p
    };
    NonNull::new(p.cast::<u8>())
        .ok_or_else(|| EmuError::Memory(format!("mmap of `{name}` returned null")))
}

/// Bytes of the segment holding `size` bytes of words.
fn segment_len(size: u64) -> Result<usize, EmuError> {
    let words = usize::try_from(size.div_ceil(8))
        .map_err(|_| EmuError::Memory(format!("size: {size} bytes does not fit in memory")))?;
    words
        .checked_mul(8)
        .and_then(|b| b.checked_add(HEADER_BYTES))
        .ok_or_else(|| EmuError::Memory(format!("size: {size} bytes does not fit in memory")))
}

/// `shm_open(O_CREAT | O_EXCL)`. A segment that already has this name carries our pid and a
/// number this process has not used: it was left by a killed earlier process whose pid we
/// reuse, so it is unlinked and the create retried once.
fn create_exclusive(cname: &CString, name: &str) -> Result<i32, EmuError> {
    for retry in [false, true] {
        // SAFETY: FFI with a NUL-terminated name; O_EXCL never reuses another's segment.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd >= 0 {
            return Ok(fd);
        }
        let e = std::io::Error::last_os_error();
        if retry || e.raw_os_error() != Some(libc::EEXIST) {
            return Err(EmuError::Memory(format!(
                "shm_open of `{name}` (create): {e}"
            )));
        }
        // SAFETY: FFI with a NUL-terminated name (a stale segment of a dead process).
        unsafe { libc::shm_unlink(cname.as_ptr()) };
    }
    Err(EmuError::Memory(format!("shm_open of `{name}` (create)")))
}

impl Segment {
    /// Creates and maps a new zeroed segment for an allocation of `size` bytes at emulated
    /// address `base`; the name is registered for unlinking at exit.
    pub fn create(id: SegmentId, base: u64, size: u64, device: u32) -> Result<Segment, EmuError> {
        let len = segment_len(size)?;
        let name = id.name();
        let cname = c_name(&id)?;
        let fd = create_exclusive(&cname, &name)?;
        let unlink = || {
            // SAFETY: FFI with a NUL-terminated name.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
        };
        // SAFETY: FFI on the fd just opened.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = errno_text();
            // SAFETY: closing the fd we own.
            unsafe { libc::close(fd) };
            unlink();
            return Err(EmuError::Memory(format!(
                "ftruncate of shared segment `{name}` to {len} bytes: {e} (is /dev/shm full?)"
            )));
        }
        let map = map_fd(fd, len, &name).inspect_err(|_| unlink())?;
        let seg = Segment {
            id,
            map,
            map_len: len,
            words: (len - HEADER_BYTES) / 8,
            owner: true,
            retired: AtomicBool::new(false),
        };
        let h = seg.header();
        h.base.store(base, Ordering::Relaxed);
        h.size.store(size, Ordering::Relaxed);
        h.pid.store(seg.id.pid as u64, Ordering::Relaxed);
        h.device.store(device as u64, Ordering::Relaxed);
        h.state.store(LIVE, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        register_live(&seg);
        Ok(seg)
    }

    /// Opens and maps (read-write) a peer's segment, checking it is the one `spec` describes
    /// and that its owner has neither freed it nor exited.
    pub fn open(spec: &SegmentSpec) -> Result<Segment, EmuError> {
        let name = spec.id.name();
        let cname = c_name(&spec.id)?;
        // SAFETY: FFI with a NUL-terminated name.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            let why = if e.raw_os_error() == Some(libc::ENOENT) {
                "no such segment: its owner freed the buffer or exited".to_string()
            } else {
                e.to_string()
            };
            return Err(EmuError::Memory(format!("shared segment `{name}`: {why}")));
        }
        let want = segment_len(spec.size)?;
        // SAFETY: `st` is written by fstat on the fd we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: FFI on the fd we own, out-pointer to a local.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || (st.st_size as u64) < want as u64 {
            // SAFETY: closing the fd we own.
            unsafe { libc::close(fd) };
            return Err(EmuError::Memory(format!(
                "shared segment `{name}` is {} bytes, the handle needs {want}",
                st.st_size
            )));
        }
        let map = map_fd(fd, want, &name)?;
        let seg = Segment {
            id: spec.id.clone(),
            map,
            map_len: want,
            words: (want - HEADER_BYTES) / 8,
            owner: false,
            retired: AtomicBool::new(false),
        };
        seg.check_matches(spec)?;
        Ok(seg)
    }

    /// The header says this is the segment of `spec`, still live, of a running owner.
    fn check_matches(&self, spec: &SegmentSpec) -> Result<(), EmuError> {
        let h = self.header();
        let name = self.id.name();
        let got = (
            h.base.load(Ordering::Relaxed),
            h.size.load(Ordering::Relaxed),
            h.pid.load(Ordering::Relaxed),
        );
        if h.magic.load(Ordering::Acquire) != MAGIC
            || got != (spec.base, spec.size, spec.id.pid as u64)
        {
            return Err(EmuError::Memory(format!(
                "shared segment `{name}` holds [{:#x}, +{}) of pid {}, the handle says \
                 [{:#x}, +{}) of pid {}",
                got.0, got.1, got.2, spec.base, spec.size, spec.id.pid
            )));
        }
        if self.peer_freed() {
            return Err(EmuError::Memory(format!(
                "shared segment `{name}`: its owner freed the buffer"
            )));
        }
        if !process_alive(spec.id.pid) {
            return Err(EmuError::Memory(format!(
                "shared segment `{name}`: its owner, pid {}, has exited",
                spec.id.pid
            )));
        }
        Ok(())
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least HEADER_BYTES long, page-aligned, and lives as long as
        // `self`; Header is all atomics.
        unsafe { self.map.cast::<Header>().as_ref() }
    }

    /// The words of the allocation (after the header page), valid while `self` lives.
    pub fn words(&self) -> NonNull<[AtomicU64]> {
        // SAFETY: HEADER_BYTES is inside the mapping, which holds `words` whole words after it;
        // the address is page-aligned plus 4096, so aligned for AtomicU64.
        let first = unsafe { self.map.add(HEADER_BYTES) }.cast::<AtomicU64>();
        NonNull::slice_from_raw_parts(first, self.words)
    }

    pub fn id(&self) -> &SegmentId {
        &self.id
    }

    /// Whether this process created the segment.
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// Whether the owner freed the allocation (or exited normally).
    pub fn peer_freed(&self) -> bool {
        self.header().state.load(Ordering::Acquire) == FREED
    }

    /// Owner only: marks the segment freed for openers and unlinks its name (idempotent). The
    /// pages stay mapped until `self` drops, so a kernel still running on them cannot fault.
    pub fn retire(&self) {
        if !self.owner || self.retired.swap(true, Ordering::AcqRel) {
            return;
        }
        self.header().state.store(FREED, Ordering::Release);
        unregister_live(&self.id.name());
        if let Ok(c) = c_name(&self.id) {
            // SAFETY: FFI with a NUL-terminated name.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.retire();
        // SAFETY: unmapping exactly the mapping this Segment made; nothing borrows it any more
        // (the Allocation holding the words is being dropped).
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

/// Whether process `pid` exists (a zombie counts as exited).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // state is the field after the parenthesised command name
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))),
        Err(_) => false,
    }
}

/// Owned, not yet retired segments: name -> address of the header (for the exit handler).
fn live() -> &'static Mutex<HashMap<String, usize>> {
    static LIVE_SEGS: std::sync::OnceLock<Mutex<HashMap<String, usize>>> =
        std::sync::OnceLock::new();
    LIVE_SEGS.get_or_init(Default::default)
}

fn register_live(seg: &Segment) {
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registering a plain `extern "C" fn()` that only touches process statics.
        unsafe { libc::atexit(retire_all_at_exit) };
    });
    let mut g = live().lock().unwrap_or_else(|p| p.into_inner());
    g.insert(seg.id.name(), seg.map.as_ptr() as usize);
}

fn unregister_live(name: &str) {
    let mut g = live().lock().unwrap_or_else(|p| p.into_inner());
    g.remove(name);
}

/// `atexit`: segments this process still owns (statics are never dropped) are marked freed
/// and unlinked, so a finished rank leaves nothing in `/dev/shm`. A killed rank leaves its
/// segments; the launcher removes `/dev/shm/ptxforge-{job}-*`.
extern "C" fn retire_all_at_exit() {
    let g = live().lock().unwrap_or_else(|p| p.into_inner());
    for (name, header) in g.iter() {
        // SAFETY: a registered header stays mapped until its Segment retires, which first
        // takes this lock to unregister it; we hold the lock.
        let h = unsafe { &*(*header as *const Header) };
        h.state.store(FREED, Ordering::Release);
        if let Ok(c) = CString::new(name.as_str()) {
            // SAFETY: FFI with a NUL-terminated name.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }
}

/// Next segment number of this process.
pub fn next_segment_number() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
