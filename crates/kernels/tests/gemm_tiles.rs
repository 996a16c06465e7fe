//! The FP8 `mma.sync` GEMM's warp tiling and its skipping of dead 16-row blocks (rows past M,
//! contiguous-layout padding rows) leave every stored output bit-identical: each output element
//! is summed in the same order whatever the tile, so kernels of different tile configurations
//! (the 4-warp 64x32 [`GemmConfig::BIG_FP8`], the 8-warp 32x32 tile it replaced, the 64x128
//! [`GemmConfig::MID`]) must agree bit for bit, and a contiguous-layout grouped run must give
//! each expert's rows exactly what a normal-layout run over that expert's rows alone gives.
//! The outputs are also checked against the f64 product of the dequantised operands (hardware
//! numerics of sm_90a: the FP8 tensor core truncates, so the bound is the BF16 output rounding
//! plus the 13-fraction-bit accumulation, 1e-2 relative Frobenius; padding rows exactly 0).
//! D is poisoned (NaN) before every launch; padding rows of A hold NaN bytes.

use half::bf16;
use kernels::gemm::GemmConfig;
use kernels::reference::{dequant_blocks_f64, dequant_rows_f64, gemm_nt_f64, rel_fro, rng};
use kernels::registry::random_m_indices;
use kernels::{GemmBufs, GemmProblem, InTy, KernelChoice};
use rand::rngs::StdRng;
use rand::Rng;
use runtime::{Buffer, Stream};

/// The tile `BIG_FP8` had before it became 4 warps of 64x32.
const OLD_BIG_FP8: GemmConfig = GemmConfig {
    bm: 128,
    bn: 64,
    warps_m: 4,
    warps_n: 2,
    stages: 4,
};

const CONFIGS: [GemmConfig; 3] = [GemmConfig::BIG_FP8, OLD_BIG_FP8, GemmConfig::MID];

/// Random finite e4m3 bytes (never the NaN codes 0x7f / 0xff).
fn e4m3(rg: &mut StdRng, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| {
            let b: u8 = rg.gen();
            if b & 0x7f == 0x7f {
                b ^ 1
            } else {
                b
            }
        })
        .collect()
}

/// Power-of-two scales in [2^-6, 2^6].
fn scales(rg: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| 2f32.powi(rg.gen_range(-6..=6))).collect()
}

