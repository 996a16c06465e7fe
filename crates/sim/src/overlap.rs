//! Computation/communication overlap inside one pipeline op: one or two dependent kernel chains
//! (e.g. the forward of one micro-batch and the backward of another, as DualPipe pairs them)
//! list-scheduled onto two concurrent resources, the compute stream and the communication
//! stream. Each chain is strictly sequential; the two chains only share the resources.

use crate::cost::{Kernel, Resource};
use serde::Serialize;

/// A kernel placed in time (seconds from the op's start), with the chain it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Placed {
    pub name: &'static str,
    pub res: Resource,
    pub layer: usize,
    pub chain: usize,
    pub start: f64,
    pub end: f64,
}

/// Result of scheduling an op.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSchedule {
    pub makespan: f64,
    /// Time the compute stream is busy.
    pub compute_busy: f64,
    /// Time the communication stream is busy.
    pub comm_busy: f64,
    pub kernels: Vec<Placed>,
}

impl OpSchedule {
    /// Communication that is not hidden: the op's time during which compute is idle
    /// because it waits for communication.
    pub fn exposed_comm(&self) -> f64 {
        if self.comm_busy <= 0.0 {
            0.0
        } else {
            (self.makespan - self.compute_busy).max(0.0)
        }
    }
}

/// Schedule chains greedily: whenever a resource frees, it takes the ready kernel that became
/// ready first (ties: lower chain index). `slowdown` stretches compute kernels that run while a
/// communication kernel is in flight (shared HBM/L2), applied to the overlapped portion.
pub fn schedule(chains: &[&[Kernel]], slowdown: f64) -> OpSchedule {
    let n = chains.len();
    let mut next = vec![0usize; n];
    let mut ready = vec![0.0f64; n]; // when the chain's next kernel may start
    let mut free = [0.0f64; 2]; // compute, comm
    let mut kernels = Vec::new();
    let (mut cbusy, mut mbusy) = (0.0, 0.0);
    let mut comm_intervals: Vec<(f64, f64)> = Vec::new();
    loop {
        // Candidates: each chain's next kernel, start = max(chain ready, resource free).
        let mut best: Option<(f64, usize)> = None;
        for c in 0..n {
            if let Some(k) = chains[c].get(next[c]) {
                let r = if k.res == Resource::Compute { 0 } else { 1 };
                let st = ready[c].max(free[r]);
                let better = match best {
                    None => true,
                    Some((bs, _)) => st < bs - 1e-15,
                };
                if better {
                    best = Some((st, c));
                }
            }
        }
        let Some((start, c)) = best else { break };
        let k = &chains[c][next[c]];
        let r = if k.res == Resource::Compute { 0 } else { 1 };
        let mut dur = k.dur;
        if r == 0 && slowdown > 0.0 {
            // Stretch the part of the kernel that overlaps already-placed communication.
            let end0 = start + dur;
            let ov: f64 = comm_intervals
                .iter()
                .map(|&(a, b)| (b.min(end0) - a.max(start)).max(0.0))
                .sum();
            dur += ov * slowdown;
        }
        let end = start + dur;
        if r == 0 {
            cbusy += dur;
        } else {
            mbusy += dur;
            if dur > 0.0 {
                comm_intervals.push((start, end));
            }
        }
        free[r] = end;
        ready[c] = end;
        next[c] += 1;
        if dur > 0.0 {
            kernels.push(Placed {
                name: k.name,
                res: k.res,
                layer: k.layer,
                chain: c,
                start,
                end,
            });
        }
    }
    let makespan = ready.iter().cloned().fold(0.0, f64::max);
    OpSchedule {
        makespan,
        compute_busy: cbusy,
        comm_busy: mbusy,
        kernels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &'static str, res: Resource, dur: f64) -> Kernel {
        Kernel {
            name,
            res,
            dur,
            layer: 0,
        }
    }

    #[test]
    fn single_chain_is_serial() {
        let c = [
            k("a", Resource::Compute, 1.0),
            k("d", Resource::Comm, 2.0),
            k("m", Resource::Compute, 1.0),
        ];
        let s = schedule(&[&c], 0.0);
        assert_eq!(s.makespan, 4.0);
        assert_eq!(s.exposed_comm(), 2.0);
    }

    #[test]
    fn two_chains_hide_communication() {
        // F: attn(1) dispatch(1) mlp(1) combine(1); B mirrored: comm first.
        let f = [
            k("attn", Resource::Compute, 1.0),
            k("dispatch", Resource::Comm, 1.0),
            k("mlp", Resource::Compute, 1.0),
            k("combine", Resource::Comm, 1.0),
        ];
        let b = [
            k("combine_bwd", Resource::Comm, 1.0),
            k("mlp_bwd", Resource::Compute, 2.0),
            k("dispatch_bwd", Resource::Comm, 1.0),
            k("attn_bwd", Resource::Compute, 2.0),
        ];
        let s = schedule(&[&f, &b], 0.0);
        // Total compute 6, comm 4: perfectly overlappable to 6 plus a small edge.
        assert!(s.makespan < 7.0 + 1e-12, "{}", s.makespan);
        assert!(s.makespan >= 6.0);
        let serial = schedule(&[&f], 0.0).makespan + schedule(&[&b], 0.0).makespan;
        assert!(s.makespan < serial);
    }
}
