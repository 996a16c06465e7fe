//! Vectors, functions and symbols of the PTX ISA (issue 16, item 3), each kernel checked by the
//! validator, `parse(print(m)) == m` and ptxas, then run on the emulator against a host
//! reference on random inputs with poisoned outputs:
//!
//! - vector registers used whole (`ld`/`st`/`mov.v4`) and by component (`%v.x`..`.w`,
//!   `.r`..`.a`), brace vectors with `_` sinks, vector-to-vector `mov` (a swap included);
//! - vector `.reg` parameters and return values, several return values, recursion through
//!   vector registers, forward declarations defined later, `.weak` functions, and the clear
//!   error of a call to an `.extern` function the module does not define;
//! - indirect calls through `.callprototype` with function addresses from `mov` and from a
//!   function table in an initialiser, lanes of a warp calling different functions, and the
//!   fault of a pointer that names no function;
//! - `WARP_SZ`, `.global`/`.const`/`.shared` variables declared in a function body (shadowing
//!   a module variable of the same name), `[var+imm]`, `var+imm` as a value, `generic()` in
//!   initialisers, and `cvta`/`cvta.to` on global, const, local, param, shared::cta and
//!   shared::cluster.

use emu::{launch, EmuError, FaultKind, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::{Rng, SeedableRng};

/// Validator, round trip and (when installed) ptxas accept `text` for `arch`; `extra` are
/// further ptxas arguments (`-c` for a module with unresolved externs).
fn check_ptxas(text: &str, arch: &str, extra: &[&str]) {
    let m = ptx::parse(text).unwrap();
    let diags = ptx::validate(&m);
    assert!(diags.iter().all(|d| !d.is_error()), "validator: {diags:#?}");
    assert_eq!(
        ptx::parse(&ptx::print(&m)).unwrap(),
        m,
        "parse(print(m)) != m"
    );
    // what `ptxforge check` reports: the emulator refuses nothing (except the extern call)
    let refused = emu::coverage::unsupported(&m);
    assert!(
        refused.iter().all(|r| r.why.contains("only declared")),
        "{refused:#?}"
    );
    if ptx::ptxas::ptxas_for_tests("isa_func test PTX").is_some() {
        let opts = ptx::ptxas::PtxasOptions {
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        ptx::ptxas::assemble(text, arch, &opts)
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}"));
        // the printed module is what ptxforge hands on: ptxas must take it too
        ptx::ptxas::assemble(&ptx::print(&m), arch, &opts)
            .unwrap_or_else(|e| panic!("ptxas rejects the printed test PTX: {e}"));
    }
}

/// Launches `kernel` on one CTA of `threads` with parameters (output, inputs..., `extra`
/// bytes); the output (`out_bytes`) is poisoned with 0xff (NaN for floats) first.
fn run(
    text: &str,
    kernel: &str,
    threads: u32,
    inputs: &[Vec<u32>],
    out_bytes: usize,
    extra: &[u8],
) -> Result<Vec<u32>, EmuError> {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(text).unwrap(), 0)?;
    let out = mem.alloc(out_bytes as u64, 0).unwrap();
    out.fill(0, out_bytes as u64, &[0xff]);
    let mut params = out.base.to_le_bytes().to_vec();
    let mut keep = Vec::new();
    for x in inputs {
        let a = mem.alloc(4 * x.len() as u64, 0).unwrap();
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        a.write_bytes(0, &bytes);
        params.extend_from_slice(&a.base.to_le_bytes());
        keep.push(a);
    }
    params.extend_from_slice(extra);
    let cfg = LaunchConfig::linear(1, threads);
    launch(
        m.kernel(kernel)?,
        mem.snapshot(),
        params,
        &cfg,
        &LaunchOptions::default(),
    )?;
    let mut raw = vec![0u8; out_bytes];
    out.read_bytes(0, &mut raw);
    Ok(raw
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A random finite f32 of moderate magnitude, as bits.
fn rand_f32(r: &mut impl Rng) -> u32 {
    (r.gen_range(-1.0e6f64..1.0e6) as f32).to_bits()
}

/// f32 sum/difference rounded once from the exact f64 value (a sum of two f32 is exact in f64).
fn f32_add(a: u32, b: u32) -> u32 {
    ((f32::from_bits(a) as f64 + f32::from_bits(b) as f64) as f32).to_bits()
}
fn f32_sub(a: u32, b: u32) -> u32 {
    ((f32::from_bits(a) as f64 - f32::from_bits(b) as f64) as f32).to_bits()
}

const VECTORS: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry vec(.param .u64 pout, .param .u64 pin)
{
    .reg .v4 .b32 %v;
    .reg .v4 .b32 %w;
    .reg .v2 .b32 %u<2>;
    .reg .v4 .f32 %f;
    .reg .b32 %r<8>;
    .reg .f32 %s<2>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pin];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 32;
    add.s64 %rd4, %rd2, %rd3;
    mul.wide.u32 %rd3, %r1, 64;
    add.s64 %rd5, %rd1, %rd3;
    ld.global.v4.b32 %v, [%rd4];
    ld.global.v4.f32 %f, [%rd4+16];
    mov.v4.b32 %w, %v;
    add.u32 %w.x, %v.y, %v.z;
    xor.b32 %w.g, %v.r, %v.a;
    mul.lo.u32 %w.w, %w.x, %v.w;
    add.f32 %s1, %f.x, %f.y;
    sub.f32 %f.b, %f.w, %f.z;
    mov.v2.b32 %u0, {%v.w, %v.z};
    mov.v2.b32 {%r2, %r3}, %u0;
    mov.v2.b32 %u1, %u0;
    mov.v2.b32 {%u1.x, %u1.y}, {%u1.y, %u1.x};
    ld.global.v4.b32 {%r4, _, %r5, _}, [%rd4];
    st.global.v4.b32 [%rd5], %w;
    st.global.v4.f32 [%rd5+16], %f;
    st.global.v4.b32 [%rd5+32], {%r2, %r3, %u1.x, %u1.y};
    st.global.v4.b32 [%rd5+48], {%r4, %r5, %s1, %u0.y};
    ret;
}
"#;

#[test]
fn vector_registers_whole_and_by_component() {
    check_ptxas(VECTORS, "sm_80", &[]);
    let n = 64usize;
    let mut r = rng(1);
    let input: Vec<u32> = (0..8 * n)
        .map(|i| if i % 8 < 4 { r.gen() } else { rand_f32(&mut r) })
        .collect();
    let got = run(
        VECTORS,
        "vec",
        n as u32,
        std::slice::from_ref(&input),
        64 * n,
        &[],
    )
    .unwrap();
    for t in 0..n {
        let v = &input[8 * t..8 * t + 4];
        let f = &input[8 * t + 4..8 * t + 8];
        let wx = v[1].wrapping_add(v[2]);
        let w = [wx, v[0] ^ v[3], v[2], wx.wrapping_mul(v[3])];
        let fo = [f[0], f[1], f32_sub(f[3], f[2]), f[3]];
        let s1 = f32_add(f[0], f[1]);
        let want: Vec<u32> = [w, fo, [v[3], v[2], v[2], v[3]], [v[0], v[2], s1, v[2]]].concat();
        assert_eq!(&got[16 * t..16 * t + 16], &want[..], "thread {t}");
    }
}

/// Vector `.reg` parameters and several return values (ptxas: several return values must be
/// `.reg`), the callee forward-declared before the kernel and defined after it; a `.weak`
/// function.
const VEC_PARAMS: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func (.reg .v2 .f32 %r, .reg .b32 %q) vf(.reg .v4 .b32 %a, .reg .f32 %s);

.weak .func (.reg .b64 %d) wide(.reg .b32 %x, .param .b32 y)
{
    .reg .b32 %t;
    ld.param.b32 %t, [y];
    mul.wide.u32 %d, %x, %t;
    ret;
}

.visible .entry vp(.param .u64 pout, .param .u64 pin)
{
    .reg .v4 .b32 %v;
    .reg .v2 .f32 %o;
    .reg .b32 %q;
    .reg .b32 %n;
    .reg .f32 %f;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pin];
    mov.u32 %n, %tid.x;
    mul.wide.u32 %rd3, %n, 32;
    add.s64 %rd4, %rd2, %rd3;
    add.s64 %rd5, %rd1, %rd3;
    ld.global.v4.b32 %v, [%rd4];
    ld.global.f32 %f, [%rd4+16];
    call (%o, %q), vf, (%v, %f);
    {
    .param .b32 param0;
    st.param.b32 [param0], %v.w;
    call (%rd6), wide, (%q, param0);
    }
    st.global.v2.f32 [%rd5], %o;
    st.global.b32 [%rd5+8], %q;
    st.global.b64 [%rd5+16], %rd6;
    ret;
}

