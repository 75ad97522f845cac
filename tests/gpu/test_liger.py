"""Liger-Kernel's ops as opforge ops, on a CUDA GPU (docs/triton.md, "Ports
of a Triton library"): one `@opforge.op` per Liger autograd.Function, with
`backward=` calling Liger's own backward helper (tests/gpu/liger_ports.py).

    pip install --no-deps .whl/liger_kernel-*.whl     # or: make gpu-test
    python -m pytest tests/gpu/test_liger.py -v -s

Per op and dtype: eager outputs and gradients equal Liger's Function;
torch.compile(fullgraph=True) with Inductor gives the same values with no
graph break, and Liger's kernels are in the forward and in the backward
graph that Inductor compiles (no opaque op). benchmarks/bench_liger.py
times the ports against Liger's Functions eagerly, and
benchmarks/bench_liger_compiled.py eager and compiled. The ports' in-place
variants (`in_place=True`, `rope_`) equal Liger's Functions,
which overwrite the same tensors. The last tests show what opforge reports
for ports that let a kernel write a tensor they do not own, or whose helper
reads tensor values.
"""

import os
import warnings
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
triton = pytest.importorskip("triton")
pytest.importorskip("liger_kernel", reason="needs liger-kernel (pip install --no-deps .whl/liger_kernel-*.whl)")

import liger_ports as P  # noqa: E402
from liger_inputs import (GLU, as_tuple, ce_inputs, forward_backward, fresh, glu_inputs, norm_inputs,  # noqa: E402
                          output_grads, rope_inputs, softmax_inputs)
from liger_kernel.ops import cross_entropy as liger_ce  # noqa: E402
from liger_kernel.ops import geglu as liger_geglu  # noqa: E402
from liger_kernel.ops import layer_norm as liger_ln  # noqa: E402
from liger_kernel.ops import rms_norm as liger_rms  # noqa: E402
from liger_kernel.ops import rope as liger_rope  # noqa: E402
from liger_kernel.ops import softmax as liger_softmax  # noqa: E402
from liger_kernel.ops import swiglu as liger_swiglu  # noqa: E402
from liger_kernel.ops.utils import element_mul_kernel  # noqa: E402

import opforge  # noqa: E402
import opforge.triton as ot  # noqa: E402
from opforge import _inspect  # noqa: E402
from triton_testing import RecordingInductor, chain_text, jit_function  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]


# --- the cases: one per Liger Function --------------------------------------------------------------


@dataclass
class Case:
    port: Callable  # the user-facing function over the opforge op
    liger: Callable  # the same over Liger's autograd.Function
    inputs: Callable  # (dtype, size) -> tuple of tensors; size is "test" or "large" (liger_inputs)
    op: opforge.OpDef
    forward_kernels: list  # what the forward graph launches for these inputs
    backward_kernels: list
    exact: bool = True  # eager results bit for bit equal to Liger's



# Before 2.13, AOTAutograd rejects an in-place write into a saved tensor that
# requires grad ("a leaf Variable that requires grad is being used in an
# in-place operation") while tracing the backward, before opforge's write
# analysis runs; torch 2.13+ traces it and opforge warns.
_TRACES_SAVED_INPUT_WRITES = torch.torch_version.TorchVersion(torch.__version__) >= "2.13"

def liger_rms_norm(X, W):
    return liger_rms.LigerRMSNormFunction.apply(X, W, 1e-6)


def liger_layer_norm(X, W, B):
    return liger_ln.LigerLayerNormFunction.apply(X, W, B, 1e-6)


def port_rope(q, k, cos, sin):
    return P.rope(q, k, cos, sin)


def liger_rope_fn(q, k, cos, sin):
    return liger_rope.LigerRopeFunction.apply(q, k, cos, sin)


def swiglu_kernels():
    tiled = liger_swiglu._should_tile(GLU["test"][1])
    return ([liger_swiglu._swiglu_forward_kernel_tiled if tiled else liger_swiglu._swiglu_forward_kernel],
            [liger_swiglu._swiglu_backward_kernel_tiled if tiled else liger_swiglu._swiglu_backward_kernel])


CASES = {
    "rms_norm": Case(lambda X, W: P.rms_norm(X, W), liger_rms_norm, lambda d, s: norm_inputs(d, s, False),
                     P.rms_norm_op, [liger_rms._rms_norm_forward_kernel], [liger_rms._rms_norm_backward_kernel]),
    "layer_norm": Case(lambda X, W, B: P.layer_norm(X, W, B), liger_layer_norm,
                       lambda d, s: norm_inputs(d, s, True), P.layer_norm_op,
                       [liger_ln._layer_norm_forward_kernel], [liger_ln._layer_norm_backward_kernel]),
    "swiglu": Case(P.swiglu, liger_swiglu.LigerSiLUMulFunction.apply, glu_inputs, P.swiglu, *swiglu_kernels()),
    "geglu": Case(P.geglu, liger_geglu.LigerGELUMulFunction.apply, glu_inputs, P.geglu,
                  [liger_geglu._geglu_tanh_forward_kernel], [liger_geglu._geglu_tanh_backward_kernel]),
    "rope": Case(port_rope, liger_rope_fn, rope_inputs, P.rope, [liger_rope._triton_rope], [liger_rope._triton_rope]),
    "softmax": Case(P.softmax, liger_softmax.LigerSoftmaxFunction.apply, softmax_inputs, P.softmax,
                    [liger_softmax._softmax_single_block_forward_kernel],
                    [liger_softmax._softmax_single_block_backward_kernel]),
    "cross_entropy": Case(P.cross_entropy, P.liger_cross_entropy, ce_inputs, P.cross_entropy_sum,
                          [liger_ce.liger_cross_entropy_kernel], [element_mul_kernel], exact=False),
}
NAMES = list(CASES)


