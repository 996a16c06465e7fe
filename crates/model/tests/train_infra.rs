//! The trainer's infrastructure: configuration (load, validate, fingerprint), data (corpus,
//! split, sampler, `.npy`, unigram entropy), checkpoints (bit-exact round trip, corruption,
//! mismatched configs, atomic saves), the loss-curve plot and the trace writer.

use half::bf16;
use model::checkpoint::{self, Checkpoint, CheckpointError, Tensor, TensorData};
use model::config::{ConfigError, DeviceKind, TrainConfig};
use model::data::{self, npy, DataError, Sampler, IGNORE_INDEX};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

/// A fresh scratch directory, removed when the test that made it ends (pass or fail).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("ptxforge-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// The PP 2 x EP 4 shape on 2 nodes x 4 devices, with the earlier preset's 4-sequence
/// micro-batches and 100-step schedule (lr 3e-3 -> 3e-4 after 10 warm-up steps): the shape the
/// configuration, placement, fingerprint and checkpoint tests below were written for. The
/// default preset is PP 2 x EP 2 (docs/TRAIN.md says why).
fn ep4() -> TrainConfig {
    let mut c = TrainConfig::default();
    (c.parallel.ep, c.parallel.devices_per_node) = (4, 4);
    (c.train.micro_batch, c.train.steps) = (4, 100);
    (c.train.lr.peak, c.train.lr.min, c.train.lr.warmup_steps) = (3e-3, 3e-4, 10);
    c
}

// ---------------------------------------------------------------- config

