//! Texture, surface and sampler objects: the 64-byte descriptor a kernel's `.u64` handle (or a
//! `.texref`/`.surfref`/`.samplerref` variable's slot) holds, its host-side builder, and the
//! texel addressing and sampling rules the `tex`, `tld4`, `txq`, `suld`, `sust`, `sured`, `suq`
//! and `istypep` executors (`exec/tex.rs`, fetches in `exec/tex/fetch.rs`) apply. The sampler
//! state and the sampling geometry are in `texture/sampler.rs` (re-exported here).
//!
//! As with TMA tensor maps ([`crate::hopper::TensorMapDesc`]), the layout is our own (the
//! driver's is opaque): the host encodes a [`TexDesc`] with [`TexDesc::encode`] into device
//! memory, the handle is that memory's address, and the emulator decodes it each time an
//! instruction runs, so a bad handle is a fault naming the handle, never a crash. With the
//! runtime's Device API: upload the bytes of `desc.encode()` (`dev.upload`) and pass the
//! buffer's `device_ptr()` (emulated devices only: on CUDA a texture object comes from
//! `cuTexObjectCreate`). The sanitizer does not watch texture and surface accesses; an access
//! outside every allocation still faults.
//!
//! Sampling follows the CUDA Programming Guide's "Texture Fetching" appendix: point sampling
//! reads texel `floor(x)`; linear filtering reads the texels around `x - 0.5` with weights held
//! in 9-bit fixed point (8 fractional bits, rounded to nearest), interpolated exactly (f64) and
//! rounded once to f32. Normalized coordinates are scaled by the extent first. As in CUDA, wrap
//! and mirror need normalized coordinates; with unnormalized ones they act as clamp. Border
//! texels read zero in every channel. Channels a format lacks read (0, 0, 0, 1).
//!
//! Layers, cube faces, samples and mipmaps. An object is a stack of 2D *planes*: the `z`
//! slices of a 3D object, the layers of a layered (array) one, the six faces of a cube (face
//! `f` of cube `c` of a cube array is plane `6c + f`, faces in CUDA's order +x, -x, +y, -y,
//! +z, -z), the samples of a multisample one (sample `s` of layer `l` is plane
//! `samples * l + s`). Level 0 starts at `base` with the given pitches; level `k > 0` follows
//! level `k - 1` directly, densely packed (pitch = width * texel bytes, slice pitch = pitch *
//! height), with every spatial extent `max(1, extent >> k)` and the same planes (a 3D
//! object's depth shrinks too). [`TexDesc::level_offset`] and [`TexDesc::bytes`] give the
//! layout.
//!
//! Level of detail (what this emulator implements; the Programming Guide leaves it to the
//! graphics APIs): `tex` and `tex.base` take `lambda = 0` (a compute kernel has no implicit
//! derivatives); `tex.level` takes `lambda = lod` (an `.s32` lod with `.s32` coordinates, as
//! ptxas requires); `tex.grad` takes `lambda = log2(rho)`, rho
//! the larger of the lengths of `dPdx` and `dPdy` in level-0 texel units (normalized
//! coordinates scaled by the extent; for a cube, the derivative of the face coordinates, see
//! [`cube_face`]). For `.f32` coordinates the sampler's bias is added and the result clamped
//! to its [min, max] LOD clamps ([`Lod::apply`]; OpenGL 4.6 section 8.14.1: bias, clamps and
//! LOD held in 1/256 units as the hardware's sampler holds them); `.s32`-coordinate fetches
//! read the level they name (OpenGL's `texelFetch`). lambda is then clamped to
//! [0, levels - 1], so a bias past the last level reads the last level. Point mip filtering reads the nearest
//! level (ties to the lower: `ceil(lambda - 0.5)`); linear mip filtering reads levels
//! `floor(lambda)` and the next and blends them with the fraction held, like the texel
//! weights, in 8 fractional bits (rounded to nearest), exactly in f64, rounded once to f32.
//! On level k, a float coordinate is scaled by that level's extent (normalized) or by
//! `extent_k / extent_0` (unnormalized); `.s32` coordinates index the level's texels.
//!
//! Layer and sample indices are 32-bit unsigned integers, clamped to the last layer or
//! sample. Cube coordinates are a direction: [`cube_face`] picks the face and the face
//! coordinates (`(s / m + 1) / 2`) as the Programming Guide's cubemap table defines, sampled
//! with clamp-to-edge on that face. With the sampler's `seamless_cube`
//! (`CU_TRSF_SEAMLESS_CUBEMAP`), linear filtering and `tld4` read a texel past a face edge from
//! the adjacent face, and one past a corner as the average of the three texels meeting at the
//! cube's corner (OpenGL 4.6 section 8.13.1; [`cube_texel`]); point sampling stays on its face.
//! A `.texref`/`.samplerref` initialiser's `clamp_ogl` acts as `clamp_to_edge`.
//!
//! Anisotropic filtering (the sampler's `max_anisotropy` > 1, `tex.grad` only: the other
//! fetches have no derivatives) follows EXT_texture_filter_anisotropic's reference algorithm:
//! N = min(ceil(Pmax / Pmin), max_anisotropy) trilinear samples at lambda = log2(Pmax / N),
//! spaced along the longer derivative at `(i / (N + 1) - 1/2) * dP`, averaged exactly (f64).
//! NVIDIA does not publish its hardware footprint or weights, so these results are the
//! specification's, not bit-exact hardware ones.
//!
//! Depth compare (`tex`/`tld4` with the operand `f`): CUDA's texture descriptor has no compare
//! function, so ptxforge's [`Sampler::compare`] supplies it (OpenGL's `TEXTURE_COMPARE_FUNC`);
//! a fetch with `f` through a sampler without one faults. Each texel the fetch reads becomes
//! `(r, 0, 0, 1)`, r = 1.0 when `f OP texel.x` holds, else 0.0 (OpenGL 4.6 table 15.1 puts a
//! depth result in red; a border texel's depth is 0), before filtering, so linear filtering is percentage-closer filtering,
//! and `tld4` gathers the comparison results. `f` is clamped to [0, 1] for u8/u16 (normalized)
//! formats read as floats; integer fetches compare the raw integers and return 1 or 0. As in
//! ptxas 13.5, which compiles `.s32`-coordinate fetches to TLD (no compare), `f` is ignored
//! there.
//!
//! Samplers: a `.samplerref` variable or an independent-mode sampler handle is a descriptor of
//! kind [`ObjKind::Sampler`]; a fetch through one takes its address modes, filter and the
//! rest of its state ([`SamplerState`]), and unnormalized coordinates when it forces them.
//!
//! Integer surfaces: `sured.p.b32` reduces `U32`/`S32` texels, `sured.p.b64` (min/max, what
//! ptxas 13.5 accepts) `U64`/`S64` texels, signed as the format is (the PTX ISA: the surface
//! format gives the signedness). Module-scope `.texref`/`.surfref` variables
//! are 64-byte descriptor slots the host fills with `LoadedModule::bind_texref` /
//! `bind_surfref`; a kernel reading an unbound one faults naming the variable.

