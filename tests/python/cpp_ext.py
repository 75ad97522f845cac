"""Builds tests/cpp_ext (a kernel library outside the opforge tree, built
against the installed CMake package as users build theirs) and loads it once
per process.

    ops = load()             # opforge.ops.opforge_ext
    ops.scale(x, cfg)
"""

from __future__ import annotations

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
EXT_BUILD = os.path.join(ROOT, "build", f"torch-{torch.__version__.split('+')[0]}", "cpp_ext")


@functools.lru_cache(maxsize=None)
def load():
    subprocess.run(
        ["cmake", "-S", EXT_SRC, "-B", EXT_BUILD, "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={opforge.cmake_prefix_path}", f"-DPython_EXECUTABLE={sys.executable}"],
        check=True, capture_output=True)
    build = subprocess.run(["cmake", "--build", EXT_BUILD], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    torch.ops.load_library(os.path.join(EXT_BUILD, "libopforge_test_ext.so"))
    return opforge.ops.opforge_ext
