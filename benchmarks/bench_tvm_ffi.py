"""TVM-FFI functions as opforge kernels (docs/tvm_ffi.md): the cost of calling
one through an opforge op, against calling it directly and against the ways
torch offers of wrapping it.

    python benchmarks/bench_tvm_ffi.py [--device cpu|cuda] [--pairs 41] [--calls 2000] [--json FILE]

One C++ source, built with tvm_ffi.cpp.load_inline (with cuda_sources for
--device cuda), holds two functions of one signature:

    void rms_norm(TensorView out, TensorView x, TensorView w, double eps, bool add_one)
    void noop(...)      # the same parameters, no work: the call's overhead alone

Each is called six ways, on [4, 128] ("small") and [256, 4096] ("large")
float32 tensors, with eps=1e-6, add_one=True:

    raw                               mod.rms_norm(out, x, w, 1e-6, True)
    opforge                           op(out, x, w, cfg)       an op with kernel=mod.rms_norm, cfg built once
    opforge (struct built in call)    op(out, x, w, NormCfg(1e-6, True))
    opforge torch.ops                 torch.ops.<ns>.rms_norm(out, x, w, 1e-6, True)
    define+impl                       Library.define of the flat schema, a Python
                                      CompositeExplicitAutograd kernel calling mod.rms_norm
    custom_op                         torch.library.custom_op(mutates_args=("out",)) calling mod.rms_norm
    opforge body                      @opforge.op with a Python body calling mod.rms_norm

Each row is timed against its reference: `opforge torch.ops` against
`define+impl` (budget <= 1.0x), every other row against `raw`. A pair times
a burst of --calls calls of each side (fewer where a burst would run past
MAX_BURST_S: the large rms_norm on a CPU), in alternating order; the ratio is
the median of --pairs pairs' ratios, with the first and third quartiles;
µs are the median per call over a row's bursts (raw's pooled over all its
pairs). With --device cuda the device is synchronized before and after each
burst. Before any timing, every row's output of the real kernel must match
raw's and a torch reference.

    >>> report = measure("cpu", pairs=3, calls=20)
    >>> print(render(report))        # the markdown table
"""

import argparse
import dataclasses
import gc
import itertools
import json
import platform
import statistics
import sys
import time

import torch
from torch import Tensor

try:
    import tvm_ffi
    import tvm_ffi.cpp
except ImportError:
    tvm_ffi = None

import opforge

EPS = 1e-6
ADD_ONE = True
SIZES = {"small": (4, 128), "large": (256, 4096)}
KERNELS = ("noop", "rms_norm")
RAW = "raw"
DEFINE_IMPL = "define+impl"
# Row -> its reference row (None: the reference of the others).
ROWS = {
    RAW: None,
    "opforge": RAW,
    "opforge (struct built in call)": RAW,
    "opforge torch.ops": DEFINE_IMPL,
    DEFINE_IMPL: RAW,
    "custom_op": RAW,
    "opforge body": RAW,
}
# The one budget (docs/tvm_ffi.md): torch.ops of a TVM-FFI kernel op costs no
# more than a Python kernel of the same schema that calls the function.
BUDGET = ("opforge torch.ops", 1.0)
# A burst longer than this gets fewer calls: the large CPU rms_norm takes a
# millisecond or so a call, and 2000 of them per burst would make the run an hour.
MAX_BURST_S = 0.1
SCHEMA = "(Tensor(a!) out, Tensor x, Tensor w, float eps, bool add_one) -> ()"
_run_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class NormCfg:
    eps: float = 1e-6
    add_one: bool = False


_CHECKS = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <cstdint>

namespace {
// out, x: [rows, hidden]; w: [hidden]; float32, contiguous, on `device_type`.
void CheckArgs(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView w, int device_type) {
  TVM_FFI_ICHECK_EQ(x.ndim(), 2) << "x must be 2-D";
  TVM_FFI_ICHECK_EQ(out.ndim(), 2) << "out must be 2-D";
  TVM_FFI_ICHECK_EQ(w.ndim(), 1) << "w must be 1-D";
  for (const tvm::ffi::TensorView* t : {&out, &x, &w}) {
    TVM_FFI_ICHECK(t->dtype().code == kDLFloat && t->dtype().bits == 32 && t->dtype().lanes == 1)
        << "rms_norm takes float32 tensors";
    TVM_FFI_ICHECK(t->IsContiguous()) << "rms_norm takes contiguous tensors";
    TVM_FFI_ICHECK_EQ(t->device().device_type, device_type) << "a tensor is on the wrong device";
  }
  TVM_FFI_ICHECK(out.size(0) == x.size(0) && out.size(1) == x.size(1)) << "out and x differ in shape";
  TVM_FFI_ICHECK_EQ(w.size(0), x.size(1)) << "w must have x's last size";
}
}  // namespace
"""

CPU_SOURCE = _CHECKS + r"""
#include <cmath>

