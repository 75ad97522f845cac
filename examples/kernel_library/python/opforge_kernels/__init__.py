"""opforge_kernels: an example kernel library built with opforge.

    import opforge_kernels
    ops = opforge_kernels.ops                  # opforge.ops.kernels
    NormCfg = opforge_kernels.NormCfg          # opforge.structs.kernels.NormCfg
    ops.rms_norm(out, x, w, NormCfg(eps=1e-5))
"""

import os

import opforge

from . import _build_info

# One sentence if this opforge or torch cannot load the library, before it loads.
opforge.check_library("opforge_kernels", opforge_version=_build_info.OPFORGE_VERSION,
                      abi_version=_build_info.OPFORGE_ABI_VERSION, torch_version=_build_info.TORCH_VERSION,
                      stable=_build_info.STABLE, torch_target_version=_build_info.TORCH_TARGET_VERSION)
opforge.load_library(os.path.join(os.path.dirname(__file__), "libopforge_kernels.so"))

ops = opforge.ops.kernels
NormCfg = opforge.structs.kernels.NormCfg
ActCfg = opforge.structs.kernels.ActCfg
Act = opforge.structs.kernels.Act
