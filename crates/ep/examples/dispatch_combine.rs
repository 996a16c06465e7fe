//! Expert-parallel dispatch and combine from Rust, on two emulated GPUs of one node.
//!
//! Every token goes to its top-2 of 8 experts (4 per rank); each rank's "expert" `e` scales the
//! rows it received by `e + 1` on the host; combine sends the rows back and sums them weighted
//! by the top-k weights: `out[t] = sum_k w[t,k] * (e[t,k] + 1) * x[t]`.
//!
//! `cargo run --example dispatch_combine -p ep`. Exits nonzero on a mismatch.

use ep::comm::XRef;
use ep::{EpConfig, EpGroup, InProcessTransport};
use half::bf16;
use rand::{Rng, SeedableRng};
use runtime::{Buffer, Device};
use std::error::Error;

const RANKS: usize = 2;
const EXPERTS: usize = 8;
const HIDDEN: usize = 128;
const TOPK: usize = 2;
const TOKENS: usize = 12;

/// Per rank: x `[TOKENS, HIDDEN]` (small integers, exact in bf16), top-k experts and weights.
type Inputs = (Vec<Vec<bf16>>, Vec<Vec<i32>>, Vec<Vec<f32>>);

fn inputs(rng: &mut rand::rngs::StdRng) -> Inputs {
    let (mut xs, mut idx, mut w) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RANKS {
        xs.push(
            (0..TOKENS * HIDDEN)
                .map(|_| bf16::from_f32(rng.gen_range(-7..=7) as f32))
                .collect(),
        );
        let (mut i, mut ws) = (Vec::new(), Vec::new());
        for _ in 0..TOKENS {
            let e0 = rng.gen_range(0..EXPERTS as i32);
            let e1 = (e0 + rng.gen_range(1..EXPERTS as i32)) % EXPERTS as i32; // distinct
            i.extend([e0, e1]);
            ws.extend([
                rng.gen_range(1..=4) as f32 * 0.25,
                rng.gen_range(1..=4) as f32 * 0.25,
            ]);
        }
        idx.push(i);
        w.push(ws);
    }
    (xs, idx, w)
}

pub fn main() -> Result<(), Box<dyn Error>> {
    let devices: Vec<Device> = (0..RANKS as u32).map(|i| Device::emu(60 + i)).collect();
    let mut cfg = EpConfig::new(
        RANKS as u32,
        RANKS as u32,
        EXPERTS as u32,
        HIDDEN as u32,
        TOPK as u32,
        32,
    );
    cfg.num_sms = 4; // communication kernels' SM budget per GPU
    let transport = InProcessTransport {
        devices: devices.clone(),
        gpus_per_node: RANKS as u32,
    };
    let mut group = EpGroup::new(cfg, devices.clone(), Box::new(transport))?;

    let (xs, idx, w) = inputs(&mut rand::rngs::StdRng::seed_from_u64(3));
    let up = |r: usize| -> runtime::Result<(Buffer<bf16>, Buffer<i32>, Buffer<f32>)> {
        Ok((
            devices[r].upload(&xs[r])?,
            devices[r].upload(&idx[r])?,
            devices[r].upload(&w[r])?,
        ))
    };
    let bufs = (0..RANKS).map(up).collect::<runtime::Result<Vec<_>>>()?;
    let x_refs: Vec<XRef> = bufs.iter().map(|b| XRef::Bf16(&b.0)).collect();
    let idx_refs: Vec<&Buffer<i32>> = bufs.iter().map(|b| &b.1).collect();
    let w_refs: Vec<&Buffer<f32>> = bufs.iter().map(|b| &b.2).collect();

    // Dispatch: rows arrive grouped by local expert (m_indices_host), padded to 128.
    let (recv, handle) = group.dispatch(&x_refs, &idx_refs, &w_refs, None)?;
    let handle = handle.ok_or("the first dispatch returns a handle")?;
    let epr = EXPERTS / RANKS;
    let mut ys = Vec::new();
    for (r, o) in recv.iter().enumerate() {
        let bytes = o.recv_x.to_bytes()?;
        let mut y: Vec<bf16> = bytes
            .chunks(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        for (row, &le) in o.m_indices_host.iter().enumerate().take(o.m_pad) {
            let scale = if le < 0 {
                0.0
            } else {
                (r * epr) as f32 + le as f32 + 1.0
            };
            for v in &mut y[row * HIDDEN..(row + 1) * HIDDEN] {
                *v = bf16::from_f32(v.to_f32() * scale);
            }
        }
        ys.push(devices[r].upload(&y)?);
    }
    // Combine: weighted by each row's top-k weight, back to the tokens' home ranks.
    let row_w: Vec<&Buffer<f32>> = recv.iter().map(|o| &o.recv_w).collect();
    let out = group.combine(&ys.iter().collect::<Vec<_>>(), Some(&row_w), &handle)?;

    for r in 0..RANKS {
        let got = out[r].to_vec()?;
        for t in 0..TOKENS {
            let f: f64 = (0..TOPK)
                .map(|k| w[r][t * TOPK + k] as f64 * (idx[r][t * TOPK + k] + 1) as f64)
                .sum();
            for i in 0..HIDDEN {
                let want = xs[r][t * HIDDEN + i].to_f64() * f;
                let g = got[t * HIDDEN + i].to_f64();
                if (g - want).abs() > want.abs() / 128.0 {
                    return Err(
                        format!("rank {r} token {t} element {i}: {g}, expected {want}").into(),
                    );
                }
            }
        }
    }
    println!("dispatch_combine: {RANKS} ranks x {TOKENS} tokens match the host reference");
    Ok(())
}