fn bits(d: &Buffer<bf16>) -> Vec<u16> {
    d.to_vec().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// One operand set: A `[m, k]` with 1x128 scales, B `[g, n, k]` with 128x128 scales.
struct Operands {
    a: Vec<u8>,
    sa: Vec<f32>,
    b: Vec<u8>,
    sb: Vec<f32>,
}

impl Operands {
    fn random(rg: &mut StdRng, m: usize, n: usize, k: usize, g: usize) -> Operands {
        Operands {
            a: e4m3(rg, m * k),
            sa: scales(rg, m * k / 128),
            b: e4m3(rg, g * n * k),
            sb: scales(rg, g * (n / 128) * (k / 128)),
        }
    }
}

/// Runs `p` with tile `cfg` on fresh device copies of `o`, D poisoned; returns D's bits.
fn run(
    st: &Stream,
    p: GemmProblem,
    cfg: GemmConfig,
    o: &Operands,
    idx: Option<&[i32]>,
) -> Vec<u16> {
    let dev = st.device();
    let (a, sa) = (dev.upload(&o.a).unwrap(), dev.upload(&o.sa).unwrap());
    let (b, sb) = (dev.upload(&o.b).unwrap(), dev.upload(&o.sb).unwrap());
    let d = dev.upload(&vec![bf16::NAN; p.total_rows() * p.n]).unwrap();
    let idx_buf = idx.map(|i| dev.upload(i).unwrap());
    let mut bufs = GemmBufs::new(&a, &b, &d).scales(&sa, &sb);
    if let Some(ib) = &idx_buf {
        bufs = bufs.index(ib);
    }
    let p = p.kernel(KernelChoice::MmaSync(cfg));
    kernels::gemm(st, &p, bufs).unwrap();
    st.synchronize().unwrap();
    bits(&d)
}

fn to_f64(d: &[u16]) -> Vec<f64> {
    d.iter().map(|&x| bf16::from_bits(x).to_f64()).collect()
}

/// Normal layout, M not a multiple of any tile height (the last tiles' lower row blocks are
/// past M and skipped): every configuration gives the same bits, close to the f64 product.
#[test]
fn tiles_agree_bit_for_bit_normal_layout() {
    let st = runtime::Device::emu(80).default_stream();
    let (m, n, k) = (200, 256, 384);
    let mut rg = rng(81);
    let o = Operands::random(&mut rg, m, n, k, 1);
    let p = GemmProblem::new(InTy::Fp8, m, n, k);
    let outs: Vec<Vec<u16>> = CONFIGS.iter().map(|&c| run(&st, p, c, &o, None)).collect();
    for (c, d) in CONFIGS.iter().zip(&outs).skip(1) {
        assert!(
            d == &outs[0],
            "{} differs from {}",
            c.tag(),
            CONFIGS[0].tag()
        );
    }
    let want = gemm_nt_f64(
        &dequant_rows_f64(&o.a, &o.sa, m, k),
        &dequant_blocks_f64(&o.b, &o.sb, n, k),
        m,
        n,
        k,
    );
    let err = rel_fro(&to_f64(&outs[0]), &want);
    assert!(err < 1e-2, "rel err {err}");
}

/// Contiguous layout with padding (random 1..128 valid rows per 128-row segment, NaN bytes in
/// the padding rows of A): every configuration gives the same bits; padding rows are +0; each
/// expert's rows are bit for bit a normal-layout GEMM over that expert's rows alone.
#[test]
fn grouped_padding_skip_keeps_rows_bit_identical() {
    let st = runtime::Device::emu(82).default_stream();
    let (m, n, k, g) = (640, 128, 256, 3);
    let mut rg = rng(83);
    let idx = random_m_indices(&mut rg, m, g);
    let mut o = Operands::random(&mut rg, m, n, k, g);
    for (r, &e) in idx.iter().enumerate() {
        if e < 0 {
            o.a[r * k..(r + 1) * k].fill(0x7f);
        }
    }
    let p = GemmProblem::new(InTy::Fp8, m, n, k).contiguous(g);
    let outs: Vec<Vec<u16>> = CONFIGS
        .iter()
        .map(|&c| run(&st, p, c, &o, Some(&idx)))
        .collect();
    for (c, d) in CONFIGS.iter().zip(&outs).skip(1) {
        assert!(
            d == &outs[0],
            "{} differs from {}",
            c.tag(),
            CONFIGS[0].tag()
        );
    }
    let d = &outs[0];
    let (a64, b64) = (
        dequant_rows_f64(&o.a, &o.sa, m, k),
        dequant_blocks_f64(&o.b, &o.sb, g * n, k),
    );
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for e in 0..g {
        let rows: Vec<usize> = (0..m).filter(|&r| idx[r] == e as i32).collect();
        let pick = |v: &[u8], w: usize| -> Vec<u8> {
            rows.iter()
                .flat_map(|&r| v[r * w..(r + 1) * w].to_vec())
                .collect()
        };
        let pickf = |v: &[f32], w: usize| -> Vec<f32> {
            rows.iter()
                .flat_map(|&r| v[r * w..(r + 1) * w].to_vec())
                .collect()
        };
        let kb = k / 128;
        let sb_e = o.sb[e * (n / 128) * kb..(e + 1) * (n / 128) * kb].to_vec();
        let oe = Operands {
            a: pick(&o.a, k),
            sa: pickf(&o.sa, kb),
            b: o.b[e * n * k..(e + 1) * n * k].to_vec(),
            sb: sb_e,
        };
        let pe = GemmProblem::new(InTy::Fp8, rows.len(), n, k);
        let de = run(&st, pe, GemmConfig::MID, &oe, None);
        for (i, &r) in rows.iter().enumerate() {
            assert!(
                de[i * n..(i + 1) * n] == d[r * n..(r + 1) * n],
                "expert {e} row {r}: grouped and normal-layout outputs differ"
            );
            for j in 0..n {
                got.push(bf16::from_bits(d[r * n + j]).to_f64());
                let ar = &a64[r * k..(r + 1) * k];
                let br = &b64[(e * n + j) * k..(e * n + j + 1) * k];
                want.push(ar.iter().zip(br).map(|(x, y)| x * y).sum::<f64>());
            }
        }
    }
    for (r, &e) in idx.iter().enumerate() {
        if e < 0 {
            assert!(
                d[r * n..(r + 1) * n].iter().all(|&x| x == 0),
                "padding row {r} not +0"
            );
        }
    }
    let err = rel_fro(&got, &want);
    assert!(err < 1e-2, "rel err {err}");
}
