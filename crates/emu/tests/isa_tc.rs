//! Instruction families new in issue 16 item 3: `wmma` (load / mma / store round trips with the
//! accumulator fragment scaled element-wise in between), sparse `mma.sp`, `movmatrix`, and the
//! per-thread stack (`stacksave`, `stackrestore`, `alloca`). Every kernel is checked by ptxas
//! for its target and run on the emulator against an independent f64 reference on random
//! inputs, outputs poisoned before the launch.
//!
//! Float tensor-core results use the emulator's exact numerics (`Numerics::Exact`) and inputs
//! (multiples of 1/64 below 2 in magnitude) whose products and sums are exact in f64, so the
//! reference is exact whatever the summation order; the only rounding is the final one to the
//! D type, which the reference does the same way (nearest even).

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use half::{bf16, f16};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn ptxas(text: &str, target: &str) {
    if ptx::ptxas::ptxas_for_tests("isa_tc test PTX").is_some() {
        ptx::ptxas::assemble(text, target, &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX for {target}: {e}\n{text}"));
    }
}

fn opts() -> LaunchOptions {
    LaunchOptions {
        numerics: emu::Numerics::Exact,
        ..Default::default()
    }
}

/// Runs kernel `k` (one CTA of `threads`) with one u64 pointer parameter per buffer; buffer
/// `out` is poisoned (0xff bytes: NaN for every float type) first. Returns every buffer after.
fn run(
    text: &str,
    bufs: &[Vec<u8>],
    out: usize,
    threads: u32,
    o: &LaunchOptions,
) -> Result<Vec<Vec<u8>>, String> {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(text).unwrap(), 0).unwrap();
    let mut params = Vec::new();
    let mut ptrs = Vec::new();
    for (i, b) in bufs.iter().enumerate() {
        let p = mem.alloc(b.len() as u64, 0).unwrap();
        if i == out {
            p.fill(0, b.len() as u64, &[0xff]);
        } else {
            p.write_bytes(0, b);
        }
        params.extend_from_slice(&p.base.to_le_bytes());
        ptrs.push(p);
    }
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        params,
        &LaunchConfig::linear(1, threads),
        o,
    )
    .map_err(|e| e.to_string())?;
    Ok(bufs
        .iter()
        .zip(&ptrs)
        .map(|(b, p)| {
            let mut v = vec![0u8; b.len()];
            p.read_bytes(0, &mut v);
            v
        })
        .collect())
}

/// Element types of a wmma test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum El {
    F16,
    Bf16,
    Tf32,
    F32,
    F64,
    S8,
    U8,
    S32,
}

impl El {
    fn name(self) -> &'static str {
        match self {
            El::F16 => "f16",
            El::Bf16 => "bf16",
            El::Tf32 => "tf32",
            El::F32 => "f32",
            El::F64 => "f64",
            El::S8 => "s8",
            El::U8 => "u8",
            El::S32 => "s32",
        }
    }
    fn size(self) -> usize {
        match self {
            El::F16 | El::Bf16 => 2,
            El::S8 | El::U8 => 1,
            El::F64 => 8,
            _ => 4,
        }
    }
    /// A random value exactly representable in the type, and its encoding.
    fn random(self, rng: &mut StdRng, acc: bool) -> (f64, Vec<u8>) {
        let x = rng.gen_range(-127i32..=127) as f64 / 64.0;
        match self {
            El::F16 => (x, f16::from_f64(x).to_le_bytes().to_vec()),
            El::Bf16 => (x, bf16::from_f64(x).to_le_bytes().to_vec()),
            El::Tf32 | El::F32 => (x, (x as f32).to_le_bytes().to_vec()),
            El::F64 => (x, x.to_le_bytes().to_vec()),
            El::S8 => {
                let v = rng.gen_range(-128i32..=127);
                (v as f64, vec![v as i8 as u8])
            }
            El::U8 => {
                let v = rng.gen_range(0i32..=255);
                (v as f64, vec![v as u8])
            }
            El::S32 => {
                // accumulators near the ends of the range make .satfinite clamp
                let v: i32 = if acc && rng.gen_bool(0.5) {
                    let s = if rng.gen_bool(0.5) { 1 } else { -1 };
                    s * (i32::MAX - rng.gen_range(0..300_000))
                } else {
                    rng.gen_range(-1 << 20..1 << 20)
                };
                (v as f64, v.to_le_bytes().to_vec())
            }
        }
    }
    /// The reference result `x` (exact) rounded/clamped to the type, as raw bits.
    fn encode_result(self, x: f64, sat: bool) -> u64 {
        match self {
            El::F16 => f16::from_f64(x).to_bits() as u64,
            El::F32 => (x as f32).to_bits() as u64,
            El::F64 => x.to_bits(),
            El::S32 if sat => x.clamp(i32::MIN as f64, i32::MAX as f64) as i32 as u32 as u64,
            El::S32 => (x as i64) as i32 as u32 as u64,
            _ => unreachable!("not an accumulator type"),
        }
    }
}

