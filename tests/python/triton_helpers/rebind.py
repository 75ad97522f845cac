"""A module whose globals the tests rebind after registering ops."""

import torch
import triton
from torch import Tensor

from .kernels import add_kernel

BLOCK = 32
current_kernel = add_kernel


def apply_current_kernel(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    current_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK)
    return out


def launch(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK)
    return out


def call_current_helper(x: Tensor, y: Tensor) -> Tensor:
    return launch(x, y)
