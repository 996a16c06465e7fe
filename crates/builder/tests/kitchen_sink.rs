//! Every example and a broad kernel per architecture that touches every instruction family:
//! print -> parse back equal -> validate -> ptxas (0 spills).

mod common;
use builder::*;
use common::check;

#[test]
fn examples_roundtrip_and_assemble() {
    for t in [Target::sm80(), Target::sm89(), Target::sm90a()] {
        let arch = t.arch.clone();
        for m in [
            examples::vector_add(t.clone()).unwrap(),
            examples::warp_reduce_sum(t.clone()).unwrap(),
            examples::transpose_tiled(t.clone()).unwrap(),
        ] {
            check(&m, &arch);
        }
    }
}

/// Families available on sm_80.
fn sink_common(k: &mut KernelBuilder) {
    let a = k.param::<GlobalPtr<f32>>("a");
    let ai = k.param::<GlobalPtr<u32>>("ai");
    let a64 = k.param::<GlobalPtr<u64>>("a64");
    let ah = k.param_ptr_aligned::<Bf16x2>("ah", 16);
    let n = k.param::<u32>("n");
    let s = k.param::<i32>("s");
    let d = k.param::<f64>("d");
    let b8 = k.param::<u8>("b8");
    k.maxntid(&[256]).minnctapersm(2).maxnreg(128);

    // special registers
    let i = k.global_index_x();
    let lane = k.lane_id();
    let warp = k.warp_id();
    let _ = (
        k.tid_y(),
        k.tid_z(),
        k.ntid_y(),
        k.ctaid_z(),
        k.nctaid_x(),
        k.nctaid_y(),
        k.clock64(),
        k.globaltimer(),
    );
    let _ = k.sreg(SReg::Smid);
    let _ = k.sreg(SReg::LanemaskLt);

    // integer arithmetic
    let x = k.add(i, 1);
    let x = k.sub(x, n);
    let x = k.mul(x, 3);
    let h = k.mul_hi(x, n);
    let w = k.mul_wide(x, h);
    let w = k.mad_wide(x, 7, w);
    let m = k.mad_lo(x, h, 5);
    let m = k.mad_hi(m, x, h);
    let q = k.div(m, 3);
    let r = k.rem(m, 7);
    let mn = k.min(q, r);
    let mx = k.max(q, r);
    let sa = k.abs(s);
    let sn = k.neg(sa);
    let ss = k.add_sat(sn, s);
    let sq = k.div(ss, 3);
    let wide64 = k.add(w, 1u64);
    // bits
    let b = k.and(mn, 0xff);
    let b = k.or(b, mx);
    let b = k.xor(b, 0x55);
    let b = k.not(b);
    let b = k.cnot(b);
    let b = k.shl(b, 2);
    let b = k.shr(b, 1);
    let ssh = k.shr(sq, 1u32);
    let b = k.shf(true, false, b, mx, 3);
    let b = k.shf(false, true, b, mx, lane);
    let b = k.bfe(b, 4, 8);
    let sb = k.bfe(ssh, 4, 8);
    let b = k.bfi(b, mx, 8, 4);
    let b = k.prmt(b, mx, 0x3210);
    let pc = k.popc(b);
    let cz = k.clz(wide64);
    let br = k.brev(b);
    let bf = k.bfind(br, false);
    let bs = k.bfind(sb, true);
    let l3 = k.lop3(pc, cz, bf, 0x96);
    let l3 = k.add(l3, bs);
    // floats
    let f0 = k.ld(a.offset(i));
    let f1 = k.ld(a.at(3));
    let fs = k.add(f0, f1);
    let fs = k.sub_m(FMods::rn().ftz(), fs, 1.0);
    let fs = k.mul_m(FMods::rnd(Rnd::Rz).sat(), fs, 0.5);
    let fs = k.add_m(FMods::rnd(Rnd::Rm), fs, f0);
    let ff = k.fma(fs, f0, f1);
    let ff = k.fma_m(FMods::rnd(Rnd::Rp).ftz(), ff, f1, 2.0);
    let fd = k.div(ff, f1);
    let fd2 = k.div_fast(fd, f0, false);
    let fd3 = k.div_fast(fd2, f0, true);
    let fdm = k.div_m(FMods::rn().ftz(), fd3, 3.0);
    let fmn = k.min(fdm, f0);
    let fmx = k.max(fmn, f1);
    let fa = k.abs(fmx);
    let fneg = k.neg(fa);
    let fc = k.copysign(fneg, fa);
    let frc = k.rcp(fc);
    let fsq = k.sqrt(frc);
    let mut acc = fsq;
    for func in [
        ApproxFn::Ex2,
        ApproxFn::Lg2,
        ApproxFn::Rcp,
        ApproxFn::Sqrt,
        ApproxFn::Rsqrt,
        ApproxFn::Sin,
        ApproxFn::Cos,
        ApproxFn::Tanh,
    ] {
        let v = k.approx(func, func == ApproxFn::Ex2, acc);
        acc = k.add(acc, v);
    }
    let e = k.ex2(acc);
    let e = k.lg2(e);
    let e = k.rsqrt(e);
    let e = k.tanh(e);
    let e = k.sin(e);
    let e = k.cos(e);
    let e = k.rcp_approx(e);
    let e = k.sqrt_approx(e);
    let d2 = k.mul(d, d);
    let d2 = k.fma(d2, d, 1.0f64);
    let d2 = k.div(d2, d);
    let d2 = k.sqrt(d2);
    let fin = k.testp(ptx::Flag::Finite, d2);
    // f16 / bf16 / packed
    let h0 = k.cvt::<F16, f32>(e);
    let h1 = k.cvt::<F16, f32>(f1);
    let hs = k.fma(h0, h1, h0);
    let hb = k.cvt::<Bf16, f32>(e);
    let hb = k.fma(hb, hb, hb);
    let bb = k.cvt_bf16x2(e, f0);
    let bb = k.fma(bb, bb, bb);
    k.st(ah.at(5), bb);
    let fx = k.cvt_f16x2(e, f1);
    let fx = k.fma(fx, fx, fx);
    let fx = k.min(fx, fx);
    let _ = k.bitcast::<u32, F16x2>(fx);
    let hsum = k.pack::<B32, F16, 2>([hs, hs]);
    let parts: [Reg<B16>; 2] = k.unpack(hsum);
    let _hb2: Reg<Bf16x2> = k.pack([parts[0], parts[1]]);
    let fbits: Reg<u32> = k.bitcast(e);
    let _back: Reg<f32> = k.bitcast(fbits);
    let tf = k.cvt_tf32(e);
    // conversions
    let c1 = k.cvt::<f32, u32>(b);
    let c2 = k.cvt::<i32, f32>(c1);
    let c3 = k.cvt::<f64, i32>(c2);
    let c4 = k.cvt::<f32, f64>(c3);
    let c5 = k.cvt::<u64, u32>(b);
    let c6 = k.cvt::<u16, u64>(c5);
    let c7 = k.cvt::<u8, u16>(c6);
    let c8 = k.cvt::<u32, u8>(b8);
    let c9 = k.cvt_m::<i32, f32>(
        CvtMods {
            rnd: Some(CvtRnd::Rni),
            sat: false,
            ..CvtMods::default()
        },
        c4,
    );
    let c10 = k.cvt_m::<f32, f32>(
        CvtMods {
            rnd: Some(CvtRnd::Rmi),
            ..CvtMods::default()
        },
        c4,
    );
    let c11 = k.cvt::<f32, Bf16>(hb);
    let _ = (c7, c9, c10, c11);
    let c8 = k.add(c8, c9.cast_helper());
    // compare / select / predicates
    let p0 = k.lt(i, n);
    let p1 = k.setp(CmpOp::Hs, b, 3);
    let p2 = k.setp(CmpOp::Geu, fa, 1.5);
    let p3 = k.le(s, 0);
    let p4 = k.gt(d2, 0.5);
    let p5 = k.ge(c6, 9);
    let p6 = k.ne(hs, h1);
    let pa = k.and(p0, p1);
    let po = k.or(pa, p2);
    let px = k.xor(po, p3);
    let pn = k.not(px);
    let pn = k.and(pn, p4);
    let pn = k.or(pn, p5);
    let pn = k.or(pn, p6);
    let pn = k.and(pn, fin);
    let sel = k.selp(fs, f1, pn);
    let sel16 = k.selp(hs, h0, pn);
    let sel64 = k.selp(wide64, 0, pn);
    let _ = k.selp(tf, tf, pn);
    let _ = k.mov::<u32>(7);
    let _ = k.imm::<f64>(2.5);
    // memory: ld/st all spaces, vectors, cache ops, orderings
    let sm = k.shared_array::<f32>(256, 16);
    let sm2 = k.shared_array_named::<u64>("bars", 4, 8);
    let dyn_sm = k.dynamic_shared::<u32>(16);
    k.st(sm.offset(lane), sel);
    k.st(sm.at(1), acc);
    let v4: [Reg<f32>; 4] = k.ld_v(sm.offset(warp));
    k.st_v(a.offset(i), v4);
    let v2: [Reg<u32>; 2] = k.ld_v_with(MemOpts::cache(CacheOp::Cg), ai.offset(i));
    k.st_v_with(MemOpts::cache(CacheOp::Cs), ai.at(8), v2);
    let lv = k.ld_with(MemOpts::sem(Sem::Volatile), ai.offset(i));
    let la = k.ld_with(MemOpts::sem(Sem::Acquire(Scope::Gpu)), ai.offset(lv));
    let lr = k.ld_with(MemOpts::sem(Sem::Relaxed(Scope::Sys)), ai.offset(la));
    let lnc = k.ld_nc(ai.offset(lr));
    let le = k.ld_with(
        MemOpts {
            evict: Some(Evict::Last),
            ..MemOpts::default()
        },
        ai.offset(lnc),
    );
    let lca = k.ld_with(MemOpts::cache(CacheOp::Ca), ai.offset(le));
    let llu = k.ld_with(MemOpts::cache(CacheOp::Lu), ai.offset(lca));
    let lcv = k.ld_with(MemOpts::cache(CacheOp::Cv), ai.offset(llu));
    k.st_with(MemOpts::sem(Sem::Release(Scope::Cta)), ai.offset(i), lcv);
    k.st_with(MemOpts::cache(CacheOp::Wt), ai.offset(i), lcv);
    k.st_with(MemOpts::cache(CacheOp::Wb), ai.offset(i), lcv);
    k.st_with(MemOpts::sem(Sem::Relaxed(Scope::Gpu)), ai.offset(i), lcv);
    let hv: [Reg<Bf16x2>; 4] = k.ld_v(ah.offset(i));
    k.st_v(ah.offset(i), hv);
    let hh = k.ld(ah.cast::<Bf16>().offset(i));
    k.st(ah.cast::<Bf16>().at(1), hh);
    k.st(ah.cast::<F16>().at(1), sel16);
    k.st(dyn_sm.offset(lane), c8);
    let di = k.ld(dyn_sm.at(2));
    let si = k.cvt::<i32, u32>(di);
    let g = k.cvta_global(a);
    let g2 = k.cvta_to_global(g);
    let gs = k.cvta_shared(sm);
    let gv = k.ld(gs.offset(lane));
    k.st(g2.offset(si), gv);
    let p64 = k.addr(a64.offset(i));
    k.st(p64, sel64);
    k.prefetch_l2(a, true);
    // atomics
    let at = k.atom_add(ai.offset(i), 1);
    let at = k.atom(AtomOp::Min, ai.offset(at), 4);
    let at = k.atom(AtomOp::Max, ai, at);
    let at = k.atom(AtomOp::Inc, ai, at);
    let at = k.atom(AtomOp::Dec, ai, at);
    let at = k.atom(AtomOp::And, ai, at);
    let at = k.atom(AtomOp::Or, ai, at);
    let at = k.atom(AtomOp::Xor, ai, at);
    let at = k.atom_exch(ai, at);
    let at = k.atom_cas(ai, at, 5);
    let at = k.atom_with(AtomOp::Add, Some(AtomSem::AcqRel), Some(Scope::Gpu), ai, at);
    let at = k.atom_cas_with(Some(AtomSem::Acquire), Some(Scope::Sys), ai, at, 1);
    let af = k.atom_add(a, fs);
    let a64v = k.atom_add(a64, 1u64);
    let a64c = k.atom_cas(a64, a64v, 0);
    k.red_add(a, af);
    k.red(AtomOp::Or, ai, at);
    k.red_with(
        AtomOp::Add,
        Some(AtomSem::Release),
        Some(Scope::Gpu),
        a64,
        a64c,
    );
    let sat = k.atom_add(sm2.cast::<u32>().offset(lane), 1);
    k.red_add(sm.offset(lane), e);
    // barriers / fences
    k.sync_threads();
    k.bar_sync(1);
    k.bar_sync_count(2, 64);
    k.bar_arrive(3, 64);
    k.barrier_sync(0);
    k.barrier_sync_count(1, 128);
    let cnt = k.bar_red_popc(0, pn);
    let all = k.bar_red_pred(true, 0, pn);
    let any = k.bar_red_pred(false, 0, all);
    k.bar_warp_sync(0xffff_ffff);
    k.membar(MembarLevel::Cta);
    k.membar(MembarLevel::Gl);
    k.membar(MembarLevel::Sys);
    k.fence(AtomSem::Sc, Scope::Gpu);
    k.fence(AtomSem::AcqRel, Scope::Cta);
    // warp-level
    let sh = k.shfl_bfly(fs, 1);
    let sh = k.shfl_down(sh, 2);
    let sh = k.shfl_up(sh, 1);
    let sh = k.shfl_idx(sh, 0);
    let sh = k.shfl_sync(ShflMode::Bfly, sh, 4, 0x1f, 0xffff);
    let shi = k.shfl_down(at, 1);
    let va = k.vote_all(any, 0xffff_ffff);
    let vy = k.vote_any(va, 0xffff_ffff);
    let vu = k.vote_uni(vy, 0xffff_ffff);
    let vb = k.vote_ballot(vu, 0xffff_ffff);
    let mut red_acc = vb;
    for op in [
        ReduxOp::Add,
        ReduxOp::Min,
        ReduxOp::Max,
        ReduxOp::And,
        ReduxOp::Or,
        ReduxOp::Xor,
    ] {
        red_acc = k.redux(op, red_acc, 0xffff_ffff);
    }
    let rs = k.redux(ReduxOp::Max, si, 0xffff_ffff);
    let ma = k.match_any(red_acc, 0xffff_ffff);
    let (mall, mp) = k.match_all(wide64, 0xffff_ffff);
    let am = k.activemask();
    // mma + ldmatrix (sm_80 shapes)
    let fr_a: [Reg<Bf16x2>; 4] = k.ldmatrix(sm.offset(lane), false);
    let fr_b: [Reg<Bf16x2>; 2] = k.ldmatrix(sm.offset(lane), true);
    let fr_1: [Reg<B32>; 1] = k.ldmatrix(sm, false);
    let acc4: [Reg<f32>; 4] = [sh, fs, e, acc];
    let dd = k.mma::<M16N8K16Bf16>(fr_a, fr_b, acc4);
    k.mma_to::<M16N8K16Bf16>(dd, fr_a, fr_b, dd);
    let ha: [Reg<F16x2>; 4] = k.ldmatrix(sm.offset(warp), false);
    let hb2: [Reg<F16x2>; 2] = k.ldmatrix(sm.offset(warp), false);
    let dh = k.mma::<M16N8K16F16>(ha, hb2, dd);
    let ia = [fr_1[0]; 4];
    let ib = [fr_1[0]; 2];
    let ic = [si, rs, si, rs];
    let di4 = k.mma::<M16N8K32S8>(ia, ib, ic);
    let ta = [tf; 4];
    let tb = [tf; 2];
    let dt = k.mma::<M16N8K8Tf32>(ta, tb, dh);
    // cp.async
    k.cp_async(sm.offset(lane), a.offset(i), 4);
    k.cp_async(sm.at(4), a.offset(i), 16);
    k.cp_async(sm.at(8), a.at(2), 8);
    k.cp_async_zfill(sm.at(12), a.offset(i), n);
    k.cp_async_commit_group();
    k.cp_async_wait_group(1);
    k.cp_async_wait_all();
    // mbarrier (sm_80 forms)
    let bar = sm2;
    k.mbarrier_init(bar, 32);
    let st = k.mbarrier_arrive(bar);
    let done = k.mbarrier_test_wait(bar, st);
    k.mbarrier_inval(bar.at(1));
    // control flow
    let tot = k.mov(0u32);
    k.for_range(0u32, n, 1u32, |k, j| {
        let odd = k.and(j, 1);
        let z = k.eq(odd, 1);
        k.continue_if(z);
        k.add_to(tot, tot, j);
        let big = k.gt(tot, 1000);
        k.break_if(big);
    });
    let cnt2 = k.mov(0u32);
    k.while_(
        |k| k.lt(cnt2, 10),
        |k| {
            k.add_to(cnt2, cnt2, 1);
        },
    );
    k.loop_(|k| {
        k.add_to(cnt2, cnt2, 3);
        let stop = k.ge(cnt2, 40);
        k.if_(stop, |k| k.break_());
        k.continue_();
    });
    k.if_else(
        done,
        |k| {
            let o = k.add(tot, cnt2);
            k.st(ai.offset(i), o);
        },
        |k| {
            k.st(ai.offset(i), tot);
        },
    );
    k.if_not(mp, |k| k.nanosleep(100));
    k.when(pn, |k| {
        k.st(ai.offset(i), mall);
        k.st(ai.at(1), ma);
    });
    k.when_not(pn, |k| k.st(ai.at(2), am));
    k.block(|k| {
        let z = k.add(cnt, shi);
        k.st(ai.at(3), z);
    });
    let exit_l = k.new_label();
    k.bra_if(pn, exit_l);
    k.bra_uni(exit_l);
    k.place(exit_l);
    // raw escape using builder registers
    let rr = k.reg::<u32>();
    k.raw(format!("add.u32 {rr}, {tot}, {sat};\n.reg .b32 tmp<2>;\nmov.b32 tmp0, {rr};\nst.global.u32 [{}], tmp0;", ai.reg()));
    k.raw(format!("@{pn} bra {exit_l};"));
    let l3f = k.cvt::<f32, u32>(l3);
    let sink = [dt[0], dt[1], di4[0].cast_f(k), l3f];
    k.st_v(a.at(16), sink);
    let last = k.trap_label();
    let _ = last;
    k.exit();
}