/// A wmma round trip: shape, types, memory layouts and strides.
#[derive(Clone, Copy, Debug)]
struct Case {
    shape: (usize, usize, usize),
    ab: (El, El),
    c: El,
    d: El,
    /// row-major A, B, C/D
    rows: (bool, bool, bool),
    /// pass an explicit stride operand (leading dimension + 8)
    stride: bool,
    /// state space of the loads and stores ("global", "shared" through a copy, "" generic)
    space: &'static str,
    sat: bool,
    target: &'static str,
}

/// Registers PTX gives a fragment (the emulator's decoder checks the same counts).
fn frag_regs(el: El, acc: bool, elems: usize) -> usize {
    match el {
        El::F16 if !acc => 8,
        El::F64 => elems / 32,
        _ => elems / 32 * el.size().min(4) / 4,
    }
}

fn reg_list(p: &str, n: usize) -> String {
    let v: Vec<String> = (0..n).map(|i| format!("%{p}{i}")).collect();
    format!("{{{}}}", v.join(", "))
}

struct Mat {
    rows: usize,
    cols: usize,
    ld: usize,
    row_major: bool,
}

impl Mat {
    fn new(rows: usize, cols: usize, row_major: bool, stride: bool) -> Mat {
        let ld = if row_major { cols } else { rows } + if stride { 8 } else { 0 };
        Mat {
            rows,
            cols,
            ld,
            row_major,
        }
    }
    fn elems(&self) -> usize {
        self.ld * if self.row_major { self.rows } else { self.cols }
    }
    fn idx(&self, r: usize, c: usize) -> usize {
        if self.row_major {
            r * self.ld + c
        } else {
            c * self.ld + r
        }
    }
    fn layout(&self) -> &'static str {
        if self.row_major {
            "row"
        } else {
            "col"
        }
    }
}

/// Random matrix in memory layout `mat` (padding random too), values by (row, col).
fn random_mat(rng: &mut StdRng, el: El, mat: &Mat, acc: bool) -> (Vec<f64>, Vec<u8>) {
    let mut vals = vec![0f64; mat.rows * mat.cols];
    let mut bytes = vec![0u8; mat.elems() * el.size()];
    for i in 0..mat.elems() {
        let (v, b) = el.random(rng, acc);
        bytes[i * el.size()..][..el.size()].copy_from_slice(&b);
        let (r, c) = if mat.row_major {
            (i / mat.ld, i % mat.ld)
        } else {
            (i % mat.ld, i / mat.ld)
        };
        if r < mat.rows && c < mat.cols {
            vals[r * mat.cols + c] = v;
        }
    }
    (vals, bytes)
}

/// Declarations and the instruction scaling every C fragment element by 2 (integers: negated).
fn scale_c(el: El, n: usize) -> String {
    (0..n)
        .map(|i| match el {
            El::F32 => format!("    mul.f32 %c{i}, %c{i}, 0f40000000;\n"),
            El::F64 => format!("    mul.f64 %c{i}, %c{i}, 0d4000000000000000;\n"),
            El::F16 => format!("    mul.rn.f16x2 %c{i}, %c{i}, %two;\n"),
            _ => format!("    neg.s32 %c{i}, %c{i};\n"),
        })
        .collect()
}

