//! `ptxforge bench attn`: MLA attention, training forward and backward (causal, `--batch`
//! sequences of `--seqlen` tokens, `--heads` heads of 192/128 by default) and FlashMLA-style
//! decoding (`--decode-batch` sequences of `--decode-len` cached tokens, `--decode-heads` query
//! heads, latent 512 + rope 64). On a CUDA device: TFLOP/s (and GB/s of the KV cache for
//! decoding), beside PyTorch SDPA (`scripts/bench_torch.py --attn`) when torch is present. On the
//! emulator (small default sizes): emulated lane-instructions, their rate, and per FLOP.

use anyhow::Result;
use half::bf16;
use kernels::attn::decode::{self, DecodeArgs, DecodeShape};
use kernels::attn::fwd::{self, AttnShape, FwdArgs};
use kernels::attn::{bwd, bwd::BwdArgs};
use rand::Rng;
use runtime::{Buffer, Device, Stream};

#[derive(clap::Args)]
pub struct AttnArgs {
    /// `emu[:N]` | `cuda[:N]`
    #[arg(long, default_value = "emu")]
    pub device: String,
    /// Training: sequences, tokens per sequence (default: 1 x 256 on the emulator, 2 x 4096 on a GPU)
    #[arg(long)]
    pub batch: Option<usize>,
    #[arg(long)]
    pub seqlen: Option<usize>,
    /// Training heads (default 2 on the emulator, 16 on a GPU).
    #[arg(long)]
    pub heads: Option<usize>,
    #[arg(long, default_value_t = 192)]
    pub d_qk: usize,
    #[arg(long, default_value_t = 128)]
    pub d_v: usize,
    /// Decoding: sequences, cached tokens each, query heads, new tokens per sequence.
    #[arg(long)]
    pub decode_batch: Option<usize>,
    #[arg(long)]
    pub decode_len: Option<usize>,
    #[arg(long)]
    pub decode_heads: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub s_q: usize,
    #[arg(long, default_value_t = 512)]
    pub kv_rank: usize,
    /// Timed repetitions after one warm-up run.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    #[arg(long)]
    pub json: bool,
}

/// One measured stage.
#[derive(serde::Serialize)]
struct Row {
    stage: &'static str,
    kernels: Vec<String>,
    seconds: f64,
    flops: f64,
    bytes: f64,
    tflops: f64,
    gbps: f64,
    lane_instructions: Option<u64>,
    lane_instructions_per_s: Option<f64>,
    torch_tflops: Option<f64>,
}

fn rand_buf(dev: &Device, rg: &mut impl Rng, n: usize) -> Result<Buffer<bf16>> {
    let v: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(rg.gen_range(-1.0f32..1.0)))
        .collect();
    Ok(dev.upload(&v)?)
}

/// A stage's timing: mean seconds, its kernels, and (emulator) lane instructions and emulator
/// seconds summed over the launches of one run.
struct Measured {
    seconds: f64,
    kernels: Vec<String>,
    emu: Option<(u64, f64)>,
}

/// Runs `f` once to warm up (synchronising after each launch to read its emulator statistics),
/// then `reps` timed times.
fn time_stage(
    st: &Stream,
    reps: usize,
    mut f: impl FnMut(&mut dyn FnMut(&str)) -> kernels::Result<()>,
) -> Result<Measured> {
    let mut names = Vec::new();
    let mut emu: Option<(u64, f64)> = None;
    f(&mut |name: &str| {
        names.push(name.to_string());
        // launches are asynchronous: the statistics exist once this one has run
        if st.synchronize().is_ok() {
            if let Some(s) = st.last_stats() {
                let e = emu.get_or_insert((0, 0.0));
                e.0 += s.lane_instructions;
                e.1 += s.seconds;
            }
        }
    })?;
    st.synchronize()?;
    let t0 = std::time::Instant::now();
    for _ in 0..reps.max(1) {
        f(&mut |_| {})?;
    }
    st.synchronize()?;
    Ok(Measured {
        seconds: t0.elapsed().as_secs_f64() / reps.max(1) as f64,
        kernels: names,
        emu,
    })
}

fn row(stage: &'static str, m: Measured, flops: f64, bytes: f64) -> Row {
    let Measured {
        seconds,
        kernels,
        emu,
    } = m;
    Row {
        stage,
        kernels,
        seconds,
        flops,
        bytes,
        tflops: flops / seconds / 1e12,
        gbps: bytes / seconds / 1e9,
        lane_instructions: emu.map(|e| e.0),
        lane_instructions_per_s: emu.map(|e| e.0 as f64 / e.1),
        torch_tflops: None,
    }
}

