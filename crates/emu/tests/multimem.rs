//! `multimem.ld_reduce`, `multimem.st` and `multimem.red` on emulated multicast objects
//! (`emu::multicast`) bound to 2, 3 and 4 devices' memories:
//!
//! - the validator accepts exactly the forms ptxas 13.5 accepts for sm_90, over every
//!   combination of operation, `.acc::f32`, vector width and type (and the memory semantics of
//!   a `.u32` form), checked with one ptxas call when ptxas is installed;
//! - every accepted form runs on the emulator against a host reference on fresh random inputs
//!   (integers exactly; floats through f64, rounded once as the reference defines), outputs
//!   poisoned first;
//! - plain loads on a multicast address, multimem on ordinary memory and on an object whose
//!   device has no memory bound, and bad API calls are typed errors naming what is wrong.

use emu::multicast::GRANULARITY;
use emu::{launch, Allocation, EmuError, FaultKind, GlobalMemory, LaunchConfig, LaunchOptions};
use emu::{LoadedModule, MemMap};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn rng() -> StdRng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

const THREADS: u32 = 32;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    LdReduce,
    St,
    Red,
}

/// One candidate form: `multimem.<kind>[.sem][.global].<op>[.acc::f32][.vN].<ty>`.
#[derive(Clone, Debug)]
struct Form {
    kind: Kind,
    sem: &'static str,
    op: &'static str,
    acc: bool,
    vec: u8,
    ty: &'static str,
}

const TYPES: [&str; 12] = [
    "b32", "u32", "s32", "b64", "u64", "s64", "f32", "f64", "f16", "bf16", "f16x2", "bf16x2",
];
const OPS: [&str; 6] = ["add", "min", "max", "and", "or", "xor"];

impl Form {
    fn elem_bytes(&self) -> u32 {
        match self.ty {
            "f16" | "bf16" => 2,
            "b64" | "u64" | "s64" | "f64" => 8,
            _ => 4,
        }
    }
    fn whole(&self) -> u32 {
        self.elem_bytes() * self.vec as u32
    }
    /// Register name of element k and the type ld/st use to move it.
    fn reg(&self, k: usize) -> (String, &'static str) {
        match (self.ty, self.elem_bytes()) {
            ("f32", _) => (format!("%f{k}"), "f32"),
            ("f64", _) => (format!("%fd{k}"), "f64"),
            (_, 2) => (format!("%h{k}"), "b16"),
            (_, 4) => (format!("%e{k}"), "b32"),
            _ => (format!("%x{k}"), "b64"),
        }
    }
    fn operand(&self) -> String {
        let regs: Vec<String> = (0..self.vec as usize).map(|k| self.reg(k).0).collect();
        if self.vec == 1 {
            regs[0].clone()
        } else {
            format!("{{{}}}", regs.join(", "))
        }
    }
    fn line(&self) -> String {
        let sem = if self.sem.is_empty() {
            String::new()
        } else {
            format!(".{}", self.sem)
        };
        let op = if self.op.is_empty() {
            String::new()
        } else {
            format!(".{}", self.op)
        };
        let acc = if self.acc { ".acc::f32" } else { "" };
        let vec = if self.vec == 1 {
            String::new()
        } else {
            format!(".v{}", self.vec)
        };
        let suffix = format!("{sem}.global{op}{acc}{vec}.{}", self.ty);
        match self.kind {
            Kind::LdReduce => format!("multimem.ld_reduce{suffix} {}, [%rd4];", self.operand()),
            Kind::St => format!("multimem.st{suffix} [%rd4], {};", self.operand()),
            Kind::Red => format!("multimem.red{suffix} [%rd4], {};", self.operand()),
        }
    }
    /// A kernel `name(mc, io)`: thread t works on bytes [t*whole, +whole) of both.
    fn kernel(&self, name: &str) -> String {
        let mut body = String::new();
        let moves: Vec<String> = (0..self.vec as usize)
            .map(|k| {
                let (r, t) = self.reg(k);
                let off = k as u32 * self.elem_bytes();
                match self.kind {
                    Kind::LdReduce => format!("st.global.{t} [%rd5+{off}], {r};"),
                    _ => format!("ld.global.{t} {r}, [%rd5+{off}];"),
                }
            })
            .collect();
        if self.kind != Kind::LdReduce {
            body += &moves.join("\n");
            body += "\n";
        }
        body += &self.line();
        body += "\n";
        if self.kind == Kind::LdReduce {
            body += &moves.join("\n");
            body += "\n";
        }
        format!(
            ".visible .entry {name}(.param .u64 mc, .param .u64 io)\n{{\n\
             .reg .b32 %r<4>;\n.reg .b64 %rd<8>;\n.reg .b16 %h<8>;\n.reg .b32 %e<8>;\n\
             .reg .b64 %x<8>;\n.reg .f32 %f<8>;\n.reg .f64 %fd<8>;\n\
             ld.param.u64 %rd1, [mc];\nld.param.u64 %rd2, [io];\nmov.u32 %r1, %tid.x;\n\
             mul.wide.u32 %rd3, %r1, {};\nadd.s64 %rd4, %rd1, %rd3;\nadd.s64 %rd5, %rd2, %rd3;\n\
             {body}ret;\n}}\n",
            self.whole()
        )
    }
}

