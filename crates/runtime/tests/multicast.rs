//! The runtime's multicast API (`runtime::Multicast`, CUDA's cuMulticast* calls) on three
//! emulated devices: a kernel on one device reduces every device's values with
//! `multimem.ld_reduce`, a kernel on another broadcasts with `multimem.st`; references on the
//! host, outputs poisoned first. The `cuda` module runs the same through the CUDA backend (with
//! `multimem.red` too) on a GPU (`PTXFORGE_TEST_CUDA=1`), and, in child processes, on the fake
//! driver (`crates/fakecuda`) with 4 devices and with multicast unsupported.

use rand::{Rng, SeedableRng};
use runtime::{args, Device, LaunchConfig, Module, Multicast, RuntimeError};

#[path = "support/fakecuda.rs"]
mod fakecuda_support;

const PTX: &str = r#"
.version 8.1
.target sm_90
.address_size 64
.visible .entry reduce(.param .u64 mc, .param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [mc];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd1, %rd3;
    add.s64 %rd5, %rd2, %rd3;
    multimem.ld_reduce.relaxed.sys.global.add.u32 %r2, [%rd4];
    st.global.u32 [%rd5], %r2;
    ret;
}
.visible .entry broadcast(.param .u64 mc, .param .u64 src)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [mc];
    ld.param.u64 %rd2, [src];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd1, %rd3;
    add.s64 %rd5, %rd2, %rd3;
    ld.global.u32 %r2, [%rd5];
    multimem.st.release.sys.global.u32 [%rd4], %r2;
    ret;
}
.visible .entry red(.param .u64 mc, .param .u64 src)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [mc];
    ld.param.u64 %rd2, [src];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd1, %rd3;
    add.s64 %rd5, %rd2, %rd3;
    ld.global.u32 %r2, [%rd5];
    multimem.red.relaxed.sys.global.add.u32 [%rd4], %r2;
    ret;
}
"#;

/// The field of a [`RuntimeError::Multicast`] (panics on any other result).
fn field<T>(r: Result<T, RuntimeError>) -> &'static str {
    match r {
        Err(RuntimeError::Multicast { field, .. }) => field,
        Err(e) => panic!("expected a multicast error, got {e}"),
        Ok(_) => panic!("expected a multicast error, got Ok"),
    }
}

#[test]
fn reduce_and_broadcast_across_three_emulated_devices() {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let devs: Vec<Device> = (60..63).map(Device::emu).collect();
    let g = Multicast::granularity();
    let mc = Multicast::create(g, 3).unwrap();
    let n = 64;
    let mut bufs = Vec::new();
    let mut vals = Vec::new();
    for d in &devs {
        let v: Vec<u32> = (0..g / 4).map(|_| r.gen()).collect();
        bufs.push(d.upload(&v).unwrap());
        vals.push(v);
        mc.add_device(d).unwrap();
    }
    for b in &bufs {
        mc.bind(0, b, 0, g).unwrap();
    }
    let (a0, a1) = (mc.map(&devs[0]).unwrap(), mc.map(&devs[1]).unwrap());
    assert_ne!(a0, a1, "each device maps its own range");

    let out = devs[0].upload(&vec![u32::MAX; n]).unwrap();
    let m0 = Module::load_ptx(&devs[0], PTX).unwrap();
    let s0 = devs[0].default_stream();
    let cfg = LaunchConfig::linear(1, n as u32);
    s0.launch(
        &m0.function("reduce").unwrap(),
        &cfg,
        &args![a0, out.device_ptr()],
    )
    .unwrap();
    s0.synchronize().unwrap();
    let want: Vec<u32> = (0..n)
        .map(|i| vals.iter().fold(0u32, |s, v| s.wrapping_add(v[i])))
        .collect();
    assert_eq!(out.to_vec().unwrap(), want);

    let src: Vec<u32> = (0..n).map(|_| r.gen()).collect();
    let src_buf = devs[1].upload(&src).unwrap();
    let m1 = Module::load_ptx(&devs[1], PTX).unwrap();
    let s1 = devs[1].default_stream();
    s1.launch(
        &m1.function("broadcast").unwrap(),
        &cfg,
        &args![a1, src_buf.device_ptr()],
    )
    .unwrap();
    s1.synchronize().unwrap();
    for (d, b) in bufs.iter().enumerate() {
        let got = b.to_vec().unwrap();
        assert_eq!(&got[..n], &src[..], "device {d}");
        assert_eq!(
            &got[n..2 * n],
            &vals[d][n..2 * n],
            "device {d} beyond the stores"
        );
    }
}

