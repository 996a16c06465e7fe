//! The rank programs of `netnccl-check` (the multi-process tests and `scripts/gpu-check.sh`
//! run them as every rank of a `dist` job): the data-parallel collectives against a host
//! reference, and the proxy transport over [`NcclEngine`] with the host in the kernels' part
//! (`ep::proxycheck`, shared with `netmpi-proxy-check`).

use crate::{Comm, NcclEngine, ReduceOp};
use half::bf16;
use runtime::{Buffer, Device, Pod};

pub use ep::selfcheck::Res;

/// splitmix64: every process derives every rank's inputs from the shared seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-2, 2).
    pub fn value(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 22) as f32 - 2.0
    }
}

/// Rank `r`'s `len` inputs of stream `what` under `seed`.
pub fn inputs(seed: u64, what: u64, r: u32, len: usize) -> Vec<f32> {
    let mut g = Rng(seed ^ what.wrapping_mul(0x1000_0001) ^ ((r as u64 + 1) << 40));
    (0..len).map(|_| g.value()).collect()
}

/// Sizes and strictness of the collectives check.
#[derive(Clone, Debug)]
pub struct CollCfg {
    /// Elements per rank and block (reduce-scatter output, all-gather input).
    pub count: usize,
    /// Also require the fake NCCL's exact rank-order results bit for bit (a real NCCL's
    /// reduction order is its own: only the f64 tolerance applies there).
    pub exact: bool,
    pub seed: u64,
}

/// Uploads `x` and a NaN-poisoned output of `out_len`.
fn io<T: Pod>(d: &Device, x: &[T], out_len: usize, nan: T) -> Res<(Buffer<T>, Buffer<T>)> {
    let send = d.upload(x)?;
    let recv = d.alloc::<T>(out_len)?;
    recv.fill(nan)?;
    Ok((send, recv))
}

/// Compares `got` with the f64 sums `want` (|err| <= tol * magnitude) and, if given, bit for
/// bit with `exact`.
fn compare(
    what: &str,
    got: &[f64],
    want: &[f64],
    mag: &[f64],
    tol: f64,
    exact: Option<&[f64]>,
) -> Res<()> {
    for i in 0..want.len() {
        let ok = (got[i] - want[i]).abs() <= tol * mag[i] + 1e-30;
        let bit = exact.is_none_or(|e| e[i].to_bits() == got[i].to_bits());
        if !ok || !bit || !got[i].is_finite() {
            let e = exact
                .map(|e| format!(", rank-order fold {}", e[i]))
                .unwrap_or_default();
            return Err(format!(
                "{what}: element {i} is {}, f64 reference {}{e}",
                got[i], want[i]
            )
            .into());
        }
    }
    Ok(())
}

/// Every rank's inputs of one stream.
fn all_inputs(c: &CollCfg, what: u64, n: u32, len: usize) -> Vec<Vec<f32>> {
    (0..n).map(|r| inputs(c.seed, what, r, len)).collect()
}

/// Reference of a sum over ranks at `idx(i)` for output element i: (f64 sum, f64 sum of |x|,
/// rank-order fold through `round`).
fn sums(
    all: &[Vec<f32>],
    len: usize,
    idx: impl Fn(usize) -> usize,
    round: impl Fn(f32) -> f32,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..len {
        let j = idx(i);
        out.0.push(all.iter().map(|x| x[j] as f64).sum());
        out.1.push(all.iter().map(|x| (x[j] as f64).abs()).sum());
        let mut acc = all[0][j];
        for x in &all[1..] {
            acc = round(acc + x[j]);
        }
        out.2.push(acc as f64);
    }
    out
}

/// All-reduce (sum, max), reduce-scatter (sum) and all-gather of f32, all-reduce (sum) and
/// all-gather of bf16, and the order-independent i32 sum, f64 min and f16 max, on fresh random
/// data (NaN-poisoned outputs), against the host reference.
pub fn collectives(comm: &Comm, c: &CollCfg) -> Res<String> {
    let (me, n, d) = (comm.rank(), comm.nranks(), comm.device().clone());
    let nn = n as usize;
    let len = c.count * nn;
    let ex = |v: &[f64]| c.exact.then(|| v.to_vec());
    // all-reduce f32 sum
    let all = all_inputs(c, 1, n, len);
    let (s, r) = io(&d, &all[me as usize], len, f32::NAN)?;
    comm.all_reduce(&s, &r, ReduceOp::Sum)?;
    let got: Vec<f64> = r.to_vec()?.iter().map(|&v| v as f64).collect();
    let (want, mag, fold) = sums(&all, len, |i| i, |x| x);
    let tol = nn as f64 * f32::EPSILON as f64;
    compare(
        "all_reduce f32 sum",
        &got,
        &want,
        &mag,
        tol,
        ex(&fold).as_deref(),
    )?;
    // all-reduce f32 max (exact everywhere)
    comm.all_reduce(&s, &r, ReduceOp::Max)?;
    let got: Vec<f64> = r.to_vec()?.iter().map(|&v| v as f64).collect();
    let want: Vec<f64> = (0..len)
        .map(|i| all.iter().map(|x| x[i]).fold(f32::MIN, f32::max) as f64)
        .collect();
    compare("all_reduce f32 max", &got, &want, &want, 0.0, Some(&want))?;
    // reduce-scatter f32 sum: this rank's block
    let all = all_inputs(c, 2, n, len);
    let (s, r) = io(&d, &all[me as usize], c.count, f32::NAN)?;
    comm.reduce_scatter(&s, &r, ReduceOp::Sum)?;
    let got: Vec<f64> = r.to_vec()?.iter().map(|&v| v as f64).collect();
    let base = me as usize * c.count;
    let (want, mag, fold) = sums(&all, c.count, |i| base + i, |x| x);
    compare(
        "reduce_scatter f32 sum",
        &got,
        &want,
        &mag,
        tol,
        ex(&fold).as_deref(),
    )?;
    // all-gather f32: bit for bit
    let all = all_inputs(c, 3, n, c.count);
    let (s, r) = io(&d, &all[me as usize], len, f32::NAN)?;
    comm.all_gather(&s, &r)?;
    let got: Vec<f64> = r.to_vec()?.iter().map(|&v| v as f64).collect();
    let want: Vec<f64> = all.concat().iter().map(|&v| v as f64).collect();
    compare("all_gather f32", &got, &want, &want, 0.0, Some(&want))?;
    bf16_checks(comm, c)?;
    exact_checks(comm, c)?;
    comm.async_error()?;
    Ok(format!(
        "rank {me}: collectives OK ({n} ranks, {} elements per block, seed {:#x}, exact {})",
        c.count, c.seed, c.exact
    ))
}

