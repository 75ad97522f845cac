"""Models for the breakable CUDA graph tests and benchmark (docs/cuda_graphs.md):
32 layers, each with captured ops (a Python op, a C++ op, a Triton op) and
one op tagged cudagraph_unsafe that reads a host value at every call, of one
kernel kind: a Python body, a C++ kernel (the example library, either ABI),
a TVM-FFI function or a Triton kernel. A capture that missed the break would
replay the capture's host value.

And a capture class with vLLM's protocol (BreakableCUDAGraphCapture:
current(), add_eager(fn)), written here, and vLLM's decorator for a Python
kernel, for the comparison."""

from __future__ import annotations

import functools
import threading

import torch
import triton
import triton.language as tl
from torch import Tensor

import opforge
from opforge.cuda_graphs import UNSAFE

import kernel_library

LAYERS = 32


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale, mask=mask)


def _grid(n):
    return (triton.cdiv(n, 1024),)


@opforge.op("cg_gpu::affine", fake=lambda x, w: torch.empty_like(x))
def affine(x: Tensor, w: Tensor) -> Tensor:
    return x * w + 0.5


@opforge.op("cg_gpu::tadd")
def tadd(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    _add_kernel[_grid(x.numel())](x, y, out, x.numel(), BLOCK=1024)
    return out


@opforge.op("cg_gpu::scale_py", mutates_args=("out",), tags=UNSAFE)
def scale_py(out: Tensor, x: Tensor, host_scale: Tensor) -> None:
    out.copy_(x * float(host_scale[0]))


@opforge.op("cg_gpu::scale_triton", mutates_args=("out",), tags=UNSAFE)
def scale_triton(out: Tensor, x: Tensor, host_scale: Tensor) -> None:
    _scale_kernel[_grid(x.numel())](x, out, x.numel(), float(host_scale[0]), BLOCK=1024)


@opforge.op("cg_gpu::scale_fresh", tags=UNSAFE, fake=lambda x, host_scale: torch.empty_like(x))
def scale_fresh(x: Tensor, host_scale: Tensor) -> Tensor:
    """A functional tagged op: a new tensor every call."""
    return x * float(host_scale[0])


TVM_FFI_SOURCE = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

namespace ffi = tvm::ffi;

__global__ void ScaleKernel(float* out, const float* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = x[i] * s;
}

void scale_by_host(ffi::TensorView out, ffi::TensorView x, ffi::TensorView host_scale) {
  TVM_FFI_ICHECK(host_scale.device().device_type == kDLCPU) << "host_scale must be on the CPU";
  const float s = *static_cast<const float*>(host_scale.data_ptr());
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(x.device().device_type, x.device().device_id));
  const int64_t n = x.numel();
  ScaleKernel<<<(n + 255) / 256, 256, 0, stream>>>(static_cast<float*>(out.data_ptr()),
                                                    static_cast<const float*>(x.data_ptr()), n, s);
}
"""


@functools.lru_cache(maxsize=None)
def tvm_ffi_op():
    import tvm_ffi.cpp

    mod = tvm_ffi.cpp.load_inline("opforge_cg_gpu_kernels", cuda_sources=TVM_FFI_SOURCE, functions=["scale_by_host"])

    @opforge.op("cg_gpu::scale_ffi", mutates_args=("out",), tags=UNSAFE, kernel={"cuda": mod.scale_by_host})
    def scale_ffi(out: Tensor, x: Tensor, host_scale: Tensor) -> None: ...

    return scale_ffi


def tagged_op(kind: str):
    """The tagged op of a kernel kind: 'python', 'cpp' (the example library as
    OPFORGE_KERNELS builds it), 'tvm_ffi', 'triton'."""
    if kind == "python":
        return scale_py
    if kind == "cpp":
        return kernel_library.load().scale_by_host
    if kind == "tvm_ffi":
        return tvm_ffi_op()
    if kind == "triton":
        return scale_triton
    raise ValueError(kind)


class Model:
    """32 layers of: affine (Python op), rms_norm (C++ op), tadd (Triton op),
    then the tagged op, scaling by the layer's host value."""

    def __init__(self, kind: str, d: int = 256, rows: int = 8, layers: int = LAYERS, tagged=True, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.kernels = kernel_library.load()
        self.cfg = opforge.structs.kernels.NormCfg(eps=1e-5)
        self.w = [torch.rand(d, device="cuda", generator=g) + 0.5 for _ in range(layers)]
        self.b = [torch.randn(rows, d, device="cuda", generator=g) * 0.1 for _ in range(layers)]
        self.host = [torch.tensor([1.0 + 0.01 * i]) for i in range(layers)]  # CPU: read by the tagged op
        self.op = tagged_op(kind) if tagged else None
        self.functional = False

    def set_host(self, step: int) -> None:
        for i, h in enumerate(self.host):
            h.fill_(0.5 + 0.03 * ((step * 7 + i) % 11))

    def __call__(self, x: Tensor) -> Tensor:
        h = x
        for w, b, host in zip(self.w, self.b, self.host):
            h = affine(h, w)
            normed = torch.empty_like(h)
            self.kernels.rms_norm(normed, h, w, self.cfg)
            h = tadd(normed, b)
            if self.op is None:
                continue
            if self.functional:
                h = scale_fresh(h, host)
            else:
                out = torch.empty_like(h)
                self.op(out, h, host)
                h = out
        return h


class ProtocolCapture:
    """A breakable capture with vLLM's protocol (written here; vLLM is not
    installed): one capture per thread, current(), add_eager(fn), replay()."""

    _tls = threading.local()

    @classmethod
    def current(cls):
        return getattr(cls._tls, "active", None)

    def __init__(self, pool=None):
        self.pool = pool
        self.segments = []
        self.num_graphs = 0
        self.num_eager_breaks = 0
        self._graph = None
        self._capturing = False

    def __enter__(self):
        if self.current() is not None:
            raise RuntimeError("nested ProtocolCapture")
        ProtocolCapture._tls.active = self
        self._begin()
        return self

    def __exit__(self, *exc):
        try:
            self._end()
        finally:
            ProtocolCapture._tls.active = None

    def _begin(self):
        self._graph = torch.cuda.CUDAGraph()
        self._graph.capture_begin(pool=self.pool)
        self._capturing = True

    def _end(self):
        if not self._capturing:
            return
        self._graph.capture_end()
        self.segments.append(self._graph.replay)
        self.num_graphs += 1
        self._capturing = False

    def add_eager(self, fn):
        self._end()
        result = fn()
        self.segments.append(fn)
        self.num_eager_breaks += 1
        self._begin()
        return result

    def replay(self):
        for step in self.segments:
            step()


def eager_break_during_capture(fn):
    """vLLM's decorator for a Python kernel, as vLLM writes it: inside a
    capture, the call becomes `lambda: fn(*args)` recorded as an eager break."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        capture = ProtocolCapture.current()
        if capture is None or not capture._capturing:
            return fn(*args, **kwargs)
        return capture.add_eager(lambda: fn(*args, **kwargs))

    return wrapper
