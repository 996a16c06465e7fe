"""Triton kernels on the ptxforge emulator: ``@triton.jit`` code compiled by Triton, run on CPUs.

``activate(arch="sm_90a")`` installs a Triton driver whose target is ``GPUTarget("cuda", 90, 32)``:
``@triton.jit`` kernels are compiled by Triton's own NVIDIA backend (real PTX and ptxas, not the
interpreter) and their PTX runs on ptxforge's emulator. Launch them with numpy arrays (or torch
CPU tensors, when torch is installed); results are written back into those arrays.
``ptxforge.DeviceArray`` arguments stay on the emulated device (no copies). bf16/fp8
data, which numpy lacks, is passed as its bits with :func:`typed`. ``@triton.autotune`` works,
ranking configs by emulator timings (see :func:`emulator_bench`), not GPU timings.

Setting ``PTXFORGE_TRITON=sm_90a`` (or ``sm_80``, ``sm_86``, ``sm_89``) in the environment
activates the driver on ``import ptxforge.triton``.

An emulator fault (say an out-of-bounds load) raises ``ptxforge.EmulatorFault`` with the kernel,
CTA, thread, PTX line and address, and its ``triton_source`` is the ``file:line:col`` of the
``@triton.jit`` code that produced that PTX line. Docs: ``docs/PYTHON.md``, "Triton on the CPU".
"""

from __future__ import annotations

import os
from typing import Optional

from ._args import HostTensor, typed
from ._driver import SUPPORTED_ARCHS, EmulatorDriver, emulator_bench, parse_arch, parse_device

__all__ = [
    "activate", "deactivate", "is_active", "active_arch", "active_device", "typed", "HostTensor",
    "emulator_bench", "SUPPORTED_ARCHS", "EmulatorDriver",
]

_UNSET = object()
_previous = _UNSET
_current: Optional[EmulatorDriver] = None


def activate(arch="sm_90a", device="emu:0") -> EmulatorDriver:
    """Make the emulator Triton's active driver, compiling for ``arch``; returns the driver.

    ``arch`` is ``"sm_90a"`` (Hopper: ``tl.dot`` lowers to ``wgmma``), ``"sm_89"``, ``"sm_86"`` or
    ``"sm_80"`` (``mma.sync``). ``device`` is the emulated device kernels run on (``"emu:N"``;
    ``ptxforge.DeviceArray`` arguments must live there). Calling it again switches; :func:`deactivate`
    restores whatever driver Triton had before the first call.
    """
    global _previous, _current
    from triton.runtime import driver as driver_config

    from . import _args

    capability = parse_arch(arch)
    spec = parse_device(device)
    _check_triton_version()
    if _previous is _UNSET:
        _previous = driver_config._active
    _current = EmulatorDriver(capability, spec)
    driver_config.set_active(_current)
    _args.install()
    return _current


# The Triton versions this driver was tested with (it uses the driver and launcher interfaces of
# triton.backends.driver / triton.runtime, which change between minor versions).
TESTED_TRITON = ("3.9",)


def _check_triton_version() -> None:
    import warnings

    import triton

    if not any(triton.__version__.startswith(v + ".") or triton.__version__ == v for v in TESTED_TRITON):
        warnings.warn(f"ptxforge.triton was tested with Triton {', '.join(TESTED_TRITON)}; this is Triton "
                      f"{triton.__version__} (pip install 'triton==3.9.*' if kernels fail to launch)",
                      RuntimeWarning, stacklevel=3)


def deactivate() -> None:
    """Restore the Triton driver that was active before :func:`activate` (no-op when inactive)."""
    global _previous, _current
    from triton.runtime import driver as driver_config

    from . import _args

    if _previous is _UNSET:
        return
    driver_config._active = _previous
    _previous = _UNSET
    _current = None
    _args.uninstall()


def is_active() -> bool:
    """Whether the emulator driver is Triton's active driver."""
    from triton.runtime import driver as driver_config

    return _current is not None and driver_config._active is _current


def active_device() -> Optional[str]:
    """``"emu:N"``, the device kernels run on, while active, else ``None``."""
    return _current.device if is_active() else None


def active_arch() -> Optional[str]:
    """``"sm_90a"``, ``"sm_80"`` ... while active, else ``None``."""
    if not is_active():
        return None
    return f"sm_{_current.arch}{'a' if _current.arch == 90 else ''}"


if os.environ.get("PTXFORGE_TRITON"):
    activate(os.environ["PTXFORGE_TRITON"])
