//! [`MeshEngine`]: the inter-node engine over `dist`'s TCP mesh, for processes started by any
//! launcher (`ptxforge launch`, torchrun, mpirun without MPI). Each [`Msg`] is one mesh frame
//! ([`Msg::encode`]); the mesh's per-pair FIFO order is the engine's ordering guarantee, and a
//! lost peer becomes an [`EpError::Engine`] naming its rank.

use crate::engine::{Engine, Msg};
use crate::{EpError, Result};
use dist::{DistError, Group, Mesh};

/// The TCP mesh engine: endpoint = group rank.
pub struct MeshEngine {
    mesh: Mesh,
}

fn engine_err(e: DistError) -> EpError {
    EpError::Engine(e.to_string())
}

impl MeshEngine {
    /// Connects every rank of `group` (every rank calls it, as a collective).
    pub fn connect(group: &Group) -> Result<MeshEngine> {
        Ok(MeshEngine {
            mesh: Mesh::connect(group).map_err(engine_err)?,
        })
    }
}

impl Engine for MeshEngine {
    fn endpoint(&self) -> u32 {
        self.mesh.rank() as u32
    }
    fn endpoints(&self) -> u32 {
        self.mesh.world_size() as u32
    }
    fn send(&self, to: u32, msg: Msg) -> Result<()> {
        self.mesh
            .send(to as usize, msg.encode())
            .map_err(engine_err)
    }
    fn poll(&self) -> Result<Option<Msg>> {
        let Some((from, bytes)) = self.mesh.try_recv().map_err(engine_err)? else {
            return Ok(None);
        };
        let m = Msg::decode(&bytes)?;
        if m.from as usize != from {
            return Err(EpError::Engine(format!(
                "rank {from} sent a message that claims to come from endpoint {}",
                m.from
            )));
        }
        Ok(Some(m))
    }
    fn name(&self) -> &'static str {
        "tcp mesh"
    }
}
