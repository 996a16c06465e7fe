//! Backend-neutral API checks that run here (emulator; CUDA absent), plus a CUDA module gated by
//! `PTXFORGE_TEST_CUDA=1` (see `scripts/gpu-check.sh`).

use runtime::tensor_map::{Im2col, Interleave, OobFill, Swizzle, TensorDataType};
use runtime::{
    args, Device, IpcHandle, LaunchConfig, Module, PartitionKind, RuntimeError, TensorMap,
};
use std::time::Duration;

#[path = "support/fakecuda.rs"]
mod fakecuda_support;
use fakecuda_support::FakeCuda;

const HEADER: &str = ".version 8.0\n.target sm_90\n.address_size 64\n";

const ADD: &str = r#"
.visible .entry add1(.param .u64 p, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r2, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r2, %r1;
    @%p1 bra END;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    ld.global.u32 %r5, [%rd3];
    add.u32 %r5, %r5, 1;
    st.global.u32 [%rd3], %r5;
END:
    ret;
}
"#;

#[test]
fn cuda_device_is_unavailable_with_a_clear_message_here() {
    if std::env::var("PTXFORGE_TEST_CUDA").as_deref() == Ok("1") {
        eprintln!("skip: PTXFORGE_TEST_CUDA=1 (a GPU is expected)");
        return;
    }
    match Device::cuda(0) {
        Err(RuntimeError::CudaUnavailable(m)) => {
            assert!(
                m.contains("libcuda.so not found")
                    || m.contains("no CUDA devices")
                    || m.contains("cuInit"),
                "{m}"
            )
        }
        Err(e) => panic!("expected CudaUnavailable, got {e}"),
        Ok(_) => eprintln!("note: a CUDA device is present"),
    }
    let e = Device::from_name("cuda:1")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.is_empty() || e.starts_with("CUDA backend unavailable") || e.starts_with("no device"),
        "{e}"
    );
    let (list, why) = Device::list();
    assert!(!list.is_empty());
    if Device::cuda_count() == 0 {
        assert!(why.is_some());
    }
}

#[test]
fn graph_capture_replays_on_the_emulator() {
    let dev = Device::emu(20);
    let m = Module::load_ptx(&dev, &format!("{HEADER}{ADD}")).unwrap();
    let f = m.function("add1").unwrap();
    let buf = dev.upload(&[10u32; 100]).unwrap();
    let s = dev.stream(0);
    s.begin_capture().unwrap();
    assert!(s.is_capturing());
    let cfg = LaunchConfig::linear(4, 32);
    s.launch(&f, &cfg, &args![&buf, 100u32]).unwrap();
    s.launch(&f, &cfg, &args![&buf, 50u32]).unwrap();
    // Bad arguments fail at capture time.
    assert!(s.launch(&f, &cfg, &args![&buf]).is_err());
    let g = s.end_capture().unwrap();
    assert_eq!(g.len(), Some(2));
    s.synchronize().unwrap();
    assert_eq!(
        buf.to_vec().unwrap()[0],
        10,
        "capture must not run the launches"
    );
    g.launch(&s).unwrap();
    g.launch(&s).unwrap();
    s.synchronize().unwrap();
    let v = buf.to_vec().unwrap();
    assert_eq!(v[0], 14);
    assert_eq!(v[99], 12);
    assert!(s.end_capture().is_err());
}

#[test]
fn ipc_handles_open_in_process_on_the_emulator() {
    let d0 = Device::emu(21);
    let d1 = Device::emu(22);
    let a = d0.upload(&[1u32, 2, 3, 4]).unwrap();
    let h = a.ipc_handle().unwrap();
    let h2 = IpcHandle::from_text(&h.to_text()).unwrap();
    assert_eq!(h, h2);
    let b = d1.open_ipc::<u32>(&h2).unwrap();
    assert_eq!(b.device_ptr(), a.device_ptr());
    assert_eq!(b.to_vec().unwrap(), vec![1, 2, 3, 4]);
    b.copy_from_host(&[9, 9]).unwrap();
    drop(b); // not the owner: the memory stays
    assert_eq!(a.to_vec().unwrap(), vec![9, 9, 3, 4]);
    let wrong = d1.open_ipc::<u32>(&IpcHandle {
        pid: h.pid + 1,
        ..h
    });
    assert!(wrong.is_err());
    drop(a);
    assert!(
        d1.open_ipc::<u32>(&h).is_err(),
        "freed memory cannot be opened"
    );
}

