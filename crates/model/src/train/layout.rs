//! Where everything goes: the job's devices, the `2 pp` stage specs of DualPipeV (stage `s` on
//! pipeline rank `s` for `s < pp`, else `2 pp - 1 - s`, each a contiguous run of
//! `layers / (2 pp)` decoder layers), which parameters each stage owns, and how a sampled batch
//! becomes a [`MicroBatch`] split over the EP ranks.

use crate::config::{DeviceKind, TrainConfig};
use crate::data::Batch;
use crate::params::ParamSpec;
use crate::stage::{MicroBatch, StageSpec};
use crate::TrainError;
use runtime::Device;

/// The job's devices by global index: emulated devices `base..base + n`, or CUDA devices
/// `0..n` (an error names how many are missing).
pub fn job_devices(cfg: &TrainConfig, emu_base: u32) -> Result<Vec<Device>, TrainError> {
    let n = cfg.devices();
    match cfg.device {
        DeviceKind::Emu => Ok((0..n).map(|i| Device::emu(emu_base + i)).collect()),
        DeviceKind::Cuda => {
            let have = Device::cuda_count();
            if have < n {
                return Err(TrainError::Unsupported(format!(
                    "device: the configuration needs {n} CUDA devices (pp x ep x dp), {have} found"
                )));
            }
            Ok((0..n).map(Device::cuda).collect::<Result<_, _>>()?)
        }
    }
}

/// The single-device run of the job: every one of its `pp x ep x dp` device slots is the same
/// device (emulated `emu_base`, or CUDA device 0), so every stage and every expert runs there
/// (`net::DeviceStage` then runs each EP rank's tokens in turn and its MoE layers as EP 1; the
/// result is bit-identical to the parallel run's).
pub fn single_device(cfg: &TrainConfig, emu_base: u32) -> Result<Vec<Device>, TrainError> {
    let d = match cfg.device {
        DeviceKind::Emu => Device::emu(emu_base),
        DeviceKind::Cuda => {
            if Device::cuda_count() == 0 {
                return Err(TrainError::Unsupported(
                    "device: the single-device run needs a CUDA device, none found".into(),
                ));
            }
            Device::cuda(0)?
        }
    };
    Ok(vec![d; cfg.devices() as usize])
}

/// The stage specs of a validated configuration over `devices` (global index order, as
/// [`TrainConfig::placement`] numbers them). Data parallelism (dp > 1) is not supported.
pub fn stage_specs(cfg: &TrainConfig, devices: &[Device]) -> Result<Vec<StageSpec>, TrainError> {
    let p = &cfg.parallel;
    if p.dp != 1 {
        return Err(TrainError::Unsupported(format!(
            "parallel.dp = {}: the trainer runs one data-parallel replica",
            p.dp
        )));
    }
    if devices.len() != cfg.devices() as usize {
        return Err(TrainError::Shape(format!(
            "{} devices for a job of {}",
            devices.len(),
            cfg.devices()
        )));
    }
    let (pp, ep) = (p.pp as usize, p.ep as usize);
    let mut groups = vec![vec![None; ep]; pp];
    for r in cfg.placement() {
        groups[r.pp as usize][r.ep as usize] = Some(devices[r.device as usize].clone());
    }
    let groups: Vec<Vec<Device>> = groups
        .into_iter()
        .map(|g| g.into_iter().collect::<Option<Vec<_>>>())
        .collect::<Option<_>>()
        .ok_or_else(|| TrainError::Shape("placement leaves an EP rank without a device".into()))?;
    let stages = 2 * pp;
    let per = cfg.model.layers as usize / stages;
    Ok((0..stages)
        .map(|s| {
            let rank = if s < pp { s } else { stages - 1 - s };
            StageSpec {
                index: s,
                stages,
                layers: s * per..(s + 1) * per,
                pp_rank: rank,
                devices: groups[rank].clone(),
                config: cfg.clone(),
            }
        })
        .collect())
}

/// Indices (into `specs`, the [`crate::params::specs`] order) of the parameters stage `spec`
/// owns: its layers', plus the embedding on the first stage and the final norm and head on the
/// last.
pub fn stage_params(spec: &StageSpec, specs: &[ParamSpec]) -> Vec<usize> {
    specs
        .iter()
        .enumerate()
        .filter(|(_, p)| match p.layer {
            Some(l) => spec.layers.contains(&l),
            None if p.name == "embed" => spec.is_first(),
            None => spec.is_last(),
        })
        .map(|(i, _)| i)
        .collect()
}

/// Micro-batch `index` from a sampled batch: its sequences split evenly over `ep` ranks in
/// order (rank `r` gets rows `r * b/ep ..`).
pub fn micro_batch(index: usize, b: &Batch, ep: usize) -> Result<MicroBatch, TrainError> {
    if ep == 0 || !b.batch.is_multiple_of(ep) {
        return Err(TrainError::Shape(format!(
            "{} sequences do not split over {ep} EP ranks",
            b.batch
        )));
    }
    let per = b.batch / ep * b.seq_len;
    let inputs = b
        .inputs
        .chunks(per)
        .map(|c| c.iter().map(|&t| t as i32).collect())
        .collect();
    let labels = b.labels.chunks(per).map(<[i32]>::to_vec).collect();
    Ok(MicroBatch {
        index,
        inputs,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::specs;

    #[test]
    fn the_default_job_folds_four_stages_onto_two_ranks_and_owns_each_parameter_once() {
        let cfg = TrainConfig::default();
        let devices = job_devices(&cfg, 9000).unwrap();
        let st = stage_specs(&cfg, &devices).unwrap();
        let ranks: Vec<usize> = st.iter().map(|s| s.pp_rank).collect();
        assert_eq!(ranks, [0, 1, 1, 0]);
        let layers: Vec<_> = st.iter().map(|s| s.layers.clone()).collect();
        assert_eq!(layers, [0..1, 1..2, 2..3, 3..4]);
        for s in &st {
            // the EP group of the placement, in EP rank order
            let want: Vec<u32> = (0..cfg.parallel.ep)
                .map(|ep| {
                    let r = cfg
                        .placement()
                        .into_iter()
                        .find(|r| r.pp as usize == s.pp_rank && r.ep == ep);
                    9000 + r.unwrap().device
                })
                .collect();
            let got: Vec<u32> = s.devices.iter().map(|d| d.index()).collect();
            assert_eq!(got, want, "stage {}", s.index);
        }
        let all = specs(&cfg.model);
        let mut count = vec![0; all.len()];
        for s in &st {
            stage_params(s, &all)
                .into_iter()
                .for_each(|i| count[i] += 1);
        }
        assert!(count.iter().all(|&c| c == 1), "{count:?}");
        assert!(
            stage_params(&st[0], &all).contains(&0),
            "embed on the first stage"
        );
        assert!(
            stage_params(&st[3], &all).contains(&(all.len() - 1)),
            "head on the last"
        );
    }

    #[test]
    fn a_batch_splits_over_the_ep_ranks_in_order() {
        let b = Batch {
            batch: 4,
            seq_len: 2,
            inputs: (0..8).collect(),
            labels: (10..18).collect(),
            chunks: vec![Some(0); 4],
        };
        let mb = micro_batch(3, &b, 2).unwrap();
        assert_eq!(mb.index, 3);
        assert_eq!(mb.inputs, [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(mb.labels, [vec![10, 11, 12, 13], vec![14, 15, 16, 17]]);
        assert!(micro_batch(0, &b, 3).is_err());
    }
}
