//! Extended-precision integer arithmetic with the carry flag (`add.cc`, `addc[.cc]`, `sub.cc`,
//! `subc[.cc]`, `mad{.lo,.hi}.cc`, `madc{.lo,.hi}[.cc]` on u32/s32/u64/s64): every form against
//! u128/i128 arithmetic on random inputs with both carry-in values, and multi-word chains
//! (128-bit add, subtract and 64x64->128 multiply in 32-bit limbs) against u128.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::{Rng, SeedableRng};

const N: usize = 256;

fn check_ptxas(text: &str) {
    if ptx::ptxas::ptxas_for_tests("carry test PTX").is_some() {
        ptx::ptxas::assemble(text, "sm_80", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}\n{text}"));
    }
}

/// Runs a kernel `k(out, a, b, c, d)` over N threads: four u64 inputs per thread, `nout` u64
/// outputs per thread.
fn run(text: &str, ins: [&[u64]; 4], nout: usize) -> Vec<Vec<u64>> {
    let diags = ptx::validate(&ptx::parse(text).unwrap());
    assert!(
        diags.iter().all(|d| !d.is_error()),
        "validator: {diags:?}\n{text}"
    );
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(text).unwrap(), 0).unwrap();
    let out = mem.alloc((N * 8 * nout) as u64, 0).unwrap();
    out.fill(0, (N * 8 * nout) as u64, &[0xa5]);
    let mut p = out.base.to_le_bytes().to_vec();
    let mut keep = Vec::new();
    for v in ins {
        let b = mem.alloc((N * 8) as u64, 0).unwrap();
        b.write_bytes(
            0,
            &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
        );
        p.extend_from_slice(&b.base.to_le_bytes());
        keep.push(b);
    }
    let cfg = LaunchConfig::linear((N / 128) as u32, 128);
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut raw = vec![0u8; N * 8 * nout];
    out.read_bytes(0, &mut raw);
    (0..N)
        .map(|i| {
            (0..nout)
                .map(|k| u64::from_le_bytes(raw[8 * (i * nout + k)..][..8].try_into().unwrap()))
                .collect()
        })
        .collect()
}

/// A kernel: loads a, b, c, cin of its thread into `%rd1..%rd4` (and 32-bit halves into
/// `%r1..%r4`), runs `body`, stores `%rd10..` (`nout` of them).
fn kernel(body: &str, nout: usize) -> String {
    let stores: String = (0..nout)
        .map(|k| format!("    st.global.u64 [%rd9+{}], %rd{};\n", 8 * k, 10 + k))
        .collect();
    format!(
        r#".version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 po, .param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd)
{{
    .reg .b32 %r<40>;
    .reg .b64 %rd<120>;
    mov.u32 %r0, %tid.x;
    mov.u32 %r5, %ctaid.x;
    mad.lo.u32 %r0, %r5, 128, %r0;
    mul.wide.u32 %rd5, %r0, 8;
    ld.param.u64 %rd6, [pa];
    add.s64 %rd6, %rd6, %rd5;
    ld.global.u64 %rd1, [%rd6];
    ld.param.u64 %rd6, [pb];
    add.s64 %rd6, %rd6, %rd5;
    ld.global.u64 %rd2, [%rd6];
    ld.param.u64 %rd6, [pc];
    add.s64 %rd6, %rd6, %rd5;
    ld.global.u64 %rd3, [%rd6];
    ld.param.u64 %rd6, [pd];
    add.s64 %rd6, %rd6, %rd5;
    ld.global.u64 %rd4, [%rd6];
    cvt.u32.u64 %r1, %rd1;
    cvt.u32.u64 %r2, %rd2;
    cvt.u32.u64 %r3, %rd3;
    cvt.u32.u64 %r4, %rd4;
    mul.lo.u32 %r6, %r0, {nout};
    mul.wide.u32 %rd7, %r6, 8;
    ld.param.u64 %rd9, [po];
    add.s64 %rd9, %rd9, %rd7;
{body}
{stores}    ret;
}}
"#
    )
}

#[derive(Clone, Copy, Debug)]
enum Form {
    Add,
    Sub,
    MadLo,
    MadHi,
}

