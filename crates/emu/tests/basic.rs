//! End-to-end emulator checks on small hand-written kernels.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use std::sync::Arc;

fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        shared_bytes: 0,
        sms: 132,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    }
}

const VADD: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry vadd(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [a];
    ld.param.u64 %rd2, [b];
    ld.param.u64 %rd3, [c];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd4, %r5, 4;
    add.s64 %rd5, %rd1, %rd4;
    add.s64 %rd6, %rd2, %rd4;
    add.s64 %rd7, %rd3, %rd4;
    ld.global.f32 %f1, [%rd5];
    ld.global.f32 %f2, [%rd6];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd7], %f3;
DONE:
    ret;
}
"#;

fn params(vals: &[(u64, usize)]) -> Vec<u8> {
    let mut p = Vec::new();
    for &(v, sz) in vals {
        while p.len() % sz != 0 {
            p.push(0);
        }
        p.extend_from_slice(&v.to_le_bytes()[..sz]);
    }
    p
}

#[test]
fn vector_add_matches_reference() {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(VADD).unwrap(), 0).unwrap();
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| (i as f32) * 0.37 - 11.0).collect();
    let b: Vec<f32> = (0..n).map(|i| 3.0 / (i as f32 + 1.0)).collect();
    let (ba, bb, bc) = (
        mem.alloc(4 * n as u64, 0).unwrap(),
        mem.alloc(4 * n as u64, 0).unwrap(),
        mem.alloc(4 * n as u64, 0).unwrap(),
    );
    ba.write_bytes(
        0,
        &a.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    );
    bb.write_bytes(
        0,
        &b.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    );
    bc.fill(0, 4 * n as u64, &[0xff]);
    let p = params(&[(ba.base, 8), (bb.base, 8), (bc.base, 8), (n as u64, 4)]);
    let k = m.kernel("vadd").unwrap();
    let st = launch(
        k,
        mem.snapshot(),
        p,
        &cfg(8, 128),
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut out = vec![0u8; 4 * n];
    bc.read_bytes(0, &mut out);
    for i in 0..n {
        let got = f32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(got, a[i] + b[i], "element {i}");
    }
    assert_eq!(st.ctas, 8);
    assert!(st.lane_instructions > 0);
}

#[test]
fn out_of_bounds_store_is_reported() {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(VADD).unwrap(), 0).unwrap();
    let n = 64u64;
    let (ba, bb, bc) = (
        mem.alloc(4 * n, 0).unwrap(),
        mem.alloc(4 * n, 0).unwrap(),
        mem.alloc(4 * 10, 0).unwrap(),
    );
    let p = params(&[(ba.base, 8), (bb.base, 8), (bc.base, 8), (n, 4)]);
    let e = launch(
        m.kernel("vadd").unwrap(),
        mem.snapshot(),
        p,
        &cfg(1, 64),
        &LaunchOptions::default(),
    )
    .unwrap_err();
    let s = e.to_string();
    assert!(
        matches!(e.fault(), Some(emu::FaultKind::OutOfBounds { .. })),
        "{s}"
    );
    assert!(
        s.contains("vadd") && s.contains("thread (10,0,0)") && s.contains("st.global.f32"),
        "{s}"
    );
    let _ = Arc::new(());
}

const CALLS: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.func (.param .b32 sq_ret) square_plus(.param .b32 sq_x, .param .b32 sq_y)
{
    .reg .b32 %r<4>;
    ld.param.b32 %r1, [sq_x];
    ld.param.b32 %r2, [sq_y];
    mad.lo.s32 %r3, %r1, %r1, %r2;
    st.param.b32 [sq_ret], %r3;
    ret;
}
.visible .entry calls(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    // Divergent call: odd lanes add 1000.
    and.b32 %r2, %r1, 1;
    mul.lo.s32 %r3, %r2, 1000;
    setp.eq.u32 %p1, %r2, 0;
    @%p1 bra SKIP;
    {
    .param .b32 param0;
    st.param.b32 [param0], %r1;
    .param .b32 param1;
    st.param.b32 [param1], %r3;
    .param .b32 retval0;
    call.uni (retval0), square_plus, (param0, param1);
    ld.param.b32 %r4, [retval0];
    }
    bra DONE;
SKIP:
    {
    .param .b32 param0;
    st.param.b32 [param0], %r1;
    .param .b32 param1;
    st.param.b32 [param1], 7;
    .param .b32 retval0;
    call.uni (retval0), square_plus, (param0, param1);
    ld.param.b32 %r4, [retval0];
    }
DONE:
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    ret;
}
"#;

#[test]
fn device_function_calls_with_divergence() {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(CALLS).unwrap(), 0).unwrap();
    let out = mem.alloc(4 * 64, 0).unwrap();
    out.fill(0, 256, &[0xff]);
    let p = params(&[(out.base, 8)]);
    launch(
        m.kernel("calls").unwrap(),
        mem.snapshot(),
        p,
        &cfg(1, 64),
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut b = vec![0u8; 256];
    out.read_bytes(0, &mut b);
    for t in 0..64u32 {
        let got = u32::from_le_bytes(b[4 * t as usize..4 * t as usize + 4].try_into().unwrap());
        let want = t * t + if t % 2 == 1 { 1000 } else { 7 };
        assert_eq!(got, want, "thread {t}");
    }
}
