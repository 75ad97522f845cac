"""Test inputs for generated ops, built from argument types and names.

    >>> op = next(o for o in _aten.select(["sub"], "myaten").ops if o.name == "sub_scalar")
    >>> [c.id for c in find_cases(op)]
    ['sub_scalar-f32', 'sub_scalar-f32-explicit', 'sub_scalar-f64']
    >>> find_cases(op)[1].args
    {'self': T((4, 4), seed=1), 'other': 2, 'alpha': 3}

Every argument gets a value from its type (a Tensor of the op's dtype, an
int, a dim, a list...), refined by its name (`index` is an in-range int64
tensor, `vec` is 1-D, `kernel_size` is `[2, 2]`) and by the few per-op hints
in `_hints.py` that names cannot express (a weight shaped for a
convolution). Candidates differ in rank, dtype and value range; the first
one that ATen accepts, and for which the out= (or in-place) overload agrees
with the functional one, becomes a case. If none does, the op gets one
case that skips with ATen's last error.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import torch

from . import _hints
from .casekit import Call, Case, Gen, Storage, T, run_case, resolve

# One size for every dimension: index tensors in [0, 4) are then valid for
# any dim, and square matrices satisfy the linear-algebra ops.
SIZE = 4
_RANKS = (2, 1, 3, 4, 0, 5)
_DTYPES = ("float32", "int64", "bool", "complex64")
_FLOAT_INITS = ("randn", "rand", "spd")

_INT = {
    "dim": -1, "k": 2, "n": 2, "steps": 5, "bins": 5, "high": 10, "low": 0, "num_samples": 2,
    "groups": 1, "size": SIZE, "split_size": 2, "start": 0, "length": 2, "p": 1, "diagonal": 0,
    "decimals": 1, "reduction": 1, "ignore_index": -100, "ind": 1, "storage_offset": 0,
    "fill_value": -1, "last_dim_size": SIZE, "normalization": 0, "m": 3, "dim0": 0, "dim1": 1,
}
_INT_ALTERNATIVES = {"dim": (0, 1), "k": (1,), "reduction": (0, 2)}
_FLOAT = {
    "eps": 1e-5, "momentum": 0.1, "p": 0.5, "tol": 1e-5, "rcond": 1e-5, "delta": 1.0, "beta": 1.0,
    "mean": 0.0, "std": 1.0, "q": 0.5, "d": 1.0, "base": 10.0, "lower": 0.125, "upper": 0.5,
}
_SCALAR = {
    "other": 2, "alpha": 2, "value": 1.5, "exponent": 2, "min": -0.5, "max": 0.5, "min_val": -1,
    "max_val": 1, "threshold": 0.5, "lambd": 0.5, "negative_slope": 0.01, "start": 0, "end": 5,
    "step": 1, "fill_value": 1.5, "p": 2, "weight": 0.3, "test_element": 1, "element": 1,
    "self": 2, "x": 0.5, "n": 3, "maxnorm": 1.0, "scale": 1, "input_scale": 1, "ord": 2,
    "correction": 1, "beta": 1,
}
_STR = {
    "reduce": ("sum", "add", "mean", "prod", "multiply", "amax", "amin"),
    "approximate": ("none", "tanh"),
    "rounding_mode": ("trunc", "floor"),
    "norm": ("backward", "ortho", "forward"),
    "interpolation": ("linear", "lower", "higher", "nearest", "midpoint"),
    "UPLO": ("L", "U"),
    "mode": ("reduced", "complete", "r"),
    "side": ("left", "right"),
    "driver": ("gelsy", "gelsd", "gelss", "gels"),
    "p": ("fro", "nuc"),
    "ord": ("fro", "nuc"),
}
_INT_LIST = {
    "size": [SIZE, SIZE], "dim": [-1], "dims": [0], "split_sizes": [1, 3], "dims_self": [1],
    "dims_other": [0], "s": [SIZE], "shifts": [1],
}
# Sized int lists whose every element has one natural value.
_INT_LIST_FILL = {
    "kernel_size": 2, "stride": 1, "padding": 1, "dilation": 1, "output_size": 2,
    "output_padding": 0, "dim": -1,
}
# Names that make a tensor 1-D, 2-D or 3-D whatever the candidate rank.
_NAME_RANK = {
    "vec": 1, "vec1": 1, "vec2": 1, "tensor": 1, "mat": 2, "mat1": 2, "mat2": 2, "batch1": 3,
    "batch2": 3, "boundaries": 1, "tau": 1,
}
# Names of int64 tensors holding positions along some dim.
_INDEX_NAMES = {"index", "indices", "LU_pivots", "pivots"}
_MASK_NAMES = {"mask", "condition"}

# Values for defaulted arguments in the "explicit" case, by name then type.
_EXPLICIT_BY_NAME = {
    "dim": (0, [0], 1), "keepdim": (True,), "alpha": (3,), "beta": (0.5,), "value": (2,),
    "diagonal": (1, -1), "reduction": (2, 0), "ignore_index": (1,), "n": (2, 3), "eps": (1e-3,),
    "fill_value": (0,), "decimals": (2,), "p": (3, 0.3, 1), "d": (0.5,), "base": (2.0,),
    "delta": (0.5,), "rcond": (1e-3,), "mean": (1.0,), "std": (2.0,), "lambd": (0.3,),
    "min_val": (-0.5,), "max_val": (0.5,), "negative_slope": (0.2,), "threshold": (1.0,),
    "nan": (0.0,), "posinf": (1.0,), "neginf": (-1.0,), "atol": (1e-3,), "rtol": (1e-3,),
    "divisor_override": (2,), "stable": (True,), "correction": (0, 2), "ord": (1, "nuc"),
    "norm": ("ortho", "forward"), "side": ("right",), "UPLO": ("U",), "mode": ("complete", "r"),
    "approximate": ("tanh",), "interpolation": ("nearest", "lower"), "range": ([-1.0, 1.0],),
    "scales": (2.0,), "scales_h": (2.0,), "scales_w": (2.0,), "scales_d": (2.0,),
    "upper": (True, 0.5), "lower": (0.2,), "stride": (2,), "padding": (1,), "dilation": (2,),
    "num_samples": (3,), "replacement": (True,), "out_int32": (True,), "right": (True,),
    "sorter": None, "generator": (Gen(1),), "memory_format": (torch.contiguous_format,),
    "dtype": (torch.float64,), "weight": None, "bias": None, "prepend": None, "append": None,
    "s": ([SIZE], [SIZE, SIZE]), "bins": (3,), "min": (-0.5, 0), "max": (0.5, 1), "step": (2,),
    "scale": (2,), "input_scale": (0.5,), "ind": (1,), "largest": (False,), "sorted": (False,),
    "descending": (True,), "driver": ("gelsd",), "hermitian": (True,),
    "check_errors": (True,), "pivot": (False, True), "left": (False,), "adjoint": (True,),
    "unitriangular": (True,), "transpose": (True,), "full_matrices": (False,),
    "compute_uv": (False,), "some": (False,), "unpack_data": (False,), "unpack_pivots": (False,),
    "density": (True,), "assume_unique": (True,), "invert": (True,), "include_self": (False,),
    "use_gelu": (True,), "training": (True,), "sparse_grad": (False,), "use_fast_accum": (True,),
    "half_to_float": (False,),
}


class Ctx:
    """What a candidate is built from: a rank, a dtype, a value range."""

    def __init__(self, rank: int, dtype: str, init: str):
        self.rank, self.dtype, self.init = rank, dtype, init
        self.seed = 0

    def t(self, shape=None, dtype=None, init=None) -> T:
        """A fresh tensor descriptor: the candidate's shape, dtype and init by default."""
        self.seed += 1
        if shape is None:
            shape = (SIZE,) * self.rank
        dtype = dtype or self.dtype
        if init is None:
            init = self.init if _is_float(dtype) else "randn"
        return T(shape, dtype, init, self.seed)

    def index(self, shape=None, high: int = SIZE) -> T:
        return self.t(shape, "int64", f"index:{high}")

    @property
    def torch_dtype(self):
        return getattr(torch, self.dtype)


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


