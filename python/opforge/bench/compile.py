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
    generated      ms per op registering the ops `opforge gen aten` makes from the 525-name
                   allowlist (its C++ library loaded) against the same schemas defined in
                   Python with define+impl and with custom_op(schema=...), each forwarding to
                   its ATen overload; fresh child processes, the variants in turn
    dynamo         the first call under torch.compile(backend="eager"), after torch._dynamo.reset()
                   (and gc.collect(), before every compile timed)
    inductor cold  the first call under torch.compile (Inductor), no compile cache
    inductor warm  the same again with Inductor's and AOTAutograd's caches on and
                   filled by a compile just before (a fresh cache directory)
    recompiles     graphs compiled when one field of every layer's first struct
                   changes (eager backend; the flat models read the same field)
    step           the compiled (Inductor) model's inference step, µs
    traced work    the Python and C function calls (cProfile's count) of one Dynamo
                   trace, one cold and one warm Inductor compile, per call site: unlike the
                   times, the same to a thousandth from run to run and machine to
                   machine (for one torch)
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Callable

import torch

from .. import _cache_key, _registry
from ..gen import _generate
from . import compiled as _bench_compiled, eager as _bench
from .runners import _no_compile_caches, compile_caches, measure_steps, run_on_threads

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


def _fresh_compile(model: torch.nn.Module, backend: str) -> Callable:
    """torch.compile of `model` after torch._dynamo.reset(), not called yet."""
    torch._dynamo.reset()
    # What the previous compile left for the collector is not this compile's cost.
    gc.collect()
    return torch.compile(model, fullgraph=True, backend=backend)


def _first_call(model: torch.nn.Module, x: torch.Tensor, backend: str) -> tuple[float, Callable, torch.Tensor]:
    fn = _fresh_compile(model, backend)
    start = time.perf_counter()
    out = fn(x)
    return time.perf_counter() - start, fn, out


def _traced_calls(model: torch.nn.Module, x: torch.Tensor, backend: str) -> int | None:
    """The function calls (Python and C, cProfile's count) of the first call
    under torch.compile, as `_first_call` makes it; None where another
    profiler is active."""
    fn = _fresh_compile(model, backend)
    profile = cProfile.Profile()
    try:
        profile.enable()
    except ValueError:  # another profiling tool is active
        return None
    try:
        fn(x)
    finally:
        profile.disable()
    return pstats.Stats(profile).total_calls


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
            # The same compiles once more, counted rather than timed (one count each: it does not vary).
            for name in _VARIANTS:
                print(f"  {layers} layers: traced work of {name} ...", file=sys.stderr, flush=True)
                for key, backend in (("dynamo_calls", "eager"), ("inductor_cold_calls", "inductor")):
                    rows[name][key] = [_traced_calls(models[name], x, backend)]
        for r in range(repeats):
            for name in _VARIANTS:
                with tempfile.TemporaryDirectory(prefix="opforge-bench-cache-") as cache, _warm_caches(cache):
                    _first_call(models[name], x, "inductor")  # fills the cache
                    misses = _cache_misses()
                    seconds, _fn, out = _first_call(models[name], x, "inductor")
                    rows[name].setdefault("inductor_warm_misses", []).append(_cache_misses() - misses)
                    if r == repeats - 1:  # the same warm compile once more, counted, from the filled cache
                        rows[name]["inductor_warm_calls"] = [_traced_calls(models[name], x, "inductor")]
                torch.testing.assert_close(out, eager[name], rtol=1e-4, atol=1e-4)
                rows[name]["inductor_warm_s"].append(seconds)
        print(f"  {layers} layers: compiled steps ...", file=sys.stderr, flush=True)
        step_us = measure_steps({name: (lambda fn=compiled[name]: fn(x)) for name in _VARIANTS}, step_repeats,
                                min_time, lambda: None)
    torch._dynamo.reset()
    out = {name: {k: (None if None in v else statistics.median(v)) for k, v in r.items()} for name, r in rows.items()}
    for name in _VARIANTS:
        # Every repeat as well as the median: how far the compile times move is part of the figure.
        out[name]["samples"] = {k: v for k, v in rows[name].items() if k.endswith("_s")}
        out[name]["step_us"] = step_us[name]
        out[name]["call_sites"] = 4 * layers
    return out


_GEN_VARIANTS = ("opforge gen aten", "define+impl", "custom_op")
_GEN_NAMESPACE = "opforge_bench_gen"

# One registration of every op of the generation, in a fresh process: prints
# {"ms": total milliseconds, "ops": ops registered, "refused": [why, ...]}.
_GEN_CHILD = textwrap.dedent("""
    import json, sys, time
    import torch
    variant, ops_json, library = sys.argv[1:4]
    ops = json.load(open(ops_json))["ops"]

    def forwarder(target):
        ns, rest = target.split("::")
        name, _, overload = rest.partition(".")
        overload = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
        return lambda *args, **kwargs: overload(*args, **kwargs)

    refused = []
    if variant == "opforge gen aten":
        start = time.perf_counter()
        torch.ops.load_library(library)
        ms, count = (time.perf_counter() - start) * 1e3, len(ops)
    elif variant == "define+impl":
        start = time.perf_counter()
        lib = torch.library.Library(ops[0]["qualified_name"].split("::")[0], "DEF")
        for op in ops:
            lib.define(op["schema"].split("::", 1)[1])
            lib.impl(op["name"], forwarder(op["target"]), "CompositeExplicitAutograd")
        ms, count = (time.perf_counter() - start) * 1e3, len(ops)
    else:
        # custom_op takes no keyword-only tensor and returns no alias: the nearest
        # schema it accepts has the written tensors positional (arguments with a
        # default keyword-only) and returns nothing.
        def text(a):
            annotated = a["type"].replace("Tensor", "Tensor" + a.get("alias", ""), 1)
            return f"{annotated} {a['name']}" + (f"={a['default']}" if "default" in a else "")

        def calling(target, positional):
            def call(*args, **kwargs):
                target(**dict(zip(positional, args)), **kwargs)
            return call

        ms, count = 0.0, 0
        for op in ops:
            args = op["arguments"]
            written = [a for a in args if "!" in a.get("alias", "")]
            first = [a for a in args if not a["kwarg_only"] and "default" not in a] + \
                [a for a in written if a["kwarg_only"]]
            rest = [text(a) for a in args if a not in first]
            schema = "(" + ", ".join([text(a) for a in first] + (["*", *rest] if rest else [])) + ") -> ()"
            fn = calling(forwarder(op["target"]), [a["name"] for a in first])
            start = time.perf_counter()
            try:
                torch.library.custom_op(op["qualified_name"], fn, mutates_args=[a["name"] for a in written],
                                        schema=schema)
            except Exception as e:  # refused: not timed
                refused.append(str(e).splitlines()[0][:200])
                continue
            ms += (time.perf_counter() - start) * 1e3
            count += 1
    # Each registration is a working op (not timed): abs forwards, its out written.
    if any(op["name"] == "abs" for op in ops):
        x, out = torch.tensor([-1.5, 2.0]), torch.empty(2)
        abs_op = getattr(torch.ops, ops[0]["qualified_name"].split("::")[0]).abs
        abs_op(x, out) if variant == "custom_op" else abs_op(x, out=out)
        assert torch.equal(out, x.abs()), (variant, out)
    print(json.dumps({"ms": ms, "ops": count, "refused": refused}))
""")


def default_allowlist() -> str | None:
    """The 525-name allowlist of examples/codegen, where this is a checkout."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "codegen", "aten_allowlist.txt")
    return os.path.normpath(path) if os.path.isfile(path) else None


def generated_library(allowlist: str, out_dir: str) -> tuple[str, str]:
    """(ops JSON, library) of `opforge gen aten` on `allowlist` in `out_dir`,
    rebuilt only where it changed (the first build takes a minute or two)."""
    print(f"  generating and building the ops of {os.path.basename(allowlist)} in {out_dir} ...",
          file=sys.stderr, flush=True)
    os.makedirs(out_dir, exist_ok=True)
    report = _generate.generate_aten(allowlist, _GEN_NAMESPACE, out_dir, tests=False, jobs=os.cpu_count() or 2)
    return os.path.join(out_dir, f"{_GEN_NAMESPACE}_ops.json"), report.library


def measure_generated(allowlist: str, out_dir: str, repeats: int) -> dict:
    ops_json, library = generated_library(allowlist, out_dir)
    samples: dict[str, list[float]] = {name: [] for name in _GEN_VARIANTS}
    counts: dict[str, int] = {}
    refused: dict[str, list[str]] = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for r in range(repeats):
        for name in _GEN_VARIANTS:
            print(f"  generated ops, repeat {r + 1}/{repeats}: {name} ...", file=sys.stderr, flush=True)
            run = subprocess.run([sys.executable, "-c", _GEN_CHILD, name, ops_json, library], capture_output=True,
                                 text=True, timeout=600, env=env)
            if run.returncode != 0:
                raise RuntimeError(f"opforge bench --compile: registering the generated ops with {name} failed:\n"
                                   f"{run.stderr[-2000:]}")
            result = json.loads(run.stdout.strip().splitlines()[-1])
            samples[name].append(result["ms"] / max(result["ops"], 1))
            counts[name] = result["ops"]
            refused[name] = result["refused"]
    with open(ops_json) as f:
        data = json.load(f)
    return {"ops": len(data["ops"]), "names": data["allowlist"]["names"], "library": library,
            "ms_per_op": {name: statistics.median(v) for name, v in samples.items()},
            "registered": counts, "refused": {name: len(v) for name, v in refused.items()},
            "refused_example": {name: v[0] for name, v in refused.items() if v}}


def _cache_misses() -> int:
    """Misses of Inductor's FX graph cache and AOTAutograd's cache so far."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"]


