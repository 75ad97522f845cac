"""Generate ATen-forwarding ops for a few names, build them, call them, and
write stubs for the namespace.

    python examples/codegen/generate_and_call.py            # into build/example_codegen/
    python examples/codegen/generate_and_call.py OUT_DIR

Prints what it did, e.g.

    exampleaten: 10 ops for 5 of 5 names; library .../build/example_codegen/build/libexampleaten_ops.so
    exampleaten::addmm(c, a, b, beta=0.5, out=result) == torch.addmm(...): True
    exampleaten::sort_values(a, dim=1, descending=True, ...) == a.sort(...): True
    exampleaten::add_scalar_(ones, 2, alpha=3) -> [7.0, 7.0, 7.0]
    under torch.compile(fullgraph=True): [2.0, 4.0]
    stubs from the live registry: stubs/exampleaten.pyi, stubs/exampleaten.py
    generated tests: 25 cases; run: pytest .../test_exampleaten_ops.py
"""

import os
import sys

import torch

from opforge import gen

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ["abs", "addmm", "max", "sort", "add_"]


def main(out: str) -> None:
    report = gen.generate_aten(NAMES, "exampleaten", out)
    generated, total = report.coverage
    print(f"exampleaten: {len(report.selection.ops)} ops for {generated} of {total} names; "
          f"library {report.library}")
    torch.ops.load_library(report.library)
    ops = torch.ops.exampleaten

    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)
    result = torch.empty(0)
    ops.addmm(c, a, b, beta=0.5, out=result)
    print("exampleaten::addmm(c, a, b, beta=0.5, out=result) == torch.addmm(...):",
          torch.allclose(result, torch.addmm(c, a, b, beta=0.5)))

    values, indices = torch.empty(0), torch.empty(0, dtype=torch.long)
    ops.sort_values(a, dim=1, descending=True, values=values, indices=indices)
    print("exampleaten::sort_values(a, dim=1, descending=True, ...) == a.sort(...):",
          torch.equal(values, a.sort(dim=1, descending=True).values))

    x = torch.ones(3)
    ops.add_scalar_(x, 2, alpha=3)
    print("exampleaten::add_scalar_(ones, 2, alpha=3) ->", x.tolist())

    compiled = torch.compile(lambda t: ops.abs(t, out=torch.empty_like(t)) * 2, fullgraph=True)
    print("under torch.compile(fullgraph=True):", compiled(torch.tensor([-1.0, 2.0])).tolist())

    # `gen aten` already wrote exampleaten.pyi; `gen stubs` does the same for
    # any namespace that is registered, here into its own directory.
    stubs = gen.generate_stubs("exampleaten", os.path.join(out, "stubs"))
    print("stubs from the live registry:", ", ".join(os.path.relpath(f, out) for f in stubs))
    print(f"generated tests: {report.cases} cases; run: pytest {os.path.join(out, 'test_exampleaten_ops.py')}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "example_codegen"))