@dataclass
class Found:
    args: dict
    ctx: Ctx


def _unwrap(type_):
    return type_.elements[0] if type_.kind == "Optional" else type_


def _tensor_for(name: str, ctx: Ctx) -> T:
    rank = _NAME_RANK.get(name, ctx.rank)
    shape = (SIZE,) * rank
    if name in _INDEX_NAMES:
        return ctx.index(shape)
    if name in _MASK_NAMES:
        return ctx.t(shape, "bool")
    if name == "boundaries" or name == "sorted_sequence":
        return ctx.t(shape, init="sorted")
    return ctx.t(shape)


def _required_value(argument, ctx: Ctx) -> list:
    """Candidate values for an argument without a default, best first."""
    name, type_ = argument.name, argument.type
    kind = type_.kind
    if kind == "Optional":
        return [None]
    if kind == "Tensor":
        return [_tensor_for(name, ctx)]
    if kind == "List":
        element = type_.elements[0]
        if element.kind == "Tensor":
            return [[ctx.t(), ctx.t()]]
        if element.kind == "Optional" and element.elements[0].kind == "Tensor":
            return [[ctx.index((SIZE,))]]
        if element.kind in ("int", "SymInt"):
            if argument.N and argument.N > 1 and name.startswith("dim"):
                return [list(range(-argument.N, 0))]
            if argument.N and name in _INT_LIST_FILL:
                return [[_INT_LIST_FILL[name]] * argument.N]
            if name in _INT_LIST:
                return [list(_INT_LIST[name])]
            return [[1] * (argument.N or 1)]
        if element.kind == "float":
            return [[1.0] * (argument.N or 1)]
        if element.kind == "bool":
            return [[True] * (argument.N or 1)]
        return [[]]
    if kind in ("int", "SymInt"):
        first = _INT.get(name, 1)
        return [first] + [v for v in _INT_ALTERNATIVES.get(name, ()) if v != first]
    if kind == "float":
        return [_FLOAT.get(name, 0.5)]
    if kind == "Scalar":
        return [_SCALAR.get(name, 2)]
    if kind == "bool":
        return [False, True]
    if kind == "str":
        return list(_STR.get(name, ("",)))
    if kind == "ScalarType":
        return [ctx.torch_dtype, torch.float32, torch.float64]
    if kind == "Storage":
        return [Storage(ctx.t())]
    return [None]


