//! Decoding of the texture and surface family: `suld.b`, `sust.b`, `sust.p`, `sured.b`,
//! `sured.p`, `suq`, `tex` (with `.base`/`.level`/`.grad`), `tld4`, `txq` (with `.level`),
//! `istypep`, in every geometry ([`TexGeom`]). The object is a `.u64` handle in a register
//! (unified mode), the name of a module-scope `.texref`/`.surfref` variable (its descriptor
//! slot's address; `LoadedModule::bind_texref` fills it) or of a kernel's `.param .texref`
//! (loaded: it holds a handle), or `[texture, sampler, {..}]`
//! (independent mode: the sampler a `.samplerref` name or a handle register). Operands are read
//! by role. Each instruction becomes one [`Op::Texture`]; `exec/tex.rs` reads the descriptor
//! ([`crate::texture`]) when it runs. The depth-compare operand `f` is read on `.f32`-coordinate
//! fetches (ptxas drops it from `.s32`-coordinate ones).

use super::*;
pub use ptx::texture::{TexGeom, TexQuery};

/// What a surface access does with an out-of-range coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Oob {
    Trap,
    Clamp,
    Zero,
}

/// The register type a texture fetch returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TexRet {
    F32,
    S32,
    U32,
    /// `.v2.f16x2`: the four channels as two packed f16 pairs.
    F16x2,
}

/// The attribute a `txq`/`suq` reads (the old name of [`TexQuery`]).
pub type TexAttr = TexQuery;

/// How a `tex` picks its mipmap level: register slots of `lod`, or of `dPdx` and `dPdy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mip {
    Base,
    Level(u32),
    Grad([[u32; 3]; 2]),
}

/// The operation of an [`Op::Texture`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TexKind {
    /// `suld.b`: `elem` bytes per vector element.
    Suld {
        elem: u32,
        oob: Oob,
    },
    Sust {
        elem: u32,
        oob: Oob,
    },
    /// `sust.p`: formatted store of 32-bit values, x in texels.
    SustP {
        oob: Oob,
    },
    Sured {
        op: AtomOp,
        ty: Ty,
        oob: Oob,
    },
    /// `sured.p`: x in texels, the operation on channel 0 of a 32-bit (`.b32`: `U32`/`S32`)
    /// or 64-bit (`wide`, `.b64`: `U64`/`S64`) integer surface, signed as its format is.
    SuredP {
        op: AtomOp,
        oob: Oob,
        wide: bool,
    },
    /// `suq` (surface) or `txq` (texture); `level`: the `txq.level` operand's slot.
    Query {
        attr: TexQuery,
        surface: bool,
        level: Option<u32>,
    },
    /// `tex`; `fcoord`: the coordinates are `.f32` (else `.s32`).
    Tex {
        ret: TexRet,
        fcoord: bool,
        mip: Mip,
    },
    /// `tld4.{r,g,b,a}`: `comp` is the channel gathered.
    Tld4 {
        comp: u8,
        ret: TexRet,
    },
    /// `istypep.texref` (`Some(Texture)`), `.surfref`, `.samplerref`.
    Istypep(crate::texture::ObjKind),
}

/// A decoded texture/surface instruction.
#[derive(Clone, Debug)]
pub struct TexOp {
    pub kind: TexKind,
    /// Register holding the object handle.
    pub handle: u32,
    /// Register holding an independent-mode sampler handle.
    pub sampler: Option<u32>,
    /// The geometry (`None` for queries and `istypep`).
    pub geom: Option<TexGeom>,
    /// The coordinate vector as written ([`TexGeom::coord_len`] used, `ZERO` beyond).
    pub coords: [u32; 4],
    /// Texel offsets (`e`), one per spatial dimension.
    pub offset: Option<[u32; 3]>,
    /// Destinations (loads, queries, fetches) or sources (stores, the reduction operand).
    pub vals: Vec<u32>,
    /// Register holding the depth-compare reference `f` of a `.f32`-coordinate fetch (an
    /// `.s32`-coordinate fetch ignores `f`, as ptxas 13.5 does: it compiles to TLD, which has
    /// no depth compare).
    pub depth: Option<u32>,
    /// The residency predicate `p` of `d|p` (always true: all memory is resident).
    pub pred: Option<u32>,
    /// The `.texref`/`.surfref`/`.samplerref` names the object and sampler came from, for
    /// the error an unbound one raises.
    pub names: [Option<String>; 2],
}

