"""Which torch opforge was built against, checked before `opforge._C` loads.

torch keeps no C++ ABI between minor releases: an extension built against
2.13 and loaded by 2.11 fails with an undefined symbol, and one loaded by a
newer torch can resolve every symbol yet read changed structures. So opforge
stores `torch.__version__` at build time (opforge/_build_info.py, written by
CMake) and refuses to load `_C` under another major.minor (docs/versions.md):

    >>> check("2.13.0+cpu", "2.13.0+cu130")   # same release line: fine
    >>> check("2.13.0+cpu", "2.15.0")
    Traceback (most recent call last):
    ImportError: opforge was built against torch 2.13.0+cpu but torch 2.15.0 is
    installed; rebuild it for this torch with `pip install --no-build-isolation
    --no-deps -e /src/opforge` (or `make build` in /src/opforge).
"""

from __future__ import annotations

import re

_RELEASE = re.compile(r"(\d+)\.(\d+)")


def abi_line(version: str) -> tuple[int, int] | None:
    """The part of a torch version that fixes its C++ ABI: '2.15.0+cu132' -> (2, 15).

    Patch releases (2.14.0, 2.14.1) and builds for another device (+cpu,
    +cu130) of one release line export the same symbols and structures.
    """
    match = _RELEASE.match(version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def cxx_standard(version: str) -> str:
    """The C++ standard torch's headers need: '2.13.0' -> 'c++17', '2.14.1' -> 'c++20'.

    cmake/OpforgeTorch.cmake applies the same rule to opforge's own build.
    """
    line = abi_line(version)
    return "c++20" if line is None or line >= (2, 14) else "c++17"


def rebuild_command(install_kind: str, source_dir: str) -> str:
    """How to rebuild opforge for the running torch, for the kind of install it is."""
    if install_kind == "editable" and source_dir:
        return (f"`pip install --no-build-isolation --no-deps -e {source_dir}` "
                f"(or `make build` in {source_dir})")
    return ("`pip install --no-build-isolation --no-deps --force-reinstall .` "
            "in the opforge source tree")


def mismatch_message(built: str, running: str, install_kind: str = "wheel", source_dir: str = "") -> str:
    """The one sentence an import under the wrong torch fails with."""
    return (f"opforge was built against torch {built} but torch {running} is installed; "
            f"rebuild it for this torch with {rebuild_command(install_kind, source_dir)}.")


def check(built: str, running: str, install_kind: str = "wheel", source_dir: str = "") -> None:
    """Raises ImportError when `running` torch cannot load an opforge built for `built`."""
    if abi_line(built) != abi_line(running) or abi_line(built) is None:
        raise ImportError(mismatch_message(built, running, install_kind, source_dir))


def built_against() -> str | None:
    """torch.__version__ at build time, or None for a build that did not record it."""
    try:
        from . import _build_info
    except ImportError:
        return None
    return _build_info.TORCH_VERSION


def check_installed() -> None:
    """Compares the recorded torch with the imported one; called by opforge/__init__.py."""
    try:
        from . import _build_info
    except ImportError:
        return  # a build from before the version was recorded: nothing to compare
    import torch

    check(_build_info.TORCH_VERSION, str(torch.__version__), _build_info.INSTALL_KIND, _build_info.SOURCE_DIR)
