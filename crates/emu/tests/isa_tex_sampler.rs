//! Sampler state on the emulator (issue 16 item 3), against a host reference written here from
//! the specifications (f64, rounded once to f32), on random texels with poisoned outputs:
//! - depth compare (`tex`/`tld4` with the operand `f`) with every compare function, on every
//!   geometry ptxas 13.5 takes it on (`.1d`, `.2d`, `.a1d`, `.a2d`, `.cube`, `.acube`; `tld4`
//!   on `.2d`, `.a2d`, `.cube`, `.acube`), point and linear (percentage-closer) filtering,
//!   `.level` and `.grad`, f32 and u16 texels (reference clamped to [0, 1]), integer fetches;
//!   `.s32`-coordinate fetches ignore `f` (ptxas compiles them to TLD), `.2dms`/`.a2dms` (which
//!   take `f` only with `.s32` coordinates) included; a sampler without a compare function
//!   faults;
//! - depth compare with a texel offset `e` (`tex` on `.1d`, `.2d`, `.a1d`, `.a2d`; `tld4` on
//!   `.2d`, `.a2d`: where ptxas takes both), and through `tex.base`/`.level`/`.grad` on
//!   mipmapped `.a2d` and `.cube` textures with a LOD bias and clamps;
//! - independent-mode sampler handles (`[tex, sampler, {c}]`) carrying compare, bias, clamps,
//!   seamless cube filtering and anisotropy to the fetch instead of the texture's own state;
//! - level-of-detail bias and min/max clamps (`.level`, `.grad`, implicit), including a bias
//!   past the last level and clamps that pin one level;
//! - seamless cube-map filtering across edges and corners, the reference finding each texel
//!   across an edge by a brute-force search for the nearest texel centre on the cube;
//! - anisotropic `tex.grad` (EXT_texture_filter_anisotropic's reference footprint).

use emu::texture::{AddrMode, CompareFunc, Filter, Sampler, TexDesc, TexFormat};
use emu::GlobalMemory;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "common/tex.rs"]
mod common;
#[path = "common/tex_desc.rs"]
mod tex_desc;
use common::{buffer, poisoned, read, run};
use tex_desc::{shaped_desc, Shape};

const HEAD: &str = ".version 8.7\n.target sm_90a\n.address_size 64\n";
const HEAD_INDEP: &str = ".version 8.7\n.target sm_90a, texmode_independent\n.address_size 64\n";
const FUNCS: [CompareFunc; 8] = [
    CompareFunc::Never,
    CompareFunc::Less,
    CompareFunc::Equal,
    CompareFunc::LessEqual,
    CompareFunc::Greater,
    CompareFunc::NotEqual,
    CompareFunc::GreaterEqual,
    CompareFunc::Always,
];

/// Point sampling with an implicit level, linear filtering with `.level` and with `.grad`.
const FILTER_MIPS: [(Filter, Mip); 3] = [
    (Filter::Point, Mip::Implicit),
    (Filter::Linear, Mip::Level),
    (Filter::Linear, Mip::Grad),
];

/// A texture and what the reference needs of it.
#[derive(Clone)]
struct Obj {
    format: TexFormat,
    ch: usize,
    dims: usize,
    /// Level-0 width and height (height 1 in 1D).
    n: [usize; 2],
    layers: usize,
    cube: bool,
    levels: usize,
    /// Samples per texel of a multisample texture (0: not multisample).
    samples: usize,
    mip_linear: bool,
    s: Sampler,
    /// Per level: values of `[plane][row][texel][channel]` as a fetch reads them.
    vals: Vec<Vec<f64>>,
    raw: Vec<u8>,
}

/// One fetch: the instruction's geometry and options, and each thread's record.
#[derive(Clone, Copy, PartialEq)]
enum Mip {
    Implicit,
    /// `tex.base`: level 0 before bias and clamps, as an implicit fetch.
    Base,
    Level,
    Grad,
}

#[derive(Clone, Copy)]
struct Rec {
    layer: u32,
    c: [f32; 3],
    lod: f32,
    reference: f32,
    dx: [f32; 3],
    dy: [f32; 3],
    /// Texel offset `e` (loaded into `%r4`, `%r5`).
    off: [i32; 2],
}