fn module(kernels: &str) -> String {
    format!(".version 8.2\n.target sm_90\n.address_size 64\n{kernels}")
}

/// Every combination of kind, operation, `.acc::f32`, vector width and type, and the memory
/// semantics (valid and not) of `.add.u32`.
fn candidates() -> Vec<Form> {
    let mut v = Vec::new();
    for ty in TYPES {
        for vec in [1, 2, 4, 8] {
            for op in OPS {
                for acc in [false, true] {
                    for kind in [Kind::LdReduce, Kind::Red] {
                        v.push(Form {
                            kind,
                            sem: "",
                            op,
                            acc,
                            vec,
                            ty,
                        });
                    }
                }
            }
            v.push(Form {
                kind: Kind::St,
                sem: "",
                op: "",
                acc: false,
                vec,
                ty,
            });
        }
    }
    let sems = [
        (Kind::LdReduce, "weak"),
        (Kind::LdReduce, "relaxed.cta"),
        (Kind::LdReduce, "acquire.sys"),
        (Kind::LdReduce, "relaxed"),
        (Kind::LdReduce, "release.gpu"),
        (Kind::St, "weak"),
        (Kind::St, "relaxed.cluster"),
        (Kind::St, "release.gpu"),
        (Kind::St, "acquire.gpu"),
        (Kind::Red, "relaxed.sys"),
        (Kind::Red, "release.cta"),
        (Kind::Red, "weak"),
        (Kind::Red, "acquire.gpu"),
    ];
    for (kind, sem) in sems {
        v.push(Form {
            kind,
            sem,
            op: if kind == Kind::St { "" } else { "add" },
            acc: false,
            vec: 1,
            ty: "u32",
        });
    }
    v
}

fn validator_accepts(f: &Form) -> bool {
    let m = ptx::parse(&module(&f.kernel("k"))).unwrap_or_else(|e| panic!("parse {e}: {f:?}"));
    ptx::validate(&m).iter().all(|d| !d.is_error())
}

