//! The threaded executor's loss and gradients equal the unpipelined reference bit for bit.

use pipeline::*;

#[test]
fn pipelined_gradients_equal_the_reference_for_every_method() {
    let cfg = ExecConfig::default();
    for m in Method::ALL {
        for pp in [4usize, 8] {
            let chunks: &[usize] = match m {
                Method::DualPipe => &[2 * pp, 2 * pp + 4],
                Method::DualPipeV => &[pp, pp + 3],
                _ => &[3, 2 * pp],
            };
            for &ch in chunks {
                let s = generate(m, pp, ch).unwrap();
                let c = check_against_reference(&s, &cfg).unwrap();
                assert!(c.exact, "{m} pp={pp} ch={ch}: {c:?}");
                assert_eq!(c.max_grad_diff, 0.0);
                assert!(c.loss > 0.0);
            }
        }
    }
}

#[test]
fn gradients_are_real_not_zero() {
    let s = generate(Method::DualPipe, 4, 8).unwrap();
    let r = execute(&s, &ExecConfig::default()).unwrap();
    assert_eq!(r.grads.len(), 4);
    for g in &r.grads {
        assert!(g.w.iter().any(|v| v.abs() > 1e-6));
    }
}

#[test]
fn broken_schedules_are_refused_not_run() {
    let mut s = generate(Method::OneFOneB, 4, 8).unwrap();
    s.ranks[2].swap(0, 5);
    assert!(execute(&s, &ExecConfig::default()).is_err());
    let s = generate(Method::OneFOneB, 2, 2).unwrap();
    assert!(execute(
        &s,
        &ExecConfig {
            width: 0,
            batch: 1,
            seed: 1
        }
    )
    .is_err());
}
