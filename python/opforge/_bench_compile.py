"""`opforge bench --compile`: what a model of struct ops costs before its
first step, against the same model with flat `Library.define` + `impl` ops
and with `custom_op`s (docs/performance.md#start-up-and-compile-time).

    opforge bench --compile                          # 16 and 80 layers, CPU
    opforge bench --compile --compile-layers 16 --compile-repeats 5

The model is `opforge bench --compiled`'s: each layer calls four ops
`f(x, w, cfg)`, two tensors and a frozen dataclass of five scalars; the flat
twins take the five scalars as arguments. Measured in one process, the three
models in turn in every repeat (medians), one intra-op thread:

    registration   ms per op at 1, 5 and 30 leaves (`opforge bench`'s measurement)
    dynamo         the first call under torch.compile(backend="eager"), after torch._dynamo.reset()
                   (and gc.collect(), before every compile timed)
    inductor cold  the first call under torch.compile (Inductor), no compile cache
    inductor warm  the same again with Inductor's and AOTAutograd's caches on and
                   filled by a compile just before (a fresh cache directory)
    recompiles     graphs compiled when one field of every layer's first struct
                   changes (eager backend; the flat models read the same field)
    step           the compiled (Inductor) model's inference step, µs
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

import torch

from . import _bench, _bench_compiled
from ._bench_runners import _no_compile_caches, compile_caches, measure_steps, run_on_threads

_VARIANTS = ("opforge struct op", "define+impl (flat)", "custom_op (flat)")


@contextlib.contextmanager
def _warm_caches(directory: str):
    """Inductor's FX graph cache and AOTAutograd's cache on, in `directory`."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    try:
        with compile_caches(True):
            yield
    finally:
        if env is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = env


def _frames() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _first_call(model: torch.nn.Module, x: torch.Tensor, backend: str) -> tuple[float, Callable, torch.Tensor]:
    torch._dynamo.reset()
    # What the previous compile left for the collector is not this compile's cost.
    gc.collect()
    fn = torch.compile(model, fullgraph=True, backend=backend)
    start = time.perf_counter()
    out = fn(x)
    return time.perf_counter() - start, fn, out


def _change_a_field(model: torch.nn.Module) -> None:
    for layer in model:
        layer.cfgs[0] = dataclasses.replace(layer.cfgs[0], scale=layer.cfgs[0].scale + 0.25)


def measure_layers(layers: int, dim: int, batch: int, repeats: int, step_repeats: int, min_time: float) -> dict:
    models = _bench_compiled.build_models(layers, dim)
    x = torch.randn(batch, dim, generator=torch.Generator().manual_seed(0))
    rows: dict[str, dict[str, list[float]]] = {name: {"dynamo_s": [], "inductor_cold_s": [], "inductor_warm_s": [],
                                                      "recompiles": []} for name in _VARIANTS}
    compiled: dict[str, Callable] = {}
    with torch.no_grad():
        eager = {name: models[name](x) for name in _VARIANTS}
        with _no_compile_caches():
            # The first compile in a process also warms Dynamo and Inductor up: no model's cost.
            _first_call(models["define+impl (flat)"], x, "inductor")
            for r in range(repeats):
                for name in _VARIANTS:
                    print(f"  {layers} layers, repeat {r + 1}/{repeats}: {name} ...", file=sys.stderr, flush=True)
                    seconds, _fn, out = _first_call(models[name], x, "eager")
                    torch.testing.assert_close(out, eager[name], rtol=1e-4, atol=1e-4)
                    rows[name]["dynamo_s"].append(seconds)
                    # A changed field: one more graph for every model (the field is a constant of the graph).
                    frames = _frames()
                    saved = [layer.cfgs[0] for layer in models[name]]
                    _change_a_field(models[name])
                    _fn(x)
                    rows[name]["recompiles"].append(_frames() - frames)
                    for layer, cfg in zip(models[name], saved):
                        layer.cfgs[0] = cfg
                    seconds, fn, out = _first_call(models[name], x, "inductor")
                    torch.testing.assert_close(out, eager[name], rtol=1e-4, atol=1e-4)
                    rows[name]["inductor_cold_s"].append(seconds)
                    compiled[name] = fn
        for r in range(repeats):
            for name in _VARIANTS:
                with tempfile.TemporaryDirectory(prefix="opforge-bench-cache-") as cache, _warm_caches(cache):
                    _first_call(models[name], x, "inductor")  # fills the cache
                    seconds, _fn, out = _first_call(models[name], x, "inductor")
                torch.testing.assert_close(out, eager[name], rtol=1e-4, atol=1e-4)
                rows[name]["inductor_warm_s"].append(seconds)
        print(f"  {layers} layers: compiled steps ...", file=sys.stderr, flush=True)
        step_us = measure_steps({name: (lambda fn=compiled[name]: fn(x)) for name in _VARIANTS}, step_repeats,
                                min_time, lambda: None)
    torch._dynamo.reset()
    out = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in rows.items()}
    for name in _VARIANTS:
        out[name]["step_us"] = step_us[name]
    return out


