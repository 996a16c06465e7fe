//! Operand rules of the texture and surface instructions (`tex`, `tld4`, `txq`, `suld`,
//! `sust`, `sured`, `suq`, `istypep`): a geometry, an `[object, {coordinates}]` operand with one
//! coordinate per dimension (four for `.3d`, the last unused), the vector widths, a query
//! attribute, a handle type. Register types are left to ptxas's looser rules (any 32-bit
//! register holds an `.f32` texel).

use super::{DiagKind, FnCheck};
use crate::ir::{Instruction, Operand};
use crate::isa::Opcode;
use crate::mods::{Flag, Mod};
use crate::types::Ty;

/// Whether [`FnCheck::texture`] checks `op`.
pub(super) fn is_texture(op: Opcode) -> bool {
    use Opcode::*;
    matches!(op, Tex | Tld4 | Txq | Suld | Sust | Sured | Suq | Istypep)
}

fn width(o: &Operand) -> usize {
    match o {
        Operand::Vec(v) => v.len(),
        _ => 1,
    }
}

impl FnCheck<'_> {
    pub(super) fn texture(&mut self, i: &Instruction) {
        use Opcode::*;
        let bad = |s: &mut Self, why: String| s.diag(DiagKind::BadOperand, i.loc, why);
        let name = i.op.name();
        match i.op {
            Txq | Suq => {
                let attrs = [Flag::Width, Flag::Height, Flag::Depth];
                let more = [Flag::NormalizedCoords, Flag::FilterMode, Flag::AddrMode0];
                let more2 = [Flag::AddrMode1, Flag::AddrMode2];
                let ok = attrs.iter().any(|f| i.has(*f))
                    || (i.op == Txq && more.iter().chain(&more2).any(|f| i.has(*f)));
                if !ok {
                    bad(
                        self,
                        format!("`{name}` needs a query attribute (.width, ...)"),
                    );
                }
                if !matches!(i.args.get(1), Some(Operand::Addr { .. } | Operand::Reg(_))) {
                    bad(self, format!("`{name}` takes its object as `[handle]`"));
                }
            }
            Istypep => {
                if !matches!(i.ty(), Some(Ty::Texref | Ty::Samplerref | Ty::Surfref)) {
                    bad(
                        self,
                        "istypep needs .texref, .samplerref or .surfref".into(),
                    );
                }
            }
            _ => {
                let dims = i.mods.iter().find_map(|m| match m {
                    Mod::Dim(d @ 1..=3) => Some(*d as usize),
                    _ => None,
                });
                let Some(dims) = dims else {
                    return bad(self, format!("`{name}` needs a .1d, .2d or .3d geometry"));
                };
                let (addr, val) = if matches!(i.op, Sust | Sured) {
                    (0, 1)
                } else {
                    (1, 0)
                };
                let want = if dims == 3 { 4 } else { dims };
                match i.args.get(addr) {
                    Some(Operand::TensorAddr { coords, .. }) if coords.len() == want => {}
                    _ => bad(
                        self,
                        format!("`{name}.{dims}d` takes `[object, {{{want} coordinates}}]`"),
                    ),
                }
                let n = match i.op {
                    Tex | Tld4 => 4,
                    Sured => 1,
                    _ => i.vec_width().unwrap_or(1) as usize,
                };
                if let Some(v) = i.args.get(val) {
                    if width(v) != n {
                        let why =
                            format!("`{name}` moves {n} values, the operand has {}", width(v));
                        self.diag(DiagKind::VectorWidth, i.loc, why);
                    }
                }
            }
        }
    }
}
