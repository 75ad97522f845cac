"""From C++: an OPFORGE_LIBRARY op whose kernel is a TVM-FFI function
(docs/tvm_ffi.md#c-libraries), called with its struct through
opforge::Call, against the function's direct call from C++ (DLTensors built
by hand, the exported __tvm_ffi_<name> called): ns per call, median of
alternating pair ratios with quartiles.

    python benchmarks/bench_tvm_ffi_cpp.py [--pairs 41] [--build-dir build/bench_tvm_ffi_cpp]
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def build(build_dir: str) -> str:
    import opforge
    import tvm_ffi.libinfo

    for step in (["cmake", "-S", os.path.join(HERE, "tvm_ffi_cpp"), "-B", build_dir, "-G", "Ninja",
                  f"-DCMAKE_PREFIX_PATH={opforge.cmake_prefix_path}", f"-DPython_EXECUTABLE={sys.executable}",
                  f"-DTVM_FFI_INCLUDE={tvm_ffi.libinfo.find_include_path()}",
                  f"-DTVM_FFI_LIB={tvm_ffi.libinfo.find_libtvm_ffi()}"],
                 ["cmake", "--build", build_dir]):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stdout + done.stderr)
    return build_dir


def measure(build_dir: str, pairs: int) -> list[dict]:
    out = subprocess.run([os.path.join(build_dir, "bench_ffi_call"), os.path.join(build_dir, "libopforge_test_tvm_ffi.so"),
                          os.path.join(build_dir, "libffi_module.so"), str(pairs)],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        kernel, size, way, direct, op, q1, median, q3 = line.split()
        rows.append({"kernel": kernel, "size": size, "way": way, "direct_ns": float(direct), "op_ns": float(op),
                     "ratio": float(median), "q1": float(q1), "q3": float(q3)})
    return rows


def render(rows: list[dict]) -> str:
    lines = ["| kernel | size | the op through | direct call, ns | the op, ns | ratio (median [q1, q3]) |",
             "|---|---|---|---:|---:|---|"]
    for r in rows:
        way = "opforge::Call" if r["way"] == "Call" else "opforge::OpRef"
        lines.append(f"| {r['kernel']} | {r['size']} | {way} | {r['direct_ns']:.1f} | {r['op_ns']:.1f} | "
                     f"{r['ratio']:.3f}x [{r['q1']:.3f}, {r['q3']:.3f}] |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=41)
    parser.add_argument("--build-dir", default=os.path.join("build", "bench_tvm_ffi_cpp"))
    args = parser.parse_args(argv)
    print("building the benchmark library", file=sys.stderr)
    print(render(measure(build(args.build_dir), args.pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