def measure(args: argparse.Namespace) -> dict:
    registration = {}
    for n in args.compile_leaves:
        print(f"  registration with {n} leaves ...", file=sys.stderr, flush=True)
        registration[n] = _bench.measure_registration(n, count=args.registrations, repeats=args.compile_repeats,
                                                      distinct=False)
    by_layers = {layers: measure_layers(layers, args.dim_compiled, args.batch, args.compile_repeats, args.repeats,
                                        args.min_time)
                 for layers in args.compile_layers}
    return {"torch": torch.__version__, "registration": registration, "layers": by_layers}


def _verdict(ratio: float, budget: float) -> str:
    return f"{ratio:>6.2f}x  budget <= {budget}x: {'met' if ratio <= budget else 'NOT met'}"


def render(result: dict) -> str:
    lines = [f"opforge bench --compile: CPU, {result['threads']} thread(s), torch {result['torch']}", "",
             f"{'registration, ms per op':28}{'opforge':>10}{'custom_op':>11}{'define+impl':>13}"]
    for n, reg in result["registration"].items():
        lines.append(f"{f'  {n} leaves':28}{reg['opforge']:>10.3f}{reg['custom_op']:>11.3f}{reg['define_impl']:>13.3f}"
                     f"   opforge / custom_op {_verdict(reg['opforge'] / reg['custom_op'], 0.5)}")
    for layers, rows in result["layers"].items():
        lines += ["", f"{f'{layers} layers x 4 ops':28}" + "".join(f"{name:>20}" for name in _VARIANTS)]
        for key, label, fmt in (("dynamo_s", "dynamo s", ".3f"), ("inductor_cold_s", "inductor cold s", ".3f"),
                                ("inductor_warm_s", "inductor warm s", ".3f"), ("recompiles", "recompiles", ".0f"),
                                ("step_us", "step µs", ".1f")):
            lines.append(f"{'  ' + label:28}" + "".join(f"{rows[name][key]:>20{fmt}}" for name in _VARIANTS))
        ours, define, custom = (rows[name] for name in _VARIANTS)
        lines += [f"{'  dynamo / custom_op':28}{_verdict(ours['dynamo_s'] / custom['dynamo_s'], 1.0)}",
                  f"{'  cold / define+impl':28}{_verdict(ours['inductor_cold_s'] / define['inductor_cold_s'], 1.0)}",
                  f"{'  warm / custom_op':28}{_verdict(ours['inductor_warm_s'] / custom['inductor_warm_s'], 1.0)}",
                  f"{'  step / define+impl':28}{_verdict(ours['step_us'] / define['step_us'], 1.0)}"]
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(t) for t in str(text).split(",") if t.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--compile (start-up and compile time)")
    group.add_argument("--compile-layers", type=_ints, default=[16, 80],
                       help="model depths, comma-separated (default 16,80)")
    group.add_argument("--compile-leaves", type=_ints, default=[1, 5, 30],
                       help="leaf counts for the registration rows (default 1,5,30)")


def run(args: argparse.Namespace) -> int:
    return run_on_threads(args, lambda: measure(args), render)
