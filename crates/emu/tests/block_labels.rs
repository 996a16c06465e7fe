//! Labels are scoped to their `{ }` block: the same label in several blocks (Triton repeats an
//! inline-asm `{ waitLoop: ... bra waitLoop; }` for every mbarrier wait) names a different place
//! in each, and a block's own label hides the function's label of that name.

#[path = "common/load.rs"]
mod load;

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions};

/// out[tid] = 3*tid + 7*tid + 100, counted by three loops named `again` (and two exits named
/// `done`): two in nested blocks (3*tid and 7*tid steps) and one at function scope (100 steps).
const K: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 out)
{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<4>;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, 0;
	mul.lo.u32 	%r3, %r1, 3;
	{
	again:
	setp.eq.u32 	%p1, %r3, 0;
	@%p1 bra.uni 	done;
	add.u32 	%r2, %r2, 1;
	sub.u32 	%r3, %r3, 1;
	bra.uni 	again;
	done:
	}
	mul.lo.u32 	%r3, %r1, 7;
	{
	again:
	setp.eq.u32 	%p1, %r3, 0;
	@%p1 bra.uni 	done;
	add.u32 	%r2, %r2, 1;
	sub.u32 	%r3, %r3, 1;
	bra.uni 	again;
	done:
	}
	mov.u32 	%r4, 0;
again:
	add.u32 	%r4, %r4, 1;
	setp.lt.u32 	%p2, %r4, 100;
	@%p2 bra.uni 	again;
	add.u32 	%r2, %r2, %r4;
	ld.param.u64 	%rd1, [out];
	mul.wide.u32 	%rd2, %r1, 4;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.u32 	[%rd3], %r2;
	ret;
}
"#;

#[test]
fn same_label_in_sibling_blocks_names_each_blocks_own_place() {
    let mem = GlobalMemory::new();
    let m = load::load_checked(&mem, K, &["sm_90a"], "block_labels");
    let n = 64u32;
    let out = mem.alloc(4 * n as u64, 0).unwrap();
    out.write_bytes(0, &vec![0xffu8; 4 * n as usize]);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [n, 1, 1],
        shared_bytes: 0,
        sms: 1,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    let params = out.base.to_le_bytes().to_vec();
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        params,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut bytes = vec![0u8; 4 * n as usize];
    out.read_bytes(0, &mut bytes);
    for t in 0..n as usize {
        let v = u32::from_le_bytes(bytes[4 * t..4 * t + 4].try_into().unwrap());
        assert_eq!(v, 10 * t as u32 + 100, "thread {t}");
    }
}