.func (.reg .v2 .f32 %r, .reg .b32 %q) vf(.reg .v4 .b32 %a, .reg .f32 %s)
{
    .reg .f32 %t;
    mov.b32 %t, %a.y;
    add.f32 %r.x, %t, %s;
    mov.b32 %r.y, %a.w;
    xor.b32 %q, %a.x, %a.z;
    ret;
}
"#;

#[test]
fn vector_reg_parameters_several_returns_forward_declaration_and_weak() {
    check_ptxas(VEC_PARAMS, "sm_80", &[]);
    let n = 48usize;
    let mut r = rng(2);
    let input: Vec<u32> = (0..8 * n)
        .map(|i| {
            if i % 8 == 1 || i % 8 == 4 {
                rand_f32(&mut r)
            } else {
                r.gen()
            }
        })
        .collect();
    let got = run(
        VEC_PARAMS,
        "vp",
        n as u32,
        std::slice::from_ref(&input),
        32 * n,
        &[],
    )
    .unwrap();
    for t in 0..n {
        let a = &input[8 * t..8 * t + 8];
        let q = a[0] ^ a[2];
        let d = q as u64 * a[3] as u64;
        let want = [
            f32_add(a[1], a[4]),
            a[3],
            q,
            0xffff_ffff,
            d as u32,
            (d >> 32) as u32,
        ];
        assert_eq!(&got[8 * t..8 * t + 6], &want[..], "thread {t}");
    }
}

