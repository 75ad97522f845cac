"""Liger-Kernel's ops ported to opforge against Liger's own autograd.Functions,
eager, with inputs that require grad (docs/performance.md, "Liger-Kernel
ports on the GPU host"). Needs a CUDA GPU and liger-kernel.

    python benchmarks/bench_liger.py [--dtypes float32,bfloat16] [--sizes small,large]
                                     [--repeats 101] [--ops rms_norm,rope_] [--profile]

The ports are tests/gpu/liger_ports.py: one `@opforge.op` per Liger
Function, calling Liger's forward and backward helpers unchanged. A row
compares the two doing the same device work: `rms_norm` with dX written to
a new tensor on both sides (Liger's `in_place=False`), `rms_norm, dX over
dY` with Liger's default on both sides, `swiglu, da db over a b` (and
geglu) with the port's `in_place=True`, which hands Liger's backward helper
the saved inputs to overwrite as Liger's Function does, `rope_` (the port
that rotates q and k in place as Liger's Function does, and says so) with
both sides given q and k made by one multiplication per call (an in-place
op needs inputs that are not leaves). Rows marked "copies" show the ports'
defaults, which give Liger's helpers copies of what they overwrite
(SwiGLU's and GeGLU's saved inputs in backward, RoPE's q and k): that row
times the copies too, and the budget does not apply to it.

Sizes (tests/gpu/liger_inputs.py): `small` has [4, 512] rows for the
norms, GLUs and softmax, `large` is bench_liger_compiled.py's default size
([4096, 4096] and [4096, 8192], Llama's attention shapes for rope), where
one kernel takes 20-140 µs; on the H100 host the host's per-call work
(Liger's Python and Triton's launcher, about 100 µs a forward) still
decides most rows. Each sample times N calls between two CUDA events (N chosen for ~5 ms); samples
alternate which side runs first, with the garbage collector paused; a
ratio is the median of the ratios of back-to-back pairs, with their first
and third quartiles in brackets. The last row times Liger's RMSNorm
Function against itself: the spread the host's noise alone gives.
Budget: opforge / Liger <= 1.0x for forward and for forward + backward, on
the rows doing the same work. `--profile` adds, per op at the small size, the
Python functions that take the most time in 200 forward + backward calls of
each side (cProfile), and, at the large size, the CUDA kernels each side
launches per call (torch.profiler).
"""

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
from dataclasses import dataclass
from typing import Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "gpu"))

from liger_inputs import as_tuple, forward_backward, fresh, output_grads  # noqa: E402


@dataclass
class Row:
    name: str
    port: Callable
    liger: Callable
    inputs: Callable  # (dtype, size) -> tuple of tensors (liger_inputs)
    same_work: bool = True  # False: the port copies what Liger's Function overwrites (not budgeted)


def rows():
    import liger_ports as P
    from liger_inputs import glu_inputs, norm_inputs, rope_inputs, softmax_inputs
    from liger_kernel.ops import geglu as liger_geglu
    from liger_kernel.ops import layer_norm as liger_ln
    from liger_kernel.ops import rms_norm as liger_rms
    from liger_kernel.ops import rope as liger_rope
    from liger_kernel.ops import softmax as liger_softmax
    from liger_kernel.ops import swiglu as liger_swiglu

    def on_non_leaves(rope):
        """rope given q and k made per call: an in-place op needs inputs that are not leaves."""
        return lambda q, k, cos, sin: rope(q * 1, k * 1, cos, sin)

    def norm(dtype, size):
        return norm_inputs(dtype, size, False)

    def norm_bias(dtype, size):
        return norm_inputs(dtype, size, True)

    rms = liger_rms.LigerRMSNormFunction.apply
    swiglu, geglu = liger_swiglu.LigerSiLUMulFunction.apply, liger_geglu.LigerGELUMulFunction.apply
    return [
        Row("rms_norm", lambda X, W: P.rms_norm(X, W), lambda X, W: rms(X, W, 1e-6, 0.0, "llama", False), norm),
        Row("rms_norm, dX over dY", lambda X, W: P.rms_norm(X, W, in_place=True), lambda X, W: rms(X, W, 1e-6),
            norm),
        Row("layer_norm", P.layer_norm, lambda X, W, B: liger_ln.LigerLayerNormFunction.apply(X, W, B, 1e-6),
            norm_bias),
        Row("swiglu, da db over a b", lambda a, b: P.swiglu(a, b, in_place=True), swiglu, glu_inputs),
        Row("swiglu, copies", P.swiglu, swiglu, glu_inputs, same_work=False),
        Row("geglu, da db over a b", lambda a, b: P.geglu(a, b, in_place=True), geglu, glu_inputs),
        Row("geglu, copies", P.geglu, geglu, glu_inputs, same_work=False),
        Row("rope_", on_non_leaves(P.rope_), on_non_leaves(liger_rope.LigerRopeFunction.apply), rope_inputs),
        Row("rope, copies", P.rope, liger_rope.LigerRopeFunction.apply, rope_inputs, same_work=False),
        Row("softmax", P.softmax, liger_softmax.LigerSoftmaxFunction.apply, softmax_inputs),
        # The noise floor: Liger's Function against itself.
        Row("control, Liger / Liger", lambda X, W: rms(X, W, 1e-6), lambda X, W: rms(X, W, 1e-6), norm,
            same_work=False),
    ]


