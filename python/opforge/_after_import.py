"""Runs code right after a module of torch has been imported, without
importing it (docs/architecture.md#the-registry). Ground floor: it imports
nothing of opforge.

`import opforge` must not import Dynamo or Inductor (seconds each), yet
opforge has to act before either is used: its compile-start callback goes
into Dynamo's callback handler, its lowerings into Inductor's table. So it
watches for their modules' import:

    after_import("torch._dynamo.callback", fn)   # fn(module) once its body has run

The caller checks first whether the module is already imported (then it
acts at once). `fn` runs in the importing thread, after the module's body
and before the import statement returns; an exception in it is logged, never
raised into the import. A watch fires once: `after_import` again (say after
the module was taken out of `sys.modules`) watches again.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType

log = logging.getLogger("opforge")

_lock = threading.Lock()
_watched: dict[str, list[Callable[[ModuleType], None]]] = {}  # module name -> callbacks, under _lock


def after_import(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Runs `fn(module)` right after the module `name` is next imported (each
    `fn` once per watch, in the order given)."""
    with _lock:
        fns = _watched.setdefault(name, [])
        if fn not in fns:
            fns.append(fn)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def watching(name: str) -> bool:
    """Whether an import of `name` will run callbacks."""
    with _lock:
        return name in _watched


class _RunAfter:
    """The module's own loader, then the callbacks."""

    def __init__(self, loader, fns):
        self._loader = loader
        self._fns = fns

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for fn in self._fns:
            try:
                fn(module)
            except Exception:  # never break the user's import
                log.exception("opforge: %s failed after %s was imported", getattr(fn, "__qualname__", fn),
                              module.__name__)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _watched:
            return None
        with _lock:
            fns = _watched.pop(fullname, None)
            if not _watched and _finder in sys.meta_path:
                sys.meta_path.remove(_finder)
        if not fns:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RunAfter(spec.loader, fns)
        return spec


_finder = _Finder()
