"""Breakable CUDA graphs (docs/cuda_graphs.md): what a step of a 32-layer
model costs eagerly, replayed by opforge's BreakableGraph, replayed by a
capture with vLLM's protocol where the tagged op's Python kernel carries
vLLM's decorator, and as one full CUDA graph of the model with the tagged op
left out (the floor); what one eager break costs at replay against the op's
raw kernel call; and the capture's time. GPU only.

    python benchmarks/bench_cuda_graphs.py [--kind cpp|python] [--no-vllm] [--pairs 21] [--steps 200] [--json FILE]

Every layer: affine (Python op), rms_norm (C++ op), tadd (Triton op) and
one op tagged cudagraph_unsafe that scales by a host value read at each call:
the example library's kernels::scale_by_host (--kind cpp) or a Python body
(--kind python). For vLLM's protocol, the same kernel is the Python kernel
of an untagged op of torch.library (Library.define + impl, as vLLM's
direct_register_custom_op makes it), decorated as vLLM's
@eager_break_during_capture does: at capture, the break records
`lambda: fn(*args)`.

A step is timed as a burst of --steps steps with the device synchronized
before and after; ratios are medians of --pairs alternating pairs. A break's
replay host cost is a burst of calls of one recorded break against a burst
of the raw kernel call on the same tensors (the C++ kernel's raw call is
torch.ops' OpOverload; a Python body's is the body itself).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, os.pardir, "tests", "gpu"), os.path.join(HERE, os.pardir, "tests", "python")]

GOALS = {
    "break replay / raw kernel call": 1.1,
    "break replay / vLLM-protocol break replay": 0.5,
    "breakable replay / (floor + 32 raw break calls)": 1.1,
}


def burst(fn, n, sync=True):
    if sync:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if sync:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def pairs(a, b, n, calls):
    """Median ratio a/b over n alternating pairs, and the medians of each side (seconds per call)."""
    ta, tb, ratios = [], [], []
    for i in range(n):
        if i % 2:
            y, x = burst(b, calls), burst(a, calls)
        else:
            x, y = burst(a, calls), burst(b, calls)
        ta.append(x)
        tb.append(y)
        ratios.append(x / y)
    return statistics.median(ratios), statistics.median(ta), statistics.median(tb)


def vllm_style_op(kind):
    """The tagged kernel as vLLM registers one: an untagged torch.library op
    whose Python kernel has vLLM's decorator."""
    import cuda_graph_models as models

    lib = torch.library.Library("cg_bench_vllm", "FRAGMENT")
    lib.define("scale(Tensor(a!) out, Tensor x, Tensor host_scale) -> ()")
    if kind == "cpp":
        raw = torch.ops.kernels.scale_by_host.default

        def kernel(out, x, host_scale):
            raw(out, x, host_scale)
    else:
        kernel = models.scale_py.__wrapped__
    lib.impl("scale", models.eager_break_during_capture(kernel), "CUDA")
    return lib, torch.ops.cg_bench_vllm.scale.default


