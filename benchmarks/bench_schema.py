"""Parse + print every schema of the installed torch with opforge's C++ parser
(docs/performance.md budget: <= 50 ms in total).

    python benchmarks/bench_schema.py
"""

from __future__ import annotations

import os
import sys
import time

import torch

from opforge import _C


def all_schemas() -> list[str]:
    texts = [str(s) for s in torch._C._jit_get_all_schemas()]
    texts += [str(s) for s in torch._C._jit_get_custom_class_schemas()]
    try:
        import torchgen
        import yaml

        path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")
        with open(path) as f:
            entries = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        texts += ["aten::" + e["func"] for e in entries if "func" in e]
    except ImportError:
        print("(pyyaml or torchgen missing: native_functions.yaml skipped)", file=sys.stderr)
    return texts


def main() -> int:
    texts = all_schemas()
    ms, _ = _C.bench_parse_print(texts, repeats=9)
    start = time.perf_counter()
    for t in texts:
        str(torch._C.parse_schema(t))
    torch_ms = (time.perf_counter() - start) * 1e3
    print(f"{len(texts)} schemas (torch {torch.__version__})")
    print(f"  opforge parse + print (C++)      {ms:8.2f} ms   budget <= 50 ms: {'met' if ms <= 50 else 'NOT met'}")
    print(f"  torch parse + print via Python   {torch_ms:8.2f} ms   (for reference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
