//! Texture fetches (`tex`, `tld4`): the level of detail (with the sampler's bias and clamps),
//! the footprint (one sample, or the samples of an anisotropic `tex.grad`), point sampling and
//! linear filtering on each mipmap level, seamless cube-map texels across face edges and
//! corners, and depth comparison of each texel before filtering. The rules are documented in
//! [`crate::texture`].

use super::*;
use crate::texture::{cube_texel, CompareFunc, CubeTexel, TexFormat};

/// Channel values of one texel as a fetch sees them (floats for `.f32` fetches, raw integers
/// otherwise, both held exactly in f64).
pub(super) type Texel = [f64; 4];

/// Where a fetch samples: mipmap level, 2D plane (layer, face or sample; a 3D object's z is a
/// coordinate), whether the addressing is a cube face's, and the depth comparison (function and
/// reference) each texel goes through before filtering.
#[derive(Clone, Copy)]
struct Place {
    level: u32,
    plane: i64,
    cube: bool,
    depth: Option<(CompareFunc, f64)>,
}

/// The sample coordinates of a fetch's footprint: one, or up to 16 (anisotropic).
struct Taps {
    c: [[f64; 3]; MAX_TAPS],
    n: usize,
}

const MAX_TAPS: usize = 16;

impl Taps {
    fn one(c: [f64; 3]) -> Taps {
        let mut t = Taps {
            c: [[0.0; 3]; MAX_TAPS],
            n: 1,
        };
        t.c[0] = c;
        t
    }
    fn as_slice(&self) -> &[[f64; 3]] {
        &self.c[..self.n]
    }
}

/// Adds `w * v` to `acc`, channel by channel.
fn accumulate(acc: &mut Texel, w: f64, v: Texel) {
    for c in 0..4 {
        acc[c] += w * v[c];
    }
}

impl Cta {
    /// One texel of `p`: on a seamless cube map, a texel outside the face is read from the
    /// adjacent face (a corner's is the average of the three texels meeting there).
    fn texel(
        &self,
        ctx: &LaunchCtx,
        wl: (usize, usize),
        d: &TexDesc,
        (p, idx): (Place, [i64; 3]),
        float: bool,
    ) -> Result<Texel, FaultKind> {
        if !(p.cube && d.state.seamless_cube) {
            return self.compared_texel(ctx, wl, d, (p, idx), float);
        }
        let n = d.level_extent(p.level)[0];
        let face = p.plane.rem_euclid(6);
        let at = |t: [i64; 3]| {
            let q = Place {
                plane: p.plane - face + t[0],
                ..p
            };
            (q, [t[1], t[2], 0])
        };
        match cube_texel(face as u32, idx[0], idx[1], n) {
            CubeTexel::One(t) => self.compared_texel(ctx, wl, d, at(t), float),
            CubeTexel::Corner(ts) => {
                let mut acc = [0.0; 4];
                for t in ts {
                    accumulate(
                        &mut acc,
                        1.0,
                        self.compared_texel(ctx, wl, d, at(t), float)?,
                    );
                }
                Ok(acc.map(|x| x / 3.0))
            }
        }
    }

    /// The stored texel, or with a depth comparison `(r OP texel.x, 0, 0, 1)` (r: 1.0 when
    /// the comparison passes, else 0.0; OpenGL 4.6 table 15.1 puts a depth result in red).
    fn compared_texel(
        &self,
        ctx: &LaunchCtx,
        wl: (usize, usize),
        d: &TexDesc,
        at: (Place, [i64; 3]),
        float: bool,
    ) -> Result<Texel, FaultKind> {
        let v = self.stored_texel(ctx, wl, d, at, float)?;
        Ok(match at.0.depth {
            Some((f, r)) => [f.passes(r, v[0]) as u8 as f64, 0.0, 0.0, 1.0],
            None => v,
        })
    }

    /// One texel of `p` as stored (spatial indices before addressing; `None` from the
    /// addressing mode is border).
    fn stored_texel(
        &self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        d: &TexDesc,
        (p, idx): (Place, [i64; 3]),
        float: bool,
    ) -> Result<Texel, FaultKind> {
        let e = d.level_extent(p.level);
        let mut at = [0i64; 3];
        for k in 0..d.dims as usize {
            let a = if p.cube {
                Some(idx[k].clamp(0, e[k] as i64 - 1))
            } else {
                d.address_in(k, idx[k], e[k])
            };
            match a {
                Some(i) => at[k] = i,
                None => return Ok([0.0; 4]),
            }
        }
        let plane = if d.dims == 3 { at[2] } else { p.plane };
        let mut v = [0.0, 0.0, 0.0, 1.0];
        let cb = d.format.bytes();
        for (c, slot) in v.iter_mut().enumerate().take(d.channels as usize) {
            let a = d.level_texel_addr(p.level, at[0], at[1], plane, (c as u32 * cb) as u64);
            let raw = self.tex_read(ctx, wi, l, a, cb)?;
            *slot = if float {
                d.format.to_float(raw)
            } else {
                d.format.to_int(raw)
            };
        }
        Ok(v)
    }

