"""The CUDA path of the core: device arrays in CUDA memory (__cuda_array_interface__ v3,
kDLCUDA) and launches through the driver. Skipped without a CUDA device; scripts/test-python.sh
runs it on the fake driver (scripts/fakecuda.sh: the driver API over the emulator), and on a GPU
machine it runs on the GPU."""

import ctypes
import gc

import numpy as np
import pytest

import ptxforge as pf
from conftest import VADD

CUDA = [d for d in pf.devices() if d.kind == "cuda"]
pytestmark = pytest.mark.skipif(not CUDA, reason="no CUDA device (driver or fake driver)")


@pytest.fixture
def dev():
    return CUDA[0]


def test_arrays_round_trip_and_expose_the_cuda_array_interface(dev, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    d = dev.array(x)
    assert d.device == dev and str(d.device).startswith("cuda:")
    np.testing.assert_array_equal(d.numpy(), x)
    cai = d.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (3, 4) and cai["typestr"] == "<f4"
    assert cai["data"] == (d.ptr, False) and cai["strides"] is None
    assert d.__dlpack_device__() == (2, dev.index)


def test_vector_add_on_cuda(dev, rng):
    n = int(rng.integers(100, 300))
    a = rng.standard_normal(n).astype(np.float32)
    b = dev.array(rng.standard_normal(n).astype(np.float32))
    c = dev.array(np.full(n, np.nan, np.float32))
    out = np.full(n, np.nan, np.float32)
    m = pf.Module(VADD, device=dev)
    m.launch("vadd", (n + 127) // 128, 128, [a, b, c, n])
    ref = a.astype(np.float64) + b.numpy()
    np.testing.assert_allclose(c.numpy(), ref, rtol=2**-23, atol=0)
    m.launch("vadd", (n + 127) // 128, 128, [a, b, out, n])
    np.testing.assert_allclose(out, ref, rtol=2**-23, atol=0)


def test_cuda_arrays_are_refused_by_emulator_modules(dev):
    c = dev.zeros(4)
    e = pf.Module(VADD)
    with pytest.raises(ValueError, match="loaded on emu:0") as err:
        e.launch("vadd", 1, 32, [c, c, c, 4])
    assert err.value.param == "a"


def test_torch_reads_cuda_arrays_without_a_copy(dev, rng):
    torch = pytest.importorskip("torch", reason="torch not installed")
    if not torch.cuda.is_available() or dev.name.startswith("ptxforge fakecuda"):
        pytest.skip("needs torch with a real CUDA device")
    x = rng.standard_normal(16).astype(np.float32)
    d = dev.array(x)
    t = torch.as_tensor(d, device=f"cuda:{dev.index}")
    assert t.data_ptr() == d.ptr
    np.testing.assert_array_equal(t.cpu().numpy(), x)


class Cai:
    """A foreign CUDA array: only `__cuda_array_interface__` (as torch CUDA tensors, CuPy)."""

    def __init__(self, d, strides=None):
        self.__cuda_array_interface__ = dict(d.__cuda_array_interface__, strides=strides)


def test_foreign_cuda_arrays_pass_their_address(dev, rng):
    n = 128
    a = dev.array(rng.standard_normal(n).astype(np.float32))
    b = rng.standard_normal(n).astype(np.float32)
    c = dev.array(np.full(n, np.nan, np.float32))
    m = pf.Module(VADD, device=dev)
    m.launch("vadd", 1, 128, [Cai(a), b, Cai(c, strides=(4,)), n])
    np.testing.assert_allclose(c.numpy(), a.numpy().astype(np.float64) + b, rtol=2**-23)
    with pytest.raises(ValueError, match="non-contiguous CUDA array") as e:
        m.launch("vadd", 1, 128, [a, b, Cai(c, strides=(8,)), n // 2])
    assert e.value.param == "c"
    with pytest.raises(ValueError, match="in CUDA memory given, the module is loaded on emu:0"):
        pf.Module(VADD).launch("vadd", 1, 128, [Cai(a), b, c.numpy(), n])


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]

_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


@pytest.mark.parametrize(
    "dtype,code,bits", [(np.float32, 2, 32), (np.int16, 0, 16), (np.uint64, 1, 64)]
)
def test_dlpack_export_of_cuda_arrays_is_the_device_memory(dev, rng, dtype, code, bits):
    """A consumer's view of the capsule (what torch.from_dlpack reads), through ctypes."""
    d = dev.array(rng.integers(0, 100, (2, 3)).astype(dtype))
    cap = d.__dlpack__()
    assert _api.PyCapsule_IsValid(cap, b"dltensor") == 1
    p = _api.PyCapsule_GetPointer(cap, b"dltensor")
    mt = DLManagedTensor.from_address(p)
    t = mt.dl_tensor
    assert t.data == d.ptr and (t.device.device_type, t.device.device_id) == (2, dev.index)
    assert t.ndim == 2 and [t.shape[0], t.shape[1]] == [2, 3] and not t.strides
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)
    # consume it as a consumer does: rename, then call the deleter when done
    _api.PyCapsule_SetName(cap, b"used_dltensor")
    mt.deleter(ctypes.cast(p, ctypes.POINTER(DLManagedTensor)))
    del cap
    gc.collect()
    np.testing.assert_array_equal(d.numpy().shape, (2, 3))


def test_an_unconsumed_dlpack_capsule_frees_its_tensor(dev, rng):
    x = rng.standard_normal(8).astype(np.float32)
    d = dev.array(x)
    for _ in range(3):
        cap = d.__dlpack__()
        del cap
    gc.collect()
    np.testing.assert_array_equal(d.numpy(), x)