impl Rec {
    fn bytes(&self) -> Vec<u8> {
        let mut w = [0u32; 16];
        w[0] = self.layer;
        for k in 0..3 {
            w[1 + k] = self.c[k].to_bits();
            w[6 + k] = self.dx[k].to_bits();
            w[9 + k] = self.dy[k].to_bits();
        }
        w[4] = self.lod.to_bits();
        w[5] = self.reference.to_bits();
        (w[12], w[13]) = (self.off[0] as u32, self.off[1] as u32);
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
}

fn level_n(o: &Obj, level: usize) -> [usize; 2] {
    [
        (o.n[0] >> level).max(1),
        if o.dims == 1 {
            1
        } else {
            (o.n[1] >> level).max(1)
        },
    ]
}

fn planes(o: &Obj) -> usize {
    o.layers.max(1) * if o.cube { 6 } else { 1 }
}

fn value(format: TexFormat, raw: &[u8]) -> f64 {
    match format {
        TexFormat::U16 => u16::from_le_bytes([raw[0], raw[1]]) as f64 / 65535.0,
        TexFormat::F32 => f32::from_le_bytes(raw[..4].try_into().unwrap()) as f64,
        TexFormat::U32 => u32::from_le_bytes(raw[..4].try_into().unwrap()) as f64,
        f => panic!("no test reads {f:?}"),
    }
}

/// Random texels: f32 multiples of 1/8 in [0, 1] (so `Equal` can hold), u16 and u32 any.
fn make_obj(
    rng: &mut StdRng,
    shape: (usize, [usize; 2], usize, bool),
    levels: usize,
    s: Sampler,
    format: TexFormat,
) -> Obj {
    let (dims, n, layers, cube) = shape;
    let mut o = Obj {
        format,
        ch: if format == TexFormat::U32 {
            1
        } else {
            rng.gen_range(1..=2)
        },
        dims,
        n,
        layers,
        cube,
        levels,
        samples: 0,
        mip_linear: rng.gen_bool(0.5),
        s,
        vals: vec![],
        raw: vec![],
    };
    for level in 0..levels {
        let e = level_n(&o, level);
        let mut v = vec![];
        for _ in 0..planes(&o) * e[0] * e[1] * o.ch {
            let b = match format {
                TexFormat::F32 => (rng.gen_range(0..=8) as f32 / 8.0).to_le_bytes().to_vec(),
                TexFormat::U16 => rng.gen::<u16>().to_le_bytes().to_vec(),
                _ => (rng.gen::<u32>() >> rng.gen_range(0..32))
                    .to_le_bytes()
                    .to_vec(),
            };
            v.push(value(format, &b));
            o.raw.extend(b);
        }
        o.vals.push(v);
    }
    o
}

fn desc(o: &Obj, base: u64) -> TexDesc {
    let ext: Vec<u32> = o.n[..o.dims].iter().map(|&x| x as u32).collect();
    let d = TexDesc::texture(base, o.format, o.ch as u32, &ext, o.s).unwrap();
    let sh = Shape {
        layers: o.layers,
        cube: o.cube,
        samples: o.samples,
        levels: o.levels as u32,
        mip_linear: o.mip_linear,
    };
    shaped_desc(d, sh)
}

/// Cube face and face coordinates (CUDA Programming Guide, "Cubemap Textures" table).
fn face_of(p: [f64; 3]) -> (usize, [f64; 2]) {
    let a = p.map(f64::abs);
    let (face, m, s, t) = if a[0] >= a[1] && a[0] >= a[2] {
        if p[0] >= 0.0 {
            (0, a[0], -p[2], -p[1])
        } else {
            (1, a[0], p[2], -p[1])
        }
    } else if a[1] >= a[2] {
        if p[1] >= 0.0 {
            (2, a[1], p[0], p[2])
        } else {
            (3, a[1], p[0], -p[2])
        }
    } else if p[2] >= 0.0 {
        (4, a[2], p[0], -p[1])
    } else {
        (5, a[2], -p[0], -p[1])
    };
    (face, [(s / m + 1.0) / 2.0, (t / m + 1.0) / 2.0])
}

/// The 3D point of face `f` at face coordinates (sc, tc) in [-1, 1] units (the table inverted).
fn face_point(f: usize, sc: f64, tc: f64) -> [f64; 3] {
    match f {
        0 => [1.0, -tc, -sc],
        1 => [-1.0, -tc, sc],
        2 => [sc, 1.0, tc],
        3 => [sc, -1.0, -tc],
        4 => [sc, -tc, 1.0],
        _ => [-sc, -tc, -1.0],
    }
}

fn centre(f: usize, i: i64, j: i64, n: usize) -> [f64; 3] {
    let c = |x: i64| 2.0 * (x as f64 + 0.5) / n as f64 - 1.0;
    face_point(f, c(i), c(j))
}

/// The texel of another face whose centre is nearest texel (i, j) of face `f` extended past
/// its edge (one index outside).
fn nearest_across(f: usize, i: i64, j: i64, n: usize) -> (usize, i64, i64) {
    let p = centre(f, i, j, n);
    let mut best = (f64::MAX, (0, 0, 0));
    for g in (0..6).filter(|g| *g != f) {
        for jj in 0..n as i64 {
            for ii in 0..n as i64 {
                let q = centre(g, ii, jj, n);
                let d: f64 = (0..3).map(|k| (p[k] - q[k]).powi(2)).sum();
                if d < best.0 {
                    best = (d, (g, ii, jj));
                }
            }
        }
    }
    best.1
}

struct At {
    level: usize,
    /// Plane of layer 0's face 0 (cube) or the layer.
    plane: usize,
    depth: Option<(CompareFunc, f64)>,
    /// Texel offset added to the texel-space coordinates on every level (not on cubes).
    off: [f64; 2],
}

fn passes(f: CompareFunc, r: f64, d: f64) -> bool {
    match f {
        CompareFunc::Never => false,
        CompareFunc::Less => r < d,
        CompareFunc::Equal => r == d,
        CompareFunc::LessEqual => r <= d,
        CompareFunc::Greater => r > d,
        CompareFunc::NotEqual => r != d,
        CompareFunc::GreaterEqual => r >= d,
        CompareFunc::Always => true,
    }
}

fn address(mode: AddrMode, i: i64, n: i64) -> Option<i64> {
    match mode {
        AddrMode::Clamp => Some(i.clamp(0, n - 1)),
        AddrMode::Border => (0..n).contains(&i).then_some(i),
        AddrMode::Wrap => Some(i.rem_euclid(n)),
        AddrMode::Mirror => {
            let p = i.rem_euclid(2 * n);
            Some(if p < n { p } else { 2 * n - 1 - p })
        }
    }
}

/// Texel (i, j) of plane `plane` (a cube's: `at.plane + face`), compared when asked.
fn texel(o: &Obj, at: &At, plane: usize, i: i64, j: i64) -> [f64; 4] {
    let e = level_n(o, at.level);
    let (i, j) = if o.cube {
        (i.clamp(0, e[0] as i64 - 1), j.clamp(0, e[1] as i64 - 1))
    } else {
        let ai = address(o.s.addr_mode[0], i, e[0] as i64);
        let aj = if o.dims == 1 {
            Some(0)
        } else {
            address(o.s.addr_mode[1], j, e[1] as i64)
        };
        match (ai, aj) {
            (Some(a), Some(b)) => (a, b),
            _ => return compare([0.0; 4], at),
        }
    };
    let base = ((plane * e[1] + j as usize) * e[0] + i as usize) * o.ch;
    let mut v = [0.0, 0.0, 0.0, 1.0];
    v[..o.ch].copy_from_slice(&o.vals[at.level][base..base + o.ch]);
    compare(v, at)
}

fn compare(v: [f64; 4], at: &At) -> [f64; 4] {
    match at.depth {
        Some((f, r)) => [passes(f, r, v[0]) as u8 as f64, 0.0, 0.0, 1.0],
        None => v,
    }
}

/// A cube texel with seamless lookup across edges (corners: average of three).
fn cube_texel(o: &Obj, at: &At, face: usize, i: i64, j: i64) -> [f64; 4] {
    let n = level_n(o, at.level)[0];
    let inside = |x: i64| (0..n as i64).contains(&x);
    if !o.s.seamless_cube || (inside(i) && inside(j)) {
        return texel(o, at, at.plane + face, i, j);
    }
    let across = |i: i64, j: i64| {
        let (g, a, b) = nearest_across(face, i, j, n);
        texel(o, at, at.plane + g, a, b)
    };
    if inside(i) || inside(j) {
        return across(i, j);
    }
    let (ci, cj) = (i.clamp(0, n as i64 - 1), j.clamp(0, n as i64 - 1));
    let t = [
        texel(o, at, at.plane + face, ci, cj),
        across(i, cj),
        across(ci, j),
    ];
    let mut v = [0.0; 4];
    for x in t {
        for c in 0..4 {
            v[c] += x[c];
        }
    }
    v.map(|x| x / 3.0)
}

fn weight(u: f64) -> (i64, f64) {
    let ub = u - 0.5;
    let i = ub.floor();
    (i as i64, ((ub - i) * 256.0).round() / 256.0)
}

/// One level's point sample or bilinear filter at texel coordinates `u` (face `face` of a cube).
fn filter(o: &Obj, at: &At, u: [f64; 2], face: usize) -> [f64; 4] {
    let get = |i: i64, j: i64| {
        if o.cube {
            cube_texel(o, at, face, i, j)
        } else {
            texel(o, at, at.plane, i, j)
        }
    };
    if o.s.filter == Filter::Point {
        let e = level_n(o, at.level);
        let (mut i, mut j) = (u[0].floor() as i64, u[1].floor() as i64);
        if o.cube {
            (i, j) = (i.clamp(0, e[0] as i64 - 1), j.clamp(0, e[1] as i64 - 1));
        }
        return get(i, j);
    }
    let (i0, a) = weight(u[0]);
    let (j0, b) = weight(u[1]);
    let mut acc = [0.0; 4];
    let corners: &[(i64, i64, f64)] = if o.dims == 1 {
        &[(0, 0, 1.0 - a), (1, 0, a)]
    } else {
        &[
            (0, 0, (1.0 - a) * (1.0 - b)),
            (1, 0, a * (1.0 - b)),
            (0, 1, (1.0 - a) * b),
            (1, 1, a * b),
        ]
    };
    for &(di, dj, w) in corners {
        let v = get(i0 + di, j0 + dj);
        for c in 0..4 {
            acc[c] += w * v[c];
        }
    }
    acc
}

/// The sample at coordinates `c` (normalized, or a cube direction) on level `level`.
fn sample(o: &Obj, at: &At, c: [f64; 3]) -> [f64; 4] {
    let e = level_n(o, at.level);
    if o.cube {
        let (face, uv) = face_of(c);
        return filter(o, at, [uv[0] * e[0] as f64, uv[1] * e[0] as f64], face);
    }
    let u = [c[0] * e[0] as f64, c[1] * e[1] as f64];
    filter(o, at, [u[0] + at.off[0], u[1] + at.off[1]], 0)
}

/// Lengths of the derivatives in level-0 texels (cube: of the face coordinates).
fn grad_lengths(o: &Obj, c: [f64; 3], d: [[f64; 3]; 2]) -> [f64; 2] {
    if o.cube {
        // d/dx of (sign * p[k] / m) for the face's s and t components, halved
        let (face, _) = face_of(c);
        let ax = face / 2;
        let m = c[ax].abs();
        let sm = if c[ax] < 0.0 { -1.0 } else { 1.0 };
        return d.map(|g| {
            let ds = |k: usize, sg: f64| (sg * g[k] * m - sg * c[k] * sm * g[ax]) / (2.0 * m * m);
            let (s, t) = face_axes(face);
            let v = [ds(s.0, s.1), ds(t.0, t.1)];
            (v[0] * v[0] + v[1] * v[1]).sqrt() * o.n[0] as f64
        });
    }
    let n = o.dims;
    d.map(|g| {
        (0..n)
            .map(|k| (g[k] * o.n[k] as f64).powi(2))
            .sum::<f64>()
            .sqrt()
    })
}

fn face_axes(face: usize) -> ((usize, f64), (usize, f64)) {
    // from face_point: the component and sign carrying s and t
    let p = face_point(face, 1.0, 0.0);
    let q = face_point(face, 0.0, 1.0);
    let find = |v: [f64; 3]| {
        let k = (0..3).find(|&k| k != face / 2 && v[k] != 0.0).unwrap();
        (k, v[k])
    };
    (find(p), find(q))
}

/// `tex.grad`'s level of detail and samples: one at log2(Pmax), or EXT_texture_filter_anisotropic's
/// N samples along the longer derivative at log2(Pmax / N).
fn grad_footprint(o: &Obj, r: &Rec, c: [f64; 3]) -> (f64, Vec<[f64; 3]>) {
    let d = [r.dx.map(|x| x as f64), r.dy.map(|x| x as f64)];
    let p = grad_lengths(o, c, d);
    let (pmax, pmin) = (p[0].max(p[1]), p[0].min(p[1]));
    let nmax = o.s.max_anisotropy.max(1) as f64;
    let ratio = pmax / pmin;
    if nmax <= 1.0 || ratio.is_nan() || ratio <= 1.0 {
        (pmax.log2(), vec![c])
    } else {
        let n = ratio.ceil().min(nmax);
        let major = if p[0] > p[1] { d[0] } else { d[1] };
        let taps = (1..=n as usize)
            .map(|i| {
                let f = i as f64 / (n + 1.0) - 0.5;
                [0, 1, 2].map(|k| c[k] + f * major[k])
            })
            .collect();
        ((pmax / n).log2(), taps)
    }
}

/// The reference fetch of one record: footprint, LOD, mip levels, filtering.
fn fetch(o: &Obj, r: &Rec, mip: Mip, depth: bool) -> [f64; 4] {
    let c = r.c.map(|x| x as f64);
    let q = |x: f32| (x as f64 * 256.0).round() / 256.0;
    let (base, taps): (f64, Vec<[f64; 3]>) = match mip {
        Mip::Implicit | Mip::Base => (0.0, vec![c]),
        Mip::Level => (r.lod as f64, vec![c]),
        Mip::Grad => grad_footprint(o, r, c),
    };
    let lambda = (base + q(o.s.lod_bias))
        .max(q(o.s.min_lod_clamp))
        .min(q(o.s.max_lod_clamp));
    let top = (o.levels - 1) as f64;
    let l = lambda.clamp(0.0, top);
    let levels: Vec<(usize, f64)> = if !o.mip_linear {
        vec![((l - 0.5).ceil().max(0.0) as usize, 1.0)]
    } else {
        let lo = l.floor();
        let f = ((l - lo) * 256.0).round() / 256.0;
        if f == 0.0 {
            vec![(lo as usize, 1.0)]
        } else {
            vec![(lo as usize, 1.0 - f), ((lo + 1.0).min(top) as usize, f)]
        }
    };
    let layer = (r.layer as usize).min(o.layers.max(1) - 1);
    let mut reference = r.reference as f64;
    if o.format == TexFormat::U16 {
        reference = reference.clamp(0.0, 1.0);
    }
    let at = |level: usize| At {
        level,
        plane: layer * if o.cube { 6 } else { 1 },
        depth: depth.then(|| (o.s.compare.unwrap(), reference)),
        off: r.off.map(f64::from),
    };
    let one = |tap: [f64; 3]| -> [f64; 4] {
        if levels.len() == 1 {
            // one level: its value as sampled (a -0.0 texel stays -0.0)
            return sample(o, &at(levels[0].0), tap);
        }
        let mut acc = [0.0; 4];
        for &(level, w) in &levels {
            let v = sample(o, &at(level), tap);
            for k in 0..4 {
                acc[k] += w * v[k];
            }
        }
        acc
    };
    if taps.len() == 1 {
        return one(taps[0]);
    }
    let mut acc = [0.0; 4];
    for t in &taps {
        let v = one(*t);
        for k in 0..4 {
            acc[k] += v[k];
        }
    }
    acc.map(|x| x / taps.len() as f64)
}

/// `tld4.{comp}` of one record: channel `comp` of the four texels of the bilinear footprint on
/// level 0, in the order (i0, j1), (i1, j1), (i1, j0), (i0, j0).
fn gather(o: &Obj, r: &Rec, comp: usize, depth: bool) -> [f64; 4] {
    let layer = (r.layer as usize).min(o.layers.max(1) - 1);
    let reference = (r.reference as f64).clamp(
        if o.format == TexFormat::U16 {
            0.0
        } else {
            f64::MIN
        },
        if o.format == TexFormat::U16 {
            1.0
        } else {
            f64::MAX
        },
    );
    let at = At {
        level: 0,
        plane: layer * if o.cube { 6 } else { 1 },
        depth: depth.then(|| (o.s.compare.unwrap(), reference)),
        off: [0.0; 2],
    };
    let c = r.c.map(|x| x as f64);
    let (face, u) = if o.cube {
        let (f, uv) = face_of(c);
        (f, uv.map(|x| x * o.n[0] as f64))
    } else {
        let off = r.off.map(f64::from);
        (
            0,
            [c[0] * o.n[0] as f64 + off[0], c[1] * o.n[1] as f64 + off[1]],
        )
    };
    let (i0, _) = weight(u[0]);
    let (j0, _) = weight(u[1]);
    let get = |i: i64, j: i64| {
        if o.cube {
            cube_texel(o, &at, face, i, j)[comp]
        } else {
            texel(o, &at, at.plane, i, j)[comp]
        }
    };
    [
        get(i0, j0 + 1),
        get(i0 + 1, j0 + 1),
        get(i0 + 1, j0),
        get(i0, j0),
    ]
}

/// The geometry's coordinate vector, with the layer in `%r10` and x, y, z in `%f11..%f13`.
fn coords(geom: &str) -> &'static str {
    match geom {
        "1d" => "{%f11}",
        "2d" => "{%f11, %f12}",
        "a1d" => "{%r10, %f11}",
        "a2d" => "{%r10, %f11, %f12, %f12}",
        "cube" => "{%f11, %f12, %f13, %f13}",
        _ => "{%r10, %f11, %f12, %f13}",
    }
}