/// Recursion through vector `.reg` parameters and return values: each invocation's vector
/// registers survive its recursive call.
const VEC_REC: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func (.reg .v2 .b32 %r) vrec(.reg .b32 %n, .reg .v2 .b32 %a)
{
    .reg .pred %p;
    .reg .b32 %m;
    .reg .v2 .b32 %b;
    .reg .v2 .b32 %x;
    setp.eq.u32 %p, %n, 0;
    @%p bra BASE;
    add.u32 %m, %n, -1;
    add.u32 %b.x, %a.y, %n;
    mul.lo.u32 %b.y, %a.x, 3;
    call (%x), vrec, (%m, %b);
    add.u32 %r.x, %x.x, %a.x;
    xor.b32 %r.y, %x.y, %a.y;
    ret;
BASE:
    mov.v2.b32 %r, %a;
    ret;
}

.visible .entry vr(.param .u64 pout, .param .u64 pin)
{
    .reg .v2 .b32 %a;
    .reg .v2 .b32 %y;
    .reg .b32 %n;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pin];
    mov.u32 %n, %tid.x;
    mul.wide.u32 %rd3, %n, 8;
    add.s64 %rd4, %rd2, %rd3;
    add.s64 %rd5, %rd1, %rd3;
    ld.global.v2.b32 %a, [%rd4];
    rem.u32 %n, %n, 40;
    call (%y), vrec, (%n, %a);
    st.global.v2.b32 [%rd5], %y;
    ret;
}
"#;

fn vrec(n: u32, a: [u32; 2]) -> [u32; 2] {
    if n == 0 {
        return a;
    }
    let x = vrec(n - 1, [a[1].wrapping_add(n), a[0].wrapping_mul(3)]);
    [x[0].wrapping_add(a[0]), x[1] ^ a[1]]
}