void rms_norm(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView w, double eps,
              bool add_one) {
  CheckArgs(out, x, w, kDLCPU);
  const int64_t rows = x.size(0), hidden = x.size(1);
  const float* xp = static_cast<const float*>(x.data_ptr());
  const float* wp = static_cast<const float*>(w.data_ptr());
  float* op = static_cast<float*>(out.data_ptr());
  const float shift = add_one ? 1.0f : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xp + r * hidden;
    float sum = 0.0f;
    for (int64_t i = 0; i < hidden; ++i) sum += row[i] * row[i];
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(hidden) + static_cast<float>(eps));
    for (int64_t i = 0; i < hidden; ++i) op[r * hidden + i] = row[i] * scale * (wp[i] + shift);
  }
}

void noop(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView w, double eps, bool add_one) {}
"""

CUDA_SOURCE = _CHECKS + r"""
#include <cuda_runtime.h>
#include <tvm/ffi/extra/c_env_api.h>

constexpr int kThreads = 256;

// One block per row: each thread sums the squares of a strided slice, the
// block reduces them in shared memory, then every thread writes its slice.
__global__ void RmsNormKernel(float* out, const float* x, const float* w, int64_t hidden, float eps, float shift) {
  __shared__ float partial[kThreads];
  const float* row = x + blockIdx.x * hidden;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) sum += row[i] * row[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / static_cast<float>(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    out[blockIdx.x * hidden + i] = row[i] * scale * (w[i] + shift);
}

void rms_norm(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView w, double eps,
              bool add_one) {
  CheckArgs(out, x, w, kDLCUDA);
  const int64_t rows = x.size(0), hidden = x.size(1);
  if (rows == 0) return;
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, x.device().device_id));
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      static_cast<float*>(out.data_ptr()), static_cast<const float*>(x.data_ptr()),
      static_cast<const float*>(w.data_ptr()), hidden, static_cast<float>(eps), add_one ? 1.0f : 0.0f);
  const cudaError_t err = cudaGetLastError();
  TVM_FFI_ICHECK_EQ(err, cudaSuccess) << "RmsNormKernel launch failed: " << cudaGetErrorString(err);
}

void noop(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView w, double eps, bool add_one) {}
"""


def build(device: str):
    """The TVM-FFI module of rms_norm and noop for `device` ("cpu" or "cuda");
    load_inline caches the library, so only the first run compiles."""
    if device == "cuda":
        return tvm_ffi.cpp.load_inline("opforge_bench_tvm_ffi_cuda", cuda_sources=CUDA_SOURCE,
                                       functions=list(KERNELS))
    return tvm_ffi.cpp.load_inline("opforge_bench_tvm_ffi", cpp_sources=CPU_SOURCE, functions=list(KERNELS))


def reference(x: Tensor, w: Tensor) -> Tensor:
    """RMSNorm in torch, as the kernel computes it with add_one (a Gemma-style weight)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (w + float(ADD_ONE))


def _functions(raw):
    """The Python functions of each way of calling `raw`, made here so that
    each closes over its own kernel."""

    def kernel_op(out: Tensor, x: Tensor, w: Tensor, cfg: NormCfg) -> None:
        """The signature only: kernel= is the body."""

    def flat(out: Tensor, x: Tensor, w: Tensor, eps: float, add_one: bool) -> None:
        raw(out, x, w, eps, add_one)

    def body(out: Tensor, x: Tensor, w: Tensor, cfg: NormCfg) -> None:
        raw(out, x, w, cfg.eps, cfg.add_one)

    return kernel_op, flat, body