use std::sync::Arc;

mod sampler;
pub use sampler::*;

/// Bytes of an encoded descriptor.
pub const DESC_BYTES: usize = 64;
const MAGIC_SURFACE: u32 = 0x4653_5850; // "PXSF"
const MAGIC_TEXTURE: u32 = 0x5854_5850; // "PXTX"
const MAGIC_SAMPLER: u32 = 0x4d53_5850; // "PXSM"
/// Most mipmap levels (a 65536-texel extent has 17).
pub const MAX_LEVELS: u32 = 17;

/// A descriptor field the host asked for that the emulator cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("texture/surface descriptor field `{field}`: {why}")]
pub struct DescError {
    pub field: &'static str,
    pub why: String,
}

fn bad(field: &'static str, why: impl Into<String>) -> DescError {
    DescError {
        field,
        why: why.into(),
    }
}

/// Element (channel) format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TexFormat {
    U8,
    U16,
    U32,
    F16,
    F32,
    /// Signed 32-bit integers (`sured.p.b32` min/max compare them signed).
    S32,
    /// 64-bit integers: surfaces only (`suld.b`/`sust.b`/`sured.b`, `sured.p.b64` min/max);
    /// no fetch or `sust.p` reads or writes them.
    U64,
    S64,
}

impl TexFormat {
    /// Bytes of one channel.
    pub fn bytes(self) -> u32 {
        match self {
            TexFormat::U8 => 1,
            TexFormat::U16 | TexFormat::F16 => 2,
            TexFormat::U32 | TexFormat::F32 | TexFormat::S32 => 4,
            TexFormat::U64 | TexFormat::S64 => 8,
        }
    }
    fn from_code(c: u8) -> Option<TexFormat> {
        [
            TexFormat::U8,
            TexFormat::U16,
            TexFormat::U32,
            TexFormat::F16,
            TexFormat::F32,
            TexFormat::S32,
            TexFormat::U64,
            TexFormat::S64,
        ]
        .get(c as usize)
        .copied()
    }
    /// Whether a float-returning fetch can read it (floats, and 8/16-bit integers read as
    /// normalized floats in [0, 1] like CUDA's `cudaReadModeNormalizedFloat`).
    pub fn reads_as_float(self) -> bool {
        matches!(
            self,
            TexFormat::U8 | TexFormat::U16 | TexFormat::F16 | TexFormat::F32
        )
    }
    /// One channel's raw bits as the float a float-returning fetch sees.
    pub fn to_float(self, raw: u64) -> f64 {
        match self {
            TexFormat::U8 => raw as u8 as f64 / 255.0,
            TexFormat::U16 => raw as u16 as f64 / 65535.0,
            TexFormat::U32 => raw as u32 as f64,
            TexFormat::F16 => crate::fp::f16_to_f32(raw as u16) as f64,
            TexFormat::F32 => f32::from_bits(raw as u32) as f64,
            TexFormat::S32 | TexFormat::U64 | TexFormat::S64 => self.to_int(raw),
        }
    }
    /// One channel's raw bits as the integer an integer fetch sees (signed formats
    /// sign-extended; 64-bit values rounded to f64).
    pub fn to_int(self, raw: u64) -> f64 {
        match self {
            TexFormat::S32 => raw as u32 as i32 as f64,
            TexFormat::S64 => raw as i64 as f64,
            TexFormat::U64 => raw as f64,
            _ => (raw & (u64::MAX >> (64 - 8 * self.bytes()))) as f64,
        }
    }
    /// Whether an integer-returning fetch can read it.
    pub fn reads_as_int(self) -> bool {
        matches!(
            self,
            TexFormat::U8 | TexFormat::U16 | TexFormat::U32 | TexFormat::S32
        )
    }
    /// Whether integer comparisons on it are signed.
    pub fn signed(self) -> bool {
        matches!(self, TexFormat::S32 | TexFormat::S64)
    }
    /// The raw channel bits `sust.p` stores for source register bits `x`: floats and the
    /// normalized 8/16-bit formats take an `.f32` (f16 rounded to nearest even; u8/u16 as
    /// `round_half_even(clamp(x, 0, 1) * max)`, NaN as 0), `U32` the 32 bits unchanged.
    pub fn from_store(self, x: u32) -> u64 {
        let f = f32::from_bits(x) as f64;
        let unorm = |max: f64| {
            if f.is_nan() {
                0
            } else {
                (f.clamp(0.0, 1.0) * max).round_ties_even() as u64
            }
        };
        match self {
            TexFormat::U8 => unorm(255.0),
            TexFormat::U16 => unorm(65535.0),
            TexFormat::U32 | TexFormat::F32 | TexFormat::S32 | TexFormat::U64 => x as u64,
            TexFormat::S64 => x as i32 as i64 as u64,
            TexFormat::F16 => crate::fp::f32_to_f16_rn(f32::from_bits(x)) as u64,
        }
    }
}

