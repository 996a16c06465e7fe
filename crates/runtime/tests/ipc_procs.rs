//! Emulator memory across processes (issue 17, intra-node): this test binary re-runs itself as
//! a second process (the ignored test `ipc_child`, its role chosen by `PTXFORGE_IPC_ROLE`, in
//! an address slot of its own while the parent is in slot 0), and both run emulated kernels on the same
//! shared buffers, opened from IPC handles passed through the environment and stdout.
//!
//! Checked: message passing with `st.release.sys` / `ld.acquire.sys` (fresh random payloads,
//! many rounds), `atom`/`red` `.sys` adds from both processes summing exactly, a kernel reading
//! a buffer the other process filled (bit-exact), and the faults: a peer buffer freed by its
//! owner, an owner that exited or was killed, process-local memory of another process.
//!
//! With `PTXFORGE_TEST_CUDA=1` (`scripts/gpu-check.sh`) the first three run on CUDA device 0 in
//! both processes instead (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`); the fault checks are
//! the emulator's own and are skipped there. `cross_process_ipc_on_the_fake_cuda_driver` runs
//! those three through the fake driver (`crates/fakecuda`), whose `cuIpcOpenMemHandle` maps the
//! other process's shared segment.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runtime::{args, Buffer, Device, IpcHandle, LaunchConfig, Module, RuntimeError};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

#[path = "support/fakecuda.rs"]
mod fakecuda_support;

const THREADS: u32 = 64;
const ROUNDS: u32 = 100;
const ATOM_N: usize = 4096;
const FILL_N: usize = 5000;
/// Emulated ns the nanosleep waiter allows before calling its peer late.
const WAIT_LIMIT_NS: u64 = 20_000_000_000;

const KERNELS: &str = r#".version 8.0
.target sm_90a
.address_size 64

// For r = 1..rounds: wait until the consumer acknowledged round r-1, copy round r's 64 words
// from src into payload, then publish r in flag (release, system scope).
.visible .entry producer(.param .u64 src, .param .u64 payload, .param .u64 flag,
    .param .u64 ack, .param .u32 rounds)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [payload];
    ld.param.u64 %rd3, [flag];
    ld.param.u64 %rd4, [ack];
    ld.param.u32 %r7, [rounds];
    mov.u32 %r1, %tid.x;
    setp.eq.u32 %p1, %r1, 0;
    mov.u32 %r2, 0;
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd6, %rd2, %rd5;
LOOP:
    @!%p1 bra WAITED;
SPIN:
    ld.acquire.sys.global.u32 %r3, [%rd4];
    setp.lt.u32 %p2, %r3, %r2;
    @%p2 bra SPIN;
WAITED:
    bar.sync 0;
    mad.lo.u32 %r4, %r2, 64, %r1;
    mul.wide.u32 %rd7, %r4, 4;
    add.s64 %rd8, %rd1, %rd7;
    ld.global.u32 %r5, [%rd8];
    st.global.u32 [%rd6], %r5;
    bar.sync 0;
    add.u32 %r2, %r2, 1;
    @%p1 st.release.sys.global.u32 [%rd3], %r2;
    setp.lt.u32 %p3, %r2, %r7;
    @%p3 bra LOOP;
    ret;
}

// For r = 1..rounds: wait for flag >= r (acquire, system scope), copy the payload into
// out[r-1], then acknowledge r (red.release.sys).
.visible .entry consumer(.param .u64 out, .param .u64 payload, .param .u64 flag,
    .param .u64 ack, .param .u32 rounds)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [payload];
    ld.param.u64 %rd3, [flag];
    ld.param.u64 %rd4, [ack];
    ld.param.u32 %r7, [rounds];
    mov.u32 %r1, %tid.x;
    setp.eq.u32 %p1, %r1, 0;
    mov.u32 %r2, 0;
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd6, %rd2, %rd5;
LOOP:
    add.u32 %r6, %r2, 1;
    @!%p1 bra WAITED;
SPIN:
    ld.acquire.sys.global.u32 %r3, [%rd3];
    setp.lt.u32 %p2, %r3, %r6;
    @%p2 bra SPIN;
