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
`silu_and_mul` also have a backward= that calls FlagGems' backward. The
ports are tests/gpu/flaggems_ports.py; benchmarks/bench_flaggems.py times
each against FlagGems' own call.
"""

import os

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
from flag_gems.ops.add import add_func  # noqa: E402
from flaggems_ports import EPS, PAIRS, add, inputs_for, layer_norm, rms_norm, silu_and_mul, softmax  # noqa: E402

# flag_gems.ops binds the names rms_norm and softmax to functions, hiding these modules.
gems_rms_norm = importlib.import_module("flag_gems.ops.rms_norm")
gems_layernorm = importlib.import_module("flag_gems.ops.layernorm")
gems_softmax_module = importlib.import_module("flag_gems.ops.softmax")

from triton_testing import RecordingInductor, jit_function  # noqa: E402


def generated_kernel(function, rank: int):
    """The @triton.jit kernel FlagGems generated for a @pointwise_dynamic function and a task rank."""
    wrapper = function.instantiate(rank)
    launcher = wrapper.__globals__[wrapper.__name__.replace("_wrapper_rank_", "_kernel_rank_")]
    return jit_function(launcher)


class Case:
    def __init__(self, op, pair, reference, kernels):
        self.op = op
        self.port = pair.port  # (*inputs) -> tuple of tensors, through the opforge op
        self.gems = pair.gems  # the same through FlagGems' own function
        self.reference = reference  # the same in torch
        self.kernels = kernels  # () -> FlagGems' @triton.jit kernels the forward graph launches


CASES = {
    "rms_norm": Case(
        rms_norm, PAIRS["rms_norm"], lambda x, w: (F.rms_norm(x.float(), [x.shape[-1]], w.float(), EPS),),
        lambda: [jit_function(gems_rms_norm.rms_norm_kernel)]),
    "layer_norm": Case(
        layer_norm, PAIRS["layer_norm"],
        lambda x, w, b: (F.layer_norm(x.float(), [x.shape[-1]], w.float(), b.float(), 1e-5),),
        lambda: [jit_function(gems_layernorm.layer_norm_persistent_kernel)]),
    "softmax": Case(
        softmax, PAIRS["softmax"], lambda x: (torch.softmax(x.float(), -1),),
        lambda: [jit_function(gems_softmax_module.softmax_kernel_inner)]),
    "silu_and_mul": Case(
        silu_and_mul, PAIRS["silu_and_mul"], lambda a, b: (F.silu(a.float()) * b.float(),),
        lambda: [generated_kernel(silu_and_mul_kernel, 1)]),
    "add": Case(
        add, PAIRS["add"], lambda a, b: (a.float() + b.float(),), lambda: [generated_kernel(add_func, 1)]),
}
NAMES = list(CASES)
DTYPES = [torch.float32, torch.bfloat16]


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