const SMID_SPIN: &str = r#"
.visible .entry smid_spin(.param .u64 out, .param .u32 iters)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r5, [iters];
    mov.u32 %r6, 0;
L:
    add.u32 %r6, %r6, 1;
    setp.lt.u32 %p1, %r6, %r5;
    @%p1 bra L;
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

#[test]
fn partitions_run_concurrently_on_disjoint_sms_on_the_emulator() {
    let dev = Device::emu(23);
    let (comm, compute) = dev.partition(16).unwrap();
    assert_eq!(*comm.kind(), PartitionKind::Emulated);
    assert_eq!(comm.sms().count, 16);
    assert_eq!(compute.sms().count, 132 - 16);
    assert!(dev.partition(0).is_err() && dev.partition(132).is_err());
    let m = Module::load_ptx(&dev, &format!("{HEADER}{SMID_SPIN}")).unwrap();
    let f = m.function("smid_spin").unwrap();
    let (cs, ks) = (comm.stream().unwrap(), compute.stream().unwrap());
    assert!(cs.priority() > ks.priority());
    let oc = dev.alloc::<u32>(64).unwrap();
    let ok = dev.alloc::<u32>(256).unwrap();
    let cfg = |n| LaunchConfig::linear(n, 32).timeout(Duration::from_secs(60));
    let t = std::time::Instant::now();
    cs.launch(&f, &cfg(64), &args![&oc, 20_000u32]).unwrap();
    ks.launch(&f, &cfg(256), &args![&ok, 20_000u32]).unwrap();
    cs.synchronize().unwrap();
    ks.synchronize().unwrap();
    let _ = t.elapsed();
    let a = cs.last_stats().unwrap().sms_used;
    let b = ks.last_stats().unwrap().sms_used;
    assert!(a.iter().all(|x| (116..132).contains(x)), "{a:?}");
    assert!(b.iter().all(|x| *x < 116), "{b:?}");
    assert!(a.iter().all(|x| !b.contains(x)));
    // The %smid each CTA saw agrees with the stats, and the diagnostic reports the same range.
    assert!(oc.to_vec().unwrap().iter().all(|x| a.contains(x)));
    let seen = runtime::sms_used(&cs, &LaunchConfig::linear(64, 32)).unwrap();
    assert!(
        seen.iter().all(|x| (116..132).contains(x)) && !seen.is_empty(),
        "{seen:?}"
    );
}

#[test]
fn partition_streams_overlap_in_time_on_the_emulator() {
    // A comm kernel spins on a flag that only the compute kernel sets: both must be running.
    const FLAG: &str = r#"
.visible .entry waiter(.param .u64 flag)
{
    .reg .pred %p<2>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [flag];
W:
    ld.acquire.gpu.global.u32 %r1, [%rd1];
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra W;
    ret;
}
.visible .entry setter(.param .u64 flag)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [flag];
    st.release.gpu.global.u32 [%rd1], 1;
    ret;
}
"#;
    let dev = Device::emu(24);
    let (comm, compute) = dev.partition(8).unwrap();
    let m = Module::load_ptx(&dev, &format!("{HEADER}{FLAG}")).unwrap();
    let flag = dev.alloc::<u32>(1).unwrap();
    let cfg = LaunchConfig::linear(1, 32).timeout(Duration::from_secs(60));
    let cs = comm.stream().unwrap();
    let ks = compute.stream().unwrap();
    cs.launch(&m.function("waiter").unwrap(), &cfg, &args![&flag])
        .unwrap();
    ks.launch(&m.function("setter").unwrap(), &cfg, &args![&flag])
        .unwrap();
    ks.synchronize().unwrap();
    cs.synchronize().unwrap();
}