#[test]
fn default_config_is_valid_and_round_trips() {
    let c = TrainConfig::default();
    c.validate().unwrap();
    assert_eq!((c.parallel.pp, c.parallel.ep, c.devices()), (2, 2, 4));
    let d = scratch("cfg");
    let toml = d.join("c.toml");
    std::fs::write(&toml, c.to_toml().unwrap()).unwrap();
    assert_eq!(TrainConfig::load(&toml).unwrap(), c);
    let json = d.join("c.json");
    std::fs::write(&json, serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(TrainConfig::load(&json).unwrap(), c);
    // a partial file takes the defaults for the rest
    std::fs::write(
        &toml,
        "device = \"cuda\"\n[model]\nhidden = 256\n[train]\nsteps = 7\n",
    )
    .unwrap();
    let p = TrainConfig::load(&toml).unwrap();
    assert_eq!(
        (p.model.hidden, p.train.steps, p.device),
        (256, 7, DeviceKind::Cuda)
    );
    assert_eq!(p.model.layers, c.model.layers);
    // unknown fields, unknown extensions and invalid files are refused before any work
    std::fs::write(&toml, "[model]\nhiden = 256\n").unwrap();
    let e = TrainConfig::load(&toml).unwrap_err();
    assert!(
        matches!(e, ConfigError::Parse { .. }) && e.to_string().contains("hiden"),
        "{e}"
    );
    let yaml = d.join("c.yaml");
    std::fs::write(&yaml, "").unwrap();
    assert!(matches!(
        TrainConfig::load(&yaml),
        Err(ConfigError::Format { .. })
    ));
    std::fs::write(&toml, "[model]\nheads = 3\n").unwrap();
    assert_eq!(
        TrainConfig::load(&toml).unwrap_err().fields(),
        ["model.heads"]
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Each inconsistent configuration is refused naming exactly the offending field(s).
#[test]
fn inconsistent_configs_name_the_field() {
    type Edit = fn(&mut TrainConfig);
    let cases: Vec<(Edit, &[&str])> = vec![
        (|c| c.model.heads = 3, &["model.heads"]),
        (|c| c.model.v_head_dim = 24, &["model.v_head_dim"]),
        (|c| c.model.v_head_dim = 16, &["model.v_head_dim"]),
        (
            |c| c.model.qk_nope_head_dim = 256,
            &["model.qk_nope_head_dim + model.qk_rope_head_dim"],
        ),
        (
            |c| c.model.routed_experts = 6,
            &["model.routed_experts", "model.groups"],
        ),
        (|c| c.model.topk = 5, &["model.topk"]), // 4 groups of 2 experts, 2 groups usable
        (
            |c| c.parallel.pp = 3,
            &[
                "parallel.pp",
                "parallel.nodes",
                "model.layers",
                "train.micro_batches",
            ],
        ),
        (|c| c.parallel.pp = 1, &["parallel.pp", "parallel.nodes"]),
        (|c| c.train.micro_batches = 2, &["train.micro_batches"]),
        (|c| c.train.micro_batches = 5, &["train.micro_batches"]),
        (|c| c.model.layers = 6, &["model.layers"]),
        (|c| c.model.topk = 9, &["model.topk"]),
        (|c| c.model.groups = 3, &["model.groups"]),
        (|c| c.model.topk_groups = 5, &["model.topk_groups"]),
        (|c| c.model.hidden = 192, &["model.hidden"]),
        (|c| c.model.heads = 5, &["model.heads"]),
        (
            |c| c.model.expert_intermediate = 100,
            &["model.expert_intermediate"],
        ),
        (
            |c| c.model.dense_intermediate = 200,
            &["model.dense_intermediate"],
        ),
        (|c| c.train.seq_len = 96, &["train.seq_len"]),
        (|c| c.train.micro_batch = 6, &["train.micro_batch"]),
        (
            |c| c.parallel.nodes = 1,
            &["parallel.nodes", "parallel.ep_nodes"],
        ),
        (|c| c.model.mtp_depth = 2, &["model.mtp_depth"]),
        (|c| c.train.adam_beta2 = 1.0, &["train.adam_beta2"]),
        (
            |c| c.train.lr.peak = f32::NAN,
            &["train.lr.peak", "train.lr.min"],
        ),
        (|c| c.model.q_lora_rank = 40, &["model.q_lora_rank"]),
        (|c| c.model.groups = 8, &["model.groups"]), // 1 expert per group
        (|c| c.parallel.ep_nodes = 3, &["parallel.ep_nodes"]),
        (|c| c.parallel.ep_nodes = 4, &["parallel.ep_nodes"]), // more than the 2 nodes
    ];
    for (i, (edit, want)) in cases.iter().enumerate() {
        let mut c = ep4();
        edit(&mut c);
        let e = c.validate().unwrap_err();
        let mut got = e.fields();
        got.sort();
        got.dedup(); // a field may fail two checks
        let mut want = want.to_vec();
        want.sort();
        assert_eq!(got, want, "case {i}: {e}");
        for f in &want {
            assert!(e.to_string().contains(f), "case {i}: {e}");
        }
    }
    // a consistent non-default shape: PP 4 x EP 2 (over 2 nodes) x DP 2 on 4 nodes x 4, 8 layers
    let mut c = ep4();
    (
        c.parallel.pp,
        c.parallel.ep,
        c.parallel.dp,
        c.parallel.nodes,
    ) = (4, 2, 2, 4);
    (c.model.layers, c.train.micro_batches, c.train.micro_batch) = (8, 8, 2);
    c.validate().unwrap();
}

/// Every device has exactly one (dp, pp, ep) role; an EP group spans `ep_nodes` nodes; the two
/// pipeline ranks of a group of EP ranks share a node.
#[test]
fn placement_is_a_bijection_and_spans_nodes() {
    let c = ep4();
    let p = c.placement();
    let want: Vec<(u32, u32, u32)> = (0..8)
        .map(|d| (d / 4, (d % 4) / 2, (d / 4) * 2 + d % 2))
        .collect();
    let got: Vec<(u32, u32, u32)> = p.iter().map(|r| (r.node, r.pp, r.ep)).collect();
    assert_eq!(
        got, want,
        "default: pp rank = local / 2, EP over both nodes"
    );
    let mut c = ep4();
    (
        c.parallel.pp,
        c.parallel.ep,
        c.parallel.dp,
        c.parallel.nodes,
    ) = (4, 2, 2, 4);
    (c.model.layers, c.train.micro_batches, c.train.micro_batch) = (8, 8, 2);
    c.validate().unwrap();
    let p = c.placement();
    assert_eq!(p.len(), 16);
    let mut roles: Vec<(u32, u32, u32)> = p.iter().map(|r| (r.dp, r.pp, r.ep)).collect();
    roles.sort();
    roles.dedup();
    assert_eq!(roles.len(), 16);
    for (i, r) in p.iter().enumerate() {
        assert_eq!(
            (r.device, r.device / 4, r.device % 4),
            (i as u32, r.node, r.local)
        );
        let group: Vec<u32> = p
            .iter()
            .filter(|o| (o.dp, o.pp) == (r.dp, r.pp))
            .map(|o| o.node)
            .collect();
        let mut nodes = group.clone();
        nodes.dedup();
        assert_eq!(
            nodes.len(),
            2,
            "EP group of {r:?} spans ep_nodes = 2 nodes: {group:?}"
        );
    }
}

/// Whatever `TrainConfig::validate` accepts, the MoE layer's own validation accepts too (the
/// trainer never fails late on a size the configuration let through).
#[test]
fn accepted_configs_make_valid_moe_layers() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut accepted = 0;
    for _ in 0..4000 {
        let mut c = ep4();
        let m = &mut c.model;
        m.routed_experts = [4, 6, 8, 16, 32, 64][rng.gen_range(0..6)];
        m.groups = [1, 2, 3, 4, 8, 16, 64][rng.gen_range(0..7)];
        m.topk_groups = rng.gen_range(1..=4);
        m.topk = rng.gen_range(1..=8);
        m.hidden = [128, 256][rng.gen_range(0..2)];
        m.expert_intermediate = [128, 256][rng.gen_range(0..2)];
        let p = &mut c.parallel;
        (p.ep, p.ep_nodes) = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (8, 2)][rng.gen_range(0..6)];
        p.devices_per_node = (p.ep / p.ep_nodes) * 2;
        p.nodes = p.ep_nodes;
        c.train.micro_batch = p.ep * [1, 2][rng.gen_range(0..2)];
        if c.validate().is_ok() {
            accepted += 1;
            let moe = c.moe_config();
            moe.validate().unwrap_or_else(|e| panic!("{c:?}: {e}"));
            assert_eq!(moe.ranks() as u32, c.parallel.ep);
        }
    }
    assert!(accepted > 100, "{accepted} accepted");
}

#[test]
fn example_config_is_the_default() {
    let p =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/train/default.toml");
    assert_eq!(TrainConfig::load(&p).unwrap(), TrainConfig::default());
}

#[test]
fn fingerprint_is_pinned() {
    // the canonical form must not drift between builds (checkpoints would stop loading): a
    // shape spelled out here, independent of the default preset, has this fingerprint forever
    let mut c = ep4();
    (c.model.hidden, c.model.layers, c.model.routed_experts) = (256, 8, 16);
    (
        c.parallel.pp,
        c.parallel.ep,
        c.parallel.ep_nodes,
        c.parallel.nodes,
    ) = (2, 2, 1, 1);
    assert_eq!(c.shape().len(), 28);
    assert_eq!(c.shape()["model.route_scaling"], serde_json::json!(2.5));
    assert_eq!(c.shape()["model.norm_eps"].to_string(), "1e-6");
    assert_eq!(c.fingerprint(), PINNED);
}

/// FNV-1a 64 of the canonical text, computed independently (Python) from
/// `{"model.dense_intermediate":256,...,"model.norm_eps":1e-6,...,"parallel.pp":2}`. Adding a
/// shape field changes every fingerprint (old checkpoints are then refused): update it then.
const PINNED: &str = "cce6260fa12f0c1a";

/// Every (pp, micro-batches) the configuration accepts is a DualPipeV schedule the `pipeline`
/// crate generates and verifies (2 stages per device). The configuration is stricter than the
/// generator (it also refuses odd PP and odd micro-batch counts, as issue 14 asks).
#[test]
fn accepted_pipeline_shapes_schedule() {
    use pipeline::{generate, verify, Method};
    let mut accepted = 0;
    for pp in 1..=6u32 {
        for mb in 1..=14u32 {
            let mut c = ep4();
            (c.parallel.pp, c.parallel.ep, c.parallel.ep_nodes) = (pp, 1, 1);
            (c.parallel.nodes, c.parallel.devices_per_node) = (pp, 1);
            (c.model.layers, c.train.micro_batches, c.train.micro_batch) = (2 * pp, mb, 1);
            let ok = c.validate().is_ok();
            if ok {
                accepted += 1;
                let s = generate(Method::DualPipeV, 2 * pp as usize, mb as usize).unwrap();
                verify(&s).unwrap();
            }
            let generator = generate(Method::DualPipeV, 2 * pp as usize, mb as usize).is_ok();
            assert!(!ok || generator, "pp {pp}, micro-batches {mb}");
            assert_eq!(
                ok,
                pp % 2 == 0 && mb % 2 == 0 && mb >= 2 * pp,
                "pp {pp}, micro-batches {mb}"
            );
        }
    }
    assert!(accepted >= 6);
}

#[test]
fn fingerprint_covers_the_shape_only() {
    let c = ep4();
    let f = c.fingerprint();
    assert_eq!(f.len(), 16);
    assert_eq!(
        TrainConfig::from_toml(&c.to_toml().unwrap())
            .unwrap()
            .fingerprint(),
        f
    );
    let mut t = c.clone();
    (t.train.steps, t.train.seed, t.train.lr.peak, t.device) = (3, 9, 1e-4, DeviceKind::Cuda);
    assert_eq!(
        t.fingerprint(),
        f,
        "training fields are not part of the shape"
    );
    let edits: [fn(&mut TrainConfig); 4] = [
        |c| c.model.hidden = 256,
        |c| c.model.kv_lora_rank = 32,
        |c| c.parallel.ep = 2,
        |c| c.model.route_scaling = 2.0,
    ];
    for e in edits {
        let mut m = c.clone();
        e(&mut m);
        assert_ne!(m.fingerprint(), f);
    }
}

#[test]
fn lr_schedule_warms_up_and_decays() {
    let c = ep4();
    let s = &c.train.lr;
    assert!((c.lr_at(0) - s.peak / s.warmup_steps as f32).abs() < 1e-9);
    assert!((c.lr_at(s.warmup_steps - 1) - s.peak).abs() < 1e-9);
    assert!((c.lr_at(s.warmup_steps) - s.peak).abs() < 1e-9);
    assert!((c.lr_at(c.train.steps) - s.min).abs() < 1e-9);
    let mid = c.lr_at((s.warmup_steps + c.train.steps) / 2);
    assert!(
        (mid - (s.peak + s.min) / 2.0).abs() < 1e-5 * s.peak,
        "{mid}"
    );
}

// ---------------------------------------------------------------- data

#[test]
fn unigram_entropy_matches_hand_computation() {
    // "aab": p = 2/3, 1/3
    let e = data::unigram_entropy(&[97, 97, 98]);
    let want = -(2.0f64 / 3.0 * (2.0f64 / 3.0).ln() + 1.0 / 3.0 * (1.0f64 / 3.0).ln());
    assert!((e.nats - want).abs() < 1e-15, "{} vs {want}", e.nats);
    // 4 equally frequent symbols: exactly 2 bits
    let t: Vec<u32> = b"abcd".repeat(25).iter().map(|&b| b as u32).collect();
    let e = data::unigram_entropy(&t);
    assert!((e.bits - 2.0).abs() < 1e-12 && (e.nats - 4f64.ln()).abs() < 1e-12);
    // one symbol: 0
    assert_eq!(data::unigram_entropy(&[5; 10]).nats, 0.0);
    // cross-entropy of "ac" under "aab" with add-one smoothing over 4 ids: p(a) = 3/7, p(c) = 1/7
    let x = data::unigram_cross_entropy(&[0, 0, 1], &[0, 2], 4);
    let want = -((3.0f64 / 7.0).ln() + (1.0f64 / 7.0).ln()) / 2.0;
    assert!((x.nats - want).abs() < 1e-15, "{} vs {want}", x.nats);
}

#[test]
fn builtin_corpus_splits_per_document() {
    let c = data::builtin_corpus();
    assert_eq!(c.docs.len(), data::builtin_names().len());
    assert!(c.len() > 100_000 && c.len() < 400_000, "{} bytes", c.len());
    let s = c.split(128).unwrap();
    assert_eq!(s.train.len() + s.valid.len(), c.len());
    // 10% of each document, rounded down per document
    assert!(s.valid.len() + c.docs.len() >= c.len() / 10 && s.valid.len() < c.len() / 5);
    // the validation stream ends with the last document's tail
    let last = c.docs.last().unwrap();
    assert!(last.ends_with(&s.valid[s.valid.len() - 100..]));
    let e = data::unigram_entropy(&s.train);
    assert!(
        e.bits > 3.5 && e.bits < 6.0,
        "unigram entropy {} bits",
        e.bits
    );
    let x = data::unigram_cross_entropy(&s.train, &s.valid, c.vocab);
    assert!(
        x.nats > e.nats - 0.2 && x.nats < e.nats + 0.5,
        "{x:?} vs {e:?}"
    );
    assert_eq!(c.fingerprint(), data::builtin_corpus().fingerprint());
    let mut other = c.clone();
    other.docs[0][0] ^= 1;
    assert_ne!(other.fingerprint(), c.fingerprint());
    println!(
        "validation cross-entropy under the training unigram: {:.4} bits = {:.4} nats",
        x.bits, x.nats
    );
    println!(
        "built-in corpus: {} bytes, train {}, valid {}, unigram entropy {:.4} bits = {:.4} nats",
        c.len(),
        s.train.len(),
        s.valid.len(),
        e.bits,
        e.nats
    );
}

#[test]
fn sampler_is_deterministic_and_covers_an_epoch() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let tokens: Vec<u32> = (0..1000).map(|_| rng.gen_range(0..256)).collect();
    let (l, b) = (16, 3);
    let mut s1 = Sampler::new(&tokens, l, b, 42).unwrap();
    let mut s2 = Sampler::new(&tokens, l, b, 42).unwrap();
    let mut s3 = Sampler::new(&tokens, l, b, 43).unwrap();
    let chunks = s1.chunks();
    assert_eq!(chunks, 999usize.div_ceil(l));
    let mut covered = vec![0u32; tokens.len()];
    let mut differs = false;
    let batches = chunks.div_ceil(b);
    let mut saved = None;
    for i in 0..batches {
        if i == 5 {
            saved = Some(s1.state());
        }
        let (x, y, z) = (s1.next_batch(), s2.next_batch(), s3.next_batch());
        assert_eq!(x, y);
        differs |= x.chunks != z.chunks;
        for (row, k) in x.chunks.iter().enumerate() {
            let k = k.unwrap();
            for p in 0..l {
                let (inp, lab) = (x.inputs[row * l + p], x.labels[row * l + p]);
                let pos = k * l + p + 1; // the label's position in the stream
                if pos < tokens.len() {
                    assert_eq!((inp, lab), (tokens[pos - 1], tokens[pos] as i32));
                    if i * b + row < chunks {
                        covered[pos] += 1;
                    }
                } else {
                    assert_eq!((inp, lab), (0, IGNORE_INDEX));
                }
            }
        }
    }
    assert!(differs, "another seed gives another order");
    assert_eq!(covered[0], 0);
    assert!(
        covered[1..].iter().all(|&c| c == 1),
        "every label exactly once per epoch"
    );
    // resuming from a saved state continues identically
    let mut r = Sampler::resume(&tokens, l, b, saved.unwrap()).unwrap();
    let mut fresh = Sampler::new(&tokens, l, b, 42).unwrap();
    for _ in 0..5 {
        fresh.next_batch();
    }
    for _ in 0..30 {
        assert_eq!(r.next_batch(), fresh.next_batch());
    }
    assert!(matches!(
        Sampler::new(&tokens[..10], 16, 1, 0),
        Err(DataError::TooSmall { .. })
    ));
}

