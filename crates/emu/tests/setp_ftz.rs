//! `setp.ftz` / `set.ftz` compare subnormal f32 and f16 operands as zero (PTX ISA, setp: "`.ftz`
//! flushes subnormal inputs to sign-preserving zero"). The emulator used to ignore `.ftz` on
//! comparisons, so libdevice's `-ftz=true` code took the wrong branch for subnormal inputs
//! (cbrtf gave NaN, powf(0, subnormal) 0, log1pf(-subnormal) +0, tgammaf(-subnormal) +inf; found
//! by `tests/libdevice.rs`). Reference: the host's IEEE comparison of the flushed values.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// The comparison operators, in bit order of the result masks.
const OPS: [&str; 14] = [
    "eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan",
];

/// A kernel that, per thread, compares f32 `a[i]`, `b[i]` and the f16 halves of `h[i]` with every
/// operator, with and without `.ftz`, and stores 5 masks: f32 ftz, f32 plain, f16 ftz, f16
/// plain, and `set.<op>.ftz.u32.f32` (all ones when true) folded to bits.
fn kernel() -> String {
    let mut body = String::new();
    for (bit, op) in OPS.iter().enumerate() {
        for (k, (ty, ftz, x, y)) in [
            ("f32", ".ftz", "%f1", "%f2"),
            ("f32", "", "%f1", "%f2"),
            ("f16", ".ftz", "%h1", "%h2"),
            ("f16", "", "%h1", "%h2"),
        ]
        .iter()
        .enumerate()
        {
            body += &format!(
                "    setp.{op}{ftz}.{ty} %p1, {x}, {y};\n    selp.u32 %r10, {}, 0, %p1;\n    or.b32 %r{}, %r{}, %r10;\n",
                1u32 << bit,
                20 + k,
                20 + k
            );
        }
        body += &format!(
            "    set.{op}.ftz.u32.f32 %r10, %f1, %f2;\n    and.b32 %r10, %r10, {};\n    or.b32 %r24, %r24, %r10;\n",
            1u32 << bit
        );
    }
    format!(
        r#".version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 pout, .param .u64 pa, .param .u64 pb, .param .u64 ph)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<32>;
    .reg .b64 %rd<12>;
    .reg .f32 %f<4>;
    .reg .f16 %h<4>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [pa];
    ld.param.u64 %rd3, [pb];
    ld.param.u64 %rd4, [ph];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd6, %rd2, %rd5;
    ld.global.f32 %f1, [%rd6];
    add.s64 %rd6, %rd3, %rd5;
    ld.global.f32 %f2, [%rd6];
    add.s64 %rd6, %rd4, %rd5;
    ld.global.b32 %r2, [%rd6];
    mov.b32 {{%h1, %h2}}, %r2;
    mov.u32 %r20, 0;
    mov.u32 %r21, 0;
    mov.u32 %r22, 0;
    mov.u32 %r23, 0;
    mov.u32 %r24, 0;
{body}    mul.wide.u32 %rd7, %r1, 20;
    add.s64 %rd7, %rd1, %rd7;
    st.global.u32 [%rd7], %r20;
    st.global.u32 [%rd7+4], %r21;
    st.global.u32 [%rd7+8], %r22;
    st.global.u32 [%rd7+12], %r23;
    st.global.u32 [%rd7+16], %r24;
    ret;
}}
"#
    )
}

/// The 14-operator mask of a host comparison of `a`, `b` (unordered forms: NaN or ordered).
fn mask(a: f32, b: f32) -> u32 {
    let nan = a.is_nan() || b.is_nan();
    let r = [
        a == b,
        a != b && !nan,
        a < b,
        a <= b,
        a > b,
        a >= b,
        a == b || nan,
        a != b,
        nan || a < b,
        nan || a <= b,
        nan || a > b,
        nan || a >= b,
        !nan,
        nan,
    ];
    r.iter()
        .enumerate()
        .fold(0, |m, (i, &t)| m | (u32::from(t) << i))
}

