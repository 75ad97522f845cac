"""What opforge checks while an op's traced body runs (docs/triton.md).

A Triton op's traced body runs under fake tensors (Dynamo) and under
FunctionalTensorMode (AOTAutograd). Around each run, `guard` does three things:

- it names the op's tensor arguments by parameter (`x`, `cfg.weight`,
  `xs[1]`) so that each launch can be checked for a kernel writing one that
  `mutates_args` does not declare: `check_launch` asks torch's kernel mutation
  analysis which arguments the kernel writes and compares their storages;
- it turns the errors of host code that reads tensor values (`.item()`,
  `assert (t > 0).all()`) into one that names the user's file and line;
- it gives traced tensors stand-in data pointers for host code that only
  passes pointers along (`_Pointers`), and records the kernels each launch
  reaches for `op.triton_kernels`.

    traced = guard("mylib::op", traced_body, inspect.signature(body), declared=("out",))
    traced(x, out)   # raises UndeclaredWriteError if a kernel writes x

`backward_switch` and `setup_context_switch` do the same for backward and
setup_context, and pick the traced copy only while tracing, since nothing
dispatches them.
"""

from __future__ import annotations

import dataclasses
import inspect
import linecache
import os
import sys
import threading
import warnings
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from . import _kernels, _ops, _writes


class UndeclaredWriteError(ValueError):
    """A kernel of the op's body writes an argument that mutates_args does not declare."""


class UndeclaredWriteWarning(UserWarning):
    """A kernel of backward writes a gradient it was given, or an op input saved for backward."""


class HostCodeError(RuntimeError):
    """Host code of a Triton op reads tensor values, which tracing cannot do.

    A RuntimeError, so that torch.compile without fullgraph still falls back
    to running the op eagerly (a graph break) as it does for the original error."""


# --- which tensors a launch must not write --------------------------------------------


@dataclasses.dataclass
class Watch:
    op: str
    phase: str  # "body", "backward" or "setup_context"
    storages: dict  # StorageWeakRef -> (path, description): ("x", "the op's parameter 'x'")
    error: bool  # raise (the body) or warn (backward)
    addresses: dict = dataclasses.field(default_factory=dict)  # StorageWeakRef -> stand-in data_ptr()

    def address(self, t: Any) -> int:
        """A stand-in for a traced tensor's data_ptr(): one aligned base per
        storage, so that views of one storage compare as they would eagerly."""
        ref = _storage_ref(t)
        base = self.addresses.get(ref)
        if base is None:
            base = self.addresses[ref] = (len(self.addresses) + 1) << 36
        return base + t.storage_offset() * t.element_size()


_LOCAL = threading.local()


def watching() -> bool:
    return getattr(_LOCAL, "watch", None) is not None


def current_op() -> str:
    """The op whose traced body, backward or setup_context is running."""
    watch = getattr(_LOCAL, "watch", None)
    return watch.op if watch is not None else "opforge"


def found(kernel: Any) -> None:
    """Records a launch of `kernel` for the op being traced (op.triton_kernels)."""
    watch = getattr(_LOCAL, "watch", None)
    if watch is not None:
        _ops.found(watch.op, watch.phase, kernel)


def _storage_ref(t: Any) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return StorageWeakRef(t.untyped_storage())
    except Exception:  # tensors without a storage (sparse, nested) cannot alias a kernel argument
        return None


