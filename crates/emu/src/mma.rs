//! Warp-level `mma.sync.aligned` on register fragments.
//!
//! [`mma_sync`] computes `D = A * B + C` for a whole warp. Fragment layouts follow the PTX ISA
//! ("Matrix fragments for mma.m16n8k*", "mma.m8n8k4 .f64"): for lane `l`, `g = l >> 2` (group id)
//! and `q = l & 3` (thread id in group). Elements are packed little-endian into registers:
//! element `2r` is the low half of register `r` for 16-bit types, element `4r` the low byte for
//! 8-bit types; tf32, f32, s32 use one register per element and f64 one 64-bit register.
//!
//! Supported forms (all `.row.col`):
//!
//! | shape     | A/B                          | C/D              |
//! |-----------|------------------------------|------------------|
//! | m16n8k16  | f16, bf16                    | f32 (f16: also f16) |
//! | m16n8k8   | f16, bf16                    | f32 (f16: also f16) |
//! | m16n8k8   | tf32                         | f32              |
//! | m16n8k4   | tf32                         | f32              |
//! | m16n8k32  | e4m3/e5m2 (any mix)          | f32 or f16       |
//! | m16n8k32  | s8/u8 (any mix)              | s32 (`.satfinite`) |
//! | m16n8k16  | s8/u8 (any mix)              | s32 (`.satfinite`) |
//! | m8n8k4    | f64                          | f64              |
//!
//! The f16 `m8n8k4` (Volta, quad-pair fragments, `.row`/`.col` A and B) is
//! [`crate::mma_volta`]'s; the sub-byte, `.b1` and m8n8k16 forms are [`crate::mma_any`]'s.
//!
//! # Numerics
//! [`mma_sync_with`] with a model applies the tensor-core numerics of an architecture
//! ([`crate::tc_numerics`]: blocks of products aligned to the largest exponent, truncated, summed
//! and rounded toward zero); the emulator uses the kernel target's model unless a launch asks for
//! [`crate::Numerics::Exact`]. The exact mode ([`mma_sync`], or no model):
//! float forms: every product of two inputs is exact in f64 (at most 2*11 significand bits for
//! f16/tf32, 2*8 for bf16, 2*4 for fp8). The products are summed in f64 in increasing `k` order,
//! C is added, and the result is rounded once (nearest even) to the D type. PTX does not fix the
//! accumulation order or intermediate precision of `mma`, so this is one admissible result; for
//! inputs whose products and partial sums fit in 53 bits (e.g. small integers) it is exact.
//! f64 `m8n8k4` uses fused multiply-adds in k order starting from C. tf32 inputs use only the upper 19 bits of
//! their register (the low 13 bits are ignored). A NaN result is the canonical NaN of D.
//! Integer forms are exact; D wraps modulo 2^32 or, with `.satfinite`, clamps to the s32 range.
//!
//! # Executing on the register file
//! The interpreter runs the GEMM forms (m16n8k16 f16/bf16, m16n8k32 fp8; f32 C and D) through
//! [`mma_in_place`], straight on the warp's registers:
//! - under a hardware model (the default), A and B are decoded from their registers directly
//!   into f32 in the layouts of the column-vector tile kernel (`tc_simd::cols16`: A transposed,
//!   B row-major, both with their magnitudes), and kept in the warp's [`FragCache`] keyed by
//!   their raw bits (an A fragment feeds one mma per B column block, a B fragment one per A row
//!   block, so most are decoded once); C is read from its registers into the kernel's
//!   column-major tile and D written back. The register moves (raw reads, the cache lookup,
//!   decodes, C and D) are [`crate::frag_simd`]'s AVX2 8 x 4 transposes, with scalar
//!   fallbacks;
//! - in the exact mode, and for tiles the f32 kernel declines (a non-finite input or C, or a
//!   CPU without AVX2), A and B are decoded to f64 (cached the same way) for the exact or
//!   portable tile kernels.
//!
//! The bits are those of [`mma_sync_with`] in both modes (tested). Other forms go through
//! [`mma_sync_with`].

use crate::fp;
use crate::frag_simd::{self, Elem};
use crate::tc_numerics::{self as tc, TcModel};
use crate::Lanes;
use ptx::{Flag, Instruction, Mod, Opcode, Ty};

/// A decoded `mma.sync` instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaSpec {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub dty: Ty,
    pub aty: Ty,
    pub bty: Ty,
    pub cty: Ty,
    pub satfinite: bool,
}

fn is_f8(t: Ty) -> bool {
    matches!(t, Ty::E4m3 | Ty::E5m2)
}
fn is_i8(t: Ty) -> bool {
    matches!(t, Ty::S8 | Ty::U8)
}

/// Bits of one A/B/C/D element in a register.
pub(crate) fn elem_bits(t: Ty) -> u32 {
    match t {
        Ty::F16 | Ty::Bf16 => 16,
        Ty::E4m3 | Ty::E5m2 | Ty::S8 | Ty::U8 => 8,
        Ty::F64 => 64,
        _ => 32,
    }
}

/// Elements held by one register.
pub(crate) fn per_reg(t: Ty) -> usize {
    match elem_bits(t) {
        8 => 4,
        16 => 2,
        _ => 1,
    }
}

impl MmaSpec {
    /// Builds and checks a spec.
    pub fn new(
        shape: (u32, u32, u32),
        dty: Ty,
        aty: Ty,
        bty: Ty,
        cty: Ty,
        satfinite: bool,
    ) -> Result<MmaSpec, String> {
        let (m, n, k) = shape;
        let s = MmaSpec {
            m,
            n,
            k,
            dty,
            aty,
            bty,
            cty,
            satfinite,
        };
        s.check()?;
        Ok(s)
    }

    /// Decodes `mma.sync.aligned.mMnNkK.row.col{.satfinite}.dtype.atype.btype.ctype`.
    pub fn from_instruction(ins: &Instruction) -> Result<MmaSpec, String> {
        if ins.op != Opcode::Mma {
            return Err(format!("not an mma instruction: {}", ins.op.info().name));
        }
        let Some(Mod::Shape { m, n, k: Some(k) }) = ins.shape() else {
            return Err("mma needs a .mMnNkK shape".into());
        };
        let tys: Vec<Ty> = ins.types().collect();
        let [dty, aty, bty, cty] = tys[..] else {
            return Err(format!(
                "mma needs four types (d, a, b, c), got {}",
                tys.len()
            ));
        };
        let row = ins.mods.iter().position(|x| *x == Mod::Flag(Flag::Row));
        let col = ins.mods.iter().position(|x| *x == Mod::Flag(Flag::Col));
        match (row, col) {
            (Some(r), Some(c)) if r < c => {}
            _ => return Err("only the .row.col layout of mma is supported".into()),
        }
        MmaSpec::new(
            (m as u32, n as u32, k as u32),
            dty,
            aty,
            bty,
            cty,
            ins.has(Flag::Satfinite),
        )
    }