/// The mip operands after the coordinates.
fn mip_ops(geom: &str, mip: Mip) -> &'static str {
    match (mip, geom) {
        (Mip::Implicit | Mip::Base, _) => "",
        (Mip::Level, _) => ", %f14",
        (Mip::Grad, "1d" | "a1d") => ", {%f16}, {%f19}",
        (Mip::Grad, "2d" | "a2d") => ", {%f16, %f17}, {%f19, %f20}",
        (Mip::Grad, _) => ", {%f16, %f17, %f18, %f18}, {%f19, %f20, %f21, %f21}",
    }
}

/// A kernel where thread `t` loads 64-byte record `t` (see [`Rec::bytes`]) into `%r10..%r13`
/// and `%f10..%f21` (the same words) and its offsets into `%r4`, `%r5`, runs `ins` into
/// `%f0..%f3` (or `%r0..%r3`) and stores them to 16-byte slot `t`. `%rd5` holds the sampler
/// handle (parameter `ps`) for independent-mode fetches.
fn kernel(ins: &str, n: usize, int: bool) -> String {
    kernel_in(HEAD, ins, n, int)
}

fn kernel_in(head: &str, ins: &str, n: usize, int: bool) -> String {
    let st = if int {
        "st.global.v4.u32 [%rd3], {%r0, %r1, %r2, %r3};"
    } else {
        "st.global.v4.f32 [%rd3], {%f0, %f1, %f2, %f3};"
    };
    format!(
        "{head}.visible .entry k(.param .u64 pt, .param .u64 pin, .param .u64 pout, .param .u64 ps)\n{{\n\
         \x20   .reg .pred %p<2>;\n    .reg .b32 %r<20>;\n    .reg .f32 %f<24>;\n    .reg .b64 %rd<8>;\n\
         \x20   ld.param.u64 %rd1, [pt];\n    ld.param.u64 %rd2, [pin];\n    ld.param.u64 %rd3, [pout];\n\
         \x20   ld.param.u64 %rd5, [ps];\n\
         \x20   mov.u32 %r19, %tid.x;\n    mov.u32 %r18, %ctaid.x;\n    mad.lo.u32 %r19, %r18, 128, %r19;\n\
         \x20   setp.ge.u32 %p1, %r19, {n};\n    @%p1 ret;\n\
         \x20   mul.wide.u32 %rd4, %r19, 64;\n    add.s64 %rd2, %rd2, %rd4;\n\
         \x20   mul.wide.u32 %rd4, %r19, 16;\n    add.s64 %rd3, %rd3, %rd4;\n\
         \x20   ld.global.v4.b32 {{%r10, %r11, %r12, %r13}}, [%rd2];\n\
         \x20   ld.global.v4.f32 {{%f10, %f11, %f12, %f13}}, [%rd2];\n\
         \x20   ld.global.v4.f32 {{%f14, %f15, %f16, %f17}}, [%rd2+16];\n\
         \x20   ld.global.v4.f32 {{%f18, %f19, %f20, %f21}}, [%rd2+32];\n\
         \x20   ld.global.v2.b32 {{%r4, %r5}}, [%rd2+48];\n\
         {ins}\n    {st}\n    ret;\n}}\n"
    )
}

