//! Runtime checks of the patterns communication kernels rely on: CTAs and devices that wait for
//! each other through memory make progress; bugs become diagnostics, not hangs or crashes.

use runtime::{args, Device, LaunchConfig, Module, SmPartition};
use std::time::Duration;

const HEADER: &str = ".version 8.0\n.target sm_90\n.address_size 64\n";

/// CTA 1 spins until CTA 0 sets a flag, then copies the value CTA 0 wrote.
const SPIN: &str = r#"
.visible .entry spin(.param .u64 flag, .param .u64 data, .param .u64 out, .param .u32 value)
{
    .reg .pred %p<3>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [data];
    ld.param.u64 %rd3, [out];
    ld.param.u32 %r5, [value];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %tid.x;
    setp.ne.u32 %p1, %r2, 0;
    @%p1 bra END;
    setp.eq.u32 %p2, %r1, 0;
    @%p2 bra PRODUCER;
WAIT:
    ld.acquire.gpu.global.u32 %r3, [%rd1];
    setp.eq.u32 %p1, %r3, 0;
    @%p1 bra WAIT;
    ld.global.u32 %r4, [%rd2];
    st.global.u32 [%rd3], %r4;
    bra END;
PRODUCER:
    // Give the consumer time to start spinning first.
    mov.u32 %r6, 0;
DELAY:
    add.u32 %r6, %r6, 1;
    setp.lt.u32 %p1, %r6, 2000;
    @%p1 bra DELAY;
    st.global.u32 [%rd2], %r5;
    st.release.gpu.global.u32 [%rd1], 1;
END:
    ret;
}
"#;

#[test]
fn cta_spinning_on_another_ctas_flag_completes() {
    let dev = Device::emu(0);
    let m = Module::load_ptx(&dev, &format!("{HEADER}{SPIN}")).unwrap();
    let f = m.function("spin").unwrap();
    let flag = dev.alloc::<u32>(1).unwrap();
    let data = dev.alloc::<u32>(1).unwrap();
    let out = dev.alloc::<u32>(1).unwrap();
    out.fill(0xdead_beef).unwrap();
    let v = 0x1234_5678u32 ^ (std::process::id());
    // Launch CTA 1 first in the order: grid of 2, both resident.
    let s = dev.default_stream();
    s.launch(
        &f,
        &LaunchConfig::linear(2, 32).timeout(Duration::from_secs(60)),
        &args![&flag, &data, &out, v],
    )
    .unwrap();
    s.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap()[0], v);
}

const PEER: &str = r#"
.visible .entry consumer(.param .u64 flag, .param .u64 data, .param .u64 out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [data];
    ld.param.u64 %rd3, [out];
W:
    ld.acquire.sys.global.u32 %r1, [%rd1];
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra W;
    ld.global.u32 %r2, [%rd2];
    st.global.u32 [%rd3], %r2;
    ret;
}
.visible .entry producer(.param .u64 flag, .param .u64 data, .param .u32 value)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [data];
    ld.param.u32 %r1, [value];
    st.global.u32 [%rd2], %r1;
    st.release.sys.global.u32 [%rd1], 1;
    ret;
}
"#;

#[test]
fn device_writes_peer_buffer_while_peer_waits() {
    let d0 = Device::emu(10);
    let d1 = Device::emu(11);
    let m0 = Module::load_ptx(&d0, &format!("{HEADER}{PEER}")).unwrap();
    let m1 = Module::load_ptx(&d1, &format!("{HEADER}{PEER}")).unwrap();
    // All three buffers live on device 1; device 0 writes two of them through peer pointers.
    let flag = d1.alloc::<u32>(1).unwrap();
    let data = d1.alloc::<u32>(1).unwrap();
    let out = d1.alloc::<u32>(1).unwrap();
    out.fill(0xdead_beef).unwrap();
    let v = 0x00c0_ffeeu32 ^ std::process::id();
    let cfg = LaunchConfig::linear(1, 32).timeout(Duration::from_secs(60));
    // Device 1 starts waiting first.
    let s1 = d1.stream(0);
    s1.launch(
        &m1.function("consumer").unwrap(),
        &cfg,
        &args![&flag, &data, &out],
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let s0 = d0.stream(0);
    let (fp, dp) = (flag.peer_ptr(&d0).unwrap(), data.peer_ptr(&d0).unwrap());
    s0.launch(
        &m0.function("producer").unwrap(),
        &cfg,
        &args![runtime::Arg::Ptr(fp), runtime::Arg::Ptr(dp), v],
    )
    .unwrap();
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap()[0], v);
}

