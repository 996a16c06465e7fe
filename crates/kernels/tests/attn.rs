//! MLA attention kernels on the emulator against the f64 references: every registered
//! attention kernel at its registered shapes, plus bad-input errors.

use kernels::registry::{registry, Kind};

fn emu() -> runtime::Stream {
    runtime::Device::emu(8).default_stream()
}

#[test]
fn registered_attention_kernels_match_the_reference() {
    let st = emu();
    for info in registry()
        .iter()
        .filter(|k| matches!(k.kind, Kind::Attn(_)))
    {
        for (i, s) in info.test_shapes.iter().enumerate() {
            let t0 = std::time::Instant::now();
            let rep = info.check(&st, s, 300 + i as u64).unwrap();
            eprintln!(
                "{:<36} {:?} rel {:.2e} mism {} lane-instr {:?} ({:.1}s)",
                info.name,
                (s.m, s.n, s.k, s.groups),
                rep.rel_err,
                rep.mismatches,
                rep.lane_instructions,
                t0.elapsed().as_secs_f64()
            );
            assert!(rep.pass, "{}: {rep:?}", info.name);
        }
    }
}

use half::bf16;
use kernels::attn::decode::{self, DecodeArgs, DecodeShape, DecodeSpec};
use kernels::attn::fwd::{self, AttnShape, FwdArgs};
use kernels::attn::registry::{self as ar, DecodeProblem, TrainProblem};
use kernels::reference::rng;
use kernels::KernelError;

fn assert_close(what: &str, got: &[bf16], want: &[f64], tol: f64) {
    let g = ar::bf16_f64(got);
    let (rel, nans) = ar::compare(&g, want);
    eprintln!("{what}: rel {rel:.2e}");
    assert!(
        nans == 0 && rel <= tol,
        "{what}: rel {rel:.2e}, {nans} non-finite"
    );
}

/// Lengths around the tile sizes (1, 31, 32, 33, 63, 64, 65, 130, and an empty sequence) and head dims that are not
/// powers of two (80/48: partial panels and odd fragment counts), forward (both variants) and
/// backward.
#[test]
fn odd_lengths_and_head_dims_forward_backward() {
    let st = emu();
    let lens = vec![1, 31, 32, 0, 33, 63, 64, 65, 130];
    for (dqk, dv) in [(80, 48), (176, 176)] {
        let mut rg = rng(11 + dqk as u64);
        let tp = TrainProblem::with_lens(&mut rg, lens.clone(), dqk, dv);
        let want = tp.p.forward(&tp.q.1, &tp.k.1, &tp.v.1);
        for wgmma in [false, true] {
            let out = ar::run_fwd(&st, &tp, wgmma).unwrap();
            assert_close(
                &format!("O {dqk}/{dv} wgmma {wgmma}"),
                &out.o,
                &want.o,
                1e-2,
            );
            assert_eq!(ar::lse_mismatches(&out.lse, &want.lse), 0);
        }
        let dout = ar::random_bf16(&mut rg, tp.total * tp.sh.heads * dv, 1.0);
        let wb = tp.p.backward(&tp.q.1, &tp.k.1, &tp.v.1, &dout.1);
        for wgmma in [false, true] {
            let b = ar::run_bwd(&st, &tp, &dout.0, wgmma).unwrap();
            let w = format!("{dqk}/{dv} wgmma {wgmma}");
            assert_close(&format!("dQ {w}"), &b.dq, &wb.dq, 2e-2);
            assert_close(&format!("dK {w}"), &b.dk, &wb.dk, 2e-2);
            assert_close(&format!("dV {w}"), &b.dv, &wb.dv, 2e-2);
        }
    }
}