/// Runs `ins` over `recs` on `o` and compares every thread's four results with `want` (f32
/// bits of the reference, or its integers).
fn check(o: &Obj, ins: &str, recs: &[Rec], int: bool, want: impl Fn(&Rec) -> [f64; 4]) {
    check_via(o, None, ins, recs, (int, want));
}

/// [`check`], or with `indep` an independent-mode kernel: the texture's descriptor carries
/// the sampler `indep` and the fetch goes through a sampler handle carrying `o.s` (the
/// reference's state).
fn check_via(
    o: &Obj,
    indep: Option<Sampler>,
    ins: &str,
    recs: &[Rec],
    (int, want): (bool, impl Fn(&Rec) -> [f64; 4]),
) {
    let got = launch(o, indep, ins, recs, int).unwrap_or_else(|e| panic!("{e}\n{ins}"));
    for (t, r) in recs.iter().enumerate() {
        let w = want(r);
        for k in 0..4 {
            let g = u32::from_le_bytes(got[16 * t + 4 * k..16 * t + 4 * k + 4].try_into().unwrap());
            let e = if int {
                w[k] as u32
            } else {
                (w[k] as f32).to_bits()
            };
            assert_eq!(
                g,
                e,
                "{ins}\nthread {t} channel {k}: got {} want {} (layer {} c {:?} lod {} ref {} dx {:?} dy {:?}; {:?} {}x{} cube {} levels {} mip linear {})",
                f32::from_bits(g),
                w[k],
                r.layer,
                r.c,
                r.lod,
                r.reference,
                r.dx,
                r.dy,
                o.format,
                o.n[0],
                o.n[1],
                o.cube,
                o.levels,
                o.mip_linear
            );
        }
    }
}

/// Loads `ins`'s kernel (independent mode with `indep`, see [`check_via`]), runs it over `recs`
/// into a poisoned output and returns the output's bytes (16 per record).
fn launch(
    o: &Obj,
    indep: Option<Sampler>,
    ins: &str,
    recs: &[Rec],
    int: bool,
) -> Result<Vec<u8>, String> {
    let mem = GlobalMemory::new();
    let data = buffer(&mem, &o.raw);
    let (head, tex) = match indep {
        Some(s) => (HEAD_INDEP, desc(&Obj { s, ..o.clone() }, data.base)),
        None => (HEAD, desc(o, data.base)),
    };
    let h = tex.upload(&mem, 0).unwrap();
    let sh = TexDesc::sampler(o.s).unwrap().upload(&mem, 0).unwrap();
    let m = common::load_checked(
        &mem,
        &kernel_in(head, ins, recs.len(), int),
        &["sm_90a"],
        "isa_tex_sampler PTX",
    );
    let input = buffer(
        &mem,
        &recs.iter().flat_map(|r| r.bytes()).collect::<Vec<u8>>(),
    );
    let out = poisoned(&mem, recs.len() * 16);
    run(
        &m,
        &mem,
        recs.len(),
        &[h.base, input.base, out.base, sh.base],
    )?;
    Ok(read(&out, recs.len() * 16))
}