    fn check(&self) -> Result<(), String> {
        let MmaSpec {
            m,
            n,
            k,
            dty,
            aty,
            bty,
            cty,
            satfinite,
        } = *self;
        let fp_acc = |t: Ty| matches!(t, Ty::F32 | Ty::F16);
        let ok = match (m, n, k) {
            (16, 8, 16) | (16, 8, 8) if aty == Ty::F16 && bty == Ty::F16 => {
                fp_acc(dty) && fp_acc(cty)
            }
            (16, 8, 16) | (16, 8, 8) if aty == Ty::Bf16 && bty == Ty::Bf16 => {
                dty == Ty::F32 && cty == Ty::F32
            }
            (16, 8, 8) | (16, 8, 4) if aty == Ty::Tf32 && bty == Ty::Tf32 => {
                dty == Ty::F32 && cty == Ty::F32
            }
            (16, 8, 32) if is_f8(aty) && is_f8(bty) => fp_acc(dty) && dty == cty,
            (16, 8, 32) | (16, 8, 16) if is_i8(aty) && is_i8(bty) => {
                dty == Ty::S32 && cty == Ty::S32
            }
            (8, 8, 4) if aty == Ty::F64 && bty == Ty::F64 => dty == Ty::F64 && cty == Ty::F64,
            _ => false,
        };
        if !ok {
            return Err(format!(
                "unsupported mma form: .m{m}n{n}k{k}.{dty}.{aty}.{bty}.{cty}"
            ));
        }
        if satfinite && !is_i8(aty) {
            return Err("mma .satfinite is only supported for integer forms".into());
        }
        Ok(())
    }

    /// Registers per lane in the A, B, C and D fragments (32-bit registers; for f64 forms, 64-bit
    /// registers).
    pub fn frag_counts(&self) -> (usize, usize, usize, usize) {
        let (m, n, k) = (self.m as usize, self.n as usize, self.k as usize);
        let regs = |elems: usize, t: Ty| (elems / 32).div_ceil(per_reg(t));
        (
            regs(m * k, self.aty),
            regs(k * n, self.bty),
            regs(m * n, self.cty),
            regs(m * n, self.dty),
        )
    }

    /// Position `(row, col)` in A of element `i` of lane `lane`.
    fn a_pos(&self, lane: usize, i: usize) -> (usize, usize) {
        let (g, q) = (lane >> 2, lane & 3);
        match (elem_bits(self.aty), self.k) {
            (16, 16) => (g + 8 * ((i >> 1) & 1), 2 * q + (i & 1) + 8 * (i >> 2)),
            (16, _) => (g + 8 * (i >> 1), 2 * q + (i & 1)),
            (8, 32) => (g + 8 * ((i >> 2) & 1), 4 * q + (i & 3) + 16 * (i >> 3)),
            (8, _) => (g + 8 * (i >> 2), 4 * q + (i & 3)),
            (64, _) => (g, q),
            (_, 4) => (g + 8 * i, q),                 // tf32 k4
            _ => (g + 8 * (i & 1), q + 4 * (i >> 1)), // tf32 k8
        }
    }

    /// Position `(k, col)` in B of element `i` of lane `lane`.
    fn b_pos(&self, lane: usize, i: usize) -> (usize, usize) {
        let (g, q) = (lane >> 2, lane & 3);
        let kk = match (elem_bits(self.bty), self.k) {
            (16, 16) => 2 * q + (i & 1) + 8 * (i >> 1),
            (16, _) => 2 * q + i,
            (8, 32) => 4 * q + (i & 3) + 16 * (i >> 2),
            (8, _) => 4 * q + i,
            (64, _) => q,
            (_, 4) => q,
            _ => q + 4 * i,
        };
        (kk, g)
    }

    /// Position `(row, col)` in C/D of element `i` of lane `lane`.
    fn c_pos(&self, lane: usize, i: usize) -> (usize, usize) {
        let (g, q) = (lane >> 2, lane & 3);
        if self.m == 8 {
            (g, 2 * q + i)
        } else {
            (g + 8 * (i >> 1), 2 * q + (i & 1))
        }
    }
}

/// Raw bits of element `i` of a fragment for lane `lane` (missing registers read as 0).
fn elem(regs: &[&Lanes], t: Ty, lane: usize, i: usize) -> u64 {
    let pr = per_reg(t);
    let Some(r) = regs.get(i / pr) else { return 0 };
    let w = elem_bits(t);
    let v = r[lane];
    if w >= 64 {
        v
    } else {
        (v >> ((i % pr) as u32 * w)) & ((1u64 << w) - 1)
    }
}

/// Decoded values of every 8-bit float code (e4m3, then e5m2), built once: fragment decoding is
/// on the emulator's hot path.
pub(crate) fn fp8_table() -> &'static [[f64; 256]; 2] {
    static T: std::sync::OnceLock<[[f64; 256]; 2]> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = [[0f64; 256]; 2];
        for c in 0..256usize {
            t[0][c] = fp::e4m3_to_f32(c as u8) as f64;
            t[1][c] = fp::e5m2_to_f32(c as u8) as f64;
        }
        t
    })
}

pub(crate) fn to_f64(t: Ty, bits: u64) -> f64 {
    match t {
        Ty::F16 => half::f16::from_bits(bits as u16).to_f64(),
        Ty::Bf16 => f32::from_bits(((bits as u32) & 0xffff) << 16) as f64,
        Ty::Tf32 => f32::from_bits((bits as u32) & !0x1FFF) as f64,
        Ty::F32 => f32::from_bits(bits as u32) as f64,
        Ty::F64 => f64::from_bits(bits),
        Ty::E4m3 => fp8_table()[0][bits as u8 as usize],
        Ty::E5m2 => fp8_table()[1][bits as u8 as usize],
        _ => 0.0,
    }
}