fn flush32(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0
    } else {
        x
    }
}

fn f16(bits: u16, ftz: bool) -> f32 {
    if ftz && bits & 0x7c00 == 0 {
        0.0
    } else {
        half::f16::from_bits(bits).to_f32()
    }
}

/// A random f32 that is often subnormal, zero or special (so pairs often tie after flushing).
fn pick32(rng: &mut StdRng) -> f32 {
    let sign = if rng.gen() { 0x8000_0000 } else { 0 };
    let bits = match rng.gen_range(0..6) {
        0 | 1 => rng.gen_range(1..0x0080_0000), // subnormal
        2 => [0, 0x7f80_0000, 0x7fc0_0000][rng.gen_range(0..3)], // 0, inf, NaN
        3 => 0x0080_0000 + rng.gen_range(0..4), // smallest normals
        _ => rng.gen_range(0x0080_0000..0x7f80_0000),
    };
    f32::from_bits(bits | sign)
}

fn pick16(rng: &mut StdRng) -> u16 {
    let sign = if rng.gen() { 0x8000 } else { 0 };
    let bits = match rng.gen_range(0..5) {
        0 | 1 => rng.gen_range(1..0x0400),
        2 => [0, 0x7c00, 0x7e00][rng.gen_range(0..3)],
        _ => rng.gen_range(0x0400..0x7c00),
    };
    bits | sign
}

#[test]
fn setp_and_set_ftz_compare_subnormals_as_zero() {
    let text = kernel();
    if ptx::ptxas::ptxas_for_tests("setp_ftz test PTX").is_some() {
        ptx::ptxas::assemble(&text, "sm_80", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}\n{text}"));
    }
    let seed: u64 = rand::random();
    let mut rng = StdRng::seed_from_u64(seed);
    let n = 256;
    let a: Vec<f32> = (0..n).map(|_| pick32(&mut rng)).collect();
    let b: Vec<f32> = (0..n)
        .map(|i| if i % 4 == 0 { -a[i] } else { pick32(&mut rng) })
        .collect();
    let h: Vec<(u16, u16)> = (0..n)
        .map(|_| (pick16(&mut rng), pick16(&mut rng)))
        .collect();
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
    let upload = |bytes: Vec<u8>| {
        let buf = mem.alloc(bytes.len() as u64, 0).unwrap();
        buf.write_bytes(0, &bytes);
        buf
    };
    let out = mem.alloc(20 * n as u64, 0).unwrap();
    out.fill(0, 20 * n as u64, &[0xa5]);
    let ins = [
        upload(a.iter().flat_map(|x| x.to_le_bytes()).collect()),
        upload(b.iter().flat_map(|x| x.to_le_bytes()).collect()),
        upload(
            h.iter()
                .flat_map(|&(x, y)| (x as u32 | (y as u32) << 16).to_le_bytes())
                .collect(),
        ),
    ];
    let mut params = out.base.to_le_bytes().to_vec();
    for buf in &ins {
        params.extend_from_slice(&buf.base.to_le_bytes());
    }
    let cfg = LaunchConfig::linear(1, n as u32);
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        params,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut raw = vec![0u8; 20 * n];
    out.read_bytes(0, &mut raw);
    for i in 0..n {
        let got: Vec<u32> = (0..5)
            .map(|k| u32::from_le_bytes(raw[20 * i + 4 * k..][..4].try_into().unwrap()))
            .collect();
        let (x, y) = h[i];
        let want = [
            mask(flush32(a[i]), flush32(b[i])),
            mask(a[i], b[i]),
            mask(f16(x, true), f16(y, true)),
            mask(f16(x, false), f16(y, false)),
            mask(flush32(a[i]), flush32(b[i])),
        ];
        assert_eq!(
            got, want,
            "seed {seed}: a {:#x} b {:#x} h {x:#x} {y:#x} (masks: f32 ftz, f32, f16 ftz, f16, set.ftz)",
            a[i].to_bits(),
            b[i].to_bits()
        );
    }
}
