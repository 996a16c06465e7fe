//! Descriptor building the texture fetch tests with layered, cube, multisample and mipmapped
//! objects (`isa_tex_geom`, `isa_tex_sampler`) share.

use emu::texture::{Filter, TexDesc};

/// What a texture descriptor adds to a plain texture: layers (0: not layered), cube faces,
/// samples per texel (0: not multisample), mipmap levels and the filter between them.
pub struct Shape {
    pub layers: usize,
    pub cube: bool,
    pub samples: usize,
    pub levels: u32,
    pub mip_linear: bool,
}

/// `d` shaped as `sh` says.
pub fn shaped_desc(mut d: TexDesc, sh: Shape) -> TexDesc {
    if sh.layers > 0 {
        d = d.layered(sh.layers as u32).unwrap();
    }
    if sh.cube {
        d = d.cubemap().unwrap();
    }
    if sh.samples > 0 {
        d = d.multisample(sh.samples as u32).unwrap();
    }
    let mf = if sh.mip_linear {
        Filter::Linear
    } else {
        Filter::Point
    };
    d.mipmapped(sh.levels, mf).unwrap()
}
