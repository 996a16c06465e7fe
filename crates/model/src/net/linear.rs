//! BF16 linear layers `y = x W^T` on one rank: the weight and its transpose on the device, and
//! the three GEMMs of a training step (forward, dgrad `dX = dY W`, wgrad `dW = dY^T X`), plus
//! the small device helpers every block uses (allocation, transposes, residual adds).
//!
//! Every helper that allocates temporaries synchronises its stream before returning: a device
//! buffer is freed when dropped, so a queued kernel must have finished reading it.

use crate::TrainError;
use half::bf16;
use kernels::train::ops;
use kernels::{GemmBufs, GemmProblem, InTy, OutTy};
use runtime::{Buffer, Device, Stream};

pub(crate) type Result<T> = std::result::Result<T, TrainError>;

/// A block's weight gradients on one rank: (parameter name suffix, f32 values).
pub(crate) type Grads = Vec<(&'static str, Vec<f32>)>;

/// A backward's input gradient and weight gradients on one rank.
pub(crate) type WithGrads = (Buffer<bf16>, Grads);

/// One EP rank's device and the stream the stage's kernels run on.
pub(crate) struct Ctx {
    pub dev: Device,
    pub st: Stream,
    /// Fill every buffer allocated here with NaN first (tests: an output a kernel fails to
    /// write shows up).
    pub poison: bool,
}

impl Ctx {
    /// The rank's context with a stream of its own (two stages on one device, as DualPipeV
    /// places them, then do not share a queue) on the device's compute partition: the top
    /// `comm_sms` SMs stay free for dispatch/combine, as V3 reserves them.
    pub fn new(dev: &Device, comm_sms: u32) -> Result<Ctx> {
        Ok(Ctx {
            dev: dev.clone(),
            st: dev.partition(comm_sms)?.1.stream()?,
            poison: false,
        })
    }

    pub fn bf(&self, n: usize) -> Result<Buffer<bf16>> {
        let b = self.dev.alloc::<bf16>(n.max(1))?;
        if self.poison {
            self.st.fill(&b, bf16::NAN)?;
        }
        Ok(b)
    }

    pub fn f32(&self, n: usize) -> Result<Buffer<f32>> {
        let b = self.dev.alloc::<f32>(n.max(1))?;
        if self.poison {
            self.st.fill(&b, f32::NAN)?;
        }
        Ok(b)
    }

    /// `x [rows, cols]` (bf16 or f32) transposed to bf16 `[cols, rows]`.
    pub fn transpose<T: kernels::train::Elem>(
        &self,
        x: &Buffer<T>,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer<bf16>> {
        let mut t = self.bf(rows * cols)?;
        ops::transpose_bf16(&self.st, x, &mut t, rows, cols)?;
        Ok(t)
    }

    /// `bf16(a + b)` over `n` elements.
    pub fn add(&self, a: &Buffer<bf16>, b: &Buffer<bf16>, n: usize) -> Result<Buffer<bf16>> {
        let mut o = self.bf(n)?;
        ops::bf16_add(&self.st, a, b, &mut o, n)?;
        Ok(o)
    }

    /// `D [m, n] = A [m, k] B [n, k]^T (+ C)`, BF16 operands, f32 accumulation, BF16 out.
    pub fn gemm(
        &self,
        a: &Buffer<bf16>,
        b: &Buffer<bf16>,
        (m, n, k): (usize, usize, usize),
        c: Option<&Buffer<bf16>>,
    ) -> Result<Buffer<bf16>> {
        let d = self.bf(m * n)?;
        let mut p = GemmProblem::new(InTy::Bf16, m, n, k);
        let mut bufs = GemmBufs::new(a, b, &d);
        if let Some(c) = c {
            p = p.add_c();
            bufs = bufs.c(c);
        }
        kernels::gemm(&self.st, &p, bufs)?;
        Ok(d)
    }

    /// The same with an f32 result (no C).
    pub fn gemm_f32(
        &self,
        a: &Buffer<bf16>,
        b: &Buffer<bf16>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<Buffer<f32>> {
        let d = self.f32(m * n)?;
        let p = GemmProblem::new(InTy::Bf16, m, n, k).out(OutTy::F32);
        kernels::gemm(&self.st, &p, GemmBufs::new(a, b, &d))?;
        Ok(d)
    }

    /// Waits for the queued kernels (before temporaries are dropped or results read).
    pub fn sync(&self) -> Result<()> {
        Ok(self.st.synchronize()?)
    }
}

/// A linear layer's BF16 weight `W [n, k]` and `W^T [k, n]` on one device.
pub(crate) struct Lin {
    pub w: Buffer<bf16>,
    pub wt: Buffer<bf16>,
    pub n: usize,
    pub k: usize,
}

/// Rows `rows` of a row-major `[_, cols]` f32 matrix.
pub(crate) fn rows_of(w: &[f32], cols: usize, rows: std::ops::Range<usize>) -> &[f32] {
    &w[rows.start * cols..rows.end * cols]
}

impl Lin {
    /// Rounds `w [n, k]` (f32 master) to BF16 and uploads it with its transpose.
    pub fn upload(dev: &Device, w: &[f32], n: usize, k: usize) -> Result<Lin> {
        if w.len() != n * k {
            return Err(TrainError::Shape(format!(
                "linear weight: {} values for [{n}, {k}]",
                w.len()
            )));
        }
        let b: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let bt = crate::moe::host::transpose(&b, n, k);
        Ok(Lin {
            w: dev.upload(&b)?,
            wt: dev.upload(&bt)?,
            n,
            k,
        })
    }

    /// `y [m, n] = x [m, k] W^T (+ c)`.
    pub fn fwd(
        &self,
        cx: &Ctx,
        x: &Buffer<bf16>,
        m: usize,
        c: Option<&Buffer<bf16>>,
    ) -> Result<Buffer<bf16>> {
        cx.gemm(x, &self.w, (m, self.n, self.k), c)
    }

    /// `dx [m, k] = dy [m, n] W (+ c)`.
    pub fn dgrad(
        &self,
        cx: &Ctx,
        dy: &Buffer<bf16>,
        m: usize,
        c: Option<&Buffer<bf16>>,
    ) -> Result<Buffer<bf16>> {
        cx.gemm(dy, &self.wt, (m, self.k, self.n), c)
    }

    /// `dW [n, k] = dy [m, n]^T x [m, k]` (f32), downloaded; both operands transposed on the
    /// device first (the GEMM takes K-contiguous operands, K = tokens here).
    pub fn wgrad(
        &self,
        cx: &Ctx,
        dy: &Buffer<bf16>,
        x: &Buffer<bf16>,
        m: usize,
    ) -> Result<Vec<f32>> {
        wgrad(cx, dy, x, (m, self.n, self.k))
    }
}

/// `dW [n, k] = dy [m, n]^T x [m, k]` in f32 on the device, downloaded.
pub(crate) fn wgrad(
    cx: &Ctx,
    dy: &Buffer<bf16>,
    x: &Buffer<bf16>,
    (m, n, k): (usize, usize, usize),
) -> Result<Vec<f32>> {
    let dyt = cx.transpose(dy, m, n)?;
    let xt = cx.transpose(x, m, k)?;
    let dw = cx.gemm_f32(&dyt, &xt, (n, k, m))?;
    cx.sync()?;
    Ok(dw.to_vec()?)
}
