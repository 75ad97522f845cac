"""Eager per-call cost of a Triton op: the same forward, backward and
setup_context as a Triton op and as an opaque op (triton="off").

    python benchmarks/bench_triton_eager.py [--repeats 15] [--device cpu|cuda]

The functions are written as Liger-Kernel's are: a forward helper and a
backward helper that launch a kernel, and a setup_context. On CPU the
helpers take a torch path instead of launching (a stub launch: Triton cannot
launch there); on CUDA they launch the kernel. A Triton op runs the user's
functions unchanged when called eagerly, so its cost per call should be the
opaque op's: the budget is <= 1.05x for each row. Times are medians of
repeats in alternating order, µs per call; the ratio is the median of the
ratios of back-to-back pairs.
"""

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import timeit

import torch
import triton  # noqa: F401

import opforge

HELPERS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)


def scale(x, factor):
    out = torch.empty_like(x)
    if x.is_cuda:
        scale_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), factor, BLOCK=128)
    else:
        torch.mul(x, factor, out=out)  # the stub launch
    return out


def body(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return scale(x, 2.0)


def setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def backward(ctx, grad):
    return scale(grad, 2.0), None
'''


def load_helpers():
    root = tempfile.mkdtemp(prefix="opforge-bench-eager-")
    path = os.path.join(root, "bench_eager_helpers.py")
    with open(path, "w") as f:
        f.write(HELPERS)
    spec = importlib.util.spec_from_file_location("bench_eager_helpers", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument("--number", type=int, default=200, help="calls per timed repeat")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    m = load_helpers()
    options = dict(backward=m.backward, setup_context=m.setup_context)
    triton_op = opforge.op("bench_eager::triton_op", **options)(m.body)
    opaque_op = opforge.op("bench_eager::opaque_op", triton="off", fake=lambda x, w: torch.empty_like(x),
                           **options)(m.body)
    assert triton_op.triton_kernels == (m.scale_kernel,) and opaque_op.triton_kernels == ()

    x = torch.randn(4096, device=args.device)
    w = torch.randn(4096, device=args.device)
    xg = x.clone().requires_grad_()
    rows = {
        "forward, no grad": (lambda: triton_op(x, w), lambda: opaque_op(x, w)),
        "forward, input requires grad": (lambda: triton_op(xg, w), lambda: opaque_op(xg, w)),
        "forward + backward": (lambda: triton_op(xg, w).sum().backward(),
                               lambda: opaque_op(xg, w).sum().backward()),
    }
    body_time = []

    def timed(fn) -> float:
        sync()
        t = timeit.timeit(fn, number=args.number)
        sync()
        return t / args.number * 1e6

    results = {}
    for label, (t_fn, o_fn) in rows.items():
        t_fn(), o_fn()
        samples_t, samples_o = [], []
        for i in range(args.repeats):
            # Alternate which goes first: the second of a pair runs warmer.
            if i % 2:
                samples_o.append(timed(o_fn))
                samples_t.append(timed(t_fn))
            else:
                samples_t.append(timed(t_fn))
                samples_o.append(timed(o_fn))
            if label == "forward, no grad":
                body_time.append(timed(lambda: m.body(x, w)))
        # The ratio of each back-to-back pair: a shared machine's slow spells cancel out.
        ratio = statistics.median(a / b for a, b in zip(samples_t, samples_o))
        results[label] = (statistics.median(samples_t), statistics.median(samples_o), ratio)

    print(f"Triton op vs the same op with triton='off', eager, {args.device.upper()}, torch {torch.__version__}, "
          f"median of {args.repeats} repeats in alternating order, µs per call")
    print(f"{'':32}{'Triton op':>12}{'opaque op':>12}{'ratio':>9}  (median of pair ratios)")
    failed = False
    for label, (t, o, ratio) in results.items():
        failed |= ratio > 1.05
        print(f"{label:32}{t:12.2f}{o:12.2f}{ratio:8.3f}x   budget <= 1.05x: {'met' if ratio <= 1.05 else 'NOT met'}")
    print(f"{'plain Python call of the body':32}{statistics.median(body_time):12.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
