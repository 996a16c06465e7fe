//! Named operand roles. Each opcode's row in the [`crate::isa`] table may list its operands by
//! role ([`Opcode::slots`]); [`Instruction::operand`] finds an operand by role, so no layer
//! needs to know that a tensor copy's mbarrier is operand 2 only when it loads, or that a
//! `wgmma` with A in registers has no `imm-trans-a`. `Instruction.args` keeps the PTX order
//! (the parser and printer need it); everything else reads through roles.
//!
//! Whether a slot is present depends on the instruction: its modifiers (`ctaMask` only with
//! `.multicast::cluster`), the kinds of its operands (`call`'s return list) and, for optional
//! slots, the operand count.

use crate::ir::{Instruction, Operand};
use crate::isa::Opcode;
use crate::mods::Flag;
use std::fmt;

macro_rules! roles {
    ($($(#[$m:meta])* $var:ident => $name:literal,)*) => {
        /// What an operand is to its instruction (named after the PTX ISA's operand names).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Role { $($(#[$m])* $var),* }
        impl Role {
            /// The PTX ISA's name for the operand.
            pub fn name(self) -> &'static str {
                match self { $(Role::$var => $name),* }
            }
        }
    };
}

roles! {
    /// The destination (`d`; a `d|p` pair counts as one).
    Dst => "d",
    /// First source (`a`); for `wgmma.mma_async` the A matrix, a descriptor or 4 registers.
    A => "a",
    /// Second source (`b`).
    B => "b",
    /// Third source (`c`).
    C => "c",
    /// `bfe`/`bfi` bit position.
    Pos => "pos",
    /// `bfe`/`bfi` field length.
    Len => "len",
    /// Shift amount of `shl`/`shr`/`shf`.
    Shift => "shift",
    /// `lop3`'s immediate look-up table.
    Lut => "immLut",
    /// `prmt`'s byte selector (`c`).
    Selector => "c",
    /// `shfl`'s source lane, offset or lane mask (`b`).
    Lane => "b",
    /// `shfl`'s clamp / segment mask (`c`).
    Clamp => "c",
    /// The member mask of a warp-synchronous instruction.
    Membermask => "membermask",
    /// A memory address (`[a]`); a texture or surface reference with its coordinates
    /// (`[a, b]`), or the queried one (`txq`/`suq`'s `[a]`).
    Addr => "a",
    /// A source of memory copies (`[srcMem]`, `[tensorMap, coords]`) or the value stored.
    Src => "src",
    /// The cache policy of a `.L2::cache_hint` access.
    CacheHint => "cache-policy",
    /// `cp.async`'s copy size (`cp-size`).
    CpSize => "cp-size",
    /// `cp.async`'s source size (`src-size`, the rest is zero-filled).
    SrcSize => "src-size",
    /// `wmma.load`/`wmma.store`'s row or column stride (`stride`).
    Stride => "stride",
    /// `mma.sp`'s sparse metadata (`e`).
    Meta => "e",
    /// `mma.sp`'s sparsity selector (`f`).
    SparsitySel => "f",
    /// Bulk-copy byte count; `alloca`'s allocation size.
    Size => "size",
    /// `alloca`'s alignment (an immediate power of two).
    Align => "align",
    /// The mbarrier a copy completes on (`[mbar]`).
    Mbar => "mbar",
    /// The destination CTAs of a multicast copy (`ctaMask`).
    CtaMask => "ctaMask",
    /// Offsets of an im2col tensor copy.
    Im2colOffsets => "im2colOffsets",
    /// An mbarrier state (`state`): written by `arrive`, read by `test_wait`/`try_wait`.
    State => "state",
    /// Arrival count (`count`).
    Count => "count",
    /// Transaction bytes (`txCount`).
    TxCount => "txCount",
    /// `test_wait`/`try_wait` result predicate (`waitComplete`).
    WaitComplete => "waitComplete",
    /// Phase parity of the `.parity` wait forms (`phaseParity`).
    Phase => "phaseParity",
    /// `try_wait`'s time limit (`suspendTimeHint`).
    SuspendHint => "suspendTimeHint",
    /// `wgmma`'s B matrix descriptor (`b-desc`).
    BDesc => "b-desc",
    /// `wgmma`'s accumulate predicate (`scale-d`).
    ScaleD => "scale-d",
    /// `wgmma`'s A negation (`imm-scale-a`, 1 or -1).
    ImmScaleA => "imm-scale-a",
    /// `wgmma`'s B negation (`imm-scale-b`).
    ImmScaleB => "imm-scale-b",
    /// `wgmma`'s A transpose (`imm-trans-a`; absent when A is in registers).
    ImmTransA => "imm-trans-a",
    /// `wgmma`'s B transpose (`imm-trans-b`).
    ImmTransB => "imm-trans-b",
    /// `mapa`'s target CTA rank (`b`).
    CtaRank => "b",
    /// `call`'s return parameters (`(ret-param)`).
    Rets => "ret-param",
    /// `call`'s target: a function name or a register holding its address.
    Func => "func",
    /// `call`'s arguments (`(param-list)`).
    Params => "param-list",
    /// An indirect call's prototype or target list (`fproto` / `flist`).
    Proto => "fproto",
    /// A branch target: `bra`'s label, `brx.idx`'s `.branchtargets` list (`tgt` / `tlist`).
    Target => "tgt",
    /// `brx.idx`'s index into its target list.
    Index => "index",
    /// The number of most recent groups a `wait_group` may leave pending (`N`).
    N => "N",
    /// `setmaxnreg`'s register count (`imm-reg-count`).
    RegCount => "imm-reg-count",
    /// `nanosleep`'s duration in nanoseconds (`t`).
    Time => "t",
    /// `tensormap.replace`: the dimension a per-dimension field is written for (`ord`).
    Ord => "ord",
    /// `tensormap.replace`: the field's new value (`new_val`).
    Value => "new_val",
    /// `tex.level`'s level of detail, `txq.level`'s mipmap level (`lod`).
    Lod => "lod",
    /// `tex.grad`'s gradient along x (`dPdx`).
    Dpdx => "dPdx",
    /// `tex.grad`'s gradient along y (`dPdy`).
    Dpdy => "dPdy",
    /// A texture fetch's texel offset vector (`e`).
    TexOffset => "e",
    /// A texture fetch's depth-compare value (`f`).
    DepthCompare => "f",
    /// A predicate source combined into a predicate result (`lop3.or`'s `q`).
    PredIn => "q",
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// When a slot is present on an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    Always,
    /// With this modifier.
    Flag(Flag),
    /// Without this modifier.
    NoFlag(Flag),
    /// When the operand at the slot's position is a `( ... )` list.
    List,
    /// When operand N is not a `{ ... }` vector.
    NotVec(u8),
    /// When the operand at the slot's position is a `{ ... }` vector (a texture fetch's offset
    /// `e`, which the scalar depth-compare operand `f` may follow or replace).
    Vec,
}

impl Cond {
    /// Whether the condition depends on the operand at the slot's own position.
    fn positional(self) -> bool {
        matches!(self, Cond::List | Cond::Vec)
    }
}

/// The type an operand must have, relative to the instruction's type modifier `T` (the
/// validator checks it; PTX's rules: bit types match any type of their size, signed and
/// unsigned of one size are interchangeable, floats must match).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TyClass {
    /// Not checked from the table (the opcode's own rule in the validator, or none).
    Any,
    /// Of type `T`.
    T,
    /// Of type `T` or an integer register wider than it (`ld`/`st` values).
    TWide,
    /// `.vN` values: a `{...}` vector of N `T` elements (a scalar without `.vN`).
    TVec,
    /// `ld`/`st` values: like [`TyClass::TVec`], elements may be wider integers.
    TWideVec,
    /// The second type modifier (`set.dtype.stype`, `slct.dtype.ctype`), `T` without one.
    T2,
    /// `.pred`, or a `p|q` pair of them, or `_`.
    PredPair,
    /// `T` for `d`, `.pred` for `p` of a `d|p` pair.
    TPair,
    /// `.b32` for `d`, `.pred` for `p` of a `d|p` pair.
    B32Pair,
    B32,
    B64,
    U32,
    Pred,
    /// `.xN` `.b32` registers (`ldmatrix`/`stmatrix` fragments).
    B32X,
    /// A `[address]` whose register base is a 32- or 64-bit integer.
    Addr,
    /// A `[address]` (base not checked).
    AddrOnly,
}