/// Texture addressing mode (CUDA's `cudaTextureAddressMode` order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddrMode {
    Wrap,
    Clamp,
    Mirror,
    Border,
}

impl AddrMode {
    fn from_code(c: u8) -> Option<AddrMode> {
        [
            AddrMode::Wrap,
            AddrMode::Clamp,
            AddrMode::Mirror,
            AddrMode::Border,
        ]
        .get(c as usize)
        .copied()
    }
    /// The value `txq.addr_mode_N` reports (the PTX ISA's enumeration: wrap 0, mirror 1,
    /// clamp_ogl 2, clamp_to_edge 3, clamp_to_border 4).
    pub fn txq_value(self) -> u32 {
        match self {
            AddrMode::Wrap => 0,
            AddrMode::Mirror => 1,
            AddrMode::Clamp => 3,
            AddrMode::Border => 4,
        }
    }
    /// Texel index `i` of an extent `n` after addressing; `None` for a border texel.
    pub fn index(self, i: i64, n: i64) -> Option<i64> {
        match self {
            AddrMode::Wrap => Some(i.rem_euclid(n)),
            AddrMode::Mirror => {
                let p = i.rem_euclid(2 * n);
                Some(if p < n { p } else { 2 * n - 1 - p })
            }
            AddrMode::Clamp => Some(i.clamp(0, n - 1)),
            AddrMode::Border => (0..n).contains(&i).then_some(i),
        }
    }
}