def _explicit_values(argument, ctx: Ctx, base_args: dict) -> list:
    """Non-default values to try for a defaulted argument."""
    name, type_ = argument.name, _unwrap(argument.type)
    default = argument.default_value
    named = _EXPLICIT_BY_NAME.get(name, ())
    if named is None:
        named = ()
    values = [v for v in named if v != default]
    kind = type_.kind
    if kind == "Tensor":
        self_like = next((v for v in base_args.values() if isinstance(v, T)), None)
        shapes = []
        if self_like is not None:
            shapes = [self_like.shape, (self_like.shape[-1],) if self_like.shape else ()]
        shapes += [(SIZE,), ()]
        for shape in dict.fromkeys(shapes):
            values.append(ctx.t(shape))
    elif kind == "bool":
        values.append(not default if isinstance(default, bool) else True)
    elif kind in ("int", "SymInt") and isinstance(default, int):
        values += [default + 1, 0]
    elif kind == "float" and isinstance(default, float):
        values += [default * 0.5 if default else 0.5]
    elif kind == "Scalar" and isinstance(default, (int, float)):
        values += [default * 2 if default else 1]
    elif kind == "List" and type_.elements[0].kind in ("int", "SymInt"):
        n = argument.N or 1
        values += [[0] * n if name.startswith("dim") else [1] * n, [-1] * n, [2] * n]
        if name.startswith("dim"):
            values += [[-1], [0, 1], [-2, -1]]
    elif kind == "ScalarType":
        values += [torch.float64]
    elif kind == "Generator":
        values += [Gen(1)]
    elif kind in ("int", "SymInt") and default is None:
        values += [0, 1, 2]
    elif kind == "float" and default is None:
        values += [1e-3, 0.5]
    elif kind == "Scalar" and default is None:
        values += [1, 0.5]
    elif kind == "str":
        values += [s for s in _STR.get(name, ()) if s != default]
    out = []
    for v in values:
        if v != default and v not in out:
            out.append(v)
    return out


