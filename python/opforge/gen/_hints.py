"""Per-op facts that argument names and types cannot express, for building
test inputs: a convolution's weight shape, a loss's class-index target, a
backward op's grad_output taken from its forward.

    HINTS["bmm"] = Hint(ranks=(3,), args={"mat2": lambda c: c.t()})
    HINTS["glu_backward"] = Hint(build=lambda c: _from_forward(c, "aten::glu", {"self": c.t(), "dim": -1}))

Keys are ATen base names ("nll_loss") or qualified overloads
("aten::max.dim_max"); an overload's hint wins over its base's. `args`
overrides single arguments, `build` returns all of them at once (for
arguments that must share tensors); either may give a `OneOf` of
alternatives. A hint only says what the generic rules in `_samples.py` get
wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .casekit import Call, T

OMIT = object()  # leave a defaulted argument out


class OneOf(tuple):
    """Alternatives for one argument, tried in order."""


@dataclass
class Hint:
    args: dict = field(default_factory=dict)  # name -> value, descriptor, OneOf, or fn(ctx)
    build: Callable | None = None  # fn(ctx) -> {name: value}, for arguments that share tensors
    ranks: tuple = ()
    dtypes: tuple = ()
    inits: tuple = ()
    out_dtypes: dict = field(default_factory=dict)  # for ops without a functional reference
    check: str = "close"
    skip: str | None = None


def hint_for(op) -> Hint | None:
    return HINTS.get(op.target_qualified) or HINTS.get(op.target[len("aten::"):]) or HINTS.get(op.base)


def _grad(c, target: str, args: dict, pick: int | None = None) -> Call:
    """A grad_output shaped like the forward's (picked) result."""
    return Call(target, args, pick=pick, like=True)


def _conv2d(c):
    return {"self": c.t((2, 4, 5, 5)), "weight": c.t((3, 4, 2, 2)), "kernel_size": [2, 2],
            "bias": None, "stride": [1, 1], "padding": [0, 0]}


def _conv2d_backward(c):
    forward = _conv2d(c)
    return dict(forward, grad_output=_grad(c, "aten::_slow_conv2d_forward", forward),
                output_mask=[True, True, True])


def _pool_backward(target: str, spatial: int, with_indices: bool = False, **fixed):
    def build(c):
        x = c.t((3,) + (4,) * spatial)
        args = {"self": x, "kernel_size": [2] * spatial, "stride": [2] * spatial,
                "padding": [0] * spatial, **fixed}
        if with_indices:
            args["dilation"] = [1] * spatial
            args["ceil_mode"] = False
        forward = {k: v for k, v in args.items()}
        out = dict(args, grad_output=_grad(c, target, forward, pick=0 if with_indices else None))
        if with_indices:
            out["indices"] = Call(target, forward, pick=1)
        else:
            out.update(ceil_mode=False, count_include_pad=True, divisor_override=None)
        return out
    return build


def _fractional(spatial: int):
    def build(c):
        x = c.t((3,) + (5,) * spatial)
        return {"self": x, "kernel_size": [2] * spatial, "output_size": [3] * spatial,
                "random_samples": c.t((1, 3, spatial), init="rand")}
    return build


def _fractional_backward(target: str, spatial: int):
    def build(c):
        forward = _fractional(spatial)(c)
        return dict(forward, grad_output=_grad(c, target, forward, pick=0),
                    indices=Call(target, forward, pick=1))
    return build


def _upsample_backward(target: str, spatial: int, align: bool):
    def build(c):
        x_shape = (2, 3) + (4,) * spatial
        forward = {"self": c.t(x_shape), "output_size": [6] * spatial}
        if align:
            forward["align_corners"] = False
        return dict(forward, grad_output=_grad(c, target, forward), input_size=list(x_shape))
    return build


def _pad_backward(target: str, spatial: int):
    def build(c):
        forward = {"self": c.t((3,) + (5,) * spatial), "padding": [1] * (2 * spatial)}
        return dict(forward, grad_output=_grad(c, target, forward))
    return build


