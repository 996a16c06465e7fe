//! Registry entries of the training-step kernels: one [`KernelInfo`] per emitted kernel, with
//! [`TrainKernel`] as its kind. A kernel that is one launch of a multi-launch host wrapper
//! (RMSNorm backward, cross-entropy, gradient norm + AdamW) is checked through that wrapper.
//!
//! Shape convention (`Shape { m, n, k }`): norm m = rows, k = H; rope m = tokens, n = heads,
//! k = rope dim; xent m = tokens, k = vocab; optim m = elements (split over n tensors for the
//! norm); bias update m = experts; norm combine m = groups; embed m = tokens, n = vocabulary, k = H.

use super::{
    balance, count, embed, norm, ops, optim, relayout, rope, xent, OpCheck, TRAIN_TARGETS,
};
use crate::quant::QUANT_TARGETS;
use crate::registry::{CheckReport, KernelInfo, Kind, ParamInfo, Shape};
use crate::{Result, ScaleMode};
use builder::Target;
use runtime::Stream;

/// The training-step kernels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TrainKernel {
    NormFwd(norm::NormOut),
    NormBwdDx,
    NormBwdDwPartial,
    NormDwReduce,
    RopeFwd,
    RopeBwd,
    XentFwd { bf16: bool },
    XentBwd { bf16: bool },
    XentMean,
    GradSumsq,
    GradNorm,
    AdamW,
    BiasUpdate,
    NormCombine,
    EmbedFwd { bf16: bool },
    EmbedBwd { bf16: bool },
    Add,
    AddF32,
    Cvt { to_bf16: bool },
    Transpose { bf16: bool },
    TransposeF32,
    HeadSum,
    TopkSlotMask,
    TopkSlotAcc,
    ExpertCount,
    SumF64,
}

impl TrainKernel {
    /// Generates the kernel for `t`.
    pub fn generate(&self, t: &Target) -> Result<ptx::Module> {
        use TrainKernel::*;
        match *self {
            NormFwd(o) => norm::gen_rmsnorm_fwd(t, o),
            NormBwdDx => norm::gen_rmsnorm_bwd_dx(t),
            NormBwdDwPartial => norm::gen_rmsnorm_bwd_dw_partial(t),
            NormDwReduce => norm::gen_dw_reduce(t),
            RopeFwd => rope::gen_rope(t, rope::RopeDir::Forward),
            RopeBwd => rope::gen_rope(t, rope::RopeDir::Backward),
            XentFwd { bf16 } => xent::gen_xent_fwd(t, bf16),
            XentBwd { bf16 } => xent::gen_xent_bwd(t, bf16),
            XentMean => xent::gen_xent_mean(t),
            GradSumsq => optim::gen_grad_sumsq(t),
            GradNorm => optim::gen_grad_norm(t),
            AdamW => optim::gen_adamw(t),
            BiasUpdate => balance::gen_bias_update(t),
            NormCombine => balance::gen_norm_combine(t),
            EmbedFwd { bf16 } => embed::gen_embed_fwd(t, bf16),
            EmbedBwd { bf16 } => embed::gen_embed_bwd(t, bf16),
            Add => ops::gen_add(t),
            AddF32 => ops::gen_add_f32(t),
            Cvt { to_bf16 } => ops::gen_cvt(t, to_bf16),
            Transpose { bf16 } => ops::gen_transpose(t, bf16),
            TransposeF32 => relayout::gen_transpose_f32(t),
            HeadSum => ops::gen_head_sum(t),
            TopkSlotMask => ops::gen_slot_mask(t),
            TopkSlotAcc => ops::gen_slot_acc(t),
            ExpertCount => count::gen_count(t),
            SumF64 => count::gen_sum_f64(t),
        }
    }

