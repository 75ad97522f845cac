"""A Triton kernel inside an opforge op, visible to Inductor.

The body launches the kernel through a helper, with a dataclass parameter.
opforge finds the launch, registers the op the way torch.library.triton_op
does, and under torch.compile Inductor receives the kernel itself
(`triton_kernel_wrapper_functional`) instead of an opaque call.

    python examples/triton_op.py

Without a CUDA GPU the kernel runs on Triton's interpreter (CPU) and the
compile step is skipped: the interpreter runs kernels, it cannot trace them.
"""

import os
from dataclasses import dataclass

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when kernels are defined and launched

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import opforge  # noqa: E402
import opforge.triton  # noqa: E402


@triton.jit
def scale_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


@dataclass(frozen=True)
class ScaleAdd:
    alpha: float = 1.0
    block: int = 256


def launch_scale_add(x, y, out, cfg):
    n = x.numel()
    scale_add_kernel[(triton.cdiv(n, cfg.block),)](x, y, out, n, cfg.alpha, BLOCK=cfg.block)


@opforge.op("examples::scale_add")
def scale_add(x: torch.Tensor, y: torch.Tensor, cfg: ScaleAdd) -> torch.Tensor:
    out = torch.empty_like(x)
    launch_scale_add(x, y, out, cfg)
    return out


def inductor_printing_kernels(gm, example_inputs):
    """Inductor, printing the Triton kernels of the graph it is handed."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner_compile(graph_module, inputs, *args, **kwargs):
        for node in graph_module.graph.nodes:
            if "triton_kernel_wrapper" in str(node.target):
                print(f"  Inductor graph: {node.target}(kernel_idx={node.kwargs['kernel_idx']}, "
                      f"grid={node.kwargs['grid']})")
        return compile_fx_inner(graph_module, inputs, *args, **kwargs)

    return compile_fx(gm, example_inputs, inner_compile=inner_compile)


def main():
    print("schema:", scale_add.schema)
    plan = opforge.triton.plan("examples::scale_add_plan", scale_add.__wrapped__)
    print("kernels found:", [k.__name__ for k in plan.kernels], "at", list(plan.launches))

    x = torch.randn(1000, device=DEVICE)
    y = torch.randn(1000, device=DEVICE)
    cfg = ScaleAdd(alpha=2.0)
    torch.testing.assert_close(scale_add(x, y, cfg), 2.0 * x + y)
    print(f"eager on {DEVICE}: ok")

    if DEVICE == "cuda":
        f = torch.compile(lambda x, y: scale_add(x, y, ScaleAdd(alpha=2.0)).relu(),
                          backend=inductor_printing_kernels, fullgraph=True)
        torch.testing.assert_close(f(x, y), (2.0 * x + y).relu())
        print("compiled with Inductor: ok")
    else:
        print("no CUDA GPU: skipping torch.compile")


if __name__ == "__main__":
    main()
