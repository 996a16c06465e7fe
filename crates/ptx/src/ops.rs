//! Typed instruction modifiers: the one definition of every modifier family that a layer needs
//! as a value (shuffle mode, vote mode, redux/atomic operation, rounding, comparison, memory
//! order and scope, swizzle, wgmma matrix descriptors). The builder takes them as arguments,
//! the emulator decodes into them and the validator reads them; no other crate declares its
//! own copy.
//!
//! Each modifier enum maps one-to-one onto [`Flag`]s (`flag()` / `from_flag()`), and
//! [`Instruction`] has an accessor per family (`inst.shfl_mode()`, `inst.rounding()`, ...) that
//! finds the family's modifier among the instruction's suffixes.

use crate::ir::Instruction;
use crate::mods::{Flag, Mod};
use std::fmt;

/// Declares a modifier enum whose variants are [`Flag`]s, with `flag`, `from_flag`, `ALL` and
/// `Display` (the PTX suffix).
macro_rules! flag_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident => $flag:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
        pub enum $name { $($(#[$vm])* $var),* }
        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),*];
            /// The modifier as written (`.up` -> [`Flag::Up`]).
            pub fn flag(self) -> Flag {
                match self { $($name::$var => Flag::$flag),* }
            }
            /// The value a modifier stands for, if it is one of this family.
            pub fn from_flag(f: Flag) -> Option<$name> {
                match f { $(Flag::$flag => Some($name::$var),)* _ => None }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.flag())
            }
        }
        impl From<$name> for Mod {
            fn from(x: $name) -> Mod {
                Mod::Flag(x.flag())
            }
        }
    };
}

flag_enum! {
    /// `shfl` modes.
    ShflMode { Up => Up, Down => Down, Bfly => Bfly, Idx => Idx }
}

flag_enum! {
    /// `vote` modes.
    VoteMode { All => All, Any => Any, Uni => Uni, Ballot => Ballot }
}

flag_enum! {
    /// `redux.sync` operations.
    ReduxOp { Add => Add, Min => Min, Max => Max, And => And, Or => Or, Xor => Xor }
}

flag_enum! {
    /// `atom` / `red` operations (`red` has no `cas`/`exch`).
    AtomOp {
        Add => Add, Min => Min, Max => Max, Inc => Inc, Dec => Dec, And => And, Or => Or,
        Xor => Xor, Exch => Exch, Cas => Cas,
    }
}

impl AtomOp {
    /// Operations on raw bits (typed `.bN`, not `.uN`/`.sN`/`.fN`).
    pub fn bitwise(self) -> bool {
        matches!(
            self,
            AtomOp::And | AtomOp::Or | AtomOp::Xor | AtomOp::Exch | AtomOp::Cas
        )
    }
}

flag_enum! {
    /// Rounding modifiers: IEEE float rounding (`.rn/.rz/.rm/.rp`, `.rna`, stochastic `.rs`) and
    /// float-to-integer rounding (`.rni/.rzi/.rmi/.rpi`).
    Rounding {
        Rn => Rn, Rz => Rz, Rm => Rm, Rp => Rp, Rna => Rna, Rs => Rs,
        Rni => Rni, Rzi => Rzi, Rmi => Rmi, Rpi => Rpi,
    }
}

impl Rounding {
    /// Rounding to an integral value (`.rni/.rzi/.rmi/.rpi`).
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            Rounding::Rni | Rounding::Rzi | Rounding::Rmi | Rounding::Rpi
        )
    }
}

flag_enum! {
    /// `setp` / `set` comparison operators.
    CmpOp {
        Eq => Eq, Ne => Ne, Lt => Lt, Le => Le, Gt => Gt, Ge => Ge,
        /// unsigned `<`, `<=`, `>`, `>=`
        Lo => Lo, Ls => Ls, Hi => Hi, Hs => Hs,
        /// unordered float comparisons
        Equ => Equ, Neu => Neu, Ltu => Ltu, Leu => Leu, Gtu => Gtu, Geu => Geu,
        /// both operands numbers / either NaN
        Num => Num, Nan => Nan,
    }
}

flag_enum! {
    /// The boolean operation combining a `setp`/`set` result with a predicate (`.and/.or/.xor`).
    BoolOp { And => And, Or => Or, Xor => Xor }
}

