"""The ptxforge kernel library on numpy data: FP8 quantisation and FP8/BF16 GEMMs.

Every function takes array-likes (numpy arrays, torch CPU tensors, ``ptxforge.DeviceArray``:
anything ``numpy.asarray`` accepts; non-contiguous arrays are copied), runs the library kernel
on ``device`` (``"emu:N"``, ``"cuda:N"`` or a ``ptxforge.Device``; default ``"emu:0"``, the CPU
emulator) with the GIL released, and returns numpy arrays. BF16 results are returned as
float32 holding the bfloat16 values exactly (numpy has no bfloat16).

GEMMs use DeepGEMM's NT layout: ``D = A @ B.T`` with A ``[m, k]`` and B ``[n, k]``, both
K-contiguous. FP8 operands are E4M3 bytes (uint8) with float32 scales: A per 1x128 (row,
128 columns), B per 128x128 block, as :func:`quantize_fp8` produces them.

Wrong dtypes raise ``TypeError``, wrong shapes or values ``ValueError``; both name the
argument. Emulator faults raise ``RuntimeError`` with the emulator's diagnostic.
"""

from . import _native

quantize_fp8 = _native.quantize_fp8
dequantize_fp8 = _native.dequantize_fp8
gemm_bf16 = _native.gemm_bf16
# DeepGEMM's operand-pair forms: a = (a_q, a_s), b = (b_q, b_s)
gemm_fp8_nt = _native.gemm_fp8_nt
m_grouped_gemm_fp8_nt_contiguous = _native.m_grouped_gemm_fp8_nt_contiguous
m_grouped_gemm_fp8_nt_masked = _native.m_grouped_gemm_fp8_nt_masked

__all__ = [
    "quantize_fp8",
    "dequantize_fp8",
    "gemm_bf16",
    "gemm_fp8",
    "m_grouped_gemm_fp8_contiguous",
    "m_grouped_gemm_fp8_masked",
    "gemm_fp8_nt",
    "m_grouped_gemm_fp8_nt_contiguous",
    "m_grouped_gemm_fp8_nt_masked",
]


def gemm_fp8(a_q, a_s, b_q, b_s, *, arch="sm_90a", device=None):
    """FP8 GEMM with fine-grained scaling (DeepGEMM's ``gemm_fp8_fp8_bf16_nt``).

    ``D = (A * a_s) @ (B * b_s).T``, the tensor-core partial sum of every 128-wide K block
    promoted to FP32 with ``a_s * b_s`` (DeepSeek-V3's recipe).

    Args:
        a_q: uint8 E4M3 ``[m, k]``.
        a_s: float32 ``[m, k/128]`` 1x128 scales (``quantize_fp8(a, "1x128")``).
        b_q: uint8 E4M3 ``[n, k]``.
        b_s: float32 ``[n/128, k/128]`` 128x128 scales (``quantize_fp8(b, "128x128")``).
            ``n`` and ``k`` are multiples of 128.
        arch: ``"sm_90a"`` (default) runs the Hopper ``wgmma`` kernel, ``"sm_89"`` the
            ``mma.sync`` kernel; ``"sm_80"`` has no FP8 tensor cores and is refused. The PTX is
            generated for the device's target (the emulator is an sm_90a part).
        device: ``"emu:N"``, ``"cuda:N"`` or a ``ptxforge.Device`` (default ``"emu:0"``).

    Returns:
        float32 ``[m, n]`` holding the bfloat16 results.

    Raises:
        TypeError: ``a_q``/``b_q`` not uint8, scales not floating.
        ValueError: shapes (K mismatch, K or n not a multiple of 128, scale shapes), ``arch``.
    """
    return _native.gemm_fp8_nt((a_q, a_s), (b_q, b_s), arch=arch, device=device)


def m_grouped_gemm_fp8_contiguous(a_q, a_s, b_q, b_s, m_indices, *, arch="sm_90a", device=None):
    """Grouped FP8 GEMM, contiguous layout (DeepGEMM's
    ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous``): ``D[r] = A[r] @ B[m_indices[r]].T``.

    The MoE layout of a dispatch: every expert's rows concatenated, each expert's segment
    padded to a multiple of 128 rows.

    Args:
        a_q: uint8 E4M3 ``[m, k]``, ``m`` a multiple of 128.
        a_s: float32 ``[m, k/128]``.
        b_q: uint8 E4M3 ``[groups, n, k]`` (one weight per expert).
        b_s: float32 ``[groups, n/128, k/128]``.
        m_indices: int ``[m]``, the expert of each row, ``-1`` for a padding row; each
            128-row segment holds one expert's rows followed only by padding.
        arch, device: as for :func:`gemm_fp8`.

    Returns:
        float32 ``[m, n]`` (bfloat16 values); padding rows are 0.

    Raises:
        TypeError: as :func:`gemm_fp8`.
        ValueError: shapes, ``m_indices`` entries outside ``-1..groups`` or a 128-row
            segment mixing experts.
    """
    return _native.m_grouped_gemm_fp8_nt_contiguous(
        (a_q, a_s), (b_q, b_s), m_indices, arch=arch, device=device
    )


def m_grouped_gemm_fp8_masked(
    a_q, a_s, b_q, b_s, masked_m, expected_m, *, arch="sm_90a", device=None
):
    """Grouped FP8 GEMM, masked layout (DeepGEMM's ``m_grouped_gemm_fp8_fp8_bf16_nt_masked``):
    ``D[g, r] = A[g, r] @ B[g].T`` for ``r < masked_m[g]``.

    The decoding layout (fixed shapes for CUDA graphs): ``groups`` slabs of ``m_max`` rows of
    which the first ``masked_m[g]`` are valid.

    Args:
        a_q: uint8 E4M3 ``[groups, m_max, k]``.
        a_s: float32 ``[groups, m_max, k/128]``.
        b_q: uint8 E4M3 ``[groups, n, k]``.
        b_s: float32 ``[groups, n/128, k/128]``.
        masked_m: int ``[groups]``, valid rows per group, each in ``0..=m_max``.
        expected_m: the expected valid rows per group (positive): sizes the tile choice, as
            in DeepGEMM; it does not change the result.
        arch, device: as for :func:`gemm_fp8`.

    Returns:
        float32 ``[groups, m_max, n]`` (bfloat16 values); rows past ``masked_m[g]`` are 0.

    Raises:
        TypeError: as :func:`gemm_fp8`.
        ValueError: shapes, ``masked_m`` entries outside ``0..=m_max``, ``expected_m <= 0``.
    """
    return _native.m_grouped_gemm_fp8_nt_masked(
        (a_q, a_s), (b_q, b_s), masked_m, expected_m, arch=arch, device=device
    )
