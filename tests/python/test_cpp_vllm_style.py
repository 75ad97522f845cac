"""A binding file written as vLLM's csrc writes its own
(tests/cpp_ext/vllm_style), in both ABI modes: the library's name is the
macro TORCH_EXTENSION_NAME, which OPFORGE_LIBRARY and OPFORGE_LIBRARY_IMPL
expand; kernels declared as vLLM declares them (`Tensor&` for every tensor,
`int64_t` for a SymInt) serve their ops; and a tensor written through
`Tensor!` gets its version bumped, where the same op registered with
TORCH_LIBRARY leaves it."""

import os

import pytest
import torch

import opforge
from cpp_ext import build
from kernel_library import STABLE_BUILDS

MODES = ["unstable", pytest.param("stable", marks=pytest.mark.skipif(
    not STABLE_BUILDS, reason=f"needs torch 2.10 (this is {torch.__version__}): a stable-ABI library"))]


@pytest.fixture(scope="module")
def built():
    return build("tests/cpp_ext/vllm_style", "vllm_style", f"VLLM_STYLE_STABLE={'ON' if STABLE_BUILDS else 'OFF'}")


def load(built, mode):
    if not hasattr(getattr(torch.ops, f"vllm_style_{mode}"), "rms_norm"):
        opforge.load_library(os.path.join(built, f"libopforge_test_vllm_{mode}.so"))


@pytest.fixture(params=MODES)
def mode(request, built):
    load(built, request.param)
    return request.param


def rms_norm_ref(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_the_namespace_is_the_expanded_torch_extension_name(mode):
    ns = f"vllm_style_{mode}"
    flat = getattr(torch.ops, ns)
    assert str(flat.rms_norm.default._schema) == (
        f"{ns}::rms_norm(Tensor(_0!) out, Tensor input, Tensor weight, float epsilon) -> ()")
    assert str(flat.scale_.default._schema) == f"{ns}::scale_(Tensor(a!) x, float factor) -> ()"
    assert not hasattr(torch.ops.TORCH_EXTENSION_NAME, "rms_norm")
    x, w = torch.randn(3, 8), torch.randn(8)
    out = torch.empty_like(x)
    flat.rms_norm(out, x, w, 1e-6)
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6))
    out = torch.empty_like(x)
    getattr(opforge.ops, ns).rms_norm(out, x, w, 0.5)
    torch.testing.assert_close(out, rms_norm_ref(x, w, 0.5))
    # The kernel of the OPFORGE_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CPU, ...) block.
    y = torch.full((4,), 2.0)
    flat.scale_(y, 3.0)
    assert y.tolist() == [6.0] * 4


def test_a_symint_argument_reaches_an_int64_kernel(mode):
    ns = f"vllm_style_{mode}"
    assert str(getattr(torch.ops, ns).numel_times.default._schema) == f"{ns}::numel_times(Tensor x, SymInt n) -> int"
    assert getattr(torch.ops, ns).numel_times(torch.ones(2, 3), 4) == 24
    assert getattr(opforge.ops, ns).numel_times(torch.ones(2, 3), 5) == 30


def test_a_written_tensor_gets_its_version_bumped_on_every_path(mode):
    ns = f"vllm_style_{mode}"
    x, w = torch.randn(2, 8), torch.randn(8)
    out = torch.empty_like(x)
    before = out._version
    getattr(torch.ops, ns).rms_norm(out, x, w, 1e-6)
    getattr(opforge.ops, ns).rms_norm(out, x, w, 1e-6)
    assert out._version == before + 2
    y = torch.ones(4)
    before = y._version
    getattr(torch.ops, ns).scale_(y, 2.0)
    assert y._version == before + 1
    # Once per call where an input requires grad too (the Autograd kernel's other path),
    # and not at all for an inference tensor, as a TORCH_LIBRARY op leaves it.
    before = out._version
    getattr(torch.ops, ns).rms_norm(out, x.requires_grad_(), w, 1e-6)
    assert out._version == before + 1
    with torch.inference_mode():
        frozen, xi, wi = torch.empty(2, 8), torch.randn(2, 8), torch.randn(8)
    getattr(torch.ops, ns).rms_norm(frozen, xi, wi, 1e-6)
    torch.testing.assert_close(frozen, rms_norm_ref(xi, wi, 1e-6))


def test_the_same_op_registered_with_torch_library_leaves_the_version_alone(built):
    # What vLLM's own ops do (docs/migration.md#from-vllms-csrc): torch bumps
    # no version for a TORCH_LIBRARY op's kernel. The block is in the C++ API build.
    load(built, "unstable")
    x, w = torch.randn(2, 8), torch.randn(8)
    out = torch.empty_like(x)
    before = out._version
    torch.ops.vllm_style_torch.rms_norm(out, x, w, 1e-6)
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6))
    assert out._version == before


def test_cpp_callers_call_an_op_with_its_kernels_own_signature(mode, built):
    # vLLM's C++ calls its ops with typed<decltype(kernel)>() (docs/cpp_ops.md#typed-calls): the
    # C++ API build records the kernels' own signature, as TORCH_LIBRARY does; a stable op records none.
    load(built, "unstable")
    ns = f"vllm_style_{mode}"
    typed = torch.ops.vllm_style_typed
    x, w = torch.randn(3, 8), torch.randn(8)
    out = torch.empty_like(x)
    typed.rms_norm(ns, out, x, w, 1e-6)
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6))
    bias = torch.randn(3, 8)
    for b, want in [(bias, x + bias), (None, x)]:
        out = torch.empty_like(x)
        typed.add_bias(ns, out, x, b)
        torch.testing.assert_close(out, want)
        out = torch.empty_like(x)
        getattr(torch.ops, ns).add_bias(out, x, b)  # and through the dispatcher's boxed path
        torch.testing.assert_close(out, want)
    assert typed.numel_times(ns, torch.ones(2, 3), 4) == 24
    out = torch.empty_like(x)
    if mode == "stable":
        typed.add_bias_flat(ns, out, x, bias)  # boxed kernels: any signature is converted
        torch.testing.assert_close(out, x + bias)
    else:
        # What TORCH_LIBRARY answers for a signature that is not the kernel's.
        for lib in (ns, "vllm_style_torch"):
            with pytest.raises(RuntimeError, match="Tried to access or call an operator with a wrong signature"):
                typed.add_bias_flat(lib, out, x, bias)


def test_kernels_that_disagree_on_a_signature_register_the_flat_one(built):
    load(built, "unstable")
    x = torch.randn(5)
    torch.testing.assert_close(torch.ops.vllm_style_signatures.twice(x), x * 2)
    assert torch.ops.vllm_style_signatures.twice(x.to("meta")).shape == (5,)
    torch.testing.assert_close(torch.ops.vllm_style_typed.twice_flat(x), x * 2)
    with pytest.raises(RuntimeError, match="wrong signature"):
        torch.ops.vllm_style_typed.twice_own(x)


def test_a_cpp_backward_follows_the_kernels_own_signature(built):
    load(built, "unstable")
    x = torch.randn(4, requires_grad=True)
    y = torch.ops.vllm_style_typed.square_own(x)
    torch.testing.assert_close(y, x * x)
    z = opforge.ops.vllm_style_signatures.square(x)
    z.sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    x.grad = None
    torch.ops.vllm_style_signatures.square(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