/// Test-only helpers.
trait CastF {
    fn cast_f(self, k: &mut KernelBuilder) -> Reg<f32>;
    fn cast_helper(self) -> Reg<u32>;
}
impl CastF for Reg<i32> {
    fn cast_f(self, k: &mut KernelBuilder) -> Reg<f32> {
        k.cvt::<f32, i32>(self)
    }
    fn cast_helper(self) -> Reg<u32> {
        self.reinterpret()
    }
}
trait TrapLabel {
    fn trap_label(&mut self) -> Label;
}
impl TrapLabel for KernelBuilder {
    fn trap_label(&mut self) -> Label {
        let l = self.new_label();
        let p = self.mov::<u32>(0);
        let z = self.eq(p, 1);
        self.bra_unless(z, l);
        self.trap();
        self.brkpt();
        self.place(l);
        l
    }
}

#[test]
fn kitchen_sink_sm80() {
    let mut k = KernelBuilder::new("sink80", Target::sm80());
    sink_common(&mut k);
    let m = k.finish().unwrap();
    assert_eq!(
        m.version, 74,
        "L2::evict_last / L1::evict_last need PTX 7.4"
    );
    check(&m, "sm_80");
}

#[test]
fn kitchen_sink_sm89_fp8() {
    let mut k = KernelBuilder::new("sink89", Target::sm89());
    sink_common_fp8(&mut k);
    let m = k.finish().unwrap();
    check(&m, "sm_89");
    // also fine on sm_90a
    let mut k = KernelBuilder::new("sink89", Target::sm90a());
    sink_common_fp8(&mut k);
    check(&k.finish().unwrap(), "sm_90a");
}

