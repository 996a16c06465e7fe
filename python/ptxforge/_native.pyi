"""Type stubs of ptxforge._native, the Rust half of the package (python/src/*.rs).

The core section (devices, arrays, modules, exceptions) mirrors the docstrings of
python/src/{device,array,module,errors}.rs. The kernel library and the expert-parallel buffer
(python/src/{kernels,ep}.rs) add their section at the end of this file.
"""

import os
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

# ----------------------------------------------------------------------------------------------
# core: devices, streams, arrays, modules, exceptions
# ----------------------------------------------------------------------------------------------

Dim3 = Union[int, Sequence[int]]
DeviceLike = Union["Device", str, None]

class EmulatorFault(RuntimeError):
    """A kernel fault on the emulator, carrying the diagnostic as attributes."""

    kernel: str
    cta: Tuple[int, int, int]
    thread: Tuple[int, int, int]
    line: int
    """1-based PTX line of the faulting instruction (0 if unknown)."""
    instruction: str
    kind: str
    """out_of_bounds, misaligned, divide_by_zero, trap, barrier_deadlock, sync_mask, hang,
    deadlock, interrupted, stack_overflow, multicast_plain_access, not_multicast or other."""
    address: Optional[int]
    space: Optional[str]

class EmulatorHang(EmulatorFault):
    """A launch that ran past its time or instruction budget, or deadlocked (the diagnostic
    names a warp that was still waiting)."""

class PtxError(ValueError):
    """PTX that does not parse or validate."""

    line: int
    col: int

class DeviceUnavailable(RuntimeError):
    """A device that cannot be opened (a CUDA device without a driver or GPU)."""

class Device:
    """A device: an emulated GPU ("emu:N") or a real one through the CUDA driver ("cuda:N").
    str(device) is its spec. Emulated devices exist for any N and share one address space."""

    def __init__(self, spec: str) -> None:
        """Opens a device by spec: "emu", "emu:N" (emulated, always available) or "cuda",
        "cuda:N" (needs the CUDA driver; raises DeviceUnavailable without one)."""
    @property
    def kind(self) -> str:
        """"emu" or "cuda"."""
    @property
    def index(self) -> int:
        """The device index (N of "emu:N")."""
    @property
    def name(self) -> str:
        """The device's name."""
    @property
    def sms(self) -> int:
        """Streaming multiprocessors."""
    @property
    def sm_version(self) -> int:
        """Compute capability as major*10 + minor (90 for the emulator's sm_90a)."""
    @property
    def total_memory(self) -> int:
        """Device memory in bytes."""
    def array(self, x: Any) -> DeviceArray:
        """A DeviceArray holding a copy of `x` (anything numpy.asarray accepts; non-contiguous
        inputs are copied in C order)."""
    def zeros(self, shape: Union[int, Sequence[int]], dtype: Any = None) -> DeviceArray:
        """A zero-filled DeviceArray of `shape` and `dtype` (a numpy dtype or its name;
        default float32)."""
    def stream(self, priority: int = 0) -> Stream:
        """A new stream on this device (launches on one stream run in order)."""
    def synchronize(self) -> None:
        """Waits for all work queued on the device."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Stream:
    """An ordered queue of work on one device (device.stream()); Module.launch(...,
    stream=s) runs on it."""

    @property
    def device(self) -> Device:
        """The stream's device."""
    def synchronize(self) -> None:
        """Waits for the work queued on this stream."""

def devices() -> list[Device]:
    """The devices of this process: the emulated device emu:0 always, then every CUDA device
    the driver reports (none without a driver). Other emulated devices open with
    Device("emu:N")."""

