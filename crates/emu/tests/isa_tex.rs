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
use emu::{GlobalMemory, LoadedModule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const HEAD: &str = ".version 8.7\n.target sm_90a\n.address_size 64\n";

#[path = "common/tex.rs"]
mod common;
use common::{buffer, poisoned, read, run};
#[path = "common/tex_ref.rs"]
mod tex_ref;
use tex_ref::{assert_rejected, float_value, linear_base, texel_data, word_buffer, words};

/// Checks `text` (validator, printer round trip, ptxas on sm_90a) and loads it.
fn load(mem: &GlobalMemory, text: &str) -> LoadedModule {
    common::load_checked(mem, text, &["sm_90a"], "isa_tex test PTX")
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

fn coord_list(dims: usize) -> &'static str {
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

impl SurfForm {
    /// `.{ty}` with `vec` values per access on a `format` surface of `channels` channels.
    fn new(ty: &'static str, vec: usize, format: TexFormat, channels: u32) -> SurfForm {
        SurfForm {
            ty,
            vec,
            format,
            channels,
        }
    }
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
    let c = coord_list(dims);
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
    let lin =
        |c: [i64; 3]| (c[0] + c[1] * ext[0] as i64 + c[2] * (ext[0] * ext[1]) as i64) as usize;
    let (_, es) = reg_of(f.ty);
    let mut want_dst = src_bytes.clone();
    for t in 0..n {
        let c = grid_coord(t, ext, dims);
        let inr = (0..dims).all(|k| c[k] >= 0 && c[k] < ext[k] as i64);
        let cl: [i64; 3] = std::array::from_fn(|k| c[k].clamp(0, ext[k] as i64 - 1));
        let texel = |p: [i64; 3]| &src_bytes[lin(p) * tb..lin(p) * tb + tb];
        let want: Vec<u8> = if inr { texel(c).to_vec() } else { vec![0; tb] };
        assert_eq!(
            &got[t * tb..t * tb + tb],
            &want[..],
            "{} .zero load t={t} {c:?}\n{text}",
            f.ty
        );
        assert_eq!(
            &gotc[t * tb..t * tb + tb],
            texel(cl),
            "{} .clamp load t={t} {c:?}",
            f.ty
        );
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
    use TexFormat::*;
    let mut rng = StdRng::seed_from_u64(0x5eed_0001);
    let forms = [
        SurfForm::new("b8", 1, U8, 1),
        SurfForm::new("b8", 4, U8, 4),
        SurfForm::new("b16", 2, F16, 2),
        SurfForm::new("b16", 1, U16, 1),
        SurfForm::new("b32", 1, F32, 1),
        SurfForm::new("b32", 4, U32, 4),
        SurfForm::new("b64", 1, U32, 2),
        SurfForm::new("b64", 2, U32, 4),
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
        let init: Vec<u64> = (0..w)
            .map(|_| rng.gen::<u64>() >> if wide { 0 } else { 32 })
            .collect();
        let vals: Vec<u64> = (0..N)
            .map(|_| rng.gen::<u64>() >> if wide { 0 } else { 32 })
            .collect();
        let enc = |v: &[u64]| -> Vec<u8> {
            v.iter()
                .flat_map(|x| x.to_le_bytes()[..es].to_vec())
                .collect()
        };
        let surf = buffer(&mem, &enc(&init));
        let vbuf = buffer(&mem, &enc(&vals));
        let d = TexDesc::surface(surf.base, TexFormat::U32, es as u32 / 4, &[w]).unwrap();
        let h = d.upload(&mem, 0).unwrap();
        let (r, ld) = if wide {
            ("%rd6", "u64")
        } else {
            ("%r6", "u32")
        };
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
        assert_eq!(
            read(&surf, w as usize * es),
            enc(&want),
            "sured.b.{op}.{ty}.{oob}"
        );
    }
}

/// `suq`, `txq` and `istypep` report what the descriptors say.
#[test]
fn queries_and_istypep() {
    let mem = GlobalMemory::new();
    let back = buffer(&mem, &[1u8; 4096]);
    let s = TexDesc::surface(back.base, TexFormat::F16, 2, &[5, 6, 7]).unwrap();
    let samp = Sampler::new(
        [AddrMode::Wrap, AddrMode::Mirror, AddrMode::Border],
        Filter::Linear,
        true,
    );
    let t1 = TexDesc::texture(back.base, TexFormat::U8, 4, &[9, 4], samp).unwrap();
    let samp2 = Sampler::new([AddrMode::Clamp; 3], Filter::Point, false);
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
    run(
        &m,
        &mem,
        1,
        &[hs.base, h1.base, h2.base, out.base, back.base],
    )
    .unwrap();
    let got = words(&out, qs.len());
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
        (
            "suld.b.2d.b32.trap {%r10}, [%rd1, {%r1, %r2}];",
            hs.base,
            16u32,
            "out of range",
        ),
        (
            "sust.b.2d.b32.trap [%rd1, {%r1, %r2}], {%r1};",
            hs.base,
            16,
            "out of range",
        ),
        (
            "tex.2d.v4.f32.f32 {%r10, %r11, %r12, %r13}, [%rd1, {%r1, %r2}];",
            hs.base,
            0,
            "needs a Texture",
        ),
        (
            "suld.b.2d.b32.trap {%r10}, [%rd1, {%r1, %r2}];",
            back.base,
            0,
            "not a ptxforge",
        ),
        (
            "suq.width.b32 %r10, [%rd1];",
            0,
            0,
            "does not point at a descriptor",
        ),
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

/// The host model of a texture, written from the CUDA Programming Guide's "Texture Fetching"
/// appendix: texel-space coordinates, addressing, point sampling, linear filtering with 9-bit
/// weights (x fastest), missing channels (0, 0, 0, 1), zero border.
struct RefTex {
    data: Vec<u8>,
    format: TexFormat,
    channels: usize,
    ext: [i64; 3],
    dims: usize,
    s: Sampler,
}

impl RefTex {
    fn channel(&self, off: usize, float: bool) -> f64 {
        let b = &self.data[off..];
        let raw = match self.format.bytes() {
            1 => b[0] as u64,
            2 => u16::from_le_bytes([b[0], b[1]]) as u64,
            _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64,
        };
        if float {
            float_value(self.format, raw)
        } else {
            raw as f64
        }
    }

    fn texel(&self, idx: [i64; 3], float: bool) -> [f64; 4] {
        let mut at = [0i64; 3];
        for k in 0..self.dims {
            let (i, n) = (idx[k], self.ext[k]);
            let mut mode = self.s.addr_mode[k];
            if !self.s.normalized && matches!(mode, AddrMode::Wrap | AddrMode::Mirror) {
                mode = AddrMode::Clamp;
            }
            at[k] = match mode {
                AddrMode::Wrap => ((i % n) + n) % n,
                AddrMode::Mirror => {
                    let p = ((i % (2 * n)) + 2 * n) % (2 * n);
                    if p < n {
                        p
                    } else {
                        2 * n - 1 - p
                    }
                }
                AddrMode::Clamp => i.max(0).min(n - 1),
                AddrMode::Border if i < 0 || i >= n => return [0.0; 4],
                AddrMode::Border => i,
            };
        }
        let cb = self.format.bytes() as usize;
        let lin = (at[0] + at[1] * self.ext[0] + at[2] * self.ext[0] * self.ext[1]) as usize;
        let mut v = [0.0, 0.0, 0.0, 1.0];
        for (c, x) in v.iter_mut().enumerate().take(self.channels) {
            *x = self.channel((lin * self.channels + c) * cb, float);
        }
        v
    }

    /// Texel-space coordinate: `.f32` scaled when normalized, `.s32` at the texel centre.
    fn coord(&self, k: usize, raw: u32, fcoord: bool) -> f64 {
        if !fcoord {
            return raw as i32 as f64 + 0.5;
        }
        let x = f32::from_bits(raw) as f64;
        if self.s.normalized {
            x * self.ext[k] as f64
        } else {
            x
        }
    }

    fn tex(&self, c: [u32; 3], fcoord: bool, float: bool) -> [f64; 4] {
        let u: Vec<f64> = (0..self.dims)
            .map(|k| self.coord(k, c[k], fcoord))
            .collect();
        if self.s.filter == Filter::Point {
            let mut idx = [0i64; 3];
            for k in 0..self.dims {
                idx[k] = u[k].floor() as i64;
            }
            return self.texel(idx, float);
        }
        let base = linear_base(&u);
        let mut acc = [0.0; 4];
        for corner in 0..1 << self.dims {
            let mut idx = [0i64; 3];
            let mut w = 1.0;
            for k in 0..self.dims {
                let hi = corner >> k & 1 == 1;
                idx[k] = base[k].0 + hi as i64;
                w *= if hi { base[k].1 } else { 1.0 - base[k].1 };
            }
            let t = self.texel(idx, true);
            for ch in 0..4 {
                acc[ch] += w * t[ch];
            }
        }
        acc
    }

    fn tld4(&self, c: [u32; 3], fcoord: bool, float: bool, comp: usize) -> [f64; 4] {
        let i = (self.coord(0, c[0], fcoord) - 0.5).floor() as i64;
        let j = (self.coord(1, c[1], fcoord) - 0.5).floor() as i64;
        [(i, j + 1), (i + 1, j + 1), (i + 1, j), (i, j)]
            .map(|(a, b)| self.texel([a, b, 0], float)[comp])
    }
}

/// A texture fetch form: instruction, texture, coordinate type and range.
struct FetchCase {
    /// `tex.2d.v4.f32.f32`, `tld4.g.2d.v4.f32.f32`, ...
    ins: &'static str,
    format: TexFormat,
    channels: u32,
    ext: &'static [u32],
    s: Sampler,
}

/// A [`FetchCase`] of `ins` on a `format` texture of `channels` channels and extent `ext`.
fn fc(
    ins: &'static str,
    format: TexFormat,
    channels: u32,
    ext: &'static [u32],
    s: Sampler,
) -> FetchCase {
    FetchCase {
        ins,
        format,
        channels,
        ext,
        s,
    }
}

fn sampler(modes: [AddrMode; 3], filter: Filter, normalized: bool) -> Sampler {
    Sampler::new(modes, filter, normalized)
}

fn fetch_case(rng: &mut StdRng, c: &FetchCase) {
    const N: usize = 512;
    let mem = GlobalMemory::new();
    let dims = c.ext.len();
    let texels: usize = c.ext.iter().map(|&x| x as usize).product();
    let data = texel_data(rng, c.format, texels * c.channels as usize);
    let back = buffer(&mem, &data);
    let d = TexDesc::texture(back.base, c.format, c.channels, c.ext, c.s).unwrap();
    let h = d.upload(&mem, 0).unwrap();
    let fcoord = c.ins.ends_with(".f32");
    let float = c.ins.contains("v4.f32");
    let mut ext = [1i64; 3];
    for (k, &e) in c.ext.iter().enumerate() {
        ext[k] = e as i64;
    }
    // coordinates reach past both edges; a quarter sit exactly on texel centres or edges
    let coords: Vec<[u32; 3]> = (0..N)
        .map(|t| {
            std::array::from_fn(|k| {
                let n = ext[k] as f64;
                if !fcoord {
                    return rng.gen_range(-3..ext[k] as i32 + 3) as u32;
                }
                let x = if t % 4 == 0 {
                    (rng.gen_range(-4..2 * ext[k] as i32 + 4) as f64 * 0.5)
                        / if c.s.normalized { n } else { 1.0 }
                } else if c.s.normalized {
                    rng.gen_range(-1.5..2.5)
                } else {
                    rng.gen_range(-3.0..n + 3.0)
                };
                (x as f32).to_bits()
            })
        })
        .collect();
    let cbuf = word_buffer(&mem, &coords);
    let out = poisoned(&mem, N * 16);
    let text = format!(
        "{HEAD}.visible .entry k(.param .u64 pt, .param .u64 pc, .param .u64 po)\n{{\n\
         \x20   .reg .b32 %r<16>;\n    .reg .b64 %rd<16>;\n    ld.param.u64 %rd1, [pt];\n\
         \x20   ld.param.u64 %rd2, [pc];\n    ld.param.u64 %rd3, [po];\n    mov.u32 %r0, %tid.x;\n\
         \x20   mov.u32 %r9, %ctaid.x;\n    mad.lo.u32 %r0, %r9, 128, %r0;\n    mul.wide.u32 %rd4, %r0, 12;\n\
         \x20   add.s64 %rd2, %rd2, %rd4;\n    ld.global.u32 %r1, [%rd2];\n\
         \x20   ld.global.u32 %r2, [%rd2+4];\n    ld.global.u32 %r3, [%rd2+8];\n\
         \x20   {ins} {{%r10, %r11, %r12, %r13}}, [%rd1, {co}];\n    mul.wide.u32 %rd4, %r0, 16;\n\
         \x20   add.s64 %rd3, %rd3, %rd4;\n    st.global.v4.u32 [%rd3], {{%r10, %r11, %r12, %r13}};\n    ret;\n}}\n",
        ins = c.ins,
        co = coord_list(dims)
    );
    let m = load(&mem, &text);
    run(&m, &mem, N, &[h.base, cbuf.base, out.base]).unwrap();
    let got = read(&out, N * 16);
    let r = RefTex {
        data,
        format: c.format,
        channels: c.channels as usize,
        ext,
        dims,
        s: c.s,
    };
    for (t, co) in coords.iter().enumerate() {
        let want = match c.ins.strip_prefix("tld4.") {
            Some(rest) => r.tld4(*co, fcoord, float, "rgba".find(&rest[..1]).unwrap()),
            None => r.tex(*co, fcoord, float),
        };
        for ch in 0..4 {
            let g = u32::from_le_bytes(
                got[t * 16 + 4 * ch..t * 16 + 4 * ch + 4]
                    .try_into()
                    .unwrap(),
            );
            let w = if float {
                (want[ch] as f32).to_bits()
            } else {
                want[ch] as u32
            };
            assert_eq!(
                g, w,
                "{} {:?} {:?} fmt {:?}x{} coords {co:?} ({:?}) channel {ch}: got {g:#x} want {w:#x}",
                c.ins, c.ext, c.s, c.format, c.channels,
                co.map(f32::from_bits)
            );
        }
    }
}

#[test]
fn tex_point_sampling() {
    use AddrMode::*;
    use TexFormat::*;
    let mut rng = StdRng::seed_from_u64(0x5eed_0003);
    let p = Filter::Point;
    #[rustfmt::skip] // one case per line
    let cases = [
        fc("tex.1d.v4.f32.f32", F32, 1, &[13], sampler([Clamp; 3], p, false)),
        fc("tex.1d.v4.f32.f32", U16, 2, &[9], sampler([Mirror; 3], p, true)),
        fc("tex.2d.v4.f32.f32", U8, 4, &[7, 5], sampler([Wrap, Mirror, Wrap], p, true)),
        fc("tex.2d.v4.f32.f32", U16, 1, &[6, 9], sampler([Border; 3], p, false)),
        fc("tex.2d.v4.f32.f32", F32, 4, &[5, 4], sampler([Wrap; 3], p, false)),
        fc("tex.3d.v4.f32.f32", F16, 2, &[4, 3, 5], sampler([Mirror, Border, Clamp], p, true)),
        fc("tex.2d.v4.u32.s32", U32, 4, &[6, 5], sampler([Clamp; 3], p, false)),
        fc("tex.1d.v4.s32.s32", U16, 2, &[10], sampler([Border; 3], p, false)),
        fc("tex.3d.v4.u32.f32", U8, 1, &[3, 4, 5], sampler([Wrap; 3], p, true)),
        fc("tex.2d.v4.f32.s32", F16, 4, &[5, 6], sampler([Border; 3], p, true)),
    ];
    for c in &cases {
        fetch_case(&mut rng, c);
    }
}

#[test]
fn tex_linear_filtering() {
    use AddrMode::*;
    use TexFormat::*;
    let mut rng = StdRng::seed_from_u64(0x5eed_0004);
    let l = Filter::Linear;
    #[rustfmt::skip] // one case per line
    let cases = [
        fc("tex.1d.v4.f32.f32", F32, 1, &[11], sampler([Wrap; 3], l, true)),
        fc("tex.1d.v4.f32.f32", U16, 4, &[7], sampler([Clamp; 3], l, false)),
        fc("tex.2d.v4.f32.f32", F16, 4, &[6, 5], sampler([Clamp; 3], l, false)),
        fc("tex.2d.v4.f32.f32", U8, 4, &[5, 7], sampler([Mirror, Wrap, Clamp], l, true)),
        fc("tex.2d.v4.f32.f32", F32, 2, &[4, 4], sampler([Border; 3], l, false)),
        fc("tex.3d.v4.f32.f32", F32, 2, &[3, 4, 3], sampler([Border, Wrap, Mirror], l, true)),
        fc("tex.3d.v4.f32.f32", F16, 1, &[4, 3, 2], sampler([Clamp; 3], l, false)),
    ];
    for c in &cases {
        fetch_case(&mut rng, c);
    }
}

#[test]
fn tld4_gather() {
    use AddrMode::*;
    use TexFormat::*;
    let mut rng = StdRng::seed_from_u64(0x5eed_0005);
    let p = Filter::Point;
    let l = Filter::Linear;
    #[rustfmt::skip] // one case per line
    let cases = [
        fc("tld4.r.2d.v4.f32.f32", F32, 4, &[6, 5], sampler([Clamp; 3], l, true)),
        fc("tld4.g.2d.v4.f32.f32", U8, 4, &[5, 7], sampler([Wrap; 3], p, true)),
        fc("tld4.b.2d.v4.f32.f32", F16, 4, &[4, 4], sampler([Border; 3], p, false)),
        fc("tld4.a.2d.v4.f32.f32", F32, 2, &[5, 3], sampler([Mirror; 3], l, true)),
        fc("tld4.r.2d.v4.u32.f32", U32, 2, &[6, 4], sampler([Border; 3], p, false)),
        fc("tld4.g.2d.v4.s32.f32", U16, 2, &[5, 5], sampler([Clamp; 3], p, true)),
    ];
    for c in &cases {
        fetch_case(&mut rng, c);
    }
}

/// The validator rejects malformed texture/surface forms (ptxas rejects them too).
#[test]
fn validator_rejects_malformed_forms() {
    #[rustfmt::skip] // one case per line
    let bad = [
        ("suld.b.2d.b32.trap {%r1}, [%rd1, {%r2}];", "coordinates"),
        ("suld.b.3d.b32.trap {%r1}, [%rd1, {%r2, %r3, %r4}];", "coordinates"),
        ("sust.b.1d.v2.b32.trap [%rd1, {%r2}], {%r1};", "moves 2 values"),
        ("tex.2d.v4.f32.f32 {%r1, %r2}, [%rd1, {%r2, %r3}];", "moves 4 values"),
        ("suld.b.b32.trap {%r1}, [%rd1, {%r2}];", "geometry"),
        ("suq.normalized_coords.b32 %r1, [%rd1];", "query attribute"),
    ];
    for (ins, msg) in bad {
        let text = format!(
            "{HEAD}.visible .entry k(.param .u64 p)\n{{\n    .reg .b32 %r<8>;\n    .reg .b64 %rd<4>;\n\
             \x20   ld.param.u64 %rd1, [p];\n    {ins}\n    ret;\n}}\n"
        );
        assert_rejected(&text, ins, msg, "isa_tex test PTX");
    }
}

/// `sust.b .clamp` writes the nearest in-range element: one thread per out-of-range coordinate
/// of a 2D surface, each on a texel of its own after clamping (corners excluded).
#[test]
fn sust_clamp_writes_the_nearest_texel() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0006);
    let (w, h) = (6u32, 5u32);
    let mem = GlobalMemory::new();
    let surf = poisoned(&mem, (w * h * 4) as usize);
    let d = TexDesc::surface(surf.base, TexFormat::U32, 1, &[w, h]).unwrap();
    let hd = d.upload(&mem, 0).unwrap();
    // (x, y) outside by a random distance on one side, inside along the other axis
    let mut pts: Vec<(i32, i32)> = Vec::new();
    for y in 0..h as i32 {
        pts.push((-rng.gen_range(1..50), y));
        pts.push((w as i32 + rng.gen_range(0..50), y));
    }
    for x in 1..w as i32 - 1 {
        pts.push((x, -rng.gen_range(1..50)));
        pts.push((x, h as i32 + rng.gen_range(0..50)));
    }
    let vals: Vec<u32> = (0..pts.len()).map(|_| rng.gen()).collect();
    let mut input = Vec::new();
    for (&(x, y), v) in pts.iter().zip(&vals) {
        input.extend_from_slice(&(x * 4).to_le_bytes());
        input.extend_from_slice(&y.to_le_bytes());
        input.extend_from_slice(&v.to_le_bytes());
    }
    let inp = buffer(&mem, &input);
    let text = format!(
        "{HEAD}.visible .entry k(.param .u64 ps, .param .u64 pi)\n{{\n    .reg .pred %p<4>;\n\
         \x20   .reg .b32 %r<16>;\n    .reg .b64 %rd<16>;\n    ld.param.u64 %rd1, [ps];\n\
         \x20   ld.param.u64 %rd2, [pi];\n    mov.u32 %r0, %tid.x;\n    setp.ge.u32 %p1, %r0, {n};\n\
         \x20   @%p1 ret;\n    mul.wide.u32 %rd3, %r0, 12;\n    add.s64 %rd2, %rd2, %rd3;\n\
         \x20   ld.global.u32 %r1, [%rd2];\n    ld.global.u32 %r2, [%rd2+4];\n    ld.global.u32 %r3, [%rd2+8];\n\
         \x20   sust.b.2d.b32.clamp [%rd1, {{%r1, %r2}}], {{%r3}};\n    ret;\n}}\n",
        n = pts.len()
    );
    let m = load(&mem, &text);
    run(&m, &mem, pts.len(), &[hd.base, inp.base]).unwrap();
    let mut want = vec![0xa5a5_a5a5u32; (w * h) as usize];
    for (&(x, y), v) in pts.iter().zip(&vals) {
        let (cx, cy) = (x.clamp(0, w as i32 - 1), y.clamp(0, h as i32 - 1));
        want[(cy * w as i32 + cx) as usize] = *v;
    }
    let got = words(&surf, (w * h) as usize);
    assert_eq!(got, want);
}

/// The host builder names the field it rejects; descriptors round-trip through their bytes.
#[test]
fn descriptor_builder_checks_fields_and_round_trips() {
    let s = sampler(
        [AddrMode::Mirror, AddrMode::Border, AddrMode::Wrap],
        Filter::Linear,
        true,
    );
    let d = TexDesc::texture(0x1000, TexFormat::F16, 4, &[7, 3, 2], s).unwrap();
    let d = d.with_pitch(64, 256).unwrap();
    assert_eq!(TexDesc::decode(&d.encode().unwrap()).unwrap(), d);
    let field = |r: Result<TexDesc, emu::texture::DescError>| r.unwrap_err().field;
    assert_eq!(
        field(TexDesc::surface(0x1000, TexFormat::U8, 3, &[4])),
        "channels"
    );
    assert_eq!(field(TexDesc::surface(0, TexFormat::U8, 1, &[4])), "base");
    assert_eq!(
        field(TexDesc::surface(0x1000, TexFormat::U8, 1, &[])),
        "extent"
    );
    assert_eq!(
        field(TexDesc::surface(0x1000, TexFormat::U8, 1, &[4, 0])),
        "extent"
    );
    assert_eq!(
        field(
            TexDesc::surface(0x1000, TexFormat::U32, 2, &[4, 2]).and_then(|d| d.with_pitch(16, 64))
        ),
        "pitch"
    );
    assert_eq!(
        field(TexDesc::texture(0x1000, TexFormat::U32, 1, &[4], s)),
        "filter"
    );
    let mut raw = d.encode().unwrap();
    raw[0] ^= 1;
    assert_eq!(TexDesc::decode(&raw).unwrap_err().field, "magic");
}
