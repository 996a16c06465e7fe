"""The Triton driver object: what ``triton.runtime.driver.active`` is while ptxforge is active.

Triton asks its active driver for the compilation target, a device and stream, a launcher class,
``utils.load_binary`` (here: load the PTX into an emulator module; the cubin Triton also built is
not used), device properties, and a benchmarker for ``@triton.autotune``. Compilation itself is
Triton's own NVIDIA backend, unchanged.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase

from ._launcher import EmulatorLauncher, LoadedKernel

# The architectures whose PTX the emulator models (Triton's capability numbers).
SUPPORTED_ARCHS = (80, 86, 89, 90)
# Shared memory per block opt-in limit (bytes), by architecture.
_MAX_SHARED = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
_SM_COUNT = {80: 108, 86: 84, 89: 128, 90: 132}


def parse_device(device) -> str:
    """``"emu"``, ``"emu:N"`` or a ``ptxforge.Device`` of the emulator -> ``"emu:N"``."""
    spec = str(device).strip()
    if spec == "emu":
        spec = "emu:0"
    kind, _, index = spec.partition(":")
    if kind != "emu" or not index.isdigit():
        raise ValueError(f"device: {device!r} is not an emulated device (\"emu:N\"); the Triton driver "
                         "runs kernels on the emulator")
    return f"emu:{int(index)}"


def parse_arch(arch) -> int:
    """``"sm_90a"``, ``"sm_90"``, ``"90"`` or ``90`` -> 90; ``ValueError`` naming ``arch`` otherwise."""
    text = str(arch).strip().lower()
    if text.startswith("sm_"):
        text = text[3:]
    if text.endswith("a"):
        text = text[:-1]
    if not text.isdigit() or int(text) not in SUPPORTED_ARCHS:
        raise ValueError(f"arch: {arch!r} is not one of sm_80, sm_86, sm_89, sm_90a (what the emulator "
                         "runs Triton's PTX for)")
    return int(text)


class _Utils:
    """``driver.utils``: module loading and device queries."""

    def __init__(self, driver: "EmulatorDriver"):
        self._driver = driver

    def load_binary(self, name, kernel, shared, device):
        """Load the kernel's PTX (Triton passes the cubin; the PTX is found by the kernel's name)."""
        from . import _backend

        ptx = _backend.take_ptx(name, kernel)
        module = _backend.load_module(ptx, self._driver.device)
        function = LoadedKernel(module, name, ptx)
        n_regs, n_spills, max_threads = 0, 0, 1024
        return module, function, n_regs, n_spills, max_threads

    def unload_module(self, module) -> None:
        """Modules are freed with their Python object."""

    def get_device_properties(self, device) -> Dict[str, int]:
        cap = self._driver.capability_of(device)
        return {
            "max_shared_mem": _MAX_SHARED[cap],
            "max_num_regs": 65536,
            "multiprocessor_count": _SM_COUNT[cap],
            "warpSize": 32,
            "sm_clock_rate": 1_755_000,
            "mem_clock_rate": 2_619_000,
            "mem_bus_width": 5120,
        }

    def get_device_capability(self, device):
        cap = self._driver.capability_of(device)
        return cap // 10, cap % 10

    def set_printf_fifo_size(self, size) -> None:
        """The emulator's printf has no fixed-size FIFO."""

    def get_current_device(self) -> int:
        return self._driver.get_current_device()

    def set_current_device(self, device) -> None:
        self._driver.set_current_device(device)


class _HostEvent:
    """``torch.cuda.Event`` for ``triton.testing.do_bench``: a host clock reading (launches on
    the emulator are synchronous, so host time between two events is emulation time)."""

    def __init__(self, enable_timing: bool = True):
        self._t: Optional[float] = None

    def record(self, stream=None) -> None:
        self._t = time.perf_counter()

    def elapsed_time(self, end: "_HostEvent") -> float:
        """Milliseconds from this event to ``end``."""
        if self._t is None or end._t is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return 1e3 * (end._t - self._t)

    def synchronize(self) -> None:
        """Nothing is in flight."""