/// Texture filter mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    Point,
    Linear,
}

/// Whether a descriptor is a surface, a texture or a sampler (a `.samplerref`: only the
/// sampler state is meaningful).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjKind {
    Surface,
    Texture,
    Sampler,
}

/// A surface or texture object over a 1D/2D/3D array in device memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TexDesc {
    pub kind: ObjKind,
    /// Device address of texel (0, 0, 0).
    pub base: u64,
    pub format: TexFormat,
    /// Channels per texel: 1, 2 or 4.
    pub channels: u32,
    /// 1, 2 or 3.
    pub dims: u32,
    /// Width, height, depth in texels (1 beyond `dims`).
    pub extent: [u32; 3],
    /// Bytes from one row to the next.
    pub pitch: u64,
    /// Bytes from one 2D slice to the next.
    pub slice_pitch: u64,
    /// Per dimension (textures only).
    pub addr_mode: [AddrMode; 3],
    pub filter: Filter,
    pub normalized: bool,
    /// Layers of a layered (array) object; 0 when not layered.
    pub layers: u32,
    /// Six faces per layer (2D, square).
    pub cube: bool,
    /// Samples per texel of a multisample object; 0 when not multisampled.
    pub samples: u32,
    /// Mipmap levels (1: none).
    pub levels: u32,
    /// Filter between mipmap levels.
    pub mip_filter: Filter,
    /// Depth compare, LOD bias and clamps, seamless cube filtering, anisotropy (textures and
    /// samplers; a surface keeps the default).
    pub state: SamplerState,
}

impl TexDesc {
    /// A densely packed surface over `extent` (1 to 3 dimensions) at `base`.
    pub fn surface(
        base: u64,
        format: TexFormat,
        channels: u32,
        extent: &[u32],
    ) -> Result<TexDesc, DescError> {
        let dims = extent.len() as u32;
        if !(1..=3).contains(&dims) {
            return Err(bad("extent", format!("{dims} dimensions (must be 1..3)")));
        }
        let mut e = [1u32; 3];
        e[..extent.len()].copy_from_slice(extent);
        let pitch = e[0] as u64 * (format.bytes() * channels) as u64;
        let d = TexDesc {
            kind: ObjKind::Surface,
            base,
            format,
            channels,
            dims,
            extent: e,
            pitch,
            slice_pitch: pitch * e[1] as u64,
            addr_mode: [AddrMode::Clamp; 3],
            filter: Filter::Point,
            normalized: false,
            layers: 0,
            cube: false,
            samples: 0,
            levels: 1,
            mip_filter: Filter::Point,
            state: SamplerState::default(),
        };
        d.check()?;
        Ok(d)
    }

    /// A sampler object (`.samplerref` state, or an independent-mode sampler handle):
    /// `normalized == false` forces unnormalized coordinates.
    pub fn sampler(sampler: Sampler) -> Result<TexDesc, DescError> {
        Ok(TexDesc {
            kind: ObjKind::Sampler,
            base: 0,
            format: TexFormat::U8,
            channels: 1,
            dims: 1,
            extent: [1; 3],
            pitch: 1,
            slice_pitch: 1,
            addr_mode: sampler.addr_mode,
            filter: sampler.filter,
            normalized: sampler.normalized,
            layers: 0,
            cube: false,
            samples: 0,
            levels: 1,
            mip_filter: Filter::Point,
            state: sampler.state()?,
        })
    }

    /// The same object as a layered (array) one with `layers` layers; slices are layers
    /// (densely packed after row `height - 1` unless [`TexDesc::with_pitch`] says otherwise).
    pub fn layered(mut self, layers: u32) -> Result<TexDesc, DescError> {
        if self.dims == 3 {
            return Err(bad("layers", "a 3D object cannot be layered"));
        }
        self.layers = layers;
        self.check()?;
        Ok(self)
    }

