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

const DECL: &str = ".extern .func (.param .b32 func_retval0) vprintf (.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);";

/// A kernel whose threads print `v=%u\n` (v = seed + tid) storing vprintf's result in
/// `out[tid]`, then `w=%d\n` (w = -tid) through a call without a result. `decl` declares
/// vprintf; `call2` is the second call (to vary its form).
fn two_calls(decl: &str, call2: &str) -> String {
    format!(
        r#"
.version 8.0
.target sm_80
.address_size 64
{decl}
.global .align 1 .b8 $v[6] = {{118, 61, 37, 117, 10, 0}};
.global .align 1 .b8 $w[6] = {{119, 61, 37, 100, 10, 0}};
.visible .entry p(.param .u64 out, .param .u32 seed)
{{
    .local .align 8 .b8 __local_depot0[8];
    .reg .b64 %SP;
    .reg .b64 %SPL;
    .reg .b32 %r<8>;
    .reg .b64 %rd<12>;
    mov.u64 %SPL, __local_depot0;
    cvta.local.u64 %SP, %SPL;
    mov.u32 %r1, %tid.x;
    ld.param.u32 %r2, [seed];
    add.u32 %r3, %r2, %r1;
    st.local.u32 [%SPL], %r3;
    mov.u64 %rd1, $v;
    cvta.global.u64 %rd2, %rd1;
    {{
    .param .b64 param0;
    st.param.b64 [param0+0], %rd2;
    .param .b64 param1;
    st.param.b64 [param1+0], %SP;
    .param .b32 retval0;
    call.uni (retval0), vprintf, (param0, param1);
    ld.param.b32 %r4, [retval0+0];
    }}
    ld.param.u64 %rd3, [out];
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %rd3, %rd4;
    st.global.u32 [%rd5], %r4;
    neg.s32 %r5, %r1;
    st.local.u32 [%SPL], %r5;
    mov.u64 %rd6, $w;
    cvta.global.u64 %rd7, %rd6;
    {{
    .param .b64 param0;
    st.param.b64 [param0+0], %rd7;
    .param .b64 param1;
    st.param.b64 [param1+0], %SP;
    .param .b64 param2;
    st.param.b64 [param2+0], %SP;
    {call2}
    }}
    ret;
}}
"#
    )
}

/// Launches `p` of `text` on `threads` threads; returns the printed text (or the error).
fn run_two_calls(
    text: &str,
    mem: &GlobalMemory,
    out: u64,
    seed: u32,
    threads: u32,
) -> Result<String, String> {
    let m = LoadedModule::load(mem, ptx::parse(text).map_err(|e| e.to_string())?, 0)
        .map_err(|e| e.to_string())?;
    let sink = Arc::new(Mutex::new(String::new()));
    let opts = LaunchOptions {
        printf: Some(sink.clone()),
        ..LaunchOptions::default()
    };
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [threads, 1, 1],
        shared_bytes: 0,
        sms: 1,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    let mut params = out.to_le_bytes().to_vec();
    params.extend(seed.to_le_bytes());
    let k = m.kernel("p").map_err(|e| e.to_string())?;
    launch(k, mem.snapshot(), params, &cfg, &opts).map_err(|e| e.to_string())?;
    let s = sink.lock().unwrap().clone();
    Ok(s)
}

/// vprintf's result (the number of characters printed) lands in the call's return variable,
/// and a call without a result variable prints too.
#[test]
fn printf_result_is_the_printed_length_and_optional() {
    let seed: u32 = rand::random();
    let n = 8u32;
    let mem = GlobalMemory::new();
    let out = mem.alloc(4 * n as u64, 0).unwrap();
    out.fill(0, 4 * n as u64, &[0xff]);
    let text = two_calls(DECL, "call.uni vprintf, (param0, param1);");
    let printed = run_two_calls(&text, &mem, out.base, seed, n).unwrap();
    let firsts: Vec<String> = (0..n)
        .map(|t| format!("v={}\n", seed.wrapping_add(t)))
        .collect();
    let want: String = firsts.concat()
        + &(0..n)
            .map(|t| format!("w={}\n", -(t as i64)))
            .collect::<String>();
    assert_eq!(printed, want);
    let mut got = vec![0u8; 4 * n as usize];
    out.read_bytes(0, &mut got);
    for (t, c) in got.chunks(4).enumerate() {
        let r = u32::from_le_bytes(c.try_into().unwrap());
        assert_eq!(r as usize, firsts[t].len(), "thread {t}");
    }
}

/// A call or declaration that does not fit `vprintf(format, args)` is refused naming what.
#[test]
fn vprintf_signature_errors_name_the_parameter() {
    let mem = GlobalMemory::new();
    let out = mem.alloc(4, 0).unwrap();
    let three = two_calls(DECL, "call.uni vprintf, (param0, param1, param2);");
    let e = run_two_calls(&three, &mem, out.base, 1, 1).unwrap_err();
    assert!(e.contains("vprintf takes (format, args)"), "{e}");
    let bad_decl = DECL.replace(".param .b64 vprintf_param_1", ".param .b32 vprintf_param_1");
    let text = two_calls(&bad_decl, "call.uni vprintf, (param0, param1);");
    let e = run_two_calls(&text, &mem, out.base, 1, 1).unwrap_err();
    assert!(e.contains("`args`"), "{e}");
}
