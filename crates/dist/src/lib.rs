//! The process layer of multi-process jobs: one rank per process, as torchrun and mpirun run
//! them. This crate owns
//!
//! - [`env`]: the rank environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//!   `MASTER_ADDR`, `MASTER_PORT`, or Open MPI's `OMPI_COMM_WORLD_*`; `PTXFORGE_JOB_ID`,
//!   `PTXFORGE_BOOTSTRAP_TIMEOUT`, `PTXFORGE_PEER_TIMEOUT`), validated;
//! - [`Bootstrap`] / [`Group`]: the TCP rendezvous store rank 0 hosts (`set`/`get`/`wait`,
//!   `barrier`, `all_gather`), the bootstrap config check (version + caller config on every
//!   rank), and the liveness watchdog that turns a peer's death into
//!   [`DistError::PeerDied`] on every rank within the peer timeout;
//! - [`launch`]: the local launcher behind `ptxforge launch` (signal forwarding, no orphans,
//!   output prefixes, shared-memory clean-up);
//! - [`mesh`]: a full mesh of TCP connections between the ranks (framed bytes, one writer
//!   and one reader thread per link), the transport of `ep::MeshEngine`;
//! - [`shm`]: the job's `/dev/shm/ptxforge-{job}-*` segment names and their removal;
//! - [`selftest`]: the test program the launcher tests run as every rank;
//! - [`testing`]: support for tests of multi-process programs (ports, rank environments,
//!   children waited for with a deadline).
//!
//! The store carries small things (bootstrap data, handles, liveness); bulk data moves through
//! the engines built on top (shared memory within a node; the [`mesh`], MPI or NCCL across
//! nodes).
//! docs/SCALE.md describes the design.

mod client;
pub mod env;
pub mod error;
pub mod fingerprint;
mod group;
pub mod launch;
pub mod mesh;
pub mod selftest;
mod server;
pub mod shm;
pub mod testing;
mod watchdog;
mod wire;

pub use env::DistEnv;
pub use error::{DistError, FieldDiff, Result};
pub use group::{Bootstrap, Group};
pub use mesh::Mesh;
pub use watchdog::{DeathHook, FaultAction};