# --- running them ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh(fresh_compile):
    """Every test here inspects the graphs of a compile of its own."""


def inputs_for(case, dtype, size="test"):
    torch.manual_seed(0)
    return case.inputs(dtype, size)


def assert_close_in_scale(a, b, dtype, what):
    """Elementwise relative tolerance, plus an absolute one in the scale of
    the tensor (a gradient of 1e-7 is not compared against atol=1e-5)."""
    rtol, scale = (1.6e-2, 1e-2) if dtype == torch.bfloat16 else (1e-5, 1e-5)
    a, b = a.float(), b.float()
    atol = scale * float(b.abs().max()) + 1e-30
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def assert_same(mine, theirs, exact, dtype, what):
    mine_outs, mine_grads = mine
    outs, grads = theirs
    assert len(mine_outs) == len(outs) and len(mine_grads) == len(grads), what
    for i, (a, b) in enumerate(zip(mine_outs + mine_grads, outs + grads)):
        if exact:
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"{what} [{i}]: {m}")
        else:
            assert_close_in_scale(a, b, dtype, f"{what} [{i}]")


# --- eager ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_eager_outputs_and_gradients_equal_liger(name, dtype):
    case = CASES[name]
    inputs = inputs_for(case, dtype)
    assert_same(forward_backward(case.port, inputs), forward_backward(case.liger, inputs), case.exact, dtype,
                f"{name} {dtype} eager")


IN_PLACE = {  # the ports' in_place=True, against Liger's Function with its default (in place) backward
    "rms_norm": (lambda X, W: P.rms_norm(X, W, in_place=True),
                 lambda X, W: liger_rms.LigerRMSNormFunction.apply(X, W, 1e-6)),
    "swiglu": (lambda a, b: P.swiglu(a, b, in_place=True), liger_swiglu.LigerSiLUMulFunction.apply),
    "geglu": (lambda a, b: P.geglu(a, b, in_place=True), liger_geglu.LigerGELUMulFunction.apply),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(IN_PLACE))
def test_the_in_place_backward_options_equal_liger_eagerly(name, dtype):
    port, liger = IN_PLACE[name]
    inputs = inputs_for(CASES[name], dtype)
    assert_same(forward_backward(port, inputs), forward_backward(liger, inputs), True, dtype,
                f"{name} in_place=True {dtype} eager")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_in_place_rope_port_rotates_the_callers_tensors_as_liger_does(dtype):
    q0, k0, cos, sin = inputs_for(CASES["rope"], dtype)
    results = []
    for fn in (P.rope_, liger_rope_fn):
        leaves = fresh((q0, k0))
        q, k = leaves[0] * 1, leaves[1] * 1  # an in-place op takes tensors that are not leaves
        outs = as_tuple(fn(q, k, cos, sin))
        rotated_in_place = outs[0].data_ptr() == q.data_ptr() and outs[1].data_ptr() == k.data_ptr()
        torch.autograd.backward(outs, output_grads(outs))
        results.append(([o.detach() for o in outs], [a.grad for a in leaves], rotated_in_place))
    assert results[0][2] and results[1][2], "both rotate the caller's q and k"
    assert_same(results[0][:2], results[1][:2], True, dtype, f"rope_ {dtype} eager")
    q, k = fresh((q0, k0))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        P.rope_(q, k, cos, sin)


def test_the_state_outputs_of_the_ports_are_not_differentiable():
    X, W = inputs_for(CASES["rms_norm"], torch.float32)
    Y, RSTD = P.rms_norm_op(X, W, 1e-6)
    X, W, B = inputs_for(CASES["layer_norm"], torch.float32)
    Y2, Mean, RSTD2 = P.layer_norm_op(X, W, B, 1e-6)
    logits, target = inputs_for(CASES["cross_entropy"], torch.float32)
    loss, dx = P.cross_entropy_sum(logits, target)
    assert Y.requires_grad and Y2.requires_grad and loss.requires_grad
    assert not any(t.requires_grad for t in (RSTD, Mean, RSTD2, dx))


