//! Texture and surface instructions (issue 16 item 3) on the emulator, unified mode (objects are
//! `.u64` kernel parameters built with `emu::texture::TexDesc`), against host references written
//! here from the PTX ISA and the CUDA Programming Guide's "Texture Fetching" appendix:
//! `suld.b`/`sust.b` in 1D/2D/3D for every element size and vector width with `.zero`/`.clamp`
//! loads and `.zero` stores, `.trap` faults; `sured.b` (add/min/max/and/or on u32/s32/b32/u64);
//! `suq`, `txq`; `tex` with point and linear filtering, every address mode, normalized and
//! unnormalized coordinates, f32/f16/u8/u16 formats and 1/2/4 channels, integer fetches with
//! `.s32` coordinates; `tld4.{r,g,b,a}`; `istypep`; bad handles. Every kernel goes through the
//! validator, `parse(print(m)) == m` and, when installed, ptxas (sm_90a). Outputs are poisoned.

use emu::texture::{AddrMode, Filter, Sampler, TexDesc, TexFormat};
use emu::{launch, Allocation, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const HEAD: &str = ".version 8.7\n.target sm_90a\n.address_size 64\n";

/// Checks `text` (validator, printer round trip, ptxas) and loads it.
fn load(mem: &GlobalMemory, text: &str) -> LoadedModule {
    let module = ptx::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let errors: Vec<_> = ptx::validate(&module)
        .into_iter()
        .filter(|d| d.is_error())
        .collect();
    assert!(errors.is_empty(), "validator: {errors:?}\n{text}");
    assert_eq!(ptx::parse(&ptx::print(&module)).unwrap(), module);
    if ptx::ptxas::ptxas_for_tests("isa_tex test PTX").is_some() {
        ptx::ptxas::assemble(text, "sm_90a", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}\n{text}"));
    }
    LoadedModule::load(mem, module, 0).unwrap()
}

/// Launches kernel `k` over `threads` threads with u64 parameters.
fn run(m: &LoadedModule, mem: &GlobalMemory, threads: usize, params: &[u64]) -> Result<(), String> {
    let p: Vec<u8> = params.iter().flat_map(|x| x.to_le_bytes()).collect();
    let cfg = LaunchConfig::linear(threads.div_ceil(128) as u32, 128);
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

fn buffer(mem: &GlobalMemory, bytes: &[u8]) -> Arc<Allocation> {
    let a = mem.alloc(bytes.len().max(1) as u64, 0).unwrap();
    a.write_bytes(0, bytes);
    a
}

fn poisoned(mem: &GlobalMemory, len: usize) -> Arc<Allocation> {
    let a = mem.alloc(len as u64, 0).unwrap();
    a.fill(0, len as u64, &[0xa5]);
    a
}

fn read(a: &Allocation, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    a.read_bytes(0, &mut v);
    v
}

/// PTX computing this thread's id `%r0` (returning when >= `n`) and the coordinates of a grid
/// one texel wider than `ext` on every side: `%r1..%r3` = x, y, z (x times `xscale`).
fn grid_prologue(n: usize, ext: [u32; 3], dims: usize, xscale: usize) -> String {
    let e: Vec<u32> = (0..3)
        .map(|k| if k < dims { ext[k] + 2 } else { 1 })
        .collect();
    let off = |k: usize| if k < dims { 1 } else { 0 };
    format!(
        "    mov.u32 %r0, %tid.x;\n    mov.u32 %r9, %ctaid.x;\n    mad.lo.u32 %r0, %r9, 128, %r0;\n\
         \x20   setp.ge.u32 %p1, %r0, {n};\n    @%p1 ret;\n\
         \x20   rem.u32 %r1, %r0, {ex};\n    sub.s32 %r1, %r1, {o0};\n    mul.lo.s32 %r1, %r1, {xscale};\n\
         \x20   div.u32 %r2, %r0, {ex};\n    rem.u32 %r2, %r2, {ey};\n    sub.s32 %r2, %r2, {o1};\n\
         \x20   div.u32 %r3, %r0, {exy};\n    sub.s32 %r3, %r3, {o2};\n",
        ex = e[0],
        ey = e[1],
        exy = e[0] * e[1],
        o0 = off(0),
        o1 = off(1),
        o2 = off(2),
    )
}

fn coords(dims: usize) -> &'static str {
    ["{%r1}", "{%r1, %r2}", "{%r1, %r2, %r3, %r3}"][dims - 1]
}

/// One surface load/store form: element type, vector width, texel format and channels whose
/// texel size equals the access size.
struct SurfForm {
    ty: &'static str,
    vec: usize,
    format: TexFormat,
    channels: u32,
}

fn reg_of(ty: &str) -> (&'static str, usize) {
    match ty {
        "b8" => ("%h", 1),
        "b16" => ("%h", 2),
        "b32" => ("%r", 4),
        _ => ("%rd", 8),
    }
}

/// `suld.b .zero` and `.clamp` into buffers, `sust.b .zero` of the loaded value + 1.
fn surface_kernel(f: &SurfForm, dims: usize, ext: [u32; 3], n: usize) -> String {
    let (rp, es) = reg_of(f.ty);
    let acc = es * f.vec;
    let v = if f.vec > 1 {
        format!(".v{}", f.vec)
    } else {
        String::new()
    };
    let regs = |base: usize| -> String {
        let r: Vec<String> = (0..f.vec).map(|k| format!("{rp}{}", base + k)).collect();
        format!("{{{}}}", r.join(", "))
    };
    let g = format!("{dims}d");
    let c = coords(dims);
    let mut s = format!(
        "{HEAD}.visible .entry k(.param .u64 ps, .param .u64 pd, .param .u64 po, .param .u64 pc)\n{{\n\
         \x20   .reg .pred %p<4>;\n    .reg .b16 %h<24>;\n    .reg .b32 %r<24>;\n    .reg .b64 %rd<24>;\n\
         \x20   ld.param.u64 %rd1, [ps];\n    ld.param.u64 %rd2, [pd];\n    ld.param.u64 %rd3, [po];\n\
         \x20   ld.param.u64 %rd4, [pc];\n{}\
         \x20   mul.wide.u32 %rd5, %r0, {acc};\n    add.s64 %rd3, %rd3, %rd5;\n    add.s64 %rd4, %rd4, %rd5;\n\
         \x20   suld.b.{g}{v}.{t}.zero {z}, [%rd1, {c}];\n\
         \x20   suld.b.{g}{v}.{t}.clamp {cl}, [%rd1, {c}];\n",
        grid_prologue(n, ext, dims, acc),
        t = f.ty,
        z = regs(10),
        cl = regs(16),
    );
    let add = match f.ty {
        "b8" | "b16" => "add.u16",
        "b32" => "add.u32",
        _ => "add.u64",
    };
    for k in 0..f.vec {
        s += &format!(
            "    st.global.{t} [%rd3+{o}], {rp}{a};\n    st.global.{t} [%rd4+{o}], {rp}{b};\n    {add} {rp}{a}, {rp}{a}, 1;\n",
            t = f.ty,
            o = k * es,
            a = 10 + k,
            b = 16 + k
        );
    }
    s += &format!(
        "    sust.b.{g}{v}.{t}.zero [%rd2, {c}], {z};\n    ret;\n}}\n",
        t = f.ty,
        z = regs(10)
    );
    s
}

/// Texel coordinates of thread `t` on the grid one texel wider than `ext` (unscaled).
fn grid_coord(t: usize, ext: [u32; 3], dims: usize) -> [i64; 3] {
    let e: Vec<i64> = (0..3)
        .map(|k| if k < dims { ext[k] as i64 + 2 } else { 1 })
        .collect();
    let o = |k: usize| if k < dims { 1 } else { 0 };
    let t = t as i64;
    [
        t % e[0] - o(0),
        (t / e[0]) % e[1] - o(1),
        t / (e[0] * e[1]) - o(2),
    ]
}

fn surface_case(rng: &mut StdRng, f: &SurfForm, dims: usize, ext: [u32; 3]) {
    let mem = GlobalMemory::new();
    let e: Vec<u32> = ext[..dims].to_vec();
    let tb = (f.format.bytes() * f.channels) as usize;
    let texels: usize = e.iter().map(|&x| x as usize).product();
    let src_bytes: Vec<u8> = (0..texels * tb).map(|_| rng.gen_range(1..=255)).collect();
    let src = buffer(&mem, &src_bytes);
    let dst = poisoned(&mem, texels * tb);
    let sd = TexDesc::surface(src.base, f.format, f.channels, &e).unwrap();
    let dd = TexDesc::surface(dst.base, f.format, f.channels, &e).unwrap();
    let (sh, dh) = (sd.upload(&mem, 0).unwrap(), dd.upload(&mem, 0).unwrap());
    let n: usize = (0..3)
        .map(|k| if k < dims { ext[k] as usize + 2 } else { 1 })
        .product();
    let out = poisoned(&mem, n * tb);
    let outc = poisoned(&mem, n * tb);
    let text = surface_kernel(f, dims, ext, n);
    let m = load(&mem, &text);
    run(&m, &mem, n, &[sh.base, dh.base, out.base, outc.base]).unwrap();
    let (got, gotc, gotd) = (
        read(&out, n * tb),
        read(&outc, n * tb),
        read(&dst, texels * tb),
    );
    let lin = |c: [i64; 3]| (c[0] + c[1] * ext[0] as i64 + c[2] * (ext[0] * ext[1]) as i64) as usize;
    let (_, es) = reg_of(f.ty);
    let mut want_dst = src_bytes.clone();
    for t in 0..n {
        let c = grid_coord(t, ext, dims);
        let inr = (0..dims).all(|k| c[k] >= 0 && c[k] < ext[k] as i64);
        let cl: [i64; 3] = std::array::from_fn(|k| c[k].clamp(0, ext[k] as i64 - 1));
        let texel = |p: [i64; 3]| &src_bytes[lin(p) * tb..lin(p) * tb + tb];
        let want: Vec<u8> = if inr { texel(c).to_vec() } else { vec![0; tb] };
        assert_eq!(&got[t * tb..t * tb + tb], &want[..], "{} .zero load t={t} {c:?}\n{text}", f.ty);
        assert_eq!(&gotc[t * tb..t * tb + tb], texel(cl), "{} .clamp load t={t} {c:?}", f.ty);
        if inr {
            // each element plus one, little-endian, wrapping at the element size
            let d = &mut want_dst[lin(c) * tb..lin(c) * tb + tb];
            for el in d.chunks_mut(es) {
                for b in el.iter_mut() {
                    let (v, carry) = b.overflowing_add(1);
                    *b = v;
                    if !carry {
                        break;
                    }
                }
            }
        }
    }
    assert_eq!(gotd, want_dst, "{} .zero store", f.ty);
}

#[test]
fn suld_sust_every_form() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0001);
    let forms = [
        SurfForm { ty: "b8", vec: 1, format: TexFormat::U8, channels: 1 },
        SurfForm { ty: "b8", vec: 4, format: TexFormat::U8, channels: 4 },
        SurfForm { ty: "b16", vec: 2, format: TexFormat::F16, channels: 2 },
        SurfForm { ty: "b16", vec: 1, format: TexFormat::U16, channels: 1 },
        SurfForm { ty: "b32", vec: 1, format: TexFormat::F32, channels: 1 },
        SurfForm { ty: "b32", vec: 4, format: TexFormat::U32, channels: 4 },
        SurfForm { ty: "b64", vec: 1, format: TexFormat::U32, channels: 2 },
        SurfForm { ty: "b64", vec: 2, format: TexFormat::U32, channels: 4 },
    ];
    for (i, f) in forms.iter().enumerate() {
        let dims = 1 + i % 3;
        let ext = [[13, 1, 1], [7, 5, 1], [4, 3, 3]][dims - 1];
        surface_case(&mut rng, f, dims, ext);
        // and every form in 2D
        surface_case(&mut rng, f, 2, [5, 4, 1]);
    }
}