#[test]
fn validator_agrees_with_ptxas_on_every_form() {
    let forms = candidates();
    let verdict: Vec<bool> = forms.iter().map(validator_accepts).collect();
    assert!(verdict.iter().filter(|v| **v).count() > 150);
    if ptx::ptxas::ptxas_for_tests("multimem forms").is_none() {
        return;
    }
    // one module, one kernel per form; ptxas names every line it rejects
    let mut text = module("");
    let mut line_of = Vec::new();
    for (i, f) in forms.iter().enumerate() {
        let k = f.kernel(&format!("k{i}"));
        let at = text.lines().count() + k.lines().position(|l| l.starts_with("multimem")).unwrap();
        line_of.push(at as u32 + 1);
        text += &k;
    }
    let rejected: Vec<u32> = match ptx::ptxas::assemble(&text, "sm_90", &Default::default()) {
        Ok(_) => Vec::new(),
        Err(e) => e.errors().iter().filter_map(|d| d.line).collect(),
    };
    for (i, f) in forms.iter().enumerate() {
        let ptxas_ok = !rejected.contains(&line_of[i]);
        assert_eq!(
            verdict[i],
            ptxas_ok,
            "validator {} but ptxas {}: {}",
            if verdict[i] { "accepts" } else { "rejects" },
            if ptxas_ok { "accepts" } else { "rejects" },
            f.line()
        );
    }
}

/// `n` devices' memories bound into one multicast object, mapped for device 0.
struct Mc {
    mem: GlobalMemory,
    devs: Vec<Arc<Allocation>>,
    base: u64,
}

impl Mc {
    fn new(n: u32) -> Mc {
        let mem = GlobalMemory::new();
        let obj = mem.multicast_create(GRANULARITY, n).unwrap();
        let devs: Vec<_> = (0..n).map(|d| mem.alloc(GRANULARITY, d).unwrap()).collect();
        for d in 0..n {
            obj.add_device(d).unwrap();
        }
        for a in &devs {
            obj.bind_mem(0, a, 0, GRANULARITY).unwrap();
        }
        let base = mem.multicast_map(&obj, 0).unwrap();
        Mc { mem, devs, base }
    }

    fn run(&self, text: &str, io: u64, threads: u32) -> Result<(), EmuError> {
        let m = LoadedModule::load(&self.mem, ptx::parse(text).unwrap(), 0)?;
        let mut p = self.base.to_le_bytes().to_vec();
        p.extend_from_slice(&io.to_le_bytes());
        launch(
            m.kernel("k")?,
            self.mem.snapshot(),
            p,
            &LaunchConfig::linear(1, threads),
            &LaunchOptions::default(),
        )
        .map(|_| ())
    }
}

/// A random element of `ty` (floats: sign times [0.125, 4), so f32 sums of a few are exact).
fn random_elem(r: &mut StdRng, ty: &str) -> u64 {
    let mut fl = || {
        let x: f64 = r.gen_range(0.125..4.0);
        if r.gen_bool(0.5) {
            -x
        } else {
            x
        }
    };
    match ty {
        "f32" => (fl() as f32).to_bits() as u64,
        "f64" => fl().to_bits(),
        "f16" => f16::from_f64(fl()).to_bits() as u64,
        "bf16" => bf16::from_f64(fl()).to_bits() as u64,
        "f16x2" => {
            (f16::from_f64(fl()).to_bits() as u64) | (f16::from_f64(fl()).to_bits() as u64) << 16
        }
        "bf16x2" => {
            (bf16::from_f64(fl()).to_bits() as u64) | (bf16::from_f64(fl()).to_bits() as u64) << 16
        }
        "b64" | "u64" | "s64" => r.gen(),
        _ => r.gen::<u32>() as u64,
    }
}

/// 16-bit float helpers of the reference: exact to f64 and rounded once from f64.
fn half_to_f64(bits: u16, bf: bool) -> f64 {
    if bf {
        bf16::from_bits(bits).to_f64()
    } else {
        f16::from_bits(bits).to_f64()
    }
}
fn half_from_f64(x: f64, bf: bool) -> u16 {
    if bf {
        bf16::from_f64(x).to_bits()
    } else {
        f16::from_f64(x).to_bits()
    }
}

/// min/max of two floats with -0 below +0.
fn fminmax(op: &str, a: f64, b: f64) -> f64 {
    let lt = a < b || (a == b && a.is_sign_negative() && !b.is_sign_negative());
    match (op, lt) {
        ("min", true) | ("max", false) => a,
        _ => b,
    }
}

