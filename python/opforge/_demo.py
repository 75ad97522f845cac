"""`opforge demo`: one op of each supported form, each run eagerly, under
torch.compile(fullgraph=True) and, where it has one, through its backward,
checked against plain PyTorch.

    $ opforge demo
    $ opforge demo --backend eager      # faster: Dynamo only, no Inductor

The ops live in the `opforge_demo` namespace once this module is imported, so
`opforge inspect opforge_demo::attention --import opforge._demo` shows one.
"""

from __future__ import annotations

import argparse
import enum
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Optional

import torch

import opforge

Tensor = torch.Tensor
NS = "opforge_demo"


# --- the ops -------------------------------------------------------------------


@opforge.op(f"{NS}::scale", fake=lambda x, factor: torch.empty_like(x))
def scale(x: Tensor, factor: float) -> Tensor:
    return x * factor


@dataclass(frozen=True)
class Affine:
    weight: float
    bias: float = 0.0


@opforge.op(f"{NS}::affine", fake=lambda x, cfg: torch.empty_like(x))
def affine(x: Tensor, cfg: Affine) -> Tensor:
    return x * cfg.weight + cfg.bias


@dataclass(frozen=True)
class Mask:
    causal: bool = True
    window: int = 0


@dataclass(frozen=True)
class AttnCfg:
    scale: float
    softcap: Optional[float] = None
    mask: Optional[Mask] = None


def _attention_fake(q, k, v, cfg):
    return torch.empty_like(q)


@opforge.op(f"{NS}::attention", fake=_attention_fake)
def attention(q: Tensor, k: Tensor, v: Tensor, cfg: AttnCfg) -> Tensor:
    return reference_attention(q, k, v, cfg)


def reference_attention(q, k, v, cfg: AttnCfg):
    scores = (q @ k.transpose(-2, -1)) * cfg.scale
    if cfg.softcap is not None:
        scores = cfg.softcap * torch.tanh(scores / cfg.softcap)
    if cfg.mask is not None and cfg.mask.causal:
        n, m = scores.shape[-2:]
        keep = torch.ones(n, m, dtype=torch.bool, device=q.device).tril()
        if cfg.mask.window:
            keep &= ~torch.ones(n, m, dtype=torch.bool, device=q.device).tril(-cfg.mask.window)
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores.softmax(-1) @ v


class Reduce(enum.Enum):
    SUM = "sum"
    MAX = "max"


def _reduce_fake(x, how=Reduce.SUM, norm="none", dims=[-1]):
    return x.sum(dims)


@opforge.op(f"{NS}::reduce", fake=_reduce_fake)
def reduce(x: Tensor, how: Reduce = Reduce.SUM, norm: Literal["none", "l2"] = "none",
           dims: list[int] = [-1]) -> Tensor:
    out = x.sum(dims) if how is Reduce.SUM else x.amax(dims)
    return out / x.norm() if norm == "l2" else out


@dataclass(frozen=True)
class Accumulator:
    total: Tensor
    count: Tensor
    decay: float = 1.0


@opforge.op(f"{NS}::accumulate", mutates_args=("acc",))
def accumulate(x: Tensor, acc: Accumulator) -> None:
    acc.total.mul_(acc.decay).add_(x)
    acc.count.add_(1)


@dataclass(frozen=True)
class Weights:
    w: Tensor
    b: Optional[Tensor] = None
    temperature: float = 1.0


def _weighted_setup(ctx, inputs, output):
    x, p = inputs
    ctx.save_for_backward(x, p.w)
    ctx.temperature = p.temperature
    ctx.has_bias = p.b is not None


def _weighted_backward(ctx, grad):
    x, w = ctx.saved_tensors
    g = grad / ctx.temperature
    return g * w, {"w": (g * x).sum(0), "b": g.sum(0) if ctx.has_bias else None}


@opforge.op(f"{NS}::weighted", fake=lambda x, p: torch.empty_like(x),
            setup_context=_weighted_setup, backward=_weighted_backward)
def weighted(x: Tensor, p: Weights) -> Tensor:
    out = x * p.w
    if p.b is not None:
        out = out + p.b
    return out / p.temperature


class Runner:
    """A stateful kernel object, like a compiled GEMM plan."""

    def __init__(self, k: float):
        self.k = k
        self.runs = 0

    def __call__(self, x: Tensor) -> Tensor:
        self.runs += 1
        return x * self.k


@opforge.op(f"{NS}::run", fake=lambda x, runner: torch.empty_like(x))
def run_runner(x: Tensor, runner: opforge.Handle[Runner]) -> Tensor:
    return runner(x)


@dataclass(frozen=True)
class MinMax:
    lo: Tensor
    hi: Tensor


@opforge.op(f"{NS}::minmax")
def minmax(x: Tensor, dim: int = -1) -> MinMax:
    return MinMax(x.amin(dim), x.amax(dim))


@minmax.register_fake
def _(x, dim=-1):
    return MinMax(x.amin(dim), x.amax(dim))


# --- the showcase --------------------------------------------------------------


@dataclass
class Step:
    form: str
    op: opforge.OpDef
    call: Callable[..., object]  # (inputs) -> result
    reference: Callable[..., object]
    make_inputs: Callable[[], tuple]
    grad: bool = False
    note: str = ""
    prepare: Callable[[tuple], None] = field(default=lambda inputs: None)


def _flat(result) -> list[Tensor]:
    if isinstance(result, Tensor):
        return [result]
    if isinstance(result, MinMax):
        return [result.lo, result.hi]
    if isinstance(result, (list, tuple)):
        return [t for r in result for t in _flat(r)]
    raise TypeError(type(result))


