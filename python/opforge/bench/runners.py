"""`opforge bench --runners`: what runners cost a compiled model (docs/handles.md).

    opforge bench --runners                        # 24 layers, Inductor, CPU
    opforge bench --runners --device cuda --layers 64
    opforge bench --runners --backend eager        # Dynamo only: seconds, not minutes

Three models of `--layers` residual blocks (LayerNorm, a matmul, ReLU), each
layer instance compiled on its own with fullgraph=True (regional
compilation), measured in one process:

    without runners     the matmul inline (`norm(x) @ self.plan`)
    tensor op           an `@opforge.op` taking the weight as a Tensor
    runner op           an `@opforge.op` taking the layer's runner
                        (`opforge.Handle[Runner]`), whose body runs it

Compile time is the first compiled call of all layers after
`torch._dynamo.reset()`, caches off, median over `--compile-repeats`; step
time is the median over `--repeats` samples. The models are measured in
turn, so that load from elsewhere falls on all three alike, and on CPU with
one intra-op thread (`--threads`), so that step times measure overhead.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import time
import warnings
from typing import Callable

import torch

import opforge

Tensor = torch.Tensor
_run_ids = itertools.count()


class Runner:
    """A kernel object prepared once: the transposed weight."""

    def __init__(self, weight: Tensor):
        self.plan = weight.t().contiguous()

    def run(self, x: Tensor) -> Tensor:
        return x @ self.plan


def define_ops(tag: str) -> tuple[Callable, Callable]:
    """(runner op, tensor op) in a fresh namespace."""
    ns = f"ofbr{tag}"

    @opforge.op(f"{ns}::runner_mm", fake=lambda x, runner: torch.empty_like(x))
    def runner_mm(x: Tensor, runner: opforge.Handle[Runner]) -> Tensor:
        return runner.run(x)

    @opforge.op(f"{ns}::tensor_mm", fake=lambda x, plan: torch.empty_like(x))
    def tensor_mm(x: Tensor, plan: Tensor) -> Tensor:
        return x @ plan

    return runner_mm, tensor_mm


def _weight(dim: int, seed: int, device: str) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(dim, dim, generator=g) / dim**0.5).to(device)


class PlainLayer(torch.nn.Module):
    def __init__(self, dim: int, seed: int, device: str):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim, device=device)
        self.register_buffer("plan", _weight(dim, seed, device).t().contiguous())

    def forward(self, x: Tensor) -> Tensor:
        return x + (self.norm(x) @ self.plan).relu()


class TensorOpLayer(PlainLayer):
    def __init__(self, op: Callable, dim: int, seed: int, device: str):
        super().__init__(dim, seed, device)
        self.op = op

    def forward(self, x: Tensor) -> Tensor:
        return x + self.op(self.norm(x), self.plan).relu()


class RunnerLayer(torch.nn.Module):
    def __init__(self, op: Callable, dim: int, seed: int, device: str):
        super().__init__()
        self.op = op
        self.norm = torch.nn.LayerNorm(dim, device=device)
        self.runner = Runner(_weight(dim, seed, device))  # registered by its __init__: the op is defined

    def forward(self, x: Tensor) -> Tensor:
        return x + self.op(self.norm(x), self.runner).relu()


def build_models(layers: int, dim: int, device: str) -> dict[str, list[torch.nn.Module]]:
    runner_mm, tensor_mm = define_ops(str(next(_run_ids)))
    return {
        "without runners (matmul inline)": [PlainLayer(dim, i, device) for i in range(layers)],
        "tensor op (weight as a Tensor)": [TensorOpLayer(tensor_mm, dim, i, device) for i in range(layers)],
        "runner op (Handle[Runner])": [RunnerLayer(runner_mm, dim, i, device) for i in range(layers)],
    }


def _run(layers, x: Tensor) -> Tensor:
    for layer in layers:
        x = layer(x)
    return x


@contextlib.contextmanager
def compile_caches(enabled: bool):
    """Inductor's FX graph cache and AOTAutograd's cache on or off (and
    Inductor's force_disable_caches their opposite) for the block."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    changes = [(c, name, value) for c, name, value in ((inductor_config, "force_disable_caches", not enabled),
                                                        (inductor_config, "fx_graph_cache", enabled),
                                                        (functorch_config, "enable_autograd_cache", enabled))
               if hasattr(c, name)]
    saved = [(c, name, getattr(c, name)) for c, name, _ in changes]
    for c, name, value in changes:
        setattr(c, name, value)
    try:
        yield
    finally:
        for c, name, value in saved:
            setattr(c, name, value)


@contextlib.contextmanager
def _no_compile_caches():
    """Every compile measured compiles: no Inductor or AOTAutograd cache hit."""
    with compile_caches(False), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        yield


def measure_compile(layers, x: Tensor, backend: str, sync: Callable[[], None]) -> tuple[float, int]:
    """(seconds for the first compiled call of all layers, graphs compiled)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    for layer in layers:
        layer._compiled_call_impl = None
        layer.compile(fullgraph=True, backend=backend)
    sync()
    start = time.perf_counter()
    _run(layers, x)
    sync()
    return time.perf_counter() - start, counters["stats"]["unique_graphs"]


def _calls_per_sample(fns, min_time: float, sync: Callable[[], None]) -> int:
    """Calls per timed sample, so that the slowest function's sample takes `min_time`."""
    number = 1
    while number < 1 << 16:
        slowest = 0.0
        for fn in fns:
            start = time.perf_counter()
            for _ in range(number):
                fn()
            sync()
            slowest = max(slowest, time.perf_counter() - start)
        if slowest >= min_time:
            break
        number *= 2
    return number


