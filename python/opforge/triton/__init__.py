"""Triton ops that Inductor can see through (docs/triton.md).

`@opforge.op` calls `plan()` for every op. When the body, or a helper it
calls, launches a Triton kernel, the plan holds two bodies:

    @opforge.op("mylib::add")
    def add(x: Tensor, y: Tensor) -> Tensor:
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
        return out

    p = plan("mylib::add", add, mode="auto", extra_kernels=())
    p.kernels       # (add_kernel,)
    p.eager_body    # add itself: eager calls launch at full speed
    p.traced_body   # a copy of add whose launch reads
                    #   __opforge_wrap__(add_kernel)[(...)](x, y, out, ...)
                    # i.e. torch.library.wrap_triton(add_kernel)[grid](...)

The traced body is the op's fake kernel and its decomposition under
FunctionalTensorMode, which is how Inductor gets
`triton_kernel_wrapper_functional` nodes instead of an opaque call. Neither the
body, its module, nor the kernels are modified.
"""

from __future__ import annotations

import inspect
import types
from collections import namedtuple
from dataclasses import dataclass
from typing import Callable

from . import _kernels, _ops, _rewrite, _scan, _source, _trace
from ._devices import device_error_hook  # noqa: F401 - for _op
from ._ops import KernelList, forget, kernels_of, record_forward  # noqa: F401 - forget, record_forward: for _op
from ._trace import HostCodeError, UndeclaredWriteError, UndeclaredWriteWarning

__all__ = ["Plan", "plan", "autograd", "KernelList", "kernels_of", "cache_info", "is_kernel", "HostCodeError",
           "UndeclaredWriteError", "UndeclaredWriteWarning"]

is_kernel = _kernels.is_kernel


@dataclass(frozen=True)
class Plan:
    """How an op runs its Triton kernels."""

    name: str
    eager_body: Callable
    traced_body: Callable
    kernels: tuple  # found by the scan; more may be found when the op is traced
    launches: tuple[str, ...]  # e.g. "add_kernel[...] at ops.py:12"
    unresolved: tuple[str, ...]  # launches whose kernel is only known at run time
    at_run_time: tuple[str, ...] = ()  # launches and launchers whose kernels are found when tracing

    def __repr__(self) -> str:
        names = ", ".join(_kernels.kernel_name(k) for k in self.kernels)
        later = f" (and those of {len(self.at_run_time)} launches found when traced)" if self.at_run_time else ""
        return f"<opforge.triton.Plan {self.name}: kernels [{names}]{later}>"


CacheInfo = namedtuple("CacheInfo", "files_parsed code_hits code_misses compile_hits compile_misses")


def cache_info() -> CacheInfo:
    """Counters of the scan and rewrite caches (they only grow)."""
    return CacheInfo(_source.stats["files_parsed"], _scan.stats["code_hits"], _scan.stats["code_misses"],
                     _rewrite.stats["compile_hits"], _rewrite.stats["compile_misses"])


