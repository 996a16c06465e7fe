//! Texture and surface forms beyond 1D/2D/3D unified-mode access (issue 16 item 3): mipmapped
//! textures with `tex.base`/`tex.level`/`tex.grad` (point and linear mip filtering), layered,
//! cube, cube-array and multisample geometries for `tex`/`tld4`, `txq.level` and the further
//! query attributes, layered `suld.b`/`sust.b`, `sust.p` with conversion to every surface
//! format, `sured.p`, module-scope `.texref`/`.surfref` variables bound from the host, and
//! independent-mode `.samplerref` samplers. Every result is compared bit for bit with a host
//! reference written here from the rules `emu::texture` documents (the CUDA Programming Guide's
//! texture fetching and cubemap rules, plus the emulator's stated level-of-detail choices), on
//! random inputs, outputs poisoned first. Every kernel goes through the validator,
//! `parse(print(m)) == m` and, when installed, ptxas (sm_90a and sm_75).

use emu::texture::{AddrMode, Filter, Sampler, TexDesc, TexFormat};
use emu::{GlobalMemory, LoadedModule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "common/tex.rs"]
mod common;
#[path = "common/tex_desc.rs"]
mod tex_desc;
use common::{buffer, poisoned, run};
use tex_desc::{shaped_desc, Shape};
#[path = "common/tex_ref.rs"]
mod tex_ref;
use tex_ref::{assert_rejected, float_value, linear_base, texel_data, word_buffer, words};

/// Checks `text` (validator, printer round trip, ptxas on sm_90a, sm_75) and loads it.
fn load(mem: &GlobalMemory, text: &str) -> LoadedModule {
    common::load_checked(mem, text, &["sm_90a", "sm_75"], "isa_tex_geom test PTX")
}

const WORDS_IN: usize = 16;

/// Runs `m` over one thread per row of `input` (parameters: object handle `h`, the input, a
/// poisoned 16-byte-per-thread output, sampler handle `sp`) and returns the output's words.
fn launch_rows(
    m: &LoadedModule,
    mem: &GlobalMemory,
    (h, sp): (u64, u64),
    input: &[[u32; WORDS_IN]],
) -> Result<Vec<u32>, String> {
    let n = input.len();
    let inb = word_buffer(mem, input);
    let out = poisoned(mem, n * 16);
    run(m, mem, n, &[h, inb.base, out.base, sp])?;
    Ok(words(&out, n * 4))
}

/// A kernel whose thread `i` loads 16 words of input (`%r10..%r25`: coordinates `%r10..%r13`,
/// lod `%r14`, dPdx `%r15..%r18`, dPdy `%r19..%r22`, offsets `%r23..%r25`), runs `body` and
/// stores `%r1..%r4`. Parameters: object handle `%rd1`, input, output, sampler handle `%rd4`.
fn kernel(head: &str, decls: &str, n: usize, body: &str) -> String {
    format!(
        "{head}{decls}\n.visible .entry k(.param .u64 ph, .param .u64 pin, .param .u64 pout, .param .u64 ps)\n{{\n\
         \x20   .reg .pred %p<4>;\n    .reg .b32 %r<40>;\n    .reg .b64 %rd<16>;\n\
         \x20   ld.param.u64 %rd1, [ph];\n    ld.param.u64 %rd2, [pin];\n    ld.param.u64 %rd3, [pout];\n\
         \x20   ld.param.u64 %rd4, [ps];\n\
         \x20   mov.u32 %r0, %tid.x;\n    mov.u32 %r9, %ctaid.x;\n    mad.lo.u32 %r0, %r9, 128, %r0;\n\
         \x20   setp.ge.u32 %p1, %r0, {n};\n    @%p1 ret;\n\
         \x20   mul.wide.u32 %rd5, %r0, 64;\n    add.s64 %rd2, %rd2, %rd5;\n\
         \x20   ld.global.v4.b32 {{%r10, %r11, %r12, %r13}}, [%rd2];\n\
         \x20   ld.global.v4.b32 {{%r14, %r15, %r16, %r17}}, [%rd2+16];\n\
         \x20   ld.global.v4.b32 {{%r18, %r19, %r20, %r21}}, [%rd2+32];\n\
         \x20   ld.global.v4.b32 {{%r22, %r23, %r24, %r25}}, [%rd2+48];\n\
         \x20   mul.wide.u32 %rd5, %r0, 16;\n    add.s64 %rd3, %rd3, %rd5;\n\
         \x20   mov.b32 %r1, 0;\n    mov.b32 %r2, 0;\n    mov.b32 %r3, 0;\n    mov.b32 %r4, 0;\n\
         {body}\n\
         \x20   st.global.v4.b32 [%rd3], {{%r1, %r2, %r3, %r4}};\n    ret;\n}}\n"
    )
}

const HEAD: &str = ".version 8.7\n.target sm_90a\n.address_size 64\n";
const HEAD_INDEP: &str = ".version 8.7\n.target sm_90a, texmode_independent\n.address_size 64\n";

/// `{%rA, %rA+1, ..}` with `n` elements.
fn regs(first: usize, n: usize) -> String {
    let r: Vec<String> = (first..first + n).map(|k| format!("%r{k}")).collect();
    format!("{{{}}}", r.join(", "))
}

/// Round-to-nearest-even f64 -> f16 bits (finite inputs within the f16 range).
fn f16_bits(x: f64) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000u16 } else { 0 };
    let a = x.abs();
    if a == 0.0 {
        return sign;
    }
    let e = a.log2().floor().max(-14.0) as i32;
    let q = 2f64.powi(e - 10);
    let m = (a / q).round_ties_even();
    // m in [1024, 2048] for normals (2048 carries into the next binade)
    let (e, m) = if m >= 2048.0 { (e + 1, 1024.0) } else { (e, m) };
    if m < 1024.0 {
        return sign | m as u16; // subnormal
    }
    sign | ((e + 15) as u16) << 10 | (m as u16 - 1024)
}

// ---------------------------------------------------------------------------------------------
// The host model of a texture object: levels of planes of texels, densely packed.

#[derive(Clone)]
struct Obj {
    format: TexFormat,
    channels: usize,
    /// Spatial dimensions (1..3; a cube is 2).
    dims: usize,
    ext: [i64; 3],
    /// Planes per level besides a 3D depth (layers x 6 faces x samples).
    planes: i64,
    levels: u32,
    s: Sampler,
    mip_linear: bool,
    cube: bool,
    layers: i64,
    samples: i64,
    data: Vec<u8>,
}

