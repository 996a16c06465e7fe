//! Wrong results of the PTX model fixed (issue 16, item 4): `cvt` sign-extension into wider
//! registers, and warp-synchronous instructions whose member mask names lanes that exit while
//! the others wait.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::{Rng, SeedableRng};

fn check_ptxas(text: &str) {
    if ptx::ptxas::ptxas_for_tests("isa_fixes test PTX").is_some() {
        ptx::ptxas::assemble(text, "sm_80", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}\n{text}"));
    }
}

/// Runs kernel `k(out, in)` on one CTA of `n` threads with u32 inputs; `nout` u64 outputs per
/// thread (poisoned before the launch).
fn run(text: &str, input: &[u32], nout: usize) -> Vec<Vec<u64>> {
    check_ptxas(text);
    let n = input.len();
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(text).unwrap(), 0).unwrap();
    let pin = mem.alloc(4 * n as u64, 0).unwrap();
    pin.write_bytes(
        0,
        &input
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let bytes = (8 * n * nout) as u64;
    let pout = mem.alloc(bytes, 0).unwrap();
    pout.fill(0, bytes, &[0xa5]);
    let mut p = pout.base.to_le_bytes().to_vec();
    p.extend_from_slice(&pin.base.to_le_bytes());
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &LaunchConfig::linear(1, n as u32),
        &LaunchOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mut raw = vec![0u8; bytes as usize];
    pout.read_bytes(0, &mut raw);
    (0..n)
        .map(|i| {
            (0..nout)
                .map(|k| u64::from_le_bytes(raw[8 * (i * nout + k)..][..8].try_into().unwrap()))
                .collect()
        })
        .collect()
}

const HEAD: &str = r#".version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 pout, .param .u64 pin)
{
    .reg .pred %p<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pin];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd3, %rd2, %rd3;
    ld.global.u32 %r3, [%rd3];
"#;

#[test]
fn cvt_signed_result_sign_extends_the_whole_register() {
    let body = r#"
    mul.wide.u32 %rd4, %r1, 48;
    add.s64 %rd4, %rd1, %rd4;
    cvt.s16.s8 %r4, %r3;
    cvt.u64.u32 %rd5, %r4;
    st.global.u64 [%rd4], %rd5;
    cvt.s32.s16 %rd6, %r3;
    st.global.u64 [%rd4+8], %rd6;
    cvt.s8.s32 %r5, %r3;
    cvt.u64.u32 %rd7, %r5;
    st.global.u64 [%rd4+16], %rd7;
    cvt.u16.s8 %r6, %r3;
    cvt.u64.u32 %rd8, %r6;
    st.global.u64 [%rd4+24], %rd8;
    cvt.s16.s32 %rd9, %r3;
    st.global.u64 [%rd4+32], %rd9;
    cvt.rzi.s32.f32 %rd10, %r3;
    st.global.u64 [%rd4+40], %rd10;
    ret;
}
"#;
    let text = format!("{HEAD}{body}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut input: Vec<u32> = (0..128).map(|_| rng.gen()).collect();
    // -62 as s8 (the issue's example), a negative and a positive small float
    input[0] = 0xc2;
    input[1] = (-1234.75f32).to_bits();
    input[2] = 99.5f32.to_bits();
    let got = run(&text, &input, 6);
    assert_eq!(got[0][0], 0xffff_ffc2, "cvt.s16.s8 of -62 into .b32");
    for (i, &x) in input.iter().enumerate() {
        let f = f32::from_bits(x);
        let fi = if f.is_nan() {
            0
        } else {
            f.trunc().clamp(i32::MIN as f32, i32::MAX as f32) as i32
        };
        let want = [
            (x as i8 as i32 as u32) as u64,
            x as i16 as i64 as u64,
            (x as i8 as i32 as u32) as u64,
            (x as i8 as u16) as u64,
            x as i16 as i64 as u64,
            fi as i64 as u64,
        ];
        assert_eq!(got[i], want, "input {x:#x}");
    }
}

/// Lanes 0..15 branch forward, store a marker and exit; lanes 16..31 reach `sync` (a lower PC,
/// so they run first and wait for the others) with a full member mask.
fn exited_lanes_kernel(sync: &str) -> String {
    format!(
        r#"{HEAD}    mul.wide.u32 %rd4, %r1, 8;
    add.s64 %rd4, %rd1, %rd4;
    and.b32 %r4, %r3, 3;
    and.b32 %r5, %r3, 1;
    setp.ne.u32 %p2, %r5, 0;
    setp.lt.u32 %p1, %r1, 16;
    @%p1 bra EARLY;
{sync}
    cvt.u64.u32 %rd5, %r2;
    st.global.u64 [%rd4], %rd5;
    ret;
EARLY:
    or.b32 %r6, %r1, -559087616;
    cvt.u64.u32 %rd6, %r6;
    st.global.u64 [%rd4], %rd6;
    exit;
}}
"#
    )
}

/// The expected value of a lane.
type Want<'a> = Box<dyn Fn(usize) -> u32 + 'a>;

#[test]
fn warp_sync_instructions_complete_when_member_lanes_exited() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let input: Vec<u32> = (0..32).map(|_| rng.gen()).collect();
    let hi = 16..32usize;
    let ballot = hi
        .clone()
        .filter(|&l| input[l] & 1 != 0)
        .fold(0u32, |m, l| m | 1 << l);
    let sum = hi.clone().fold(0u32, |s, l| s.wrapping_add(input[l]));
    let cases: [(&str, Want<'_>); 5] = [
        (
            "    vote.sync.ballot.b32 %r2, %p2, -1;",
            Box::new(move |_| ballot),
        ),
        (
            "    shfl.sync.bfly.b32 %r2, %r3, 1, 31, -1;",
            Box::new(|l| input[l ^ 1]),
        ),
        (
            "    redux.sync.add.u32 %r2, %r3, -1;",
            Box::new(move |_| sum),
        ),
        (
            "    match.any.sync.b32 %r2, %r4, -1;",
            Box::new(|l| {
                (16..32)
                    .filter(|&k| input[k] & 3 == input[l] & 3)
                    .fold(0u32, |m, k| m | 1 << k)
            }),
        ),
        (
            "    bar.warp.sync -1;\n    mul.lo.u32 %r2, %r3, 3;",
            Box::new(|l| input[l].wrapping_mul(3)),
        ),
    ];
    for (sync, want) in &cases {
        let got = run(&exited_lanes_kernel(sync), &input, 1);
        for (l, g) in got.iter().enumerate() {
            let w = if l < 16 {
                (l as u32 | 0xdead_0000) as u64
            } else {
                want(l) as u64
            };
            assert_eq!(g[0], w, "`{}` lane {l}", sync.trim());
        }
    }
}
