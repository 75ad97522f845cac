"""FlagGems' ops as opforge ops, FlagGems unchanged: one `@opforge.op` per
op, each calling FlagGems' own function (docs/triton.md, "Kernels found
where they are launched"), with their inputs. Shared by
tests/gpu/test_flaggems.py and benchmarks/bench_flaggems.py.

`PAIRS[name]` holds the port's call and FlagGems' own call on the same
inputs, each returning a tuple of tensors, and the inputs: "test" (what the
tests compare and compile: [256, 1024] rows) or "bench" ([4, 512] rows,
where the host's per-call work decides the time).
"""

import os
from dataclasses import dataclass
from typing import Callable

import torch

# FlagGems finds its vendor by running each vendor's query tool; name it.
os.environ.setdefault("GEMS_VENDOR", "nvidia")

from flag_gems.fused.silu_and_mul import silu_and_mul_grad_kernel, silu_and_mul_kernel  # noqa: E402
from flag_gems.ops.add import add as gems_add  # noqa: E402
from flag_gems.ops.layernorm import layer_norm as gems_layer_norm  # noqa: E402
from flag_gems.ops.rms_norm import rms_norm_backward, rms_norm_forward  # noqa: E402
from flag_gems.ops.softmax import softmax as gems_softmax  # noqa: E402

import opforge  # noqa: E402

Tensor = torch.Tensor
DEV = "cuda"
EPS = 1e-6


# --- the ports: one @opforge.op per FlagGems op ---------------------------------------------------


def rms_norm_setup_context(ctx, inputs, output):
    x, w, eps = inputs
    ctx.save_for_backward(x, w, output[1])
    ctx.eps = eps


def rms_norm_backward_fn(ctx, dy, _d_inv_rms):
    x, w, inv_rms = ctx.saved_tensors
    dx, dw = rms_norm_backward(dy, x, inv_rms, [x.shape[-1]], w, ctx.eps)
    return dx, dw, None


@opforge.op("gems::rms_norm", setup_context=rms_norm_setup_context, backward=rms_norm_backward_fn)
def rms_norm(x: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return rms_norm_forward(x, [x.shape[-1]], w, eps)


@opforge.op("gems::layer_norm")
def layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return gems_layer_norm(x, [x.shape[-1]], w, b, eps)


@opforge.op("gems::softmax")
def softmax(x: Tensor, dim: int) -> Tensor:
    return gems_softmax(x, dim)


def silu_and_mul_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def silu_and_mul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    return silu_and_mul_grad_kernel(a, b, grad)


@opforge.op("gems::silu_and_mul", setup_context=silu_and_mul_setup_context, backward=silu_and_mul_backward)
def silu_and_mul(a: Tensor, b: Tensor) -> Tensor:
    return silu_and_mul_kernel(a, b)


@opforge.op("gems::add")
def add(a: Tensor, b: Tensor) -> Tensor:
    return gems_add(a, b)


# --- inputs -----------------------------------------------------------------------------------------


def leaf(*shape, dtype):
    return torch.randn(*shape, device=DEV, dtype=dtype)


def norm_inputs(dtype, size, bias=False):
    rows, cols = (256, 1024) if size == "test" else (4, 512)
    x = leaf(rows, cols, dtype=dtype)
    w = (torch.rand(cols, device=DEV) + 0.5).to(dtype)
    return (x, w, leaf(cols, dtype=dtype)) if bias else (x, w)


def pair_inputs(dtype, size):
    shape = (256, 1024) if size == "test" else (4, 512)
    return leaf(*shape, dtype=dtype), leaf(*shape, dtype=dtype)


@dataclass
class Pair:
    port: Callable  # (*inputs) -> tuple of tensors, through the opforge op
    gems: Callable  # the same through FlagGems' own function
    inputs: Callable  # (dtype, size) -> tuple of tensors


PAIRS = {
    "rms_norm": Pair(lambda x, w: rms_norm(x, w, EPS)[:1], lambda x, w: rms_norm_forward(x, [x.shape[-1]], w, EPS)[:1],
                     norm_inputs),
    "layer_norm": Pair(lambda x, w, b: layer_norm(x, w, b, 1e-5)[:1],
                       lambda x, w, b: gems_layer_norm(x, [x.shape[-1]], w, b, 1e-5)[:1],
                       lambda d, s: norm_inputs(d, s, bias=True)),
    "softmax": Pair(lambda x: (softmax(x, -1),), lambda x: (gems_softmax(x, -1),), lambda d, s: pair_inputs(d, s)[:1]),
    "silu_and_mul": Pair(lambda a, b: (silu_and_mul(a, b),), lambda a, b: (silu_and_mul_kernel(a, b),), pair_inputs),
    "add": Pair(lambda a, b: (add(a, b),), lambda a, b: (gems_add(a, b),), pair_inputs),
}


def inputs_for(name, dtype, size="test"):
    torch.manual_seed(0)
    return PAIRS[name].inputs(dtype, size)
