//! Decoding of the texture and surface family (unified mode: the object is a `.u64` handle in a
//! register): `suld.b`, `sust.b`, `sured.b`, `suq`, `tex`, `tld4`, `txq`, `istypep`. Each
//! becomes one [`Op::Texture`]; `exec/tex.rs` reads the descriptor ([`crate::texture`]) when it
//! runs. `.texref`/`.surfref` module variables and `suld.p`/`sust.p` are refused with an error
//! naming them; array and cube geometries, `tex.level`/`tex.grad` and mipmaps do not parse.

use super::*;

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
}

/// A `txq`/`suq` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TexAttr {
    Width,
    Height,
    Depth,
    NormalizedCoords,
    FilterMode,
    AddrMode(u8),
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
    Sured {
        op: AtomOp,
        ty: Ty,
        oob: Oob,
    },
    /// `suq` (surface) or `txq` (texture).
    Query {
        attr: TexAttr,
        surface: bool,
    },
    /// `tex`; `fcoord`: the coordinates are `.f32` (else `.s32`).
    Tex {
        ret: TexRet,
        fcoord: bool,
    },
    /// `tld4.{r,g,b,a}`: `comp` is the channel gathered.
    Tld4 {
        comp: u8,
        ret: TexRet,
        fcoord: bool,
    },
    /// `istypep.texref` (`Some(Texture)`), `.surfref` (`Some(Surface)`), `.samplerref` (`None`).
    Istypep(Option<crate::texture::ObjKind>),
}

/// A decoded texture/surface instruction.
#[derive(Clone, Debug)]
pub struct TexOp {
    pub kind: TexKind,
    /// Register holding the object handle.
    pub handle: u32,
    /// Geometry (1..3) and coordinate slots (`ZERO` beyond `dims`).
    pub dims: u8,
    pub coords: [u32; 3],
    /// Destinations (loads, queries, fetches) or sources (stores, the reduction operand).
    pub vals: Vec<u32>,
}

