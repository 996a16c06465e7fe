//! Which device does what: the `(dp, pp, ep)` coordinates of every device on the `nodes x
//! devices_per_node` grid, and the MoE layer's configuration of one expert-parallel group.
//!
//! An EP group spans `ep_nodes` nodes with `ep / ep_nodes` devices on each, as V3 spreads an
//! EP group over nodes (dispatch and combine then cross nodes and node-limited routing
//! matters), while the pipeline neighbours of a device sit on its own node. Nodes are taken in
//! blocks of `ep_nodes`; a block holds `devices_per_node / (ep / ep_nodes)` (dp, pp) groups,
//! filled pipeline rank first, then data-parallel replica. The default (2 nodes x 4, PP 2, EP 4
//! over 2 nodes): pipeline rank 0 on local devices 0-1 of both nodes, rank 1 on 2-3.

use super::TrainConfig;
use crate::moe::MoeConfig;

/// One device's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRole {
    /// Global device index: `node * devices_per_node + local`.
    pub device: u32,
    pub node: u32,
    pub local: u32,
    pub dp: u32,
    pub pp: u32,
    pub ep: u32,
}

impl TrainConfig {
    /// Every device's role, by global device index (call after `validate`).
    pub fn placement(&self) -> Vec<DeviceRole> {
        let p = &self.parallel;
        let per_node = (p.ep / p.ep_nodes.max(1)).max(1);
        let groups_per_block = (p.devices_per_node / per_node).max(1);
        let mut out = Vec::with_capacity(self.devices() as usize);
        for dp in 0..p.dp {
            for pp in 0..p.pp {
                let g = dp * p.pp + pp;
                let (block, slot) = (g / groups_per_block, g % groups_per_block);
                for ep in 0..p.ep {
                    let node = block * p.ep_nodes + ep / per_node;
                    let local = slot * per_node + ep % per_node;
                    let device = node * p.devices_per_node + local;
                    out.push(DeviceRole {
                        device,
                        node,
                        local,
                        dp,
                        pp,
                        ep,
                    });
                }
            }
        }
        out.sort_by_key(|r| r.device);
        out
    }

    /// The MoE layer of one EP group: `ep_nodes x (ep / ep_nodes)` ranks (rank = EP rank), the
    /// model's expert sizes and routing, `seq_len x micro_batch / ep` tokens per rank.
    pub fn moe_config(&self) -> MoeConfig {
        let (m, p, t) = (&self.model, &self.parallel, &self.train);
        MoeConfig {
            nodes: p.ep_nodes,
            gpus_per_node: p.ep / p.ep_nodes.max(1),
            hidden: m.hidden,
            experts: m.routed_experts,
            intermediate: m.expert_intermediate,
            tokens: t.seq_len * (t.micro_batch / p.ep.max(1)),
            topk: m.topk,
            groups: m.groups,
            topk_groups: m.topk_groups,
            route_scaling: m.route_scaling,
            shared: m.shared_experts == 1,
            num_sms: p.comm_sms,
            seed: t.seed,
            // a token's expert outputs summed in slot order on its home rank: the sum does
            // not depend on where the experts are (bit identity with a single-device run)
            slot_combine: true,
            ..MoeConfig::small()
        }
    }
}
