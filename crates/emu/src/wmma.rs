//! Warp matrix functions (`wmma.load`, `wmma.store`, `wmma.mma`), sparse `mma.sp` and
//! `movmatrix`: their decoded forms and the arithmetic on whole-warp fragments (sparse and
//! sub-byte arithmetic: [`crate::mma_sp`], [`crate::mma_any`]).
//!
//! # wmma fragment layout
//! PTX leaves the wmma fragment layout unspecified. This emulator chooses one that coincides
//! with the documented `mma.sync` fragments, which is what lowering wmma m16n16k16 to two
//! m16n8k16 HMMAs on sm_80+ implies (not checked on hardware here; code that relies on the
//! layout is outside PTX's contract anyway), extended uniformly to every shape:
//! a fragment is a sequence of 8x8 "core" tiles (for A and B, 8 rows by one 32-bit register
//! width), each held exactly as an `mma.sync` fragment holds it: for lane `l`, `g = l >> 2`,
//! `q = l & 3`,
//! - A (`m x k`, `pr` elements per 32 bits): lane holds row `g`, columns `q*pr .. q*pr+pr` of a
//!   core; cores are ordered row block fastest (so `wmma` m16n16k16 A equals `mma` m16n8k16 A);
//! - B (`k x n`): lane holds column `g`, rows `q*pr ..`; cores ordered k block fastest;
//! - C/D (`m x n`): lane holds row `g`, columns `2q, 2q+1`; cores ordered row block fastest
//!   (so the m16n16 accumulator is two `mma` m16n8 accumulators, columns 0-7 then 8-15).
//!
//! PTX fixes the register count of each fragment; where it holds more elements than the matrix
//! has per lane (the f16 A/B fragments: 16 halves each) the extra elements repeat the first ones
//! (element `e` is element `e mod distinct`), as Volta's duplicated operands do. Loads fill
//! every copy, `wmma.mma` reads the first copy and writes every copy of D, stores write the
//! first copy; so element-wise operations on fragments (scaling every element) behave as on
//! hardware. The `.row`/`.col` qualifiers of `wmma.mma` describe how A and B were loaded; the
//! fragment here is layout-independent (the load did the transposition), so `wmma.mma` reads
//! them only to check that they are present.
//!
//! The sub-byte forms (m8n8k32 `.s4`/`.u4`, m8n8k128 `.b1`) follow the same rule: A and B are
//! one register per lane (8 nibbles or 32 bits along k, element `j` in bits `j*bits ..`), so
//! they equal the `mma` m8n8k32 / m8n8k128 fragments and `wmma.mma` runs as that `mma`. PTX
//! allows only row-major A and column-major B for them, so each lane's register is 32
//! consecutive bits of memory (element `i` of a row at bit `i*bits` from the row's first byte,
//! low bits of a byte first), loaded as one 32-bit word.
//!
//! # Numerics
//! Float `wmma.mma` uses the same model as `mma.sync` ([`crate::tc_numerics`] for the target, or
//! exact: f64 products summed in k order, C added, one rounding); integer forms are exact
//! (wrapping or `.satfinite`); f64 uses fused multiply-adds in k order.

use crate::mma::{round_to, to_f64, to_i64};
use crate::program::MSpace;
use crate::tc_numerics::{self as tc, TcModel};
use crate::Lanes;
use ptx::{Flag, Instruction, Mod, Opcode, Ty};

/// Which operand a fragment is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FragKind {
    A,
    B,
    /// C or D (the accumulator).
    C,
}

/// The shape of one wmma fragment: its matrix (`rows x cols`) and element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frag {
    pub kind: FragKind,
    pub ty: Ty,
    pub rows: usize,
    pub cols: usize,
}

/// Bits of one fragment element (sub-byte types included; f64: 64).
fn elem_bits(t: Ty) -> u32 {
    match t {
        Ty::F64 => 64,
        _ => crate::mma_any::bits(t),
    }
}

