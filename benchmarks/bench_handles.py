"""Per-call cost of an op taking a runner handle, eager (docs/handles.md).

    python benchmarks/bench_handles.py [--repeats 15] [--json FILE]

Three no-op ops side by side in one process, measured in turn (median of
`--repeats` repeats, µs per call):

    tensor op             ns::plain(Tensor(a!) out) -> ()
    handle op, object     ns::run(Tensor(a!) out, Handle[Runner] r) -> (), called with the runner
    handle op, torch.ops  the same through torch.ops with the runner's integer
                          handle: the dispatcher's kernel resolves it in the handle table

and the handle table's own resolve (`opforge.handles.resolve`) alone. It
uses only the public API, so that one script times two builds of opforge
(before and after a change to the handle table) on the same machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit

import torch

import opforge
from opforge import handles

Tensor = torch.Tensor


class Runner:
    def __init__(self, k: int):
        self.k = k


@opforge.op("ofbh::plain", mutates_args=("out",))
def plain(out: Tensor) -> None:
    pass


@opforge.op("ofbh::run", mutates_args=("out",))
def run(out: Tensor, r: opforge.Handle[Runner]) -> None:
    assert r.k == 3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    x = torch.zeros(4)
    runner = Runner(3)
    h = int(handles.register(runner))
    ops = torch.ops.ofbh
    run(x, runner)
    ops.run(x, h)
    assert handles.resolve(h) is runner
    rows = {
        "tensor op": lambda: plain(x),
        "handle op, object": lambda: run(x, runner),
        "handle op, torch.ops": lambda: ops.run(x, h),
        "tensor op, torch.ops": lambda: ops.plain(x),
        "handles.resolve": lambda: handles.resolve(h),
    }
    samples = {name: [] for name in rows}
    for _ in range(args.repeats):
        for name, fn in rows.items():  # in turn: load falls on every row alike
            samples[name].append(timeit.timeit(fn, number=args.number) / args.number * 1e6)
    med = {name: statistics.median(v) for name, v in samples.items()}
    print(f"bench_handles: torch {torch.__version__}, opforge {opforge.__version__}, "
          f"median of {args.repeats} repeats, µs per call")
    for name, v in med.items():
        print(f"  {name:28}{v:8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(med, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
