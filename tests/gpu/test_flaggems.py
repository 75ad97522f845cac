"""FlagGems' ops as opforge ops, on a CUDA GPU, FlagGems unchanged
(docs/triton.md, "Kernels found where they are launched"): one `@opforge.op`
per op, each calling FlagGems' own function.

    pip install --no-deps .whl/flag_gems-*.whl .whl/sqlalchemy-*.whl    # or: make gpu-test
    python -m pytest tests/gpu/test_flaggems.py -v -s

FlagGems launches its kernels through its own launchers: `@libentry()` (a
`triton.KernelInterface` holding the kernel at `.fn`), `@libtuner` (an
Autotuner subclass), and `@pointwise_dynamic`, which generates the launching
code and the kernel per tensor rank at run time and imports them. Per op:
eager values equal FlagGems' own call and a torch reference;
torch.compile(fullgraph=True) with Inductor has no graph break, the graph
Inductor compiles holds FlagGems' kernels as triton_kernel_wrapper_functional
nodes (no opaque op), and its values equal eager. `rms_norm` and
`silu_and_mul` also have a backward= that calls FlagGems' backward.
`test_timings` prints each op's eager time per call next to FlagGems' own
call (budget <= 1.05x).
"""

import os
import statistics
import time

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
triton = pytest.importorskip("triton")
# FlagGems finds its vendor by running each vendor's query tool; name it.
os.environ.setdefault("GEMS_VENDOR", "nvidia")
pytest.importorskip("flag_gems", reason="needs flag-gems (pip install --no-deps .whl/flag_gems-*.whl "
                                        ".whl/sqlalchemy-*.whl)")

import importlib  # noqa: E402

import torch.nn.functional as F  # noqa: E402
from flag_gems.fused.silu_and_mul import SiluAndMul, silu_and_mul_grad_kernel, silu_and_mul_kernel  # noqa: E402
from flag_gems.ops.add import add as gems_add  # noqa: E402
from flag_gems.ops.add import add_func  # noqa: E402
from flag_gems.ops.layernorm import layer_norm as gems_layer_norm  # noqa: E402
from flag_gems.ops.rms_norm import rms_norm_backward, rms_norm_forward  # noqa: E402
from flag_gems.ops.softmax import softmax as gems_softmax  # noqa: E402

# flag_gems.ops binds the names rms_norm and softmax to functions, hiding these modules.
gems_rms_norm = importlib.import_module("flag_gems.ops.rms_norm")
gems_layernorm = importlib.import_module("flag_gems.ops.layernorm")
gems_softmax_module = importlib.import_module("flag_gems.ops.softmax")

import opforge  # noqa: E402
from triton_testing import RecordingInductor, jit_function  # noqa: E402

Tensor = torch.Tensor
DEV = "cuda"
EPS = 1e-6


# --- the ports: one @opforge.op per FlagGems op ---------------------------------------------------


def rms_norm_setup_context(ctx, inputs, output):
    x, w, eps = inputs
    ctx.save_for_backward(x, w, output[1])
    ctx.eps = eps


def rms_norm_backward_fn(ctx, dy, _d_inv_rms):
    x, w, inv_rms = ctx.saved_tensors
    dx, dw = rms_norm_backward(dy, x, inv_rms, [x.shape[-1]], w, ctx.eps)
    return dx, dw, None


