//! The texture and surface instruction forms as typed values: the geometry (`.1d` .. `.a2dms`)
//! with the layout of its coordinate vector, the mipmap mode of `tex` (`.base`, `.level`,
//! `.grad`), the `txq`/`suq` query attributes, and the field initialisers of module-scope
//! `.texref`/`.samplerref` variables (`= { addr_mode_0 = wrap, filter_mode = linear }`). The
//! validator checks instructions against these rules and the emulator decodes into them, so the
//! coordinate layout of a geometry is written down once, here.
//!
//! Coordinate vectors as the PTX ISA lays them out (`c` of `[a, c]` / `[a, b, c]`):
//! `.1d` {x}; `.2d` {x, y}; `.3d` {x, y, z, _}; `.a1d` {layer, x}; `.a2d` {layer, x, y, _};
//! `.cube` {x, y, z, _} (a direction); `.acube` {layer, x, y, z}; `.2dms` {sample, x, y, _};
//! `.a2dms` {layer, sample, x, y}. Layer and sample indices are 32-bit integers whatever the
//! coordinate type; `_` slots are ignored.

use crate::ir::{Init, Instruction, VarDecl};
use crate::mods::{Flag, Mod};
use std::fmt;

/// A texture or surface geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TexGeom {
    D1,
    D2,
    D3,
    A1d,
    A2d,
    Cube,
    Acube,
    Dms2,
    A2dms,
}

impl TexGeom {
    /// Every geometry, in PTX ISA order.
    pub const ALL: &'static [TexGeom] = &[
        TexGeom::D1,
        TexGeom::D2,
        TexGeom::D3,
        TexGeom::A1d,
        TexGeom::A2d,
        TexGeom::Cube,
        TexGeom::Acube,
        TexGeom::Dms2,
        TexGeom::A2dms,
    ];

    /// The geometry a modifier names (`.2d` is [`Mod::Dim`], `.a2d` a [`Flag`]).
    pub fn from_mod(m: &Mod) -> Option<TexGeom> {
        Some(match m {
            Mod::Dim(1) => TexGeom::D1,
            Mod::Dim(2) => TexGeom::D2,
            Mod::Dim(3) => TexGeom::D3,
            Mod::Flag(Flag::A1d) => TexGeom::A1d,
            Mod::Flag(Flag::A2d) => TexGeom::A2d,
            Mod::Flag(Flag::Cube) => TexGeom::Cube,
            Mod::Flag(Flag::Acube) => TexGeom::Acube,
            Mod::Flag(Flag::Dms2) => TexGeom::Dms2,
            Mod::Flag(Flag::A2dms) => TexGeom::A2dms,
            _ => return None,
        })
    }

    /// The modifier as written.
    pub fn to_mod(self) -> Mod {
        match self {
            TexGeom::D1 => Mod::Dim(1),
            TexGeom::D2 => Mod::Dim(2),
            TexGeom::D3 => Mod::Dim(3),
            TexGeom::A1d => Flag::A1d.into(),
            TexGeom::A2d => Flag::A2d.into(),
            TexGeom::Cube => Flag::Cube.into(),
            TexGeom::Acube => Flag::Acube.into(),
            TexGeom::Dms2 => Flag::Dms2.into(),
            TexGeom::A2dms => Flag::A2dms.into(),
        }
    }

    /// Elements of the coordinate vector as written (the `_` padding included).
    pub fn coord_len(self) -> usize {
        match self {
            TexGeom::D1 => 1,
            TexGeom::D2 | TexGeom::A1d => 2,
            _ => 4,
        }
    }

    /// Texel-space dimensions addressed by coordinates (a cube direction has 3, sampled on a
    /// 2D face).
    pub fn spatial(self) -> usize {
        match self {
            TexGeom::D1 | TexGeom::A1d => 1,
            TexGeom::D2 | TexGeom::A2d | TexGeom::Dms2 | TexGeom::A2dms => 2,
            TexGeom::D3 | TexGeom::Cube | TexGeom::Acube => 3,
        }
    }

    /// Position of the layer index in the coordinate vector, for layered geometries.
    pub fn layer_slot(self) -> Option<usize> {
        matches!(
            self,
            TexGeom::A1d | TexGeom::A2d | TexGeom::Acube | TexGeom::A2dms
        )
        .then_some(0)
    }

    /// Position of the sample index, for multisample geometries.
    pub fn sample_slot(self) -> Option<usize> {
        match self {
            TexGeom::Dms2 => Some(0),
            TexGeom::A2dms => Some(1),
            _ => None,
        }
    }

    /// Position of the first spatial coordinate.
    pub fn first_coord(self) -> usize {
        match self {
            TexGeom::A1d | TexGeom::A2d | TexGeom::Acube | TexGeom::Dms2 => 1,
            TexGeom::A2dms => 2,
            _ => 0,
        }
    }

    /// Whether coordinates are a cube-map direction.
    pub fn is_cube(self) -> bool {
        matches!(self, TexGeom::Cube | TexGeom::Acube)
    }

    /// Whether the geometry is multisampled.
    pub fn is_ms(self) -> bool {
        matches!(self, TexGeom::Dms2 | TexGeom::A2dms)
    }

    /// Elements of a `tex.grad` gradient vector (`dPdx`, `dPdy`): 1, 2, or 4 for directions
    /// and volumes (the fourth ignored).
    pub fn grad_len(self) -> usize {
        match self.spatial() {
            1 => 1,
            2 => 2,
            _ => 4,
        }
    }

    /// Elements of a coordinate-offset vector (`e`): one per spatial dimension, 4 for `.3d`.
    pub fn offset_len(self) -> usize {
        self.grad_len()
    }
}