impl Obj {
    fn lext(&self, level: u32) -> [i64; 3] {
        let mut e = self.ext;
        for x in e.iter_mut().take(self.dims) {
            *x = (*x >> level).max(1);
        }
        e
    }
    fn level_planes(&self, level: u32) -> i64 {
        if self.dims == 3 {
            self.lext(level)[2]
        } else {
            self.planes
        }
    }
    /// Texels of level `level`, all planes.
    fn level_texels(&self, level: u32) -> i64 {
        let e = self.lext(level);
        e[0] * e[1] * self.level_planes(level)
    }
    fn bytes(&self) -> usize {
        let t: i64 = (0..self.levels).map(|k| self.level_texels(k)).sum();
        t as usize * self.channels * self.format.bytes() as usize
    }
    fn raw(&self, level: u32, x: i64, y: i64, plane: i64, c: usize) -> u64 {
        let before: i64 = (0..level).map(|k| self.level_texels(k)).sum();
        let e = self.lext(level);
        let t = before + x + e[0] * (y + e[1] * plane);
        let cb = self.format.bytes() as usize;
        let off = (t as usize * self.channels + c) * cb;
        let b = &self.data[off..off + cb];
        let mut v = 0u64;
        for (k, x) in b.iter().enumerate() {
            v |= (*x as u64) << (8 * k);
        }
        v
    }
    fn value(&self, raw: u64, float: bool) -> f64 {
        if float {
            float_value(self.format, raw)
        } else {
            raw as f64
        }
    }
    fn wrap(&self, k: usize, i: i64, n: i64) -> Option<i64> {
        if self.cube {
            return Some(i.max(0).min(n - 1));
        }
        let mut mode = self.s.addr_mode[k];
        if !self.s.normalized && matches!(mode, AddrMode::Wrap | AddrMode::Mirror) {
            mode = AddrMode::Clamp;
        }
        match mode {
            AddrMode::Wrap => Some(((i % n) + n) % n),
            AddrMode::Mirror => {
                let p = ((i % (2 * n)) + 2 * n) % (2 * n);
                Some(if p < n { p } else { 2 * n - 1 - p })
            }
            AddrMode::Clamp => Some(i.max(0).min(n - 1)),
            AddrMode::Border => (i >= 0 && i < n).then_some(i),
        }
    }
    fn texel(&self, level: u32, plane: i64, idx: [i64; 3], float: bool) -> [f64; 4] {
        let e = self.lext(level);
        let mut at = [0i64; 3];
        for k in 0..self.dims {
            match self.wrap(k, idx[k], e[k]) {
                Some(i) => at[k] = i,
                None => return [0.0; 4],
            }
        }
        let plane = if self.dims == 3 { at[2] } else { plane };
        let mut v = [0.0, 0.0, 0.0, 1.0];
        for (c, x) in v.iter_mut().enumerate().take(self.channels) {
            *x = self.value(self.raw(level, at[0], at[1], plane, c), float);
        }
        v
    }
    /// Point or linear (9-bit weights, x fastest) at texel-space `u`.
    fn filter(&self, level: u32, plane: i64, u: &[f64], (float, ms): (bool, bool)) -> [f64; 4] {
        if self.s.filter == Filter::Point || !float || ms {
            let mut idx = [0i64; 3];
            for (k, x) in u.iter().enumerate() {
                idx[k] = x.floor() as i64;
            }
            return self.texel(level, plane, idx, float);
        }
        let base = linear_base(u);
        let mut acc = [0.0; 4];
        for corner in 0..1usize << u.len() {
            let mut idx = [0i64; 3];
            let mut w = 1.0;
            for k in 0..u.len() {
                let hi = corner >> k & 1 == 1;
                idx[k] = base[k].0 + hi as i64;
                w *= if hi { base[k].1 } else { 1.0 - base[k].1 };
            }
            let t = self.texel(level, plane, idx, true);
            for ch in 0..4 {
                acc[ch] += w * t[ch];
            }
        }
        acc
    }
    /// The level(s) and weights for level of detail `lambda`.
    fn levels_for(&self, lambda: f64) -> Vec<(u32, f64)> {
        let top = (self.levels - 1) as f64;
        let l = if lambda.is_nan() {
            0.0
        } else {
            lambda.max(0.0).min(top)
        };
        if !self.mip_linear {
            // nearest level, ties to the lower one
            let mut k = l.floor();
            if l - k > 0.5 {
                k += 1.0;
            }
            return vec![(k as u32, 1.0)];
        }
        let lo = l.floor();
        let f = ((l - lo) * 256.0).round() / 256.0;
        if f == 0.0 {
            return vec![(lo as u32, 1.0)];
        }
        vec![(lo as u32, 1.0 - f), ((lo + 1.0).min(top) as u32, f)]
    }
}

/// Cube face and face coordinates (u, v in [0, 1]) of direction `p`, with the derivative of
/// (u, v) along `d`: the Programming Guide's table, written out face by face.
fn cube_ref(p: [f64; 3], d: [f64; 3]) -> (i64, [f64; 2], [f64; 2]) {
    let (x, y, z) = (p[0], p[1], p[2]);
    let (ax, ay, az) = (x.abs(), y.abs(), z.abs());
    // (face, sc, tc, ma, dsc, dtc, dma)
    let (face, sc, tc, ma, dsc, dtc, dma) = if ax >= ay && ax >= az {
        if x >= 0.0 {
            (0, -z, -y, x, -d[2], -d[1], d[0])
        } else {
            (1, z, -y, -x, d[2], -d[1], -d[0])
        }
    } else if ay >= az {
        if y >= 0.0 {
            (2, x, z, y, d[0], d[2], d[1])
        } else {
            (3, x, -z, -y, d[0], -d[2], -d[1])
        }
    } else if z >= 0.0 {
        (4, x, -y, z, d[0], -d[1], d[2])
    } else {
        (5, -x, -y, -z, -d[0], -d[1], -d[2])
    };
    let uv = [(sc / ma + 1.0) / 2.0, (tc / ma + 1.0) / 2.0];
    let du = [
        (dsc * ma - sc * dma) / (2.0 * ma * ma),
        (dtc * ma - tc * dma) / (2.0 * ma * ma),
    ];
    (face, uv, du)
}

/// What a fetch case runs.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    Plain,
    Base,
    Level,
    Grad,
    /// `tld4` of a channel.
    Gather(usize),
}

struct Case {
    geom: &'static str,
    form: Form,
    /// `.f32` (true) or `.s32` coordinates.
    fcoord: bool,
    /// `.f32` (true) or `.s32` result.
    float: bool,
    offsets: bool,
    obj: Obj,
}

fn geom_info(g: &str) -> (usize, usize, usize, Option<usize>, Option<usize>, bool) {
    // (coord_len, spatial, first coordinate, layer slot, sample slot, cube)
    match g {
        "1d" => (1, 1, 0, None, None, false),
        "2d" => (2, 2, 0, None, None, false),
        "3d" => (4, 3, 0, None, None, false),
        "a1d" => (2, 1, 1, Some(0), None, false),
        "a2d" => (4, 2, 1, Some(0), None, false),
        "cube" => (4, 3, 0, None, None, true),
        "acube" => (4, 3, 1, Some(0), None, true),
        "2dms" => (4, 2, 1, None, Some(0), false),
        _ => (4, 2, 2, Some(0), Some(1), false),
    }
}

/// The reference result of one thread's inputs `w`.
fn reference(c: &Case, w: &[u32]) -> [f64; 4] {
    let o = &c.obj;
    let (_, spatial, first, lslot, sslot, cube) = geom_info(c.geom);
    let f = |k: usize| f32::from_bits(w[k]) as f64;
    let layer = lslot.map_or(0, |s| (w[s] as i64).min(o.layers.max(1) - 1));
    let sample = sslot.map_or(0, |s| (w[s] as i32 as i64).max(0).min(o.samples.max(1) - 1));
    let mut plane = if cube {
        6 * layer
    } else {
        layer * o.samples.max(1) + sample
    };
    let dir = [f(first), f(first + 1), f(first + 2)];
    if let Form::Gather(comp) = c.form {
        let mut u = [0.0; 2];
        if cube {
            let (face, uv, _) = cube_ref(dir, [0.0; 3]);
            plane += face;
            u = [uv[0] * o.ext[0] as f64, uv[1] * o.ext[0] as f64];
        } else {
            for k in 0..2 {
                let s = if o.s.normalized { o.ext[k] as f64 } else { 1.0 };
                u[k] = f(first + k) * s;
                if c.offsets {
                    u[k] += w[13 + k] as i32 as f64;
                }
            }
        }
        let i = (u[0] - 0.5).floor() as i64;
        let j = (u[1] - 0.5).floor() as i64;
        return [(i, j + 1), (i + 1, j + 1), (i + 1, j), (i, j)]
            .map(|(a, b)| o.texel(0, plane, [a, b, 0], c.float)[comp]);
    }
    let lambda = match c.form {
        Form::Level if c.fcoord => f(4),
        Form::Level => w[4] as i32 as f64,
        Form::Grad => {
            let n = spatial;
            let len = |base: usize| -> f64 {
                if cube {
                    let g = [f(base), f(base + 1), f(base + 2)];
                    let (_, _, du) = cube_ref(dir, g);
                    (du[0] * du[0] + du[1] * du[1]).sqrt() * o.ext[0] as f64
                } else {
                    let mut s = 0.0;
                    for k in 0..n {
                        let sc = if o.s.normalized { o.ext[k] as f64 } else { 1.0 };
                        s += (f(base + k) * sc).powi(2);
                    }
                    s.sqrt()
                }
            };
            len(5).max(len(9)).log2()
        }
        _ => 0.0,
    };
    let mut acc = [0.0; 4];
    let lv = o.levels_for(lambda);
    let one = lv.len() == 1;
    for (level, wgt) in lv {
        let e = o.lext(level);
        let v = if cube {
            let (face, uv, _) = cube_ref(dir, [0.0; 3]);
            let wd = e[0] as f64;
            o.filter(
                level,
                plane + face,
                &[uv[0] * wd, uv[1] * wd],
                (c.float, false),
            )
        } else {
            let mut u = vec![0.0; spatial];
            for (k, x) in u.iter_mut().enumerate() {
                *x = if c.fcoord {
                    let v = f(first + k);
                    if o.s.normalized {
                        v * e[k] as f64
                    } else {
                        v * e[k] as f64 / o.ext[k] as f64
                    }
                } else {
                    w[first + k] as i32 as f64 + 0.5
                };
                if c.offsets {
                    *x += w[13 + k] as i32 as f64;
                }
            }
            let ms = sslot.is_some();
            o.filter(level, plane, &u, (c.float, ms))
        };
        if one {
            return v;
        }
        for ch in 0..4 {
            acc[ch] += wgt * v[ch];
        }
    }
    acc
}