/// Reference: (d, carry-out) of one form with carry-in `cin` (0 when the form takes none).
fn reference(form: Form, ty: &str, a: u64, b: u64, c: u64, cin: u64) -> (u64, u64) {
    let w = if ty.ends_with("64") { 64 } else { 32 };
    let mask = if w == 64 { u64::MAX } else { 0xffff_ffff };
    let (a, b, c) = (a & mask, b & mask, c & mask);
    let signed = ty.starts_with('s');
    let sx = |x: u64| -> i128 {
        if w == 64 {
            x as i64 as i128
        } else {
            x as u32 as i32 as i128
        }
    };
    let full: u128 = match form {
        Form::Add => a as u128 + b as u128 + cin as u128,
        Form::Sub => {
            let sub = b as u128 + cin as u128;
            let d = (a as u128).wrapping_sub(sub) & mask as u128;
            return (d as u64, (sub > a as u128) as u64);
        }
        Form::MadLo => ((a as u128 * b as u128) & mask as u128) + c as u128 + cin as u128,
        Form::MadHi => {
            let hi = if signed {
                ((sx(a) * sx(b)) >> w) as u128 & mask as u128
            } else {
                (a as u128 * b as u128) >> w
            };
            hi + c as u128 + cin as u128
        }
    };
    ((full & mask as u128) as u64, (full >> w) as u64)
}

#[test]
fn every_carry_form_matches_u128_reference() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let edge = [
        0u64,
        1,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        u64::MAX,
        1 << 63,
    ];
    let gen = |i: usize, rng: &mut rand::rngs::StdRng| -> u64 {
        if i.is_multiple_of(4) {
            edge[rng.gen_range(0..edge.len())]
        } else {
            rng.gen()
        }
    };
    let a: Vec<u64> = (0..N).map(|i| gen(i, &mut rng)).collect();
    let b: Vec<u64> = (0..N).map(|i| gen(i + 1, &mut rng)).collect();
    let c: Vec<u64> = (0..N).map(|i| gen(i + 2, &mut rng)).collect();
    let cin: Vec<u64> = (0..N).map(|_| rng.gen_range(0..2)).collect();
    let forms = [
        ("add.cc", Form::Add, false, true),
        ("addc", Form::Add, true, false),
        ("addc.cc", Form::Add, true, true),
        ("sub.cc", Form::Sub, false, true),
        ("subc", Form::Sub, true, false),
        ("subc.cc", Form::Sub, true, true),
        ("mad.lo.cc", Form::MadLo, false, true),
        ("mad.hi.cc", Form::MadHi, false, true),
        ("madc.lo", Form::MadLo, true, false),
        ("madc.lo.cc", Form::MadLo, true, true),
        ("madc.hi", Form::MadHi, true, false),
        ("madc.hi.cc", Form::MadHi, true, true),
    ];
    let mut body = String::new();
    let mut cases = Vec::new();
    for ty in ["u32", "s32", "u64", "s64"] {
        let (r, mov) = if ty.ends_with("64") {
            ("%rd", "mov.b64")
        } else {
            ("%r", "mov.b32")
        };
        for (name, form, takes_cin, sets_cout) in forms {
            let k = cases.len();
            let (dd, cf) = (10 + 2 * k, 11 + 2 * k);
            let tmp = if r == "%rd" { 119 } else { 20 };
            let srcs = match form {
                Form::Add | Form::Sub => format!("{r}1, {r}2"),
                _ => format!("{r}1, {r}2, {r}3"),
            };
            // CF := cin, the form, then CF read back with addc.
            body.push_str(&format!(
                "    add.cc.u32 %r30, %r4, -1;\n    {name}.{ty} {r}{tmp}, {srcs};\n    addc.u32 %r31, 0, 0;\n"
            ));
            if r == "%rd" {
                body.push_str(&format!("    {mov} %rd{dd}, %rd119;\n"));
            } else {
                body.push_str(&format!("    cvt.u64.u32 %rd{dd}, %r20;\n"));
            }
            body.push_str(&format!("    cvt.u64.u32 %rd{cf}, %r31;\n"));
            cases.push((format!("{name}.{ty}"), form, ty, takes_cin, sets_cout));
        }
    }
    let text = kernel(&body, 2 * cases.len());
    check_ptxas(&text);
    let got = run(&text, [&a, &b, &c, &cin], 2 * cases.len());
    for i in 0..N {
        for (k, (name, form, ty, takes_cin, sets_cout)) in cases.iter().enumerate() {
            let ci = if *takes_cin { cin[i] } else { 0 };
            let (d, co) = reference(*form, ty, a[i], b[i], c[i], ci);
            let want_cf = if *sets_cout { co } else { cin[i] };
            assert_eq!(
                (got[i][2 * k], got[i][2 * k + 1]),
                (d, want_cf),
                "{name} a={:#x} b={:#x} c={:#x} cin={}",
                a[i],
                b[i],
                c[i],
                cin[i]
            );
        }
    }
}

