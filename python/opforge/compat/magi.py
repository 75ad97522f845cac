"""MagiCompiler's `magi_register_custom_op`, built on `@opforge.op`.

    from opforge.compat.magi import magi_register_custom_op

    @magi_register_custom_op()                      # in my_kernels.py
    def scale(x: torch.Tensor, cfg: ScaleCfg) -> torch.Tensor:
        return x * cfg.factor

    scale.name                         # 'my_kernels::scale'  (file stem :: function name)
    scale(x, ScaleCfg(factor=2.0))     # the original signature
    torch.ops.my_kernels.scale(x, 2.0) # the flat leaves
    scale._magi_param_mapping_tree     # [('primitive', 'x', 'x', None),
                                       #  ('dataclass', 'cfg', ScaleCfg,
                                       #   [('primitive', 'factor', 'cfg__factor', None)])]

As in MagiCompiler: the meta function may be a function, a list of parameter
names (each output is `empty_like` that parameter) or None (`empty_like` of the
first N tensor inputs, N from the return annotation); Literal and Enum
parameters reach the body as their raw values; `setup_context_fn` and
`backward_fn` work on the original signature; errors start with MagiCompiler's
words. `is_compute_sensitive` and `is_subgraph_boundary` mean nothing to
opforge: they are recorded (`compute_sensitive_ops()`,
`subgraph_boundary_ops()`) and, when MagiCompiler is installed, added to its
compile config as MagiCompiler does. Every op is a lockstep-replay op of
MagiCompiler's profiler, with its `materialize_inputs` hook
(`lockstep_replay_ops()`, and `magi_compiler.profiling` when installed).

`set_strict(True)` (or `OPFORGE_MAGI_STRICT=1`) rejects what opforge accepts
beyond MagiCompiler: int Literals, int Enums, `Optional[list[Tensor]]` and
returned dataclasses.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.util
import inspect
import os
import re
import sys
import threading
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .. import _op
from .._codegen import EMPTY, Param, gradients_per_parameter
from .._types import Problem, SignatureError, TypeInfo, Where
from ..triton import _kernels
from ._common import all_tensor_params, check_name_free, signature_types

__all__ = ["compute_sensitive_ops", "lockstep_replay_ops", "magi_register_custom_op", "set_strict",
           "subgraph_boundary_ops"]

_lock = threading.Lock()
_compute_sensitive: list[str] = []
_subgraph_boundary: list[str] = []
_replay_hooks: dict[str, Callable | None] = {}
_strict = os.environ.get("OPFORGE_MAGI_STRICT", "").lower() in ("1", "true", "yes")

# MagiCompiler's force_register_mode -> @opforge.op's triton=.
_TRITON_MODES = {None: "auto", "triton_op": "force", "custom_op": "off"}

# MagiCompiler's words for what opforge's own errors are about; opforge's fix
# follows them.
_MAGI_WORDS = {
    Problem.TUPLE: "has tuple annotation {annotation}; use list[...].",
    Problem.DICT: "has dict-typed annotation {annotation}.",
    Problem.UNRESOLVED: "has unresolved string annotation {annotation}.",
    Problem.NO_ANNOTATION: "has no type annotation.",
}
_MAGI_GRADIENT_COUNT = "backward_fn returned {returned} grad(s) but the function has {expected} input(s)"

# MagiCompiler's default helper depth for its Triton scan (its PR #33).
_MAGI_INTROSPECT_DEPTH = 5


def magi_register_custom_op(
    name: str | None = None,
    mutates_args: Sequence[str] = (),
    infer_output_meta_fn: Callable | list[str] | None = None,
    setup_context_fn: Callable | None = None,
    backward_fn: Callable | None = None,
    is_compute_sensitive: bool = False,
    is_subgraph_boundary: bool = False,
    extra_triton_kernels: Sequence[Any] | None = None,
    force_register_mode: str | None = None,
    materialize_inputs: Callable | None = None,
    max_introspect_depth: int = _MAGI_INTROSPECT_DEPTH,
    has_internal_collective: bool | None = None,
) -> Callable[[Callable], _op.OpDef]:
    """Registers the decorated function as the op `name` (default
    `<file stem>::<function name>`) and returns it as an `opforge.OpDef`."""
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"magi_register_custom_op: name must be 'namespace::op' or None, not {type(name).__name__}. "
            f"Write @magi_register_custom_op() with parentheses."
        )
    if force_register_mode not in _TRITON_MODES:
        raise ValueError(
            f"magi_register_custom_op: force_register_mode={force_register_mode!r} is not one of "
            f"None, 'triton_op', 'custom_op'."
        )
    if materialize_inputs is not None and not callable(materialize_inputs):
        raise TypeError(
            f"magi_register_custom_op: materialize_inputs must be a function taking the op's flat arguments, "
            f"not {type(materialize_inputs).__name__}. Pass a function or None."
        )
    if type(max_introspect_depth) is not int or max_introspect_depth < 0:
        raise ValueError(
            f"magi_register_custom_op: max_introspect_depth={max_introspect_depth!r} is not a count of helper "
            f"calls. Pass an int >= 0."
        )
    if has_internal_collective is not None:
        _dropped_internal_collective()

    def decorator(fn: Callable) -> _op.OpDef:
        return _register(
            fn,
            name if name is not None else default_op_name(fn),
            mutates_args=mutates_args,
            meta=infer_output_meta_fn,
            setup_context_fn=setup_context_fn,
            backward_fn=backward_fn,
            compute_sensitive=is_compute_sensitive,
            subgraph_boundary=is_subgraph_boundary,
            triton=_TRITON_MODES[force_register_mode],
            extra_triton_kernels=tuple(extra_triton_kernels or ()),
            materialize_inputs=materialize_inputs,
            caller=sys._getframe(1),
        )

    return decorator


def set_strict(enabled: bool) -> bool:
    """Whether ops registered from now on reject what MagiCompiler rejects
    and opforge accepts (int Literals, int Enums, `Optional[list[Tensor]]`,
    returned dataclasses, `has_internal_collective=`); returns the previous
    setting. `OPFORGE_MAGI_STRICT=1` starts the process in strict mode."""
    global _strict
    with _lock:
        previous, _strict = _strict, bool(enabled)
    return previous


def compute_sensitive_ops() -> tuple[str, ...]:
    """Ops registered with `is_compute_sensitive=True`, in registration order."""
    with _lock:
        return tuple(_compute_sensitive)


def subgraph_boundary_ops() -> tuple[str, ...]:
    """Ops registered with `is_subgraph_boundary=True`, in registration order."""
    with _lock:
        return tuple(_subgraph_boundary)


def lockstep_replay_ops() -> dict[str, Callable | None]:
    """Every op registered here, as MagiCompiler's profiler replays it (in
    lockstep across ranks), with its `materialize_inputs` hook or None:
    {'my_kernels::attn_cp': attn_cp_inputs, 'my_kernels::scale': None}."""
    with _lock:
        return dict(_replay_hooks)


def default_op_name(fn: Callable) -> str:
    """`<file stem>::<function name>`, as MagiCompiler names ops:
    `def rms_norm` in `kernels/norm.py` -> 'norm::rms_norm'."""
    try:
        namespace = re.sub(r"[^a-zA-Z0-9_]", "_", Path(inspect.getfile(fn)).stem)
    except (TypeError, OSError):
        namespace = "magi_custom"
    return f"{namespace}::{fn.__name__}"


def _dropped_internal_collective() -> None:
    fix = ("MagiCompiler dropped it: every op it registers replays in lockstep across ranks, as every op "
           "registered here does. Delete the argument.")
    if _strict:
        raise TypeError(f"magi_register_custom_op() got an unexpected keyword argument 'has_internal_collective'. "
                        f"{fix}")
    warnings.warn(f"magi_register_custom_op: has_internal_collective is ignored. {fix}", DeprecationWarning,
                  stacklevel=3)


def _register(fn, op_name, *, mutates_args, meta, setup_context_fn, backward_fn, compute_sensitive,
              subgraph_boundary, triton, extra_triton_kernels, materialize_inputs, caller) -> _op.OpDef:
    check_name_free(op_name)
    try:
        params, ret_types = signature_types(op_name, fn, caller)
    except SignatureError as e:
        words = _MAGI_WORDS[e.problem].format(annotation=e.annotation)
        raise TypeError(f"{e.op}: {e.where} {words} {e.fix}") from None
    if _strict:
        _reject_what_magi_rejects(op_name, params, ret_types)
    if isinstance(mutates_args, str) and mutates_args == "unknown":
        mutates_args = all_tensor_params(params)
    else:
        _check_mutates_args(op_name, params, mutates_args)

    if setup_context_fn is not None and backward_fn is None:
        warnings.warn(
            f"{op_name}: setup_context_fn is ignored without backward_fn, as in MagiCompiler. "
            f"Pass backward_fn= as well, or drop setup_context_fn.",
            stacklevel=3,
        )
        setup_context_fn = None

    plan = _raw_value_plan(params)
    if meta is None:
        fake = None
    elif isinstance(meta, (list, tuple)):
        fake = _meta_from_param_names(op_name, params, list(meta))
    elif callable(meta):
        fake = _with_raw_values(meta, plan) if plan else meta
    else:
        raise TypeError(
            f"{op_name}: infer_output_meta_fn must be a function, a list of parameter names or None, "
            f"not {type(meta).__name__}."
        )
    body = _body_with_raw_values(fn, plan) if plan else fn
    if plan and setup_context_fn is not None:
        setup_context_fn = _setup_with_raw_values(setup_context_fn, plan)
    if backward_fn is not None:
        backward_fn = _backward_in_magi_words(op_name, backward_fn, [p.name for p in params])

    try:
        opdef = _op.define(
            op_name,
            body,
            mutates_args=mutates_args,
            fake=fake,
            setup_context=setup_context_fn,
            backward=backward_fn,
            triton=triton,
            extra_triton_kernels=extra_triton_kernels,
            _caller=caller,
            # No meta function: a Triton op traces its own body (as
            # MagiCompiler's triton_op path does); any other op gets the
            # identity meta.
            _default_fake=(lambda: _identity_meta(op_name, params, ret_types)) if ret_types else None,
        )
    except _kernels.KernelError as e:
        # MagiCompiler rejects an outermost @triton.heuristics with a
        # RuntimeError; code written against it catches that.
        if _kernels.classify(e.kernel) == "heuristics":
            raise RuntimeError(str(e)) from None
        raise
    opdef.__wrapped__ = fn
    tree = _mapping_tree(opdef, params)
    opdef._magi_torch_registered_op = opdef.overload
    opdef._magi_param_mapping_tree = tree
    opdef._magi_flat_plan = tree  # the name earlier MagiCompiler releases used
    _record_flags(op_name, compute_sensitive, subgraph_boundary)
    _record_replay(op_name, materialize_inputs)
    return opdef


def _reject_what_magi_rejects(op_name: str, params: list[Param], ret_types: list[TypeInfo]) -> None:
    """Strict mode: MagiCompiler's errors for the annotations opforge
    accepts beyond it."""
    fix = "opforge accepts it: call opforge.compat.magi.set_strict(False) to allow it."

    def check(t: TypeInfo, where: Where) -> None:
        if t.kind == "literal" and not all(isinstance(v, str) for v in t.allowed):
            raise TypeError(f"{op_name}: {where} has Literal {t.text}; only Literal[str, ...] is auto-downgraded. "
                            f"Use str values, or {fix}")
        if t.kind == "enum" and not all(isinstance(m.value, str) for m in t.py):
            raise TypeError(f"{op_name}: {where} has non-string Enum {t.py.__qualname__!r}. Use str values, "
                            f"or {fix}")
        if t.kind == "list" and t.optional and t.element.kind == "tensor":
            raise ValueError(f"{op_name}: {where} has unsupported type Optional[list[Tensor]]. Use "
                             f"list[Optional[Tensor]], or {fix}")
        for field, ft in t.fields.items():
            check(ft, where.at_field(t.py, field))

    for p in params:
        check(p.type, Where.parameter(p.name))
    for t in ret_types:
        if t.kind == "struct":
            raise TypeError(f"{op_name}: returns dataclass {t.py.__qualname__!r}; only Tensor / tuple[Tensor, ...] / "
                            f"list[Tensor] are supported. Return its tensors as a tuple, or {fix}")


def _check_mutates_args(op_name: str, params: list[Param], names: Sequence[str]) -> None:
    """MagiCompiler's rule: each entry names a parameter or a flat leaf."""
    known = _parameter_names(params)
    for name in names:
        if name not in known:
            leaves = [n for n, (_i, path, _t) in known.items() if path]
            raise ValueError(
                f"{op_name}: mutates_args entry {name!r} does not match any parameter. Name a parameter "
                f"({', '.join(p.name for p in params)})" + (f" or a leaf ({', '.join(leaves)})." if leaves else ".")
            )


