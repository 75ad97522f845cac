"""Drop-in replacements for other projects' registration helpers, built on
`@opforge.op`. Switching is a change of import:

    from magi_compiler.api import magi_register_custom_op          # before
    from opforge.compat.magi import magi_register_custom_op         # after

    from vllm.utils.torch_utils import direct_register_custom_op   # before
    from opforge.compat.vllm import direct_register_custom_op       # after

    from mylib.custom_ops import register_runner, get_runner        # before
    from opforge.compat.runner_registry import register_runner, get_runner

docs/migration.md lists what changes and what stays the same.
"""

import importlib

from ._common import OpNameTakenError

__all__ = ["OpNameTakenError", "magi", "runner_registry", "vllm"]
_SHIMS = ("magi", "runner_registry", "vllm")


def __getattr__(name):
    # `import opforge.compat` then `opforge.compat.magi` works without
    # importing every shim up front.
    if name in _SHIMS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