/// Random records for `geom`: coordinates over and a little beyond the texture (directions
/// anywhere for cubes), layers including one past the last, the other fields random.
fn records(rng: &mut StdRng, o: &Obj, n: usize, refs: &[f64]) -> Vec<Rec> {
    (0..n)
        .map(|_| {
            let c = if o.cube {
                [0; 3].map(|_| rng.gen_range(-1.0f32..1.0))
            } else {
                [0; 3].map(|_| rng.gen_range(-0.1f32..1.1))
            };
            let g = |rng: &mut StdRng| {
                [0; 3].map(|_| rng.gen_range(-0.3f32..0.3) * rng.gen_range(0.0f32..1.0).powi(3))
            };
            Rec {
                layer: rng.gen_range(0..=o.layers as u32),
                c,
                lod: rng.gen_range(-1.0f32..o.levels as f32 + 1.0),
                reference: if rng.gen_bool(0.5) {
                    refs[rng.gen_range(0..refs.len())] as f32
                } else {
                    rng.gen_range(-0.2f32..1.2)
                },
                dx: g(rng),
                dy: g(rng),
                off: [0; 2],
            }
        })
        .collect()
}

fn sampler(rng: &mut StdRng, filter: Filter) -> Sampler {
    let modes = [
        AddrMode::Wrap,
        AddrMode::Clamp,
        AddrMode::Mirror,
        AddrMode::Border,
    ];
    let m = [0; 3].map(|_| modes[rng.gen_range(0..4)]);
    Sampler::new(m, filter, true)
}

/// (dims, level-0 extent, layers, cube) of a geometry.
fn shape(rng: &mut StdRng, geom: &str) -> (usize, [usize; 2], usize, bool) {
    let w = rng.gen_range(3..7);
    match geom {
        "1d" => (1, [w, 1], 0, false),
        "a1d" => (1, [w, 1], rng.gen_range(1..4), false),
        "2d" => (2, [w, rng.gen_range(3..7)], 0, false),
        "a2d" => (2, [w, rng.gen_range(3..7)], rng.gen_range(1..4), false),
        "cube" => (2, [w, w], 0, true),
        _ => (2, [w, w], rng.gen_range(1..3), true),
    }
}

#[test]
fn depth_compare_every_geometry() {
    let mut rng = StdRng::seed_from_u64(0x00dc_0001);
    let mut k = 0;
    for geom in ["1d", "2d", "a1d", "a2d", "cube", "acube"] {
        for (filter, mip) in FILTER_MIPS {
            let mut s = sampler(&mut rng, filter);
            s.compare = Some(FUNCS[k % 8]);
            s.seamless_cube = rng.gen_bool(0.5);
            k += 1;
            let format = if rng.gen_bool(0.5) {
                TexFormat::F32
            } else {
                TexFormat::U16
            };
            let sh = shape(&mut rng, geom);
            let o = make_obj(&mut rng, sh, 2, s, format);
            let refs: Vec<f64> = o.vals[0].clone();
            let recs = records(&mut rng, &o, 48, &refs);
            let ins = format!("{}, %f15;", fetch_ins(geom, mip).trim_end_matches(';'));
            check(&o, &ins, &recs, false, |r| fetch(&o, r, mip, true));
        }
    }
}

#[test]
fn depth_compare_tld4_and_integer_fetches() {
    let mut rng = StdRng::seed_from_u64(0xdc_02);
    for (k, geom) in ["2d", "a2d", "cube", "acube"].into_iter().enumerate() {
        for comp in [0usize, 3] {
            let mut s = sampler(&mut rng, Filter::Linear);
            s.compare = Some(FUNCS[(2 * k + comp) % 8]);
            s.seamless_cube = comp == 0;
            let sh = shape(&mut rng, geom);
            let o = make_obj(&mut rng, sh, 1, s, TexFormat::F32);
            let recs = records(&mut rng, &o, 48, &o.vals[0].clone());
            let ins = format!(
                "    tld4.{}.{geom}.v4.f32.f32 {{%f0, %f1, %f2, %f3}}, [%rd1, {}], %f15;",
                ["r", "g", "b", "a"][comp],
                coords(geom)
            );
            check(&o, &ins, &recs, false, |r| gather(&o, r, comp, true));
        }
    }
    // integer fetch: raw integers compared with the reference, results 1 or 0
    for f in FUNCS {
        let mut s = sampler(&mut rng, Filter::Point);
        s.compare = Some(f);
        let sh = shape(&mut rng, "2d");
        let o = make_obj(&mut rng, sh, 1, s, TexFormat::U32);
        let refs: Vec<f64> = o.vals[0].iter().map(|x| *x as f32 as f64).collect();
        let mut recs = records(&mut rng, &o, 32, &refs);
        for r in recs.iter_mut().step_by(2) {
            r.reference *= 4e9;
        }
        let ins = "    tex.2d.v4.u32.f32 {%r0, %r1, %r2, %r3}, [%rd1, {%f11, %f12}], %f15;";
        check(&o, ins, &recs, true, |r| fetch(&o, r, Mip::Implicit, true));
    }
}

#[test]
fn depth_compare_ignored_on_s32_coordinates_and_faults_without_a_function() {
    let mut rng = StdRng::seed_from_u64(0xdc_03);
    let mut s = Sampler::new([AddrMode::Clamp; 3], Filter::Point, false);
    s.compare = Some(CompareFunc::Never);
    let o = make_obj(&mut rng, (2, [5, 4], 0, false), 1, s, TexFormat::F32);
    let recs: Vec<Rec> = (0..20)
        .map(|_| Rec {
            layer: 0,
            c: [
                f32::from_bits(rng.gen_range(0..5)),
                f32::from_bits(rng.gen_range(0..4)),
                0.0,
            ],
            lod: 0.0,
            reference: 0.5,
            dx: [0.0; 3],
            dy: [0.0; 3],
            off: [0; 2],
        })
        .collect();
    let ins = "    tex.2d.v4.f32.s32 {%f0, %f1, %f2, %f3}, [%rd1, {%r11, %r12}], %r15;";
    check(&o, ins, &recs, false, |r| {
        let (i, j) = (r.c[0].to_bits() as usize, r.c[1].to_bits() as usize);
        let mut v = [0.0, 0.0, 0.0, 1.0];
        let at = (j * 5 + i) * o.ch;
        v[..o.ch].copy_from_slice(&o.vals[0][at..at + o.ch]);
        v
    });
    // a depth-compare fetch through a sampler without a compare function faults
    let s = sampler(&mut rng, Filter::Linear);
    let o = make_obj(&mut rng, (2, [4, 4], 0, false), 1, s, TexFormat::F32);
    let ins = "    tex.2d.v4.f32.f32 {%f0, %f1, %f2, %f3}, [%rd1, {%f11, %f12}], %f15;";
    let mut rec = records(&mut rng, &o, 1, &[0.5])[0];
    rec.reference = 0.5;
    let err = launch(&o, None, ins, &[rec], false).unwrap_err();
    assert!(err.contains("without a compare function"), "{err}");
}

/// A mipmapped 2D (8 x 4..8, 4 levels) or cube (8 x 8, 4 levels) texture.
fn mip_obj(rng: &mut StdRng, geom: &str, s: Sampler) -> Obj {
    let sh = match geom {
        "2d" => (2, [8, rng.gen_range(4..9)], 0, false),
        "a2d" => (2, [8, rng.gen_range(4..9)], 2, false),
        "cube" => (2, [8, 8], 0, true),
        _ => (2, [8, 8], 2, true),
    };
    make_obj(rng, sh, 4, s, TexFormat::F32)
}

