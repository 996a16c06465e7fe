//! Kernel arguments as front ends give them, checked against a kernel's parameter list: the
//! one set of rules (and messages) behind `ptxforge run`, [`crate::runner`] and the Python
//! package's `Module.launch`.
//!
//! A front end describes each argument as a [`Given`]: a device buffer, a value of a definite
//! kind (`u32:7` on the command line, a numpy scalar), or an integer or float of no definite
//! width (a Python `int` or `float`), which takes the parameter's own type when it fits.
//! [`resolve`] checks the count, each argument's kind and range against its parameter, and
//! sizes and packing (through [`crate::Function::check_args`]), and returns the [`Arg`]s to
//! launch with. Errors are [`ArgError`]s naming the argument's index and the parameter.

use crate::{Arg, Function, RuntimeError};

/// One kernel argument before it is checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Given {
    /// A device buffer: its address is passed.
    Buffer(u64),
    /// A value of a definite kind: passed only for a parameter of that kind.
    Value(Arg),
    /// An integer of no definite width: takes the integer parameter's type when in range.
    Int(i128),
    /// A float of no definite width: takes the float parameter's type when in range.
    Float(f64),
}

/// What was wrong with an argument list (front ends map these to their own error classes:
/// Python raises `TypeError` for [`ArgProblem::Kind`] and `ValueError` for the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgProblem {
    /// Too few or too many arguments.
    Count,
    /// The wrong kind of argument for the parameter (a float for an integer, a buffer for a
    /// float, an `i32` for a `.u32`, ...).
    Kind,
    /// A value out of the parameter type's range.
    Range,
    /// An argument of the wrong size for the parameter.
    Size,
}

/// A refused argument list. Displays as `kernel `NAME`: MSG`, where MSG starts with
/// `argument I (`PARAM`): ` when one argument is at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("kernel `{kernel}`: {msg}")]
pub struct ArgError {
    pub kernel: String,
    /// Index of the argument at fault (None for a wrong count).
    pub index: Option<usize>,
    /// Name of the parameter at fault (None for a wrong count).
    pub param: Option<String>,
    pub problem: ArgProblem,
    pub msg: String,
}

impl ArgError {
    /// An error about argument `i`, passed for parameter `p` of `kernel`.
    pub fn at(
        kernel: &str,
        i: usize,
        p: &ptx::Param,
        problem: ArgProblem,
        msg: impl std::fmt::Display,
    ) -> ArgError {
        ArgError {
            kernel: kernel.to_string(),
            index: Some(i),
            param: Some(p.name.clone()),
            problem,
            msg: format!("argument {i} (`{}`): {msg}", p.name),
        }
    }

    /// The wrong-count error.
    pub fn count(kernel: &str, given: usize, takes: usize) -> ArgError {
        ArgError {
            kernel: kernel.to_string(),
            index: None,
            param: None,
            problem: ArgProblem::Count,
            msg: format!("{given} arguments given, kernel takes {takes}"),
        }
    }
}

impl From<ArgError> for RuntimeError {
    fn from(e: ArgError) -> RuntimeError {
        RuntimeError::Args {
            kernel: e.kernel,
            msg: e.msg,
        }
    }
}

/// Checks `given` against `func`'s parameters and returns the arguments to launch with.
pub fn resolve(func: &Function, given: &[Given]) -> Result<Vec<Arg>, ArgError> {
    if given.len() != func.params.len() {
        return Err(ArgError::count(&func.name, given.len(), func.params.len()));
    }
    let args = given
        .iter()
        .zip(&func.params)
        .enumerate()
        .map(|(i, (g, p))| resolve_one(&func.name, i, g, p))
        .collect::<Result<Vec<_>, _>>()?;
    func.check_args(&args)?;
    Ok(args)
}

