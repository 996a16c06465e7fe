//! Device-function calls as PTX defines them: every invocation has its own registers,
//! parameters, return values and `.local` storage. Recursion 1,000+ deep with divergent depths,
//! pointers into the caller's frame, a caller reusing the callee's register names, forward
//! declarations, mutual recursion, and the stack-limit fault.

use emu::{launch, EmuError, FaultKind, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::{Rng, SeedableRng};

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// `rec(n, x, out)`: writes `x ^ n` through `out` (a generic pointer into the caller's frame),
/// recurses with a pointer into its own `__local_depot`, and mixes the result with values
/// kept in registers and in its depot across the call. Forward-declared before the kernel.
const REC: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func (.param .b64 rv) rec(.param .b32 n, .param .b64 x, .param .b64 out);

.visible .entry k(.param .u64 pout, .param .u64 pin, .param .u64 pdepth)
{
    .local .align 8 .b8 __local_depot0[8];
    .reg .b64 %SP;
    .reg .b64 %SPL;
    .reg .b32 %r<8>;
    .reg .b64 %rd<16>;
    mov.u64 %SPL, __local_depot0;
    cvta.local.u64 %SP, %SPL;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pin];
    ld.param.u64 %rd3, [pdepth];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd4, %r1, 8;
    add.s64 %rd4, %rd2, %rd4;
    ld.global.u64 %rd5, [%rd4];
    mul.wide.u32 %rd6, %r1, 4;
    add.s64 %rd6, %rd3, %rd6;
    ld.global.u32 %r3, [%rd6];
    {
    .param .b32 param0;
    st.param.b32 [param0], %r3;
    .param .b64 param1;
    st.param.b64 [param1], %rd5;
    .param .b64 param2;
    st.param.b64 [param2], %SP;
    .param .b64 retval0;
    call.uni (retval0), rec, (param0, param1, param2);
    ld.param.b64 %rd7, [retval0];
    }
    ld.local.u64 %rd8, [%SPL];
    mul.lo.s32 %r4, %r1, 3;
    mul.wide.u32 %rd9, %r4, 8;
    add.s64 %rd9, %rd1, %rd9;
    st.global.u64 [%rd9], %rd7;
    st.global.u64 [%rd9+8], %rd8;
    st.global.u64 [%rd9+16], %rd5;
    ret;
}

.func (.param .b64 rv) rec(.param .b32 n, .param .b64 x, .param .b64 out)
{
    .local .align 8 .b8 __local_depot1[16];
    .reg .b64 %SP;
    .reg .b64 %SPL;
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<16>;
    mov.u64 %SPL, __local_depot1;
    cvta.local.u64 %SP, %SPL;
    ld.param.u32 %r1, [n];
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [out];
    cvt.u64.u32 %rd3, %r1;
    xor.b64 %rd4, %rd1, %rd3;
    st.u64 [%rd2], %rd4;
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra BASE;
    mad.lo.s64 %rd5, %rd1, 3, %rd3;
    st.local.u64 [%SPL], %rd5;
    shr.u64 %rd6, %rd1, 3;
    add.s64 %rd7, %rd5, %rd6;
    add.s32 %r2, %r1, -1;
    add.s64 %rd8, %SP, 8;
    {
    .param .b32 param0;
    st.param.b32 [param0], %r2;
    .param .b64 param1;
    st.param.b64 [param1], %rd7;
    .param .b64 param2;
    st.param.b64 [param2], %rd8;
    .param .b64 retval0;
    call.uni (retval0), rec, (param0, param1, param2);
    ld.param.b64 %rd9, [retval0];
    }
    ld.local.u64 %rd10, [%SPL+8];
    ld.local.u64 %rd11, [%SPL];
    mul.lo.s64 %rd12, %rd9, -7046029254386353131;
    add.s64 %rd12, %rd12, %rd10;
    xor.b64 %rd12, %rd12, %rd11;
    add.s64 %rd12, %rd12, %rd3;
    xor.b64 %rd12, %rd12, %rd1;
    st.param.b64 [rv], %rd12;
    ret;
BASE:
    add.s64 %rd13, %rd1, 12345;
    st.param.b64 [rv], %rd13;
    ret;
}
"#;