    /// Point sample or linear filter at texel-space coordinates `u` (one per spatial
    /// dimension of the object or face). Point sampling stays on a cube face.
    fn filter_at(
        &self,
        ctx: &LaunchCtx,
        wl: (usize, usize),
        d: &TexDesc,
        p: Place,
        (u, float, linear): (&[f64], bool, bool),
    ) -> Result<Texel, FaultKind> {
        if !linear {
            let e = d.level_extent(p.level);
            let mut idx = [0i64; 3];
            for (k, x) in u.iter().enumerate() {
                idx[k] = x.floor() as i64;
                if p.cube {
                    idx[k] = idx[k].clamp(0, e[k] as i64 - 1);
                }
            }
            return self.texel(ctx, wl, d, (p, idx), float);
        }
        let lw: Vec<(i64, f64)> = u.iter().map(|&x| linear_weight(x)).collect();
        let mut acc = [0.0f64; 4];
        // corners in order, x fastest: bit k of `corner` takes texel i0 + 1 along dimension k
        for corner in 0..1usize << u.len() {
            let mut idx = [0i64; 3];
            let mut w = 1.0f64;
            for (k, &(i0, a)) in lw.iter().enumerate() {
                let up = corner >> k & 1 == 1;
                idx[k] = if up { i0.saturating_add(1) } else { i0 };
                w *= if up { a } else { 1.0 - a };
            }
            accumulate(&mut acc, w, self.texel(ctx, wl, d, (p, idx), true)?);
        }
        Ok(acc)
    }

    /// The plane a layered/multisample fetch reads (indices clamped), before the cube face.
    fn fetch_plane(&self, wi: usize, l: usize, t: &TexOp, d: &TexDesc, g: TexGeom) -> i64 {
        let layer = g.layer_slot().map_or(0, |s| {
            (self.coord_bits(wi, l, t, s) as i64).min(d.layers.max(1) as i64 - 1)
        });
        let sample = g.sample_slot().map_or(0, |s| {
            (self.coord_bits(wi, l, t, s) as i32 as i64).clamp(0, d.samples.max(1) as i64 - 1)
        });
        if g.is_cube() {
            6 * layer
        } else {
            layer * d.samples.max(1) as i64 + sample
        }
    }

    /// The lane's spatial coordinates as written (`.f32` values or `.s32` integers, exactly),
    /// or a cube fetch's direction.
    fn fetch_coords(&self, wi: usize, l: usize, t: &TexOp, g: TexGeom, fcoord: bool) -> [f64; 3] {
        let f = g.first_coord();
        let n = if g.is_cube() { 3 } else { g.spatial() };
        let mut c = [0.0; 3];
        for (k, x) in c.iter_mut().enumerate().take(n) {
            let raw = self.coord_bits(wi, l, t, f + k);
            *x = if fcoord {
                f32::from_bits(raw) as f64
            } else {
                raw as i32 as f64
            };
        }
        c
    }

    /// The level of detail and the coordinates of each sample of the lane's footprint. Only
    /// `.f32`-coordinate fetches take the sampler's bias and clamps (an `.s32` fetch reads the
    /// level it names, as OpenGL's `texelFetch`).
    fn footprint(
        &self,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
        (fcoord, mip): (bool, Mip),
        c: [f64; 3],
    ) -> (f64, Taps) {
        let reg = |s: u32| self.warps[wi].regs[s as usize][l] as u32;
        let (lambda, taps) = match mip {
            Mip::Base => (0.0, Taps::one(c)),
            Mip::Level(s) if fcoord => (f32::from_bits(reg(s)) as f64, Taps::one(c)),
            Mip::Level(s) => (reg(s) as i32 as f64, Taps::one(c)),
            Mip::Grad(gr) => self.grad_footprint((wi, l), t, d, gr, c),
        };
        if fcoord {
            (d.state.lod.apply(lambda), taps)
        } else {
            (lambda, taps)
        }
    }