/// MLA's decoupled RoPE key passed once for all heads (`k_rope` `[total, r]`, K without it):
/// forward (both variants) and backward against the reference with the key broadcast to every
/// head; 192 = 128 + 64 (V3) and 80 = 32 + 48 (the two sources share a 64-column panel).
#[test]
fn shared_rope_key_matches_the_broadcast_reference() {
    let st = emu();
    for (dqk, dv, rope) in [(192, 128, 64), (80, 48, 48)] {
        let mut rg = rng(21 + dqk as u64);
        let tp = TrainProblem::with_lens(&mut rg, vec![37, 70, 1], dqk, dv).with_shared_rope(rope);
        let want = tp.p.forward(&tp.q.1, &tp.k.1, &tp.v.1);
        for wgmma in [false, true] {
            let out = ar::run_fwd(&st, &tp, wgmma).unwrap();
            assert_close(
                &format!("O {dqk}/{dv} kr{rope} wgmma {wgmma}"),
                &out.o,
                &want.o,
                1e-2,
            );
            assert_eq!(ar::lse_mismatches(&out.lse, &want.lse), 0);
        }
        let dout = ar::random_bf16(&mut rg, tp.total * tp.sh.heads * dv, 1.0);
        let wb = tp.p.backward(&tp.q.1, &tp.k.1, &tp.v.1, &dout.1);
        for wgmma in [false, true] {
            let b = ar::run_bwd(&st, &tp, &dout.0, wgmma).unwrap();
            assert_close(&format!("dQ kr{rope} wgmma {wgmma}"), &b.dq, &wb.dq, 2e-2);
            assert_close(&format!("dK kr{rope} wgmma {wgmma}"), &b.dk, &wb.dk, 2e-2);
            assert_close(&format!("dV kr{rope} wgmma {wgmma}"), &b.dv, &wb.dv, 2e-2);
        }
    }
}

/// The sm_90a backward (TMA loads through mbarrier rings, wgmma) at both ends of the head-dim
/// range, V3's 192/128 (K concatenated and with the shared 64-wide RoPE key), on a ragged batch
/// with lengths around its tiles (16-query and 64-key tiles in dK/dV, 64-query and 32-key tiles
/// in dQ; an empty sequence; 130 rows wrap both 2-stage rings): boxes reaching into the next
/// sequence and past the tensor end must not leak into the gradients. Outputs poisoned, f64
/// reference.
#[test]
fn tma_backward_head_dim_extremes_ragged() {
    let st = emu();
    let lens = vec![17, 1, 0, 130, 15, 65, 16, 63];
    for (dqk, dv, rope) in [
        (32, 32, 0),
        (32, 256, 0),
        (256, 32, 0),
        (256, 256, 0),
        (192, 128, 0),
        (192, 128, 64),
    ] {
        let mut rg = rng(31 + dqk as u64 + dv as u64 + rope as u64);
        let tp = TrainProblem::with_lens(&mut rg, lens.clone(), dqk, dv).with_shared_rope(rope);
        let dout = ar::random_bf16(&mut rg, tp.total * tp.sh.heads * dv, 1.0);
        let wb = tp.p.backward(&tp.q.1, &tp.k.1, &tp.v.1, &dout.1);
        let b = ar::run_bwd(&st, &tp, &dout.0, true).unwrap();
        let w = format!("{dqk}/{dv} kr{rope} (TMA + wgmma)");
        assert_close(&format!("dQ {w}"), &b.dq, &wb.dq, 2e-2);
        assert_close(&format!("dK {w}"), &b.dk, &wb.dk, 2e-2);
        assert_close(&format!("dV {w}"), &b.dv, &wb.dv, 2e-2);
    }
}