/// A random float coordinate: normalized in [-0.25, 1.25], else texel space past both edges;
/// some exactly on texel centres.
fn coord(rng: &mut StdRng, o: &Obj, k: usize) -> f32 {
    let n = o.ext[k] as f32;
    if rng.gen_bool(0.2) {
        let c = rng.gen_range(-1..o.ext[k] + 1) as f32 + 0.5;
        return if o.s.normalized { c / n } else { c };
    }
    if o.s.normalized {
        rng.gen_range(-0.25f32..1.25)
    } else {
        rng.gen_range(-2.0..n + 2.0)
    }
}

/// A cube direction whose largest component is clearly the largest.
fn direction(rng: &mut StdRng) -> [f32; 3] {
    loop {
        let p: [f32; 3] = [0; 3].map(|_| rng.gen_range(-1.0f32..1.0));
        let mut a = p.map(f32::abs);
        a.sort_by(|x, y| y.total_cmp(x));
        if a[0] - a[1] > 1e-3 && a[0] > 0.05 {
            return p;
        }
    }
}

/// One thread's 16 input words for `c`.
fn inputs(rng: &mut StdRng, c: &Case) -> [u32; WORDS_IN] {
    let o = &c.obj;
    let (_, spatial, first, lslot, sslot, cube) = geom_info(c.geom);
    let mut w = [0u32; WORDS_IN];
    if cube {
        let p = direction(rng);
        for k in 0..3 {
            w[first + k] = p[k].to_bits();
        }
    } else {
        for k in 0..spatial {
            w[first + k] = if c.fcoord {
                coord(rng, o, k).to_bits()
            } else {
                rng.gen_range(-2..o.ext[k] + 2) as i32 as u32
            };
        }
    }
    if let Some(s) = lslot {
        w[s] = rng.gen_range(0..o.layers as u32 + 2);
    }
    if let Some(s) = sslot {
        w[s] = rng.gen_range(-1..o.samples as i32 + 2) as u32;
    }
    w[4] = if c.fcoord {
        rng.gen_range(-1.0f32..o.levels as f32 + 0.5).to_bits()
    } else {
        rng.gen_range(-1..o.levels as i32 + 1) as u32
    };
    for g in w[5..13].iter_mut() {
        let mag = 2f32.powf(rng.gen_range(-7.0f32..1.0));
        let v = if o.s.normalized || cube {
            mag
        } else {
            mag * 8.0
        };
        *g = if rng.gen_bool(0.5) { v } else { -v }.to_bits();
    }
    for e in w[13..16].iter_mut() {
        *e = rng.gen_range(-8..8) as u32;
    }
    w
}

fn instruction(c: &Case) -> String {
    let (clen, spatial, ..) = geom_info(c.geom);
    let g = c.geom;
    let d = if c.float { "f32" } else { "s32" };
    let ct = if c.fcoord { "f32" } else { "s32" };
    let dst = "{%r1, %r2, %r3, %r4}";
    let coords = regs(10, clen);
    let glen = if spatial == 3 { 4 } else { spatial };
    let off = if c.offsets {
        format!(", {}", regs(23, glen))
    } else {
        String::new()
    };
    match c.form {
        Form::Plain => format!("tex.{g}.v4.{d}.{ct} {dst}, [%rd1, {coords}]{off};"),
        Form::Base => format!("tex.base.{g}.v4.{d}.{ct} {dst}, [%rd1, {coords}]{off};"),
        Form::Level => format!("tex.level.{g}.v4.{d}.{ct} {dst}, [%rd1, {coords}], %r14{off};"),
        Form::Grad => format!(
            "tex.grad.{g}.v4.{d}.{ct} {dst}, [%rd1, {coords}], {}, {}{off};",
            regs(15, glen),
            regs(19, glen)
        ),
        Form::Gather(k) => {
            let comp = ["r", "g", "b", "a"][k];
            format!("tld4.{comp}.{g}.v4.{d}.f32 {dst}, [%rd1, {coords}]{off};")
        }
    }
}

/// The descriptor of `o` over `base`.
fn desc_of(o: &Obj, base: u64) -> TexDesc {
    let ext: Vec<u32> = o.ext[..o.dims].iter().map(|&x| x as u32).collect();
    let d = TexDesc::texture(base, o.format, o.channels as u32, &ext, o.s).unwrap();
    let sh = Shape {
        layers: o.layers as usize,
        cube: o.cube,
        samples: o.samples as usize,
        levels: o.levels,
        mip_linear: o.mip_linear,
    };
    shaped_desc(d, sh)
}

/// How a fetch case's kernel reaches its object: a handle parameter (unified mode), or a
/// module-scope `.texref` bound from the host, with an optional sampler.
struct Setup<'a> {
    head: &'a str,
    decls: &'a str,
    /// Rewrites the instruction's `[%rd1, ` (e.g. to `[gt, gsm, `).
    object: &'a str,
    /// The `.texref` to bind the texture to.
    bind: Option<&'a str>,
    /// An independent-mode sampler handle (parameter `ps`).
    sampler: Option<TexDesc>,
    /// The sampler state the texture descriptor carries when it differs from the one the
    /// fetch uses (`c.obj.s`, the reference's).
    tex_sampler: Option<Sampler>,
}

const UNIFIED: Setup = Setup {
    head: HEAD,
    decls: "",
    object: "[%rd1, ",
    bind: None,
    sampler: None,
    tex_sampler: None,
};

fn run_case(rng: &mut StdRng, c: &mut Case) {
    run_case_with(rng, c, &UNIFIED);
}

fn run_case_with(rng: &mut StdRng, c: &mut Case, setup: &Setup) {
    const N: usize = 256;
    let mem = GlobalMemory::new();
    let nbytes = c.obj.bytes();
    let n = nbytes / c.obj.format.bytes() as usize;
    c.obj.data = texel_data(rng, c.obj.format, n);
    let back = buffer(&mem, &c.obj.data);
    let mut o = c.obj.clone();
    o.s = setup.tex_sampler.unwrap_or(o.s);
    let d = desc_of(&o, back.base);
    assert_eq!(d.bytes() as usize, nbytes, "layout of {}", c.geom);
    let h = d.upload(&mem, 0).unwrap();
    let ins: Vec<[u32; WORDS_IN]> = (0..N).map(|_| inputs(rng, c)).collect();
    let ins_text = instruction(c).replace("[%rd1, ", setup.object);
    let text = kernel(setup.head, setup.decls, N, &format!("    {ins_text}"));
    let m = load(&mem, &text);
    if let Some(name) = setup.bind {
        m.bind_texref(name, &d).unwrap();
    }
    let sh = setup.sampler.as_ref().map(|s| s.upload(&mem, 0).unwrap());
    let sp = sh.as_ref().map_or(0, |a| a.base);
    let got = launch_rows(&m, &mem, (h.base, sp), &ins).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for (t, w) in ins.iter().enumerate() {
        let want = reference(c, w).map(|x| {
            if c.float {
                (x as f32).to_bits()
            } else {
                x as u32
            }
        });
        assert_eq!(
            &got[4 * t..4 * t + 4],
            &want,
            "{}: thread {t} inputs {w:x?}",
            instruction(c)
        );
    }
}

