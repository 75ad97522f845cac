"""Ops of C++ kernel libraries (OPFORGE_LIBRARY), called from Python with structs.

    opforge.load_library("libmyops.so")          # or torch.ops.load_library
    Cfg = opforge.structs.mylib.NormCfg          # a generated frozen dataclass
    opforge.ops.mylib.rms_norm(out, x, w, Cfg(eps=1e-5))   # -> torch.ops.mylib.rms_norm(out, x, w, 1e-05, False)

A C++ op seen from Python is an `OpDef` built by the same steps as an
`@opforge.op` op: the same call boundary (any object with a struct's fields
works in place of the generated class), the same decorators
(`register_fake`, `register_autograd`, `register_kernel`, each refusing to
override what C++ registered), and the same eager fast path, which calls the
dispatcher from C. Ops of every loaded library are made before torch.compile
traces, so an op's first call may be inside a compiled region.
"""

from __future__ import annotations

import dataclasses
import enum
import keyword
import os
import threading
from typing import Any, Callable, Literal, Optional, Sequence

import torch
from torch import _C as _torch_C

from . import _C, _op, _types
from ._codegen import EMPTY, Param
from ._types import EnumInfo, StructInfo, TypeInfo

_CODE_TO_DTYPE = {code: getattr(torch, name) for name, code in _types._DTYPE_CODES.items() if hasattr(torch, name)}

_classes: dict[str, type] = {}  # registered struct/enum name -> generated class


def _python_value(value: Any, type_: Any) -> Any:
    kind = type_.kind
    if kind == "Optional":
        return None if value is None else _python_value(value, type_.elements[0])
    if kind == "ScalarType" and isinstance(value, int):
        return _CODE_TO_DTYPE.get(value, value)
    if kind == "Device" and isinstance(value, str):
        return torch.device(value)
    if kind == "Enum" and not isinstance(value, enum.Enum):
        return _enum_class(type_.name)(value)  # a C++ default arrives as the member's value
    return value


def _enum_class(name: str) -> type:
    cls = _classes.get(name)
    if cls is None:
        members, values = _C.describe_enum(name)
        cls = enum.Enum(name.split(".")[-1], list(zip(members, values)), module="opforge.structs")
        cls.__qualname__ = name
        _classes[name] = cls
        info = EnumInfo(name, cls, {m.value: m for m in cls})
        _types.ENUMS.setdefault(cls, info)
        _types.ENUMS_BY_NAME.setdefault(name, info)
    return cls


def struct_class(name: str) -> type:
    """The generated frozen dataclass for a registered struct:

        struct_class("mylib.NormCfg")   # <class 'opforge.structs.mylib.NormCfg'>: NormCfg(eps=1e-06, offset=False)
    """
    cls = _classes.get(name)
    if cls is not None:
        return cls
    fields = _C.describe_struct(name)
    if fields is None:
        raise AttributeError(f"opforge.structs: no struct named {name!r} is registered.")
    specs, infos = [], {}
    for fname, ftype, default, has_default in fields:
        info = _type_info(ftype)
        infos[fname] = info
        annotation = _annotation(info)
        if has_default:
            value = _python_value(default, ftype)
            if isinstance(value, (list, dict)):
                specs.append((fname, annotation, dataclasses.field(default_factory=lambda v=value: type(v)(v))))
            else:
                specs.append((fname, annotation, dataclasses.field(default=value)))
        else:
            specs.append((fname, annotation))
    # A field without default after one with a default needs keyword-only
    # construction; otherwise fields stay positional, in C++ order.
    defaults_seen, kw_only = False, False
    for spec in specs:
        if len(spec) == 3:
            defaults_seen = True
        elif defaults_seen:
            kw_only = True
    cls = dataclasses.make_dataclass(name.split(".")[-1], specs, frozen=True, kw_only=kw_only)
    cls.__qualname__ = name
    cls.__module__ = "opforge.structs"
    _classes[name] = cls
    all_scalar = all(_types._is_scalar_tree(t) for t in infos.values())
    info = StructInfo(name, cls, infos, all_scalar)
    _types.STRUCTS.setdefault(cls, info)
    _types.STRUCTS_BY_NAME.setdefault(name, info)
    return cls


def _annotation(info: TypeInfo) -> Any:
    if info.kind == "list":
        ann = list[_annotation(info.element)]
    elif info.kind in ("struct", "enum"):
        ann = info.py
    elif info.kind == "literal":
        ann = Literal[info.allowed]
    else:
        ann = _types.PY_TYPES.get(info.text.rstrip("?"), Any)
    return Optional[ann] if info.optional else ann


