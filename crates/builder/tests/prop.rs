//! Random sequences of builder calls over random typed registers: the modules print, parse back
//! equal, validate and assemble.

mod common;
use builder::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    IntBin(u8, usize, usize),
    IntImm(u8, usize, u32),
    FBin(u8, usize, usize),
    Fma(usize, usize, usize),
    Cvt(u8, usize),
    Cmp(u8, usize, usize),
    Sel(usize, usize, usize),
    Shfl(u8, usize, u32),
    Load(usize),
    Store(usize, usize),
    If(usize, usize),
    Atom(u8, usize),
    Bits(u8, usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    let i = 0usize..64;
    prop_oneof![
        (0u8..9, i.clone(), i.clone()).prop_map(|(a, b, c)| Op::IntBin(a, b, c)),
        (0u8..4, i.clone(), 0u32..1000).prop_map(|(a, b, c)| Op::IntImm(a, b, c)),
        (0u8..6, i.clone(), i.clone()).prop_map(|(a, b, c)| Op::FBin(a, b, c)),
        (i.clone(), i.clone(), i.clone()).prop_map(|(a, b, c)| Op::Fma(a, b, c)),
        (0u8..6, i.clone()).prop_map(|(a, b)| Op::Cvt(a, b)),
        (0u8..6, i.clone(), i.clone()).prop_map(|(a, b, c)| Op::Cmp(a, b, c)),
        (i.clone(), i.clone(), i.clone()).prop_map(|(a, b, c)| Op::Sel(a, b, c)),
        (0u8..4, i.clone(), 0u32..32).prop_map(|(a, b, c)| Op::Shfl(a, b, c)),
        i.clone().prop_map(Op::Load),
        (i.clone(), i.clone()).prop_map(|(a, b)| Op::Store(a, b)),
        (i.clone(), i.clone()).prop_map(|(a, b)| Op::If(a, b)),
        (0u8..4, i.clone()).prop_map(|(a, b)| Op::Atom(a, b)),
        (0u8..8, i.clone(), i.clone()).prop_map(|(a, b, c)| Op::Bits(a, b, c)),
    ]
}

fn pick<T: Copy>(v: &[T], i: usize) -> T {
    v[i % v.len()]
}