/// Warp 0 waits at barrier 1, warp 1 at barrier 2: neither completes.
const DEADLOCK: &str = r#"
.visible .entry deadlock(.param .u64 out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    mov.u32 %r1, %tid.x;
    setp.lt.u32 %p1, %r1, 32;
    @%p1 bra A;
    bar.sync 2, 64;
    ret;
A:
    bar.sync 1, 64;
    ret;
}
"#;

#[test]
fn barrier_never_reached_is_a_diagnostic() {
    let dev = Device::emu(1);
    let m = Module::load_ptx(&dev, &format!("{HEADER}{DEADLOCK}")).unwrap();
    let f = m.function("deadlock").unwrap();
    let out = dev.alloc::<u32>(1).unwrap();
    let s = dev.stream(0);
    s.launch(&f, &LaunchConfig::linear(1, 64), &args![&out])
        .unwrap();
    let e = s.synchronize().unwrap_err().to_string();
    assert!(
        e.contains("barrier deadlock") && e.contains("deadlock") && e.contains("CTA (0,0,0)"),
        "{e}"
    );
    assert!(e.contains("PTX line"), "{e}");
}

const HANG: &str = r#"
.visible .entry hang(.param .u64 flag)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [flag];
L:
    ld.volatile.global.u32 %r1, [%rd1];
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra L;
    ret;
}
"#;

#[test]
fn kernel_waiting_forever_is_stopped() {
    let dev = Device::emu(2);
    let m = Module::load_ptx(&dev, &format!("{HEADER}{HANG}")).unwrap();
    let f = m.function("hang").unwrap();
    let flag = dev.alloc::<u32>(1).unwrap();
    let s = dev.stream(0);
    let mut cfg = LaunchConfig::linear(1, 32);
    cfg.max_warp_instructions = Some(200_000);
    s.launch(&f, &cfg, &args![&flag]).unwrap();
    let e = s.synchronize().unwrap_err().to_string();
    assert!(
        e.contains("budget") && e.contains("hang") && e.contains("PTX line"),
        "{e}"
    );
}

#[test]
fn budgeted_launch_stays_on_its_sms() {
    let dev = Device::emu(0);
    let m = Module::load_ptx(&dev, &format!("{HEADER}{SMID}")).unwrap();
    let f = m.function("smid").unwrap();
    let out = dev.alloc::<u32>(200).unwrap();
    let s = dev.stream(0);
    let cfg = LaunchConfig::linear(200, 32).budget(SmPartition {
        offset: 112,
        count: 20,
    });
    s.launch(&f, &cfg, &args![&out]).unwrap();
    s.synchronize().unwrap();
    let v = out.to_vec().unwrap();
    let mut seen: Vec<u32> = v.clone();
    seen.sort();
    seen.dedup();
    assert!(v.iter().all(|&sm| (112..132).contains(&sm)), "{seen:?}");
    assert!(seen.len() <= 20);
    let st = s.last_stats().unwrap();
    assert!(st.sms_used.iter().all(|&x| (112..132).contains(&x)));
}

const SMID: &str = r#"
.visible .entry smid(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra E;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %smid;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r3;
E:
    ret;
}
"#;
