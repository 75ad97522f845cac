"""The C++ rows of `opforge bench` (and benchmarks/bench_cpp_ops.py): C++ ops
compiled on first use from `cpp_ops.cc`, timed from C++ and from
Python in this process.

    >>> results = measure(build())
    >>> results.cpp["opforge_bwd"] / results.cpp["function_bwd"]
    1.01
    >>> print(render(results))
    C++ ops (compiled against torch 2.13.0+cpu), median of 31 repeats
      from C++, through the dispatcher                   ns per call
        flat TORCH_LIBRARY op                                   17.8
        ...
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from ..gen._build import PRIVATE_STATIC_LIBS, torch_flags

# Scalar leaves of the struct-op rows: a struct op from Python against the
# same flat op through torch.ops.
LEAVES = (1, 5, 30)
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp_ops.cc")
LIBRARY = "libopforge_bench_ops.so"


def default_build_dir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "opforge", f"bench-{torch.__version__}")


def build(build_dir: str | None = None, quiet: bool = True) -> str:
    """Compiles the bench ops against this opforge and torch, unless the
    library is newer than its source and the command is unchanged; returns
    the library path."""

    import opforge

    build_dir = build_dir or default_build_dir()
    os.makedirs(build_dir, exist_ok=True)
    library = os.path.join(build_dir, LIBRARY)
    root = opforge.cmake_prefix_path
    lib_dir = os.path.join(root, "lib")
    cflags, ldflags = torch_flags()
    torch_include = cflags[cflags.index("-isystem") + 1]
    command = (
        [os.environ.get("CXX", "c++")] + cflags
        + ["-isystem", os.path.join(torch_include, "torch", "csrc", "api", "include"),
           "-I", os.path.join(root, "include"), SOURCE, "-o", library]
        + ldflags + ["-ltorch", f"-L{lib_dir}", "-lopforge_torch", "-lopforge_core", f"-Wl,-rpath,{lib_dir}"]
    )
    stamp = library + ".cmd"
    current = os.path.exists(library) and os.path.getmtime(library) >= max(
        os.path.getmtime(SOURCE), os.path.getmtime(os.path.join(lib_dir, "libopforge_torch.so")))
    if current and os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as f:
            current = json.load(f) == command
    if not current:
        if not quiet:
            print(f"  compiling the C++ bench ops into {build_dir} ...", file=sys.stderr, flush=True)
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError("compiling the C++ bench ops failed:\n" + proc.stderr[-4000:])
        with open(stamp, "w", encoding="utf-8") as f:
            json.dump(command, f)
    return library


STABLE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stable_ops.cc")
STABLE_LIBRARY = "libopforge_bench_stable.so"


def build_stable(build_dir: str | None = None, quiet: bool = True) -> str:
    """Compiles the stable-ABI bench ops (torch's stable ABI, target 2.10)
    unless they are newer than their source; returns the library path."""

    import opforge

    build_dir = build_dir or default_build_dir()
    os.makedirs(build_dir, exist_ok=True)
    library = os.path.join(build_dir, STABLE_LIBRARY)
    cflags, _ = torch_flags()
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    command = ([os.environ.get("CXX", "c++")] + cflags
               + ["-DOPFORGE_STABLE_ABI", "-DTORCH_TARGET_VERSION=0x020A000000000000ULL",
                  "-I", os.path.join(opforge.cmake_prefix_path, "include"), STABLE_SOURCE, "-o", library,
                  "-shared", PRIVATE_STATIC_LIBS, os.path.join(torch_lib, "libtorch_cpu.so"), "-ldl",
                  f"-Wl,-rpath,{torch_lib}"])
    if not (os.path.exists(library) and os.path.getmtime(library) >= os.path.getmtime(STABLE_SOURCE)):
        if not quiet:
            print(f"  compiling the stable-ABI bench ops into {build_dir} ...", file=sys.stderr, flush=True)
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError("compiling the stable-ABI bench ops failed:\n" + proc.stderr[-4000:])
    return library


@dataclasses.dataclass
class Results:
    cpp: dict[str, float]  # ns per call, timed from C++
    python: dict[str, float]  # µs per call, timed from Python
    repeats: int


def _median_us(fn, calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def measure(library: str, calls: int = 400, repeats: int = 31, stable_library: str | None = None) -> Results:
    """Times every C++ case from C++ (the ops `opforge_bench::time_cpp` and
    `time_boxed`) and the Python cases from Python, alternating repeats.
    With `stable_library`, the stable-ABI struct ops too."""
    import opforge

    torch.ops.load_library(library)
    ops = torch.ops.opforge_bench
    flat, structured, function_bwd, opforge_bwd = ops.time_cpp(calls, repeats)
    cpp = {"flat": flat, "structured": structured, "function_bwd": function_bwd, "opforge_bwd": opforge_bwd}
    if stable_library:
        opforge.load_library(stable_library)
        names = [f"opforge_bench::{kind}{n}" for n in LEAVES for kind in ("flat", "struct")]
        names += [f"opforge_bench_stable::{kind}{n}" for n in LEAVES for kind in ("flat", "struct")]
        for name, ns in zip(names, ops.time_boxed(names, calls * 20, repeats)):
            cpp["boxed " + name.split("::")[0].replace("opforge_bench_stable", "stable") + " " +
                name.split("::")[1]] = ns

    x, w, b = (torch.ones(4, requires_grad=True) for _ in range(3))
    y = torch.ones(4)
    lin = opforge.structs.opforge_bench.Lin(w=w, b=b, scale=2.0)
    cfg = opforge.structs.opforge_bench.Cfg(2.0, True, 3)
    affine, structured = opforge.ops.opforge_bench.affine, opforge.ops.opforge_bench.structured
    flat_op, struct_op = ops.flat.default, ops.structured.default
    autograd_calls = max(calls // 4, 20)
    leaf_cases = {}
    for n in LEAVES:
        values = [float(i) for i in range(n)]
        cls = getattr(opforge.structs.opforge_bench, f"Cfg{n}")
        cfg_n = cls(*values)
        flat_n, struct_n = getattr(ops, f"flat{n}"), getattr(opforge.ops.opforge_bench, f"struct{n}")
        leaf_cases[f"flat{n}"] = (lambda f=flat_n, v=values: f(y, *v), autograd_calls * 20)
        leaf_cases[f"struct{n}"] = (lambda f=struct_n, c=cfg_n: f(y, c), autograd_calls * 20)
        leaf_cases[f"struct{n}_built"] = (lambda f=struct_n, c=cls, v=values: f(y, c(*v)), autograd_calls * 20)
        if stable_library:
            stable_cls = getattr(opforge.structs.opforge_bench_stable, f"Cfg{n}")
            stable_n = getattr(opforge.ops.opforge_bench_stable, f"struct{n}")
            leaf_cases[f"stable{n}"] = (lambda f=stable_n, c=stable_cls(*values): f(y, c), autograd_calls * 20)
    # (callable, calls per repeat): bare calls cost ~1/20 of fwd + bwd.
    cases = {
        **leaf_cases,
        "flat": (lambda: flat_op(y, y, 2.0, True, 3), autograd_calls * 20),
        "structured": (lambda: struct_op(y, y, 2.0, True, 3), autograd_calls * 20),
        "structured_wrapper": (lambda: structured(y, y, cfg), autograd_calls * 20),
        "function_bwd": (lambda: ops.affine_flat(x, w, b, 2.0).sum().backward(), autograd_calls),
        "opforge_bwd": (lambda: ops.affine(x, w, b, 2.0).sum().backward(), autograd_calls),
        "opforge_wrapper_bwd": (lambda: affine(x, lin).sum().backward(), autograd_calls),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for fn, n in cases.values():
        _median_us(fn, n // 4 + 1, 1)  # warm up
    for _ in range(repeats):
        for key, (fn, n) in cases.items():
            samples[key].append(_median_us(fn, n, 1))
    python = {k: statistics.median(v) for k, v in samples.items()}
    return Results(cpp, python, repeats)


def render(results: Results) -> str:
    c, p = results.cpp, results.python
    r_struct = c["structured"] / c["flat"]
    r_cpp = c["opforge_bwd"] / c["function_bwd"]
    r_py = p["opforge_bwd"] / p["function_bwd"]
    r_struct_py = p["structured"] / p["flat"]

    def verdict(r, budget=1.05):
        return "met" if r <= budget else "NOT met"

    def ratio_row(label, value, base, budget):
        r = value / base
        return f"    {label:48}{r:>11.3f}x   budget <= {budget:.2f}x: {verdict(r, budget)}"

    lines = [
        f"C++ ops (compiled against torch {torch.__version__}), median of {results.repeats} repeats",
        f"  {'from C++, through the dispatcher':50}{'ns per call':>12}",
        f"    {'flat TORCH_LIBRARY op':48}{c['flat']:>12.1f}",
        f"    {'opforge struct op':48}{c['structured']:>12.1f}",
        f"    {'fwd+bwd: hand-written torch::autograd::Function':48}{c['function_bwd']:>12.1f}",
        f"    {'fwd+bwd: opforge C++ backward (struct form)':48}{c['opforge_bwd']:>12.1f}",
        *[f"    {'boxed: ' + key[len('boxed '):]:48}{c[key]:>12.1f}" for key in sorted(c) if key.startswith("boxed ")],
        f"  {'from Python':50}{'µs per call':>12}",
        f"    {'flat TORCH_LIBRARY op':48}{p['flat']:>12.3f}",
        f"    {'opforge struct op, flat call (torch.ops)':48}{p['structured']:>12.3f}",
        f"    {'opforge struct op, opforge.ops + dataclass':48}{p['structured_wrapper']:>12.3f}",
        f"  {'from Python, N scalar leaves (1 / 5 / 30)':50}{'µs per call':>12}",
        *[f"    {label:48}{' / '.join(f'{p[key.format(n)]:.3f}' for n in LEAVES):>24}" for label, key in (
            ("flat op, torch.ops.ns.flatN(x, *leaves)", "flat{}"),
            ("struct op, opforge.ops.ns.structN(x, cfg)", "struct{}"),
            ("same, cfg built in the call", "struct{}_built"))],
        *([f"    {'stable-ABI struct op, opforge.ops.ns.structN(x, cfg)':48}"
           f"{' / '.join(format(p['stable' + str(n)], '.3f') for n in LEAVES):>24}"] if "stable1" in p else []),
        f"  {'from Python, fwd + .sum().backward()':50}{'µs per call':>12}",
        f"    {'hand-written torch::autograd::Function op':48}{p['function_bwd']:>12.2f}",
        f"    {'opforge C++ backward, flat call (torch.ops)':48}{p['opforge_bwd']:>12.2f}",
        f"    {'opforge C++ backward, opforge.ops + dataclass':48}{p['opforge_wrapper_bwd']:>12.2f}",
        "  ratios",
        f"    {'C++ struct op / flat op, from C++':48}{r_struct:>11.3f}x   budget <= 1.05x: {verdict(r_struct)}",
        f"    {'C++ struct op / flat op, from Python':48}{r_struct_py:>11.3f}x   budget <= 1.05x: {verdict(r_struct_py)}",
        *[f"    {f'C++ struct op / flat torch.ops op, {n} leaves':48}{p[f'struct{n}'] / p[f'flat{n}']:>11.3f}x"
          f"   budget <= 1.05x: {verdict(p[f'struct{n}'] / p[f'flat{n}'])}" for n in LEAVES],
        *[f"    {f'  same, struct built in the call, {n} leaves':48}"
          f"{p[f'struct{n}_built'] / p[f'flat{n}']:>11.3f}x   budget <= 1.15x: "
          f"{verdict(p[f'struct{n}_built'] / p[f'flat{n}'], 1.15)}" for n in LEAVES],
        *[ratio_row(f"stable-ABI struct op / C++ API flat op, {n} leaves", p.get(f"stable{n}"), p[f"flat{n}"],
                    1.10) for n in LEAVES if f"stable{n}" in p],
        *[ratio_row(f"  same, from C++ (boxed), {n} leaves", c.get(f"boxed stable struct{n}"),
                    c.get(f"boxed opforge_bench flat{n}"), 1.10) for n in LEAVES if f"boxed stable struct{n}" in c],
        *[ratio_row(f"  stable struct op / stable flat op (TORCH_BOX), {n}", c.get(f"boxed stable struct{n}"),
                    c.get(f"boxed stable flat{n}"), 1.10) for n in LEAVES if f"boxed stable flat{n}" in c],
        f"    {'C++ backward / autograd::Function, from C++':48}{r_cpp:>11.3f}x   budget <= 1.05x: {verdict(r_cpp)}",
        f"    {'C++ backward / autograd::Function, from Python':48}{r_py:>11.3f}x   budget <= 1.05x: {verdict(r_py)}",
    ]
    return "\n".join(lines)


def section(build_dir: str | None = None, calls: int = 400, repeats: int = 31) -> str:
    """The C++ section of `opforge bench`, or one line saying why it is missing."""
    try:
        library = build(build_dir, quiet=False)
    except (OSError, RuntimeError) as e:
        return f"C++ ops: not measured ({str(e).splitlines()[0]})"
    try:
        stable = build_stable(build_dir, quiet=False)
    except (OSError, RuntimeError) as e:
        print(f"  stable-ABI ops: not measured ({str(e).splitlines()[0]})", file=sys.stderr)
        stable = None
    return render(measure(library, calls=calls, repeats=repeats, stable_library=stable))
