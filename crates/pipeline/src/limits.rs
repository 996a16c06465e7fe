//! Limits on the sizes a schedule request may ask for, in one place (docs/RELIABILITY.md,
//! "Limits", lists them and why). Every op of a schedule is held in memory, simulated and
//! drawn, so the request is bounded before anything is generated.

/// Pipeline ranks (stages for DualPipeV): far above any real pipeline (V3 trains with 16).
pub const MAX_PP: usize = 1024;
/// Micro-batches of one schedule.
pub const MAX_CHUNKS: usize = 1 << 16;
/// Passes of one schedule (`pp * chunks`, each micro-batch passing every stage): keeps a
/// schedule, its timeline and its verification to a few hundred MB at most.
pub const MAX_PASSES: usize = 1 << 22;
/// Largest cost of one pass (any unit): sums over [`MAX_PASSES`] passes stay finite and exact
/// to well below one unit.
pub const MAX_COST: f64 = 1e9;
/// Pixels of a PNG timeline (4096 x 16384 pixels, 192 MiB of RGB): larger schedules are drawn
/// as SVG.
pub const MAX_PICTURE_PIXELS: usize = 1 << 26;
