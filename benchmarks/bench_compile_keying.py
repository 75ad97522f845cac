"""What keying every op's definition into torch.compile's caches costs a
compile (docs/compile_cache.md), CPU, one thread.

The struct-op model of `opforge bench --compile` (16 layers x 4 ops) is
compiled with Inductor cold (no cache) and warm (from a cache filled just
before, in a fresh directory), in pairs: one compile with the digests in the
caches' keys ("keyed", opforge as shipped, every digest computed anew as a
process's first compile does) and one with that compile-start step taken out
and its entries removed from Inductor's config ("unkeyed", what a compile
cost before the keying), the first of each pair taking turns. Every opforge
op of the process is keyed, so the process defines --ops more of them, as an
engine does. Ratio: the median of the pairs' keyed / unkeyed, with the first
and third quartiles, over --processes fresh processes.

    python benchmarks/bench_compile_keying.py
    python benchmarks/bench_compile_keying.py --pairs 9 --processes 2 --ops 64 --json out.json

Budget: keyed / unkeyed <= 1.02x cold and warm, and no warm compile misses a
cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, tempfile, time
import torch
torch.set_num_threads(1)
import opforge
from opforge import _cache_key, _registry
from opforge.bench import compiled as bench_compiled
from opforge.bench.compile import _cache_misses, _first_call, _warm_caches
from opforge.bench.runners import _no_compile_caches

layers, dim, extra, pairs = map(int, sys.argv[1:5])
note_all = _cache_key.note_all
config = torch._inductor.config


def keyed(on: bool) -> None:
    _cache_key._memo.clear()  # every digest computed anew, as a process's first compile does
    if on:
        _cache_key.note_all = note_all
    else:
        _cache_key.note_all = lambda ops: None
        _cache_key._noted.clear()
        config.unsafe_marked_cacheable_functions = {
            k: v for k, v in config.unsafe_marked_cacheable_functions.items() if not k.startswith("opforge ")}


for i in range(extra):  # more ops in the process, as an engine defines them: each is keyed at every compile start
    bench_compiled.define_ops(f"extra{i}")
models = bench_compiled.build_models(layers, dim)
model = models["opforge struct op"]
x = torch.randn(8, dim, generator=torch.Generator().manual_seed(0))
samples = {"cold": [], "warm": []}
misses = []
with torch.no_grad():
    eager = model(x)
    with _no_compile_caches():
        _first_call(models["define+impl (flat)"], x, "inductor")  # warms Dynamo and Inductor up
    for p in range(pairs):
        pair = {"cold": {}, "warm": {}}
        for on in ((True, False) if p % 2 == 0 else (False, True)):
            with _no_compile_caches():
                keyed(on)
                seconds, _fn, out = _first_call(model, x, "inductor")
            torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
            pair["cold"][on] = seconds
            with tempfile.TemporaryDirectory(prefix="opforge-keying-") as cache, _warm_caches(cache):
                keyed(on)
                _first_call(model, x, "inductor")  # fills the cache
                keyed(on)
                before = _cache_misses()
                seconds, _fn, out = _first_call(model, x, "inductor")
                misses.append(_cache_misses() - before)
            torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
            pair["warm"][on] = seconds
        for kind in samples:
            samples[kind].append([pair[kind][True], pair[kind][False]])
keyed(True)
t0 = time.perf_counter()
for op in _registry.ops():
    _cache_key.digest(op)
digest_ms = (time.perf_counter() - t0) * 1e3
print("RESULT " + json.dumps({"samples": samples, "warm_misses": misses, "ops": len(_registry.ops()),
                              "digest_ms": digest_ms}))
"""


def run_child(layers: int, dim: int, extra: int, pairs: int) -> dict:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(layers), str(dim), str(extra), str(pairs)],
                          capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the benchmark's process failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=9, help="keyed/unkeyed pairs per process (default 9)")
    parser.add_argument("--processes", type=int, default=2, help="fresh processes (default 2)")
    parser.add_argument("--layers", type=int, default=16, help="model depth (default 16)")
    parser.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--ops", type=int, default=64,
                        help="opforge ops defined in the process besides the model's (default 64)")
    parser.add_argument("--json", metavar="FILE", help="also write every sample to FILE")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.processes < 1:
        parser.error("--pairs and --processes must be at least 1")
    runs = []
    for n in range(args.processes):
        print(f"  process {n + 1}/{args.processes}: {args.pairs} pairs ...", file=sys.stderr, flush=True)
        runs.append(run_child(args.layers, args.dim, args.ops, args.pairs))
    print(f"opforge keyed compile caches: {args.layers} layers x 4 struct ops, {runs[0]['ops']} opforge ops in "
          f"the process, CPU, one thread; {args.processes} x {args.pairs} keyed/unkeyed pairs")
    print(f"  computing every op's digest anew: "
          f"{statistics.median(r['digest_ms'] for r in runs):.2f} ms")
    failed = False
    for kind, label in (("cold", "inductor cold"), ("warm", "inductor warm")):
        pairs = [p for r in runs for p in r["samples"][kind]]
        q1, median, q3 = quartiles([k / u for k, u in pairs])
        met = median <= 1.02
        failed |= not met
        print(f"  {label:14} keyed {statistics.median(k for k, _ in pairs):.3f} s  unkeyed "
              f"{statistics.median(u for _, u in pairs):.3f} s  {median:.3f}x [{q1:.3f}, {q3:.3f}]  "
              f"budget <= 1.02x: {'met' if met else 'NOT met'}")
    misses = [m for r in runs for m in r["warm_misses"]]
    print(f"  warm compiles that missed a cache: {sum(1 for m in misses if m)} of {len(misses)}")
    failed |= any(misses)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layers": args.layers, "dim": args.dim, "runs": runs}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
