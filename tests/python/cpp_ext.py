"""Builds C++ kernel libraries outside the opforge tree (tests/cpp_ext, the
examples) against the installed CMake package, as users build theirs, and
loads them once per process.

    ops = load()                        # tests/cpp_ext: opforge.ops.opforge_ext
    path = build("examples/kernel_library", "kernel_library")   # the built .so's folder
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import subprocess
import sys

import torch

import opforge

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXT_SRC = os.path.join(ROOT, "tests", "cpp_ext")
# Kept apart per torch release, so suites on two torch versions never reuse
# each other's objects.
BUILD = os.path.join(ROOT, "build", f"torch-{torch.__version__.split('+')[0]}")
EXT_BUILD = os.path.join(BUILD, "cpp_ext")


@contextlib.contextmanager
def build_lock(out: str):
    """Holds `out`'s lock: the pytest workers of one run (pytest -n 2) and
    suites running side by side build each folder one at a time, and a
    second comer finds it built."""
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out.rstrip(os.sep) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build(src: str, name: str, *defines: str, out: str | None = None) -> str:
    """Configures and builds the CMake project `src` (relative to the repo,
    or absolute) into `out`, by default build/torch-<release>/<name>;
    returns that folder."""
    out = out or os.path.join(BUILD, name)
    with build_lock(out):
        return _build(src, out, defines)


def _build(src: str, out: str, defines) -> str:
    configure = subprocess.run(
        ["cmake", "-S", os.path.join(ROOT, src), "-B", out, "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={opforge.cmake_prefix_path}", f"-DPython_EXECUTABLE={sys.executable}",
         *[f"-D{d}" for d in defines]],
        capture_output=True, text=True)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    result = subprocess.run(["cmake", "--build", out], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@functools.lru_cache(maxsize=None)
def load():
    opforge.load_library(os.path.join(build("tests/cpp_ext", "cpp_ext"), "libopforge_test_ext.so"))
    return opforge.ops.opforge_ext