/// The kernel gradients against central finite differences of the f64 forward's loss
/// L = sum(dO * O) (independent of the reference backward's formulas), at random elements.
#[test]
fn gradients_match_finite_differences() {
    let st = emu();
    let mut rg = rng(77);
    let tp = TrainProblem::with_lens(&mut rg, vec![20, 37], 32, 32);
    let dout = ar::random_bf16(&mut rg, tp.total * tp.sh.heads * 32, 1.0);
    let b = ar::run_bwd(&st, &tp, &dout.0, false).unwrap();
    let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
        let o = tp.p.forward(q, k, v).o;
        o.iter().zip(&dout.1).map(|(a, b)| a * b).sum()
    };
    let h = 1e-4;
    use rand::Rng;
    for (which, grad) in [(0, &b.dq), (1, &b.dk), (2, &b.dv)] {
        let gmax = grad.iter().fold(0f64, |m, x| m.max(x.to_f64().abs()));
        for _ in 0..6 {
            let i = rg.gen_range(0..grad.len());
            let mut x = [tp.q.1.clone(), tp.k.1.clone(), tp.v.1.clone()];
            x[which][i] += h;
            let lp = loss(&x[0], &x[1], &x[2]);
            x[which][i] -= 2.0 * h;
            let lm = loss(&x[0], &x[1], &x[2]);
            let fd = (lp - lm) / (2.0 * h);
            let g = grad[i].to_f64();
            assert!(
                (fd - g).abs() <= 2e-2 * gmax + 1e-3,
                "input {which} element {i}: kernel {g}, finite difference {fd}"
            );
        }
    }
}

/// One query token, 20 heads (a partial 16-row tile), d_v 128 (column quarters not aligned to
/// 64-column panels), 8 splits over short sequences (some splits empty), auto configuration.
#[test]
fn decode_single_token_many_splits() {
    let st = emu();
    let mut rg = rng(5);
    let sh0 = DecodeShape {
        heads: 20,
        s_q: 1,
        d_v: 128,
        d_rope: 32,
        scale: 0.1,
        num_blocks: 0,
        max_blocks: 0,
        num_splits: 8,
    };
    let dp = DecodeProblem::random(&mut rg, sh0, 200, 3);
    let spec = decode::choose_spec(&dp.sh, st.device().props().max_shared_per_block);
    let (o, lse, _) = dp.run(&st, &spec).unwrap();
    let (wo, wl) = dp.reference();
    assert_close("decode O", &o, &wo, 1e-2);
    for (g, w) in lse.iter().zip(&wl) {
        assert!((*g as f64 - w).abs() <= 1e-3, "lse {g} vs {w}");
    }
    // the 64-row configuration on 64+ rows agrees with the 16-row one
    let sh1 = DecodeShape {
        heads: 40,
        s_q: 2,
        num_splits: 2,
        d_v: 64,
        d_rope: 64,
        ..sh0
    };
    let dp = DecodeProblem::random(&mut rg, sh1, 150, 2);
    let (wo, _) = dp.reference();
    for (rgs, stages) in [(1, 1), (4, 1), (1, 2), (4, 2)] {
        let spec = DecodeSpec {
            d_v: 64,
            d_rope: 64,
            row_groups: rgs,
            stages,
        };
        let (o, _, _) = dp.run(&st, &spec).unwrap();
        let what = format!("decode O, {} rows/CTA, {stages} stage(s)", 16 * rgs);
        assert_close(&what, &o, &wo, 1e-2);
    }
}

fn expect_shape_err(r: kernels::Result<()>, what: &str) {
    match r {
        Err(KernelError::Shape { msg, .. }) => {
            assert!(msg.contains(what), "error `{msg}` should mention `{what}`")
        }
        other => panic!("expected a shape error about `{what}`, got {other:?}"),
    }
}

