//! One library kernel's emitted PTX run through `runtime::runner` (the engine of `ptxforge run`)
//! with inputs written as .npy files gives exactly the host API's answer.

use half::bf16;
use kernels::registry::{host_quant_blocks, host_quant_rows};
use rand::Rng;
use runtime::runner::{self, ArgSpec, DType, HostArray, OutInit, RunSpec};
use runtime::Arg;

fn npy(dir: &std::path::Path, name: &str, dtype: DType, data: Vec<u8>, len: usize) -> ArgSpec {
    let p = dir.join(format!("{name}.npy"));
    let a = HostArray {
        dtype,
        shape: vec![len as u64],
        data,
    };
    runner::write_npy(&p, &a).unwrap();
    ArgSpec::In(p)
}

#[test]
fn emitted_fp8_gemm_through_the_runner_matches_the_host_api() {
    let (m, n, k) = (40usize, 128usize, 256usize);
    let mut rg = kernels::reference::rng(5);
    let a: Vec<f32> = (0..m * k).map(|_| rg.gen_range(-1.0f32..1.0)).collect();
    let b: Vec<f32> = (0..n * k).map(|_| rg.gen_range(-1.0f32..1.0)).collect();
    let (qa, sa) = host_quant_rows(&a, m, k);
    let (qb, sb) = host_quant_blocks(&b, n, k);

    // host API
    let dev = runtime::Device::emu(65);
    let stream = dev.default_stream();
    let (ab, sab, bb, sbb) = (
        dev.upload(&qa).unwrap(),
        dev.upload(&sa).unwrap(),
        dev.upload(&qb).unwrap(),
        dev.upload(&sb).unwrap(),
    );
    let d = dev.alloc::<bf16>(m * n).unwrap();
    let p = kernels::GemmProblem::new(kernels::InTy::Fp8, m, n, k);
    let bufs = kernels::GemmBufs::new(&ab, &bb, &d).scales(&sab, &sbb);
    kernels::gemm(&stream, &p, bufs).unwrap();
    stream.synchronize().unwrap();
    let want: Vec<u16> = d.to_vec().unwrap().iter().map(|x| x.to_bits()).collect();

    // the same kernel as PTX text through the runner
    let cfg = kernels::gemm::choose_config(
        kernels::gemm::InTy::Fp8,
        kernels::gemm::Layout::Normal,
        m,
        n,
        dev.props().sms,
    );
    let spec = kernels::gemm::spec(
        kernels::gemm::InTy::Fp8,
        kernels::OutTy::Bf16,
        kernels::gemm::Layout::Normal,
        false,
        cfg,
    );
    let text = ptx::print(&kernels::gemm::gen_gemm(&builder::Target::sm90a(), &spec).unwrap());
    let dir = std::env::temp_dir().join(format!("kernels-runner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let args = vec![
        npy(&dir, "a", DType::U8, qa.clone(), qa.len()),
        npy(&dir, "sa", DType::F32, f32b(&sa), sa.len()),
        npy(&dir, "b", DType::U8, qb.clone(), qb.len()),
        npy(&dir, "sb", DType::F32, f32b(&sb), sb.len()),
        ArgSpec::Out {
            dtype: DType::Bf16,
            count: m * n,
        },
        ArgSpec::Scalar(Arg::U32(m as u32)),
        ArgSpec::Scalar(Arg::U32(n as u32)),
        ArgSpec::Scalar(Arg::U32(k as u32)),
    ];
    let rs = RunSpec {
        ptx: text,
        entry: spec.name.clone(),
        grid: [
            n.div_ceil(cfg.bn as usize) as u32,
            m.div_ceil(cfg.bm as usize) as u32,
            1,
        ],
        block: [cfg.threads(), 1, 1],
        shared: cfg.shared_bytes(),
        args,
        out_init: OutInit::Poison(0xff),
        timeout: None,
        progress: None,
        banks: false,
        numerics: None,
    };
    let out = runner::run(&runtime::Device::emu(66), &rs).unwrap();
    let got = out.buffers[4].as_ref().unwrap();
    let got: Vec<u16> = got
        .data
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(&dir);
}
