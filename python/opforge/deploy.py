"""What an exported program needs where it runs (docs/deploy.md).

    ep = torch.export.export(model, (x,))
    opforge.deploy.requirements(ep)
    # Requirements(libraries={'/site/kernels/libkernels.so': ('kernels::rms_norm',)},
    #              runtime=('/site/opforge/lib/libopforge_core.so', '/site/opforge/lib/libopforge_torch.so'),
    #              python_ops=('mylib::scale',), other_ops=())
    opforge.deploy.aoti_compile_and_package(ep, package_path="model.pt2", python_free=True)
    # ValueError: ... mylib::scale ... has only a Python kernel ...

    opforge.deploy.save(ep, "model.pt2")   # torch.export.save, with what the program needs
    ep = opforge.deploy.load("model.pt2")  # says which library to load or module to import first
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from typing import Any

import torch

from . import _C, _registry

__all__ = ["Requirements", "requirements", "aoti_compile_and_package", "save", "load"]


@dataclass(frozen=True)
class Requirements:
    """What the process that runs a program must load first.

    libraries: each opforge C++ library the program calls, by path, with its ops there
    runtime: opforge's own shared libraries those libraries need (ship them beside the package)
    python_ops: ops defined in Python (@opforge.op): the running process must be Python and import
        the module that defines them; a C++ program cannot run them
    other_ops: custom ops opforge did not define (whatever registers them must be loaded too)
    """

    libraries: dict
    runtime: tuple
    python_ops: tuple
    other_ops: tuple


_BUILTIN_NAMESPACES = {"aten", "prims", "quantized", "_quantized", "higher_order", "profiler", "inductor",
                       "_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "symm_mem"}


def _graph_modules(program: Any) -> list:
    if isinstance(program, torch.export.ExportedProgram):
        program = program.graph_module
    if not isinstance(program, torch.fx.GraphModule):
        raise TypeError(f"opforge.deploy.requirements takes a torch.export.ExportedProgram or a torch.fx.GraphModule, "
                        f"not {type(program).__name__}. Export the model first: torch.export.export(model, args).")
    return [m for m in program.modules() if isinstance(m, torch.fx.GraphModule)]


def _ops_of(program: Any) -> list[str]:
    """The custom ops a program calls, in the order it first calls them."""
    names: dict[str, None] = {}
    for gm in _graph_modules(program):
        for node in gm.graph.nodes:
            target = node.target
            if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
                continue
            name = target._schema.name
            if name.split("::")[0] not in _BUILTIN_NAMESPACES:
                names.setdefault(name, None)
    return list(names)


def _loaded(basename: str) -> str | None:
    """The path of a loaded shared library, from the process's own map."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if path.endswith("/" + basename):
                    return path
    except OSError:
        pass
    return None


def requirements(program: Any) -> Requirements:
    """The opforge libraries (with their paths) and Python ops a program
    calls; see Requirements."""
    libraries: dict[str, list[str]] = {}
    needs_torch_layer = False
    python_ops, other_ops = [], []
    for name in _ops_of(program):
        info = _C.library_op(name)
        if info is not None:
            libraries.setdefault(info["library"], []).append(name)
            # A stable-ABI library's C++ backward is wired by the torch layer; a
            # library on the C++ API links it.
            needs_torch_layer = needs_torch_layer or info["abi"] == "unstable" or info["has_torch_layer_autograd"]
        elif _registry.get(name) is not None:  # a C++ op is found by _C.library_op first
            python_ops.append(name)
        else:
            other_ops.append(name)
    runtime = []
    if libraries:
        for basename in ("libopforge_core.so",) + (("libopforge_torch.so",) if needs_torch_layer else ()):
            path = _loaded(basename)
            if path is not None:
                runtime.append(path)
    return Requirements({lib: tuple(ops) for lib, ops in libraries.items()}, tuple(runtime), tuple(python_ops),
                        tuple(other_ops))


def aoti_compile_and_package(program: Any, *, python_free: bool = False, **kwargs):
    """`torch._inductor.aoti_compile_and_package(program, **kwargs)`; with
    `python_free=True` it first refuses a program that a C++ program could
    not run: one that calls an op whose only kernels are Python."""
    if python_free:
        needs = requirements(program)
        if needs.python_ops:
            listed = ", ".join(needs.python_ops)
            raise ValueError(
                f"opforge.deploy: the program calls {listed}, defined in Python with @opforge.op: a Python-free "
                f"runtime (a C++ program loading the package) has no kernel for "
                f"{'it' if len(needs.python_ops) == 1 else 'them'}. Give each a C++ kernel in an OPFORGE_LIBRARY "
                f"(docs/cpp_ops.md) and call that op, or package without python_free and run the package from "
                f"Python with the module that defines {'it' if len(needs.python_ops) == 1 else 'them'} imported.")
    return torch._inductor.aoti_compile_and_package(program, **kwargs)