    /// Runs the kernel's host wrapper at `s` on fresh random inputs against the f64 reference.
    pub fn check(&self, st: &Stream, s: &Shape, seed: u64) -> Result<OpCheck> {
        use TrainKernel::*;
        match *self {
            NormFwd(o) => norm::check_fwd(st, s.m, s.k, o, seed),
            NormBwdDx | NormBwdDwPartial | NormDwReduce => norm::check_bwd(st, s.m, s.k, seed),
            RopeFwd => rope::check_rope(st, s.m, s.n, s.k, rope::RopeDir::Forward, seed),
            RopeBwd => rope::check_rope(st, s.m, s.n, s.k, rope::RopeDir::Backward, seed),
            XentFwd { bf16 } | XentBwd { bf16 } => xent::check_xent(st, s.m, s.k, bf16, seed),
            XentMean => xent::check_xent(st, s.m, s.k, true, seed),
            GradSumsq | GradNorm | AdamW => optim::check_step(st, s.m, s.n, seed),
            BiasUpdate => balance::check_bias_update(st, s.m, seed),
            NormCombine => balance::check_norm_combine(st, s.m, seed),
            EmbedFwd { bf16 } => embed::check_fwd(st, s.m, s.n, s.k, bf16, seed),
            EmbedBwd { bf16 } => embed::check_bwd(st, s.m, s.n, s.k, bf16, seed),
            Add | AddF32 | Cvt { .. } => ops::check_elementwise(st, s.m, seed),
            Transpose { bf16 } => ops::check_transpose(st, s.m, s.k, bf16, seed),
            TransposeF32 => relayout::check_transpose_f32(st, s.m, s.k, seed),
            HeadSum => ops::check_head_sum(st, s.m, s.n, s.k, seed),
            TopkSlotMask | TopkSlotAcc => ops::check_topk_slots(st, s.m, s.k, s.n, seed),
            ExpertCount => count::check_count(st, s.m, s.n, seed),
            SumF64 => count::check_sum_f64(st, s.m, seed),
        }
    }
}

/// A [`CheckReport`] from an [`OpCheck`] (mismatches = elements outside their bound;
/// `rel_err_rounded` carries the worst error/bound ratio).
pub(crate) fn report(
    info: &KernelInfo,
    k: &TrainKernel,
    st: &Stream,
    s: &Shape,
    seed: u64,
) -> Result<CheckReport> {
    let c = k.check(st, s, seed)?;
    Ok(CheckReport {
        kernel: info.name.clone(),
        shape: *s,
        mismatches: c.mismatches,
        rel_err: c.rel_fro,
        rel_err_rounded: c.worst,
        // element-wise relative errors: not computed by this checker
        max_rel_err: f64::NAN,
        mean_rel_err: f64::NAN,
        tolerance: 0.0,
        pass: c.mismatches == 0,
        seconds: c.seconds,
        flops: 0.0,
        lane_instructions: c.lane_instructions,
    })
}

fn p(v: &[(&'static str, &'static str)]) -> Vec<ParamInfo> {
    v.iter().map(|&(name, ty)| ParamInfo { name, ty }).collect()
}

struct E {
    name: &'static str,
    summary: &'static str,
    params: &'static [(&'static str, &'static str)],
    launch: &'static str,
    host: &'static str,
    shapes: Vec<Shape>,
    kind: TrainKernel,
}

/// Every training-step kernel's registry entry.
pub fn entries() -> Vec<KernelInfo> {
    let mut v = norm_entries();
    v.extend(rest_entries());
    v.into_iter()
        .map(|e| {
            let fp8 = matches!(e.kind, TrainKernel::NormFwd(norm::NormOut::Fp8(_)));
            KernelInfo {
                name: e.name.to_string(),
                summary: e.summary.to_string(),
                params: p(e.params),
                launch: e.launch.to_string(),
                targets: if fp8 { QUANT_TARGETS } else { TRAIN_TARGETS },
                host: e.host,
                test_shapes: e.shapes,
                kind: Kind::Train(e.kind),
            }
        })
        .collect()
}

const NORM_FWD_LAUNCH: &str = "grid = ceil(rows/4), block = 128 (warp per row)";

