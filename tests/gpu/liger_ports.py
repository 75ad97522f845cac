"""Liger-Kernel's ops as opforge ops: one `@opforge.op` per Liger
autograd.Function, the body calling Liger's forward helper and `backward=`
calling Liger's backward helper, unchanged (docs/triton.md, "Ports of a
Triton library").

Each op returns what Liger's Function keeps on ctx between forward and
backward (RMSNorm's RSTD, LayerNorm's Mean and RSTD) as extra outputs,
which setup_context marks non-differentiable with gradients left
unmaterialized (backward gets None for them, and no zeros are made), and
the user-facing function (`rms_norm`, `layer_norm`, ...) returns what
Liger's Function returns. Where a Liger helper writes a tensor it was given,
the port hands it a copy, because the op's inputs and gradients may be
shared with the rest of the program. `rope_` is the exception that shows
the other way: like Liger's Function it rotates the caller's q and k, and
says so (`mutates_args`, `ctx.mark_dirty`).

CrossEntropy is the exception: Liger's `cross_entropy_forward` counts the
targets with `.item()` and `cross_entropy_backward` compares the incoming
gradient with 1.0 using `torch.equal`, so neither can run under a trace.
`cross_entropy_literal` is the direct port (eager only; torch.compile
reports the `.item()` line); `cross_entropy` launches the same two Liger
kernels with the value-dependent parts moved out of the op.
"""

import functools

import torch
import triton
from liger_kernel.ops import cross_entropy as liger_ce
from liger_kernel.ops import geglu as liger_geglu
from liger_kernel.ops import layer_norm as liger_ln
from liger_kernel.ops import rms_norm as liger_rms
from liger_kernel.ops import rope as liger_rope
from liger_kernel.ops import softmax as liger_softmax
from liger_kernel.ops import swiglu as liger_swiglu
from liger_kernel.ops.utils import calculate_settings, element_mul_kernel, is_hip

import opforge

Tensor = torch.Tensor


# Liger's forward helpers compute the launch settings and return them to their
# Function; an op's setup_context sees only the outputs, so it asks again, once per width.
_settings = functools.lru_cache(maxsize=None)(calculate_settings)


def _contiguous_copy(t: Tensor) -> Tensor:
    return t.clone(memory_format=torch.contiguous_format)


# --- RMSNorm (LigerRMSNormFunction) ------------------------------------------------------------


def _rms_norm_setup(ctx, inputs, output):
    X, W, eps, offset, casting_mode, in_place = inputs
    _, RSTD = output
    ctx.mark_non_differentiable(RSTD)
    ctx.set_materialize_grads(False)
    dim = X.shape[-1]
    ctx.save_for_backward(X.contiguous().view(-1, dim), W, RSTD)
    ctx.offset = offset
    ctx.casting_mode = liger_rms._str_to_casting_mode[casting_mode]
    ctx.in_place = in_place
    ctx.BLOCK_SIZE, ctx.num_warps = _settings(dim)


def _rms_norm_backward(ctx, dY, _dRSTD):
    X, W, RSTD = ctx.saved_tensors
    dX, dW = liger_rms.rms_norm_backward(dY.contiguous(), X, W, RSTD, ctx.offset, ctx.casting_mode, ctx.BLOCK_SIZE,
                                         ctx.num_warps, ctx.in_place, None, needs_dw=ctx.needs_input_grad[1])
    return dX, dW, None, None, None, None


@opforge.op("liger::rms_norm", setup_context=_rms_norm_setup, backward=_rms_norm_backward)
def rms_norm_op(X: Tensor, W: Tensor, eps: float, offset: float = 0.0, casting_mode: str = "llama",
                in_place: bool = False) -> tuple[Tensor, Tensor]:
    """(Y, RSTD); in_place=True has backward write dX over dY, as Liger's default does."""
    Y, _, RSTD, _, _, _ = liger_rms.rms_norm_forward(X.contiguous(), W, eps, offset, casting_mode, None)
    return Y, RSTD


def rms_norm(X, W, eps=1e-6, offset=0.0, casting_mode="llama", in_place=False):
    return rms_norm_op(X, W, eps, offset, casting_mode, in_place)[0]


# --- LayerNorm (LigerLayerNormFunction) --------------------------------------------------------


def _layer_norm_setup(ctx, inputs, output):
    X, W, B, _eps = inputs
    _, Mean, RSTD = output
    ctx.mark_non_differentiable(Mean, RSTD)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(X.contiguous().view(-1, X.shape[-1]), W, B, Mean, RSTD)


def _layer_norm_backward(ctx, dY, _dMean, _dRSTD):
    X, W, B, Mean, RSTD = ctx.saved_tensors
    DX, DW, DB = liger_ln.layer_norm_backward(dY.contiguous(), X, W, B, Mean, RSTD,
                                              needs_dw=ctx.needs_input_grad[1], needs_db=ctx.needs_input_grad[2])
    return DX, DW, DB, None