def test_the_literal_cross_entropy_port_equals_liger_eagerly():
    inputs = inputs_for(CASES["cross_entropy"], torch.float32)
    mine = forward_backward(lambda a, t: P.cross_entropy_literal(a, t)[0], inputs)
    assert_same(mine, forward_backward(P.liger_cross_entropy, inputs), True, torch.float32, "literal cross entropy")


# --- compiled ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_compiled_fullgraph_with_liger_kernels_in_the_forward_and_backward_graphs(name, dtype):
    case = CASES[name]
    inputs = inputs_for(case, dtype)
    backend = RecordingInductor()
    compiled = torch.compile(case.port, backend=backend, fullgraph=True)
    with warnings.catch_warnings():
        # The ports hand Liger's helpers copies of what they write (no UndeclaredWriteWarning).
        warnings.simplefilter("error", ot.UndeclaredWriteWarning)
        mine_outs, mine_grads = forward_backward(compiled, inputs)
    outs, grads = forward_backward(case.liger, inputs)
    for i, (a, b) in enumerate(zip(mine_outs + mine_grads, outs + grads)):
        assert_close_in_scale(a, b, dtype, f"{name} {dtype} compiled [{i}]")

    assert not torch._dynamo.utils.counters["graph_break"]
    assert len(backend.graphs) == 2, "one forward and one backward graph"
    assert backend.kernels(0) == [jit_function(k) for k in case.forward_kernels]
    assert backend.kernels(1) == [jit_function(k) for k in case.backward_kernels]
    assert not backend.calls(case.op, 0) and not backend.calls(case.op, 1)


@pytest.mark.parametrize("name", NAMES)
def test_triton_kernels_and_inspect_list_liger_kernels(name):
    case = CASES[name]
    kernels = case.op.triton_kernels
    assert set(case.forward_kernels) <= set(kernels.forward)
    assert set(case.backward_kernels) <= set(kernels.backward)
    text = _inspect.describe(case.op)
    for k in case.forward_kernels + case.backward_kernels:
        assert jit_function(k).__name__ in text


# --- what opforge reports ---------------------------------------------------------------------------------


def show(capsys, text):
    """Prints a message for the closing note, with or without pytest -s."""
    with capsys.disabled():
        print(f"\n{text}\n")


def raised(error, kind):
    """The exception of type kind that error was raised from (torch.compile wraps it)."""
    e, seen = error, set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    raise AssertionError(f"no {kind.__name__} behind:\n{chain_text(error)}")


def test_a_port_whose_kernel_writes_its_input_is_reported(capsys):
    op = opforge.op("liger_literal::rope")(P.rope_literal_body)
    q, k, cos, sin = (t.detach() for t in inputs_for(CASES["rope"], torch.float32))
    before = q.clone()
    op(q, k, cos, sin)
    assert not torch.equal(q, before), "eagerly, Liger's kernel rotates the caller's q"

    with pytest.raises(Exception) as info:
        torch.compile(op, backend="inductor", fullgraph=True)(q, k, cos, sin)
    text = str(raised(info.value, ot.UndeclaredWriteError))
    show(capsys, text)
    assert "liger_literal::rope: Triton kernel '_triton_rope' (launched at rope.py:" in text
    assert "writes its argument 'q_ptr', which is the op's parameter 'q', but mutates_args does not declare 'q'" in text
    assert "q.clone()" in text


@pytest.mark.skipif(not _TRACES_SAVED_INPUT_WRITES, reason=f"needs torch 2.13 (this is {torch.__version__}): "
                    "earlier torch fails the trace itself with 'a leaf Variable that requires grad is being used "
                    "in an in-place operation'")
def test_rms_norm_backward_writing_its_gradient_in_place_warns(capsys):
    X, W = inputs_for(CASES["rms_norm"], torch.float32)
    f = torch.compile(lambda X, W: P.rms_norm(X, W, in_place=True), backend="inductor", fullgraph=True)
    with pytest.warns(ot.UndeclaredWriteWarning) as record:
        forward_backward(f, (X, W))
    message = next(str(w.message) for w in record if issubclass(w.category, ot.UndeclaredWriteWarning))
    show(capsys, message)
    assert "liger::rms_norm: backward: Triton kernel '_rms_norm_backward_kernel' (launched at rms_norm.py:" in message
    assert "writes its argument 'dX_ptr', which is backward's parameter 'dY'" in message


def test_liger_cross_entropy_helpers_read_tensor_values_and_the_error_names_liger_line(capsys):
    logits, target = inputs_for(CASES["cross_entropy"], torch.float32)
    f = torch.compile(lambda a, t: P.cross_entropy_literal(a, t)[0], backend="inductor", fullgraph=True)
    with pytest.raises(Exception) as info:
        f(logits, target)
    text = str(raised(info.value, ot.HostCodeError))
    show(capsys, text)
    assert "liger::cross_entropy_literal: the body reads a tensor's value at " in text
    assert f"{os.sep}liger_kernel{os.sep}ops{os.sep}cross_entropy.py:" in text
    assert "liger_ports.py:" in text.split("(reached from ", 1)[1]
