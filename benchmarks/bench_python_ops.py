"""The Python rows of docs/performance.md: per-call overhead of `@opforge.op` ops against
`Library.define` + `impl` and `torch.library.custom_op`, forward + backward
against `custom_op` + `register_autograd` and `torch.autograd.Function`, and
registration time per op, at 1, 5 and 30 arguments.

    python benchmarks/bench_python_ops.py                 # CPU tensors
    python benchmarks/bench_python_ops.py --device cuda   # CUDA tensors

The same code runs as `opforge bench`.
"""

import sys

from opforge.bench import main

if __name__ == "__main__":
    sys.exit(main())
