//! The sizes every block of a stage reads, derived from the job's configuration and checked
//! against the stage's EP group before any device work.

use super::linear::Result;
use crate::config::ModelConfig;
use crate::stage::StageSpec;
use crate::TrainError;

/// The sizes every block reads.
#[derive(Clone, Debug)]
pub(crate) struct Dims {
    pub h: usize,
    pub nh: usize,
    pub dn: usize,
    pub dr: usize,
    pub dv: usize,
    pub ql: usize,
    pub kvl: usize,
    /// Dense FFN and expert intermediate sizes.
    pub di: usize,
    pub ei: usize,
    pub eps: f32,
    /// Tokens per rank and sequence length.
    pub t: usize,
    pub seq: usize,
    pub vocab: usize,
    pub experts: usize,
    pub shared: bool,
    pub dense_layers: usize,
    /// All `ep > 1` EP ranks of the stage name one device (the single-device run): the ranks'
    /// token slices run there one after the other and each MoE layer is one EP-1 layer over
    /// all of them (see `net`'s module docs).
    pub one_device: bool,
}

impl Dims {
    pub fn new(spec: &StageSpec) -> Result<Dims> {
        let (m, tr) = (&spec.config.model, &spec.config.train);
        let ep = spec.devices.len();
        let bad = |msg: String| Err(TrainError::Shape(msg));
        if ep == 0 || !(tr.micro_batch as usize).is_multiple_of(ep) {
            return bad(format!(
                "devices: {ep} EP ranks must divide micro_batch = {}",
                tr.micro_batch
            ));
        }
        if ep != spec.config.parallel.ep as usize {
            return bad(format!(
                "devices: {ep} devices for an EP group of parallel.ep = {}",
                spec.config.parallel.ep
            ));
        }
        if spec.layers.end > m.layers as usize {
            return bad(format!(
                "layers {:?} beyond the model's {}",
                spec.layers, m.layers
            ));
        }
        let seq = tr.seq_len as usize;
        let t = seq * tr.micro_batch as usize / ep;
        if t == 0 || !t.is_multiple_of(128) {
            return bad(format!(
                "tokens per EP rank (seq_len x micro_batch / ep) = {t}: must be a positive multiple of 128"
            ));
        }
        let mut d = dims_of(m, t, seq);
        d.one_device = ep > 1 && spec.devices.iter().all(|x| x.same(&spec.devices[0]));
        Ok(d)
    }
}

fn dims_of(m: &ModelConfig, t: usize, seq: usize) -> Dims {
    Dims {
        h: m.hidden as usize,
        nh: m.heads as usize,
        dn: m.qk_nope_head_dim as usize,
        dr: m.qk_rope_head_dim as usize,
        dv: m.v_head_dim as usize,
        ql: m.q_lora_rank as usize,
        kvl: m.kv_lora_rank as usize,
        di: m.dense_intermediate as usize,
        ei: m.expert_intermediate as usize,
        eps: m.norm_eps,
        t,
        seq,
        vocab: m.vocab as usize,
        experts: m.routed_experts as usize,
        shared: m.shared_experts > 0,
        dense_layers: m.dense_layers as usize,
        one_device: false,
    }
}