def _type_info(t: Any) -> TypeInfo:
    """A core Type as the TypeInfo the code generator reads."""
    if t.kind == "Optional":
        inner = _type_info(t.elements[0])
        return dataclasses.replace(inner, text=inner.text + "?", optional=True)
    if t.kind == "List":
        elem = _type_info(t.elements[0])
        return TypeInfo(elem.text + "[]", "list", element=elem)
    if t.kind == "Struct":
        cls = struct_class(t.name)
        return TypeInfo(t.name, "struct", py=cls, fields=_types.STRUCTS[cls].fields)
    if t.kind == "Enum":
        return TypeInfo(t.name, "enum", py=_enum_class(t.name))
    if t.kind == "Literal":
        return TypeInfo(str(t), "literal", allowed=tuple(t.literals))
    if t.kind == "Handle":
        # C++ runners live in the C++ handle table: Python passes the int.
        return TypeInfo("int", "scalar")
    return TypeInfo(str(t), "tensor" if t.kind == "Tensor" else "scalar")


class CppOpDef(_op.OpDef):
    """An op of a C++ kernel library seen from Python. Its decorators never
    override what the library registered in C++: each is then an error naming
    the op and the fix (docs/cpp_ops.md#python-decorators-on-c-ops)."""

    __slots__ = ()

    def register_fake(self, fn: Callable) -> Callable:
        _op._check_callable(self.name, "register_fake", fn)
        state = self._state
        if state.fake is None:
            if _has_kernel(self.name, "CompositeImplicitAutograd"):
                raise RuntimeError(
                    f"{self.name}: register_fake cannot take effect: the op's C++ kernel is a "
                    f"CompositeImplicitAutograd kernel, which fake tensors trace through. Register it "
                    f"per device (m.impl(\"{self.name.split('::')[1]}\", c10::kCPU, &fn)) or as "
                    f"m.def(schema, &fn), or give the op its fake kernel in C++ with m.fake(...).")
            if _has_kernel(self.name, "Meta"):
                raise RuntimeError(f"{self.name}: register_fake: the op already has a fake (Meta) kernel from C++ "
                                   f"(m.fake(...)). Remove one of the two.")
            _op._register_fake(self._lib, self.name, _op._lazy_fake_kernel(self._code, _op._fake_dispatch(
                self.name, state)))
        state.fake = fn
        return fn

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None) -> None:
        _op._check_callable(self.name, "backward", backward)
        if setup_context is not None:
            _op._check_callable(self.name, "setup_context", setup_context)
        if not self._has_autograd:
            info = _C.library_op(self.name) or {}
            if info.get("has_cpp_autograd") or info.get("has_torch_layer_autograd"):
                raise RuntimeError(f"{self.name}: register_autograd: the op already has a backward from C++ "
                                   f"(.autograd<G>()). Remove one of the two.")
            if any(leaf.mutated for leaf in self.model.leaves):
                raise RuntimeError(f"{self.name}: register_autograd: the op mutates an argument; a backward is "
                                   f"only supported for ops that mutate nothing. Return a new tensor instead.")
            if _has_kernel(self.name, "Autograd") and not _C.drop_no_backward_kernel(self.name):
                raise RuntimeError(f"{self.name}: register_autograd: the op already has an Autograd kernel from "
                                   f"C++. Remove one of the two.")
        _op._install_autograd(self, backward, setup_context)

    def register_kernel(self, device_types: str | Sequence[str], fn: Callable | None = None):
        def register(fn: Callable) -> Callable:
            _op._check_callable(self.name, "register_kernel", fn)
            devices = _op._device_list(self.name, device_types)
            for d in devices:
                key = _torch_C._dispatch_key_for_device(d)
                if key not in self._registrations and _has_kernel(self.name, key):
                    raise RuntimeError(f"{self.name}: register_kernel: the op already has a {key} kernel from "
                                       f"C++. Register the Python kernel for another device, or drop the C++ one.")
            _op._install_kernels(self, devices, fn)
            return fn

        return register if fn is None else register(fn)

    @property
    def library(self) -> str:
        """The shared library that defined the op."""
        return (_C.library_op(self.name) or {}).get("library", "")

    def __repr__(self) -> str:
        return f"<opforge C++ op {self.name}: {self.spec}>"


def _has_kernel(name: str, key: str) -> bool:
    return _torch_C._dispatch_has_kernel_for_dispatch_key(name, key)