pub(crate) fn to_i64(t: Ty, bits: u64) -> i64 {
    match t {
        Ty::S8 => bits as u8 as i8 as i64,
        Ty::U8 => bits as u8 as i64,
        Ty::S32 => bits as u32 as i32 as i64,
        _ => 0,
    }
}

/// `D = A * B + C` for the whole warp. `a`, `b`, `c` are the fragment registers (as many as
/// [`MmaSpec::frag_counts`] says; missing ones read as zero) and `d` receives the D fragment
/// (extra entries are left alone). Register values are raw bits, zero-extended.
pub fn mma_sync(spec: &MmaSpec, a: &[&Lanes], b: &[&Lanes], c: &[&Lanes], d: &mut [Lanes]) {
    mma_sync_with(spec, None, a, b, c, d)
}

/// [`mma_sync`] under tensor-core numerics `model` ([`crate::tc_numerics`]); `None` is the exact
/// mode. Integer and f64 forms ignore the model (they are exact either way).
pub fn mma_sync_with(
    spec: &MmaSpec,
    model: Option<&TcModel>,
    a: &[&Lanes],
    b: &[&Lanes],
    c: &[&Lanes],
    d: &mut [Lanes],
) {
    if mma_fast(spec, model, a, b, c, d) {
        return;
    }
    let (m, n, k) = (spec.m as usize, spec.n as usize, spec.k as usize);
    let (na, nb, nc, nd) = {
        let per = |rows: usize, cols: usize| rows * cols / 32;
        (per(m, k), per(k, n), per(m, n), per(m, n))
    };
    let int = is_i8(spec.aty);
    // scatter fragments into dense matrices
    // Fixed-size scratch (largest supported shape: m16 n8 k32) keeps the hot path allocation-free.
    if m * k > 512 || k * n > 256 || m * n > 128 {
        return;
    }
    let mut am = [0f64; 512];
    let mut bm = [0f64; 256];
    let mut cm = [0f64; 128];
    let mut ai = [0i64; 512];
    let mut bi = [0i64; 256];
    let mut ci = [0i64; 128];
    for lane in 0..32 {
        for i in 0..na {
            let (r, col) = spec.a_pos(lane, i);
            let bits = elem(a, spec.aty, lane, i);
            if r < m && col < k {
                if int {
                    ai[r * k + col] = to_i64(spec.aty, bits);
                } else {
                    am[r * k + col] = to_f64(spec.aty, bits);
                }
            }
        }
        for i in 0..nb {
            let (kk, col) = spec.b_pos(lane, i);
            let bits = elem(b, spec.bty, lane, i);
            if kk < k && col < n {
                if int {
                    bi[kk * n + col] = to_i64(spec.bty, bits);
                } else {
                    bm[col * k + kk] = to_f64(spec.bty, bits);
                }
            }
        }
        for i in 0..nc {
            let (r, col) = spec.c_pos(lane, i);
            let bits = elem(c, spec.cty, lane, i);
            if r < m && col < n {
                if int {
                    ci[r * n + col] = to_i64(spec.cty, bits);
                } else {
                    cm[r * n + col] = to_f64(spec.cty, bits);
                }
            }
        }
    }
    // multiply and gather
    let pr = per_reg(spec.dty);
    let w = elem_bits(spec.dty);
    let mut out = vec![[0u64; 32]; nd.div_ceil(pr)];
    for lane in 0..32 {
        for i in 0..nd {
            let (r, col) = spec.c_pos(lane, i);
            if r >= m || col >= n {
                continue;
            }
            let bits = if int {
                let mut s = ci[r * n + col];
                for kk in 0..k {
                    s += ai[r * k + kk] * bi[kk * n + col];
                }
                if spec.satfinite {
                    s.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32 as u64
                } else {
                    s as i32 as u32 as u64
                }
            } else if spec.dty == Ty::F64 {
                // f64 products are not exact: fused multiply-add steps from C, in k order
                let mut s = cm[r * n + col];
                for kk in 0..k {
                    s = am[r * k + kk].mul_add(bm[col * k + kk], s);
                }
                if s.is_nan() {
                    s = f64::from_bits(0x7FFF_FFFF_FFFF_FFFF);
                }
                s.to_bits()
            } else if let Some(model) = model {
                let (ar, bc) = (&am[r * k..r * k + k], &bm[col * k..col * k + k]);
                let x = tc::dot(model, ar, bc, cm[r * n + col] as f32);
                round_to(spec.dty, x as f64)
            } else {
                let mut s = 0f64;
                let (ar, bc) = (&am[r * k..r * k + k], &bm[col * k..col * k + k]);
                for kk in 0..k {
                    s += ar[kk] * bc[kk];
                }
                s += cm[r * n + col];
                round_to(spec.dty, s)
            };
            let reg = i / pr;
            let sh = (i % pr) as u32 * w;
            if w >= 64 {
                out[reg][lane] = bits;
            } else {
                out[reg][lane] |= (bits & ((1u64 << w) - 1)) << sh;
            }
        }
    }
    for (dst, src) in d.iter_mut().zip(out) {
        *dst = src;
    }
}

/// Rounds an f64 to the D type (nearest even; NaN -> canonical NaN).
pub(crate) fn round_to(t: Ty, x: f64) -> u64 {
    if t == Ty::F32 {
        // f64 -> f32 `as` rounds to nearest even (one rounding); NaN is canonicalised.
        let f = x as f32;
        return if f.is_nan() {
            0x7FFF_FFFF
        } else {
            f.to_bits() as u64
        };
    }
    let spec = fp::CvtSpec::new(t, Ty::F64).rnd(fp::Rnd::Rn);
    if x.is_nan() {
        return match t {
            Ty::F16 => 0x7FFF,
            _ => 0x7FFF_FFFF,
        };
    }
    fp::cvt(&spec, x.to_bits(), 0)
}

