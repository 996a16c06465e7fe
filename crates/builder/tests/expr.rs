//! The expression layer emits exactly what the method API emits: the same kernels written both
//! ways print to identical PTX.

use builder::*;

type Saxpy = TypedKernel<(GlobalPtr<f32>, GlobalPtr<f32>, f32, u32)>;

fn saxpy_methods() -> Saxpy {
    let k = KernelBuilder::new("saxpy", Target::sm80()).typed();
    let (k, x) = k.param::<GlobalPtr<f32>>("x");
    let (k, y) = k.param::<GlobalPtr<f32>>("y");
    let (k, a) = k.param::<f32>("a");
    let (mut k, n) = k.param::<u32>("n");
    let i = k.global_index_x();
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let xi = k.ld(x.offset(i));
        let yi = k.ld(y.offset(i));
        let r = k.fma(a, xi, yi);
        k.st(y.offset(i), r);
    });
    k.finish().unwrap()
}

fn saxpy_expr() -> Saxpy {
    let k = KernelBuilder::new("saxpy", Target::sm80()).typed();
    let (k, x) = k.param::<GlobalPtr<f32>>("x");
    let (k, y) = k.param::<GlobalPtr<f32>>("y");
    let (k, a) = k.param::<f32>("a");
    let (mut k, n) = k.param::<u32>("n");
    k.expr(|e| {
        let (x, y, a, i) = (e.ptr(x), e.ptr(y), e.val(a), e.global_index_x());
        e.if_(i.lt(n), || y.set(i, a.mul_add(x.get(i), y.get(i))));
    });
    k.finish().unwrap()
}

#[test]
fn saxpy_both_ways_is_the_same_ptx() {
    let (m, e) = (saxpy_methods(), saxpy_expr());
    assert_eq!(ptx::print(m.module()), ptx::print(e.module()));
    assert_eq!(m.module(), e.module());
}

/// The library example `examples::vector_add`, rewritten with operators.
#[test]
fn library_vector_add_rewritten_is_the_same_ptx() {
    let mut k = KernelBuilder::new("vector_add", Target::sm80());
    let (a, b) = (
        k.param::<GlobalPtr<f32>>("a"),
        k.param::<GlobalPtr<f32>>("b"),
    );
    let out = k.param::<GlobalPtr<f32>>("out");
    let n = k.param::<u32>("n");
    k.expr(|e| {
        let (a, b, out, i) = (e.ptr(a), e.ptr(b), e.ptr(out), e.global_index_x());
        e.if_(i.lt(n), || out.set(i, a.get(i) + b.get(i)));
    });
    let m = k.finish().unwrap();
    let lib = examples::vector_add(Target::sm80()).unwrap();
    assert_eq!(ptx::print(&m), ptx::print(&lib));
}

/// Every operator is the one instruction of its method: a kernel using each operator once
/// equals the same sequence of method calls.
#[test]
fn each_operator_is_its_method() {
    let build = |exprs: bool| {
        let mut k = KernelBuilder::new("ops", Target::sm80());
        let (u, s, f) = (
            k.param::<u32>("u"),
            k.param::<i32>("s"),
            k.param::<f32>("f"),
        );
        let out = k.param::<GlobalPtr<f32>>("out");
        if exprs {
            k.expr(|e| {
                let (u, s, f) = (e.val(u), e.val(s), e.val(f));
                let a = ((u + 1) - u) * 3u32 / u % 7u32;
                let b = ((a & 0xffu32) | u) ^ a;
                let c = (b << 2u32) >> 1u32;
                let d = -(s + 2) * s;
                let g = 2.0f32 * f + 1.5f32;
                let h = g.mul_add(f, g) / f;
                let m = h.min(f).max(0.5f32) - 1.0f32;
                let p = c.lt(u);
                let q = !p;
                let sel = e.select(q, m, h);
                let cf = d.cvt::<f32>();
                e.if_(c.ge(7u32), || e.ptr(out).set(c, sel + cf));
            });
        } else {
            let a = k.add(u, 1);
            let a = k.sub(a, u);
            let a = k.mul(a, 3u32);
            let a = k.div(a, u);
            let a = k.rem(a, 7u32);
            let b = k.and(a, 0xffu32);
            let b = k.or(b, u);
            let b = k.xor(b, a);
            let c = k.shl(b, 2u32);
            let c = k.shr(c, 1u32);
            let d = k.add(s, 2);
            let d = k.neg(d);
            let d = k.mul(d, s);
            let g = k.mul(2.0f32, f);
            let g = k.add(g, 1.5f32);
            let h = k.fma(g, f, g);
            let h = k.div(h, f);
            let m = k.min(h, f);
            let m = k.max(m, 0.5f32);
            let m = k.sub(m, 1.0f32);
            let p = k.lt(c, u);
            let q = k.not(p);
            let sel = k.selp(m, h, q);
            let cf = k.cvt::<f32, i32>(d);
            let ge = k.ge(c, 7u32);
            k.if_(ge, |k| {
                let v = k.add(sel, cf);
                k.st(out.offset(c), v);
            });
        }
        k.finish().unwrap()
    };
    let (e, m) = (build(true), build(false));
    assert_eq!(ptx::print(&e), ptx::print(&m));
}

/// `a * x + y` is a `mul` and an `add`, never a silent `fma`.
#[test]
fn no_silent_fusion() {
    let mut k = KernelBuilder::new("k", Target::sm80());
    let (a, x, y) = (
        k.param::<f32>("a"),
        k.param::<f32>("x"),
        k.param::<f32>("y"),
    );
    let out = k.param::<GlobalPtr<f32>>("out");
    k.expr(|e| {
        let r = e.val(a) * x + y;
        e.ptr(out).set_at(0, r);
    });
    let text = ptx::print(&k.finish().unwrap());
    assert!(
        text.contains("mul.f32") && text.contains("add.f32"),
        "{text}"
    );
    assert!(!text.contains("fma"), "{text}");
}

/// Operators record the Rust line of the operator.
#[test]
fn operators_record_their_rust_line() {
    let mut k = KernelBuilder::new("k", Target::sm80());
    let (a, b) = (k.param::<f32>("a"), k.param::<f32>("b"));
    let out = k.param::<GlobalPtr<f32>>("out");
    let line = k.expr(|e| {
        let line = line!() + 1;
        let r = e.val(a) * b;
        e.ptr(out).set_at(0, r);
        line
    });
    let m = k.finish().unwrap();
    let f = m.entries().next().unwrap();
    let mul = f
        .instructions()
        .into_iter()
        .find(|i| i.op == ptx::Opcode::Mul)
        .unwrap();
    let loc = mul.loc.rust.unwrap();
    assert_eq!((loc.file(), loc.line()), (file!(), line));
}