def _signature(name: str, lowered) -> _op.Signature:
    """The original signature of a C++ op, as `_read_signature` reads a Python one."""
    params = []
    for arg in lowered.original.arguments:
        info = _type_info(arg.type)
        default = _python_value(arg.default_value, arg.type) if arg.has_default else EMPTY
        if arg.has_default and info.kind == "struct" and isinstance(default, dict):
            default = info.py(**default)
        if keyword.iskeyword(arg.name):
            raise TypeError(f"{name}: parameter {arg.name!r} is a Python keyword, so the op cannot be called "
                            f"from Python by name. Rename it in the schema.")
        params.append(Param(arg.name, arg.kwarg_only, default, info, None))
    return _op.Signature(params, [_type_info(r.type) for r in lowered.original.returns], lowered.definable_spec)


def define(name: str) -> CppOpDef:
    """The OpDef of C++ op `name`, by the steps `_op.define` takes for a
    Python op, less those C++ did (the schema and its kernels)."""
    lowered = _C.op_spec(name)
    if lowered is None or _C.library_op(name) is None:
        raise AttributeError(_missing(name))
    ns, opname = name.split("::")
    overload = getattr(getattr(torch.ops, ns), opname).default
    sig = _signature(name, lowered)
    model = _op.OpModel.of(lowered)
    boundary = _op._make_boundary(name, sig, model, duck_structs=True, handles_as_ints=True)
    state = _op._State(fn=None, fake=None, backward=None, setup_context=None,
                       has_tensor_returns=len(model.return_types) > 0)
    # Python registrations (register_fake, ...) go to a fragment of their own.
    lib = torch.library.Library(ns, "FRAGMENT")
    opdef = _op._new_opdef(name, None, sig, model, boundary, overload, state, lib, None, base=CppOpDef,
                           duck_structs=True)
    opdef._bind(boundary, None, {}, type(opdef).__call__)
    leaf_returns = all(node.is_leaf for node in model.returns)
    opdef._set_dispatcher_op(name, None if leaf_returns else opdef._code.rebuild_output)
    return opdef


def _missing(name: str) -> str:
    ns = name.split("::")[0]
    failed = [message for _library, message in _C.load_errors() if f"({ns})" in message or f"{ns}::" in message]
    if failed:
        return f"opforge.ops: {name} is not registered because its library failed to load: {failed[-1]}"
    return (f"opforge.ops: {name} was not defined with OPFORGE_LIBRARY (or its library is not loaded). "
            f"Load it with opforge.load_library(path) first.")


_lock = threading.RLock()
_made: dict[str, CppOpDef] = {}
_seen_generation = -1


def refresh() -> None:
    """Makes the OpDefs of every C++ op loaded since the last call. Runs
    before torch.compile traces (so `opforge.ops.ns.op` needs no work under
    tracing), after opforge.load_library, and on a miss in `opforge.ops`."""
    global _seen_generation
    generation = _C.library_generation()
    if generation == _seen_generation:
        return
    namespaces: set[str] = set()
    with _lock:
        for name in _C.op_spec_names():
            if name not in _made and _C.library_op(name) is not None:
                try:
                    op = _made[name] = define(name)
                except Exception:  # noqa: BLE001 - reported when the op is used, with its message
                    continue
                # Plain attributes: Dynamo reads them without calling __getattr__.
                ns, opname = name.split("::")
                ops.space(ns).__dict__.setdefault(opname, op)
                namespaces.add(ns)
        for ns in namespaces:
            space = structs.space(ns)
            for short in {t.split(".")[-1] for t in _types_used_by(ns)}:
                if short not in space.__dict__:
                    space.__dict__[short] = _find_class(ns, short)
        _seen_generation = generation
    from . import symm_mem

    symm_mem.sync()


def load_library(path: str | os.PathLike) -> None:
    """Loads a C++ kernel library (as torch.ops.load_library does) and raises
    if one of its OPFORGE_LIBRARY blocks could not be registered:

        opforge.load_library("build/libkernels.so")
        # RuntimeError: libkernels.so: OPFORGE_LIBRARY(kernels) at ops.cc:40: kernels::rms_norm: ... Nothing of this block was registered.
    """
    path = os.fspath(path)
    before = len(_C.load_errors())
    torch.ops.load_library(path)
    errors = [message for _library, message in _C.load_errors()[before:]]
    refresh()
    if errors:
        raise RuntimeError("\n".join(errors))


