//! PTX scalar types and state spaces: the vocabulary every other part of the IR is typed with.

use std::fmt;

macro_rules! enum_str {
    ($(#[$m:meta])* $name:ident { $($var:ident => $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($var),* }
        impl $name {
            /// All variants, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),*];
            /// The PTX spelling, without the leading dot.
            pub fn as_str(self) -> &'static str { match self { $($name::$var => $s),* } }
            /// Parses the PTX spelling (without the leading dot).
            #[allow(clippy::should_implement_trait)]
            pub fn from_str(s: &str) -> Option<Self> { match s { $($s => Some($name::$var),)* _ => None } }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    };
}
pub(crate) use enum_str;

enum_str! {
    /// A PTX fundamental (or packed) type.
    Ty {
        Pred => "pred",
        B8 => "b8", B16 => "b16", B32 => "b32", B64 => "b64", B128 => "b128",
        U8 => "u8", U16 => "u16", U32 => "u32", U64 => "u64",
        S8 => "s8", S16 => "s16", S32 => "s32", S64 => "s64",
        F16 => "f16", F16x2 => "f16x2", Bf16 => "bf16", Bf16x2 => "bf16x2",
        F32 => "f32", F64 => "f64", Tf32 => "tf32",
        E4m3 => "e4m3", E5m2 => "e5m2", E4m3x2 => "e4m3x2", E5m2x2 => "e5m2x2",
        E4m3x4 => "e4m3x4", E5m2x4 => "e5m2x4", Ue8m0x2 => "ue8m0x2",
        Texref => "texref", Samplerref => "samplerref", Surfref => "surfref",
        // sub-byte element types: only instruction modifiers (mma/wmma inputs, cvt.pack)
        U4 => "u4", S4 => "s4", U2 => "u2", S2 => "s2", B1 => "b1",
    }
}

/// Broad class of a type, used by the validator's compatibility rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TyKind {
    Pred,
    Bits,
    Unsigned,
    Signed,
    Float,
    Opaque,
}

impl Ty {
    /// Size in bytes (pred counts as 1 for storage purposes; opaque refs as 8).
    pub fn size(self) -> u32 {
        use Ty::*;
        match self {
            // sub-byte types occupy at least a byte wherever a size is asked for
            Pred | B8 | U8 | S8 | E4m3 | E5m2 | U4 | S4 | U2 | S2 | B1 => 1,
            B16 | U16 | S16 | F16 | Bf16 | E4m3x2 | E5m2x2 | Ue8m0x2 => 2,
            B32 | U32 | S32 | F32 | F16x2 | Bf16x2 | Tf32 | E4m3x4 | E5m2x4 => 4,
            B64 | U64 | S64 | F64 | Texref | Samplerref | Surfref => 8,
            B128 => 16,
        }
    }
    /// Size in bits.
    pub fn bits(self) -> u32 {
        match self {
            Ty::Pred | Ty::B1 => 1,
            Ty::U2 | Ty::S2 => 2,
            Ty::U4 | Ty::S4 => 4,
            _ => self.size() * 8,
        }
    }
    pub fn kind(self) -> TyKind {
        use Ty::*;
        match self {
            Pred => TyKind::Pred,
            B1 | B8 | B16 | B32 | B64 | B128 => TyKind::Bits,
            U2 | U4 | U8 | U16 | U32 | U64 => TyKind::Unsigned,
            S2 | S4 | S8 | S16 | S32 | S64 => TyKind::Signed,
            F16 | F16x2 | Bf16 | Bf16x2 | F32 | F64 | Tf32 | E4m3 | E5m2 | E4m3x2 | E5m2x2
            | E4m3x4 | E5m2x4 | Ue8m0x2 => TyKind::Float,
            Texref | Samplerref | Surfref => TyKind::Opaque,
        }
    }
    pub fn is_float(self) -> bool {
        self.kind() == TyKind::Float
    }
    pub fn is_signed(self) -> bool {
        self.kind() == TyKind::Signed
    }
    pub fn is_int(self) -> bool {
        matches!(
            self.kind(),
            TyKind::Signed | TyKind::Unsigned | TyKind::Bits
        )
    }
    /// The bit type of the same size (b16 for f16, b32 for u32, ...).
    pub fn bit_ty(self) -> Ty {
        match self.size() {
            1 => Ty::B8,
            2 => Ty::B16,
            4 => Ty::B32,
            8 => Ty::B64,
            _ => Ty::B128,
        }
    }
    /// Unsigned integer type of the given size in bytes.
    pub fn unsigned_of(size: u32) -> Option<Ty> {
        Some(match size {
            1 => Ty::U8,
            2 => Ty::U16,
            4 => Ty::U32,
            8 => Ty::U64,
            _ => return None,
        })
    }
    /// Signed integer type of the given size in bytes.
    pub fn signed_of(size: u32) -> Option<Ty> {
        Some(match size {
            1 => Ty::S8,
            2 => Ty::S16,
            4 => Ty::S32,
            8 => Ty::S64,
            _ => return None,
        })
    }
}

enum_str! {
    /// A PTX state space (with the `::cta` / `::cluster` sub-spaces of shared memory).
    Space {
        Reg => "reg", Sreg => "sreg", Const => "const", Global => "global", Local => "local",
        Param => "param", ParamEntry => "param::entry", ParamFunc => "param::func",
        Shared => "shared", SharedCta => "shared::cta", SharedCluster => "shared::cluster",
        Tex => "tex",
    }
}

impl Space {
    /// Shared memory of any flavour.
    pub fn is_shared(self) -> bool {
        matches!(
            self,
            Space::Shared | Space::SharedCta | Space::SharedCluster
        )
    }
    pub fn is_param(self) -> bool {
        matches!(self, Space::Param | Space::ParamEntry | Space::ParamFunc)
    }
}