fn reg_ty(el: El) -> &'static str {
    match el {
        El::F32 => ".f32",
        El::F64 => ".f64",
        _ => ".b32",
    }
}

/// Copies `bytes` bytes from global `src` to shared `dst` (one warp, 4 bytes a lane a step),
/// for the `.shared` variant.
fn copy_to_shared(src: &str, dst: &str, bytes: usize, tag: &str) -> String {
    format!(
        r#"    mov.u32 %w1, 0;
CP{tag}:
    shl.b32 %w2, %w1, 7;
    shl.b32 %w3, %w0, 2;
    add.u32 %w2, %w2, %w3;
    setp.lt.u32 %q0, %w2, {bytes};
    @!%q0 bra DONE{tag};
    cvt.u64.u32 %x1, %w2;
    add.s64 %x2, {src}, %x1;
    ld.global.u32 %w4, [%x2];
    mov.u32 %w5, {dst};
    add.u32 %w5, %w5, %w2;
    st.shared.u32 [%w5], %w4;
    add.u32 %w1, %w1, 1;
    bra CP{tag};
DONE{tag}:
"#
    )
}

fn wmma_kernel(cs: &Case, mats: &[Mat; 4], bytes: [usize; 3]) -> String {
    let (m, n, k) = cs.shape;
    let shape = format!("m{m}n{n}k{k}");
    let (ra, rb, rc) = (
        frag_regs(cs.ab.0, false, m * k),
        frag_regs(cs.ab.1, false, k * n),
        frag_regs(cs.c, true, m * n),
    );
    let rd = frag_regs(cs.d, true, m * n);
    let sp = if cs.space.is_empty() {
        String::new()
    } else {
        format!(".{}", cs.space)
    };
    let st = |i: usize| {
        if cs.stride {
            format!(", {}", mats[i].ld)
        } else {
            String::new()
        }
    };
    let types = if cs.ab.0 == El::F16 {
        format!("{}.{}", cs.d.name(), cs.c.name())
    } else {
        format!(
            "{}.{}.{}.{}",
            cs.d.name(),
            cs.ab.0.name(),
            cs.ab.1.name(),
            cs.c.name()
        )
    };
    let sat = if cs.sat { ".satfinite" } else { "" };
    let (pa, pb, pc) = if cs.space == "shared" {
        ("%sa", "%sb", "%sc")
    } else {
        ("%rd1", "%rd2", "%rd3")
    };
    let mut pre = String::new();
    if cs.space == "shared" {
        pre.push_str(&copy_to_shared("%rd1", "smA", bytes[0], "A"));
        pre.push_str(&copy_to_shared("%rd2", "smB", bytes[1], "B"));
        pre.push_str(&copy_to_shared("%rd3", "smC", bytes[2], "C"));
        pre.push_str("    bar.sync 0;\n    mov.u32 %sa, smA;\n    mov.u32 %sb, smB;\n    mov.u32 %sc, smC;\n");
    }
    let shared_decl = if cs.space == "shared" {
        format!(
            ".shared .align 16 .b8 smA[{}];\n.shared .align 16 .b8 smB[{}];\n.shared .align 16 .b8 smC[{}];\n",
            bytes[0], bytes[1], bytes[2]
        )
    } else {
        String::new()
    };
    format!(
        r#".version 8.5
.target {target}
.address_size 64
{shared_decl}.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd)
{{
    .reg .pred %q<2>;
    .reg .b32 %w<8>, %sa, %sb, %sc, %two;
    .reg .b64 %x<4>, %rd<6>;
    .reg {abty} %a<16>, %b<16>;
    .reg {cty} %c<8>;
    .reg {dty} %d<8>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u64 %rd4, [pd];
    mov.u32 %w0, %tid.x;
    mov.b32 %two, 0x40004000;
{pre}    wmma.load.a.sync.aligned.{la}.{shape}{sp}.{at} {fa}, [{pa}]{sa};
    wmma.load.b.sync.aligned.{lb}.{shape}{sp}.{bt} {fb}, [{pb}]{sb};
    wmma.load.c.sync.aligned.{lc}.{shape}{sp}.{ct} {fc}, [{pc}]{sc};
{scale}    wmma.mma.sync.aligned.{la}.{lb}.{shape}.{types}{sat} {fd}, {fa}, {fb}, {fc};
    wmma.store.d.sync.aligned.{lc}.{shape}.global.{dt} [%rd4], {fd}{sd};
    ret;
}}
"#,
        target = cs.target,
        abty = reg_ty(cs.ab.0),
        cty = reg_ty(cs.c),
        dty = reg_ty(cs.d),
        la = mats[0].layout(),
        lb = mats[1].layout(),
        lc = mats[2].layout(),
        at = cs.ab.0.name(),
        bt = cs.ab.1.name(),
        ct = cs.c.name(),
        dt = cs.d.name(),
        fa = reg_list("a", ra),
        fb = reg_list("b", rb),
        fc = reg_list("c", rc),
        fd = reg_list("d", rd),
        sa = st(0),
        sb = st(1),
        sc = st(2),
        sd = st(3),
        scale = scale_c(cs.c, rc),
    )
}

