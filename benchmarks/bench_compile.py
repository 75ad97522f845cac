"""What a model of struct ops costs before its first step, CPU: registration
at 1, 5 and 30 leaves and of the ops `opforge gen aten` makes from the
525-name allowlist, Dynamo, Inductor cold and warm-cache compiles,
recompiles when a struct field changes, and the compiled step, at 16 and 80
layers, against the same model with flat `Library.define` + `impl` ops and
with `custom_op`s (docs/performance.md#start-up-and-compile-time).

    python benchmarks/bench_compile.py
    python benchmarks/bench_compile.py --compile-layers 16 --compile-repeats 3 --json out.json

The same code runs as `opforge bench --compile`.
"""

import sys

from opforge.bench import main

if __name__ == "__main__":
    sys.exit(main(["--compile", *sys.argv[1:]]))
