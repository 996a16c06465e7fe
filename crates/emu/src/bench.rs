//! Emulator throughput benchmarks, shared by `cargo bench -p emu` and `ptxforge bench emu`.
//!
//! * `alu`: an ALU-bound kernel (a loop of 4 independent f32 FMA chains and an integer
//!   LCG/xor/shift chain, unrolled) — lane-instructions per second, total and per host thread.
//! * `gemm`: the corpus Triton `gemm_bf16` sm_80 kernel (`cp.async` + `ldmatrix` +
//!   `mma.sync.m16n8k16`) on an M×N×K bf16 GEMM (f32 accumulate, bf16 out), timed against a
//!   plain single-threaded CPU reference of the same GEMM (naive triple loop, f32 accumulate),
//!   with the ratio and the largest error of the emulated result against the reference.

use crate::{launch, EmuError, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use std::time::Instant;

/// The corpus GEMM kernel (Triton 3.9, sm_80, 64×64×32 tiles, 4 warps, 8 KiB dynamic smem).
pub const GEMM_BF16_SM80: &str = include_str!("../../../tests-data/corpus/sm_80/gemm_bf16.ptx");

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Host threads for the emulator (0: all available).
    pub threads: usize,
    /// Loop iterations of the ALU kernel per thread.
    pub alu_iters: u32,
    /// CTAs (of 256 threads) of the ALU kernel.
    pub alu_ctas: u32,
    /// GEMM size (M = N = K; a multiple of 64).
    pub gemm_size: u32,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            threads: 0,
            alu_iters: 256,
            alu_ctas: 264,
            gemm_size: 512,
        }
    }
}

/// Throughput of one launch.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Throughput {
    pub kernel: String,
    pub ctas: u64,
    pub warp_instructions: u64,
    pub lane_instructions: u64,
    pub seconds: f64,
    pub lane_instructions_per_s: f64,
    /// `lane_instructions_per_s` divided by the host threads used.
    pub lane_instructions_per_s_per_thread: f64,
}

/// The emulated GEMM against the CPU reference.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GemmCompare {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub emu_seconds: f64,
    pub cpu_reference_seconds: f64,
    /// `emu_seconds / cpu_reference_seconds`.
    pub ratio: f64,
    /// max |emu - ref| / max |ref| (bf16 output rounding: ~4e-3).
    pub max_error_rel_to_max: f64,
}

/// All results of a run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EmuBench {
    pub threads: usize,
    pub alu: Throughput,
    pub mma_gemm: Throughput,
    pub gemm: GemmCompare,
}

/// The ALU-bound kernel: per iteration 16 FMAs (4 chains), 8 integer ops, 3 loop-control.
pub fn alu_kernel_ptx() -> String {
    let mut body = String::new();
    for i in 0..4 {
        for c in 0..4 {
            body.push_str(&format!(
                "    fma.rn.f32 %f{c}, %f{c}, %f8, %f{};\n",
                4 + (c + i) % 4
            ));
        }
    }
    body.push_str(
        "    mad.lo.u32 %r10, %r10, 1664525, 1013904223;\n    xor.b32 %r11, %r11, %r10;\n    shl.b32 %r12, %r11, 3;\n    add.u32 %r11, %r11, %r12;\n",
    );
    body.push_str(
        "    mad.lo.u32 %r10, %r10, 1664525, 1013904223;\n    shr.u32 %r12, %r10, 7;\n    xor.b32 %r11, %r11, %r12;\n    and.b32 %r13, %r11, 255;\n",
    );
    format!(
        r#".version 8.0
.target sm_80
.address_size 64
.visible .entry alu_loop(.param .u64 out, .param .u32 iters)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<16>;
    .reg .f32 %f<12>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iters];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mad.lo.u32 %r5, %r3, %r4, %r2;
    cvt.rn.f32.u32 %f0, %r5;
    mov.f32 %f1, 0f3F800000;
    mov.f32 %f2, 0f40000000;
    mov.f32 %f3, 0f40400000;
    mov.f32 %f4, 0f3DCCCCCD;
    mov.f32 %f5, 0fBDCCCCCD;
    mov.f32 %f6, 0f3C23D70A;
    mov.f32 %f7, 0fBC23D70A;
    mov.f32 %f8, 0f3F7FBE77;
    mov.u32 %r6, 0;
    mov.u32 %r10, %r5;
    mov.u32 %r11, 0;
    mov.u32 %r13, 0;
LOOP:
{body}    add.u32 %r6, %r6, 1;
    setp.lt.u32 %p1, %r6, %r1;
    @%p1 bra LOOP;
    add.f32 %f0, %f0, %f1;
    add.f32 %f2, %f2, %f3;
    add.f32 %f0, %f0, %f2;
    cvt.rn.f32.u32 %f9, %r13;
    add.f32 %f0, %f0, %f9;
    mul.wide.u32 %rd2, %r5, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.f32 [%rd3], %f0;
    ret;
}}
"#
    )
}

