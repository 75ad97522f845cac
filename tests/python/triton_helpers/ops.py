"""Op bodies that reach their kernels in every form the scan detects.

`define("ns")` registers one op per form under the namespace `ns` and
returns them with a reference implementation, so the CPU tests (on Triton's
interpreter) and the GPU tests check the same ops.
"""

from dataclasses import dataclass

import torch
import triton
from torch import Tensor
from torch.library import wrap_triton

import opforge

from . import kernels as K
from . import launchers
from .kernels import Holder, add_kernel, add_kernel_autotuned, add_kernel_heuristics_inside, scale_kernel
from .launchers import launch_add

BLOCK = 32


def grid(n):
    return (triton.cdiv(n, BLOCK),)


def add_module_global(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    add_kernel[grid(x.numel())](x, y, out, x.numel(), BLOCK=BLOCK)
    return out


def add_module_attribute(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    K.add_kernel[grid(x.numel())](x, y, out, x.numel(), BLOCK=BLOCK)
    return out


def add_class_attribute(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    Holder.k[grid(x.numel())](x, y, out, x.numel(), BLOCK=BLOCK)
    return out


def add_static_method(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    Holder.launch(x, y, out, x.numel(), BLOCK)
    return out


def add_run(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel.run(x, y, out, n, BLOCK=BLOCK, grid=grid(n), warmup=False)
    return out


def add_cross_module_helper(x: Tensor, y: Tensor) -> Tensor:
    return launch_add(x, y)


def add_helper_module_attribute(x: Tensor, y: Tensor) -> Tensor:
    return launchers.launch_with(add_kernel, x, y)


def add_autotuned(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel_autotuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out


def add_heuristics_inside(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel_heuristics_inside[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out


def add_user_wrapped(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    wrap_triton(add_kernel)[grid(x.numel())](x, y, out, x.numel(), BLOCK=BLOCK)
    return out


def make_closure_body(kernel):
    def add_closure(x: Tensor, y: Tensor) -> Tensor:
        out = torch.empty_like(x)
        kernel[grid(x.numel())](x, y, out, x.numel(), BLOCK=BLOCK)
        return out

    return add_closure


add_closure_cell = make_closure_body(add_kernel)

LAUNCHER = launchers.Launcher(add_kernel)


def add_kernel_on_self(x: Tensor, y: Tensor) -> Tensor:
    return LAUNCHER.launch(x, y)


def add_from_factory(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    K.pick("add")[grid(x.numel())](x, y, out, x.numel(), BLOCK=BLOCK)
    return out


def add_from_globals(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    globals()["add_kernel"][grid(x.numel())](x, y, out, x.numel(), BLOCK=BLOCK)
    return out


def add_into(x: Tensor, y: Tensor, out: Tensor) -> None:
    add_kernel[grid(x.numel())](x, y, out, x.numel(), BLOCK=BLOCK)


@dataclass(frozen=True)
class ScaleCfg:
    factor: float
    bias: float = 0.0


def scale(x: Tensor, cfg: ScaleCfg) -> Tensor:
    out = torch.empty_like(x)
    scale_kernel[grid(x.numel())](x, out, x.numel(), cfg.factor, BLOCK=BLOCK)
    return out + cfg.bias


def scale_backward(ctx, grad):
    return grad * ctx.factor, None


def scale_setup_context(ctx, inputs, output):
    ctx.factor = inputs[1].factor


# name -> (body, options, reference)
FORMS = {
    "add_module_global": (add_module_global, {}, lambda x, y: x + y),
    "add_module_attribute": (add_module_attribute, {}, lambda x, y: x + y),
    "add_class_attribute": (add_class_attribute, {}, lambda x, y: x + y),
    "add_static_method": (add_static_method, {}, lambda x, y: x + y),
    "add_run": (add_run, {}, lambda x, y: x + y),
    "add_cross_module_helper": (add_cross_module_helper, {}, lambda x, y: x + y),
    "add_helper_module_attribute": (add_helper_module_attribute, {}, lambda x, y: x + y),
    "add_autotuned": (add_autotuned, {}, lambda x, y: x + y),
    "add_heuristics_inside": (add_heuristics_inside, {}, lambda x, y: x + y),
    "add_user_wrapped": (add_user_wrapped, {}, lambda x, y: x + y),
    "add_closure_cell": (add_closure_cell, {}, lambda x, y: x + y),
    "add_kernel_on_self": (add_kernel_on_self, {"extra_triton_kernels": (add_kernel,)}, lambda x, y: x + y),
    "add_from_factory": (add_from_factory, {"extra_triton_kernels": (add_kernel,)}, lambda x, y: x + y),
    "add_from_globals": (add_from_globals, {"extra_triton_kernels": (add_kernel,)}, lambda x, y: x + y),
}


def define(ns: str) -> dict:
    """Registers every form as `ns::<form>`; returns {form: (op, reference)}."""
    ops = {}
    for form, (body, options, reference) in FORMS.items():
        ops[form] = (opforge.op(f"{ns}::{form}", **options)(body), reference)
    ops["add_into"] = (opforge.op(f"{ns}::add_into", mutates_args=("out",))(add_into), None)
    ops["scale"] = (opforge.op(f"{ns}::scale")(scale), lambda x, cfg: x * cfg.factor + cfg.bias)
    ops["scale_with_backward"] = (
        opforge.op(f"{ns}::scale_with_backward", backward=scale_backward, setup_context=scale_setup_context)(scale),
        lambda x, cfg: x * cfg.factor + cfg.bias,
    )
    return ops