/// `tex` on `geom` with the mip operands of `mip`, into `%f0..%f3`.
fn fetch_ins(geom: &str, mip: Mip) -> String {
    let m = match mip {
        Mip::Implicit => "",
        Mip::Base => ".base",
        Mip::Level => ".level",
        Mip::Grad => ".grad",
    };
    format!(
        "    tex{m}.{geom}.v4.f32.f32 {{%f0, %f1, %f2, %f3}}, [%rd1, {}]{};",
        coords(geom),
        mip_ops(geom, mip)
    )
}

/// `mipmapLevelBias`, `minMipmapLevelClamp`, `maxMipmapLevelClamp` on `.level`, `.grad` and
/// implicit fetches, with edge cases: a bias past the last level (and below level 0), clamps
/// that pin one level or a blend between two, a fractional bias quantized to 1/256.
#[test]
fn lod_bias_and_clamps() {
    let mut rng = StdRng::seed_from_u64(0x10d0_0001);
    let edges: [(f32, f32, f32); 7] = [
        (16.0, 0.0, 16.0),
        (-16.0, 0.0, 16.0),
        (0.0, 1.5, 1.5),
        (0.3, 0.0, 0.25),
        (1.1, 2.7, 16.0),
        (-0.7, 0.5, 2.2),
        (3.0, 0.0, 2.0),
    ];
    for (k, (bias, lo, hi)) in edges.into_iter().enumerate() {
        let geom = ["2d", "cube", "a2d", "acube"][k % 4];
        let filter = if k % 3 == 0 {
            Filter::Point
        } else {
            Filter::Linear
        };
        let mut s = sampler(&mut rng, filter);
        (s.lod_bias, s.min_lod_clamp, s.max_lod_clamp) = (bias, lo, hi);
        let o = mip_obj(&mut rng, geom, s);
        for mip in [Mip::Implicit, Mip::Level, Mip::Grad] {
            let recs = records(&mut rng, &o, 32, &[0.5]);
            check(&o, &fetch_ins(geom, mip), &recs, false, |r| {
                fetch(&o, r, mip, false)
            });
        }
    }
    // random state
    for k in 0..6 {
        let geom = ["2d", "cube"][k % 2];
        let mut s = sampler(&mut rng, Filter::Linear);
        s.lod_bias = rng.gen_range(-4.0..4.0);
        s.min_lod_clamp = rng.gen_range(0.0..2.0);
        s.max_lod_clamp = rng.gen_range(s.min_lod_clamp..4.0);
        let o = mip_obj(&mut rng, geom, s);
        let mip = [Mip::Level, Mip::Grad][k / 2 % 2];
        let recs = records(&mut rng, &o, 32, &[0.5]);
        check(&o, &fetch_ins(geom, mip), &recs, false, |r| {
            fetch(&o, r, mip, false)
        });
    }
}

/// Directions near a cube's edges and corners: two or three components of nearly the same
/// magnitude.
fn edge_dirs(rng: &mut StdRng, n: usize) -> Vec<[f32; 3]> {
    (0..n)
        .map(|k| {
            let sign = |rng: &mut StdRng| if rng.gen_bool(0.5) { 1.0f32 } else { -1.0 };
            let near = |rng: &mut StdRng| sign(rng) * (1.0 - rng.gen_range(0.0f32..0.15));
            let mut c = [near(rng), near(rng), near(rng)];
            if k % 3 != 0 {
                c[rng.gen_range(0..3)] = rng.gen_range(-1.0..1.0);
            }
            c
        })
        .collect()
}

/// `CU_TRSF_SEAMLESS_CUBEMAP`: linear filtering (and `tld4` gathers) near cube edges and
/// corners read the adjacent faces; point sampling stays on its face.
#[test]
fn seamless_cube_edges_and_corners() {
    let mut rng = StdRng::seed_from_u64(0x5ea0_0001);
    for geom in ["cube", "acube"] {
        for (filter, mip) in [
            (Filter::Linear, Mip::Implicit),
            (Filter::Linear, Mip::Level),
            (Filter::Point, Mip::Implicit),
        ] {
            let mut s = sampler(&mut rng, filter);
            s.seamless_cube = true;
            let w = rng.gen_range(2..6);
            let layers = if geom == "acube" { 2 } else { 0 };
            let o = make_obj(&mut rng, (2, [w, w], layers, true), 2, s, TexFormat::F32);
            let mut recs = records(&mut rng, &o, 60, &[0.5]);
            for (r, c) in recs.iter_mut().zip(edge_dirs(&mut rng, 60)) {
                r.c = c;
            }
            check(&o, &fetch_ins(geom, mip), &recs, false, |r| {
                fetch(&o, r, mip, false)
            });
        }
        let mut s = sampler(&mut rng, Filter::Linear);
        s.seamless_cube = true;
        let layers = if geom == "acube" { 2 } else { 0 };
        let o = make_obj(&mut rng, (2, [4, 4], layers, true), 1, s, TexFormat::F32);
        let mut recs = records(&mut rng, &o, 60, &[0.5]);
        for (r, c) in recs.iter_mut().zip(edge_dirs(&mut rng, 60)) {
            r.c = c;
        }
        let ins = format!(
            "    tld4.g.{geom}.v4.f32.f32 {{%f0, %f1, %f2, %f3}}, [%rd1, {}];",
            coords(geom)
        );
        check(&o, &ins, &recs, false, |r| gather(&o, r, 1, false));
    }
}

/// `maxAnisotropy`: `tex.grad` through an anisotropic sampler averages the samples of the
/// EXT_texture_filter_anisotropic footprint (including a zero minor derivative: N = max).
#[test]
fn anisotropic_grad() {
    let mut rng = StdRng::seed_from_u64(0xa1_50);
    for (k, aniso) in [2u32, 4, 16, 3, 8, 16].into_iter().enumerate() {
        let geom = ["2d", "a2d", "cube", "2d", "acube", "cube"][k];
        let mut s = sampler(&mut rng, Filter::Linear);
        s.max_anisotropy = aniso;
        s.seamless_cube = k % 2 == 0;
        let o = mip_obj(&mut rng, geom, s);
        let mut recs = records(&mut rng, &o, 40, &[0.5]);
        for (t, r) in recs.iter_mut().enumerate() {
            let major = rng.gen_range(0.05f32..1.0);
            let ratio = rng.gen_range(1.0f32..24.0);
            let a = rng.gen_range(0.0f32..std::f32::consts::TAU);
            let (x, y) = (a.cos(), a.sin());
            r.dx = [x * major, y * major, rng.gen_range(-0.1..0.1)];
            r.dy = [
                -y * major / ratio,
                x * major / ratio,
                rng.gen_range(-0.01..0.01),
            ];
            if t % 5 == 0 {
                r.dy = [0.0; 3];
            }
            if t % 2 == 1 {
                std::mem::swap(&mut r.dx, &mut r.dy);
            }
        }
        check(&o, &fetch_ins(geom, Mip::Grad), &recs, false, |r| {
            fetch(&o, r, Mip::Grad, false)
        });
    }
}

