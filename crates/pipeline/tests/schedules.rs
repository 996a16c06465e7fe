//! Generators pass the verifier, memory matches the reference sheet, and the simulated bubble
//! equals the closed form in each method's regime (see docs/PIPELINE.md).

use pipeline::*;

const PPS: [usize; 3] = [4, 8, 16];

fn chunk_counts(m: Method, pp: usize) -> Vec<usize> {
    match m {
        Method::DualPipe => vec![2 * pp, 2 * pp + 2, 3 * pp, 4 * pp + 6],
        Method::DualPipeV => vec![pp, pp + 1, 2 * pp, 3 * pp + 3],
        _ => vec![1, pp - 1, pp, 2 * pp + 3, 4 * pp],
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn every_generated_schedule_verifies() {
    for m in Method::ALL {
        for pp in PPS {
            for ch in chunk_counts(m, pp) {
                let s = generate(m, pp, ch).unwrap();
                let rep = verify(&s).unwrap_or_else(|e| panic!("{m} pp={pp} chunks={ch}: {e}"));
                // F + (B or I+W) for every (micro-batch, stage).
                let stages = s.num_chains() * s.mbs_per_chain() * s.num_stages();
                assert!(rep.passes >= 2 * stages && rep.passes <= 3 * stages);
            }
        }
    }
}

#[test]
fn memory_matches_the_reference_sheet() {
    for pp in PPS {
        for ch in chunk_counts(Method::DualPipe, pp) {
            let r = verify(&generate(Method::DualPipe, pp, ch).unwrap()).unwrap();
            assert_eq!(
                r.peak_activations,
                vec![pp + 1; pp],
                "DualPipe pp={pp} ch={ch}"
            );
            assert_eq!(r.param_stages, vec![2; pp]);
        }
        for ch in chunk_counts(Method::DualPipeV, pp) {
            let r = verify(&generate(Method::DualPipeV, pp, ch).unwrap()).unwrap();
            assert_eq!(
                r.peak_activations,
                vec![pp + 1; pp / 2],
                "DualPipeV pp={pp} ch={ch}"
            );
            assert_eq!(r.param_stages, vec![2; pp / 2]);
        }
        let ch = 3 * pp;
        let r = verify(&generate(Method::OneFOneB, pp, ch).unwrap()).unwrap();
        let want: Vec<usize> = (0..pp).map(|r| pp - r).collect();
        assert_eq!(r.peak_activations, want);
        assert_eq!(r.param_stages, vec![1; pp]);
        let r = verify(&generate(Method::Zb1p, pp, ch).unwrap()).unwrap();
        assert_eq!(
            r.peak_activations,
            vec![pp; pp],
            "ZB-H1 keeps 1F1B's peak of PP"
        );
    }
}

/// Dyadic costs so every sum is exact in f64.
fn cost_grid() -> Vec<Costs> {
    let mut v = Vec::new();
    for f in [1.0, 1.5, 2.0, 3.0] {
        for b in [1.0, 2.0, 3.0, 4.0] {
            for w in [0.0, 0.25, 0.5, 1.0, 1.5, 2.0] {
                if w <= b {
                    v.push(Costs {
                        f,
                        b,
                        w,
                        fb: f + b,
                        p2p: 0.0,
                    });
                }
            }
        }
    }
    v
}

#[test]
fn one_f_one_b_bubble_is_exact_for_all_costs() {
    for c in cost_grid() {
        for pp in PPS {
            for ch in [pp, 2 * pp + 1, 4 * pp] {
                let t = simulate(&generate(Method::OneFOneB, pp, ch).unwrap(), &c).unwrap();
                let want = bubble_formula(Method::OneFOneB, pp, &c);
                // Every rank idles exactly the formula: all ranks do the same work.
                for &i in &t.idle {
                    assert!(close(i, want), "{c:?} pp={pp} ch={ch}: {i} vs {want}");
                }
            }
        }
    }
}

#[test]
fn zb1p_bubble_is_exact_in_its_regime() {
    // Regime: p2p = 0, at least PP micro-batches, W <= F and W <= I = B - W.
    for c in cost_grid() {
        for pp in PPS {
            for ch in [pp, 2 * pp + 1, 4 * pp] {
                let t = simulate(&generate(Method::Zb1p, pp, ch).unwrap(), &c).unwrap();
                let want = bubble_formula(Method::Zb1p, pp, &c);
                if 2.0 * c.w <= c.b && c.w <= c.f && ch >= pp {
                    for &i in &t.idle {
                        assert!(close(i, want), "{c:?} pp={pp} ch={ch}: {i} vs {want}");
                    }
                } else {
                    // Outside the regime the formula is optimistic (it can even go below the
                    // (PP-1)F a last rank must wait for its first input).
                    assert!(t.bubble() >= want - 1e-9);
                }
            }
        }
    }
}

#[test]
fn dualpipe_bubble_is_exact_in_its_regime() {
    // Regime: p2p = 0, F&B = F + B, the input-gradient part I = B - W costs one F, W <= F.
    for f in [0.5, 1.0, 1.5, 2.0, 3.0] {
        for w in [0.0, 0.5, 1.0, 2.0] {
            let c = Costs {
                f,
                b: f + w,
                w,
                fb: f + f + w,
                p2p: 0.0,
            };
            for m in [Method::DualPipe, Method::DualPipeV] {
                for pp in PPS {
                    for ch in chunk_counts(m, pp) {
                        let t = simulate(&generate(m, pp, ch).unwrap(), &c).unwrap();
                        let want = bubble_formula(m, pp, &c);
                        if c.w <= c.f {
                            for &i in &t.idle {
                                assert!(close(i, want), "{m} {c:?} pp={pp} ch={ch}: {i} vs {want}");
                            }
                        } else {
                            // A W longer than F no longer fits the drain's gaps.
                            assert!(t.bubble() > want, "{m} {c:?} pp={pp} ch={ch}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn dualpipe_beats_one_f_one_b_at_deepseek_costs() {
    // DeepSeek's figure: F=1, B=2, W=1.
    let c = Costs {
        f: 1.0,
        b: 2.0,
        w: 1.0,
        fb: 3.0,
        p2p: 0.0,
    };
    let dp = simulate(&generate(Method::DualPipe, 8, 20).unwrap(), &c).unwrap();
    let ob = simulate(&generate(Method::OneFOneB, 8, 20).unwrap(), &c).unwrap();
    assert_eq!(dp.bubble(), 6.0); // (8/2-1)(3+2-3)
    assert_eq!(ob.bubble(), 21.0); // (8-1)(1+2)
}

#[test]
fn latency_only_adds_time() {
    let c0 = Costs {
        f: 1.0,
        b: 2.0,
        w: 1.0,
        fb: 3.0,
        p2p: 0.0,
    };
    let c1 = Costs { p2p: 0.25, ..c0 };
    for m in Method::ALL {
        let s = generate(m, 8, 32).unwrap();
        let a = simulate(&s, &c0).unwrap();
        let b = simulate(&s, &c1).unwrap();
        assert!(b.makespan > a.makespan, "{m}");
        assert_eq!(a.busy, b.busy);
    }
}

#[test]
fn requests_a_method_cannot_serve_are_refused_with_the_rule() {
    let e = generate(Method::DualPipe, 5, 20).unwrap_err().to_string();
    assert!(e.contains("even PP"), "{e}");
    let e = generate(Method::DualPipe, 4, 9).unwrap_err().to_string();
    assert!(e.contains("even"), "{e}");
    let e = generate(Method::DualPipe, 8, 14).unwrap_err().to_string();
    assert!(e.contains("2*PP"), "{e}");
    let e = generate(Method::DualPipeV, 8, 6).unwrap_err().to_string();
    assert!(e.contains("at least"), "{e}");
    assert!(generate(Method::DualPipeV, 3, 6).is_err());
    assert!(generate(Method::OneFOneB, 0, 6).is_err());
    assert!(generate(Method::Zb1p, 4, 0).is_err());
    assert!("dualpipe".parse::<Method>().is_ok());
    assert!("2f2b".parse::<Method>().is_err());
}

#[test]
fn nonsense_costs_are_refused() {
    let s = generate(Method::OneFOneB, 4, 8).unwrap();
    let ok = Costs::default();
    for bad in [
        Costs { f: -1.0, ..ok },
        Costs { b: 0.0, ..ok },
        Costs { w: 3.0, ..ok },
        Costs { fb: 5.0, ..ok },
        Costs { fb: 1.0, ..ok },
        Costs {
            p2p: f64::NAN,
            ..ok
        },
    ] {
        assert!(
            matches!(simulate(&s, &bad), Err(ScheduleError::BadCosts(_))),
            "{bad:?}"
        );
    }
}

fn one(kind: PassKind, mb: usize) -> Op {
    Op::single(Pass::new(kind, mb, 0))
}

fn linear(ranks: Vec<Vec<Op>>, chunks: usize) -> Schedule {
    Schedule {
        method: Method::OneFOneB,
        pp: ranks.len(),
        chunks,
        layout: Layout::Linear,
        ranks,
    }
}

#[test]
fn verifier_rejects_broken_schedules() {
    use PassKind::*;
    // Missing backward.
    let s = linear(vec![vec![one(F, 0), one(B, 0)], vec![one(F, 0)]], 1);
    assert!(verify(&s).unwrap_err().to_string().contains("missing"));
    // Duplicate forward.
    let s = linear(
        vec![
            vec![one(F, 0), one(F, 0), one(B, 0)],
            vec![one(F, 0), one(B, 0)],
        ],
        1,
    );
    assert!(verify(&s).unwrap_err().to_string().contains("twice"));
    // Backward before own forward on one rank.
    let s = linear(
        vec![vec![one(F, 0), one(B, 0)], vec![one(B, 0), one(F, 0)]],
        1,
    );
    assert!(matches!(verify(&s), Err(ScheduleError::Invalid(_))));
    // W after a full B.
    let s = linear(vec![vec![one(F, 0), one(B, 0), one(W, 0)]], 1);
    assert!(verify(&s)
        .unwrap_err()
        .to_string()
        .contains("full backward"));
    // I without W.
    let s = linear(vec![vec![one(F, 0), one(I, 0)]], 1);
    assert!(verify(&s).is_err());
    // Cross-rank cycle: each rank waits for the other.
    let s = linear(
        vec![
            vec![one(F, 0), one(B, 0), one(F, 1), one(B, 1)],
            vec![one(F, 1), one(B, 1), one(F, 0), one(B, 0)],
        ],
        2,
    );
    assert!(matches!(verify(&s), Err(ScheduleError::Deadlock(_))));
    assert!(matches!(
        simulate(&s, &Costs::default()),
        Err(ScheduleError::Deadlock(_))
    ));
    // Bad dir and mb.
    let s = linear(vec![vec![Op::single(Pass::new(F, 0, 1))]], 1);
    assert!(verify(&s).unwrap_err().to_string().contains("dir"));
    let s = linear(vec![vec![one(F, 5)]], 1);
    assert!(verify(&s).unwrap_err().to_string().contains("out of range"));
    // Two forwards overlapped.
    let s = linear(
        vec![vec![Op::overlapped(Pass::new(F, 0, 0), Pass::new(F, 1, 0))]],
        2,
    );
    assert!(verify(&s).unwrap_err().to_string().contains("overlap"));
}
