//! Execution of the texture and surface family ([`Op::Texture`]). Each lane reads its object's
//! descriptor ([`crate::texture::TexDesc`]) from device memory and applies the rules documented
//! there: byte-addressed surface loads, stores and reductions with `.trap`/`.clamp`/`.zero`
//! out-of-range handling, queries, point and linear texture fetches, and `tld4` gathers.

use super::*;
use crate::texture::{linear_weight, Filter, ObjKind, TexDesc, DESC_BYTES};

/// Channel values of one texel as a fetch sees them (floats for `.f32` fetches, raw integers
/// otherwise, both held exactly in f64).
type Texel = [f64; 4];

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
                let d = self.read_desc(ctx, wi, l, h).ok();
                let is = matches!((d, want), (Some(d), Some(k)) if d.kind == k);
                self.warps[wi].regs[t.vals[0] as usize][l] = is as u64;
                continue;
            }
            let d = self.read_desc(ctx, wi, l, h)?;
            let need = match t.kind {
                TexKind::Suld { .. } | TexKind::Sust { .. } | TexKind::Sured { .. } => {
                    ObjKind::Surface
                }
                TexKind::Query { surface: true, .. } => ObjKind::Surface,
                _ => ObjKind::Texture,
            };
            if d.kind != need {
                return Err(FaultKind::Other(format!(
                    "handle {h:#x} is a {:?} object; this instruction needs a {need:?} object",
                    d.kind
                )));
            }
            if t.dims != 0 && t.dims as u32 != d.dims {
                return Err(FaultKind::Other(format!(
                    "handle {h:#x} is a {}D object; the instruction's geometry is .{}d",
                    d.dims, t.dims
                )));
            }
            match t.kind {
                TexKind::Suld { .. } | TexKind::Sust { .. } | TexKind::Sured { .. } => {
                    self.surface_lane(ctx, wi, l, t, &d)?
                }
                TexKind::Query { attr, .. } => {
                    let v = match attr {
                        TexAttr::Width => d.extent[0],
                        TexAttr::Height => d.extent[1],
                        TexAttr::Depth => d.extent[2],
                        TexAttr::NormalizedCoords => d.normalized as u32,
                        TexAttr::FilterMode => (d.filter == Filter::Linear) as u32,
                        TexAttr::AddrMode(i) => d.addr_mode[i as usize].txq_value(),
                    };
                    self.warps[wi].regs[t.vals[0] as usize][l] = v as u64;
                }
                TexKind::Tex { ret, fcoord } => {
                    let v = self.tex_lane(ctx, (wi, l), t, &d, (ret, fcoord))?;
                    self.write_texel(wi, l, t, ret, v);
                }
                TexKind::Tld4 { comp, ret, fcoord } => {
                    let v = self.tld4_lane(ctx, wi, l, t, &d, (comp, ret, fcoord))?;
                    self.write_texel(wi, l, t, ret, v);
                }
                TexKind::Istypep(_) => {}
            }
        }
        Ok(Flow::Next)
    }

    /// Reads and decodes the descriptor at handle `h`.
    fn read_desc(
        &self,
        ctx: &LaunchCtx,
        wi: usize,
        l: usize,
        h: u64,
    ) -> Result<TexDesc, FaultKind> {
        let mut raw = [0u8; DESC_BYTES];
        for (k, chunk) in raw.chunks_mut(8).enumerate() {
            let v = self
                .tex_read(ctx, wi, l, h.wrapping_add(8 * k as u64), 8)
                .map_err(|f| {
                    FaultKind::Other(format!(
                        "texture/surface handle {h:#x} does not point at a descriptor: {f}"
                    ))
                })?;
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        TexDesc::decode(&raw)
            .map_err(|e| FaultKind::Other(format!("texture/surface handle {h:#x}: {e}")))
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

    /// One lane of `suld.b`/`sust.b`/`sured.b`: x is in bytes, y and z in rows and slices.
    fn surface_lane(
        &mut self,
        ctx: &LaunchCtx,
        wi: usize,
        l: usize,
        t: &TexOp,
        d: &TexDesc,
    ) -> Result<(), FaultKind> {
        let (elem, oob, name) = match t.kind {
            TexKind::Suld { elem, oob } => (elem, oob, "suld"),
            TexKind::Sust { elem, oob } => (elem, oob, "sust"),
            TexKind::Sured { ty, oob, .. } => (ty.size(), oob, "sured"),
            _ => return Err(misrouted_tex()),
        };
        let access = (elem as usize * t.vals.len()) as i64;
        let row = d.extent[0] as i64 * d.texel_bytes() as i64;
        if access > row {
            return Err(FaultKind::Other(format!(
                "{name}: a {access}-byte access is wider than the surface's {row}-byte rows"
            )));
        }
        let regs = &self.warps[wi].regs;
        let mut c = [0i64; 3];
        for k in 0..t.dims as usize {
            c[k] = regs[t.coords[k] as usize][l] as u32 as i32 as i64;
        }
        let hi = [row - access, d.extent[1] as i64 - 1, d.extent[2] as i64 - 1];
        if (0..3).any(|k| c[k] < 0 || c[k] > hi[k]) {
            match oob {
                Oob::Trap => {
                    return Err(FaultKind::Other(format!(
                        "{name}.trap: surface coordinate ({} bytes, {}, {}) out of range \
                         (rows of {row} bytes, {} rows, {} slices)",
                        c[0], c[1], c[2], d.extent[1], d.extent[2]
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
        let base = d.texel_addr([0, c[1], c[2]], c[0] as u64);
        self.surface_access(ctx, wi, l, t, base, elem)
    }

    /// The memory side of a surface access at `base`, once the coordinate is in range.
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

    /// One texel (indices before addressing; `None` from the addressing mode is border).
    fn texel(
        &self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        d: &TexDesc,
        idx: [i64; 3],
        float: bool,
    ) -> Result<Texel, FaultKind> {
        let mut at = [0i64; 3];
        for k in 0..d.dims as usize {
            match d.address(k, idx[k]) {
                Some(i) => at[k] = i,
                None => return Ok([0.0; 4]),
            }
        }
        let mut v = [0.0, 0.0, 0.0, 1.0];
        let cb = d.format.bytes();
        for (c, slot) in v.iter_mut().enumerate().take(d.channels as usize) {
            let raw = self.tex_read(ctx, wi, l, d.texel_addr(at, (c as u32 * cb) as u64), cb)?;
            *slot = if float {
                d.format.to_float(raw)
            } else {
                raw as f64
            };
        }
        Ok(v)
    }

    /// The coordinate of dimension `k` in texel space (`.s32` coordinates are texel indices,
    /// addressed at the texel's centre).
    fn tex_coord(&self, wi: usize, l: usize, t: &TexOp, d: &TexDesc, k: usize, f: bool) -> f64 {
        let raw = self.warps[wi].regs[t.coords[k] as usize][l] as u32;
        if f {
            d.texel_coord(k, f32::from_bits(raw))
        } else {
            raw as i32 as f64 + 0.5
        }
    }

    /// One lane of `tex`: point sampling or linear filtering.
    fn tex_lane(
        &self,
        ctx: &LaunchCtx,
        (wi, l): (usize, usize),
        t: &TexOp,
        d: &TexDesc,
        (ret, fcoord): (TexRet, bool),
    ) -> Result<Texel, FaultKind> {
        let float = ret == TexRet::F32;
        check_ret(d, float)?;
        let dims = d.dims as usize;
        let u: Vec<f64> = (0..dims)
            .map(|k| self.tex_coord(wi, l, t, d, k, fcoord))
            .collect();
        if d.filter == Filter::Point {
            let mut idx = [0i64; 3];
            for k in 0..dims {
                idx[k] = u[k].floor() as i64;
            }
            return self.texel(ctx, (wi, l), d, idx, float);
        }
        if !float {
            return Err(FaultKind::Other(
                "tex: linear filtering needs an .f32 fetch".into(),
            ));
        }
        let lw: Vec<(i64, f64)> = u.iter().map(|&x| linear_weight(x)).collect();
        let mut acc = [0.0f64; 4];
        // corners in order, x fastest: bit k of `corner` takes texel i0 + 1 along dimension k
        for corner in 0..1usize << dims {
            let mut idx = [0i64; 3];
            let mut w = 1.0f64;
            for (k, &(i0, a)) in lw.iter().enumerate() {
                let up = corner >> k & 1 == 1;
                idx[k] = if up { i0.saturating_add(1) } else { i0 };
                w *= if up { a } else { 1.0 - a };
            }
            let v = self.texel(ctx, (wi, l), d, idx, true)?;
            for c in 0..4 {
                acc[c] += w * v[c];
            }
        }
        Ok(acc)
    }

    /// One lane of `tld4`: channel `comp` of the four texels a bilinear fetch would read, in
    /// the order (i0, j1), (i1, j1), (i1, j0), (i0, j0).
    fn tld4_lane(
        &self,
        ctx: &LaunchCtx,
        wi: usize,
        l: usize,
        t: &TexOp,
        d: &TexDesc,
        (comp, ret, fcoord): (u8, TexRet, bool),
    ) -> Result<Texel, FaultKind> {
        let float = ret == TexRet::F32;
        check_ret(d, float)?;
        if d.dims != 2 {
            return Err(FaultKind::Other("tld4 needs a 2D texture object".into()));
        }
        let (i0, _) = linear_weight(self.tex_coord(wi, l, t, d, 0, fcoord));
        let (j0, _) = linear_weight(self.tex_coord(wi, l, t, d, 1, fcoord));
        let (i1, j1) = (i0.saturating_add(1), j0.saturating_add(1));
        let mut out = [0.0; 4];
        for (o, (i, j)) in out.iter_mut().zip([(i0, j1), (i1, j1), (i1, j0), (i0, j0)]) {
            *o = self.texel(ctx, (wi, l), d, [i, j, 0], float)?[comp as usize];
        }
        Ok(out)
    }

    fn write_texel(&mut self, wi: usize, l: usize, t: &TexOp, ret: TexRet, v: Texel) {
        for (d, x) in t.vals.iter().zip(v) {
            let bits = match ret {
                TexRet::F32 => (x as f32).to_bits(),
                TexRet::S32 | TexRet::U32 => x as u32,
            };
            self.warps[wi].regs[*d as usize][l] = bits as u64;
        }
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
        Err(FaultKind::Other(format!(
            "a {} fetch cannot read a {:?} texture",
            if float { ".f32" } else { "integer" },
            d.format
        )))
    }
}

fn misrouted_tex() -> FaultKind {
    FaultKind::Other("texture executor reached an arm its op kind does not take".into())
}