def define_ops(mod, tag: str) -> dict:
    """{kernel: (statements, scope)}: statements maps each row to the call it
    times, run with `scope` as globals and out, x, w as locals. The ops live
    in namespaces of their own; `tag` keeps a second measure() in one
    process from meeting the first's."""
    ns = f"bench_ffi{tag}"
    libs = []
    ways = {}
    for name in KERNELS:
        raw = getattr(mod, name)
        kernel_op, flat, body = _functions(raw)
        op = opforge.op(f"{ns}::{name}", mutates_args=("out",), kernel=raw)(kernel_op)
        body_op = opforge.op(f"{ns}_body::{name}", mutates_args=("out",))(body)
        lib = torch.library.Library(f"{ns}_def", "FRAGMENT")
        lib.define(name + SCHEMA)
        lib.impl(name, flat, "CompositeExplicitAutograd")
        libs.append(lib)
        cop = torch.library.custom_op(f"{ns}_cop::{name}", mutates_args=("out",))(_functions(raw)[1])
        scope = {"torch": torch, "NormCfg": NormCfg, "raw": raw, "op": op, "body_op": body_op, "cop": cop,
                 "cfg": NormCfg(EPS, ADD_ONE), "_libs": libs}
        # Literal scalars in every statement, so that no row pays a lookup the others do not.
        args = f"out, x, w, {EPS!r}, {ADD_ONE!r}"
        statements = {
            RAW: f"raw({args})",
            "opforge": "op(out, x, w, cfg)",
            "opforge (struct built in call)": f"op(out, x, w, NormCfg({EPS!r}, {ADD_ONE!r}))",
            "opforge torch.ops": f"torch.ops.{ns}.{name}({args})",
            DEFINE_IMPL: f"torch.ops.{ns}_def.{name}({args})",
            "custom_op": f"cop({args})",
            "opforge body": "body_op(out, x, w, cfg)",
        }
        ways[name] = (statements, scope)
    return ways


def check_equal(ways: dict, device: str) -> None:
    """Every row of the real kernel writes what raw writes, and raw what torch
    computes; an AssertionError naming the row otherwise."""
    statements, scope = ways["rms_norm"]
    for size, shape in SIZES.items():
        g = torch.Generator().manual_seed(1)
        x = torch.randn(*shape, generator=g).to(device)
        w = torch.randn(shape[1], generator=g).to(device)
        outs = {}
        for row, stmt in statements.items():
            out = torch.full(shape, float("nan"), device=device)
            eval(stmt, scope, {"out": out, "x": x, "w": w})  # noqa: S307
            outs[row] = out
        try:
            torch.testing.assert_close(outs[RAW], reference(x, w), rtol=1e-4, atol=1e-4)
        except AssertionError as e:
            raise AssertionError(f"rms_norm ({size}, {device}): the raw TVM-FFI kernel differs from torch's "
                                 f"RMSNorm:\n{e}") from None
        for row, out in outs.items():
            try:
                torch.testing.assert_close(out, outs[RAW], rtol=0, atol=0)
            except AssertionError as e:
                raise AssertionError(f"rms_norm ({size}, {device}): the {row!r} row's output differs from the "
                                     f"raw call's:\n{e}") from None


def _burst(stmt: str, scope: dict, sync):
    """A function timing `n` executions of `stmt` in ns, the device synchronized
    before and after; compiled, so the loop adds no call of its own."""
    src = (f"def burst(n, out, x, w, sync, clock):\n"
           f"    sync()\n"
           f"    start = clock()\n"
           f"    for _ in range(n):\n"
           f"        {stmt}\n"
           f"    sync()\n"
           f"    return clock() - start\n")
    local = dict(scope)
    exec(compile(src, "<bench_tvm_ffi>", "exec", dont_inherit=True), local)  # noqa: S102
    fn = local["burst"]
    return lambda n, t: fn(n, *t, sync, time.perf_counter_ns)


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, statistics.median(values), q3


def measure_cell(statements: dict, scope: dict, tensors: tuple, sync, pairs: int, calls: int,
                 max_burst_s: float) -> list[dict]:
    """One size and kernel: every row against its reference, the pairs of
    all rows interleaved so that drift on the machine falls on all alike."""
    bursts = {row: _burst(stmt, scope, sync) for row, stmt in statements.items()}
    compared = [row for row, ref in ROWS.items() if ref is not None]
    counts = {}
    for row in compared:
        ref = ROWS[row]
        probe = max(1, min(calls, 20))
        per_call = max(bursts[row](probe, tensors), bursts[ref](probe, tensors)) / probe  # warms up too
        counts[row] = max(1, min(calls, int(max_burst_s * 1e9 / max(per_call, 1.0))))
    samples = {row: ([], []) for row in compared}  # row -> (its ns per call, its reference's)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for p in range(pairs):
            for row in compared:
                n, mine, theirs = counts[row], *samples[row]
                if p % 2 == 0:
                    mine.append(bursts[row](n, tensors) / n)
                    theirs.append(bursts[ROWS[row]](n, tensors) / n)
                else:
                    theirs.append(bursts[ROWS[row]](n, tensors) / n)
                    mine.append(bursts[row](n, tensors) / n)
    finally:
        if gc_was_enabled:
            gc.enable()
    raw_ns = [ns for row in compared if ROWS[row] == RAW for ns in samples[row][1]]
    results = [{"row": RAW, "us": statistics.median(raw_ns) / 1e3, "reference": None, "ratio": None,
                "q1": None, "q3": None, "calls": min(counts[r] for r in compared if ROWS[r] == RAW)}]
    for row in compared:
        mine, theirs = samples[row]
        q1, ratio, q3 = _quartiles([a / b for a, b in zip(mine, theirs)])
        results.append({"row": row, "us": statistics.median(mine) / 1e3, "reference": ROWS[row], "ratio": ratio,
                        "q1": q1, "q3": q3, "calls": counts[row]})
    return results