#[test]
fn bad_training_inputs_are_rejected_before_launch() {
    let st = emu();
    let dev = st.device().clone();
    let cu = dev.upload(&[0i32, 5, 12]).unwrap();
    let q = dev.upload(&vec![bf16::ONE; 12 * 2 * 256]).unwrap();
    let mut o = dev.alloc::<bf16>(12 * 2 * 256).unwrap();
    o.fill(bf16::from_bits(0x7fc1)).unwrap();
    let mut lse = dev.alloc::<f32>(24).unwrap();
    let sh = AttnShape {
        heads: 2,
        d_qk: 64,
        d_v: 64,
        scale: 0.125,
        max_seqlen: 7,
        k_rope: 0,
    };
    let mut run = |sh: AttnShape, cu: &runtime::Buffer<i32>| {
        fwd::mla_attn_fwd(
            &st,
            &sh,
            FwdArgs {
                q: &q,
                k: &q,
                k_rope: None,
                v: &q,
                cu_seqlens: cu,
                o: &mut o,
                lse: &mut lse,
            },
        )
    };
    expect_shape_err(run(AttnShape { d_qk: 40, ..sh }, &cu), "d_qk = 40");
    expect_shape_err(run(AttnShape { d_v: 272, ..sh }, &cu), "d_v = 272");
    expect_shape_err(run(AttnShape { d_qk: 16, ..sh }, &cu), "d_qk = 16");
    expect_shape_err(
        run(
            AttnShape {
                max_seqlen: 6,
                ..sh
            },
            &cu,
        ),
        "length 7",
    );
    expect_shape_err(
        run(
            AttnShape {
                max_seqlen: 1 << 21,
                ..sh
            },
            &cu,
        ),
        "exceeds the limit",
    );
    expect_shape_err(
        run(
            AttnShape {
                scale: f32::NAN,
                ..sh
            },
            &cu,
        ),
        "scale",
    );
    let bad_cu = dev.upload(&[0i32, 9, 5]).unwrap();
    expect_shape_err(
        run(
            AttnShape {
                max_seqlen: 10,
                ..sh
            },
            &bad_cu,
        ),
        "length -4",
    );
    let big_cu = dev.upload(&[0i32, 7, 40]).unwrap();
    expect_shape_err(
        run(
            AttnShape {
                max_seqlen: 40,
                d_qk: 256,
                ..sh
            },
            &big_cu,
        ),
        "`q` holds",
    );
    let many = dev.upload(&vec![0i32; 70_000]).unwrap();
    expect_shape_err(run(sh, &many), "at most 65535");
    // nothing was launched: O is still poisoned
    assert!(o.to_vec().unwrap().iter().all(|x| x.is_nan()));
}

#[test]
fn bad_decoding_inputs_are_rejected_before_launch() {
    let st = emu();
    let mut rg = rng(9);
    let sh0 = DecodeShape {
        heads: 16,
        s_q: 1,
        d_v: 64,
        d_rope: 64,
        scale: 0.1,
        num_blocks: 0,
        max_blocks: 0,
        num_splits: 2,
    };
    let dp = DecodeProblem::random(&mut rg, sh0, 100, 2);
    let dev = st.device().clone();
    let q = dev.upload(&dp.q.0).unwrap();
    let kv = dev.upload(&dp.kv.0).unwrap();
    let lens: Vec<i32> = dp.lens.iter().map(|&l| l as i32).collect();
    let mut o_part = dev.alloc::<f32>(1 << 16).unwrap();
    let mut lse_part = dev.alloc::<f32>(1 << 10).unwrap();
    let mut o = dev.alloc::<bf16>(2 * 16 * 64).unwrap();
    o.fill(bf16::from_bits(0x7fc1)).unwrap();
    let mut lse = dev.alloc::<f32>(32).unwrap();
    let mut run = |sh: DecodeShape, table: &[i32], lens: &[i32]| {
        let (t, l) = (dev.upload(table).unwrap(), dev.upload(lens).unwrap());
        decode::mla_decode(
            &st,
            &sh,
            DecodeArgs {
                q: &q,
                kv_cache: &kv,
                block_table: &t,
                seqlens: &l,
                o_part: &mut o_part,
                lse_part: &mut lse_part,
                o: &mut o,
                lse: &mut lse,
            },
        )
    };
    let mut past = dp.table.clone();
    past[0] = dp.sh.num_blocks as i32;
    expect_shape_err(run(dp.sh, &past, &lens), "outside the cache");
    let mut neg = dp.table.clone();
    neg[dp.sh.max_blocks] = -1;
    expect_shape_err(run(dp.sh, &neg, &lens), "outside the cache");
    let long = vec![(dp.sh.max_blocks * 64 + 1) as i32, 5];
    expect_shape_err(run(dp.sh, &dp.table, &long), "seqlens[0]");
    expect_shape_err(
        run(DecodeShape { d_v: 96, ..dp.sh }, &dp.table, &lens),
        "d_v (kv_lora_rank) = 96",
    );
    expect_shape_err(
        run(DecodeShape { d_rope: 8, ..dp.sh }, &dp.table, &lens),
        "d_rope = 8",
    );
    expect_shape_err(
        run(DecodeShape { heads: 64, ..dp.sh }, &dp.table, &lens),
        "`q` holds",
    );
    assert!(o.to_vec().unwrap().iter().all(|x| x.is_nan()));
}