#[test]
fn eval_batches_use_every_token_once() {
    let tokens: Vec<u32> = (0..100).map(|i| (i * 7 % 256) as u32).collect();
    let bs = data::eval_batches(&tokens, 8, 4).unwrap();
    let labels: Vec<i32> = bs
        .iter()
        .flat_map(|b| b.labels.iter().copied())
        .filter(|&l| l != IGNORE_INDEX)
        .collect();
    let want: Vec<i32> = tokens[1..].iter().map(|&t| t as i32).collect();
    assert_eq!(labels, want);
    assert!(bs
        .iter()
        .all(|b| b.inputs.len() == 32 && b.labels.len() == 32));
    assert_eq!(bs.iter().map(|b| b.label_count()).sum::<usize>(), 99);
}

#[test]
fn npy_token_files() {
    let d = scratch("npy");
    let ids: Vec<i32> = (0..600).map(|i| i * 31 % 300).collect();
    let raw: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = d.join("t.npy");
    std::fs::write(&p, npy::encode("<i4", &[20, 30], &raw)).unwrap();
    let c = data::load_file(&p, 300).unwrap();
    assert_eq!(c.docs[0], ids.iter().map(|&v| v as u32).collect::<Vec<_>>());
    // an id outside the vocabulary is named with its index
    match data::load_file(&p, 299) {
        Err(DataError::Vocab { index, id: 299, .. }) => assert_eq!(ids[index], 299),
        r => panic!("{r:?}"),
    }
    let u16s: Vec<u8> = [1u16, 2, 65535]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(
        npy::tokens(&npy::encode("<u2", &[3], &u16s), 65536).unwrap(),
        [1, 2, 65535]
    );
    let neg: Vec<u8> = [3i16, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        npy::tokens(&npy::encode("<i2", &[2], &neg), 10),
        Err(npy::NpyError::Vocab { index: 1, id: -1 })
    );
    let bad = |descr: &str, shape: &[usize], data: &[u8], needle: &str| {
        std::fs::write(&p, npy::encode(descr, shape, data)).unwrap();
        let e = data::load_file(&p, 1 << 20).unwrap_err();
        assert!(
            matches!(e, DataError::Npy { .. }) && e.to_string().contains(needle),
            "{e}"
        );
    };
    bad("<f4", &[2], &[0; 8], "not an integer");
    bad(">i4", &[2], &[0; 8], "not little-endian");
    bad("<i4", &[3], &[0; 8], "promises 3 elements");
    bad("<i4", &[1], &[0; 8], "holds 8 data bytes");
    std::fs::write(&p, b"\x93NUMP").unwrap();
    assert!(data::load_file(&p, 256).is_err());
    // any other file is bytes
    let t = d.join("t.txt");
    std::fs::write(&t, "héllo").unwrap();
    let c = data::load_file(&t, 256).unwrap();
    assert_eq!(
        c.docs[0],
        "héllo".bytes().map(u32::from).collect::<Vec<_>>()
    );
    assert!(matches!(data::load_file(&t, 100), Err(DataError::Shape(_))));
    assert!(matches!(c.split(8), Err(DataError::TooSmall { .. })));
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------- checkpoint

fn random_checkpoint(seed: u64) -> Checkpoint {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut ck = Checkpoint::new(&ep4(), 17);
    ck.rng = vec![rng.gen(), rng.gen(), u64::MAX];
    for (i, shape) in [vec![3, 5], vec![128], vec![2, 3, 4], vec![0]]
        .into_iter()
        .enumerate()
    {
        let n: usize = shape.iter().product();
        // any bit pattern, NaN payloads and -0.0 included: the round trip must keep the bits
        let f: Vec<f32> = (0..n).map(|_| f32::from_bits(rng.gen())).collect();
        let h: Vec<bf16> = (0..n).map(|_| bf16::from_bits(rng.gen())).collect();
        ck.params.insert(
            format!("layer.{i}.w"),
            Tensor {
                shape: shape.clone(),
                data: TensorData::F32(f),
            },
        );
        ck.optimizer.insert(
            format!("layer.{i}.w/m"),
            Tensor {
                shape,
                data: TensorData::Bf16(h),
            },
        );
    }
    ck.meta
        .insert("corpus".into(), serde_json::json!("built-in"));
    ck
}

fn bits(ck: &Checkpoint) -> Vec<(String, Vec<usize>, Vec<u32>)> {
    ck.params
        .iter()
        .chain(&ck.optimizer)
        .map(|(n, t)| {
            let b = match &t.data {
                TensorData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
                TensorData::Bf16(v) => v.iter().map(|x| x.to_bits() as u32).collect(),
            };
            (n.clone(), t.shape.clone(), b)
        })
        .collect()
}

#[test]
fn checkpoint_round_trip_is_bit_exact() {
    let d = scratch("ck");
    let p = d.join("run.ckpt");
    checkpoint::preflight(&p).unwrap();
    let ck = random_checkpoint(3);
    checkpoint::save(&p, &ck).unwrap();
    let back = checkpoint::load(&p).unwrap();
    assert_eq!(bits(&back), bits(&ck));
    assert_eq!(
        (back.step, &back.rng, &back.meta, &back.fingerprint),
        (ck.step, &ck.rng, &ck.meta, &ck.fingerprint)
    );
    back.check_config(&ep4()).unwrap();
    assert!(!model::atomic::temp_path(&p).exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn corrupt_or_truncated_checkpoints_are_refused() {
    let d = scratch("ckbad");
    let p = d.join("run.ckpt");
    checkpoint::save(&p, &random_checkpoint(4)).unwrap();
    let good = std::fs::read(&p).unwrap();
    // every single flipped byte is detected (magic, version, lengths, header, data, checksum)
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] ^= 0x20;
        assert!(
            checkpoint::decode(&b, "x").is_err(),
            "flipped byte {i} went unnoticed"
        );
    }
    for cut in [
        0,
        7,
        19,
        20,
        100,
        good.len() / 2,
        good.len() - 5,
        good.len() - 1,
    ] {
        let e = checkpoint::decode(&good[..cut], "x").unwrap_err();
        assert!(
            matches!(
                e,
                CheckpointError::Truncated { .. } | CheckpointError::Corrupt { .. }
            ),
            "cut {cut}: {e}"
        );
    }
    let e = checkpoint::decode(&good[..good.len() - 1], "x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("truncated") || e.contains("checksum"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn checkpoint_of_another_config_is_refused_naming_fields() {
    let ck = random_checkpoint(5);
    let mut c = ep4();
    c.model.hidden = 256;
    c.parallel.ep = 2;
    c.train.steps = 1; // not part of the shape
    match ck.check_config(&c) {
        Err(CheckpointError::ConfigMismatch(m)) => {
            let f: Vec<&str> = m.iter().map(|m| m.field.as_str()).collect();
            assert_eq!(f, ["model.hidden", "parallel.ep"]);
            assert_eq!(
                (m[0].checkpoint.as_str(), m[0].current.as_str()),
                ("128", "256")
            );
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn failed_save_keeps_the_previous_checkpoint() {
    let d = scratch("ckfail");
    let p = d.join("run.ckpt");
    checkpoint::save(&p, &random_checkpoint(6)).unwrap();
    let before = std::fs::read(&p).unwrap();
    // the temporary's name is taken by a directory: the save fails before touching `p`
    std::fs::create_dir(model::atomic::temp_path(&p)).unwrap();
    assert!(matches!(
        checkpoint::save(&p, &random_checkpoint(7)),
        Err(CheckpointError::Io(_))
    ));
    assert_eq!(std::fs::read(&p).unwrap(), before);
    std::fs::remove_dir(model::atomic::temp_path(&p)).unwrap();
    // a tensor whose shape does not hold its data is refused before writing
    let mut bad = random_checkpoint(8);
    bad.params.get_mut("layer.0.w").unwrap().shape = vec![4, 4];
    assert!(matches!(
        checkpoint::save(&p, &bad),
        Err(CheckpointError::Tensor { .. })
    ));
    assert_eq!(std::fs::read(&p).unwrap(), before);
    assert!(checkpoint::preflight(&d.join("no/such/dir.ckpt")).is_err());
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------- plot, trace

#[test]
fn loss_curve_svg_and_png() {
    use model::plot::LossCurve;
    let d = scratch("plot");
    let train: Vec<(u32, f64)> = (0..50)
        .map(|s| (s, 5.5 * (-(s as f64) / 20.0).exp() + 1.5))
        .collect();
    let valid: Vec<(u32, f64)> = (0..=5)
        .map(|i| (i * 10, 5.5 * (-(i as f64) / 2.0).exp() + 1.7))
        .collect();
    let curve = LossCurve {
        title: "a < b".into(),
        train,
        valid,
        reference: Some(("unigram".into(), 3.3)),
    };
    let svg = curve.svg().unwrap();
    assert_eq!(svg.matches("<polyline").count(), 2);
    let pts: Vec<usize> = svg
        .lines()
        .filter(|l| l.starts_with("<polyline"))
        .map(|l| {
            l.split("points=\"")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .count()
        })
        .collect();
    assert_eq!(pts, [50, 6]);
    assert!(svg.contains("a &lt; b") && svg.contains("unigram (3.300)"));
    curve.write_svg(&d.join("loss.svg")).unwrap();
    curve.write_png(&d.join("loss.png")).unwrap();
    let dec = png::Decoder::new(std::fs::File::open(d.join("loss.png")).unwrap());
    let mut r = dec.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (800, 480));
    let px = |c: &[u8]| buf.chunks(3).filter(|p| p == &c).count();
    assert!(px(&[31, 94, 191]) > 50, "train curve drawn in blue");
    assert!(px(&[191, 56, 43]) > 20, "validation curve drawn in red");
    let nan = LossCurve {
        train: vec![(0, f64::NAN)],
        ..Default::default()
    };
    assert!(nan.svg().is_err() && nan.png().is_err());
    assert!(LossCurve::default().svg().is_err());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn trace_keeps_the_moe_format_and_names_partitions() {
    use model::moe::{Span, TraceSpan};
    use model::trace::{Trace, Track};
    use std::time::{Duration, Instant};
    let t0 = Instant::now();
    let at = |a: u64, b: u64| Span {
        start: t0 + Duration::from_micros(a),
        end: t0 + Duration::from_micros(b),
    };
    let spans = vec![
        TraceSpan {
            name: "ep_dispatch".into(),
            device: 1,
            stream: "comm",
            span: at(10, 30),
        },
        TraceSpan {
            name: "gemm".into(),
            device: 0,
            stream: "compute",
            span: at(5, 50),
        },
    ];
    // the format `ptxforge moe --trace` wrote before the writer moved here
    let legacy: Vec<serde_json::Value> = spans.iter().map(|s| {
        let ts = s.span.start.duration_since(t0).as_secs_f64() * 1e6;
        serde_json::json!({"name": s.name, "ph": "X", "ts": ts, "dur": s.span.secs() * 1e6, "pid": s.device, "tid": s.stream})
    }).collect();
    let legacy = serde_json::to_string(&serde_json::json!({"traceEvents": legacy})).unwrap();
    let t = Trace::from_spans(t0, &spans);
    assert_eq!(t.to_json().to_string(), legacy);
    let d = scratch("trace");
    let p = d.join("t.json");
    t.write(&p).unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), legacy);
    let mut t = Trace::new();
    t.device_names.push((3, "device 3 (node 0)".into()));
    t.push(
        "combine",
        Track {
            device: 3,
            stream: "comm".into(),
            partition: Some("SMs 112..131".into()),
        },
        1.0,
        2.5,
    );
    let v = t.to_json();
    let ev = v["traceEvents"].as_array().unwrap();
    assert_eq!(ev[0]["ph"], "M");
    assert_eq!(ev[0]["args"]["name"], "device 3 (node 0)");
    assert_eq!(
        (
            ev[1]["tid"].as_str(),
            ev[1]["pid"].as_u64(),
            ev[1]["dur"].as_f64()
        ),
        (Some("comm [SMs 112..131]"), Some(3), Some(2.5))
    );
    let _ = std::fs::remove_dir_all(&d);
}
