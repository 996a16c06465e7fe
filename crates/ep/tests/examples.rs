//! The runnable example (`cargo run --example dispatch_combine -p ep`) runs here too, so CI
//! checks it: its `main` returns an error when the result differs from the host reference.

#[path = "../examples/dispatch_combine.rs"]
mod dispatch_combine;

#[test]
fn dispatch_combine_example() {
    dispatch_combine::main().unwrap();
}