/// Every attention launch (not only the last of a multi-launch call, which is all the registry
/// bank test sees) takes the ideal number of shared wavefronts: partial panels (d = 48), the
/// dK/dV kernel and the decoding kernel's P tile and row-max exchange included.
#[test]
fn every_attention_launch_is_free_of_bank_conflicts() {
    // (its own device: the other tests' launches must not land in this profile)
    let st = runtime::Device::emu(81).default_stream();
    st.set_bank_profile(true);
    let dev = st.device().clone();
    let mut seen = Vec::new();
    let mut check = |name: &str| {
        st.synchronize().unwrap(); // launches are asynchronous
        let b = st.last_stats().and_then(|s| s.banks).expect("bank profile");
        assert_eq!(
            b.total.wavefronts,
            b.total.ideal,
            "{name}: {:#?}",
            &b.lines[..b.lines.len().min(3)]
        );
        seen.push(name.to_string());
    };
    let mut rg = rng(3);
    let tp = TrainProblem::with_lens(&mut rg, vec![45, 70], 48, 80);
    let up = |v: &[bf16]| dev.upload(v).unwrap();
    let (q, k, v) = (up(&tp.q.0), up(&tp.k.0), up(&tp.v.0));
    let cu = dev.upload(&tp.cu_i32()).unwrap();
    let rows = tp.total * tp.sh.heads;
    let (mut o, mut lse) = (
        dev.alloc::<bf16>(rows * 80).unwrap(),
        dev.alloc::<f32>(rows).unwrap(),
    );
    fwd::mla_attn_fwd(
        &st,
        &tp.sh,
        FwdArgs {
            q: &q,
            k: &k,
            k_rope: None,
            v: &v,
            cu_seqlens: &cu,
            o: &mut o,
            lse: &mut lse,
        },
    )
    .unwrap();
    check("fwd");
    let dout = up(&ar::random_bf16(&mut rg, rows * 80, 1.0).0);
    let mut delta = dev.alloc::<f32>(rows).unwrap();
    let (mut dq, mut dk) = (
        dev.alloc::<bf16>(rows * 48).unwrap(),
        dev.alloc::<bf16>(rows * 48).unwrap(),
    );
    let mut dv = dev.alloc::<bf16>(rows * 80).unwrap();
    let args = kernels::attn::bwd::BwdArgs {
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
    kernels::attn::bwd::mla_attn_bwd_observed(&st, &tp.sh, args, &mut check).unwrap();
    let sh0 = DecodeShape {
        heads: 32,
        s_q: 2,
        d_v: 128,
        d_rope: 64,
        scale: 0.1,
        num_blocks: 0,
        max_blocks: 0,
        num_splits: 2,
    };
    let dp = DecodeProblem::random(&mut rg, sh0, 100, 2);
    let lens: Vec<i32> = dp.lens.iter().map(|&l| l as i32).collect();
    let (dq_, dkv) = (up(&dp.q.0), up(&dp.kv.0));
    let (table, lens) = (dev.upload(&dp.table).unwrap(), dev.upload(&lens).unwrap());
    let (wo, wl) = decode::workspace_len(&dp.sh, 2, 2);
    let (mut op, mut lp) = (dev.alloc::<f32>(wo).unwrap(), dev.alloc::<f32>(wl).unwrap());
    let (mut o2, mut l2) = (
        dev.alloc::<bf16>(2 * 64 * 128).unwrap(),
        dev.alloc::<f32>(128).unwrap(),
    );
    for (rgs, stages) in [(1, 1), (4, 2)] {
        let spec = DecodeSpec {
            d_v: 128,
            d_rope: 64,
            row_groups: rgs,
            stages,
        };
        let args = DecodeArgs {
            q: &dq_,
            kv_cache: &dkv,
            block_table: &table,
            seqlens: &lens,
            o_part: &mut op,
            lse_part: &mut lp,
            o: &mut o2,
            lse: &mut l2,
        };
        decode::mla_decode_observed(&st, &spec, &dp.sh, args, &mut check).unwrap();
    }
    st.synchronize().unwrap();
    assert_eq!(seen.len(), 1 + 3 + 4, "{seen:?}");
}

/// Every training kernel over a grid of head-dim pairs (d_qk, d_v in {32, 64, 112, 144, 176,
/// 208, 256}) x every target assembles with ptxas without spills (588 kernels, ~3 minutes on
/// 2 cores: run with `--ignored`; the registered pairs are checked by tests/ptxas.rs).
#[test]
#[ignore = "588 ptxas runs (~3 min on 2 cores): cargo test -p kernels --test attn -- --ignored"]
fn head_dim_sweep_assembles_without_spills() {
    use kernels::attn::{bwd, fwd};
    // run only on request, so a missing ptxas is a failure, not a skip
    assert!(
        ptx::ptxas::find_ptxas().is_some(),
        "ptxas not found (scripts/setup-ptxas.sh or PTXAS=...)"
    );
    let ds = [32u32, 64, 112, 144, 176, 208, 256];
    let mut failures = Vec::new();
    for &dqk in &ds {
        for &dv in &ds {
            for arch in ["sm_80", "sm_89", "sm_90a"] {
                let t = builder::Target::new(arch);
                let bs = bwd::BwdSpec::new(dqk, dv);
                let mut specs = vec![fwd::FwdSpec::mma(dqk, dv)];
                if arch == "sm_90a" {
                    specs.push(fwd::FwdSpec {
                        wgmma: true,
                        ..specs[0]
                    });
                }
                let mut mods: Vec<(String, ptx::Module)> = specs
                    .iter()
                    .map(|s| (s.name(), fwd::gen_fwd(&t, s).unwrap()))
                    .collect();
                let mut bspecs = vec![bs];
                if arch == "sm_90a" {
                    bspecs.push(bwd::BwdSpec { wgmma: true, ..bs });
                }
                for bs in bspecs {
                    mods.push((bs.dkdv_name(), bwd::gen_dkdv(&t, &bs).unwrap()));
                    mods.push((bs.dq_name(), bwd::gen_dq(&t, &bs).unwrap()));
                }
                for (name, m) in mods {
                    let rep =
                        ptx::ptxas::assemble(&ptx::print(&m), arch, &Default::default()).unwrap();
                    let k = rep.kernel(&name).cloned().unwrap_or_default();
                    if k.spill_stores_bytes + k.spill_loads_bytes + k.stack_frame_bytes > 0 {
                        failures.push(format!("{name} {arch}: {k:?}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every decoding configuration over d_v in {64, 128, 192, 256, 384, 512} x d_rope in {0, 16,
/// 64, 128} x {16, 64} rows per CTA x its targets assembles without spills (the 64-row variant
/// takes d_rope multiples of 64 only, and is refused otherwise): 112 kernels, ~10 s.
#[test]
fn decode_dim_sweep_assembles_without_spills() {
    if ptx::ptxas::ptxas_for_tests("attention decode sweep").is_none() {
        return;
    }
    let mut failures = Vec::new();
    for d_v in [64u32, 128, 192, 256, 384, 512] {
        for d_rope in [0u32, 16, 64, 128] {
            for (row_groups, stages) in [(1u32, 1u32), (4, 1), (1, 2), (4, 2)] {
                let s = DecodeSpec {
                    d_v,
                    d_rope,
                    row_groups,
                    stages,
                };
                for arch in s.targets() {
                    let m = match decode::gen_decode(&builder::Target::new(arch), &s) {
                        Ok(m) => m,
                        Err(e) => {
                            assert!(row_groups == 4 && d_rope % 64 != 0, "{e}");
                            continue;
                        }
                    };
                    let rep =
                        ptx::ptxas::assemble(&ptx::print(&m), arch, &Default::default()).unwrap();
                    let k = rep.kernel(&s.name()).cloned().unwrap_or_default();
                    if k.spill_stores_bytes + k.spill_loads_bytes + k.stack_frame_bytes > 0 {
                        failures.push(format!("{} {arch}: {k:?}", s.name()));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The sm_90a kernels (forward, backward dK/dV and dQ: TMA rings + wgmma) at the ends of the
/// head-dim range, odd dims and the shared RoPE key assemble without spills, and all of them
/// load through TMA (no `cp.async`).
#[test]
fn wgmma_kernels_assemble_without_spills() {
    if ptx::ptxas::ptxas_for_tests("attention wgmma forward").is_none() {
        return;
    }
    let t = builder::Target::new("sm_90a");
    let mut failures = Vec::new();
    for (d_qk, d_v, k_rope) in [
        (32, 32, 0),
        (32, 256, 0),
        (256, 32, 0),
        (256, 256, 0),
        (80, 48, 0),
        (80, 48, 48),
        (176, 176, 0),
        (192, 128, 64),
    ] {
        let s = fwd::FwdSpec {
            d_qk,
            d_v,
            wgmma: true,
            k_rope,
        };
        let text = ptx::print(&fwd::gen_fwd(&t, &s).unwrap());
        assert!(text.contains("cp.async.bulk.tensor.2d"), "{}", s.name());
        assert!(!text.contains("cp.async.ca") && !text.contains("cp.async.cg"));
        let rep = ptx::ptxas::assemble(&text, "sm_90a", &Default::default()).unwrap();
        let k = rep.kernel(&s.name()).cloned().unwrap_or_default();
        eprintln!(
            "{} regs {} smem {}",
            s.name(),
            k.registers,
            s.shared_bytes()
        );
        if k.spill_stores_bytes + k.spill_loads_bytes + k.stack_frame_bytes > 0 {
            failures.push(format!("{}: {k:?}", s.name()));
        }
        let b = kernels::attn::bwd::BwdSpec {
            d_qk,
            d_v,
            k_rope,
            wgmma: true,
        };
        use kernels::attn::bwd::{gen_dkdv, gen_dq};
        for (name, m) in [
            (b.dkdv_name(), gen_dkdv(&t, &b).unwrap()),
            (b.dq_name(), gen_dq(&t, &b).unwrap()),
        ] {
            let text = ptx::print(&m);
            assert!(text.contains("cp.async.bulk.tensor.2d"), "{name}");
            assert!(!text.contains("cp.async.ca") && !text.contains("cp.async.cg"));
            let rep = ptx::ptxas::assemble(&text, "sm_90a", &Default::default()).unwrap();
            let k = rep.kernel(&name).cloned().unwrap_or_default();
            eprintln!("{name} regs {}", k.registers);
            if k.spill_stores_bytes + k.spill_loads_bytes + k.stack_frame_bytes > 0 {
                failures.push(format!("{name}: {k:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