/// Elements held by one register (f64: one 64-bit register each).
fn per_reg(t: Ty) -> usize {
    (32 / elem_bits(t).min(32)) as usize
}

/// Elements of A/B per 32-bit register width of a core tile (f64: one element).
fn pr_ab(t: Ty) -> usize {
    per_reg(t)
}

/// The sub-byte and single-bit element types (`wmma` m8n8k32 / m8n8k128).
pub fn is_sub_byte(t: Ty) -> bool {
    matches!(t, Ty::S4 | Ty::U4 | Ty::B1)
}

impl Frag {
    /// The fragment of operand `kind` of shape `m x n x k`.
    pub fn new(kind: FragKind, ty: Ty, (m, n, k): (u32, u32, u32)) -> Frag {
        let (rows, cols) = match kind {
            FragKind::A => (m, k),
            FragKind::B => (k, n),
            FragKind::C => (m, n),
        };
        Frag {
            kind,
            ty,
            rows: rows as usize,
            cols: cols as usize,
        }
    }

    /// Registers PTX gives this fragment (64-bit registers for f64).
    pub fn regs(&self) -> usize {
        if self.kind != FragKind::C && matches!(self.ty, Ty::F16) {
            return 8;
        }
        (self.distinct() / per_reg(self.ty)).max(1)
    }

    /// Elements per lane in the registers.
    pub fn elems(&self) -> usize {
        self.regs() * per_reg(self.ty)
    }

    /// Distinct matrix elements per lane.
    pub fn distinct(&self) -> usize {
        self.rows * self.cols / 32
    }

    /// Position `(row, col)` in the matrix of element `e` of lane `lane` (module docs).
    pub fn pos(&self, lane: usize, e: usize) -> (usize, usize) {
        let d = e % self.distinct().max(1);
        let (g, q) = (lane >> 2, lane & 3);
        match self.kind {
            FragKind::A => {
                let pr = pr_ab(self.ty);
                let (core, w) = (d / pr, d % pr);
                let rb = self.rows / 8;
                (8 * (core % rb) + g, (core / rb) * 4 * pr + q * pr + w)
            }
            FragKind::B => {
                let pr = pr_ab(self.ty);
                let (core, w) = (d / pr, d % pr);
                let kb = (self.rows / (4 * pr)).max(1);
                ((core % kb) * 4 * pr + q * pr + w, 8 * (core / kb) + g)
            }
            FragKind::C => {
                let (core, w) = (d / 2, d % 2);
                let rb = self.rows / 8;
                (8 * (core % rb) + g, 8 * (core / rb) + 2 * q + w)
            }
        }
    }

    /// Raw bits of element `e` of lane `lane` in fragment registers `regs`.
    pub fn get(&self, regs: &[&Lanes], lane: usize, e: usize) -> u64 {
        let pr = per_reg(self.ty);
        let Some(r) = regs.get(e / pr) else { return 0 };
        let w = elem_bits(self.ty);
        if w >= 64 {
            r[lane]
        } else {
            (r[lane] >> ((e % pr) as u32 * w)) & ((1u64 << w) - 1)
        }
    }

    /// Stores raw bits of element `e` of lane `lane` into `out` (registers, zeroed beforehand).
    pub fn put(&self, out: &mut [Lanes], lane: usize, e: usize, bits: u64) {
        let pr = per_reg(self.ty);
        let w = elem_bits(self.ty);
        if let Some(r) = out.get_mut(e / pr) {
            if w >= 64 {
                r[lane] = bits;
            } else {
                r[lane] |= (bits & ((1u64 << w) - 1)) << ((e % pr) as u32 * w);
            }
        }
    }
}