/// `sured.b` with every operation: thread `t` reduces into texel `t % (w + 1)` (the last is out
/// of range: dropped by `.zero`, clamped onto the last texel by `.clamp`).
#[test]
fn sured_ops() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0002);
    let cases = [
        ("add", "u32", "zero"),
        ("min", "u32", "clamp"),
        ("max", "u32", "zero"),
        ("min", "s32", "clamp"),
        ("max", "s32", "zero"),
        ("and", "b32", "clamp"),
        ("or", "b32", "zero"),
        ("add", "u64", "clamp"),
        ("min", "u64", "zero"),
        ("max", "u64", "clamp"),
    ];
    const N: usize = 256;
    for (op, ty, oob) in cases {
        let wide = ty == "u64";
        let es = if wide { 8 } else { 4 };
        let w = rng.gen_range(3..9u32);
        let mem = GlobalMemory::new();
        let init: Vec<u64> = (0..w).map(|_| rng.gen::<u64>() >> if wide { 0 } else { 32 }).collect();
        let vals: Vec<u64> = (0..N).map(|_| rng.gen::<u64>() >> if wide { 0 } else { 32 }).collect();
        let enc = |v: &[u64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()[..es].to_vec()).collect() };
        let surf = buffer(&mem, &enc(&init));
        let vbuf = buffer(&mem, &enc(&vals));
        let d = TexDesc::surface(surf.base, TexFormat::U32, es as u32 / 4, &[w]).unwrap();
        let h = d.upload(&mem, 0).unwrap();
        let (r, ld) = if wide { ("%rd6", "u64") } else { ("%r6", "u32") };
        let text = format!(
            "{HEAD}.visible .entry k(.param .u64 ps, .param .u64 pv)\n{{\n    .reg .pred %p<4>;\n\
             \x20   .reg .b32 %r<16>;\n    .reg .b64 %rd<16>;\n    ld.param.u64 %rd1, [ps];\n\
             \x20   ld.param.u64 %rd2, [pv];\n    mov.u32 %r0, %tid.x;\n    mov.u32 %r9, %ctaid.x;\n\
             \x20   mad.lo.u32 %r0, %r9, 128, %r0;\n    mul.wide.u32 %rd3, %r0, {es};\n\
             \x20   add.s64 %rd2, %rd2, %rd3;\n    ld.global.{ld} {r}, [%rd2];\n\
             \x20   rem.u32 %r1, %r0, {w1};\n    mul.lo.u32 %r1, %r1, {es};\n\
             \x20   sured.b.{op}.1d.{ty}.{oob} [%rd1, {{%r1}}], {r};\n    ret;\n}}\n",
            w1 = w + 1
        );
        let m = load(&mem, &text);
        run(&m, &mem, N, &[h.base, vbuf.base]).unwrap();
        let mut want = init.clone();
        for (t, &v) in vals.iter().enumerate() {
            let mut x = t % (w as usize + 1);
            if x == w as usize {
                if oob == "zero" {
                    continue;
                }
                x = w as usize - 1;
            }
            let o = want[x];
            want[x] = match (op, ty) {
                ("add", "u64") => o.wrapping_add(v),
                ("add", _) => (o as u32).wrapping_add(v as u32) as u64,
                ("min", "s32") => (o as i32).min(v as i32) as u32 as u64,
                ("max", "s32") => (o as i32).max(v as i32) as u32 as u64,
                ("min", _) => o.min(v),
                ("max", _) => o.max(v),
                ("and", _) => o & v,
                _ => o | v,
            };
        }
        assert_eq!(read(&surf, w as usize * es), enc(&want), "sured.b.{op}.{ty}.{oob}");
    }
}