fn obj(format: TexFormat, channels: usize, ext: &[i64], s: Sampler) -> Obj {
    let mut e = [1i64; 3];
    e[..ext.len()].copy_from_slice(ext);
    Obj {
        format,
        channels,
        dims: ext.len(),
        ext: e,
        planes: 1,
        levels: 1,
        s,
        mip_linear: false,
        cube: false,
        layers: 0,
        samples: 0,
        data: Vec::new(),
    }
}

fn smp(modes: [AddrMode; 3], filter: Filter, normalized: bool) -> Sampler {
    Sampler::new(modes, filter, normalized)
}

fn case(geom: &'static str, form: Form, obj: Obj) -> Case {
    Case {
        geom,
        form,
        fcoord: true,
        float: true,
        offsets: false,
        obj,
    }
}

/// `tex.base`/`.level`/`.grad` on mipmapped 1D/2D/3D textures: point and linear texel and mip
/// filters, normalized and unnormalized coordinates, `.s32` coordinates and lod.
#[test]
fn mipmapped_level_and_grad() {
    use AddrMode::*;
    use TexFormat::*;
    let mut rng = StdRng::seed_from_u64(0x71e7);
    let lin = smp([Wrap, Clamp, Mirror], Filter::Linear, true);
    let pt = smp([Clamp, Border, Wrap], Filter::Point, true);
    let mipped = |mut o: Obj, levels: u32, linear: bool| {
        o.levels = levels;
        o.mip_linear = linear;
        o
    };
    #[rustfmt::skip] // one case per line
    let mut cases = vec![
        case("2d", Form::Level, mipped(obj(F32, 2, &[8, 6], lin), 4, true)),
        case("2d", Form::Level, mipped(obj(U8, 4, &[9, 5], pt), 4, false)),
        case("2d", Form::Grad, mipped(obj(F16, 1, &[16, 8], lin), 5, true)),
        case("2d", Form::Grad, mipped(obj(F32, 4, &[8, 8], pt), 4, false)),
        case("1d", Form::Grad, mipped(obj(U16, 2, &[32], lin), 6, true)),
        case("3d", Form::Level, mipped(obj(F32, 1, &[4, 4, 8], lin), 4, true)),
        case("3d", Form::Grad, mipped(obj(F32, 1, &[8, 4, 4], pt), 4, true)),
        case("2d", Form::Base, mipped(obj(F32, 1, &[8, 4], lin), 3, true)),
        case("2d", Form::Grad, mipped(obj(F32, 1, &[8, 4], smp([Clamp; 3], Filter::Linear, false)), 3, true)),
    ];
    let mut ints = case(
        "2d",
        Form::Level,
        mipped(obj(TexFormat::U32, 1, &[8, 8], pt), 4, false),
    );
    (ints.fcoord, ints.float) = (false, false);
    cases.push(ints);
    let o = mipped(obj(TexFormat::F32, 2, &[8, 8], pt), 4, true);
    let mut grad_int = case("2d", Form::Grad, o);
    grad_int.fcoord = false;
    cases.push(grad_int);
    let mut off = case(
        "2d",
        Form::Level,
        mipped(obj(TexFormat::F32, 1, &[8, 8], lin), 3, true),
    );
    off.offsets = true;
    cases.push(off);
    for c in &mut cases {
        run_case(&mut rng, c);
    }
}

/// Layered, cube, cube-array and multisample `tex`, and `tld4` on layered and cube textures.
#[test]
fn arrays_cubes_and_multisample() {
    use AddrMode::*;
    use TexFormat::*;
    let mut rng = StdRng::seed_from_u64(0xa77a);
    let lin = smp([Wrap, Clamp, Clamp], Filter::Linear, true);
    let pt = smp([Clamp, Mirror, Clamp], Filter::Point, false);
    let shaped = |mut o: Obj, layers: i64, cube: bool, samples: i64, levels: u32| {
        o.layers = layers;
        o.cube = cube;
        o.samples = samples;
        o.planes = layers.max(1) * if cube { 6 } else { samples.max(1) };
        o.levels = levels;
        o.mip_linear = true;
        o
    };
    #[rustfmt::skip] // one case per line
    let mut cases = vec![
        case("a1d", Form::Plain, shaped(obj(F32, 2, &[7], lin), 3, false, 0, 1)),
        case("a2d", Form::Plain, shaped(obj(U8, 4, &[5, 4], pt), 4, false, 0, 1)),
        case("a2d", Form::Grad, shaped(obj(F32, 1, &[8, 8], lin), 2, false, 0, 4)),
        case("a1d", Form::Level, shaped(obj(F16, 1, &[16], lin), 2, false, 0, 5)),
        case("cube", Form::Plain, shaped(obj(F32, 4, &[4, 4], lin), 0, true, 0, 1)),
        case("cube", Form::Level, shaped(obj(F32, 1, &[8, 8], lin), 0, true, 0, 4)),
        case("cube", Form::Grad, shaped(obj(U16, 2, &[8, 8], lin), 0, true, 0, 4)),
        case("acube", Form::Plain, shaped(obj(U8, 1, &[3, 3], pt), 3, true, 0, 1)),
        case("acube", Form::Grad, shaped(obj(F32, 1, &[4, 4], lin), 2, true, 0, 3)),
        case("a2d", Form::Gather(1), shaped(obj(F32, 2, &[5, 5], lin), 3, false, 0, 1)),
        case("cube", Form::Gather(0), shaped(obj(U8, 4, &[4, 4], pt), 0, true, 0, 1)),
        case("acube", Form::Gather(3), shaped(obj(F32, 4, &[4, 4], lin), 2, true, 0, 1)),
    ];
    for (g, layers) in [("2dms", 0), ("a2dms", 3)] {
        let o = shaped(obj(TexFormat::U32, 2, &[5, 3], pt), layers, false, 4, 1);
        let mut c = case(g, Form::Plain, o);
        (c.fcoord, c.float) = (false, false);
        cases.push(c);
        let o = shaped(obj(TexFormat::F32, 1, &[4, 4], pt), layers, false, 2, 1);
        let mut c = case(g, Form::Plain, o);
        c.fcoord = false;
        cases.push(c);
    }
    let mut off = case(
        "a2d",
        Form::Gather(0),
        shaped(obj(TexFormat::F32, 1, &[6, 6], lin), 2, false, 0, 1),
    );
    off.offsets = true;
    cases.push(off);
    for c in &mut cases {
        run_case(&mut rng, c);
    }
}