WAITED:
    bar.sync 0;
    ld.global.u32 %r5, [%rd6];
    mad.lo.u32 %r4, %r2, 64, %r1;
    mul.wide.u32 %rd7, %r4, 4;
    add.s64 %rd8, %rd1, %rd7;
    st.global.u32 [%rd8], %r5;
    bar.sync 0;
    mov.u32 %r2, %r6;
    @%p1 red.release.sys.global.add.u32 [%rd4], 1;
    setp.lt.u32 %p3, %r2, %r7;
    @%p3 bra LOOP;
    ret;
}

// Every CTA announces itself on go and waits for all `arrivals` (both processes), then adds
// vals[j] to c64[j % 8] (atom.add.u64) and to c32[j % 16] (red.add.u32: half-word CAS).
.visible .entry hammer(.param .u64 vals, .param .u64 c64, .param .u64 c32, .param .u64 go,
    .param .u32 n, .param .u32 arrivals)
{
    .reg .pred %p<4>;
    .reg .b32 %r<14>;
    .reg .b64 %rd<14>;
    ld.param.u64 %rd1, [vals];
    ld.param.u64 %rd2, [c64];
    ld.param.u64 %rd3, [c32];
    ld.param.u64 %rd4, [go];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r2, [arrivals];
    mov.u32 %r3, %tid.x;
    setp.eq.u32 %p1, %r3, 0;
    @!%p1 bra READY;
    atom.release.sys.global.add.u32 %r4, [%rd4], 1;
SPIN:
    ld.acquire.sys.global.u32 %r4, [%rd4];
    setp.lt.u32 %p2, %r4, %r2;
    @%p2 bra SPIN;
READY:
    bar.sync 0;
    mov.u32 %r5, %ctaid.x;
    mov.u32 %r6, %ntid.x;
    mov.u32 %r7, %nctaid.x;
    mad.lo.u32 %r8, %r5, %r6, %r3;
    mul.lo.u32 %r9, %r6, %r7;
LOOP:
    setp.ge.u32 %p3, %r8, %r1;
    @%p3 bra DONE;
    mul.wide.u32 %rd5, %r8, 4;
    add.s64 %rd6, %rd1, %rd5;
    ld.global.u32 %r10, [%rd6];
    and.b32 %r11, %r8, 7;
    mul.wide.u32 %rd7, %r11, 8;
    add.s64 %rd8, %rd2, %rd7;
    cvt.u64.u32 %rd9, %r10;
    atom.relaxed.sys.global.add.u64 %rd10, [%rd8], %rd9;
    and.b32 %r12, %r8, 15;
    mul.wide.u32 %rd11, %r12, 4;
    add.s64 %rd12, %rd3, %rd11;
    red.relaxed.sys.global.add.u32 [%rd12], %r10;
    add.u32 %r8, %r8, %r9;
    bra LOOP;
DONE:
    ret;
}

// Polls flag with nanosleep until it is non-zero (result[0] = the flag) or %globaltimer says
// more than `limit` ns passed (result[0] = all ones); result[1] = the ns that passed.
.visible .entry waiter(.param .u64 flag, .param .u64 result, .param .u64 limit)
{
    .reg .pred %p<3>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [result];
    ld.param.u64 %rd3, [limit];
    mov.u64 %rd4, %globaltimer;
LOOP:
    ld.acquire.sys.global.u32 %r1, [%rd1];
    mov.u64 %rd5, %globaltimer;
    sub.s64 %rd6, %rd5, %rd4;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra SEEN;
    setp.gt.u64 %p2, %rd6, %rd3;
    @%p2 bra LATE;
    nanosleep.u32 1000;
    bra LOOP;
SEEN:
    cvt.u64.u32 %rd7, %r1;
    bra OUT;
LATE:
    mov.u64 %rd7, -1;
OUT:
    st.global.u64 [%rd2], %rd7;
    st.global.u64 [%rd2+8], %rd6;
    ret;
}

// dst[i] = src[i] (32-bit words, copied as bits).
.visible .entry copy(.param .u64 src, .param .u64 dst, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra END;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.b32 %r6, [%rd4];
    add.s64 %rd5, %rd2, %rd3;
    st.global.b32 [%rd5], %r6;
END:
    ret;
}
"#;