/// One operand of an opcode's role list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub role: Role,
    pub cond: Cond,
    /// Present only if the instruction has more operands than the required ones that follow.
    pub optional: bool,
    /// The operand's type class.
    pub ty: TyClass,
}

impl Slot {
    /// Whether the slot's condition holds for `ins`, with `k` operands placed before it.
    fn holds(&self, ins: &Instruction, k: usize) -> bool {
        match self.cond {
            Cond::Always => true,
            Cond::Flag(f) => ins.has(f),
            Cond::NoFlag(f) => !ins.has(f),
            Cond::List => matches!(ins.args.get(k), Some(Operand::List(_))),
            Cond::Vec => matches!(ins.args.get(k), Some(Operand::Vec(_))),
            Cond::NotVec(n) => !matches!(ins.args.get(n as usize), Some(Operand::Vec(_))),
        }
    }
}

impl Opcode {
    /// Does the table list this opcode's operands by role?
    pub fn has_roles(self) -> bool {
        !self.slots().is_empty()
    }
}

impl Instruction {
    /// The roles of this instruction's operands, in order: one entry per operand the role list
    /// places (fewer than `args` when the instruction has too many operands, a role missing
    /// when it has too few). Empty for opcodes without a role list.
    pub fn roles(&self) -> Vec<Role> {
        self.placed_slots().iter().map(|s| s.role).collect()
    }

