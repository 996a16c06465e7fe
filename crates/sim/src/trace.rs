//! Perfetto / Chrome trace-event JSON of one pipeline rank: pipeline ops on one track, the
//! kernels inside them on a compute-stream track and a communication-stream track.

use crate::cost::Resource;
use crate::timeline::Op;
use crate::Simulation;
use serde_json::{json, Value};

fn op_name(op: &Op) -> String {
    match op {
        Op::F(w) => format!("F d{} mb{}", w.dir, w.mb),
        Op::B(w) => format!("B d{} mb{}", w.dir, w.mb),
        Op::BW(w) => format!("BW d{} mb{}", w.dir, w.mb),
        Op::W(w) => format!("W d{} mb{}", w.dir, w.mb),
        Op::FB(a, b, full) => format!(
            "F&B F(d{} mb{}) {}(d{} mb{})",
            a.dir,
            a.mb,
            if *full { "B" } else { "I" },
            b.dir,
            b.mb
        ),
    }
}

/// Trace of `rank` (times in microseconds). Returns `None` if the rank does not exist.
pub fn rank_trace(sim: &Simulation, rank: usize) -> Option<Value> {
    let ops = sim.timeline.ops.get(rank)?;
    let mut ev = vec![
        json!({"ph":"M","name":"process_name","pid":rank,"args":{"name":format!("pipeline rank {rank}")}}),
        json!({"ph":"M","name":"thread_name","pid":rank,"tid":0,"args":{"name":"pipeline ops"}}),
        json!({"ph":"M","name":"thread_name","pid":rank,"tid":1,"args":{"name":"compute stream"}}),
        json!({"ph":"M","name":"thread_name","pid":rank,"tid":2,"args":{"name":"comm stream"}}),
    ];
    for p in ops {
        let us = 1e6;
        ev.push(json!({
            "ph":"X","pid":rank,"tid":0,"name":op_name(&p.op),
            "ts":p.start*us,"dur":(p.end-p.start)*us,
            "args":{"stages":[p.stages.0,p.stages.1]}
        }));
        let (kind, a, b) = match p.op {
            Op::F(_) => (0u8, p.stages.0, p.stages.0),
            Op::B(_) => (1, p.stages.0, p.stages.0),
            Op::BW(_) => (2, p.stages.0, p.stages.0),
            Op::W(_) => (3, p.stages.0, p.stages.0),
            Op::FB(_, _, true) => (4, p.stages.0, p.stages.1),
            Op::FB(_, _, false) => (5, p.stages.0, p.stages.1),
        };
        let s = sim.stages.op_schedule(kind, a, b);
        for k in &s.kernels {
            let tid = if k.res == Resource::Compute { 1 } else { 2 };
            let layer = if k.layer == usize::MAX {
                -1
            } else {
                k.layer as i64
            };
            ev.push(json!({
                "ph":"X","pid":rank,"tid":tid,"name":k.name,
                "ts":(p.start+k.start)*us,"dur":(k.end-k.start)*us,
                "args":{"layer":layer,"chain":k.chain}
            }));
        }
    }
    Some(json!({"traceEvents": ev, "displayTimeUnit": "ms"}))
}