/// Checks the kernels (validator; ptxas with 0 spills when installed) and loads them.
fn load(d: &Device) -> Module {
    let module = ptx::parse(KERNELS).expect("parse");
    let errors: Vec<_> = ptx::validate(&module)
        .into_iter()
        .filter(|d| d.is_error())
        .collect();
    assert!(errors.is_empty(), "validator: {errors:?}");
    if ptx::ptxas::ptxas_for_tests("ipc_procs kernels").is_some() {
        let rep = ptx::ptxas::assemble(KERNELS, "sm_90a", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}"));
        for k in &rep.kernels {
            assert_eq!(
                k.spill_stores_bytes + k.spill_loads_bytes,
                0,
                "{} spills",
                k.name
            );
        }
    }
    Module::load_ptx(d, KERNELS).expect("load")
}

/// CUDA device 0 under `PTXFORGE_TEST_CUDA=1`, else emulated device 0.
fn dev() -> Device {
    if cuda() {
        Device::cuda(0).expect("PTXFORGE_TEST_CUDA=1 but no CUDA device")
    } else {
        Device::emu(0)
    }
}

fn cuda() -> bool {
    std::env::var("PTXFORGE_TEST_CUDA").as_deref() == Ok("1")
}

/// A launch that must not hang the suite: a broken handshake fails after a minute.
fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        timeout: Some(Duration::from_secs(60)),
        ..LaunchConfig::linear(grid, block)
    }
}

fn rng_words(seed: u64, n: usize) -> Vec<u32> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen()).collect()
}

fn env_u64(k: &str) -> u64 {
    std::env::var(k).unwrap().parse().unwrap()
}

fn handles(k: &str) -> Vec<IpcHandle> {
    std::env::var(k)
        .unwrap()
        .split(',')
        .map(|t| IpcHandle::from_text(t).unwrap())
        .collect()
}

/// The error opening `h` gives (it must fail).
fn open_err(d: &Device, h: &IpcHandle) -> RuntimeError {
    match d.open_ipc::<u32>(h) {
        Ok(b) => panic!("{} opened at {:#x}", h.to_text(), b.device_ptr()),
        Err(e) => e,
    }
}

fn join(h: &[IpcHandle]) -> String {
    h.iter().map(|h| h.to_text()).collect::<Vec<_>>().join(",")
}