impl fmt::Display for TexGeom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_mod())
    }
}

/// How `tex` picks a mipmap level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MipMode {
    /// No modifier: level 0 (compute kernels have no implicit derivatives).
    Implicit,
    /// `.base`: level 0.
    Base,
    /// `.level`: the level of detail is an operand.
    Level,
    /// `.grad`: from the gradient operands `dPdx`, `dPdy`.
    Grad,
}

/// A `txq`/`suq` attribute (the `.level` forms of `txq` query one mipmap level's extent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TexQuery {
    Width,
    Height,
    Depth,
    ChannelDataType,
    ChannelOrder,
    NormalizedCoords,
    FilterMode,
    AddrMode(u8),
    ArraySize,
    NumMipmapLevels,
    NumSamples,
    MemoryLayout,
}

impl TexQuery {
    const FLAGS: [(Flag, TexQuery); 14] = [
        (Flag::Width, TexQuery::Width),
        (Flag::Height, TexQuery::Height),
        (Flag::Depth, TexQuery::Depth),
        (Flag::ChannelDataType, TexQuery::ChannelDataType),
        (Flag::ChannelOrder, TexQuery::ChannelOrder),
        (Flag::NormalizedCoords, TexQuery::NormalizedCoords),
        (Flag::FilterMode, TexQuery::FilterMode),
        (Flag::AddrMode0, TexQuery::AddrMode(0)),
        (Flag::AddrMode1, TexQuery::AddrMode(1)),
        (Flag::AddrMode2, TexQuery::AddrMode(2)),
        (Flag::ArraySize, TexQuery::ArraySize),
        (Flag::NumMipmapLevels, TexQuery::NumMipmapLevels),
        (Flag::NumSamples, TexQuery::NumSamples),
        (Flag::MemoryLayout, TexQuery::MemoryLayout),
    ];

    /// Whether `txq` (`surface == false`) or `suq` accepts the attribute (ptxas 13.5).
    pub fn allowed(self, surface: bool) -> bool {
        use TexQuery::*;
        match self {
            Width | Height | Depth | ChannelDataType | ChannelOrder | ArraySize => true,
            MemoryLayout => surface,
            NormalizedCoords | FilterMode | AddrMode(_) | NumMipmapLevels | NumSamples => !surface,
        }
    }

    /// Whether the attribute is one of a sampler's (a `.samplerref` answers only these).
    pub fn of_sampler(self) -> bool {
        matches!(
            self,
            TexQuery::NormalizedCoords | TexQuery::FilterMode | TexQuery::AddrMode(_)
        )
    }
}

impl Instruction {
    /// The texture/surface geometry modifier, if any.
    pub fn tex_geom(&self) -> Option<TexGeom> {
        self.mods.iter().find_map(TexGeom::from_mod)
    }

    /// `tex`'s mipmap mode.
    pub fn mip_mode(&self) -> MipMode {
        if self.has(Flag::Level) {
            MipMode::Level
        } else if self.has(Flag::Grad) {
            MipMode::Grad
        } else if self.has(Flag::Base) {
            MipMode::Base
        } else {
            MipMode::Implicit
        }
    }

    /// The `txq`/`suq` attribute, if any.
    pub fn tex_query(&self) -> Option<TexQuery> {
        TexQuery::FLAGS
            .iter()
            .find(|(f, _)| self.has(*f))
            .map(|(_, q)| *q)
    }
}

