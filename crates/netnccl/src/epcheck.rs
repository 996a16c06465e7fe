//! Expert-parallel dispatch (BF16) and weighted combine of a `nodes x gpus_per_node` group,
//! either in one process (every rank here, the direct in-process transport) or one process per
//! node with the other nodes reached through the proxy transport over [`NcclEngine`]. Every
//! process derives every rank's inputs from the seed and uploads only its own; the result is a
//! hash of every output of every hosted rank, which must be bit-identical across the modes.
//! Every received row is also checked against its source token. (The inputs, group and row check
//! are `ep::selfcheck`'s, shared with `netmpi::check`; smaller sizes, fewer operations.)

use crate::check::Res;
use crate::NcclEngine;
use ep::comm::XRef;
use ep::selfcheck::{check_rows, expert_outputs, fnv, group, inputs, upload, CheckCfg, RankIn};
use half::bf16;
use runtime::Buffer;
use std::time::Duration;

/// The sizes of this check: `netmpi`'s at 1 GPU per node, 8 experts, hidden 128, top-2.
pub fn default_cfg() -> CheckCfg {
    CheckCfg {
        nodes: 2,
        gpus_per_node: 1,
        experts: 8,
        hidden: 128,
        topk: 2,
        tokens: 6,
        max_tokens: 16,
        seed: 1,
        timeout: Duration::from_secs(60),
    }
}

/// Runs the check; returns `hash <rank> <output> <fnv64>` lines of the hosted ranks.
pub fn run(c: &CheckCfg, engine: Option<NcclEngine>) -> Res<Vec<String>> {
    let engine = engine.map(|e| Box::new(e) as Box<dyn ep::Engine>);
    let mut g = group(c, engine)?;
    let (hosted, devs) = (g.hosted.clone(), g.devices.clone());
    let ins: Vec<RankIn> = hosted.iter().map(|&r| inputs(c, r)).collect();
    let xb = upload(&devs, &ins.iter().map(|i| &i.x[..]).collect::<Vec<_>>())?;
    let ib = upload(&devs, &ins.iter().map(|i| &i.idx[..]).collect::<Vec<_>>())?;
    let wb = upload(&devs, &ins.iter().map(|i| &i.w[..]).collect::<Vec<_>>())?;
    let (ir, wr): (Vec<_>, Vec<_>) = (ib.iter().collect(), wb.iter().collect());
    let xr: Vec<XRef> = xb.iter().map(XRef::Bf16).collect();
    let (outs, handle) = g.dispatch(&xr, &ir, &wr, None)?;
    let handle = handle.ok_or("a fresh dispatch returns a handle")?;
    check_rows(c, &hosted, &outs)?;
    let ys = expert_outputs(c, &devs, &outs)?;
    let yr: Vec<&Buffer<bf16>> = ys.iter().collect();
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    let comb = g.combine(&yr, Some(&rw), &handle)?;
    let mut lines = Vec::new();
    for (i, &r) in hosted.iter().enumerate() {
        for (what, b) in [
            ("rows-bf16", outs[i].recv_x.to_bytes()?),
            ("recv-src", outs[i].recv_src.to_bytes()?),
            ("combine", comb[i].to_bytes()?),
        ] {
            lines.push(format!("hash {r} {what} {:016x}", fnv(&b)));
        }
    }
    Ok(lines)
}
