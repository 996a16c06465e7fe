//! Inter-node transport. Dispatch and combine kernels move data across nodes with one-sided puts
//! into ring buffers that live in the receiving rank's memory. A [`Transport`] hands out the
//! addresses a kernel may write through for a remote rank (the RDMA-registered window of that
//! rank) and classifies links; byte counting happens on the device (per link class counters).
//!
//! [`InProcessTransport`] emulates several nodes inside one process: every emulated device shares
//! the emulator's unified address space, so the "remote window" of a rank on another node is
//! simply its buffer address. Kernels write through it directly (no host proxy thread): the put
//! is a sequence of stores followed by a release store of the ring's tail counter, exactly the
//! ordering an RDMA write + atomic/fenced flag update gives on InfiniBand.
//!
//! [`crate::proxy::ProxyTransport`] is the real-process model: kernels write local send
//! windows and host proxy threads move the records through an [`crate::engine::Engine`]
//! (channels in process, MPI across processes).

use crate::proxy::WindowSpec;
use crate::Result;
use runtime::{Buffer, Device};
use serde::Serialize;

/// Which physical link a transfer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum LinkClass {
    /// Same rank (no link).
    Local,
    /// Same node, other GPU (NVLink).
    IntraNode,
    /// Other node (InfiniBand / RDMA).
    InterNode,
}

/// One-sided access to remote ranks' communication windows.
pub trait Transport: Send + Sync {
    fn ranks(&self) -> u32;
    fn gpus_per_node(&self) -> u32;
    fn node_of(&self, rank: u32) -> u32 {
        rank / self.gpus_per_node()
    }
    /// The link between two ranks.
    fn link(&self, src: u32, dst: u32) -> LinkClass {
        if src == dst {
            LinkClass::Local
        } else if self.node_of(src) == self.node_of(dst) {
            LinkClass::IntraNode
        } else {
            LinkClass::InterNode
        }
    }
    /// Address through which a kernel running on rank `src` puts into `buf` (owned by rank
    /// `dst`) on another node.
    fn remote_ptr(&self, src: u32, dst: u32, buf: &Buffer<u8>) -> runtime::Result<u64>;
    fn name(&self) -> &'static str;

    /// Address through which rank `src`'s kernels put into `buf` (rank `dst`'s window, on
    /// another node) laid out as `spec` says. Transports without a host proxy ignore the layout.
    fn window(&self, src: u32, dst: u32, buf: &Buffer<u8>, spec: &WindowSpec) -> Result<u64> {
        let _ = spec;
        Ok(self.remote_ptr(src, dst, buf)?)
    }
    /// Registers rank `owner`'s window `buf` (hosted by this process) for puts from rank `src`,
    /// hosted by another process. Only transports that span processes support it.
    fn expose(&self, owner: u32, src: u32, buf: &Buffer<u8>, spec: &WindowSpec) -> Result<()> {
        let _ = (buf, spec);
        Err(crate::EpError::Config(format!(
            "transport '{}' cannot expose rank {owner}'s window to rank {src} of another process",
            self.name()
        )))
    }
    /// Address through which rank `src` (hosted here) puts into rank `dst`'s window of `bytes`
    /// (hosted by another process). Only transports that span processes support it.
    fn attach(&self, src: u32, dst: u32, bytes: usize, spec: &WindowSpec) -> Result<u64> {
        let _ = (bytes, spec);
        Err(crate::EpError::Config(format!(
            "transport '{}' cannot reach rank {dst} of another process from rank {src}",
            self.name()
        )))
    }
    /// All-gather of per-rank rows: `mine[i]` belongs to hosted rank `hosted[i]`; returns one
    /// row per rank of the job, in rank order (a collective over every process).
    fn all_gather(&self, hosted: &[u32], mine: Vec<Vec<u32>>) -> Result<Vec<Vec<u32>>> {
        if hosted.len() != self.ranks() as usize
            || hosted.iter().enumerate().any(|(i, &r)| r != i as u32)
        {
            return Err(crate::EpError::Config(format!(
                "transport '{}' hosts every rank in this process; an all-gather over processes needs a proxy transport",
                self.name()
            )));
        }
        Ok(mine)
    }
    /// The next operation's records in ring windows `key` are `bytes` long, the rest of each
    /// slot unwritten (a proxy ships only those bytes). Transports without a proxy ignore it.
    fn record_bytes(&self, key: u32, bytes: u32) -> Result<()> {
        let _ = (key, bytes);
        Ok(())
    }
    /// Before an operation's launches, once every rank's counters are reset (a proxy starts a
    /// new epoch and fences with its peers here).
    fn begin(&self) -> Result<()> {
        Ok(())
    }
    /// After an operation's kernels finished on the hosted ranks: every put has landed when it
    /// returns.
    fn end(&self) -> Result<()> {
        Ok(())
    }
    /// An operation failed: stop waiting for it (no fences).
    fn abort(&self) {}
    /// Per hosted node: what its host proxy moved (empty without a proxy).
    fn proxy_stats(&self) -> Vec<(u32, crate::proxy::ProxyStats)> {
        Vec::new()
    }
}

/// Several nodes emulated in one process (see the module docs).
pub struct InProcessTransport {
    pub devices: Vec<Device>,
    pub gpus_per_node: u32,
}

impl Transport for InProcessTransport {
    fn ranks(&self) -> u32 {
        self.devices.len() as u32
    }
    fn gpus_per_node(&self) -> u32 {
        self.gpus_per_node
    }
    fn remote_ptr(&self, src: u32, _dst: u32, buf: &Buffer<u8>) -> runtime::Result<u64> {
        buf.peer_ptr(&self.devices[src as usize])
    }
    fn name(&self) -> &'static str {
        "in-process (unified address space, direct remote stores)"
    }
}