def _line(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_library(name: str, *, opforge_version: str, abi_version: int, torch_version: str, stable: bool,
                  torch_target_version: str = "") -> None:
    """Raises ImportError, in one sentence naming both versions, when a C++
    kernel library built with these versions cannot load here. A library's
    package calls it before loading its .so (examples/kernel_library):

        check_library("kernels", opforge_version="0.2.0", abi_version=1, torch_version="2.13.0", stable=False)
        # ImportError: kernels was built against opforge 0.2.0 but opforge 0.1.0 is installed; ...
    """
    from . import __version__

    running = torch.__version__
    if stable:
        have = _C.abi_version()
        if int(abi_version) > have:
            raise ImportError(f"{name} was built against opforge {opforge_version}, whose C ABI version is "
                              f"{abi_version}, but opforge {__version__} serves versions up to {have}; install "
                              f"opforge>={opforge_version}.")
        if torch_target_version and _line(running) < _line(torch_target_version):
            raise ImportError(f"{name} is built on torch's stable ABI for torch {torch_target_version} and later, "
                              f"but torch {running} is installed; install torch>={torch_target_version}.")
        return
    if opforge_version != __version__:
        raise ImportError(f"{name} was built against opforge {opforge_version} but opforge {__version__} is "
                          f"installed; install opforge=={opforge_version}, or rebuild {name} against this opforge "
                          f"(pip install --no-build-isolation --no-deps --force-reinstall <its source>), or build it "
                          f"on the stable ABI, which loads with later opforge releases (docs/stable_abi.md).")
    if _line(torch_version) != _line(running):
        raise ImportError(f"{name} was built against torch {torch_version} but torch {running} is installed; "
                          f"install a torch {'.'.join(map(str, _line(torch_version)))}.x, or rebuild {name} for "
                          f"this torch, or build it on the stable ABI (docs/stable_abi.md).")


def load_errors() -> list[str]:
    """The messages of every C++ library block that could not be registered."""
    return [message for _library, message in _C.load_errors()]


def _on_compile_start(*_args) -> None:
    refresh()


def _install_compile_hook() -> None:
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # pragma: no cover - every supported torch has it
        return
    callback_handler.register_start_callback(_on_compile_start)


class _Namespace:
    def __init__(self, ns: str, kind: str):
        self._ns = ns
        self._kind = kind

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._kind == "ops":
            qualified = f"{self._ns}::{name}"
            op = _made.get(qualified)
            if op is None:
                refresh()
                op = _made.get(qualified)
                if op is None:
                    op = _made[qualified] = define(qualified)  # raises the reason
            value = op
        else:
            value = _find_class(self._ns, name)
        self.__dict__[name] = value
        return value

    def __dir__(self):
        if self._kind == "ops":
            return [n.split("::")[1] for n in _C.op_spec_names() if n.startswith(self._ns + "::")]
        return [n.split(".")[-1] for n in _C.type_names()]

    def __repr__(self):
        return f"<opforge.{self._kind}.{self._ns}>"


def _types_used_by(ns: str) -> set[str]:
    """Struct and enum names the ops of namespace `ns` use, nested ones too."""
    seen: set[str] = set()

    def walk(t):
        if t.kind in ("Struct", "Enum") and t.name not in seen:
            seen.add(t.name)
            if t.kind == "Struct":
                for _name, ftype, _default, _has in _C.describe_struct(t.name) or ():
                    walk(ftype)
        for e in t.elements:
            walk(e)

    for op_name in _C.op_spec_names():
        if op_name.startswith(ns + "::"):
            spec = _C.op_spec(op_name).original
            for arg in (*spec.arguments, *spec.returns):
                walk(arg.type)
    return seen


def _find_class(ns: str, name: str) -> type:
    """`opforge.structs.<ns>.<name>`: the type registered as `<ns>.<name>`
    (a C++ library's own types), else one the namespace's ops use whose last
    name part is `name`, else one registered as `name`."""
    used = sorted(n for n in _types_used_by(ns) if n.split(".")[-1] == name)
    for candidate in (f"{ns}.{name}", *used, name):
        if _C.describe_struct(candidate) is not None:
            return struct_class(candidate)
        if _C.describe_enum(candidate) is not None:
            return _enum_class(candidate)
    raise AttributeError(f"opforge.structs.{ns}: no struct or enum named {name!r} is used by the ops "
                         f"of {ns} or registered as {ns}.{name}.")


class _Root:
    def __init__(self, kind: str):
        self._kind = kind

    def __getattr__(self, ns: str) -> _Namespace:
        if ns.startswith("__"):
            raise AttributeError(ns)
        return self.space(ns)

    def space(self, ns: str) -> _Namespace:
        space = self.__dict__.get(ns)
        if space is None:
            space = self.__dict__[ns] = _Namespace(ns, self._kind)
        return space

    def __repr__(self):
        return f"<opforge.{self._kind}>"


ops = _Root("ops")
structs = _Root("structs")
_install_compile_hook()
