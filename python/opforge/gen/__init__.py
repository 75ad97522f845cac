"""Schema codegen (docs/codegen.md): ATen-backed operators and type stubs.

    >>> from opforge import gen
    >>> report = gen.generate_aten(["abs", "addmm"], "myaten", "gen/")   # sources, tests, library
    >>> torch.ops.load_library(report.library)
    >>> torch.ops.myaten.abs(x, out=y)          # aten::abs.out
    >>> gen.generate_stubs("myaten", "stubs/")  # stubs/myaten.pyi, stubs/myaten.py

The command line is `opforge gen aten|stubs`; docs/codegen.md has the rules.
"""

from ._aten import GenError
from ._generate import Report, generate_aten, generate_stubs

__all__ = ["GenError", "Report", "generate_aten", "generate_stubs"]