fn sink_common_fp8(k: &mut KernelBuilder) {
    let a = k.param::<GlobalPtr<f32>>("a");
    let q = k.param::<GlobalPtr<E4m3x2>>("q");
    let i = k.global_index_x();
    let x = k.ld(a.offset(i));
    let y = k.ld(a.at(1));
    let e4 = k.cvt_e4m3x2(x, y);
    let e5 = k.cvt_e5m2x2(y, x);
    k.st(q.offset(i), e4);
    let h = k.cvt_f16x2_from_e4m3x2(e4);
    let h5 = k.cvt_f16x2_from_e5m2x2(e5);
    let h = k.fma(h, h5, h);
    let back = k.cvt_e4m3x2_from_f16x2(h);
    let packed: Reg<E4m3x4> = k.pack([back, e4]);
    let packed5: Reg<E5m2x4> = k.pack([e5, e5]);
    let c = [x, y, x, y];
    let d = k.mma::<M16N8K32E4m3>([packed; 4], [packed; 2], c);
    let d = k.mma::<M16N8K32E5m2>([packed5; 4], [packed5; 2], d);
    k.st_v(a.offset(i), d);
}

#[test]
fn kitchen_sink_sm90a() {
    let mut k = KernelBuilder::new("sink90a", Target::sm90a());
    k.cluster_dims(&[2, 1, 1])
        .explicit_cluster()
        .reqntid(&[128]);
    let a = k.param::<GlobalPtr<f32>>("a");
    let tmap = k.param_tensormap("tmap");
    let i = k.global_index_x();
    let tid = k.tid_x();
    let sm = k.shared_array::<Bf16>(64 * 64, 128);
    let bars = k.shared_array::<u64>(2, 8);
    let bar = bars;
    let e = k.elect_sync(0xffff_ffff);
    k.when(e, |k| {
        k.mbarrier_init(bar, 1);
    });
    k.fence_mbarrier_init();
    k.fence_proxy_async();
    k.sync_threads();
    let c0 = k.mov::<i32>(0);
    let c1 = k.mov::<i32>(64);
    let is0 = k.eq(tid, 0);
    k.if_(is0, |k| {
        k.mbarrier_arrive_expect_tx(bar, 8192);
        k.cp_async_bulk_tensor_g2s(sm, tmap, &[c0, c1], bar);
        k.mbarrier_expect_tx(bar.at(1), 1024);
        k.cp_async_bulk_g2s(sm.at(4096), a, 1024u32, bar.at(1));
    });
    k.mbarrier_wait_parity(bar, 0u32);
    // wgmma with descriptors
    let sa = k.cvt::<u64, u32>(sm.reg());
    let da = k.shr(sa, 4u32);
    let db = k.add(da, 64u64);
    let acc: [Reg<f32>; 32] = k.regs();
    for r in acc {
        k.mov_to(r, 0.0f32);
    }
    let scale = k.ne(tid, 1000);
    k.wgmma_fence();
    k.wgmma_mma_async::<Bf16>(64, &acc, da, db, scale, false, true);
    k.wgmma_mma_async::<F16>(64, &acc, da, db, scale, false, false);
    k.wgmma_commit_group();
    k.wgmma_wait_group(0);
    let mut s = acc[0];
    for r in &acc[1..] {
        s = k.add(s, *r);
    }
    k.st(a.offset(i), s);
    // stmatrix
    let fr: [Reg<B32>; 4] = k.ldmatrix(sm, false);
    k.stmatrix(sm.at(1024), fr, true);
    // bulk store + groups
    k.fence_proxy_async();
    k.if_(is0, |k| {
        k.cp_async_bulk_tensor_s2g(tmap, &[c0, c1], sm);
        k.cp_async_bulk_s2g(a.at(64), sm.at(2048), 256u32);
        k.cp_async_bulk_commit_group();
        k.cp_async_bulk_wait_group(0, true);
        k.cp_async_bulk_wait_group(0, false);
    });
    // cluster
    let rank = k.cluster_ctarank();
    let other = k.xor(rank, 1);
    let remote = k.mapa(bars, other);
    let rr = k.getctarank(remote);
    let v = k.ld(remote.at(1));
    let vv = k.cvt::<u32, u64>(v);
    let sum = k.add(rr, vv);
    k.st(a.cast::<u32>().at(3), sum);
    k.barrier_cluster_arrive();
    k.barrier_cluster_wait();
    let ok = k.mbarrier_try_wait_parity(bar, 1u32);
    k.when(ok, |k| k.mbarrier_inval(bar));
    k.griddepcontrol_wait();
    k.griddepcontrol_launch_dependents();
    k.setmaxnreg_dec(40);
    k.setmaxnreg_inc(232);
    k.ret();
    let m = k.finish().unwrap();
    assert!(m.version >= 80);
    check(&m, "sm_90a");
}