/// f32 add as `red.add.f32` defines it: subnormal inputs and results flushed, rounded once
/// (the f64 sum of two of the test's f32 values is exact).
fn f32_add(a: u32, b: u32) -> u32 {
    let ftz = |x: u32| {
        if x & 0x7f80_0000 == 0 {
            x & 0x8000_0000
        } else {
            x
        }
    };
    let s = f32::from_bits(ftz(a)) as f64 + f32::from_bits(ftz(b)) as f64;
    ftz((s as f32).to_bits())
}

/// The reference `a op b` for one element of `ty`.
fn combine(op: &str, ty: &str, a: u64, b: u64) -> u64 {
    let halves = |bf: bool, n: usize| {
        let mut out = 0u64;
        for h in 0..n {
            let (x, y) = (
                half_to_f64((a >> (16 * h)) as u16, bf),
                half_to_f64((b >> (16 * h)) as u16, bf),
            );
            let v = if op == "add" {
                x + y
            } else {
                fminmax(op, x, y)
            };
            out |= (half_from_f64(v, bf) as u64) << (16 * h);
        }
        out
    };
    match (op, ty) {
        ("and", _) => a & b,
        ("or", _) => a | b,
        ("xor", _) => a ^ b,
        ("add", "u32" | "s32") => (a as u32).wrapping_add(b as u32) as u64,
        ("add", "u64") => a.wrapping_add(b),
        ("min", "u32") => a.min(b),
        ("max", "u32") => a.max(b),
        ("min", "s32") => (a as i32).min(b as i32) as u32 as u64,
        ("max", "s32") => (a as i32).max(b as i32) as u32 as u64,
        ("min", "u64") => a.min(b),
        ("max", "u64") => a.max(b),
        ("min", "s64") => (a as i64).min(b as i64) as u64,
        ("max", "s64") => (a as i64).max(b as i64) as u64,
        ("add", "f32") => f32_add(a as u32, b as u32) as u64,
        ("add", "f64") => (f64::from_bits(a) + f64::from_bits(b)).to_bits(),
        (_, "f16") => halves(false, 1),
        (_, "bf16") => halves(true, 1),
        (_, "f16x2") => halves(false, 2),
        (_, "bf16x2") => halves(true, 2),
        _ => panic!("no reference for .{op}.{ty}"),
    }
}

/// `.acc::f32`: the exact sum of every device's value (f64 holds it exactly for the test's
/// inputs), rounded once per 16-bit half.
fn acc_sum(ty: &str, vals: &[u64]) -> u64 {
    let bf = ty.starts_with("bf");
    let n = if ty.ends_with("x2") { 2 } else { 1 };
    let mut out = 0u64;
    for h in 0..n {
        let s: f64 = vals
            .iter()
            .map(|v| half_to_f64((v >> (16 * h)) as u16, bf))
            .sum();
        out |= (half_from_f64(s, bf) as u64) << (16 * h);
    }
    out
}

fn read_elem(a: &Allocation, off: u64, size: u32) -> u64 {
    let mut b = [0u8; 8];
    a.read_bytes(off, &mut b[..size as usize]);
    u64::from_le_bytes(b)
}
fn write_elem(a: &Allocation, off: u64, size: u32, v: u64) {
    a.write_bytes(off, &v.to_le_bytes()[..size as usize]);
}

