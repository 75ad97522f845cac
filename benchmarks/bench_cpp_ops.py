"""C++ struct op vs the same op with a flat schema (SPEC §9, budget <= 1.05x).

    python benchmarks/bench_cpp_ops.py [--build-dir build/bench_cpp]

Builds benchmarks/cpp against the installed opforge CMake package, runs the
C++ timing (calls through the dispatcher from C++), then times the same two
ops from Python in this process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch

import opforge

HERE = os.path.dirname(os.path.abspath(__file__))


def build(build_dir: str) -> str:
    os.makedirs(build_dir, exist_ok=True)
    print(f"building benchmarks/cpp in {build_dir} ...", file=sys.stderr, flush=True)
    subprocess.run(
        ["cmake", "-S", os.path.join(HERE, "cpp"), "-B", build_dir, "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={opforge.cmake_prefix_path}", f"-DPython_EXECUTABLE={sys.executable}",
         "-DCMAKE_BUILD_TYPE=Release"],
        check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build_dir], check=True, stdout=subprocess.DEVNULL)
    return build_dir


def median_us(fn, calls=20000, repeats=9) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(times)[repeats // 2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=os.path.join("build", "bench_cpp"))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    build_dir = build(args.build_dir)
    subprocess.run([os.path.join(build_dir, "bench_struct_ops")], check=True)

    torch.ops.load_library(os.path.join(build_dir, "libopforge_bench_ops.so"))
    x = torch.ones(4, device=args.device)
    flat = torch.ops.opforge_bench.flat.default
    structured = torch.ops.opforge_bench.structured.default
    Cfg = opforge.structs.opforge_bench.Cfg
    wrapper = opforge.ops.opforge_bench.structured
    cfg = Cfg(2.0, True, 3)
    for fn in (lambda: flat(x, x, 2.0, True, 3), lambda: structured(x, x, 2.0, True, 3), lambda: wrapper(x, x, cfg)):
        median_us(fn, calls=2000, repeats=1)
    f = median_us(lambda: flat(x, x, 2.0, True, 3))
    s = median_us(lambda: structured(x, x, 2.0, True, 3))
    w = median_us(lambda: wrapper(x, x, cfg))
    print(f"Python through the dispatcher ({args.device} tensors)")
    print(f"  flat TORCH_LIBRARY op                 {f:7.3f} us")
    print(f"  opforge struct op, flat call          {s:7.3f} us   ratio {s / f:.3f} (budget <= 1.05)")
    print(f"  opforge.ops wrapper with a dataclass  {w:7.3f} us   ratio {w / f:.3f} (adds the Python flatten)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
