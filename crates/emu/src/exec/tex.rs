//! Execution of the texture and surface family ([`Op::Texture`]). Each lane reads its object's
//! descriptor ([`crate::texture::TexDesc`]) from device memory (and, in independent mode, its
//! sampler's) and applies the rules documented there: byte-addressed (`.b`) and formatted
//! (`.p`) surface loads, stores and reductions with `.trap`/`.clamp`/`.zero` out-of-range
//! handling on 1D/2D/3D and layered surfaces, queries, point and linear texture fetches with
//! mipmap level selection (`.level`, `.grad`) on every geometry (layers, cube faces, samples),
//! texel offsets, and `tld4` gathers.

use super::*;
use crate::program::Mip;
use crate::texture::{cube_face, linear_weight, Filter, ObjKind, TexDesc, DESC_BYTES};
use ptx::texture::{TexGeom, TexQuery};

/// Channel values of one texel as a fetch sees them (floats for `.f32` fetches, raw integers
/// otherwise, both held exactly in f64).
type Texel = [f64; 4];

/// Where a fetch samples: mipmap level, 2D plane (layer, face or sample; a 3D object's z is a
/// coordinate), and whether the addressing is a cube face's clamp.
#[derive(Clone, Copy)]
struct Place {
    level: u32,
    plane: i64,
    cube: bool,
}

/// Whether a descriptor's shape is the one geometry `g` reads (surfaces may also read a cube
/// map's faces as the layers of an `.a2d` access).
fn geom_fits(d: &TexDesc, g: TexGeom, surface: bool) -> bool {
    let layered = d.layers > 0;
    let flat = !d.cube && d.samples == 0;
    match g {
        TexGeom::D1 => d.dims == 1 && !layered,
        TexGeom::D2 => d.dims == 2 && !layered && flat,
        TexGeom::D3 => d.dims == 3,
        TexGeom::A1d => d.dims == 1 && layered,
        TexGeom::A2d => d.dims == 2 && d.samples == 0 && (layered && !d.cube || surface && d.cube),
        TexGeom::Cube => d.cube && !layered,
        TexGeom::Acube => d.cube && layered,
        TexGeom::Dms2 => d.samples > 0 && !layered,
        TexGeom::A2dms => d.samples > 0 && layered,
    }
}

fn fault(why: String) -> FaultKind {
    FaultKind::Other(why)
}

impl Cta {
    /// Executes a texture/surface op ([`Cta::exec`] sends it here).
    pub(super) fn exec_tex(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        inst: &Inst,
        m: u32,
    ) -> Result<Flow, FaultKind> {
        let Op::Texture(t) = &inst.op else {
            return Err(misrouted(inst));
        };
        for l in lanes_of(m) {
            let h = self.warps[wi].regs[t.handle as usize][l];
            if let TexKind::Istypep(want) = t.kind {
                let d = self.read_desc(ctx, (wi, l), h, None).ok();
                let is = d.is_some_and(|d| d.kind == want);
                self.warps[wi].regs[t.vals[0] as usize][l] = is as u64;
                continue;
            }
            let d = self.lane_desc(ctx, (wi, l), t)?;
            match t.kind {
                TexKind::Query { attr, level, .. } => {
                    let lv = level.map_or(0, |s| self.warps[wi].regs[s as usize][l] as u32);
                    self.warps[wi].regs[t.vals[0] as usize][l] = query(&d, attr, lv) as u64;
                }
                TexKind::Tex { ret, .. } | TexKind::Tld4 { ret, .. } => {
                    check_ret(&d, ret != TexRet::S32 && ret != TexRet::U32)?;
                    let v = if let TexKind::Tex { fcoord, mip, .. } = t.kind {
                        self.tex_lane(ctx, (wi, l), t, &d, (fcoord, mip))?
                    } else {
                        self.tld4_lane(ctx, (wi, l), t, &d)?
                    };
                    self.write_texel(wi, l, t, ret, v);
                }
                _ => self.surface_lane(ctx, (wi, l), t, &d)?,
            }
        }
        Ok(Flow::Next)
    }

