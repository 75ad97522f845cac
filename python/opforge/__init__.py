"""opforge: turn kernels into first-class PyTorch operators.

    import opforge

    @opforge.op("mylib::scale")
    def scale(x: torch.Tensor, cfg: ScaleCfg) -> torch.Tensor:
        return x * cfg.factor

    scale(torch.ones(2), ScaleCfg(factor=3.0))   # tensor([3., 3.])
    scale.schema   # 'mylib::scale(Tensor x, float cfg__factor) -> Tensor'
"""

import torch  # noqa: F401  (loads libtorch before the extension)

import os as _os

from . import _torch_version

# Before _C loads: under another torch its symbols may not resolve, or may
# resolve against changed structures (docs/versions.md).
_torch_version.check_installed()

from . import _C, cuda_graphs, deploy, handles, symm_mem  # noqa: E402
# The registry's consumers, each listening from its import on (opforge._registry).
from . import _in_graph, _cache_key, _inductor  # noqa: E402, F401  (in this order at a compile start)
from ._cpp_ops import ops, structs  # noqa: E402
from ._ffi import TvmFfiKernel  # noqa: E402
from ._libraries import check_library, load_errors, load_library  # noqa: E402
from ._op import OpDef, op, opcheck  # noqa: E402
from ._types import HandleAnnotation as _HandleAnnotation  # noqa: E402
from .symm_mem import arg_tags, symm_mem_args  # noqa: E402

__all__ = ["Handle", "OpDef", "TvmFfiKernel", "arg_tags", "cache_key", "check_library", "cmake_prefix_path", "cuda_graphs", "deploy",
           "handles",
           "load_errors",
           "load_library", "op", "opcheck", "ops", "set_fast_path_enabled", "structs", "symm_mem", "symm_mem_args"]

# For C++ kernel libraries: cmake -DCMAKE_PREFIX_PATH=<this> ... then find_package(opforge).
cmake_prefix_path = _os.path.dirname(_C.__file__)


class _HandleFactory:
    """`opforge.Handle[Runner]`: a parameter that takes a Runner object, passed
    through the dispatcher as an int handle (see opforge.handles)."""

    def __getitem__(self, target):
        return _HandleAnnotation(target)

    def __repr__(self):
        return "opforge.Handle"


Handle = _HandleFactory()
__version__ = "0.1.0"


def set_fast_path_enabled(enabled: bool) -> bool:
    """Turns the eager fast path on or off for every op (it is on by default);
    returns the previous setting. With it off, every call goes through the
    dispatcher."""
    return _C.set_fast_path_enabled(enabled)


def cache_key(op) -> str:
    """What `op` (an @opforge.op, or a C++ op of opforge.ops) contributes to
    the keys of torch.compile's on-disk caches, as text: its digest and the
    parts it is made of (docs/compile_cache.md).

        print(opforge.cache_key(mylib.rms_norm))"""
    if not isinstance(op, OpDef):
        raise TypeError(f"opforge.cache_key takes an opforge op (an @opforge.op function or an op of opforge.ops), "
                        f"not {type(op).__name__} {op!r}.")
    return _cache_key.explain(op)

