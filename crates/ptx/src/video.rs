//! The video instructions as one typed form: the scalar `vadd vsub vabsdiff vmin vmax vshl vshr
//! vmad vset` and the SIMD `vadd2 .. vset2`, `vadd4 .. vset4`. [`VideoForm::from_instruction`]
//! reads an instruction's types, modifiers and operand selectors (`%r.b1`, `-%r`, `d.h10`) into
//! one value and rejects what the PTX ISA does not allow; the validator reports its errors and the
//! emulator executes the form, so the rules live here once.

use crate::ir::{Instruction, Operand, Sel};
use crate::isa::Opcode;
use crate::mods::Flag;
use crate::roles::Role;
use crate::types::Ty;

/// The primary operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VOp {
    Add,
    Sub,
    Absdiff,
    Min,
    Max,
    /// SIMD only: rounded average.
    Avrg,
    Shl,
    Shr,
    Mad,
    Set,
}

/// The comparison of `vset*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VCmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// The secondary operation with the third operand `c` (scalar `.add/.min/.max`, SIMD `.add`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SecOp {
    Add,
    Min,
    Max,
}

/// A scalar operand part: the whole word, byte `k` or half-word `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    Word,
    Byte(u8),
    Half(u8),
}

/// One video instruction form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VideoForm {
    pub op: VOp,
    /// 1 (scalar), 2 (half-word SIMD) or 4 (byte SIMD).
    pub lanes: u8,
    /// Signedness of d, a and b (`vset*` results are unsigned).
    pub signed: [bool; 3],
    pub sat: bool,
    pub second: Option<SecOp>,
    pub cmp: Option<VCmp>,
    /// `vshl`/`vshr`: `.wrap` (shift count mod 32) rather than `.clamp`.
    pub wrap: bool,
    /// `vmad.po`: plus one.
    pub po: bool,
    /// `vmad.shr7` / `.shr15`: right shift of the result (0 without).
    pub shr: u8,
    /// `vmad` negated operands a, b, c.
    pub neg: [bool; 3],
    /// Scalar: the source parts of a and b, and the merge position of d (`None`: whole word).
    pub asel: Part,
    pub bsel: Part,
    pub dsel: Option<Part>,
    /// SIMD: for each result lane, the lane of the 64-bit `{b, a}` it takes from a and from b.
    pub alanes: [u8; 4],
    pub blanes: [u8; 4],
    /// SIMD: bit `i` set when result lane `i` is written (the destination mask).
    pub mask: u8,
}

fn cmp_of(ins: &Instruction) -> Option<VCmp> {
    [
        (Flag::Eq, VCmp::Eq),
        (Flag::Ne, VCmp::Ne),
        (Flag::Lt, VCmp::Lt),
        (Flag::Le, VCmp::Le),
        (Flag::Gt, VCmp::Gt),
        (Flag::Ge, VCmp::Ge),
    ]
    .into_iter()
    .find_map(|(f, c)| ins.has(f).then_some(c))
}

/// The operation and lane count of a video opcode; `None` for other opcodes.
pub fn video_op(op: Opcode) -> Option<(VOp, u8)> {
    use Opcode as O;
    Some(match op {
        O::Vadd => (VOp::Add, 1),
        O::Vsub => (VOp::Sub, 1),
        O::Vabsdiff => (VOp::Absdiff, 1),
        O::Vmin => (VOp::Min, 1),
        O::Vmax => (VOp::Max, 1),
        O::Vshl => (VOp::Shl, 1),
        O::Vshr => (VOp::Shr, 1),
        O::Vmad => (VOp::Mad, 1),
        O::Vset => (VOp::Set, 1),
        O::Vadd2 => (VOp::Add, 2),
        O::Vsub2 => (VOp::Sub, 2),
        O::Vavrg2 => (VOp::Avrg, 2),
        O::Vabsdiff2 => (VOp::Absdiff, 2),
        O::Vmin2 => (VOp::Min, 2),
        O::Vmax2 => (VOp::Max, 2),
        O::Vset2 => (VOp::Set, 2),
        O::Vadd4 => (VOp::Add, 4),
        O::Vsub4 => (VOp::Sub, 4),
        O::Vavrg4 => (VOp::Avrg, 4),
        O::Vabsdiff4 => (VOp::Absdiff, 4),
        O::Vmin4 => (VOp::Min, 4),
        O::Vmax4 => (VOp::Max, 4),
        O::Vset4 => (VOp::Set, 4),
        _ => return None,
    })
}

