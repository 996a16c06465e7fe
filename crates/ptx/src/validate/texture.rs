//! Operand rules of the texture and surface instructions (`tex`, `tld4`, `txq`, `suld`,
//! `sust`, `sured`, `suq`, `istypep`), read by role: the geometries each opcode takes
//! ([`TexGeom`], as ptxas 13.5 accepts them), the `[object, {coordinates}]` operand with the
//! geometry's coordinate count, `[texture, sampler, {..}]` (a `.samplerref` name only under
//! `texmode_independent`),
//! symbol objects naming a module-scope `.texref`/`.surfref`/`.samplerref` (or a kernel's
//! `.param` of that type) of the right kind,
//! the mipmap operands (`lod`, `dPdx`, `dPdy`), offsets, coordinate and result types, vector
//! widths, query attributes and handle types. Register types of values are left to ptxas's
//! looser rules (any 32-bit register holds an `.f32` texel).

use super::{DiagKind, Diagnostic, FnCheck, Severity};
use crate::ir::{AddrBase, Init, Instruction, Module, Operand};
use crate::isa::Opcode;
use crate::mods::Flag;
use crate::roles::Role;
use crate::texture::{MipMode, TexGeom};
use crate::types::Ty;

/// Whether [`FnCheck::texture`] checks `op`.
pub(super) fn is_texture(op: Opcode) -> bool {
    use Opcode::*;
    matches!(op, Tex | Tld4 | Txq | Suld | Sust | Sured | Suq | Istypep)
}

/// The geometries an opcode takes.
fn geoms(op: Opcode) -> &'static [TexGeom] {
    use TexGeom::*;
    match op {
        Opcode::Tex => TexGeom::ALL,
        Opcode::Tld4 => &[D2, A2d, Cube, Acube],
        Opcode::Suld | Opcode::Sust => &[D1, D2, D3, A1d, A2d],
        _ => &[D1, D2, D3],
    }
}

/// Module-scope declarations: a `.texref`/`.samplerref` initialiser's fields
/// ([`crate::texture::ref_fields`]), field initialisers only on those, and `.samplerref`
/// variables only under `texmode_independent` (ptxas rejects them in unified mode).
pub(super) fn ref_decls(m: &Module) -> Vec<Diagnostic> {
    let independent = m.target.options.iter().any(|o| o == "texmode_independent");
    let mut out = Vec::new();
    for v in m.globals() {
        let is_ref = matches!(v.ty, Ty::Texref | Ty::Samplerref | Ty::Surfref);
        let fields = v
            .init
            .iter()
            .flatten()
            .any(|i| matches!(i, Init::Field { .. }));
        let why = if v.ty == Ty::Samplerref && !independent {
            let m = format!(
                "`{}`: .samplerref needs .target texmode_independent",
                v.name
            );
            Some((Severity::Error, m))
        } else if is_ref {
            crate::texture::ref_fields(v).err().map(|e| {
                let sev = if e.ptxas_rejects {
                    Severity::Error
                } else {
                    Severity::Warning
                };
                (sev, e.message)
            })
        } else if fields {
            let m = format!(
                "`{}`: `field = value` initialisers are for .texref/.samplerref",
                v.name
            );
            Some((Severity::Error, m))
        } else {
            None
        };
        out.extend(why.map(|(severity, message)| Diagnostic {
            severity,
            kind: DiagKind::BadOperand,
            line: v.loc.line,
            col: v.loc.col,
            function: None,
            message,
            rust: None,
        }));
    }
    out
}

fn width(o: &Operand) -> usize {
    match o {
        Operand::Vec(v) => v.len(),
        Operand::Pair(v, _) => width(v),
        _ => 1,
    }
}