class DeviceArray:
    """An array in device memory (C-contiguous): device.array(x), ptxforge.asarray(x).
    Kernels get its address when it is passed to Module.launch.

    Emulated arrays export host copies (numpy(), __array__, __dlpack__ with device kDLCPU);
    CUDA arrays expose __cuda_array_interface__ (version 3) and __dlpack__ (kDLCUDA) without a
    copy."""

    @property
    def shape(self) -> Tuple[int, ...]:
        """The shape, a tuple."""
    @property
    def dtype(self) -> str:
        """The dtype's numpy name ("float32", "bfloat16", "float8_e4m3fn", ...)."""
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int:
        """Number of elements."""
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> Device:
        """The device the array lives on."""
    @property
    def ptr(self) -> int:
        """The device address (what a kernel's pointer parameter receives)."""
    def numpy(self) -> np.ndarray:
        """A host copy as a numpy array (bfloat16/float8_e4m3fn as ml_dtypes types when
        ml_dtypes is installed, else as their raw bits, uint16/uint8)."""
    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        """numpy's array protocol: a host copy (converted to `dtype` when given)."""
    def copy_from(self, x: Any) -> None:
        """Overwrites the array with `x` (same shape; converted to the array's dtype)."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Any = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """DLPack export. Emulated arrays export a host copy (kDLCPU); CUDA arrays their device
        memory without a copy (kDLCUDA; the device is synchronised first)."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """(device type, index): kDLCPU (1, 0) for emulated arrays, kDLCUDA (2, N) on CUDA."""
    @property
    def __cuda_array_interface__(self) -> dict:
        """The CUDA array interface (version 3), CUDA arrays only (AttributeError on the
        emulator)."""
    def __len__(self) -> int: ...

def asarray(x: Any, device: DeviceLike = None) -> DeviceArray:
    """`x` as a DeviceArray on `device` (default emu:0): a DeviceArray already there is
    returned as it is; anything else is copied (numpy arrays, torch CPU tensors, lists, ...)."""

def from_dlpack(x: Any, device: DeviceLike = None) -> DeviceArray:
    """A DeviceArray on `device` (default emu:0) holding a copy of any DLPack exporter on the
    CPU (numpy arrays, torch CPU tensors, DeviceArrays)."""

class Module:
    """A PTX module loaded on a device."""

    def __init__(
        self, ptx: Union[str, bytes, "os.PathLike[str]"], device: DeviceLike = None
    ) -> None:
        """Loads PTX (text, a path, or bytes) on `device` (a Device or spec; default "emu:0").
        PTX that does not parse or validate raises PtxError with its line."""
    @property
    def device(self) -> Device:
        """The device the module is loaded on."""
    def entries(self) -> list[str]:
        """The kernels (.entry functions) of the module, in order."""
    def params(self, entry: str) -> list[Tuple[str, str]]:
        """The parameters of kernel `entry`: a list of (name, PTX type) pairs, e.g.
        ("n", "u32"); byte arrays as ("p", "b8[16]")."""
    def launch(
        self,
        entry: str,
        grid: Dim3,
        block: Dim3,
        args: Sequence[Any],
        shared: int = 0,
        stream: Optional[Stream] = None,
        timeout: Optional[float] = None,
    ) -> dict:
        """Launches kernel `entry` on a grid of `grid` CTAs of `block` threads (ints or tuples
        of up to 3) with `args` checked against its parameters, and waits for it.

        Arguments: numpy arrays and CPU DLPack tensors (copied in; copied back unless
        read-only; non-contiguous ones refused), DeviceArrays (their address), objects with
        __cuda_array_interface__ for CUDA modules (their address), Python ints and
        floats (typed by the parameter, range-checked), numpy scalars (exactly the parameter's
        kind). Errors: TypeError/ValueError naming the parameter, EmulatorFault, EmulatorHang;
        Ctrl-C raises KeyboardInterrupt after stopping the emulator.

        `shared`: dynamic shared memory bytes. `stream`: a Stream of the module's device
        (default: a new one). `timeout`: seconds before the emulator stops the kernel as hung
        (default 600, or PTXFORGE_EMU_TIMEOUT_S).

        Returns a dict: `seconds` (host wall time of the launch and its wait) and, on the
        emulator, `ctas`, `warp_instructions`, `lane_instructions` and `emulator_seconds` (the
        emulator's run time, not a GPU's)."""

# ----------------------------------------------------------------------------------------------
# kernel library and expert-parallel buffer (python/src/kernels.rs, python/src/ep.rs)
# ----------------------------------------------------------------------------------------------
