"""Op bodies that import their launching helpers inside the function, as
libraries do to keep import time low or to break import cycles."""

from torch import Tensor


def from_import(x: Tensor) -> Tensor:
    from triton_helpers.library import scale_forward

    return scale_forward(x, 2.0)


def import_as(x: Tensor) -> Tensor:
    import triton_helpers.library as lib

    return lib.scale_forward(x, 2.0)


def import_dotted(x: Tensor) -> Tensor:
    import triton_helpers.library

    return triton_helpers.library.scale_forward(x, 2.0)


def relative_import(x: Tensor) -> Tensor:
    from .library import scale_forward

    return scale_forward(x, 2.0)


def import_module_assigned(x: Tensor) -> Tensor:
    import importlib

    lib = importlib.import_module("triton_helpers.library")
    return lib.scale_forward(x, 2.0)


def import_module_inline(x: Tensor) -> Tensor:
    import importlib

    return importlib.import_module("triton_helpers.library").scale_forward(x, 2.0)


def lazy_backward(ctx, grad: Tensor):
    from .library import scale_backward

    return scale_backward(grad.contiguous(), 2.0)


FORMS = {f.__name__: f for f in (from_import, import_as, import_dotted, relative_import, import_module_assigned,
                                  import_module_inline)}