fn torch_attn(mode: &str, b: usize, s: usize, h: usize, dqk: usize, dv: usize) -> Option<f64> {
    let built =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench_torch.py");
    let script = if built.exists() {
        built
    } else {
        "scripts/bench_torch.py".into()
    };
    let args = [
        ("--attn", mode.to_string()),
        ("--batch", b.to_string()),
        ("--seqlen", s.to_string()),
        ("--heads", h.to_string()),
        ("--dqk", dqk.to_string()),
        ("--dv", dv.to_string()),
    ];
    let mut c = std::process::Command::new("python3");
    c.arg(script);
    for (k, v) in args {
        c.args([k, &v]);
    }
    let out = c.output().ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["tflops"].as_f64()
}

fn train(a: &AttnArgs, dev: &Device, st: &Stream, emu: bool) -> Result<Vec<Row>> {
    let (b, s) = (
        a.batch.unwrap_or(if emu { 1 } else { 2 }),
        a.seqlen.unwrap_or(if emu { 256 } else { 4096 }),
    );
    let h = a.heads.unwrap_or(if emu { 2 } else { 16 });
    let mut rg = kernels::reference::rng(1);
    let n = b * s * h;
    let (q, k, v) = (
        rand_buf(dev, &mut rg, n * a.d_qk)?,
        rand_buf(dev, &mut rg, n * a.d_qk)?,
        rand_buf(dev, &mut rg, n * a.d_v)?,
    );
    let dout = rand_buf(dev, &mut rg, n * a.d_v)?;
    let cu: Vec<i32> = (0..=b).map(|i| (i * s) as i32).collect();
    let cu = dev.upload(&cu)?;
    let (mut o, mut lse) = (dev.alloc::<bf16>(n * a.d_v)?, dev.alloc::<f32>(n)?);
    let (mut dq, mut dk, mut dv) = (
        dev.alloc::<bf16>(n * a.d_qk)?,
        dev.alloc::<bf16>(n * a.d_qk)?,
        dev.alloc::<bf16>(n * a.d_v)?,
    );
    let mut delta = dev.alloc::<f32>(n)?;
    let sh = AttnShape {
        heads: h,
        d_qk: a.d_qk,
        d_v: a.d_v,
        scale: 1.0 / (a.d_qk as f32).sqrt(),
        max_seqlen: s,
        k_rope: 0,
    };
    // (the host API runs the wgmma variant on sm_90a devices)
    let fwd_name = kernels::attn::fwd::FwdSpec {
        d_qk: a.d_qk as u32,
        d_v: a.d_v as u32,
        wgmma: kernels::host::target_for(dev).arch == "sm_90a",
        k_rope: 0,
    }
    .name();
    let fl = kernels::attn::registry::causal_flops(&vec![s; b], h, a.d_qk, a.d_v);
    let m = time_stage(st, a.reps, |after| {
        fwd::mla_attn_fwd(
            st,
            &sh,
            FwdArgs {
                q: &q,
                k: &k,
                k_rope: None,
                v: &v,
                cu_seqlens: &cu,
                o: &mut o,
                lse: &mut lse,
            },
        )?;
        after(&fwd_name);
        Ok(())
    })?;
    let mut fwd_row = row("train fwd", m, fl, 0.0);
    let m = time_stage(st, a.reps, |after| {
        let args = BwdArgs {
            q: &q,
            k: &k,
            k_rope: None,
            v: &v,
            o: &o,
            lse: &lse,
            dout: &dout,
            cu_seqlens: &cu,
            delta: &mut delta,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        bwd::mla_attn_bwd_observed(st, &sh, args, after)
    })?;
    // backward: S recomputed twice (dK/dV and dQ passes), dP twice, dV, dK, dQ: 3.5 x forward
    let mut bwd_row = row("train bwd", m, 3.5 * fl, 0.0);
    if !emu {
        fwd_row.torch_tflops = torch_attn("fwd", b, s, h, a.d_qk, a.d_v);
        bwd_row.torch_tflops = torch_attn("bwd", b, s, h, a.d_qk, a.d_v);
    }
    Ok(vec![fwd_row, bwd_row])
}

fn decode_row(a: &AttnArgs, dev: &Device, st: &Stream, emu: bool) -> Result<Row> {
    let b = a.decode_batch.unwrap_or(if emu { 2 } else { 64 });
    let len = a.decode_len.unwrap_or(if emu { 512 } else { 4096 });
    let h = a.decode_heads.unwrap_or(if emu { 16 } else { 128 });
    let dk = a.kv_rank + 64;
    let mb = len.div_ceil(64);
    let mut rg = kernels::reference::rng(2);
    let mut perm: Vec<i32> = (0..(b * mb) as i32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rg.gen_range(0..=i));
    }
    let sh = DecodeShape {
        heads: h,
        s_q: a.s_q,
        d_v: a.kv_rank,
        d_rope: 64,
        scale: 1.0 / 192f32.sqrt(),
        num_blocks: b * mb,
        max_blocks: mb,
        num_splits: 0,
    };
    let rows = b * a.s_q * h;
    let q = rand_buf(dev, &mut rg, rows * dk)?;
    let kv = rand_buf(dev, &mut rg, b * mb * 64 * dk)?;
    let table = dev.upload(&perm)?;
    let lens = dev.upload(&vec![len as i32; b])?;
    let splits = decode::choose_splits(&sh, b, st.sm_count());
    let (wo, wl) = decode::workspace_len(&sh, b, splits);
    let (mut op, mut lp) = (dev.alloc::<f32>(wo)?, dev.alloc::<f32>(wl)?);
    let (mut o, mut lse) = (
        dev.alloc::<bf16>(rows * a.kv_rank)?,
        dev.alloc::<f32>(rows)?,
    );
    let spec = decode::choose_spec(&sh, dev.props().max_shared_per_block);
    let m = time_stage(st, a.reps, |after| {
        let args = DecodeArgs {
            q: &q,
            kv_cache: &kv,
            block_table: &table,
            seqlens: &lens,
            o_part: &mut op,
            lse_part: &mut lp,
            o: &mut o,
            lse: &mut lse,
        };
        decode::mla_decode_observed(st, &spec, &sh, args, after)
    })?;
    let flops = 2.0 * rows as f64 * len as f64 * (dk + a.kv_rank) as f64;
    let bytes = (b * len * dk * 2 + rows * (dk + a.kv_rank) * 2) as f64;
    Ok(row("decode", m, flops, bytes))
}

