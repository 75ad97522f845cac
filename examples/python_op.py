"""An attention-like op defined with `@opforge.op`: a config dataclass, an
enum mode, an optional group of settings and a backward, on CPU.

    python examples/python_op.py

It checks its results against plain PyTorch (eager, compiled and gradients)
and prints the schema torch sees.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

import opforge

Tensor = torch.Tensor


class Normalize(enum.Enum):
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


@dataclass(frozen=True)
class Window:
    """Sliding-window masking: each query sees at most `size` keys back."""

    size: int
    causal: bool = True


@dataclass(frozen=True)
class AttnConfig:
    scale: float
    normalize: Normalize = Normalize.SOFTMAX
    window: Optional[Window] = None


def _mask(n: int, m: int, window: Window, device) -> Tensor:
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(m, device=device)[None, :]
    keep = (i - j) < window.size
    return keep & (j <= i) if window.causal else keep & ((j - i) < window.size)


def _forward(q: Tensor, k: Tensor, v: Tensor, cfg: AttnConfig) -> tuple[Tensor, Tensor]:
    """Output and attention weights; the weights are what backward needs."""
    scores = (q @ k.transpose(-2, -1)) * cfg.scale
    if cfg.window is not None:
        keep = _mask(scores.shape[-2], scores.shape[-1], cfg.window, q.device)
        fill = float("-inf") if cfg.normalize is Normalize.SOFTMAX else -1e4
        scores = scores.masked_fill(~keep, fill)
    weights = scores.softmax(-1) if cfg.normalize is Normalize.SOFTMAX else scores.sigmoid()
    return weights @ v, weights


def setup_context(ctx, inputs, output):
    q, k, v, cfg = inputs  # the original arguments: cfg is an AttnConfig
    _, weights = _forward(q, k, v, cfg)  # recomputed: setup_context sees the output only
    ctx.save_for_backward(q, k, v, weights)
    ctx.cfg = cfg


def backward(ctx, grad_out):
    q, k, v, weights = ctx.saved_tensors
    cfg = ctx.cfg
    grad_v = weights.transpose(-2, -1) @ grad_out
    grad_w = grad_out @ v.transpose(-2, -1)
    if cfg.normalize is Normalize.SOFTMAX:
        grad_scores = weights * (grad_w - (grad_w * weights).sum(-1, keepdim=True))
    else:
        grad_scores = grad_w * weights * (1 - weights)
    grad_scores = grad_scores * cfg.scale
    # One gradient per original parameter; cfg has no tensors, so None.
    return grad_scores @ k, grad_scores.transpose(-2, -1) @ q, grad_v, None


@opforge.op("examples::attention", setup_context=setup_context, backward=backward)
def attention(q: Tensor, k: Tensor, v: Tensor, cfg: AttnConfig) -> Tensor:
    return _forward(q, k, v, cfg)[0]


@attention.register_fake
def _(q, k, v, cfg):
    return q.new_empty(q.shape[:-1] + v.shape[-1:])


def reference(q, k, v, cfg: AttnConfig) -> Tensor:
    """The same computation in plain PyTorch, differentiated by autograd."""
    return _forward(q, k, v, replace(cfg, normalize=Normalize(cfg.normalize)))[0]


def main() -> None:
    torch.manual_seed(0)
    batch, heads, n, d = 2, 3, 6, 8
    q, k, v = (torch.randn(batch, heads, n, d, requires_grad=True) for _ in range(3))
    configs = [
        AttnConfig(scale=1 / math.sqrt(d)),
        AttnConfig(scale=0.3, normalize="sigmoid"),  # a raw value works too: the body gets Normalize.SIGMOID
        AttnConfig(scale=1 / math.sqrt(d), window=Window(size=3)),
    ]

    print(attention.schema)
    # examples::attention(Tensor q, Tensor k, Tensor v, float cfg__scale, str cfg__normalize,
    #     bool cfg__window__is_set, SymInt? cfg__window__size, bool? cfg__window__causal) -> Tensor

    compiled = torch.compile(attention, fullgraph=True, backend="eager")
    for cfg in configs:
        out = attention(q, k, v, cfg)
        expected = reference(q, k, v, cfg)
        assert torch.allclose(out, expected, atol=1e-6), cfg
        assert torch.allclose(compiled(q, k, v, cfg), expected, atol=1e-6), cfg

        grad = torch.randn_like(out)
        ours = torch.autograd.grad(out, (q, k, v), grad)
        theirs = torch.autograd.grad(expected, (q, k, v), grad)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ours, theirs)), cfg
        print(f"ok  {cfg}")

    # torch sees a flat op: the same call with the leaves spelled out.
    flat = torch.ops.examples.attention(q, k, v, 0.5, "softmax", True, 3, True)
    assert torch.allclose(flat, reference(q, k, v, AttnConfig(0.5, window=Window(3))), atol=1e-6)
    print(opforge.opcheck(attention, (q, k, v, configs[2])))


if __name__ == "__main__":
    main()
