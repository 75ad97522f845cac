"""Traceable copies of user functions, built without touching the originals.

A launch `K.add_kernel[grid](x, out)` in the body becomes
`__opforge_wrap__(K.add_kernel)[grid](x, out)`, and a call of a helper that
launches kernels, `launch_add(x)`, becomes `__opforge_call__(launch_add)(x)`.
The rewritten function is compiled from the original's syntax tree (same
file, same line numbers) and built with

- the original closure cells, so a rebound `nonlocal` is seen;
- a globals mapping that holds only the two hooks and reads everything else
  from the module's real globals at call time, so a module global rebound
  after registration is seen too (no snapshot).

Both hooks decide at run time: `__opforge_wrap__` passes anything that is not
a Triton kernel through unchanged, and `__opforge_call__` substitutes the
rewritten copy of a helper only when that helper launches kernels, or, in a
module that imports Triton, makes calls only the run time can resolve (a
kernel generated at run time is launched behind such calls).
"""

from __future__ import annotations

import ast
import builtins
import copy
import sys
import types
import weakref
from typing import Any

from . import _kernels, _launch, _scan, _source

stats = {"compile_hits": 0, "compile_misses": 0}

_COMPILED = _source.CodeCache()
_REWRITTEN_CODES = _source.CodeCache()
_RUNTIME: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_NO_REWRITE = object()
_PLAIN_TYPES = (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                types.WrapperDescriptorType, types.MethodDescriptorType, type)


class _Globals(dict):
    """A module's globals as rewritten code sees them: the hooks, then a
    read-through to the real module dict on every miss."""

    __slots__ = ("real",)

    def __init__(self, real: dict, hooks: dict):
        super().__init__(hooks)
        self["__builtins__"] = real.get("__builtins__", builtins)
        # The import system reads these from the dict itself (a relative import
        # inside a traced function needs __package__).
        for key in ("__name__", "__package__", "__spec__", "__file__"):
            if key in real:
                dict.__setitem__(self, key, real[key])
        self.real = real

    def __missing__(self, key):
        return self.real[key]

    def get(self, key, default=None):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        return self.real.get(key, default)

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or key in self.real

    def __setitem__(self, key, value) -> None:
        if key in ("__builtins__",) or key in _HOOKS:
            dict.__setitem__(self, key, value)
        else:
            self.real[key] = value

    def __delitem__(self, key) -> None:
        del self.real[key]

    def __repr__(self) -> str:
        return f"<opforge traced globals of {self.real.get('__name__')!r}>"


class _NameGlobals(_Globals):
    """Without source, launches cannot be rewritten; instead every read of a
    global that is a kernel (or a launching helper) returns the traceable form."""

    __slots__ = ()

    def __missing__(self, key):
        value = self.real[key]
        if _kernels.is_kernel(value):
            return _launch.wrap(value)
        return call_hook(value)


_PROXIES: dict[tuple[int, type], _Globals] = {}


def proxy_globals(real: dict, kind: type = _Globals) -> _Globals:
    proxy = _PROXIES.get((id(real), kind))
    if proxy is None or proxy.real is not real:
        proxy = kind(real, _HOOKS)
        _PROXIES[(id(real), kind)] = proxy
    return proxy


# --- run-time hooks ----------------------------------------------------------


def call_hook(f: Any) -> Any:
    """`__opforge_call__`: the callable to call in traced code."""
    t = type(f)
    if t is types.FunctionType:
        r = _RUNTIME.get(f, None)
        if r is None:
            r = _prepare(f)
        return f if r is _NO_REWRITE else r
    if t is types.MethodType:
        func = f.__func__
        if type(func) is types.FunctionType:
            r = _RUNTIME.get(func, None)
            if r is None:
                r = _prepare(func)
            if r is not _NO_REWRITE:
                return types.MethodType(r, f.__self__)
        return f
    if isinstance(f, _PLAIN_TYPES) or _scan.op_name(f) is not None:
        return f
    call = _scan.python_function(f)
    if call is None:
        return f
    r = _RUNTIME.get(call, None)
    if r is None:
        r = _prepare(call)
    if r is _NO_REWRITE:
        return f
    if getattr(f, "__wrapped__", None) is not None:
        return r  # a functools.wraps-style wrapper: call the rewritten inner function
    return types.MethodType(r, f)  # an instance with a Python __call__