fn build(ops: &[Op]) -> ptx::Module {
    let mut k = KernelBuilder::new("prop", Target::sm80());
    let a = k.param::<GlobalPtr<f32>>("a");
    let ai = k.param::<GlobalPtr<u32>>("ai");
    let n = k.param::<u32>("n");
    let tid = k.global_index_x();
    let mut us = vec![tid, n];
    let f0 = k.ld(a.offset(tid));
    let mut fs = vec![f0];
    let p0 = k.lt(tid, n);
    let mut ps = vec![p0];
    for o in ops {
        match *o {
            Op::IntBin(w, x, y) => {
                let (x, y) = (pick(&us, x), pick(&us, y));
                let r = match w {
                    0 => k.add(x, y),
                    1 => k.sub(x, y),
                    2 => k.mul(x, y),
                    3 => k.mul_hi(x, y),
                    4 => k.min(x, y),
                    5 => k.max(x, y),
                    6 => k.div(x, y),
                    7 => k.rem(x, y),
                    _ => k.mad_lo(x, y, x),
                };
                us.push(r);
            }
            Op::IntImm(w, x, c) => {
                let x = pick(&us, x);
                let r = match w {
                    0 => k.add(x, c),
                    1 => k.xor(x, c),
                    2 => k.shl(x, c % 32),
                    _ => k.shr(x, c % 32),
                };
                us.push(r);
            }
            Op::FBin(w, x, y) => {
                let (x, y) = (pick(&fs, x), pick(&fs, y));
                let r = match w {
                    0 => k.add(x, y),
                    1 => k.sub(x, y),
                    2 => k.mul(x, y),
                    3 => k.max(x, y),
                    4 => k.div(x, y),
                    _ => k.ex2(x),
                };
                fs.push(r);
            }
            Op::Fma(x, y, z) => {
                let r = k.fma(pick(&fs, x), pick(&fs, y), pick(&fs, z));
                fs.push(r);
            }
            Op::Cvt(w, x) => match w {
                0 => {
                    let r = k.cvt::<f32, u32>(pick(&us, x));
                    fs.push(r)
                }
                1 => {
                    let r = k.cvt::<u32, f32>(pick(&fs, x));
                    us.push(r)
                }
                2 => {
                    let h = k.cvt::<Bf16, f32>(pick(&fs, x));
                    let r = k.cvt::<f32, Bf16>(h);
                    fs.push(r)
                }
                3 => {
                    let w = k.cvt::<u64, u32>(pick(&us, x));
                    let r = k.cvt::<u32, u64>(w);
                    us.push(r)
                }
                4 => {
                    let b = k.cvt_bf16x2(pick(&fs, x), pick(&fs, x + 1));
                    let r: Reg<u32> = k.bitcast(b);
                    us.push(r)
                }
                _ => {
                    let r: Reg<f32> = k.bitcast(pick(&us, x));
                    fs.push(r)
                }
            },
            Op::Cmp(w, x, y) => {
                let p = match w {
                    0 => k.lt(pick(&us, x), pick(&us, y)),
                    1 => k.eq(pick(&us, x), pick(&us, y)),
                    2 => k.ge(pick(&fs, x), pick(&fs, y)),
                    3 => k.setp(CmpOp::Neu, pick(&fs, x), pick(&fs, y)),
                    4 => k.and(pick(&ps, x), pick(&ps, y)),
                    _ => k.not(pick(&ps, x)),
                };
                ps.push(p);
            }
            Op::Sel(p, x, y) => {
                let r = k.selp(pick(&us, x), pick(&us, y), pick(&ps, p));
                us.push(r);
            }
            Op::Shfl(w, x, c) => {
                let v = pick(&fs, x);
                let r = match w {
                    0 => k.shfl_bfly(v, c),
                    1 => k.shfl_down(v, c),
                    2 => k.shfl_up(v, c),
                    _ => k.shfl_idx(v, c),
                };
                fs.push(r);
            }
            Op::Load(x) => {
                let r = k.ld(a.offset(pick(&us, x)));
                fs.push(r);
            }
            Op::Store(x, y) => k.st(a.offset(pick(&us, x)), pick(&fs, y)),
            Op::If(p, x) => {
                let (p, v) = (pick(&ps, p), pick(&us, x));
                k.if_(p, |k| k.st(ai.offset(v), v));
            }
            Op::Atom(w, x) => {
                let v = pick(&us, x);
                let r = match w {
                    0 => k.atom_add(ai.offset(tid), v),
                    1 => k.atom(AtomOp::Max, ai, v),
                    2 => k.atom_cas(ai, v, 0),
                    _ => k.atom_exch(ai.offset(v), v),
                };
                us.push(r);
            }
            Op::Bits(w, x, y) => {
                let (x, y) = (pick(&us, x), pick(&us, y));
                let r = match w {
                    0 => k.popc(x),
                    1 => k.clz(x),
                    2 => k.brev(x),
                    3 => k.bfe(x, y, 8),
                    4 => k.bfi(x, y, 4, 8),
                    5 => k.prmt(x, y, 0x5410),
                    6 => k.lop3(x, y, x, 0xe8),
                    _ => k.shf(true, false, x, y, 5),
                };
                us.push(r);
            }
        }
    }
    // Keep every value alive so ptxas does not remove the work.
    let mut acc = k.mov(0u32);
    for u in &us {
        acc = k.add(acc, *u);
    }
    k.st(ai.offset(tid), acc);
    let mut facc = k.mov(0.0f32);
    for f in &fs {
        facc = k.add(facc, *f);
    }
    k.st(a.offset(tid), facc);
    k.finish().expect("random builder programs are valid")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn random_builder_programs(ops in proptest::collection::vec(op(), 1..40)) {
        let m = build(&ops);
        common::check(&m, "sm_80");
    }
}
