//! Operand rules of the Volta `mma.sync.aligned.m8n8k4.alayout.blayout.dtype.f16.f16.ctype`
//! forms, as ptxas 13.5 checks them: `.sync.aligned`, one `.row`/`.col` layout for A and one
//! for B, f16 B, f16 or f32 C and D but not an f16 D with an f32 C, no `.satfinite` or rounding
//! modifier; A and B are two `.b32` (f16x2) registers each, C and D four `.b32` (f16) or eight
//! `.f32`.
//!
//! ptxas 13.5 also accepts `mma.sync.aligned.m8n8k4.alayout.blayout.f32.bf16.bf16.f32` on
//! sm_80 and later (PTX 7.0+), a form the PTX ISA does not document and for which it emits no
//! arithmetic (the D registers are stored unwritten in SASS); it is accepted here with a
//! warning, and the emulator refuses to run it.

use super::*;

impl FnCheck<'_> {
    /// Checks an `mma.m8n8k4` whose A is not `.f64` (`tys`: its types, D first).
    pub(super) fn mma_m8n8k4(&mut self, i: &Instruction, tys: &[Ty]) {
        let bad = |s: &mut Self, why: String| s.diag(DiagKind::BadOperand, i.loc, why);
        let layouts = i
            .mods
            .iter()
            .filter(|m| matches!(m, Mod::Flag(Flag::Row | Flag::Col)))
            .count();
        if !(i.has(Flag::Sync) && i.has(Flag::Aligned)) {
            bad(self, "mma.m8n8k4 needs .sync.aligned".into());
        }
        if layouts != 2 {
            bad(
                self,
                "mma.m8n8k4 .f16 needs .alayout.blayout: one of .row/.col for A, then for B".into(),
            );
        }
        let [dt, at, bt, ct] = tys[..] else {
            bad(
                self,
                format!(
                    "mma.m8n8k4 needs four types (d, a, b, c), found {}",
                    tys.len()
                ),
            );
            return;
        };
        if at == Ty::Bf16 {
            return self.mma_m8n8k4_bf16(i, [dt, bt, ct]);
        }
        if at != Ty::F16 {
            bad(
                self,
                format!("mma.m8n8k4 takes .f16 (Volta) or .f64 A and B, found .{at}"),
            );
            return;
        }
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
            bad(
                self,
                "mma.m8n8k4 with .f16 inputs takes no .satfinite".into(),
            );
        }
        if i.rounding().is_some() {
            bad(self, "mma.m8n8k4 takes no rounding modifier".into());
        }
        let frag = |t: Ty| {
            if t == Ty::F16 {
                (4, Ty::B32)
            } else {
                (8, Ty::F32)
            }
        };
        let ((nd, dty), (nc, cty)) = (frag(dt), frag(ct));
        let parts = [
            ("D", nd, dty, Role::Dst),
            ("A", 2, Ty::B32, Role::A),
            ("B", 2, Ty::B32, Role::B),
            ("C", nc, cty, Role::C),
        ];
        self.mma_parts(i, "mma .m8n8k4 .f16", parts);
    }

    /// The undocumented `.f32.bf16.bf16.f32` form (module docs): a warning; other `.bf16`
    /// combinations are errors, as in ptxas.
    fn mma_m8n8k4_bf16(&mut self, i: &Instruction, [dt, bt, ct]: [Ty; 3]) {
        if (dt, bt, ct) != (Ty::F32, Ty::Bf16, Ty::F32) {
            let why = format!(
                "mma.m8n8k4 .{dt}.bf16.{bt}.{ct}: with .bf16 A only .f32.bf16.bf16.f32 assembles"
            );
            self.diag(DiagKind::BadOperand, i.loc, why);
            return;
        }
        self.diags.push(Diagnostic {
            severity: Severity::Warning,
            kind: DiagKind::BadOperand,
            line: i.loc.line,
            col: i.loc.col,
            function: Some(self.f.name.clone()),
            message: "mma.m8n8k4 .f32.bf16.bf16.f32 is not in the PTX ISA: ptxas 13.5 accepts it \
                      but emits no arithmetic for it, and the emulator does not run it"
                .into(),
            rust: i.loc.rust_location(),
        });
        let parts = [
            ("D", 8, Ty::F32, Role::Dst),
            ("A", 2, Ty::B32, Role::A),
            ("B", 2, Ty::B32, Role::B),
            ("C", 8, Ty::F32, Role::C),
        ];
        self.mma_parts(i, "mma .m8n8k4 .bf16", parts);
    }
}