/// Runs form `f` on `mc` with random inputs and checks every element against the reference.
fn run_form(mc: &Mc, f: &Form, r: &mut StdRng) {
    let (es, n) = (f.elem_bytes(), THREADS as usize * f.vec as usize);
    let ndev = mc.devs.len();
    let dev_vals: Vec<Vec<u64>> = (0..ndev)
        .map(|_| (0..n).map(|_| random_elem(r, f.ty)).collect())
        .collect();
    for (d, vals) in dev_vals.iter().enumerate() {
        for (i, v) in vals.iter().enumerate() {
            write_elem(&mc.devs[d], i as u64 * es as u64, es, *v);
        }
    }
    let io = mc.mem.alloc(n as u64 * es as u64, 0).unwrap();
    let src: Vec<u64> = (0..n).map(|_| random_elem(r, f.ty)).collect();
    match f.kind {
        Kind::LdReduce => io.fill(0, n as u64 * es as u64, &[0xff]),
        _ => {
            for (i, v) in src.iter().enumerate() {
                write_elem(&io, i as u64 * es as u64, es, *v);
            }
        }
    }
    mc.run(&module(&f.kernel("k")), io.base, THREADS)
        .unwrap_or_else(|e| panic!("{}: {e}", f.line()));
    let fail = |what: String| panic!("{} on {ndev} devices: {what}", f.line());
    for i in 0..n {
        let at = i as u64 * es as u64;
        match f.kind {
            Kind::LdReduce => {
                let vals: Vec<u64> = dev_vals.iter().map(|d| d[i]).collect();
                let want = if f.acc {
                    acc_sum(f.ty, &vals)
                } else {
                    vals[1..]
                        .iter()
                        .fold(vals[0], |acc, v| combine(f.op, f.ty, acc, *v))
                };
                let got = read_elem(&io, at, es);
                if got != want {
                    fail(format!(
                        "element {i}: got {got:#x}, want {want:#x} from {vals:x?}"
                    ));
                }
            }
            _ => {
                for (d, vals) in dev_vals.iter().enumerate() {
                    let want = match f.kind {
                        Kind::St => src[i],
                        _ => combine(f.op, f.ty, vals[i], src[i]),
                    };
                    let got = read_elem(&mc.devs[d], at, es);
                    if got != want {
                        fail(format!(
                            "device {d} element {i}: got {got:#x}, want {want:#x}"
                        ));
                    }
                }
            }
        }
    }
    mc.mem.free(io.base);
}

#[test]
fn every_accepted_form_runs_on_2_to_4_devices() {
    let mut r = rng();
    let mcs = [Mc::new(2), Mc::new(3), Mc::new(4)];
    let forms: Vec<Form> = candidates().into_iter().filter(validator_accepts).collect();
    for (i, f) in forms.iter().enumerate() {
        run_form(&mcs[i % 3], f, &mut r);
    }
    // .acc::f32 on 4 devices, where summing in f32 and rounding once differs from rounding
    // after each addition: both f16 add forms on every width
    for vec in [2, 4, 8] {
        for acc in [false, true] {
            let f = Form {
                kind: Kind::LdReduce,
                sem: "",
                op: "add",
                acc,
                vec,
                ty: "f16",
            };
            run_form(&mcs[2], &f, &mut r);
        }
    }
}

#[test]
fn red_from_many_threads_is_atomic_on_every_device() {
    let mut r = rng();
    let mc = Mc::new(3);
    let text = module(
        ".visible .entry k(.param .u64 mc, .param .u64 io)\n{\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n\
         ld.param.u64 %rd1, [mc];\nmov.u32 %r1, %tid.x;\nadd.u32 %r2, %r1, 1;\n\
         multimem.red.relaxed.sys.global.add.u32 [%rd1+64], %r2;\nret;\n}\n",
    );
    let init: Vec<u32> = (0..3).map(|_| r.gen()).collect();
    for (d, a) in mc.devs.iter().enumerate() {
        write_elem(a, 64, 4, init[d] as u64);
    }
    mc.run(&text, 0, 256).unwrap();
    let sum: u32 = (1..=256u32).sum();
    for (d, a) in mc.devs.iter().enumerate() {
        assert_eq!(
            read_elem(a, 64, 4) as u32,
            init[d].wrapping_add(sum),
            "device {d}"
        );
    }
}