impl TexOp {
    /// Whether it writes memory (progress another warp could observe).
    pub fn writes(&self) -> bool {
        matches!(self.kind, TexKind::Sust { .. } | TexKind::Sured { .. })
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
            O::Suq | O::Txq => {
                let attr = tex_attr(ins).ok_or_else(|| self.err(ins, "unsupported query"))?;
                let extent = matches!(attr, TexAttr::Width | TexAttr::Height | TexAttr::Depth);
                if ins.op == O::Suq && !extent {
                    return Err(self.err(ins, "suq queries .width, .height or .depth"));
                }
                let d = self.dst(ins, arg(Role::Dst)?)?;
                let handle = self.handle(ins, arg(Role::Addr)?)?;
                TexOp {
                    kind: TexKind::Query {
                        attr,
                        surface: ins.op == O::Suq,
                    },
                    handle,
                    dims: 0,
                    coords: [ZERO; 3],
                    vals: vec![d],
                }
            }
            O::Tex | O::Tld4 => self.decode_fetch(ins)?,
            O::Istypep => {
                use crate::texture::ObjKind;
                let kind = match ins.ty() {
                    Some(Ty::Texref) => Some(ObjKind::Texture),
                    Some(Ty::Surfref) => Some(ObjKind::Surface),
                    Some(Ty::Samplerref) => None,
                    _ => {
                        return Err(self.err(ins, "istypep needs .texref, .samplerref or .surfref"))
                    }
                };
                let d = self.dst(ins, arg(Role::Dst)?)?;
                let handle = self.src(ins, arg(Role::A)?)?;
                TexOp {
                    kind: TexKind::Istypep(kind),
                    handle,
                    dims: 0,
                    coords: [ZERO; 3],
                    vals: vec![d],
                }
            }
            _ => return Err(misrouted(self, ins)),
        };
        self.push(Op::Texture(Box::new(op)), ins0, guard);
        Ok(())
    }

    /// The handle register of `[h]` or `[h, {coords}]`.
    fn handle(&mut self, ins: &Instruction, o: &Operand) -> Result<u32, EmuError> {
        let base = match o {
            Operand::Addr { base, offset: 0 } | Operand::TensorAddr { base, .. } => base,
            Operand::Reg(_) => return self.src(ins, o),
            _ => return Err(self.err(ins, "expected [handle] or [handle, {coords}]")),
        };
        match base {
            AddrBase::Reg(r) => self
                .lookup(r)
                .ok_or_else(|| self.err(ins, format!("undeclared register `{r}`"))),
            AddrBase::Sym(n) => Err(self.err(
                ins,
                format!(
                    "`{n}`: .texref/.surfref variables are not supported by the emulator; \
                     pass texture and surface objects as .u64 handles"
                ),
            )),
            AddrBase::Imm(_) => Err(self.err(ins, "a texture/surface handle must be a register")),
        }
    }

    /// Handle, geometry and coordinate slots of `[h, {c..}]`.
    fn tex_coords(
        &mut self,
        ins: &Instruction,
        o: &Operand,
    ) -> Result<(u32, u8, [u32; 3]), EmuError> {
        let dims = ins
            .mods
            .iter()
            .find_map(|m| match m {
                Mod::Dim(d @ 1..=3) => Some(*d),
                _ => None,
            })
            .ok_or_else(|| self.err(ins, "only the .1d, .2d and .3d geometries are supported"))?;
        let Operand::TensorAddr { coords, .. } = o else {
            return Err(self.err(ins, "expected [handle, {coordinates}]"));
        };
        if coords.len() < dims as usize {
            return Err(self.err(ins, format!("{dims}d needs {dims} coordinates")));
        }
        let handle = self.handle(ins, o)?;
        let mut cs = [ZERO; 3];
        for (k, c) in coords.iter().take(dims as usize).enumerate() {
            cs[k] = self.src(ins, c)?;
        }
        Ok((handle, dims, cs))
    }

    fn decode_surface(&mut self, ins: &Instruction) -> Result<TexOp, EmuError> {
        if !ins.has(Flag::B) {
            return Err(self.err(
                ins,
                "only .b (byte-addressed) surface accesses are supported",
            ));
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
        let (handle, dims, coords) = self.tex_coords(ins, role(self.f, ins, Role::Addr)?)?;
        let vo = role(self.f, ins, value)?;
        let (kind, vals) = match ins.op {
            Opcode::Suld => {
                let ds = self.vec_dsts(ins, vo)?;
                (
                    TexKind::Suld {
                        elem: ty.size(),
                        oob,
                    },
                    ds,
                )
            }
            Opcode::Sust => {
                let ss = self.vec_srcs(ins, vo)?;
                (
                    TexKind::Sust {
                        elem: ty.size(),
                        oob,
                    },
                    ss,
                )
            }
            _ => {
                let op = [
                    (Flag::Add, AtomOp::Add),
                    (Flag::Min, AtomOp::Min),
                    (Flag::Max, AtomOp::Max),
                    (Flag::And, AtomOp::And),
                    (Flag::Or, AtomOp::Or),
                ]
                .into_iter()
                .find(|(f, _)| ins.has(*f))
                .map(|(_, o)| o)
                .ok_or_else(|| self.err(ins, "sured needs .add, .min, .max, .and or .or"))?;
                let s = self.src(ins, vo)?;
                (TexKind::Sured { op, ty, oob }, vec![s])
            }
        };
        Ok(TexOp {
            kind,
            handle,
            dims,
            coords,
            vals,
        })
    }

    fn decode_fetch(&mut self, ins: &Instruction) -> Result<TexOp, EmuError> {
        let mut tys = ins.types();
        let ret = match tys.next() {
            Some(Ty::F32) => TexRet::F32,
            Some(Ty::S32) => TexRet::S32,
            Some(Ty::U32) => TexRet::U32,
            _ => return Err(self.err(ins, "texture fetches return .f32, .s32 or .u32")),
        };
        let fcoord = match tys.next() {
            Some(Ty::F32) => true,
            Some(Ty::S32) => false,
            _ => return Err(self.err(ins, "texture coordinates are .f32 or .s32")),
        };
        if ins.vec_width() != Some(4) {
            return Err(self.err(ins, "texture fetches return .v4"));
        }
        let (handle, dims, coords) = self.tex_coords(ins, role(self.f, ins, Role::Addr)?)?;
        let vals = self.vec_dsts(ins, role(self.f, ins, Role::Dst)?)?;
        if vals.len() != 4 {
            return Err(self.err(ins, "texture fetches write four registers"));
        }
        let kind = if ins.op == Opcode::Tld4 {
            let comp = [Flag::R, Flag::G, Flag::B, Flag::A]
                .iter()
                .position(|f| ins.has(*f))
                .ok_or_else(|| self.err(ins, "tld4 needs .r, .g, .b or .a"))?;
            if dims != 2 {
                return Err(self.err(ins, "tld4 gathers from 2d textures only"));
            }
            TexKind::Tld4 {
                comp: comp as u8,
                ret,
                fcoord,
            }
        } else {
            TexKind::Tex { ret, fcoord }
        };
        Ok(TexOp {
            kind,
            handle,
            dims,
            coords,
            vals,
        })
    }
}

fn tex_attr(ins: &Instruction) -> Option<TexAttr> {
    [
        (Flag::Width, TexAttr::Width),
        (Flag::Height, TexAttr::Height),
        (Flag::Depth, TexAttr::Depth),
        (Flag::NormalizedCoords, TexAttr::NormalizedCoords),
        (Flag::FilterMode, TexAttr::FilterMode),
        (Flag::AddrMode0, TexAttr::AddrMode(0)),
        (Flag::AddrMode1, TexAttr::AddrMode(1)),
        (Flag::AddrMode2, TexAttr::AddrMode(2)),
    ]
    .into_iter()
    .find(|(f, _)| ins.has(*f))
    .map(|(_, a)| a)
}