def named_tensors(name: str, value: Any, out: list, depth: int = 0) -> None:
    """(path, tensor) for every tensor in a parameter value: `x`, `xs[1]`, `cfg.weight`."""
    if isinstance(value, torch.Tensor):
        out.append((name, value))
    elif depth > 4:
        return
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            named_tensors(f"{name}[{i}]", v, out, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            named_tensors(f"{name}.{f.name}", getattr(value, f.name, None), out, depth + 1)


def _declared(path: str, declared: frozenset) -> bool:
    top = path.split(".")[0].split("[")[0]
    return path in declared or top in declared


def _param_storages(sig: inspect.Signature | None, args: tuple, kwargs: dict, declared: frozenset,
                    describe: Callable[[str], str]) -> dict:
    if sig is None:
        return {}
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return {}
    found: list = []
    for pname, value in bound.arguments.items():
        named_tensors(pname, value, found)
    storages = {}
    for path, t in found:
        if _declared(path, declared):
            continue
        ref = _storage_ref(t)
        if ref is not None:
            storages.setdefault(ref, (path, describe(path)))
    return storages


class _Pushed:
    __slots__ = ("previous",)

    def __init__(self, watch: Watch | None):
        self.previous = getattr(_LOCAL, "watch", None)
        _LOCAL.watch = watch

    def pop(self) -> None:
        _LOCAL.watch = self.previous


def check_launch(kernel: Any, args: tuple, kwargs: dict, frame) -> None:
    """Reports a launch whose kernel writes a watched tensor."""
    watch = getattr(_LOCAL, "watch", None)
    if watch is None or not watch.storages:
        return
    jit = _kernels.jit_of(kernel)
    names = list(getattr(jit, "arg_names", ()) or ())
    combined = {**dict(zip(names, args)), **kwargs}
    hit = []
    for name, value in combined.items():
        if isinstance(value, torch.Tensor):
            what = watch.storages.get(_storage_ref(value))
            if what is not None:
                hit.append((name, what))
    if not hit:
        return
    written = _writes.written_arguments(kernel, combined)
    if written is None:  # the analysis could not run (no GPU driver): nothing to say
        return
    for arg, what in hit:
        if arg in written:
            _report(watch, _kernels.kernel_name(kernel), arg, what, frame)
            return


def _report(watch: Watch, kernel: str, arg: str, target: tuple, frame) -> None:
    path, what = target
    at = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else "?"
    if watch.error:
        top = path.split(".")[0].split("[")[0]
        raise UndeclaredWriteError(
            f"{watch.op}: Triton kernel '{kernel}' (launched at {at}) writes its argument '{arg}', which is "
            f"{what}, but mutates_args does not declare '{top}'. Eager and compiled results would differ: "
            f"a compiled graph assumes '{top}' is left unchanged. Declare it with mutates_args=('{top}',), "
            f"or have the body write into a copy ({top}.clone()).")
    warnings.warn(
        f"{watch.op}: {watch.phase}: Triton kernel '{kernel}' (launched at {at}) writes its argument "
        f"'{arg}', which is {what}. Eager runs write into that tensor; compiled runs write into a copy, so "
        f"results can differ wherever the tensor is used again. Have {watch.phase} write into a copy "
        f"(.clone() first), or use the library's out-of-place option (e.g. in_place=False).",
        UndeclaredWriteWarning, stacklevel=2)


# --- host code that reads tensor values ------------------------------------------------


def _host_errors() -> tuple:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    types = [DataDependentOutputException, DynamicOutputShapeException]
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        types.append(GuardOnDataDependentSymNode)
    except ImportError:  # pragma: no cover - every supported torch has it
        pass
    return tuple(types)


_LIBRARY_DIRS: list[tuple[str, bool]] = []  # (directory, whether its site-packages are user code)


def _library_dirs() -> list[tuple[str, bool]]:
    if not _LIBRARY_DIRS:
        import sysconfig

        import triton

        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the opforge package
        for d in (os.path.dirname(torch.__file__), os.path.dirname(triton.__file__), here):
            _LIBRARY_DIRS.append((os.path.normcase(os.path.abspath(d)) + os.sep, False))
        _LIBRARY_DIRS.append((os.path.normcase(os.path.abspath(sysconfig.get_paths()["stdlib"])) + os.sep, True))
    return _LIBRARY_DIRS


def _is_user_file(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    norm = os.path.normcase(os.path.abspath(filename))
    for d, packages_are_users in _library_dirs():
        if norm.startswith(d):
            rest = norm[len(d):]
            return packages_are_users and ("site-packages" in rest or "dist-packages" in rest)
    return True


def user_frames(tb) -> list[tuple[str, int]]:
    """(file, line) of the frames of a traceback that are user code (not
    torch, triton, opforge, the standard library or generated code), outermost first."""
    out = []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if _is_user_file(filename):
            out.append((filename, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _host_message(op: str, phase: str, e: BaseException) -> str:
    frames = user_frames(e.__traceback__)
    where = "in host code"
    source = ""
    if frames:
        inner = frames[-1]
        where = f"at {inner[0]}:{inner[1]}"
        if frames[0] != inner:
            where += f" (reached from {frames[0][0]}:{frames[0][1]})"
        line = linecache.getline(inner[0], inner[1]).strip()
        if line:
            source = f"\n    {line}\n"
    who = "the body" if phase == "body" else phase
    if "Cannot access data pointer" in str(e):
        return (f"{op}: {who} launches a Triton kernel {where} that opforge did not make traceable, so it ran on "
                f"fake tensors, which have no data.{source or ' '}Launch it through torch.library.wrap_triton("
                f"kernel)[grid](...) there, pass the kernel in extra_triton_kernels=, or keep the op opaque with "
                f"triton='off' and a shape function fake=.")
    if phase == "body":
        fix = ("Move the value check or computation out of the op (do it before calling the op and pass the "
               "result as a parameter), or keep the op opaque with triton='off' and a shape function fake=.")
    else:
        fix = (f"Make {phase} decide from shapes, dtypes and ctx attributes only, or compute the value with "
               f"tensor operations instead of reading it on the host.")
    return (f"{op}: {who} reads a tensor's value {where}, which torch.compile cannot trace: it runs {who} on "
            f"fake tensors, which have shapes but no values ({type(e).__name__}).{source or ' '}{fix}")


def _is_host_error(e: BaseException) -> bool:
    return isinstance(e, _host_errors()) or (isinstance(e, RuntimeError) and "Cannot access data pointer" in str(e))


_DATA_PTR = torch._C.TensorBase.data_ptr
_NO_DATA = "Cannot access data pointer of Tensor (e.g. FakeTensor, FunctionalTensor)"


class _Pointers(TorchFunctionMode):
    """data_ptr() of a traced tensor returns a stand-in address (Watch.address),
    so host code that only passes pointers along runs while tracing (FlagGems'
    StridedBuffer reads one when it is built). Triton's own runtime still gets
    the error: a launch that did not go through wrap_triton cannot be traced."""

    def __init__(self, watch: Watch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _DATA_PTR and args and isinstance(args[0], _tracing_types()):
            caller = sys._getframe(1).f_globals.get("__name__") or ""
            if caller.partition(".")[0] == "triton":
                raise RuntimeError(f"{_NO_DATA}: Triton launched a kernel on a traced tensor.")
            return self.watch.address(args[0])
        return func(*args, **(kwargs or {}))


def _run_watched(op: str, where: str, watch: Watch, fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs) with `watch` checking its launches; host code that
    reads a tensor's value becomes a HostCodeError naming `where` and the
    user's line."""
    pushed = _Pushed(watch)
    try:
        with _Pointers(watch):
            return fn(*args, **kwargs)
    except Exception as e:
        if isinstance(e, (UndeclaredWriteError, HostCodeError)) or not _is_host_error(e):
            raise
        raise HostCodeError(_host_message(op, where, e))  # noqa: B904 - Dynamo reads __cause__
    finally:
        pushed.pop()


# --- guards ---------------------------------------------------------------------------------


def guard(op: str, traced: Callable, sig: inspect.Signature | None, declared: frozenset) -> Callable:
    """The traced body, checking launches for undeclared writes and naming
    the user's line when host code reads tensor values. Same signature."""

    def describe(path: str) -> str:
        return f"the op's parameter '{path}'"

    def traced_body(*args, **kwargs):
        watch = Watch(op, "body", _param_storages(sig, args, kwargs, declared, describe), True)
        return _run_watched(op, "body", watch, traced, *args, **kwargs)

    _copy_names(traced_body, traced)
    return traced_body


def _copy_names(wrapper: Callable, fn: Callable) -> None:
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        try:
            setattr(wrapper, attr, getattr(fn, attr))
        except (AttributeError, TypeError):
            pass
    wrapper.__wrapped__ = fn  # inspect.signature(wrapper) == inspect.signature(fn)


_TRACING_TYPES: list = []


def _tracing_types() -> tuple:
    if not _TRACING_TYPES:
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor

        _TRACING_TYPES.append((FakeTensor, FunctionalTensor))
    return _TRACING_TYPES[0]


_dispatch_modes = torch._C._len_torch_dispatch_stack


def tracing(values) -> bool:
    """Whether backward or setup_context runs under a trace (AOTAutograd,
    make_fx, compiled autograd) rather than eagerly: a dispatch mode is
    active, or a value (or an item of a tuple or list value) is a fake or
    functional tensor. Cheap: it runs on every eager call with a gradient."""
    if _dispatch_modes():
        return True
    for v in values:
        if _traced_value(v):
            return True
    return False


def _traced_value(v: Any) -> bool:
    types = _TRACING_TYPES[0] if _TRACING_TYPES else _tracing_types()
    if isinstance(v, types):
        return True
    if type(v) is tuple or type(v) is list:
        for item in v:
            if isinstance(item, types):
                return True
    return False


_INPUTS_ATTR = "_opforge_watched_inputs"


def backward_switch(op: str, eager: Callable, traced: Callable, sig: inspect.Signature | None) -> Callable:
    """backward(ctx, *grads): the user's function eagerly; while tracing, its
    traced copy, watching the gradients it was given and the op inputs
    setup_context saw."""

    def describe(path: str) -> str:
        return f"backward's parameter '{path}' (a gradient autograd passes in, which other ops may share)"

    def backward(ctx, *grads):
        if not tracing(grads):
            return eager(ctx, *grads)
        storages = _param_storages(sig, (ctx, *grads), {}, frozenset(), describe) if sig is not None else {}
        storages.pop(None, None)
        for ref, what in (getattr(ctx, _INPUTS_ATTR, None) or {}).items():
            storages.setdefault(ref, what)
        return _run_watched(op, "backward", Watch(op, "backward", storages, False), traced, ctx, *grads)

    _copy_names(backward, eager)
    return backward


def setup_context_switch(op: str, eager: Callable, traced: Callable | None, param_names: tuple,
                         declared: frozenset) -> Callable:
    """setup_context(ctx, inputs, output): the user's function eagerly; while
    tracing, the traced copy (if it launches kernels), after noting on ctx
    which tensors are the op's inputs so that backward's launches are checked
    against them."""

    def setup_context(ctx, inputs, output):
        if not (_dispatch_modes() or _traced_value(output)):
            return eager(ctx, inputs, output)
        found: list = []
        for pname, value in zip(param_names, inputs):
            if not _declared(pname, declared):
                named_tensors(pname, value, found)
        saved = {}
        for path, t in found:
            ref = _storage_ref(t)
            if ref is not None:
                saved.setdefault(ref, (path, f"the op's parameter '{path}' (saved for backward; eager runs "
                                             f"overwrite the caller's tensor)"))
        try:
            setattr(ctx, _INPUTS_ATTR, saved)
        except (AttributeError, TypeError):  # pragma: no cover - autograd contexts take attributes
            pass
        fn = traced if traced is not None else eager
        return _run_watched(op, "setup_context", Watch(op, "setup_context", {}, False), fn, ctx, inputs, output)

    _copy_names(setup_context, eager)
    return setup_context


__all__ = ["UndeclaredWriteError", "UndeclaredWriteWarning", "HostCodeError", "guard", "backward_switch",
           "setup_context_switch", "check_launch", "watching", "current_op", "found", "tracing", "user_frames"]
