"""Host arrays as Triton pointer arguments.

Triton's specialiser accepts as a pointer any object with ``data_ptr()`` and ``dtype``. numpy
arrays have neither, so while the driver is active every ``kernel[grid](...)`` call wraps its
numpy arguments in :class:`HostTensor` before Triton sees them. torch CPU tensors already qualify
and pass through unchanged. The launcher (``_launcher.py``) copies each pointer argument to the
emulated device before the launch and back into the caller's memory after it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional

import numpy as np

# numpy dtypes (and ml_dtypes' names) -> Triton's element type names.
_NUMPY_TO_TRITON = {
    "bool": "u1", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "float16": "fp16", "float32": "fp32", "float64": "fp64",
    "bfloat16": "bf16", "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5",
}
_TRITON_BYTES = {
    "u1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8,
    "fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8, "fp8e4nv": 1, "fp8e5": 1, "fp8e4b15": 1,
}


def _triton_name(dtype) -> str:
    """``tl.bfloat16``, ``"bf16"``, ``"bfloat16"``, ``np.float32`` ... -> Triton's short name."""
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, (np.dtype, type)):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = str(dtype)
    else:
        name = str(getattr(dtype, "name", dtype))  # a triton.language dtype: tl.bfloat16.name == "bf16"
    if name in _TRITON_BYTES:
        return name
    alias = {"float8e4nv": "fp8e4nv", "float8e5": "fp8e5", "float8e4b15": "fp8e4b15", "int1": "u1"}
    if name in alias:
        return alias[name]
    if name in _NUMPY_TO_TRITON:
        return _NUMPY_TO_TRITON[name]
    raise ValueError(f"dtype: {dtype!r} is not an element type this driver knows "
                     f"(one of {', '.join(sorted(_TRITON_BYTES))})")


class HostTensor:
    """A contiguous host array seen by Triton as a pointer to ``dtype`` elements.

    ``data_ptr()`` is the host address (Triton reads only its alignment, to specialise on
    16-byte divisibility; emulator buffers are at least that aligned). ``zero_``/``clone``/
    ``copy_`` make ``@triton.autotune(reset_to_zero=..., restore_value=...)`` work on numpy.
    """

    def __init__(self, array: np.ndarray, dtype: Optional[Any] = None, what: str = "array"):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{what}: expected a numpy.ndarray, got {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise ValueError(f"{what}: not C-contiguous; Triton kernels address memory through the pointer and "
                             "the strides you pass, so give a contiguous array (numpy.ascontiguousarray copies one)")
        name = _triton_name(dtype if dtype is not None else array.dtype)
        if _TRITON_BYTES[name] != array.dtype.itemsize:
            raise ValueError(f"dtype: {name} elements are {_TRITON_BYTES[name]} bytes but the {what}'s "
                             f"{array.dtype} elements are {array.dtype.itemsize}")
        self.array = array
        self.dtype = name

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    @property
    def shape(self):
        return self.array.shape

    def numel(self) -> int:
        return self.array.size

    def zero_(self) -> "HostTensor":
        self.array.fill(0)
        return self

    def clone(self) -> "HostTensor":
        return HostTensor(self.array.copy(), self.dtype)

    def copy_(self, other: "HostTensor") -> "HostTensor":
        np.copyto(self.array, other.array if isinstance(other, HostTensor) else np.asarray(other))
        return self

    def __repr__(self) -> str:
        return f"HostTensor[{self.dtype}](shape={self.array.shape})"


def typed(array: np.ndarray, dtype) -> HostTensor:
    """``array`` passed to a kernel as a pointer to ``dtype`` (``"bf16"``, ``tl.float8e4nv`` ...).

    numpy has no bf16 or fp8: hold their bits in a ``uint16``/``uint8`` array and say the type
    here. Results written by the kernel land in ``array``.
    """
    return HostTensor(array, dtype)


class DevicePointer:
    """A ``ptxforge.DeviceArray`` seen by Triton as a pointer: its device address and dtype.

    The launcher passes the array itself, so the kernel works on device memory in place.
    """

    def __init__(self, array):
        self.array = array
        self.dtype = _triton_name(array.dtype)

    def data_ptr(self) -> int:
        return self.array.ptr

    def __repr__(self) -> str:
        return f"DevicePointer[{self.dtype}]({self.array.device}, shape={self.array.shape})"


def _device_array_type():
    from .. import DeviceArray

    return DeviceArray


def wrap_arg(value, name: str = "array"):
    """numpy arrays become :class:`HostTensor`, DeviceArrays :class:`DevicePointer`; tuples
    are walked; anything else is kept. ``name`` (the kernel argument) is what errors name."""
    if isinstance(value, np.ndarray):
        return HostTensor(value, what=f"argument `{name}`")
    if isinstance(value, _device_array_type()):
        return DevicePointer(value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(wrap_arg(v, f"{name}[{i}]") for i, v in enumerate(value))
    return value


def _wrapping(run: Callable) -> Callable:
    @functools.wraps(run)
    def run_with_host_arrays(self, *args, **kwargs):
        names = list(getattr(self, "arg_names", []))
        names += [f"#{i}" for i in range(len(names), len(args))]
        args = tuple(wrap_arg(a, n) for a, n in zip(args, names))
        kwargs = {k: wrap_arg(v, k) for k, v in kwargs.items()}
        return run(self, *args, **kwargs)

    run_with_host_arrays.__ptxforge_wrapped__ = run
    return run_with_host_arrays


_saved: Dict[str, Callable] = {}


def install() -> None:
    """Wrap numpy arguments of ``JITFunction.run`` and ``Autotuner.run``/``Heuristics.run``."""
    from triton.runtime import autotuner, jit

    for owner, attr in ((jit.JITFunction, "run"), (autotuner.Autotuner, "run"), (autotuner.Heuristics, "run")):
        key = f"{owner.__module__}.{owner.__qualname__}.{attr}"
        current = owner.__dict__.get(attr)
        if current is None or key in _saved or hasattr(current, "__ptxforge_wrapped__"):
            continue
        _saved[key] = current
        setattr(owner, attr, _wrapping(current))


def uninstall() -> None:
    """Undo :func:`install`."""
    from triton.runtime import autotuner, jit

    for owner, attr in ((jit.JITFunction, "run"), (autotuner.Autotuner, "run"), (autotuner.Heuristics, "run")):
        key = f"{owner.__module__}.{owner.__qualname__}.{attr}"
        if key in _saved:
            setattr(owner, attr, _saved.pop(key))