@opforge.op("gems::rms_norm", setup_context=rms_norm_setup_context, backward=rms_norm_backward_fn)
def rms_norm(x: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return rms_norm_forward(x, [x.shape[-1]], w, eps)


@opforge.op("gems::layer_norm")
def layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return gems_layer_norm(x, [x.shape[-1]], w, b, eps)


@opforge.op("gems::softmax")
def softmax(x: Tensor, dim: int) -> Tensor:
    return gems_softmax(x, dim)


def silu_and_mul_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def silu_and_mul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    return silu_and_mul_grad_kernel(a, b, grad)


@opforge.op("gems::silu_and_mul", setup_context=silu_and_mul_setup_context, backward=silu_and_mul_backward)
def silu_and_mul(a: Tensor, b: Tensor) -> Tensor:
    return silu_and_mul_kernel(a, b)


@opforge.op("gems::add")
def add(a: Tensor, b: Tensor) -> Tensor:
    return gems_add(a, b)


def generated_kernel(function, rank: int):
    """The @triton.jit kernel FlagGems generated for a @pointwise_dynamic function and a task rank."""
    wrapper = function.instantiate(rank)
    launcher = wrapper.__globals__[wrapper.__name__.replace("_wrapper_rank_", "_kernel_rank_")]
    return jit_function(launcher)


def leaf(*shape, dtype):
    return torch.randn(*shape, device=DEV, dtype=dtype)


class Case:
    def __init__(self, op, port, gems, reference, inputs, kernels):
        self.op = op
        self.port = port  # (*inputs) -> tuple of tensors, through the opforge op
        self.gems = gems  # the same through FlagGems' own function
        self.reference = reference  # the same in torch
        self.inputs = inputs  # (dtype, size) -> tuple of tensors
        self.kernels = kernels  # () -> FlagGems' @triton.jit kernels the forward graph launches


def norm_inputs(dtype, size, bias=False):
    rows, cols = (256, 1024) if size == "test" else (4, 512)
    x = leaf(rows, cols, dtype=dtype)
    w = (torch.rand(cols, device=DEV) + 0.5).to(dtype)
    return (x, w, leaf(cols, dtype=dtype)) if bias else (x, w)


def pair_inputs(dtype, size):
    shape = (256, 1024) if size == "test" else (4, 512)
    return leaf(*shape, dtype=dtype), leaf(*shape, dtype=dtype)


CASES = {
    "rms_norm": Case(
        rms_norm, lambda x, w: rms_norm(x, w, EPS)[:1], lambda x, w: rms_norm_forward(x, [x.shape[-1]], w, EPS)[:1],
        lambda x, w: (F.rms_norm(x.float(), [x.shape[-1]], w.float(), EPS),), norm_inputs,
        lambda: [jit_function(gems_rms_norm.rms_norm_kernel)]),
    "layer_norm": Case(
        layer_norm, lambda x, w, b: layer_norm(x, w, b, 1e-5)[:1],
        lambda x, w, b: gems_layer_norm(x, [x.shape[-1]], w, b, 1e-5)[:1],
        lambda x, w, b: (F.layer_norm(x.float(), [x.shape[-1]], w.float(), b.float(), 1e-5),),
        lambda d, s: norm_inputs(d, s, bias=True), lambda: [jit_function(gems_layernorm.layer_norm_persistent_kernel)]),
    "softmax": Case(
        softmax, lambda x: (softmax(x, -1),), lambda x: (gems_softmax(x, -1),), lambda x: (torch.softmax(x.float(), -1),),
        lambda d, s: pair_inputs(d, s)[:1],
        lambda: [jit_function(gems_softmax_module.softmax_kernel_inner)]),
    "silu_and_mul": Case(
        silu_and_mul, lambda a, b: (silu_and_mul(a, b),), lambda a, b: (silu_and_mul_kernel(a, b),),
        lambda a, b: (F.silu(a.float()) * b.float(),), pair_inputs, lambda: [generated_kernel(silu_and_mul_kernel, 1)]),
    "add": Case(
        add, lambda a, b: (add(a, b),), lambda a, b: (gems_add(a, b),), lambda a, b: (a.float() + b.float(),),
        pair_inputs, lambda: [generated_kernel(add_func, 1)]),
}
NAMES = list(CASES)
DTYPES = [torch.float32, torch.bfloat16]


def inputs_for(name, dtype, size="test"):
    torch.manual_seed(0)
    return CASES[name].inputs(dtype, size)


def tolerance(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.fixture(autouse=True)
def _fresh(fresh_compile):
    """Every test here inspects the graphs of a compile of its own."""


# --- eager -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_eager_values_equal_flaggems_and_torch(name, dtype):
    case = CASES[name]
    inputs = inputs_for(name, dtype)
    mine, theirs, reference = case.port(*inputs), case.gems(*inputs), case.reference(*inputs)
    for a, b, r in zip(mine, theirs, reference):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same kernels on the same inputs
        torch.testing.assert_close(a.float(), r, **tolerance(dtype))


def gradients(fn, inputs, dy):
    leaves = [t.clone().requires_grad_() for t in inputs]
    fn(*leaves).backward(dy)
    return [t.grad for t in leaves]


def test_rms_norm_gradients_equal_flaggems_function_and_torch():
    inputs = inputs_for("rms_norm", torch.float32)
    torch.manual_seed(1)
    dy = torch.randn_like(inputs[0])
    mine = gradients(lambda x, w: rms_norm(x, w, EPS)[0], inputs, dy)
    theirs = gradients(lambda x, w: gems_rms_norm.rms_norm(x, [x.shape[-1]], w, EPS), inputs, dy)  # RmsNorm Function
    reference = gradients(lambda x, w: F.rms_norm(x, [x.shape[-1]], w, EPS), inputs, dy)
    for a, b, r in zip(mine, theirs, reference):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4)


def test_silu_and_mul_gradients_equal_flaggems_function():
    inputs = inputs_for("silu_and_mul", torch.float32)
    torch.manual_seed(1)
    dy = torch.randn_like(inputs[0])
    for mine, theirs in zip(gradients(silu_and_mul, inputs, dy), gradients(SiluAndMul.apply, inputs, dy)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


# --- compiled ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_compiled_fullgraph_with_flaggems_kernels_in_the_graph(name, dtype):
    case = CASES[name]
    inputs = inputs_for(name, dtype)
    backend = RecordingInductor()
    compiled = torch.compile(case.port, backend=backend, fullgraph=True)
    got = compiled(*inputs)
    for a, b in zip(got, case.port(*inputs)):
        torch.testing.assert_close(a, b, **tolerance(dtype))

    assert not torch._dynamo.utils.counters["graph_break"]
    assert len(backend.graphs) == 1
    assert len(backend.kernel_nodes(0)) == len(case.kernels())
    assert backend.kernels(0) == case.kernels()
    assert not backend.calls(case.op, 0)
    assert set(case.kernels()) <= {jit_function(k) for k in case.op.triton_kernels.forward}


@pytest.mark.parametrize("name, backward_kernels", [
    ("rms_norm", lambda: [jit_function(gems_rms_norm.rms_norm_grad_dx_kernel),
                          jit_function(gems_rms_norm.rms_norm_grad_dw_kernel)]),
    ("silu_and_mul", lambda: [generated_kernel(silu_and_mul_grad_kernel, 1)]),
])
def test_backward_through_backward_is_compiled_with_flaggems_backward_kernels(name, backward_kernels):
    case = CASES[name]
    inputs = inputs_for(name, torch.float32)
    torch.manual_seed(1)
    dy = torch.randn_like(inputs[0])

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = fn(*leaves)[0]
        out.backward(dy)
        return [out.detach(), *(t.grad for t in leaves)]

    backend = RecordingInductor()
    compiled = run(torch.compile(case.port, backend=backend, fullgraph=True))
    for a, b in zip(compiled, run(case.port)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert len(backend.graphs) == 2, "one forward and one backward graph"
    assert backend.kernels(0) == case.kernels()
    assert backend.kernels(1) == backward_kernels()
    assert not backend.calls(case.op, 0) and not backend.calls(case.op, 1)
    assert set(backward_kernels()) <= {jit_function(k) for k in case.op.triton_kernels.backward}


# --- timings ------------------------------------------------------------------------------------------


def _per_call_us(fn, inputs, number=200) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(number):
        fn(*inputs)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / number * 1e6


def _alternating(fns: dict, inputs, repeats=15) -> dict:
    """Median µs per call of each function, timed in turn, the order rotating each repeat."""
    samples = {k: [] for k in fns}
    keys = list(fns)
    for k in keys:
        _per_call_us(fns[k], inputs, 20)
    for r in range(repeats):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            samples[k].append(_per_call_us(fns[k], inputs))
    return {k: statistics.median(v) for k, v in samples.items()}


def test_timings(capsys):
    rows = []
    for name, case in CASES.items():
        inputs = inputs_for(name, torch.bfloat16, "bench")
        t = _alternating({"gems": case.gems, "opforge": case.port}, inputs)
        rows.append((name, t["gems"], t["opforge"]))
    x, w = inputs_for("rms_norm", torch.bfloat16, "bench")
    xg, dy = x.clone().requires_grad_(), torch.randn_like(x)
    t = _alternating({"gems": lambda: gems_rms_norm.rms_norm(xg, [xg.shape[-1]], w, EPS).backward(dy),
                      "opforge": lambda: rms_norm(xg, w, EPS)[0].backward(dy)}, ())

    lines = [f"FlagGems ops, eager, bf16, µs per call on {torch.cuda.get_device_name()} "
             f"(torch {torch.__version__}, triton {triton.__version__}; medians of alternating repeats)", "",
             "| op | FlagGems | opforge | ratio | budget <= 1.05x |", "|---|---|---|---|---|"]
    for name, gems, mine in rows:
        lines.append(f"| {name} | {gems:.1f} | {mine:.1f} | {mine / gems:.3f} | "
                     f"{'met' if mine / gems <= 1.05 else 'NOT met'} |")
    lines.append(f"| rms_norm forward+backward, input requires grad (FlagGems' RmsNorm Function) | "
                 f"{t['gems']:.1f} | {t['opforge']:.1f} | {t['opforge'] / t['gems']:.3f} | - |")
    with capsys.disabled():
        print("\n" + "\n".join(lines) + "\n")
    assert all(gems > 0 and mine > 0 for _, gems, mine in rows)