def measure_digests(repeats: int = 5) -> dict:
    """What keying every op's definition costs a compile start
    (docs/compile_cache.md): every registered op's digest computed anew
    (cold), and the compile-start step once they are known (warm)."""
    ops = _registry.ops()
    cold, warm = [], []
    for _ in range(repeats):
        _cache_key._memo.clear()
        t0 = time.perf_counter()
        for op in ops:
            _cache_key.digest(op)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _cache_key.note_all(ops)
        warm.append(time.perf_counter() - t0)
    return {"ops": len(ops), "cold_ms": statistics.median(cold) * 1e3, "warm_us": statistics.median(warm) * 1e6}


def measure(args: argparse.Namespace) -> dict:
    registration = {}
    for n in args.compile_leaves:
        print(f"  registration with {n} leaves ...", file=sys.stderr, flush=True)
        registration[n] = _bench.measure_registration(n, count=args.registrations, repeats=args.compile_repeats,
                                                      distinct=False)
    generated = None
    allowlist = args.compile_allowlist or default_allowlist()
    if allowlist and args.compile_generated:
        generated = measure_generated(allowlist, args.compile_gen_dir, args.compile_repeats)
    by_layers = {layers: measure_layers(layers, args.dim_compiled, args.batch, args.compile_repeats, args.repeats,
                                        args.min_time)
                 for layers in args.compile_layers}
    return {"torch": torch.__version__, "registration": registration, "generated": generated, "layers": by_layers,
            "digests": measure_digests()}