/// A kernel on the comm partition's stream spins until the compute partition's stream queues a
/// fill that sets the flag; the compute stream's upload, read and byte copy must complete
/// meanwhile (device-wide `Buffer` copies would wait for the spinning kernel). The spin is
/// bounded (it then records 0xbad instead of the flag) so a wrong implementation fails instead
/// of hanging.
pub(crate) fn stream_ordered_ops(dev: &Device) {
    const WAIT: &str = r#"
.visible .entry waiter(.param .u64 flag, .param .u64 out)
{
    .reg .pred %p<3>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [out];
    mov.u32 %r3, 0;
W:
    ld.acquire.gpu.global.u32 %r1, [%rd1];
    add.u32 %r3, %r3, 1;
    setp.gt.u32 %p2, %r3, 50000000;
    @%p2 bra GIVEUP;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra W;
    st.global.u32 [%rd2], %r1;
    ret;
GIVEUP:
    st.global.u32 [%rd2], 2989;
    ret;
}
"#;
    let (comm, compute) = dev.partition(8).unwrap();
    let m = Module::load_ptx(dev, &format!("{HEADER}{WAIT}")).unwrap();
    let cs = comm.stream().unwrap();
    let ks = compute.stream().unwrap();
    let flag = ks.upload(&[0u32]).unwrap();
    let out = ks.upload(&[0u32]).unwrap();
    ks.synchronize().unwrap();
    let cfg = LaunchConfig::linear(1, 32).timeout(Duration::from_secs(60));
    cs.launch(&m.function("waiter").unwrap(), &cfg, &args![&flag, &out])
        .unwrap();
    let data: Vec<u16> = (0..64).map(|i| (i * 977 % 65521) as u16).collect();
    let a = ks.upload(&data).unwrap();
    let b = dev.alloc::<u8>(128).unwrap();
    ks.fill(&b, 0xee).unwrap();
    assert_eq!(ks.read(&b).unwrap(), vec![0xee; 128]);
    ks.copy_bytes(&a, &b).unwrap();
    let got = ks.read(&b).unwrap();
    let want: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(got, want);
    let c = dev.alloc::<u32>(5).unwrap();
    ks.fill(&c, 0xdead_beef).unwrap();
    assert_eq!(ks.read(&c).unwrap(), vec![0xdead_beef; 5]);
    assert!(ks.copy_bytes(&a, &c).is_err()); // 128 bytes do not fit in 20
    ks.fill(&flag, 1).unwrap();
    ks.synchronize().unwrap();
    cs.synchronize().unwrap();
    assert_eq!(
        cs.read(&out).unwrap(),
        vec![1],
        "the waiter gave up: the fill never landed"
    );
}

#[test]
fn stream_ordered_host_ops_do_not_wait_for_other_streams() {
    stream_ordered_ops(&Device::emu(27));
}

#[test]
fn async_copies_and_events_on_the_emulator() {
    let dev = Device::emu(25);
    let buf = dev.alloc::<u32>(8).unwrap();
    let s = dev.stream(0);
    let e0 = s.record().unwrap();
    s.copy_to_device(&buf, &[7u32; 8]).unwrap();
    let e1 = s.record().unwrap();
    s.synchronize().unwrap();
    assert!(e1.is_complete());
    let _ = e1.elapsed_since(&e0);
    assert_eq!(buf.to_vec().unwrap(), vec![7; 8]);
    assert!(s.copy_to_device(&buf, &[0u32; 9]).is_err());
}

#[test]
fn param_offsets_follow_alignment() {
    let dev = Device::emu(26);
    let m = Module::load_ptx(
        &dev,
        &format!("{HEADER}.visible .entry k(.param .u8 a, .param .u64 b, .param .u32 c, .param .u16 d, .param .f64 e)\n{{\n    ret;\n}}\n"),
    )
    .unwrap();
    let f = m.function("k").unwrap();
    assert_eq!(f.param_offsets(), vec![0, 8, 16, 20, 24]);
    let packed = f.pack_args(&args![1u8, 2u64, 3u32, 4u16, 5.0f64]).unwrap();
    assert_eq!(packed.len(), 32);
}

fn tm() -> TensorMap {
    TensorMap::tiled(TensorDataType::F16, 0x10000, &[1024, 512], &[64, 32])
}

