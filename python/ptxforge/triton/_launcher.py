"""The launcher Triton calls for every launch of a compiled kernel: PTX on the emulator.

Triton hands it the bound arguments of the ``@triton.jit`` function (constexprs included) and the
grid; it flattens them in the order of the kernel's PTX parameters, appends the scratch pointers
the PTX asks for (Triton >= 3.5 adds ``global_scratch`` and ``profile_scratch``), converts scalars
to the PTX types, and runs ``ptxforge`` ``Module.launch``; the host arrays go to the emulated
device and the results come back into the caller's memory (``_backend.launch``).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _ptx
from ._args import DevicePointer, HostTensor


class LoadedKernel:
    """What ``utils.load_binary`` returns as Triton's "function": the module and the entry."""

    def __init__(self, module, name: str, ptx: str):
        self.module = module
        self.name = name
        self.ptx = ptx
        self.params = [_ptx.PtxParam.from_pair(pname, ty) for pname, ty in module.params(name)]
        self._source_map: Optional[_ptx.SourceMap] = None

    def source_of(self, ptx_line: int) -> Optional[str]:
        """The ``@triton.jit`` source position that produced PTX line ``ptx_line``."""
        if self._source_map is None:
            self._source_map = _ptx.SourceMap(self.ptx)
        return self._source_map.lookup(ptx_line)


def _flatten(signature: Sequence[Any], names: Sequence[str], args: Sequence[Any]) -> List[Tuple[str, str, Any]]:
    """(name, triton type, value) of every runtime argument, tuples flattened, constexprs dropped."""
    out: List[Tuple[str, str, Any]] = []
    for name, ty, value in zip(names, signature, args):
        if isinstance(ty, tuple):
            out.extend(_flatten(ty, [f"{name}[{i}]" for i in range(len(ty))], value))
        elif ty != "constexpr":
            if isinstance(ty, str) and ty.startswith("tensordesc"):
                raise TypeError(f"argument `{name}`: tensor descriptors (TMA) are not supported by the "
                                "ptxforge Triton driver; pass a pointer and strides")
            out.append((name, ty, value))
    return out


def _host_array(name: str, value) -> np.ndarray:
    """The host memory a pointer argument names, as a numpy array sharing that memory."""
    if isinstance(value, HostTensor):
        return value.array
    if isinstance(value, np.ndarray):
        return HostTensor(value, what=f"argument `{name}`").array
    if type(value).__module__.startswith("torch"):
        return _torch_array(name, value)
    raise TypeError(f"argument `{name}`: a pointer parameter needs a numpy array, a torch CPU tensor or "
                    f"ptxforge.triton.typed(...), got {type(value).__name__}")


def _torch_array(name: str, tensor) -> np.ndarray:
    import torch

    if tensor.device.type != "cpu":
        raise ValueError(f"argument `{name}`: tensor is on {tensor.device}; the emulator driver takes CPU tensors")
    if not tensor.is_contiguous():
        raise ValueError(f"argument `{name}`: tensor is not contiguous; call .contiguous() first")
    t = tensor.detach()
    size = t.element_size()
    if t.dtype in (torch.bfloat16, torch.float16) or size == 1 and t.dtype not in (torch.int8, torch.uint8, torch.bool):
        t = t.view(torch.int16 if size == 2 else torch.uint8)
    return t.numpy()


class EmulatorLauncher:
    """Triton's ``launcher_cls``: built once per compiled kernel, called once per launch."""

    last_launch_seconds: float = 0.0

    def __init__(self, src, metadata):
        self.names = list(src.fn.arg_names) if hasattr(src, "fn") else list(src.signature.keys())
        self.signature = list(src.signature.values())
        if getattr(metadata, "tensordesc_meta", None):
            raise TypeError("tensor descriptors (TMA) are not supported by the ptxforge Triton driver")
        self.num_warps = metadata.num_warps
        self.num_ctas = getattr(metadata, "num_ctas", 1)
        self.shared = metadata.shared
        self.scratch = [(getattr(metadata, "global_scratch_size", 0), "global_scratch"),
                        (getattr(metadata, "profile_scratch_size", 0), "profile_scratch")]
        if self.num_ctas != 1:
            raise ValueError(f"num_ctas: {self.num_ctas} CTAs per cluster is not supported by the ptxforge "
                             "Triton driver (use num_ctas=1)")

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                 launch_enter_hook, launch_exit_hook, *args):
        if gridX * gridY * gridZ == 0:
            return
        kernel_args = self._kernel_args(function, (gridX, gridY, gridZ), args)
        if launch_enter_hook is not None:
            launch_enter_hook(launch_metadata)
        from . import _backend

        EmulatorLauncher.last_launch_seconds = _backend.launch(
            function, (gridX, gridY, gridZ), (32 * self.num_warps, 1, 1), self.shared, kernel_args)
        if launch_exit_hook is not None:
            launch_exit_hook(launch_metadata)

    def _kernel_args(self, function: LoadedKernel, grid, args) -> list:
        """The argument list in PTX parameter order: host arrays for pointers, typed scalars."""
        flat = _flatten(self.signature, self.names, args)
        params = function.params
        extra = len(params) - len(flat)
        if extra < 0 or extra > len(self.scratch):
            raise TypeError(f"kernel `{function.name}`: {len(flat)} runtime arguments but the PTX has "
                            f"{len(params)} parameters ({', '.join(p.name for p in params)})")
        out = []
        seen = {}
        for (name, ty, value), param in zip(flat, params):
            if isinstance(ty, str) and ty.startswith("*"):
                out.append(self._pointer(name, value, seen, function.module.device))
            else:
                out.append(_ptx.scalar_for_param(value, param, name))
        n_ctas = grid[0] * grid[1] * grid[2]
        for size, _name in self.scratch[:extra]:
            out.append(np.zeros(n_ctas * size, np.uint8) if size > 0 else 0)
        return out

    @staticmethod
    def _pointer(name: str, value, seen: dict, device):
        if isinstance(value, DevicePointer):
            if value.array.device != device:
                raise ValueError(f"argument `{name}`: a DeviceArray on {value.array.device}, but the kernel runs "
                                 f"on {device} (ptxforge.triton.activate(device=...))")
            return value.array
        array = _host_array(name, value)
        key = (array.ctypes.data, array.nbytes)
        if key in seen:
            return seen[key]
        seen[key] = array
        return array
