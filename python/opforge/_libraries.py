"""Loading C++ kernel libraries and checking that a built one can load here
(docs/cpp_ops.md#building):

    opforge.load_library("build/libkernels.so")   # raises what any of its blocks could not register
    opforge.check_library("kernels", opforge_version="0.1.0", abi_version=1, torch_version="2.13.0", stable=False)
"""

from __future__ import annotations

import os

import torch

from . import _C, _registry

def load_library(path: str | os.PathLike) -> None:
    """Loads a C++ kernel library (as torch.ops.load_library does) and raises
    if one of its OPFORGE_LIBRARY blocks could not be registered:

        opforge.load_library("build/libkernels.so")
        # RuntimeError: libkernels.so: OPFORGE_LIBRARY(kernels) at ops.cc:40: kernels::rms_norm: ... Nothing of this block was registered.
    """
    path = os.fspath(path)
    before = len(_C.load_errors())
    torch.ops.load_library(path)
    errors = [message for _library, message in _C.load_errors()[before:]]
    _registry.refresh()  # the library's ops as OpDefs (opforge._cpp_ops)
    if errors:
        raise RuntimeError("\n".join(errors))


def _line(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_library(name: str, *, opforge_version: str, abi_version: int, torch_version: str, stable: bool,
                  torch_target_version: str = "") -> None:
    """Raises ImportError, in one sentence naming both versions, when a C++
    kernel library built with these versions cannot load here. A library's
    package calls it before loading its .so (examples/kernel_library):

        check_library("kernels", opforge_version="0.2.0", abi_version=1, torch_version="2.13.0", stable=False)
        # ImportError: kernels was built against opforge 0.2.0 but opforge 0.1.0 is installed; ...
    """
    from . import __version__

    running = torch.__version__
    if stable:
        have = _C.abi_version()
        if int(abi_version) > have:
            raise ImportError(f"{name} was built against opforge {opforge_version}, whose C ABI version is "
                              f"{abi_version}, but opforge {__version__} serves versions up to {have}; install "
                              f"opforge>={opforge_version}.")
        if torch_target_version and _line(running) < _line(torch_target_version):
            raise ImportError(f"{name} is built on torch's stable ABI for torch {torch_target_version} and later, "
                              f"but torch {running} is installed; install torch>={torch_target_version}.")
        return
    if opforge_version != __version__:
        raise ImportError(f"{name} was built against opforge {opforge_version} but opforge {__version__} is "
                          f"installed; install opforge=={opforge_version}, or rebuild {name} against this opforge "
                          f"(pip install --no-build-isolation --no-deps --force-reinstall <its source>), or build it "
                          f"on the stable ABI, which loads with later opforge releases (docs/stable_abi.md).")
    if _line(torch_version) != _line(running):
        raise ImportError(f"{name} was built against torch {torch_version} but torch {running} is installed; "
                          f"install a torch {'.'.join(map(str, _line(torch_version)))}.x, or rebuild {name} for "
                          f"this torch, or build it on the stable ABI (docs/stable_abi.md).")


def load_errors() -> list[str]:
    """The messages of every C++ library block that could not be registered."""
    return [message for _library, message in _C.load_errors()]