#[test]
fn tensor_map_validation_follows_the_driver_rules() {
    let ok = tm();
    ok.validate().unwrap();
    assert_eq!(ok.global_strides, vec![2048]);
    assert_eq!(ok.box_bytes(), 64 * 32 * 2);
    let bad = |t: TensorMap, what: &str| {
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains(what), "expected `{what}` in `{e}`");
    };
    bad(
        TensorMap {
            global_address: 0x10008,
            ..tm()
        },
        "16-byte aligned",
    );
    bad(
        TensorMap {
            global_dims: vec![1; 6],
            global_strides: vec![16; 5],
            box_dims: vec![1; 6],
            element_strides: vec![1; 6],
            ..tm()
        },
        "rank 6",
    );
    bad(
        TensorMap {
            global_strides: vec![2056],
            ..tm()
        },
        "multiple of 16",
    );
    bad(
        TensorMap {
            global_strides: vec![1024],
            ..tm()
        },
        "smaller than",
    );
    bad(
        TensorMap {
            global_strides: vec![1 << 41],
            ..tm()
        },
        "2^40",
    );
    bad(
        TensorMap {
            box_dims: vec![512, 32],
            ..tm()
        },
        "1..=256",
    );
    bad(
        TensorMap {
            box_dims: vec![4, 32],
            ..tm()
        },
        "multiple of 16",
    );
    bad(
        TensorMap {
            element_strides: vec![9, 1],
            ..tm()
        },
        "1..=8",
    );
    bad(
        TensorMap {
            swizzle: Swizzle::B64,
            ..tm()
        },
        "swizzle span",
    );
    TensorMap {
        swizzle: Swizzle::B128,
        ..tm()
    }
    .validate()
    .unwrap();
    bad(
        TensorMap {
            interleave: Interleave::B16,
            ..tm()
        },
        "with interleave",
    );
    bad(
        TensorMap {
            data_type: TensorDataType::U32,
            oob_fill: OobFill::NanRequestZeroFma,
            ..TensorMap::tiled(TensorDataType::U32, 0, &[64], &[32])
        },
        "floating-point",
    );
    bad(
        TensorMap {
            global_dims: vec![0, 512],
            ..tm()
        },
        "global dim 0",
    );
    bad(
        TensorMap {
            box_dims: vec![64],
            ..tm()
        },
        "box dims",
    );
    if Device::cuda_count() == 0 {
        assert!(matches!(
            ok.encode_cuda(),
            Err(RuntimeError::CudaUnavailable(_))
        ));
    }
}

/// A 4d NHWC im2col map (`cuTensorMapEncodeIm2col` parameters).
fn im2col_tm() -> TensorMap {
    TensorMap::im2col(
        TensorDataType::BF16,
        0x10000,
        &[64, 14, 14, 2],
        Im2col {
            lower_corner: vec![-1, -1],
            upper_corner: vec![-1, -1],
            channels_per_pixel: 64,
            pixels_per_column: 128,
        },
    )
}

/// Im2col maps: the driver's rules with the field named, and the emulator encoding carries
/// the corners, channels and pixels (`emu::hopper::TensorMapDesc`).
#[test]
fn tensor_map_im2col_validation_and_encoding() {
    let ok = im2col_tm();
    ok.validate().unwrap();
    assert_eq!(ok.box_bytes(), 128 * 64 * 2);
    let d = emu::hopper::TensorMapDesc::from_bytes(&ok.encode_emu().unwrap()).unwrap();
    let p = d.im2col.expect("an im2col map");
    assert_eq!((p.lower, p.upper), ([-1, -1, 0], [-1, -1, 0]));
    assert_eq!((p.channels_per_pixel, p.pixels_per_column), (64, 128));
    assert_eq!((d.rank, d.dims[..4].to_vec()), (4, vec![64, 14, 14, 2]));
    let bad = |f: &dyn Fn(&mut Im2col), what: &str| {
        let mut t = im2col_tm();
        f(t.im2col.as_mut().unwrap());
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains(what), "expected `{what}` in `{e}`");
    };
    bad(&|i| i.lower_corner = vec![-1], "lower corner has 1 entries");
    bad(&|i| i.upper_corner = vec![0, 128], "upper corner 1 = 128");
    bad(&|i| i.channels_per_pixel = 0, "channels per pixel = 0");
    bad(
        &|i| i.channels_per_pixel = 4,
        "channels per pixel spans 8 bytes",
    );
    bad(&|i| i.pixels_per_column = 1025, "pixels per column = 1025");
    let mut t = im2col_tm();
    t.global_dims = vec![64, 14];
    t.global_strides = vec![128];
    t.element_strides = vec![1, 1];
    assert!(t.validate().unwrap_err().to_string().contains("rank 2"));
    let mut t = im2col_tm();
    t.swizzle = Swizzle::B64;
    assert!(t
        .validate()
        .unwrap_err()
        .to_string()
        .contains("swizzle span"));
    t.element_strides[0] = 2;
    t.swizzle = Swizzle::B128;
    assert!(t
        .encode_emu()
        .unwrap_err()
        .to_string()
        .contains("not emulated"));
}

