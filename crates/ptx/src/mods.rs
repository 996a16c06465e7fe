//! Instruction modifiers: every `.suffix` that may follow an opcode. A modifier is a typed value;
//! its meaning is decided by the opcode it follows (`.lo` is a comparison for `setp` and a half
//! selector for `mul`). Unknown suffixes are parse errors, never silently dropped.

use crate::types::{enum_str, Space, Ty};
use std::fmt;

enum_str! {
    /// Modifiers that carry no data.
    Flag {
        // rounding
        Rn => "rn", Rz => "rz", Rm => "rm", Rp => "rp", Rni => "rni", Rzi => "rzi",
        Rmi => "rmi", Rpi => "rpi", Rna => "rna", Rs => "rs",
        // arithmetic behaviour
        Ftz => "ftz", Sat => "sat", Satfinite => "satfinite", Relu => "relu", Approx => "approx",
        Full => "full", Uni => "uni", Wide => "wide", Hi => "hi", Lo => "lo", Cc => "cc",
        NaN => "NaN", Xorsign => "xorsign", Abs => "abs", Noftz => "noftz", Shiftamt => "shiftamt",
        // comparisons (`lo`/`hi` above double as unsigned comparisons)
        Eq => "eq", Ne => "ne", Lt => "lt", Le => "le", Gt => "gt", Ge => "ge", Ls => "ls",
        Hs => "hs", Equ => "equ", Neu => "neu", Ltu => "ltu", Leu => "leu", Gtu => "gtu",
        Geu => "geu", Num => "num", Nan => "nan",
        // boolean / reduction / atomic operations
        And => "and", Or => "or", Xor => "xor", Popc => "popc", Add => "add", Min => "min",
        Max => "max", Inc => "inc", Dec => "dec", Cas => "cas", Exch => "exch",
        // memory ordering and scope
        Volatile => "volatile", Relaxed => "relaxed", Acquire => "acquire", Release => "release",
        AcqRel => "acq_rel", Sc => "sc", Weak => "weak", Mmio => "mmio",
        Cta => "cta", Cluster => "cluster", Gpu => "gpu", Sys => "sys", Gl => "gl",
        // cache operators and eviction priorities
        Ca => "ca", Cg => "cg", Cs => "cs", Lu => "lu", Cv => "cv", Wb => "wb", Wt => "wt",
        Nc => "nc",
        L1EvictNormal => "L1::evict_normal", L1EvictUnchanged => "L1::evict_unchanged",
        L1EvictFirst => "L1::evict_first", L1EvictLast => "L1::evict_last",
        L1NoAllocate => "L1::no_allocate", L2EvictNormal => "L2::evict_normal",
        L2EvictFirst => "L2::evict_first", L2EvictLast => "L2::evict_last",
        L2EvictUnchanged => "L2::evict_unchanged", L2CacheHint => "L2::cache_hint",
        L264B => "L2::64B", L2128B => "L2::128B", L2256B => "L2::256B",
        Fractional => "fractional",
        // warp-level
        Up => "up", Down => "down", Bfly => "bfly", Idx => "idx", All => "all", Any => "any",
        Ballot => "ballot", Sync => "sync", Aligned => "aligned", Arrive => "arrive", Red => "red",
        Wait => "wait", Read => "read",
        // matrix
        Row => "row", Col => "col", Trans => "trans",
        // conversions and bit ops
        To => "to", L => "l", R => "r", Wrap => "wrap", Clamp => "clamp",
        F4e => "f4e", B4e => "b4e", Rc8 => "rc8", Ecl => "ecl", Ecr => "ecr", Rc16 => "rc16",
        Pack => "pack", Po => "po", Shr7 => "shr7", Shr15 => "shr15",
        Finite => "finite", Infinite => "infinite", Number => "number", Notanumber => "notanumber",
        Normal => "normal", Subnormal => "subnormal",
        // async copies, barriers, proxies
        BulkGroup => "bulk_group", CompleteTxBytes => "mbarrier::complete_tx::bytes",
        MulticastCluster => "multicast::cluster", Tile => "tile", Im2col => "im2col",
        ExpectTx => "expect_tx", NoComplete => "noComplete", Parity => "parity", Noinc => "noinc",
        Proxy => "proxy", Async => "async", Alias => "alias",
        TensormapGeneric => "tensormap::generic", MbarrierInit => "mbarrier_init",
        Tensormap => "tensormap", LaunchDependents => "launch_dependents", L2 => "L2",
        // tensor maps: im2col stores/reductions, the `.b1024` map object (a size, not a
        // register type), the fields `tensormap.replace` writes
        Im2colNoOffs => "im2col_no_offs", B1024 => "b1024", GlobalAddress => "global_address",
        Rank => "rank", BoxDim => "box_dim", GlobalDim => "global_dim",
        GlobalStride => "global_stride", ElementStride => "element_stride",
        Elemtype => "elemtype", InterleaveLayout => "interleave_layout",
        SwizzleMode => "swizzle_mode", FillMode => "fill_mode",
        // multimem accumulation precision
        AccF32 => "acc::f32",
        // audit (issue 16): prefetch level, `[a].unified`, `pmevent.mask`, `createpolicy`
        // forms, fence restrictions (PTX 8.6)
        L1 => "L1", Unified => "unified", Mask => "mask", Range => "range", CvtPolicy => "cvt",
        SyncRestrictSharedCluster => "sync_restrict::shared::cluster",
        SyncRestrictSharedCta => "sync_restrict::shared::cta", AsyncGeneric => "async::generic",
        Oob => "oob",
        // textures and surfaces: `.b` addressing, out-of-range modes, gather components,
        // query attributes (`.r` and `.clamp` are above)
        B => "b", Trap => "trap", Zero => "zero", G => "g", A => "a", Width => "width",
        Height => "height", Depth => "depth", NormalizedCoords => "normalized_coords",
        FilterMode => "filter_mode", AddrMode0 => "addr_mode_0", AddrMode1 => "addr_mode_1",
        AddrMode2 => "addr_mode_2",
        // texture/surface geometries beyond `.1d`..`.3d` (crate::texture::TexGeom), mipmap
        // modes, formatted (`.p`) surface access and the further query attributes
        A1d => "a1d", A2d => "a2d", Cube => "cube", Acube => "acube", Dms2 => "2dms",
        A2dms => "a2dms", Base => "base", Level => "level", Grad => "grad", P => "p",
        ArraySize => "array_size", NumMipmapLevels => "num_mipmap_levels",
        NumSamples => "num_samples", ChannelDataType => "channel_data_type",
        ChannelOrder => "channel_order", MemoryLayout => "memory_layout",
    }
}

