//! The constraints of [`TrainConfig`]: each check names the field it rejects and why. All
//! violations are collected, so one run of `validate` reports every problem at once.

use super::TrainConfig;

/// One rejected field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field}: {msg}")]
pub struct FieldError {
    /// `section.field`, e.g. `model.heads`.
    pub field: String,
    pub msg: String,
}

struct Errs(Vec<FieldError>);

impl Errs {
    fn fail(&mut self, field: &str, msg: String) {
        self.0.push(FieldError {
            field: field.to_string(),
            msg,
        });
    }
    fn ensure(&mut self, ok: bool, field: &str, msg: impl FnOnce() -> String) {
        if !ok {
            self.fail(field, msg());
        }
    }
    fn positive_multiple(&mut self, field: &str, v: u32, of: u32, why: &str) {
        self.ensure(v > 0 && v.is_multiple_of(of), field, || {
            format!("{v} is not a positive multiple of {of} ({why})")
        });
    }
    fn head_dim(&mut self, field: &str, v: u32) {
        self.ensure(
            v.is_multiple_of(16) && (32..=256).contains(&v),
            field,
            || {
                format!(
                    "{v} must be a multiple of 16 in 32..=256 (the attention kernels' head dims)"
                )
            },
        );
    }
    fn unit(&mut self, field: &str, v: f32, lo: f32, hi: f32) {
        self.ensure(v.is_finite() && v >= lo && v < hi, field, || {
            format!("{v} is not in [{lo}, {hi})")
        });
    }
    fn positive(&mut self, field: &str, v: f32) {
        self.ensure(v.is_finite() && v > 0.0, field, || {
            format!("{v} must be positive and finite")
        });
    }
}

pub(super) fn check(c: &TrainConfig) -> Vec<FieldError> {
    let mut e = Errs(Vec::new());
    model_sizes(c, &mut e);
    experts(c, &mut e);
    parallel(c, &mut e);
    training(c, &mut e);
    e.0
}

fn model_sizes(c: &TrainConfig, e: &mut Errs) {
    let m = &c.model;
    e.ensure(m.vocab >= 2, "model.vocab", || {
        format!("{} token ids are too few", m.vocab)
    });
    let fp8 = "FP8 GEMM blocks of 128";
    e.positive_multiple("model.hidden", m.hidden, 128, fp8);
    e.positive_multiple("model.expert_intermediate", m.expert_intermediate, 128, fp8);
    // the MTP block's FFN is dense too
    if m.dense_layers > 0 || m.mtp_depth > 0 {
        e.positive_multiple("model.dense_intermediate", m.dense_intermediate, 128, fp8);
    }
    e.ensure(
        m.heads > 0 && m.hidden.is_multiple_of(m.heads.max(1)),
        "model.heads",
        || format!("{} heads do not divide hidden {}", m.heads, m.hidden),
    );
    let bf16 = "BF16 MMA tiles of 16";
    e.positive_multiple("model.q_lora_rank", m.q_lora_rank, 16, bf16);
    e.positive_multiple("model.kv_lora_rank", m.kv_lora_rank, 16, bf16);
    e.positive_multiple("model.qk_nope_head_dim", m.qk_nope_head_dim, 16, bf16);
    e.positive_multiple("model.qk_rope_head_dim", m.qk_rope_head_dim, 16, bf16);
    e.head_dim(
        "model.qk_nope_head_dim + model.qk_rope_head_dim",
        m.qk_nope_head_dim + m.qk_rope_head_dim,
    );
    e.head_dim("model.v_head_dim", m.v_head_dim);
    e.ensure(m.layers > 0, "model.layers", || {
        "needs at least one layer".into()
    });
    e.ensure(m.dense_layers <= m.layers, "model.dense_layers", || {
        format!(
            "{} dense layers exceed the {} layers",
            m.dense_layers, m.layers
        )
    });
    e.ensure(m.mtp_depth <= 1, "model.mtp_depth", || {
        format!(
            "{} is not 0 or 1 (one MTP module, as V3, is the deepest built)",
            m.mtp_depth
        )
    });
    e.positive("model.rope_theta", m.rope_theta);
    e.positive("model.norm_eps", m.norm_eps);
}

fn experts(c: &TrainConfig, e: &mut Errs) {
    let m = &c.model;
    if m.dense_layers == m.layers {
        return; // no MoE layer: the expert fields are unused
    }
    e.ensure(m.routed_experts > 0, "model.routed_experts", || {
        "an MoE layer needs routed experts".into()
    });
    e.ensure(m.shared_experts <= 1, "model.shared_experts", || {
        format!("{} is not 0 or 1", m.shared_experts)
    });
    let ep = c.parallel.ep.max(1);
    e.ensure(
        m.routed_experts.is_multiple_of(ep),
        "model.routed_experts",
        || format!("{} experts are not divisible by EP {ep}", m.routed_experts),
    );
    e.ensure(
        m.topk >= 1 && m.topk <= m.routed_experts,
        "model.topk",
        || format!("top-{} of {} experts", m.topk, m.routed_experts),
    );
    e.ensure(
        m.groups > 0 && m.routed_experts.is_multiple_of(m.groups.max(1)),
        "model.groups",
        || {
            format!(
                "{} groups do not divide {} experts",
                m.groups, m.routed_experts
            )
        },
    );
    let per_group = m.routed_experts / m.groups.max(1);
    e.ensure(m.groups <= 32 && per_group >= 2, "model.groups", || {
        format!(
            "{} groups of {per_group} experts: at most 32 groups of at least 2 (group scores \
             sum each group's top 2)",
            m.groups
        )
    });
    e.ensure(
        m.topk_groups >= 1 && m.topk_groups <= m.groups,
        "model.topk_groups",
        || format!("{} of {} groups", m.topk_groups, m.groups),
    );
    let reachable = m.topk_groups * (m.routed_experts / m.groups.max(1));
    e.ensure(m.topk <= reachable, "model.topk", || {
        format!(
            "top-{} exceeds the {reachable} experts in {} groups",
            m.topk, m.topk_groups
        )
    });
    e.positive("model.route_scaling", m.route_scaling);
}

