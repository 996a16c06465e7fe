//! Shared-memory allocations and address slots (`emu::memory::shm`, `memory::peer`) inside one
//! process: two `GlobalMemory`s in different slots stand for two ranks (the cross-process tests
//! are in `crates/runtime/tests/ipc_procs.rs`). Every kernel result is checked against a CPU
//! reference on fresh random inputs, outputs poisoned before the launch.

#[path = "common/load.rs"]
mod load;

use emu::memory::{shm, GLOBAL_BASE, SLOT_BYTES, SLOT_COUNT};
use emu::{launch, Allocation, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::Rng;
use std::sync::Arc;

/// out[i] = 3 a[i] + 1; cnt[i % 4] += a[i] (atom.add.u64); bytes[i] = low byte of a[i]
/// (a masked sub-word store).
const MIX: &str = ".version 8.0\n.target sm_90a\n.address_size 64\n\
.visible .entry mix(.param .u64 a, .param .u64 out, .param .u64 cnt, .param .u64 bytes, \
.param .u32 n)\n{\n\
.reg .pred %p<2>;\n.reg .b32 %r<9>;\n.reg .b64 %rd<12>;\n\
ld.param.u64 %rd1, [a];\nld.param.u64 %rd2, [out];\nld.param.u64 %rd3, [cnt];\n\
ld.param.u64 %rd4, [bytes];\nld.param.u32 %r1, [n];\n\
mov.u32 %r2, %ctaid.x;\nmov.u32 %r3, %ntid.x;\nmov.u32 %r4, %tid.x;\n\
mad.lo.u32 %r5, %r2, %r3, %r4;\nsetp.ge.u32 %p1, %r5, %r1;\n@%p1 bra DONE;\n\
mul.wide.u32 %rd5, %r5, 4;\nadd.s64 %rd6, %rd1, %rd5;\nld.global.u32 %r6, [%rd6];\n\
mad.lo.u32 %r7, %r6, 3, 1;\nadd.s64 %rd7, %rd2, %rd5;\nst.global.u32 [%rd7], %r7;\n\
and.b32 %r8, %r5, 3;\nmul.wide.u32 %rd8, %r8, 8;\nadd.s64 %rd9, %rd3, %rd8;\n\
cvt.u64.u32 %rd10, %r6;\natom.global.add.u64 %rd11, [%rd9], %rd10;\n\
cvt.u64.u32 %rd10, %r5;\nadd.s64 %rd9, %rd4, %rd10;\nst.global.u8 [%rd9], %r6;\n\
DONE:\nret;\n}\n";

const N: usize = 300;

struct Bufs {
    a: Arc<Allocation>,
    out: Arc<Allocation>,
    cnt: Arc<Allocation>,
    bytes: Arc<Allocation>,
}

fn load(mem: &GlobalMemory) -> LoadedModule {
    load::load_checked(mem, MIX, &["sm_90a"], "shm mix")
}

/// Allocates the buffers (`shared`: in segments), a = fresh random, outputs poisoned.
fn bufs(mem: &GlobalMemory, shared: bool, a: &[u32]) -> Bufs {
    let al = |n: u64| {
        if shared {
            mem.alloc_shared(n, 0).unwrap()
        } else {
            mem.alloc(n, 0).unwrap()
        }
    };
    let b = Bufs {
        a: al(4 * N as u64),
        out: al(4 * N as u64),
        cnt: al(32),
        bytes: al(N as u64),
    };
    b.a.write_bytes(0, &le(a));
    b.out.fill(0, 4 * N as u64, &[0xff]);
    b.cnt.write_bytes(0, &[0u8; 32]);
    b.bytes.fill(0, N as u64, &[0xa5]);
    b
}

fn le(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn words<const W: usize>(a: &Allocation, n: usize) -> Vec<[u8; W]> {
    let mut b = vec![0u8; n * W];
    a.read_bytes(0, &mut b);
    b.chunks_exact(W).map(|c| c.try_into().unwrap()).collect()
}

fn run_mix(mem: &GlobalMemory, m: &LoadedModule, b: &Bufs) -> Result<(), emu::EmuError> {
    let mut p = Vec::new();
    for x in [&b.a, &b.out, &b.cnt, &b.bytes] {
        p.extend_from_slice(&x.base.to_le_bytes());
    }
    p.extend_from_slice(&(N as u32).to_le_bytes());
    launch(
        m.kernel("mix").unwrap(),
        mem.snapshot(),
        p,
        &LaunchConfig::linear(3, 128),
        &LaunchOptions::default(),
    )
    .map(|_| ())
}

/// Checks the outputs against the CPU reference of `a`.
fn check(b: &Bufs, a: &[u32]) {
    let out: Vec<u32> = words::<4>(&b.out, N)
        .into_iter()
        .map(u32::from_le_bytes)
        .collect();
    let want: Vec<u32> = a
        .iter()
        .map(|x| x.wrapping_mul(3).wrapping_add(1))
        .collect();
    assert_eq!(out, want, "out = 3a + 1");
    let cnt: Vec<u64> = words::<8>(&b.cnt, 4)
        .into_iter()
        .map(u64::from_le_bytes)
        .collect();
    let mut sums = [0u64; 4];
    for (i, x) in a.iter().enumerate() {
        sums[i % 4] += *x as u64;
    }
    assert_eq!(cnt, sums, "atomic sums");
    let mut bytes = vec![0u8; N];
    b.bytes.read_bytes(0, &mut bytes);
    let lo: Vec<u8> = a.iter().map(|x| *x as u8).collect();
    assert_eq!(bytes, lo, "byte stores");
}

fn random(n: usize) -> Vec<u32> {
    let mut r = rand::thread_rng();
    (0..n).map(|_| r.gen()).collect()
}

fn segment_file(a: &Allocation) -> String {
    let name = a.segment().expect("a shared allocation").id().name();
    format!("/dev/shm{name}")
}

#[test]
fn shared_allocations_compute_like_process_local_ones() {
    let a = random(N);
    for shared in [false, true] {
        let mem = GlobalMemory::new();
        let m = load(&mem);
        let b = bufs(&mem, shared, &a);
        assert_eq!(b.out.segment().is_some(), shared);
        run_mix(&mem, &m, &b).unwrap();
        check(&b, &a);
        if shared {
            // the words live in the segment, after its 4 KiB header page
            let file = segment_file(&b.out);
            let raw = std::fs::read(&file).unwrap();
            let mut mine = vec![0u8; 4 * N];
            b.out.read_bytes(0, &mut mine);
            assert_eq!(
                &raw[shm::HEADER_BYTES..shm::HEADER_BYTES + 4 * N],
                &mine[..]
            );
            mem.free(b.out.base);
            assert!(!std::path::Path::new(&file).exists(), "free unlinks {file}");
        }
    }
}

#[test]
fn the_process_wide_switch_makes_every_allocation_shared() {
    let mem = GlobalMemory::new();
    mem.set_shared_default(true);
    let x = mem.alloc(64, 0).unwrap();
    let file = segment_file(&x);
    assert!(std::path::Path::new(&file).exists(), "{file}");
    assert!(file.starts_with(&format!("/dev/shm/ptxforge-solo-p{}-", std::process::id())));
    mem.set_shared_default(false);
    assert!(mem.alloc(64, 0).unwrap().segment().is_none());
    drop(x);
    mem.free(GLOBAL_BASE);
    assert!(!std::path::Path::new(&file).exists(), "{file}");
}

#[test]
fn a_slot_moves_every_address_and_kernels_run_there() {
    let mem = GlobalMemory::new();
    mem.set_address_slot(4095).unwrap();
    assert_eq!(mem.address_slot(), 4095);
    let m = load(&mem);
    let a = random(N);
    let b = bufs(&mem, false, &a);
    let lo = GLOBAL_BASE + 4095 * SLOT_BYTES;
    assert!(
        b.a.base >= lo && b.bytes.base < lo + SLOT_BYTES,
        "{:#x}",
        b.a.base
    );
    run_mix(&mem, &m, &b).unwrap();
    check(&b, &a);
    let e = mem.set_address_slot(3).unwrap_err().to_string();
    assert!(e.contains("slot") && e.contains("after allocating"), "{e}");
    let e = GlobalMemory::new()
        .set_address_slot(SLOT_COUNT)
        .unwrap_err()
        .to_string();
    assert!(e.contains("slot: 4096"), "{e}");
}

/// Two address spaces standing for two ranks: A in slot 1, B in slot 2.
fn two_ranks() -> (GlobalMemory, GlobalMemory) {
    let (a, b) = (GlobalMemory::new(), GlobalMemory::new());
    a.set_address_slot(1).unwrap();
    b.set_address_slot(2).unwrap();
    (a, b)
}

#[test]
fn a_peer_segment_maps_at_the_exporters_address() {
    let (ma, mb) = two_ranks();
    let a = random(N);
    let ba = bufs(&ma, true, &a);
    // B maps A's four buffers and runs the kernel on them: the same pointers in both
    let open = |x: &Arc<Allocation>| mb.open_shared(&x.shared_spec().unwrap()).unwrap();
    let bb = Bufs {
        a: open(&ba.a),
        out: open(&ba.out),
        cnt: open(&ba.cnt),
        bytes: open(&ba.bytes),
    };
    assert_eq!(bb.out.base, ba.out.base);
    let m = load(&mb);
    run_mix(&mb, &m, &bb).unwrap();
    check(&ba, &a); // A sees what B's kernel wrote
                    // a second open of the same segment is the same mapping, counted
    let again = mb.open_shared(&ba.out.shared_spec().unwrap()).unwrap();
    assert!(Arc::ptr_eq(&again, &bb.out));
    mb.close_shared(ba.out.base);
    assert!(
        mb.snapshot().find(ba.out.base, 4).is_some(),
        "one open left"
    );
    mb.close_shared(ba.out.base);
    assert!(mb.snapshot().find(ba.out.base, 4).is_none(), "closed");
}

#[test]
fn overlapping_or_own_slot_segments_are_refused() {
    let (ma, mb) = two_ranks();
    let x = ma.alloc_shared(256, 0).unwrap();
    // A itself: the range lies in A's own slot
    let e = ma.open_shared(&x.shared_spec().unwrap()).unwrap_err();
    assert!(e.to_string().contains("own slot 1"), "{e}");
    // a second "rank" wrongly given slot 1 too: its segment has the same address as A's
    let twin = GlobalMemory::new();
    twin.set_address_slot(1).unwrap();
    let y = twin.alloc_shared(256, 0).unwrap();
    assert_eq!(x.base, y.base);
    mb.open_shared(&x.shared_spec().unwrap()).unwrap();
    let e = mb.open_shared(&y.shared_spec().unwrap()).unwrap_err();
    assert!(e.to_string().contains("overlaps the allocation"), "{e}");
    // a handle that does not match the segment's header
    let mut bad = y.shared_spec().unwrap();
    bad.size = 128;
    let mc = GlobalMemory::new();
    mc.set_address_slot(3).unwrap();
    let e = mc.open_shared(&bad).unwrap_err();
    assert!(e.to_string().contains("the handle says"), "{e}");
}

#[test]
fn a_freed_peer_buffer_faults_at_the_next_launch() {
    let (ma, mb) = two_ranks();
    let a = random(N);
    let ba = bufs(&ma, true, &a);
    let open = |x: &Arc<Allocation>| mb.open_shared(&x.shared_spec().unwrap()).unwrap();
    let bb = Bufs {
        a: open(&ba.a),
        out: open(&ba.out),
        cnt: open(&ba.cnt),
        bytes: open(&ba.bytes),
    };
    let spec = ba.out.shared_spec().unwrap();
    let m = load(&mb);
    ma.free(ba.out.base);
    assert!(bb.out.peer_freed());
    let e = run_mix(&mb, &m, &bb).unwrap_err();
    match e.fault() {
        Some(emu::error::FaultKind::OutOfBounds { addr, .. }) => {
            assert!(
                *addr >= ba.out.base && *addr < ba.out.base + 4 * N as u64,
                "{e}"
            )
        }
        other => panic!("expected an out-of-bounds fault, got {other:?}: {e}"),
    }
    // the pages are still mapped here (no SIGBUS on host access), and the name is gone
    let mut b = [0u8; 4];
    bb.out.read_bytes(0, &mut b);
    let e = mb.open_shared(&spec).unwrap_err().to_string();
    assert!(e.contains("no such segment"), "{e}");
}

#[test]
fn job_ids_must_fit_a_segment_name() {
    shm::check_job_id("job_17.a").unwrap();
    for bad in ["", "a/b", "a-b", &"x".repeat(shm::MAX_JOB_ID + 1)] {
        let e = shm::check_job_id(bad).unwrap_err().to_string();
        assert!(e.contains("PTXFORGE_JOB_ID"), "{e}");
    }
}

#[test]
fn allocations_made_after_opening_a_higher_slot_peer_are_found() {
    let (ma, mb) = two_ranks();
    let a = random(N);
    // A (slot 1) maps B's (slot 2) buffer: it lies above every address A hands out
    let bb = bufs(&mb, true, &a);
    let peer_in = ma.open_shared(&bb.a.shared_spec().unwrap()).unwrap();
    let mine = bufs(&ma, false, &random(N));
    let ba = Bufs {
        a: peer_in,
        out: mine.out,
        cnt: mine.cnt,
        bytes: mine.bytes,
    };
    let m = load(&ma);
    run_mix(&ma, &m, &ba).unwrap();
    check(&ba, &a);
}

#[test]
fn a_stale_segment_of_a_dead_process_with_our_pid_is_replaced() {
    // a job name no other test uses, so the file below collides with nothing live
    let id = shm::SegmentId {
        job: "stalecheck".into(),
        pid: std::process::id(),
        n: 0,
    };
    let file = format!("/dev/shm{}", id.name());
    // what a killed earlier process with this pid would have left
    std::fs::write(&file, [0x77u8; 5000]).unwrap();
    let seg = shm::Segment::create(id, GLOBAL_BASE, 16, 0);
    let raw = std::fs::read(&file);
    drop(seg);
    let raw = raw.unwrap();
    assert_eq!(raw.len(), shm::HEADER_BYTES + 16, "a fresh segment");
    assert_eq!(&raw[shm::HEADER_BYTES..], &[0u8; 16], "zeroed words");
    assert!(
        !std::path::Path::new(&file).exists(),
        "dropping the owner unlinks it"
    );
}
