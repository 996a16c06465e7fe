//! Texture and surface objects (unified mode): the 64-byte descriptor a kernel's `.u64` handle
//! points at, its host-side builder, and the texel addressing and sampling rules the `tex`,
//! `tld4`, `txq`, `suld`, `sust`, `sured`, `suq` and `istypep` executors (`exec/tex.rs`) apply.
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

use std::sync::Arc;

/// Bytes of an encoded descriptor.
pub const DESC_BYTES: usize = 64;
const MAGIC_SURFACE: u32 = 0x4653_5850; // "PXSF"
const MAGIC_TEXTURE: u32 = 0x5854_5850; // "PXTX"

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
}

impl TexFormat {
    /// Bytes of one channel.
    pub fn bytes(self) -> u32 {
        match self {
            TexFormat::U8 => 1,
            TexFormat::U16 | TexFormat::F16 => 2,
            TexFormat::U32 | TexFormat::F32 => 4,
        }
    }
    fn from_code(c: u8) -> Option<TexFormat> {
        [
            TexFormat::U8,
            TexFormat::U16,
            TexFormat::U32,
            TexFormat::F16,
            TexFormat::F32,
        ]
        .get(c as usize)
        .copied()
    }
    /// Whether a float-returning fetch can read it (floats, and 8/16-bit integers read as
    /// normalized floats in [0, 1] like CUDA's `cudaReadModeNormalizedFloat`).
    pub fn reads_as_float(self) -> bool {
        self != TexFormat::U32
    }
    /// One channel's raw bits as the float a float-returning fetch sees.
    pub fn to_float(self, raw: u64) -> f64 {
        match self {
            TexFormat::U8 => raw as u8 as f64 / 255.0,
            TexFormat::U16 => raw as u16 as f64 / 65535.0,
            TexFormat::U32 => raw as u32 as f64,
            TexFormat::F16 => crate::fp::f16_to_f32(raw as u16) as f64,
            TexFormat::F32 => f32::from_bits(raw as u32) as f64,
        }
    }
    /// Whether an integer-returning fetch can read it.
    pub fn reads_as_int(self) -> bool {
        matches!(self, TexFormat::U8 | TexFormat::U16 | TexFormat::U32)
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

/// Whether a descriptor is a surface or a texture object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjKind {
    Surface,
    Texture,
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
        };
        d.check()?;
        Ok(d)
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
        if self.slice_pitch < self.pitch * self.extent[1] as u64 {
            return Err(bad("slice_pitch", "smaller than pitch * height"));
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

    /// The 64-byte descriptor (checked first).
    pub fn encode(&self) -> Result<[u8; DESC_BYTES], DescError> {
        self.check()?;
        let mut b = [0u8; DESC_BYTES];
        let magic = match self.kind {
            ObjKind::Surface => MAGIC_SURFACE,
            ObjKind::Texture => MAGIC_TEXTURE,
        };
        b[0..4].copy_from_slice(&magic.to_le_bytes());
        b[4] = self.format as u8;
        b[5] = self.channels as u8;
        b[6] = self.dims as u8;
        b[7] = (self.filter == Filter::Linear) as u8 | (self.normalized as u8) << 1;
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
        let kind = match u32at(0) {
            MAGIC_SURFACE => ObjKind::Surface,
            MAGIC_TEXTURE => ObjKind::Texture,
            _ => return Err(bad("magic", "not a ptxforge texture/surface descriptor")),
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
            filter: if b[7] & 1 != 0 {
                Filter::Linear
            } else {
                Filter::Point
            },
            normalized: b[7] & 2 != 0,
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
        let mode = match self.addr_mode[dim] {
            AddrMode::Wrap | AddrMode::Mirror if !self.normalized => AddrMode::Clamp,
            m => m,
        };
        mode.index(i, self.extent[dim] as i64)
    }

    /// A float coordinate along `dim` in texel space (scaled by the extent when normalized).
    pub fn texel_coord(&self, dim: usize, x: f32) -> f64 {
        if self.normalized {
            x as f64 * self.extent[dim] as f64
        } else {
            x as f64
        }
    }
}

/// The sampler state of a texture object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampler {
    pub addr_mode: [AddrMode; 3],
    pub filter: Filter,
    pub normalized: bool,
}

/// A 9-bit fixed-point interpolation weight (8 fractional bits, rounded to nearest) and the
/// lower texel index, for texel-space coordinate `u` (already scaled).
pub fn linear_weight(u: f64) -> (i64, f64) {
    let ub = u - 0.5;
    let i = ub.floor();
    let a = ((ub - i) * 256.0).round() / 256.0;
    (i as i64, a)
}