def _backward_in_magi_words(op_name: str, backward_fn: Callable, names: list[str]) -> Callable:
    """backward_fn, its gradient count checked with MagiCompiler's words."""

    def backward(ctx, *grads):
        return gradients_per_parameter(op_name, backward_fn(ctx, *grads), names, _MAGI_GRADIENT_COUNT)

    return backward


# MagiCompiler lowers Literal and Enum parameters to `str` and the body gets
# the raw value; @opforge.op gives the body Enum members. The shim converts
# back, so a body written for MagiCompiler (`mode == "a"`) keeps working.

def _raw_value_plan(params: list[Param]) -> list[tuple[int, str, Callable]]:
    plan = []
    for index, p in enumerate(params):
        convert = _raw_value_converter(p.type)
        if convert is not None:
            plan.append((index, p.name, convert))
    return plan


def _raw_value_converter(t: TypeInfo) -> Callable | None:
    """Replaces Enum members by their values inside a value of type `t`;
    None when `t` holds no Enum."""
    if t.kind == "enum":
        return _enum_value
    if t.kind == "list" and t.element is not None:
        inner = _raw_value_converter(t.element)
        if inner is None:
            return None
        return lambda value: value if value is None else [inner(v) for v in value]
    if t.kind == "struct":
        fields = [(name, c) for name, ft in t.fields.items() if (c := _raw_value_converter(ft)) is not None]
        if not fields:
            return None

        def convert_struct(value):
            if value is None:
                return None
            return dataclasses.replace(value, **{name: c(getattr(value, name)) for name, c in fields})

        return convert_struct
    return None