/// Fast path for the shapes GEMM kernels live on: m16n8k16 bf16/f16 and m16n8k32 e4m3/e5m2
/// with f32 C/D. Same semantics as the general path (exact products summed in f64 in k order,
/// plus C, rounded once; or the hardware model), with the fragment layouts written out instead
/// of looked up per element. Returns false when the instruction is not one of these forms.
fn mma_fast(
    spec: &MmaSpec,
    model: Option<&TcModel>,
    a: &[&Lanes],
    b: &[&Lanes],
    c: &[&Lanes],
    d: &mut [Lanes],
) -> bool {
    let Some(k) = fast_k(spec) else { return false };
    if a.len() < 4 || b.len() < 2 || c.len() < 4 || d.len() < 4 {
        return false;
    }
    let simd = frag_simd::Simd::detect();
    let mut raw = FragRaw::default();
    frag_simd::lo32(simd, [a[0], a[1], a[2], a[3]], &mut raw.a);
    frag_simd::lo32(simd, [b[0], b[1]], &mut raw.b);
    let (mut am, mut bk) = ([0f64; 16 * 32], [0f64; 32 * 8]);
    decode_a(spec, &raw.a, &mut am);
    decode_b(spec, &raw.b, &mut bk);
    let acc = tile_out(model, (&am[..16 * k], &bk[..8 * k], k), |acc, add| {
        for (i, ci) in c.iter().take(4).enumerate() {
            if add {
                add_c(acc, i, ci)
            } else {
                gather_c(acc, i, ci)
            }
        }
    });
    for (i, di) in d.iter_mut().take(4).enumerate() {
        scatter_d(&acc, i, di, u32::MAX);
    }
    true
}

/// K of the fast-path forms (m16n8, f32 C and D): 16 for 16-bit inputs, 32 for 8-bit floats.
fn fast_k(spec: &MmaSpec) -> Option<usize> {
    if spec.m != 16 || spec.n != 8 || spec.cty != Ty::F32 || spec.dty != Ty::F32 {
        return None;
    }
    match (spec.aty, spec.bty, spec.k) {
        (Ty::Bf16 | Ty::F16, Ty::Bf16 | Ty::F16, 16) => Some(16),
        (Ty::E4m3 | Ty::E5m2, Ty::E4m3 | Ty::E5m2, 32) => Some(32),
        _ => None,
    }
}

/// The register slots and active lanes of one `mma` executed in place on a register file.
#[derive(Clone, Copy, Debug)]
pub struct MmaSlots<'a> {
    pub a: &'a [u32],
    pub b: &'a [u32],
    pub c: &'a [u32],
    pub d: &'a [u32],
    /// Lanes whose D registers are written.
    pub m: u32,
}

/// `mma.sync` of a fast-path form ([`mma_fast`]) straight on a warp's register file: A and B
/// are decoded into the tile layout once and kept in `cache` (a GEMM's inner loop feeds each
/// A fragment to several mmas, one per B column block, and each B fragment to several), C is
/// gathered from its registers and D scattered into its registers, with no intermediate
/// fragment rows. The same bits as [`mma_sync_with`]. Returns false (nothing done) for other
/// forms, fragment counts or slots outside `regs`.
pub fn mma_in_place(
    spec: &MmaSpec,
    model: Option<&TcModel>,
    regs: &mut [Lanes],
    s: MmaSlots,
    cache: &mut FragCache,
) -> bool {
    let Some(k) = fast_k(spec) else { return false };
    let n = regs.len();
    let ok =
        |v: &[u32], want: usize| v.len() >= want && v[..want].iter().all(|&r| (r as usize) < n);
    if !(ok(s.a, 4) && ok(s.b, 2) && ok(s.c, 4) && ok(s.d, 4)) {
        return false;
    }
    let simd = frag_simd::Simd::detect();
    let FragCache { f64, f32, raw } = cache;
    let r = |i: u32| &regs[i as usize];
    frag_simd::lo32(
        simd,
        [r(s.a[0]), r(s.a[1]), r(s.a[2]), r(s.a[3])],
        &mut raw.a,
    );
    frag_simd::lo32(simd, [r(s.b[0]), r(s.b[1])], &mut raw.b);
    if let Some(model) = model {
        if in_place_f32((spec, model, simd), regs, s, FragCache::rings32(f32), raw) {
            return true;
        }
    }
    in_place_f64(
        (spec, model, simd, k),
        regs,
        s,
        FragCache::rings64(f64),
        raw,
    );
    true
}

/// [`mma_in_place`] in the exact mode, and for the tiles the f32 kernel declines: A and B
/// decoded to f64 (cached in `rings`), the exact or portable tile kernels. Not inlined: its
/// f64 tiles (tens of KiB of stack) would otherwise make every call of [`mma_in_place`] probe
/// and touch that much stack.
#[inline(never)]
fn in_place_f64(
    (spec, model, simd, k): (&MmaSpec, Option<&TcModel>, Option<frag_simd::Simd>, usize),
    regs: &mut [Lanes],
    s: MmaSlots,
    rings: &mut Rings64,
    raw: &FragRaw,
) {
    let Rings64 {
        a: ring_a,
        b: ring_b,
    } = rings;
    let am = ring_a.get((spec.aty, spec.k), (simd, &raw.a), |r, v| {
        decode_a(spec, r, v)
    });
    let bk = ring_b.get((spec.bty, spec.k), (simd, &raw.b), |r, v| {
        decode_b(spec, r, v)
    });
    let acc = tile_out(model, (&am[..16 * k], &bk[..8 * k], k), |acc, add| {
        for i in 0..4 {
            let ci = &regs[s.c[i] as usize];
            if add {
                add_c(acc, i, ci)
            } else {
                gather_c(acc, i, ci)
            }
        }
    });
    for i in 0..4 {
        scatter_d(&acc, i, &mut regs[s.d[i] as usize], s.m);
    }
}