def plan(name: str, fn: Callable, *, mode: str = "auto", extra_kernels: tuple = (),
         mutates_args=()) -> Plan | None:
    """The Triton plan of op `name` with body `fn`, or None when mode is
    'auto' and the body launches no Triton kernel."""
    if mode not in ("auto", "force"):
        raise ValueError(f"{name}: triton={mode!r} is not one of 'auto', 'off', 'force'.")
    if mode == "force":
        try:
            import triton  # noqa: F401
        except ImportError:
            raise ValueError(f"{name}: triton='force' needs the triton package, which is not importable. "
                             f"Install triton, or use triton='auto'.") from None
    extras = _check_extras(name, tuple(extra_kernels))
    target = _body_function(fn)
    if target is None:
        if mode == "auto" and not extras:
            return None
        raise TypeError(f"{name}: the body is a {type(fn).__name__}, not a Python function, so its Triton "
                        f"launches cannot be traced. Define the body with 'def', or pass triton='off'.")
    if mode == "auto" and not extras and not _scan.may_launch(target):
        return None

    scan = _scan.Scan()
    scan.visit(target)
    kernels = dict(scan.kernels)
    for k in extras:
        kernels.setdefault(id(k), k)
    if not kernels and not scan.runtime:
        if mode == "auto":
            return None
        hint = ""
        if scan.unresolved:
            hint = f" ({scan.unresolved[0]} launches a kernel the scan cannot resolve)"
        raise ValueError(f"{name}: triton='force', but no Triton kernel was found in the body or the helpers it "
                         f"calls{hint}. Pass the kernels with extra_triton_kernels=(kernel, ...), or use "
                         f"triton='auto'.")
    _check_kernels(name, kernels)
    if scan.opaque:
        op, at = scan.opaque[0]
        if kernels:
            first = next(iter(kernels.values()))
            launch = f"Triton kernel '{_kernels.kernel_name(first)}' " \
                     f"({scan.kernel_where.get(id(first), 'extra_triton_kernels')})"
        else:
            launch = f"Triton kernels ({scan.runtime[0]})"
        raise ValueError(
            f"{name}: the body launches {launch} and also calls the custom op '{op}' ({at}), which Inductor "
            f"cannot see into, so the op would be only half visible. Make '{op}' a Triton op too (an "
            f"@opforge.op whose body launches Triton kernels, or torch.library.triton_op), call it outside this "
            f"op, or pass triton='off' to keep this op opaque.")

    traced = _traced_body(name, target, scan)
    if isinstance(fn, types.MethodType):
        traced = types.MethodType(traced, fn.__self__)
    traced = _trace.guard(name, traced, _signature(fn), frozenset(_names(mutates_args)))
    eager = fn if not scan.user_wrapped else _unwrapped_eager(fn)
    return Plan(name, eager, traced, tuple(kernels.values()), tuple(scan.launch_texts), tuple(scan.unresolved),
                tuple(scan.runtime))


def autograd(name: str, body: Callable, backward: Callable | None, setup_context: Callable | None, *,
             mode: str = "auto", extra_kernels: tuple = (), mutates_args=()) -> tuple:
    """(backward, setup_context) to use in place of the user's: each one that
    launches Triton kernels runs unchanged eagerly and as a traced copy while
    AOTAutograd traces the backward, so Inductor receives its kernels.

        bw, ctx_fn = autograd("mylib::op", body, backward, setup_context)
    """
    if mode == "off":
        return backward, setup_context
    declared = frozenset(_names(mutates_args))
    kernels: dict = {}
    traced_backward = _traced_hook(name, "backward", backward, tuple(extra_kernels), kernels)
    traced_setup = _traced_hook(name, "setup_context", setup_context, tuple(extra_kernels), kernels)
    _ops.record_backward(name, tuple(kernels.values()))
    if traced_backward is None and traced_setup is None:
        return backward, setup_context
    new_backward = backward
    if traced_backward is not None:
        new_backward = _trace.backward_switch(name, backward, traced_backward, _signature(backward))
    new_setup = setup_context
    if setup_context is not None:
        sig = _signature(body)
        names = tuple(p for p in sig.parameters) if sig is not None else ()
        new_setup = _trace.setup_context_switch(name, setup_context, traced_setup, names, declared)
    return new_backward, new_setup


def _traced_hook(name: str, what: str, fn: Callable | None, extras: tuple, kernels: dict) -> Callable | None:
    """The traced copy of backward or setup_context, or None when it launches nothing."""
    if fn is None:
        return None
    target = _body_function(fn)
    if target is None or not _scan.may_launch(target):
        return None
    scan = _scan.Scan()
    scan.visit(target)
    if not scan.kernels and not scan.launch_texts and not scan.user_wrapped and not scan.runtime:
        return None
    found = dict(scan.kernels)
    if scan.unresolved:
        for k in extras:
            found.setdefault(id(k), k)
    _check_kernels(f"{name}: {what}", found)
    kernels.update(found)
    traced = _traced_body(f"{name} ({what})", target, scan)
    if isinstance(fn, types.MethodType):
        traced = types.MethodType(traced, fn.__self__)
    return traced


def _names(mutates_args) -> tuple:
    return (mutates_args,) if isinstance(mutates_args, str) else tuple(mutates_args or ())


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _check_kernels(name: str, kernels: dict) -> None:
    for k in kernels.values():
        problem = _kernels.problem(k)
        if problem is not None:
            raise _kernels.KernelError(f"{name}: {problem}", kernel=k)