fn wmma_case(cs: Case, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (m, n, k) = cs.shape;
    let mats = [
        Mat::new(m, k, cs.rows.0, cs.stride),
        Mat::new(k, n, cs.rows.1, cs.stride),
        Mat::new(m, n, cs.rows.2, cs.stride),
        Mat::new(m, n, cs.rows.2, cs.stride),
    ];
    let (av, ab) = random_mat(&mut rng, cs.ab.0, &mats[0], false);
    let (bv, bb) = random_mat(&mut rng, cs.ab.1, &mats[1], false);
    let (cv, cb) = random_mat(&mut rng, cs.c, &mats[2], true);
    let db = vec![0u8; mats[3].elems() * cs.d.size()];
    let text = wmma_kernel(&cs, &mats, [ab.len(), bb.len(), cb.len()]);
    ptxas(&text, cs.target);
    let out =
        run(&text, &[ab, bb, cb, db], 3, 32, &opts()).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let int = matches!(cs.c, El::S32);
    for r in 0..m {
        for c in 0..n {
            let mut s = 0f64;
            for kk in 0..k {
                s += av[r * k + kk] * bv[kk * n + c];
            }
            let cc = cv[r * n + c];
            s += if int { -cc } else { 2.0 * cc };
            let want = cs.d.encode_result(s, cs.sat);
            let sz = cs.d.size();
            let o = mats[3].idx(r, c) * sz;
            let mut raw = [0u8; 8];
            raw[..sz].copy_from_slice(&out[3][o..o + sz]);
            let got = u64::from_le_bytes(raw);
            assert_eq!(
                got, want,
                "{cs:?}: D[{r}][{c}] = {got:#x}, want {want:#x} ({s})"
            );
        }
    }
}

const BASE: Case = Case {
    shape: (16, 16, 16),
    ab: (El::F16, El::F16),
    c: El::F32,
    d: El::F32,
    rows: (true, false, true),
    stride: false,
    space: "global",
    sat: false,
    // ptxas 13.5 no longer takes sm_70; the forms are the Volta ones
    target: "sm_75",
};

#[test]
fn wmma_f16_every_shape_and_layout() {
    let mut seed = 1;
    for shape in [(16, 16, 16), (32, 8, 16), (8, 32, 16)] {
        for (acc, rows, stride, space) in [
            ((El::F32, El::F32), (true, false, true), false, "global"),
            ((El::F16, El::F16), (false, true, false), true, ""),
            ((El::F16, El::F32), (true, true, true), true, "shared"),
            ((El::F32, El::F16), (false, false, false), false, "global"),
        ] {
            seed += 1;
            wmma_case(
                Case {
                    shape,
                    c: acc.0,
                    d: acc.1,
                    rows,
                    stride,
                    space,
                    ..BASE
                },
                seed,
            );
        }
    }
}