#[test]
fn multiword_add_sub_mul_chains_match_u128() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let edge = [0u64, u64::MAX, 1 << 63, 0xffff_ffff];
    let rnd = |i: usize, rng: &mut rand::rngs::StdRng| {
        if i.is_multiple_of(5) {
            edge[rng.gen_range(0..4)]
        } else {
            rng.gen()
        }
    };
    let v: [Vec<u64>; 4] = std::array::from_fn(|j| (0..N).map(|i| rnd(i + j, &mut rng)).collect());
    // x = (rd2:rd1), y = (rd4:rd3) as u128; limbs in %r.
    let body = r#"
    mov.b64 {%r10, %r11}, %rd1;
    mov.b64 {%r12, %r13}, %rd2;
    mov.b64 {%r14, %r15}, %rd3;
    mov.b64 {%r16, %r17}, %rd4;
    add.cc.u32 %r20, %r10, %r14;
    addc.cc.u32 %r21, %r11, %r15;
    addc.cc.u32 %r22, %r12, %r16;
    addc.u32 %r23, %r13, %r17;
    mov.b64 %rd10, {%r20, %r21};
    mov.b64 %rd11, {%r22, %r23};
    sub.cc.u32 %r20, %r10, %r14;
    subc.cc.u32 %r21, %r11, %r15;
    subc.cc.u32 %r22, %r12, %r16;
    subc.u32 %r23, %r13, %r17;
    mov.b64 %rd12, {%r20, %r21};
    mov.b64 %rd13, {%r22, %r23};
    mul.lo.u32 %r20, %r10, %r14;
    mul.hi.u32 %r21, %r10, %r14;
    mad.lo.cc.u32 %r21, %r10, %r15, %r21;
    madc.hi.u32 %r22, %r10, %r15, 0;
    mad.lo.cc.u32 %r21, %r11, %r14, %r21;
    madc.hi.cc.u32 %r22, %r11, %r14, %r22;
    addc.u32 %r23, 0, 0;
    mad.lo.cc.u32 %r22, %r11, %r15, %r22;
    madc.hi.u32 %r23, %r11, %r15, %r23;
    mov.b64 %rd14, {%r20, %r21};
    mov.b64 %rd15, {%r22, %r23};
    add.cc.u64 %rd20, %rd1, %rd3;
    addc.u64 %rd21, %rd2, %rd4;
    mov.b64 %rd16, %rd20;
    mov.b64 %rd17, %rd21;
"#;
    let text = kernel(body, 8);
    check_ptxas(&text);
    let got = run(&text, [&v[0], &v[1], &v[2], &v[3]], 8);
    for i in 0..N {
        let x = (v[1][i] as u128) << 64 | v[0][i] as u128;
        let y = (v[3][i] as u128) << 64 | v[2][i] as u128;
        let pair = |lo: u64, hi: u64| (hi as u128) << 64 | lo as u128;
        let g = &got[i];
        assert_eq!(
            pair(g[0], g[1]),
            x.wrapping_add(y),
            "128-bit add, thread {i}"
        );
        assert_eq!(
            pair(g[2], g[3]),
            x.wrapping_sub(y),
            "128-bit sub, thread {i}"
        );
        assert_eq!(
            pair(g[4], g[5]),
            v[0][i] as u128 * v[2][i] as u128,
            "64x64 multiply, thread {i}"
        );
        assert_eq!(
            pair(g[6], g[7]),
            x.wrapping_add(y),
            "u64-limb add, thread {i}"
        );
    }
}
