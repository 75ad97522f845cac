"""`@opforge.op`: define an operator from a Python function.

    @opforge.op("mylib::attn")
    def attn(q: Tensor, cfg: AttnCfg, mode: Mode = Mode.FAST) -> Tensor: ...

    attn.schema  # 'mylib::attn(Tensor q, float cfg__scale, bool cfg__causal, str mode="fast") -> Tensor'
    attn(q, AttnCfg(0.5, True))           # original signature
    torch.ops.mylib.attn(q, 0.5, True)    # flat leaves

Registration goes through `Library.define`, then one C++ kernel per dispatch
key (`_C.register_kernel`, `_C.AutogradBridge`), and is atomic: an error
leaves nothing behind.
"""

from __future__ import annotations

import collections
import functools
import inspect
import sys
import threading
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import _C as _torch_C

from . import _C, _ffi, _kinds, _registry, _types, handles, symm_mem
from ._codegen import EMPTY, Builder, Leaf, OpCode, Param
from ._types import Problem, Registrations, Resolver, SignatureError, TypeInfo, Where

# One definition at a time: two threads defining one name would both pass
# the name check, and the second would get torch's "registered multiple times".
_DEFINING = threading.RLock()


class OpDef(_C.OpBase):
    """An operator defined with `@opforge.op`. Call it with the original
    signature; `.overload` is the registered `torch._ops.OpOverload`.

    Eager calls enter C (`_C.OpBase`): the arguments are bound, checked and
    converted by the op's boundary, then the body runs directly when nothing
    could intercept the dispatcher call, or the call goes through the
    dispatcher. `torch.compile` traces the Python `__call__` of the op's class,
    which goes through the dispatcher."""

    __slots__ = ("name", "overload", "spec", "model", "boundary", "_state", "_code", "_lib", "_registrations",
                 "_has_autograd", "_device_kernels", "_kind", "__wrapped__", "__dict__", "__weakref__")

    # A C++ op (CppOpDef) takes any object with a struct's fields, and its
    # handles stay ints: C++ runners live in the C++ handle table.
    _duck_structs = False

    @property
    def schema(self) -> str:
        return str(self.overload._schema)

    @property
    def lowered(self):
        """The core's lowering result (`opforge._C.Lowered`)."""
        return self.model.lowered

    def register_fake(self, fn: Callable) -> Callable:
        """Registers the shape function, written against the original signature."""
        _check_callable(self.name, "register_fake", fn)
        self._before_fake()
        self._state.fake = fn
        return fn

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None) -> None:
        """Registers `backward(ctx, *grads) -> one gradient per original parameter`."""
        _check_callable(self.name, "backward", backward)
        if setup_context is not None:
            _check_callable(self.name, "setup_context", setup_context)
        self._before_autograd()
        _install_autograd(self, backward, setup_context)

    def register_kernel(self, device_types: str | Sequence[str], fn: Callable | None = None):
        """Registers a device-specific body with the original signature, or a
        `tvm_ffi.Function` that takes the flat leaves (docs/tvm_ffi.md).
        Usable as `@op.register_kernel("cuda")`."""

        def register(fn: Callable) -> Callable:
            _check_callable(self.name, "register_kernel", fn)
            devices = _kinds.device_list(self.name, device_types)
            self._before_kernels(devices)
            _kinds.of_kernel(self.name, fn, devices).install(self, devices)
            return fn

        return register if fn is None else register(fn)

    # What a subclass checks before each decorator takes effect (CppOpDef:
    # nothing the C++ library registered is overridden).
    def _before_fake(self) -> None:
        pass

    def _before_autograd(self) -> None:
        pass

    def _before_kernels(self, devices: list[str]) -> None:
        pass

    def _register_fake_kernel(self) -> None:
        """The op's fake kernel for torch, calling whatever fake is registered then."""
        _register_fake(self._lib, self.name, _lazy_fake_kernel(self._code, _fake_dispatch(self.name, self._state)))

    @property
    def triton_kernels(self) -> tuple:
        """The Triton kernels the op launches, forward's first (`.forward`,
        `.backward` say which is which); empty for an opaque op. Kernels a
        library builds at run time are listed once the op has been traced.
        See docs/triton.md."""
        module = _kinds.triton_module()
        if module is None:
            return ()
        return module.kernels_of(self.name)

    def flatten(self, *args, **kwargs) -> tuple[tuple, dict]:
        """The flat arguments the dispatcher sees for this call."""
        return self._code.flatten_call(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<opforge.OpDef {self.name}: {self.spec}>"


@dataclass
class _State:
    """What an op's kernels read at call time; decorators update it."""

    fn: Callable | None = None  # the body for every device (None for a C++ op)
    fake: Callable | None = None
    backward: Callable | None = None
    setup_context: Callable | None = None
    has_tensor_returns: bool = False
    traced_body: Callable | None = None  # a Triton op's traceable body, its fake unless one is registered
    no_fake: str | None = None  # the error of a trace with no fake, where the kernels say more than the default


@dataclass(frozen=True)
class OpModel:
    """The core's op model of one op, read once:

        original: (q: Tensor, cfg: AttnCfg, mode: Literal['a','b']='a') -> Tensor
        schema:   ns::attn(Tensor q, float cfg__scale, bool cfg__causal, str mode="a") -> Tensor
        leaves:   LeafModel per flat argument (name, type, default, is_tensor, mutated, ...)
        params:   MappingNode per original parameter; returns: per original return
    """

    lowered: Any
    schema: str
    definable_schema: str
    leaves: tuple
    params: tuple
    returns: tuple
    return_types: tuple  # flat return types, e.g. ("Tensor", "Tensor")
    warnings: tuple

    @classmethod
    def of(cls, lowered) -> "OpModel":
        return cls(lowered, lowered.schema, lowered.definable_schema, tuple(lowered.model_leaves),
                   tuple(lowered.params), tuple(lowered.returns), tuple(lowered.return_types),
                   tuple(lowered.warnings))


@dataclass
class Signature:
    """What `_read_signature` reads off the decorated function."""

    params: list[Param]
    return_types: list
    spec: str  # 'ns::f(Tensor x, mod.Cfg cfg, *, mod.Mode mode="a") -> Tensor'


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
    kernel: Any = None,
) -> Callable[[Callable], OpDef]:
    """Defines the operator `name` ("namespace::op") from the decorated function.
    With `kernel=` (a `tvm_ffi.Function`, or {device type: function}), the
    decorated function gives only the signature and the TVM-FFI function is
    the kernel (docs/tvm_ffi.md)."""
    if not isinstance(name, str):
        if callable(name):  # `@opforge.op` without the name
            fn_name = getattr(name, "__name__", "f")
            raise TypeError(f"opforge.op was given the function {fn_name} where it takes the op's name: write "
                            f"@opforge.op(\"mylib::{fn_name}\") above it, with your namespace.")
        raise TypeError(f"opforge.op takes the op's name as a str 'namespace::name', not {type(name).__name__} "
                        f"{name!r}. Write e.g. @opforge.op(\"mylib::scale\").")

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
            kernel=kernel,
            _caller=sys._getframe(1),
        )

    return decorate