/// Runs on a GPU: `PTXFORGE_TEST_CUDA=1 cargo test --release -p runtime --test backend cuda`.
mod cuda {
    use super::*;

    fn gpu() -> Option<Device> {
        if std::env::var("PTXFORGE_TEST_CUDA").as_deref() != Ok("1") {
            eprintln!("skip: CUDA tests need PTXFORGE_TEST_CUDA=1 and a GPU");
            return None;
        }
        Some(Device::cuda(0).expect("PTXFORGE_TEST_CUDA=1 but no CUDA device"))
    }

    #[test]
    fn cuda_vector_add() {
        let Some(dev) = gpu() else { return };
        let m = Module::load_ptx(&dev, &format!("{HEADER}{ADD}")).unwrap();
        let f = m.function("add1").unwrap();
        let host: Vec<u32> = (0..10_000).collect();
        let buf = dev.upload(&host).unwrap();
        let s = dev.stream(0);
        let e0 = s.record().unwrap();
        s.launch(
            &f,
            &LaunchConfig::linear(10_000u32.div_ceil(256), 256),
            &args![&buf, 10_000u32],
        )
        .unwrap();
        let e1 = s.record().unwrap();
        s.synchronize().unwrap();
        let v = buf.to_vec().unwrap();
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32 + 1));
        eprintln!("cuda vector add: {:?}", e1.elapsed_since(&e0));
        // Graph capture + replay.
        s.begin_capture().unwrap();
        s.launch(&f, &LaunchConfig::linear(40, 256), &args![&buf, 10_000u32])
            .unwrap();
        let g = s.end_capture().unwrap();
        g.launch(&s).unwrap();
        g.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(buf.to_vec().unwrap()[5], 8);
        // Async copy through pinned staging.
        s.copy_to_device(&buf, &[3u32; 16]).unwrap();
        s.synchronize().unwrap();
        assert_eq!(buf.to_vec().unwrap()[15], 3);
    }

    /// A copy's host source must outlive the copy even when another thread synchronises the
    /// stream meanwhile (`to_vec` synchronises every stream of the device): the sources queued
    /// after that synchronisation began stay alive.
    #[test]
    fn cuda_async_copy_sources_survive_concurrent_synchronisation() {
        let Some(dev) = gpu() else { return };
        let s = dev.stream(0);
        let n = 4096usize;
        let bufs: Vec<_> = (0..48).map(|_| dev.alloc::<u32>(n).unwrap()).collect();
        let other = dev.upload(&[1u32; 64]).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        let pattern = |i: usize, j: usize| (i as u32).wrapping_mul(0x9e37_79b9) ^ j as u32;
        std::thread::scope(|sc| {
            sc.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    assert_eq!(other.to_vec().unwrap()[63], 1);
                }
            });
            for (i, b) in bufs.iter().enumerate() {
                let v: Vec<u32> = (0..n).map(|j| pattern(i, j)).collect();
                s.copy_to_device(b, &v).unwrap();
            }
            s.synchronize().unwrap();
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        for (i, b) in bufs.iter().enumerate() {
            let v = b.to_vec().unwrap();
            let bad = (0..n).find(|&j| v[j] != pattern(i, j));
            assert_eq!(bad, None, "buffer {i}: a copy read a freed host source");
        }
    }

    #[test]
    fn cuda_stream_ordered_host_ops() {
        let Some(dev) = gpu() else { return };
        super::stream_ordered_ops(&dev);
    }

    #[test]
    fn cuda_spin_flag_kernel() {
        let Some(dev) = gpu() else { return };
        const SPIN: &str = r#"
.visible .entry spin(.param .u64 flag, .param .u64 out)
{
    .reg .pred %p<3>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %ctaid.x;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra PRODUCER;
W:
    ld.acquire.gpu.global.u32 %r2, [%rd1];
    setp.eq.u32 %p2, %r2, 0;
    @%p2 bra W;
    st.global.u32 [%rd2], %r2;
    ret;
PRODUCER:
    st.release.gpu.global.u32 [%rd1], 7;
    ret;
}
"#;
        let m = Module::load_ptx(&dev, &format!("{HEADER}{SPIN}")).unwrap();
        let flag = dev.alloc::<u32>(1).unwrap();
        let out = dev.alloc::<u32>(1).unwrap();
        let s = dev.stream(0);
        s.launch(
            &m.function("spin").unwrap(),
            &LaunchConfig::linear(2, 1).cooperative(),
            &args![&flag, &out],
        )
        .unwrap();
        s.synchronize().unwrap();
        assert_eq!(out.to_vec().unwrap()[0], 7);
    }

    #[test]
    fn cuda_p2p() {
        let Some(d0) = gpu() else { return };
        let Ok(d1) = Device::cuda(1) else {
            eprintln!("skip: cuda_p2p needs two GPUs");
            return;
        };
        let m1 = Module::load_ptx(&d1, &format!("{HEADER}{ADD}")).unwrap();
        let buf = d0.upload(&[1u32; 64]).unwrap();
        let p = buf.peer_ptr(&d1).unwrap();
        let s = d1.stream(0);
        s.launch(
            &m1.function("add1").unwrap(),
            &LaunchConfig::linear(1, 64),
            &[runtime::Arg::Ptr(p), 64u32.into()],
        )
        .unwrap();
        s.synchronize().unwrap();
        assert_eq!(buf.to_vec().unwrap(), vec![2; 64]);
    }

    #[test]
    fn cuda_budgeted_launch_records_smids() {
        let Some(dev) = gpu() else { return };
        let sms = dev.props().sms;
        let s = dev.stream(1);
        let budget = runtime::SmPartition {
            offset: 0,
            count: 16,
        };
        let seen = runtime::sms_used(&s, &LaunchConfig::persistent(budget, 128)).unwrap();
        eprintln!(
            "advisory budget of 16 SMs: CTAs ran on {} SMs: {seen:?}",
            seen.len()
        );
        assert!(!seen.is_empty() && seen.iter().all(|&x| x < sms));
        let (comm, compute) = dev.partition(16).unwrap();
        eprintln!(
            "partition: {:?}, comm {:?}, compute {:?}",
            comm.kind(),
            comm.sms(),
            compute.sms()
        );
        let cs = comm.stream().unwrap();
        let ks = compute.stream().unwrap();
        let a = runtime::sms_used(&cs, &LaunchConfig::linear(4 * sms, 128)).unwrap();
        let b = runtime::sms_used(&ks, &LaunchConfig::linear(4 * sms, 128)).unwrap();
        eprintln!(
            "comm partition ran on {} SMs {a:?}; compute on {} SMs",
            a.len(),
            b.len()
        );
        if *comm.kind() == PartitionKind::GreenContext {
            assert!(a.len() as u32 <= comm.sms().count, "{a:?}");
            assert!(
                a.iter().all(|x| !b.contains(x)),
                "green partitions overlap: {a:?} / {b:?}"
            );
        }
    }

    #[test]
    fn cuda_jit_error_names_the_ptx_line() {
        let Some(dev) = gpu() else { return };
        let text = format!("{HEADER}.visible .entry k(.param .u64 p)\n{{\n    .reg .b32 %r<2>;\n    mov.u32 %r1, %undefined_reg;\n    ret;\n}}\n");
        // The ptx crate may reject it first; either way the message must name the problem line.
        let e = match Module::load_ptx_with(
            &dev,
            &text,
            &runtime::JitOptions {
                cache: Some(false),
                ..Default::default()
            },
        ) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("bad PTX loaded"),
        };
        eprintln!("{e}");
        assert!(
            e.contains("line 7") || e.contains("PTX line 7") || e.contains(":7"),
            "{e}"
        );
    }

    #[test]
    fn cuda_tensor_map_encodes() {
        let Some(dev) = gpu() else { return };
        let buf = dev.alloc::<half::f16>(1024 * 512).unwrap();
        let t = TensorMap {
            global_address: buf.device_ptr(),
            ..tm()
        };
        let d = t.encode_cuda().unwrap();
        assert!(d.iter().any(|&b| b != 0));
    }

    #[test]
    fn cuda_tensor_map_encodes_im2col() {
        let Some(dev) = gpu() else { return };
        let buf = dev.alloc::<half::bf16>(64 * 14 * 14 * 2).unwrap();
        let t = TensorMap {
            global_address: buf.device_ptr(),
            ..im2col_tm()
        };
        let d = t.encode_cuda().unwrap();
        assert!(d.iter().any(|&b| b != 0));
        let bad = TensorMap {
            global_address: buf.device_ptr(),
            element_strides: vec![1, 1, 1, 9],
            ..im2col_tm()
        };
        assert!(bad.encode_cuda().is_err());
    }
}