/// The register under a selector or negation (`-%r.h1` -> `%r`).
pub fn base_operand(o: &Operand) -> &Operand {
    match o {
        Operand::Neg(x) | Operand::Sel(x, _) => base_operand(x),
        x => x,
    }
}

/// The selector and negation on an operand.
fn decorations(o: &Operand) -> (Option<Sel>, bool) {
    match o {
        Operand::Neg(x) => (decorations(x).0, true),
        Operand::Sel(_, s) => (Some(*s), false),
        _ => (None, false),
    }
}

fn scalar_part(sel: Option<Sel>, what: &str) -> Result<Part, String> {
    let Some(s) = sel else { return Ok(Part::Word) };
    match (s.half, s.digits()) {
        (false, [d @ 0..=3]) => Ok(Part::Byte(*d)),
        (true, [d @ 0..=1]) => Ok(Part::Half(*d)),
        _ => Err(format!(
            "{what} selector `.{s}` is not one of .b0 .b1 .b2 .b3 .h0 .h1"
        )),
    }
}

/// SIMD source lanes: `.hxy` (x, y in 0..=3) or `.bxyzw` (0..=7), most significant lane first.
fn simd_lanes(
    sel: Option<Sel>,
    lanes: u8,
    default: [u8; 4],
    what: &str,
) -> Result<[u8; 4], String> {
    let Some(s) = sel else { return Ok(default) };
    let (half, max) = if lanes == 2 { (true, 3) } else { (false, 7) };
    let d = s.digits();
    if s.half != half || d.len() != lanes as usize || d.iter().any(|&x| x > max) {
        let want = if lanes == 2 {
            ".hxy (0-3)"
        } else {
            ".bxyzw (0-7)"
        };
        return Err(format!("{what} selector `.{s}` is not of the form {want}"));
    }
    let mut out = [0u8; 4];
    for (i, x) in d.iter().rev().enumerate() {
        out[i] = *x;
    }
    Ok(out)
}

/// SIMD destination mask: the lanes listed, strictly descending (`.h10`, `.b310`).
fn simd_mask(sel: Option<Sel>, lanes: u8) -> Result<u8, String> {
    let all = (1u8 << lanes) - 1;
    let Some(s) = sel else { return Ok(all) };
    let d = s.digits();
    let ok =
        s.half == (lanes == 2) && d.iter().all(|&x| x < lanes) && d.windows(2).all(|w| w[0] > w[1]);
    if !ok {
        let want = if lanes == 2 {
            ".h0 .h1 .h10"
        } else {
            "descending byte lanes such as .b0 .b31 .b3210"
        };
        return Err(format!("destination mask `.{s}` is not one of {want}"));
    }
    Ok(d.iter().fold(0, |m, &x| m | 1 << x))
}

impl VideoForm {
    /// Reads a video instruction. Errors name what is wrong (types, modifiers, selectors,
    /// operands) as the PTX ISA defines the forms.
    pub fn from_instruction(ins: &Instruction) -> Result<VideoForm, String> {
        let (op, lanes) =
            video_op(ins.op).ok_or_else(|| format!("`{}` is not a video instruction", ins.op))?;
        let name = ins.op.name();
        let tys: Vec<Ty> = ins.types().collect();
        let ntys = if op == VOp::Set { 2 } else { 3 };
        if tys.len() != ntys || tys.iter().any(|t| !matches!(t, Ty::U32 | Ty::S32)) {
            return Err(format!(
                "`{name}` takes {ntys} types, each .u32 or .s32 ({})",
                if op == VOp::Set {
                    "atype, btype"
                } else {
                    "dtype, atype, btype"
                }
            ));
        }
        let signed = if op == VOp::Set {
            [false, tys[0] == Ty::S32, tys[1] == Ty::S32]
        } else {
            [tys[0] == Ty::S32, tys[1] == Ty::S32, tys[2] == Ty::S32]
        };
        let cmp = cmp_of(ins);
        if (op == VOp::Set) != cmp.is_some() {
            return Err(format!(
                "`{name}` {} a comparison (.eq .ne .lt .le .gt .ge)",
                if op == VOp::Set { "needs" } else { "takes no" }
            ));
        }
        let second = [
            (Flag::Add, SecOp::Add),
            (Flag::Min, SecOp::Min),
            (Flag::Max, SecOp::Max),
        ]
        .into_iter()
        .find_map(|(f, s)| ins.has(f).then_some(s));
        let mut f = VideoForm {
            op,
            lanes,
            signed,
            sat: ins.has(Flag::Sat),
            second,
            cmp,
            wrap: ins.has(Flag::Wrap),
            po: ins.has(Flag::Po),
            shr: if ins.has(Flag::Shr7) {
                7
            } else if ins.has(Flag::Shr15) {
                15
            } else {
                0
            },
            neg: [false; 3],
            asel: Part::Word,
            bsel: Part::Word,
            dsel: None,
            alanes: [0, 1, 2, 3],
            blanes: if lanes == 2 {
                [2, 3, 0, 0]
            } else {
                [4, 5, 6, 7]
            },
            mask: (1 << lanes) - 1,
        };
        f.check_modifiers(ins)?;
        f.read_operands(ins)?;
        Ok(f)
    }