def measure(device: str = "cpu", pairs: int = 41, calls: int = 2000, max_burst_s: float = MAX_BURST_S) -> dict:
    """Builds the kernels, checks every row's output, times every row; the report:

        {"device": "cpu", "pairs": 41, "calls": 2000, ...,
         "rows": [{"size": "small", "shape": [4, 128], "kernel": "noop", "row": "raw", "us": 0.31,
                   "reference": None, "ratio": None, "q1": None, "q3": None, "calls": 2000},
                  {..., "row": "opforge", "reference": "raw", "ratio": 1.42, "q1": 1.40, "q3": 1.45}, ...]}
    """
    if tvm_ffi is None:
        raise ImportError("bench_tvm_ffi needs TVM-FFI: pip install apache-tvm-ffi")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda needs torch with CUDA and a GPU, and none is available")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ways = define_ops(build(device), f"{next(_run_ids) or ''}")
    check_equal(ways, device)
    rows = []
    for size, shape in SIZES.items():
        print(f"  measuring {size} {list(shape)} on {device} ...", file=sys.stderr, flush=True)
        g = torch.Generator().manual_seed(0)
        tensors = (torch.empty(*shape, device=device), torch.randn(*shape, generator=g).to(device),
                   torch.randn(shape[1], generator=g).to(device))
        for kernel in KERNELS:
            statements, scope = ways[kernel]
            for cell in measure_cell(statements, scope, tensors, sync, pairs, calls, max_burst_s):
                rows.append({"size": size, "shape": list(shape), "kernel": kernel, **cell})
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "tvm_ffi": getattr(tvm_ffi, "__version__", "?"),
        "opforge": getattr(opforge, "__version__", "?"),
        "python": platform.python_version(),
        "pairs": pairs,
        "calls": calls,
        "max_burst_s": max_burst_s,
        "rows": rows,
    }


def render(report: dict) -> str:
    """The report as a markdown table, then the budget's verdict per cell."""
    device = report["device"]
    where = f"{report['threads']} threads" if device == "cpu" else report["device_name"]
    lines = [
        f"### TVM-FFI kernels, {device.upper()}: torch {report['torch']}, tvm_ffi {report['tvm_ffi']}, "
        f"Python {report['python']}, {where}; {report['pairs']} pairs of bursts of up to {report['calls']} "
        f"calls (fewer where a burst would pass {report['max_burst_s'] * 1e3:g} ms)",
        "",
        "| size | kernel | row | µs per call | vs | ratio (median [q1, q3]) |",
        "|---|---|---|---:|---|---|",
    ]
    verdicts = []
    for r in report["rows"]:
        size = f"{r['size']} {r['shape'][0]}x{r['shape'][1]}"
        if r["ratio"] is None:
            ratio, vs = "reference", ""
        else:
            ratio, vs = f"{r['ratio']:.3f}x [{r['q1']:.3f}, {r['q3']:.3f}]", r["reference"]
        calls = f" ({r['calls']} calls)" if r["calls"] < report["calls"] else ""
        lines.append(f"| {size} | {r['kernel']} | {r['row']}{calls} | {r['us']:.3f} | {vs} | {ratio} |")
        if r["row"] == BUDGET[0]:
            ok = "met" if r["ratio"] <= BUDGET[1] else "NOT met"
            verdicts.append(f"{r['size']} {r['kernel']} {r['ratio']:.3f}x {ok}")
    lines += ["", f"Budget: {BUDGET[0]} / {DEFINE_IMPL} <= {BUDGET[1]:g}x: " + "; ".join(verdicts) + "."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--pairs", type=int, default=41, help="pairs of bursts per row (default 41)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per burst, at most (default 2000)")
    parser.add_argument("--json", metavar="FILE", help="also write the report to FILE")
    args = parser.parse_args(argv)
    if tvm_ffi is None:
        print("bench_tvm_ffi needs TVM-FFI, which is not installed: pip install apache-tvm-ffi.", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs torch with CUDA and a GPU, and none is available")
    if args.pairs < 1 or args.calls < 1:
        parser.error("--pairs and --calls must be at least 1")
    report = measure(args.device, args.pairs, args.calls)
    print(render(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
