//! Re-simulates the JSON report from scratch — own stage mapping, own dependency rules, own
//! cost table, no code shared with `pipeline::timing` — and checks it reproduces every op's
//! start and end, the per-rank bubble and the formula value.

use std::collections::HashMap;

use pipeline::{generate, Costs, Method, Report};
use serde_json::Value;

fn stage_of(method: &str, devices: usize, rank: usize, dir: usize) -> (usize, usize) {
    match (method, dir) {
        ("1f1b" | "zb1p", 0) => (0, rank),
        ("dualpipe", 0) => (0, rank),
        ("dualpipe", 1) => (1, devices - 1 - rank),
        ("dualpipev", 0) => (0, rank),
        ("dualpipev", 1) => (0, 2 * devices - 1 - rank),
        _ => panic!("unexpected {method} dir {dir}"),
    }
}

fn resimulate(json: &Value) {
    let method = json["method"].as_str().unwrap();
    let c = &json["costs"];
    let (f, b, w, fb, p2p) = (
        c["f"].as_f64().unwrap(),
        c["b"].as_f64().unwrap(),
        c["w"].as_f64().unwrap(),
        c["fb"].as_f64().unwrap(),
        c["p2p"].as_f64().unwrap(),
    );
    let ranks = json["ranks"].as_array().unwrap();
    let d = ranks.len();
    let last_stage = if method == "dualpipev" {
        2 * d - 1
    } else {
        d - 1
    };
    // (class, chain, mb, stage) -> (rank, end); class 0 = F, 1 = B or I, 2 = W.
    let mut done: HashMap<(u8, usize, usize, usize), (usize, f64)> = HashMap::new();
    let mut pos = vec![0usize; d];
    let mut free = vec![0.0f64; d];
    let mut got: Vec<Vec<(f64, f64)>> = vec![Vec::new(); d];
    loop {
        let mut moved = false;
        for r in 0..d {
            let ops = ranks[r].as_array().unwrap();
            'next: while pos[r] < ops.len() {
                let passes = ops[pos[r]]["passes"].as_array().unwrap();
                let mut start = free[r];
                let mut keys = Vec::new();
                let mut dur = 0.0;
                for p in passes {
                    let kind = p["kind"].as_str().unwrap();
                    let mb = p["mb"].as_u64().unwrap() as usize;
                    let (chain, st) = stage_of(method, d, r, p["dir"].as_u64().unwrap() as usize);
                    let mut need = Vec::new();
                    let class = match kind {
                        "F" => {
                            if st > 0 {
                                need.push((0u8, chain, mb, st - 1));
                            }
                            dur += f;
                            0u8
                        }
                        "B" | "I" => {
                            need.push((0, chain, mb, st));
                            if st < last_stage {
                                need.push((1, chain, mb, st + 1));
                            }
                            dur += if kind == "B" { b } else { b - w };
                            1
                        }
                        "W" => {
                            need.push((1, chain, mb, st));
                            dur += w;
                            2
                        }
                        k => panic!("kind {k}"),
                    };
                    for n in need {
                        match done.get(&n) {
                            None => break 'next,
                            Some(&(pr, t)) => start = start.max(if pr == r { t } else { t + p2p }),
                        }
                    }
                    keys.push((class, chain, mb, st));
                }
                if passes.len() == 2 {
                    // An overlapped forward+backward costs fb (less w for an input-only backward).
                    let has_i = passes.iter().any(|p| p["kind"] == "I");
                    dur = if has_i { fb - w } else { fb };
                }
                let end = start + dur;
                for k in keys {
                    assert!(done.insert(k, (r, end)).is_none(), "{k:?} twice");
                }
                got[r].push((start, end));
                free[r] = end;
                pos[r] += 1;
                moved = true;
            }
        }
        if (0..d).all(|r| pos[r] == ranks[r].as_array().unwrap().len()) {
            break;
        }
        assert!(moved, "re-simulation stalled");
    }
    let makespan = free.iter().cloned().fold(0.0, f64::max);
    let tol = 1e-9 * (1.0 + makespan);
    for r in 0..d {
        let ops = ranks[r].as_array().unwrap();
        let mut busy = 0.0;
        for (k, op) in ops.iter().enumerate() {
            let (s, e) = got[r][k];
            assert!(
                (op["start"].as_f64().unwrap() - s).abs() < tol,
                "{method} rank {r} op {k} start"
            );
            assert!(
                (op["end"].as_f64().unwrap() - e).abs() < tol,
                "{method} rank {r} op {k} end"
            );
            busy += e - s;
        }
        let idle = json["bubble"][r].as_f64().unwrap();
        assert!(
            (idle - (makespan - busy)).abs() < tol,
            "{method} rank {r} bubble"
        );
    }
    // The formula value matches the sheet, computed here by hand.
    let pp = json["pp"].as_f64().unwrap();
    let want = match method {
        "1f1b" => (pp - 1.0) * (f + b),
        "zb1p" => (pp - 1.0) * (f + b - 2.0 * w),
        _ => (pp / 2.0 - 1.0) * (fb + b - 3.0 * w),
    };
    assert!((json["bubble_formula"].as_f64().unwrap() - want).abs() < 1e-9);
}

#[test]
fn json_reproduces_under_independent_resimulation() {
    let costs = [
        Costs {
            f: 1.0,
            b: 2.0,
            w: 0.5,
            fb: 2.6,
            p2p: 0.0,
        },
        Costs {
            f: 1.0,
            b: 2.0,
            w: 1.0,
            fb: 3.0,
            p2p: 0.0,
        },
        Costs {
            f: 1.3,
            b: 2.2,
            w: 0.7,
            fb: 2.9,
            p2p: 0.15,
        },
    ];
    for m in Method::ALL {
        for pp in [4usize, 8, 16] {
            let chunks: &[usize] = match m {
                Method::DualPipe => &[2 * pp, 3 * pp],
                Method::DualPipeV => &[pp, 2 * pp + 1],
                _ => &[pp / 2, 2 * pp],
            };
            for &ch in chunks {
                let s = generate(m, pp, ch).unwrap();
                for c in &costs {
                    let text =
                        serde_json::to_string(&Report::new(&s, c).unwrap().to_json()).unwrap();
                    let json: Value = serde_json::from_str(&text).unwrap();
                    for key in [
                        "method",
                        "pp",
                        "chunks",
                        "costs",
                        "ranks",
                        "bubble",
                        "bubble_formula",
                        "peak_activations",
                    ] {
                        assert!(json.get(key).is_some(), "missing {key}");
                    }
                    resimulate(&json);
                }
            }
        }
    }
}