def _nll(c, spatial: bool = False):
    shape = (2, 4, 3, 3) if spatial else (3, 4)
    target = (2, 3, 3) if spatial else (3,)
    return {"self": c.t(shape), "target": c.index(target), "weight": None, "reduction": 1,
            "ignore_index": -100}


def _nll_backward(forward_target: str, spatial: bool = False):
    def build(c):
        forward = _nll(c, spatial)
        return dict(forward, grad_output=_grad(c, forward_target, forward, pick=0),
                    total_weight=Call(forward_target, forward, pick=1))
    return build


def _margin(c):
    return {"self": c.t((3, 4)), "target": c.index((3,))}


def _multilabel(c):
    return {"self": c.t((3, 4)), "target": c.index((3, 4)), "reduction": 1}


def _lu(c, factor: str = "aten::linalg_lu_factor"):
    a = c.t((4, 4))
    return Call(factor, {"A": a}, pick=0), Call(factor, {"A": a}, pick=1)


def _lu_solve(c):
    lu, pivots = _lu(c)
    return {"LU": lu, "pivots": pivots, "B": c.t((4, 2))}


def _lu_solve_legacy(c):
    lu, pivots = _lu(c)
    return {"self": c.t((4, 2)), "LU_data": lu, "LU_pivots": pivots}


def _lu_unpack(c):
    lu, pivots = _lu(c)
    return {"LU_data": lu, "LU_pivots": pivots}


def _ldl_solve(c):
    a = c.t((4, 4), init="spd")
    factor = {"self": a}
    return {"LD": Call("aten::linalg_ldl_factor", factor, pick=0),
            "pivots": Call("aten::linalg_ldl_factor", factor, pick=1), "B": c.t((4, 2))}


def _householder(c):
    a = c.t((4, 3))
    return {"self": Call("aten::geqrf", {"self": a}, pick=0),
            "input2": Call("aten::geqrf", {"self": a}, pick=1), "input3": c.t((4, 2))}


def _coo_rows(c):
    return T((8,), "int64", "sorted_index:4", 11)


_BATCH_NORM = {
    "input": lambda c: c.t((2, 4, 3)), "weight": None, "bias": None,
    "running_mean": lambda c: c.t((4,)), "running_var": lambda c: c.t((4,), init="pos"),
}