fn params(vals: &[(u64, usize)]) -> Vec<u8> {
    let mut p = Vec::new();
    for &(v, sz) in vals {
        while p.len() % sz != 0 {
            p.push(0);
        }
        p.extend_from_slice(&v.to_le_bytes()[..sz]);
    }
    p
}

fn bench_err(msg: impl Into<String>) -> EmuError {
    EmuError::Launch(msg.into())
}

fn opts(threads: usize) -> LaunchOptions {
    let mut o = LaunchOptions::default();
    if threads > 0 {
        o.threads = threads;
    }
    o
}

fn throughput(kernel: &str, s: &crate::LaunchStats, threads: usize) -> Throughput {
    let rate = s.lane_instructions as f64 / s.seconds.max(1e-9);
    Throughput {
        kernel: kernel.to_string(),
        ctas: s.ctas,
        warp_instructions: s.warp_instructions,
        lane_instructions: s.lane_instructions,
        seconds: s.seconds,
        lane_instructions_per_s: rate,
        lane_instructions_per_s_per_thread: rate / threads.max(1) as f64,
    }
}

/// Runs the ALU-bound kernel.
pub fn bench_alu(o: &BenchOptions) -> Result<Throughput, EmuError> {
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&alu_kernel_ptx())?, 0)?;
    let prog = m.kernel("alu_loop")?;
    let threads = o.alu_ctas as u64 * 256;
    let out = mem.alloc(threads * 4, 0)?;
    let cfg = LaunchConfig {
        grid: [o.alu_ctas, 1, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
        sms: 132,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    let lo = opts(o.threads);
    let s = launch(
        prog,
        mem.snapshot(),
        params(&[(out.base, 8), (o.alu_iters as u64, 4)]),
        &cfg,
        &lo,
    )?;
    Ok(throughput("alu_loop", &s, lo.threads))
}

fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Naive CPU GEMM (f32 accumulate) on f32 inputs; returns C (M×N, row-major).
pub fn cpu_gemm(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for kk in 0..k {
                acc += a[i * k + kk] * b[kk * n + j];
            }
            c[i * n + j] = acc;
        }
    }
    c
}

/// Largest benchmark GEMM size (4096³ is 10^11 multiply-adds: hours on the emulator, and the
/// operands stay far from the host's memory).
pub const MAX_GEMM_SIZE: u32 = 4096;