def _enum_value(value):
    return value.value if isinstance(value, enum.Enum) else value


def _convert_args(plan, args: tuple, kwargs: dict) -> tuple[list, dict]:
    args = list(args)
    for index, name, convert in plan:
        if index < len(args):
            args[index] = convert(args[index])
        elif name in kwargs:
            kwargs[name] = convert(kwargs[name])
    return args, kwargs


def _with_raw_values(fn: Callable, plan) -> Callable:
    def call(*args, **kwargs):
        args, kwargs = _convert_args(plan, args, kwargs)
        return fn(*args, **kwargs)

    return call


def _body_with_raw_values(fn: Callable, plan) -> Callable:
    """`fn` behind the conversion, looking like `fn` to `@opforge.op`: same
    signature, annotations and globals, so string annotations resolve."""

    def make(_opforge_target, _opforge_plan, _opforge_convert):
        def call(*args, **kwargs):
            args, kwargs = _opforge_convert(_opforge_plan, args, kwargs)
            return _opforge_target(*args, **kwargs)

        return call

    call = make(fn, plan, _convert_args)
    body = types.FunctionType(call.__code__, fn.__globals__, fn.__name__, None, call.__closure__)
    body.__signature__ = inspect.signature(fn)
    body.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    body.__qualname__ = fn.__qualname__
    body.__module__ = fn.__module__
    body.__doc__ = fn.__doc__
    return body