/// The descriptor builder checks the sampler state, naming the field, and round-trips it.
#[test]
fn sampler_state_is_checked_and_round_trips() {
    let base = Sampler::new([AddrMode::Clamp; 3], Filter::Linear, true);
    type Edit = fn(&mut Sampler);
    let bad: [(&str, Edit); 6] = [
        ("lod_bias", |s| s.lod_bias = f32::NAN),
        ("lod_bias", |s| s.lod_bias = 16.5),
        ("min_lod_clamp", |s| s.min_lod_clamp = -1.0),
        ("max_lod_clamp", |s| s.max_lod_clamp = 17.0),
        ("min_lod_clamp", |s| {
            (s.min_lod_clamp, s.max_lod_clamp) = (3.0, 2.0)
        }),
        ("max_anisotropy", |s| s.max_anisotropy = 17),
    ];
    for (field, f) in bad {
        let mut s = base;
        f(&mut s);
        let e = TexDesc::texture(0x1000, TexFormat::F32, 1, &[8, 8], s).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        let e = TexDesc::sampler(s).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    }
    let mut s = base;
    s.compare = Some(CompareFunc::GreaterEqual);
    s.lod_bias = -2.3;
    (s.min_lod_clamp, s.max_lod_clamp) = (0.5, 2.75);
    s.seamless_cube = true;
    s.max_anisotropy = 8;
    let d = TexDesc::texture(0x1000, TexFormat::F32, 1, &[8, 8], s)
        .unwrap()
        .cubemap()
        .unwrap()
        .mipmapped(4, Filter::Linear)
        .unwrap();
    let back = TexDesc::decode(&d.encode().unwrap()).unwrap();
    assert_eq!(back, d);
    assert_eq!(back.state, s.state().unwrap());
    assert_eq!(back.state.lod.bias, (-2.3f64 * 256.0).round() as i16);
    // a sampler object carries the state to the texture it samples
    let plain = TexDesc::texture(0x1000, TexFormat::F32, 1, &[8, 8], base).unwrap();
    assert_eq!(
        plain.with_sampler(&TexDesc::sampler(s).unwrap()).state,
        d.state
    );
}

/// The validator: no depth compare on `.3d`; with `.s32` coordinates (`.2dms` included) `f`
/// is an integer register (ptxas 13.5 types it by the coordinates); an offset vector `e` followed by `f`
/// gives each its role.
#[test]
fn validator_rules_for_depth_compare() {
    let errors = |ins: &str| common::validator_errors(&kernel(ins, 1, false));
    let d = "{%f0, %f1, %f2, %f3}";
    let e = errors(&format!(
        "    tex.3d.v4.f32.f32 {d}, [%rd1, {{%f11, %f12, %f13, %f13}}], %f15;"
    ));
    assert!(
        e.iter().any(|x| x.contains("takes no depth-compare")),
        "{e:?}"
    );
    for (geom, co) in [("2d", "{%r11, %r12}"), ("2dms", "{%r11, %r12, %r13, %r13}")] {
        let e = errors(&format!(
            "    tex.{geom}.v4.f32.s32 {d}, [%rd1, {co}], %f15;"
        ));
        assert!(
            e.iter().any(|x| x.contains("depth-compare operand `f`")),
            "{geom}: {e:?}"
        );
    }
    let ok = format!("    tex.2d.v4.f32.f32 {d}, [%rd1, {{%f11, %f12}}], {{%r12, %r13}}, %f15;");
    assert!(errors(&ok).is_empty(), "{:?}", errors(&ok));
    let tex = match ptx::parse_statements(&ok).unwrap().remove(0) {
        ptx::Statement::Instr(i) => i,
        s => panic!("{s:?}"),
    };
    assert!(matches!(
        tex.operand(ptx::Role::TexOffset),
        Some(ptx::Operand::Vec(_))
    ));
    assert!(
        matches!(tex.operand(ptx::Role::DepthCompare), Some(ptx::Operand::Reg(r)) if r == "%f15")
    );
}

/// `.v2.f16x2` fetches with depth compare: the point-sampled comparison results (1.0 or 0.0,
/// then 0, 0, 1) packed as f16 pairs.
#[test]
fn depth_compare_f16x2() {
    let mut rng = StdRng::seed_from_u64(0x00dc_0004);
    for f in [
        CompareFunc::LessEqual,
        CompareFunc::Greater,
        CompareFunc::Equal,
    ] {
        let mut s = sampler(&mut rng, Filter::Point);
        s.compare = Some(f);
        let o = make_obj(&mut rng, (2, [5, 4], 0, false), 1, s, TexFormat::F32);
        let recs = records(&mut rng, &o, 40, &o.vals[0].clone());
        let ins = "    mov.b32 %r2, 0;\n    mov.b32 %r3, 0;\n\
                   \x20   tex.2d.v2.f16x2.f32 {%r0, %r1}, [%rd1, {%f11, %f12}], %f15;";
        let h = |x: f64| match x {
            0.0 => 0u32,
            1.0 => 0x3c00,
            _ => panic!("{x} is not a comparison result"),
        };
        check(&o, ins, &recs, true, |r| {
            let v = fetch(&o, r, Mip::Implicit, true);
            [
                (h(v[0]) | h(v[1]) << 16) as f64,
                (h(v[2]) | h(v[3]) << 16) as f64,
                0.0,
                0.0,
            ]
        });
    }
}

/// Random texel offsets in [-8, 7] (ptxas's range) on each record, the second 0 in 1D.
fn with_offsets(rng: &mut StdRng, recs: &mut [Rec], dims: usize) {
    for r in recs {
        r.off = [rng.gen_range(-8..8), rng.gen_range(-8..8)];
        if dims == 1 {
            r.off[1] = 0;
        }
    }
}

/// `ins` (ending in `;`) with the further operands `more` appended.
fn with_operands(ins: &str, more: &str) -> String {
    format!("{}, {more};", ins.trim_end_matches(';'))
}

/// Depth compare together with a texel offset `e` (`tex ..., e, f`): `tex` on every geometry
/// ptxas 13.5 takes both on (`.1d`, `.2d`, `.a1d`, `.a2d`; it takes no offsets on cubes),
/// implicit, `.level` and `.grad`, and `tld4` (`.2d`, `.a2d`) with each component; the
/// offset moves the footprint in texel space on every level before the comparison.
#[test]
fn depth_compare_with_texel_offsets() {
    let mut rng = StdRng::seed_from_u64(0x00dc_0005);
    let mut k = 0;
    for geom in ["1d", "2d", "a1d", "a2d"] {
        for (filter, mip) in FILTER_MIPS {
            let mut s = sampler(&mut rng, filter);
            s.compare = Some(FUNCS[(3 * k + 1) % 8]);
            k += 1;
            let format = [TexFormat::F32, TexFormat::U16][k % 2];
            let sh = shape(&mut rng, geom);
            let o = make_obj(&mut rng, sh, 2, s, format);
            let mut recs = records(&mut rng, &o, 48, &o.vals[0].clone());
            with_offsets(&mut rng, &mut recs, o.dims);
            let e = if o.dims == 1 { "{%r4}" } else { "{%r4, %r5}" };
            let ins = with_operands(&fetch_ins(geom, mip), &format!("{e}, %f15"));
            check(&o, &ins, &recs, false, |r| fetch(&o, r, mip, true));
        }
    }
    for geom in ["2d", "a2d"] {
        for comp in 0..4 {
            let mut s = sampler(&mut rng, Filter::Linear);
            s.compare = Some(FUNCS[(2 * comp + 3) % 8]);
            let sh = shape(&mut rng, geom);
            let o = make_obj(&mut rng, sh, 1, s, TexFormat::F32);
            let mut recs = records(&mut rng, &o, 48, &o.vals[0].clone());
            with_offsets(&mut rng, &mut recs, 2);
            let ins = format!(
                "    tld4.{}.{geom}.v4.f32.f32 {{%f0, %f1, %f2, %f3}}, [%rd1, {}], {{%r4, %r5}}, %f15;",
                ["r", "g", "b", "a"][comp],
                coords(geom)
            );
            check(&o, &ins, &recs, false, |r| gather(&o, r, comp, true));
        }
    }
}