fn bf16_checks(comm: &Comm, c: &CollCfg) -> Res<()> {
    let (me, n, d) = (comm.rank(), comm.nranks(), comm.device().clone());
    let len = c.count * n as usize;
    let to_bf =
        |v: &Vec<f32>| -> Vec<f32> { v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect() };
    let all: Vec<Vec<f32>> = all_inputs(c, 4, n, len).iter().map(to_bf).collect();
    let mine: Vec<bf16> = all[me as usize]
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    let nan = bf16::from_f32(f32::NAN);
    let (s, r) = io(&d, &mine, len, nan)?;
    comm.all_reduce(&s, &r, ReduceOp::Sum)?;
    let got: Vec<f64> = r.to_vec()?.iter().map(|v| v.to_f64()).collect();
    let round = |x: f32| bf16::from_f32(x).to_f32();
    let (want, mag, fold) = sums(&all, len, |i| i, round);
    let tol = n as f64 * (1.0 / 256.0);
    let exact = c.exact.then_some(&fold[..]);
    compare("all_reduce bf16 sum", &got, &want, &mag, tol, exact)?;
    let (s, r) = io(&d, &mine[..c.count], len, nan)?;
    comm.all_gather(&s, &r)?;
    let got: Vec<f64> = r.to_vec()?.iter().map(|v| v.to_f64()).collect();
    let want: Vec<f64> = all
        .iter()
        .flat_map(|x| x[..c.count].iter().map(|&v| v as f64))
        .collect();
    compare("all_gather bf16", &got, &want, &want, 0.0, Some(&want))
}

/// Reductions that are exact in any order: i32 sum (wrapping), f64 min, f16 max.
fn exact_checks(comm: &Comm, c: &CollCfg) -> Res<()> {
    let (me, n, d) = (comm.rank() as usize, comm.nranks(), comm.device().clone());
    let len = c.count;
    let all = all_inputs(c, 5, n, len);
    let ints: Vec<Vec<i32>> = all
        .iter()
        .map(|v| v.iter().map(|&x| (x * 1e9) as i32).collect())
        .collect();
    let (s, r) = io(&d, &ints[me], len, i32::MIN)?;
    comm.all_reduce(&s, &r, ReduceOp::Sum)?;
    let want: Vec<i32> = (0..len)
        .map(|i| ints.iter().fold(0i32, |a, v| a.wrapping_add(v[i])))
        .collect();
    if r.to_vec()? != want {
        return Err("all_reduce i32 sum differs from the exact host sum".into());
    }
    let wide: Vec<Vec<f64>> = all
        .iter()
        .map(|v| v.iter().map(|&x| x as f64 / 3.0).collect())
        .collect();
    let (s, r) = io(&d, &wide[me], len, f64::NAN)?;
    comm.all_reduce(&s, &r, ReduceOp::Min)?;
    let want: Vec<f64> = (0..len)
        .map(|i| wide.iter().map(|v| v[i]).fold(f64::MAX, f64::min))
        .collect();
    compare(
        "all_reduce f64 min",
        &r.to_vec()?,
        &want,
        &want,
        0.0,
        Some(&want),
    )?;
    let halves: Vec<Vec<half::f16>> = all
        .iter()
        .map(|v| v.iter().map(|&x| half::f16::from_f32(x)).collect())
        .collect();
    let (s, r) = io(&d, &halves[me], len, half::f16::NAN)?;
    comm.all_reduce(&s, &r, ReduceOp::Max)?;
    let got: Vec<f64> = r.to_vec()?.iter().map(|v| v.to_f64()).collect();
    let want: Vec<f64> = (0..len)
        .map(|i| {
            halves
                .iter()
                .map(|v| v[i].to_f64())
                .fold(f64::MIN, f64::max)
        })
        .collect();
    compare("all_reduce f16 max", &got, &want, &want, 0.0, Some(&want))
}

/// The two-endpoint proxy check (`ep::proxycheck`) over the NCCL engine: the windows live
/// on this process's emulated device, the engine's staging on its GPU.
pub fn proxy(engine: NcclEngine, seed: u64) -> Res<String> {
    let p = ep::Engine::endpoint(&engine);
    let records = 40;
    let cfg = ep::proxycheck::PairCfg {
        records,
        seed,
        timeout: std::time::Duration::from_secs(60),
    };
    ep::proxycheck::run(Box::new(engine), &cfg)?;
    Ok(format!(
        "rank {p}: proxy over NCCL OK ({records} records each way, sparse words landed)"
    ))
}