@opforge.op("liger::layer_norm", setup_context=_layer_norm_setup, backward=_layer_norm_backward)
def layer_norm_op(X: Tensor, W: Tensor, B: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(Y, Mean, RSTD)."""
    Y, _, Mean, RSTD, _, _ = liger_ln.layer_norm_forward(X.contiguous(), W, B, eps)
    return Y, Mean, RSTD


def layer_norm(X, W, B, eps=1e-6):
    return layer_norm_op(X, W, B, eps)[0]


# --- SwiGLU (LigerSiLUMulFunction) and GeGLU (LigerGELUMulFunction) ---------------------------------


def _overwritable(t: Tensor, in_place: bool) -> Tensor:
    """What a backward helper that writes over `t` gets: a copy, or with
    in_place=True `t` itself, as Liger's Functions do (memory saved; the
    caller's tensor overwritten)."""
    return t.contiguous() if in_place else _contiguous_copy(t)


def _swiglu_setup(ctx, inputs, output):
    a, b, gate_multiplier, down_multiplier, in_place = inputs
    ctx.save_for_backward(a, b)
    ctx.gate_multiplier, ctx.down_multiplier, ctx.in_place = gate_multiplier, down_multiplier, in_place


def _swiglu_backward(ctx, dc):
    a, b = ctx.saved_tensors
    dc = dc.contiguous()
    if ctx.down_multiplier != 1.0:
        dc = dc * ctx.down_multiplier
    # swiglu_backward writes da and db over a and b.
    da, db = liger_swiglu.swiglu_backward(_overwritable(a, ctx.in_place), _overwritable(b, ctx.in_place), dc,
                                          ctx.gate_multiplier)
    return da, db, None, None, None


@opforge.op("liger::swiglu", setup_context=_swiglu_setup, backward=_swiglu_backward)
def swiglu(a: Tensor, b: Tensor, gate_multiplier: float = 1.0, down_multiplier: float = 1.0,
           in_place: bool = False) -> Tensor:
    """in_place=True has backward write da and db over a and b, as Liger's Function does."""
    _, _, c = liger_swiglu.swiglu_forward(a.contiguous(), b.contiguous(), gate_multiplier)
    if down_multiplier != 1.0:
        c = c * down_multiplier
    return c


def _geglu_setup(ctx, inputs, output):
    a, b, in_place = inputs
    ctx.save_for_backward(a, b)
    ctx.in_place = in_place


def _geglu_backward(ctx, dc):
    a, b = ctx.saved_tensors
    # geglu_backward writes da and db over a and b.
    da, db = liger_geglu.geglu_backward(_overwritable(a, ctx.in_place), _overwritable(b, ctx.in_place),
                                        dc.contiguous())
    return da, db, None


@opforge.op("liger::geglu", setup_context=_geglu_setup, backward=_geglu_backward)
def geglu(a: Tensor, b: Tensor, in_place: bool = False) -> Tensor:
    """in_place=True has backward write da and db over a and b, as Liger's Function does."""
    _, _, c = liger_geglu.geglu_forward(a.contiguous(), b.contiguous())
    return c


# --- RoPE (LigerRopeFunction) -------------------------------------------------------------------


def _rope_setup(ctx, inputs, output):
    _q, _k, cos, sin = inputs
    ctx.save_for_backward(cos, sin)


def _rope_backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    # rope_backward rotates dq and dk in place (when their transpose is contiguous): give it copies.
    dq, dk = liger_rope.rope_backward(dq.clone(), dk.clone(), cos, sin)
    return dq, dk, None, None


@opforge.op("liger::rope", setup_context=_rope_setup, backward=_rope_backward)
def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """q, k: (batch, heads, seq, head_dim); rope_forward rotates them in place, so it gets copies."""
    q, k, _, _ = liger_rope.rope_forward(q.clone(), k.clone(), cos, sin)
    return q, k


def _rope_in_place_setup(ctx, inputs, output):
    q, k, cos, sin = inputs
    ctx.mark_dirty(q, k)
    ctx.save_for_backward(cos, sin)


def _rope_in_place_backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    # As Liger's Function does: rope_backward rotates the incoming gradients in place.
    dq, dk = liger_rope.rope_backward(dq, dk, cos, sin)
    return dq, dk, None, None


@opforge.op("liger::rope_", mutates_args=("q", "k"), setup_context=_rope_in_place_setup,
            backward=_rope_in_place_backward)
def rope_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """LigerRopeFunction's semantics: rotates q and k in place and returns them. Eager
    only (an op returning its own inputs has no compiled form); q and k must not be
    leaves that require grad, as for any in-place op."""
    rq, rk, _, _ = liger_rope.rope_forward(q, k, cos, sin)
    # rope_forward rotates a copy when q's (batch, seq, heads, dim) view is not contiguous.
    if rq.data_ptr() != q.data_ptr():
        q.copy_(rq)
    if rk.data_ptr() != k.data_ptr():
        k.copy_(rk)
    return q, k


def rope_literal_body(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """The port without copies: Liger's kernel rotates the caller's q and k."""
    q, k, _, _ = liger_rope.rope_forward(q, k, cos, sin)
    return q.clone(), k.clone()


# --- Softmax (LigerSoftmaxFunction) -------------------------------------------------------------------


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    n_cols = output.shape[-1]
    ctx.BLOCK_SIZE, ctx.num_warps = _settings(n_cols)
    ctx.multi_block_launch = n_cols > ctx.BLOCK_SIZE


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return liger_softmax._softmax_backward(dy, y, ctx.BLOCK_SIZE, ctx.num_warps, ctx.multi_block_launch)


@opforge.op("liger::softmax", setup_context=_softmax_setup, backward=_softmax_backward)
def softmax(x: Tensor) -> Tensor:
    y, _, _, _ = liger_softmax._softmax_forward(x)
    return y


# --- CrossEntropy (LigerCrossEntropyFunction) ----------------------------------------------------------


def _ce_literal_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _ce_literal_backward(ctx, grad_loss, _grad_dx):
    (dx,) = ctx.saved_tensors
    return liger_ce.cross_entropy_backward(dx.clone(), grad_loss), None, None


def _ce_literal_fake(_input, target, ignore_index=-100):
    return _input.new_empty(()), torch.empty_like(_input)


@opforge.op("liger::cross_entropy_literal", setup_context=_ce_literal_setup, backward=_ce_literal_backward)
def cross_entropy_literal(_input: Tensor, target: Tensor, ignore_index: int = -100) -> tuple[Tensor, Tensor]:
    """(mean loss, its gradient): Liger's helpers as they are. Eager only."""
    # The kernel writes the gradient over the logits it is given, and computes it only
    # for logits that require grad.
    dx = _input.detach().clone().requires_grad_()
    loss, _, _, _, dx = liger_ce.cross_entropy_forward(dx, target, None, ignore_index, 0.0, 0.0, "mean", None, False)
    return loss, dx.detach()


def _ce_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _ce_backward(ctx, grad_loss, _grad_dx):
    (dx,) = ctx.saved_tensors
    dx = dx.clone()
    BT, V = dx.shape
    # What cross_entropy_backward launches for a scalar gradient; X_col_stride is left to its default.
    element_mul_kernel[(BT,)](dx, dx.stride(-2), grad_loss, V, BLOCK_SIZE=min(liger_ce.MAX_FUSED_SIZE,
                                                                              triton.next_power_of_2(V)),
                              num_warps=32 if not is_hip() else 16)
    return dx, None, None


@opforge.op("liger::cross_entropy_sum", setup_context=_ce_setup, backward=_ce_backward)
def cross_entropy_sum(_input: Tensor, target: Tensor, ignore_index: int = -100) -> tuple[Tensor, Tensor]:
    """(summed loss, its gradient), from Liger's kernel with reduction='sum', which
    needs no count of the non-ignored targets."""
    BT, V = _input.shape
    dx = _input.detach().clone(memory_format=torch.contiguous_format)  # the kernel writes the gradient here
    target = target.contiguous()
    loss_1d = torch.zeros(BT, dtype=_input.dtype, device=_input.device)
    liger_ce.liger_cross_entropy_kernel[(BT,)](
        X_ptr=dx, X_stride=dx.stride(-2), Y_ptr=target, Y_stride=target.stride(-1), weight_ptr=None,
        loss_ptr=loss_1d, z_loss_ptr=None, loss_stride=loss_1d.stride(-1), token_accuracy_ptr=None,
        token_accuracy_stride=0, predicted_tokens_ptr=None, predicted_tokens_stride=0, n_cols=V, n_non_ignore=1,
        sum_non_ignore_weight=1, weight_sum=0.0, ignore_index=ignore_index, lse_square_scale=0.0,
        label_smoothing=0.0, reduction="sum", softcap=None, RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=False,
        RETURN_PREDICTED_TOKENS=False, BLOCK_SIZE=min(liger_ce.MAX_FUSED_SIZE, triton.next_power_of_2(V)),
        HAS_WEIGHT=False, HAS_SOFTCAPPING=False, HAS_GRADIENTS=True, num_warps=32 if not is_hip() else 16)
    return loss_1d.sum(), dx


def cross_entropy(_input, target, ignore_index=-100):
    """Liger's mean cross entropy: the count of non-ignored targets is a tensor
    operation outside the op, so torch.compile traces it."""
    loss_sum, _ = cross_entropy_sum(_input, target, ignore_index)
    return loss_sum / (target != ignore_index).sum()


def liger_cross_entropy(_input, target, ignore_index=-100):
    return liger_ce.LigerCrossEntropyFunction.apply(_input, target, None, ignore_index)[0]


OPS = {
    "rms_norm": rms_norm_op,
    "layer_norm": layer_norm_op,
    "swiglu": swiglu,
    "geglu": geglu,
    "rope": rope,
    "rope_": rope_,
    "softmax": softmax,
    "cross_entropy": cross_entropy_sum,
}

__all__ = ["OPS", "rms_norm", "layer_norm", "swiglu", "geglu", "rope", "rope_", "softmax", "cross_entropy",
           "cross_entropy_literal", "liger_cross_entropy", "rope_literal_body"]
