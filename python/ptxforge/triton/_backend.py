"""The one place the Triton driver touches ptxforge's native module API.

``load_module`` and ``launch`` sit on ``ptxforge.Module`` / ``Module.launch`` (numpy arrays are
copied to the emulated device and back; scalars are checked against the PTX parameters);
``take_ptx`` finds the PTX of the kernel Triton is loading.
"""

from __future__ import annotations

import sys
from typing import Optional


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


def load_module(ptx: str):
    """An emulator module for ``ptx`` (parsed and validated now; errors name the PTX line)."""
    import ptxforge

    return ptxforge.Module(ptx)


def launch(function, grid, block, shared: int, args: list) -> None:
    """Run ``function`` (a ``LoadedKernel``); an emulator fault gains the Triton source line."""
    import ptxforge

    fault_types = tuple(t for t in (getattr(ptxforge, "EmulatorFault", None),
                                    getattr(ptxforge, "EmulatorHang", None)) if t is not None)
    try:
        function.module.launch(function.name, grid, block, args, shared=shared)
    except fault_types as err:
        _annotate(err, function)
        raise


def _annotate(err: BaseException, function) -> None:
    """Attach ``triton_source`` (``file:line:col`` of the ``@triton.jit`` code) to a fault."""
    line: Optional[int] = getattr(err, "ptx_line", None)
    if not isinstance(line, int):
        return
    source = function.source_of(line)
    try:
        err.triton_source = source
    except AttributeError:
        return
    if source is not None and hasattr(err, "add_note"):
        err.add_note(f"Triton source: {source} (PTX line {line} of kernel `{function.name}`)")