def _close(a, b) -> bool:
    fa, fb = _flat(a), _flat(b)
    return len(fa) == len(fb) and all(x.shape == y.shape and torch.allclose(x, y, atol=1e-5) for x, y in zip(fa, fb))


RUNNER = Runner(3.0)


def _steps() -> list[Step]:
    g = torch.Generator().manual_seed(0)

    def randn(*shape, grad=False):
        return torch.randn(*shape, generator=g).requires_grad_(grad)

    def accumulate_twice(x, total, count):
        acc = Accumulator(total, count, decay=0.5)
        accumulate(x, acc)
        accumulate(x, acc)
        return torch.stack([total.sum(), count.sum()])

    def accumulate_reference(x, total, count):
        total = (total * 0.5 + x) * 0.5 + x
        return torch.stack([total.sum(), count.sum() + 2])

    return [
        Step("plain", scale, lambda x: scale(x, 2.5), lambda x: x * 2.5, lambda: (randn(8),)),
        Step("struct", affine, lambda x: affine(x, Affine(3.0, bias=1.0)), lambda x: x * 3.0 + 1.0,
             lambda: (randn(8),)),
        Step("nested + optional struct", attention,
             lambda q, k, v: attention(q, k, v, AttnCfg(0.5, softcap=30.0, mask=Mask(causal=True, window=2))),
             lambda q, k, v: reference_attention(q, k, v, AttnCfg(0.5, softcap=30.0, mask=Mask(True, 2))),
             lambda: (randn(2, 4, 8), randn(2, 4, 8), randn(2, 4, 8)),
             note="AttnCfg.mask is an Optional[Mask]"),
        Step("enum + Literal + list default", reduce,
             lambda x: reduce(x, "max", norm="l2"), lambda x: x.amax(-1) / x.norm(), lambda: (randn(3, 5),),
             note="how passed as its value 'max', the body gets Reduce.MAX"),
        Step("mutation inside a struct", accumulate, accumulate_twice, accumulate_reference,
             lambda: (randn(4), torch.zeros(4), torch.zeros(())), note="acc.total and acc.count updated in place"),
        Step("backward", weighted,
             lambda x, w, b: weighted(x, Weights(w, b, temperature=2.0)),
             lambda x, w, b: (x * w + b) / 2.0,
             lambda: (randn(5, 3, grad=True), randn(3, grad=True), randn(3, grad=True)), grad=True,
             note="gradients for x and for the tensor fields w and b"),
        Step("handle", run_runner, lambda x: run_runner(x, RUNNER), lambda x: x * 3.0, lambda: (randn(6),),
             note="a Runner object through the dispatcher as an int"),
        Step("struct return", minmax, lambda x: minmax(x), lambda x: MinMax(x.amin(-1), x.amax(-1)),
             lambda: (randn(3, 4),), note="MinMax(lo, hi) rebuilt from a (Tensor, Tensor) op"),
    ]


def _grads(fn, inputs) -> list[Tensor]:
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*leaves)
    (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum().backward()
    return [t.grad for t in leaves if t.requires_grad]


def _fresh(inputs):
    return tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)


def run_showcase(backend: str, out=None) -> int:
    from torch._dynamo.utils import counters

    out = out or sys.stdout
    steps = _steps()
    failures = 0
    checks = 0

    def check(ok: bool, what: str, results: list[str]):
        nonlocal failures, checks
        checks += 1
        results.append(f"{what} {'ok' if ok else 'FAILED'}")
        if not ok:
            failures += 1

    print(f"opforge demo: torch {torch.__version__}, CPU, torch.compile backend '{backend}'", file=out)
    for step in steps:
        started = time.perf_counter()
        print(f"\n  {step.form}: {step.op.name}", file=out)
        print(f"    schema  {step.op.schema}", file=out)
        if step.note:
            print(f"    note    {step.note}", file=out)
        results: list[str] = []
        inputs = step.make_inputs()
        check(_close(step.call(*_fresh(inputs)), step.reference(*_fresh(inputs))), "eager", results)

        torch._dynamo.reset()
        counters.clear()
        try:
            compiled = torch.compile(step.call, fullgraph=True, backend=backend)
            result = compiled(*_fresh(inputs))
            breaks = sum(counters["graph_break"].values())
            check(_close(result, step.reference(*_fresh(inputs))) and breaks == 0,
                  f"compiled (fullgraph, {breaks} graph breaks)", results)
        except Exception as e:  # report and keep going
            check(False, f"compiled ({type(e).__name__}: {str(e).splitlines()[0][:80]})", results)

        if step.grad:
            ours, ref = _grads(step.call, inputs), _grads(step.reference, inputs)
            check(all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ours, ref)) and len(ours) == len(ref),
                  "backward", results)
            torch._dynamo.reset()
            ours = _grads(torch.compile(step.call, fullgraph=True, backend=backend), inputs)
            check(all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ours, ref)), "compiled backward", results)
        print(f"    checks  {', '.join(results)}  ({time.perf_counter() - started:.1f} s)", file=out)
    torch._dynamo.reset()
    summary = f"{len(steps)} ops, {checks - failures} of {checks} checks passed"
    print(f"\n{summary}" + ("" if not failures else f"; {failures} FAILED"), file=out)
    return 1 if failures else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="inductor",
                        help="torch.compile backend (default inductor; 'eager' skips code generation)")


def run(args: argparse.Namespace) -> int:
    return run_showcase(args.backend)