/// Module-scope `.texref` variables bound from the host (with initialiser fields overriding
/// the bound object's sampler state), independent-mode `.samplerref` variables and sampler
/// handles, and the error a kernel reading an unbound `.texref` gets.
#[test]
fn texrefs_and_samplers() {
    use AddrMode::*;
    let mut rng = StdRng::seed_from_u64(0x7e7f);
    let lin = smp([Wrap, Clamp, Clamp], Filter::Linear, true);
    let plain = |sm: Sampler| case("2d", Form::Plain, obj(TexFormat::F32, 2, &[6, 5], sm));
    let point = smp([Clamp; 3], Filter::Point, false);
    // unified: a bound .texref
    let setup = Setup {
        decls: ".global .texref gt;",
        object: "[gt, ",
        bind: Some("gt"),
        ..UNIFIED
    };
    run_case_with(&mut rng, &mut plain(lin), &setup);
    // the declaration's fields override the bound object's sampler
    let setup = Setup {
        decls: ".global .texref gt = { filter_mode = linear, addr_mode_0 = mirror, \
                addr_mode_1 = clamp_to_border, normalized_coords = 1 };",
        object: "[gt, ",
        bind: Some("gt"),
        tex_sampler: Some(point),
        ..UNIFIED
    };
    let want = smp([Mirror, Border, Clamp], Filter::Linear, true);
    run_case_with(&mut rng, &mut plain(want), &setup);
    // independent mode: a .samplerref's state replaces the texture's
    let setup = Setup {
        head: HEAD_INDEP,
        decls: ".global .texref gt;\n.global .samplerref gsm = { addr_mode_0 = wrap, \
                addr_mode_1 = mirror, filter_mode = linear };",
        object: "[gt, gsm, ",
        bind: Some("gt"),
        sampler: None,
        tex_sampler: Some(smp([Border; 3], Filter::Point, true)),
    };
    let want = smp([Wrap, Mirror, Clamp], Filter::Linear, true);
    run_case_with(&mut rng, &mut plain(want), &setup);
    // independent mode with handles: a sampler forcing unnormalized coordinates
    let forced = smp([Border, Clamp, Clamp], Filter::Linear, false);
    let setup = Setup {
        head: HEAD_INDEP,
        object: "[%rd1, %rd4, ",
        sampler: Some(TexDesc::sampler(forced).unwrap()),
        tex_sampler: Some(smp([Wrap; 3], Filter::Point, true)),
        ..UNIFIED
    };
    run_case_with(&mut rng, &mut plain(forced), &setup);
    let mut g = case(
        "2d",
        Form::Gather(1),
        obj(TexFormat::F32, 2, &[6, 5], forced),
    );
    run_case_with(&mut rng, &mut g, &setup);
}

