use builder::*;
#[test]
fn show() {
    for m in [examples::vector_add(Target::sm80()).unwrap(), examples::warp_reduce_sum(Target::sm80()).unwrap(), examples::transpose_tiled(Target::sm80()).unwrap()] {
        let s = ptx::print(&m);
        println!("{s}");
        assert_eq!(ptx::parse(&s).unwrap(), m);
        let r = ptx::ptxas::assemble(&s, "sm_80", &Default::default());
        println!("{:?}", r.map(|r| r.kernels));
    }
}
