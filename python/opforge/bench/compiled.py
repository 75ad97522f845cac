"""`opforge bench --compiled`: what struct ops cost a compiled model, against
the same model with flat `Library.define` + `impl` ops and with `custom_op`s
(docs/performance.md).

    opforge bench --compiled                   # 16 layers x 4 ops, Inductor, CPU
    opforge bench --compiled --layers 32 --backend aot_eager

Each layer calls four ops `f(x, w, cfg)`: two tensors and a frozen
dataclass of five scalars (float, float, int, bool, float); the flat twins
take the five scalars as arguments. The whole model is compiled once with
fullgraph=True; the step is an inference call (no_grad), median over
`--repeats` samples taken in turn, one intra-op thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from typing import Callable

import torch

import opforge

from .runners import _no_compile_caches, measure_steps, run_on_threads

Tensor = torch.Tensor
_run_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class Cfg:
    scale: float
    shift: float
    repeat: int
    negate: bool
    eps: float


def _body(x: Tensor, w: Tensor, scale: float, shift: float, repeat: int, negate: bool, eps: float) -> Tensor:
    out = torch.add(x, w, alpha=scale * repeat + shift + eps)
    return out.neg_() if negate else out


def define_ops(tag: str) -> dict[str, Callable]:
    """The same op three ways: opforge struct op, define+impl, custom_op (flat)."""
    ns = f"ofbc{tag}"

    @opforge.op(f"{ns}::s", fake=lambda x, w, cfg: torch.empty_like(x))
    def struct_op(x: Tensor, w: Tensor, cfg: Cfg) -> Tensor:
        return _body(x, w, cfg.scale, cfg.shift, cfg.repeat, cfg.negate, cfg.eps)

    def flat(x: Tensor, w: Tensor, scale: float, shift: float, repeat: int, negate: bool, eps: float) -> Tensor:
        return _body(x, w, scale, shift, repeat, negate, eps)

    lib = torch.library.Library(f"{ns}d", "FRAGMENT")
    lib.define("f" + torch.library.infer_schema(flat, mutates_args=()))
    lib.impl("f", flat, "CompositeExplicitAutograd")
    lib.impl("f", lambda x, *rest: torch.empty_like(x), "Meta")
    define_op = getattr(torch.ops, f"{ns}d").f.default
    define_op._opforge_lib = lib  # the library lives as long as the op is used

    # As a module defines its ops: found by module and name, which puts the op in
    # Dynamo's graph as one call (docs/performance.md#one-node-in-dynamos-graph).
    struct_op.__name__ = struct_op.__qualname__ = f"struct_op_{ns}"
    globals()[struct_op.__name__] = struct_op

    custom = torch.library.custom_op(f"{ns}c::f", mutates_args=())(flat)
    custom.register_fake(lambda x, *rest: torch.empty_like(x))
    return {"opforge struct op": struct_op, "define+impl (flat)": define_op, "custom_op (flat)": custom}


class Layer(torch.nn.Module):
    """Four ops, each with its own weight and config."""

    def __init__(self, op: Callable, struct: bool, dim: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.op = op
        self.struct = struct
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.rand(dim, generator=g) * 0.1,
                                                                 requires_grad=False) for _ in range(4))
        self.cfgs = [Cfg(0.5 + 0.01 * i, 0.001 * i, 1 + i % 2, i == 3, 1e-6) for i in range(4)]

    def forward(self, x: Tensor) -> Tensor:
        for w, cfg in zip(self.weights, self.cfgs):
            if self.struct:
                x = self.op(x, w, cfg)
            else:
                x = self.op(x, w, cfg.scale, cfg.shift, cfg.repeat, cfg.negate, cfg.eps)
        return x


def build_models(layers: int, dim: int) -> dict[str, torch.nn.Module]:
    ops = define_ops(str(next(_run_ids)))
    return {name: torch.nn.Sequential(*[Layer(op, name.startswith("opforge"), dim, i) for i in range(layers)])
            for name, op in ops.items()}


def measure(args: argparse.Namespace) -> dict:
    models = build_models(args.layers, args.dim)
    x = torch.randn(args.batch, args.dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), _no_compile_caches():
        eager = {name: model(x) for name, model in models.items()}
        # The first compile in a process also warms up Dynamo and Inductor: no model's cost.
        torch.compile(models["define+impl (flat)"], fullgraph=True, backend=args.backend)(x)
        compiled = {}
        compile_s = {}
        for name, model in models.items():
            print(f"  compiling {name} ...", file=sys.stderr, flush=True)
            torch._dynamo.reset()
            fn = torch.compile(model, fullgraph=True, backend=args.backend)
            start = time.perf_counter()
            out = fn(x)
            compile_s[name] = time.perf_counter() - start
            torch.testing.assert_close(out, eager[name], rtol=1e-4, atol=1e-4)
            compiled[name] = fn
        print("  measuring compiled steps ...", file=sys.stderr, flush=True)
        step_us = measure_steps({name: (lambda fn=fn: fn(x)) for name, fn in compiled.items()}, args.repeats,
                                args.min_time, lambda: None)
    torch._dynamo.reset()
    return {"torch": torch.__version__, "layers": args.layers, "ops": args.layers * 4, "dim": args.dim,
            "batch": args.batch, "backend": args.backend,
            "rows": {name: {"step_us": step_us[name], "compile_s": compile_s[name]} for name in models}}


def render(result: dict) -> str:
    rows = result["rows"]
    lines = [f"opforge bench --compiled: {result['layers']} layers x 4 ops (2 tensors + a struct of 5 scalars), "
             f"backend {result['backend']}, dim {result['dim']}, batch {result['batch']}, CPU, "
             f"{result['threads']} thread(s), torch {result['torch']}",
             "",
             f"{'':36}{'step µs':>11}{'per op µs':>11}{'compile s':>11}"]
    for name, r in rows.items():
        lines.append(f"{'  ' + name:36}{r['step_us']:>11.1f}{r['step_us'] / result['ops']:>11.2f}"
                     f"{r['compile_s']:>11.2f}")
    ours, define = rows["opforge struct op"], rows["define+impl (flat)"]
    ratio = ours["step_us"] / define["step_us"]
    lines += ["", f"{'  step, opforge / define+impl':36}{ratio:>10.2f}x   budget <= 1.0x: "
                  f"{'met' if ratio <= 1.0 else 'NOT met'}"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--compiled (a compiled model of struct ops)")
    group.add_argument("--compiled-layers", dest="layers_compiled", type=int, default=16,
                       help="layers of four ops (default 16)")
    group.add_argument("--compiled-dim", dest="dim_compiled", type=int, default=64, help="model width (default 64)")


def run(args: argparse.Namespace) -> int:
    options = argparse.Namespace(layers=args.layers_compiled, dim=args.dim_compiled, batch=args.batch,
                                 backend=args.backend, repeats=args.repeats, min_time=args.min_time)
    return run_on_threads(args, lambda: measure(options), render)
