//! The runtime's multicast API (`runtime::Multicast`, CUDA's cuMulticast* calls) on three
//! emulated devices: a kernel on one device reduces every device's values with
//! `multimem.ld_reduce`, a kernel on another broadcasts with `multimem.st`; references on the
//! host, outputs poisoned first.

use rand::{Rng, SeedableRng};
use runtime::{args, Device, LaunchConfig, Module, Multicast};

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
"#;

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
    let e = mc.bind(0, &b, 1, g).unwrap_err().to_string();
    assert!(e.contains("mem_offset"), "{e}");
    assert_eq!(mc.size(), g);
}
