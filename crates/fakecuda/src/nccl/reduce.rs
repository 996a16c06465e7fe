//! Element types and reductions of the fake NCCL. Reductions combine the ranks' contributions
//! one at a time in rank order (0, 1, ..., n-1), so every rank computes bit-identical results
//! and a run is reproducible; 16-bit floats are widened to f32 for each step and rounded back.

use half::{bf16, f16};

/// `ncclDataType_t` values (NCCL 2.19+ numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dtype {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    Bf16,
    F8e4m3,
    F8e5m2,
}

impl Dtype {
    pub fn from_raw(v: u32) -> Option<Dtype> {
        use Dtype::*;
        Some(match v {
            0 => I8,
            1 => U8,
            2 => I32,
            3 => U32,
            4 => I64,
            5 => U64,
            6 => F16,
            7 => F32,
            8 => F64,
            9 => Bf16,
            10 => F8e4m3,
            11 => F8e5m2,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        use Dtype::*;
        match self {
            I8 | U8 | F8e4m3 | F8e5m2 => 1,
            F16 | Bf16 => 2,
            I32 | U32 | F32 => 4,
            I64 | U64 | F64 => 8,
        }
    }
}

/// `ncclRedOp_t` values (the built-in ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl RedOp {
    pub fn from_raw(v: u32) -> Option<RedOp> {
        Some(match v {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            4 => RedOp::Avg,
            _ => return None,
        })
    }
}

/// The rank-order fold of every element: `acc = part 0's`, then `acc = step(acc, part q's)`
/// for q = 1..n-1, and `fin(acc)` is the result. Elements are `N` little-endian bytes, read
/// as `T` by `dec`.
fn fold_elems<T: Copy, const N: usize>(
    parts: &[Vec<u8>],
    dec: impl Fn([u8; N]) -> T,
    step: impl Fn(T, T) -> T,
    fin: impl Fn(T) -> [u8; N],
) -> Vec<u8> {
    let get = |p: &Vec<u8>, i: usize| {
        let mut a = [0u8; N];
        a.copy_from_slice(&p[i * N..(i + 1) * N]);
        dec(a)
    };
    let n = parts[0].len() / N;
    let mut out = Vec::with_capacity(parts[0].len());
    for i in 0..n {
        let acc = parts[1..]
            .iter()
            .fold(get(&parts[0], i), |acc, p| step(acc, get(p, i)));
        out.extend_from_slice(&fin(acc));
    }
    out
}

macro_rules! fold_num {
    ($t:ty, $parts:expr, $op:expr, $avg:expr) => {
        fold_elems::<$t, { std::mem::size_of::<$t>() }>($parts, <$t>::from_le_bytes, $op, |a| {
            $avg(a).to_le_bytes()
        })
    };
}

macro_rules! ints {
    ($t:ty, $parts:expr, $op:expr, $n:expr) => {{
        let n = $n as $t;
        match $op {
            RedOp::Sum => fold_num!($t, $parts, |a: $t, b: $t| a.wrapping_add(b), |a| a),
            RedOp::Prod => fold_num!($t, $parts, |a: $t, b: $t| a.wrapping_mul(b), |a| a),
            RedOp::Max => fold_num!($t, $parts, |a: $t, b: $t| a.max(b), |a| a),
            RedOp::Min => fold_num!($t, $parts, |a: $t, b: $t| a.min(b), |a| a),
            RedOp::Avg => fold_num!($t, $parts, |a: $t, b: $t| a.wrapping_add(b), |a: $t| a / n),
        }
    }};
}

macro_rules! floats {
    ($t:ty, $parts:expr, $op:expr, $n:expr) => {{
        let n = $n as $t;
        match $op {
            RedOp::Sum => fold_num!($t, $parts, |a: $t, b: $t| a + b, |a| a),
            RedOp::Prod => fold_num!($t, $parts, |a: $t, b: $t| a * b, |a| a),
            RedOp::Max => fold_num!($t, $parts, |a: $t, b: $t| a.max(b), |a| a),
            RedOp::Min => fold_num!($t, $parts, |a: $t, b: $t| a.min(b), |a| a),
            RedOp::Avg => fold_num!($t, $parts, |a: $t, b: $t| a + b, |a: $t| a / n),
        }
    }};
}

/// Folds `parts` (one byte vector per rank, in rank order, equal lengths) with `op`.
/// `None` when the type has no reduction here (the 8-bit floats).
pub(crate) fn fold(dt: Dtype, op: RedOp, parts: &[Vec<u8>]) -> Option<Vec<u8>> {
    let n = parts.len();
    Some(match dt {
        Dtype::I8 => ints!(i8, parts, op, n),
        Dtype::U8 => ints!(u8, parts, op, n),
        Dtype::I32 => ints!(i32, parts, op, n),
        Dtype::U32 => ints!(u32, parts, op, n),
        Dtype::I64 => ints!(i64, parts, op, n),
        Dtype::U64 => ints!(u64, parts, op, n),
        Dtype::F32 => floats!(f32, parts, op, n),
        Dtype::F64 => floats!(f64, parts, op, n),
        Dtype::F16 => halves(
            parts,
            op,
            |b| f16::from_bits(b).to_f32(),
            |x| f16::from_f32(x).to_bits(),
        ),
        Dtype::Bf16 => halves(
            parts,
            op,
            |b| bf16::from_bits(b).to_f32(),
            |x| bf16::from_f32(x).to_bits(),
        ),
        Dtype::F8e4m3 | Dtype::F8e5m2 => return None,
    })
}

/// 16-bit floats: each step in f32, rounded back to the type (as a half-precision kernel
/// accumulating in registers of the type would). `dec`/`enc` convert the type's bits.
fn halves(parts: &[Vec<u8>], op: RedOp, dec: fn(u16) -> f32, enc: fn(f32) -> u16) -> Vec<u8> {
    let round = |x: f32| dec(enc(x));
    let n = parts.len() as f32;
    fold_elems::<f32, 2>(
        parts,
        |b| dec(u16::from_le_bytes(b)),
        |acc, x| {
            round(match op {
                RedOp::Sum | RedOp::Avg => acc + x,
                RedOp::Prod => acc * x,
                RedOp::Max => acc.max(x),
                RedOp::Min => acc.min(x),
            })
        },
        |acc| {
            let acc = if op == RedOp::Avg {
                round(acc / n)
            } else {
                acc
            };
            enc(acc).to_le_bytes()
        },
    )
}
