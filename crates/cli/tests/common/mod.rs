//! Shared by the CLI tests (`mod common;`).

/// `ptxforge moe` at the tests' small size: 2 nodes x 2 emulated devices, hidden 256, 16
/// experts (top-4 of 4 groups, 2 groups per token), 128 tokens per device, 4 communication SMs.
pub const SMALL_MOE: &[&str] = &[
    "moe",
    "--nodes",
    "2",
    "--gpus-per-node",
    "2",
    "--hidden",
    "256",
    "--experts",
    "16",
    "--intermediate",
    "128",
    "--tokens",
    "128",
    "--topk",
    "4",
    "--groups",
    "4",
    "--topk-groups",
    "2",
    "--num-sms",
    "4",
];

/// `SMALL_MOE` followed by `extra`.
pub fn small_moe(extra: &[&str]) -> Vec<String> {
    SMALL_MOE
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}
