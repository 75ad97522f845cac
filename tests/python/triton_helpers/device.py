"""@triton.jit helpers that kernels elsewhere reach through this module
(`device.program_id(0)`), as FlagGems' kernels reach its triton_lang_extension."""

import triton
import triton.language as tl


@triton.jit
def program_id(axis: tl.constexpr):
    return tl.program_id(axis).to(tl.int64)


@triton.jit
def twice(x):
    return x * 2