#[test]
fn wmma_bf16_tf32_f64_forms() {
    for (i, shape) in [(16, 16, 16), (32, 8, 16), (8, 32, 16)]
        .into_iter()
        .enumerate()
    {
        wmma_case(
            Case {
                shape,
                ab: (El::Bf16, El::Bf16),
                stride: i == 1,
                rows: (i != 2, i == 2, true),
                target: "sm_80",
                ..BASE
            },
            100 + i as u64,
        );
    }
    wmma_case(
        Case {
            shape: (16, 16, 8),
            ab: (El::Tf32, El::Tf32),
            space: "shared",
            target: "sm_80",
            ..BASE
        },
        110,
    );
    wmma_case(
        Case {
            shape: (8, 8, 4),
            ab: (El::F64, El::F64),
            c: El::F64,
            d: El::F64,
            rows: (false, true, false),
            stride: true,
            target: "sm_80",
            ..BASE
        },
        111,
    );
}

#[test]
fn wmma_integer_forms_wrap_and_saturate() {
    let mut seed = 200;
    for shape in [(16, 16, 16), (32, 8, 16), (8, 32, 16)] {
        for (ab, sat) in [
            ((El::S8, El::S8), true),
            ((El::U8, El::U8), false),
            ((El::U8, El::U8), true),
        ] {
            seed += 1;
            wmma_case(
                Case {
                    shape,
                    ab,
                    c: El::S32,
                    d: El::S32,
                    sat,
                    stride: seed % 2 == 0,
                    target: "sm_75",
                    ..BASE
                },
                seed,
            );
        }
    }
}

