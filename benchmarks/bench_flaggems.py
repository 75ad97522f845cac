"""FlagGems' ops as opforge ops against FlagGems' own calls, eager
(docs/triton.md, "Kernels found where they are launched"). Needs a CUDA GPU
and flag-gems (with sqlalchemy, which it imports).

    python benchmarks/bench_flaggems.py [--dtypes bfloat16,float32] [--repeats 101] [--ops rms_norm,add]

The ports are tests/gpu/flaggems_ports.py: one `@opforge.op` per op, each
calling FlagGems' function unchanged. A row times the port's call against
FlagGems' own on the same inputs, [4, 512] rows, where the host's per-call
work decides the time; the last row times rms_norm forward + backward with
an input that requires grad, the port's backward= against FlagGems' RmsNorm
Function. Timing as benchmarks/bench_liger.py: N calls between two CUDA
events per sample, samples in alternating order, medians in µs per call; a
ratio is the median of the ratios of back-to-back pairs, with their first
and third quartiles in brackets. Budget: opforge / FlagGems <= 1.05x for
each op's forward (the backward row has none); the exit status is 1 when a
row misses it.
"""

import argparse
import importlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "gpu"))

from bench_liger import compare  # noqa: E402

BUDGET = 1.05


def forward_backward_row(dtype):
    """(opforge, FlagGems) rms_norm forward + .backward(dy), the input requiring grad."""
    from flaggems_ports import EPS, inputs_for, rms_norm

    gems_rms_norm = importlib.import_module("flag_gems.ops.rms_norm")  # flag_gems.ops hides the module
    x, w = inputs_for("rms_norm", dtype, "bench")
    xg, dy = x.clone().requires_grad_(), torch.randn_like(x)
    return (lambda: rms_norm(xg, w, EPS)[0].backward(dy),
            lambda: gems_rms_norm.rms_norm(xg, [xg.shape[-1]], w, EPS).backward(dy))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument("--ops", default="", help="comma-separated op names, e.g. rms_norm,add (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_flaggems: needs a CUDA GPU")
        return 2
    import triton

    from flaggems_ports import PAIRS, inputs_for

    wanted = [o for o in args.ops.split(",") if o]
    names = [n for n in PAIRS if not wanted or n in wanted]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]

    print(f"FlagGems ports / FlagGems' own calls, eager, [4, 512] rows, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, triton {triton.__version__}; median of {args.repeats} samples in "
          f"alternating order, µs per call; ratio: median of pair ratios")
    print(f"| op | dtype | FlagGems | opforge | ratio | budget <= {BUDGET}x |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for dtype in dtypes:
        for name in names:
            pair = PAIRS[name]
            inputs = inputs_for(name, dtype, "bench")
            mine, theirs, ratio, (q1, q3) = compare(lambda: pair.port(*inputs), lambda: pair.gems(*inputs),
                                                    args.repeats)
            worst = max(worst, ratio)
            print(f"| {name} | {str(dtype)[6:]} | {theirs:.1f} | {mine:.1f} | {ratio:.3f}x ({q1:.2f}-{q3:.2f}) | "
                  f"{'met' if ratio <= BUDGET else 'NOT met'} |", flush=True)
        if not wanted or "rms_norm" in wanted:
            mine, theirs, ratio, (q1, q3) = compare(*forward_backward_row(dtype), args.repeats)
            print(f"| rms_norm forward+backward, input requires grad (FlagGems' RmsNorm Function) | "
                  f"{str(dtype)[6:]} | {theirs:.1f} | {mine:.1f} | {ratio:.3f}x ({q1:.2f}-{q3:.2f}) | - |", flush=True)
    print(f"worst forward ratio {worst:.3f}x; budget <= {BUDGET}x: {'met' if worst <= BUDGET else 'NOT met'}")
    return 0 if worst <= BUDGET else 1


if __name__ == "__main__":
    sys.exit(main())