fn norm_entries() -> Vec<E> {
    use norm::NormOut;
    let sh = || vec![Shape::new(13, 0, 264), Shape::new(4, 0, 7168)];
    let sh8 = || vec![Shape::new(9, 0, 384), Shape::new(4, 0, 7168)];
    let fwd = |o: NormOut, summary, params| E {
        name: norm::fwd_name(o),
        summary,
        params,
        launch: NORM_FWD_LAUNCH,
        host: if o == NormOut::Bf16 {
            "rmsnorm_fwd"
        } else {
            "rmsnorm_fwd_fp8"
        },
        shapes: if o == NormOut::Bf16 { sh() } else { sh8() },
        kind: TrainKernel::NormFwd(o),
    };
    const FP8P: &[(&str, &str)] = &[
        ("x", "bf16*"),
        ("w", "f32*"),
        ("q", "e4m3*"),
        ("s", "f32*"),
        ("rstd", "f32*"),
        ("rows", "u32"),
        ("h", "u32"),
        ("eps", "f32"),
    ];
    vec![
        fwd(
            NormOut::Bf16,
            "RMSNorm forward, bf16 x -> bf16 y (f32 weight and math) + rstd",
            &[
                ("x", "bf16*"),
                ("w", "f32*"),
                ("y", "bf16*"),
                ("rstd", "f32*"),
                ("rows", "u32"),
                ("h", "u32"),
                ("eps", "f32"),
            ],
        ),
        fwd(
            NormOut::Fp8(ScaleMode::Float),
            "RMSNorm forward fused with FP8 1x128 quantisation of y (float scales) + rstd",
            FP8P,
        ),
        fwd(
            NormOut::Fp8(ScaleMode::Pow2),
            "RMSNorm forward fused with FP8 1x128 quantisation of y (pow2 scales) + rstd",
            FP8P,
        ),
        E {
            name: norm::BWD_DX_NAME,
            summary: "RMSNorm backward dx (bf16), warp per row",
            params: &[
                ("x", "bf16*"),
                ("w", "f32*"),
                ("dy", "bf16*"),
                ("rstd", "f32*"),
                ("dx", "bf16*"),
                ("rows", "u32"),
                ("h", "u32"),
            ],
            launch: NORM_FWD_LAUNCH,
            host: "rmsnorm_bwd",
            shapes: sh(),
            kind: TrainKernel::NormBwdDx,
        },
        E {
            name: norm::BWD_DW_PARTIAL_NAME,
            summary: "RMSNorm backward dweight partials over 32-row blocks (deterministic)",
            params: &[
                ("x", "bf16*"),
                ("dy", "bf16*"),
                ("rstd", "f32*"),
                ("part", "f32*"),
                ("rows", "u32"),
                ("h", "u32"),
            ],
            launch: "grid = (ceil(h/256), ceil(rows/32)), block = 128",
            host: "rmsnorm_bwd",
            shapes: vec![Shape::new(70, 0, 264)],
            kind: TrainKernel::NormBwdDwPartial,
        },
        E {
            name: norm::DW_REDUCE_NAME,
            summary: "RMSNorm dweight: fixed-order sum of the 32-row partials",
            params: &[
                ("part", "f32*"),
                ("dw", "f32*"),
                ("nparts", "u32"),
                ("h", "u32"),
                ("accumulate", "u32"),
            ],
            launch: "grid = ceil(h/256), block = 256",
            host: "rmsnorm_bwd",
            shapes: vec![Shape::new(70, 0, 264)],
            kind: TrainKernel::NormDwReduce,
        },
    ]
}

const ROPE_P: &[(&str, &str)] = &[
    ("x", "bf16* (in place)"),
    ("pos", "i32*"),
    ("cos", "f32*"),
    ("sin", "f32*"),
    ("tokens", "u32"),
    ("heads", "u32"),
    ("row_stride", "u32"),
    ("head_stride", "u32"),
    ("col0", "u32"),
    ("half", "u32"),
];
const XENT_FWD_P: &[(&str, &str)] = &[
    ("logits", "bf16*|f32*"),
    ("labels", "i32*"),
    ("loss", "f32*"),
    ("lse", "f32*"),
    ("v", "u32"),
    ("ignore", "i32"),
    ("smoothing", "f32"),
];
const XENT_BWD_P: &[(&str, &str)] = &[
    ("logits", "bf16*|f32*"),
    ("labels", "i32*"),
    ("lse", "f32*"),
    ("dloss", "f32* (0 = scalar)"),
    ("dloss_scale", "f32"),
    ("dlogits", "bf16*|f32*"),
    ("v", "u32"),
    ("ignore", "i32"),
    ("smoothing", "f32"),
];
const EMBED_FWD_P: &[(&str, &str)] = &[
    ("table", "bf16*|f32*"),
    ("ids", "i32*"),
    ("out", "bf16*|f32*"),
    ("tokens", "u32"),
    ("h", "u32"),
];
const EMBED_BWD_P: &[(&str, &str)] = &[
    ("dout", "bf16*|f32*"),
    ("uniq", "i32*"),
    ("starts", "u32*"),
    ("positions", "i32*"),
    ("dtable", "f32*"),
    ("nuniq", "u32"),
    ("h", "u32"),
];