def _one_at_a_time(fn):
    """Runs `fn` holding _DEFINING."""
    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with _DEFINING:
            return fn(*args, **kwargs)

    return locked


@_one_at_a_time
def define(name, fn, *, mutates_args=(), fake=None, setup_context=None, backward=None, device_types=None,
           tags=(), symm_mem_args=(), triton="auto", extra_triton_kernels=(), kernel=None, _caller=None,
           _default_fake=None) -> OpDef:
    """Registers `fn` as the op `name`: every check first, then torch's
    registrations; a failure anywhere undoes what was done. `_default_fake`
    (for front ends such as compat.magi) makes the fake of an op that is
    neither given one nor brings one, and may raise to reject the op.
    `kernel` (TVM-FFI functions) makes `fn` the signature only."""
    mutates_args, devices, tag_list = _check_arguments(name, fn, mutates_args, fake, setup_context, backward,
                                                       device_types, tags)
    kind = _kinds.of_definition(name, fn, kernel, devices, triton, extra_triton_kernels, mutates_args, tag_list)
    regs = Registrations()
    lib = opdef = None
    symm_mem_declared = False
    try:
        if fake is None:
            fake = kind.fake if kind.fake is not None or _default_fake is None else _default_fake()
        sig = _read_signature(name, fn, regs, _caller)
        model = _lower(name, sig, mutates_args)
        lib, overload = _define_schema(name, model, tag_list)
        if symm_mem_args:
            symm_mem.declare(name, model.lowered, symm_mem_args, lib=lib, stacklevel=4)
            symm_mem_declared = True
        state = _State(fn=kind.body, fake=fake, backward=backward, setup_context=setup_context,
                       traced_body=kind.traced_body, no_fake=kind.no_fake)
        opdef = assemble(name, fn, sig, model, overload, lib, state=state, devices=kind.devices, kind=kind)
        kind.install(opdef, kind.devices)
        _register_dispatch_keys(opdef, tag_list, backward, setup_context)
        kind.commit(opdef)
        _registry.add(opdef)
        return opdef
    except BaseException:
        if opdef is not None:
            opdef._registrations.clear()
        kind.undo(name)
        if symm_mem_declared:
            symm_mem.forget(name)
        if lib is not None:
            lib._destroy()
        regs.rollback()
        raise