const LD_KERNEL: &str = ".visible .entry k(.param .u64 mc, .param .u64 io)\n{\n.reg .b32 %r<4>;\n\
    .reg .b64 %rd<4>;\nld.param.u64 %rd1, [mc];\nld.param.u64 %rd2, [io];\nINSTR\nret;\n}\n";

fn fault_of(mc: &Mc, instr: &str, io: u64) -> (Option<FaultKind>, String) {
    let e = mc
        .run(&module(&LD_KERNEL.replace("INSTR", instr)), io, 32)
        .unwrap_err();
    (e.fault().cloned(), e.to_string())
}

#[test]
fn plain_access_to_a_multicast_address_faults() {
    let mc = Mc::new(2);
    for instr in [
        "ld.global.u32 %r1, [%rd1];",
        "st.global.u32 [%rd1], 1;",
        "atom.global.add.u32 %r1, [%rd1], 1;",
    ] {
        let (f, s) = fault_of(&mc, instr, 0);
        assert!(
            matches!(f, Some(FaultKind::MulticastPlainAccess { addr, .. }) if addr == mc.base),
            "{instr}: {s}"
        );
        assert!(s.contains("only multimem"), "{s}");
    }
}

#[test]
fn multimem_on_ordinary_memory_faults() {
    let mc = Mc::new(2);
    let plain = mc.mem.alloc(256, 0).unwrap();
    let (f, s) = fault_of(
        &mc,
        "multimem.ld_reduce.global.add.u32 %r1, [%rd2];",
        plain.base,
    );
    assert!(
        matches!(f, Some(FaultKind::NotMulticast { addr, .. }) if addr == plain.base),
        "{s}"
    );
    assert!(s.contains("ordinary global memory"), "{s}");
    let (f, s) = fault_of(&mc, "multimem.st.global.u32 [%rd2], 5;", 0x1234_0000);
    assert!(matches!(f, Some(FaultKind::NotMulticast { .. })), "{s}");
    // misaligned within the multicast range
    let (f, s) = fault_of(
        &mc,
        "multimem.red.relaxed.gpu.global.add.u32 [%rd1+2], 5;",
        0,
    );
    assert!(matches!(f, Some(FaultKind::Misaligned { .. })), "{s}");
}

#[test]
fn a_member_without_bound_memory_is_named() {
    let mem = GlobalMemory::new();
    let obj = mem.multicast_create(2 * GRANULARITY, 2).unwrap();
    obj.add_device(0).unwrap();
    obj.add_device(5).unwrap();
    let a0 = mem.alloc(2 * GRANULARITY, 0).unwrap();
    let a5 = mem.alloc(GRANULARITY, 5).unwrap();
    obj.bind_mem(0, &a0, 0, 2 * GRANULARITY).unwrap();
    obj.bind_mem(0, &a5, 0, GRANULARITY).unwrap();
    let base = mem.multicast_map(&obj, 0).unwrap();
    let mc = Mc {
        mem,
        devs: vec![a0, a5],
        base,
    };
    // the first granule is bound on both devices, the second only on device 0
    mc.run(
        &module(&LD_KERNEL.replace("INSTR", "multimem.st.global.u32 [%rd1], 7;")),
        0,
        32,
    )
    .unwrap();
    assert_eq!(read_elem(&mc.devs[1], 0, 4), 7);
    let instr = format!("multimem.st.global.u32 [%rd1+{GRANULARITY}], 7;");
    let (_, s) = fault_of(&mc, &instr, 0);
    assert!(s.contains("device 5 has no memory bound"), "{s}");
}