fn rest_entries() -> Vec<E> {
    let rope_sh = || vec![Shape::new(7, 3, 64), Shape::new(5, 1, 16)];
    let mut v = vec![
        E {
            name: rope::FWD_NAME,
            summary: "RoPE forward on the decoupled rope part, interleaved pairs, in place (YaRN cos/sin table)",
            params: ROPE_P,
            launch: "grid = ceil(tokens*heads*dim/2 / 256), block = 256 (thread per pair)",
            host: "rope_apply",
            shapes: rope_sh(),
            kind: TrainKernel::RopeFwd,
        },
        E {
            name: rope::BWD_NAME,
            summary: "RoPE backward (rotation by -angle) of the gradient, in place",
            params: ROPE_P,
            launch: "grid = ceil(tokens*heads*dim/2 / 256), block = 256 (thread per pair)",
            host: "rope_apply",
            shapes: rope_sh(),
            kind: TrainKernel::RopeBwd,
        },
    ];
    for bf in [true, false] {
        let xsh = || vec![Shape::new(6, 0, 1000), Shape::new(3, 0, 4104)];
        v.push(E {
            name: xent::fwd_name(bf),
            summary: "softmax cross-entropy forward: online lse + loss per token (ignore index, label smoothing)",
            params: XENT_FWD_P,
            launch: "grid = tokens, block = 256",
            host: "xent_fwd",
            shapes: xsh(),
            kind: TrainKernel::XentFwd { bf16: bf },
        });
        v.push(E {
            name: xent::bwd_name(bf),
            summary:
                "softmax cross-entropy backward: dlogits = (softmax - smoothed onehot) * dloss",
            params: XENT_BWD_P,
            launch: "grid = tokens, block = 256",
            host: "xent_bwd",
            shapes: xsh(),
            kind: TrainKernel::XentBwd { bf16: bf },
        });
        v.push(E {
            name: embed::fwd_name(bf),
            summary: "embedding gather out[t] = table[ids[t]] (bit-exact copy)",
            params: EMBED_FWD_P,
            launch: "grid = ceil(tokens/4), block = 128 (warp per token)",
            host: "embed_fwd",
            shapes: vec![Shape::new(37, 50, 264), Shape::new(8, 10, 2048)],
            kind: TrainKernel::EmbedFwd { bf16: bf },
        });
        v.push(E {
            name: embed::bwd_name(bf),
            summary: "embedding backward: deterministic scatter-add into an f32 table gradient (host CSR, warp per id)",
            params: EMBED_BWD_P,
            launch: "grid = ceil(distinct ids/4), block = 128 (warp per id)",
            host: "embed_bwd",
            shapes: vec![Shape::new(37, 50, 264), Shape::new(8, 10, 2048)],
            kind: TrainKernel::EmbedBwd { bf16: bf },
        });
    }
    v.extend(reduction_entries());
    v.extend(ops_entries());
    v.extend(count_entries());
    v
}

/// The bookkeeping reductions of [`count`] (shapes: count m = indices, n = experts; sum m =
/// values).
fn count_entries() -> Vec<E> {
    vec![
        E {
            name: count::COUNT_NAME,
            summary: "per-expert token histogram of routed indices, out[E] = indices outside [0, E) (thread per expert, in-order scan, exact)",
            params: &[("idx", "i32*"), ("out", "u32*"), ("n", "u32"), ("experts", "u32")],
            launch: "grid = ceil((experts+1)/128), block = 128 (thread per count)",
            host: "expert_count",
            shapes: vec![Shape::new(1000, 8, 0), Shape::new(77, 300, 0)],
            kind: TrainKernel::ExpertCount,
        },
        E {
            name: count::SUM_F64_NAME,
            summary: "acc = (accumulate ? acc : 0) + f64 sum of f32 values in index order (one thread; the ranks' losses)",
            params: &[("x", "f32*"), ("acc", "f64*"), ("n", "u32"), ("accumulate", "u32")],
            launch: "grid = 1, block = 32 (thread 0 sums)",
            host: "f32_sum_f64",
            shapes: vec![Shape::new(4, 0, 0), Shape::new(1000, 0, 0)],
            kind: TrainKernel::SumF64,
        },
    ]
}