/// `.2dms`/`.a2dms` take `f` only with `.s32` coordinates (ptxas 13.5 rejects `.f32` ones
/// there, and types `f` as an integer register): like every `.s32` fetch, it reads the stored
/// sample and ignores the sampler's compare function and the reference.
#[test]
fn depth_compare_on_multisample_reads_the_sample() {
    let mut rng = StdRng::seed_from_u64(0x00dc_0007);
    for (geom, layers, co) in [
        ("2dms", 0, "{%r11, %r12, %r13, %r13}"),
        ("a2dms", 3, "{%r10, %r11, %r12, %r13}"),
    ] {
        for (k, format) in [TexFormat::F32, TexFormat::U16].into_iter().enumerate() {
            let mut s = Sampler::new([AddrMode::Clamp; 3], Filter::Point, false);
            s.compare = Some(FUNCS[rng.gen_range(0..8)]);
            let (w, h, ns) = (rng.gen_range(3..7), rng.gen_range(3..7), 2 + 2 * k);
            // planes are (layer, sample) pairs, sample fastest, as the descriptor lays them out
            let sh = (2, [w, h], layers.max(1) * ns, false);
            let mut o = make_obj(&mut rng, sh, 1, s, format);
            (o.layers, o.samples) = (layers, ns);
            let recs: Vec<Rec> = (0..40)
                .map(|_| Rec {
                    layer: rng.gen_range(0..layers.max(1) as u32),
                    c: [ns, w, h].map(|n| f32::from_bits(rng.gen_range(0..n as u32))),
                    lod: 0.0,
                    reference: rng.gen_range(-0.2f32..1.2),
                    dx: [0.0; 3],
                    dy: [0.0; 3],
                    off: [0; 2],
                })
                .collect();
            let ins =
                format!("    tex.{geom}.v4.f32.s32 {{%f0, %f1, %f2, %f3}}, [%rd1, {co}], %r15;");
            check(&o, &ins, &recs, false, |r| {
                let [sample, i, j] = r.c.map(|x| x.to_bits() as usize);
                let plane = r.layer as usize * ns + sample;
                let at = ((plane * h + j) * w + i) * o.ch;
                let mut v = [0.0, 0.0, 0.0, 1.0];
                v[..o.ch].copy_from_slice(&o.vals[0][at..at + o.ch]);
                v
            });
        }
    }
}

/// Depth compare through `tex.base`, `tex.level` and `tex.grad` on mipmapped `.a2d` and
/// `.cube` textures (4 levels, point and linear filtering, point or linear mip filtering),
/// with a random LOD bias and clamps: each level's comparison results are filtered, then
/// the levels blended.
#[test]
fn depth_compare_mip_forms_on_layered_and_cube() {
    let mut rng = StdRng::seed_from_u64(0x00dc_0006);
    let mut k = 0;
    for geom in ["a2d", "cube"] {
        for mip in [Mip::Base, Mip::Level, Mip::Grad] {
            for filter in [Filter::Point, Filter::Linear] {
                let mut s = sampler(&mut rng, filter);
                s.compare = Some(FUNCS[(5 * k + 2) % 8]);
                k += 1;
                s.seamless_cube = rng.gen_bool(0.5);
                s.lod_bias = rng.gen_range(-1.5..1.5);
                s.min_lod_clamp = rng.gen_range(0.0..1.0);
                s.max_lod_clamp = rng.gen_range(s.min_lod_clamp..3.5);
                let o = mip_obj(&mut rng, geom, s);
                let recs = records(&mut rng, &o, 32, &o.vals[0].clone());
                let ins = with_operands(&fetch_ins(geom, mip), "%f15");
                check(&o, &ins, &recs, false, |r| fetch(&o, r, mip, true));
            }
        }
    }
}

/// Independent mode (`[tex, sampler, {c}]` with a sampler handle): the sampler's state (depth
/// compare, LOD bias and clamps, seamless cube filtering, anisotropy) decides the result, not
/// the state the texture was built with (point filtering, no compare function, no bias: a
/// depth fetch through it would fault).
#[test]
fn independent_sampler_carries_compare_bias_and_clamps() {
    let mut rng = StdRng::seed_from_u64(0x00dc_0008);
    let cases = [
        ("2d", Mip::Level, true, 0),
        ("a2d", Mip::Grad, true, 0),
        ("cube", Mip::Implicit, true, 0),
        ("acube", Mip::Level, false, 0),
        ("2d", Mip::Grad, false, 4),
        ("cube", Mip::Grad, true, 8),
    ];
    for (k, (geom, mip, depth, aniso)) in cases.into_iter().enumerate() {
        let mut s = sampler(&mut rng, Filter::Linear);
        s.compare = depth.then_some(FUNCS[(3 * k + 1) % 8]);
        s.seamless_cube = k % 2 == 0;
        s.max_anisotropy = aniso;
        s.lod_bias = rng.gen_range(-1.0..2.0);
        s.min_lod_clamp = rng.gen_range(0.0..1.0);
        s.max_lod_clamp = rng.gen_range(s.min_lod_clamp..3.5);
        let o = mip_obj(&mut rng, geom, s);
        let own = Sampler::new(s.addr_mode, Filter::Point, true);
        let recs = records(&mut rng, &o, 32, &o.vals[0].clone());
        let mut ins = fetch_ins(geom, mip).replace("[%rd1, ", "[%rd1, %rd5, ");
        if depth {
            ins = with_operands(&ins, "%f15");
        }
        check_via(
            &o,
            Some(own),
            &ins,
            &recs,
            (false, |r: &Rec| fetch(&o, r, mip, depth)),
        );
    }
    // tld4 with an offset and depth compare through the sampler
    for geom in ["2d", "a2d"] {
        let mut s = sampler(&mut rng, Filter::Linear);
        s.compare = Some(CompareFunc::LessEqual);
        let sh = shape(&mut rng, geom);
        let o = make_obj(&mut rng, sh, 1, s, TexFormat::F32);
        let own = Sampler::new(s.addr_mode, Filter::Point, true);
        let mut recs = records(&mut rng, &o, 40, &o.vals[0].clone());
        with_offsets(&mut rng, &mut recs, 2);
        let ins = format!(
            "    tld4.b.{geom}.v4.f32.f32 {{%f0, %f1, %f2, %f3}}, [%rd1, %rd5, {}], {{%r4, %r5}}, %f15;",
            coords(geom)
        );
        check_via(
            &o,
            Some(own),
            &ins,
            &recs,
            (false, |r: &Rec| gather(&o, r, 2, true)),
        );
    }
}
