"""The syntax tree of a function, found from its code object.

Each source file is parsed once and indexed by (first line, name), so
registering many ops from one module parses that module once:

    find(body.__code__, body.__globals__)   # Found(node=<ast.FunctionDef 'body'>, class_name=None)
"""

from __future__ import annotations

import ast
import linecache
import types
import weakref
from collections import OrderedDict
from dataclasses import dataclass

_MAX_FILES = 64


@dataclass
class Found:
    node: ast.FunctionDef | ast.Lambda
    class_name: str | None  # the innermost class around it, whose name private names mangle with
    filename: str


class _FileIndex:
    __slots__ = ("lines", "tree", "defs", "lambdas")

    def __init__(self, lines: list[str], tree: ast.Module):
        self.lines = lines
        self.tree = tree
        self.defs: dict[tuple[int, str], list[tuple[ast.AST, str | None]]] = {}
        self.lambdas: dict[tuple[int, str], list[tuple[ast.AST, str | None]]] | None = None
        self._index(tree.body, None)

    def _index(self, statements: list, class_name: str | None) -> None:
        # Defs are statements, so only statement lists need walking.
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                self.defs.setdefault((first, node.name), []).append((node, class_name))
                self._index(node.body, class_name)  # private names mangle in nested scopes too
            elif isinstance(node, ast.ClassDef):
                self._index(node.body, node.name)
            else:
                for name in ("body", "orelse", "finalbody"):
                    inner = getattr(node, name, None)
                    if isinstance(inner, list):
                        self._index(inner, class_name)
                for part in (*getattr(node, "handlers", ()), *getattr(node, "cases", ())):
                    self._index(part.body, class_name)

    def candidates(self, key: tuple[int, str]) -> list:
        if key[1] != "<lambda>":
            return self.defs.get(key, [])
        if self.lambdas is None:
            self.lambdas = {}
            self._index_lambdas(self.tree, None)
        return self.lambdas.get(key, [])

    def _index_lambdas(self, node: ast.AST, class_name: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Lambda):
                self.lambdas.setdefault((child.lineno, "<lambda>"), []).append((child, class_name))
                self._index_lambdas(child, class_name)
            elif isinstance(child, ast.ClassDef):
                self._index_lambdas(child, child.name)
            else:
                self._index_lambdas(child, class_name)


_FILES: OrderedDict[str, _FileIndex] = OrderedDict()
stats = {"files_parsed": 0}


def _index_for(filename: str, module_globals: dict | None) -> _FileIndex | None:
    lines = linecache.getlines(filename, module_globals)
    if not lines:
        return None
    index = _FILES.get(filename)
    if index is not None and index.lines is lines:
        _FILES.move_to_end(filename)
        return index
    try:
        tree = ast.parse("".join(lines), filename)
    except (SyntaxError, ValueError):
        return None
    stats["files_parsed"] += 1
    index = _FileIndex(lines, tree)
    _FILES[filename] = index
    while len(_FILES) > _MAX_FILES:
        _FILES.popitem(last=False)
    return index


def _arg_names(node: ast.FunctionDef | ast.Lambda) -> tuple[str, ...]:
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if a.vararg:
        names.append(a.vararg.arg)
    if a.kwarg:
        names.append(a.kwarg.arg)
    return tuple(names)


def _code_arg_names(code: types.CodeType) -> tuple[str, ...]:
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
    return code.co_varnames[:n]


def find(code: types.CodeType, module_globals: dict | None = None) -> Found | None:
    """The def or lambda that compiled to `code`, or None when its source is
    not available (exec'd code, a changed file, two lambdas on one line)."""
    index = _index_for(code.co_filename, module_globals)
    if index is None:
        return None
    candidates = index.candidates((code.co_firstlineno, code.co_name))
    wanted = _code_arg_names(code)
    matches = [(n, c) for n, c in candidates if _arg_names(n) == wanted]
    if len(matches) != 1 or isinstance(matches[0][0], ast.AsyncFunctionDef):
        return None
    node, class_name = matches[0]
    return Found(node, class_name, code.co_filename)


class CodeCache:
    """A cache keyed by code object identity. Code objects compare equal
    when their bytecode is equal, even from different files, so a
    WeakKeyDictionary would hand one file's analysis to another."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, object]] = {}

    def get(self, code: types.CodeType, default=None):
        entry = self._entries.get(id(code))
        if entry is None or entry[0]() is not code:
            return default
        return entry[1]

    def __setitem__(self, code: types.CodeType, value) -> None:
        key = id(code)
        entries = self._entries

        def drop(_ref, key=key):
            entry = entries.get(key)
            if entry is not None and entry[0] is _ref:
                del entries[key]

        entries[key] = (weakref.ref(code, drop), value)
