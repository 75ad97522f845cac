"""A kernel written against TVM-FFI, not torch, as an opforge op
(docs/tvm_ffi.md): built with tvm_ffi.cpp.load_inline, given its signature
by a stub with a config dataclass, then called eagerly, through torch.ops,
under torch.compile, and with a gradient through a second TVM-FFI kernel.

    pip install apache-tvm-ffi
    python examples/tvm_ffi_op.py

It checks each result against plain PyTorch and prints the schema torch sees.
"""

import dataclasses

import torch
import tvm_ffi.cpp

import opforge

Tensor = torch.Tensor

SOURCE = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

namespace ffi = tvm::ffi;

// out = x * scale + shift, over contiguous float32 tensors.
void affine(ffi::TensorView out, ffi::TensorView x, double scale, double shift) {
  TVM_FFI_ICHECK(x.dtype() == DLDataType({kDLFloat, 32, 1}) && x.IsContiguous()) << "x must be contiguous float32";
  TVM_FFI_ICHECK(out.numel() == x.numel()) << "out and x differ in size";
  const float* px = static_cast<const float*>(x.data_ptr());
  float* po = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = static_cast<float>(px[i] * scale + shift);
}
"""

mod = tvm_ffi.cpp.load_inline("opforge_example_affine", cpp_sources=SOURCE, functions=["affine"])


@dataclasses.dataclass(frozen=True)
class Affine:
    scale: float = 1.0
    shift: float = 0.0


@opforge.op("example::affine_out", mutates_args=("out",), kernel=mod.affine)
def affine_out(out: Tensor, x: Tensor, cfg: Affine) -> None:
    """The signature; the TVM-FFI function is the kernel. Its fake is free: it returns nothing."""


def backward(ctx, grad):
    g = torch.empty_like(grad)
    affine_out(g, grad.contiguous(), Affine(ctx.scale))  # the backward's kernel is an op too
    return g, None


def setup_context(ctx, inputs, output):
    ctx.scale = inputs[1].scale


@opforge.op("example::affine", backward=backward, setup_context=setup_context,
            fake=lambda x, cfg: torch.empty_like(x))
def affine(x: Tensor, cfg: Affine) -> Tensor:
    out = torch.empty_like(x)
    affine_out(out, x, cfg)
    return out


def main() -> None:
    x = torch.randn(4, 8)
    cfg = Affine(scale=2.0, shift=0.5)
    print("schema:", affine_out.schema)
    torch.testing.assert_close(affine(x, cfg), x * 2 + 0.5)
    out = torch.empty_like(x)
    torch.ops.example.affine_out(out, x, 3.0, -1.0)  # the flat op: the struct's fields as leaves
    torch.testing.assert_close(out, x * 3 - 1)
    compiled = torch.compile(lambda t: affine(t, cfg).relu(), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), (x * 2 + 0.5).relu())
    xg = x.clone().requires_grad_()
    affine(xg, cfg).sum().backward()
    torch.testing.assert_close(xg.grad, torch.full_like(x, 2.0))
    print("eager, torch.ops, torch.compile and the gradient match PyTorch")


if __name__ == "__main__":
    main()