/// The second process: this binary running `ipc_child` in another address slot.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    /// Each test gives its children their own `slot`: two peers in one slot would overlap here.
    fn spawn(role: &str, slot: u32, env: &[(&str, String)]) -> Peer {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "ipc_child", "--ignored", "--nocapture"])
            .env("PTXFORGE_IPC_ROLE", role)
            .env("PTXFORGE_EMU_SLOT", slot.to_string())
            .env_remove("RANK")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("spawn the child process");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Peer {
            child,
            stdin,
            stdout,
        }
    }

    /// The payload of the next line the child prints starting with `tag `.
    fn expect(&mut self, tag: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the child exited before printing {tag}");
            if let Some(rest) = line.trim_end().strip_prefix(&format!("{tag} ")) {
                return rest.to_string();
            }
        }
    }

    fn say(&mut self, what: &str) {
        writeln!(self.stdin, "{what}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for the child; it must have passed.
    fn finish(mut self) {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        let st = self.child.wait().unwrap();
        assert!(st.success(), "child failed ({st}):\n{rest}");
    }
}

/// The roles of the second process (run by the tests below, never on its own).
#[test]
#[ignore = "the second process of the cross-process tests; they run it"]
fn ipc_child() {
    let role = std::env::var("PTXFORGE_IPC_ROLE").expect("PTXFORGE_IPC_ROLE");
    let d = dev();
    match role.as_str() {
        "producer" => child_producer(&d),
        "hammer" => child_hammer(&d),
        "filler" => child_filler(&d),
        "waiter" => child_waiter(&d),
        "open" => {
            let h = &handles("PTXFORGE_IPC_HANDLES")[0];
            match d.open_ipc::<u32>(h) {
                Ok(_) => println!("OPENED ok"),
                Err(e) => println!("OPENED error: {e}"),
            }
        }
        r => panic!("unknown role {r}"),
    }
}

fn child_producer(d: &Device) {
    let h = handles("PTXFORGE_IPC_HANDLES");
    let (payload, flag, ack) = (
        d.open_ipc::<u32>(&h[0]).unwrap(),
        d.open_ipc::<u32>(&h[1]).unwrap(),
        d.open_ipc::<u32>(&h[2]).unwrap(),
    );
    let src = d
        .upload(&rng_words(
            env_u64("PTXFORGE_IPC_SEED"),
            (THREADS * ROUNDS) as usize,
        ))
        .unwrap();
    let f = load(d).function("producer").unwrap();
    let s = d.default_stream();
    s.launch(
        &f,
        &cfg(1, THREADS),
        &args![&src, &payload, &flag, &ack, ROUNDS],
    )
    .unwrap();
    s.synchronize().unwrap();
    println!("DONE producer");
}

fn child_hammer(d: &Device) {
    let h = handles("PTXFORGE_IPC_HANDLES");
    let (c64, c32, go) = (
        d.open_ipc::<u64>(&h[0]).unwrap(),
        d.open_ipc::<u32>(&h[1]).unwrap(),
        d.open_ipc::<u32>(&h[2]).unwrap(),
    );
    let vals = d
        .upload(&rng_words(env_u64("PTXFORGE_IPC_SEED"), ATOM_N))
        .unwrap();
    run_hammer(d, &vals, &c64, &c32, &go);
    println!("DONE hammer");
}

fn child_waiter(d: &Device) {
    let flag = d
        .open_ipc::<u32>(&handles("PTXFORGE_IPC_HANDLES")[0])
        .unwrap();
    let result = d.alloc::<u64>(2).unwrap();
    result.fill(0x5a5a_5a5a_5a5a_5a5a).unwrap();
    let f = load(d).function("waiter").unwrap();
    let s = d.default_stream();
    s.launch(&f, &cfg(1, 1), &args![&flag, &result, WAIT_LIMIT_NS])
        .unwrap();
    s.synchronize().unwrap();
    let r = result.to_vec().unwrap();
    println!("WAITED {} {}", r[0] as i64, r[1]);
}

fn child_filler(d: &Device) {
    let words = rng_words(env_u64("PTXFORGE_IPC_SEED"), FILL_N);
    let buf = d.alloc_shared::<u32>(FILL_N).unwrap();
    buf.copy_from_host(&words).unwrap();
    println!("HANDLE {}", buf.ipc_handle().unwrap().to_text());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    if line.trim() == "free" {
        drop(buf);
        println!("FREED now");
        std::io::stdin().read_line(&mut line).unwrap();
    }
}

fn run_hammer(
    d: &Device,
    vals: &Buffer<u32>,
    c64: &Buffer<u64>,
    c32: &Buffer<u32>,
    go: &Buffer<u32>,
) {
    let f = load(d).function("hammer").unwrap();
    let s = d.default_stream();
    // 2 CTAs here and 2 in the other process
    let a = args![vals, c64, c32, go, ATOM_N as u32, 4u32];
    s.launch(&f, &cfg(2, 128), &a).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn release_acquire_message_passing_across_processes() {
    let d = dev();
    let seed: u64 = rand::thread_rng().gen();
    let payload = d.alloc_shared::<u32>(THREADS as usize).unwrap();
    payload.fill(0xdead_beef).unwrap();
    let flag = d.alloc_shared::<u32>(1).unwrap();
    let ack = d.alloc_shared::<u32>(1).unwrap();
    let hs = [&payload, &flag, &ack].map(|b| b.ipc_handle().unwrap());
    let out = d.alloc::<u32>((THREADS * ROUNDS) as usize).unwrap();
    out.fill(u32::MAX).unwrap(); // poisoned
    let peer = Peer::spawn(
        "producer",
        1,
        &[
            ("PTXFORGE_IPC_HANDLES", join(&hs)),
            ("PTXFORGE_IPC_SEED", seed.to_string()),
        ],
    );
    let f = load(&d).function("consumer").unwrap();
    let s = d.default_stream();
    s.launch(
        &f,
        &cfg(1, THREADS),
        &args![&out, &payload, &flag, &ack, ROUNDS],
    )
    .unwrap();
    s.synchronize().unwrap();
    peer.finish();
    let want = rng_words(seed, (THREADS * ROUNDS) as usize);
    let got = out.to_vec().unwrap();
    let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    assert_eq!(
        bad,
        0,
        "{bad} payload words differ (first round: {:?})",
        &got[..4]
    );
    assert_eq!(flag.to_vec().unwrap(), vec![ROUNDS]);
    assert_eq!(ack.to_vec().unwrap(), vec![ROUNDS]);
}

#[test]
fn system_scope_atomics_from_two_processes_sum_exactly() {
    let d = dev();
    let (mine, theirs): (u64, u64) = (rand::thread_rng().gen(), rand::thread_rng().gen());
    let init64: Vec<u64> = rng_words(mine ^ 1, 16)
        .chunks(2)
        .map(|c| (c[0] as u64) << 32 | c[1] as u64)
        .collect();
    let init32 = rng_words(mine ^ 2, 16);
    let c64 = d.alloc_shared::<u64>(8).unwrap();
    let c32 = d.alloc_shared::<u32>(16).unwrap();
    let go = d.alloc_shared::<u32>(1).unwrap();
    c64.copy_from_host(&init64).unwrap();
    c32.copy_from_host(&init32).unwrap();
    let hs = [
        c64.ipc_handle().unwrap(),
        c32.ipc_handle().unwrap(),
        go.ipc_handle().unwrap(),
    ];
    let peer = Peer::spawn(
        "hammer",
        2,
        &[
            ("PTXFORGE_IPC_HANDLES", join(&hs)),
            ("PTXFORGE_IPC_SEED", theirs.to_string()),
        ],
    );
    let vals = d.upload(&rng_words(mine, ATOM_N)).unwrap();
    run_hammer(&d, &vals, &c64, &c32, &go);
    peer.finish();
    // the reference: both processes' values added to the initial counters
    let (mut w64, mut w32) = (init64.clone(), init32.clone());
    for v in [rng_words(mine, ATOM_N), rng_words(theirs, ATOM_N)] {
        for (j, x) in v.iter().enumerate() {
            w64[j % 8] = w64[j % 8].wrapping_add(*x as u64);
            w32[j % 16] = w32[j % 16].wrapping_add(*x);
        }
    }
    assert_eq!(c64.to_vec().unwrap(), w64, "atom.add.u64 sums");
    assert_eq!(c32.to_vec().unwrap(), w32, "red.add.u32 sums");
    assert_eq!(go.to_vec().unwrap(), vec![4], "every CTA arrived once");
}

#[test]
fn a_kernel_reads_a_peer_filled_buffer_then_faults_once_the_peer_frees_it() {
    let d = dev();
    let seed: u64 = rand::thread_rng().gen();
    let mut peer = Peer::spawn("filler", 3, &[("PTXFORGE_IPC_SEED", seed.to_string())]);
    let h = IpcHandle::from_text(&peer.expect("HANDLE")).unwrap();
    assert_ne!(h.pid, std::process::id());
    let src = d.open_ipc::<u32>(&h).unwrap();
    if !cuda() {
        assert_eq!(Device::emu_address_slot(), 0);
        assert!(src.device_ptr() >= emu::memory::GLOBAL_BASE + emu::memory::SLOT_BYTES);
    }
    let dst = d.alloc::<u32>(FILL_N).unwrap();
    dst.fill(u32::MAX).unwrap();
    let m = load(&d);
    let f = m.function("copy").unwrap();
    let s = d.default_stream();
    let a = args![&src, &dst, FILL_N as u32];
    s.launch(&f, &cfg(FILL_N.div_ceil(256) as u32, 256), &a)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        dst.to_vec().unwrap(),
        rng_words(seed, FILL_N),
        "bit-exact copy"
    );
    if cuda() {
        drop(src); // cuIpcCloseMemHandle before the owner frees
        peer.say("exit");
        peer.finish();
        return;
    }
    // the owner frees it: the next launch faults (typed), host copies are refused
    peer.say("free");
    peer.expect("FREED");
    let e = s
        .launch(&f, &cfg(FILL_N.div_ceil(256) as u32, 256), &a)
        .and_then(|_| s.synchronize())
        .unwrap_err();
    match &e {
        RuntimeError::Emu(emu::EmuError::Fault { kind, .. }) => {
            assert!(
                matches!(kind, emu::error::FaultKind::OutOfBounds { .. }),
                "{e}"
            )
        }
        _ => panic!("expected a kernel fault, got {e}"),
    }
    let e = src.to_vec().unwrap_err();
    assert!(
        matches!(e, RuntimeError::Ipc { .. }) && e.to_string().contains("freed"),
        "{e}"
    );
    let e = open_err(&d, &h).to_string();
    assert!(
        e.contains("no such segment") && e.contains(&format!("pid {}", h.pid)),
        "{e}"
    );
    peer.say("exit");
    peer.finish();
}

#[test]
fn handles_of_exited_or_killed_owners_and_of_local_memory_are_refused() {
    if cuda() {
        eprintln!("skip: the emulator's segment lifetime checks");
        return;
    }
    let d = Device::emu(0);
    // an owner that exits normally unlinks its segments (atexit)
    let mut peer = Peer::spawn("filler", 4, &[("PTXFORGE_IPC_SEED", "1".into())]);
    let h = IpcHandle::from_text(&peer.expect("HANDLE")).unwrap();
    peer.say("exit");
    peer.finish();
    let e = open_err(&d, &h).to_string();
    assert!(e.contains("no such segment"), "{e}");
    // a killed owner leaves its segment (the launcher removes it): the dead pid is refused
    let mut peer = Peer::spawn("filler", 5, &[("PTXFORGE_IPC_SEED", "2".into())]);
    let h = IpcHandle::from_text(&peer.expect("HANDLE")).unwrap();
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();
    let e = open_err(&d, &h);
    let name = format!("/dev/shm/ptxforge-solo-p{}-0", h.pid);
    let left = std::path::Path::new(&name).exists();
    let _ = std::fs::remove_file(&name);
    assert!(
        left,
        "a killed owner's segment stays until the launcher removes it"
    );
    assert!(
        matches!(e, RuntimeError::Ipc { .. }) && e.to_string().contains("has exited"),
        "{e}"
    );
    // process-local memory of this process, opened by another
    let local = d.alloc::<u32>(8).unwrap();
    let hl = local.ipc_handle().unwrap();
    let mut peer = Peer::spawn("open", 6, &[("PTXFORGE_IPC_HANDLES", hl.to_text())]);
    let said = peer.expect("OPENED");
    peer.finish();
    assert!(said.contains("process-local memory"), "{said}");
}

#[test]
fn cross_process_ipc_on_the_fake_cuda_driver() {
    let Some(f) = fakecuda_support::FakeCuda::new("ipc") else {
        return;
    };
    let out = f
        .command(std::env::current_exe().unwrap())
        .args(["release_acquire", "system_scope", "a_kernel_reads"])
        .args(["--test-threads=1", "--nocapture"])
        .env("PTXFORGE_EMU_SHM", "1")
        .output()
        .expect("run the tests on the fake driver");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("3 passed"), "{text}");
}

