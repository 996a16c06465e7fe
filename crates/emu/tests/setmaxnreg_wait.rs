//! `setmaxnreg.inc` waits for registers other warps release with `setmaxnreg.dec`, as on
//! hardware (warp-specialised kernels, Triton's `warp_specialize=True`, rely on it): the
//! consumers' `.inc` may run before the producers' `.dec`.

#[path = "common/load.rs"]
mod load;

use emu::{launch, EmuError, FaultKind, GlobalMemory, LaunchConfig, LaunchOptions};

/// 384 threads (three warpgroups) first set 168 registers each (64512 of the 65536). Warpgroup
/// 0 then asks for 232 at once (72704 > 65536: it must wait); warpgroups 1 and 2 count to
/// `spin` first and then drop to `low` registers (to 120: 4*232 + 8*120 = 60416 fits). Each
/// thread stores tid + 1000 * (its warpgroup's step).
fn kernel(low: u32) -> String {
    format!(
        r#"
.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 out, .param .u32 spin)
.reqntid 384
.maxnreg 168
{{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<4>;
	setmaxnreg.dec.sync.aligned.u32 	168;
	mov.u32 	%r1, %tid.x;
	setp.ge.u32 	%p1, %r1, 128;
	@%p1 bra 	PRODUCER;
	setmaxnreg.inc.sync.aligned.u32 	232;
	mov.u32 	%r2, 1;
	bra.uni 	STORE;
PRODUCER:
	ld.param.u32 	%r3, [spin];
	mov.u32 	%r4, 0;
LOOP:
	add.u32 	%r4, %r4, 1;
	setp.lt.u32 	%p2, %r4, %r3;
	@%p2 bra.uni 	LOOP;
	setmaxnreg.dec.sync.aligned.u32 	{low};
	mov.u32 	%r2, 2;
STORE:
	mad.lo.u32 	%r5, %r2, 1000, %r1;
	ld.param.u64 	%rd1, [out];
	mul.wide.u32 	%rd2, %r1, 4;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.u32 	[%rd3], %r5;
	ret;
}}
"#
    )
}

fn run(low: u32) -> Result<Vec<u32>, EmuError> {
    let mem = GlobalMemory::new();
    let m = load::load_checked(&mem, &kernel(low), &["sm_90a"], "setmaxnreg_wait");
    let out = mem.alloc(4 * 384, 0).unwrap();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [384, 1, 1],
        shared_bytes: 0,
        sms: 1,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    let mut params = out.base.to_le_bytes().to_vec();
    params.extend_from_slice(&500u32.to_le_bytes());
    let opts = LaunchOptions {
        timeout: std::time::Duration::from_secs(5),
        ..LaunchOptions::default()
    };
    launch(m.kernel("k")?, mem.snapshot(), params, &cfg, &opts)?;
    let mut bytes = vec![0u8; 4 * 384];
    out.read_bytes(0, &mut bytes);
    Ok(bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

#[test]
fn inc_waits_for_the_registers_other_warps_release() {
    let v = run(120).unwrap();
    for (t, &x) in v.iter().enumerate() {
        let step = if t < 128 { 1 } else { 2 };
        assert_eq!(x, t as u32 + 1000 * step, "thread {t}");
    }
}

#[test]
fn inc_that_can_never_be_satisfied_is_a_hang() {
    // Dropping to 168 releases nothing: warpgroup 0 waits forever.
    let e = run(168).unwrap_err();
    let s = e.to_string();
    assert!(matches!(e.fault(), Some(FaultKind::Deadlock(_))), "{s}");
    assert!(s.contains("setmaxnreg.inc"), "{s}");
}