def _register_dispatch_keys(opdef: OpDef, tags: list, backward: Callable | None,
                            setup_context: Callable | None) -> None:
    """What every op registers beside its kernels: the fake kernel, the
    capture guard of a cudagraph_unsafe op, the version bump of a mutating
    op, the Autograd kernel."""
    name = opdef.name
    opdef._register_fake_kernel()
    if torch.Tag.cudagraph_unsafe in tags:
        # Before any launch, a call made while its stream captures goes to a breakable capture or is refused.
        opdef._registrations["BackendSelect"] = _C.register_capture_guard(name)
    if any(leaf.mutated for leaf in opdef.model.leaves):
        # Versions of what the op writes are bumped, as custom_op does.
        opdef._registrations["ADInplaceOrView"] = _C.register_inplace_kernel(name)
    if backward is not None:
        _install_autograd(opdef, backward, setup_context)
    else:
        opdef._registrations["Autograd"] = _C.register_no_backward_kernel(name, _no_backward_message(name,
                                                                                                 opdef.__wrapped__))


def _check_callable(name: str, what: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{name}: {what} must be a function written against the op's signature, not "
                        f"{type(fn).__name__} {fn!r}.")


def _check_arguments(name, fn, mutates_args, fake, setup_context, backward, device_types, tags):
    """The decorator's own arguments, checked before anything is registered:

        mutates_args="x"  ->  TypeError: ns::f: mutates_args must be a sequence ... Write mutates_args=('x',).
    """
    _C.check_op_name(name)
    _check_free(name)
    _ffi.refuse_as_body(name, fn)
    _check_callable(name, "the decorated object", fn)
    if isinstance(mutates_args, str):
        raise TypeError(f"{name}: mutates_args must be a sequence of parameter names, not a string. "
                        f"Write mutates_args=({mutates_args!r},).")
    mutates_args = list(mutates_args)
    for what, value in (("fake", fake), ("setup_context", setup_context), ("backward", backward)):
        if value is not None:
            _check_callable(name, f"{what}=", value)
    if setup_context is not None and backward is None:
        raise TypeError(f"{name}: setup_context was given without backward. Pass backward= as well.")
    devices = _kinds.device_list(name, device_types) if device_types is not None else None
    tag_list = [tags] if isinstance(tags, torch.Tag) else list(tags)
    for tag in tag_list:
        if not isinstance(tag, torch.Tag):
            raise TypeError(f"{name}: tags must be torch.Tag values (e.g. torch.Tag.needs_fixed_stride_order), "
                            f"not {type(tag).__name__} {tag!r}.")
    return mutates_args, devices, tag_list


