//! Sampler state and the geometry of sampling: the [`Sampler`] a texture object is built with
//! (its descriptor-side [`SamplerState`]), depth comparison ([`CompareFunc`]), level-of-detail
//! bias and clamps ([`Lod`]), cube-map face selection ([`cube_face`]) and the seamless
//! cube-map texel lookup across edges and corners ([`cube_texel`]), and the fixed-point
//! linear-filter weights.

use super::{bad, AddrMode, DescError, Filter};

/// Cube-map face selection (CUDA Programming Guide, "Cubemap Textures"): the face is that of
/// the component of largest magnitude `m` (ties: x before y before z), and the face
/// coordinates are `(s / m + 1) / 2`, `(t / m + 1) / 2` with
/// +x: (s, t) = (-z, -y); -x: (z, -y); +y: (x, z); -y: (x, -z); +z: (x, -y); -z: (-x, -y).
/// Returns the face, the face coordinates and, for a derivative `d` of the direction, the
/// derivative of the face coordinates.
pub fn cube_face(p: [f64; 3], d: [[f64; 3]; 2]) -> (u32, [f64; 2], [[f64; 2]; 2]) {
    let a = p.map(f64::abs);
    let axis = if a[0] >= a[1] && a[0] >= a[2] {
        0
    } else if a[1] >= a[2] {
        1
    } else {
        2
    };
    let neg = p[axis] < 0.0;
    let face = 2 * axis as u32 + neg as u32;
    let (s, t) = face_axes(face);
    let m = a[axis];
    let sm = if neg { -1.0 } else { 1.0 };
    let uv = |(k, sg): (usize, f64)| (sg * p[k] / m + 1.0) / 2.0;
    // d/dx of (sg * p[k] / m): (sg * d[k] * m - sg * p[k] * sm * d[axis]) / m^2, halved
    let du = |g: &[f64; 3], (k, sg): (usize, f64)| {
        (sg * g[k] * m - sg * p[k] * sm * g[axis]) / (2.0 * m * m)
    };
    let dd = [[du(&d[0], s), du(&d[0], t)], [du(&d[1], s), du(&d[1], t)]];
    (face, [uv(s), uv(t)], dd)
}

/// The sampler state of a texture object: CUDA's `CUDA_TEXTURE_DESC` (address modes, filter,
/// normalized coordinates, `mipmapLevelBias`, `minMipmapLevelClamp`, `maxMipmapLevelClamp`,
/// `maxAnisotropy`, `CU_TRSF_SEAMLESS_CUBEMAP`) plus a depth-compare function, which CUDA does
/// not expose (the hardware takes it from its sampler state; OpenGL's `TEXTURE_COMPARE_FUNC`).
/// [`Sampler::new`] gives the defaults: no compare function, bias 0, clamps [0, 16] (no clamp:
/// unlike a zero-initialised `CUDA_TEXTURE_DESC`, whose `maxMipmapLevelClamp` of 0 pins level 0),
/// cube faces filtered separately, no anisotropy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    pub addr_mode: [AddrMode; 3],
    pub filter: Filter,
    pub normalized: bool,
    /// The comparison a fetch with the depth-compare operand `f` applies; a fetch with `f`
    /// through a sampler without one faults.
    pub compare: Option<CompareFunc>,
    /// Added to the level of detail of every `.f32`-coordinate fetch, in [-16, 16].
    pub lod_bias: f32,
    /// The level of detail is clamped to [`min_lod_clamp`, `max_lod_clamp`], both in [0, 16].
    pub min_lod_clamp: f32,
    pub max_lod_clamp: f32,
    /// Linear filtering of a cube map reads across face edges and corners.
    pub seamless_cube: bool,
    /// Most samples of an anisotropic `tex.grad` footprint (0 or 1: isotropic; at most 16).
    pub max_anisotropy: u32,
}

impl Sampler {
    /// A sampler with the given address modes, filter and coordinates and default state.
    pub fn new(addr_mode: [AddrMode; 3], filter: Filter, normalized: bool) -> Sampler {
        Sampler {
            addr_mode,
            filter,
            normalized,
            compare: None,
            lod_bias: 0.0,
            min_lod_clamp: 0.0,
            max_lod_clamp: MAX_LOD,
            seamless_cube: false,
            max_anisotropy: 0,
        }
    }