/// Loads `nin` u32 per lane (lane-major) into %i0.., runs `body`, stores %o0..%o{nout-1}.
fn lane_kernel(target: &str, nin: usize, nout: usize, decl: &str, body: &str) -> String {
    let mut s = format!(
        r#".version 8.5
.target {target}
.address_size 64
.visible .entry k(.param .u64 pin, .param .u64 pout)
{{
    .reg .b32 %i<{ni}>, %o<{no}>, %t;
    .reg .b64 %rd<6>;
{decl}    ld.param.u64 %rd1, [pin];
    ld.param.u64 %rd2, [pout];
    mov.u32 %t, %tid.x;
    mul.wide.u32 %rd3, %t, {bi};
    add.s64 %rd1, %rd1, %rd3;
    mul.wide.u32 %rd3, %t, {bo};
    add.s64 %rd2, %rd2, %rd3;
"#,
        ni = nin.max(1),
        no = nout.max(1),
        bi = 4 * nin,
        bo = 4 * nout
    );
    for i in 0..nin {
        s.push_str(&format!("    ld.global.u32 %i{i}, [%rd1+{}];\n", 4 * i));
    }
    s.push_str(body);
    for i in 0..nout {
        s.push_str(&format!("    st.global.u32 [%rd2+{}], %o{i};\n", 4 * i));
    }
    s.push_str("    ret;\n}\n");
    s
}

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bytes_of(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn movmatrix_transposes_the_ldmatrix_fragment() {
    let text = lane_kernel(
        "sm_75",
        1,
        1,
        "",
        "    movmatrix.sync.aligned.m8n8.trans.b16 %o0, %i0;\n",
    );
    ptxas(&text, "sm_75");
    let mut rng = StdRng::seed_from_u64(7);
    let input: Vec<u32> = (0..32).map(|_| rng.gen()).collect();
    // element (r, c) of the 8x8 matrix: lane 4r + c/2, half c%2
    let el = |r: usize, c: usize| (input[4 * r + c / 2] >> (16 * (c % 2))) & 0xffff;
    let out = run(&text, &[bytes_of(&input), vec![0; 128]], 1, 32, &opts()).unwrap();
    let got = words(&out[1]);
    for (lane, &g) in got.iter().enumerate() {
        let (r, q) = (lane / 4, lane % 4);
        let want = el(2 * q, r) | (el(2 * q + 1, r) << 16);
        assert_eq!(g, want, "lane {lane}");
    }
}

/// Sparse `mma.sp` m16n8k16 f16/bf16 -> f32 with every sparsity selector; lanes that do not
/// provide metadata hold random garbage in the metadata register.
#[test]
fn mma_sp_m16n8k16_metadata_and_selector() {
    for (ty, sel, sp) in [
        ("f16", 0u32, "sp"),
        ("f16", 1, "sp::ordered_metadata"),
        ("bf16", 2, "sp"),
        ("f16", 3, "sp::ordered_metadata"),
    ] {
        let body = format!(
            "    mma.{sp}.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%f0, %f1, %f2, %f3}}, \
             {{%i0, %i1}}, {{%i2, %i3}}, {{%c0, %c1, %c2, %c3}}, %i8, {sel};\n"
        );
        let mut full = String::new();
        for i in 0..4 {
            full.push_str(&format!("    mov.b32 %c{i}, %i{};\n", 4 + i));
        }
        full.push_str(&body);
        for i in 0..4 {
            full.push_str(&format!("    mov.b32 %o{i}, %f{i};\n"));
        }
        let text = lane_kernel("sm_80", 9, 4, "    .reg .f32 %f<4>, %c<4>;\n", &full);
        ptxas(&text, "sm_80");
        let mut rng = StdRng::seed_from_u64(300 + sel as u64);
        let enc = |x: f64| -> u32 {
            if ty == "f16" {
                f16::from_f64(x).to_bits() as u32
            } else {
                bf16::from_f64(x).to_bits() as u32
            }
        };
        let val = |rng: &mut StdRng| rng.gen_range(-127i32..=127) as f64 / 64.0;
        // dense A with two non-zeros in each group of 4, their positions, B, C
        let mut a = [[0f64; 16]; 16];
        let mut comp = [[0u32; 8]; 16];
        let mut meta = [0u32; 16];
        for r in 0..16 {
            for j in 0..4 {
                let i0 = rng.gen_range(0..3usize);
                let i1 = rng.gen_range(i0 + 1..4usize);
                for (slot, idx) in [i0, i1].into_iter().enumerate() {
                    let v = val(&mut rng);
                    a[r][4 * j + idx] = v;
                    comp[r][2 * j + slot] = enc(v);
                    meta[r] |= (idx as u32) << (4 * j + 2 * slot);
                }
            }
        }
        let b: Vec<Vec<f64>> = (0..16)
            .map(|_| (0..8).map(|_| val(&mut rng)).collect())
            .collect();
        let c: Vec<Vec<f64>> = (0..16)
            .map(|_| (0..8).map(|_| val(&mut rng)).collect())
            .collect();
        let mut input = vec![0u32; 32 * 9];
        for lane in 0..32 {
            let (g, q) = (lane / 4, lane % 4);
            let w = &mut input[9 * lane..9 * lane + 9];
            // compressed A as a dense m16n8k8 A fragment
            w[0] = comp[g][2 * q] | comp[g][2 * q + 1] << 16;
            w[1] = comp[g + 8][2 * q] | comp[g + 8][2 * q + 1] << 16;
            // B (k16 x n8): register i holds k = 2q + 8i and 2q + 8i + 1, column g
            for i in 0..2 {
                w[2 + i] = enc(b[2 * q + 8 * i][g]) | enc(b[2 * q + 8 * i + 1][g]) << 16;
            }
            // C: element i at (g + 8*(i/2), 2q + i%2)
            for i in 0..4 {
                w[4 + i] = (c[g + 8 * (i / 2)][2 * q + i % 2] as f32).to_bits();
            }
            w[8] = if q as u32 == sel {
                meta[g] | meta[g + 8] << 16
            } else {
                rng.gen()
            };
        }
        let out = run(&text, &[bytes_of(&input), vec![0; 512]], 1, 32, &opts()).unwrap();
        let got = words(&out[1]);
        for lane in 0..32 {
            let (g, q) = (lane / 4, lane % 4);
            for i in 0..4 {
                let (r, col) = (g + 8 * (i / 2), 2 * q + i % 2);
                let mut s = c[r][col];
                for kk in 0..16 {
                    s += a[r][kk] * b[kk][col];
                }
                let want = (s as f32).to_bits();
                assert_eq!(got[4 * lane + i], want, "{ty} sel {sel}: D[{r}][{col}]");
            }
        }
    }
}

const STACK_FUNC: &str = r#"
.func (.param .b64 res) fill(.param .b32 pn, .param .b32 pseed)
{
    .reg .b64 %p, %q, %s, %a;
    .reg .b32 %i, %v, %seed;
    .reg .pred %z;
    ld.param.u32 %seed, [pseed];
    stacksave.u64 %s;
    alloca.u64 %p, 96, 32;
    // the callee's allocation is 32-aligned and fills it; the caller's data must survive
    mov.u32 %i, 0;
F:
    add.u32 %v, %i, %seed;
    mul.wide.u32 %q, %i, 4;
    add.s64 %q, %p, %q;
    st.local.u32 [%q], %v;
    add.u32 %i, %i, 1;
    setp.lt.u32 %z, %i, 24;
    @%z bra F;
    and.b64 %a, %p, 31;
    st.param.b64 [res], %a;
    stackrestore.u64 %s;
    ret;
}
"#;

fn stack_kernel(extra: u32) -> String {
    format!(
        r#".version 8.5
.target sm_80
.address_size 64
{STACK_FUNC}
.visible .entry k(.param .u64 pin, .param .u64 pout)
{{
    .reg .b64 %rd<16>;
    .reg .b32 %r<16>;
    .reg .pred %z;
    ld.param.u64 %rd1, [pin];
    ld.param.u64 %rd2, [pout];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd1, %rd1, %rd3;
    ld.global.u32 %r2, [%rd1];
    mul.wide.u32 %rd3, %r1, 32;
    add.s64 %rd2, %rd2, %rd3;
    // n = x % 13 + 1 + {extra} words
    rem.u32 %r3, %r2, 13;
    add.u32 %r3, %r3, {extra};
    add.u32 %r3, %r3, 1;
    stacksave.u64 %rd4;
    shl.b32 %r4, %r3, 2;
    cvt.u64.u32 %rd5, %r4;
    alloca.u64 %rd6, %rd5, 16;
    alloca.u64 %rd7, 8, 64;
    // fill the first array with x + i
    mov.u32 %r5, 0;
L:
    add.u32 %r6, %r2, %r5;
    mul.wide.u32 %rd8, %r5, 4;
    add.s64 %rd8, %rd6, %rd8;
    st.local.u32 [%rd8], %r6;
    add.u32 %r5, %r5, 1;
    setp.lt.u32 %z, %r5, %r3;
    @%z bra L;
    st.local.u64 [%rd7], %rd6;
    {{
    .param .b32 a0;
    .param .b32 a1;
    .param .b64 r0;
    st.param.b32 [a0], %r3;
    st.param.b32 [a1], %r2;
    call.uni (r0), fill, (a0, a1);
    ld.param.b64 %rd13, [r0];
    st.global.u64 [%rd2+8], %rd13;
    }}
    // sum the array back (through a generic address)
    cvta.local.u64 %rd9, %rd6;
    mov.u32 %r5, 0;
    mov.u32 %r7, 0;
S:
    mul.wide.u32 %rd8, %r5, 4;
    add.s64 %rd8, %rd9, %rd8;
    ld.u32 %r6, [%rd8];
    add.u32 %r7, %r7, %r6;
    add.u32 %r5, %r5, 1;
    setp.lt.u32 %z, %r5, %r3;
    @%z bra S;
    st.global.u32 [%rd2], %r7;
    ld.local.u64 %rd10, [%rd7];
    sub.s64 %rd10, %rd10, %rd6;
    and.b64 %rd11, %rd6, 15;
    or.b64 %rd10, %rd10, %rd11;
    and.b64 %rd11, %rd7, 63;
    or.b64 %rd10, %rd10, %rd11;
    st.global.u64 [%rd2+16], %rd10;
    // after stackrestore the next allocation reuses the first one's memory
    stackrestore.u64 %rd4;
    alloca.u64 %rd12, 4, 16;
    sub.s64 %rd12, %rd12, %rd6;
    st.global.u64 [%rd2+24], %rd12;
    ret;
}}
"#
    )
}

#[test]
fn alloca_stacksave_stackrestore() {
    let text = stack_kernel(0);
    ptxas(&text, "sm_80");
    let mut rng = StdRng::seed_from_u64(400);
    let input: Vec<u32> = (0..64).map(|_| rng.gen_range(0..1u32 << 24)).collect();
    let out = run(&text, &[bytes_of(&input), vec![0; 64 * 32]], 1, 64, &opts()).unwrap();
    for (t, &x) in input.iter().enumerate() {
        let o = &out[1][32 * t..32 * t + 32];
        let q = |i: usize| u64::from_le_bytes(o[8 * i..8 * i + 8].try_into().unwrap());
        let n = (x % 13 + 1) as u64;
        let want: u64 = (0..n).map(|i| x as u64 + i).sum::<u64>() & 0xffff_ffff;
        assert_eq!(
            q(0) & 0xffff_ffff,
            want,
            "thread {t}: sum of its alloca'd array"
        );
        assert_eq!(q(1), 0, "thread {t}: callee's alloca is 32-byte aligned");
        assert_eq!(
            q(2),
            0,
            "thread {t}: stored pointer intact, both arrays aligned"
        );
        assert_eq!(q(3), 0, "thread {t}: stackrestore frees the allocations");
    }
}

#[test]
fn alloca_past_the_stack_limit_is_a_clear_fault() {
    let text = stack_kernel(5000);
    let input = vec![3u32; 32];
    let o = LaunchOptions {
        stack_bytes: 16 * 1024,
        ..opts()
    };
    let err = run(&text, &[bytes_of(&input), vec![0; 32 * 32]], 1, 32, &o).unwrap_err();
    assert!(
        err.contains("alloca") && err.contains("16384"),
        "unexpected error: {err}"
    );
    // a size near 2^64 is the same clear fault, not an arithmetic overflow
    let huge = lane_kernel(
        "sm_80",
        0,
        1,
        "    .reg .b64 %s, %p;\n",
        "    mov.b64 %s, -8;\n    alloca.u64 %p, %s, 8;\n    cvt.u32.u64 %o0, %p;\n",
    );
    ptxas(&huge, "sm_80");
    let err = run(&huge, &[vec![0; 4], vec![0; 128]], 1, 32, &o).unwrap_err();
    assert!(err.contains("alloca"), "unexpected error: {err}");
    // the same kernel fits a larger stack
    let o = LaunchOptions {
        stack_bytes: 64 * 1024,
        ..opts()
    };
    run(&text, &[bytes_of(&input), vec![0; 32 * 32]], 1, 32, &o).unwrap();
}

/// The validator accepts the test kernels and names what is wrong in malformed forms; the
/// printer's output parses back to the same module.
#[test]
fn validator_and_printer_know_the_new_forms() {
    let good = [
        stack_kernel(0),
        lane_kernel(
            "sm_75",
            1,
            1,
            "",
            "    movmatrix.sync.aligned.m8n8.trans.b16 %o0, %i0;\n",
        ),
        wmma_kernel(
            &BASE,
            &[
                Mat::new(16, 16, true, false),
                Mat::new(16, 16, false, false),
                Mat::new(16, 16, true, false),
                Mat::new(16, 16, true, false),
            ],
            [512, 512, 1024],
        ),
    ];
    for text in &good {
        let m = ptx::parse(text).unwrap();
        let errs = ptx::validate::validate_errors(&m);
        assert!(errs.is_empty(), "{errs:?}\n{text}");
        let again = ptx::parse(&m.to_string()).unwrap();
        assert_eq!(again, m, "print/parse round trip");
    }
    for (body, what) in [
        (
            "    movmatrix.sync.aligned.m8n8.b16 %o0, %i0;\n",
            "movmatrix",
        ),
        ("    alloca.u32 %o0, 16, 12;\n", "power of two"),
        ("    stacksave.s32 %o0;\n", ".u32 or .u64"),
    ] {
        let text = lane_kernel("sm_80", 1, 1, "", body);
        let diags = ptx::validate::validate_errors(&ptx::parse(&text).unwrap());
        assert!(
            diags.iter().any(|d| d.to_string().contains(what)),
            "{body}: {diags:?}"
        );
    }
}
