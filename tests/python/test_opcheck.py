"""opforge.opcheck runs torch.library.opcheck on the flat op with the call
flattened; it passes for every op form that takes tensors."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal, Optional

import pytest
import torch

import opforge

Tensor = torch.Tensor
NS = "opcheck_forms"


class Mode(enum.Enum):
    ADD = "add"
    MUL = "mul"


@dataclass(frozen=True)
class Cfg:
    scale: float
    mode: Mode = Mode.ADD


@dataclass(frozen=True)
class Bias:
    b: Tensor
    gain: float = 1.0


@dataclass(frozen=True)
class Outer:
    cfg: Cfg
    bias: Optional[Bias] = None


@dataclass(frozen=True)
class Acc:
    out: Tensor
    alpha: float


@dataclass(frozen=True)
class Pair:
    lo: Tensor
    hi: Tensor


class Runner:
    def __init__(self, k: float):
        self.k = k


@opforge.op(f"{NS}::plain", fake=lambda x, s: torch.empty_like(x))
def plain(x: Tensor, s: float) -> Tensor:
    return x * s


@opforge.op(f"{NS}::nested", fake=lambda x, o: torch.empty_like(x))
def nested(x: Tensor, o: Outer) -> Tensor:
    out = x * o.cfg.scale if o.cfg.mode is Mode.MUL else x + o.cfg.scale
    return out if o.bias is None else out + o.bias.b * o.bias.gain


@opforge.op(f"{NS}::choice", fake=lambda x, how="one", dims=[0], dtype=torch.float32: x.new_empty(x.shape, dtype=dtype))
def choice(x: Tensor, how: Literal["one", "two"] = "one", dims: list[int] = [0],
           dtype: torch.dtype = torch.float32) -> Tensor:
    return (x + (1 if how == "one" else 2)).to(dtype)


@opforge.op(f"{NS}::accumulate", mutates_args=("acc",))
def accumulate(x: Tensor, acc: Acc) -> None:
    acc.out.add_(x * acc.alpha)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1].b)
    ctx.gain = inputs[1].gain


def _backward(ctx, g):
    x, b = ctx.saved_tensors
    return g * b * ctx.gain, {"b": g * x * ctx.gain}


@opforge.op(f"{NS}::mul", fake=lambda x, p: torch.empty_like(x), setup_context=_setup, backward=_backward)
def mul(x: Tensor, p: Bias) -> Tensor:
    return x * p.b * p.gain


@opforge.op(f"{NS}::run", fake=lambda x, r: torch.empty_like(x))
def run(x: Tensor, r: opforge.Handle[Runner]) -> Tensor:
    return x * r.k


@opforge.op(f"{NS}::split")
def split(x: Tensor) -> Pair:
    return Pair(x * 2, x * 3)


@split.register_fake
def _(x):
    return Pair(torch.empty_like(x), torch.empty_like(x))


@opforge.op(f"{NS}::stack", fake=lambda xs, w=None: torch.empty_like(xs[0]))
def stack(xs: list[Tensor], w: Optional[Tensor] = None) -> Tensor:
    out = torch.stack(xs).sum(0)
    return out if w is None else out * w


RUNNER = Runner(3.0)
X = torch.randn(3)

CASES = {
    "plain": (plain, (X, 2.0)),
    "nested_struct_optional_none": (nested, (X, Outer(Cfg(2.0, Mode.MUL)))),
    "nested_struct_optional_set": (nested, (X, Outer(Cfg(2.0), Bias(torch.randn(3), 0.5)))),
    "literal_list_dtype": (choice, (X, "two", [0], torch.float64)),
    "mutation_in_struct": (accumulate, (X, Acc(torch.zeros(3), 2.0))),
    "backward_with_struct_grads": (mul, (torch.randn(3, requires_grad=True),
                                         Bias(torch.randn(3, requires_grad=True), 2.0))),
    "handle": (run, (X, RUNNER)),
    "struct_return": (split, (X,)),
    "tensor_list_and_optional": (stack, ([X, X + 1], torch.randn(3))),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_opcheck_passes(case):
    op, args = CASES[case]
    result = opforge.opcheck(op, args)
    assert result == {name: "SUCCESS" for name in result}
    assert set(result) >= {"test_schema", "test_autograd_registration", "test_faketensor"}


def test_opcheck_accepts_keyword_arguments():
    result = opforge.opcheck(choice, (X,), {"how": "two", "dtype": torch.float64})
    assert set(result.values()) == {"SUCCESS"}


def test_opcheck_validates_the_call_like_the_op():
    with pytest.raises(ValueError, match=rf"{NS}::choice: parameter 'how': 'three' is not one of"):
        opforge.opcheck(choice, (X, "three"))
