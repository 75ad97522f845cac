"""A small Triton library written the way Liger-Kernel is: forward and
backward helpers that launch kernels, a kernel parameter with a default
that callers leave out, kernels that write the tensors they are given, and
host code that reads tensor values. Op bodies elsewhere call into it."""

import torch
import triton
import triton.language as tl

BLOCK = 32


@triton.jit
def scale_kernel(X_ptr, Y_ptr, n, factor, BLOCK: tl.constexpr, X_stride: tl.constexpr = 1):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(X_ptr + offsets * X_stride, mask=mask)
    tl.store(Y_ptr + offsets, x * factor, mask=mask)


@triton.jit
def mul_by_scalar_kernel(X_ptr, g_ptr, n, BLOCK: tl.constexpr, X_stride: tl.constexpr = 1):
    """X *= g[0], in place (Liger's element_mul_kernel)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    g = tl.load(g_ptr)
    x = tl.load(X_ptr + offsets * X_stride, mask=mask)
    tl.store(X_ptr + offsets * X_stride, x * g, mask=mask)


@triton.jit
def square_kernel(X_ptr, Y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(X_ptr + offsets, mask=mask)
    tl.store(Y_ptr + offsets, x * x, mask=mask)


@triton.jit
def square_backward_kernel(X_ptr, dY_ptr, n, BLOCK: tl.constexpr):
    """dX = 2 * X * dY, written over X (Liger's SwiGLU and GeGLU backward)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(X_ptr + offsets, mask=mask)
    dy = tl.load(dY_ptr + offsets, mask=mask)
    tl.store(X_ptr + offsets, 2 * x * dy, mask=mask)


def grid(n):
    return (triton.cdiv(n, BLOCK),)


def scale_forward(x, factor):
    y = torch.empty_like(x)
    scale_kernel[grid(x.numel())](x, y, x.numel(), factor, BLOCK=BLOCK)  # X_stride left to its default
    return y


def scale_backward(dy, factor, in_place=False):
    """in_place writes the gradient into dy (Liger's RMSNorm backward)."""
    dx = dy if in_place else torch.empty_like(dy)
    scale_kernel[grid(dy.numel())](dy, dx, dy.numel(), factor, BLOCK=BLOCK)
    return dx


def mul_by_scalar_(x, g):
    """x *= g, in place, g a one-element tensor (Liger's CrossEntropy backward)."""
    mul_by_scalar_kernel[grid(x.numel())](x, g, x.numel(), BLOCK=BLOCK)
    return x


def square_forward(x):
    y = torch.empty_like(x)
    square_kernel[grid(x.numel())](x, y, x.numel(), BLOCK=BLOCK)
    return x, y


def square_backward(x, dy):
    """Overwrites the saved input x with its gradient."""
    square_backward_kernel[grid(x.numel())](x, dy, x.numel(), BLOCK=BLOCK)
    return x


def count_positive_then_scale(x):
    """Host code that reads a tensor value (Liger's CrossEntropy counts targets with .item())."""
    n_positive = (x > 0).sum().item()
    return scale_forward(x, 1.0 / max(n_positive, 1))


def equal_one_or_scale(dy, y):
    """Host code comparing tensor values (Liger's cross_entropy_backward: torch.equal)."""
    if torch.equal(dy, torch.ones_like(dy)):
        return y
    return scale_forward(y, 2.0)