    /// The same 2D square object as a cube map (six faces per layer).
    pub fn cubemap(mut self) -> Result<TexDesc, DescError> {
        self.cube = true;
        self.check()?;
        Ok(self)
    }

    /// The same 2D object with `samples` samples per texel.
    pub fn multisample(mut self, samples: u32) -> Result<TexDesc, DescError> {
        self.samples = samples;
        self.check()?;
        Ok(self)
    }

    /// The same object with a chain of `levels` mipmap levels and filter `mip_filter` between
    /// them (the layout is in the module docs).
    pub fn mipmapped(mut self, levels: u32, mip_filter: Filter) -> Result<TexDesc, DescError> {
        self.levels = levels;
        self.mip_filter = mip_filter;
        self.check()?;
        Ok(self)
    }

    /// 2D planes per level: depth (3D), layers, 6 faces per layer, samples per layer.
    pub fn planes(&self, level: u32) -> u64 {
        let layers = self.layers.max(1) as u64;
        if self.dims == 3 {
            self.level_extent(level)[2] as u64
        } else if self.cube {
            6 * layers
        } else {
            self.samples.max(1) as u64 * layers
        }
    }

    /// Extent of mipmap level `level` (`max(1, extent >> level)` per spatial dimension).
    pub fn level_extent(&self, level: u32) -> [u32; 3] {
        let mut e = self.extent;
        for x in e.iter_mut().take(self.dims as usize) {
            *x = (*x >> level.min(31)).max(1);
        }
        e
    }

    /// Row and plane pitches of level `level`.
    pub fn level_pitches(&self, level: u32) -> (u64, u64) {
        if level == 0 {
            return (self.pitch, self.slice_pitch);
        }
        let e = self.level_extent(level);
        let p = e[0] as u64 * self.texel_bytes() as u64;
        (p, p * e[1] as u64)
    }

    /// Byte offset of level `level` from `base` (saturating: [`TexDesc::check`] rejects a
    /// layout that wraps the address space).
    pub fn level_offset(&self, level: u32) -> u64 {
        (0..level).fold(0u64, |acc, k| {
            acc.saturating_add(self.level_pitches(k).1.saturating_mul(self.planes(k)))
        })
    }

    /// Bytes the object spans from `base` (all levels and planes).
    pub fn bytes(&self) -> u64 {
        self.level_offset(self.levels)
    }

    /// Device address of texel `(x, y)` of plane `plane` of level `level`, plus `byte`.
    pub fn level_texel_addr(&self, level: u32, x: i64, y: i64, plane: i64, byte: u64) -> u64 {
        let (p, sp) = self.level_pitches(level);
        self.base
            .wrapping_add(self.level_offset(level))
            .wrapping_add(x as u64 * self.texel_bytes() as u64)
            .wrapping_add(y as u64 * p)
            .wrapping_add(plane as u64 * sp)
            .wrapping_add(byte)
    }

    /// A densely packed texture object with the given sampler state.
    pub fn texture(
        base: u64,
        format: TexFormat,
        channels: u32,
        extent: &[u32],
        sampler: Sampler,
    ) -> Result<TexDesc, DescError> {
        let mut d = TexDesc::surface(base, format, channels, extent)?;
        d.kind = ObjKind::Texture;
        d.addr_mode = sampler.addr_mode;
        d.filter = sampler.filter;
        d.normalized = sampler.normalized;
        d.state = sampler.state()?;
        d.check()?;
        Ok(d)
    }

    /// The same object with explicit row and slice pitches (bytes).
    pub fn with_pitch(mut self, pitch: u64, slice_pitch: u64) -> Result<TexDesc, DescError> {
        self.pitch = pitch;
        self.slice_pitch = slice_pitch;
        self.check()?;
        Ok(self)
    }

    /// Bytes of one texel.
    pub fn texel_bytes(&self) -> u32 {
        self.format.bytes() * self.channels
    }

