//! The runnable examples (`cargo run --example NAME -p builder`) run here too, so CI checks
//! them: each `main` returns an error when its result differs from its host reference.

#[path = "../examples/saxpy.rs"]
mod saxpy;

#[path = "../examples/block_reduce.rs"]
mod block_reduce;

#[path = "../examples/warp_scan.rs"]
mod warp_scan;

#[test]
fn saxpy_example() {
    saxpy::main().unwrap();
}

#[test]
fn block_reduce_example() {
    block_reduce::main().unwrap();
}

#[test]
fn warp_scan_example() {
    warp_scan::main().unwrap();
}

/// The block reduction of the example written with the expression layer (`builder::expr`):
/// the same PTX, instruction for instruction.
#[test]
fn block_reduce_in_expression_style_is_the_same_ptx() {
    use block_reduce::BLOCK;
    use builder::*;
    let k = KernelBuilder::new("block_sum", Target::sm80()).typed();
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
        for j in 1..=BLOCK.trailing_zeros() {
            let s = BLOCK >> j;
            e.if_(tid.lt(s), || {
                let other = tid + s;
                sm.set(tid, sm.get(tid) + sm.get(other));
            });
            e.sync_threads();
        }
        e.if_(tid.eq(0u32), || {
            let total = sm.get_at(0);
            partial.set(e.ctaid_x(), total);
        });
    });
    let expr = k.finish().unwrap();
    let methods = block_reduce::block_sum(Target::sm80()).unwrap();
    assert_eq!(ptx::print(expr.module()), ptx::print(methods.module()));
}
