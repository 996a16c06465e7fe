//! The contract between the pipeline executor (`train`) and the layers of one pipeline stage
//! (`net`): what crosses a stage boundary, what a stage does per micro-batch, and how its
//! gradients come back in a fixed order.
//!
//! A stage holds a contiguous range of decoder layers (the first stage also the embedding, the
//! last also the final norm, the head and the loss) on one expert-parallel group of devices.
//! Inside the stage each EP rank owns `micro_batch / ep` whole sequences (attention, norms and
//! the dense FFN are data-parallel over the ranks; the MoE layers dispatch tokens across them).

use crate::config::TrainConfig;
use crate::params::Params;
use crate::train::optim::DeviceParams;
use runtime::{Buffer, Device};
use std::ops::Range;

/// Which part of the model a stage holds and where it runs. With DualPipeV over `pp` pipeline
/// ranks there are `2 pp` stages; pipeline rank `r` holds stages `r` and `2 pp - 1 - r` (the two
/// legs of the V), both on its EP group.
#[derive(Clone)]
pub struct StageSpec {
    /// Position along the chain, `0..stages`.
    pub index: usize,
    pub stages: usize,
    /// Decoder layers of this stage (global indices).
    pub layers: Range<usize>,
    /// The pipeline rank (EP group) running it.
    pub pp_rank: usize,
    /// The EP group's devices, EP rank order.
    pub devices: Vec<Device>,
    /// The whole job's configuration (model sizes, micro-batch, comm SMs, ...).
    pub config: TrainConfig,
}

impl StageSpec {
    pub fn is_first(&self) -> bool {
        self.index == 0
    }
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.stages
    }
}

/// Activations (forward) or their gradients (backward) at a stage boundary: per EP rank of the
/// stage, `[tokens_r, hidden]` f32 (BF16-representable values) in that rank's device memory.
/// The executor moves them to the next stage's devices with device-to-device copies.
pub struct Boundary {
    pub ranks: Vec<Buffer<f32>>,
}

/// One micro-batch: per EP rank its sequences' input ids and labels (`[tokens_r]` each, labels
/// `data::IGNORE_INDEX` where nothing is predicted). `index` is its position in the step
/// (`0..micro_batches`): the order in which gradients and losses are reduced.
#[derive(Clone, Debug)]
pub struct MicroBatch {
    pub index: usize,
    pub inputs: Vec<Vec<i32>>,
    pub labels: Vec<Vec<i32>>,
}

impl MicroBatch {
    /// Labelled tokens (the loss is the sum over them divided by the step's total).
    pub fn labelled(&self) -> usize {
        self.labels.iter().flatten().filter(|&&l| l >= 0).count()
    }
}

/// What a stage's forward produced.
pub enum StageOut {
    /// Activations for the next stage.
    Hidden(Boundary),
    /// The last stage: the summed cross-entropy (nats) over the micro-batch's labelled tokens.
    Loss(f64),
}

/// Per MoE layer (global layer index) the number of tokens routed to each expert in the
/// micro-batches seen since the last [`Stage::take_grads`] (for the aux-loss-free bias update).
pub type ExpertLoad = Vec<(usize, Vec<u64>)>;

/// A stage's gradients: (parameter name, f32 values) in [`crate::params::specs`] order.
pub type NamedGrads = Vec<(String, Vec<f32>)>;

/// Errors of a stage.
pub type StageResult<T> = std::result::Result<T, crate::TrainError>;

/// One pipeline stage on its EP group.
pub trait Stage: Send {
    /// The stage's devices (EP rank order).
    fn devices(&self) -> &[Device];

    /// Forward of micro-batch `mb`. `x` is `None` for the first stage (it embeds `mb.inputs`).
    /// Keeps what the backward needs, keyed by `mb.index`. The last stage scales nothing: it
    /// returns the summed loss and, in its backward, uses d(loss)/d(logit) scaled by
    /// `loss_scale` (1 / labelled tokens of the whole step) given at construction or by
    /// [`Stage::set_loss_scale`].
    fn forward(&mut self, mb: &MicroBatch, x: Option<Boundary>) -> StageResult<StageOut>;

    /// Backward of micro-batch `mb` (its forward must have run). `dy` is `None` for the last
    /// stage. Returns the gradient of the stage's input (`None` for the first stage) and
    /// records this micro-batch's parameter gradients apart from the others'.
    fn backward(&mut self, mb: usize, dy: Option<Boundary>) -> StageResult<Option<Boundary>>;

    /// Drops what the forward of micro-batch `mb` kept (a forward-only pass: evaluation).
    fn discard(&mut self, mb: usize);

    /// d(step loss)/d(summed micro-batch loss) for the next backward passes: 1 / (labelled
    /// tokens of the step).
    fn set_loss_scale(&mut self, scale: f32);

    /// The stage's parameter gradients (f32, names of [`crate::params`]), each the sum over the
    /// micro-batches **in index order** whatever order their backward passes ran in (so a
    /// pipelined step is bit-identical to an unpipelined one), plus the expert loads; clears
    /// them.
    fn take_grads(&mut self) -> StageResult<(NamedGrads, ExpertLoad)>;

    /// Loads (uploads, re-quantises) the stage's parameters from `p` (after an optimizer step,
    /// and at start or resume).
    fn load_params(&mut self, p: &Params) -> StageResult<()>;

    /// Loads the stage's parameters from the optimizer's FP32 master weights on the devices
    /// (after an optimizer step): device-to-device copies and conversion/quantisation kernels,
    /// bit-identical to [`Stage::load_params`] of their host copies. The default downloads
    /// them and calls [`Stage::load_params`] (host mocks).
    fn load_device_params(&mut self, p: &DeviceParams<'_>) -> StageResult<()> {
        self.load_params(&p.download()?)
    }

    /// The last stage with an MTP module (`model.mtp_depth = 1`): each micro-batch's summed
    /// MTP cross-entropy (nats) of the forwards since the last call, by micro-batch index;
    /// clears them (a discarded forward's is dropped). Stages without one return nothing.
    fn take_mtp_losses(&mut self) -> Vec<(usize, f64)> {
        Vec::new()
    }
}
