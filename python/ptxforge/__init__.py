"""ptxforge: PTX-level GPU programming, the CPU emulator and the DeepSeek-V3 kernel set from Python.

The core (``docs/PYTHON.md``):

- ``devices()``, ``Device("emu:0" | "cuda:0")``, ``Stream`` (``device.stream()``);
- ``DeviceArray`` (``device.array(x)``, ``asarray``, ``from_dlpack``, ``.numpy()``);
- ``Module(ptx_text_or_path, device=None)`` and ``module.launch(entry, grid, block, args,
  shared=0, stream=None, timeout=None)``;
- exceptions ``EmulatorFault`` (a ``RuntimeError``), ``EmulatorHang`` (an ``EmulatorFault``),
  ``PtxError`` (a ``ValueError``), ``DeviceUnavailable`` (a ``RuntimeError``).

Everything else the extension ``ptxforge._native`` defines (the kernel library, the
expert-parallel buffer) is reachable as ``ptxforge.NAME`` too.
"""

from . import _native
from ._native import (
    Device,
    DeviceArray,
    DeviceUnavailable,
    EmulatorFault,
    EmulatorHang,
    Module,
    PtxError,
    Stream,
    asarray,
    devices,
    from_dlpack,
)

__all__ = [
    "Device",
    "DeviceArray",
    "DeviceUnavailable",
    "EmulatorFault",
    "EmulatorHang",
    "Module",
    "PtxError",
    "Stream",
    "asarray",
    "devices",
    "from_dlpack",
]


def __getattr__(name):
    # the rest of the extension (kernel library, EP buffer) without listing it here
    try:
        return getattr(_native, name)
    except AttributeError:
        raise AttributeError(f"module 'ptxforge' has no attribute '{name}'") from None


def __dir__():
    return sorted(set(globals()) | set(dir(_native)))