impl TexOp {
    /// Whether it writes memory (progress another warp could observe).
    pub fn writes(&self) -> bool {
        matches!(
            self.kind,
            TexKind::Sust { .. }
                | TexKind::SustP { .. }
                | TexKind::Sured { .. }
                | TexKind::SuredP { .. }
        )
    }

    fn new(kind: TexKind, handle: (u32, Option<String>), vals: Vec<u32>) -> TexOp {
        TexOp {
            kind,
            handle: handle.0,
            sampler: None,
            geom: None,
            coords: [ZERO; 4],
            offset: None,
            vals,
            depth: None,
            pred: None,
            names: [handle.1, None],
        }
    }
}

impl Decoder<'_> {
    /// Decodes one instruction of the texture family: the opcodes [`family`] sends here.
    pub(super) fn decode_tex(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        use Opcode as O;
        let op = match ins.op {
            O::Suld | O::Sust | O::Sured => self.decode_surface(ins)?,
            O::Suq | O::Txq => self.decode_query(ins)?,
            O::Tex | O::Tld4 => self.decode_fetch(ins)?,
            O::Istypep => {
                use crate::texture::ObjKind;
                let kind = match ins.ty() {
                    Some(Ty::Texref) => ObjKind::Texture,
                    Some(Ty::Surfref) => ObjKind::Surface,
                    Some(Ty::Samplerref) => ObjKind::Sampler,
                    _ => {
                        return Err(self.err(ins, "istypep needs .texref, .samplerref or .surfref"))
                    }
                };
                let d = self.dst(ins, arg(Role::Dst)?)?;
                let handle = self.src(ins, arg(Role::A)?)?;
                TexOp::new(TexKind::Istypep(kind), (handle, None), vec![d])
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(Op::Texture(Box::new(op)), ins0, guard);
        Ok(())
    }

    fn decode_query(&mut self, ins: &Instruction) -> Result<TexOp, EmuError> {
        let surface = ins.op == Opcode::Suq;
        let attr = ins
            .tex_query()
            .filter(|q| q.allowed(surface))
            .ok_or_else(|| self.err(ins, "unsupported query attribute"))?;
        let d = self.dst(ins, role(self.f, ins, Role::Dst)?)?;
        let handle = self.handle(ins, role(self.f, ins, Role::Addr)?)?;
        let level = match ins.operand(Role::Lod) {
            Some(o) => Some(self.src(ins, o)?),
            None => None,
        };
        let kind = TexKind::Query {
            attr,
            surface,
            level,
        };
        Ok(TexOp::new(kind, handle, vec![d]))
    }

    /// The register of an object: a handle register, or a `.texref`/`.surfref`/`.samplerref`
    /// variable's slot address (with its name).
    fn handle_base(
        &mut self,
        ins: &Instruction,
        base: &AddrBase,
    ) -> Result<(u32, Option<String>), EmuError> {
        match base {
            AddrBase::Reg(r) => self
                .lookup(r)
                .map(|s| (s, None))
                .ok_or_else(|| self.err(ins, format!("undeclared register `{r}`"))),
            AddrBase::Sym(n) => {
                let (a, space) = self.sym_value(ins, n)?;
                if space != MSpace::Param {
                    return Ok((self.konst(a), Some(n.clone())));
                }
                // a `.param .texref t` kernel parameter holds the object's handle: load it
                let s = self.new_slot(64);
                let ld = Op::Ld {
                    space,
                    elem: 8,
                    sext: false,
                    ds: vec![s],
                    addr: self.konst(a),
                    off: 0,
                    ord: Ord::Relaxed,
                };
                self.push(ld, ins, (NONE, false));
                Ok((s, Some(n.clone())))
            }
            AddrBase::Imm(_) => Err(self.err(ins, "a texture/surface handle must be a register")),
        }
    }

    /// The object of `[h]`, `h`, `[h, {coords}]` or `[h, s, {coords}]`.
    fn handle(
        &mut self,
        ins: &Instruction,
        o: &Operand,
    ) -> Result<(u32, Option<String>), EmuError> {
        match o {
            Operand::Addr { base, offset: 0 }
            | Operand::TensorAddr { base, .. }
            | Operand::SampledAddr { base, .. } => self.handle_base(ins, base),
            Operand::Reg(_) => Ok((self.src(ins, o)?, None)),
            _ => Err(self.err(ins, "expected [handle] or [handle, {coords}]")),
        }
    }

    /// Geometry, object, sampler and coordinate slots of the `Addr` operand.
    fn tex_coords(&mut self, ins: &Instruction, t: &mut TexOp) -> Result<(), EmuError> {
        let geom = ins
            .tex_geom()
            .ok_or_else(|| self.err(ins, "texture/surface access without a geometry"))?;
        let o = role(self.f, ins, Role::Addr)?;
        let coords = match o {
            Operand::TensorAddr { coords, .. } => coords,
            Operand::SampledAddr {
                sampler, coords, ..
            } => {
                let (s, name) = self.handle_base(ins, sampler)?;
                t.sampler = Some(s);
                t.names[1] = name;
                coords
            }
            _ => return Err(self.err(ins, "expected [handle, {coordinates}]")),
        };
        let n = geom.coord_len();
        if coords.len() != n {
            return Err(self.err(ins, format!(".{geom} takes {n} coordinates")));
        }
        (t.handle, t.names[0]) = self.handle(ins, o)?;
        for (k, c) in coords.iter().enumerate() {
            t.coords[k] = match c {
                Operand::Sink => ZERO,
                c => self.src(ins, c)?,
            };
        }
        t.geom = Some(geom);
        Ok(())
    }

    /// Up to three slots of a `{..}` vector operand (`dPdx`, `dPdy`, `e`).
    fn tex_vec3(&mut self, ins: &Instruction, o: &Operand) -> Result<[u32; 3], EmuError> {
        let mut out = [ZERO; 3];
        let v = self.vec_srcs(ins, o)?;
        for (k, s) in v.into_iter().take(3).enumerate() {
            out[k] = s;
        }
        Ok(out)
    }

    fn decode_surface(&mut self, ins: &Instruction) -> Result<TexOp, EmuError> {
        let p = ins.has(Flag::P);
        if !p && !ins.has(Flag::B) {
            return Err(self.err(ins, "surface accesses are .b or .p"));
        }
        let oob = if ins.has(Flag::Clamp) {
            Oob::Clamp
        } else if ins.has(Flag::Zero) {
            Oob::Zero
        } else {
            Oob::Trap
        };
        let ty = ins
            .last_ty()
            .ok_or_else(|| self.err(ins, "surface access without a type"))?;
        let value = if ins.op == Opcode::Suld {
            Role::Dst
        } else {
            Role::Src
        };
        let vo = role(self.f, ins, value)?;
        let (kind, vals) = match ins.op {
            Opcode::Suld if !p => (
                TexKind::Suld {
                    elem: ty.size(),
                    oob,
                },
                self.vec_dsts(ins, vo)?,
            ),
            Opcode::Sust => {
                let kind = if p {
                    TexKind::SustP { oob }
                } else {
                    TexKind::Sust {
                        elem: ty.size(),
                        oob,
                    }
                };
                (kind, self.vec_srcs(ins, vo)?)
            }
            Opcode::Sured => {
                let op = [Flag::Add, Flag::Min, Flag::Max, Flag::And, Flag::Or]
                    .into_iter()
                    .find_map(|f| ins.has(f).then(|| AtomOp::from_flag(f)).flatten())
                    .ok_or_else(|| self.err(ins, "sured needs .add, .min, .max, .and or .or"))?;
                let minmax = matches!(op, AtomOp::Min | AtomOp::Max);
                let kind = match (p, ty) {
                    (false, _) => TexKind::Sured { op, ty, oob },
                    (true, Ty::B32) => TexKind::SuredP {
                        op,
                        oob,
                        wide: false,
                    },
                    (true, Ty::B64) if minmax => TexKind::SuredP {
                        op,
                        oob,
                        wide: true,
                    },
                    (true, Ty::B64) => {
                        return Err(self.err(ins, "sured.p.b64 takes .min or .max (ptxas 13.5)"))
                    }
                    _ => return Err(self.err(ins, "sured.p is .b32 or .b64")),
                };
                (kind, vec![self.src(ins, vo)?])
            }
            _ => return Err(self.err(ins, "suld.p does not exist (ptxas 13.5)")),
        };
        let mut t = TexOp::new(kind, (ZERO, None), vals);
        self.tex_coords(ins, &mut t)?;
        Ok(t)
    }

    fn decode_fetch(&mut self, ins: &Instruction) -> Result<TexOp, EmuError> {
        let mut tys = ins.types();
        let ret = match tys.next() {
            Some(Ty::F32) => TexRet::F32,
            Some(Ty::S32) => TexRet::S32,
            Some(Ty::U32) => TexRet::U32,
            Some(Ty::F16x2) if ins.op == Opcode::Tex => TexRet::F16x2,
            _ => return Err(self.err(ins, "texture fetches return .f32, .s32, .u32 or .f16x2")),
        };
        let fcoord = match tys.next() {
            Some(Ty::F32) => true,
            Some(Ty::S32) if ins.op == Opcode::Tex => false,
            _ => return Err(self.err(ins, "texture coordinates are .f32 (or .s32 for tex)")),
        };
        let n = if ret == TexRet::F16x2 { 2 } else { 4 };
        let (vals, pred) = match role(self.f, ins, Role::Dst)? {
            Operand::Pair(d, p) => (self.vec_dsts(ins, d)?, Some(self.dst(ins, p)?)),
            d => (self.vec_dsts(ins, d)?, None),
        };
        if vals.len() != n {
            return Err(self.err(ins, format!("this fetch writes {n} registers")));
        }
        let kind = if ins.op == Opcode::Tld4 {
            let comp = [Flag::R, Flag::G, Flag::B, Flag::A]
                .iter()
                .position(|f| ins.has(*f))
                .ok_or_else(|| self.err(ins, "tld4 needs .r, .g, .b or .a"))?;
            TexKind::Tld4 {
                comp: comp as u8,
                ret,
            }
        } else {
            let mip = self.decode_mip(ins)?;
            TexKind::Tex { ret, fcoord, mip }
        };
        let mut t = TexOp::new(kind, (ZERO, None), vals);
        t.pred = pred;
        if let Some(f) = ins.operand(Role::DepthCompare).filter(|_| fcoord) {
            t.depth = Some(self.src(ins, f)?);
        }
        self.tex_coords(ins, &mut t)?;
        if let Some(e) = ins.operand(Role::TexOffset) {
            t.offset = Some(self.tex_vec3(ins, e)?);
        }
        Ok(t)
    }

    fn decode_mip(&mut self, ins: &Instruction) -> Result<Mip, EmuError> {
        use ptx::texture::MipMode;
        Ok(match ins.mip_mode() {
            MipMode::Implicit | MipMode::Base => Mip::Base,
            MipMode::Level => Mip::Level(self.src(ins, role(self.f, ins, Role::Lod)?)?),
            MipMode::Grad => {
                let dx = self.tex_vec3(ins, role(self.f, ins, Role::Dpdx)?)?;
                let dy = self.tex_vec3(ins, role(self.f, ins, Role::Dpdy)?)?;
                Mip::Grad([dx, dy])
            }
        })
    }
}