class _DeviceInterface:
    """The part of ``torch.cuda``'s interface ``triton.testing`` touches, for the emulator."""

    Event = _HostEvent

    def __init__(self, driver: "EmulatorDriver"):
        self._driver = driver

    def current_device(self) -> int:
        return self._driver.get_current_device()

    def synchronize(self, device=None) -> None:
        """Launches on the emulator are synchronous."""


class EmulatorDriver(DriverBase):
    """A Triton driver that compiles for ``GPUTarget("cuda", arch, 32)`` and runs on the emulator.

    Devices are numbered by architecture (one per ``activate(arch=...)`` seen in this process), so
    Triton's per-device kernel caches never hand a kernel built for one architecture to another.
    """

    # (architecture, device spec) of every driver made in this process; Triton's device id is
    # the index here.
    _targets: List[Tuple[int, str]] = []

    def __init__(self, arch: int, device: str = "emu:0"):
        super().__init__()
        target = (arch, device)
        if target not in EmulatorDriver._targets:
            EmulatorDriver._targets.append(target)
        self._device = EmulatorDriver._targets.index(target)
        self.arch = arch
        self.device = device
        self.utils = _Utils(self)
        self.launcher_cls = EmulatorLauncher

    @classmethod
    def is_active(cls) -> bool:
        return True

    def capability_of(self, device) -> int:
        return EmulatorDriver._targets[int(device)][0]

    def map_python_to_cpp_type(self, ty: str) -> str:
        return "uint64_t" if ty.startswith("*") else ty

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", self.arch, 32)

    def get_current_device(self) -> int:
        return self._device

    def set_current_device(self, device) -> None:
        if int(device) != self._device:
            raise ValueError(f"device: {device} is not this driver's device {self._device} "
                             f"({self.device}, sm_{self.arch}); call ptxforge.triton.activate(...) to switch")

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_device_capability(self, device=None):
        return self.arch // 10, self.arch % 10

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_device_interface(self):
        return _DeviceInterface(self)

    def get_benchmarker(self) -> Callable:
        return emulator_bench

    def get_empty_cache_for_benchmark(self):
        return None

    def clear_cache(self, cache) -> None:
        """The emulator has no cache state that carries between launches."""


def emulator_bench(kernel_call: Callable, quantiles: Optional[Sequence[float]] = None, *,
                   warmup: int = 1, rep: int = 3, return_mode: str = "mean", **_ignored):
    """Time ``kernel_call`` on the emulator: milliseconds of emulation, not of a GPU.

    The benchmarker ``@triton.autotune`` uses while the driver is active. One warm-up call (which
    compiles), then ``rep`` timed calls; each time is the wall-clock time of the emulated launch
    (argument copies excluded). These rank configurations by how much work the emulator does —
    instruction count and memory traffic — which follows, but is not, the GPU's ordering.
    """
    for _ in range(max(warmup, 0)):
        kernel_call()
    times: List[float] = []
    for _ in range(max(rep, 1)):
        EmulatorLauncher.last_launch_seconds = 0.0
        start = time.perf_counter()
        kernel_call()
        total = time.perf_counter() - start
        launched = EmulatorLauncher.last_launch_seconds
        times.append(1e3 * (launched if launched > 0 else total))
    if quantiles is not None:
        ordered = sorted(times)
        return [ordered[min(int(q * len(ordered)), len(ordered) - 1)] for q in quantiles]
    reduce = {"mean": statistics.mean, "median": statistics.median, "min": min, "max": max}
    if return_mode == "all":
        return times
    if return_mode not in reduce:
        raise ValueError(f"return_mode: {return_mode!r} is not one of all, mean, median, min, max")
    return reduce[return_mode](times)