/// [`mma_in_place`] under a hardware model through the f32 column kernel
/// ([`crate::tc_simd`]'s `cols16`): A and B decoded straight into its layouts as f32 (cached in
/// `rings`), C read from and D written to the registers in its column-major tile. Returns
/// false (nothing written) where the kernel is not available or declines the tile (a
/// non-finite input or C): the f64 path then runs.
fn in_place_f32(
    (spec, model, simd): (&MmaSpec, &TcModel, Option<frag_simd::Simd>),
    regs: &mut [Lanes],
    s: MmaSlots,
    rings: &mut Rings32,
    raw: &FragRaw,
) -> bool {
    let Some(kernel) = crate::tc_simd::fast_cols16() else {
        return false;
    };
    let k = spec.k as usize;
    let Rings32 { a: ra, b: rb } = rings;
    let (Some(ea), Some(eb)) = (Elem::of(spec.aty), Elem::of(spec.bty)) else {
        return false;
    };
    let a = ra.get((spec.aty, spec.k), (simd, &raw.a), |r, f| {
        f.finite = frag_simd::decode_a(simd, ea, r, &mut f.v, &mut f.abs)
    });
    let b = rb.get((spec.bty, spec.k), (simd, &raw.b), |r, f| {
        f.finite = frag_simd::decode_b(simd, eb, r, &mut f.v, &mut f.abs)
    });
    if !(a.finite && b.finite) {
        return false;
    }
    let r = |i: u32| &regs[i as usize];
    let mut c = frag_simd::c_tile(simd, [r(s.c[0]), r(s.c[1]), r(s.c[2]), r(s.c[3])]);
    let ops = crate::tc_simd::Cols {
        at: &a.v[..16 * k],
        at_abs: &a.abs[..16 * k],
        b: &b.v[..8 * k],
        b_abs: &b.abs[..8 * k],
        k,
        cols: 8,
    };
    if !kernel(model, &ops, &mut c) {
        return false;
    }
    // the kernel's results are finite (finite inputs and C; rounding toward zero never
    // overflows), so no NaN needs canonicalising
    frag_simd::d_tile(simd, &c, regs, [s.d[0], s.d[1], s.d[2], s.d[3]], s.m)
}

/// Decoded f32 values of every 8-bit float code (e4m3, then e5m2; exact), built once.
pub(crate) fn fp8_table32() -> &'static [[f32; 256]; 2] {
    static T: std::sync::OnceLock<[[f32; 256]; 2]> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = [[0f32; 256]; 2];
        for c in 0..256usize {
            t[0][c] = fp::e4m3_to_f32(c as u8);
            t[1][c] = fp::e5m2_to_f32(c as u8);
        }
        t
    })
}

/// The binary16 value of the low 16 bits of `h` as an f32 (exact; infinities and NaNs map to
/// non-finite values, which is all the caller needs of them). The exponent and fraction
/// shifted into f32 position are the value times 2^-112 (subnormals included), so one exact
/// multiplication by 2^112 finishes it.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    if em >= 0x7c00 {
        return f32::from_bits(sign | 0x7f80_0000 | (em & 0x3ff) << 13);
    }
    let v = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
    f32::from_bits(sign | v.to_bits())
}

/// The low 32 bits of the A (4 registers) and B (2 registers) fragments (`a[r][lane]`): all
/// the fast-path forms read.
#[derive(Default)]
struct FragRaw {
    a: [[u32; 32]; 4],
    b: [[u32; 32]; 2],
}

/// Fragments a [`Ring`] remembers.
const RING: usize = 4;

/// The last [`RING`] decoded fragments of one operand (`R` raw registers decoded into a `T`),
/// with the raw bits and (type, k) they were decoded from.
struct Ring<const R: usize, T> {
    keys: [Option<(Ty, u32)>; RING],
    raw: [[[u32; 32]; R]; RING],
    val: [T; RING],
    next: usize,
}

impl<const R: usize, T: Copy> Ring<R, T> {
    fn new(zero: T) -> Self {
        Ring {
            keys: [None; RING],
            raw: [[[0; 32]; R]; RING],
            val: [zero; RING],
            next: 0,
        }
    }

    /// The decoded values of `raw` under `key`: remembered, or decoded now by `decode` into
    /// the oldest entry.
    fn get(
        &mut self,
        key: (Ty, u32),
        (simd, raw): (Option<frag_simd::Simd>, &[[u32; 32]; R]),
        decode: impl FnOnce(&[[u32; 32]; R], &mut T),
    ) -> &T {
        let valid = (0..RING).fold(0, |m, i| m | ((self.keys[i] == Some(key)) as u32) << i);
        let i = match frag_simd::find(simd, &self.raw, valid, raw) {
            Some(i) => i,
            None => {
                let i = self.next;
                self.next = (i + 1) % RING;
                self.keys[i] = Some(key);
                self.raw[i] = *raw;
                decode(raw, &mut self.val[i]);
                i
            }
        };
        &self.val[i]
    }
}

/// The f64 operands of the exact mode and of the tiles the f32 kernel declines: A (16 x k,
/// row-major) and B (k x 8, k-major).
struct Rings64 {
    a: Ring<4, [f64; 16 * 32]>,
    b: Ring<2, [f64; 32 * 8]>,
}

/// A fragment decoded for the f32 column kernel ([`crate::tc_simd`]'s `Cols` layouts): the
/// values, their magnitudes, and whether every value is finite (else the kernel is not used).
#[derive(Clone, Copy)]
struct Frag32<const E: usize> {
    v: [f32; E],
    abs: [f32; E],
    finite: bool,
}

impl<const E: usize> Frag32<E> {
    const ZERO: Self = Frag32 {
        v: [0.0; E],
        abs: [0.0; E],
        finite: false,
    };
}

/// The f32 operands of the hardware-model path: A transposed (`at[kk * 16 + row]`) and B
/// (`b[kk * 8 + col]`).
struct Rings32 {
    a: Ring<4, Frag32<{ 16 * 32 }>>,
    b: Ring<2, Frag32<{ 32 * 8 }>>,
}

/// A warp's recently decoded `mma` operands, per layout (each allocated on first use; the f32
/// rings of retired warps are reused by the thread's next ones). A GEMM's inner loop feeds
/// each A fragment to several mmas (one per B column block) and each B fragment to several
/// (one per A row block), so most fragments are decoded once.
#[derive(Default)]
pub struct FragCache {
    f64: Option<Box<Rings64>>,
    f32: Option<Box<Rings32>>,
    /// The raw A and B fragments of the current `mma` (scratch, overwritten by each).
    raw: FragRaw,
}

impl FragCache {
    fn rings64(f64: &mut Option<Box<Rings64>>) -> &mut Rings64 {
        f64.get_or_insert_with(|| {
            Box::new(Rings64 {
                a: Ring::new([0.0; 16 * 32]),
                b: Ring::new([0.0; 32 * 8]),
            })
        })
    }

    fn rings32(f32: &mut Option<Box<Rings32>>) -> &mut Rings32 {
        f32.get_or_insert_with(|| {
            let spare = SPARE32.with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()));
            spare.unwrap_or_else(|| {
                Box::new(Rings32 {
                    a: Ring::new(Frag32::ZERO),
                    b: Ring::new(Frag32::ZERO),
                })
            })
        })
    }
}

/// Most spare [`Rings32`] a thread keeps.
const MAX_SPARE: usize = 64;

