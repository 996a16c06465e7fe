//! TEMPORARY host stand-ins for kernels being written (to be replaced by `kernels::`).
#![allow(clippy::too_many_arguments)]
use half::bf16;
use runtime::{Buffer, Stream};

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}
fn q1x128(v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut q = Vec::new();
    let mut s = Vec::new();
    for b in v.chunks(128) {
        let amax = b.iter().fold(0f32, |a, x| a.max(x.abs()));
        let sc = if amax == 0.0 {
            1.0
        } else {
            (amax / 448.0).log2().ceil().exp2()
        };
        s.push(sc);
        q.extend(b.iter().map(|&x| emu::fp::f32_to_e4m3(x / sc, true)));
    }
    (q, s)
}

pub fn swiglu_fwd_fp8(
    st: &Stream,
    gu: &Buffer<bf16>,
    mi: &Buffer<i32>,
    aq: &mut Buffer<u8>,
    asc: &mut Buffer<f32>,
    m: usize,
    i: usize,
) -> anyhow::Result<()> {
    st.synchronize()?;
    let g = gu.to_vec()?;
    let mi = mi.to_vec()?;
    let mut act = vec![0f32; m * i];
    for r in 0..m {
        if mi[r] < 0 {
            continue;
        }
        for j in 0..i {
            act[r * i + j] = silu(g[r * 2 * i + j].to_f32()) * g[r * 2 * i + i + j].to_f32();
        }
    }
    let (q, s) = q1x128(&act);
    aq.copy_from_host(&q)?;
    asc.copy_from_host(&s)?;
    Ok(())
}

pub fn swiglu_bwd(
    st: &Stream,
    gu: &Buffer<bf16>,
    dh: &Buffer<bf16>,
    row_w: &Buffer<f32>,
    mi: &Buffer<i32>,
    gq: &mut Buffer<u8>,
    gs: &mut Buffer<f32>,
    dgu_w: &mut Buffer<bf16>,
    act_w: &mut Buffer<bf16>,
    m: usize,
    i: usize,
) -> anyhow::Result<()> {
    st.synchronize()?;
    let (g, d, w, mi) = (gu.to_vec()?, dh.to_vec()?, row_w.to_vec()?, mi.to_vec()?);
    let mut dgu = vec![0f32; m * 2 * i];
    let mut dw = vec![bf16::ZERO; m * 2 * i];
    let mut aw = vec![bf16::ZERO; m * i];
    for r in 0..m {
        if mi[r] < 0 {
            continue;
        }
        for j in 0..i {
            let x = g[r * 2 * i + j].to_f32();
            let u = g[r * 2 * i + i + j].to_f32();
            let dd = d[r * i + j].to_f32();
            let s = 1.0 / (1.0 + (-x).exp());
            let dgv = dd * u * s * (1.0 + x * (1.0 - s));
            let duv = dd * silu(x);
            dgu[r * 2 * i + j] = dgv;
            dgu[r * 2 * i + i + j] = duv;
            dw[r * 2 * i + j] = bf16::from_f32(w[r] * dgv);
            dw[r * 2 * i + i + j] = bf16::from_f32(w[r] * duv);
            aw[r * i + j] = bf16::from_f32(w[r] * silu(x) * u);
        }
    }
    let (q, s) = q1x128(&dgu);
    gq.copy_from_host(&q)?;
    gs.copy_from_host(&s)?;
    dgu_w.copy_from_host(&dw)?;
    act_w.copy_from_host(&aw)?;
    Ok(())
}

pub fn quantize_fp8_1x128_t(
    st: &Stream,
    x: &Buffer<bf16>,
    mi: Option<&Buffer<i32>>,
    q: &mut Buffer<u8>,
    s: &mut Buffer<f32>,
    m: usize,
    c: usize,
) -> anyhow::Result<()> {
    st.synchronize()?;
    let xv = x.to_vec()?;
    let mi = match mi {
        Some(b) => b.to_vec()?,
        None => vec![0; m],
    };
    let mut t = vec![0f32; c * m];
    for r in 0..m {
        if mi[r] < 0 {
            continue;
        }
        for j in 0..c {
            t[j * m + r] = xv[r * c + j].to_f32();
        }
    }
    let (qq, ss) = q1x128(&t);
    q.copy_from_host(&qq)?;
    s.copy_from_host(&ss)?;
    Ok(())
}

pub fn wgrad_fp8_kgrouped(
    st: &Stream,
    a: &Buffer<u8>,
    sa: &Buffer<f32>,
    b: &Buffer<u8>,
    sb: &Buffer<f32>,
    ks: &Buffer<i32>,
    d: &mut Buffer<f32>,
    m: usize,
    n: usize,
    kt: usize,
    groups: usize,
) -> anyhow::Result<()> {
    st.synchronize()?;
    let (a, sa, b, sb, ks) = (
        a.to_vec()?,
        sa.to_vec()?,
        b.to_vec()?,
        sb.to_vec()?,
        ks.to_vec()?,
    );
    let deq = |q: &[u8], s: &[f32], rows: usize| -> Vec<f32> {
        (0..rows * kt)
            .map(|i| emu::fp::e4m3_to_f32(q[i]) * s[i / 128])
            .collect()
    };
    let (ad, bd) = (deq(&a, &sa, m), deq(&b, &sb, n));
    let mut out = vec![0f32; groups * m * n];
    for gi in 0..groups {
        let (k0, k1) = (ks[gi] as usize, ks[gi + 1] as usize);
        for r in 0..m {
            for c in 0..n {
                let mut acc = 0f32;
                for k in k0..k1 {
                    acc += ad[r * kt + k] * bd[c * kt + k];
                }
                out[gi * m * n + r * n + c] = acc;
            }
        }
    }
    d.copy_from_host(&out)?;
    Ok(())
}