    /// `tex.grad`: lambda = log2 of the longer derivative (level-0 texel units; for a cube,
    /// of the face coordinates, see [`cube_face`]). Through a sampler with `max_anisotropy`
    /// N_max > 1, EXT_texture_filter_anisotropic's reference footprint: with Pmax, Pmin the
    /// longer and shorter derivative lengths, N = min(ceil(Pmax / Pmin), N_max) samples at
    /// `c + (i / (N + 1) - 1/2) * dP` (i = 1..N, dP the longer derivative; `dPdy` on a tie),
    /// each at lambda = log2(Pmax / N).
    fn grad_footprint(
        &self,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
        gr: [[u32; 3]; 2],
        c: [f64; 3],
    ) -> (f64, Taps) {
        let g = t.geom.unwrap_or(TexGeom::D1);
        let reg = |s: u32| f32::from_bits(self.warps[wi].regs[s as usize][l] as u32) as f64;
        let dd = gr.map(|v| v.map(reg));
        let len = if g.is_cube() {
            let (_, _, fd) = cube_face(c, dd);
            let w = d.extent[0] as f64;
            fd.map(|v| (v[0] * v[0] + v[1] * v[1]).sqrt() * w)
        } else {
            let n = g.spatial();
            let scale = |k: usize| {
                if d.normalized {
                    d.extent[k] as f64
                } else {
                    1.0
                }
            };
            dd.map(|v| {
                (0..n)
                    .map(|k| (v[k] * scale(k)).powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
        };
        let (pmax, pmin) = (len[0].max(len[1]), len[0].min(len[1]));
        let max_n = d.state.max_anisotropy as f64;
        let ratio = pmax / pmin;
        if max_n <= 1.0 || ratio.is_nan() || ratio <= 1.0 {
            return (pmax.log2(), Taps::one(c));
        }
        // max_anisotropy <= 16 (the descriptor's check), so n <= MAX_TAPS
        let n = ratio.ceil().min(max_n).min(MAX_TAPS as f64);
        let major = if len[0] > len[1] { dd[0] } else { dd[1] };
        let mut taps = Taps::one(c);
        taps.n = n as usize;
        for (i, tap) in taps.c.iter_mut().take(taps.n).enumerate() {
            let f = (i + 1) as f64 / (n + 1.0) - 0.5;
            *tap = [0, 1, 2].map(|k| c[k] + f * major[k]);
        }
        ((pmax / n).log2(), taps)
    }

    /// The depth comparison of a fetch with the compare operand `f`: the sampler's function and
    /// the reference, clamped to [0, 1] for a normalized-integer format read as floats (OpenGL
    /// clamps fixed-point depth references).
    fn depth_ref(
        &self,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
        float: bool,
    ) -> Result<Option<(CompareFunc, f64)>, FaultKind> {
        let Some(s) = t.depth else {
            return Ok(None);
        };
        let f = d.state.compare.ok_or_else(|| {
            fault(
                "depth-compare fetch through a sampler without a compare function \
                 (set Sampler::compare when building the texture or sampler)"
                    .into(),
            )
        })?;
        let mut r = f32::from_bits(self.warps[wi].regs[s as usize][l] as u32) as f64;
        if float && matches!(d.format, TexFormat::U8 | TexFormat::U16) {
            r = r.clamp(0.0, 1.0);
        }
        Ok(Some((f, r)))
    }

    /// One lane of `tex`: footprint and mip level(s), then point sampling or linear filtering
    /// of each sample on each level, averaged over the footprint's samples.
    pub(super) fn tex_lane(
        &self,
        ctx: &LaunchCtx,
        wl: (usize, usize),
        t: &TexOp,
        d: &TexDesc,
        (fcoord, mip): (bool, Mip),
    ) -> Result<Texel, FaultKind> {
        let (wi, l) = wl;
        let g = t.geom.ok_or_else(misrouted_tex)?;
        let float = !matches!(
            t.kind,
            TexKind::Tex {
                ret: TexRet::S32 | TexRet::U32,
                ..
            }
        );
        if !float && d.filter == Filter::Linear && !g.is_ms() {
            return Err(fault("tex: linear filtering needs an .f32 fetch".into()));
        }
        let c = self.fetch_coords(wi, l, t, g, fcoord);
        let (lambda, taps) = self.footprint(wl, t, d, (fcoord, mip), c);
        let levels = d.mip_levels(lambda);
        let depth = self.depth_ref(wl, t, d, float)?;
        let sample = |tap: [f64; 3]| -> Result<Texel, FaultKind> {
            if levels[1].1 == 0.0 {
                // one level: its value as sampled (a -0.0 texel stays -0.0)
                let at = (levels[0].0, fcoord, float);
                return self.sample_level(ctx, wl, t, d, at, (tap, depth));
            }
            let mut acc = [0.0f64; 4];
            for (level, w) in levels.into_iter().filter(|lw| lw.1 != 0.0) {
                let v = self.sample_level(ctx, wl, t, d, (level, fcoord, float), (tap, depth))?;
                accumulate(&mut acc, w, v);
            }
            Ok(acc)
        };
        let taps = taps.as_slice();
        if taps.len() == 1 {
            return sample(taps[0]);
        }
        let mut acc = [0.0f64; 4];
        for tap in taps {
            accumulate(&mut acc, 1.0, sample(*tap)?);
        }
        Ok(acc.map(|x| x / taps.len() as f64))
    }

    /// The filtered value of level `level` at coordinates `c` (as [`Cta::fetch_coords`]).
    fn sample_level(
        &self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
        (level, fcoord, float): (u32, bool, bool),
        (c, depth): ([f64; 3], Option<(CompareFunc, f64)>),
    ) -> Result<Texel, FaultKind> {
        let g = t.geom.ok_or_else(misrouted_tex)?;
        let mut p = Place {
            level,
            plane: self.fetch_plane(wi, l, t, d, g),
            cube: false,
            depth,
        };
        if g.is_cube() {
            let w = d.level_extent(level)[0] as f64;
            let (face, uv, _) = cube_face(c, [[0.0; 3]; 2]);
            p.plane += face as i64;
            p.cube = true;
            let linear = float && d.filter == Filter::Linear;
            let u = [uv[0] * w, uv[1] * w];
            return self.filter_at(ctx, (wi, l), d, p, (&u, float, linear));
        }
        let mut u = [0.0f64; 3];
        for (k, x) in u.iter_mut().enumerate().take(g.spatial()) {
            *x = if fcoord {
                d.level_coord(level, k, c[k])
            } else {
                c[k] + 0.5
            };
            if let Some(e) = t.offset {
                *x += self.warps[wi].regs[e[k] as usize][l] as u32 as i32 as f64;
            }
        }
        let linear = float && d.filter == Filter::Linear && !g.is_ms();
        self.filter_at(ctx, (wi, l), d, p, (&u[..g.spatial()], float, linear))
    }

    /// One lane of `tld4`: channel `comp` of the four texels a bilinear fetch would read, in
    /// the order (i0, j1), (i1, j1), (i1, j0), (i0, j0) (after the depth comparison, if any).
    pub(super) fn tld4_lane(
        &self,
        ctx: &LaunchCtx,
        wl: (usize, usize),
        t: &TexOp,
        d: &TexDesc,
    ) -> Result<Texel, FaultKind> {
        let (wi, l) = wl;
        let TexKind::Tld4 { comp, ret } = t.kind else {
            return Err(misrouted_tex());
        };
        let float = ret == TexRet::F32;
        let g = t.geom.ok_or_else(misrouted_tex)?;
        let mut p = Place {
            level: 0,
            plane: self.fetch_plane(wi, l, t, d, g),
            cube: false,
            depth: self.depth_ref(wl, t, d, float)?,
        };
        let c = self.fetch_coords(wi, l, t, g, true);
        let mut u = [0.0f64; 2];
        if g.is_cube() {
            let (face, uv, _) = cube_face(c, [[0.0; 3]; 2]);
            p.plane += face as i64;
            p.cube = true;
            u = uv.map(|x| x * d.extent[0] as f64);
        } else {
            for (k, x) in u.iter_mut().enumerate() {
                *x = d.level_coord(0, k, c[k]);
                if let Some(e) = t.offset {
                    *x += self.warps[wi].regs[e[k] as usize][l] as u32 as i32 as f64;
                }
            }
        }
        let (i0, _) = linear_weight(u[0]);
        let (j0, _) = linear_weight(u[1]);
        let (i1, j1) = (i0.saturating_add(1), j0.saturating_add(1));
        let mut out = [0.0; 4];
        for (o, (i, j)) in out.iter_mut().zip([(i0, j1), (i1, j1), (i1, j0), (i0, j0)]) {
            *o = self.texel(ctx, wl, d, (p, [i, j, 0]), float)?[comp as usize];
        }
        Ok(out)
    }

    pub(super) fn write_texel(&mut self, wi: usize, l: usize, t: &TexOp, ret: TexRet, v: Texel) {
        if ret == TexRet::F16x2 {
            let h = |x: f64| crate::fp::f32_to_f16_rn(x as f32) as u64;
            for (k, d) in t.vals.iter().enumerate() {
                self.warps[wi].regs[*d as usize][l] = h(v[2 * k]) | h(v[2 * k + 1]) << 16;
            }
        } else {
            for (d, x) in t.vals.iter().zip(v) {
                let bits = match ret {
                    TexRet::F32 => (x as f32).to_bits(),
                    _ => x as i64 as u32,
                };
                self.warps[wi].regs[*d as usize][l] = bits as u64;
            }
        }
        if let Some(p) = t.pred {
            self.warps[wi].regs[p as usize][l] = 1;
        }
    }
}