#[test]
fn recursion_through_vector_registers() {
    check_ptxas(VEC_REC, "sm_80", &[]);
    let n = 64usize;
    let mut r = rng(3);
    let input: Vec<u32> = (0..2 * n).map(|_| r.gen()).collect();
    let got = run(
        VEC_REC,
        "vr",
        n as u32,
        std::slice::from_ref(&input),
        8 * n,
        &[],
    )
    .unwrap();
    for t in 0..n {
        let want = vrec(t as u32 % 40, [input[2 * t], input[2 * t + 1]]);
        assert_eq!(&got[2 * t..2 * t + 2], &want[..], "thread {t}");
    }
}

const EXTERN: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.extern .func (.param .b32 rv) ext(.param .b32 a);

.visible .entry k(.param .u64 pout)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [pout];
    mov.u32 %r1, %tid.x;
    {
    .param .b32 param0;
    st.param.b32 [param0], %r1;
    .param .b32 retval0;
    call (retval0), ext, (param0);
    ld.param.b32 %r2, [retval0];
    }
    st.global.u32 [%rd1], %r2;
    ret;
}
"#;

#[test]
fn calling_an_undefined_extern_function_is_a_clear_error() {
    // ptxas takes it as relocatable code (`-c`); linking would have to supply `ext`
    check_ptxas(EXTERN, "sm_80", &["-c"]);
    let e = run(EXTERN, "k", 32, &[], 4, &[]).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, EmuError::Unsupported { .. }) && text.contains("`ext` is only declared"),
        "{text}"
    );
}

/// Indirect calls: a table of function addresses in an initialiser, an address taken with
/// `mov`, and one `.callprototype`; lanes of a warp call different functions.
const INDIRECT: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func (.param .b32 rv) f1(.param .b32 a)
{
    .reg .b32 %r<3>;
    ld.param.b32 %r1, [a];
    mul.lo.s32 %r2, %r1, 3;
    st.param.b32 [rv], %r2;
    ret;
}

.func (.param .b32 rv) f2(.param .b32 a)
{
    .reg .b32 %r<3>;
    ld.param.b32 %r1, [a];
    xor.b32 %r2, %r1, 0x5a5a;
    st.param.b32 [rv], %r2;
    ret;
}

.weak .func (.param .b32 rv) f3(.param .b32 a)
{
    .reg .b32 %r<3>;
    ld.param.b32 %r1, [a];
    shl.b32 %r2, %r1, 5;
    add.s32 %r2, %r2, WARP_SZ;
    st.param.b32 [rv], %r2;
    ret;
}

.global .align 8 .u64 table[3] = {f1, f2, f3};

.visible .entry ind(.param .u64 pout, .param .u64 pin, .param .u64 psel)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;
    .reg .pred %p;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pin];
    ld.param.u64 %rd3, [psel];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %rd2, %rd4;
    ld.global.u32 %r2, [%rd5];
    add.s64 %rd5, %rd3, %rd4;
    ld.global.u32 %r3, [%rd5];
    rem.u32 %r4, %r3, 3;
    mul.wide.u32 %rd6, %r4, 8;
    mov.u64 %rd7, table;
    add.s64 %rd7, %rd7, %rd6;
    ld.global.u64 %rd8, [%rd7];
    mov.u64 %rd9, f2;
    rem.u32 %r5, %r3, 5;
    setp.eq.u32 %p, %r5, 0;
    @%p mov.u64 %rd8, %rd9;
    {
    .param .b32 param0;
    st.param.b32 [param0], %r2;
    .param .b32 retval0;
    prototype_0 : .callprototype (.param .b32 _) _ (.param .b32 _);
    call (retval0), %rd8, (param0), prototype_0;
    ld.param.b32 %r6, [retval0];
    }
    add.s64 %rd5, %rd1, %rd4;
    st.global.u32 [%rd5], %r6;
    ret;
}
"#;

/// [`INDIRECT`] with its call through a `.calltargets` list instead of a prototype.
fn with_calltargets() -> String {
    INDIRECT
        .replace(
            "prototype_0 : .callprototype (.param .b32 _) _ (.param .b32 _);",
            "Ftable: .calltargets f1, f2, f3;",
        )
        .replace("(param0), prototype_0;", "(param0), Ftable;")
}