/// The shapes and types PTX lists for `wmma`.
fn check_form(shape: (u32, u32, u32), aty: Ty, cty: Ty) -> Result<(), String> {
    let (m, n, k) = shape;
    let big = matches!((m, n, k), (16, 16, 16) | (32, 8, 16) | (8, 32, 16));
    let ok = match aty {
        Ty::F16 => big && matches!(cty, Ty::F16 | Ty::F32),
        Ty::Bf16 => big && cty == Ty::F32,
        Ty::S8 | Ty::U8 => big && cty == Ty::S32,
        Ty::Tf32 => (m, n, k) == (16, 16, 8) && cty == Ty::F32,
        Ty::F64 => (m, n, k) == (8, 8, 4) && cty == Ty::F64,
        Ty::S4 | Ty::U4 => (m, n, k) == (8, 8, 32) && cty == Ty::S32,
        Ty::B1 => (m, n, k) == (8, 8, 128) && cty == Ty::S32,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "unsupported wmma form .m{m}n{n}k{k} with .{aty} inputs and .{cty} accumulators"
        ))
    }
}

fn shape_of(ins: &Instruction) -> Result<(u32, u32, u32), String> {
    match ins.shape() {
        Some(Mod::Shape { m, n, k: Some(k) }) => Ok((m as u32, n as u32, k as u32)),
        _ => Err(format!("`{}` needs a .mMnNkK shape", ins.op.name())),
    }
}

/// `wmma.load.{a,b,c}` / `wmma.store.d`: which fragment, and whether memory is row-major.
pub fn ldst_frag(ins: &Instruction) -> Result<(Frag, bool), String> {
    let shape = shape_of(ins)?;
    let kind = match ins.op {
        Opcode::WmmaLoadA => FragKind::A,
        Opcode::WmmaLoadB => FragKind::B,
        _ => FragKind::C,
    };
    let ty = ins
        .ty()
        .ok_or_else(|| format!("`{}` needs an element type", ins.op.name()))?;
    let (aty, cty) = match kind {
        FragKind::C => {
            let a = match (ty, shape) {
                (Ty::F64, _) => Ty::F64,
                (Ty::S32, (8, 8, 32)) => Ty::S4,
                (Ty::S32, (8, 8, 128)) => Ty::B1,
                (Ty::S32, _) => Ty::S8,
                (Ty::F32, (16, 16, 8)) => Ty::Tf32,
                _ => Ty::F16,
            };
            (a, ty)
        }
        _ => {
            let c = match ty {
                Ty::F64 => Ty::F64,
                Ty::S8 | Ty::U8 | Ty::S4 | Ty::U4 | Ty::B1 => Ty::S32,
                _ => Ty::F32,
            };
            (ty, c)
        }
    };
    check_form(shape, aty, cty)?;
    let row = match (ins.has(Flag::Row), ins.has(Flag::Col)) {
        (true, false) => true,
        (false, true) => false,
        _ => return Err("wmma.load/store needs exactly one of .row and .col".into()),
    };
    // sub-byte A is only row-major and B only column-major: each lane's fragment register is
    // then 32 consecutive bits of memory
    if is_sub_byte(ty) && row != (kind == FragKind::A) {
        return Err("sub-byte and .b1 wmma loads need .row for A and .col for B".into());
    }
    Ok((Frag::new(kind, ty, shape), row))
}

/// A decoded `wmma.mma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WmmaSpec {
    pub shape: (u32, u32, u32),
    pub dty: Ty,
    pub aty: Ty,
    pub bty: Ty,
    pub cty: Ty,
    pub satfinite: bool,
}