flag_enum! {
    /// Memory scopes (`.cta`, `.cluster`, `.gpu`, `.sys`).
    Scope { Cta => Cta, Cluster => Cluster, Gpu => Gpu, Sys => Sys }
}

flag_enum! {
    /// Memory-ordering semantics of atomics, fences and ordered loads/stores.
    MemOrder { Relaxed => Relaxed, Acquire => Acquire, Release => Release, AcqRel => AcqRel, Sc => Sc }
}

/// Shared-memory swizzle of a tile, a wgmma matrix descriptor or a tensor map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Swizzle {
    #[default]
    None,
    B32,
    B64,
    B128,
}

impl Swizzle {
    /// Bytes of one swizzled row (16 without swizzle: a core-matrix row).
    #[inline]
    pub fn width(self) -> u32 {
        match self {
            Swizzle::None => 16,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }
    /// The swizzle span of a tensor map (`None` without swizzle).
    pub fn span_bytes(self) -> Option<u64> {
        match self {
            Swizzle::None => None,
            s => Some(s.width() as u64),
        }
    }
    /// Matrix-descriptor bits 62-63: 0 none, 1 128B, 2 64B, 3 32B.
    pub fn desc_code(self) -> u64 {
        match self {
            Swizzle::None => 0,
            Swizzle::B128 => 1,
            Swizzle::B64 => 2,
            Swizzle::B32 => 3,
        }
    }
    /// The swizzle in bits 62-63 of a matrix descriptor.
    pub fn from_desc(bits: u64) -> Swizzle {
        match (bits >> 62) & 3 {
            1 => Swizzle::B128,
            2 => Swizzle::B64,
            3 => Swizzle::B32,
            _ => Swizzle::None,
        }
    }
    /// Alignment a tile with this swizzle needs (the 8-row repeat of the XOR pattern).
    pub fn align(self) -> u32 {
        match self {
            Swizzle::None => 128,
            s => 8 * s.width(),
        }
    }
    /// Applies the swizzle to an absolute shared-memory byte address: the 16-byte chunk index
    /// (bits 4..) is XORed with the row index within the repeating 8-row pattern (bits 7..).
    #[inline]
    pub fn apply(self, addr: u64) -> u64 {
        let bits = match self {
            Swizzle::None => return addr,
            Swizzle::B32 => 1,
            Swizzle::B64 => 2,
            Swizzle::B128 => 3,
        };
        let mask = (1u64 << bits) - 1;
        addr ^ (((addr >> 7) & mask) << 4)
    }
}

/// A wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13
/// start >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride byte offset >> 4, 49-51
/// base offset, 62-63 swizzle. Fields hold bytes; [`MatrixDesc::encode`] shifts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MatrixDesc {
    pub start: u32,
    pub lbo: u32,
    pub sbo: u32,
    /// The 3-bit base offset (non-zero only for tiles not aligned to the swizzle repeat).
    pub base_offset: u8,
    pub swizzle: Swizzle,
}

impl MatrixDesc {
    /// The descriptor of a K-major operand tile of `rows` rows stored as slabs of
    /// `rows x width` (the TMA box layout): 8-row groups are `8 * width` apart (SBO), slabs
    /// `rows * width` apart (LBO).
    pub fn k_major(swizzle: Swizzle, rows: u32) -> MatrixDesc {
        let w = swizzle.width();
        MatrixDesc {
            start: 0,
            lbo: rows * w,
            sbo: 8 * w,
            base_offset: 0,
            swizzle,
        }
    }
    /// The 64-bit descriptor value.
    pub fn encode(&self) -> u64 {
        ((self.start as u64 >> 4) & 0x3fff)
            | (((self.lbo as u64 >> 4) & 0x3fff) << 16)
            | (((self.sbo as u64 >> 4) & 0x3fff) << 32)
            | ((self.base_offset as u64 & 7) << 49)
            | (self.swizzle.desc_code() << 62)
    }
    /// Decodes a 64-bit descriptor value.
    #[inline]
    pub fn decode(d: u64) -> MatrixDesc {
        MatrixDesc {
            start: ((d & 0x3fff) << 4) as u32,
            lbo: (((d >> 16) & 0x3fff) << 4) as u32,
            sbo: (((d >> 32) & 0x3fff) << 4) as u32,
            base_offset: ((d >> 49) & 7) as u8,
            swizzle: Swizzle::from_desc(d),
        }
    }
}