    /// The descriptor-side state: LOD values in 1/256 units (the hardware's 8 fractional bits,
    /// rounded to nearest), each field checked.
    pub fn state(&self) -> Result<SamplerState, DescError> {
        let fixed = |field: &'static str, x: f32, lo: f32| {
            if x.is_nan() || x < lo || x > MAX_LOD {
                return Err(bad(field, format!("{x} (must be in [{lo}, {MAX_LOD}])")));
            }
            Ok((x as f64 * 256.0).round() as i16)
        };
        let lod = Lod {
            bias: fixed("lod_bias", self.lod_bias, -MAX_LOD)?,
            min: fixed("min_lod_clamp", self.min_lod_clamp, 0.0)?,
            max: fixed("max_lod_clamp", self.max_lod_clamp, 0.0)?,
        };
        if lod.min > lod.max {
            return Err(bad("min_lod_clamp", "greater than max_lod_clamp"));
        }
        if self.max_anisotropy > 16 {
            let why = format!("{} (at most 16)", self.max_anisotropy);
            return Err(bad("max_anisotropy", why));
        }
        Ok(SamplerState {
            compare: self.compare,
            lod,
            seamless_cube: self.seamless_cube,
            max_anisotropy: self.max_anisotropy.max(1) as u8,
        })
    }
}

/// The largest level of detail a bias or clamp may name (a 65536-texel extent's last level).
pub const MAX_LOD: f32 = 16.0;

/// Level-of-detail bias and clamps in 1/256 units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lod {
    pub bias: i16,
    pub min: i16,
    pub max: i16,
}

impl Lod {
    /// `lambda + bias` clamped to [min, max] (NaN gives min), as OpenGL 4.6 section 8.14.1
    /// and Vulkan's "Level-of-Detail Operation" define it.
    pub fn apply(&self, lambda: f64) -> f64 {
        let f = |x: i16| x as f64 / 256.0;
        (lambda + f(self.bias)).max(f(self.min)).min(f(self.max))
    }
}

/// The sampler state beyond address modes, filter and coordinates, as a descriptor holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SamplerState {
    pub compare: Option<CompareFunc>,
    pub lod: Lod,
    pub seamless_cube: bool,
    /// 1 to 16 (1: isotropic).
    pub max_anisotropy: u8,
}

impl Default for SamplerState {
    fn default() -> SamplerState {
        SamplerState {
            compare: None,
            lod: Lod {
                bias: 0,
                min: 0,
                max: (MAX_LOD * 256.0) as i16,
            },
            seamless_cube: false,
            max_anisotropy: 1,
        }
    }
}

/// A depth comparison (OpenGL's `TEXTURE_COMPARE_FUNC`, Vulkan's `VkCompareOp`): a texel
/// passes (reads 1.0) when `reference OP texel` holds, else reads 0.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareFunc {
    Never,
    Less,
    Equal,
    LessEqual,
    Greater,
    NotEqual,
    GreaterEqual,
    Always,
}

impl CompareFunc {
    const ALL: [CompareFunc; 8] = [
        CompareFunc::Never,
        CompareFunc::Less,
        CompareFunc::Equal,
        CompareFunc::LessEqual,
        CompareFunc::Greater,
        CompareFunc::NotEqual,
        CompareFunc::GreaterEqual,
        CompareFunc::Always,
    ];
    /// Whether `reference OP texel` holds (false on NaN except for `NotEqual` and `Always`).
    pub fn passes(self, reference: f64, texel: f64) -> bool {
        match self {
            CompareFunc::Never => false,
            CompareFunc::Less => reference < texel,
            CompareFunc::Equal => reference == texel,
            CompareFunc::LessEqual => reference <= texel,
            CompareFunc::Greater => reference > texel,
            CompareFunc::NotEqual => reference != texel,
            CompareFunc::GreaterEqual => reference >= texel,
            CompareFunc::Always => true,
        }
    }
    /// The descriptor code: 1 + the index above (0: none).
    pub(super) fn code(c: Option<CompareFunc>) -> u8 {
        c.map_or(0, |c| c as u8 + 1)
    }
    pub(super) fn from_code(b: u8) -> Result<Option<CompareFunc>, DescError> {
        match b {
            0 => Ok(None),
            b => Self::ALL
                .get(b as usize - 1)
                .map(|c| Some(*c))
                .ok_or(bad("compare", "bad code")),
        }
    }
}