impl WmmaSpec {
    /// Decodes `wmma.mma.sync.aligned.alayout.blayout.shape.dtype.ctype` (f16 inputs) or
    /// `...shape.dtype.atype.btype.ctype{.satfinite}`.
    pub fn from_instruction(ins: &Instruction) -> Result<WmmaSpec, String> {
        let shape = shape_of(ins)?;
        let tys: Vec<Ty> = ins.types().collect();
        let (dty, aty, bty, cty) = match tys[..] {
            [d, c] => (d, Ty::F16, Ty::F16, c),
            [d, a, b, c] => (d, a, b, c),
            _ => return Err("wmma.mma needs .dtype.ctype or .dtype.atype.btype.ctype".into()),
        };
        let layouts = ins
            .mods
            .iter()
            .filter(|m| matches!(m, Mod::Flag(Flag::Row | Flag::Col)))
            .count();
        if layouts != 2 {
            return Err("wmma.mma needs an A and a B layout (.row/.col each)".into());
        }
        let int = matches!(aty, Ty::S8 | Ty::U8);
        if aty != bty || (int && dty != Ty::S32) || (!int && aty != Ty::F16 && dty != cty) {
            return Err(format!(
                "unsupported wmma.mma types .{dty}.{aty}.{bty}.{cty}"
            ));
        }
        check_form(shape, aty, cty)?;
        if !int && matches!(dty, Ty::S32) {
            return Err("wmma.mma: integer D needs integer inputs".into());
        }
        let satfinite = ins.has(Flag::Satfinite);
        if satfinite && !int {
            return Err("wmma.mma .satfinite is supported for the integer forms only".into());
        }
        Ok(WmmaSpec {
            shape,
            dty,
            aty,
            bty,
            cty,
            satfinite,
        })
    }

    pub fn frag(&self, kind: FragKind) -> Frag {
        let ty = match kind {
            FragKind::A => self.aty,
            FragKind::B => self.bty,
            FragKind::C => self.cty,
        };
        Frag::new(kind, ty, self.shape)
    }

    pub fn d_frag(&self) -> Frag {
        Frag::new(FragKind::C, self.dty, self.shape)
    }
}

/// A decoded warp-matrix op.
#[derive(Clone, Debug)]
pub enum WmmaOp {
    /// `wmma.load` (`load`) or `wmma.store.d`: fragment registers `regs`, `[addr+off]`, the
    /// stride slot in elements (`None`: the matrix's leading dimension).
    LdSt {
        load: bool,
        frag: Frag,
        row: bool,
        regs: Vec<u32>,
        addr: u32,
        off: i64,
        stride: Option<u32>,
        space: MSpace,
    },
    Mma {
        spec: WmmaSpec,
        d: Vec<u32>,
        a: Vec<u32>,
        b: Vec<u32>,
        c: Vec<u32>,
    },
    /// `mma.sp` ([`crate::mma_sp`]): `a` is the compressed A fragment.
    Sparse {
        spec: crate::mma_sp::SparseSpec,
        d: Vec<u32>,
        a: Vec<u32>,
        b: Vec<u32>,
        c: Vec<u32>,
        meta: u32,
        sel: u32,
    },
    /// An `mma` or sub-byte `wmma.mma` form of [`crate::mma_any`].
    Any {
        spec: crate::mma_any::AnySpec,
        d: Vec<u32>,
        a: Vec<u32>,
        b: Vec<u32>,
        c: Vec<u32>,
    },
    /// A Volta `mma.m8n8k4` form with f16 inputs ([`crate::mma_volta`]).
    Volta {
        spec: crate::mma_volta::VoltaSpec,
        d: Vec<u32>,
        a: Vec<u32>,
        b: Vec<u32>,
        c: Vec<u32>,
    },
    /// `movmatrix.sync.aligned.m8n8.trans.b16 d, a`
    Movmatrix { d: u32, a: u32 },
}

/// Lane `lane`'s element offset of matrix element `(r, c)` in memory.
pub fn mem_index(row_major: bool, (r, c): (usize, usize), ld: u64) -> u64 {
    if row_major {
        r as u64 * ld + c as u64
    } else {
        c as u64 * ld + r as u64
    }
}

/// Default leading dimension of a fragment's matrix in memory.
pub fn default_ld(frag: &Frag, row_major: bool) -> u64 {
    if row_major {
        frag.cols as u64
    } else {
        frag.rows as u64
    }
}