/// `suq`, `txq` and `istypep` report what the descriptors say.
#[test]
fn queries_and_istypep() {
    let mem = GlobalMemory::new();
    let back = buffer(&mem, &[1u8; 4096]);
    let s = TexDesc::surface(back.base, TexFormat::F16, 2, &[5, 6, 7]).unwrap();
    let samp = Sampler {
        addr_mode: [AddrMode::Wrap, AddrMode::Mirror, AddrMode::Border],
        filter: Filter::Linear,
        normalized: true,
    };
    let t1 = TexDesc::texture(back.base, TexFormat::U8, 4, &[9, 4], samp).unwrap();
    let samp2 = Sampler {
        addr_mode: [AddrMode::Clamp; 3],
        filter: Filter::Point,
        normalized: false,
    };
    let t2 = TexDesc::texture(back.base, TexFormat::F32, 1, &[11], samp2).unwrap();
    let (hs, h1, h2) = (
        s.upload(&mem, 0).unwrap(),
        t1.upload(&mem, 0).unwrap(),
        t2.upload(&mem, 0).unwrap(),
    );
    let qs = [
        "suq.width.b32 %r10, [%rd1];",
        "suq.height.b32 %r10, [%rd1];",
        "suq.depth.b32 %r10, [%rd1];",
        "txq.width.b32 %r10, [%rd2];",
        "txq.height.b32 %r10, [%rd2];",
        "txq.normalized_coords.b32 %r10, [%rd2];",
        "txq.filter_mode.b32 %r10, [%rd2];",
        "txq.addr_mode_0.b32 %r10, [%rd2];",
        "txq.addr_mode_1.b32 %r10, [%rd2];",
        "txq.addr_mode_2.b32 %r10, [%rd2];",
        "txq.width.b32 %r10, [%rd3];",
        "txq.normalized_coords.b32 %r10, [%rd3];",
        "txq.filter_mode.b32 %r10, [%rd3];",
        "txq.addr_mode_0.b32 %r10, [%rd3];",
        "istypep.texref %p1, %rd2; selp.u32 %r10, 1, 0, %p1;",
        "istypep.texref %p1, %rd1; selp.u32 %r10, 1, 0, %p1;",
        "istypep.surfref %p1, %rd1; selp.u32 %r10, 1, 0, %p1;",
        "istypep.surfref %p1, %rd3; selp.u32 %r10, 1, 0, %p1;",
        "istypep.samplerref %p1, %rd2; selp.u32 %r10, 1, 0, %p1;",
        "istypep.texref %p1, %rd5; selp.u32 %r10, 1, 0, %p1;",
    ];
    let want = [5, 6, 7, 9, 4, 1, 1, 0, 1, 4, 11, 0, 0, 3, 1, 0, 1, 0, 0, 0];
    let body: String = qs
        .iter()
        .enumerate()
        .map(|(j, q)| format!("    {q}\n    st.global.u32 [%rd4+{}], %r10;\n", 4 * j))
        .collect();
    let text = format!(
        "{HEAD}.visible .entry k(.param .u64 ps, .param .u64 pt, .param .u64 pu, .param .u64 po, .param .u64 pg)\n{{\n\
         \x20   .reg .pred %p<4>;\n    .reg .b32 %r<16>;\n    .reg .b64 %rd<16>;\n\
         \x20   ld.param.u64 %rd1, [ps];\n    ld.param.u64 %rd2, [pt];\n    ld.param.u64 %rd3, [pu];\n\
         \x20   ld.param.u64 %rd4, [po];\n    ld.param.u64 %rd5, [pg];\n{body}    ret;\n}}\n"
    );
    let m = load(&mem, &text);
    let out = poisoned(&mem, 4 * qs.len());
    run(&m, &mem, 1, &[hs.base, h1.base, h2.base, out.base, back.base]).unwrap();
    let got: Vec<u32> = read(&out, 4 * qs.len())
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for (j, q) in qs.iter().enumerate() {
        assert_eq!(got[j], want[j], "{q}");
    }
}

