"""opforge: turn kernels into first-class PyTorch operators."""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C

__all__ = ["_C"]
__version__ = "0.1.0"