#[test]
fn indirect_calls_through_a_prototype_a_calltargets_list_and_a_function_table() {
    for (form, text) in [
        ("prototype", INDIRECT.to_string()),
        ("calltargets", with_calltargets()),
    ] {
        assert!(text.contains("Ftable") == (form == "calltargets"));
        check_ptxas(&text, "sm_80", &[]);
        let n = 96usize;
        let mut r = rng(4 + form.len() as u64);
        let a: Vec<u32> = (0..n).map(|_| r.gen()).collect();
        let sel: Vec<u32> = (0..n).map(|_| r.gen()).collect();
        let got = run(
            &text,
            "ind",
            n as u32,
            &[a.clone(), sel.clone()],
            4 * n,
            &[],
        )
        .unwrap();
        check_indirect(&a, &sel, &got, form);
    }
}

/// Compares the results of [`INDIRECT`] with the host functions.
fn check_indirect(a: &[u32], sel: &[u32], got: &[u32], form: &str) {
    for t in 0..a.len() {
        let f = if sel[t].is_multiple_of(5) {
            1
        } else {
            sel[t] % 3
        };
        let want = match f {
            0 => a[t].wrapping_mul(3),
            1 => a[t] ^ 0x5a5a,
            _ => (a[t] << 5).wrapping_add(32),
        };
        assert_eq!(got[t], want, "{form}: thread {t} (function f{})", f + 1);
    }
}

#[test]
fn an_indirect_call_through_a_non_function_address_faults() {
    // the table's own address is no function
    let bad = INDIRECT.replace("ld.global.u64 %rd8, [%rd7];", "mov.u64 %rd8, %rd7;");
    check_ptxas(&bad, "sm_80", &[]);
    let e = run(&bad, "ind", 32, &[vec![1; 32], vec![1; 32]], 128, &[]).unwrap_err();
    let text = e.to_string();
    match e.fault() {
        Some(FaultKind::Other(why)) => {
            assert!(why.contains("prototype_0"), "{text}")
        }
        other => panic!("expected a fault, got {other:?}: {text}"),
    }
}

/// Predefined `WARP_SZ`; variables declared in a function body (a function-scope `cnt`
/// shadowing the module's, two functions' own `sh` and `cnt`, a kernel-scope `kg`); `[var+imm]`, `[var]`, `var+imm` as a value; `generic()` in
/// initialisers; `cvta`/`cvta.to` on every state space.
const SYMBOLS: &str = r#"
.version 8.0
.target sm_90
.address_size 64

.global .align 8 .u32 gv[4] = {11, 22, 33, 44};
.global .align 8 .u64 gp = generic(gv);
.global .align 8 .u64 gq[2] = {gv, generic(gv)+8};
.const .align 4 .u32 kc[2] = {7, 9};
.global .align 4 .u32 cnt = 1000;

.func (.reg .b32 %o) counter(.reg .b32 %x)
{
    .global .align 4 .u32 cnt = 5;
    .const .align 4 .u32 cst[2] = {100, 200};
    .shared .align 4 .u32 sh[64];
    .reg .b32 %t<4>;
    .reg .b64 %a<3>;
    ld.global.u32 %t1, [cnt];
    ld.const.u32 %t2, [cst+4];
    mov.u32 %t3, %tid.x;
    mul.wide.u32 %a1, %t3, 4;
    mov.u64 %a2, sh;
    add.s64 %a2, %a2, %a1;
    ld.shared.u32 %t3, [%a2];
    st.shared.u32 [%a2], %x;
    add.u32 %o, %t1, %t2;
    add.u32 %o, %o, %t3;
    ret;
}

.func (.reg .b32 %o) counter2(.reg .b32 %y)
{
    .global .align 4 .u32 cnt = 9;
    .shared .align 4 .u32 sh[64];
    .reg .b32 %t;
    .reg .b64 %a<3>;
    mov.u32 %t, %tid.x;
    mul.wide.u32 %a1, %t, 4;
    mov.u64 %a2, sh;
    add.s64 %a2, %a2, %a1;
    st.shared.u32 [%a2], %y;
    ld.global.u32 %t, [cnt];
    ld.shared.u32 %o, [%a2];
    add.u32 %o, %o, %t;
    ret;
}

