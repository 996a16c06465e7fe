"""DeepEP-style expert-parallel dispatch and combine across emulated (or CUDA) devices.

One process holds every rank, as ``ptxforge moe`` does: where DeepEP takes one rank's tensor,
:class:`Buffer` takes a list with one array per rank (rank ``r`` runs on ``devices[r]``,
default ``emu:r``), and returns lists in the same way. The kernels are the ``ep`` crate's
hierarchical dispatch/combine (DeepEP normal mode: ranks are ``nodes x gpus_per_node``; a
token crosses to each destination node once, then fans out over the intra-node links), run on
``num_sms`` SMs per rank with clock-based timeouts in every wait loop.

Received rows are laid out for the grouped GEMMs: one row per (token, local expert) pair,
grouped by local expert, each expert's segment padded to a multiple of 128 rows (DeepGEMM's
contiguous layout; ``recv_expert`` is its ``m_indices``).
"""

from . import _native

Handle = _native.EpHandle

__all__ = ["Buffer", "Handle"]


class Buffer:
    """The expert-parallel communication buffer of a group of ``num_ranks`` ranks.

    Args:
        num_ranks: ranks in the group (1..64).
        hidden: hidden size of a token (a multiple of 128).
        num_experts: experts in total (a multiple of ``num_ranks``; rank ``r`` holds experts
            ``r * E/num_ranks ...``).
        gpus_per_node: ranks per node (default ``num_ranks``: one node). Tokens cross between
            nodes over the emulated RDMA link, within a node over peer pointers (NVLink).
        num_sms: SMs of the communication kernels per rank (even; default 20, DeepEP's). They
            are the last ``num_sms`` of the device's 132.
        max_tokens_per_rank: the most tokens one rank dispatches in one call (default 256).
        devices: one device per rank (spec strings or ``ptxforge.Device``; default
            ``["emu:0", ..., "emu:{num_ranks-1}"]``).
        timeout_s: how long a wait loop may see no progress before the call raises
            ``TimeoutError`` (emulated time on the emulator; default 20).

    Raises:
        ValueError: a keyword out of range, named.
    """

    def __init__(
        self,
        num_ranks,
        hidden,
        num_experts,
        *,
        gpus_per_node=None,
        num_sms=20,
        max_tokens_per_rank=256,
        devices=None,
        timeout_s=20.0,
    ):
        self._native = _native.EpBuffer(
            {
                "num_ranks": num_ranks,
                "hidden": hidden,
                "num_experts": num_experts,
                "gpus_per_node": gpus_per_node,
                "num_sms": num_sms,
                "max_tokens_per_rank": max_tokens_per_rank,
                "devices": None if devices is None else list(devices),
                "timeout_s": float(timeout_s),
            }
        )

    num_ranks = property(lambda self: self._native.num_ranks, doc="Ranks in the group.")
    gpus_per_node = property(lambda self: self._native.gpus_per_node, doc="Ranks per node.")
    hidden = property(lambda self: self._native.hidden, doc="Hidden size.")
    num_experts = property(lambda self: self._native.num_experts, doc="Experts in total.")
    num_sms = property(lambda self: self._native.num_sms, doc="SMs of the kernels per rank.")
    max_tokens_per_rank = property(
        lambda self: self._native.max_tokens_per_rank, doc="Most tokens per rank per call."
    )
    devices = property(lambda self: self._native.devices, doc="Device of each rank (specs).")

    def __repr__(self):
        return repr(self._native)

    def get_dispatch_layout(self, topk_idx, rank=0):
        """The dispatch layout of one rank's routing (DeepEP's ``get_dispatch_layout``).

        Args:
            topk_idx: int ``[T, topk]``, each token's experts (``-1``: none; no expert twice in
                a row; ``topk`` at most 32).
            rank: the rank whose device computes it (the result does not depend on it).

        Returns:
            ``(num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert,
            is_token_in_rank)``: int32 ``[num_ranks]`` tokens sent to each rank, int32
            ``[nodes]`` tokens sent to each node, int32 ``[num_experts]`` copies per expert,
            bool ``[T, num_ranks]``.

        Raises:
            TypeError: ``topk_idx`` not integer. ValueError: shape, an entry outside
            ``-1..num_experts``, a repeated expert, ``rank`` out of range.
        """
        return self._native.get_dispatch_layout(topk_idx, rank)

    def dispatch(self, x, topk_idx=None, topk_weights=None, handle=None):
        """Sends every rank's tokens to the ranks of their top-k experts (DeepEP's ``dispatch``).

        Args:
            x: one entry per rank: a floating array ``[T_r, hidden]`` (BF16 payload, rounded
                to bfloat16), or a tuple ``(q, scales)`` for the FP8 payload: uint8 E4M3
                ``[T_r, hidden]`` and float32 ``[T_r, hidden/128]`` (``quantize_fp8(x)``;
                DeepSeek-V3 dispatches with power-of-two scales, ``ue8m0``-style, but any
                scales travel). All ranks use the same payload.
            topk_idx: one int ``[T_r, topk]`` per rank (``-1``: no expert); not with ``handle``.
            topk_weights: one floating ``[T_r, topk]`` per rank; not with ``handle``.
            handle: the handle of an earlier dispatch: reuse its routing and layout (no layout
                kernels, no count exchange). This is the backward of :meth:`combine`: send the
                gradients of the combined tokens back to the rows they came from.

        Returns:
            ``(recv_x, recv_expert, recv_topk_weights, num_recv_tokens_per_expert_list,
            handle)``, lists with one entry per rank:

            - ``recv_x``: float32 ``[rows_r, hidden]`` (bfloat16 values), or ``(q, scales)``
              for FP8: one row per (token, local expert) pair, grouped by local expert, each
              expert's segment padded to 128 rows (padding rows are 0);
            - ``recv_expert``: int32 ``[rows_r]``, local expert of each row, ``-1`` for padding
              (the ``m_indices`` of ``m_grouped_gemm_fp8_contiguous``);
            - ``recv_topk_weights``: float32 ``[rows_r]``, the top-k weight of each row's
              (token, expert) pair (0 for padding);
            - ``num_recv_tokens_per_expert_list``: rows per local expert, before padding;
            - ``handle``: a :class:`Handle` (the same object when one was passed); its
              ``recv_src_rank``, ``recv_src_token`` and ``recv_topk_slot`` say where each
              row came from.

        Raises:
            TypeError / ValueError naming the argument (``x[r]``, ``topk_idx[r]``, ...):
            wrong dtype, wrong shape, a list without one entry per rank, more than
            ``max_tokens_per_rank`` tokens, an expert out of range. TimeoutError: a rank
            stopped making progress. RuntimeError: an emulator fault.
        """
        return self._native.dispatch(x, topk_idx, topk_weights, handle)

    def combine(self, x, handle, topk_weights=None):
        """Reduces the expert outputs back to their tokens' home ranks (DeepEP's ``combine``).

        ``out[r][t] = sum over the rows of token (r, t) of w_row * x_row`` (BF16 on the
        links, FP32 sums: reduced at the forwarder of each node, then at home in node order).

        Args:
            x: one floating ``[rows_r, hidden]`` per rank, in the row layout ``handle``'s
                dispatch produced (rounded to bfloat16; padding rows are ignored).
            handle: the :class:`Handle` of the dispatch.
            topk_weights: ``None`` for a plain sum (the backward of :meth:`dispatch`), or one
                float ``[rows_r]`` per rank: each row's weight, e.g. the dispatch's
                ``recv_topk_weights`` (the forward of an MoE layer).

        Returns:
            list of float32 ``[T_r, hidden]`` (bfloat16 values), one per rank.

        Raises:
            TypeError / ValueError naming the argument; ``handle`` from another Buffer.
        """
        return self._native.combine(x, handle, topk_weights)