/// The `cuda` tests above, run again in a child process on the fake driver (`crates/fakecuda`:
/// the CUDA driver API implemented on the emulator), so the CUDA backend's FFI, JIT logs,
/// streams, events, graphs, tensor maps, green contexts and peer access run in CI without a GPU.
#[test]
fn cuda_tests_pass_on_the_fake_driver() {
    let Some(f) = FakeCuda::new("runtime") else {
        return;
    };
    let exe = std::env::current_exe().expect("test executable");
    let out = f
        .command(exe)
        .args(["cuda::", "--test-threads=1", "--nocapture"])
        .output()
        .expect("run the cuda tests");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("9 passed"), "{text}");
    assert!(!text.contains("skip: CUDA tests need"), "{text}");
    assert!(text.contains("partition: GreenContext"), "{text}");
}

/// `Stream::copy_range` moves exactly the asked elements between offsets (the rest of the
/// poisoned destination untouched, within one buffer too) and refuses ranges past either end.
#[test]
fn copy_range_copies_slices_and_checks_bounds() {
    let dev = Device::emu(28);
    let st = dev.new_stream();
    let data: Vec<u32> = (0..100u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let a = st.upload(&data).unwrap();
    let b = dev.alloc::<u32>(50).unwrap();
    st.fill(&b, 0xdead_beef).unwrap();
    st.copy_range((&a, 37), (&b, 5), 20).unwrap();
    let got = st.read(&b).unwrap();
    for (i, &v) in got.iter().enumerate() {
        let want = if (5..25).contains(&i) {
            data[i - 5 + 37]
        } else {
            0xdead_beef
        };
        assert_eq!(v, want, "element {i}");
    }
    st.copy_range((&b, 5), (&b, 30), 20).unwrap();
    assert_eq!(st.read(&b).unwrap()[30..50], data[37..57]);
    assert!(st.copy_range((&a, 90), (&b, 0), 11).is_err());
    assert!(st.copy_range((&a, 0), (&b, 31), 20).is_err());
    assert!(st.copy_range((&a, usize::MAX), (&b, 0), 1).is_err());
    st.copy_range((&a, 100), (&b, 50), 0).unwrap();
}

#[test]
fn copy_range_moves_a_slice_between_devices_and_refuses_ranges_outside_the_buffers() {
    let (a, b) = (Device::emu(40), Device::emu(41));
    let src = a
        .upload(&(0..10).map(|v| v as f32 + 0.5).collect::<Vec<_>>())
        .unwrap();
    let dst = b.upload(&[f32::NAN; 8]).unwrap();
    let st = b.stream(0);
    st.copy_range((&src, 3), (&dst, 2), 4).unwrap();
    st.synchronize().unwrap();
    let got = dst.to_vec().unwrap();
    assert_eq!(&got[2..6], &[3.5, 4.5, 5.5, 6.5]);
    assert!(
        got[..2].iter().chain(&got[6..]).all(|v| v.is_nan()),
        "{got:?}"
    );
    let e = st.copy_range((&src, 8), (&dst, 0), 3).unwrap_err();
    assert!(e.to_string().contains("[8..]"), "{e}");
    assert!(st.copy_range((&src, 0), (&dst, 6), 3).is_err());
}
