//! Non-finite detection: the trainer checks each loss, gradient and updated parameter it reads
//! back and stops naming the step, layer and tensor (issue 14: "a NaN/Inf loss stops the run
//! naming the step, layer and tensor"), before a bad value reaches a checkpoint.

/// Where a tensor belongs.
#[derive(Clone, Debug, PartialEq)]
pub struct Site {
    /// Optimizer step (0-based).
    pub step: u64,
    /// Decoder layer, `None` for the embedding, head or loss.
    pub layer: Option<u32>,
    pub tensor: String,
}

/// A tensor holding NaN or infinite values: the first one, and how many.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("step {}: {}{}: {count} non-finite value(s), first {value} at index {index}", site.step, layer(site.layer), site.tensor)]
pub struct NonFinite {
    pub site: Site,
    pub index: usize,
    pub value: f32,
    pub count: usize,
}

fn layer(l: Option<u32>) -> String {
    l.map(|l| format!("layer {l}: ")).unwrap_or_default()
}

/// `Ok` if every value is finite, else the first offending index and value and the count.
pub fn check_finite(site: impl FnOnce() -> Site, data: &[f32]) -> Result<(), NonFinite> {
    let Some(index) = data.iter().position(|v| !v.is_finite()) else {
        return Ok(());
    };
    Err(NonFinite {
        site: site(),
        index,
        value: data[index],
        count: data[index..].iter().filter(|v| !v.is_finite()).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_step_layer_and_tensor() {
        let site = || Site {
            step: 7,
            layer: Some(2),
            tensor: "moe.w_down.grad".into(),
        };
        assert!(check_finite(site, &[1.0, -3.5, f32::MAX]).is_ok());
        let e = check_finite(site, &[1.0, f32::INFINITY, 2.0, f32::NAN]).unwrap_err();
        assert_eq!((e.index, e.count), (1, 2));
        assert_eq!(
            e.to_string(),
            "step 7: layer 2: moe.w_down.grad: 2 non-finite value(s), first inf at index 1"
        );
        let loss = || Site {
            step: 0,
            layer: None,
            tensor: "loss".into(),
        };
        let e = check_finite(loss, &[f32::NAN]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "step 0: loss: 1 non-finite value(s), first NaN at index 0"
        );
    }
}