_HOOKS = {"__opforge_wrap__": _launch.wrap, "__opforge_call__": call_hook}


def _prepare(f: types.FunctionType) -> Any:
    """The rewritten copy of f if it launches kernels or makes calls only
    tracing can resolve (docs/triton.md), else _NO_REWRITE; cached per
    function object. A decorated function (functools.wraps) is replaced by
    the copy of the function it wraps only when that launches kernels."""
    target = _scan.python_function(f)
    result: Any = _NO_REWRITE
    if target is not None and not _REWRITTEN_CODES.get(target.__code__):
        scan = _scan.Scan()
        if scan.visit(target):
            found = scan.results[id(target)]
            if target is f or found.launches:
                built = build(found)
                if built is not None:
                    result = built
    try:
        _RUNTIME[f] = result
    except TypeError:  # pragma: no cover - functions are weak-referenceable
        pass
    return result


def remember(f: types.FunctionType, rewritten: types.FunctionType) -> None:
    _RUNTIME[f] = rewritten


# --- building -----------------------------------------------------------------


def build(result: _scan.FnResult) -> types.FunctionType | None:
    """The traceable copy of result.fn, or None if it cannot be built."""
    fn = result.fn
    if result.info.found is None:
        return _copy_function(fn, fn.__code__, proxy_globals(fn.__globals__, _NameGlobals))
    launch_keys = frozenset(s.key for s in result.info.launches if not s.wrapped)
    selection = (result.call_keys, result.subscript_keys)
    per_code = _COMPILED.get(fn.__code__)
    if per_code is None:
        per_code = {}
        _COMPILED[fn.__code__] = per_code
    code = per_code.get(selection)
    if code is None:
        stats["compile_misses"] += 1
        code = _compile(result.info.found, fn.__code__, launch_keys, result.call_keys, result.subscript_keys)
        per_code[selection] = code
    else:
        stats["compile_hits"] += 1
    if code is False:
        return None
    return _copy_function(fn, code, proxy_globals(fn.__globals__))


def _copy_function(fn: types.FunctionType, code: types.CodeType, globals_: dict) -> types.FunctionType | None:
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    try:
        closure = tuple(cells[name] for name in code.co_freevars)
    except KeyError:
        return None
    new = types.FunctionType(code, globals_, fn.__name__, fn.__defaults__, closure or None)
    new.__kwdefaults__ = copy.copy(fn.__kwdefaults__)
    new.__annotations__ = dict(getattr(fn, "__annotations__", {}) or {})
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__dict__.update(fn.__dict__)
    new.__dict__.pop("__wrapped__", None)
    new.__opforge_original__ = fn
    return new


def _hook(name: str, expr: ast.expr) -> ast.Call:
    func = ast.copy_location(ast.Name(id=name, ctx=ast.Load()), expr)
    return ast.copy_location(ast.Call(func=func, args=[expr], keywords=[]), expr)


def _with(node: ast.AST, **changes) -> ast.AST:
    """A shallow copy of node with some fields replaced."""
    new = node.__class__.__new__(node.__class__)
    new.__dict__.update(node.__dict__)
    new.__dict__.update(changes)
    return new


