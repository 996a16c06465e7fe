//! Operand rules of the Volta `mma.sync.aligned.m8n8k4.alayout.blayout.dtype.f16.f16.ctype`
//! forms, as ptxas 13.5 checks them: one `.row`/`.col` layout for A and one for B, f16 B,
//! f16 or f32 C and D but not an f16 D with an f32 C, no `.satfinite` or rounding modifier;
//! A and B are two `.b32` (f16x2) registers each, C and D four `.b32` (f16) or eight `.f32`.

use super::*;

impl FnCheck<'_> {
    /// Checks an `mma.m8n8k4` with `.f16` A (`tys`: its types, D first).
    pub(super) fn mma_m8n8k4_f16(&mut self, i: &Instruction, tys: &[Ty]) {
        let bad = |s: &mut Self, why: String| s.diag(DiagKind::BadOperand, i.loc, why);
        let layouts = i
            .mods
            .iter()
            .filter(|m| matches!(m, Mod::Flag(Flag::Row | Flag::Col)))
            .count();
        if layouts != 2 {
            bad(
                self,
                "mma.m8n8k4 .f16 needs .alayout.blayout: one of .row/.col for A, then for B".into(),
            );
        }
        let [dt, _, bt, ct] = tys[..] else {
            bad(
                self,
                format!("mma.m8n8k4 needs four types (d, a, b, c), found {}", tys.len()),
            );
            return;
        };
        let acc = |t: Ty| matches!(t, Ty::F16 | Ty::F32);
        if bt != Ty::F16 || !acc(dt) || !acc(ct) {
            bad(
                self,
                format!("mma.m8n8k4 .{dt}.f16.{bt}.{ct}: with .f16 A, B must be .f16 and C, D .f16 or .f32"),
            );
            return;
        }
        if dt == Ty::F16 && ct == Ty::F32 {
            bad(
                self,
                "mma.m8n8k4: .dtype must be .f32 when .ctype is .f32 (.f16.f16.f16.f32 does not exist)".into(),
            );
        }
        if i.has(Flag::Satfinite) {
            bad(self, "mma.m8n8k4 with .f16 inputs takes no .satfinite".into());
        }
        if i.rounding().is_some() {
            bad(self, "mma.m8n8k4 takes no rounding modifier".into());
        }
        let frag = |t: Ty| if t == Ty::F16 { (4, Ty::B32) } else { (8, Ty::F32) };
        let ((nd, dty), (nc, cty)) = (frag(dt), frag(ct));
        let parts = [
            ("D", nd, dty, Role::Dst),
            ("A", 2, Ty::B32, Role::A),
            ("B", 2, Ty::B32, Role::B),
            ("C", nc, cty, Role::C),
        ];
        self.mma_parts(i, "mma .m8n8k4 .f16", parts);
    }
}
