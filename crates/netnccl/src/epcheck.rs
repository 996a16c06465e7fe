//! Expert-parallel dispatch (BF16, FP8) and weighted combine of a `nodes x gpus_per_node` group,
//! either in one process (every rank here, the direct in-process transport) or one process per
//! node with the other nodes reached through the proxy transport over [`NcclEngine`]. Every
//! process derives every rank's inputs from the seed and uploads only its own; the result is a
//! hash of every output of every hosted rank, which must be bit-identical across the modes.
//! Every received row is also checked against its source token. (The inputs, group and row check
//! are `ep::selfcheck`'s, shared with `netmpi::check`; smaller sizes, fewer operations.)

use crate::check::Res;
use crate::NcclEngine;
use ep::selfcheck::{dispatch_combine_hashes, CheckCfg};
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

/// Runs the check; returns `hash <rank> <output> <fnv64>` lines of the hosted ranks
/// (`ep::selfcheck::dispatch_combine_hashes`, the same check the TCP mesh engine runs).
pub fn run(c: &CheckCfg, engine: Option<NcclEngine>) -> Res<Vec<String>> {
    let engine = engine.map(|e| Box::new(e) as Box<dyn ep::Engine>);
    dispatch_combine_hashes(c, engine)
}
