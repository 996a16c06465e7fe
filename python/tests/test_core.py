"""The core of the package: PTX kernels launched from numpy on the emulator, device arrays,
DLPack, devices and streams. Results are compared with float64 numpy references on fresh random
inputs; outputs are poisoned (NaN or a sentinel) before each launch."""

import numpy as np
import pytest

import ptxforge as pf
from conftest import AXPB_I64, REDUCE, REVERSE_DYN, VADD


def test_vector_add_from_numpy(rng):
    n = int(rng.integers(300, 700))
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    c = np.full(n, np.nan, np.float32)
    stats = pf.Module(VADD).launch("vadd", (n + 127) // 128, 128, [a, b, c, n])
    ref = a.astype(np.float64) + b.astype(np.float64)
    # one f32 rounding of the exact sum
    np.testing.assert_allclose(c, ref, rtol=2**-23, atol=0)
    assert stats["ctas"] == (n + 127) // 128 and stats["warp_instructions"] > 0
    assert stats["seconds"] > 0 and stats["emulator_seconds"] > 0


def test_reduction_with_a_float_scalar(rng):
    rows = int(rng.integers(2, 5))
    x = rng.uniform(-1, 1, (rows, 256)).astype(np.float32)
    scale = float(rng.uniform(0.5, 2.0))
    out = np.full(rows, np.nan, np.float32)
    pf.Module(REDUCE).launch("rowsum", rows, 256, [x, out, scale])
    ref = x.astype(np.float64).sum(axis=1) * np.float32(scale)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_dynamic_shared_memory(rng):
    n = 128
    x = rng.standard_normal(n).astype(np.float32)
    y = np.full(n, np.nan, np.float32)
    pf.Module(REVERSE_DYN).launch("reverse", 1, n, [x, y], shared=4 * n)
    np.testing.assert_array_equal(y, x[::-1])


def test_integer_scalars_take_the_parameter_types(rng):
    n = int(rng.integers(50, 200))
    x = rng.integers(-(2**20), 2**20, n, dtype=np.int64)
    y = np.full(n, -(2**62), np.int64)
    k = int(rng.integers(-(2**30), -1))
    off = int(rng.integers(-(2**31), 2**31 - 1))
    pf.Module(AXPB_I64).launch("axpb", (n + 63) // 64, 64, [x, y, k, off, n])
    ref = [int(v) * k + off for v in x]
    assert [int(v) for v in y] == ref


def test_a_kernel_writes_through_a_device_array(rng):
    n = int(rng.integers(100, 400))
    dev = pf.Device("emu:0")
    a = dev.array(rng.standard_normal(n).astype(np.float32))
    b = rng.standard_normal(n).astype(np.float32)
    c = dev.array(np.full(n, np.nan, np.float32))
    assert c.shape == (n,) and c.dtype == "float32" and c.device == dev
    m = pf.Module(VADD, device=dev)
    m.launch("vadd", (n + 127) // 128, 128, [a, b, c, n])
    ref = a.numpy().astype(np.float64) + b
    np.testing.assert_allclose(c.numpy(), ref, rtol=2**-23, atol=0)
    np.testing.assert_array_equal(np.asarray(c), c.numpy())
    # the device array is updated in place by a second launch (c = a + c)
    m.launch("vadd", (n + 127) // 128, 128, [a, c, c, n])
    np.testing.assert_allclose(c.numpy(), ref + a.numpy(), rtol=1e-6, atol=1e-6)


def test_read_only_arrays_are_not_written_back(rng):
    n = 64
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    c = np.full(n, np.nan, np.float32)
    c.flags.writeable = False
    pf.Module(VADD).launch("vadd", 1, 64, [a, b, c, n])
    assert np.isnan(c).all()


def test_dlpack_round_trip(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    d = pf.from_dlpack(x)
    assert d.shape == (3, 5) and d.dtype == "float32" and str(d.device) == "emu:0"
    assert d.__dlpack_device__() == (1, 0)
    back = np.from_dlpack(d)
    np.testing.assert_array_equal(back, x)
    # the export is a host copy: writing it leaves the device array as it was
    back[0, 0] = 7.0
    assert d.numpy()[0, 0] == x[0, 0]
    assert pf.asarray(d) is d
    e = pf.asarray(d, device="emu:1")
    assert str(e.device) == "emu:1"
    np.testing.assert_array_equal(e.numpy(), x)


DTYPES = [
    np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16,
    np.int32, np.uint32, np.int64, np.uint64, np.bool_,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtypes_round_trip(rng, dtype):
    hi = 2 if dtype is np.bool_ else 100
    x = rng.integers(0, hi, (2, 3, 4)).astype(dtype)
    d = pf.asarray(x)
    assert d.dtype == np.dtype(dtype).name and d.shape == (2, 3, 4)
    y = d.numpy()
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)


def test_bfloat16_and_fp8_come_back_as_ml_dtypes_or_raw_bits(rng):
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed")
    x = rng.standard_normal(16).astype(ml.bfloat16)
    d = pf.asarray(x)
    assert d.dtype == "bfloat16"
    np.testing.assert_array_equal(d.numpy().view(np.uint16), x.view(np.uint16))
    f = rng.standard_normal(16).astype(ml.float8_e4m3fn)
    assert pf.asarray(f).dtype == "float8_e4m3fn"
    np.testing.assert_array_equal(pf.asarray(f).numpy().view(np.uint8), f.view(np.uint8))


def test_non_contiguous_inputs_are_copied_by_asarray(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    d = pf.asarray(x[:, ::2])
    np.testing.assert_array_equal(d.numpy(), x[:, ::2])


def test_devices_and_specs():
    ds = pf.devices()
    assert ds[0] == pf.Device("emu:0") and str(ds[0]) == "emu:0"
    d = pf.Device("emu:3")
    assert str(d) == "emu:3" and d.kind == "emu" and d.index == 3 and d.sm_version == 90
    assert pf.Device("emu") == pf.Device("emu:0")
    assert len({pf.Device("emu:0"), pf.Device("emu:0"), d}) == 2


def test_cuda_without_a_driver_raises_device_unavailable():
    if any(d.kind == "cuda" for d in pf.devices()):
        pytest.skip("a CUDA driver is present")
    with pytest.raises(pf.DeviceUnavailable, match="CUDA"):
        pf.Device("cuda:0")


def test_module_from_a_path_and_bytes(tmp_path, rng):
    p = tmp_path / "vadd.ptx"
    p.write_text(VADD)
    for src in (p, str(p), VADD.encode()):
        m = pf.Module(src)
        assert m.entries() == ["vadd"]
        assert m.params("vadd") == [("a", "u64"), ("b", "u64"), ("c", "u64"), ("n", "u32")]
    n = 32
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    c = np.full(n, np.nan, np.float32)
    m.launch("vadd", 1, 32, [a, b, c, n], 0, None, 30.0)
    np.testing.assert_allclose(c, a.astype(np.float64) + b, rtol=2**-23)


def test_launch_on_a_stream(rng):
    dev = pf.Device("emu:0")
    s = dev.stream()
    n = 96
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    c = np.full(n, np.nan, np.float32)
    pf.Module(VADD, device=dev).launch("vadd", (1, 1), (128,), [a, b, c, n], stream=s)
    s.synchronize()
    np.testing.assert_allclose(c, a.astype(np.float64) + b, rtol=2**-23)


def test_torch_cpu_tensors(rng):
    torch = pytest.importorskip("torch", reason="torch not installed")
    n = 200
    a = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    c = torch.full((n,), float("nan"))
    pf.Module(VADD).launch("vadd", 2, 128, [a, b, c, n])
    ref = a.double() + b.double()
    assert torch.allclose(c.double(), ref, rtol=2**-23, atol=0)
    d = pf.from_dlpack(a)
    np.testing.assert_array_equal(d.numpy(), a.numpy())
    t = torch.from_dlpack(d)
    assert torch.equal(t, a)


CORPUS = __import__("pathlib").Path(__file__).resolve().parents[2] / "tests-data" / "corpus"


def to_bf16_bits(x):
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("target,shared", [("sm_80", 8192), ("sm_90a", 16384)])
def test_a_triton_compiled_gemm_from_the_corpus(rng, target, shared):
    """Triton 3.9's bf16 tl.dot GEMM (C[128,64] = A[128,64] B[64,64]; mma.sync on sm_80, wgmma
    on sm_90a) from its committed PTX, on fresh random inputs against a float64 reference."""
    ptx = CORPUS / target / "gemm_bf16.ptx"
    a = to_bf16_bits(rng.standard_normal((128, 64)))
    b = to_bf16_bits(rng.standard_normal((64, 64)))
    c = np.full((128, 64), 0x7FC0, np.uint16)  # bf16 NaN
    m = pf.Module(ptx)
    m.launch("gemm", 2, 128, [a, b, c, 64, 64, 64, 64, 0, 0], shared=shared)
    ref = from_bf16_bits(a).astype(np.float64) @ from_bf16_bits(b).astype(np.float64)
    got = from_bf16_bits(c).astype(np.float64)
    # f32 accumulation, one bf16 rounding of the result (8 significant bits)
    np.testing.assert_allclose(got, ref, rtol=2**-8, atol=1e-3 * np.abs(ref).max())