flag_enum! {
    /// The tensor-map field `tensormap.replace` writes.
    TensormapField {
        GlobalAddress => GlobalAddress, Rank => Rank, BoxDim => BoxDim, GlobalDim => GlobalDim,
        GlobalStride => GlobalStride, ElementStride => ElementStride, Elemtype => Elemtype,
        InterleaveLayout => InterleaveLayout, SwizzleMode => SwizzleMode, FillMode => FillMode,
    }
}

impl TensormapField {
    /// Whether the field is per dimension (`box_dim`, `global_dim`, `global_stride`,
    /// `element_stride`: the instruction names the dimension with an `ord` operand).
    pub fn has_ord(self) -> bool {
        use TensormapField as F;
        matches!(
            self,
            F::BoxDim | F::GlobalDim | F::GlobalStride | F::ElementStride
        )
    }
}

impl Instruction {
    /// The first modifier of the family `from` recognises.
    fn find_flag<T>(&self, from: impl Fn(Flag) -> Option<T>) -> Option<T> {
        self.mods.iter().find_map(|m| match m {
            Mod::Flag(f) => from(*f),
            _ => None,
        })
    }
    /// `shfl` mode.
    pub fn shfl_mode(&self) -> Option<ShflMode> {
        self.find_flag(ShflMode::from_flag)
    }
    /// `vote` mode.
    pub fn vote_mode(&self) -> Option<VoteMode> {
        self.find_flag(VoteMode::from_flag)
    }
    /// `redux` operation.
    pub fn redux_op(&self) -> Option<ReduxOp> {
        self.find_flag(ReduxOp::from_flag)
    }
    /// `atom` / `red` operation.
    pub fn atom_op(&self) -> Option<AtomOp> {
        self.find_flag(AtomOp::from_flag)
    }
    /// Rounding modifier.
    pub fn rounding(&self) -> Option<Rounding> {
        self.find_flag(Rounding::from_flag)
    }
    /// `setp`/`set` comparison (the first comparison modifier; `.lo`/`.hi` count as unsigned
    /// comparisons, so ask only of comparing instructions).
    pub fn cmp_op(&self) -> Option<CmpOp> {
        self.find_flag(CmpOp::from_flag)
    }
    /// `setp`/`set` boolean combination (`.and/.or/.xor` after the comparison).
    pub fn bool_op(&self) -> Option<BoolOp> {
        self.find_flag(BoolOp::from_flag)
    }
    /// Memory scope.
    pub fn scope(&self) -> Option<Scope> {
        self.find_flag(Scope::from_flag)
    }
    /// Memory-ordering semantics.
    pub fn mem_order(&self) -> Option<MemOrder> {
        self.find_flag(MemOrder::from_flag)
    }
    /// `tensormap.replace` field.
    pub fn tensormap_field(&self) -> Option<TensormapField> {
        self.find_flag(TensormapField::from_flag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_round_trip() {
        for m in ShflMode::ALL {
            assert_eq!(ShflMode::from_flag(m.flag()), Some(*m));
        }
        for m in AtomOp::ALL {
            assert_eq!(AtomOp::from_flag(m.flag()), Some(*m));
        }
        for m in CmpOp::ALL {
            assert_eq!(CmpOp::from_flag(m.flag()), Some(*m));
        }
        assert_eq!(Rounding::from_flag(Flag::Ftz), None);
    }

    #[test]
    fn descriptor_round_trip() {
        let d = MatrixDesc {
            start: 0x1230,
            lbo: 4096,
            sbo: 1024,
            base_offset: 3,
            swizzle: Swizzle::B64,
        };
        assert_eq!(MatrixDesc::decode(d.encode()), d);
        assert_eq!(MatrixDesc::k_major(Swizzle::B128, 64).sbo, 1024);
        assert_eq!(Swizzle::B128.apply(256 + 16), 256 + 48);
    }

    #[test]
    fn accessors_find_their_family() {
        let i = crate::parse_statements("setp.lt.and.u32 %p, %r1, %r2, %q;").unwrap();
        let crate::Statement::Instr(i) = &i[0] else {
            panic!("not an instruction")
        };
        assert_eq!(i.cmp_op(), Some(CmpOp::Lt));
        assert_eq!(i.bool_op(), Some(BoolOp::And));
        assert_eq!(i.rounding(), None);
    }
}