    /// Device address of texel `(x, y, z)` (in range) plus `byte` bytes.
    pub fn texel_addr(&self, idx: [i64; 3], byte: u64) -> u64 {
        self.base
            .wrapping_add(idx[0] as u64 * self.texel_bytes() as u64)
            .wrapping_add(idx[1] as u64 * self.pitch)
            .wrapping_add(idx[2] as u64 * self.slice_pitch)
            .wrapping_add(byte)
    }

    fn check(&self) -> Result<(), DescError> {
        self.check_state()?;
        if self.kind == ObjKind::Sampler {
            return Ok(());
        }
        self.check_shape()?;
        if self.base == 0 {
            return Err(bad("base", "null address"));
        }
        if ![1, 2, 4].contains(&self.channels) {
            return Err(bad(
                "channels",
                format!("{} (must be 1, 2 or 4)", self.channels),
            ));
        }
        if !(1..=3).contains(&self.dims) {
            return Err(bad("dims", format!("{} (must be 1..3)", self.dims)));
        }
        for (i, &n) in self.extent.iter().enumerate() {
            if n == 0 || (i as u32 >= self.dims && n != 1) || n > 1 << 16 {
                return Err(bad("extent", format!("dimension {i} is {n}")));
            }
        }
        let row = self.extent[0] as u64 * self.texel_bytes() as u64;
        if self.pitch < row {
            return Err(bad("pitch", format!("{} < row bytes {row}", self.pitch)));
        }
        if self.slice_pitch < self.pitch.saturating_mul(self.extent[1] as u64) {
            return Err(bad("slice_pitch", "smaller than pitch * height"));
        }
        if self.bytes() == u64::MAX || self.bytes().checked_add(self.base).is_none() {
            return Err(bad("extent", "the object wraps the address space"));
        }
        if self.kind == ObjKind::Texture
            && self.filter == Filter::Linear
            && !self.format.reads_as_float()
        {
            return Err(bad(
                "filter",
                "linear filtering needs a float-readable format",
            ));
        }
        Ok(())
    }

    /// The sampler state a decoded descriptor carries is one [`Sampler::state`] can make.
    fn check_state(&self) -> Result<(), DescError> {
        let s = &self.state;
        let max = (MAX_LOD * 256.0) as i16;
        if !(1..=16).contains(&s.max_anisotropy) {
            return Err(bad("max_anisotropy", format!("{}", s.max_anisotropy)));
        }
        if !(-max..=max).contains(&s.lod.bias) {
            return Err(bad("lod_bias", "out of [-16, 16]"));
        }
        if s.lod.min < 0 || s.lod.min > s.lod.max || s.lod.max > max {
            return Err(bad("min_lod_clamp", "clamps out of order or range"));
        }
        Ok(())
    }

    /// Layers, cube, samples and levels agree with each other and the dimensions.
    fn check_shape(&self) -> Result<(), DescError> {
        if self.layers > 1 << 16 {
            return Err(bad("layers", format!("{} (at most 65536)", self.layers)));
        }
        if self.cube && (self.dims != 2 || self.extent[0] != self.extent[1]) {
            return Err(bad("cube", "a cube map is 2D with width == height"));
        }
        if self.samples > 16 || (self.samples > 0 && (self.dims != 2 || self.cube)) {
            return Err(bad("samples", format!("{} (2D, at most 16)", self.samples)));
        }
        let max_levels = 32
            - self
                .extent
                .iter()
                .max()
                .copied()
                .unwrap_or(1)
                .leading_zeros();
        if self.levels == 0 || self.levels > max_levels.min(MAX_LEVELS) {
            let why = format!("{} (1..={max_levels} for this extent)", self.levels);
            return Err(bad("levels", why));
        }
        if self.levels > 1 && self.samples > 0 {
            return Err(bad("levels", "a multisample object has no mipmaps"));
        }
        Ok(())
    }