def _setup_with_raw_values(setup_context: Callable, plan) -> Callable:
    def setup(ctx, inputs, output):
        inputs = list(inputs)
        for index, _name, convert in plan:
            inputs[index] = convert(inputs[index])
        return setup_context(ctx, tuple(inputs), output)

    return setup


def _param_values(params: list[Param], args: tuple, kwargs: dict) -> list:
    values = []
    for index, p in enumerate(params):
        if index < len(args):
            values.append(args[index])
        elif p.name in kwargs:
            values.append(kwargs[p.name])
        else:
            values.append(None if p.default is EMPTY else p.default)
    return values


def _tensors_in(value, t: TypeInfo):
    """Tensors of one argument in leaf order (struct fields depth-first)."""
    if t.kind == "tensor":
        if isinstance(value, torch.Tensor):
            yield value
    elif t.kind == "struct" and value is not None:
        for name, ft in t.fields.items():
            yield from _tensors_in(getattr(value, name), ft)


def _tensor_leaf_count(t: TypeInfo) -> int | None:
    """How many tensors describe a value of this return type, or None if
    some part of it is not a (non-optional) Tensor."""
    if t.optional:
        return None
    if t.kind == "tensor":
        return 1
    if t.kind == "struct":
        counts = [_tensor_leaf_count(ft) for ft in t.fields.values()]
        return None if any(c is None for c in counts) else sum(counts)
    return None