thread_local! {
    /// The f32 rings of this thread's retired warps (tens of KiB each, zero-filled when made;
    /// a launch worker retires and creates warps all the time). Their entries are pure
    /// functions of the raw bits and (type, k) they are keyed by, so a new warp may keep them.
    static SPARE32: std::cell::RefCell<Vec<Box<Rings32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Drop for FragCache {
    fn drop(&mut self) {
        if let Some(r) = self.f32.take() {
            // a thread being torn down has no pool any more: the rings are simply freed
            let _ = SPARE32.try_with(|s| {
                if let Ok(mut s) = s.try_borrow_mut() {
                    if s.len() < MAX_SPARE {
                        s.push(r);
                    }
                }
            });
        }
    }
}

/// C register `i` (all lanes) into the 16 x 8 tile `acc` (row-major): lane `l` holds row
/// `l / 4 + 8 * (i / 2)`, column `2 * (l % 4) + i % 2`, i.e. index `2 l + 64 (i / 2) + i % 2`.
#[inline(always)]
fn gather_c(acc: &mut [f64; 128], i: usize, row: &Lanes) {
    let base = 64 * (i >> 1) + (i & 1);
    for (lane, v) in row.iter().enumerate() {
        acc[base + 2 * lane] = f32::from_bits(*v as u32) as f64;
    }
}

/// Adds C register `i` to the tile `acc` (the layout of [`gather_c`]).
#[inline(always)]
fn add_c(acc: &mut [f64; 128], i: usize, row: &Lanes) {
    let base = 64 * (i >> 1) + (i & 1);
    for (lane, v) in row.iter().enumerate() {
        acc[base + 2 * lane] += f32::from_bits(*v as u32) as f64;
    }
}

/// D register `i` of the lanes in `m` from the 16 x 8 tile `acc` (the layout of
/// [`gather_c`]), rounded to f32 (NaN: the canonical NaN).
#[inline(always)]
fn scatter_d(acc: &[f64; 128], i: usize, row: &mut Lanes, m: u32) {
    let base = 64 * (i >> 1) + (i & 1);
    for (lane, x) in row.iter_mut().enumerate() {
        let v = acc[base + 2 * lane] as f32;
        let bits = if v.is_nan() {
            0x7FFF_FFFF
        } else {
            v.to_bits() as u64
        };
        *x = if m >> lane & 1 != 0 { bits } else { *x };
    }
}

/// A (16 x k, row-major, `k` 16 or 32) of a fast-path form from its raw fragment.
fn decode_a(spec: &MmaSpec, raw: &[[u32; 32]; 4], am: &mut [f64; 512]) {
    let raw = raw.as_flattened();
    let bf = |v: u32| f32::from_bits((v & 0xffff) << 16) as f64;
    let hf = |v: u32| half::f16::from_bits(v as u16).to_f64();
    match spec.aty {
        Ty::Bf16 => decode16_a(raw, am, bf),
        Ty::F16 => decode16_a(raw, am, hf),
        t => {
            let tab = &fp8_table()[(t == Ty::E5m2) as usize];
            // a_r holds bytes 4r..4r+3: row g + 8*(r&1), col 4q + 16*(r>>1) (+0..3).
            for r in 0..4 {
                for lane in 0..32 {
                    let (g, q) = (lane >> 2, lane & 3);
                    let v = raw[r * 32 + lane];
                    let at = (g + 8 * (r & 1)) * 32 + 4 * q + 16 * (r >> 1);
                    for j in 0..4 {
                        am[at + j] = tab[((v >> (8 * j)) & 0xff) as usize];
                    }
                }
            }
        }
    }
}

/// [`decode_a`] of 16-bit inputs (k = 16) with the element decoder `da` (one monomorphic
/// loop per type).
#[inline(always)]
fn decode16_a(raw: &[u32], am: &mut [f64; 512], da: impl Fn(u32) -> f64) {
    // a_r of lane 4g + q holds elements 2r (low) and 2r+1: row g + 8*(r&1), columns
    // 2q + 8*(r>>1) (+0/1). The four lanes of a group g fill 8 consecutive columns of a row.
    for r in 0..4 {
        for g in 0..8 {
            let at = (g + 8 * (r & 1)) * 16 + 8 * (r >> 1);
            let w = &raw[r * 32 + 4 * g..r * 32 + 4 * g + 4];
            let dst = &mut am[at..at + 8];
            for q in 0..4 {
                dst[2 * q] = da(w[q]);
                dst[2 * q + 1] = da(w[q] >> 16);
            }
        }
    }
}

/// B (k x 8, k-major) of a fast-path form from its raw fragment.
fn decode_b(spec: &MmaSpec, raw: &[[u32; 32]; 2], bk: &mut [f64; 256]) {
    let raw = raw.as_flattened();
    let bf = |v: u32| f32::from_bits((v & 0xffff) << 16) as f64;
    let hf = |v: u32| half::f16::from_bits(v as u16).to_f64();
    match spec.bty {
        Ty::Bf16 => decode16_b(raw, bk, bf),
        Ty::F16 => decode16_b(raw, bk, hf),
        t => {
            let tab = &fp8_table()[(t == Ty::E5m2) as usize];
            // b_r: k = 4q + 16r (+0..3), n = g.
            for r in 0..2 {
                for lane in 0..32 {
                    let (g, q) = (lane >> 2, lane & 3);
                    let v = raw[r * 32 + lane];
                    let kk = 4 * q + 16 * r;
                    for j in 0..4 {
                        bk[(kk + j) * 8 + g] = tab[((v >> (8 * j)) & 0xff) as usize];
                    }
                }
            }
        }
    }
}

/// [`decode_b`] of 16-bit inputs (k = 16) with the element decoder `db`.
#[inline(always)]
fn decode16_b(raw: &[u32], bk: &mut [f64; 256], db: impl Fn(u32) -> f64) {
    // b_r of lane 4g + q: k = 2q + 8r (+0/1), n = g. The eight groups fill one k row.
    for r in 0..2 {
        for q in 0..4 {
            let kk = 2 * q + 8 * r;
            let (lo, hi) = bk[kk * 8..kk * 8 + 16].split_at_mut(8);
            for g in 0..8 {
                let v = raw[r * 32 + 4 * g + q];
                lo[g] = db(v);
                hi[g] = db(v >> 16);
            }
        }
    }
}

/// The exact products of a 16 x 8 tile: `acc[r * 8 + c]` = sum over k in increasing order,
/// from 0.0, of `am[r * k + kk] * bk[kk * 8 + c]` (f64, no fused multiply-add). Two rows at a
/// time, k inner: 16 independent k-order sums stay in registers and the column loops vectorise.
#[inline(always)]
fn exact_rows(am: &[f64], bk: &[f64], k: usize, acc: &mut [f64; 128]) {
    for r in (0..16).step_by(2) {
        let (a0, a1) = (&am[r * k..(r + 1) * k], &am[(r + 1) * k..(r + 2) * k]);
        let (mut s0, mut s1) = ([0f64; 8], [0f64; 8]);
        for kk in 0..k {
            let b: &[f64] = &bk[kk * 8..kk * 8 + 8];
            for col in 0..8 {
                s0[col] += a0[kk] * b[col];
                s1[col] += a1[kk] * b[col];
            }
        }
        acc[r * 8..r * 8 + 8].copy_from_slice(&s0);
        acc[(r + 1) * 8..(r + 2) * 8].copy_from_slice(&s1);
    }
}

type ExactFn = fn(&[f64], &[f64], usize, &mut [f64; 128]);

/// [`exact_rows`] compiled for AVX-512F or AVX2 when the CPU has them (checked at run time),
/// else the baseline build. Both compute the same IEEE operations in the same order (Rust never
/// contracts to fused multiply-adds), so the bits agree (tested).
fn exact_dispatch() -> ExactFn {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2_impl(am: &[f64], bk: &[f64], k: usize, acc: &mut [f64; 128]) {
            exact_rows(am, bk, k, acc)
        }
        fn avx2(am: &[f64], bk: &[f64], k: usize, acc: &mut [f64; 128]) {
            // SAFETY: `avx2` is only selected below when the CPU reports AVX2 support.
            unsafe { avx2_impl(am, bk, k, acc) }
        }
        #[target_feature(enable = "avx512f")]
        fn avx512_impl(am: &[f64], bk: &[f64], k: usize, acc: &mut [f64; 128]) {
            exact_rows(am, bk, k, acc)
        }
        fn avx512(am: &[f64], bk: &[f64], k: usize, acc: &mut [f64; 128]) {
            // SAFETY: `avx512` is only selected below when the CPU reports AVX-512F support.
            unsafe { avx512_impl(am, bk, k, acc) }
        }
        if std::is_x86_feature_detected!("avx512f") {
            return avx512;
        }
        if std::is_x86_feature_detected!("avx2") {
            return avx2;
        }
    }
    exact_rows
}