/// Runs the corpus mma.sync GEMM kernel on a size³ GEMM and the CPU reference.
pub fn bench_gemm(o: &BenchOptions) -> Result<(Throughput, GemmCompare), EmuError> {
    let sz = o.gemm_size;
    if sz == 0 || !sz.is_multiple_of(64) || sz > MAX_GEMM_SIZE {
        return Err(bench_err(format!(
            "GEMM size {sz} is not a positive multiple of 64 up to {MAX_GEMM_SIZE}"
        )));
    }
    let n = sz as usize;
    // Deterministic inputs, exactly representable in bf16.
    let mut state = 0x1234_5678u32;
    let mut next = move || {
        state = state.wrapping_mul(1664525).wrapping_add(1013904223);
        let v = ((state >> 9) & 0xff) as f32 / 128.0 - 1.0; // in [-1, 1), 8 bits: exact in bf16
        (v.to_bits() >> 16) as u16
    };
    let a: Vec<u16> = (0..n * n).map(|_| next()).collect();
    let b: Vec<u16> = (0..n * n).map(|_| next()).collect();
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(GEMM_BF16_SM80)?, 0)?;
    let prog = m.kernel("gemm")?;
    let bytes = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let da = mem.alloc((n * n * 2) as u64, 0)?;
    let db = mem.alloc((n * n * 2) as u64, 0)?;
    let dc = mem.alloc((n * n * 2) as u64, 0)?;
    da.write_bytes(0, &bytes(&a));
    db.write_bytes(0, &bytes(&b));
    let s64 = sz as u64;
    let p = params(&[
        (da.base, 8),
        (db.base, 8),
        (dc.base, 8),
        (s64, 4),
        (s64, 4),
        (s64, 4),
        (s64, 4),
        (0, 8),
        (0, 8),
    ]);
    let cfg = LaunchConfig {
        grid: [sz / 64, sz / 64, 1],
        block: [128, 1, 1],
        shared_bytes: 8192,
        sms: 132,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    let lo = opts(o.threads);
    let t = Instant::now();
    let s = launch(prog, mem.snapshot(), p, &cfg, &lo)?;
    let emu_seconds = t.elapsed().as_secs_f64();
    let mut out = vec![0u8; n * n * 2];
    dc.read_bytes(0, &mut out);

    let t = Instant::now();
    let af: Vec<f32> = a.iter().map(|&x| bf16_to_f32(x)).collect();
    let bf: Vec<f32> = b.iter().map(|&x| bf16_to_f32(x)).collect();
    let c = cpu_gemm(&af, &bf, n, n, n);
    let cpu_seconds = t.elapsed().as_secs_f64();
    let cmax = c
        .iter()
        .fold(0f32, |m, x| m.max(x.abs()))
        .max(f32::MIN_POSITIVE);
    let err = out
        .chunks_exact(2)
        .zip(&c)
        .map(|(o, r)| (bf16_to_f32(u16::from_le_bytes([o[0], o[1]])) - r).abs())
        .fold(0f32, f32::max);
    let cmp = GemmCompare {
        m: sz,
        n: sz,
        k: sz,
        emu_seconds,
        cpu_reference_seconds: cpu_seconds,
        ratio: emu_seconds / cpu_seconds.max(1e-9),
        max_error_rel_to_max: (err / cmax) as f64,
    };
    Ok((
        throughput("gemm_bf16 (sm_80, mma.sync.m16n8k16)", &s, lo.threads),
        cmp,
    ))
}

/// Runs everything.
pub fn run(o: &BenchOptions) -> Result<EmuBench, EmuError> {
    let alu = bench_alu(o)?;
    let (mma_gemm, gemm) = bench_gemm(o)?;
    Ok(EmuBench {
        threads: opts(o.threads).threads,
        alu,
        mma_gemm,
        gemm,
    })
}

impl std::fmt::Display for EmuBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "emulator benchmark ({} host threads)", self.threads)?;
        for t in [&self.alu, &self.mma_gemm] {
            writeln!(
                f,
                "  {:<40} {:>6} CTAs {:>14} lane-instr {:>8.3} s  {:>9.3e} lane-instr/s ({:.3e}/thread)",
                t.kernel, t.ctas, t.lane_instructions, t.seconds, t.lane_instructions_per_s, t.lane_instructions_per_s_per_thread
            )?;
        }
        let g = &self.gemm;
        write!(
            f,
            "  {}x{}x{} bf16 GEMM: emulated {:.3} s, CPU reference (naive, 1 thread) {:.3} s, ratio {:.1}x; max error {:.2e} of max|C|",
            g.m, g.n, g.k, g.emu_seconds, g.cpu_reference_seconds, g.ratio, g.max_error_rel_to_max
        )
    }
}