def _build_like(t: TypeInfo, tensors) -> Any:
    """A return value of type `t` whose tensors come from `tensors` in leaf order."""
    if t.kind == "tensor":
        return next(tensors)
    return t.py(**{name: _build_like(ft, tensors) for name, ft in t.fields.items()})


def _identity_meta(op_name: str, params: list[Param], ret_types: list[TypeInfo]) -> Callable:
    """MagiCompiler's default meta: output i is `empty_like` of the i-th
    tensor input. `f(scale: float, x, y) -> tuple[Tensor, Tensor]` gives
    `(empty_like(x), empty_like(y))`; a returned dataclass of tensors takes
    one input per tensor field, in field order."""
    counts = [_tensor_leaf_count(t) for t in ret_types]
    tensors_only = all(c is not None for c in counts)
    returns = ", ".join(t.text for t in ret_types)
    for t, c in zip(ret_types, counts):
        if t.kind == "struct" and c is None:
            # Eager calls would work and torch.compile would fail later; say
            # so where the op is declared.
            raise TypeError(
                f"{op_name}: the default meta function describes Tensor outputs only, and the returned "
                f"{t.py.__qualname__} has fields that are not Tensors. Pass infer_output_meta_fn= (a "
                f"function returning a {t.py.__qualname__} of empty tensors)."
            )
    count = sum(c or 0 for c in counts)

    def identity_meta(*args, **kwargs):
        if not tensors_only:
            raise TypeError(
                f"{op_name}: the default meta function describes Tensor outputs only, and this op returns "
                f"({returns}). Pass infer_output_meta_fn= (a function returning the outputs' empty tensors)."
            )
        found = []
        for value, p in zip(_param_values(params, args, kwargs), params):
            for t in _tensors_in(value, p.type):
                found.append(t)
                if len(found) == count:
                    empties = iter([torch.empty_like(x) for x in found])
                    outs = [_build_like(t, empties) for t in ret_types]
                    return outs[0] if len(outs) == 1 else tuple(outs)
        raise ValueError(
            f"{op_name}: the default meta function needs {count} tensor input(s) to copy the output "
            f"shape(s) from, but the call has {len(found)}. Pass infer_output_meta_fn= (a function, or "
            f"the names of the parameters whose shape each output takes)."
        )

    return identity_meta


def _parameter_names(params: list[Param]) -> dict[str, tuple[int, tuple[str, ...], TypeInfo]]:
    """Every name infer_output_meta_fn and mutates_args may list, as in
    MagiCompiler: parameters, and struct fields by their flat name
    ('cfg__bias'). name -> (param index, field path, type)."""
    out = {}

    def walk(prefix, index, path, t):
        out[prefix] = (index, path, t)
        if t.kind == "struct":
            for name, ft in t.fields.items():
                walk(f"{prefix}__{name}", index, (*path, name), ft)

    for index, p in enumerate(params):
        walk(p.name, index, (), p.type)
    return out