/// The 16 x 8 tile A (16 x k, row-major) * B (k x 8, k-major) + C under `model` (exact: each
/// output's products summed in f64 in k order from 0.0, plus C; rounding to D is the
/// caller's). `c(acc, add)` sets (`add` false) or adds (`add` true) C into the row-major tile.
fn tile_out(
    model: Option<&TcModel>,
    (am, bk, k): (&[f64], &[f64], usize),
    c: impl Fn(&mut [f64; 128], bool),
) -> [f64; 128] {
    let mut acc = [0f64; 16 * 8];
    if let Some(model) = model {
        c(&mut acc, false);
        tc::tile(model, am, bk, k, 8, &mut acc);
    } else {
        exact_dispatch()(am, bk, k, &mut acc);
        c(&mut acc, true);
    }
    acc
}

/// `sums[r * n + c]` += the products `a[r * k + kk] * bt[kk * n + c]` in increasing kk order
/// (wgmma's exact path: `sums` starts at 0.0, so each output is its k-order f64 sum).
#[inline(always)]
fn rows_k_order(a: &[f64], bt: &[f64], k: usize, n: usize, sums: &mut [f64]) {
    for (r, row) in sums.chunks_mut(n).enumerate() {
        for kk in 0..k {
            let x = a[r * k + kk];
            for (s, &y) in row.iter_mut().zip(&bt[kk * n..(kk + 1) * n]) {
                *s += x * y;
            }
        }
    }
}

