//! Execution of the texture and surface family ([`Op::Texture`]). Each lane reads its object's
//! descriptor ([`crate::texture::TexDesc`]) from device memory (and, in independent mode, its
//! sampler's) and applies the rules documented there: byte-addressed (`.b`) and formatted
//! (`.p`) surface loads, stores and reductions with `.trap`/`.clamp`/`.zero` out-of-range
//! handling on 1D/2D/3D and layered surfaces, queries, point and linear texture fetches with
//! mipmap level selection (`.level`, `.grad`) on every geometry (layers, cube faces, samples),
//! texel offsets, and `tld4` gathers. The fetches, with the sampler's depth compare, LOD bias
//! and clamps, seamless cube filtering and anisotropy, are in `fetch.rs`.

use super::*;
use crate::texture::{cube_face, linear_weight, Filter, ObjKind, TexDesc, DESC_BYTES};
use ptx::texture::{TexGeom, TexQuery};

mod fetch;

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