#[test]
fn multicast_errors_are_typed() {
    let d = Device::emu(63);
    let g = Multicast::granularity();
    assert!(Multicast::create(g + 1, 1).is_err());
    let mc = Multicast::create(g, 1).unwrap();
    let b = d.alloc::<u8>(g).unwrap();
    let e = mc.bind(0, &b, 0, g).unwrap_err().to_string();
    assert!(e.contains("was not added"), "{e}");
    mc.add_device(&d).unwrap();
    assert_eq!(field(mc.bind(0, &b, 1, g)), "buf_offset");
    assert_eq!(field(mc.bind(g, &b, 0, g)), "size");
    assert_eq!(field(Multicast::create(g, 0)), "num_devices");
    assert_eq!(field(mc.map(&Device::emu(64))), "device");
    assert_eq!(mc.size(), g);
    let two = Multicast::create(g, 2).unwrap();
    two.add_device(&d).unwrap();
    assert_eq!(
        field(two.bind(0, &b, 0, g)),
        "num_devices",
        "bind before all were added"
    );
    assert_eq!(
        field(two.map(&d)),
        "num_devices",
        "map before all were added"
    );
}

/// The CUDA backend's multicast objects. Runs on a GPU (`PTXFORGE_TEST_CUDA=1`; up to 4 of
/// its devices) and, through [`cuda_multicast_runs_on_the_fake_driver`], on the fake driver.
mod cuda {
    use super::*;

    fn gpus() -> Option<Vec<Device>> {
        if std::env::var("PTXFORGE_TEST_CUDA").as_deref() != Ok("1") {
            eprintln!("skip: CUDA tests need PTXFORGE_TEST_CUDA=1 and a GPU");
            return None;
        }
        let n = Device::cuda_count().min(4);
        assert!(n > 0, "PTXFORGE_TEST_CUDA=1 but no CUDA device");
        Some((0..n).map(|i| Device::cuda(i).unwrap()).collect())
    }