class _Rewriter:
    """Rewrites launch and call sites. Nodes on the path to a change are
    copied, everything else is shared with the cached syntax tree, which is
    never modified."""

    def __init__(self, launches: frozenset, calls: frozenset, subscripts: frozenset):
        self.launches = launches
        self.calls = calls
        self.subscripts = subscripts
        self.lines = {k[1] for k in (*launches, *calls, *subscripts)}

    def visit(self, node: ast.AST) -> ast.AST:
        end = getattr(node, "end_lineno", None)
        if end is not None and not any(node.lineno <= line <= end for line in self.lines):
            return node
        changes = {}
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                items = [self.visit(v) if isinstance(v, ast.AST) else v for v in value]
                if any(a is not b for a, b in zip(items, value)):
                    changes[name] = items
            elif isinstance(value, ast.AST):
                new = self.visit(value)
                if new is not value:
                    changes[name] = new
        new = _with(node, **changes) if changes else node
        if isinstance(node, (ast.Call, ast.Subscript)):
            key = _scan._key(node)
            if key in self.launches:
                new = _with(new, func=_with(new.func, value=_hook("__opforge_wrap__", new.func.value)))
            elif key in self.calls:
                new = _with(new, func=_hook("__opforge_call__", new.func))
            elif key in self.subscripts:
                new = _with(new, value=_hook("__opforge_wrap__", new.value))
        return new


def _strip_signature(node: ast.FunctionDef | ast.Lambda) -> ast.AST:
    """A copy without defaults, annotations and decorators: those come from
    the original function object, and here they would run in the wrong scope."""
    a = node.args

    def bare(arg):
        return None if arg is None else _with(arg, annotation=None, type_comment=None)

    args = _with(a, posonlyargs=[bare(x) for x in a.posonlyargs], args=[bare(x) for x in a.args],
                 kwonlyargs=[bare(x) for x in a.kwonlyargs], vararg=bare(a.vararg), kwarg=bare(a.kwarg),
                 defaults=[], kw_defaults=[None] * len(a.kwonlyargs))
    if isinstance(node, ast.Lambda):
        return _with(node, args=args)
    changes = dict(args=args, decorator_list=[], returns=None, type_comment=None)
    if hasattr(node, "type_params"):
        changes["type_params"] = []
    return _with(node, **changes)


def _located(node: ast.AST, at: ast.AST) -> ast.AST:
    for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
        setattr(node, attr, getattr(at, attr))
    return node


def _compile(found, original: types.CodeType, launches, calls, subscripts) -> types.CodeType | bool:
    node = _strip_signature(_Rewriter(launches, calls, subscripts).visit(found.node))
    if isinstance(node, ast.Lambda):
        body = [_located(ast.Return(value=node), node)]
    else:
        name = _located(ast.Name(id=node.name, ctx=ast.Load()), node)
        body = [node, _located(ast.Return(value=name), node)]
    factory = ast.FunctionDef(
        name="__opforge_factory__",
        args=ast.arguments(posonlyargs=[], args=[_located(ast.arg(arg=v), node) for v in original.co_freevars],
                           vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
        body=body, decorator_list=[], returns=None, type_comment=None,
    )
    if sys.version_info >= (3, 12):
        factory.type_params = []
    top: ast.stmt = _located(factory, node)
    if found.class_name:
        # Compiled inside a class of the same name, so private names mangle alike.
        cls = ast.ClassDef(name=found.class_name, bases=[], keywords=[], body=[factory], decorator_list=[])
        if sys.version_info >= (3, 12):
            cls.type_params = []
        top = _located(cls, node)
    module = ast.Module(body=[top], type_ignores=[])
    try:
        module_code = compile(module, found.filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, TypeError):
        return False
    code = _find_inner(module_code, original.co_name)
    if code is None:
        return False
    if hasattr(original, "co_qualname"):
        code = code.replace(co_qualname=original.co_qualname)
    _mark(code)
    return code


def _find_inner(code: types.CodeType, name: str) -> types.CodeType | None:
    for const in code.co_consts:
        if not isinstance(const, types.CodeType):
            continue
        if const.co_name == "__opforge_factory__":
            for inner in const.co_consts:
                if isinstance(inner, types.CodeType) and inner.co_name == name:
                    return inner
        found = _find_inner(const, name)
        if found is not None:
            return found
    return None


def _mark(code: types.CodeType) -> None:
    _REWRITTEN_CODES[code] = True
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _mark(const)
