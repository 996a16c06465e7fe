//! Raw escape, error reporting, target/version selection, modules with `.func`s and calls.

mod common;
use builder::*;
use common::check;

#[test]
fn raw_uses_builder_registers() {
    let mut k = KernelBuilder::new("raw_ok", Target::sm80());
    let out = k.param::<GlobalPtr<u32>>("out");
    let t = k.tid_x();
    let d = k.reg::<u32>();
    k.raw(format!("add.u32 {d}, {t}, 7;"));
    k.raw(format!(
        "{{\n.reg .b32 %tmp;\nshl.b32 %tmp, {d}, 1;\nst.global.u32 [{}], %tmp;\n}}",
        out.reg()
    ));
    let m = k.finish().unwrap();
    check(&m, "sm_80");
}

#[test]
fn raw_unknown_register_is_an_error() {
    let mut k = KernelBuilder::new("raw_bad", Target::sm80());
    let t = k.tid_x();
    k.raw(format!("add.u32 %r99, {t}, %r42;"));
    match k.finish() {
        Err(BuildError::UnknownRegisters { regs, .. }) => {
            assert_eq!(regs, vec!["%r99".to_string(), "%r42".to_string()])
        }
        other => panic!("expected UnknownRegisters, got {other:?}"),
    }
    let mut k = KernelBuilder::new("raw_bad2", Target::sm80());
    let e = k.try_raw("@%p3 bra L;").unwrap_err();
    assert!(e.to_string().contains("%p3"), "{e}");
    assert!(matches!(
        k.try_raw("add.u32 %r0, [;"),
        Err(BuildError::RawParse(_))
    ));
    assert!(matches!(
        k.try_raw(".reg .b32 %r<4>;"),
        Err(BuildError::RawRedeclare(_))
    ));
}

#[test]
fn target_and_version_checks() {
    // wgmma on sm_80: arch error naming the instruction
    let mut k = KernelBuilder::new("w", Target::sm80());
    k.wgmma_fence();
    let e = k.finish().unwrap_err();
    assert!(matches!(e, BuildError::ArchTooOld { need: 90, .. }), "{e}");
    // wgmma on sm_90 (not sm_90a)
    let mut k = KernelBuilder::new("w", Target::sm90());
    k.wgmma_fence();
    assert!(matches!(
        k.finish(),
        Err(BuildError::NeedsArchSpecific { .. })
    ));
    // fp8 cvt needs sm_89
    let mut k = KernelBuilder::new("c", Target::sm80());
    let (a, b) = (k.mov(1.0f32), k.mov(2.0f32));
    k.cvt_e4m3x2(a, b);
    assert!(matches!(
        k.finish(),
        Err(BuildError::ArchTooOld { need: 89, .. })
    ));
    // user-fixed PTX version too old
    let mut k = KernelBuilder::new("v", Target::sm90a().with_ptx(78));
    k.elect_sync(0xffff_ffff);
    assert!(matches!(
        k.finish(),
        Err(BuildError::PtxVersionTooOld { .. })
    ));
    // lowest version chosen automatically, and a user-chosen newer one kept
    let m = examples::vector_add(Target::sm80()).unwrap();
    assert_eq!(m.version, 70);
    let m = examples::vector_add(Target::sm89()).unwrap();
    assert_eq!(m.version, 78);
    let m = examples::vector_add(Target::sm80().with_ptx(83)).unwrap();
    assert_eq!(m.version, 83);
    let mut k = KernelBuilder::new("e", Target::sm90a());
    k.elect_sync(0xffff_ffff);
    assert_eq!(k.finish().unwrap().version, 80);
}

#[test]
fn misuse_errors() {
    let mut k = KernelBuilder::new("b", Target::sm80());
    k.break_();
    assert!(matches!(k.finish(), Err(BuildError::ControlFlow(_))));
    let mut k = KernelBuilder::new("v3", Target::sm80());
    let a = k.param::<GlobalPtr<f32>>("a");
    let _: [Reg<f32>; 3] = k.ld_v(a);
    assert!(matches!(k.finish(), Err(BuildError::Invalid(_))));
    let mut k = KernelBuilder::new("dup", Target::sm80());
    k.param::<u32>("n");
    k.param::<u32>("n");
    assert!(matches!(k.finish(), Err(BuildError::Duplicate(_))));
    let mut k = KernelBuilder::new("wg", Target::sm90a());
    let acc: [Reg<f32>; 8] = k.regs();
    let (da, db) = (k.mov(0u64), k.mov(0u64));
    let p = k.eq(da, db);
    k.wgmma_mma_async::<Bf16>(64, &acc, da, db, p, false, false);
    assert!(matches!(k.finish(), Err(BuildError::Invalid(_))));
    let mut k = KernelBuilder::new("when", Target::sm80());
    let t = k.tid_x();
    let p = k.eq(t, 0);
    k.when(p, |k| k.if_(p, |_| {}));
    assert!(matches!(k.finish(), Err(BuildError::ControlFlow(_))));
}