/// A 9-bit fixed-point interpolation weight (8 fractional bits, rounded to nearest) and the
/// lower texel index, for texel-space coordinate `u` (already scaled).
pub fn linear_weight(u: f64) -> (i64, f64) {
    let ub = u - 0.5;
    let i = ub.floor();
    let a = ((ub - i) * 256.0).round() / 256.0;
    (i as i64, a)
}

/// The (component, sign) of the face coordinates s and t of cube face `face`.
fn face_axes(face: u32) -> ((usize, f64), (usize, f64)) {
    match face {
        0 => ((2, -1.0), (1, -1.0)),
        1 => ((2, 1.0), (1, -1.0)),
        2 => ((0, 1.0), (2, 1.0)),
        3 => ((0, 1.0), (2, -1.0)),
        4 => ((0, 1.0), (1, -1.0)),
        _ => ((0, -1.0), (1, -1.0)),
    }
}

/// The point of the plane of face `face` with face coordinates `sc`, `tc` in [-1, 1] units
/// (the inverse of [`cube_face`]'s `s / m`, `t / m` with `m = 1`).
fn face_point(face: u32, sc: f64, tc: f64) -> [f64; 3] {
    let ((ks, gs), (kt, gt)) = face_axes(face);
    let mut p = [0.0; 3];
    p[face as usize / 2] = if face % 2 == 1 { -1.0 } else { 1.0 };
    p[ks] = gs * sc;
    p[kt] = gt * tc;
    p
}

/// The texel(s) seamless cube-map filtering reads for texel `(i, j)` of face `face` of an
/// `n`-texel face: the texel itself inside the face; across one edge, the adjacent face's
/// texel at that place; past a corner (both indices outside), the three texels meeting at the
/// cube's corner, whose average is the value (OpenGL 4.6 section 8.13.1,
/// `ARB_seamless_cube_map`). Each is `[face, i, j]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CubeTexel {
    One([i64; 3]),
    Corner([[i64; 3]; 3]),
}

/// [`CubeTexel`] of texel `(i, j)` (indices at most one texel outside the face, as a bilinear
/// footprint reaches; further ones are first clamped to that).
pub fn cube_texel(face: u32, i: i64, j: i64, n: u32) -> CubeTexel {
    let last = n as i64 - 1;
    let (i, j) = (i.clamp(-1, n as i64), j.clamp(-1, n as i64));
    let inside = |x: i64| (0..=last).contains(&x);
    let (ci, cj) = (i.clamp(0, last), j.clamp(0, last));
    match (inside(i), inside(j)) {
        (true, true) => CubeTexel::One([face as i64, i, j]),
        (false, false) => CubeTexel::Corner([
            [face as i64, ci, cj],
            across_edge(face, i, cj, n),
            across_edge(face, ci, j, n),
        ]),
        _ => CubeTexel::One(across_edge(face, i, j, n)),
    }
}

/// The texel one step past an edge of face `face`: its centre, extended past the edge in the
/// face's plane, is a direction whose face (re-selected by [`cube_face`]) is the neighbour, and
/// that face's texel under it is the one adjacent across the edge.
fn across_edge(face: u32, i: i64, j: i64, n: u32) -> [i64; 3] {
    let centre = |x: i64| 2.0 * (x as f64 + 0.5) / n as f64 - 1.0;
    let (f, uv, _) = cube_face(face_point(face, centre(i), centre(j)), [[0.0; 3]; 2]);
    let idx = |u: f64| ((u * n as f64).floor() as i64).clamp(0, n as i64 - 1);
    [f as i64, idx(uv[0]), idx(uv[1])]
}