.visible .entry sym(.param .u64 pout, .param .u32 pk)
{
    .reg .pred %p;
    .reg .b32 %r<20>;
    .reg .b64 %rd<24>;
    .shared .align 4 .u32 ksh[64];
    .local .align 8 .u32 lv[2];
    .global .align 4 .u32 kg = 77;
    ld.param.u64 %rd1, [pout];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd2, %r0, 80;
    add.s64 %rd1, %rd1, %rd2;
    mov.u64 %rd2, gv+8;
    ld.global.u32 %r1, [%rd2];
    ld.global.u32 %r2, [gv+4];
    ld.global.u32 %r3, [gv];
    add.u32 %r4, %r0, WARP_SZ;
    ld.global.u64 %rd3, [gp];
    ld.u32 %r5, [%rd3+12];
    ld.global.u64 %rd3, [gq+8];
    ld.u32 %r6, [%rd3];
    mov.u64 %rd4, pk;
    cvta.param.u64 %rd5, %rd4;
    ld.u32 %r7, [%rd5];
    cvta.to.param.u64 %rd6, %rd5;
    ld.param.u32 %r8, [%rd6];
    add.u32 %r8, %r8, %r0;
    mad.lo.u32 %r9, %r0, 7, %r7;
    call (%r19), counter, (%r9);
    xor.b32 %r19, %r9, 1234;
    call (%r19), counter2, (%r19);
    call (%r9), counter, (%r9);
    mul.wide.u32 %rd7, %r0, 4;
    mov.u64 %rd8, ksh;
    add.s64 %rd8, %rd8, %rd7;
    cvta.shared::cta.u64 %rd9, %rd8;
    cvta.to.shared::cta.u64 %rd10, %rd9;
    setp.eq.u64 %p, %rd10, %rd8;
    selp.u32 %r10, 1, 0, %p;
    cvta.shared::cluster.u64 %rd11, %rd8;
    cvta.to.shared::cluster.u64 %rd12, %rd11;
    setp.eq.u64 %p, %rd12, %rd8;
    selp.u32 %r11, 1, 0, %p;
    xor.b32 %r12, %r7, %r0;
    st.shared.u32 [%rd8], %r12;
    ld.u32 %r12, [%rd9];
    st.local.u32 [lv+4], %r9;
    mov.u64 %rd13, lv;
    cvta.local.u64 %rd14, %rd13;
    ld.u32 %r13, [%rd14+4];
    cvta.to.local.u64 %rd15, %rd14;
    setp.eq.u64 %p, %rd15, %rd13;
    selp.u32 %r14, 1, 0, %p;
    mov.u64 %rd16, kc;
    cvta.const.u64 %rd17, %rd16;
    ld.u32 %r15, [%rd17+4];
    mov.u64 %rd18, gv;
    cvta.global.u64 %rd19, %rd18;
    cvta.to.global.u64 %rd20, %rd19;
    ld.global.u32 %r16, [%rd20+12];
    ld.global.u32 %r17, [cnt];
    st.global.v4.u32 [%rd1], {%r1, %r2, %r3, %r4};
    st.global.v4.u32 [%rd1+16], {%r5, %r6, %r7, %r8};
    st.global.v4.u32 [%rd1+32], {%r9, %r10, %r11, %r12};
    st.global.v4.u32 [%rd1+48], {%r13, %r14, %r15, %r16};
    ld.global.u32 %r18, [kg];
    st.global.v2.u32 [%rd1+64], {%r17, %r18};
    st.global.u32 [%rd1+72], %r19;
    ret;
}
"#;

#[test]
fn warp_sz_function_scope_variables_addresses_and_cvta_on_every_space() {
    check_ptxas(SYMBOLS, "sm_90", &[]);
    let n = 64usize;
    let k: u32 = rng(5).gen();
    let got = run(SYMBOLS, "sym", n as u32, &[], 80 * n, &k.to_le_bytes()).unwrap();
    for t in 0..n as u32 {
        let counter = t.wrapping_mul(7).wrapping_add(k).wrapping_add(205);
        let want = [
            33,
            22,
            11,
            t + 32,
            44,
            33,
            k,
            k.wrapping_add(t),
            counter,
            1,
            1,
            k ^ t,
            counter,
            1,
            9,
            44,
            1000,
            77,
            (t.wrapping_mul(7).wrapping_add(k) ^ 1234).wrapping_add(9),
        ];
        let t = t as usize;
        assert_eq!(&got[20 * t..20 * t + 19], &want[..], "thread {t}");
    }
}