/// One `.suffix` of an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mod {
    Flag(Flag),
    Type(Ty),
    Space(Space),
    /// `.v2`, `.v4`, `.v8`
    Vec(u8),
    /// `.x1`, `.x2`, `.x4` (ldmatrix/stmatrix counts)
    X(u8),
    /// `.1d` .. `.5d` (tensor copies)
    Dim(u8),
    /// `.mMnN[kK]`: matrix shapes of mma, wgmma, ldmatrix.
    Shape {
        m: u16,
        n: u16,
        k: Option<u16>,
    },
}

impl Mod {
    /// Parses one suffix (without the dot).
    pub fn parse(s: &str) -> Option<Mod> {
        if let Some(t) = Ty::from_str(s) {
            return Some(Mod::Type(t));
        }
        if let Some(sp) = Space::from_str(s) {
            return Some(Mod::Space(sp));
        }
        if let Some(f) = Flag::from_str(s) {
            return Some(Mod::Flag(f));
        }
        let b = s.as_bytes();
        if b.len() == 2 && b[0] == b'v' && matches!(b[1], b'2' | b'4' | b'8') {
            return Some(Mod::Vec(b[1] - b'0'));
        }
        if b.len() == 2 && b[0] == b'x' && matches!(b[1], b'1' | b'2' | b'4') {
            return Some(Mod::X(b[1] - b'0'));
        }
        if b.len() == 2 && b[1] == b'd' && (b'1'..=b'5').contains(&b[0]) {
            return Some(Mod::Dim(b[0] - b'0'));
        }
        if b.first() == Some(&b'm') {
            return parse_shape(&s[1..]);
        }
        None
    }
}

fn parse_shape(s: &str) -> Option<Mod> {
    let (m, rest) = s.split_once('n')?;
    let (n, k) = match rest.split_once('k') {
        Some((n, k)) => (n, Some(k)),
        None => (rest, None),
    };
    let num = |x: &str| -> Option<u16> {
        if x.is_empty() || !x.bytes().all(|c| c.is_ascii_digit()) {
            None
        } else {
            x.parse().ok()
        }
    };
    Some(Mod::Shape {
        m: num(m)?,
        n: num(n)?,
        k: match k {
            Some(k) => Some(num(k)?),
            None => None,
        },
    })
}

impl fmt::Display for Mod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mod::Flag(x) => write!(f, "{x}"),
            Mod::Type(t) => write!(f, "{t}"),
            Mod::Space(s) => write!(f, "{s}"),
            Mod::Vec(n) => write!(f, "v{n}"),
            Mod::X(n) => write!(f, "x{n}"),
            Mod::Dim(n) => write!(f, "{n}d"),
            Mod::Shape { m, n, k: Some(k) } => write!(f, "m{m}n{n}k{k}"),
            Mod::Shape { m, n, k: None } => write!(f, "m{m}n{n}"),
        }
    }
}

impl From<Flag> for Mod {
    fn from(f: Flag) -> Mod {
        Mod::Flag(f)
    }
}
impl From<Ty> for Mod {
    fn from(t: Ty) -> Mod {
        Mod::Type(t)
    }
}
impl From<Space> for Mod {
    fn from(s: Space) -> Mod {
        Mod::Space(s)
    }
}