def _verdict(ratio: float, budget: float) -> str:
    return f"{ratio:>6.2f}x  budget <= {budget}x: {'met' if ratio <= budget else 'NOT met'}"


def render(result: dict) -> str:
    lines = [f"opforge bench --compile: CPU, {result['threads']} thread(s), torch {result['torch']}", "",
             f"{'registration, ms per op':28}{'opforge':>10}{'custom_op':>11}{'define+impl':>13}"]
    for n, reg in result["registration"].items():
        lines.append(f"{f'  {n} leaves':28}{reg['opforge']:>10.3f}{reg['custom_op']:>11.3f}{reg['define_impl']:>13.3f}"
                     f"   opforge / custom_op {_verdict(reg['opforge'] / reg['custom_op'], 0.5)}")
    generated = result.get("generated")
    if generated:
        ms, n, names = generated["ms_per_op"], generated["ops"], generated["names"]
        lines.append(f"{f'  {n} ops of {names} names':28}{ms['opforge gen aten']:>10.4f}{ms['custom_op']:>11.3f}"
                     f"{ms['define+impl']:>13.3f}   opforge / custom_op "
                     f"{_verdict(ms['opforge gen aten'] / ms['custom_op'], 0.5)}")
        lines.append(f"{'':28}(opforge: loading the C++ library `opforge gen aten` built; the others: the same "
                     "schemas defined in Python, forwarding to ATen)")
        accepted = generated["registered"]["custom_op"]
        if accepted < n:
            lines.append(f"{'':28}custom_op took {accepted} of the {n} schemas (per op: those); it refused "
                         f"{n - accepted}: {generated['refused_example'].get('custom_op', '')}")
    for layers, rows in result["layers"].items():
        lines += ["", f"{f'{layers} layers x 4 ops':28}" + "".join(f"{name:>20}" for name in _VARIANTS)]
        for key, label, fmt in (("dynamo_s", "dynamo s", ".3f"), ("inductor_cold_s", "inductor cold s", ".3f"),
                                ("inductor_warm_s", "inductor warm s", ".3f"),
                                ("inductor_warm_misses", "inductor warm misses", ".0f"),
                                ("recompiles", "recompiles", ".0f"),
                                ("step_us", "step µs", ".1f")):
            lines.append(f"{'  ' + label:28}" + "".join(f"{rows[name][key]:>20{fmt}}" for name in _VARIANTS))
        ours, define, custom = (rows[name] for name in _VARIANTS)
        for key, label in (("dynamo_calls", "dynamo calls"), ("inductor_cold_calls", "inductor cold calls"),
                           ("inductor_warm_calls", "inductor warm calls")):
            if all(rows[name].get(key) for name in _VARIANTS):
                lines.append(f"{'  ' + label + ', k':28}" + "".join(f"{rows[name][key] / 1000:>20.1f}"
                                                                     for name in _VARIANTS))
                # What one struct-op call site adds over a flat one.
                sites = ours["call_sites"]
                lines.append(f"{'    opforge per call site':28}{(ours[key] - define[key]) / sites:>+8.0f} over "
                             f"define+impl, {(ours[key] - custom[key]) / sites:>+.0f} over custom_op")
        lines += [f"{'  dynamo / custom_op':28}{_verdict(ours['dynamo_s'] / custom['dynamo_s'], 1.0)}",
                  f"{'  cold / define+impl':28}{_verdict(ours['inductor_cold_s'] / define['inductor_cold_s'], 1.0)}",
                  f"{'  warm / custom_op':28}{_verdict(ours['inductor_warm_s'] / custom['inductor_warm_s'], 1.0)}",
                  f"{'  step / define+impl':28}{_verdict(ours['step_us'] / define['step_us'], 1.0)}"]
    digests = result.get("digests")
    if digests:
        lines += ["", f"definition digests at a compile start (docs/compile_cache.md): {digests['ops']} ops, "
                      f"{digests['cold_ms']:.2f} ms computed anew, {digests['warm_us']:.0f} µs once known"]
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(t) for t in str(text).split(",") if t.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--compile (start-up and compile time)")
    group.add_argument("--compile-layers", type=_ints, default=[16, 80],
                       help="model depths, comma-separated (default 16,80)")
    group.add_argument("--compile-leaves", type=_ints, default=[1, 5, 30],
                       help="leaf counts for the registration rows (default 1,5,30)")
    group.add_argument("--compile-allowlist", default=None,
                       help="allowlist for the generated-ops row (default: examples/codegen/aten_allowlist.txt "
                            "of this checkout, 525 names)")
    group.add_argument("--compile-gen-dir", default=os.path.join(
                           tempfile.gettempdir(), f"opforge-bench-gen-torch-{torch.__version__.split('+')[0]}"),
                       help="where the generated library is built and kept between runs")
    group.add_argument("--no-compile-generated", dest="compile_generated", action="store_false",
                       help="leave out the generated-ops row (its first build takes a minute or two)")


def run(args: argparse.Namespace) -> int:
    return run_on_threads(args, lambda: measure(args), render)