#[test]
fn module_with_funcs_and_calls() {
    let t = Target::sm80();
    let mut mb = ModuleBuilder::new(t.clone());
    // .func (.param .f32 r) axpy(.param .f32 a, .param .f32 x, .param .f32 y)
    let mut f = mb.func("axpy");
    let r = f.ret_param::<f32>("r");
    let a = f.param::<f32>("a");
    let x = f.param::<f32>("x");
    let y = f.param::<f32>("y");
    let v = f.fma(a, x, y);
    f.set_ret(&r, v);
    f.ret();
    mb.add(f);
    // .func noop()
    let mut g = mb.func("bump");
    let p = g.param::<GlobalPtr<u32>>("p");
    g.red_add(p, 1u32);
    g.ret();
    mb.add(g);
    for name in ["k1", "k2"] {
        let mut k = mb.kernel(name);
        let out = k.param::<GlobalPtr<f32>>("out");
        let cnt = k.param::<Ptr<u32, Generic>>("cnt");
        let i = k.global_index_x();
        let xf = k.cvt::<f32, u32>(i);
        let two = k.mov(2.0f32);
        let res = k.reg::<f32>();
        k.call("axpy", &[res.any()], &[two.any(), xf.any(), xf.any()]);
        k.call("bump", &[], &[cnt.reg().any()]);
        k.st(out.offset(i), res);
        let _ = k.dynamic_shared::<f32>(16);
        mb.add(k);
    }
    let m = mb.finish().unwrap();
    assert_eq!(m.functions().count(), 4);
    assert_eq!(m.globals().count(), 1, "dynamic shared declared once");
    check(&m, "sm_80");
    // duplicate kernel names
    let mut mb = ModuleBuilder::new(t);
    let k1 = mb.kernel("same");
    let k2 = mb.kernel("same");
    mb.add(k1).add(k2);
    assert!(matches!(mb.finish(), Err(BuildError::Duplicate(_))));
}

#[test]
fn kernel_attributes_and_registers() {
    let mut k = KernelBuilder::new("attrs", Target::sm90a());
    k.reqntid(&[128, 1, 1])
        .maxnreg(64)
        .minnctapersm(1)
        .cluster_dims(&[2, 1, 1])
        .explicit_cluster();
    let x = k.mov(1u32);
    assert_eq!(x.name(), "%r0");
    assert_eq!(format!("{x}"), "%r0");
    let y = k.mov(1u64);
    assert_eq!(y.to_string(), "%rd0");
    let h = k.reg::<Bf16>();
    assert_eq!(h.to_string(), "%rs0");
    let p = k.reg::<Pred>();
    assert_eq!(p.to_string(), "%p0");
    let s: Reg<i32> = x.reinterpret();
    assert_eq!(s.to_string(), "%r0");
    let m = k.finish().unwrap();
    let text = ptx::print(&m);
    assert!(
        text.contains(".reqntid 128, 1, 1")
            && text.contains(".reqnctapercluster 2, 1, 1")
            && text.contains(".explicitcluster")
    );
    check(&m, "sm_90a");
}

#[test]
fn local_and_const_spaces() {
    let mut k = KernelBuilder::new("spaces", Target::sm80());
    let out = k.param::<GlobalPtr<u32>>("out");
    let t = k.tid_x();
    let tab = k.const_table_u32("table", &[1, 2, 3, 5, 8]);
    let loc = k.local_array::<u32>(8, 16);
    let i = k.and(t, 3);
    let v = k.ld(tab.offset(i));
    k.st(loc.offset(i), v);
    let w = k.ld_with(MemOpts::sem(Sem::Volatile), loc.offset(i));
    k.st(out.offset(t), w);
    let m = k.finish().unwrap();
    check(&m, "sm_80");
}
