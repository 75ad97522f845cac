"""`@opforge.op`: define an operator from a Python function.

    @opforge.op("mylib::attn")
    def attn(q: Tensor, cfg: AttnCfg, mode: Mode = Mode.FAST) -> Tensor: ...

    attn.schema  # 'mylib::attn(Tensor q, float cfg__scale, bool cfg__causal, str mode="fast") -> Tensor'
    attn(q, AttnCfg(0.5, True))           # original signature
    torch.ops.mylib.attn(q, 0.5, True)    # flat leaves

Registration goes through `Library.define` + `impl`, one registration per
dispatch key, and is atomic: an error leaves nothing behind.
"""

from __future__ import annotations

import inspect
import sys
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import _C as _torch_C

from . import _C, _types
from ._codegen import EMPTY, Builder, Leaf, OpCode, Param
from ._types import Registrations, Resolver, TypeInfo

_REGISTERED: dict[str, "OpDef"] = {}
_AFTER_AUTOGRAD = _torch_C._after_autograd_keyset
_AFTER_ADINPLACE = _torch_C._after_ADInplaceOrView_keyset


class OpDef:
    """An operator defined with `@opforge.op`. Call it with the original
    signature; `.overload` is the registered `torch._ops.OpOverload`."""

    __slots__ = ("name", "overload", "spec", "lowered", "_state", "_code", "_lib", "_registrations",
                 "__wrapped__", "__dict__")

    @property
    def schema(self) -> str:
        return str(self.overload._schema)

    def register_fake(self, fn: Callable) -> Callable:
        """Registers the shape function, written against the original signature."""
        self._state.fake = fn
        return fn

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None) -> None:
        """Registers `backward(ctx, *grads) -> one gradient per original parameter`."""
        _install_autograd(self, backward, setup_context)

    def register_kernel(self, device_types: str | Sequence[str], fn: Callable | None = None):
        """Registers a device-specific body with the original signature.
        Usable as `@op.register_kernel("cuda")`."""

        def register(fn: Callable) -> Callable:
            _install_kernels(self, _device_list(self.name, device_types), fn)
            return fn

        return register if fn is None else register(fn)

    def flatten(self, *args, **kwargs) -> tuple[tuple, dict]:
        """The flat arguments the dispatcher sees for this call."""
        return self._code.flatten_call(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<opforge.OpDef {self.name}: {self.spec}>"


@dataclass
class _State:
    """What an op's kernels read at call time; decorators update it."""

    fn: Callable
    fake: Callable | None
    backward: Callable | None
    setup_context: Callable | None
    has_tensor_returns: bool


@dataclass
class _Meta:
    """The last argument of the autograd.Function: how to run the forward."""

    keyset: Any  # DispatchKeySet on the dispatcher path; None when called directly
    args: tuple  # original arguments (direct path)
    kwargs: dict


def op(
    name: str,
    *,
    mutates_args: Iterable[str] = (),
    fake: Callable | None = None,
    setup_context: Callable | None = None,
    backward: Callable | None = None,
    device_types: str | Sequence[str] | None = None,
    tags: torch.Tag | Sequence[torch.Tag] = (),
    symm_mem_args: Iterable[str] = (),
    triton: str = "auto",
    extra_triton_kernels: Iterable[Any] = (),
) -> Callable[[Callable], OpDef]:
    """Defines the operator `name` ("namespace::op") from the decorated function."""

    def decorate(fn: Callable) -> OpDef:
        return define(
            name,
            fn,
            mutates_args=mutates_args,
            fake=fake,
            setup_context=setup_context,
            backward=backward,
            device_types=device_types,
            tags=tags,
            symm_mem_args=symm_mem_args,
            triton=triton,
            extra_triton_kernels=extra_triton_kernels,
            _caller=sys._getframe(1),
        )

    return decorate


def define(name, fn, *, mutates_args=(), fake=None, setup_context=None, backward=None, device_types=None,
           tags=(), symm_mem_args=(), triton="auto", extra_triton_kernels=(), _caller=None) -> OpDef:
    _C.check_op_name(name)
    _check_free(name)
    if isinstance(mutates_args, str):
        raise TypeError(f"{name}: mutates_args must be a sequence of parameter names, not a string. "
                        f"Write mutates_args=({mutates_args!r},).")
    if setup_context is not None and backward is None:
        raise TypeError(f"{name}: setup_context was given without backward. Pass backward= as well.")
    devices = _device_list(name, device_types) if device_types is not None else None
    tag_list = [tags] if isinstance(tags, torch.Tag) else list(tags)

    regs = Registrations()
    lib = None
    try:
        body = fn
        plan = _triton_plan(name, fn, triton, extra_triton_kernels)
        if plan is not None:
            body = plan.eager_body
            if fake is None:
                # As torch.library.triton_op: the traceable body is the fake.
                fake = plan.traced_body
        params, ret_types, spec = _build_spec(name, fn, regs, _caller)
        lowered = _C.lower(spec, list(mutates_args))
        for warning in lowered.warnings:
            import warnings

            warnings.warn(f"{name}: {warning}", stacklevel=3)
        ns, opname = name.split("::")
        lib = torch.library.Library(ns, "FRAGMENT")
        flat_schema = lowered.schema
        lib.define(flat_schema[len(ns) + 2:], tags=(*tag_list, torch.Tag.pt2_compliant_tag))
        overload = getattr(getattr(torch.ops, ns), opname).default

        state = _State(fn=body, fake=fake, backward=backward, setup_context=setup_context,
                       has_tensor_returns=len(lowered.flat.returns) > 0)
        leaves = _leaves(lowered, params)
        mutated_positions = [i for i, leaf in enumerate(leaves) if leaf.mutated]

        needs_autograd = object()
        tensor_positions = [i for i, leaf in enumerate(leaves) if leaf.type_text.startswith("Tensor")]
        kwnames = tuple(p.name for p in params if p.kw_only)
        fast = _C.FastPath(
            default_kernel=body if devices is None else None,
            kernels={d: body for d in devices} if devices is not None else {},
            kwnames=kwnames,
            mutated=tuple(tensor_positions.index(i) for i in mutated_positions),
            has_backward=backward is not None and not mutated_positions,
            needs_autograd=needs_autograd,
        )
        builder = Builder(name, params, leaves, list(lowered.returns), ret_types, len(lowered.flat.returns))
        holder: dict[str, Any] = {}
        code = builder.build(fast, needs_autograd, overload, lambda leaves_, args_: holder["autograd"](leaves_, args_))

        opdef = _make_opdef(name, fn, overload, spec, lowered, state, code, lib)
        opdef._registrations = []
        holder["autograd"] = lambda leaves_, args_: _apply_direct(opdef, leaves_, args_)
        opdef.__dict__.update(_fast=fast, _mutated=mutated_positions, _params=params,
                              _device_kernels=bool(devices))

        if devices is None:
            lib.impl(opname, code.make_kernel(body), "CompositeExplicitAutograd")
        else:
            for d in devices:
                lib.impl(opname, code.make_kernel(body), _dispatch_key(name, d))
        if plan is not None:
            _install_triton_decomposition(opdef, plan)
        lib._register_fake(opname, code.make_fake_kernel(_fake_dispatch(name, state)))
        if mutated_positions:
            _install_version_bump(opdef, leaves, mutated_positions)
        if backward is not None:
            _install_autograd(opdef, backward, setup_context)
        else:
            opdef._registrations.append(_C.register_no_backward_kernel(name, _no_backward_message(name, fn)))
        _REGISTERED[name] = opdef
        return opdef
    except BaseException:
        if lib is not None:
            lib._destroy()
        regs.rollback()
        raise


def _triton_plan(name: str, fn: Callable, mode: str, extra_kernels):
    """What the Triton scan found (SPEC §3.2), or None for an opaque op."""
    if mode not in ("auto", "off", "force"):
        raise ValueError(f"{name}: triton={mode!r} is not one of 'auto', 'off', 'force'.")
    extra_kernels = tuple(extra_kernels)
    if mode == "off":
        return None
    try:
        from . import triton as _triton
    except ImportError:
        if mode == "force" or extra_kernels:
            raise ValueError(f"{name}: triton={mode!r} needs the triton package, which is not importable.") from None
        return None
    return _triton.plan(name, fn, mode=mode, extra_kernels=extra_kernels)


def _install_triton_decomposition(opdef: "OpDef", plan) -> None:
    """Under FunctionalTensorMode (AOTAutograd), the op decomposes into its
    traceable body, so Inductor sees the wrapped Triton kernels instead of an
    opaque call; that is what torch.library.triton_op registers."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    traced_kernel = opdef._code.make_fake_kernel(plan.traced_body)

    def functional_decomp(mode, func, types, args, kwargs):
        with mode:
            return traced_kernel(*args, **kwargs)

    torch.library.register_torch_dispatch(opdef.overload, FunctionalTensorMode, functional_decomp, lib=opdef._lib)


def _check_free(name: str) -> None:
    ns, opname = name.split("::")
    if name in _REGISTERED or _schema_exists(name):
        raise ValueError(
            f"{name}: an operator with this name is already registered. "
            f"Choose another name, or another namespace than '{ns}'."
        )


def _schema_exists(name: str) -> bool:
    try:
        _torch_C._dispatch_find_schema_or_throw(name, "")
        return True
    except RuntimeError:
        return False


def _device_list(name: str, device_types) -> list[str]:
    devices = [device_types] if isinstance(device_types, str) else list(device_types)
    out = []
    for d in devices:
        try:
            out.append(torch.device(d).type)
        except RuntimeError:
            raise ValueError(f"{name}: device_types: {d!r} is not a device type. Use e.g. 'cpu' or 'cuda'.") from None
    return out


def _dispatch_key(name: str, device: str) -> str:
    return _torch_C._dispatch_key_for_device(device)


def _caller_locals(fn: Callable, caller) -> dict:
    """Names a string annotation may use besides the function's globals:
    its closure cells and the locals of the scope that defined it."""
    ns: dict = {}
    if caller is not None:
        ns.update(caller.f_locals)
    code = getattr(fn, "__code__", None)
    if code is not None and fn.__closure__:
        for var, cell in zip(code.co_freevars, fn.__closure__):
            try:
                ns[var] = cell.cell_contents
            except ValueError:
                pass
    return ns


def _build_spec(name: str, fn: Callable, regs: Registrations, caller) -> tuple[list[Param], list, str]:
    sig = inspect.signature(fn)
    raw = getattr(fn, "__annotations__", {})
    needs_eval = any(isinstance(a, str) for a in raw.values())
    resolver = Resolver(name, regs, getattr(fn, "__globals__", {}),
                        _caller_locals(fn, caller) if needs_eval else None)
    params: list[Param] = []
    texts: list[str] = []
    saw_kw = False
    for p in sig.parameters.values():
        where = f"parameter '{p.name}'"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            star = "*" if p.kind == p.VAR_POSITIONAL else "**"
            raise TypeError(f"{name}: parameter '{star}{p.name}': variadic parameters cannot be op "
                            f"parameters. Spell out each parameter.")
        if p.kind == p.POSITIONAL_ONLY:
            raise TypeError(f"{name}: {where}: positional-only parameters are not supported. "
                            f"Remove the '/' from the signature.")
        if p.annotation is p.empty:
            raise TypeError(f"{name}: {where}: missing type annotation. Annotate it, e.g. "
                            f"'{p.name}: torch.Tensor'.")
        t = resolver.resolve(p.annotation, where)
        default = p.default
        text = f"{t.text} {p.name}"
        if default is not p.empty:
            if default is None and not t.optional and t.kind != "tensor":
                raise TypeError(f"{name}: {where}: the default is None but the annotation "
                                f"{_show(p.annotation)} is not Optional. Annotate it as Optional[...].")
            dtext = _types.default_text(default, t)
            if dtext is not None:
                text += f"={dtext}"
        kw = p.kind == p.KEYWORD_ONLY
        if kw and not saw_kw:
            texts.append("*")
            saw_kw = True
        texts.append(text)
        params.append(Param(p.name, kw, default, t, ()))
    if sig.return_annotation is sig.empty:
        raise TypeError(f"{name}: return value: missing annotation. Add one, e.g. '-> torch.Tensor' "
                        f"or '-> None'.")
    ret_text, ret_types = _return_spec(name, resolver, sig.return_annotation)
    spec = f"{name}({', '.join(texts)}) -> {ret_text}"
    return params, ret_types, spec


def _show(ann) -> str:
    return ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann))


def _return_spec(name: str, resolver: Resolver, ann) -> tuple[str, list]:
    where = "return value"
    ann = resolver.evaluate(ann, where)
    if ann is None or ann is type(None):
        return "()", []
    if typing.get_origin(ann) is tuple:
        args = typing.get_args(ann)
        if not args or Ellipsis in args:
            raise TypeError(f"{name}: {where}: {ann} has no fixed length. Return a tuple of fixed "
                            f"length, e.g. tuple[Tensor, Tensor], or list[Tensor].")
        types = [_return_item(name, resolver, a) for a in args]
        return "(" + ", ".join(t.text for t in types) + ")", types
    t = _return_item(name, resolver, ann)
    return t.text, [t]


def _return_item(name: str, resolver: Resolver, ann) -> TypeInfo:
    t = resolver.resolve(ann, "return value")
    ok = t.kind in ("tensor", "struct") or (t.kind == "scalar" and t.text in ("SymInt", "float", "bool", "Scalar")) or (
        t.kind == "list" and t.element.kind == "tensor" and not t.optional)
    if not ok or (t.optional and t.kind != "struct"):
        raise TypeError(f"{name}: return value: {_show(ann)} cannot be returned from an op. Return Tensor, "
                        f"tuple[Tensor, ...], list[Tensor], a frozen dataclass of tensors, int, float, "
                        f"bool or None.")
    return t


def _leaves(lowered, params: list[Param]) -> list[Leaf]:
    for p, node in zip(params, lowered.params):
        p.node = node
    leaves = []
    flat = lowered.flat.arguments
    for i, (arg, info) in enumerate(zip(flat, lowered.leaves)):
        enum_cls = _types.ENUMS_BY_NAME[info.enum_name].cls if info.enum_name else None
        leaves.append(
            Leaf(
                name=arg.name,
                type_text=str(arg.type),
                kw_only=arg.kwarg_only,
                default=EMPTY,
                allowed=tuple(info.allowed),
                enum=enum_cls,
                handle=info.handle_type,
                is_presence=info.is_presence,
                mutated=info.mutated,
            )
        )
    # Python values for the flat defaults: the dispatcher leaves out trailing
    # arguments equal to their default, so the kernel must supply them.
    for p in params:
        _leaf_defaults(p.node, p.default if p.default is not EMPTY else EMPTY, p.type, leaves, flat)
    return leaves


def _leaf_defaults(node, default, t: TypeInfo, leaves: list[Leaf], flat) -> None:
    if node[0] == "leaf":
        index = node[2]
        if flat[index].has_default:
            leaves[index].default = None if default is EMPTY else default
            if default is EMPTY:
                leaves[index].default = flat[index].default_value
            elif t.kind == "enum" and default is not None:
                leaves[index].default = default.value if hasattr(default, "value") else default
        return
    _, _name, _struct, optional, presence, children = node
    if presence >= 0 and flat[presence].has_default:
        leaves[presence].default = default is not None and default is not EMPTY
    from dataclasses import MISSING, fields

    field_defaults = {}
    if t.py is not None:
        for f in fields(t.py):
            if f.default is not MISSING:
                field_defaults[f.name] = f.default
            elif f.default_factory is not MISSING:
                field_defaults[f.name] = f.default_factory()
    for child in children:
        field = child[1]
        if default is None:
            sub = None
        elif default is EMPTY:
            sub = field_defaults.get(field, EMPTY)
        else:
            sub = getattr(default, field)
        _leaf_defaults(child, sub, t.fields[field], leaves, flat)


def _make_opdef(name, fn, overload, spec, lowered, state, code: OpCode, lib) -> OpDef:
    cls = type(
        f"OpDef[{name}]",
        (OpDef,),
        {"__call__": code.call, "__slots__": (), "__doc__": fn.__doc__},
    )
    opdef = cls.__new__(cls)
    opdef.name = name
    opdef.overload = overload
    opdef.spec = spec
    opdef.lowered = lowered
    opdef._state = state
    opdef._code = code
    opdef._lib = lib
    opdef.__wrapped__ = fn
    opdef.__dict__.update(
        __name__=getattr(fn, "__name__", name), __qualname__=getattr(fn, "__qualname__", name),
        __module__=getattr(fn, "__module__", None),
    )
    return opdef


def _fake_dispatch(name: str, state: _State) -> Callable:
    def fake(*args, **kwargs):
        if state.fake is None:
            if not state.has_tensor_returns:
                return None
            raise RuntimeError(
                f"{name}: no fake (shape) implementation is registered, and torch.compile, fake "
                f"tensors and meta tensors need one. Pass fake= to @opforge.op or decorate one "
                f"with @{name.split('::')[1]}.register_fake."
            )
        return state.fake(*args, **kwargs)

    return fake


def _no_backward_message(name: str, fn: Callable) -> str:
    fname = getattr(fn, "__name__", "op")
    return (f"{name}: a gradient was requested through this op, but it has no backward. "
            f"Pass backward= to @opforge.op or call {fname}.register_autograd(backward).")


def _install_kernels(opdef: OpDef, devices: list[str], fn: Callable) -> None:
    ns, opname = opdef.name.split("::")
    for d in devices:
        opdef._lib.impl(opname, opdef._code.make_kernel(fn), _dispatch_key(opdef.name, d))
        opdef.__dict__["_fast"].set_kernel(d, fn)
    # The direct autograd path only knows the default body.
    opdef.__dict__["_device_kernels"] = True
    opdef.__dict__["_fast"].set_has_backward(False)


def _install_version_bump(opdef: OpDef, leaves: list[Leaf], mutated: list[int]) -> None:
    """Mutated tensors get their version counter bumped, as custom_op does."""
    overload = opdef.overload
    code = opdef._code
    ns, opname = opdef.name.split("::")

    def adinplaceorview(keyset, *args, **kwargs):
        all_leaves = code.flat_full(*args, **kwargs)
        for i in mutated:
            t = all_leaves[i]
            if t is None:
                continue
            for x in t if isinstance(t, (list, tuple)) else (t,):
                if x is not None:
                    torch.autograd.graph.increment_version(x)
        return overload.redispatch(keyset & _AFTER_ADINPLACE, *args, **kwargs)

    opdef._lib.impl(opname, adinplaceorview, "ADInplaceOrView", with_keyset=True)


def _install_autograd(opdef: OpDef, backward: Callable, setup_context: Callable | None) -> None:
    state = opdef._state
    first = state.backward is None or not hasattr(opdef, "_function")
    state.backward = backward
    state.setup_context = setup_context
    if not first:
        return
    # Replace the no-backward kernel with the autograd bridge.
    opdef._registrations.clear()
    fn_cls = _make_function(opdef)
    opdef.__dict__["_function"] = fn_cls
    apply = fn_cls.apply
    overload = opdef.overload
    code = opdef._code
    ns, opname = opdef.name.split("::")

    def autograd_kernel(keyset, *args, **kwargs):
        if _torch_C.is_grad_enabled() and _torch_C._any_requires_grad(*args, **kwargs):
            return apply(*code.flat_full(*args, **kwargs), _Meta(keyset, (), {}))
        with _torch_C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & _AFTER_AUTOGRAD, *args, **kwargs)

    opdef._lib.impl(opname, autograd_kernel, "Autograd", with_keyset=True)
    if not opdef.__dict__["_mutated"] and not opdef.__dict__["_device_kernels"]:
        opdef.__dict__["_fast"].set_has_backward(True)


def _apply_direct(opdef: OpDef, leaves: tuple, args: tuple):
    """The eager path for a call that needs a gradient: the autograd.Function
    runs the body directly instead of redispatching."""
    return opdef.__dict__["_function"].apply(*leaves, _Meta(None, args, {}))


def _make_function(opdef: OpDef) -> type:
    state = opdef._state
    code = opdef._code
    overload = opdef.overload
    params = opdef.__dict__["_params"]
    leaves_per_param = [_leaf_positions(p.node) for p in params]
    flat_args = opdef.lowered.flat.arguments
    positional = [a.name for a in flat_args if not a.kwarg_only]
    keyword = [a.name for a in flat_args if a.kwarg_only]
    npos = len(positional)
    multiple_returns = len(opdef.lowered.returns) > 1
    name = opdef.name

    def forward(ctx, *args):
        meta = args[-1]
        leaves = args[:-1]
        if meta.keyset is not None:
            with _torch_C._AutoDispatchBelowAutograd():
                out = overload.redispatch(
                    meta.keyset & _AFTER_AUTOGRAD, *leaves[:npos], **dict(zip(keyword, leaves[npos:]))
                )
            inputs = code.rebuild_inputs(leaves) if state.setup_context else None
            original_out = code.rebuild_output(out) if state.setup_context else None
        else:
            original_out = code.body_positional(state.fn, *meta.args)
            inputs = meta.args
            out = code.flatten_output(original_out)
        if state.setup_context is not None:
            state.setup_context(ctx, inputs, original_out)
        return out

    def backward(ctx, *grads):
        grads_flat = grads if len(grads) > 1 else grads[0]
        original = code.rebuild_output(grads_flat)
        per_param = original if multiple_returns else (original,)
        prev = ctx.needs_input_grad
        ctx.needs_input_grad = tuple(any(prev[i] for i in pos) for pos in leaves_per_param)
        try:
            result = state.backward(ctx, *per_param)
        finally:
            ctx.needs_input_grad = prev
        return (*code.flatten_grads(result), None)

    cls = type(
        f"Backward_{name.replace('::', '_')}",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )
    lists = any(str(a.type).startswith("Tensor?[]") or str(a.type).startswith("Tensor[]")
                for a in (*flat_args, *opdef.lowered.flat.returns))
    if lists:
        from torch._library.autograd import supports_tensorlist

        cls = supports_tensorlist(cls)
    return cls


def _leaf_positions(node) -> list[int]:
    if node[0] == "leaf":
        return [node[2]]
    out = []
    for child in node[5]:
        out.extend(_leaf_positions(child))
    return out


def opcheck(op: OpDef, args: tuple, kwargs: dict | None = None, **options):
    """Runs `torch.library.opcheck` on the flat op with the call flattened."""
    flat_args, flat_kwargs = op.flatten(*args, **(kwargs or {}))
    return torch.library.opcheck(op.overload, flat_args, flat_kwargs, **options)


def registered_ops() -> dict[str, OpDef]:
    return dict(_REGISTERED)
