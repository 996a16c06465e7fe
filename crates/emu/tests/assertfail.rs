//! CUDA's `__assertfail` (nvcc's `assert`, Triton's `tl.device_assert`), as Triton 3.9 emits
//! it: the emulator faults with the assertion's message, file, line and function, naming the
//! first thread whose assertion failed.

#[path = "common/load.rs"]
mod load;

use emu::{launch, EmuError, FaultKind, GlobalMemory, LaunchConfig, LaunchOptions};

/// Each thread asserts `tid.x != bad` (the kernel's parameter), with the message "tid is bad" at
/// "kernel.py" line 8 of function "check".
const K: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.extern .func __assertfail
(
	.param .b64 __assertfail_param_0,
	.param .b64 __assertfail_param_1,
	.param .b32 __assertfail_param_2,
	.param .b64 __assertfail_param_3,
	.param .b64 __assertfail_param_4
)
.noreturn;
.global .align 1 .b8 assertFunc_0[6] = {99, 104, 101, 99, 107};
.global .align 1 .b8 assertFile_0[10] = {107, 101, 114, 110, 101, 108, 46, 112, 121};
.global .align 1 .b8 assertMessage_0[11] = {116, 105, 100, 32, 105, 115, 32, 98, 97, 100};
.visible .entry check(.param .u32 bad)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<9>;
	ld.param.u32 	%r1, [bad];
	mov.u32 	%r2, %tid.x;
	setp.ne.u32 	%p1, %r2, %r1;
	@!%p1 bra 	FAIL;
	ret;
FAIL:
	{
	.param .b64 	param0;
	.param .b64 	param1;
	.param .b32 	param2;
	.param .b64 	param3;
	.param .b64 	param4;
	mov.b64 	%rd3, assertFunc_0;
	cvta.global.u64 	%rd4, %rd3;
	st.param.b64 	[param3], %rd4;
	mov.b64 	%rd5, assertFile_0;
	cvta.global.u64 	%rd6, %rd5;
	st.param.b64 	[param1], %rd6;
	mov.b64 	%rd7, assertMessage_0;
	cvta.global.u64 	%rd8, %rd7;
	st.param.b64 	[param0], %rd8;
	st.param.b64 	[param4], 1;
	st.param.b32 	[param2], 8;
	call.uni __assertfail, (param0, param1, param2, param3, param4);
	}
	trap;
}
"#;

fn run(bad: u32) -> Result<(), EmuError> {
    let mem = GlobalMemory::new();
    let m = load::load_checked(&mem, K, &["sm_90a"], "assertfail");
    let cfg = LaunchConfig {
        grid: [2, 1, 1],
        block: [64, 1, 1],
        shared_bytes: 0,
        sms: 132,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    let params = bad.to_le_bytes().to_vec();
    launch(
        m.kernel("check")?,
        mem.snapshot(),
        params,
        &cfg,
        &LaunchOptions::default(),
    )
    .map(|_| ())
}

#[test]
fn failed_assertion_reports_message_file_line_and_thread() {
    let e = run(37).unwrap_err();
    let expected = FaultKind::Assert {
        message: "tid is bad".into(),
        file: "kernel.py".into(),
        line: 8,
        function: "check".into(),
    };
    assert_eq!(e.fault(), Some(&expected), "{e}");
    let s = e.to_string();
    assert!(s.contains("kernel.py:8") && s.contains("tid is bad"), "{s}");
    assert!(
        s.contains("thread (37,0,0)") && s.contains("__assertfail"),
        "{s}"
    );
}

#[test]
fn assertion_that_holds_does_not_fault() {
    // No thread has tid.x == 1000: the call is never reached.
    run(1000).unwrap();
}