    /// The 64-byte descriptor (checked first).
    pub fn encode(&self) -> Result<[u8; DESC_BYTES], DescError> {
        self.check()?;
        let mut b = [0u8; DESC_BYTES];
        let magic = match self.kind {
            ObjKind::Surface => MAGIC_SURFACE,
            ObjKind::Texture => MAGIC_TEXTURE,
            ObjKind::Sampler => MAGIC_SAMPLER,
        };
        b[0..4].copy_from_slice(&magic.to_le_bytes());
        b[4] = self.format as u8;
        b[5] = self.channels as u8;
        b[6] = self.dims as u8;
        b[7] = (self.filter == Filter::Linear) as u8
            | (self.normalized as u8) << 1
            | ((self.mip_filter == Filter::Linear) as u8) << 2
            | (self.cube as u8) << 3
            | (self.state.seamless_cube as u8) << 4;
        b[14] = CompareFunc::code(self.state.compare);
        b[15] = self.state.max_anisotropy;
        b[28..30].copy_from_slice(&self.state.lod.bias.to_le_bytes());
        b[30..32].copy_from_slice(&self.state.lod.min.to_le_bytes());
        b[60..62].copy_from_slice(&self.state.lod.max.to_le_bytes());
        b[12] = self.levels as u8;
        b[13] = self.samples as u8;
        b[56..60].copy_from_slice(&self.layers.to_le_bytes());
        for i in 0..3 {
            b[8 + i] = self.addr_mode[i] as u8;
            b[16 + 4 * i..20 + 4 * i].copy_from_slice(&self.extent[i].to_le_bytes());
        }
        b[32..40].copy_from_slice(&self.base.to_le_bytes());
        b[40..48].copy_from_slice(&self.pitch.to_le_bytes());
        b[48..56].copy_from_slice(&self.slice_pitch.to_le_bytes());
        Ok(b)
    }

    /// Reads a descriptor back; an error says why the bytes are not one.
    pub fn decode(b: &[u8; DESC_BYTES]) -> Result<TexDesc, DescError> {
        let u32at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64at = |o: usize| u64::from(u32at(o)) | u64::from(u32at(o + 4)) << 32;
        let i16at = |o: usize| i16::from_le_bytes([b[o], b[o + 1]]);
        let kind = match u32at(0) {
            MAGIC_SURFACE => ObjKind::Surface,
            MAGIC_TEXTURE => ObjKind::Texture,
            MAGIC_SAMPLER => ObjKind::Sampler,
            _ => return Err(bad("magic", "not a ptxforge texture/surface descriptor")),
        };
        let linear = |bit: u8| {
            if b[7] & bit != 0 {
                Filter::Linear
            } else {
                Filter::Point
            }
        };
        let mode = |i: usize| AddrMode::from_code(b[8 + i]).ok_or(bad("addr_mode", "bad code"));
        let d = TexDesc {
            kind,
            base: u64at(32),
            format: TexFormat::from_code(b[4]).ok_or(bad("format", "bad code"))?,
            channels: b[5] as u32,
            dims: b[6] as u32,
            extent: [u32at(16), u32at(20), u32at(24)],
            pitch: u64at(40),
            slice_pitch: u64at(48),
            addr_mode: [mode(0)?, mode(1)?, mode(2)?],
            filter: linear(1),
            normalized: b[7] & 2 != 0,
            layers: u32at(56),
            cube: b[7] & 8 != 0,
            samples: b[13] as u32,
            levels: b[12] as u32,
            mip_filter: linear(4),
            state: SamplerState {
                compare: CompareFunc::from_code(b[14])?,
                lod: Lod {
                    bias: i16at(28),
                    min: i16at(30),
                    max: i16at(60),
                },
                seamless_cube: b[7] & 16 != 0,
                max_anisotropy: b[15],
            },
        };
        d.check()?;
        Ok(d)
    }

    /// Writes the descriptor into a fresh allocation of `mem`; the allocation's base address is
    /// the handle a kernel receives. Keep the allocation alive while kernels use the handle.
    pub fn upload(
        &self,
        mem: &crate::GlobalMemory,
        device: u32,
    ) -> Result<Arc<crate::Allocation>, crate::EmuError> {
        let bytes = self
            .encode()
            .map_err(|e| crate::EmuError::Memory(e.to_string()))?;
        let a = mem.alloc(DESC_BYTES as u64, device)?;
        a.write_bytes(0, &bytes);
        Ok(a)
    }

    /// The texel index along dimension `dim` for texel-space index `i`, after the addressing
    /// mode (wrap and mirror act as clamp on unnormalized coordinates); `None` for border.
    pub fn address(&self, dim: usize, i: i64) -> Option<i64> {
        self.address_in(dim, i, self.extent[dim])
    }

