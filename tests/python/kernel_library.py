"""The example kernel library (examples/kernel_library), in the build the
environment asks for, loaded once per process:

    OPFORGE_KERNELS unset or "unstable"  built here on libtorch's C++ API
    OPFORGE_KERNELS="stable"             built here on torch's stable ABI (target 2.10)
    OPFORGE_KERNELS=/path/to/lib.so      that file, as built elsewhere (make test-stable-abi)
"""

from __future__ import annotations

import functools
import hashlib
import os

import opforge
from cpp_ext import build


def mode() -> str:
    value = os.environ.get("OPFORGE_KERNELS", "unstable")
    return value if value in ("unstable", "stable") else "prebuilt"


def library_path() -> str:
    value = os.environ.get("OPFORGE_KERNELS", "unstable")
    if value == "unstable":
        return os.path.join(build("examples/kernel_library", "kernel_library"), "libopforge_kernels.so")
    if value == "stable":
        return os.path.join(build("examples/kernel_library", "kernel_library_stable", "KERNELS_STABLE=ON"),
                            "libopforge_kernels.so")
    return value


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@functools.lru_cache(maxsize=None)
def load():
    opforge.load_library(library_path())
    return opforge.ops.kernels