/// `D = A * B + C` of `wmma.mma` over whole-warp fragments (module docs); `d` receives the
/// D registers.
pub fn wmma_mma(
    spec: &WmmaSpec,
    model: Option<&TcModel>,
    (a, b, c): (&[&Lanes], &[&Lanes], &[&Lanes]),
    d: &mut [Lanes],
) {
    let (m, n, k) = (
        spec.shape.0 as usize,
        spec.shape.1 as usize,
        spec.shape.2 as usize,
    );
    let (fa, fb, fc, fd) = (
        spec.frag(FragKind::A),
        spec.frag(FragKind::B),
        spec.frag(FragKind::C),
        spec.d_frag(),
    );
    let int = matches!(spec.aty, Ty::S8 | Ty::U8);
    // dense matrices: A row-major, B column-major (so rows of A meet columns of B), C row-major
    let (mut am, mut bm, mut cm) = (vec![0f64; m * k], vec![0f64; k * n], vec![0f64; m * n]);
    let conv = |t: Ty, bits: u64| {
        if int {
            to_i64(t, bits) as f64
        } else {
            to_f64(t, bits)
        }
    };
    for lane in 0..32 {
        for e in 0..fa.distinct() {
            let (r, col) = fa.pos(lane, e);
            am[r * k + col] = conv(fa.ty, fa.get(a, lane, e));
        }
        for e in 0..fb.distinct() {
            let (kk, col) = fb.pos(lane, e);
            bm[col * k + kk] = conv(fb.ty, fb.get(b, lane, e));
        }
        for e in 0..fc.distinct() {
            let (r, col) = fc.pos(lane, e);
            cm[r * n + col] = conv(fc.ty, fc.get(c, lane, e));
        }
    }
    let mut out = vec![[0u64; 32]; fd.regs()];
    for lane in 0..32 {
        for e in 0..fd.elems() {
            let (r, col) = fd.pos(lane, e);
            let (ar, bc, cv) = (
                &am[r * k..r * k + k],
                &bm[col * k..col * k + k],
                cm[r * n + col],
            );
            let bits = dot_bits(spec, model, (ar, bc, cv));
            fd.put(&mut out, lane, e, bits);
        }
    }
    for (dst, src) in d.iter_mut().zip(out) {
        *dst = src;
    }
}

/// One element of D: `a . b + c` rounded to D's type.
fn dot_bits(spec: &WmmaSpec, model: Option<&TcModel>, (a, b, c): (&[f64], &[f64], f64)) -> u64 {
    if matches!(spec.aty, Ty::S8 | Ty::U8) {
        // products of 8-bit integers and their sums (k <= 16) are exact in f64
        let s = a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() as i64 + c as i64;
        return if spec.satfinite {
            s.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32 as u64
        } else {
            s as i32 as u32 as u64
        };
    }
    if spec.dty == Ty::F64 {
        let mut s = c;
        for (x, y) in a.iter().zip(b) {
            s = x.mul_add(*y, s);
        }
        if s.is_nan() {
            s = f64::from_bits(0x7FFF_FFFF_FFFF_FFFF);
        }
        return s.to_bits();
    }
    let x = match model {
        Some(model) => tc::dot(model, a, b, c as f32) as f64,
        None => a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() + c,
    };
    round_to(spec.dty, x)
}

/// `movmatrix.sync.aligned.m8n8.trans.b16`: the 8x8 matrix of 16-bit elements held as an
/// `ldmatrix` fragment (lane `4r + q` holds row `r`, columns `2q, 2q+1`) is transposed.
pub fn movmatrix(a: &Lanes) -> Lanes {
    let el = |r: usize, c: usize| (a[4 * r + c / 2] >> (16 * (c % 2))) & 0xffff;
    let mut d = [0u64; 32];
    for (lane, v) in d.iter_mut().enumerate() {
        let (r, q) = (lane >> 2, lane & 3);
        // row r of the transpose is column r of the source
        *v = el(2 * q, r) | (el(2 * q + 1, r) << 16);
    }
    d
}
