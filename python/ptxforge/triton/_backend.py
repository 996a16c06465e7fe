"""The one place the Triton driver touches ptxforge's native module API.

``load_module`` and ``launch`` sit on ``ptxforge.Module`` / ``Module.launch`` and
``ptxforge.asarray`` (host arrays become device arrays on the module's device and are copied
back after the launch; scalars are checked against the PTX parameters by ``Module.launch``);
``take_ptx`` finds the PTX of the kernel Triton is loading.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def take_ptx(name: str, kernel) -> str:
    """The PTX text of the compiled kernel ``name`` whose binary Triton passed to ``load_binary``.

    Triton's ``CompiledKernel._init_handles`` passes the cubin its ptxas made (which proves the
    PTX assembles) but the emulator runs PTX: the ``CompiledKernel`` on the caller's frame holds
    it in ``asm["ptx"]``. A caller that passes PTX text itself (str or bytes) is served directly.
    """
    if isinstance(kernel, str):
        return kernel
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        asm = getattr(owner, "asm", None)
        if getattr(owner, "kernel", None) is kernel and asm is not None and "ptx" in asm:
            return asm["ptx"]
        frame = frame.f_back
    head = bytes(kernel[:4096]) if isinstance(kernel, (bytes, bytearray)) else b""
    if b".entry" in head or b".version" in head:
        return bytes(kernel).decode()
    raise RuntimeError(f"kernel `{name}`: Triton passed a binary without its PTX; the ptxforge driver "
                       "runs PTX, so load kernels through Triton's CompiledKernel")


def load_module(ptx: str, device: str):
    """A module for ``ptx`` on ``device`` (parsed and validated now; errors name the PTX line)."""
    import ptxforge

    return ptxforge.Module(ptx, device=device)


def launch(function, grid, block, shared: int, args: list) -> float:
    """Run ``function`` (a ``LoadedKernel``) with ``args`` (host arrays and typed scalars).

    Each distinct host array is copied to the emulated device once (an array passed for two
    pointer parameters is one buffer, as on a GPU) and copied back after the launch, unless it is
    read-only. Returns the seconds the launch itself took (copies excluded). An emulator fault
    gains ``triton_source``, the ``@triton.jit`` line that produced the faulting PTX line.
    """
    import ptxforge

    device = function.module.device
    uploaded = {}
    kernel_args = []
    for a in args:
        if isinstance(a, np.ndarray):
            key = id(a)
            if key not in uploaded:
                uploaded[key] = (a, ptxforge.asarray(a, device=device))
            kernel_args.append(uploaded[key][1])
        else:
            kernel_args.append(a)
    start = time.perf_counter()
    try:
        function.module.launch(function.name, grid, block, kernel_args, shared=shared)
    except ptxforge.EmulatorFault as err:
        _annotate(err, function)
        raise
    seconds = time.perf_counter() - start
    for host, dev in uploaded.values():
        if host.flags.writeable:
            np.copyto(host, dev.numpy().reshape(host.shape).view(host.dtype), casting="no")
    return seconds


def _annotate(err: BaseException, function) -> None:
    """Attach ``triton_source`` (``file:line:col`` of the ``@triton.jit`` code) to a fault."""
    line = getattr(err, "line", None)
    source = function.source_of(line) if isinstance(line, int) else None
    try:
        err.triton_source = source
    except AttributeError:
        return
    if source is not None and hasattr(err, "add_note"):
        err.add_note(f"Triton source: {source} (PTX line {line} of kernel `{function.name}`)")