def _meta_from_param_names(op_name: str, params: list[Param], names: list[str]) -> Callable:
    """`infer_output_meta_fn=["weight", "bias"]`: output i is `empty_like`
    of the i-th named parameter."""
    known = _parameter_names(params)
    tensors = [n for n, (_i, _p, t) in known.items() if t.kind == "tensor"]
    getters = []
    for name in names:
        if name not in known:
            raise ValueError(
                f"{op_name}: infer_output_meta_fn: {name!r} is not a parameter. "
                f"Name Tensor parameters, e.g. {tensors!r}."
            )
        index, path, t = known[name]
        if t.kind != "tensor":
            raise ValueError(
                f"{op_name}: infer_output_meta_fn: parameter {name!r} is {t.text}, not a Tensor. "
                f"Name only Tensor parameters ({tensors!r}), or pass a function."
            )
        getters.append((name, index, path))

    def meta(*args, **kwargs):
        values = _param_values(params, args, kwargs)
        outs = []
        for name, index, path in getters:
            value = values[index]
            for field in path:
                value = None if value is None else getattr(value, field)
            if not isinstance(value, torch.Tensor):
                raise ValueError(
                    f"{op_name}: infer_output_meta_fn names {name!r}, which is None in this call. "
                    f"Pass a function as infer_output_meta_fn to describe this case."
                )
            outs.append(torch.empty_like(value))
        return outs[0] if len(outs) == 1 else tuple(outs)

    return meta


def _mapping_tree(opdef: _op.OpDef, params: list[Param]) -> list[tuple]:
    """MagiCompiler's `param_mapping_tree`, built from opforge's."""
    leaf_names = [leaf.name for leaf in opdef.model.leaves]

    def convert(node, t: TypeInfo):
        if node.is_leaf:
            return ("primitive", node.name, leaf_names[node.leaf_index], None)
        return ("dataclass", node.name, t.py, [convert(c, t.fields[c.name]) for c in node.children])

    return [convert(node, p.type) for node, p in zip(opdef.model.params, params)]


def _record_flags(op_name: str, compute_sensitive: bool, subgraph_boundary: bool) -> None:
    if not (compute_sensitive or subgraph_boundary):
        return
    with _lock:
        if compute_sensitive:
            _compute_sensitive.append(op_name)
        if subgraph_boundary:
            _subgraph_boundary.append(op_name)
    config = _magi_module("magi_compiler.config")
    if config is None:
        return
    # MagiCompiler's compiler reads these lists; keep them filled for users
    # who still compile with magi_compile.
    try:
        compile_config = config.get_compile_config()
        if compute_sensitive:
            compile_config.recompute_config.custom_compute_sensitive_ops.append(op_name)
        if subgraph_boundary:
            compile_config.splitting_ops.append(op_name)
    except Exception as e:  # an incompatible MagiCompiler release
        _incompatible(op_name, "compile config", e)


def _record_replay(op_name: str, hook: Callable | None) -> None:
    """As MagiCompiler's decorator does: the op replays in lockstep across
    ranks when its profiler measures it, through `hook` if given."""
    with _lock:
        _replay_hooks[op_name] = hook
    profiling = _magi_module("magi_compiler.profiling")
    if profiling is None:
        return
    try:
        register = profiling.register_materialize_inputs
        # Releases between MagiCompiler's PR #58 and the next mark lockstep
        # ops with a flag; later ones mark every registered op.
        if "has_internal_collective" in inspect.signature(register).parameters:
            register(op_name, hook, has_internal_collective=True)
        else:
            register(op_name, hook)
    except Exception as e:
        _incompatible(op_name, "profiling registry", e)


def _incompatible(op_name: str, what: str, e: Exception) -> None:
    warnings.warn(
        f"{op_name}: could not add the op to MagiCompiler's {what} ({type(e).__name__}: {e}); "
        f"opforge.compat.magi still lists it.",
        stacklevel=5,
    )


def _magi_module(name: str):
    """MagiCompiler's module `name` when MagiCompiler is installed, else None."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        if importlib.util.find_spec("magi_compiler") is None:
            return None
        return importlib.import_module(name)
    except Exception:
        return None