/// Largest elements of one operand (2^32: 16 GiB of f32), so the products below stay far from
/// overflow and the request from the host's memory.
const MAX_OPERAND_ELEMENTS: u128 = 1 << 32;

/// Bounds every size flag (each field, then the operands' element counts in 128 bits) before
/// anything is allocated; `--reps` must be at least 1.
fn check_sizes(a: &AttnArgs) -> Result<()> {
    for (flag, v, limit) in [
        ("--batch", a.batch, 4096),
        ("--seqlen", a.seqlen, 1 << 20),
        ("--heads", a.heads, 1024),
        ("--decode-batch", a.decode_batch, 4096),
        ("--decode-len", a.decode_len, 1 << 20),
        ("--decode-heads", a.decode_heads, 1024),
        ("--d-qk", Some(a.d_qk), 1024),
        ("--d-v", Some(a.d_v), 1024),
        ("--s-q", Some(a.s_q), 1024),
        ("--kv-rank", Some(a.kv_rank), 4096),
    ] {
        if let Some(v) = v.filter(|&v| v > limit) {
            anyhow::bail!("{flag} {v} is above the limit of {limit}");
        }
    }
    if a.reps == 0 {
        anyhow::bail!("--reps 0: at least one timed repetition");
    }
    // an unset flag takes its default, the larger (GPU) one of the two
    let w = |v: Option<usize>, default: usize| v.unwrap_or(default) as u128;
    let train = w(a.batch, 2) * w(a.seqlen, 4096) * w(a.heads, 16) * a.d_qk.max(a.d_v) as u128;
    let decode = w(a.decode_batch, 64) * w(a.decode_len, 4096) * (a.kv_rank as u128 + 64);
    if train.max(decode) > MAX_OPERAND_ELEMENTS {
        anyhow::bail!(
            "the operands would hold {} elements, above the limit of {MAX_OPERAND_ELEMENTS} \
             (reduce --batch/--seqlen/--heads or --decode-batch/--decode-len)",
            train.max(decode)
        );
    }
    Ok(())
}

pub fn run(a: AttnArgs) -> Result<()> {
    check_sizes(&a)?;
    let dev = Device::from_name(&a.device)?;
    let emu = dev.backend() == runtime::Backend::Emu;
    let st = dev.stream(0);
    let mut rows = train(&a, &dev, &st, emu)?;
    rows.push(decode_row(&a, &dev, &st, emu)?);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    for r in &rows {
        let tail = if emu {
            format!(
                "{:.3e} lane-instr ({:.1} M/s emulated, {:.2} per FLOP)",
                r.lane_instructions.unwrap_or(0) as f64,
                r.lane_instructions_per_s.unwrap_or(0.0) / 1e6,
                r.lane_instructions.unwrap_or(0) as f64 / r.flops
            )
        } else {
            format!(
                "{:.1} TFLOP/s{}{}",
                r.tflops,
                if r.bytes > 0.0 {
                    format!(", {:.0} GB/s", r.gbps)
                } else {
                    String::new()
                },
                r.torch_tflops
                    .map(|t| format!(", torch SDPA {t:.1} TFLOP/s"))
                    .unwrap_or_default()
            )
        };
        println!(
            "{:<10} {:>10.3} ms  {}  [{}]",
            r.stage,
            r.seconds * 1e3,
            tail,
            r.kernels.join(", ")
        );
    }
    Ok(())
}