/// The reference of `rec`.
fn rec(n: u32, x: u64, out: &mut u64) -> u64 {
    *out = x ^ n as u64;
    if n == 0 {
        return x.wrapping_add(12345);
    }
    let b0 = x.wrapping_mul(3).wrapping_add(n as u64);
    let xp = b0.wrapping_add(x >> 3);
    let mut b1 = 0;
    let r = rec(n - 1, xp, &mut b1);
    ((r.wrapping_mul(K).wrapping_add(b1)) ^ b0).wrapping_add(n as u64) ^ x
}

fn cfg(block: u32) -> LaunchConfig {
    LaunchConfig::linear(1, block)
}

/// The validator and (when installed) ptxas accept the test PTX; it prints and parses back.
fn check_ptxas(text: &str) {
    let m = ptx::parse(text).unwrap();
    let diags = ptx::validate(&m);
    assert!(diags.iter().all(|d| !d.is_error()), "validator: {diags:#?}");
    assert_eq!(
        ptx::parse(&ptx::print(&m)).unwrap(),
        m,
        "parse(print(m)) != m"
    );
    if ptx::ptxas::ptxas_for_tests("calls test PTX").is_some() {
        ptx::ptxas::assemble(text, "sm_80", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}"));
    }
}

/// Runs `rec` on `threads` lanes with the given depths; returns (result, depot, x) per lane.
fn run_rec(depths: &[u32], opts: &LaunchOptions) -> Result<(Vec<[u64; 3]>, Vec<u64>), EmuError> {
    let n = depths.len();
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(REC).unwrap(), 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64 * 7 + 1);
    let xs: Vec<u64> = (0..n).map(|_| rng.gen()).collect();
    let pin = mem.alloc(8 * n as u64, 0).unwrap();
    pin.write_bytes(
        0,
        &xs.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    );
    let pd = mem.alloc(4 * n as u64, 0).unwrap();
    pd.write_bytes(
        0,
        &depths
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let pout = mem.alloc(24 * n as u64, 0).unwrap();
    pout.fill(0, 24 * n as u64, &[0xa5]);
    let mut p = Vec::new();
    for b in [pout.base, pin.base, pd.base] {
        p.extend_from_slice(&b.to_le_bytes());
    }
    launch(m.kernel("k")?, mem.snapshot(), p, &cfg(n as u32), opts)?;
    let mut raw = vec![0u8; 24 * n];
    pout.read_bytes(0, &mut raw);
    let got = (0..n)
        .map(|i| {
            let w = |k: usize| u64::from_le_bytes(raw[24 * i + 8 * k..][..8].try_into().unwrap());
            [w(0), w(1), w(2)]
        })
        .collect();
    Ok((got, xs))
}

#[test]
fn recursion_1000_deep_keeps_registers_params_and_locals_per_invocation() {
    check_ptxas(REC);
    // 64 threads (two warps), depths 1000..1063 in a shuffled order: lanes of a warp return
    // at different times (divergent recursion).
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut depths: Vec<u32> = (1000..1064).collect();
    for i in (1..depths.len()).rev() {
        depths.swap(i, rng.gen_range(0..=i));
    }
    let (got, xs) = run_rec(&depths, &LaunchOptions::default()).unwrap();
    for (i, (&d, &x)) in depths.iter().zip(&xs).enumerate() {
        let mut depot = 0;
        let want = rec(d, x, &mut depot);
        assert_eq!(got[i], [want, depot, x], "thread {i}, depth {d}");
    }
}

