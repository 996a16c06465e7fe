"""What the launcher reads from the PTX that Triton's NVIDIA backend emitted.

Two things: scalars as the kernel's PTX parameter types (``Module.launch`` checks every argument
against them, and Triton's signature says ``i32`` where the PTX says ``.u32``), and the
``.loc``/``.file`` debug directives, which map a faulting PTX
line back to the line of the ``@triton.jit`` function that produced it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)")
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:,\s*"([^"]*)")?')


class PtxParamError(TypeError):
    """A kernel argument that cannot be given to the PTX parameter it lands on."""


@dataclass(frozen=True)
class PtxParam:
    """One ``.param`` of a ``.entry``: PTX type (``u32``, ``f32``, ``u64``, ``b8`` ...) and name."""

    ty: str
    name: str
    is_array: bool

    @staticmethod
    def from_pair(name: str, ty: str) -> "PtxParam":
        """From ``Module.params``' ``(name, type)``: ``("n", "u32")``, ``("desc", "b8[128]")``."""
        base = ty.split("[", 1)[0]
        return PtxParam(base, name, "[" in ty)

    @property
    def bits(self) -> int:
        digits = "".join(c for c in self.ty if c.isdigit())
        return int(digits) if digits else 0


def scalar_for_param(value, param: PtxParam, arg_name: str):
    """``value`` (a Python/numpy scalar as Triton passes it) as the PTX parameter's type.

    Integers are wrapped to the parameter's width (Triton's ``i32`` lands on ``.u32``: the bits
    are what matters); floats go to ``.f32``/``.f64`` parameters as floats and to ``.b16``
    parameters as their fp16 bits.
    """
    ty = param.ty
    if param.is_array:
        raise PtxParamError(f"argument `{arg_name}`: PTX parameter `{param.name}` is a byte array "
                            "(a by-value struct such as a TMA descriptor), which this driver does not pass")
    if isinstance(value, bool):
        value = int(value)
    if ty in ("f32", "f64"):
        if not _is_number(value):
            raise PtxParamError(f"argument `{arg_name}`: expected a number for .{ty} parameter `{param.name}`, "
                                f"got {type(value).__name__}")
        return float(value)
    if ty in ("b16", "f16") and isinstance(value, float):
        return struct.unpack("<H", struct.pack("<e", value))[0]
    if not _is_integer(value):
        if _is_number(value) and ty in ("b32", "b64"):
            fmt = "<f" if ty == "b32" else "<d"
            return struct.unpack("<I" if ty == "b32" else "<Q", struct.pack(fmt, float(value)))[0]
        raise PtxParamError(f"argument `{arg_name}`: expected an integer for .{ty} parameter `{param.name}`, "
                            f"got {type(value).__name__}")
    bits = param.bits
    v = int(value) & ((1 << bits) - 1)
    if ty.startswith("s") and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def _is_integer(v) -> bool:
    return hasattr(v, "__index__")


def _is_number(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


class SourceMap:
    """PTX line (1-based) -> the Triton source position of the nearest preceding ``.loc``."""

    def __init__(self, ptx: str):
        self._files: Dict[int, str] = {}
        self._loc_by_line: List[Optional[Tuple[int, int, int]]] = [None]
        current: Optional[Tuple[int, int, int]] = None
        in_asm = False
        for line in ptx.splitlines():
            # LLVM repeats `.loc` inside an inline-asm block with the line number advanced per asm
            # line, so there the position in effect where the block began is the true one.
            if "// begin inline asm" in line:
                in_asm = True
            elif "// end inline asm" in line:
                in_asm = False
            m = _LOC.match(line)
            if m and not (in_asm and current is not None):
                current = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            f = _FILE.match(line)
            if f:
                path = f.group(2) if not f.group(3) else f"{f.group(3)}/{f.group(2)}"
                self._files[int(f.group(1))] = path
            self._loc_by_line.append(current)

    def lookup(self, ptx_line: int) -> Optional[str]:
        """``file:line:column`` of the Python source for a PTX line, or ``None``."""
        if not 0 < ptx_line < len(self._loc_by_line):
            return None
        loc = self._loc_by_line[ptx_line]
        if loc is None or loc[1] == 0:
            return None
        path = self._files.get(loc[0], f"<file {loc[0]}>")
        return f"{path}:{loc[1]}:{loc[2]}"
