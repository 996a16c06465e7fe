"""Shared PTX kernels and helpers of the core tests (test_core.py, test_errors.py)."""

import numpy as np
import pytest

HEADER = """
.version 8.0
.target sm_90
.address_size 64
"""

# c[i] = a[i] + b[i] for i < n
VADD = HEADER + r"""
.visible .entry vadd(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)
{
  .reg .pred %p<2>; .reg .b32 %r<6>; .reg .b64 %rd<11>; .reg .f32 %f<4>;
  ld.param.u64 %rd1, [a]; ld.param.u64 %rd2, [b]; ld.param.u64 %rd3, [c];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd4, %rd1; cvta.to.global.u64 %rd5, %rd2; cvta.to.global.u64 %rd6, %rd3;
  mul.wide.u32 %rd7, %r5, 4;
  add.s64 %rd8, %rd4, %rd7; add.s64 %rd9, %rd5, %rd7; add.s64 %rd10, %rd6, %rd7;
  ld.global.f32 %f1, [%rd8]; ld.global.f32 %f2, [%rd9];
  add.f32 %f3, %f1, %f2;
  st.global.f32 [%rd10], %f3;
DONE:
  ret;
}
"""

# out[blockIdx.x] = scale * sum(x[blockIdx.x*256 .. +256]): a 256-thread shared-memory tree
# reduction per CTA, with a float scalar parameter.
REDUCE = HEADER + r"""
.visible .entry rowsum(.param .u64 x, .param .u64 out, .param .f32 scale)
{
  .reg .pred %p<3>; .reg .b32 %r<10>; .reg .b64 %rd<10>; .reg .f32 %f<6>;
  .shared .align 4 .f32 buf[256];
  ld.param.u64 %rd1, [x]; ld.param.u64 %rd2, [out]; ld.param.f32 %f5, [scale];
  cvta.to.global.u64 %rd1, %rd1; cvta.to.global.u64 %rd2, %rd2;
  mov.u32 %r1, %tid.x; mov.u32 %r2, %ctaid.x;
  shl.b32 %r3, %r2, 8; add.s32 %r3, %r3, %r1;
  mul.wide.u32 %rd3, %r3, 4; add.s64 %rd4, %rd1, %rd3;
  ld.global.f32 %f1, [%rd4];
  mov.u32 %r4, buf; shl.b32 %r5, %r1, 2; add.s32 %r6, %r4, %r5;
  st.shared.f32 [%r6], %f1;
  bar.sync 0;
  mov.u32 %r7, 128;
LOOP:
  setp.ge.u32 %p1, %r1, %r7;
  @%p1 bra SKIP;
  shl.b32 %r8, %r7, 2; add.s32 %r9, %r6, %r8;
  ld.shared.f32 %f2, [%r6]; ld.shared.f32 %f3, [%r9];
  add.f32 %f2, %f2, %f3;
  st.shared.f32 [%r6], %f2;
SKIP:
  bar.sync 0;
  shr.u32 %r7, %r7, 1;
  setp.ne.u32 %p2, %r7, 0;
  @%p2 bra LOOP;
  setp.ne.u32 %p1, %r1, 0;
  @%p1 bra DONE;
  ld.shared.f32 %f4, [%r4];
  mul.f32 %f4, %f4, %f5;
  mul.wide.u32 %rd5, %r2, 4; add.s64 %rd6, %rd2, %rd5;
  st.global.f32 [%rd6], %f4;
DONE:
  ret;
}
"""

# y[i] = x[i] * k + off for i < n over 64-bit signed integers (int scalars of two kinds)
AXPB_I64 = HEADER + r"""
.visible .entry axpb(.param .u64 x, .param .u64 y, .param .s64 k, .param .s32 off, .param .u32 n)
{
  .reg .pred %p<2>; .reg .b32 %r<7>; .reg .b64 %rd<12>;
  ld.param.u64 %rd1, [x]; ld.param.u64 %rd2, [y]; ld.param.s64 %rd3, [k];
  ld.param.s32 %r1, [off]; ld.param.u32 %r2, [n];
  mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ntid.x; mov.u32 %r5, %tid.x;
  mad.lo.s32 %r6, %r3, %r4, %r5;
  setp.ge.u32 %p1, %r6, %r2;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd1, %rd1; cvta.to.global.u64 %rd2, %rd2;
  mul.wide.u32 %rd4, %r6, 8;
  add.s64 %rd5, %rd1, %rd4; add.s64 %rd6, %rd2, %rd4;
  ld.global.s64 %rd7, [%rd5];
  mul.lo.s64 %rd8, %rd7, %rd3;
  cvt.s64.s32 %rd9, %r1;
  add.s64 %rd10, %rd8, %rd9;
  st.global.s64 [%rd6], %rd10;
DONE:
  ret;
}
"""

# stores one float 1 MiB past its pointer: an out-of-bounds store on line OOB_LINE
OOB = HEADER + r"""
.visible .entry oob(.param .u64 a)
{
  .reg .b64 %rd<3>; .reg .f32 %f<2>;
  ld.param.u64 %rd1, [a];
  add.s64 %rd2, %rd1, 1048576;
  mov.f32 %f1, 0f3F800000;
  st.global.f32 [%rd2], %f1;
  ret;
}
"""
OOB_LINE = OOB.splitlines().index("  st.global.f32 [%rd2], %f1;") + 1

# loops forever (the counter never reaches its exit value)
SPIN = HEADER + r"""
.visible .entry spin(.param .u64 a)
{
  .reg .pred %p<2>; .reg .b32 %r<2>;
  mov.u32 %r1, 0;
LOOP:
  add.u32 %r1, %r1, 1;
  setp.eq.u32 %p1, %r1, 0x7fffffff;
  @%p1 bra LOOP;
  bra LOOP;
}
"""


@pytest.fixture
def rng():
    """A fresh generator per test (fresh inputs every run; the seed is printed on failure)."""
    seed = np.random.SeedSequence().entropy
    print(f"seed {seed}")
    return np.random.default_rng(seed)

# y[i] = x[blockDim.x - 1 - i] through dynamic shared memory (`extern .shared`), one CTA
REVERSE_DYN = HEADER + r"""
.extern .shared .align 4 .b8 dyn[];
.visible .entry reverse(.param .u64 x, .param .u64 y)
{
  .reg .b32 %r<8>; .reg .b64 %rd<7>; .reg .f32 %f<2>;
  ld.param.u64 %rd1, [x]; ld.param.u64 %rd2, [y];
  cvta.to.global.u64 %rd1, %rd1; cvta.to.global.u64 %rd2, %rd2;
  mov.u32 %r1, %tid.x; mov.u32 %r2, %ntid.x;
  mul.wide.u32 %rd3, %r1, 4; add.s64 %rd4, %rd1, %rd3;
  ld.global.f32 %f1, [%rd4];
  mov.u32 %r3, dyn; shl.b32 %r4, %r1, 2; add.s32 %r5, %r3, %r4;
  st.shared.f32 [%r5], %f1;
  bar.sync 0;
  sub.s32 %r6, %r2, %r1; sub.s32 %r6, %r6, 1;
  shl.b32 %r7, %r6, 2; add.s32 %r7, %r3, %r7;
  ld.shared.f32 %f1, [%r7];
  add.s64 %rd5, %rd2, %rd3;
  st.global.f32 [%rd5], %f1;
  ret;
}
"""