    /// The lane's object descriptor, its sampler applied, checked against the instruction.
    fn lane_desc(
        &self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        t: &TexOp,
    ) -> Result<TexDesc, FaultKind> {
        let h = self.warps[wi].regs[t.handle as usize][l];
        let mut d = self.read_desc(ctx, (wi, l), h, t.names[0].as_deref())?;
        if let Some(s) = t.sampler {
            let sh = self.warps[wi].regs[s as usize][l];
            let sd = self.read_desc(ctx, (wi, l), sh, t.names[1].as_deref())?;
            d = d.with_sampler(&sd);
        }
        let surface = matches!(
            t.kind,
            TexKind::Suld { .. }
                | TexKind::Sust { .. }
                | TexKind::SustP { .. }
                | TexKind::Sured { .. }
                | TexKind::SuredP { .. }
                | TexKind::Query { surface: true, .. }
        );
        let ok = match (t.kind, d.kind) {
            (_, ObjKind::Surface) => surface,
            (_, ObjKind::Texture) => !surface,
            (TexKind::Query { attr, .. }, ObjKind::Sampler) => attr.of_sampler(),
            _ => false,
        };
        if !ok {
            let what = if surface { "Surface" } else { "Texture" };
            return Err(fault(format!(
                "handle {h:#x} is a {:?} object; this instruction needs a {what} object",
                d.kind
            )));
        }
        if let Some(g) = t.geom.filter(|g| !geom_fits(&d, *g, surface)) {
            return Err(fault(format!(
                "handle {h:#x} ({}D, {} layers, cube {}, {} samples) cannot be read as .{g}",
                d.dims, d.layers, d.cube, d.samples
            )));
        }
        Ok(d)
    }