class Runner:
    """forward() and forward_backward() of one side over fixed inputs."""

    def __init__(self, fn, inputs):
        self.fn = fn
        self.args = fresh(inputs)
        self.leaves = [a for a in self.args if a.requires_grad]
        self.grads = output_grads(as_tuple(fn(*self.args)))

    def forward(self):
        self.fn(*self.args)

    def forward_backward(self):
        torch.autograd.backward(as_tuple(self.fn(*self.args)), self.grads)
        for a in self.leaves:
            a.grad = None


def time_per_call(fn, number):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(number):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / number * 1000.0


def compare(mine, theirs, repeats):
    """(median µs mine, median µs theirs, median of pair ratios, (first, third) quartile of them)."""
    for _ in range(3):
        mine(), theirs()
    probe = time_per_call(theirs, 5)
    number = max(3, min(2000, int(5_000 / max(probe, 1.0))))
    a, b = [], []
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection would fall on one side of a pair
    try:
        for i in range(repeats):
            if i % 2:
                b.append(time_per_call(theirs, number))
                a.append(time_per_call(mine, number))
            else:
                a.append(time_per_call(mine, number))
                b.append(time_per_call(theirs, number))
    finally:
        if gc_was_enabled:
            gc.enable()
    ratios = [x / y for x, y in zip(a, b)]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return statistics.median(a), statistics.median(b), statistics.median(ratios), (q1, q3)


def same_values(row, inputs):
    """The port's outputs and input gradients equal Liger's, bit for bit."""
    mine, theirs = (forward_backward(fn, inputs) for fn in (row.port, row.liger))
    flat_mine, flat_theirs = mine[0] + mine[1], theirs[0] + theirs[1]
    return len(flat_mine) == len(flat_theirs) and all(torch.equal(x, y) for x, y in zip(flat_mine, flat_theirs))


def profile(row, inputs, size):
    if size == "small":
        for label, fn in (("opforge", row.port), ("Liger", row.liger)):
            r = Runner(fn, inputs)
            r.forward_backward()
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                r.forward_backward()
            torch.cuda.synchronize()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
            text = out.getvalue()
            body = text[text.find("ncalls"):] if "ncalls" in text else text
            print(f"\n-- {row.name}, {label}, 200 x forward+backward, by own time:\n{body.rstrip()}")
    else:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        for label, fn in (("opforge", row.port), ("Liger", row.liger)):
            r = Runner(fn, inputs)
            r.forward_backward()
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(4):
                    r.forward_backward()
                torch.cuda.synchronize()
            kernels = sorted((e.key, e.count // 4, e.device_time_total / 4) for e in p.key_averages()
                             if e.device_time_total > 0)
            listed = "; ".join(f"{k[:60]} x{c} {t:.1f} µs" for k, c, t in kernels)
            print(f"-- {row.name}, {label}, CUDA kernels per forward+backward: {listed}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument("--ops", default="", help="comma-separated op names, e.g. rms_norm,rope_ (default: all)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_liger: needs a CUDA GPU")
        return 2
    import triton

    wanted = [o for o in args.ops.split(",") if o]
    table = [r for r in rows() if not wanted or r.name in wanted or r.name.split(",")[0] in wanted]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    sizes = args.sizes.split(",")

    print(f"Liger-Kernel ports / Liger's Functions, eager, inputs require grad, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, triton {triton.__version__}; median of {args.repeats} samples in "
          f"alternating order, µs per call; ratio: median of pair ratios")
    print("| op | dtype | size | fwd Liger | fwd opforge | fwd ratio | fwd+bwd Liger | fwd+bwd opforge | "
          "fwd+bwd ratio | same values |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst, failed = 0.0, False
    for row in table:
        for dtype in dtypes:
            for size in sizes:
                torch.manual_seed(0)
                inputs = row.inputs(dtype, size)
                equal = same_values(row, inputs)
                mine, theirs = Runner(row.port, inputs), Runner(row.liger, inputs)
                f = compare(mine.forward, theirs.forward, args.repeats)
                fb = compare(mine.forward_backward, theirs.forward_backward, args.repeats)
                if row.same_work:
                    worst = max(worst, f[2], fb[2])
                    failed |= not equal
                print(f"| {row.name} | {str(dtype)[6:]} | {size} | {f[1]:.1f} | {f[0]:.1f} | {f[2]:.3f}x "
                      f"({f[3][0]:.2f}-{f[3][1]:.2f}) | {fb[1]:.1f} | {fb[0]:.1f} | {fb[2]:.3f}x "
                      f"({fb[3][0]:.2f}-{fb[3][1]:.2f}) | {'yes' if equal else 'NO'} |", flush=True)
                if args.profile and dtype == dtypes[-1]:
                    profile(row, inputs, size)
                del inputs, mine, theirs
                torch.cuda.empty_cache()
    print(f"worst ratio of the rows doing the same work {worst:.3f}x; budget <= 1.0x: "
          f"{'met' if worst <= 1.0 else 'NOT met'}{'; some values DIFFER' if failed else ''}")
    return 0 if worst <= 1.0 and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