def measure_steps(fns: dict[str, Callable[[], Tensor]], repeats: int, min_time: float,
                  sync: Callable[[], None]) -> dict[str, float]:
    """Median per-call time in µs of each function, sampled in turn so that
    load from elsewhere on the machine falls on all of them alike."""
    number = _calls_per_sample(list(fns.values()), min_time, sync)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def measure(args: argparse.Namespace) -> dict:
    device = torch.device(args.device).type
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    models = build_models(args.layers, args.dim, device)
    x = torch.randn(args.batch, args.dim, generator=torch.Generator().manual_seed(0)).to(device)
    steps = {name: (lambda layers=layers: _run(layers, x)) for name, layers in models.items()}
    with torch.no_grad(), _no_compile_caches():
        print("  measuring eager steps ...", file=sys.stderr, flush=True)
        eager = {name: step() for name, step in steps.items()}
        eager_us = measure_steps(steps, args.repeats, args.min_time, sync)

        print("  measuring compile times ...", file=sys.stderr, flush=True)
        # The first compile in a process also warms up Dynamo and the backend: not any model's cost.
        measure_compile(next(iter(models.values())), x, args.backend, sync)
        compiles: dict[str, list[tuple[float, int]]] = {name: [] for name in models}
        for _ in range(args.compile_repeats):
            for name, layers in models.items():
                compiles[name].append(measure_compile(layers, x, args.backend, sync))

        print("  measuring compiled steps ...", file=sys.stderr, flush=True)
        torch._dynamo.reset()
        for layers in models.values():
            for layer in layers:
                layer.compile(fullgraph=True, backend=args.backend)
        for name, step in steps.items():
            torch.testing.assert_close(step(), eager[name], rtol=1e-4, atol=1e-4)
        compiled_us = measure_steps(steps, args.repeats, args.min_time, sync)
        for layers in models.values():
            for layer in layers:
                layer._compiled_call_impl = None
        torch._dynamo.reset()
    rows = {name: {"compile_s": statistics.median(c for c, _ in compiles[name]),
                   "graphs": max(g for _, g in compiles[name]),
                   "step_us": compiled_us[name], "eager_step_us": eager_us[name]} for name in models}
    return {"device": device, "torch": torch.__version__, "layers": args.layers, "dim": args.dim,
            "batch": args.batch, "backend": args.backend, "handle_compile_mode": opforge.handles.compile_mode(),
            "rows": rows}


def render(result: dict) -> str:
    rows = result["rows"]
    lines = [f"opforge bench --runners: {result['layers']} layers, each compiled with fullgraph=True "
             f"(backend {result['backend']}), dim {result['dim']}, batch {result['batch']}, "
             f"{result['device']}, {result['threads']} thread(s), torch {result['torch']}, "
             f"handles as {result['handle_compile_mode']!r}",
             "",
             f"{'':40}{'compile s':>11}{'graphs':>8}{'step µs':>11}{'eager µs':>11}"]
    for name, r in rows.items():
        lines.append(f"{'  ' + name:40}{r['compile_s']:>11.2f}{r['graphs']:>8d}{r['step_us']:>11.1f}"
                     f"{r['eager_step_us']:>11.1f}")
    names = list(rows)
    plain, tensor_op, runner = (rows[n] for n in names)
    lines += ["", "  ratios, runner op model / other model      compile     step"]
    for label, other in (("/ without runners", plain), ("/ tensor op", tensor_op)):
        lines.append(f"{'    ' + label:40}{runner['compile_s'] / other['compile_s']:>11.2f}x"
                     f"{runner['step_us'] / other['step_us']:>8.2f}x")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--runners (runner handles under torch.compile)")
    group.add_argument("--layers", type=int, default=24, help="layers, a runner each (default 24)")
    group.add_argument("--dim", type=int, default=128, help="model width (default 128)")
    group.add_argument("--batch", type=int, default=8, help="rows of the input (default 8)")
    group.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    group.add_argument("--threads", type=int, default=1,
                       help="intra-op threads on CPU (default 1: the step times measure overhead, not contention)")
    group.add_argument("--compile-repeats", type=int, default=3,
                       help="compiles measured per model; the median is reported (default 3)")


def run_on_threads(args: argparse.Namespace, measure_fn: Callable[[], dict], render_fn: Callable[[dict], str]) -> int:
    """Runs `measure_fn` on `--threads` intra-op threads, prints its result
    rendered, and writes it to `--json`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result = measure_fn()
    finally:
        torch.set_num_threads(threads)
    result["threads"] = args.threads
    print(render_fn(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def run(args: argparse.Namespace) -> int:
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("opforge bench: --device cuda needs a CUDA GPU, and none is available.", file=sys.stderr)
        return 2
    return run_on_threads(args, lambda: measure(args), render)
