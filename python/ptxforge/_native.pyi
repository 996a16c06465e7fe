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