/// A kernel waiting with `nanosleep` for a flag another process sets after a host delay: the
/// waiting process is quiet, but must not fast-forward emulated time (its peer runs on another
/// timeline), so its `%globaltimer` timeout does not fire while the peer is merely slow.
#[test]
fn a_nanosleep_wait_for_another_process_does_not_time_out_early() {
    if cuda() {
        eprintln!("skip: emulated time");
        return;
    }
    let d = Device::emu(0);
    let flag = d.alloc_shared::<u32>(1).unwrap();
    let h = flag.ipc_handle().unwrap();
    let mut peer = Peer::spawn("waiter", 7, &[("PTXFORGE_IPC_HANDLES", h.to_text())]);
    std::thread::sleep(Duration::from_millis(400)); // the child is waiting by now
    let v: u32 = rand::thread_rng().gen_range(1..u32::MAX);
    flag.copy_from_host(&[v]).unwrap();
    let said = peer.expect("WAITED");
    peer.finish();
    let f: Vec<i64> = said.split(' ').map(|x| x.parse().unwrap()).collect();
    assert_eq!(
        f[0], v as i64,
        "saw the flag, not a timeout after {} emulated ns",
        f[1]
    );
    assert!((f[1] as u64) < WAIT_LIMIT_NS, "{said}");
}
