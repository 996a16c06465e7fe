"""ptxforge: PTX-level GPU programming, the CPU emulator and the DeepSeek-V3 kernel set from Python."""

from . import _native  # noqa: F401
