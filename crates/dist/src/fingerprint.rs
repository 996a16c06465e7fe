//! The bootstrap config check. Every rank contributes a fingerprint — the ptxforge version and
//! the caller's configuration as JSON — and every rank compares all of them with rank 0's, so
//! a mismatch is reported alike on every rank, naming each differing rank and field.

use crate::error::{DistError, FieldDiff, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// This build's fingerprint for `config`.
pub fn fingerprint(config: &Value) -> Value {
    json!({ "version": env!("CARGO_PKG_VERSION"), "config": config })
}

/// Compares every rank's fingerprint with rank 0's (bytes as gathered).
pub fn check(all: &[Vec<u8>]) -> Result<()> {
    let parsed: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(r, b)| {
            serde_json::from_slice(b).map_err(|e| {
                DistError::Protocol(format!("rank {r} sent a malformed fingerprint: {e}"))
            })
        })
        .collect::<Result<_>>()?;
    let Some(base) = parsed.first() else {
        return Ok(());
    };
    let base_fields = flatten(base);
    let mut diffs = Vec::new();
    for (rank, v) in parsed.iter().enumerate().skip(1) {
        diffs.extend(diff(rank, &base_fields, &flatten(v)));
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(DistError::ConfigMismatch { diffs })
    }
}

fn diff(
    rank: usize,
    base: &BTreeMap<String, String>,
    other: &BTreeMap<String, String>,
) -> Vec<FieldDiff> {
    const ABSENT: &str = "<absent>";
    let mut keys: Vec<&String> = base.keys().chain(other.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| base.get(*k) != other.get(*k))
        .map(|k| FieldDiff {
            rank,
            field: k.clone(),
            value: other.get(k).map_or(ABSENT, |s| s).to_string(),
            rank0_value: base.get(k).map_or(ABSENT, |s| s).to_string(),
        })
        .collect()
}

/// Leaf values by dotted path (`config.moe.hidden`, `config.sizes[2]`).
fn flatten(v: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(v, String::new(), &mut out);
    out
}

fn walk(v: &Value, path: String, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(x, p, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                walk(x, format!("{path}[{i}]"), out);
            }
        }
        leaf => {
            out.insert(path, leaf.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &Value) -> Vec<u8> {
        serde_json::to_vec(&fingerprint(v)).unwrap()
    }

    #[test]
    fn equal_configs_pass_and_differences_name_rank_and_field() {
        let a = json!({"hidden": 64, "experts": [4, 8], "name": "x"});
        check(&[bytes(&a), bytes(&a), bytes(&a)]).unwrap();
        let b = json!({"hidden": 128, "experts": [4, 8], "name": "x"});
        let c = json!({"hidden": 64, "experts": [4, 9]});
        let e = check(&[bytes(&a), bytes(&b), bytes(&c)]).unwrap_err();
        let DistError::ConfigMismatch { diffs } = &e else {
            panic!("{e}")
        };
        let got: Vec<(usize, &str, &str, &str)> = diffs
            .iter()
            .map(|d| {
                (
                    d.rank,
                    d.field.as_str(),
                    d.value.as_str(),
                    d.rank0_value.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (1, "config.hidden", "128", "64"),
                (2, "config.experts[1]", "9", "8"),
                (2, "config.name", "<absent>", "\"x\""),
            ]
        );
        let msg = e.to_string();
        assert!(
            msg.contains("rank 1 has `config.hidden` = 128 where rank 0 has 64"),
            "{msg}"
        );
        let mut other_version: Value = fingerprint(&a);
        other_version["version"] = json!("0.0.9");
        let v = serde_json::to_vec(&other_version).unwrap();
        let e = check(&[bytes(&a), v]).unwrap_err().to_string();
        assert!(e.contains("`version`") && e.contains("0.0.9"), "{e}");
        assert!(check(&[bytes(&a), b"{".to_vec()]).is_err());
    }
}