def _lower(name: str, sig: Signature, mutates_args: list[str]) -> OpModel:
    """The core's lowering of the spec, warnings shown once:

        'ns::f(Tensor x, mod.Cfg cfg) -> Tensor' -> OpModel(schema='ns::f(Tensor x, float cfg__scale) -> Tensor', ...)
    """
    model = OpModel.of(_C.lower(sig.spec, mutates_args))
    for warning in model.warnings:
        import warnings

        warnings.warn(f"{name}: {warning}", stacklevel=4)
    return model


def _make_boundary(name: str, sig: Signature, model: OpModel, *, duck_structs: bool = False,
                   handles_as_ints: bool = False) -> "_C.Boundary":
    """The op's call boundary; raises if a parameter's default does not fit
    its type (`n: int = 1.5`)."""
    classes, enum_values, handle_classes = _classes_of(sig.params, sig.return_types)
    params = [(p.name, p.kw_only, p.default) for p in sig.params]
    boundary = _C.Boundary(name, model.lowered, model.definable_schema, params, EMPTY, classes, enum_values,
                           {} if handles_as_ints else handle_classes, handles.checked, duck_structs)
    boundary.check_defaults()
    if handle_classes and not handles_as_ints:
        handles.prepare(handle_classes.values())
    return boundary


def _classes_of(params: list[Param], return_types: list) -> tuple[dict, dict, dict]:
    """Registered name -> class for every struct and enum the op uses, enum
    name -> {raw value: member}, handle type -> class."""
    classes: dict = {}
    enum_values: dict = {}
    handle_classes: dict = {}

    def walk(t: TypeInfo | None):
        if t is None:
            return
        if t.kind == "struct":
            info = _types.STRUCTS[t.py]
            if info.name not in classes:
                classes[info.name] = t.py
                for f in t.fields.values():
                    walk(f)
        elif t.kind == "enum":
            info = _types.ENUMS[t.py]
            classes[info.name] = t.py
            enum_values[info.name] = info.by_value
        elif t.kind == "handle":
            handle_classes[_types.registered_name(t.py)] = t.py
        elif t.kind == "list":
            walk(t.element)

    for p in params:
        walk(p.type)
    for t in return_types:
        walk(t)
    return classes, enum_values, handle_classes


def _define_schema(name: str, model: OpModel, tags: list) -> tuple:
    """`Library.define` of the flat schema; returns (library, OpOverload)."""
    ns, opname = name.split("::")
    lib = torch.library.Library(ns, "FRAGMENT")
    try:
        lib.define(model.definable_schema[len(ns) + 2:], tags=(*tags, torch.Tag.pt2_compliant_tag))
        overload = getattr(getattr(torch.ops, ns), opname).default
    except BaseException:
        lib._destroy()
        raise
    return lib, overload


def _leaves(model: OpModel, boundary) -> list[Leaf]:
    """The code generator's view of the flat arguments; defaults are what a
    Python kernel receives from torch for an argument the caller left out."""
    defaults = boundary.flat_defaults()
    out = []
    for leaf, default in zip(model.leaves, defaults):
        enum_cls = _types.ENUMS_BY_NAME[leaf.enum_name].cls if leaf.enum_name else None
        out.append(Leaf(leaf.name, leaf.type, leaf.kwarg_only, EMPTY if default is None else default[0],
                        tuple(leaf.allowed) if leaf.allowed else (), enum_cls, leaf.handle_type, leaf.is_presence,
                        leaf.mutated))
    return out


