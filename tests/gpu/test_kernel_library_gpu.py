"""The example kernel library's CUDA kernels (examples/kernel_library), built
here with CUDA: values against torch in fp32 and bf16, opcheck, gradcheck of
the C++ backward, a fullgraph Inductor compile whose first call of the ops is
compiled, and CUDA graph replay.

    python -m pytest tests/gpu/test_kernel_library_gpu.py -v -s
    OPFORGE_KERNELS=stable python -m pytest tests/gpu/test_kernel_library_gpu.py -v -s   # the stable-ABI build
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

import opforge  # noqa: E402

import kernel_library  # noqa: E402
from cpp_ext import ROOT  # noqa: E402


@pytest.fixture(scope="module")
def kernels():
    ops = kernel_library.load()
    if "CUDA" not in torch._C._dispatch_dump("kernels::rms_norm"):
        pytest.fail("the example library was built without its CUDA kernels (torch or CMake without CUDA)")
    return ops


@pytest.fixture(scope="module")
def s(kernels):
    return opforge.structs.kernels


def rms_norm_ref(x, w, eps, gemma=False):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * ((1 + w.float()) if gemma else w.float())
    return y.to(x.dtype)


def tol(dtype):
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 64), (4, 3, 1000)])
def test_rms_norm_and_fused_add_equal_torch(kernels, s, dtype, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype)
    for cfg in (s.NormCfg(eps=1e-5), s.NormCfg(eps=1e-2, gemma=True)):
        out = torch.empty_like(x)
        kernels.rms_norm(out, x, w, cfg)
        torch.testing.assert_close(out, rms_norm_ref(x, w, cfg.eps, cfg.gemma), **tol(dtype))
        xi, res = x.clone(), torch.randn_like(x)
        res0 = res.clone()
        kernels.fused_add_rms_norm(xi, res, w, cfg)
        torch.testing.assert_close(res, (res0.float() + x.float()).to(dtype), **tol(dtype))
        torch.testing.assert_close(xi, rms_norm_ref(res, w, cfg.eps, cfg.gemma), **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_act_and_mul_equals_torch(kernels, s, dtype):
    x = torch.randn(5, 2 * 96, device="cuda", dtype=dtype)
    for act, fn in (("kSilu", torch.nn.functional.silu), ("kGelu", torch.nn.functional.gelu)):
        out = torch.empty(5, 96, device="cuda", dtype=dtype)
        kernels.act_and_mul(out, x, s.ActCfg(act=getattr(s.Act, act), limit=3.0))
        ref = (fn(x[:, :96].float().clamp(-3, 3)) * x[:, 96:].float()).to(dtype)
        torch.testing.assert_close(out, ref, **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_functional_norm_and_its_cpp_backward_equal_torch(kernels, s, dtype):
    x = torch.randn(6, 256, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(256, device="cuda", dtype=dtype, requires_grad=True)
    cfg = s.NormCfg(eps=1e-5, gemma=True)
    y = kernels.rms_norm_fn(x, w, cfg)
    g = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    yr = rms_norm_ref(xr, wr, 1e-5, True)
    gxr, gwr = torch.autograd.grad(yr, (xr, wr), g.float())
    torch.testing.assert_close(y, yr.to(dtype), **tol(dtype))
    loose = {"atol": 5e-2, "rtol": 5e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(gx, gxr.to(dtype), **loose)
    torch.testing.assert_close(gw, gwr.to(dtype), **loose)


def test_gradcheck_of_the_cpp_backward_on_cuda(kernels, s):
    x = torch.randn(3, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: kernels.rms_norm_fn(x, w, s.NormCfg(eps=0.1, gemma=True)), (x, w))


def test_opcheck_on_cuda(kernels, s):
    x = torch.randn(4, 32, device="cuda", requires_grad=True)
    w = torch.randn(32, device="cuda", requires_grad=True)
    opforge.opcheck(kernels.rms_norm_fn, (x, w, s.NormCfg()))
    opforge.opcheck(kernels.rms_norm, (torch.empty(4, 32, device="cuda"), x.detach(), w.detach(), s.NormCfg()))
    opforge.opcheck(kernels.act_and_mul, (torch.empty(4, 16, device="cuda"), x.detach(), s.ActCfg()))


def test_a_compiled_model_whose_first_call_of_the_ops_is_compiled():
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import torch, opforge
        torch.ops.load_library({kernel_library.library_path()!r})   # nothing made eagerly

        def block(x, res, w):
            s = opforge.structs.kernels
            opforge.ops.kernels.fused_add_rms_norm(x, res, w, s.NormCfg(eps=1e-5))
            h = torch.empty(x.shape[0], x.shape[1] // 2, device=x.device, dtype=x.dtype)
            opforge.ops.kernels.act_and_mul(h, x, s.ActCfg())
            return opforge.ops.kernels.rms_norm_fn(h, w[: h.shape[1]], s.NormCfg()) * 2

        compiled = torch.compile(block, fullgraph=True, backend="inductor")
        x, res = torch.randn(8, 128, device="cuda"), torch.randn(8, 128, device="cuda")
        w = torch.randn(128, device="cuda")
        out = compiled(x.clone(), res.clone(), w)
        ref = block(x.clone(), res.clone(), w)
        torch.testing.assert_close(out, ref)
        print("graph breaks", torch._dynamo.utils.counters["graph_break"].total())
    """)], capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests", "python")))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "graph breaks 0" in result.stdout


def test_cuda_graph_replay(kernels, s):
    x = torch.randn(16, 512, device="cuda")
    w = torch.randn(512, device="cuda")
    out = torch.empty_like(x)
    cfg = s.NormCfg(eps=1e-5)
    kernels.rms_norm(out, x, w, cfg)  # warm up
    y = kernels.rms_norm_fn(x, w, cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.rms_norm(out, x, w, cfg)
        y = kernels.rms_norm_fn(out, w, cfg)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        first = rms_norm_ref(x, w, 1e-5)
        torch.testing.assert_close(out, first)
        torch.testing.assert_close(y, rms_norm_ref(first, w, 1e-5))
