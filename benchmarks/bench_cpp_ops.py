"""C++ ops against their hand-written twins (docs/cpp_ops.md, budgets <= 1.05x):

- a struct op vs the same op with a flat TORCH_LIBRARY schema, called through
  the dispatcher from C++;
- an op with an opforge C++ backward vs the same op with a hand-written
  torch::autograd::Function autograd kernel, forward + .sum().backward(),
  from C++ and from Python.

    python benchmarks/bench_cpp_ops.py [--build-dir build/bench_cpp_ops] [--repeats 31]

The ops live in python/opforge/bench/cpp_ops.cc (the same ones `opforge
bench` times); they are compiled against the installed opforge and torch.
"""

from __future__ import annotations

import argparse
import os
import sys

from opforge.bench import cpp as _bench_cpp


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=os.path.join("build", "bench_cpp_ops"))
    parser.add_argument("--calls", type=int, default=400, help="fwd+bwd iterations per repeat from C++")
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args(argv)
    library = _bench_cpp.build(args.build_dir, quiet=False)
    print(_bench_cpp.render(_bench_cpp.measure(library, calls=args.calls, repeats=args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