HINTS: dict[str, Hint] = {
    # Linear algebra and products.
    "bmm": Hint(ranks=(3,), args={"mat2": lambda c: c.t()}),
    "_int_mm": Hint(dtypes=("int8",), args={"self": lambda c: c.t((4, 8)), "mat2": lambda c: c.t((8, 8))}),
    "cross": Hint(args={"self": lambda c: c.t((4, 3)), "other": lambda c: c.t((4, 3)), "dim": 1}),
    "linalg_cross": Hint(args={"self": lambda c: c.t((4, 3)), "other": lambda c: c.t((4, 3))}),
    "orgqr": Hint(build=lambda c: {k: v for k, v in _householder(c).items() if k != "input3"}),
    "ormqr": Hint(build=_householder),
    "linalg_lu_solve": Hint(build=_lu_solve),
    "lu_solve": Hint(build=_lu_solve_legacy),
    "lu_unpack": Hint(build=_lu_unpack),
    "linalg_ldl_solve": Hint(build=_ldl_solve),
    "linalg_tensorsolve": Hint(ranks=(2,), args={"other": lambda c: c.t((4,))}),
    # A Tensor fill value must be 0-dim; the tensor filled need not be.
    "aten::fill_.Tensor": Hint(ranks=(2,), args={"value": lambda c: c.t(())}),
    "aten::masked_fill_.Tensor": Hint(ranks=(2,), args={"value": lambda c: c.t(())}),
    "clamp": Hint(args={"min": -0.5}),
    "clip": Hint(args={"min": -0.5}),
    "aten::clamp.Tensor_out": Hint(args={"min": lambda c: c.t()}),
    "aten::clip.Tensor_out": Hint(args={"min": lambda c: c.t()}),
    "float_power_": Hint(dtypes=("float64", "complex128")),
    # float8 matmul; the CPU kernel wants mat2 column-major.
    "_scaled_mm": Hint(dtypes=("float8_e4m3fn",), args={
        "self": lambda c: c.t((16, 32)), "mat2": lambda c: Call("aten::t", {"self": c.t((16, 32))}),
        "scale_a": lambda c: c.t((), "float32", "ones"), "scale_b": lambda c: c.t((), "float32", "ones")}),
    # Convolutions.
    "_slow_conv2d_forward": Hint(build=_conv2d),
    "thnn_conv2d": Hint(build=_conv2d),
    "_slow_conv2d_backward": Hint(build=_conv2d_backward),
    "slow_conv_transpose3d": Hint(args={"self": lambda c: c.t((1, 4, 3, 3, 3)),
                                        "weight": lambda c: c.t((4, 2, 2, 2, 2)), "kernel_size": [2, 2, 2]}),
    "col2im": Hint(args={"self": lambda c: c.t((4, 9)), "output_size": [4, 4], "kernel_size": [2, 2],
                         "dilation": [1, 1], "padding": [0, 0], "stride": [1, 1]}),
    "_fft_r2c": Hint(args={"dim": [1]}, ranks=(2,)),
    # Pooling and their backwards.
    "avg_pool2d_backward": Hint(build=_pool_backward("aten::avg_pool2d", 2)),
    "avg_pool3d_backward": Hint(build=_pool_backward("aten::avg_pool3d", 3)),
    "max_pool2d_with_indices_backward": Hint(build=_pool_backward("aten::max_pool2d_with_indices", 2, True)),
    "max_pool3d_with_indices_backward": Hint(build=_pool_backward("aten::max_pool3d_with_indices", 3, True)),
    "fractional_max_pool2d": Hint(build=_fractional(2)),
    "fractional_max_pool3d": Hint(build=_fractional(3)),
    "fractional_max_pool2d_backward": Hint(build=_fractional_backward("aten::fractional_max_pool2d", 2)),
    "fractional_max_pool3d_backward": Hint(build=_fractional_backward("aten::fractional_max_pool3d", 3)),
    "mkldnn_adaptive_avg_pool2d": Hint(args={"self": lambda c: c.t((1, 4, 4, 4), init="mkldnn"),
                                             "output_size": [2, 2]}),
    "glu_backward": Hint(build=lambda c: (lambda x: {"self": x, "dim": -1, "grad_output": _grad(
        c, "aten::glu", {"self": x, "dim": -1})})(c.t())),
    # Losses.
    "nll_loss": Hint(build=_nll),
    "nll_loss_forward": Hint(build=_nll),
    "nll_loss2d": Hint(build=lambda c: _nll(c, True)),
    "nll_loss2d_forward": Hint(build=lambda c: _nll(c, True)),
    "nll_loss_backward": Hint(build=_nll_backward("aten::nll_loss_forward")),
    "nll_loss2d_backward": Hint(build=_nll_backward("aten::nll_loss2d_forward", True)),
    "multi_margin_loss": Hint(build=_margin),
    "multi_margin_loss_backward": Hint(build=lambda c: (lambda f: dict(
        f, p=1, margin=1, grad_output=_grad(c, "aten::multi_margin_loss", f)))(_margin(c))),
    "multilabel_margin_loss": Hint(build=_multilabel),
    "multilabel_margin_loss_forward": Hint(build=_multilabel),
    "multilabel_margin_loss_backward": Hint(build=lambda c: (lambda f: dict(
        f, grad_output=_grad(c, "aten::multilabel_margin_loss_forward", f, pick=0),
        is_target=Call("aten::multilabel_margin_loss_forward", f, pick=1)))(_multilabel(c))),
    # With reduction=mean, ATen's out= form disagrees with the functional one
    # on torch 2.13 (a wrong value, NaN into an empty out); test reduction=none.
    "binary_cross_entropy": Hint(inits=("rand",), args={"reduction": 0}),
    "binary_cross_entropy_backward": Hint(build=lambda c: (lambda x, t: {
        "self": x, "target": t, "grad_output": _grad(c, "aten::binary_cross_entropy", {"self": x, "target": t})})(
        c.t(init="rand"), c.t(init="rand")), inits=("rand",)),
    # Normalization and activations with state.
    "native_batch_norm": Hint(args=dict(_BATCH_NORM, training=False, momentum=0.1, eps=1e-5)),
    "_batch_norm_with_update": Hint(args=dict(_BATCH_NORM, momentum=0.1, eps=1e-5),
                                    out_dtypes={"reserve": "uint8"}),
    "batch_norm_elemt": Hint(args={"input": lambda c: c.t((2, 4, 3)), "mean": lambda c: c.t((4,)),
                                   "invstd": lambda c: c.t((4,), init="pos")}),
    "rrelu_with_noise": Hint(ranks=(2,), args={"noise": lambda c: c.t(), "training": False}),
    # Resampling and padding backwards.
    **{f"{name}_backward": Hint(build=_upsample_backward(f"aten::{name}", spatial, align))
       for name, spatial, align in [
           ("upsample_bicubic2d", 2, True), ("upsample_bilinear2d", 2, True),
           ("upsample_linear1d", 1, True), ("upsample_trilinear3d", 3, True),
           ("upsample_nearest1d", 1, False), ("upsample_nearest2d", 2, False),
           ("upsample_nearest3d", 3, False), ("_upsample_bicubic2d_aa", 2, True),
           ("_upsample_bilinear2d_aa", 2, True), ("_upsample_nearest_exact1d", 1, False),
           ("_upsample_nearest_exact2d", 2, False), ("_upsample_nearest_exact3d", 3, False)]},
    "aten::upsample_bilinear2d.vec_out": Hint(ranks=(4,), args={"output_size": None,
                                                                "scale_factors": [2.0, 2.0]}),
    "aten::upsample_nearest2d.vec_out": Hint(ranks=(4,), args={"output_size": None,
                                                               "scale_factors": [2.0, 2.0]}),
    **{f"{name}_backward": Hint(build=_pad_backward(f"aten::{name}", spatial))
       for name, spatial in [("reflection_pad1d", 1), ("reflection_pad2d", 2), ("reflection_pad3d", 3),
                             ("replication_pad1d", 1), ("replication_pad2d", 2), ("replication_pad3d", 3)]},
    # Sparse layouts.
    "hspmm": Hint(args={"mat1": lambda c: c.t((4, 4), init="sparse_coo"), "mat2": lambda c: c.t((4, 4))}),
    "sspaddmm": Hint(args={"self": lambda c: c.t((4, 4), init="sparse_coo"),
                           "mat1": lambda c: c.t((4, 4), init="sparse_coo"), "mat2": lambda c: c.t((4, 4))}),
    "sparse_sampled_addmm": Hint(args={"self": lambda c: c.t((4, 4), init="sparse_csr"),
                                       "mat1": lambda c: c.t((4, 4)), "mat2": lambda c: c.t((4, 4))}),
    # Index conversions read their inputs unchecked: give them valid ones.
    "_convert_indices_from_coo_to_csr": Hint(args={"self": _coo_rows, "size": 4}),
    "_convert_indices_from_csr_to_coo": Hint(args={
        "crow_indices": lambda c: Call("aten::_convert_indices_from_coo_to_csr", {"self": _coo_rows(c), "size": 4}),
        "col_indices": lambda c: c.index((8,))}),
    # Uninitialized memory: only the shape and dtype can be compared.
    "empty": Hint(check="meta"),
}
