"""opforge: turn kernels into first-class PyTorch operators.

    import opforge

    @opforge.op("mylib::scale")
    def scale(x: torch.Tensor, cfg: ScaleCfg) -> torch.Tensor:
        return x * cfg.factor

    scale(torch.ones(2), ScaleCfg(factor=3.0))   # tensor([3., 3.])
    scale.schema   # 'mylib::scale(Tensor x, float cfg__factor) -> Tensor'
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C
from ._op import OpDef, op, opcheck

__all__ = ["OpDef", "op", "opcheck"]
__version__ = "0.1.0"


def set_fast_path_enabled(enabled: bool) -> bool:
    """Turns the eager fast path on or off for every op (it is on by default);
    returns the previous setting. With it off, every call goes through the
    dispatcher."""
    return _C.set_fast_path_enabled(enabled)