/// Whether a parameter takes floats or integers, for messages (None: untyped bits or others).
fn wants(p: &ptx::Param) -> Option<&'static str> {
    if p.array.is_some() {
        return None;
    }
    match p.ty.kind() {
        ptx::TyKind::Float => Some("a float"),
        ptx::TyKind::Signed | ptx::TyKind::Unsigned => Some("an integer"),
        _ => None,
    }
}

/// Checks only each argument's kind against its parameter (a float for an integer parameter,
/// a buffer or an integer for a float one), not the count or the sizes: `ptxforge run` does this
/// before it reads any file, and leaves the rest to [`resolve`] at the launch.
pub fn check_kinds(func: &Function, given: &[Given]) -> Result<(), ArgError> {
    if given.len() != func.params.len() {
        return Ok(()); // the launch reports the count
    }
    for (i, (g, p)) in given.iter().zip(&func.params).enumerate() {
        check_kind(&func.name, i, g, p)?;
    }
    Ok(())
}

/// A float for an integer parameter, or anything else for a float one, is a kind error.
fn check_kind(kernel: &str, i: usize, g: &Given, p: &ptx::Param) -> Result<(), ArgError> {
    let given_float = matches!(g, Given::Float(_) | Given::Value(Arg::F32(_) | Arg::F64(_)));
    let mismatch = match wants(p) {
        Some(w @ "a float") if !given_float => Some(w),
        Some(w @ "an integer") if given_float => Some(w),
        _ => None,
    };
    match mismatch {
        None => Ok(()),
        Some(want) => Err(ArgError::at(
            kernel,
            i,
            p,
            ArgProblem::Kind,
            format!("{} given, parameter is .{} ({want})", describe(g), p.ty),
        )),
    }
}

/// One argument: its kind first, then the width-less numbers typed by the parameter.
fn resolve_one(kernel: &str, i: usize, g: &Given, p: &ptx::Param) -> Result<Arg, ArgError> {
    check_kind(kernel, i, g, p)?;
    match *g {
        Given::Buffer(ptr) => Ok(Arg::Ptr(ptr)),
        Given::Value(v) => Ok(v),
        Given::Int(v) => int_for(v, p.ty).ok_or_else(|| range_err(kernel, i, p, v)),
        Given::Float(v) => float_for(v, p.ty).ok_or_else(|| {
            ArgError::at(
                kernel,
                i,
                p,
                ArgProblem::Range,
                format!("{v:e} is out of range for .{}", p.ty),
            )
        }),
    }
}

/// How a refused argument is named in messages (the CLI's `U32(7)` for definite values).
fn describe(g: &Given) -> String {
    match g {
        Given::Buffer(_) => "a buffer address".into(),
        Given::Value(v) => format!("{v:?}"),
        Given::Int(v) => format!("int {v}"),
        Given::Float(v) => format!("float {v:?}"),
    }
}

fn range_err(kernel: &str, i: usize, p: &ptx::Param, v: i128) -> ArgError {
    let (lo, hi) = int_range(p.ty);
    ArgError::at(
        kernel,
        i,
        p,
        ArgProblem::Range,
        format!("{v} is out of range for .{} ({lo}..={hi})", p.ty),
    )
}