    /// Reads and decodes the descriptor at handle `h` (`name`: the `.texref`/`.surfref`/
    /// `.samplerref` it is the slot of).
    fn read_desc(
        &self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        h: u64,
        name: Option<&str>,
    ) -> Result<TexDesc, FaultKind> {
        let mut raw = [0u8; DESC_BYTES];
        for (k, chunk) in raw.chunks_mut(8).enumerate() {
            let v = self
                .tex_read(ctx, wi, l, h.wrapping_add(8 * k as u64), 8)
                .map_err(|f| {
                    fault(format!(
                        "texture/surface handle {h:#x} does not point at a descriptor: {f}"
                    ))
                })?;
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        if let (Some(n), true) = (name, raw.iter().all(|b| *b == 0)) {
            return Err(fault(format!(
                "`{n}` is not bound (bind an object with LoadedModule::bind_texref / \
                 bind_surfref before the launch)"
            )));
        }
        TexDesc::decode(&raw).map_err(|e| fault(format!("texture/surface handle {h:#x}: {e}")))
    }

    fn tex_read(
        &self,
        ctx: &LaunchCtx,
        wi: usize,
        l: usize,
        a: u64,
        size: u32,
    ) -> Result<u64, FaultKind> {
        let loc = self.locate(ctx, MSpace::Global, a, size, l, ctx.prog.local_bytes)?;
        Ok(self.load(ctx, wi, &loc, size, Ordering::Relaxed))
    }

    /// Coordinate slot `k` of the lane as raw 32 bits.
    fn coord_bits(&self, wi: usize, l: usize, t: &TexOp, k: usize) -> u32 {
        self.warps[wi].regs[t.coords[k] as usize][l] as u32
    }

    /// One lane of a surface access: x is in bytes (`.b`) or texels (`.p`), y in rows, the
    /// third coordinate a slice (3D) or the layer index (layered).
    fn surface_lane(
        &mut self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
    ) -> Result<(), FaultKind> {
        let (elem, oob, name) = match t.kind {
            TexKind::Suld { elem, oob } => (elem, oob, "suld"),
            TexKind::Sust { elem, oob } => (elem, oob, "sust"),
            TexKind::SustP { oob } => (d.format.bytes(), oob, "sust.p"),
            TexKind::Sured { ty, oob, .. } => (ty.size(), oob, "sured"),
            TexKind::SuredP { oob, wide, .. } => (4 << wide as u32, oob, "sured.p"),
            _ => return Err(misrouted_tex()),
        };
        let g = t.geom.ok_or_else(misrouted_tex)?;
        let texels = matches!(t.kind, TexKind::SustP { .. } | TexKind::SuredP { .. });
        let row = d.extent[0] as i64 * d.texel_bytes() as i64;
        let access = if texels {
            1
        } else {
            (elem as usize * t.vals.len()) as i64
        };
        if access > row {
            return Err(fault(format!(
                "{name}: a {access}-byte access is wider than the surface's {row}-byte rows"
            )));
        }
        let mut c = [0i64; 3];
        let f = g.first_coord();
        for (k, ck) in c.iter_mut().enumerate().take(g.spatial()) {
            *ck = self.coord_bits(wi, l, t, f + k) as i32 as i64;
        }
        if let Some(s) = g.layer_slot() {
            c[2] = self.coord_bits(wi, l, t, s) as i64;
        }
        let xmax = if texels {
            d.extent[0] as i64 - 1
        } else {
            row - access
        };
        let hi = [xmax, d.extent[1] as i64 - 1, d.planes(0) as i64 - 1];
        if (0..3).any(|k| c[k] < 0 || c[k] > hi[k]) {
            match oob {
                Oob::Trap => {
                    return Err(fault(format!(
                        "{name}.trap: surface coordinate ({}, {}, {}) out of range \
                         (x up to {xmax}, {} rows, {} slices/layers)",
                        c[0],
                        c[1],
                        c[2],
                        d.extent[1],
                        d.planes(0)
                    )))
                }
                Oob::Zero => {
                    if let TexKind::Suld { .. } = t.kind {
                        for v in &t.vals {
                            self.warps[wi].regs[*v as usize][l] = 0;
                        }
                    }
                    return Ok(());
                }
                Oob::Clamp => (0..3).for_each(|k| c[k] = c[k].clamp(0, hi[k])),
            }
        }
        let bx = if texels {
            c[0] as u64 * d.texel_bytes() as u64
        } else {
            c[0] as u64
        };
        let base = d.level_texel_addr(0, 0, c[1], c[2], bx);
        match t.kind {
            TexKind::SustP { .. } => self.sust_p(ctx, (wi, l), t, d, base),
            TexKind::SuredP { op, wide, .. } => self.sured_p(ctx, (wi, l), t, d, base, (op, wide)),
            _ => self.surface_access(ctx, wi, l, t, base, elem),
        }
    }

    /// `sust.p`: the first `channels` values, converted to the surface format.
    fn sust_p(
        &mut self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
        base: u64,
    ) -> Result<(), FaultKind> {
        let cb = d.format.bytes();
        if cb > 4 {
            return Err(fault(format!(
                "sust.p stores 32-bit values; a {:?} surface has 64-bit channels (use sust.b)",
                d.format
            )));
        }
        for (k, v) in t.vals.iter().enumerate().take(d.channels as usize) {
            let a = base.wrapping_add(k as u64 * cb as u64);
            let loc = self.locate(ctx, MSpace::Global, a, cb, l, ctx.prog.local_bytes)?;
            let x = d
                .format
                .from_store(self.warps[wi].regs[*v as usize][l] as u32);
            self.store(wi, &loc, cb, x, Ordering::Relaxed);
        }
        Ok(())
    }

    /// `sured.p`: the reduction on channel 0 of the texel of an integer surface whose channels
    /// are the instruction's width (`.b32`: `U32`/`S32`; `.b64`: `U64`/`S64`), signed or
    /// unsigned as the format is (the PTX ISA: the surface's format gives the signedness).
    fn sured_p(
        &mut self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
        base: u64,
        (op, wide): (AtomOp, bool),
    ) -> Result<(), FaultKind> {
        use crate::texture::TexFormat as F;
        let ty = match (wide, d.format) {
            (false, F::U32) => Ty::U32,
            (false, F::S32) => Ty::S32,
            (true, F::U64) => Ty::U64,
            (true, F::S64) => Ty::S64,
            (_, f) => {
                let want = if wide { "U64 or S64" } else { "U32 or S32" };
                let b = if wide { 64 } else { 32 };
                return Err(fault(format!(
                    "sured.p.b{b} reduces {want} surfaces, not {f:?}"
                )));
            }
        };
        let b = self.warps[wi].regs[t.vals[0] as usize][l];
        let size = ty.size();
        let loc = self.locate(ctx, MSpace::Global, base, size, l, ctx.prog.local_bytes)?;
        match loc {
            // SAFETY: allocation kept alive by the launch's memory snapshot.
            Loc::Global(al, off) => {
                let f = |old| atom_apply(op, ty, old, b, 0);
                unsafe { &*al }.rmw(off, size, Ordering::Relaxed, f);
                Ok(())
            }
            _ => Err(misrouted_tex()),
        }
    }

    /// The memory side of a `.b` surface access at `base`, once the coordinate is in range.
    fn surface_access(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        l: usize,
        t: &TexOp,
        base: u64,
        elem: u32,
    ) -> Result<(), FaultKind> {
        let lb = ctx.prog.local_bytes;
        for (k, v) in t.vals.iter().enumerate() {
            let a = base.wrapping_add(k as u64 * elem as u64);
            let loc = self.locate(ctx, MSpace::Global, a, elem, l, lb)?;
            match t.kind {
                TexKind::Suld { .. } => {
                    let x = self.load(ctx, wi, &loc, elem, Ordering::Relaxed);
                    self.warps[wi].regs[*v as usize][l] = x;
                }
                TexKind::Sust { .. } => {
                    let x = self.warps[wi].regs[*v as usize][l];
                    self.store(wi, &loc, elem, x, Ordering::Relaxed);
                }
                TexKind::Sured { op, ty, .. } => {
                    let b = self.warps[wi].regs[*v as usize][l];
                    let f = |old| atom_apply(op, ty, old, b, 0);
                    match loc {
                        // SAFETY: allocation kept alive by the launch's memory snapshot.
                        Loc::Global(al, off) => {
                            unsafe { &*al }.rmw(off, elem, Ordering::Relaxed, f);
                        }
                        _ => return Err(misrouted_tex()),
                    }
                }
                _ => return Err(misrouted_tex()),
            }
        }
        Ok(())
    }

    /// One texel of `p` (spatial indices before addressing; `None` from the addressing mode
    /// is border).
    fn texel(
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
    /// dimension of the object or face).
    fn filter_at(
        &self,
        ctx: &LaunchCtx,
        wl: (usize, usize),
        d: &TexDesc,
        p: Place,
        (u, float, linear): (&[f64], bool, bool),
    ) -> Result<Texel, FaultKind> {
        if !linear {
            let mut idx = [0i64; 3];
            for (k, x) in u.iter().enumerate() {
                idx[k] = x.floor() as i64;
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
            let v = self.texel(ctx, wl, d, (p, idx), true)?;
            for c in 0..4 {
                acc[c] += w * v[c];
            }
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

    /// A cube fetch's direction from the coordinates.
    fn cube_dir(&self, wi: usize, l: usize, t: &TexOp, g: TexGeom) -> [f64; 3] {
        let f = g.first_coord();
        [0, 1, 2].map(|k| f32::from_bits(self.coord_bits(wi, l, t, f + k)) as f64)
    }

    /// The level of detail of a `.level`/`.grad` fetch (level-0 texel units for gradients).
    fn lambda(&self, wi: usize, l: usize, t: &TexOp, d: &TexDesc, fcoord: bool, mip: Mip) -> f64 {
        let reg = |s: u32| self.warps[wi].regs[s as usize][l] as u32;
        let g = t.geom.unwrap_or(TexGeom::D1);
        match mip {
            Mip::Base => 0.0,
            Mip::Level(s) if fcoord => f32::from_bits(reg(s)) as f64,
            Mip::Level(s) => reg(s) as i32 as f64,
            Mip::Grad(gr) => {
                let gv = |k: usize| gr[k].map(|s| f32::from_bits(reg(s)) as f64);
                let (dx, dy) = (gv(0), gv(1));
                let len = |v: [f64; 2]| (v[0] * v[0] + v[1] * v[1]).sqrt();
                let rho = if g.is_cube() {
                    let (_, _, dd) = cube_face(self.cube_dir(wi, l, t, g), [dx, dy]);
                    let w = d.extent[0] as f64;
                    len(dd[0]).max(len(dd[1])) * w
                } else {
                    let n = g.spatial();
                    let scale = |k: usize| {
                        if d.normalized {
                            d.extent[k] as f64
                        } else {
                            1.0
                        }
                    };
                    let norm = |v: [f64; 3]| {
                        (0..n)
                            .map(|k| (v[k] * scale(k)).powi(2))
                            .sum::<f64>()
                            .sqrt()
                    };
                    norm(dx).max(norm(dy))
                };
                rho.log2()
            }
        }
    }

    /// One lane of `tex`: mip level(s), then point sampling or linear filtering on each.
    fn tex_lane(
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
        let lambda = self.lambda(wi, l, t, d, fcoord, mip);
        let levels = d.mip_levels(lambda);
        if levels[1].1 == 0.0 {
            // one level: its value as sampled (a -0.0 texel stays -0.0)
            return self.sample_level(ctx, wl, t, d, (levels[0].0, fcoord, float));
        }
        let mut acc = [0.0f64; 4];
        for (level, w) in levels {
            if w == 0.0 {
                continue;
            }
            let v = self.sample_level(ctx, wl, t, d, (level, fcoord, float))?;
            for c in 0..4 {
                acc[c] += w * v[c];
            }
        }
        Ok(acc)
    }

    /// The filtered value of level `level` at the lane's coordinates.
    fn sample_level(
        &self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
        (level, fcoord, float): (u32, bool, bool),
    ) -> Result<Texel, FaultKind> {
        let g = t.geom.ok_or_else(misrouted_tex)?;
        let mut p = Place {
            level,
            plane: self.fetch_plane(wi, l, t, d, g),
            cube: false,
        };
        let w = d.level_extent(level)[0] as f64;
        if g.is_cube() {
            let (face, uv, _) = cube_face(self.cube_dir(wi, l, t, g), [[0.0; 3]; 2]);
            p.plane += face as i64;
            p.cube = true;
            let linear = float && d.filter == Filter::Linear;
            let u = [uv[0] * w, uv[1] * w];
            return self.filter_at(ctx, (wi, l), d, p, (&u, float, linear));
        }
        let f = g.first_coord();
        let mut u = [0.0f64; 3];
        for (k, x) in u.iter_mut().enumerate().take(g.spatial()) {
            let raw = self.coord_bits(wi, l, t, f + k);
            *x = if fcoord {
                d.level_coord(level, k, f32::from_bits(raw) as f64)
            } else {
                raw as i32 as f64 + 0.5
            };
            if let Some(e) = t.offset {
                *x += self.warps[wi].regs[e[k] as usize][l] as u32 as i32 as f64;
            }
        }
        let linear = float && d.filter == Filter::Linear && !g.is_ms();
        self.filter_at(ctx, (wi, l), d, p, (&u[..g.spatial()], float, linear))
    }

    /// One lane of `tld4`: channel `comp` of the four texels a bilinear fetch would read, in
    /// the order (i0, j1), (i1, j1), (i1, j0), (i0, j0).
    fn tld4_lane(
        &self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
    ) -> Result<Texel, FaultKind> {
        let TexKind::Tld4 { comp, ret } = t.kind else {
            return Err(misrouted_tex());
        };
        let float = ret == TexRet::F32;
        let g = t.geom.ok_or_else(misrouted_tex)?;
        let mut p = Place {
            level: 0,
            plane: self.fetch_plane(wi, l, t, d, g),
            cube: false,
        };
        let mut u = [0.0f64; 2];
        if g.is_cube() {
            let (face, uv, _) = cube_face(self.cube_dir(wi, l, t, g), [[0.0; 3]; 2]);
            p.plane += face as i64;
            p.cube = true;
            u = uv.map(|x| x * d.extent[0] as f64);
        } else {
            let f = g.first_coord();
            for (k, x) in u.iter_mut().enumerate() {
                let c = f32::from_bits(self.coord_bits(wi, l, t, f + k));
                *x = d.texel_coord(k, c);
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
            *o = self.texel(ctx, (wi, l), d, (p, [i, j, 0]), float)?[comp as usize];
        }
        Ok(out)
    }

    fn write_texel(&mut self, wi: usize, l: usize, t: &TexOp, ret: TexRet, v: Texel) {
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

/// The value `txq`/`suq` reports (`level`: `txq.level`'s mipmap level). Format and channel
/// queries report ptxforge's own codes: the [`crate::texture::TexFormat`] index and the
/// channel count; `array_size` is 0 for an object without layers; `memory_layout` is 1
/// (linear).
fn query(d: &TexDesc, attr: TexQuery, level: u32) -> u32 {
    let e = d.level_extent(level);
    match attr {
        TexQuery::Width => e[0],
        TexQuery::Height => e[1],
        TexQuery::Depth => e[2],
        TexQuery::ChannelDataType => d.format as u32,
        TexQuery::ChannelOrder => d.channels,
        TexQuery::NormalizedCoords => d.normalized as u32,
        TexQuery::FilterMode => (d.filter == Filter::Linear) as u32,
        TexQuery::AddrMode(i) => d.addr_mode[i as usize].txq_value(),
        TexQuery::ArraySize => d.layers,
        TexQuery::NumMipmapLevels => d.levels,
        TexQuery::NumSamples => d.samples,
        TexQuery::MemoryLayout => 1,
    }
}

/// Whether the texture's format can be read by a float (`float`) or integer fetch.
fn check_ret(d: &TexDesc, float: bool) -> Result<(), FaultKind> {
    let ok = if float {
        d.format.reads_as_float()
    } else {
        d.format.reads_as_int()
    };
    if ok {
        Ok(())
    } else {
        Err(fault(format!(
            "a {} fetch cannot read a {:?} texture",
            if float { ".f32" } else { "integer" },
            d.format
        )))
    }
}

fn misrouted_tex() -> FaultKind {
    fault("texture executor reached an arm its op kind does not take".into())
}