/// A field of a `.texref`/`.samplerref` initialiser.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefField {
    AddrMode(u8),
    FilterMode,
    /// `.texref` only.
    NormalizedCoords,
    /// `.samplerref` only.
    ForceUnnormalizedCoords,
    /// `.texref`'s `width`, `height`, `depth`, `channel_data_type`, `channel_order`: accepted
    /// by ptxas, describing the texture the host binds (the emulator takes them from the
    /// bound object).
    Shape,
}

/// An addressing mode as an initialiser names it (the integers 0..=4 in this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefAddrMode {
    Wrap,
    Mirror,
    ClampOgl,
    ClampToEdge,
    ClampToBorder,
}

/// A field value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefValue {
    AddrMode(RefAddrMode),
    /// `filter_mode`: `linear` / 1 (true) or `nearest` / 0.
    Linear(bool),
    /// A flag (any nonzero integer is true).
    Bool(bool),
    /// A [`RefField::Shape`] value.
    Int(i128),
}

/// Why an initialiser is wrong: ptxas rejects it too (an unknown field or symbol), or ptxas
/// accepts it but it has no meaning here (an enumerator or integer of another field's kind,
/// `addr_mode_0 = linear`): the validator warns, the emulator refuses to load it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefError {
    pub ptxas_rejects: bool,
    pub message: String,
}

const ADDR_MODES: [(&str, RefAddrMode); 5] = [
    ("wrap", RefAddrMode::Wrap),
    ("mirror", RefAddrMode::Mirror),
    ("clamp_ogl", RefAddrMode::ClampOgl),
    ("clamp_to_edge", RefAddrMode::ClampToEdge),
    ("clamp_to_border", RefAddrMode::ClampToBorder),
];

/// The fields a `.texref`/`.samplerref` declaration initialises, checked: an error names the
/// variable and the field and says what is wrong. Variables without initialiser have none.
pub fn ref_fields(v: &VarDecl) -> Result<Vec<(RefField, RefValue)>, RefError> {
    let Some(init) = &v.init else {
        return Ok(Vec::new());
    };
    let sampler = v.ty == crate::Ty::Samplerref;
    let err = |ptxas_rejects: bool, what: String| RefError {
        ptxas_rejects,
        message: format!("`{}`: {what}", v.name),
    };
    let mut out = Vec::new();
    for i in init {
        let Init::Field { name, value } = i else {
            return Err(err(true, "expected `field = value`".into()));
        };
        let field = match name.as_str() {
            "addr_mode_0" => RefField::AddrMode(0),
            "addr_mode_1" => RefField::AddrMode(1),
            "addr_mode_2" => RefField::AddrMode(2),
            "filter_mode" => RefField::FilterMode,
            "normalized_coords" if !sampler => RefField::NormalizedCoords,
            "force_unnormalized_coords" if sampler => RefField::ForceUnnormalizedCoords,
            "width" | "height" | "depth" | "channel_data_type" | "channel_order" if !sampler => {
                RefField::Shape
            }
            _ => return Err(err(true, format!("unknown field `{name}`"))),
        };
        let val = match value.as_ref() {
            Init::Int(n) => field_int(field, *n),
            Init::Sym {
                name: w, offset: 0, ..
            } => field_word(field, w)
                .ok_or_else(|| err(true, format!("unknown value `{w}` for `{name}`")))?,
            _ => return Err(err(true, format!("bad value for `{name}`"))),
        };
        let val = val.ok_or_else(|| err(false, format!("value of another kind for `{name}`")))?;
        out.push((field, val));
    }
    Ok(out)
}

/// An integer field value (`None`: out of the field's range).
fn field_int(field: RefField, n: i128) -> Option<RefValue> {
    Some(match field {
        RefField::AddrMode(_) => RefValue::AddrMode(ADDR_MODES.get(usize::try_from(n).ok()?)?.1),
        RefField::FilterMode if (0..=1).contains(&n) => RefValue::Linear(n == 1),
        RefField::FilterMode => return None,
        RefField::NormalizedCoords | RefField::ForceUnnormalizedCoords => RefValue::Bool(n != 0),
        RefField::Shape => RefValue::Int(n),
    })
}

