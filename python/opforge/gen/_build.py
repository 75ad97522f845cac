"""Compiles generated C++ into a shared library that `torch.ops.load_library`
loads, rebuilding only what changed.

    >>> result = build(["gen/opforge_forward.cc", "gen/myaten_ops.cc"], "gen/build", "myaten_ops")
    [build] compiling opforge_forward.cc
    [build] compiling myaten_ops.cc
    [build] linking libmyaten_ops.so
    >>> result.library, result.compiled
    ('gen/build/libmyaten_ops.so', ['opforge_forward.cc', 'myaten_ops.cc'])

An object is rebuilt when its source or any header it included is newer, or
its command line changed; the same check decides the link. Torch is located
the way cmake/OpforgeTorch.cmake does it, through the running Python.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import time
from dataclasses import dataclass, field

from .._torch_version import cxx_standard
from ._aten import GenError
from ._io import Progress, ensure_directory, write_if_changed


@dataclass
class BuildResult:
    library: str
    compiled: list[str] = field(default_factory=list)
    linked: bool = False
    cpu_seconds: float = 0.0  # compiler and linker CPU time, user + system
    wall_seconds: float = 0.0


# Keeps a C++ runtime linked statically private to the library
# (cmake/OpforgeTorch.cmake, opforge_private_static_libs).
PRIVATE_STATIC_LIBS = "-Wl,--exclude-libs,ALL"


def torch_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for the installed torch."""
    import torch

    root = os.path.dirname(torch.__file__)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cflags = [
        # C++17 where torch's headers accept it (it compiles faster than
        # C++20); torch 2.14 and later need C++20.
        f"-std={cxx_standard(torch.__version__)}", "-O2", "-fPIC", "-DNDEBUG",
        # Hidden symbols: two generated libraries loaded into one process never
        # see each other's RegisterForwardedOps.
        "-fvisibility=hidden", "-fvisibility-inlines-hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        # Torch's headers are system headers, absent from the depfile; naming
        # the version in the command rebuilds the objects after an upgrade.
        f"-DOPFORGE_GEN_TORCH={torch.__version__}",
        "-isystem", os.path.join(root, "include"),
    ]
    lib = os.path.join(root, "lib")
    ldflags = ["-shared", PRIVATE_STATIC_LIBS, f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}"]
    return cflags, ldflags


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CXX", "c++"))


def _start(command: list[str]) -> subprocess.Popen:
    try:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        raise GenError(f"cannot run the C++ compiler {command[0]!r} ({e.strerror}); install one, name it in CXX, "
                       "or pass --no-build.") from None


def _extra_flags() -> list[str]:
    return shlex.split(os.environ.get("CXXFLAGS", ""))


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


def _depfile_paths(depfile: str) -> list[str]:
    """Paths named in a gcc `-MMD` depfile, 'a.o: a.cc b.h \\\\\\n c.h' -> ['a.cc', 'b.h', 'c.h']."""
    try:
        with open(depfile, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    text = text.replace("\\\n", " ")
    _, _, deps = text.partition(":")
    return deps.split()


def _stale(output: str, command: list[str], inputs: list[str]) -> bool:
    built = _mtime(output)
    if built is None:
        return True
    try:
        with open(output + ".cmd", encoding="utf-8") as f:
            if json.loads(f.read()) != command:
                return True
    except (FileNotFoundError, ValueError):
        return True
    for path in inputs:
        seen = _mtime(path)
        if seen is None or seen > built:
            return True
    return False


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build(sources: list[str], build_dir: str, name: str, jobs: int = 2,
          progress: Progress | None = None) -> BuildResult:
    """Compiles `sources` and links `build_dir/lib<name>.so`; see the module doc."""
    progress = progress or Progress(quiet=True)
    ensure_directory(build_dir, "--build-dir")
    cflags, ldflags = torch_flags()
    cflags += _extra_flags()
    library = os.path.join(build_dir, f"lib{name}.so")
    result = BuildResult(library=library)
    start_wall, start_cpu = time.perf_counter(), _children_cpu()

    objects, pending = [], []
    for source in sources:
        obj = os.path.join(build_dir, os.path.basename(source) + ".o")
        depfile = obj + ".d"
        command = _compiler() + cflags + ["-MMD", "-MF", depfile, "-c", source, "-o", obj]
        objects.append(obj)
        if _stale(obj, command, [source] + _depfile_paths(depfile)):
            pending.append((source, obj, command))

    running: list[tuple[subprocess.Popen, str, str, list[str]]] = []
    failures: list[str] = []

    def reap(proc, source, obj, command):
        _, err = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"{os.path.basename(source)}:\n{err.decode(errors='replace')}")
            return
        write_if_changed(obj + ".cmd", json.dumps(command))
        result.compiled.append(os.path.basename(source))

    queue = list(pending)
    total = len(pending)
    while queue or running:
        while queue and len(running) < max(1, jobs):
            source, obj, command = queue.pop(0)
            progress.say(f"[build {total - len(queue)}/{total}] compiling {os.path.basename(source)}")
            proc = _start(command)
            running.append((proc, source, obj, command))
        proc_entry = running.pop(0)
        reap(*proc_entry)
    if failures:
        raise GenError("compiling the generated C++ failed; the compiler said:\n" + "\n".join(failures))

    link = _compiler() + objects + ["-o", library] + ldflags
    if _stale(library, link, objects):
        progress.say(f"[build] linking {os.path.basename(library)}")
        proc = _start(link)
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise GenError("linking the generated library failed; the linker said:\n" + err.decode(errors="replace"))
        write_if_changed(library + ".cmd", json.dumps(link))
        result.linked = True
    elif not pending:
        progress.say(f"[build] {os.path.basename(library)} is up to date")
    result.cpu_seconds = _children_cpu() - start_cpu
    result.wall_seconds = time.perf_counter() - start_wall
    return result
