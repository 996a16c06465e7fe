//! The expert-parallel communication check behind `netmpi-ep-check` and `ptxforge comm`:
//! dispatch (BF16 and FP8), weighted and unweighted combine, cached dispatch and the top-k weight
//! gradient puts of a `nodes x gpus_per_node` group, either in one process (every rank here, the
//! direct in-process transport) or one process per node under `mpirun` (other nodes through the
//! proxy transport over [`crate::MpiEngine`]). Every process derives every rank's inputs from the
//! same seed and uploads only its own; the report holds a hash of every output of every hosted
//! rank (bit-identical across modes), the time and bytes of every operation for the hosted ranks,
//! and the proxies' bytes. Every received BF16 row is checked against its source row.

//!
//! The inputs, the group, the report and the row check are `ep::selfcheck`'s (shared with the
//! NCCL engine's check); this module runs the full set of operations over MPI.

use crate::Mpi;
use ep::comm::XRef;
use ep::selfcheck::{check_rows, expert_outputs, group, op, upload_inputs};
pub use ep::selfcheck::{fnv, CheckCfg, OpReport, Report, Res};
use ep::Engine;
use half::bf16;
use runtime::Buffer;

/// Runs the check (see the module docs).
pub fn run(c: &CheckCfg, mpi: Option<&Mpi>) -> Res<Report> {
    let engine = match mpi {
        Some(m) => Some(Box::new(m.engine()?) as Box<dyn Engine>),
        None => None,
    };
    let mut g = group(c, engine)?;
    let hosted = g.hosted.clone();
    let devs = g.devices.clone();
    let u = upload_inputs(c, &hosted, &devs)?;
    let ins = &u.inputs;
    let (ir, wr): (Vec<_>, Vec<_>) = (u.idx.iter().collect(), u.w.iter().collect());
    let mut ops = Vec::new();
    let xr: Vec<XRef> = u.x.iter().map(XRef::Bf16).collect();
    let (outs, handle) = g.dispatch(&xr, &ir, &wr, None)?;
    let handle = handle.ok_or("a fresh dispatch returns a handle")?;
    ops.push(op(&g, "dispatch-bf16"));
    check_rows(c, &hosted, &outs)?;
    let qr: Vec<XRef> = u.q.iter().zip(&u.s).map(|(q, s)| XRef::Fp8(q, s)).collect();
    let (outs8, _) = g.dispatch(&qr, &ir, &wr, None)?;
    ops.push(op(&g, "dispatch-fp8"));
    let ys = expert_outputs(c, &devs, &outs)?;
    let yr: Vec<&Buffer<bf16>> = ys.iter().collect();
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    let comb = g.combine(&yr, Some(&rw), &handle)?;
    ops.push(op(&g, "combine-weighted"));
    let comb2 = g.combine(&yr, None, &handle)?;
    ops.push(op(&g, "combine-unweighted"));
    let (cached, _) = g.dispatch(&xr, &ir, &wr, Some(&handle))?;
    ops.push(op(&g, "dispatch-cached"));
    let dy: Vec<&Buffer<u8>> = cached.iter().map(|o| &o.recv_x).collect();
    let ntok: Vec<usize> = ins.iter().map(|r| r.idx.len() / c.topk).collect();
    let t0 = std::time::Instant::now();
    let tg = g.topk_weight_grad(&yr, &dy, &outs, &ntok)?;
    let mut tgo = op(&g, "topk-grad");
    (tgo.seconds, tgo.inter_node_bytes, tgo.intra_node_bytes) = (
        t0.elapsed().as_secs_f64(),
        tg.inter_node_bytes,
        tg.intra_node_bytes,
    );
    ops.push(tgo);
    // the proxies count since their start: per operation, the difference
    let mut before = 0;
    for o in &mut ops {
        (o.proxy_put_bytes, before) = (o.proxy_put_bytes - before, o.proxy_put_bytes);
    }
    let mut hashes = Vec::new();
    let mut add = |r: u32, what: &str, b: Vec<u8>| {
        hashes.push((r, what.to_string(), format!("{:016x}", fnv(&b))));
    };
    for (i, &r) in hosted.iter().enumerate() {
        add(r, "rows-bf16", outs[i].recv_x.to_bytes()?);
        add(r, "rows-fp8", outs8[i].recv_x.to_bytes()?);
        add(r, "scales-fp8", outs8[i].recv_scales.to_bytes()?);
        add(r, "recv-src", outs[i].recv_src.to_bytes()?);
        add(r, "combine", comb[i].to_bytes()?);
        add(r, "combine-unweighted", comb2[i].to_bytes()?);
        add(r, "cached-rows", cached[i].recv_x.to_bytes()?);
        add(r, "topk-dw", tg.dw[i].to_bytes()?);
    }
    Ok(Report {
        process: mpi.map_or(0, |m| m.rank()),
        processes: mpi.map_or(1, |m| m.size()),
        hosted,
        transport: g.transport.name().to_string(),
        ops,
        hashes,
    })
}