def assemble(name: str, fn: Callable | None, sig: Signature, model: OpModel, overload, lib, *,
             base: type | None = None, state: _State | None = None, devices: list[str] | None = None,
             kind: "_kinds.Kind" = _kinds.CPP) -> OpDef:
    """An op defined with torch, as an OpDef of class `base` (OpDef, or a
    subclass such as CppOpDef) bound to its C entry: the call boundary, the
    generated code, the state its kernels read. Its class is made per op, so
    that `__call__` has the op's own signature (which Dynamo traces).

        assemble("ns::f", f, sig, model, torch.ops.ns.f.default, lib, state=_State(fn=f))
    """
    base = base or OpDef
    duck = base._duck_structs
    boundary = _make_boundary(name, sig, model, duck_structs=duck, handles_as_ints=duck)
    state = state or _State()
    state.has_tensor_returns = len(model.return_types) > 0
    for p, node in zip(sig.params, model.params):
        p.node = node
    leaves = _leaves(model, boundary)
    if duck:
        for leaf in leaves:
            leaf.handle = ""
    builder = Builder(name, sig.params, leaves, list(model.returns), sig.return_types, len(model.return_types),
                      duck_structs=duck)
    code = builder.build(overload, boundary)
    cls = type(f"{base.__name__}[{name}]", (base,),
               {"__call__": code.call, "__slots__": (), "__doc__": getattr(fn, "__doc__", None)})
    _C.install_fast_call(cls)
    opdef = cls.__new__(cls)
    opdef.name = name
    opdef.overload = overload
    opdef.spec = sig.spec
    opdef.model = model
    opdef.boundary = boundary
    opdef._state = state
    opdef._code = code
    opdef._lib = lib
    opdef._registrations = {}  # dispatch key -> the registration that keeps its kernel
    opdef._has_autograd = False
    opdef._device_kernels = devices is not None
    opdef._kind = kind
    opdef.__wrapped__ = fn
    opdef.__dict__.update(
        __name__=getattr(fn, "__name__", name.split("::")[1]), __qualname__=getattr(fn, "__qualname__", name),
        __module__=getattr(fn, "__module__", None),
    )
    opdef._set_capture_guarded(torch.Tag.cudagraph_unsafe in overload.tags)
    # The body for every device, or one per listed device type.
    opdef._bind(boundary, state.fn if devices is None else None, {d: state.fn for d in devices or ()},
                cls.__call__)
    return opdef


def _fake_register_takes_lib() -> bool:
    try:
        from torch._library.fake_impl import FakeImplHolder

        return "lib" in inspect.signature(FakeImplHolder.register).parameters
    except Exception:
        return False


_FAKE_REGISTER_TAKES_LIB = _fake_register_takes_lib()


def _register_fake(lib, name: str, fn: Callable) -> None:
    """`lib._register_fake` without its cost: it reads the caller's source
    line from disk on every registration."""
    if _FAKE_REGISTER_TAKES_LIB and hasattr(lib, "_registration_handles"):
        holder = torch._library.simple_registry.singleton.find(name).fake_impl
        lib._registration_handles.append(holder.register(fn, f"<opforge {name}>", lib=lib))
    else:
        lib._register_fake(name.split("::")[1], fn)


def _lazy_fake_kernel(code: OpCode, fn: Callable) -> Callable:
    """The flat fake kernel, generated when first needed."""
    kernel = None

    def fake_kernel(*args, **kwargs):
        nonlocal kernel
        if kernel is None:
            kernel = code.make_fake_kernel(fn)
        return kernel(*args, **kwargs)

    return fake_kernel


def _check_free(name: str) -> None:
    ns, opname = name.split("::")
    if _registry.get(name) is not None or _schema_exists(name):
        raise ValueError(
            f"{name}: an operator with this name is already registered. "
            f"Choose another name, or another namespace than '{ns}'."
        )


def _schema_exists(name: str) -> bool:
    """Whether torch knows an operator `name` with any overload
    (`aten::add` exists through `aten::add.Tensor`). Every dispatcher schema
    is also in this registry."""
    return bool(_torch_C._jit_get_schemas_for_operator(name))