    fn check_modifiers(&self, ins: &Instruction) -> Result<(), String> {
        let name = ins.op.name();
        let shift = matches!(self.op, VOp::Shl | VOp::Shr);
        if shift && (ins.has(Flag::Clamp) == ins.has(Flag::Wrap)) {
            return Err(format!("`{name}` needs exactly one of .clamp and .wrap"));
        }
        if !shift && (ins.has(Flag::Clamp) || ins.has(Flag::Wrap)) {
            return Err(format!("`{name}` takes no .clamp/.wrap"));
        }
        if shift && self.signed[2] {
            return Err(format!(
                "`{name}` needs an unsigned (.u32) shift count type"
            ));
        }
        if self.op != VOp::Mad && (self.po || self.shr != 0) {
            return Err("only `vmad` takes .po, .shr7 and .shr15".into());
        }
        if ins.has(Flag::Shr7) && ins.has(Flag::Shr15) {
            return Err("`vmad` takes one of .shr7 and .shr15".into());
        }
        if self.op == VOp::Mad && self.second.is_some() {
            return Err("`vmad` takes no secondary operation".into());
        }
        if self.lanes > 1 && matches!(self.second, Some(SecOp::Min | SecOp::Max)) {
            return Err(format!("`{name}` takes only .add as secondary operation"));
        }
        if self.lanes > 1 && self.sat && self.second.is_some() {
            return Err(format!("`{name}` cannot saturate with the .add accumulate"));
        }
        if self.op == VOp::Set && self.sat {
            return Err(format!("`{name}` takes no .sat"));
        }
        Ok(())
    }

    fn read_operands(&mut self, ins: &Instruction) -> Result<(), String> {
        let name = ins.op.name();
        let n = ins.args.len();
        let deco = |r: Role| ins.operand(r).map(decorations).unwrap_or((None, false));
        let (dsel, dneg) = deco(Role::Dst);
        let (asel, aneg) = deco(Role::A);
        let (bsel, bneg) = deco(Role::B);
        let (csel, cneg) = deco(Role::C);
        if dneg || csel.is_some() {
            return Err(format!(
                "`{name}`: only a and b take selectors, only vmad negates"
            ));
        }
        if (aneg || bneg || cneg) && self.op != VOp::Mad {
            return Err(format!("`{name}` operands cannot be negated"));
        }
        if self.po && (aneg || bneg || cneg) {
            return Err("`vmad.po` operands cannot be negated".into());
        }
        if (aneg ^ bneg) && cneg {
            return Err("`vmad` negates either the product or c, not both".into());
        }
        self.neg = [aneg, bneg, cneg];
        if self.lanes == 1 {
            self.asel = scalar_part(asel, "source")?;
            self.bsel = scalar_part(bsel, "source")?;
            if let Some(s) = dsel {
                if self.op == VOp::Mad {
                    return Err("`vmad` has no merge form".into());
                }
                self.dsel = Some(scalar_part(Some(s), "destination")?);
            }
            let wants_c = self.op == VOp::Mad || self.second.is_some() || self.dsel.is_some();
            if self.dsel.is_some() && self.second.is_some() {
                return Err(format!(
                    "`{name}`: the merge form (d.sel) takes no secondary operation"
                ));
            }
            if wants_c != (n == 4) {
                return Err(format!(
                    "`{name}` takes {} operands in this form, found {n}",
                    if wants_c { 4 } else { 3 }
                ));
            }
        } else {
            self.alanes = simd_lanes(asel, self.lanes, self.alanes, "source")?;
            self.blanes = simd_lanes(bsel, self.lanes, self.blanes, "source")?;
            self.mask = simd_mask(dsel, self.lanes)?;
            if n != 4 {
                return Err(format!("`{name}` takes 4 operands, found {n}"));
            }
        }
        Ok(())
    }
}