    /// The granularity, or None (after checking the refusals and printing the line the fake
    /// driver test looks for) when the devices report CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0.
    fn granularity(devs: &[Device]) -> Option<usize> {
        match Multicast::granularity_on(&devs[0], devs.len() as u32) {
            Ok(g) => Some(g),
            Err(RuntimeError::Multicast {
                field: "device",
                msg,
            }) => {
                assert!(msg.contains("MULTICAST_SUPPORTED"), "{msg}");
                let g = Multicast::granularity();
                assert_eq!(field(Multicast::create_on(&devs[0], g, 1)), "device");
                eprintln!("multicast unsupported: {msg}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    fn launch(dev: &Device, kernel: &str, a: u64, b: u64, n: usize) {
        let m = Module::load_ptx(dev, PTX).unwrap();
        let s = dev.default_stream();
        s.launch(
            &m.function(kernel).unwrap(),
            &LaunchConfig::linear(1, n as u32),
            &args![a, b],
        )
        .unwrap();
        s.synchronize().unwrap();
    }

    /// `multimem.ld_reduce` on device 0 sums every device's values into a poisoned output,
    /// `multimem.st` from the last device writes every device, `multimem.red` from device 0
    /// adds into every device; the bytes past the accessed range stay as uploaded.
    #[test]
    fn cuda_multicast_reduce_broadcast_red() {
        let Some(devs) = gpus() else { return };
        let Some(g) = granularity(&devs) else { return };
        let seed: u64 = rand::random();
        eprintln!("seed {seed}");
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let (nd, n) = (devs.len(), 256);
        let mc = Multicast::create_on(&devs[0], g, nd as u32).unwrap();
        for d in &devs {
            mc.add_device(d).unwrap();
        }
        let vals: Vec<Vec<u32>> = (0..nd)
            .map(|_| (0..g / 4).map(|_| r.gen()).collect())
            .collect();
        // cuMemCreate memory (cuMulticastBindMem); on the fake driver the last device's is a
        // plain allocation (cuMulticastBindAddr, which only the fake allows for cuMemAlloc)
        let fake = devs[0].props().name.contains("fakecuda");
        let bufs: Vec<_> = devs
            .iter()
            .zip(&vals)
            .enumerate()
            .map(|(i, (d, v))| {
                let b = if i + 1 < nd || !fake {
                    Multicast::alloc_buffer::<u32>(d, v.len()).unwrap()
                } else {
                    d.alloc::<u32>(v.len()).unwrap()
                };
                b.copy_from_host(v).unwrap();
                b
            })
            .collect();
        for b in &bufs {
            mc.bind(0, b, 0, g).unwrap();
        }
        let ptrs: Vec<u64> = bufs.iter().map(|b| b.device_ptr()).collect();
        eprintln!("buffers at {ptrs:#x?}");
        let last = &devs[nd - 1];
        let a0 = mc.map(&devs[0]).unwrap();
        let al = if nd > 1 { mc.map(last).unwrap() } else { a0 };

        let out = devs[0].upload(&vec![0xdead_beef_u32; n]).unwrap();
        launch(&devs[0], "reduce", a0, out.device_ptr(), n);
        let want: Vec<u32> = (0..n)
            .map(|i| vals.iter().fold(0u32, |s, v| s.wrapping_add(v[i])))
            .collect();
        assert_eq!(out.to_vec().unwrap(), want, "ld_reduce");

        let src: Vec<u32> = (0..n).map(|_| r.gen()).collect();
        let src_buf = last.upload(&src).unwrap();
        launch(last, "broadcast", al, src_buf.device_ptr(), n);
        let delta: Vec<u32> = (0..n).map(|_| r.gen()).collect();
        let delta_buf = devs[0].upload(&delta).unwrap();
        launch(&devs[0], "red", a0, delta_buf.device_ptr(), n);
        for (d, b) in bufs.iter().enumerate() {
            let got = b.to_vec().unwrap();
            let want: Vec<u32> = src
                .iter()
                .zip(&delta)
                .map(|(s, x)| s.wrapping_add(*x))
                .collect();
            assert_eq!(&got[..n], &want[..], "st + red, device {d}");
            assert_eq!(&got[n..], &vals[d][n..], "device {d} beyond the accesses");
        }
        drop(mc);
        eprintln!("multicast reduce/broadcast/red ok on {nd} devices");
    }

    /// Every refusal is a `RuntimeError::Multicast` naming the field.
    #[test]
    fn cuda_multicast_errors_are_typed() {
        let Some(devs) = gpus() else { return };
        let Some(g) = granularity(&devs) else { return };
        let d0 = &devs[0];
        assert_eq!(field(Multicast::create_on(d0, g + 1, 1)), "size");
        assert_eq!(field(Multicast::create_on(d0, g, 0)), "num_devices");
        let mc = Multicast::create_on(d0, g, 1).unwrap();
        let b = Multicast::alloc_buffer::<u8>(d0, 2 * g).unwrap();
        assert_eq!(field(mc.bind(0, &b, 0, g)), "device", "bind before add");
        assert_eq!(field(mc.map(d0)), "device", "map before add");
        mc.add_device(d0).unwrap();
        assert_eq!(field(mc.add_device(d0)), "device", "added twice");
        assert_eq!(field(mc.add_device(&Device::emu(70))), "device");
        assert_eq!(field(mc.bind(0, &b, 1, g)), "buf_offset");
        assert_eq!(field(mc.bind(0, &b, 0, g + 1)), "size");
        assert_eq!(field(mc.bind(g, &b, 0, g)), "size", "outside the object");
        assert_eq!(
            field(mc.bind(0, &b, 2 * g, g)),
            "size",
            "outside the buffer"
        );
        mc.bind(0, &b, g, g).unwrap();
        if let Some(d1) = devs.get(1) {
            assert_eq!(field(mc.add_device(d1)), "device", "added after a bind");
            assert_eq!(field(mc.map(d1)), "device", "map on a non-member");
        }
        assert_ne!(mc.map(d0).unwrap(), b.device_ptr());
        let two = Multicast::create_on(d0, g, 2).unwrap();
        two.add_device(d0).unwrap();
        assert_eq!(
            field(two.bind(0, &b, 0, g)),
            "num_devices",
            "bind before all were added"
        );
        assert_eq!(
            field(two.map(d0)),
            "num_devices",
            "map before all were added"
        );
        let emu = Multicast::create(Multicast::granularity(), 1).unwrap();
        assert_eq!(
            field(emu.add_device(d0)),
            "device",
            "CUDA device, emulated object"
        );
    }
}

/// The `cuda` tests above in child processes on the fake driver (`crates/fakecuda`): with 4
/// devices, and with multicast unsupported (`PTXFORGE_FAKECUDA_MULTICAST=0`).
#[test]
fn cuda_multicast_runs_on_the_fake_driver() {
    let Some(f) = fakecuda_support::FakeCuda::new("multicast") else {
        return;
    };
    let exe = std::env::current_exe().expect("test executable");
    for (on, want) in [
        ("1", "multicast reduce/broadcast/red ok on 4 devices"),
        ("0", "multicast unsupported: "),
    ] {
        let out = f
            .command(&exe)
            .args(["cuda::", "--test-threads=1", "--nocapture"])
            .env("PTXFORGE_FAKECUDA_DEVICES", "4")
            .env("PTXFORGE_FAKECUDA_MULTICAST", on)
            .output()
            .expect("run the cuda tests");
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(text.contains("2 passed"), "{text}");
        assert!(text.contains(want), "{text}");
        assert!(!text.contains("skip: CUDA tests need"), "{text}");
    }
}