fn parallel(c: &TrainConfig, e: &mut Errs) {
    let p = &c.parallel;
    e.ensure(p.pp >= 2 && p.pp.is_multiple_of(2), "parallel.pp", || {
        format!("{} must be even and at least 2 (DualPipeV)", p.pp)
    });
    e.ensure(p.ep >= 1, "parallel.ep", || "must be at least 1".into());
    e.ensure(p.dp >= 1, "parallel.dp", || "must be at least 1".into());
    let devices = p.nodes as u64 * p.devices_per_node as u64;
    let used = p.pp as u64 * p.ep as u64 * p.dp as u64;
    e.ensure(devices > 0 && devices == used, "parallel.nodes", || {
        format!(
            "{} nodes x {} devices = {devices}, but pp x ep x dp = {used}",
            p.nodes, p.devices_per_node
        )
    });
    let span = p.ep_nodes.max(1);
    e.ensure(
        p.ep_nodes >= 1
            && p.ep.is_multiple_of(span)
            && p.nodes.is_multiple_of(span)
            && p.devices_per_node.is_multiple_of((p.ep / span).max(1)),
        "parallel.ep_nodes",
        || {
            format!(
                "an EP group of {} over {} nodes needs ep and nodes divisible by it and \
                 devices_per_node {} divisible by ep / ep_nodes",
                p.ep, p.ep_nodes, p.devices_per_node
            )
        },
    );
    e.ensure(
        p.comm_sms >= 2 && p.comm_sms.is_multiple_of(2),
        "parallel.comm_sms",
        || format!("{} must be even and at least 2", p.comm_sms),
    );
    let chunks = 2 * p.pp.max(1);
    e.ensure(
        c.model.layers.is_multiple_of(chunks),
        "model.layers",
        || {
            format!(
                "{} layers do not split into the {chunks} DualPipeV stages of pp {} (2 per device)",
                c.model.layers, p.pp
            )
        },
    );
}

fn training(c: &TrainConfig, e: &mut Errs) {
    let (t, p) = (&c.train, &c.parallel);
    e.ensure(t.seq_len >= 2, "train.seq_len", || {
        format!("{} is too short to predict a next token", t.seq_len)
    });
    let ep = p.ep.max(1);
    e.ensure(
        t.micro_batch > 0 && t.micro_batch % ep == 0,
        "train.micro_batch",
        || {
            format!(
                "{} sequences do not spread evenly over EP {ep}",
                t.micro_batch
            )
        },
    );
    let per_rank = t.seq_len as u64 * (t.micro_batch / ep) as u64;
    e.ensure(
        per_rank > 0 && per_rank.is_multiple_of(128),
        "train.seq_len",
        || {
            format!(
            "seq_len x micro_batch / ep = {per_rank} tokens per EP rank is not a multiple of 128 \
             (FP8 1x128 activation blocks along tokens)"
        )
        },
    );
    let min = 2 * p.pp.max(1);
    e.ensure(
        t.micro_batches >= min && t.micro_batches % 2 == 0,
        "train.micro_batches",
        || {
            format!(
                "{} must be even and at least 2 x pp = {min} (DualPipeV)",
                t.micro_batches
            )
        },
    );
    e.ensure(t.steps >= 1, "train.steps", || "must be at least 1".into());
    e.ensure(t.eval_every >= 1, "train.eval_every", || {
        "must be at least 1".into()
    });
    e.positive("train.lr.peak", t.lr.peak);
    e.ensure(
        t.lr.min.is_finite() && t.lr.min >= 0.0 && t.lr.min <= t.lr.peak,
        "train.lr.min",
        || format!("{} is not in [0, peak {}]", t.lr.min, t.lr.peak),
    );
    e.unit("train.adam_beta1", t.adam_beta1, 0.0, 1.0);
    e.unit("train.adam_beta2", t.adam_beta2, 0.0, 1.0);
    e.positive("train.adam_eps", t.adam_eps);
    e.unit("train.weight_decay", t.weight_decay, 0.0, 1.0);
    e.positive("train.grad_clip", t.grad_clip);
    e.unit("train.bias_update_speed", t.bias_update_speed, 0.0, 1.0);
    e.unit("train.mtp_loss_weight", t.mtp_loss_weight, 0.0, 10.0);
}
