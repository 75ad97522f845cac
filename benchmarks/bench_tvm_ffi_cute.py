"""A CuTe DSL kernel compiled with --enable-tvm-ffi, called directly and as an
opforge op (docs/tvm_ffi.md#cute-dsl): host µs per call, alternating pairs,
median of pair ratios with quartiles (budget: the op from Python with a
struct <= 1.0x the direct call).

    python benchmarks/bench_tvm_ffi_cute.py [--pairs 41] [--calls 2000] [--n 1000]

Needs a CUDA GPU, apache-tvm-ffi and nvidia-cutlass-dsl.
"""


import argparse
import dataclasses
import gc
import os
import statistics
import sys

import torch
from torch import Tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_tvm_ffi import _burst, _quartiles  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Shift:
    value: float = 1.0


def build():
    import cutlass.cute as cute

    @cute.kernel
    def add_kernel(a: cute.Tensor, b: cute.Tensor, c: cute.Float32):
        cta, _, _ = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        i = cta * 128 + tid
        if i < a.shape[0]:
            b[i] = a[i] + c

    @cute.jit
    def add(a: cute.Tensor, b: cute.Tensor, c: cute.Float32, stream):
        n = a.shape[0]
        add_kernel(a, b, c).launch(grid=((n + 127) // 128, 1, 1), block=(128, 1, 1), stream=stream)

    n = cute.sym_int()
    fake_a = cute.runtime.make_fake_compact_tensor(cute.Float32, (n,))
    fake_b = cute.runtime.make_fake_compact_tensor(cute.Float32, (n,))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(add, fake_a, fake_b, cute.Float32(0.0), stream, options="--enable-tvm-ffi")


def measure(pairs: int = 41, calls: int = 2000, n: int = 1000) -> dict:
    import opforge

    compiled = build()

    @opforge.op("bench_cute::add", mutates_args=("out",), kernel={"cuda": compiled})
    def add(x: Tensor, out: Tensor, shift: Shift) -> None: ...

    @torch.library.custom_op("bench_cute::add_custom", mutates_args=("out",))
    def add_custom(x: Tensor, out: Tensor, value: float) -> None:
        compiled(x, out, value)

    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    shift = Shift(2.5)
    compiled(x, out, 2.5)
    torch.testing.assert_close(out, x + 2.5)
    out.zero_()
    add(x, out, shift)
    torch.testing.assert_close(out, x + 2.5)
    rows = {
        "direct": "compiled(x, out, 2.5)",
        "opforge": "add(x, out, shift)",
        "opforge (struct built in call)": "add(x, out, Shift(2.5))",
        "opforge torch.ops": "flat(x, out, 2.5)",
        "custom_op": "add_custom(x, out, 2.5)",
    }
    scope = {"compiled": compiled, "add": add, "shift": shift, "Shift": Shift, "flat": torch.ops.bench_cute.add,
             "add_custom": add_custom}
    # _burst's statement sees (out, x, w): w is unused here.
    bursts = {row: _burst(stmt, scope, torch.cuda.synchronize) for row, stmt in rows.items()}
    tensors = (out, x, None)
    for b in bursts.values():
        b(50, tensors)
    samples = {row: ([], []) for row in rows if row != "direct"}
    gc.disable()
    try:
        for p in range(pairs):
            for row in samples:
                mine, theirs = samples[row]
                if p % 2 == 0:
                    mine.append(bursts[row](calls, tensors) / calls)
                    theirs.append(bursts["direct"](calls, tensors) / calls)
                else:
                    theirs.append(bursts["direct"](calls, tensors) / calls)
                    mine.append(bursts[row](calls, tensors) / calls)
    finally:
        gc.enable()
    direct = [ns for _, theirs in samples.values() for ns in theirs]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "n": n, "pairs": pairs,
              "calls": calls, "rows": [{"row": "direct", "us": statistics.median(direct) / 1e3}]}
    for row, (mine, theirs) in samples.items():
        q1, ratio, q3 = _quartiles([a / b for a, b in zip(mine, theirs)])
        report["rows"].append({"row": row, "us": statistics.median(mine) / 1e3, "ratio": ratio, "q1": q1, "q3": q3})
    return report


def render(report: dict) -> str:
    lines = [f"### CuTe DSL kernel ({report['n']} floats), {report['device']}, torch {report['torch']}; "
             f"{report['pairs']} pairs of bursts of {report['calls']} calls", "",
             "| row | host µs per call | / direct (median [q1, q3]) |", "|---|---:|---|"]
    for r in report["rows"]:
        ratio = "reference" if "ratio" not in r else f"{r['ratio']:.3f}x [{r['q1']:.3f}, {r['q3']:.3f}]"
        lines.append(f"| {r['row']} | {r['us']:.3f} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=41)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_tvm_ffi_cute needs a CUDA GPU.", file=sys.stderr)
        return 1
    print(render(measure(args.pairs, args.calls, args.n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