/// Queries of `.texref`/`.samplerref`/`.surfref` variables and `.surfref` access, and the
/// fault an unbound variable raises.
#[test]
fn bound_refs_query_and_access() {
    let mem = GlobalMemory::new();
    let decls = ".global .texref gt;\n.global .surfref gs;\n.global .texref gu;\n\
                 .global .samplerref gsm = { addr_mode_0 = mirror, filter_mode = linear };";
    let body = "    txq.width.b32 %r1, [gt];\n    txq.filter_mode.b32 %r2, [gsm];\n\
                \x20   txq.addr_mode_0.b32 %r3, [gsm];\n    suq.height.b32 %r4, [gs];\n\
                \x20   suld.b.2d.b32.trap {%r5}, [gs, {%r10, %r11}];\n\
                \x20   add.u32 %r5, %r5, %r4;\n    sust.b.2d.b32.trap [gs, {%r10, %r11}], {%r5};";
    let text = kernel(HEAD_INDEP, decls, 1, body);
    let m = load(&mem, &text);
    let mut rng = StdRng::seed_from_u64(5);
    let tex_back = buffer(&mem, &[0u8; 4 * 7 * 3]);
    let s = smp([AddrMode::Clamp; 3], Filter::Point, false);
    let td = TexDesc::texture(tex_back.base, TexFormat::F32, 1, &[7, 3], s).unwrap();
    let texels: Vec<u32> = (0..12).map(|_| rng.gen()).collect();
    let sb: Vec<u8> = texels.iter().flat_map(|x| x.to_le_bytes()).collect();
    let surf = buffer(&mem, &sb);
    let sd = TexDesc::surface(surf.base, TexFormat::U32, 1, &[4, 3]).unwrap();
    let mut input = [0u32; WORDS_IN];
    (input[0], input[1]) = (8, 2);
    let inb = buffer(&mem, &input.map(u32::to_le_bytes).concat());
    let out = poisoned(&mem, 16);
    let e = run(&m, &mem, 1, &[0, inb.base, out.base, 0]).expect_err("unbound");
    assert!(e.contains("`gt` is not bound"), "{e}");
    m.bind_texref("gt", &td).unwrap();
    let e = run(&m, &mem, 1, &[0, inb.base, out.base, 0]).expect_err("unbound");
    assert!(e.contains("`gs` is not bound"), "{e}");
    assert!(m.bind_texref("gs", &sd).is_err(), "gs is a .surfref");
    assert!(
        m.bind_surfref("gs", &td).is_err(),
        "a texture for a .surfref"
    );
    m.bind_surfref("gs", &sd).unwrap();
    run(&m, &mem, 1, &[0, inb.base, out.base, 0]).unwrap();
    // txq: width 7, linear (1), mirror (1); suq: height 3
    assert_eq!(words(&out, 4), [7, 1, 1, 3]);
    let mut want = texels.clone();
    want[2 * 4 + 2] = texels[2 * 4 + 2].wrapping_add(3); // byte 8 = texel 2 of row 2
    let got = words(&surf, texels.len());
    assert_eq!(got, want);
    // an unbound .texref used by a fetch names itself too
    let t2 = kernel(
        HEAD,
        ".global .texref gu;",
        1,
        "    tex.1d.v4.f32.f32 {%r1, %r2, %r3, %r4}, [gu, {%r10}];",
    );
    let m2 = load(&mem, &t2);
    let e = run(&m2, &mem, 1, &[0, inb.base, out.base, 0]).expect_err("unbound");
    assert!(e.contains("`gu` is not bound"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Surfaces

/// A surface form: geometry, format, channels, vector width, out-of-range mode.
struct SurfCase {
    geom: &'static str,
    format: TexFormat,
    channels: u32,
    vec: usize,
    mode: &'static str,
    /// Width (texels), height, and depth or layers.
    ext: [i64; 3],
}

/// The coordinate words of texel-space (x, y, plane) for `geom` (x in bytes when `bx`).
fn surf_coords(geom: &str, x: i64, y: i64, plane: i64) -> [u32; 4] {
    let (x, y, p) = (x as i32 as u32, y as i32 as u32, plane as i32 as u32);
    match geom {
        "1d" => [x, 0, 0, 0],
        "2d" => [x, y, 0, 0],
        "3d" => [x, y, p, 0],
        "a1d" => [p, x, 0, 0],
        _ => [p, x, y, 0],
    }
}

fn surf_desc(c: &SurfCase, base: u64) -> TexDesc {
    let ext: Vec<u32> = match c.geom {
        "1d" | "a1d" => vec![c.ext[0] as u32],
        "2d" | "a2d" => vec![c.ext[0] as u32, c.ext[1] as u32],
        _ => c.ext.map(|x| x as u32).to_vec(),
    };
    let d = TexDesc::surface(base, c.format, c.channels, &ext).unwrap();
    if c.geom.starts_with('a') {
        d.layered(c.ext[2] as u32).unwrap()
    } else {
        d
    }
}

/// What `sust.p` stores for register bits `x` in format `f`.
fn converted(f: TexFormat, x: u32) -> Vec<u8> {
    let v = f32::from_bits(x) as f64;
    let unorm = |max: f64| {
        if v.is_nan() {
            0
        } else {
            (v.clamp(0.0, 1.0) * max).round_ties_even() as u32
        }
    };
    match f {
        TexFormat::U8 => vec![unorm(255.0) as u8],
        TexFormat::U16 => (unorm(65535.0) as u16).to_le_bytes().to_vec(),
        TexFormat::F16 => f16_bits(v).to_le_bytes().to_vec(),
        TexFormat::F32 | TexFormat::U32 => x.to_le_bytes().to_vec(),
        f => panic!("no sust.p test stores {f:?}"),
    }
}

/// A value to store: unorm formats get [-0.5, 1.5] and NaN, f16 finite values, else any bits.
fn store_value(rng: &mut StdRng, f: TexFormat) -> u32 {
    match f {
        TexFormat::U8 | TexFormat::U16 if rng.gen_bool(0.05) => f32::NAN.to_bits(),
        TexFormat::U8 | TexFormat::U16 => rng.gen_range(-0.5f32..1.5).to_bits(),
        TexFormat::F16 if rng.gen_bool(0.1) => rng.gen_range(-1e-5f32..1e-5).to_bits(),
        TexFormat::F16 => rng.gen_range(-300.0f32..300.0).to_bits(),
        _ => rng.gen(),
    }
}

/// `sust.p` of every thread's texel (one thread per texel): `.trap` in range, `.zero` with a
/// quarter of the threads out of range (their texels keep the poison), `.clamp` with the edge
/// threads' coordinates past the edge.
fn sust_p_case(rng: &mut StdRng, c: &SurfCase) {
    let mem = GlobalMemory::new();
    let [w, h, p] = c.ext;
    let n = (w * h * p) as usize;
    let tb = (c.format.bytes() * c.channels) as usize;
    let surf = poisoned(&mem, n * tb);
    let d = surf_desc(c, surf.base);
    let hd = d.upload(&mem, 0).unwrap();
    let mut want = vec![0xa5u8; n * tb];
    let mut input = Vec::new();
    for t in 0..n as i64 {
        let (x, y, z) = (t % w, t / w % h, t / (w * h));
        let vals: Vec<u32> = (0..4).map(|_| store_value(rng, c.format)).collect();
        let (mut cx, mut cy, mut cz) = (x, y, z);
        let mut lands = true;
        match c.mode {
            "zero" if rng.gen_bool(0.25) => {
                lands = false;
                // a dimension the geometry has: x, y (2D rows), z / layer
                let has_y = matches!(c.geom, "2d" | "3d" | "a2d");
                let has_z = matches!(c.geom, "3d" | "a1d" | "a2d");
                let dims: Vec<usize> = [(0, true), (1, has_y), (2, has_z)]
                    .into_iter()
                    .filter_map(|(k, on)| on.then_some(k))
                    .collect();
                match dims[rng.gen_range(0..dims.len())] {
                    0 => cx = if rng.gen_bool(0.5) { -1 - x } else { w + x },
                    1 => cy = h + y,
                    _ => cz = if rng.gen_bool(0.5) { -1 } else { p + z },
                }
            }
            "clamp" => {
                let past = |v: i64, n: i64| match v {
                    0 => -1 - (v & 3),
                    v if v == n - 1 && n > 1 => n + 2,
                    v => v,
                };
                // a layer index is unsigned: -1 is past the last layer, not before the first
                let layered = c.geom.starts_with('a');
                let pz = if layered && z == 0 { 0 } else { past(z, p) };
                (cx, cy, cz) = (past(x, w), past(y, h), pz);
            }
            _ => {}
        }
        if lands {
            for (k, v) in vals.iter().enumerate().take(c.vec.min(c.channels as usize)) {
                let cb = c.format.bytes() as usize;
                let off = t as usize * tb + k * cb;
                want[off..off + cb].copy_from_slice(&converted(c.format, *v));
            }
        }
        let mut words = [0u32; WORDS_IN];
        words[..4].copy_from_slice(&surf_coords(c.geom, cx, cy, cz));
        words[5..9].copy_from_slice(&vals);
        input.push(words);
    }
    let coords = regs(
        10,
        if matches!(c.geom, "1d") {
            1
        } else if matches!(c.geom, "2d" | "a1d") {
            2
        } else {
            4
        },
    );
    let (v, src) = if c.vec == 1 {
        (String::new(), "{%r15}".to_string())
    } else {
        (format!(".v{}", c.vec), regs(15, c.vec))
    };
    let ins = format!(
        "    sust.p.{}{v}.b32.{} [%rd1, {coords}], {src};",
        c.geom, c.mode
    );
    let text = kernel(HEAD, "", n, &ins);
    let m = load(&mem, &text);
    assert_eq!(input.len(), n);
    launch_rows(&m, &mem, (hd.base, 0), &input).unwrap_or_else(|e| panic!("{e}\n{ins}"));
    let mut got = vec![0u8; n * tb];
    surf.read_bytes(0, &mut got);
    for t in 0..n {
        assert_eq!(
            &got[t * tb..(t + 1) * tb],
            &want[t * tb..(t + 1) * tb],
            "{ins}: texel {t}, inputs {:x?}",
            input[t]
        );
    }
}

/// `sust.p` converts to every surface format, on every geometry it takes, in every mode.
#[test]
fn sust_p_converts_to_every_format() {
    let mut rng = StdRng::seed_from_u64(0x5057);
    let cases = [
        ("1d", TexFormat::F32, 4, 4, "trap", [9, 1, 1]),
        ("2d", TexFormat::F16, 2, 4, "zero", [5, 4, 1]),
        ("3d", TexFormat::U8, 4, 4, "clamp", [4, 3, 3]),
        ("a1d", TexFormat::U16, 1, 1, "trap", [6, 1, 3]),
        ("a2d", TexFormat::U32, 2, 2, "zero", [3, 4, 3]),
        ("2d", TexFormat::U8, 1, 4, "trap", [7, 3, 1]),
        ("a2d", TexFormat::F16, 4, 2, "clamp", [4, 3, 2]),
        ("a1d", TexFormat::U16, 2, 4, "zero", [5, 1, 4]),
    ];
    for (geom, format, channels, vec, mode, ext) in cases {
        let c = SurfCase {
            geom,
            format,
            channels,
            vec,
            mode,
            ext,
        };
        sust_p_case(&mut rng, &c);
    }
}

/// Layered `suld.b` (`.zero`, `.clamp`) at random byte coordinates past every edge, and
/// `sust.b.a1d`/`.a2d`.
#[test]
fn layered_suld_and_sust_b() {
    const N: usize = 256;
    let mut rng = StdRng::seed_from_u64(0x1a7e);
    for (geom, vec, mode) in [
        ("a1d", 1, "zero"),
        ("a2d", 2, "clamp"),
        ("a2d", 1, "zero"),
        ("a1d", 2, "clamp"),
    ] {
        let mem = GlobalMemory::new();
        let c = SurfCase {
            geom,
            format: TexFormat::U32,
            channels: 2,
            vec,
            mode,
            ext: [5, if geom == "a1d" { 1 } else { 3 }, 4],
        };
        let [w, h, p] = c.ext;
        let row = w * 8;
        let data: Vec<u32> = (0..w * 2 * h * p).map(|_| rng.gen()).collect();
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        let surf = buffer(&mem, &bytes);
        let hd = surf_desc(&c, surf.base).upload(&mem, 0).unwrap();
        let access = 4 * vec as i64;
        let mut input = Vec::new();
        let mut want = Vec::new();
        for _ in 0..N {
            let x = 4 * rng.gen_range(-2..row / 4 + 2);
            let y = if geom == "a1d" {
                0
            } else {
                rng.gen_range(-1..h + 1)
            };
            let z = rng.gen_range(-1..p + 1);
            let hi = [row - access, h - 1, p - 1];
            // the layer index is unsigned (-1 is past the last layer)
            let zu = z as u32 as i64;
            let inr = x >= 0 && x <= hi[0] && y >= 0 && y <= hi[1] && zu <= hi[2];
            let mut v = [0u32; 4];
            if inr || mode == "clamp" {
                let (x, y, z) = (x.max(0).min(hi[0]), y.max(0).min(hi[1]), zu.min(hi[2]));
                for (k, slot) in v.iter_mut().enumerate().take(vec) {
                    *slot = data[((z * h + y) * row + x) as usize / 4 + k];
                }
            }
            want.push(v);
            let mut words = [0u32; WORDS_IN];
            words[..4].copy_from_slice(&surf_coords(geom, x, y, z));
            input.push(words);
        }
        let coords = regs(10, if geom == "a1d" { 2 } else { 4 });
        let (v, dst) = if vec == 1 {
            (String::new(), "{%r1}".to_string())
        } else {
            (format!(".v{vec}"), regs(1, vec))
        };
        let ins = format!("    suld.b.{geom}{v}.b32.{mode} {dst}, [%rd1, {coords}];");
        let text = kernel(HEAD, "", N, &ins);
        let m = load(&mem, &text);
        let got =
            launch_rows(&m, &mem, (hd.base, 0), &input).unwrap_or_else(|e| panic!("{e}\n{ins}"));
        for t in 0..N {
            assert_eq!(
                &got[4 * t..4 * t + 4],
                &want[t],
                "{ins}: {:?}",
                &input[t][..4]
            );
        }
        // sust.b of the same form writes back value + 1 at in-range coordinates
        let st = format!(
            "    suld.b.{geom}{v}.b32.trap {dst}, [%rd1, {coords}];\n    add.u32 %r1, %r1, 1;\n\
             \x20   sust.b.{geom}{v}.b32.trap [%rd1, {coords}], {dst};"
        );
        let m = load(&mem, &kernel(HEAD, "", 1, &st));
        let (x, y, z) = (8, h - 1, p - 1);
        let mut words1 = [0u32; WORDS_IN];
        words1[..4].copy_from_slice(&surf_coords(geom, x, y, z));
        launch_rows(&m, &mem, (hd.base, 0), &[words1]).unwrap();
        let i = ((z * h + y) * row + x) as usize / 4;
        let mut after = data.clone();
        after[i] = data[i].wrapping_add(1);
        let got = words(&surf, data.len());
        assert_eq!(got, after, "{st}");
    }
}

/// `sured.p` on a U32 surface: many threads reduce into a few texels.
#[test]
fn sured_p_reduces_u32_texels() {
    const N: usize = 200;
    let mut rng = StdRng::seed_from_u64(0x5ed);
    for op in ["add", "min", "max", "and", "or"] {
        let mem = GlobalMemory::new();
        let init: Vec<u32> = (0..6).map(|_| rng.gen()).collect();
        let surf = buffer(
            &mem,
            &init
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let hd = TexDesc::surface(surf.base, TexFormat::U32, 1, &[3, 2])
            .unwrap()
            .upload(&mem, 0)
            .unwrap();
        let mut want = init.clone();
        let mut input = Vec::new();
        for _ in 0..N {
            let (x, y) = (rng.gen_range(0..3i64), rng.gen_range(0..2i64));
            let v: u32 = rng.gen();
            let o = &mut want[(y * 3 + x) as usize];
            *o = match op {
                "add" => o.wrapping_add(v),
                "min" => (*o).min(v),
                "max" => (*o).max(v),
                "and" => *o & v,
                _ => *o | v,
            };
            let mut words = [0u32; WORDS_IN];
            words[..4].copy_from_slice(&surf_coords("2d", x, y, 0));
            words[5] = v;
            input.push(words);
        }
        let ins = format!("    sured.p.{op}.2d.b32.trap [%rd1, {{%r10, %r11}}], %r15;");
        let m = load(&mem, &kernel(HEAD, "", N, &ins));
        launch_rows(&m, &mem, (hd.base, 0), &input).unwrap();
        assert_eq!(words(&surf, 6), want, "{ins}");
    }
}

/// `txq.level.*`, `txq.num_mipmap_levels`/`array_size`/`num_samples`/`channel_*` and
/// `suq.array_size`/`memory_layout`/`channel_*` report the descriptor.
#[test]
fn queries_report_the_shape() {
    let mem = GlobalMemory::new();
    let back = buffer(&mem, &[0u8; 4]);
    let s = smp([AddrMode::Clamp; 3], Filter::Point, true);
    let tx = |f, ch, ext: &[u32]| TexDesc::texture(back.base, f, ch, ext, s).unwrap();
    let one_thread = |body: &str| kernel(HEAD, "", 1, body);
    let levels = one_thread(
        "    txq.level.width.b32 %r1, [%rd1], %r10;\n    txq.level.height.b32 %r2, [%rd1], %r10;\n\
         \x20   txq.level.depth.b32 %r3, [%rd1], %r10;\n    txq.num_mipmap_levels.b32 %r4, [%rd1];",
    );
    let shape = one_thread(
        "    txq.array_size.b32 %r1, [%rd1];\n    txq.num_samples.b32 %r2, [%rd1];\n\
         \x20   txq.channel_data_type.b32 %r3, [%rd1];\n    txq.channel_order.b32 %r4, [%rd1];",
    );
    let surf = one_thread(
        "    suq.array_size.b32 %r1, [%rd1];\n    suq.memory_layout.b32 %r2, [%rd1];\n\
         \x20   suq.channel_data_type.b32 %r3, [%rd1];\n    suq.channel_order.b32 %r4, [%rd1];",
    );
    let cases: Vec<(&String, TexDesc, u32, [u32; 4])> = vec![
        (
            &levels,
            tx(TexFormat::F32, 1, &[16, 8])
                .mipmapped(5, Filter::Linear)
                .unwrap(),
            2,
            [4, 2, 1, 5],
        ),
        (
            &levels,
            tx(TexFormat::F32, 1, &[16, 8])
                .mipmapped(5, Filter::Point)
                .unwrap(),
            4,
            [1, 1, 1, 5],
        ),
        (
            &levels,
            tx(TexFormat::U8, 2, &[8, 4, 16])
                .mipmapped(4, Filter::Point)
                .unwrap(),
            3,
            [1, 1, 2, 4],
        ),
        (&levels, tx(TexFormat::U8, 2, &[6, 5]), 0, [6, 5, 1, 1]),
        (
            &shape,
            tx(TexFormat::F16, 4, &[4, 4]).layered(5).unwrap(),
            0,
            [5, 0, 3, 4],
        ),
        (
            &shape,
            tx(TexFormat::U32, 2, &[4, 4]).multisample(4).unwrap(),
            0,
            [0, 4, 2, 2],
        ),
        (
            &shape,
            tx(TexFormat::U16, 1, &[4, 4])
                .cubemap()
                .unwrap()
                .layered(2)
                .unwrap(),
            0,
            [2, 0, 1, 1],
        ),
        (
            &surf,
            TexDesc::surface(back.base, TexFormat::U16, 2, &[3, 2])
                .unwrap()
                .layered(3)
                .unwrap(),
            0,
            [3, 1, 1, 2],
        ),
    ];
    for (text, d, level, want) in cases {
        let m = load(&mem, text);
        let h = d.upload(&mem, 0).unwrap();
        let mut input = [0u32; WORDS_IN];
        input[0] = level;
        let inb = buffer(&mem, &input.map(u32::to_le_bytes).concat());
        let out = poisoned(&mem, 16);
        run(&m, &mem, 1, &[h.base, inb.base, out.base, 0]).unwrap();
        assert_eq!(words(&out, 4), want, "{d:?} level {level}");
    }
}

/// The validator rejects what ptxas rejects among the new forms (geometries an opcode does
/// not take, coordinate and gradient counts, coordinate types, `.p` types, samplers outside
/// independent mode, objects of the wrong kind).
#[test]
fn validator_rejects_malformed_new_forms() {
    // `{d4}` stands for a four-register vector
    #[rustfmt::skip] // one case per line
    let bad: [(&str, &str); 13] = [
        ("tex.level.2dms.v4.f32.s32 {d4}, [%rd1, {%r5, %r6, %r7, %r8}], %r9;", "no .base/.level/.grad"),
        ("tex.cube.v4.f32.s32 {d4}, [%rd1, {%r5, %r6, %r7, %r8}];", "types"),
        ("tex.2dms.v4.f32.f32 {d4}, [%rd1, {%r5, %r6, %r7, %r8}];", "types"),
        ("tld4.r.2d.v4.f32.s32 {d4}, [%rd1, {%r5, %r6}];", "types"),
        ("suld.b.cube.b32.trap {%r1}, [%rd1, {%r5, %r6, %r7, %r8}];", "geometry"),
        ("sured.b.add.a1d.u32.trap [%rd1, {%r5, %r6}], %r1;", "geometry"),
        ("sust.p.2d.v4.u32.trap [%rd1, {%r5, %r6}], {d4};", "sust.p"),
        ("suld.p.2d.v4.b32.trap {d4}, [%rd1, {%r5, %r6}];", "sust.p"),
        ("tex.a2d.v4.f32.f32 {d4}, [%rd1, {%r5, %r6}];", "coordinates"),
        ("tex.grad.2d.v4.f32.f32 {d4}, [%rd1, {%r5, %r6}], {%r7}, {%r8, %r9};", "dPdx"),
        ("tex.2d.v4.f32.f32 {d4}, [gs, {%r5, %r6}];", "not a module-scope .texref"),
        ("suq.num_mipmap_levels.b32 %r1, [%rd1];", "query attribute"),
        ("txq.level.filter_mode.b32 %r1, [%rd1], %r2;", ".level"),
    ];
    for (ins, msg) in bad {
        let ins = ins.replace("{d4}", "{%r1, %r2, %r3, %r4}");
        let text = format!(
            "{HEAD}.global .surfref gs;\n.visible .entry k(.param .u64 p)\n{{\n    .reg .b32 %r<10>;\n\
             \x20   .reg .b64 %rd<4>;\n    ld.param.u64 %rd1, [p];\n    mov.b64 %rd2, %rd1;\n    {ins}\n    ret;\n}}\n"
        );
        assert_rejected(&text, &ins, msg, "isa_tex_geom test PTX");
    }
}

/// `tex.v2.f16x2` packs the four channels as f16 pairs (rounded to nearest even), and the
/// residency predicate of `d|p` is true.
#[test]
fn f16x2_results_and_residency_predicate() {
    const N: usize = 128;
    let mut rng = StdRng::seed_from_u64(0xf16);
    let mem = GlobalMemory::new();
    let s = smp([AddrMode::Wrap; 3], Filter::Linear, true);
    let mut o = obj(TexFormat::F32, 4, &[5, 4], s);
    o.data = texel_data(&mut rng, TexFormat::F32, 5 * 4 * 4);
    let back = buffer(&mem, &o.data);
    let h = desc_of(&o, back.base).upload(&mem, 0).unwrap();
    let c = case("2d", Form::Plain, o.clone());
    let input: Vec<[u32; WORDS_IN]> = (0..N).map(|_| inputs(&mut rng, &c)).collect();
    let body = "    tex.2d.v2.f16x2.f32 {%r1, %r2}, [%rd1, {%r10, %r11}];\n\
                \x20   tex.2d.v4.f32.f32 {%r5, %r6, %r7, %r8}|%p2, [%rd1, {%r10, %r11}];\n\
                \x20   selp.u32 %r3, 7, 9, %p2;\n    mov.b32 %r4, %r8;";
    let m = load(&mem, &kernel(HEAD, "", N, body));
    let got = launch_rows(&m, &mem, (h.base, 0), &input).unwrap();
    for (t, w) in input.iter().enumerate() {
        let v = reference(&c, w);
        let hb = |x: f64| f16_bits(x as f32 as f64) as u32;
        let want = [
            hb(v[0]) | hb(v[1]) << 16,
            hb(v[2]) | hb(v[3]) << 16,
            7,
            (v[3] as f32).to_bits(),
        ];
        assert_eq!(&got[4 * t..4 * t + 4], &want, "thread {t}: {w:x?}");
    }
}

/// Declarations the validator rejects as ptxas does: a `.samplerref` in unified mode, unknown
/// initialiser fields or values. (ptxas takes any known enumerator or integer for any field,
/// `addr_mode_0 = linear`; the validator warns about those and the emulator refuses them.)
#[test]
fn validator_rejects_bad_ref_declarations() {
    let bad = [
        (
            HEAD,
            ".global .samplerref s = { filter_mode = linear };",
            "texmode_independent",
        ),
        (
            HEAD_INDEP,
            ".global .samplerref s = { normalized_coords = 1 };",
            "unknown field",
        ),
        (
            HEAD_INDEP,
            ".global .samplerref s = { addr_mode_0 = foo };",
            "unknown value",
        ),
        (
            HEAD,
            ".global .texref t = { force_unnormalized_coords = 1 };",
            "unknown field",
        ),
    ];
    for (head, decl, msg) in bad {
        let text = format!("{head}{decl}\n.visible .entry k()\n{{\n    ret;\n}}\n");
        assert_rejected(&text, decl, msg, "isa_tex_geom test PTX");
    }
}

/// An initialiser value of another field's kind is a warning (ptxas accepts it) and a load
/// error naming the variable (the emulator cannot give it a meaning).
#[test]
fn wrong_kind_initialiser_values_warn_and_refuse() {
    let text = format!(
        "{HEAD_INDEP}.global .samplerref s = {{ addr_mode_0 = linear }};\n.visible .entry k()\n{{\n    ret;\n}}\n"
    );
    let m = ptx::parse(&text).unwrap();
    let d = ptx::validate(&m);
    assert!(d.iter().all(|d| !d.is_error()), "{d:?}");
    assert!(
        d.iter().any(|d| d.message.contains("another kind")),
        "{d:?}"
    );
    let mem = GlobalMemory::new();
    let e = LoadedModule::load(&mem, m, 0).err().expect("load refuses");
    assert!(e.to_string().contains("`s`"), "{e}");
}

/// A kernel's `.param .texref` parameter holds a texture handle (unified mode).
#[test]
fn texref_kernel_parameter() {
    use AddrMode::*;
    const N: usize = 64;
    let mut rng = StdRng::seed_from_u64(0x9a7);
    let mem = GlobalMemory::new();
    let mut o = obj(
        TexFormat::F32,
        2,
        &[5, 3],
        smp([Wrap, Clamp, Clamp], Filter::Linear, true),
    );
    o.data = texel_data(&mut rng, TexFormat::F32, 5 * 3 * 2);
    let back = buffer(&mem, &o.data);
    let h = desc_of(&o, back.base).upload(&mem, 0).unwrap();
    let c = case("2d", Form::Plain, o.clone());
    let input: Vec<[u32; WORDS_IN]> = (0..N).map(|_| inputs(&mut rng, &c)).collect();
    let body = "    tex.2d.v4.f32.f32 {%r1, %r2, %r3, %r4}, [ph, {%r10, %r11}];";
    let text = kernel(HEAD, "", N, body)
        .replace(".param .u64 ph", ".param .texref ph")
        .replace("    ld.param.u64 %rd1, [ph];\n", "");
    let m = load(&mem, &text);
    let got = launch_rows(&m, &mem, (h.base, 0), &input).unwrap();
    for (t, w) in input.iter().enumerate() {
        let want = reference(&c, w).map(|x| (x as f32).to_bits());
        assert_eq!(&got[4 * t..4 * t + 4], &want, "thread {t}: {w:x?}");
    }
}

/// `istypep` tells samplers, textures and surfaces apart (and rejects a non-descriptor).
#[test]
fn istypep_knows_samplers() {
    let mem = GlobalMemory::new();
    let back = buffer(&mem, &[0u8; 16]);
    let s = smp([AddrMode::Clamp; 3], Filter::Point, true);
    let tex = TexDesc::texture(back.base, TexFormat::F32, 1, &[4], s).unwrap();
    let surf = TexDesc::surface(back.base, TexFormat::F32, 1, &[4]).unwrap();
    let body = "    istypep.samplerref %p1, %rd1;\n    selp.u32 %r1, 1, 0, %p1;\n\
                \x20   istypep.texref %p1, %rd1;\n    selp.u32 %r2, 1, 0, %p1;\n\
                \x20   istypep.surfref %p1, %rd1;\n    selp.u32 %r3, 1, 0, %p1;";
    let m = load(&mem, &kernel(HEAD, "", 1, body));
    let inb = buffer(&mem, &[0u8; 64]);
    for (d, want) in [
        (Some(TexDesc::sampler(s).unwrap()), [1, 0, 0, 0]),
        (Some(tex), [0, 1, 0, 0]),
        (Some(surf), [0, 0, 1, 0]),
        (None, [0, 0, 0, 0]),
    ] {
        let h = d.map(|d| d.upload(&mem, 0).unwrap());
        let hb = h.as_ref().map_or(back.base, |a| a.base);
        let out = poisoned(&mem, 16);
        run(&m, &mem, 1, &[hb, inb.base, out.base, 0]).unwrap();
        assert_eq!(words(&out, 4), want);
    }
}
