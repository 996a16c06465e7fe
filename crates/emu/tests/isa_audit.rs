//! The ISA audit of issue 16 item 3: `tests-data/isa_audit/<target>.ptx` hold one small kernel
//! per instruction form that ptxas 13.5 accepts for the target (generated and checked by
//! `tests-data/isa_audit/generate.py`); every kernel must parse, validate, print and parse back
//! to the same module, assemble with ptxas (when installed) and run on the emulator. The forms
//! the audit found missing or wrong are also checked one by one against exact references on
//! random inputs (`lop3` predicate form, `mad24.hi[.sat]`, `cp.async` with a src-size that is
//! not a multiple of 4, `.alias`, `ld [a].unified`, and the semantics of the audited barrier,
//! special-register, 64-bit bit and division forms).

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

fn rng() -> StdRng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn audit_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests-data/isa_audit")
}

/// Parses, validates, round-trips and (with ptxas) assembles `text` for `target`.
fn check(text: &str, target: &str, what: &str) -> ptx::Module {
    let m = ptx::parse(text).unwrap_or_else(|e| panic!("{what}: parse: {e}"));
    let errs: Vec<String> = ptx::validate(&m)
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.to_string())
        .collect();
    assert!(errs.is_empty(), "{what}: validator: {errs:#?}");
    let back = ptx::parse(&ptx::print(&m)).unwrap_or_else(|e| panic!("{what}: reparse: {e}"));
    assert_eq!(back, m, "{what}: parse(print(m)) != m");
    if ptx::ptxas::ptxas_for_tests("isa audit kernels").is_some() {
        // ptxas 13.5 has no sm_70/sm_72: their PTX is assembled for the lowest target it has
        let arch = if target == "sm_70" { "sm_75" } else { target };
        let rep = ptx::ptxas::assemble(text, arch, &Default::default())
            .unwrap_or_else(|e| panic!("{what}: ptxas rejects it: {e}"));
        for k in &rep.kernels {
            assert_eq!(
                k.spill_stores_bytes + k.spill_loads_bytes,
                0,
                "{} spills",
                k.name
            );
        }
    }
    m
}

