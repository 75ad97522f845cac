"""Runners under torch.compile: compile time and per-step time of a model
whose every layer holds its own runner (`opforge.Handle[Runner]`), each layer
compiled on its own with fullgraph=True, against the same model without
runners (docs/handles.md).

    python benchmarks/bench_runners.py                          # 24 layers, Inductor, CPU
    python benchmarks/bench_runners.py --device cuda --layers 64

The same code runs as `opforge bench --runners`.
"""

import sys

from opforge.bench import main

if __name__ == "__main__":
    sys.exit(main(["--runners", *sys.argv[1:]]))