def _caller_locals(fn: Callable, caller) -> typing.Mapping:
    """Names a string annotation may use besides the function's globals:
    its closure cells, then the locals of the scope that defined it."""
    cells: dict = {}
    code = getattr(fn, "__code__", None)
    if code is not None and fn.__closure__:
        for var, cell in zip(code.co_freevars, fn.__closure__):
            try:
                cells[var] = cell.cell_contents
            except ValueError:
                pass
    if caller is None or caller.f_locals is getattr(fn, "__globals__", None):
        return cells  # defined at module level: the locals are the globals
    return collections.ChainMap(cells, caller.f_locals)


_KINDS = inspect.Parameter
_CO_VARARGS = inspect.CO_VARARGS
_CO_VARKEYWORDS = inspect.CO_VARKEYWORDS


def _signature(fn: Callable) -> tuple[list[tuple[str, Any, Any, Any]], Any]:
    """[(name, kind, default, annotation)] and the return annotation, as
    inspect.signature gives them; read straight from a plain function's
    code object, which is much cheaper."""
    code = getattr(fn, "__code__", None)
    if (type(fn) is not type(_signature) or hasattr(fn, "__wrapped__") or hasattr(fn, "__signature__")
            or code is None):
        sig = inspect.signature(fn)
        return [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()], sig.return_annotation
    ann = fn.__annotations__
    empty = _KINDS.empty
    npos, nposonly, nkw = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    names = code.co_varnames
    defaults = fn.__defaults__ or ()
    kwdefaults = fn.__kwdefaults__ or {}
    first_default = npos - len(defaults)
    out = []
    for i in range(npos):
        n = names[i]
        kind = _KINDS.POSITIONAL_ONLY if i < nposonly else _KINDS.POSITIONAL_OR_KEYWORD
        out.append((n, kind, defaults[i - first_default] if i >= first_default else empty, ann.get(n, empty)))
    extra = npos + nkw
    if code.co_flags & _CO_VARARGS:
        n = names[extra]
        out.append((n, _KINDS.VAR_POSITIONAL, empty, ann.get(n, empty)))
        extra += 1
    for i in range(npos, npos + nkw):
        n = names[i]
        out.append((n, _KINDS.KEYWORD_ONLY, kwdefaults.get(n, empty), ann.get(n, empty)))
    if code.co_flags & _CO_VARKEYWORDS:
        n = names[extra]
        out.append((n, _KINDS.VAR_KEYWORD, empty, ann.get(n, empty)))
    return out, ann.get("return", empty)


def _read_signature(name: str, fn: Callable, regs: Registrations, caller) -> Signature:
    """The op spec text for `fn`, with its parameters:

        def f(x: Tensor, cfg: Cfg, *, mode: Mode = Mode.A) -> Tensor
        -> 'ns::f(Tensor x, mod.Cfg cfg, *, mod.Mode mode="a") -> Tensor'
    """
    sig_params, ret_ann = _signature(fn)
    raw = getattr(fn, "__annotations__", None) or {}
    needs_eval = any(isinstance(a, str) for a in raw.values())
    resolver = Resolver(name, regs, getattr(fn, "__globals__", {}),
                        _caller_locals(fn, caller) if needs_eval else None)
    empty = _KINDS.empty
    params: list[Param] = []
    texts: list[str] = []
    saw_kw = False
    for pname, kind, default, ann in sig_params:
        where = Where.parameter(pname)
        if kind is _KINDS.VAR_POSITIONAL or kind is _KINDS.VAR_KEYWORD:
            star = "*" if kind is _KINDS.VAR_POSITIONAL else "**"
            raise TypeError(f"{name}: parameter '{star}{pname}': variadic parameters cannot be op "
                            f"parameters. Spell out each parameter.")
        if kind is _KINDS.POSITIONAL_ONLY:
            raise TypeError(f"{name}: {where}: positional-only parameters are not supported. "
                            f"Remove the '/' from the signature.")
        if not pname.isascii():
            raise ValueError(f"{name}: {where}: torch's schemas take ASCII names only. "
                             f"Rename the parameter (e.g. 'lam' for 'λ').")
        if ann is empty:
            raise SignatureError(name, where, Problem.NO_ANNOTATION, "missing type annotation.", "",
                                 f"Annotate it, e.g. '{pname}: torch.Tensor'.")
        t = resolver.resolve(ann, where)
        text = f"{t.text} {pname}"
        if default is not empty:
            dtext = _types.default_text(default, t)
            if dtext is not None:
                text += f"={dtext}"
        kw = kind is _KINDS.KEYWORD_ONLY
        if kw and not saw_kw:
            texts.append("*")
            saw_kw = True
        texts.append(text)
        params.append(Param(pname, kw, default, t, ()))
    if ret_ann is empty:
        raise SignatureError(name, Where.RETURN, Problem.NO_ANNOTATION, "missing annotation.", "",
                             "Add one, e.g. '-> torch.Tensor' or '-> None'.")
    ret_text, ret_types = _return_spec(name, resolver, ret_ann)
    return Signature(params, ret_types, f"{name}({', '.join(texts)}) -> {ret_text}")


