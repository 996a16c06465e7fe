//! Device-side `printf` (CUDA's `vprintf`, as nvcc emits it): format string in global memory,
//! arguments packed in a local buffer with natural alignment.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use std::sync::{Arc, Mutex};

const K: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.extern .func (.param .b32 func_retval0) vprintf (.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);
.global .align 1 .b8 $str[34] = {116, 61, 37, 100, 32, 120, 61, 37, 53, 46, 50, 102, 32, 104, 61, 37, 120, 32, 98, 105, 103, 61, 37, 108, 108, 100, 32, 37, 115, 33, 37, 37, 10, 0};
.global .align 1 .b8 $name[4] = {101, 109, 117, 0};
.global .align 1 .b8 $pad[1] = {0};
.visible .entry p(.param .f32 x)
{
    .local .align 8 .b8 __local_depot0[40];
    .reg .b64 %SP;
    .reg .b64 %SPL;
    .reg .b32 %r<6>;
    .reg .f32 %f<3>;
    .reg .f64 %fd<2>;
    .reg .b64 %rd<12>;
    .reg .pred %p<2>;
    mov.u64 %SPL, __local_depot0;
    cvta.local.u64 %SP, %SPL;
    mov.u32 %r1, %tid.x;
    setp.ge.u32 %p1, %r1, 2;
    @%p1 bra DONE;
    ld.param.f32 %f1, [x];
    cvt.rn.f32.u32 %f2, %r1;
    add.f32 %f2, %f2, %f1;
    cvt.f64.f32 %fd1, %f2;
    st.local.u32 [%SPL], %r1;
    st.local.f64 [%SPL+8], %fd1;
    mov.u32 %r2, 48879;
    st.local.u32 [%SPL+16], %r2;
    mov.u64 %rd1, -1234567890123;
    st.local.u64 [%SPL+24], %rd1;
    mov.u64 %rd2, $name;
    cvta.global.u64 %rd3, %rd2;
    st.local.u64 [%SPL+32], %rd3;
    mov.u64 %rd4, $str;
    cvta.global.u64 %rd5, %rd4;
    {
    .param .b64 param0;
    st.param.b64 [param0+0], %rd5;
    .param .b64 param1;
    st.param.b64 [param1+0], %SP;
    .param .b32 retval0;
    call.uni (retval0), vprintf, (param0, param1);
    ld.param.b32 %r3, [retval0+0];
    }
DONE:
    ret;
}
"#;

#[test]
fn printf_formats_like_cuda() {
    let mem = GlobalMemory::new();
    // The format string is "t=%d x=%5.2f h=%x big=%lld %s!%%\n" (the $str bytes above).
    let m = LoadedModule::load(&mem, ptx::parse(K).unwrap(), 0).unwrap();
    let sink = Arc::new(Mutex::new(String::new()));
    let opts = LaunchOptions {
        printf: Some(sink.clone()),
        ..LaunchOptions::default()
    };
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        sms: 1,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    launch(
        m.kernel("p").unwrap(),
        mem.snapshot(),
        1.25f32.to_le_bytes().to_vec(),
        &cfg,
        &opts,
    )
    .unwrap();
    let out = sink.lock().unwrap().clone();
    assert_eq!(out, "t=0 x= 1.25 h=beef big=-1234567890123 emu!%\nt=1 x= 2.25 h=beef big=-1234567890123 emu!%\n");
}