def _case(op, args: dict, ctx: Ctx, label: str, hint) -> Case:
    ref_kwargs = {}
    if op.reference and "dtype" in op.reference_extra:
        ref_kwargs["dtype"] = ctx.torch_dtype
    out_dtypes = dict(hint.out_dtypes) if hint and hint.out_dtypes else {}
    return Case(op=op.name, target=op.target_qualified, reference=op.reference, kind=op.kind,
                args=args, outs=tuple(op.out_arguments), ref_kwargs=ref_kwargs,
                out_dtypes=out_dtypes, check=hint.check if hint else "close", label=label)


def _try(case: Case) -> str | None:
    """None if the ATen target passes the case, else ATen's error."""
    target = resolve(case.target)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_case(case, target)
            # Twice: a case whose result differs between runs cannot check anything.
            run_case(case, target)
    except Exception as e:  # ATen's errors are RuntimeError, ValueError, TypeError, ...
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return None


def _label(dtype: str) -> str:
    return {"float32": "f32", "float64": "f64", "int64": "i64", "int32": "i32", "bool": "bool",
            "complex64": "c64", "complex128": "c128"}.get(dtype, dtype)


def _map_tensors(value, fn):
    if isinstance(value, T):
        return fn(value)
    if isinstance(value, Call):
        return Call(value.target, _map_tensors(value.args, fn), value.pick, value.like)
    if isinstance(value, Storage):
        return Storage(fn(value.tensor))
    if isinstance(value, list):
        return [_map_tensors(v, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def find_cases(op) -> list[Case]:
    """Cases for one generated op: defaults, explicit arguments, another dtype."""
    hint = _hints.hint_for(op)
    if hint and hint.skip:
        return [Case(op=op.name, target=op.target_qualified, reference=op.reference, kind=op.kind,
                     args={}, outs=tuple(op.out_arguments), label="", skip=hint.skip)]
    arguments = [a for a in op.schema.arguments if a.name not in op.out_arguments]
    named = [a.name for a in arguments if "Dimname" in str(a.type)]
    if named:
        # The op itself is generated; only its test would need named tensors.
        return [Case(op=op.name, target=op.target_qualified, reference=op.reference, kind=op.kind,
                     args={}, outs=tuple(op.out_arguments), label="",
                     skip=f"{op.target_qualified} takes a Dimname ({', '.join(named)}): it needs named "
                          "tensors, which these tests do not build")]
    ranks = hint.ranks if hint and hint.ranks else _RANKS
    dtypes = hint.dtypes if hint and hint.dtypes else _DTYPES
    errors: list[str] = []
    found = None
    for rank, dtype in itertools.product(ranks, dtypes):
        inits = (hint.inits if hint and hint.inits else _FLOAT_INITS) if _is_float(dtype) else ("randn",)
        for init in inits:
            ctx = Ctx(rank, dtype, init)
            choices = _candidates(arguments, ctx, hint)
            if choices is None:
                continue
            args = {name: values[0] for name, values in choices.items()}
            error = _try(_case(op, args, ctx, _label(dtype), hint))
            if error is None:
                found = Found(args, ctx)
                break
            errors.append(error)
            for name, values in choices.items():
                for value in values[1:]:
                    trial = dict(args, **{name: value})
                    error = _try(_case(op, trial, ctx, _label(dtype), hint))
                    if error is None:
                        found = Found(trial, ctx)
                        break
                if found:
                    break
            if found:
                break
        if found:
            break
    if not found:
        return [Case(op=op.name, target=op.target_qualified, reference=op.reference, kind=op.kind,
                     args={}, outs=tuple(op.out_arguments), label="", skip=_skip_reason(op, errors))]

    ctx = found.ctx
    # Cases are labelled by the dtype of their data: the first tensor's, or
    # the output's for factory functions.
    dtype = _first_dtype(found.args) or ctx.dtype
    label = _label(dtype)
    cases = [_case(op, found.args, ctx, label, hint)]

    explicit = dict(found.args)
    changed = []
    fixed = set(hint.args) if hint and hint.args else set()
    if hint and hint.build:
        fixed |= set(hint.build(Ctx(ctx.rank, ctx.dtype, ctx.init)))
    for argument in arguments:
        if not argument.has_default or argument.name in fixed:
            continue
        for value in _explicit_values(argument, ctx, found.args):
            trial = _insert(explicit, arguments, argument.name, value)
            if _try(_case(op, trial, ctx, label, hint)) is None:
                explicit = trial
                changed.append(argument.name)
                break
    if changed:
        cases.append(_case(op, explicit, ctx, label + "-explicit", hint))

    other = {"float32": "float64", "int64": "int32"}.get(dtype)
    if other:
        converted = _map_tensors(found.args, lambda t: t.with_(dtype=other) if t.dtype == dtype else t)
        converted = {k: (getattr(torch, other) if v is getattr(torch, dtype) else v) for k, v in converted.items()}
        factory = _first_dtype(found.args) is None
        if factory or repr(converted) != repr(found.args):
            case = _case(op, converted, Ctx(ctx.rank, other if factory else ctx.dtype, ctx.init),
                         _label(other), hint)
            if _try(case) is None:
                cases.append(case)
    return cases


def _first_dtype(value) -> str | None:
    """The dtype of the first tensor descriptor in `value`, or None."""
    if isinstance(value, T):
        return value.dtype
    if isinstance(value, Call):
        return _first_dtype(value.args)
    if isinstance(value, Storage):
        return value.tensor.dtype
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return None
    for item in items:
        found = _first_dtype(item)
        if found:
            return found
    return None


def _skip_reason(op, errors: list[str]) -> str:
    """Why no case was found, from ATen's errors on the candidates."""
    for error in errors:
        if "Could not run" in error and "'CPU' backend" in error:
            return f"ATen has no CPU kernel for {op.target_qualified}; it is not exercised on CPU"
    first = errors[0] if errors else "no candidate could be built"
    return f"no generated input is accepted by {op.target_qualified} on CPU; first error: {first}"


def _insert(args: dict, arguments, name: str, value) -> dict:
    """`args` with `name` set, keeping schema order."""
    merged = dict(args)
    merged[name] = value
    order = [a.name for a in arguments]
    return {k: merged[k] for k in order if k in merged}


def _candidates(arguments, ctx: Ctx, hint) -> dict | None:
    """Candidate values per argument that the defaults case passes."""
    fixed = dict(hint.args) if hint and hint.args else {}
    if hint and hint.build:
        fixed.update(hint.build(ctx))
    choices = {}
    for argument in arguments:
        name = argument.name
        if name in fixed:
            value = fixed[name]
            if callable(value) and not isinstance(value, (T, Call, Gen, Storage)):
                value = value(ctx)
            if value is _hints.OMIT:
                continue
            choices[name] = list(value) if isinstance(value, _hints.OneOf) else [value]
        elif argument.has_default:
            continue
        else:
            choices[name] = _required_value(argument, ctx)
    return choices