/// The values an integer parameter takes (untyped `.bN`: signed or unsigned of that width).
fn int_range(ty: ptx::Ty) -> (i128, i128) {
    let bits = ty.size().min(8) * 8;
    match ty.kind() {
        ptx::TyKind::Signed => (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
        ptx::TyKind::Bits => (-(1i128 << (bits - 1)), (1i128 << bits) - 1),
        _ => (0, (1i128 << bits) - 1),
    }
}

/// A width-less integer as the parameter's type (None: out of range). Signed parameters get
/// signed kinds; unsigned and untyped ones unsigned kinds (two's complement for a negative
/// value given for `.bN`).
fn int_for(v: i128, ty: ptx::Ty) -> Option<Arg> {
    let (lo, hi) = int_range(ty);
    if v < lo || v > hi {
        return None;
    }
    let signed = ty.kind() == ptx::TyKind::Signed;
    Some(match (ty.size(), signed) {
        (1, true) => Arg::I8(v as i8),
        (1, false) => Arg::U8(v as u8),
        (2, true) => Arg::I16(v as i16),
        (2, false) => Arg::U16(v as u16),
        (4, true) => Arg::I32(v as i32),
        (4, false) => Arg::U32(v as u32),
        (_, true) => Arg::I64(v as i64),
        (_, false) => Arg::U64(v as u64),
    })
}

/// A width-less float as the parameter's type (None: a finite value the type cannot hold).
fn float_for(v: f64, ty: ptx::Ty) -> Option<Arg> {
    let a = match ty {
        ptx::Ty::F16 => Arg::F16(half::f16::from_f64(v)),
        ptx::Ty::Bf16 => Arg::Bf16(half::bf16::from_f64(v)),
        ptx::Ty::F32 => Arg::F32(v as f32),
        // untyped 64-bit parameters take the f64's bits; other widths have no float type
        ptx::Ty::F64 | ptx::Ty::B64 => Arg::F64(v),
        ptx::Ty::B32 => Arg::F32(v as f32),
        ptx::Ty::B16 => Arg::F16(half::f16::from_f64(v)),
        _ => Arg::F64(v), // a size error from `check_args` names the parameter's width
    };
    let back = match a {
        Arg::F16(x) => x.to_f64(),
        Arg::Bf16(x) => x.to_f64(),
        Arg::F32(x) => x as f64,
        _ => v,
    };
    (back.is_finite() || !v.is_finite()).then_some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(ty: ptx::Ty, name: &str) -> ptx::Param {
        ptx::Param::new(ptx::Space::Param, ty, name)
    }

    #[test]
    fn ints_take_the_parameter_type_in_range() {
        assert_eq!(int_for(7, ptx::Ty::U32), Some(Arg::U32(7)));
        assert_eq!(int_for(-1, ptx::Ty::S16), Some(Arg::I16(-1)));
        assert_eq!(int_for(-1, ptx::Ty::B32), Some(Arg::U32(u32::MAX)));
        assert_eq!(int_for(1 << 32, ptx::Ty::U32), None);
        assert_eq!(int_for(-1, ptx::Ty::U64), None);
        assert_eq!(int_for(1 << 31, ptx::Ty::S32), None);
        assert_eq!(
            int_for(u64::MAX as i128, ptx::Ty::U64),
            Some(Arg::U64(u64::MAX))
        );
    }

    #[test]
    fn floats_take_the_parameter_type_and_overflow_is_refused() {
        assert_eq!(float_for(1.5, ptx::Ty::F32), Some(Arg::F32(1.5)));
        assert_eq!(float_for(1e300, ptx::Ty::F32), None);
        assert_eq!(float_for(1e5, ptx::Ty::F16), None);
        assert!(matches!(
            float_for(f64::INFINITY, ptx::Ty::F32),
            Some(Arg::F32(x)) if x.is_infinite()
        ));
    }

    #[test]
    fn kinds_and_ranges_name_the_parameter() {
        let p = param(ptx::Ty::U32, "n");
        let e = resolve_one("k", 2, &Given::Float(2.5), &p).unwrap_err();
        assert_eq!(e.problem, ArgProblem::Kind);
        assert_eq!(
            e.msg,
            "argument 2 (`n`): float 2.5 given, parameter is .u32 (an integer)"
        );
        let e = resolve_one("k", 2, &Given::Int(-3), &p).unwrap_err();
        assert_eq!(e.problem, ArgProblem::Range);
        assert_eq!(e.param.as_deref(), Some("n"));
        assert!(e.msg.contains("-3 is out of range for .u32"), "{}", e.msg);
        let f = param(ptx::Ty::F32, "alpha");
        let e = resolve_one("k", 0, &Given::Buffer(64), &f).unwrap_err();
        assert_eq!(
            e.to_string(),
            "kernel `k`: argument 0 (`alpha`): a buffer address given, parameter is .f32 (a float)"
        );
    }
}