#[test]
fn shallow_and_zero_depth_calls() {
    let depths: Vec<u32> = (0..40).map(|i| i % 5).collect();
    let (got, xs) = run_rec(&depths, &LaunchOptions::default()).unwrap();
    for (i, (&d, &x)) in depths.iter().zip(&xs).enumerate() {
        let mut depot = 0;
        let want = rec(d, x, &mut depot);
        assert_eq!(got[i], [want, depot, x], "thread {i}, depth {d}");
    }
}

#[test]
fn recursion_past_the_stack_limit_is_a_fault_naming_the_limit() {
    let opts = LaunchOptions {
        stack_bytes: 16 * 1024,
        ..LaunchOptions::default()
    };
    let e = run_rec(&[3, 100_000], &opts).unwrap_err();
    let text = e.to_string();
    match e.fault() {
        Some(FaultKind::StackOverflow { depth, limit }) => {
            assert_eq!(*limit, 16 * 1024);
            assert!(*depth > 10 && *depth < 1000, "{text}");
        }
        other => panic!("expected a stack overflow, got {other:?}: {text}"),
    }
    // the fault site is the call instruction, which names the callee
    assert!(text.contains("rec, (param0"), "{text}");
    assert!(
        text.contains("stack_bytes") && text.contains("16384"),
        "{text}"
    );
    // The same depth fits a larger limit.
    let opts = LaunchOptions {
        stack_bytes: 64 * 1024,
        ..LaunchOptions::default()
    };
    let (got, xs) = run_rec(&[3, 100], &opts).unwrap();
    let mut depot = 0;
    assert_eq!(got[1][0], rec(100, xs[1], &mut depot));
}

/// `even(n)`/`odd(n)` call each other; each keeps `n * seed` in a register across the call.
const MUTUAL: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func (.param .b32 rv) odd(.param .b32 n, .param .b32 s);

.func (.param .b32 rv) even(.param .b32 n, .param .b32 s)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    ld.param.u32 %r1, [n];
    ld.param.u32 %r2, [s];
    mul.lo.s32 %r3, %r1, %r2;
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra DONE;
    add.s32 %r4, %r1, -1;
    {
    .param .b32 param0;
    st.param.b32 [param0], %r4;
    .param .b32 param1;
    st.param.b32 [param1], %r2;
    .param .b32 retval0;
    call.uni (retval0), odd, (param0, param1);
    ld.param.b32 %r5, [retval0];
    }
    xor.b32 %r3, %r3, %r5;
    shf.l.wrap.b32 %r3, %r3, %r3, 5;
DONE:
    st.param.b32 [rv], %r3;
    ret;
}

.func (.param .b32 rv) odd(.param .b32 n, .param .b32 s)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    ld.param.u32 %r1, [n];
    ld.param.u32 %r2, [s];
    add.s32 %r3, %r1, %r2;
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra DONE;
    add.s32 %r4, %r1, -1;
    {
    .param .b32 param0;
    st.param.b32 [param0], %r4;
    .param .b32 param1;
    st.param.b32 [param1], %r2;
    .param .b32 retval0;
    call.uni (retval0), even, (param0, param1);
    ld.param.b32 %r5, [retval0];
    }
    add.s32 %r3, %r3, %r5;
DONE:
    st.param.b32 [rv], %r3;
    ret;
}

.visible .entry m(.param .u64 pout, .param .u64 pin)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pin];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r2, [%rd4];
    and.b32 %r3, %r1, 63;
    {
    .param .b32 param0;
    st.param.b32 [param0], %r3;
    .param .b32 param1;
    st.param.b32 [param1], %r2;
    .param .b32 retval0;
    call.uni (retval0), even, (param0, param1);
    ld.param.b32 %r4, [retval0];
    }
    add.s32 %r5, %r4, %r3;
    add.s64 %rd5, %rd1, %rd3;
    st.global.u32 [%rd5], %r5;
    ret;
}
"#;

fn even(n: u32, s: u32) -> u32 {
    let r = n.wrapping_mul(s);
    if n == 0 {
        return r;
    }
    (r ^ odd(n - 1, s)).rotate_left(5)
}

