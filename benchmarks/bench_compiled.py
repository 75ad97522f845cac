"""A compiled model's step: 16 layers x 4 struct ops (two tensors and a frozen
dataclass of five scalars), Inductor, CPU, against the same model with flat
`Library.define` + `impl` ops and with `custom_op`s (docs/performance.md).

    python benchmarks/bench_compiled.py
    python benchmarks/bench_compiled.py --compiled-layers 32 --backend aot_eager

The same code runs as `opforge bench --compiled`.
"""

import sys

from opforge.bench import main

if __name__ == "__main__":
    sys.exit(main(["--compiled", *sys.argv[1:]]))
