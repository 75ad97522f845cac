"""Kernels as Inductor can compile them.

Inductor compiles a traced kernel from its source text, adding the
@triton.jit helpers it calls by plain name and the Triton names it imports.
A helper reached through a module (`tle.program_id(0)`, with
`from flag_gems.utils import triton_lang_extension as tle`) is left out, and
the compiled kernel fails with a NameError. `for_inductor(k)` returns `k`
itself, or a copy whose source calls such helpers by their own name:

    pid = tle.program_id(0)        ->        pid = program_id(0)

with `program_id` bound in the copy's globals. Autotune and heuristics
layers are copied around the new @triton.jit function; the kernel itself is
never modified.
"""

from __future__ import annotations

import ast
import copy
import inspect
import linecache
import types
from typing import Any

from . import _kernels

# Names the module Inductor writes for a kernel binds itself.
_PROVIDED = frozenset({"triton", "tl"})
_COPIES: dict[int, tuple[Any, Any]] = {}  # id(kernel) -> (kernel, the kernel as Inductor should see it)


def for_inductor(kernel: Any) -> Any:
    """`kernel`, or a copy of its layers over a @triton.jit function whose
    helpers Inductor can find (see the module docstring)."""
    entry = _COPIES.get(id(kernel))
    if entry is not None and entry[0] is kernel:
        return entry[1]
    layers = _kernels._chain(kernel)
    jit = layers[-1]
    result = kernel
    if _kernels.classify(jit) == "jit":
        inner = _flat_jit(jit, {})
        if inner is not jit:
            for layer in reversed(layers[:-1]):
                outer = copy.copy(layer)
                outer.fn = inner
                inner = outer
            result = inner
    _COPIES[id(kernel)] = (kernel, result)
    return result


def _flat_jit(jit: Any, seen: dict) -> Any:
    """The @triton.jit function itself, or a copy calling its module-reached helpers by name."""
    if id(jit) in seen:
        return seen[id(jit)]
    seen[id(jit)] = jit
    fn = jit.fn
    try:
        tree = ast.parse(jit.src)
    except SyntaxError:
        return jit
    node = tree.body[0] if tree.body and isinstance(tree.body[0], ast.FunctionDef) else None
    if node is None:
        return jit
    local = _local_names(node)
    scope = fn.__globals__
    bindings: dict[str, Any] = {}
    edits: list[tuple[ast.Attribute, str]] = []
    for attr in ast.walk(node):
        found = _module_reference(attr, local, scope)
        if found is None:
            continue
        value = found
        if _kernels.classify(value) == "jit":
            value = _flat_jit(value, seen)
            name = value.fn.__name__  # Inductor emits the helper's source, whose def has this name
        elif callable(value) and (getattr(value, "__module__", "") or "").startswith("triton"):
            name = getattr(value, "__name__", None)  # imported by name, as `from triton... import name`
        else:
            continue
        if not name or name in local or (name in scope and scope[name] is not value) or \
                (name in bindings and bindings[name] is not value):
            continue  # another object has this name here: leave the reference as it is
        bindings[name] = value
        edits.append((attr, name))
    if not edits:
        return jit
    copied = _copy_jit(jit, _edited(jit.src, edits), bindings)
    seen[id(jit)] = copied
    return copied


def _local_names(node: ast.FunctionDef) -> set[str]:
    names = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load):
            names.add(child.id)
    return names


def _module_reference(node: ast.AST, local: set, scope: dict) -> Any:
    """The object `module.attr` names, when `module` is a global module other
    than the ones Inductor's kernel module binds; None otherwise."""
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and isinstance(node.ctx, ast.Load)):
        return None
    root = node.value.id
    if root in local or root in _PROVIDED:
        return None
    module = scope.get(root)
    if not isinstance(module, types.ModuleType):
        return None
    try:
        return inspect.getattr_static(module, node.attr)
    except AttributeError:
        return None


def _edited(src: str, edits: list) -> str:
    lines = src.splitlines(keepends=True)
    for attr, name in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        if attr.lineno != attr.end_lineno:
            continue
        line = lines[attr.lineno - 1]
        # AST offsets are in UTF-8 bytes.
        raw = line.encode()
        lines[attr.lineno - 1] = (raw[:attr.col_offset] + name.encode() + raw[attr.end_col_offset:]).decode()
    return "".join(lines)


_COPY_OPTIONS = ("do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline", "launch_metadata")


def _copy_jit(jit: Any, src: str, bindings: dict) -> Any:
    """A @triton.jit function compiled from `src` in a copy of `jit`'s globals plus `bindings`."""
    from triton.runtime.jit import JITFunction

    fn = jit.fn
    name = fn.__name__
    filename = f"<opforge: {fn.__module__}.{fn.__qualname__} as Inductor compiles it>"
    lines = src.splitlines(keepends=True)
    linecache.cache[filename] = (len(src), None, lines, filename)  # inspect.getsource reads it from here
    scope = dict(fn.__globals__)
    scope.update(bindings)
    exec(compile(src, filename, "exec", dont_inherit=True), scope)  # noqa: S102
    new_fn = scope[name]
    if name in fn.__globals__:
        scope[name] = fn.__globals__[name]
    else:
        del scope[name]
    new_fn.__qualname__ = fn.__qualname__
    new_fn.__defaults__ = fn.__defaults__
    accepted = inspect.signature(JITFunction.__init__).parameters
    options = {k: getattr(jit, k) for k in _COPY_OPTIONS if k in accepted and hasattr(jit, k)}
    if "repr" in accepted and hasattr(jit, "_repr"):
        options["repr"] = jit._repr
    copied = JITFunction(new_fn, **options)
    copied.__opforge_original__ = jit
    return copied


def original(kernel: Any) -> Any:
    """The @triton.jit function a copy was made from (itself when it is no copy)."""
    jit = _kernels.jit_of(kernel)
    return getattr(jit, "__opforge_original__", jit)