fn odd(n: u32, s: u32) -> u32 {
    let r = n.wrapping_add(s);
    if n == 0 {
        return r;
    }
    r.wrapping_add(even(n - 1, s))
}

#[test]
fn mutual_recursion_and_forward_declaration() {
    check_ptxas(MUTUAL);
    let n = 96usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let seeds: Vec<u32> = (0..n).map(|_| rng.gen()).collect();
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(MUTUAL).unwrap(), 0).unwrap();
    let pin = mem.alloc(4 * n as u64, 0).unwrap();
    pin.write_bytes(
        0,
        &seeds
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let pout = mem.alloc(4 * n as u64, 0).unwrap();
    pout.fill(0, 4 * n as u64, &[0xa5]);
    let mut p = Vec::new();
    for b in [pout.base, pin.base] {
        p.extend_from_slice(&b.to_le_bytes());
    }
    let k = m.kernel("m").unwrap();
    launch(
        k,
        mem.snapshot(),
        p,
        &cfg(n as u32),
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut raw = vec![0u8; 4 * n];
    pout.read_bytes(0, &mut raw);
    for i in 0..n {
        let got = u32::from_le_bytes(raw[4 * i..][..4].try_into().unwrap());
        let d = (i & 63) as u32;
        assert_eq!(got, even(d, seeds[i]).wrapping_add(d), "thread {i}");
    }
}

/// `.reg` parameters and return value; the recursive call swaps two parameters.
const REG_PARAMS: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func (.reg .b64 %ret) mix(.reg .b32 %n, .reg .b32 %a, .reg .b32 %b)
{
    .reg .pred %p;
    .reg .b32 %t;
    .reg .b64 %x;
    .reg .b64 %y;
    setp.eq.u32 %p, %n, 0;
    @%p bra BASE;
    add.s32 %t, %n, -1;
    call (%x), mix, (%t, %b, %a);
    cvt.u64.u32 %y, %a;
    mad.lo.s64 %ret, %x, 31, %y;
    ret;
BASE:
    mul.wide.u32 %ret, %a, 1000;
    cvt.u64.u32 %y, %b;
    add.s64 %ret, %ret, %y;
    ret;
}

.visible .entry r(.param .u64 pout, .param .u64 pin)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pin];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 8;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.v2.u32 {%r2, %r3}, [%rd4];
    rem.u32 %r4, %r1, 50;
    call (%rd5), mix, (%r4, %r2, %r3);
    add.s64 %rd6, %rd1, %rd3;
    st.global.u64 [%rd6], %rd5;
    ret;
}
"#;

fn mix(n: u32, a: u32, b: u32) -> u64 {
    if n == 0 {
        return (a as u64 * 1000).wrapping_add(b as u64);
    }
    mix(n - 1, b, a).wrapping_mul(31).wrapping_add(a as u64)
}

#[test]
fn reg_parameters_and_return_values_per_invocation() {
    check_ptxas(REG_PARAMS);
    let n = 64usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let ab: Vec<u32> = (0..2 * n).map(|_| rng.gen()).collect();
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(REG_PARAMS).unwrap(), 0).unwrap();
    let pin = mem.alloc(8 * n as u64, 0).unwrap();
    pin.write_bytes(
        0,
        &ab.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    );
    let pout = mem.alloc(8 * n as u64, 0).unwrap();
    pout.fill(0, 8 * n as u64, &[0xa5]);
    let mut p = Vec::new();
    for b in [pout.base, pin.base] {
        p.extend_from_slice(&b.to_le_bytes());
    }
    let k = m.kernel("r").unwrap();
    launch(
        k,
        mem.snapshot(),
        p,
        &cfg(n as u32),
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut raw = vec![0u8; 8 * n];
    pout.read_bytes(0, &mut raw);
    for i in 0..n {
        let got = u64::from_le_bytes(raw[8 * i..][..8].try_into().unwrap());
        let want = mix(i as u32 % 50, ab[2 * i], ab[2 * i + 1]);
        assert_eq!(got, want, "thread {i}");
    }
}