/// Faults: `.trap` out of range, a texture fetch through a surface handle, a handle that does
/// not point at a descriptor, a null handle.
#[test]
fn faults_are_clear() {
    let mem = GlobalMemory::new();
    let back = buffer(&mem, &[3u8; 256]);
    let s = TexDesc::surface(back.base, TexFormat::U32, 1, &[4, 4]).unwrap();
    let hs = s.upload(&mem, 0).unwrap();
    let cases = [
        ("suld.b.2d.b32.trap {%r10}, [%rd1, {%r1, %r2}];", hs.base, 16u32, "out of range"),
        ("sust.b.2d.b32.trap [%rd1, {%r1, %r2}], {%r1};", hs.base, 16, "out of range"),
        ("tex.2d.v4.f32.f32 {%r10, %r11, %r12, %r13}, [%rd1, {%r1, %r2}];", hs.base, 0, "needs a Texture"),
        ("suld.b.2d.b32.trap {%r10}, [%rd1, {%r1, %r2}];", back.base, 0, "not a ptxforge"),
        ("suq.width.b32 %r10, [%rd1];", 0, 0, "does not point at a descriptor"),
    ];
    for (ins, h, x, msg) in cases {
        let text = format!(
            "{HEAD}.visible .entry k(.param .u64 ps, .param .u64 po)\n{{\n    .reg .b32 %r<16>;\n\
             \x20   .reg .b64 %rd<16>;\n    ld.param.u64 %rd1, [ps];\n    ld.param.u64 %rd2, [po];\n\
             \x20   mov.u32 %r1, {x};\n    mov.u32 %r2, 0;\n    {ins}\n    st.global.u32 [%rd2], %r10;\n    ret;\n}}\n"
        );
        let m = load(&mem, &text);
        let out = poisoned(&mem, 4);
        let e = run(&m, &mem, 1, &[h, out.base]).expect_err(ins);
        assert!(e.contains(msg), "`{ins}`: {e}");
    }
}
