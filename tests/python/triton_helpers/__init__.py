"""Triton kernels, helpers and op bodies spread over several modules, for the
Triton detection tests.

`load_interpreted()` imports a second copy of this package whose kernels are
built for Triton's interpreter, so they run on CPU tensors.
"""

import importlib
import importlib.util
import os
import sys


def load_interpreted():
    """The package again, as `triton_helpers_interpreted`, with every
    @triton.jit kernel built under TRITON_INTERPRET=1."""
    name = __name__ + "_interpreted"
    if name in sys.modules:
        return sys.modules[name]
    import triton
    import triton.runtime.interpreter as interpreter

    if not hasattr(interpreter, "_LangPatchScope"):
        import torch

        raise RuntimeError(f"needs Triton 3.6 (this is {triton.__version__}, which torch {torch.__version__} pins): "
                           f"an earlier interpreter patches triton.language for the rest of the process, and "
                           f"every later compile of a kernel in it fails")
    here = os.path.dirname(os.path.abspath(__file__))
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec = importlib.util.spec_from_file_location(name, os.path.join(here, "__init__.py"),
                                                      submodule_search_locations=[here])
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        spec.loader.exec_module(package)
        for sub in ("kernels", "launchers", "ops", "rebind", "library", "lazy", "device", "flaglike"):
            importlib.import_module(f"{name}.{sub}")
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return package