# The record save() writes beside the program: what load() checks first.
RECORD = "opforge-requirements.json"
_RECORD_FORMAT = 1


def _record(program: Any) -> dict:
    needs = requirements(program)
    python_ops = {}
    for name in needs.python_ops:
        fn = getattr(_registry.get(name), "__wrapped__", None)
        python_ops[name] = getattr(fn, "__module__", None)
    return {"format": _RECORD_FORMAT,
            "libraries": {os.path.basename(path): {"path": path, "ops": list(ops)}
                          for path, ops in needs.libraries.items()},
            "python_ops": python_ops, "other_ops": list(needs.other_ops)}


def save(program: Any, f: Any, *, extra_files: dict | None = None, **kwargs) -> None:
    """`torch.export.save(program, f, ...)`, recording beside the program the
    opforge libraries and Python ops it calls, which `load` checks first."""
    if not isinstance(program, torch.export.ExportedProgram):
        raise TypeError(f"opforge.deploy.save takes a torch.export.ExportedProgram, not {type(program).__name__}. "
                        f"Export the model first: torch.export.export(model, args).")
    extra = dict(extra_files or {})
    if RECORD in extra:
        raise ValueError(f"opforge.deploy.save: extra_files may not hold {RECORD!r}: opforge writes its record of "
                         f"what the program needs there. Give the file another name.")
    extra[RECORD] = json.dumps(_record(program), indent=1)
    torch.export.save(program, f, extra_files=extra, **kwargs)


def _read_record(f: Any) -> dict | None:
    """The record `save` wrote into the archive at `f`, or None (a program
    saved by torch.export.save alone, or not a file opforge can read)."""
    where = f.tell() if hasattr(f, "seek") else None
    try:
        with zipfile.ZipFile(f) as archive:
            names = [n for n in archive.namelist() if n.endswith("/" + RECORD) or n == RECORD]
            text = archive.read(names[0]).decode("utf-8") if names else None
    except (OSError, zipfile.BadZipFile, KeyError):
        return None
    finally:
        if where is not None:
            f.seek(where)  # torch.export.load reads the file from where it was
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("format") == _RECORD_FORMAT else None


def _registered(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(name, "")
        return True
    except RuntimeError:
        return False


def _missing_message(f: Any, record: dict) -> str | None:
    where = os.fspath(f) if isinstance(f, (str, os.PathLike)) else "the program"
    lines = []
    for base, lib in record.get("libraries", {}).items():
        missing = [op for op in lib.get("ops", []) if not _registered(op)]
        if missing:
            lines.append(f"  {', '.join(missing)}: from the opforge library {base} (at {lib.get('path')} where the "
                         f"program was saved): call opforge.load_library(path) with its path here, or import the "
                         f"package that loads it")
    for name, module in record.get("python_ops", {}).items():
        if not _registered(name):
            source = (f"import {module}" if module and module != "__main__"
                      else "run the code that defines it (it was defined in a script's __main__)")
            lines.append(f"  {name}: defined in Python with @opforge.op: {source}")
    others = [op for op in record.get("other_ops", []) if not _registered(op)]
    if others:
        lines.append(f"  {', '.join(others)}: custom ops opforge did not define: load whatever registers them")
    if not lines:
        return None
    return (f"opforge.deploy.load: {where} calls ops this process has not registered; register them before "
            f"loading (docs/deploy.md#what-the-running-process-loads-first):\n" + "\n".join(lines))


def load(f: Any, *, extra_files: dict | None = None, **kwargs) -> "torch.export.ExportedProgram":
    """`torch.export.load(f, ...)`; for a program `save` wrote, it first
    checks that every op the program calls is registered, and otherwise
    raises naming each missing op and the library to load or the module to
    import, instead of torch's "Could not find schema"."""
    record = _read_record(f)
    if record is not None:
        message = _missing_message(f, record)
        if message is not None:
            raise RuntimeError(message)
    # torch fills the dict it is given with every extra file (a dict it is given
    # empty it replaces with its own), so it gets a non-empty one to fill.
    extra = {RECORD: ""}
    program = torch.export.load(f, extra_files=extra, **kwargs)
    del extra[RECORD]
    if extra_files is not None:
        extra_files.update(extra)
    return program
