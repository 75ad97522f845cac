"""Registration time of Triton ops: 50 ops whose bodies live in one module.

    python benchmarks/bench_triton_registration.py [--ops 50] [--repeats 5]

Prints the time to register all of them with triton="auto" (scan, rewrite,
triton_op-style registration) next to triton="off" (a plain opaque op), and
the time of the Triton planning step alone. Each repeat uses a fresh module,
so its source is parsed and its bodies are compiled again.
"""

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

import torch  # noqa: F401
import triton  # noqa: F401

import opforge
import opforge.triton as ot

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def launch(x, y, out):
    add_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
'''

BODY = '''

def op_{i}(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    out = torch.empty_like(x)
    if alpha == {i}:
        kernels.launch(x, y, out)
    else:
        kernels.add_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
    return out
'''


def make_package(root: str, tag: str, count: int):
    """A fresh package `bench_<tag>` with a kernels module and one module holding `count` op bodies."""
    pkg = os.path.join(root, f"bench_{tag}")
    os.makedirs(pkg)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    with open(os.path.join(pkg, "kernels.py"), "w") as f:
        f.write(KERNELS)
    with open(os.path.join(pkg, "ops.py"), "w") as f:
        f.write("import torch\nimport triton\n\nfrom . import kernels\n")
        for i in range(count):
            f.write(BODY.format(i=i))
    sys.path.insert(0, root)
    try:
        spec = importlib.util.find_spec(f"bench_{tag}.ops")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(root)
    return [getattr(module, f"op_{i}") for i in range(count)]


def register(bodies, ns: str, triton_mode: str) -> float:
    start = time.perf_counter()
    for i, body in enumerate(bodies):
        opforge.op(f"{ns}::op_{i}", triton=triton_mode, fake=_fake)(body)
    return time.perf_counter() - start


def plan_only(bodies, ns: str) -> float:
    start = time.perf_counter()
    for i, body in enumerate(bodies):
        assert ot.plan(f"{ns}::op_{i}", body, mode="auto", extra_kernels=()) is not None
    return time.perf_counter() - start


def _fake(x, y, alpha=1.0):
    return torch.empty_like(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    auto, off, plans = [], [], []
    with tempfile.TemporaryDirectory() as root:
        # Warm-up: first-use imports of torch.library and the Triton hooks.
        register(make_package(root, "warm", 2), "bench_warm", "auto")
        for r in range(args.repeats):
            auto.append(register(make_package(root, f"auto{r}", args.ops), f"bench_auto{r}", "auto"))
            off.append(register(make_package(root, f"off{r}", args.ops), f"bench_off{r}", "off"))
            plans.append(plan_only(make_package(root, f"plan{r}", args.ops), f"bench_plan{r}"))
    info = ot.cache_info()
    n = args.ops
    print(f"registering {n} Triton ops from one module (median of {args.repeats}, fresh module each time)")
    for label, times in (("triton='auto'", auto), ("triton='off'", off), ("plan() alone", plans)):
        total = statistics.median(times)
        print(f"  {label:14s} {total * 1e3:8.1f} ms total  {total / n * 1e3:6.2f} ms/op")
    print(f"  cache: {info}")


if __name__ == "__main__":
    main()