impl FnCheck<'_> {
    pub(super) fn texture(&mut self, i: &Instruction) {
        use Opcode::*;
        match i.op {
            Txq | Suq => self.tex_query(i),
            Istypep => {
                if !matches!(i.ty(), Some(Ty::Texref | Ty::Samplerref | Ty::Surfref)) {
                    self.tex_bad(i, "istypep needs .texref, .samplerref or .surfref".into());
                }
            }
            _ => self.tex_access(i),
        }
    }

    fn tex_bad(&mut self, i: &Instruction, why: String) {
        self.diag(DiagKind::BadOperand, i.loc, why);
    }

    /// The type of `name` if it is a `.param` parameter of the function (a kernel's
    /// `.param .texref t`) or else a module-scope variable.
    fn module_var_ty(&self, name: &str) -> Option<Ty> {
        let param = self.f.params.iter().find(|p| p.name == name);
        match param {
            Some(p) => Some(p.ty),
            None => self.m.globals().find(|v| v.name == name).map(|v| v.ty),
        }
    }

    /// A symbol used as a texture/surface/sampler object must be a variable of type `want`.
    fn tex_object(&mut self, i: &Instruction, base: &AddrBase, want: &[Ty], what: &str) {
        match base {
            AddrBase::Sym(n) => {
                let ty = self.module_var_ty(n);
                if !ty.is_some_and(|t| want.contains(&t)) {
                    let kinds: Vec<String> = want.iter().map(|t| format!(".{t}")).collect();
                    let why = format!(
                        "`{}`: {what} `{n}` is not a module-scope {} variable or parameter",
                        i.op.name(),
                        kinds.join(" or ")
                    );
                    self.tex_bad(i, why);
                }
            }
            AddrBase::Imm(_) => {
                let why = format!("`{}`: the {what} must be a register or a name", i.op.name());
                self.tex_bad(i, why);
            }
            AddrBase::Reg(_) => {}
        }
    }

    fn tex_query(&mut self, i: &Instruction) {
        let surface = i.op == Opcode::Suq;
        let name = i.op.name();
        match i.tex_query() {
            Some(q) if q.allowed(surface) => {}
            Some(_) => self.tex_bad(i, format!("`{name}` does not take this query attribute")),
            None => self.tex_bad(i, format!("`{name}` needs a query attribute (.width, ...)")),
        }
        if i.has(Flag::Level) {
            let extent = matches!(
                i.tex_query(),
                Some(crate::texture::TexQuery::Width)
                    | Some(crate::texture::TexQuery::Height)
                    | Some(crate::texture::TexQuery::Depth)
            );
            if surface || !extent {
                self.tex_bad(
                    i,
                    "`.level` queries .width, .height or .depth of a texture".into(),
                );
            }
        }
        let want: &[Ty] = if surface {
            &[Ty::Surfref]
        } else {
            &[Ty::Texref, Ty::Samplerref]
        };
        match i.operand(Role::Addr) {
            Some(Operand::Addr { base, offset: 0 }) => self.tex_object(i, base, want, "object"),
            Some(Operand::Reg(_)) => {}
            _ => self.tex_bad(i, format!("`{name}` takes its object as `[handle]`")),
        }
    }

    /// `tex`, `tld4`, `suld`, `sust`, `sured`.
    fn tex_access(&mut self, i: &Instruction) {
        let name = i.op.name();
        let Some(geom) = i.tex_geom().filter(|g| geoms(i.op).contains(g)) else {
            let allowed: Vec<String> = geoms(i.op).iter().map(|g| format!(".{g}")).collect();
            let why = format!("`{name}` needs a geometry: one of {}", allowed.join(", "));
            return self.tex_bad(i, why);
        };
        let surface = matches!(i.op, Opcode::Suld | Opcode::Sust | Opcode::Sured);
        let independent = self
            .m
            .target
            .options
            .iter()
            .any(|o| o == "texmode_independent");
        let want = if surface { Ty::Surfref } else { Ty::Texref };
        let coords = match i.operand(Role::Addr) {
            Some(Operand::TensorAddr { base, coords }) => {
                if independent && !surface && !matches!(base, AddrBase::Reg(_)) {
                    let why = format!("`{name}` under texmode_independent needs a sampler");
                    self.tex_bad(i, why);
                }
                self.tex_object(i, base, &[want], "object");
                Some(coords)
            }
            Some(Operand::SampledAddr {
                base,
                sampler,
                coords,
            }) if !surface => {
                if !independent && !matches!(sampler, AddrBase::Reg(_)) {
                    let why = format!("`{name}`: a .samplerref needs .target texmode_independent");
                    self.tex_bad(i, why);
                }
                self.tex_object(i, base, &[want], "texture");
                self.tex_object(i, sampler, &[Ty::Samplerref], "sampler");
                Some(coords)
            }
            _ => None,
        };
        let n = geom.coord_len();
        if coords.is_none_or(|c| c.len() != n) {
            let why = format!("`{name}.{geom}` takes `[object, {{{n} coordinates}}]`");
            self.tex_bad(i, why);
        }
        if surface {
            self.surface_form(i);
        } else {
            self.fetch_form(i, geom);
        }
    }

    fn surface_form(&mut self, i: &Instruction) {
        let name = i.op.name();
        let ty = i.last_ty();
        if i.has(Flag::P) {
            let ok = match i.op {
                Opcode::Sust => ty == Some(Ty::B32),
                Opcode::Sured => matches!(ty, Some(Ty::B32 | Ty::B64)),
                _ => false,
            };
            if !ok {
                let why = format!("`{name}.p` is sust.p (.b32) or sured.p (.b32/.b64)");
                self.tex_bad(i, why);
            }
            if ty == Some(Ty::B64) && !(i.has(Flag::Min) || i.has(Flag::Max)) {
                self.tex_bad(i, "`sured.p.b64` takes .min or .max".into());
            }
        } else if !i.has(Flag::B) {
            self.tex_bad(i, format!("`{name}` needs .b (or .p)"));
        }
        let oob = [Flag::Trap, Flag::Clamp, Flag::Zero];
        if oob.iter().filter(|f| i.has(**f)).count() > 1 {
            self.tex_bad(i, format!("`{name}`: one of .trap, .clamp, .zero"));
        }
        let (role, n) = match i.op {
            Opcode::Suld => (Role::Dst, i.vec_width().unwrap_or(1) as usize),
            Opcode::Sust => (Role::Src, i.vec_width().unwrap_or(1) as usize),
            _ => (Role::Src, 1),
        };
        if let Some(v) = i.operand(role) {
            if width(v) != n {
                let why = format!("`{name}` moves {n} values, the operand has {}", width(v));
                self.diag(DiagKind::VectorWidth, i.loc, why);
            }
        }
    }

    fn fetch_form(&mut self, i: &Instruction, geom: TexGeom) {
        let name = i.op.name();
        let mut tys = i.types();
        let (dty, cty) = (tys.next(), tys.next());
        let f16x2 = dty == Some(Ty::F16x2) && i.op == Opcode::Tex;
        let dty_ok = f16x2 || matches!(dty, Some(Ty::F32 | Ty::S32 | Ty::U32));
        let cty_ok = match cty {
            Some(Ty::F32) => !geom.is_ms(),
            Some(Ty::S32) => !geom.is_cube() && i.op == Opcode::Tex,
            _ => false,
        };
        if !dty_ok || !cty_ok {
            let why = format!(
                "`{name}.{geom}` types: .dtype .f32/.s32/.u32 (.f16x2 with .v2), .ctype .f32 \
                 (or .s32: not .cube/.acube, required by .2dms/.a2dms; tld4 takes .f32)"
            );
            self.tex_bad(i, why);
        }
        let vec = if f16x2 { 2 } else { 4 };
        if i.vec_width() != Some(vec) {
            self.tex_bad(i, format!("`{name}` returns .v{vec}"));
        }
        if let Some(d) = i.operand(Role::Dst) {
            if width(d) != vec as usize {
                let why = format!("`{name}` moves {vec} values, the operand has {}", width(d));
                self.diag(DiagKind::VectorWidth, i.loc, why);
            }
        }
        self.mip_form(i, geom);
        self.depth_form(i, geom, cty);
        if let Some(e) = i.operand(Role::TexOffset) {
            if width(e) != geom.offset_len() || !matches!(e, Operand::Vec(_)) {
                let why = format!(
                    "`{name}`: the offset `e` is {} .s32 values",
                    geom.offset_len()
                );
                self.tex_bad(i, why);
            }
        }
    }

    /// The depth-compare operand `f`: not on `.3d`; a register of the coordinate type (ptxas
    /// 13.5 types it so: `.f32`, or `.s32`, where it compiles to TLD and is dropped).
    fn depth_form(&mut self, i: &Instruction, geom: TexGeom, cty: Option<Ty>) {
        let Some(f) = i.operand(Role::DepthCompare) else {
            return;
        };
        let name = i.op.name();
        if geom == TexGeom::D3 {
            return self.tex_bad(i, format!("`{name}.3d` takes no depth-compare operand"));
        }
        let ty = match f {
            Operand::Reg(r) => self.lookup(r).map(|r| r.ty),
            _ => None,
        };
        let float_reg = matches!(ty, Some(Ty::F32));
        let int_reg = matches!(ty, Some(Ty::B32 | Ty::S32 | Ty::U32));
        let ok = match cty {
            Some(Ty::S32) => int_reg,
            _ => float_reg || int_reg || matches!(f, Operand::Imm(_)),
        };
        if !ok {
            let why = format!("`{name}`: the depth-compare operand `f` is a 32-bit register of the coordinate type");
            self.tex_bad(i, why);
        }
    }

    fn mip_form(&mut self, i: &Instruction, geom: TexGeom) {
        let name = i.op.name();
        let mode = i.mip_mode();
        if mode == MipMode::Implicit {
            return;
        }
        if i.op != Opcode::Tex || geom.is_ms() {
            let why = format!("`{name}.{geom}` takes no .base/.level/.grad");
            return self.tex_bad(i, why);
        }
        let flags = [Flag::Base, Flag::Level, Flag::Grad];
        if flags.iter().filter(|f| i.has(**f)).count() > 1 {
            return self.tex_bad(i, "`tex`: one of .base, .level, .grad".into());
        }
        if mode == MipMode::Grad {
            for r in [Role::Dpdx, Role::Dpdy] {
                let ok = i
                    .operand(r)
                    .is_some_and(|o| matches!(o, Operand::Vec(_)) && width(o) == geom.grad_len());
                if !ok {
                    let n = geom.grad_len();
                    self.tex_bad(i, format!("`tex.grad.{geom}`: `{r}` is {n} .f32 values"));
                }
            }
        }
    }
}