/// The element-wise and re-layout kernels of [`ops`] (shapes: element-wise m = elements;
/// transpose m = rows, k = cols; head sum m = rows, n = heads, k = head dim; top-k slot kernels
/// m = tokens, n = topk, k = h).
fn ops_entries() -> Vec<E> {
    const CVT_P: &[(&str, &str)] = &[("x", "f32*|bf16*"), ("out", "bf16*|f32*"), ("n", "u32")];
    const ELEM: &str = "grid = ceil(n/256), block = 256 (thread per element)";
    let ew = || vec![Shape::new(1000, 0, 0), Shape::new(77, 0, 0)];
    let mut v = vec![
        E {
            name: ops::ADD_NAME,
            summary: "out = bf16(a + b), bf16 operands (residual adds)",
            params: &[
                ("a", "bf16*"),
                ("b", "bf16*"),
                ("out", "bf16*"),
                ("n", "u32"),
            ],
            launch: ELEM,
            host: "bf16_add",
            shapes: ew(),
            kind: TrainKernel::Add,
        },
        E {
            name: ops::ADD_F32_NAME,
            summary: "out = a + b in f32 (fixed-order gradient accumulation)",
            params: &[("a", "f32*"), ("b", "f32*"), ("out", "f32*"), ("n", "u32")],
            launch: ELEM,
            host: "f32_add",
            shapes: ew(),
            kind: TrainKernel::AddF32,
        },
        E {
            name: ops::CVT_TO_BF16_NAME,
            summary: "f32 -> bf16 (cvt.rn)",
            params: CVT_P,
            launch: ELEM,
            host: "cvt_f32_bf16",
            shapes: ew(),
            kind: TrainKernel::Cvt { to_bf16: true },
        },
        E {
            name: ops::CVT_TO_F32_NAME,
            summary: "bf16 -> f32 (exact)",
            params: CVT_P,
            launch: ELEM,
            host: "cvt_bf16_f32",
            shapes: ew(),
            kind: TrainKernel::Cvt { to_bf16: false },
        },
        E {
            name: ops::HEAD_SUM_NAME,
            summary:
                "per-head column slices summed over heads in order (MLA dK_nope, shared dK_rope)",
            params: &[
                ("x", "bf16*"),
                ("out", "bf16*"),
                ("rows", "u32"),
                ("w", "u32"),
                ("groups", "u32"),
                ("row_in", "u32"),
                ("blk", "u32"),
                ("off", "u32"),
                ("nsum", "u32"),
                ("sstride", "u32"),
            ],
            launch: "grid = ceil(rows*groups*w/256), block = 256 (thread per output)",
            host: "head_sum",
            shapes: vec![Shape::new(37, 3, 48), Shape::new(8, 16, 192)],
            kind: TrainKernel::HeadSum,
        },
        E {
            name: ops::SLOT_MASK_NAME,
            summary: "out[r] = (slot[r] == k) as f32 (per-slot MoE combine, expert side)",
            params: &[("slot", "i32*"), ("out", "f32*"), ("k", "i32"), ("n", "u32")],
            launch: ELEM,
            host: "topk_slot_mask",
            shapes: vec![Shape::new(37, 2, 24), Shape::new(128, 8, 128)],
            kind: TrainKernel::TopkSlotMask,
        },
        E {
            name: ops::SLOT_ACC_NAME,
            summary: "acc[t, c] = fma(w[t, k], part[t, c], k > 0 ? acc : 0): top-k sum in slot order (per-slot MoE combine, home side)",
            params: &[
                ("part", "bf16*"),
                ("w", "f32*"),
                ("acc", "f32*"),
                ("k", "u32"),
                ("topk", "u32"),
                ("h", "u32"),
                ("n", "u32"),
            ],
            launch: "grid = ceil(tokens*h/256), block = 256 (thread per element)",
            host: "topk_slot_acc",
            shapes: vec![Shape::new(37, 2, 24), Shape::new(128, 8, 128)],
            kind: TrainKernel::TopkSlotAcc,
        },
    ];
    for bf in [true, false] {
        v.push(E {
            name: ops::transpose_name(bf),
            summary: "out [cols, rows] = bf16(x [rows, cols])^T (weight-gradient operands)",
            params: &[
                ("x", "bf16*|f32*"),
                ("out", "bf16*"),
                ("rows", "u32"),
                ("cols", "u32"),
            ],
            launch: "grid = ceil(rows*cols/256), block = 256 (thread per output)",
            host: "transpose_bf16",
            shapes: vec![Shape::new(37, 0, 24), Shape::new(128, 0, 256)],
            kind: TrainKernel::Transpose { bf16: bf },
        });
    }
    v.push(E {
        name: relayout::TRANSPOSE_F32_NAME,
        summary: "out [cols, rows] = x [rows, cols]^T, f32 exact (W^T before the on-device FP8 weight quantisation)",
        params: &[("x", "f32*"), ("out", "f32*"), ("rows", "u32"), ("cols", "u32")],
        launch: "grid = ceil(rows*cols/256), block = 256 (thread per output)",
        host: "transpose_f32",
        shapes: vec![Shape::new(37, 0, 24), Shape::new(128, 0, 256)],
        kind: TrainKernel::TransposeF32,
    });
    v
}

