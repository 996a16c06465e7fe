//! Block reduction: each CTA sums 256 elements through shared memory (tree reduction with
//! `bar.sync`), writing one partial sum per CTA; the host adds the partials.
//!
//! `cargo run --example block_reduce -p builder`. Exits nonzero on a mismatch.

use builder::*;
use runtime::{Device, LaunchConfig};
use std::error::Error;

pub const BLOCK: u32 = 256;

/// The kernel's signature: its parameter types, in order.
pub type BlockSum = TypedKernel<(GlobalPtr<f32>, GlobalPtr<f32>, u32)>;

/// `partial[ctaid.x] = sum(x[ctaid.x*256 .. +256])` (elements past `n` count as 0).
pub fn block_sum(t: Target) -> Result<BlockSum, BuildError> {
    let k = KernelBuilder::new("block_sum", t).typed();
    let (k, x) = k.param::<GlobalPtr<f32>>("x");
    let (k, partial) = k.param::<GlobalPtr<f32>>("partial");
    let (mut k, n) = k.param::<u32>("n");
    k.reqntid(&[BLOCK]);
    let sm = k.shared_array::<f32>(BLOCK as u64, 4);
    let (tid, i) = (k.tid_x(), k.global_index_x());
    let v = k.mov(0.0f32);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let xi = k.ld(x.offset(i));
        k.mov_to(v, xi);
    });
    k.st(sm.offset(tid), v);
    k.bar_sync(0u32);
    k.unroll(BLOCK.trailing_zeros(), |k, j| {
        let s = BLOCK >> (j + 1);
        let other = k.add(tid, s);
        let active = k.lt(tid, s);
        k.if_(active, |k| {
            let (a, b) = (k.ld(sm.offset(tid)), k.ld(sm.offset(other)));
            let sum = k.add(a, b);
            k.st(sm.offset(tid), sum);
        });
        k.bar_sync(0u32);
    });
    let first = k.eq(tid, 0u32);
    k.if_(first, |k| {
        let cta = k.ctaid_x();
        let total = k.ld(sm);
        k.st(partial.offset(cta), total);
    });
    k.finish()
}

/// The same kernel in the expression style (`builder::expr`): the same PTX, instruction for
/// instruction (the test `block_reduce_in_expression_style_is_the_same_ptx` checks it).
pub fn block_sum_expr(t: Target) -> Result<BlockSum, BuildError> {
    let k = KernelBuilder::new("block_sum", t).typed();
    let (k, x) = k.param::<GlobalPtr<f32>>("x");
    let (k, partial) = k.param::<GlobalPtr<f32>>("partial");
    let (mut k, n) = k.param::<u32>("n");
    k.reqntid(&[BLOCK]);
    let sm = k.shared_array::<f32>(BLOCK as u64, 4);
    k.expr(|e| {
        let (x, partial, sm) = (e.ptr(x), e.ptr(partial), e.ptr(sm));
        let (tid, i, v) = (e.tid_x(), e.global_index_x(), e.imm(0.0f32));
        e.if_(i.lt(n), || e.assign(v, x.get(i)));
        sm.set(tid, v);
        e.sync_threads();
        for s in (1..=BLOCK.trailing_zeros()).map(|j| BLOCK >> j) {
            let other = tid + s;
            e.if_(tid.lt(s), || sm.set(tid, sm.get(tid) + sm.get(other)));
            e.sync_threads();
        }
        e.if_(tid.eq(0u32), || partial.set(e.ctaid_x(), sm.get_at(0)));
    });
    k.finish()
}

pub fn main() -> Result<(), Box<dyn Error>> {
    let n = 5000usize;
    let xs: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let ctas = n.div_ceil(BLOCK as usize);

    let dev = Device::emu(0);
    let f = dev.load_kernel(&block_sum(Target::sm80())?)?;
    let x_buf = dev.upload(&xs)?;
    let partial = dev.upload(&vec![f32::NAN; ctas])?; // poisoned: every CTA must write
    let stream = dev.stream(0);
    let cfg = LaunchConfig::linear(ctas as u32, BLOCK);
    stream.launch_typed(&f, &cfg, (&x_buf, &partial, n as u32))?;
    let parts = stream.read(&partial)?;

    for (c, got) in parts.iter().enumerate() {
        let lo = c * BLOCK as usize;
        let want: f64 = xs[lo..(lo + BLOCK as usize).min(n)]
            .iter()
            .map(|&v| v as f64)
            .sum();
        if (*got as f64 - want).abs() > 1e-4 * want.abs().max(1.0) {
            return Err(format!("CTA {c}: partial sum {got}, expected {want}").into());
        }
    }
    let total: f64 = parts.iter().map(|&p| p as f64).sum();
    println!("block_reduce: {ctas} partial sums match; total {total:.4}");
    Ok(())
}
