"""What keying every op's definition into torch.compile's caches costs a
compile (docs/compile_cache.md), CPU: the struct-op model of `opforge bench
--compile` compiled with Inductor cold (no cache) and warm (from a cache
filled just before, in a fresh directory), with the digests entering the
caches' keys ("keyed", opforge as shipped; every opforge op of the
process is keyed, so the process defines --ops more of them) and with that compile-start step
taken out ("unkeyed", what a compile cost before the keying). Each compile
runs in a fresh process; the two kinds of process alternate, the first of
each round taking turns, and the median of the rounds is reported with its
spread.

    python benchmarks/bench_compile_keying.py
    python benchmarks/bench_compile_keying.py --rounds 7 --layers 16 --ops 64 --json out.json

Budget: keyed / unkeyed <= 1.02x cold and warm, and the warm compile misses
no cache (0 misses) either way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import gc, json, os, sys, tempfile, time
import torch
torch.set_num_threads(1)
import opforge
from opforge import _cache_key
from opforge.bench import compiled as bench_compiled
from opforge.bench.compile import _cache_misses, _first_call, _warm_caches
from opforge.bench.runners import _no_compile_caches

keyed, layers, dim, extra = sys.argv[1] == "keyed", int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if not keyed:
    _cache_key.note_all = lambda ops: None  # the compile-start step that puts the digests in the key
for i in range(extra):  # more ops in the process, as an engine defines them: each is keyed at every compile start
    bench_compiled.define_ops(f"extra{i}")
models = bench_compiled.build_models(layers, dim)
model = models["opforge struct op"]
x = torch.randn(8, dim, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    eager = model(x)
    with _no_compile_caches():
        _first_call(models["define+impl (flat)"], x, "inductor")  # warms Dynamo and Inductor up
        cold, _fn, out = _first_call(model, x, "inductor")
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    with tempfile.TemporaryDirectory(prefix="opforge-keying-") as cache, _warm_caches(cache):
        _first_call(model, x, "inductor")  # fills the cache
        misses = _cache_misses()
        warm, _fn, out = _first_call(model, x, "inductor")
        misses = _cache_misses() - misses
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
marked = torch._inductor.config.unsafe_marked_cacheable_functions
digests = sum(1 for k in marked if k.startswith("opforge "))
print("RESULT " + json.dumps({"cold_s": cold, "warm_s": warm, "warm_misses": misses, "digests": digests}))
"""


def run_child(kind: str, layers: int, dim: int, extra: int) -> dict:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, kind, str(layers), str(dim), str(extra)], capture_output=True,
                          text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"the {kind} child failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of one keyed and one unkeyed process")
    parser.add_argument("--layers", type=int, default=16, help="model depth (default 16)")
    parser.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--ops", type=int, default=64,
                        help="opforge ops defined in the process besides the model's (default 64)")
    parser.add_argument("--json", metavar="FILE", help="also write every sample to FILE")
    args = parser.parse_args(argv)
    samples: dict[str, list[dict]] = {"keyed": [], "unkeyed": []}
    for r in range(args.rounds):
        order = ("keyed", "unkeyed") if r % 2 == 0 else ("unkeyed", "keyed")
        for kind in order:
            print(f"  round {r + 1}/{args.rounds}: {kind} ...", file=sys.stderr, flush=True)
            samples[kind].append(run_child(kind, args.layers, args.dim, args.ops))
    print(f"opforge keyed compile caches: {args.layers} layers x 4 struct ops, {args.ops + 1} opforge ops in the "
          f"process, CPU, one thread, {args.rounds} rounds (medians, [min, max] of the rounds' ratios)")
    print(f"  digests in the key: keyed {samples['keyed'][0]['digests']}, unkeyed {samples['unkeyed'][0]['digests']}")
    failed = False
    for key, label in (("cold_s", "inductor cold s"), ("warm_s", "inductor warm s")):
        keyed = [s[key] for s in samples["keyed"]]
        unkeyed = [s[key] for s in samples["unkeyed"]]
        # Per round: the keyed process over the unkeyed one of the same round.
        ratios = [k / u for k, u in zip(keyed, unkeyed)]
        ratio = statistics.median(keyed) / statistics.median(unkeyed)
        met = ratio <= 1.02
        failed |= not met
        print(f"  {label:18} keyed {statistics.median(keyed):.3f}  unkeyed {statistics.median(unkeyed):.3f}  "
              f"{ratio:.3f}x [{min(ratios):.3f}, {max(ratios):.3f}]  budget <= 1.02x: {'met' if met else 'NOT met'}")
    misses = {kind: [s["warm_misses"] for s in samples[kind]] for kind in samples}
    print(f"  warm misses: keyed {misses['keyed']}, unkeyed {misses['unkeyed']}")
    failed |= any(misses["keyed"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layers": args.layers, "dim": args.dim, "samples": samples}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
