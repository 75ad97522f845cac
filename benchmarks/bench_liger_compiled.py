"""Liger-Kernel's ops and their opforge ports under torch.compile: each side
eager and compiled with Inductor, forward and forward + backward, and the
graph breaks torch.compile takes in Liger's Functions (docs/triton.md,
"Ports of a Triton library"). Needs a CUDA GPU and liger-kernel.

    python benchmarks/bench_liger_compiled.py [--dtypes bfloat16] [--sizes large] [--repeats 21]
                                              [--ops rms_norm,rope]

The ports are tests/gpu/liger_ports.py, compiled with fullgraph=True;
Liger's Functions are compiled without it, so torch.compile breaks the graph
where it cannot trace them (the count is printed), and a Function it cannot
compile at all shows "fails" with the reason under the table. Sizes as
tests/gpu/liger_inputs.py (`large`: [4096, 4096] rows, Llama's attention
shapes for rope; cross_entropy has no `small` inputs and skips it).
Timing as benchmarks/bench_liger.py: N calls between two CUDA events per
sample, the four callables of a row in rotating order, medians in µs per
call. No budget: the table shows what compiling gives each side; the exit
status is 1 only when a port fails to run eagerly or to compile with
fullgraph=True, which its tests (tests/gpu/test_liger.py) check at their
own size.
"""

import argparse
import logging
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "gpu"))

from bench_liger import Runner, time_per_call  # noqa: E402


def rows():
    """{name: (port, Liger's Function, inputs)}: the ops tests/gpu/test_liger.py compiles."""
    import liger_ports as P
    from liger_inputs import ce_inputs, glu_inputs, norm_inputs, rope_inputs, softmax_inputs
    from liger_kernel.ops import geglu as liger_geglu
    from liger_kernel.ops import layer_norm as liger_ln
    from liger_kernel.ops import rms_norm as liger_rms
    from liger_kernel.ops import rope as liger_rope
    from liger_kernel.ops import softmax as liger_softmax
    from liger_kernel.ops import swiglu as liger_swiglu

    return {
        "rms_norm": (lambda X, W: P.rms_norm(X, W), lambda X, W: liger_rms.LigerRMSNormFunction.apply(X, W, 1e-6),
                     lambda d, s: norm_inputs(d, s, False)),
        "layer_norm": (lambda X, W, B: P.layer_norm(X, W, B),
                       lambda X, W, B: liger_ln.LigerLayerNormFunction.apply(X, W, B, 1e-6),
                       lambda d, s: norm_inputs(d, s, True)),
        "swiglu": (P.swiglu, liger_swiglu.LigerSiLUMulFunction.apply, glu_inputs),
        "geglu": (P.geglu, liger_geglu.LigerGELUMulFunction.apply, glu_inputs),
        "rope": (lambda q, k, cos, sin: P.rope(q, k, cos, sin),
                 lambda q, k, cos, sin: liger_rope.LigerRopeFunction.apply(q, k, cos, sin), rope_inputs),
        "softmax": (P.softmax, liger_softmax.LigerSoftmaxFunction.apply, softmax_inputs),
        "cross_entropy": (P.cross_entropy, P.liger_cross_entropy, ce_inputs),
    }


def runner(fn, inputs):
    """A Runner (one call made, compiling a compiled fn), or why it failed, in one line: the
    innermost error (torch.compile wraps the one it met), its first and last lines."""
    try:
        return Runner(fn, inputs)
    except Exception as e:  # noqa: BLE001 - reported under the table
        while getattr(e, "inner_exception", None) is not None or e.__cause__ is not None:
            e = getattr(e, "inner_exception", None) or e.__cause__
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [""]
        return f"{type(e).__name__}: {lines[0][:120]}" + (f" ... {lines[-1][:160]}" if len(lines) > 1 else "")


def medians(runners: dict, what: str, repeats: int) -> dict:
    """Median µs per call of `what` ('forward' or 'forward_backward') of each runner, in rotating order."""
    fns = {k: getattr(r, what) for k, r in runners.items() if isinstance(r, Runner)}
    keys = list(fns)
    if not keys:
        return {}
    probe = time_per_call(fns[keys[0]], 3)
    number = max(3, min(2000, int(5_000 / max(probe, 1.0))))
    samples = {k: [] for k in keys}
    for i in range(repeats):
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            samples[k].append(time_per_call(fns[k], number))
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--sizes", default="large")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--ops", default="", help="comma-separated op names, e.g. rms_norm,rope (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_liger_compiled: needs a CUDA GPU")
        return 2
    import triton

    # torch logs a whole traceback when its analysis of a Liger kernel fails; the table says "fails".
    logging.getLogger("torch._higher_order_ops.triton_kernel_wrap").addFilter(lambda record: False)
    wanted = [o for o in args.ops.split(",") if o]
    table = {n: r for n, r in rows().items() if not wanted or n in wanted}
    sides = ("Liger", "Liger+compile", "opforge", "opforge+compile")
    print(f"Liger-Kernel ports and Liger's Functions, eager and compiled (Inductor), inputs require grad, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; median of "
          f"{args.repeats} samples in rotating order, µs per call")
    print("| op | dtype | size | timed | " + " | ".join(sides) + " | opforge+compile / Liger+compile | "
          "graph breaks (Liger) |")
    print("|" + "---|" * (len(sides) + 6))
    failed, notes, ratios = [], [], []
    for name, (port, liger, make_inputs) in table.items():
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            for size in args.sizes.split(","):
                torch.manual_seed(0)
                try:
                    inputs = make_inputs(dtype, size)
                except KeyError:
                    continue  # no inputs of this size for this op
                torch._dynamo.reset()
                torch._dynamo.utils.counters.clear()
                runners = {"Liger": runner(liger, inputs), "Liger+compile": runner(torch.compile(liger), inputs)}
                breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
                runners["opforge"] = runner(port, inputs)
                runners["opforge+compile"] = runner(torch.compile(port, fullgraph=True), inputs)
                for side, runner_or_error in runners.items():
                    if not isinstance(runner_or_error, Runner):
                        line = f"{name} {str(dtype)[6:]} {size} {side}: {runner_or_error}"
                        (failed if side.startswith("opforge") else notes).append(line)
                for what, label in (("forward", "fwd"), ("forward_backward", "fwd+bwd")):
                    t = medians(runners, what, args.repeats)
                    cells = [f"{t[s]:.1f}" if s in t else "fails" for s in sides]
                    ratio = "-"
                    if "opforge+compile" in t and "Liger+compile" in t:
                        r = t["opforge+compile"] / t["Liger+compile"]
                        ratio = f"{r:.3f}x"
                        if what == "forward_backward":
                            ratios.append(r)
                    print(f"| {name} | {str(dtype)[6:]} | {size} | {label} | " + " | ".join(cells) +
                          f" | {ratio} | {breaks} |", flush=True)
                del inputs, runners
                torch.cuda.empty_cache()
    if ratios:
        print(f"opforge+compile / Liger+compile, forward+backward: geometric mean "
              f"{statistics.geometric_mean(ratios):.3f}x")
    for line in notes:
        print(f"fails: {line}")
    for line in failed:
        print(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
