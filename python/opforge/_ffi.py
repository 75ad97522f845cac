"""TVM-FFI functions as op kernels (docs/tvm_ffi.md).

    mod = tvm_ffi.cpp.load_inline("norm", cpp_sources=src, functions=["rms_norm"])

    @opforge.op("mylib::rms_norm", mutates_args=("out",), kernel=mod.rms_norm)
    def rms_norm(out: Tensor, x: Tensor, w: Tensor, cfg: NormCfg) -> None:
        '''The signature: TVM-FFI records no parameter names or mutation.'''

    rms_norm(out, x, w, NormCfg(eps=1e-6))   # rms_norm(out, x, w, 1e-6) in C, no Python frame

The function receives the op's flat leaves in schema order (a struct as its
fields, an enum as its value); see `_C.FfiKernel` for how each leaf travels.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any, Callable

import torch

from . import _C

_INSTALL = "pip install 'opforge[tvm-ffi]' (or pip install apache-tvm-ffi)"


def is_function(obj: Any) -> bool:
    """Whether `obj` is a `tvm_ffi.Function`, without importing tvm_ffi
    (an object of its type cannot exist before tvm_ffi is imported)."""
    module = sys.modules.get("tvm_ffi")
    return module is not None and isinstance(obj, module.Function)


def _is_module(obj: Any) -> bool:
    module = sys.modules.get("tvm_ffi")
    return module is not None and isinstance(obj, module.Module)


_LIB: list = []  # [the path of libtvm_ffi.so]


@dataclasses.dataclass(frozen=True)
class TvmFfiKernel:
    """A TVM-FFI function as `kernel=`, with how opforge passes it tensors.
    A function whose parameters are `ffi::Tensor` (owned) rather than
    `ffi::TensorView` needs `owned_tensors=True`: a `tvm_ffi.Function` does
    not say what it takes, so opforge passes DLTensor views unless told.

        ffi::Tensor ident(ffi::Tensor x)  ->  kernel=opforge.TvmFfiKernel(mod.ident, owned_tensors=True)
    """

    function: Any
    owned_tensors: bool = False


def _module_functions(module: Any) -> list[str]:
    """The functions of a `tvm_ffi.Module` looked up so far (`mod.f` keeps
    each in the module's __dict__); TVM-FFI has no list of a module's exports."""
    return sorted(n for n, v in getattr(module, "__dict__", {}).items() if is_function(v))


def _refuse_module(name: str, what: str, module: Any) -> None:
    names = _module_functions(module)
    example = names[0] if names else "<function>"
    known = f"; the module has: {', '.join(names)}" if names else " (one of its functions, by name)"
    passed = f"kernel=mod.{example}" if what == "kernel=" else f"mod.{example}"
    raise TypeError(f"{name}: {what} got a tvm_ffi.Module, which holds several functions, not one. Pass "
                    f"{passed}{known}.")


def unwrap(obj: Any) -> Any:
    """The `tvm_ffi.Function` that `obj` is or wraps (a CuTe DSL compile with
    --enable-tvm-ffi returns a Python object around one; a TvmFfiKernel
    holds one), or None. A `tvm_ffi.Module` comes back as itself, for
    make_kernel to refuse: it holds several functions, not one."""
    if is_function(obj) or _is_module(obj):
        return obj
    if isinstance(obj, TvmFfiKernel):
        return unwrap(obj.function)
    if "tvm_ffi" not in sys.modules or isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        return None
    for value in getattr(obj, "__dict__", {}).values():
        if is_function(value):
            return value
    return None


def make_kernel(name: str, function: Any, what: str = "kernel") -> "_C.FfiKernel":
    """The op's `_C.FfiKernel` for a `tvm_ffi.Function` (or an object that
    wraps one, or a TvmFfiKernel); a TypeError naming the op for anything
    else, a module included."""
    owned = isinstance(function, TvmFfiKernel) and function.owned_tensors
    if _is_module(function) or (isinstance(function, TvmFfiKernel) and _is_module(function.function)):
        _refuse_module(name, what, getattr(function, "function", function))
    function = unwrap(function) or function
    if not is_function(function):
        # Without tvm_ffi imported nothing can be one: say how to get it.
        install = "" if "tvm_ffi" in sys.modules else f" TVM-FFI kernels need the apache-tvm-ffi package: {_INSTALL}."
        raise TypeError(f"{name}: {what} must be a tvm_ffi.Function (from tvm_ffi.load_module, "
                        f"tvm_ffi.cpp.load_inline or a CuTe DSL compile with --enable-tvm-ffi), not "
                        f"{type(function).__name__}. A Python kernel is the decorated function itself.{install}")
    import tvm_ffi.libinfo

    if not _LIB:
        _LIB.append(tvm_ffi.libinfo.find_libtvm_ffi())
    label = getattr(function, "__name__", None) or ""  # a module's function has none
    return _C.FfiKernel(name, label, function.__chandle__(), _LIB[0], bool(getattr(function, "release_gil", True)),
                        owned)


def kernels_of(name: str, kernel: Any, device_types: list[str] | None) -> dict:
    """`kernel=` as {device type or None (every device): tvm_ffi.Function}:

        kernel=f                          -> {None: f}
        kernel=f, device_types=["cuda"]   -> {"cuda": f}
        kernel={"cpu": f, "cuda": g}      -> {"cpu": f, "cuda": g}
    """
    if isinstance(kernel, dict):
        if device_types is not None:
            raise TypeError(f"{name}: kernel= names its devices as a dict; drop device_types=.")
        if not kernel:
            raise ValueError(f"{name}: kernel= is an empty dict. Map device types to functions, "
                             f"e.g. kernel={{'cuda': mod.f}}.")
        for device in kernel:
            if not isinstance(device, str):
                raise TypeError(f"{name}: kernel= maps device types ('cpu', 'cuda') to functions, "
                                f"not {type(device).__name__} {device!r}.")
        return dict(kernel)
    if device_types is None:
        return {None: kernel}
    return {d: kernel for d in device_types}


def refuse_as_body(name: str, fn: Any) -> None:
    """A TVM-FFI function decorated directly: it has no signature to read."""
    if is_function(fn):
        raise TypeError(
            f"{name}: a tvm_ffi.Function records no parameter names, types or mutation, so it cannot be the "
            f"decorated function. Decorate a stub that has the op's signature and pass the function as its "
            f"kernel: @opforge.op({name!r}, kernel=fn) above `def f(x: Tensor, ...) -> Tensor: ...` "
            f"(docs/tvm_ffi.md).")


def missing_fake_message(name: str) -> str:
    short = name.split("::")[1]
    return (f"{name}: its kernel is a TVM-FFI function, which cannot run on the fake tensors of torch.compile, "
            f"torch.export and meta tensors, and the op has no fake. Pass fake= to @opforge.op, or decorate a "
            f"shape function with @{short}.register_fake (an out-variant op that returns None needs none).")


def raw_calls(fn: Callable) -> list[str]:
    """The TVM-FFI functions and modules `fn` refers to by name (globals,
    closure cells, nested functions), as `mod.f` calls them:

        def backward(ctx, g): return mod.rms_norm_bwd(g, ...)  ->  ['mod']
    """
    if "tvm_ffi" not in sys.modules:
        return []
    found: list[str] = []
    seen: set = set()

    def visit(code: types.CodeType, namespace: dict, closure: dict) -> None:
        if code in seen:
            return
        seen.add(code)
        for n in code.co_names + code.co_freevars:
            value = closure.get(n, namespace.get(n))
            if (is_function(value) or _is_module(value)) and n not in found:
                found.append(n)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                visit(const, namespace, closure)

    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    closure = {}
    for n, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            closure[n] = cell.cell_contents
        except ValueError:
            pass
    visit(code, getattr(fn, "__globals__", {}), closure)
    return found


def _is_traced(values) -> bool:
    """Whether these tensors are the fake or functional stand-ins of a trace."""
    for v in values:
        if isinstance(v, torch.Tensor) and (type(v) is not torch.Tensor or v.device.type == "meta"):
            return True
    return False


def guard_backward(name: str, backward: Callable) -> Callable:
    """`backward`, refusing to run on a trace's fake tensors when it calls a
    TVM-FFI function directly (the function would read no memory, or write
    through a null pointer); unchanged when it calls none."""
    names = raw_calls(backward)
    if not names:
        return backward
    listed = ", ".join(repr(n) for n in names)
    message = (f"{name}: its backward calls the TVM-FFI function {listed} directly, which cannot run on the fake "
               f"tensors torch.compile traces the backward with. Make that kernel an op too: "
               f"@opforge.op('{name}_backward', kernel=...) on a stub with its signature, and call the op from "
               f"the backward (docs/tvm_ffi.md#backward-kernels).")

    def guarded(ctx, *grads):
        if _is_traced(grads):
            raise RuntimeError(message)
        return backward(ctx, *grads)

    guarded.__wrapped__ = backward
    return guarded