def _return_spec(name: str, resolver: Resolver, ann) -> tuple[str, list]:
    where = Where.RETURN
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
    # Which types may be returned is the core's rule (lowering checks it).
    return resolver.resolve(ann, Where.RETURN)


def _fake_dispatch(name: str, state: _State) -> Callable:
    def fake(*args, **kwargs):
        if state.fake is None:
            if not state.has_tensor_returns:
                return None
            raise RuntimeError(state.no_fake or (
                f"{name}: no fake (shape) implementation is registered, and torch.compile, fake "
                f"tensors and meta tensors need one. Pass fake= to @opforge.op or decorate one "
                f"with @{name.split('::')[1]}.register_fake."
            ))
        return state.fake(*args, **kwargs)

    return fake


def _no_backward_message(name: str, fn: Callable) -> str:
    fname = getattr(fn, "__name__", "op")
    return (f"{name}: a gradient was requested through this op, but it has no backward. "
            f"Pass backward= to @opforge.op or call {fname}.register_autograd(backward).")


def _install_autograd(opdef: OpDef, backward: Callable, setup_context: Callable | None) -> None:
    """The op's autograd bridge (`_C.AutogradBridge`, docs/python_ops.md#autograd):
    its Autograd kernel replaces the no-backward one, and eager calls that
    need a gradient record its node directly. Called again, it only replaces
    backward and setup_context, which the bridge reads at call time."""
    backward, setup_context = opdef._kind.backward(opdef, backward, setup_context)
    state = opdef._state
    state.backward = backward
    state.setup_context = setup_context
    if opdef._has_autograd:
        return
    opdef._registrations.pop("Autograd", None)  # the no-backward kernel, before the bridge takes its key
    bridge = _C.AutogradBridge(opdef)
    opdef._registrations["Autograd"] = bridge.register()
    opdef._has_autograd = True
    opdef._set_autograd(bridge)
    # The direct path runs the default Python body (a C++ op has none).
    if not opdef._device_kernels and state.fn is not None:
        opdef._set_has_backward(True)


def opcheck(op: OpDef, args: tuple, kwargs: dict | None = None, **options):
    """Runs `torch.library.opcheck` on the flat op with the call flattened."""
    flat_args, flat_kwargs = op.flatten(*args, **(kwargs or {}))
    return torch.library.opcheck(op.overload, flat_args, flat_kwargs, **options)


def registered_ops() -> dict[str, OpDef]:
    """Every op defined with @opforge.op (the C++ ops seen from Python are in opforge._registry too)."""
    return {op.name: op for op in _registry.ops() if not isinstance(op._kind, _kinds.CppKernels)}
