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

import keyword
import threading

import torch
from torch import _C as _torch_C

from . import _C, _op, _registry, symm_mem
from ._codegen import EMPTY, Param
from ._structs import find_class, python_value, type_info, types_used_by


class CppOpDef(_op.OpDef):
    """An op of a C++ kernel library seen from Python. Its decorators never
    override what the library registered in C++: each is then an error naming
    the op and the fix (docs/cpp_ops.md#python-decorators-on-c-ops)."""

    __slots__ = ()
    _duck_structs = True

    def _before_fake(self) -> None:
        if self._state.fake is not None:
            return
        if _has_kernel(self.name, "CompositeImplicitAutograd"):
            raise RuntimeError(
                f"{self.name}: register_fake cannot take effect: the op's C++ kernel is a "
                f"CompositeImplicitAutograd kernel, which fake tensors trace through. Register it "
                f"per device (m.impl(\"{self.name.split('::')[1]}\", c10::kCPU, &fn)) or as "
                f"m.def(schema, &fn), or give the op its fake kernel in C++ with m.fake(...).")
        if _has_kernel(self.name, "Meta"):
            raise RuntimeError(f"{self.name}: register_fake: the op already has a fake (Meta) kernel from C++ "
                               f"(m.fake(...)). Remove one of the two.")
        self._register_fake_kernel()

    def _before_autograd(self) -> None:
        if self._has_autograd:
            return
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

    def _before_kernels(self, devices: list[str]) -> None:
        for d in devices:
            key = _torch_C._dispatch_key_for_device(d)
            if key not in self._registrations and _has_kernel(self.name, key):
                raise RuntimeError(f"{self.name}: register_kernel: the op already has a {key} kernel from "
                                   f"C++. Register the Python kernel for another device, or drop the C++ one.")

    @property
    def library(self) -> str:
        """The shared library that defined the op."""
        return (_C.library_op(self.name) or {}).get("library", "")

    def __repr__(self) -> str:
        return f"<opforge C++ op {self.name}: {self.spec}>"


def _has_kernel(name: str, key: str) -> bool:
    return _torch_C._dispatch_has_kernel_for_dispatch_key(name, key)


def signature_of(name: str, lowered) -> _op.Signature:
    """The original signature of a C++ op, as `_op` reads a Python function's."""
    params = []
    for arg in lowered.original.arguments:
        info = type_info(arg.type)
        default = python_value(arg.default_value, arg.type) if arg.has_default else EMPTY
        if arg.has_default and info.kind == "struct" and isinstance(default, dict):
            default = info.py(**default)
        if keyword.iskeyword(arg.name):
            raise TypeError(f"{name}: parameter {arg.name!r} is a Python keyword, so the op cannot be called "
                            f"from Python by name. Rename it in the schema.")
        params.append(Param(arg.name, arg.kwarg_only, default, info, None))
    return _op.Signature(params, [type_info(r.type) for r in lowered.original.returns], lowered.definable_spec)


def define(name: str) -> CppOpDef:
    """The OpDef of C++ op `name`, assembled as `_op.define` assembles a
    Python op's, less what C++ did (the schema and its kernels)."""
    lowered = _C.op_spec(name)
    if lowered is None or _C.library_op(name) is None:
        raise AttributeError(_missing(name))
    ns, opname = name.split("::")
    overload = getattr(getattr(torch.ops, ns), opname).default
    # Python registrations (register_fake, ...) go to a fragment of their own.
    opdef = _op.assemble(name, None, signature_of(name, lowered), _op.OpModel.of(lowered), overload,
                         torch.library.Library(ns, "FRAGMENT"), base=CppOpDef)
    leaf_returns = all(node.is_leaf for node in opdef.model.returns)
    opdef._set_dispatcher_op(name, None if leaf_returns else opdef._code.rebuild_output)
    _registry.add(opdef)
    return opdef


def _missing(name: str) -> str:
    ns = name.split("::")[0]
    failed = [message for _library, message in _C.load_errors() if f"({ns})" in message or f"{ns}::" in message]
    if failed:
        return f"opforge.ops: {name} is not registered because its library failed to load: {failed[-1]}"
    return (f"opforge.ops: {name} was not defined with OPFORGE_LIBRARY (or its library is not loaded). "
            f"Load it with opforge.load_library(path) first.")


_lock = threading.RLock()
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
            if _registry.get(name) is None and _C.library_op(name) is not None:
                try:
                    op = define(name)
                except Exception:  # noqa: BLE001 - reported when the op is used, with its message
                    continue
                # Plain attributes: Dynamo reads them without calling __getattr__.
                ns, opname = name.split("::")
                ops.space(ns).__dict__.setdefault(opname, op)
                namespaces.add(ns)
        for ns in namespaces:
            space = structs.space(ns)
            for short in {t.split(".")[-1] for t in types_used_by(ns)}:
                if short not in space.__dict__:
                    space.__dict__[short] = find_class(ns, short)
        _seen_generation = generation
    symm_mem.sync()


def _cpp_op(name: str) -> CppOpDef | None:
    op = _registry.get(name)
    return op if isinstance(op, CppOpDef) else None


class _Namespace:
    def __init__(self, ns: str, kind: str):
        self._ns = ns
        self._kind = kind

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._kind == "ops":
            qualified = f"{self._ns}::{name}"
            op = _cpp_op(qualified)
            if op is None:
                refresh()
                op = _cpp_op(qualified) or define(qualified)  # raises the reason
            value = op
        else:
            value = find_class(self._ns, name)
        self.__dict__[name] = value
        return value

    def __dir__(self):
        if self._kind == "ops":
            return [n.split("::")[1] for n in _C.op_spec_names() if n.startswith(self._ns + "::")]
        return [n.split(".")[-1] for n in _C.type_names()]

    def __repr__(self):
        return f"<opforge.{self._kind}.{self._ns}>"


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
_registry.on_refresh(refresh)
