// shared helpers (included with `mod common;`)
#![allow(dead_code, clippy::too_many_arguments)]
use ep::comm::{EpConfig, EpGroup};
use ep::transport::InProcessTransport;
use rand::{Rng, SeedableRng};
use runtime::Device;

pub fn group(
    base: u32,
    nodes: u32,
    gpn: u32,
    experts: u32,
    hidden: u32,
    topk: u32,
    max_tokens: u32,
    num_sms: u32,
) -> EpGroup {
    let ranks = nodes * gpn;
    let devs: Vec<Device> = (0..ranks).map(|i| Device::emu(base + i)).collect();
    let mut cfg = EpConfig::new(ranks, gpn, experts, hidden, topk, max_tokens);
    cfg.num_sms = num_sms;
    cfg.ring_slots = 4;
    cfg.chunk = 2;
    let tr = InProcessTransport {
        devices: devs.clone(),
        gpus_per_node: gpn,
    };
    EpGroup::new(cfg, devs, Box::new(tr)).unwrap()
}

/// Random distinct experts per token; `mode` 0: uniform, 1: all to expert 0 (+ -1 pads),
/// 2: never to rank `skip`.
pub fn routing(
    rng: &mut rand::rngs::StdRng,
    t: usize,
    k: usize,
    experts: usize,
    mode: u32,
    epr: usize,
    skip: usize,
) -> (Vec<i32>, Vec<f32>) {
    let mut idx = Vec::new();
    let mut w = Vec::new();
    for _ in 0..t {
        let mut chosen: Vec<i32> = Vec::new();
        while chosen.len() < k {
            let e = match mode {
                1 => {
                    if chosen.is_empty() {
                        0
                    } else {
                        -1
                    }
                }
                _ => rng.gen_range(0..experts as i32),
            };
            if mode == 2 && e >= 0 && e as usize / epr == skip {
                continue;
            }
            if e >= 0 && chosen.contains(&e) {
                continue;
            }
            chosen.push(e);
        }
        for e in chosen {
            idx.push(e);
            // dyadic weights: sums and products stay exact in bf16/f32
            w.push(rng.gen_range(1..=4) as f32 * 0.25);
        }
    }
    (idx, w)
}

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}
