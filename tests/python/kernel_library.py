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
import subprocess
import sys
import textwrap

import torch

import opforge
from cpp_ext import ROOT, build


# A stable-ABI library builds against the stable headers of its target,
# 2.10 (docs/stable_abi.md); on older torch opforge_add_library says so.
STABLE_BUILDS = torch.torch_version.TorchVersion(torch.__version__) >= "2.10"


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


def rms_norm_ref(x, w, eps, gemma=False):
    """RMSNorm computed with torch, in float32, in x's dtype."""
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * ((1 + w.float()) if gemma else w.float())
    return y.to(x.dtype)


def run_python(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter that sees the test helpers."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests", "python"),
                                                       os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=600)
