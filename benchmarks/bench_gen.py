"""Benchmarks for `opforge gen aten` (docs/codegen.md, docs/performance.md).

    python benchmarks/bench_gen.py                 # both parts, the 525-name allowlist
    python benchmarks/bench_gen.py --skip-build    # per-call overhead only (reuses the build)
    python benchmarks/bench_gen.py --calibrate     # also time one <torch/torch.h> translation unit

(a) Generate + compile: runs `opforge gen aten` on a fresh output directory
    in a child process and reports its CPU-seconds (user + system of it and
    the compilers it waits for, what /usr/bin/time reports), with and
    without the search for test inputs.
(b) Per-call overhead: a generated op against the ATen overload it forwards
    to, in one process, tiny CPU tensors, median of several repeats. The
    fair comparison is `torch.ops.aten.<op>.<overload>`, which takes the same
    Python-to-dispatcher path; the public `torch.<op>(..., out=)` binding,
    which skips the boxed stack, is shown too.
(c) The same from C++, where the forwarding hop is not hidden under Python's
    cost: a loop of dispatcher calls (boxed, and typed/unboxed as a C++
    caller would make them), compiled with the generator's own build.
(d) Compile cost of the typed header NS_ops.h (`--header` runs only this):
    CPU-seconds of a translation unit with the header's own includes, with
    the header, and with the header and every function in it used.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_ALLOWLIST = os.path.join(ROOT, "examples", "codegen", "aten_allowlist.txt")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_generate(allowlist: str, out: str, namespace: str, tests: bool, build: bool = True) -> tuple[float, float]:
    """(CPU-seconds, wall seconds) of one `opforge gen aten` run."""
    command = [sys.executable, "-m", "opforge.cli", "gen", "aten", "--allowlist", allowlist,
               "--namespace", namespace, "--out", out, "--quiet"]
    if not tests:
        command.append("--no-tests")
    if not build:
        command.append("--no-build")
    cpu, wall = children_cpu(), time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return children_cpu() - cpu, time.perf_counter() - wall


def bench_build(args) -> None:
    print(f"(a) generate + compile, {args.allowlist and os.path.basename(args.allowlist)}")
    rows = []
    for tests in (False, True):
        out = os.path.join(args.out, "with_tests" if tests else "no_tests")
        shutil.rmtree(out, ignore_errors=True)
        cpu, wall = timed_generate(args.allowlist, out, args.namespace, tests)
        rows.append(("generate + compile" + (" + test inputs" if tests else ""), cpu, wall))
    out = os.path.join(args.out, "no_tests")
    cpu, wall = timed_generate(args.allowlist, out, args.namespace, tests=False)
    rows.append(("identical regeneration (no rebuild)", cpu, wall))
    gen_cpu, gen_wall = timed_generate(args.allowlist, os.path.join(args.out, "sources_only"), args.namespace,
                                       tests=False, build=False)
    rows.append(("generate only (no compile, no tests)", gen_cpu, gen_wall))
    for label, cpu, wall in rows:
        print(f"    {label:<40} {cpu:8.1f} CPU-s {wall:8.1f} s wall")
    budget = (2330 + 100) / 10
    print(f"    budget: <= {budget:.0f} CPU-s (1/10 of a peer's ~2,330 s compile + ~100 s generation)")
    if args.calibrate:
        print(f"    one <torch/torch.h> translation unit here: {calibrate():.1f} CPU-s")


def calibrate() -> float:
    """CPU-seconds to compile one TU that includes <torch/torch.h>, the unit
    a per-op build pays for each op."""
    from opforge.gen._build import torch_flags

    import torch

    cflags, _ = torch_flags()
    root = os.path.dirname(torch.__file__)
    cflags += ["-isystem", os.path.join(root, "include", "torch", "csrc", "api", "include")]
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "one_op.cc")
        with open(source, "w") as f:
            f.write("#include <torch/torch.h>\n"
                    "at::Tensor& AbsOut(const at::Tensor& self, at::Tensor& out) { return at::abs_out(out, self); }\n")
        cpu = children_cpu()
        subprocess.run(["c++"] + cflags + ["-c", source, "-o", os.path.join(tmp, "one_op.o")], check=True)
        return children_cpu() - cpu


def medians_us(fns, calls: int, repeats: int) -> list[float]:
    """Median µs per call of each function; repeats alternate between the
    functions so that drift in the machine's speed hits them alike."""
    for fn in fns:
        for _ in range(calls // 4):
            fn()
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[i].append((time.perf_counter() - start) / calls * 1e6)
    return [statistics.median(s) for s in samples]


def bench_overhead(args) -> None:
    import torch

    library = os.path.join(args.out, "no_tests", "build", f"lib{args.namespace}_ops.so")
    if not os.path.exists(library):
        out = os.path.join(args.out, "overhead")
        subprocess.run([sys.executable, "-m", "opforge.cli", "gen", "aten", "--allowlist", args.allowlist,
                        "--namespace", args.namespace, "--out", out, "--no-tests", "--quiet"], check=True,
                       stdout=subprocess.DEVNULL)
        library = os.path.join(out, "build", f"lib{args.namespace}_ops.so")
    torch.ops.load_library(library)
    ns = getattr(torch.ops, args.namespace)
    torch.set_num_threads(1)
    a, b, o = torch.randn(4), torch.randn(4), torch.empty(4)
    m1, m2, mo = torch.randn(4, 4), torch.randn(4, 4), torch.empty(4, 4)
    cases = [
        ("abs out=", lambda: ns.abs.default(a, out=o), lambda: torch.ops.aten.abs.out(a, out=o),
         lambda: torch.abs(a, out=o)),
        ("sub out= (2 tensors, alpha)", lambda: ns.sub.default(a, b, alpha=2, out=o),
         lambda: torch.ops.aten.sub.out(a, b, alpha=2, out=o), lambda: torch.sub(a, b, alpha=2, out=o)),
        ("addmm out= (3 tensors, 2 scalars)", lambda: ns.addmm.default(m1, m1, m2, beta=1, alpha=1, out=mo),
         lambda: torch.ops.aten.addmm.out(m1, m1, m2, beta=1, alpha=1, out=mo),
         lambda: torch.addmm(m1, m1, m2, beta=1, alpha=1, out=mo)),
        ("add_ in place", lambda: ns.add_.default(o, b), lambda: torch.ops.aten.add_.Tensor(o, b),
         lambda: o.add_(b)),
    ]
    print(f"(b) per-call overhead, µs per call (median of {args.repeats} x {args.calls} calls, "
          f"torch {torch.__version__}, 1 thread)")
    print(f"    {'op':<36} {'generated':>9} {'aten ops':>9} {'ratio':>6} {'torch.*':>8} {'ratio':>6}")
    for label, generated, via_ops, via_api in cases:
        g, r, p = medians_us([generated, via_ops, via_api], args.calls, args.repeats)
        print(f"    {label:<36} {g:9.2f} {r:9.2f} {g / r:5.2f}x {p:8.2f} {g / p:5.2f}x")


CPP_BENCH = r"""
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <chrono>
#include <string>

namespace {

// Nanoseconds per call of `name.overload(a, out=out)`, called `calls` times.
double TimeUnaryOut(std::string name, std::string overload, at::Tensor a, at::Tensor out,
                    bool typed, int64_t calls) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  auto typed_op = op.typed<at::Tensor&(const at::Tensor&, at::Tensor&)>();
  torch::jit::Stack stack;
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) {
    if (typed) {
      typed_op.call(a, out);
    } else {
      stack.clear();
      stack.emplace_back(a);
      stack.emplace_back(out);
      op.callBoxed(&stack);
    }
  }
  std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / static_cast<double>(calls);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opforge_bench, m) {
  m.def("time_unary_out(str name, str overload, Tensor a, Tensor out, bool typed, int calls) -> float",
        TimeUnaryOut);
}
"""


def bench_cpp(args, namespace: str) -> None:
    import torch

    from opforge.gen._build import build

    out = os.path.join(args.out, "cpp_bench")
    os.makedirs(out, exist_ok=True)
    source = os.path.join(out, "bench_calls.cc")
    from opforge.gen._io import write_if_changed

    write_if_changed(source, CPP_BENCH)
    result = build([source], out, "opforge_bench_calls")
    torch.ops.load_library(result.library)
    time_calls = torch.ops.opforge_bench.time_unary_out
    a, o = torch.randn(4), torch.empty(4)
    print(f"(c) from C++, ns per call of abs(a, out=o), median of {args.repeats} x {args.calls * 10} calls")
    for typed in (False, True):
        rows = {"generated": [], "aten": []}
        for _ in range(args.repeats):
            rows["generated"].append(time_calls(f"{namespace}::abs", "", a, o, typed, args.calls * 10))
            rows["aten"].append(time_calls("aten::abs", "out", a, o, typed, args.calls * 10))
        g, r = statistics.median(rows["generated"]), statistics.median(rows["aten"])
        how = "typed (unboxed) call" if typed else "boxed call"
        print(f"    {how:<22} generated {g:7.0f} ns   aten {r:7.0f} ns   ratio {g / r:4.2f}x   (+{g - r:.0f} ns)")


def bench_header(args) -> None:
    """(d): what including NS_ops.h costs a C++ caller's translation unit."""
    import re

    from opforge.gen._build import torch_flags

    out = os.path.join(args.out, "header")
    timed_generate(args.allowlist, out, args.namespace, tests=False, build=False)
    header = os.path.join(out, f"{args.namespace}_ops.h")
    with open(header, encoding="utf-8") as f:
        text = f.read()
    names = re.findall(r"^inline .*? (\w+)\(", text, flags=re.M)
    prelude = text[text.index("#pragma once") + len("#pragma once"):text.index("namespace opforge_gen")]
    uses = "".join(f"    reinterpret_cast<const void*>(&{args.namespace}::{n}),\n" for n in names)
    units = [
        ("the header's includes only", prelude + "int main() { return 0; }\n"),
        (f"#include \"{os.path.basename(header)}\"", f'#include "{header}"\nint main() {{ return 0; }}\n'),
        (f"the header, all {len(names)} functions used",
         f'#include "{header}"\nconst void* kUsed[] = {{\n{uses}}};\nint main() {{ return kUsed[0] != nullptr; }}\n'),
    ]
    cflags, _ = torch_flags()
    print(f"(d) compile cost of {os.path.basename(header)} ({len(names)} typed functions), "
          f"CPU-s of one translation unit (-O2)")
    with tempfile.TemporaryDirectory() as tmp:
        for label, source in units:
            path = os.path.join(tmp, "unit.cc")
            with open(path, "w") as f:
                f.write(source)
            cpu, wall = children_cpu(), time.perf_counter()
            subprocess.run(["c++"] + cflags + ["-c", path, "-o", os.path.join(tmp, "unit.o")], check=True)
            print(f"    {label:<44} {children_cpu() - cpu:6.1f} CPU-s {time.perf_counter() - wall:6.1f} s wall")
    if args.calibrate:
        print(f"    one <torch/torch.h> translation unit, for scale: {calibrate():.1f} CPU-s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allowlist", default=DEFAULT_ALLOWLIST)
    parser.add_argument("--namespace", default="benchaten")
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "bench_gen"))
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--skip-build", action="store_true", help="only the per-call overhead")
    parser.add_argument("--calibrate", action="store_true", help="also time one <torch/torch.h> TU")
    parser.add_argument("--header", action="store_true", help="only the compile cost of NS_ops.h")
    args = parser.parse_args()
    if args.header:
        bench_header(args)
        return 0
    if not args.skip_build:
        bench_build(args)
    bench_overhead(args)
    bench_cpp(args, args.namespace)
    bench_header(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