def _body_function(fn: Callable) -> types.FunctionType | None:
    """The Python function behind an op body: itself, the function a
    functools.wraps decorator wraps, or the function of a bound method."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    for _ in range(16):
        if isinstance(fn, types.FunctionType) and "__wrapped__" not in fn.__dict__:
            return fn
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            return None
        fn = inner
    return None


def _check_extras(name: str, extras: tuple) -> tuple:
    for i, k in enumerate(extras):
        if not _kernels.is_kernel(k):
            raise TypeError(f"{name}: extra_triton_kernels[{i}] is a {type(k).__name__}, not a Triton kernel. "
                            f"Pass functions decorated with @triton.jit or @triton.autotune, or a library's "
                            f"launcher of one (a triton.KernelInterface holding it at .fn).")
    return extras


def _traced_body(name: str, target: types.FunctionType, scan: _scan.Scan) -> Callable:
    # Rewrite every function of the scan that needs it; the body always, so
    # that calls the scan could not resolve (self.launch(...)) are checked
    # when tracing.
    body = scan.results[id(target)]
    if not body.needs_rewrite:
        body = _scan.FnResult(body.fn, body.info, True, body.call_keys, body.subscript_keys)
    traced = _rewrite.build(body)
    if traced is None:
        raise ValueError(f"{name}: the body launches Triton kernels but could not be recompiled for tracing. "
                         f"Define it in a source file, or pass triton='off'.")
    for key, result in scan.results.items():
        if result is None or key == id(target) or not result.needs_rewrite:
            continue
        helper = _rewrite.build(result)
        if helper is not None:
            _rewrite.remember(result.fn, helper)
    return traced


def _unwrapped_eager(fn: Callable) -> Callable:
    """fn, with the user's own wrap_triton calls returning the bare kernel, as
    torch.library.triton_op does for eager calls (the traceable wrapper is a
    ~1 ms detour with real tensors). Same signature as fn."""
    from torch._library import triton as torch_triton

    state = getattr(torch_triton, "wrap_triton_enabled", None)
    sig = inspect.signature(fn)
    params, args, ns = [], [], {"__opforge_fn": fn, "__opforge_state": state,
                                "__opforge_default": getattr(torch_triton, "wrap_triton_enabled_default", True),
                                "__opforge_off": torch_triton.set_wrap_triton_enabled}
    saw_kw_marker = False
    for i, p in enumerate(sig.parameters.values()):
        text = p.name
        if p.default is not p.empty:
            ns[f"__opforge_d{i}"] = p.default
            text += f"=__opforge_d{i}"
        if p.kind == p.VAR_POSITIONAL:
            text, saw_kw_marker = "*" + p.name, True
            args.append("*" + p.name)
        elif p.kind == p.VAR_KEYWORD:
            text = "**" + p.name
            args.append("**" + p.name)
        elif p.kind == p.KEYWORD_ONLY:
            if not saw_kw_marker:
                params.append("*")
                saw_kw_marker = True
            args.append(f"{p.name}={p.name}")
        else:
            args.append(p.name)
        params.append(text)
        if p.kind == p.POSITIONAL_ONLY and (i + 1 == len(sig.parameters) or
                                           list(sig.parameters.values())[i + 1].kind != p.POSITIONAL_ONLY):
            params.append("/")
    call = f"__opforge_fn({', '.join(args)})"
    if state is not None:
        lines = [
            f"def __opforge_eager({', '.join(params)}):",
            "    __opforge_prev = getattr(__opforge_state, 'value', __opforge_default)",
            "    __opforge_state.value = False",
            "    try:",
            f"        return {call}",
            "    finally:",
            "        __opforge_state.value = __opforge_prev",
        ]
    else:  # pragma: no cover - every supported torch has the thread-local
        lines = [f"def __opforge_eager({', '.join(params)}):", "    with __opforge_off(False):",
                 f"        return {call}"]
    exec(compile("\n".join(lines) + "\n", f"<opforge eager {fn.__qualname__}>", "exec"), ns)  # noqa: S102
    eager = ns["__opforge_eager"]
    eager.__name__ = fn.__name__
    eager.__qualname__ = fn.__qualname__
    eager.__module__ = fn.__module__
    eager.__doc__ = fn.__doc__
    eager.__annotations__ = dict(getattr(fn, "__annotations__", {}) or {})
    return eager
