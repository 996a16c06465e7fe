//! `emu`: a CPU emulator for PTX kernels (work in progress).
pub mod fp;
pub mod mma;
/// The values of one register across the 32 lanes of a warp (raw bits, zero-extended).
pub type Lanes = [u64; 32];