#[test]
fn multicast_api_errors_name_the_field() {
    let mem = GlobalMemory::new();
    let err = |r: Result<(), EmuError>| r.unwrap_err().to_string();
    assert!(mem
        .multicast_create(4096, 2)
        .err()
        .unwrap()
        .to_string()
        .contains("granularity"));
    let obj = mem.multicast_create(GRANULARITY, 2).unwrap();
    let a = mem.alloc(GRANULARITY, 1).unwrap();
    assert!(err(obj.bind_mem(0, &a, 0, GRANULARITY)).contains("was not added"));
    assert!(mem.multicast_map(&obj, 0).is_err());
    obj.add_device(0).unwrap();
    assert!(err(obj.add_device(0)).contains("already added"));
    obj.add_device(1).unwrap();
    assert!(err(obj.add_device(2)).contains("num_devices"));
    assert!(err(obj.bind_mem(4096, &a, 0, GRANULARITY)).contains("mc_offset"));
    assert!(err(obj.bind_mem(0, &a, 0, 2 * GRANULARITY)).contains("size"));
    obj.bind_mem(0, &a, 0, GRANULARITY).unwrap();
    assert!(err(obj.bind_mem(0, &a, 0, GRANULARITY)).contains("already has memory bound"));
    assert!(err(obj.add_device(3)).contains("num_devices"));
    // an unmapped range faults like any other non-multicast address
    let base = mem.multicast_map(&obj, 1).unwrap();
    mem.multicast_unmap(base);
    let snap: MemMap = mem.snapshot();
    assert!(snap.find_multicast(base, 4).is_none());
}

/// `multicast_reserve` + `multicast_map_at` / `alloc_at` (cuMemAddressReserve + cuMemMap of a
/// multicast or a physical handle): only inside reserved ranges, never overlapping; memory at
/// a reserved address binds and serves `multimem.st`; `unbind` removes exactly one binding.
#[test]
fn reserved_ranges_map_objects_and_memory_and_unbind_removes_a_binding() {
    let mem = GlobalMemory::new();
    let g = GRANULARITY;
    assert!(mem.multicast_reserve(4096).is_err());
    let r = mem.multicast_reserve(3 * g).unwrap();
    let obj = mem.multicast_create(g, 1).unwrap();
    obj.add_device(0).unwrap();
    let plain = mem.alloc(g, 0).unwrap();
    let outside = mem.multicast_map_at(&obj, 0, plain.base).unwrap_err();
    assert!(
        outside.to_string().contains("not inside a reserved range"),
        "{outside}"
    );
    let a = mem.alloc_at(r, g, 0).unwrap();
    assert_eq!((a.base, a.size), (r, g));
    let e = mem.multicast_map_at(&obj, 0, r).unwrap_err();
    assert!(e.to_string().contains("overlaps"), "{e}");
    assert!(mem.alloc_at(r + g / 2, g, 0).is_err(), "overlapping memory");
    assert!(
        mem.alloc_at(r + 3 * g, 2 * g, 0).is_err(),
        "past every reservation"
    );
    mem.multicast_map_at(&obj, 0, r + g).unwrap();
    assert!(
        mem.alloc_at(r + g, g, 0).is_err(),
        "over a multicast mapping"
    );
    assert!(
        mem.multicast_map_at(&obj, 3, r + 2 * g).is_err(),
        "not a member"
    );
    // the memory at the reserved address is ordinary memory: bind it and store through the map
    a.fill(0, g, &[0xff]);
    obj.bind_mem(0, &a, 0, g).unwrap();
    let mc = Mc {
        mem,
        devs: vec![a],
        base: r + g,
    };
    let v: u32 = rng().gen();
    let st = format!("multimem.st.global.u32 [%rd1], {v};");
    mc.run(&module(&LD_KERNEL.replace("INSTR", &st)), 0, 32)
        .unwrap();
    assert_eq!(read_elem(&mc.devs[0], 0, 4), v as u64);
    assert_eq!(
        read_elem(&mc.devs[0], 4, 4),
        0xffff_ffff,
        "only offset 0 is stored"
    );
    let e = obj.unbind(0, 0, 2 * g).unwrap_err();
    assert!(e.to_string().contains("no binding"), "{e}");
    obj.unbind(0, 0, g).unwrap();
    let (_, s) = fault_of(&mc, &st, 0);
    assert!(s.contains("device 0 has no memory bound"), "{s}");
}