/// An enumerator field value: `None` for an unknown word, `Some(None)` for one of another
/// field's kind.
fn field_word(field: RefField, w: &str) -> Option<Option<RefValue>> {
    let mode = ADDR_MODES.iter().find(|(n, _)| *n == w).map(|(_, m)| *m);
    let filter = match w {
        "nearest" => Some(false),
        "linear" => Some(true),
        _ => None,
    };
    if mode.is_none() && filter.is_none() {
        return None;
    }
    Some(match field {
        RefField::AddrMode(_) => mode.map(RefValue::AddrMode),
        RefField::FilterMode => filter.map(RefValue::Linear),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Item, Statement};
    use crate::roles::Role;

    fn ins(text: &str) -> Instruction {
        match crate::parse_statements(text).unwrap().remove(0) {
            Statement::Instr(i) => i,
            s => panic!("not an instruction: {s:?}"),
        }
    }

    #[test]
    fn mipmap_operands_by_role() {
        let g = ins("tex.grad.a2d.v4.f32.f32 {%f1,%f2,%f3,%f4}, [%rd1, {%r1,%f2,%f3,%f4}], {%f5,%f6}, {%f7,%f8}, {%r2,%r3};");
        assert_eq!(g.tex_geom(), Some(TexGeom::A2d));
        assert_eq!(g.mip_mode(), MipMode::Grad);
        assert_eq!(g.operand_index(Role::Dpdx), Some(2));
        assert_eq!(g.operand_index(Role::Dpdy), Some(3));
        assert_eq!(g.operand_index(Role::TexOffset), Some(4));
        assert_eq!(g.operand(Role::Lod), None);
        let l = ins("tex.level.cube.v4.f32.f32 {%f1,%f2,%f3,%f4}, [%rd1, {%f1,%f2,%f3,%f4}], %f9;");
        assert_eq!(l.operand_index(Role::Lod), Some(2));
        assert_eq!(l.operand(Role::TexOffset), None);
        let q = ins("txq.level.width.b32 %r1, [%rd1], %r2;");
        assert_eq!(q.tex_query(), Some(TexQuery::Width));
        assert_eq!(q.operand_index(Role::Lod), Some(2));
        let s = ins("tex.2d.v4.f32.f32 {%f1,%f2,%f3,%f4}, [t, smp, {%f5,%f6}];");
        assert!(matches!(
            s.operand(Role::Addr),
            Some(crate::Operand::SampledAddr { .. })
        ));
    }

    #[test]
    fn geometry_layouts() {
        for g in TexGeom::ALL {
            assert_eq!(TexGeom::from_mod(&g.to_mod()), Some(*g));
            // indices before the coordinates, coordinates within the vector
            assert!(g.first_coord() + g.spatial() <= g.coord_len(), "{g}");
            assert!(g.layer_slot().is_none_or(|s| s < g.first_coord()), "{g}");
            assert!(g.sample_slot().is_none_or(|s| s < g.first_coord()), "{g}");
        }
        assert_eq!(TexGeom::A2dms.sample_slot(), Some(1));
        assert_eq!(TexGeom::Acube.first_coord(), 1);
    }

    #[test]
    fn ref_initialisers_round_trip_and_check() {
        let text = ".version 8.7\n.target sm_90a, texmode_independent\n.address_size 64\n\
                    .global .samplerref s = { addr_mode_0 = mirror, filter_mode = linear, \
                    force_unnormalized_coords = 1 };\n.global .texref t;\n";
        let m = crate::parse(text).unwrap();
        assert_eq!(crate::parse(&crate::print(&m)).unwrap(), m);
        let Item::Var(v) = &m.items[0] else {
            panic!("not a variable")
        };
        let f = ref_fields(v).unwrap();
        assert_eq!(
            f,
            vec![
                (
                    RefField::AddrMode(0),
                    RefValue::AddrMode(RefAddrMode::Mirror)
                ),
                (RefField::FilterMode, RefValue::Linear(true)),
                (RefField::ForceUnnormalizedCoords, RefValue::Bool(true)),
            ]
        );
        let cases = [
            ("filter_mode = wrap", false),
            ("addr_mode_1 = 9", false),
            ("normalized_coords = 1", true),
            ("addr_mode_3 = wrap", true),
            ("addr_mode_0 = foo", true),
        ];
        for (bad, ptxas_rejects) in cases {
            let t = format!(".version 8.7\n.target sm_90a\n.address_size 64\n.global .samplerref s = {{ {bad} }};\n");
            let m = crate::parse(&t).unwrap();
            let Item::Var(v) = &m.items[0] else {
                panic!("not a variable")
            };
            let e = ref_fields(v).unwrap_err();
            assert_eq!(e.ptxas_rejects, ptxas_rejects, "{bad}: {e:?}");
            assert!(e.message.contains("`s`"), "{bad}: {e:?}");
        }
    }
}