    /// [`TexDesc::address`] on an extent of `n` texels (a mipmap level's).
    pub fn address_in(&self, dim: usize, i: i64, n: u32) -> Option<i64> {
        let mode = match self.addr_mode[dim] {
            AddrMode::Wrap | AddrMode::Mirror if !self.normalized => AddrMode::Clamp,
            m => m,
        };
        mode.index(i, n as i64)
    }

    /// A float coordinate along `dim` in texel space (scaled by the extent when normalized).
    pub fn texel_coord(&self, dim: usize, x: f32) -> f64 {
        self.level_coord(0, dim, x as f64)
    }

    /// A float coordinate along `dim` in texel space of level `level`.
    pub fn level_coord(&self, level: u32, dim: usize, x: f64) -> f64 {
        let e = self.level_extent(level)[dim] as f64;
        if self.normalized {
            x * e
        } else {
            x * e / self.extent[dim] as f64
        }
    }

    /// The object with a sampler's state (address modes, filter; unnormalized coordinates
    /// when the sampler forces them).
    pub fn with_sampler(mut self, s: &TexDesc) -> TexDesc {
        self.addr_mode = s.addr_mode;
        self.filter = s.filter;
        self.normalized &= s.normalized;
        self.state = s.state;
        self
    }

    /// The mipmap levels and their weights a fetch at level of detail `lambda` reads
    /// (`lambda` NaN or below 0 reads level 0).
    pub fn mip_levels(&self, lambda: f64) -> [(u32, f64); 2] {
        let top = (self.levels - 1) as f64;
        let l = if lambda.is_nan() {
            0.0
        } else {
            lambda.clamp(0.0, top)
        };
        if self.mip_filter == Filter::Point {
            return [((l - 0.5).ceil().max(0.0) as u32, 1.0), (0, 0.0)];
        }
        let lo = l.floor();
        let f = ((l - lo) * 256.0).round() / 256.0;
        let hi = (lo + 1.0).min(top);
        [(lo as u32, 1.0 - f), (hi as u32, f)]
    }
}

/// The initial 64 bytes of a module-scope `.texref`/`.surfref`/`.samplerref` variable's slot
/// (`None` for other variables): zeros (unbound) for textures and surfaces, the sampler its
/// initialiser describes for a `.samplerref` (unset fields: clamp, point, normalized).
pub fn ref_slot(v: &ptx::VarDecl) -> Result<Option<[u8; DESC_BYTES]>, DescError> {
    match v.ty {
        ptx::Ty::Texref | ptx::Ty::Surfref => {
            ptx::texture::ref_fields(v).map_err(|e| bad("initialiser", e.message))?;
            Ok(Some([0; DESC_BYTES]))
        }
        ptx::Ty::Samplerref => {
            let s = Sampler::new([AddrMode::Clamp; 3], Filter::Point, true);
            let d = apply_ref_fields(TexDesc::sampler(s)?, v)?;
            d.encode().map(Some)
        }
        _ => Ok(None),
    }
}

/// `desc` with the sampler fields of `v`'s initialiser applied (what binding a texture to a
/// `.texref` declared `= { filter_mode = linear, ... }` does).
pub fn apply_ref_fields(mut desc: TexDesc, v: &ptx::VarDecl) -> Result<TexDesc, DescError> {
    use ptx::texture::{RefAddrMode as M, RefField as F, RefValue as V};
    for (f, val) in ptx::texture::ref_fields(v).map_err(|e| bad("initialiser", e.message))? {
        match (f, val) {
            (F::AddrMode(i), V::AddrMode(m)) => {
                desc.addr_mode[i as usize] = match m {
                    M::Wrap => AddrMode::Wrap,
                    M::Mirror => AddrMode::Mirror,
                    M::ClampOgl | M::ClampToEdge => AddrMode::Clamp,
                    M::ClampToBorder => AddrMode::Border,
                }
            }
            (F::FilterMode, V::Linear(l)) => {
                desc.filter = if l { Filter::Linear } else { Filter::Point }
            }
            (F::NormalizedCoords, V::Bool(b)) => desc.normalized = b,
            (F::ForceUnnormalizedCoords, V::Bool(b)) => desc.normalized = !b,
            // the bound object's shape is the texture's; the declaration's is informative
            (F::Shape, _) => {}
            _ => return Err(bad("initialiser", format!("`{}`: bad field value", v.name))),
        }
    }
    Ok(desc)
}