def measure(kind="cpp", n_pairs=21, steps=200, calls=2000, vllm=True):
    import opforge
    from opforge import cuda_graphs

    import cuda_graph_models as models

    report = {"kind": kind, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": {}}
    model = models.Model(kind)
    x = torch.randn(8, 256, device="cuda")
    expected = model(x)

    capture = None
    if vllm:
        # vLLM's protocol with the decorated Python kernel.
        lib, vllm_op = vllm_style_op(kind)
        vllm_model = models.Model(kind)
        vllm_model.op = vllm_op
        vllm_model(x)  # warm-up
        torch.cuda.synchronize()
        capture = models.ProtocolCapture(pool=torch.cuda.graph_pool_handle())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        t0 = time.perf_counter()
        with torch.cuda.stream(stream), capture:
            vout = vllm_model(x)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        report["capture_vllm_s"] = time.perf_counter() - t0
        capture.replay()
        torch.cuda.synchronize()
        assert torch.equal(vout, expected), "vLLM-protocol replay differs from eager"
        assert capture.num_eager_breaks == models.LAYERS

    # opforge's breakable capture.
    graph = cuda_graphs.BreakableGraph()
    t0 = time.perf_counter()
    out = graph.capture(model, x)
    torch.cuda.synchronize()
    report["capture_s"] = time.perf_counter() - t0
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected), "breakable replay differs from eager"

    # The floor: one CUDA graph of the model without the tagged op.
    floor_model = models.Model(kind, tagged=False)
    floor_model(x)
    torch.cuda.synchronize()
    full = torch.cuda.CUDAGraph()
    with torch.cuda.graph(full):
        floor_model(x)

    step_eager = lambda: model(x)  # noqa: E731
    rows = report["rows"]
    steps_timed = [("eager", step_eager), ("opforge breakable replay", graph.replay),
                   ("floor: one full graph", full.replay)]
    if capture is not None:
        steps_timed.insert(2, ("vLLM-protocol replay", capture.replay))
    for name, fn in steps_timed:
        burst(fn, 10)
        rows[name] = statistics.median(burst(fn, steps) for _ in range(n_pairs)) * 1e6

    # One break: the recorded call against the raw kernel call.
    ours = graph._segments[1]
    theirs = capture.segments[1] if capture is not None else None
    assert type(ours).__name__ == "CapturedCall"
    bx, bout, bhost = torch.randn(8, 256, device="cuda"), torch.empty(8, 256, device="cuda"), torch.tensor([1.5])
    if kind == "cpp":
        raw_op = torch.ops.kernels.scale_by_host.default
        raw = lambda: raw_op(bout, bx, bhost)  # noqa: E731
    else:
        body = models.scale_py.__wrapped__
        raw = lambda: body(bout, bx, bhost)  # noqa: E731
    op = model.op
    eager_call = lambda: op(bout, bx, bhost)  # noqa: E731
    for fn in (ours, raw, eager_call) + ((theirs,) if theirs is not None else ()):
        burst(fn, 100)
    r_raw, t_ours, t_raw = pairs(ours, raw, n_pairs, calls)
    r_vllm, t_vllm = (pairs(ours, theirs, n_pairs, calls)[::2]) if theirs is not None else (None, None)
    _, t_eager, _ = pairs(eager_call, raw, max(3, n_pairs // 3), calls)
    rows["break replay (us)"] = t_ours * 1e6
    rows["raw kernel call (us)"] = t_raw * 1e6
    if t_vllm is not None:
        rows["vLLM-protocol break replay (us)"] = t_vllm * 1e6
    rows["eager call of the tagged op (us)"] = t_eager * 1e6
    floor_plus = rows["floor: one full graph"] + models.LAYERS * t_raw * 1e6
    report["ratios"] = {
        "break replay / raw kernel call": r_raw,
        "breakable replay / (floor + 32 raw break calls)": rows["opforge breakable replay"] / floor_plus,
        "eager / opforge breakable replay": rows["eager"] / rows["opforge breakable replay"],
    }
    if capture is not None:
        report["ratios"]["break replay / vLLM-protocol break replay"] = r_vllm
        report["ratios"]["vLLM-protocol replay / opforge breakable replay"] = (
            rows["vLLM-protocol replay"] / rows["opforge breakable replay"])
    graph.release()
    
    return report


def render(report) -> str:
    lines = [f"## Breakable CUDA graphs, tagged op: {report['kind']} ({report['device']}, torch {report['torch']})", "",
             "| per step / per call | us |", "|---|---|"]
    for name, us in report["rows"].items():
        lines.append(f"| {name} | {us:.2f} |")
    vllm_capture = report.get("capture_vllm_s")
    lines += ["", f"capture: opforge {report['capture_s'] * 1e3:.1f} ms" +
              (f", vLLM protocol {vllm_capture * 1e3:.1f} ms" if vllm_capture is not None else ""), "",
              "| ratio | value | goal |", "|---|---|---|"]
    for name, value in report["ratios"].items():
        goal = GOALS.get(name)
        verdict = "" if goal is None else f"<= {goal}x {'met' if value <= goal else 'NOT met'}"
        lines.append(f"| {name} | {value:.3f}x | {verdict} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("cpp", "python"), action="append")
    parser.add_argument("--pairs", type=int, default=21)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--no-vllm", action="store_true", help="leave out the vLLM-protocol rows")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_cuda_graphs.py needs a CUDA GPU.")
    reports = [measure(k, args.pairs, args.steps, args.calls, not args.no_vllm) for k in (args.kind or ["cpp", "python"])]
    for r in reports:
        print(render(r))
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=2)


if __name__ == "__main__":
    main()