/// The other predefined identifiers of the ISA read the emulator's model: `WARP_SZ` 32, no
/// programmed performance counters, no reserved shared memory, no CUDA graph (all 0).
const PREDEFINED: &str = r#"
.version 8.0
.target sm_90
.address_size 64

.visible .entry pre(.param .u64 pout)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [pout];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd2, %r0, 48;
    add.s64 %rd1, %rd1, %rd2;
    mov.u32 %r1, WARP_SZ;
    mul.lo.u32 %r2, %r0, WARP_SZ;
    mov.u32 %r3, %pm0;
    mov.u32 %r4, %pm7;
    mov.u32 %r5, %reserved_smem_offset_begin;
    mov.u32 %r6, %reserved_smem_offset_end;
    mov.u32 %r7, %reserved_smem_offset_cap;
    mov.u32 %r8, %reserved_smem_offset_1;
    mov.u64 %rd3, %pm3_64;
    mov.u64 %rd4, %current_graph_exec;
    st.global.v4.u32 [%rd1], {%r1, %r2, %r3, %r4};
    st.global.v4.u32 [%rd1+16], {%r5, %r6, %r7, %r8};
    st.global.v2.u64 [%rd1+32], {%rd3, %rd4};
    ret;
}
"#;

#[test]
fn predefined_identifiers() {
    check_ptxas(PREDEFINED, "sm_90", &[]);
    let n = 40usize;
    let got = run(PREDEFINED, "pre", n as u32, &[], 48 * n, &[]).unwrap();
    for t in 0..n {
        let mut want = [0u32; 12];
        want[0] = 32;
        want[1] = 32 * t as u32;
        assert_eq!(&got[12 * t..12 * t + 12], &want[..], "thread {t}");
    }
}

/// An indirect call with `.reg` parameters and return value; neighbouring lanes call
/// different functions (the warp diverges at the call and meets again after it).
const INDIRECT_REG: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func (.reg .b32 %o) g1(.reg .b32 %a)
{
    add.u32 %o, %a, 1;
    ret;
}

.func (.reg .b32 %o) g2(.reg .b32 %a)
{
    .reg .b32 %t;
    mul.lo.u32 %t, %a, 5;
    xor.b32 %o, %t, %a;
    ret;
}

.visible .entry k(.param .u64 pout, .param .u64 pin)
{
    .reg .b64 %rd<6>;
    .reg .b32 %r<4>;
    .reg .pred %p;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd4, [pin];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd4, %rd4, %rd5;
    add.s64 %rd1, %rd1, %rd5;
    ld.global.u32 %r0, [%rd4];
    mov.u64 %rd2, g1;
    mov.u64 %rd3, g2;
    and.b32 %r2, %r1, 1;
    setp.eq.u32 %p, %r2, 1;
    @%p mov.u64 %rd2, %rd3;
    proto: .callprototype (.reg .b32 _) _ (.reg .b32 _);
    call (%r3), %rd2, (%r0), proto;
    add.u32 %r3, %r3, %r1;
    st.global.u32 [%rd1], %r3;
    ret;
}
"#;

#[test]
fn indirect_calls_with_reg_parameters_diverge_per_lane() {
    check_ptxas(INDIRECT_REG, "sm_80", &[]);
    let n = 64usize;
    let mut r = rng(6);
    let a: Vec<u32> = (0..n).map(|_| r.gen()).collect();
    let got = run(
        INDIRECT_REG,
        "k",
        n as u32,
        std::slice::from_ref(&a),
        4 * n,
        &[],
    )
    .unwrap();
    for t in 0..n {
        let v = if t % 2 == 1 {
            a[t].wrapping_mul(5) ^ a[t]
        } else {
            a[t].wrapping_add(1)
        };
        assert_eq!(got[t], v.wrapping_add(t as u32), "thread {t}");
    }
}
