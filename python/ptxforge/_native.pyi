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
    deadlock, interrupted, assert (a failed `__assertfail`, e.g. `tl.device_assert`),
    stack_overflow, multicast_plain_access, not_multicast or other."""
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
# ---- py-lib: the kernel library and the EP buffer (python/src/kernels*, python/src/ep*) ----
# Array arguments accept anything numpy.asarray accepts (ArrayLike); results are numpy arrays.
# `device` is a spec string ("emu:0", "cuda:1") or an object whose str() is one (Device).
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

_DeviceSpec = Union[str, Any, None]
_Fp8Pair = Tuple[npt.ArrayLike, npt.ArrayLike]

def quantize_fp8(
    x: npt.ArrayLike,
    block: str = "1x128",
    ue8m0: bool = False,
    *,
    device: _DeviceSpec = None,
) -> Tuple[npt.NDArray[np.uint8], Union[npt.NDArray[np.float32], npt.NDArray[np.uint8]]]:
    """FP8 E4M3 quantisation, 1x128 or 128x128 blocks; scales float32 or UE8M0 bytes."""

def dequantize_fp8(
    q: npt.ArrayLike,
    scales: npt.ArrayLike,
    block: str = "1x128",
    *,
    device: _DeviceSpec = None,
) -> npt.NDArray[np.float32]:
    """q (uint8 E4M3) times its block scales, float32."""

def gemm_bf16(
    a: npt.ArrayLike, b: npt.ArrayLike, *, arch: str = "sm_90a", device: _DeviceSpec = None
) -> npt.NDArray[np.float32]:
    """D = A @ B.T (NT), inputs rounded to bfloat16; bfloat16 results as float32."""

def gemm_fp8_nt(
    a: _Fp8Pair, b: _Fp8Pair, *, arch: str = "sm_90a", device: _DeviceSpec = None
) -> npt.NDArray[np.float32]:
    """DeepGEMM gemm_fp8_fp8_bf16_nt with (q, scales) pairs; see ptxforge.kernels.gemm_fp8."""

def m_grouped_gemm_fp8_nt_contiguous(
    a: _Fp8Pair,
    b: _Fp8Pair,
    m_indices: npt.ArrayLike,
    *,
    arch: str = "sm_90a",
    device: _DeviceSpec = None,
) -> npt.NDArray[np.float32]:
    """Grouped FP8 GEMM, contiguous layout; see ptxforge.kernels.m_grouped_gemm_fp8_contiguous."""

def m_grouped_gemm_fp8_nt_masked(
    a: _Fp8Pair,
    b: _Fp8Pair,
    masked_m: npt.ArrayLike,
    expected_m: int,
    *,
    arch: str = "sm_90a",
    device: _DeviceSpec = None,
) -> npt.NDArray[np.float32]:
    """Grouped FP8 GEMM, masked layout; see ptxforge.kernels.m_grouped_gemm_fp8_masked."""

class EpHandle:
    """The routing a dispatch fixed (ptxforge.ep.Handle)."""

    @property
    def num_tokens(self) -> List[int]: ...
    @property
    def num_recv_rows(self) -> List[int]: ...
    @property
    def topk(self) -> int: ...
    @property
    def recv_src_rank(self) -> List[npt.NDArray[np.int32]]: ...
    @property
    def recv_src_token(self) -> List[npt.NDArray[np.int32]]: ...
    @property
    def recv_topk_slot(self) -> List[npt.NDArray[np.int32]]: ...
    @property
    def recv_expert(self) -> List[npt.NDArray[np.int32]]: ...
    @property
    def num_recv_tokens_per_expert_list(self) -> List[List[int]]: ...

_RecvX = Union[npt.NDArray[np.float32], Tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]]

class EpBuffer:
    """Native half of ptxforge.ep.Buffer; the constructor takes its keywords as one dict."""

    def __init__(self, config: dict) -> None: ...
    def get_dispatch_layout(
        self, topk_idx: npt.ArrayLike, rank: int = 0
    ) -> Tuple[
        npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.bool_]
    ]: ...
    def dispatch(
        self,
        x: Sequence[Union[npt.ArrayLike, _Fp8Pair]],
        topk_idx: Optional[Sequence[npt.ArrayLike]] = None,
        topk_weights: Optional[Sequence[npt.ArrayLike]] = None,
        handle: Optional[EpHandle] = None,
    ) -> Tuple[
        List[_RecvX],
        List[npt.NDArray[np.int32]],
        List[npt.NDArray[np.float32]],
        List[List[int]],
        EpHandle,
    ]: ...
    def combine(
        self,
        x: Sequence[npt.ArrayLike],
        handle: EpHandle,
        topk_weights: Optional[Sequence[npt.ArrayLike]] = None,
    ) -> List[npt.NDArray[np.float32]]: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def num_sms(self) -> int: ...
    @property
    def max_tokens_per_rank(self) -> int: ...
    @property
    def devices(self) -> List[str]: ...