/// Runs kernel `name` of `m` on one CTA of `threads` threads (a cluster of `cluster` CTAs)
/// with parameters `params` and 256 bytes of dynamic shared memory.
fn run(
    mem: &GlobalMemory,
    m: &LoadedModule,
    name: &str,
    params: Vec<u8>,
    threads: u32,
    cluster: u32,
) {
    // 256 bytes of dynamic shared memory for the kernels that use `.extern .shared`
    let cfg = LaunchConfig {
        cluster: [cluster, 1, 1],
        shared_bytes: 256,
        ..LaunchConfig::linear(cluster, threads)
    };
    let k = m
        .kernel(name)
        .unwrap_or_else(|e| panic!("{name}: decode: {e}"));
    launch(k, mem.snapshot(), params, &cfg, &LaunchOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[test]
fn every_audited_form_parses_validates_assembles_and_runs() {
    let mut r = rng();
    let mut total = 0;
    for target in ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_90a"] {
        let path = audit_dir().join(format!("{target}.ptx"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let m = check(&text, target, target);
        let entries: Vec<(String, u32)> = m
            .entries()
            .map(|f| {
                let cluster = f
                    .directives
                    .iter()
                    .find_map(|d| match d {
                        ptx::PerfDirective::Reqnctapercluster(v) => Some(v.iter().product()),
                        _ => None,
                    })
                    .unwrap_or(1);
                (f.name.clone(), cluster)
            })
            .collect();
        let mem = GlobalMemory::new();
        let lm = LoadedModule::load(&mem, m, 0).unwrap();
        for (name, cluster) in entries {
            // p0: 4 KiB of random global memory, p1: a u32, sp: a 32-byte struct
            let buf = mem.alloc(4096, 0).unwrap();
            let bytes: Vec<u8> = (0..4096).map(|_| r.gen()).collect();
            buf.write_bytes(0, &bytes);
            let mut p = buf.base.to_le_bytes().to_vec();
            p.extend_from_slice(&r.gen::<u32>().to_le_bytes());
            p.extend_from_slice(&[0; 4]);
            p.extend((0..32).map(|_| r.gen::<u8>()));
            run(&mem, &lm, &name, p, 32, cluster);
            mem.free(buf.base);
            total += 1;
        }
    }
    assert!(total > 250, "only {total} audit kernels");
}

// ---------------------------------------------------------------------------------------------
// Exact checks of the forms the audit fixed and of the audited semantics.

const HDR: &str = ".version 8.7\n.target sm_90\n.address_size 64\n";

/// Runs kernel `k(.param .u64 in, .param .u64 out)` of `body` (after `HDR`) on one CTA of
/// `threads` threads; `out` (out_len bytes) is poisoned with 0xff first. Returns `out`.
fn run_io(body: &str, input: &[u8], out_len: usize, threads: u32) -> Vec<u8> {
    let text = format!("{HDR}{body}");
    let target = "sm_90";
    let m = check(&text, target, "audit kernel");
    let mem = GlobalMemory::new();
    let lm = LoadedModule::load(&mem, m, 0).unwrap();
    let inp = mem.alloc(input.len().max(16) as u64, 0).unwrap();
    inp.write_bytes(0, input);
    let out = mem.alloc(out_len as u64, 0).unwrap();
    out.fill(0, out_len as u64, &[0xff]);
    let mut p = inp.base.to_le_bytes().to_vec();
    p.extend_from_slice(&out.base.to_le_bytes());
    run(&mem, &lm, "k", p, threads, 1);
    let mut v = vec![0u8; out_len];
    out.read_bytes(0, &mut v);
    v
}

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn dwords(b: &[u8]) -> Vec<u64> {
    b.chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn bytes_of(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Kernel prologue: %r1 = tid, %rd3 = in + 16*tid, %rd4 = out + 16*tid.
const PRO: &str = "ld.param.u64 %rd1, [in];\nld.param.u64 %rd2, [out];\nmov.u32 %r1, %tid.x;\n\
    mul.wide.u32 %rd5, %r1, 16;\nadd.s64 %rd3, %rd1, %rd5;\nadd.s64 %rd4, %rd2, %rd5;\n";

fn kernel(regs: &str, body: &str) -> String {
    format!(
        ".visible .entry k(.param .u64 in, .param .u64 out)\n{{\n.reg .pred %p<8>;\n\
         .reg .b32 %r<24>;\n.reg .b64 %rd<16>;\n{regs}{PRO}{body}\nret;\n}}\n"
    )
}

/// `lop3`'s truth table: bit i of the result is LUT bit (a_i<<2 | b_i<<1 | c_i).
fn lop3_ref(a: u32, b: u32, c: u32, lut: u8) -> u32 {
    (0..32).fold(0, |d, i| {
        let k = ((a >> i) & 1) << 2 | ((b >> i) & 1) << 1 | ((c >> i) & 1);
        d | (((lut as u32) >> k) & 1) << i
    })
}

#[test]
fn lop3_predicate_form_matches_reference() {
    let mut r = rng();
    let luts = [0u8, r.gen(), r.gen(), 0xff];
    let mut body =
        String::from("ld.global.v4.u32 {%r2, %r3, %r4, %r5}, [%rd3];\nsetp.ne.u32 %p1, %r5, 0;\n");
    for (k, lut) in luts.iter().enumerate() {
        let op = if k % 2 == 0 { "or" } else { "and" };
        // the first form writes `_` for d; the others keep it
        let d = if k == 0 {
            "_".to_string()
        } else {
            format!("%r{}", 10 + k)
        };
        body += &format!(
            "lop3.{op}.b32 {d}|%p{}, %r2, %r3, %r4, {lut}, %p1;\n",
            2 + k
        );
        body += &format!("selp.u32 %r{}, 1, 0, %p{};\n", 16 + k, 2 + k);
    }
    body += "st.global.v4.u32 [%rd4], {%r16, %r17, %r18, %r19};\n";
    body += "mul.wide.u32 %rd6, %r1, 12;\nadd.s64 %rd7, %rd2, %rd6;\nadd.s64 %rd7, %rd7, 512;\n";
    body +=
        "st.global.u32 [%rd7], %r11;\nst.global.u32 [%rd7+4], %r12;\nst.global.u32 [%rd7+8], %r13;";
    let n = 32usize;
    let mut input = Vec::new();
    for _ in 0..n {
        let q = r.gen_range(0..2u32);
        input.extend(bytes_of(&[r.gen(), r.gen(), r.gen(), q]));
    }
    let out = run_io(&kernel("", &body), &input, 512 + 12 * n, n as u32);
    let inw = words(&input);
    let (preds, ds) = (words(&out[..512]), words(&out[512..]));
    for t in 0..n {
        let (a, b, c, q) = (
            inw[4 * t],
            inw[4 * t + 1],
            inw[4 * t + 2],
            inw[4 * t + 3] != 0,
        );
        for (k, lut) in luts.iter().enumerate() {
            let d = lop3_ref(a, b, c, *lut);
            let p = if k % 2 == 0 { d != 0 || q } else { d != 0 && q };
            assert_eq!(preds[4 * t + k], p as u32, "thread {t} lut {lut:#x} p");
            if k > 0 {
                assert_eq!(ds[3 * t + k - 1], d, "thread {t} lut {lut:#x} d");
            }
        }
    }
}

#[test]
fn mad24_hi_and_sat_match_reference() {
    let mut r = rng();
    let body = "ld.global.v4.u32 {%r2, %r3, %r4, %r5}, [%rd3];\n\
        mad24.hi.u32 %r6, %r2, %r3, %r4;\nmad24.hi.s32 %r7, %r2, %r3, %r4;\n\
        mad24.hi.sat.s32 %r8, %r2, %r3, %r4;\nmul24.hi.s32 %r9, %r2, %r3;\n\
        st.global.v4.u32 [%rd4], {%r6, %r7, %r8, %r9};";
    let n = 64usize;
    let mut input = Vec::new();
    for t in 0..n {
        // every fourth thread adds near the i32 limits, so saturation happens
        let c = match t % 4 {
            0 => i32::MAX - r.gen_range(0..1 << 20),
            1 => i32::MIN + r.gen_range(0..1 << 20),
            _ => r.gen(),
        };
        input.extend(bytes_of(&[r.gen(), r.gen(), c as u32, 0]));
    }
    let out = words(&run_io(&kernel("", body), &input, 16 * n, n as u32));
    let inw = words(&input);
    let sx = |x: u32| ((x << 8) as i32 >> 8) as i64;
    for t in 0..n {
        let (a, b, c) = (inw[4 * t], inw[4 * t + 1], inw[4 * t + 2]);
        let pu = ((a & 0xff_ffff) as u64 * (b & 0xff_ffff) as u64) >> 16;
        let ps = (sx(a) * sx(b)) >> 16;
        let want = [
            (pu as u32).wrapping_add(c),
            (ps as u32).wrapping_add(c),
            (ps as i32 as i64 + c as i32 as i64).clamp(i32::MIN as i64, i32::MAX as i64) as i32
                as u32,
            ps as u32,
        ];
        assert_eq!(
            &out[4 * t..4 * t + 4],
            &want,
            "thread {t}: a {a:#x} b {b:#x} c {c:#x}"
        );
    }
}

#[test]
fn cp_async_with_any_src_size_zero_fills_the_rest() {
    let mut r = rng();
    // shared poisoned with 0xff, then each thread copies 16 bytes with src-size tid % 17
    let body = "mov.u32 %r2, smem;\nmul.lo.u32 %r3, %r1, 16;\nadd.u32 %r2, %r2, %r3;\n\
        st.shared.v4.u32 [%r2], {%r9, %r9, %r9, %r9};\nrem.u32 %r4, %r1, 17;\n\
        add.s64 %rd8, %rd3, 0;\ncp.async.ca.shared.global [%r2], [%rd8], 16, %r4;\n\
        cp.async.wait_all;\nld.shared.v4.u32 {%r5, %r6, %r7, %r8}, [%r2];\n\
        st.global.v4.u32 [%rd4], {%r5, %r6, %r7, %r8};";
    let text = format!(
        ".shared .align 16 .b8 smem[1024];\n{}",
        kernel("", &format!("mov.u32 %r9, -1;\n{body}"))
    );
    let n = 64usize;
    let input: Vec<u8> = (0..16 * n).map(|_| r.gen()).collect();
    let out = run_io(&text, &input, 16 * n, n as u32);
    for t in 0..n {
        let ss = t % 17;
        let mut want = [0u8; 16];
        want[..ss.min(16)].copy_from_slice(&input[16 * t..16 * t + ss.min(16)]);
        assert_eq!(&out[16 * t..16 * t + 16], &want, "thread {t} src-size {ss}");
    }
}

#[test]
fn alias_runs_the_aliasee_and_unified_loads_read_global() {
    let mut r = rng();
    let funcs = ".visible .func (.param .b32 r) orig(.param .b32 a)\n{\n.reg .b32 %r<3>;\n\
        ld.param.b32 %r1, [a];\nmad.lo.u32 %r2, %r1, 3, 1;\nst.param.b32 [r], %r2;\nret;\n}\n\
        .visible .func (.param .b32 r) aliased(.param .b32 a);\n.alias aliased, orig;\n";
    let body = "ld.global.u32 %r2, [%rd3].unified;\n{\n.param .b32 a;\n.param .b32 rv;\n\
        st.param.b32 [a], %r2;\ncall (rv), aliased, (a);\nld.param.b32 %r3, [rv];\n}\n\
        st.global.u32 [%rd4], %r3;";
    let n = 32usize;
    let input: Vec<u8> = (0..16 * n).map(|_| r.gen()).collect();
    let out = words(&run_io(
        &format!("{funcs}{}", kernel("", body)),
        &input,
        16 * n,
        n as u32,
    ));
    let inw = words(&input);
    for t in 0..n {
        assert_eq!(
            out[4 * t],
            inw[4 * t].wrapping_mul(3).wrapping_add(1),
            "thread {t}"
        );
    }
}

#[test]
fn bar_red_popc_and_or_match_reference() {
    let mut r = rng();
    let body = "ld.global.u32 %r2, [%rd3];\nsetp.ne.u32 %p1, %r2, 0;\n\
        bar.red.popc.u32 %r3, 0, %p1;\nbarrier.red.and.pred %p2, 1, %p1;\n\
        bar.red.or.pred %p3, 2, 64, !%p1;\nselp.u32 %r4, 1, 0, %p2;\nselp.u32 %r5, 1, 0, %p3;\n\
        st.global.v4.u32 [%rd4], {%r3, %r4, %r5, %r2};";
    let n = 64usize;
    for all_set in [false, true] {
        let flags: Vec<u32> = (0..n)
            .map(|_| if all_set { 1 } else { r.gen_range(0..2) })
            .collect();
        let input: Vec<u8> = flags
            .iter()
            .flat_map(|f| bytes_of(&[*f, 0, 0, 0]))
            .collect();
        let out = words(&run_io(&kernel("", body), &input, 16 * n, n as u32));
        let popc = flags.iter().filter(|f| **f != 0).count() as u32;
        for t in 0..n {
            let want = [
                popc,
                (popc == n as u32) as u32,
                (popc < n as u32) as u32,
                flags[t],
            ];
            assert_eq!(&out[4 * t..4 * t + 4], &want, "thread {t}");
        }
    }
}

#[test]
fn bit_ops_on_b64_and_s64_division_match_reference() {
    let mut r = rng();
    let body = "ld.global.v2.u64 {%rd6, %rd7}, [%rd3];\nclz.b64 %r2, %rd6;\npopc.b64 %r3, %rd6;\n\
        bfind.u64 %r4, %rd6;\nbfind.s64 %r5, %rd6;\nbfind.shiftamt.u64 %r6, %rd6;\n\
        brev.b64 %rd8, %rd6;\ndiv.s64 %rd9, %rd6, %rd7;\nrem.s64 %rd10, %rd6, %rd7;\n\
        mul.wide.u32 %rd11, %r1, 48;\nadd.s64 %rd11, %rd2, %rd11;\n\
        st.global.v4.u32 [%rd11], {%r2, %r3, %r4, %r5};\nst.global.u32 [%rd11+16], %r6;\n\
        st.global.u64 [%rd11+24], %rd8;\nst.global.v2.u64 [%rd11+32], {%rd9, %rd10};";
    let n = 64usize;
    let mut vals = Vec::new();
    for t in 0..n {
        let a: u64 = match t % 8 {
            0 => 0,
            1 => u64::MAX,
            2 => 1u64 << r.gen_range(0..64),
            3 => (r.gen::<u64>() >> r.gen_range(0..64)) | 1,
            _ => r.gen(),
        };
        let mut b: i64 = r.gen::<i64>() >> r.gen_range(0..63);
        if b == 0 || (a as i64 == i64::MIN && b == -1) {
            b = -7;
        }
        vals.push((a, b));
    }
    let input: Vec<u8> = vals
        .iter()
        .flat_map(|(a, b)| [a.to_le_bytes(), b.to_le_bytes()].concat())
        .collect();
    let out = run_io(&kernel("", body), &input, 48 * n, n as u32);
    for (t, (a, b)) in vals.iter().enumerate() {
        let o = &out[48 * t..48 * t + 48];
        let w = words(&o[..20]);
        let bfind_u = if *a == 0 {
            u32::MAX
        } else {
            63 - a.leading_zeros()
        };
        let s = *a as i64;
        let mag = if s < 0 { !s as u64 } else { s as u64 };
        let bfind_s = if mag == 0 {
            u32::MAX
        } else {
            63 - mag.leading_zeros()
        };
        let shiftamt = if *a == 0 { u32::MAX } else { a.leading_zeros() };
        assert_eq!(
            w,
            [
                a.leading_zeros(),
                a.count_ones(),
                bfind_u,
                bfind_s,
                shiftamt
            ],
            "{a:#x}"
        );
        let d = dwords(&o[24..48]);
        assert_eq!(d[0], a.reverse_bits(), "brev {a:#x}");
        assert_eq!(d[1] as i64, s / b, "{s} / {b}");
        assert_eq!(d[2] as i64, s % b, "{s} % {b}");
    }
}

#[test]
fn ld_param_of_vector_and_struct_params_reads_the_bytes() {
    let mut r = rng();
    let text = format!(
        "{HDR}.visible .entry k(.param .u64 out, .param .align 16 .b8 sp[32])\n{{\n\
         .reg .b32 %r<8>;\n.reg .f32 %f<8>;\n.reg .b64 %rd<8>;\nld.param.u64 %rd1, [out];\n\
         ld.param.v2.u32 {{%r1, %r2}}, [sp+8];\nld.param.v4.f32 {{%f1, %f2, %f3, %f4}}, [sp+16];\n\
         ld.param.u64 %rd2, [sp];\nst.global.u64 [%rd1], %rd2;\nst.global.v2.u32 [%rd1+8], {{%r1, %r2}};\n\
         st.global.v4.f32 [%rd1+16], {{%f1, %f2, %f3, %f4}};\nret;\n}}\n"
    );
    let m = check(&text, "sm_90", "struct params");
    let mem = GlobalMemory::new();
    let lm = LoadedModule::load(&mem, m, 0).unwrap();
    let out = mem.alloc(32, 0).unwrap();
    out.fill(0, 32, &[0xff]);
    let sp: Vec<u8> = (0..32).map(|_| r.gen()).collect();
    let mut p = out.base.to_le_bytes().to_vec();
    p.extend_from_slice(&[0; 8]);
    p.extend_from_slice(&sp);
    run(&mem, &lm, "k", p, 1, 1);
    let mut v = vec![0u8; 32];
    out.read_bytes(0, &mut v);
    assert_eq!(v, sp);
}

#[test]
fn lanemasks_and_elect_match_reference() {
    let body =
        "mov.u32 %r2, %lanemask_eq;\nmov.u32 %r3, %lanemask_lt;\nmov.u32 %r4, %lanemask_le;\n\
        mov.u32 %r5, %lanemask_gt;\nmov.u32 %r6, %lanemask_ge;\n\
        elect.sync %r7|%p1, 0xffffffff;\nselp.u32 %r8, 1, 0, %p1;\n\
        and.b32 %r9, %r1, 1;\nsetp.eq.u32 %p2, %r9, 1;\nmov.u32 %r10, 0;\nmov.u32 %r11, 7;\n\
        @%p2 elect.sync %r10|%p3, 0xaaaaaaaa;\n@%p2 selp.u32 %r11, 1, 0, %p3;\n\
        mul.wide.u32 %rd6, %r1, 32;\nadd.s64 %rd6, %rd2, %rd6;\n\
        st.global.v4.u32 [%rd6], {%r2, %r3, %r4, %r5};\n\
        st.global.v4.u32 [%rd6+16], {%r6, %r7, %r8, %r10};\nst.global.u32 [%rd4+1024], %r11;";
    let out = words(&run_io(&kernel("", body), &[1; 16], 1024 + 16 * 32, 32));
    for l in 0..32u32 {
        let o = &out[8 * l as usize..8 * l as usize + 8];
        let eq = 1u32 << l;
        let want = [
            eq,
            eq - 1,
            eq | (eq - 1),
            !(eq | (eq - 1)),
            !(eq - 1),
            0,
            (l == 0) as u32,
        ];
        assert_eq!(&o[..7], &want, "lane {l}");
        let odd = l % 2 == 1;
        assert_eq!(
            o[7],
            if odd { 1 } else { 0 },
            "lane {l}: elected lane of 0xaaaaaaaa"
        );
        let p = out[256 + 4 * l as usize];
        assert_eq!(
            p,
            if odd { (l == 1) as u32 } else { 7 },
            "lane {l}: elect p"
        );
    }
}

#[test]
fn isspacep_on_every_space_matches_the_pointer() {
    // generic pointers into global, shared, local, const and param; isspacep per space
    let body = "mov.u64 %rd6, gbuf;\ncvta.global.u64 %rd6, %rd6;\nmov.u64 %rd7, sbuf;\n\
        cvta.shared.u64 %rd7, %rd7;\nmov.u64 %rd8, lbuf;\ncvta.local.u64 %rd8, %rd8;\n\
        mov.u64 %rd9, cbuf;\ncvta.const.u64 %rd9, %rd9;\nmov.u64 %rd10, in;\n\
        cvta.param.u64 %rd10, %rd10;\nSPACES\nret;\n}\n";
    let spaces = [
        "global",
        "shared",
        "shared::cta",
        "shared::cluster",
        "local",
        "const",
        "param",
    ];
    let mut checks = String::new();
    let mut k = 0;
    for (pi, _) in ["g", "s", "l", "c", "p"].iter().enumerate() {
        for sp in spaces {
            checks += &format!(
                "isspacep.{sp} %p1, %rd{};\nselp.u32 %r2, 1, 0, %p1;\nst.global.u32 [%rd2+{}], %r2;\n",
                6 + pi,
                4 * k
            );
            k += 1;
        }
    }
    let text = format!(
        ".global .align 4 .b8 gbuf[16];\n.const .align 4 .b8 cbuf[16] = {{1}};\n\
         .shared .align 4 .b8 sbuf[16];\n.visible .entry k(.param .u64 in, .param .u64 out)\n{{\n\
         .local .align 4 .b8 lbuf[16];\n.reg .pred %p<8>;\n.reg .b32 %r<24>;\n.reg .b64 %rd<16>;\n\
         {PRO}{}",
        body.replace("SPACES", &checks)
    );
    let out = words(&run_io(&text, &[1; 16], 4 * k, 1));
    let mut k = 0;
    for ptr in ["global", "shared", "local", "const", "param"] {
        for sp in spaces {
            let want = sp == ptr || (ptr == "shared" && sp.starts_with("shared"));
            // .const data lives in global memory here, so the global and const windows are
            // one (unverified on hardware): their cross answers are not asserted
            let overlap = matches!((ptr, sp), ("global", "const") | ("const", "global"));
            if !overlap {
                assert_eq!(out[k], want as u32, "isspacep.{sp} of a {ptr} pointer");
            }
            k += 1;
        }
    }
}

#[test]
fn fma_oob_zeroes_halves_with_an_out_of_bounds_nan() {
    use half::{bf16, f16};
    let mut r = rng();
    let body = "ld.global.v4.u32 {%r2, %r3, %r4, %r5}, [%rd3];\n\
        fma.rn.oob.f16x2 %r6, %r2, %r3, %r4;\nfma.rn.oob.relu.bf16x2 %r7, %r2, %r3, %r4;\n\
        mov.b32 {%h1, %h2}, %r2;\nmov.b32 {%h3, %h4}, %r3;\nmov.b32 {%h5, %h6}, %r4;\n\
        fma.rn.oob.f16 %h7, %h1, %h3, %h5;\ncvt.u32.u16 %r8, %h7;\n\
        st.global.v4.u32 [%rd4], {%r6, %r7, %r8, %r5};";
    let regs = ".reg .b16 %h<8>;\n";
    let n = 64usize;
    // halves in [-4, 4) (so f64 holds a*b+c exactly), one in four the OOB NaN 0x7fff
    let mut half_bits = |bf: bool| -> u32 {
        let mut h = || -> u32 {
            if r.gen_range(0..4) == 0 {
                return 0x7fff;
            }
            let x: f64 = r.gen_range(-4.0..4.0);
            if bf {
                bf16::from_f64(x).to_bits() as u32
            } else {
                f16::from_f64(x).to_bits() as u32
            }
        };
        h() | h() << 16
    };
    let mut input = Vec::new();
    let mut cases = Vec::new();
    for t in 0..n {
        // f16 inputs for even threads, bf16 for odd (both forms run on both; each checks its own)
        let bf = t % 2 == 1;
        let abc = [half_bits(bf), half_bits(bf), half_bits(bf)];
        input.extend(bytes_of(&[abc[0], abc[1], abc[2], 0]));
        cases.push((bf, abc));
    }
    let out = words(&run_io(&kernel(regs, body), &input, 16 * n, n as u32));
    let fma_half = |bf: bool, relu: bool, a: u32, b: u32, c: u32, h: u32| -> u32 {
        let get = |x: u32| (x >> h) as u16;
        if [a, b, c].iter().any(|x| get(*x) == 0x7fff) {
            return 0;
        }
        let v = |x: u32| {
            if bf {
                bf16::from_bits(get(x)).to_f64()
            } else {
                f16::from_bits(get(x)).to_f64()
            }
        };
        let mut s = v(a) * v(b) + v(c);
        if relu && s.is_sign_negative() {
            s = 0.0; // negative results and -0.0 become +0.0
        }
        let bits = if bf {
            bf16::from_f64(s).to_bits()
        } else {
            f16::from_f64(s).to_bits()
        };
        (bits as u32) << h
    };
    for (t, (bf, [a, b, c])) in cases.iter().enumerate() {
        let o = &out[4 * t..4 * t + 4];
        if !bf {
            let want =
                fma_half(false, false, *a, *b, *c, 0) | fma_half(false, false, *a, *b, *c, 16);
            assert_eq!(o[0], want, "f16x2 thread {t}: {a:#x} {b:#x} {c:#x}");
            assert_eq!(
                o[2],
                fma_half(false, false, *a, *b, *c, 0),
                "f16 thread {t}"
            );
        } else {
            let want = fma_half(true, true, *a, *b, *c, 0) | fma_half(true, true, *a, *b, *c, 16);
            assert_eq!(o[1], want, "bf16x2 relu thread {t}: {a:#x} {b:#x} {c:#x}");
        }
    }
}