/// [`rows_k_order`] compiled for AVX-512F or AVX2 when the CPU has them (checked at run time),
/// else the baseline build (same operations in the same order: the same bits).
pub(crate) fn rows_k_order_dispatch() -> fn(&[f64], &[f64], usize, usize, &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2_impl(a: &[f64], bt: &[f64], k: usize, n: usize, sums: &mut [f64]) {
            rows_k_order(a, bt, k, n, sums)
        }
        fn avx2(a: &[f64], bt: &[f64], k: usize, n: usize, sums: &mut [f64]) {
            // SAFETY: `avx2` is only selected below when the CPU reports AVX2 support.
            unsafe { avx2_impl(a, bt, k, n, sums) }
        }
        #[target_feature(enable = "avx512f")]
        fn avx512_impl(a: &[f64], bt: &[f64], k: usize, n: usize, sums: &mut [f64]) {
            rows_k_order(a, bt, k, n, sums)
        }
        fn avx512(a: &[f64], bt: &[f64], k: usize, n: usize, sums: &mut [f64]) {
            // SAFETY: `avx512` is only selected below when the CPU reports AVX-512F support.
            unsafe { avx512_impl(a, bt, k, n, sums) }
        }
        if std::is_x86_feature_detected!("avx512f") {
            return avx512;
        }
        if std::is_x86_feature_detected!("avx2") {
            return avx2;
        }
    }
    rows_k_order
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A random finite element of `t` (raw bits), never zero.
    fn rand_elem(rng: &mut rand::rngs::StdRng, t: Ty) -> u32 {
        loop {
            let v = match t {
                Ty::Bf16 | Ty::F16 => rng.gen::<u32>() & 0xffff,
                _ => rng.gen::<u32>() & 0xff,
            };
            let x = match t {
                Ty::Bf16 => f32::from_bits(v << 16) as f64,
                Ty::F16 => half::f16::from_bits(v as u16).to_f64(),
                _ => to_f64(t, v as u64),
            };
            // keep products and sums finite: moderate exponents only
            if x.is_finite() && x != 0.0 && x.abs() < 1e4 && x.abs() > 1e-4 {
                return v;
            }
        }
    }

    /// `mma_in_place` (fragments from the register file, decoded-fragment cache, C gathered
    /// and D scattered in place, active-lane mask) gives the same bits as `mma_sync_with` on
    /// the same fragments followed by a masked write, in both numerics modes, for every
    /// fast-path input type, with D in place of C and in other registers, and when the cache
    /// holds stale fragments of the same slots (also rings inherited from a dropped cache).
    #[test]
    fn in_place_matches_fragment_api() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(19);
        let forms = [
            (Ty::Bf16, 16),
            (Ty::F16, 16),
            (Ty::E4m3, 32),
            (Ty::E5m2, 32),
        ];
        let mut cache = FragCache::default();
        for round in 0..24 {
            if round % 6 == 5 {
                // a new warp's cache: its f32 rings are the retired one's, entries and all
                cache = FragCache::default();
            }
            let (aty, k) = forms[round % 4];
            // 16-bit forms take one type; 8-bit floats mix
            let bty = if k == 16 {
                aty
            } else {
                forms[2 + (round / 4) % 2].0
            };
            let spec = MmaSpec::new((16, 8, k as u32), Ty::F32, aty, bty, Ty::F32, false).unwrap();
            let model = if round % 3 == 0 {
                None
            } else {
                tc::model_for([80, 89, 90][round % 3], aty)
            };
            let pack = |rng: &mut rand::rngs::StdRng, t: Ty| -> u64 {
                let n = per_reg(t);
                let w = 32 / n as u32;
                (0..n).fold(0u64, |v, i| {
                    v | (rand_elem(rng, t) as u64) << (w * i as u32)
                })
            };
            // slots: A 0..4, B 4..6, C 6..10, D 10..14 (or C itself)
            let mut regs: Vec<Lanes> = vec![[0; 32]; 14];
            for l in 0..32 {
                for r in 0..4 {
                    regs[r][l] = pack(&mut rng, aty);
                }
                for r in 4..6 {
                    regs[r][l] = pack(&mut rng, bty);
                }
                for r in 6..10 {
                    regs[r][l] = (rng.gen_range(-100.0f32..100.0)).to_bits() as u64;
                }
                for r in 10..14 {
                    regs[r][l] = 0x7fc0_dead; // poison
                }
            }
            if round % 7 == 2 {
                // C at the ends of the FP32 range: blocks outside the f32 kernel's safe range
                for (i, v) in [0u64, 0x8000_0000, 0x7f7f_ffff, 0xff7f_ffff, 1, 0x8000_0005]
                    .into_iter()
                    .enumerate()
                {
                    regs[6 + i % 4][(7 * i + round) % 32] = v;
                }
            }
            if round % 5 == 3 {
                // a non-finite input (infinity or NaN): the f64 path runs
                let special = match aty {
                    Ty::Bf16 => 0x7f80,
                    Ty::F16 => 0xfc00,
                    Ty::E4m3 => 0x7f,
                    _ => 0x7d,
                };
                regs[round % 4][round] = special;
            }
            let m = if round % 2 == 0 {
                u32::MAX
            } else {
                rng.gen::<u32>() | 1
            };
            let in_place = round % 5 == 1;
            let d: Vec<u32> = if in_place {
                vec![6, 7, 8, 9]
            } else {
                vec![10, 11, 12, 13]
            };
            // the reference: the fragment API, then a masked write
            let mut want = regs.clone();
            let mut out = [[0u64; 32]; 4];
            {
                let ar: Vec<&Lanes> = (0..4).map(|r| &regs[r]).collect();
                let br: Vec<&Lanes> = (4..6).map(|r| &regs[r]).collect();
                let cr: Vec<&Lanes> = (6..10).map(|r| &regs[r]).collect();
                mma_sync_with(&spec, model.as_ref(), &ar, &br, &cr, &mut out);
            }
            for (i, &s) in d.iter().enumerate() {
                for l in 0..32 {
                    if m >> l & 1 != 0 {
                        want[s as usize][l] = out[i][l];
                    }
                }
            }
            let slots = MmaSlots {
                a: &[0, 1, 2, 3],
                b: &[4, 5],
                c: &[6, 7, 8, 9],
                d: &d,
                m,
            };
            assert!(mma_in_place(
                &spec,
                model.as_ref(),
                &mut regs,
                slots,
                &mut cache
            ));
            assert_eq!(
                regs, want,
                "round {round}: {aty:?} x {bty:?}, model {model:?}"
            );
        }
    }

    /// The f32 decoders of the 16-bit formats give the value of every code exactly (the half
    /// crate's f16 conversion and bf16's definition as the oracle; non-finite codes stay
    /// non-finite).
    #[test]
    fn half_decoders_exact() {
        for h in 0..=0xffffu32 {
            let want = half::f16::from_bits(h as u16).to_f64();
            let got = f16_to_f32(h) as f64;
            if want.is_finite() {
                assert_eq!(got.to_bits(), want.to_bits(), "f16 {h:#06x}");
            } else {
                assert!(!got.is_finite(), "f16 {h:#06x}");
            }
            let want = to_f64(Ty::Bf16, h as u64);
            let got = Elem::Bf16.scalar(h) as f64;
            assert!(got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan());
        }
    }

    /// The dispatched (AVX2 where available) exact tile equals the baseline build bit for bit.
    #[test]
    fn exact_rows_dispatch_matches_baseline() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for k in [16usize, 32] {
            let am: Vec<f64> = (0..16 * k)
                .map(|_| rng.gen_range(-1.0..1.0) * 2f64.powi(rng.gen_range(-20..20)))
                .collect();
            let bk: Vec<f64> = (0..8 * k)
                .map(|_| rng.gen_range(-1.0..1.0) * 2f64.powi(rng.gen_range(-20..20)))
                .collect();
            let (mut x, mut y) = ([f64::NAN; 128], [f64::NAN; 128]);
            exact_dispatch()(&am, &bk, k, &mut x);
            exact_rows(&am, &bk, k, &mut y);
            assert_eq!(x.map(f64::to_bits), y.map(f64::to_bits), "k = {k}");
            // the wgmma kernel too (n = 24 columns)
            let bt: Vec<f64> = (0..24 * k).map(|i| bk[i % (8 * k)] * 1.5).collect();
            let (mut x, mut y) = (vec![0f64; 16 * 24], vec![0f64; 16 * 24]);
            rows_k_order_dispatch()(&am, &bt, k, 24, &mut x);
            rows_k_order(&am, &bt, k, 24, &mut y);
            assert_eq!(x, y, "wgmma rows, k = {k}");
        }
    }
}