/// The cross-entropy mean and the optimiser kernels.
fn reduction_entries() -> Vec<E> {
    let opt_sh = || vec![Shape::new(10000, 0, 0), Shape::new(300, 0, 0)];
    let tensors = |mut s: Vec<Shape>| {
        s[0].n = 3;
        s[1].n = 1;
        s
    };
    vec![
        E {
            name: xent::MEAN_NAME,
            summary: "mean of the per-token losses over non-ignored tokens (one CTA, fixed order)",
            params: &[("loss", "f32*"), ("out", "f32*"), ("tokens", "u32"), ("count", "u32")],
            launch: "grid = 1, block = 256",
            host: "xent_mean",
            shapes: vec![Shape::new(6, 0, 1000)],
            kind: TrainKernel::XentMean,
        },
        E {
            name: optim::SUMSQ_NAME,
            summary: "gradient norm stage 1: per-CTA sums of squares of 4096 elements (one launch per tensor)",
            params: &[("g", "f32*"), ("n", "u32"), ("part", "f32*"), ("part0", "u32")],
            launch: "grid = ceil(n/4096), block = 256",
            host: "grad_norm",
            shapes: tensors(opt_sh()),
            kind: TrainKernel::GradSumsq,
        },
        E {
            name: optim::NORM_NAME,
            summary: "gradient norm stage 2: fixed-order sum of the partials, sqrt",
            params: &[("part", "f32*"), ("nparts", "u32"), ("out", "f32*")],
            launch: "grid = 1, block = 256",
            host: "grad_norm",
            shapes: tensors(opt_sh()),
            kind: TrainKernel::GradNorm,
        },
        E {
            name: optim::ADAMW_NAME,
            summary: "AdamW on f32 master weights with bf16 moments, global-norm clip read from device memory",
            params: &[
                ("p", "f32*"),
                ("g", "f32*"),
                ("m", "bf16*"),
                ("v", "bf16*"),
                ("norm", "f32* (0 = no clip)"),
                ("n", "u32"),
                ("lr", "f32"),
                ("beta1", "f32"),
                ("beta2", "f32"),
                ("eps", "f32"),
                ("wd", "f32"),
                ("bc1", "f32"),
                ("bc2", "f32"),
                ("clip", "f32"),
            ],
            launch: "grid = ceil(n/1024), block = 256 (4 elements per thread)",
            host: "adamw_step",
            shapes: tensors(opt_sh()),
            kind: TrainKernel::AdamW,
        },
        E {
            name: balance::BIAS_UPDATE_NAME,
            summary: "aux-loss-free MoE bias update: bias += speed * sign(mean load - load) (integer sign, f32 update)",
            params: &[
                ("bias", "f32* (in place)"),
                ("load", "u32*"),
                ("experts", "u32"),
                ("speed", "f32"),
            ],
            launch: "grid = 1, block = 256 (thread per expert, strided)",
            host: "moe_bias_update",
            shapes: vec![Shape::new(64, 0, 0), Shape::new(300, 0, 0)],
            kind: TrainKernel::BiasUpdate,
        },
        E {
            name: balance::NORM_COMBINE_NAME,
            summary: "global gradient norm from per-device-group norms: f64 sum of squares in group order, sqrt, one f32 rounding",
            params: &[
                ("norm", "f32*"),
                ("acc", "f64*"),
                ("out", "f32*"),
                ("first", "u32"),
                ("last", "u32"),
            ],
            launch: "grid = 1, block = 32, one launch per group in order",
            host: "grad_norm_combine",
            shapes: vec![Shape::new(4, 0, 0), Shape::new(1, 0, 0)],
            kind: TrainKernel::NormCombine,
        },
    ]
}