    /// The slots of the role list this instruction has, in operand order (see [`Self::roles`]).
    pub fn placed_slots(&self) -> Vec<&'static Slot> {
        let slots = self.op.slots();
        let mut out = Vec::with_capacity(slots.len());
        for (i, s) in slots.iter().enumerate() {
            if self.slot_present(slots, i, out.len()) {
                out.push(s);
            }
        }
        out
    }

    fn slot_present(&self, slots: &[Slot], i: usize, k: usize) -> bool {
        let s = &slots[i];
        if !s.holds(self, k) {
            return false;
        }
        if !s.optional {
            return true;
        }
        // Required slots after this one are placed after it; an optional one takes an operand
        // only when there are more left than those need.
        let later = slots[i + 1..]
            .iter()
            .filter(|t| !t.optional && !t.cond.positional() && t.holds(self, usize::MAX))
            .count();
        self.args.len().saturating_sub(k) > later
    }

    /// Position in `args` of the operand with `role`, if the instruction has it.
    pub fn operand_index(&self, role: Role) -> Option<usize> {
        let slots = self.op.slots();
        let mut k = 0;
        for (i, s) in slots.iter().enumerate() {
            if !self.slot_present(slots, i, k) {
                continue;
            }
            if s.role == role {
                return (k < self.args.len()).then_some(k);
            }
            k += 1;
        }
        None
    }

    /// The operand with `role` (`inst.operand(Role::Mbar)`), if the instruction has it.
    pub fn operand(&self, role: Role) -> Option<&Operand> {
        self.operand_index(role).map(|k| &self.args[k])
    }

    /// The operand count the role list requires (`min`) and allows (`max`) for this
    /// instruction's modifiers; `None` for opcodes without a role list.
    pub fn operand_range(&self) -> Option<(usize, usize)> {
        let slots = self.op.slots();
        if slots.is_empty() {
            return None;
        }
        let mut min = 0;
        let mut max = 0;
        for s in slots {
            let possible = s.cond.positional() || s.holds(self, usize::MAX);
            if possible {
                max += 1;
                if !s.optional && !s.cond.positional() {
                    min += 1;
                }
            }
        }
        Some((min, max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Statement;

    fn ins(text: &str) -> Instruction {
        match crate::parse_statements(text).unwrap().remove(0) {
            Statement::Instr(i) => i,
            s => panic!("not an instruction: {s:?}"),
        }
    }

    fn name_of(i: &Instruction, r: Role) -> Option<String> {
        i.operand(r).map(|o| match o {
            Operand::Reg(n) => n.clone(),
            Operand::Addr { .. } | Operand::TensorAddr { .. } => "[..]".into(),
            Operand::Imm(x) => format!("{}", x.bits() as i64),
            Operand::List(_) => "(..)".into(),
            Operand::Sym { name, .. } => name.clone(),
            o => format!("{o:?}"),
        })
    }

    #[test]
    fn tensor_copy_roles_follow_the_modifiers() {
        let load = ins("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%r1], [%rd1, {%r2, %r3}], [%r4], %rs1;");
        assert_eq!(name_of(&load, Role::Mbar).as_deref(), Some("[..]"));
        assert_eq!(name_of(&load, Role::CtaMask).as_deref(), Some("%rs1"));
        assert_eq!(load.operand(Role::CacheHint), None);
        let store =
            ins("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {%r2, %r3}], [%r1];");
        assert_eq!(store.operand(Role::Mbar), None);
        assert_eq!(store.operand_index(Role::Src), Some(1));
        assert_eq!(store.operand_range(), Some((2, 2)));
    }

    #[test]
    fn wgmma_register_a_has_no_trans_a() {
        let desc = ins("wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f1,%f2,%f3,%f4}, %rd1, %rd2, p, 1, -1, 0, 1;");
        assert_eq!(name_of(&desc, Role::ImmScaleB).as_deref(), Some("-1"));
        assert_eq!(name_of(&desc, Role::ImmTransB).as_deref(), Some("1"));
        let regs = ins("wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, %rd2, p, 1, 1, 1;");
        assert_eq!(regs.operand(Role::ImmTransA), None);
        assert_eq!(name_of(&regs, Role::ImmTransB).as_deref(), Some("1"));
    }

    #[test]
    fn mbarrier_and_call_roles() {
        let w = ins("mbarrier.try_wait.parity.shared::cta.b64 p, [%r1], %r2, %r3;");
        assert_eq!(name_of(&w, Role::Phase).as_deref(), Some("%r2"));
        assert_eq!(w.operand(Role::State), None);
        assert_eq!(name_of(&w, Role::SuspendHint).as_deref(), Some("%r3"));
        let a = ins("mbarrier.arrive.expect_tx.shared::cta.b64 %rd1, [%r1], %r2;");
        assert_eq!(name_of(&a, Role::TxCount).as_deref(), Some("%r2"));
        assert_eq!(a.operand(Role::Count), None);
        let c = ins("call.uni (%r1), f, (%r2);");
        assert_eq!(name_of(&c, Role::Rets).as_deref(), Some("(..)"));
        assert_eq!(name_of(&c, Role::Func).as_deref(), Some("f"));
        let c = ins("call.uni f, (%r2);");
        assert_eq!(c.operand(Role::Rets), None);
        assert_eq!(name_of(&c, Role::Params).as_deref(), Some("(..)"));
        let s = ins("shfl.sync.bfly.b32 %r1|p, %r2, 1, 31, -1;");
        assert_eq!(name_of(&s, Role::Membermask).as_deref(), Some("-1"));
        let s = ins("cp.async.ca.shared.global.L2::cache_hint [%r1], [%rd1], 16, %rd2;");
        assert_eq!(s.operand(Role::SrcSize), None);
        assert_eq!(name_of(&s, Role::CacheHint).as_deref(), Some("%rd2"));
    }

    #[test]
    fn optional_and_flagged_sources() {
        let b = ins("bar.red.popc.u32 %r1, 0, 64, !p;");
        assert_eq!(name_of(&b, Role::Dst).as_deref(), Some("%r1"));
        assert_eq!(name_of(&b, Role::B).as_deref(), Some("64"));
        assert_eq!(b.operand_index(Role::C), Some(3));
        let b = ins("bar.red.popc.u32 %r1, 0, p;");
        assert_eq!(b.operand(Role::B), None);
        assert_eq!(name_of(&b, Role::C).as_deref(), Some("p"));
        let b = ins("bar.sync 1, 64;");
        assert_eq!(b.operand(Role::Dst), None);
        assert_eq!(name_of(&b, Role::A).as_deref(), Some("1"));
        assert_eq!(name_of(&b, Role::B).as_deref(), Some("64"));
        let m = ins("min.s32 %r1, %r2, %r3;");
        assert_eq!(m.operand(Role::C), None);
        let m = ins("min.s32 %r1, %r2, %r3, %r4;");
        assert_eq!(name_of(&m, Role::C).as_deref(), Some("%r4"));
        let a = ins("alloca.u64 %rd1, %rd2, 16;");
        assert_eq!(name_of(&a, Role::Size).as_deref(), Some("%rd2"));
        assert_eq!(name_of(&a, Role::Align).as_deref(), Some("16"));
        let s = ins("shl.b32 %r1, %r2, 3;");
        assert_eq!(name_of(&s, Role::Shift).as_deref(), Some("3"));
        let x = ins("brx.idx %r1, tgts;");
        assert_eq!(name_of(&x, Role::Index).as_deref(), Some("%r1"));
        assert_eq!(name_of(&x, Role::Target).as_deref(), Some("tgts"));
    }

    /// The counted columns of the table agree with the role lists (no modifiers: the required
    /// roles are the minimum).
    #[test]
    fn counts_agree_with_roles() {
        for &op in Opcode::ALL.iter().filter(|o| o.has_roles()) {
            let info = op.info();
            let bare = Instruction::new(op, Vec::new(), Vec::new());
            let (min, max) = bare.operand_range().unwrap();
            let lo = (info.dsts + info.min_srcs) as usize;
            let hi = (info.dsts + info.max_srcs) as usize;
            assert_eq!(min, lo, "{op}: required roles vs table minimum");
            assert!(
                max <= hi.max(min),
                "{op}: roles without modifiers exceed the table"
            );
        }
    }
}
