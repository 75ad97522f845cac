"""vLLM's `direct_register_custom_op`, built on `@opforge.op`.

    from opforge.compat.vllm import direct_register_custom_op

    def silly_attention(q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> None:
        out.copy_(q + k + v)

    direct_register_custom_op("silly_attention", silly_attention, mutates_args=["out"],
                              fake_impl=lambda q, k, v, out: None)
    torch.ops.vllm.silly_attention(q, k, v, out)

As in vLLM: the op is defined in `target_lib`'s namespace (default `vllm`),
its kernel is registered for `dispatch_key` only (default: the platform's,
"CUDA" with a CUDA device, else "CPU"), `mutates_args=None` means nothing is
mutated, `fake_impl` is the shape function and `tags` go on the schema. The
registered schema is the one `torch.library.infer_schema` gives for a flat
signature. Beyond vLLM, `op_func` may take frozen dataclass, Literal and Enum
parameters, and the op is returned as an `opforge.OpDef`.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

import torch
from torch import _C as _torch_C
from torch.library import Library

from .. import _op
from ._common import all_tensor_params, check_name_free, signature_types

__all__ = ["direct_register_custom_op", "vllm_lib"]

vllm_lib = Library("vllm", "FRAGMENT")

_ALL_DEVICES = "CompositeExplicitAutograd"
_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla", "lazy", "ipu", "maia", "meta")


def direct_register_custom_op(
    op_name: str,
    op_func: Callable,
    mutates_args: Sequence[str] | None = None,
    fake_impl: Callable | None = None,
    target_lib: Library | None = None,
    dispatch_key: str | None = None,
    tags: tuple[torch.Tag, ...] = (),
) -> _op.OpDef:
    """Defines `<target_lib.ns>::<op_name>` with `op_func` as its kernel for
    `dispatch_key`, and returns it as an `opforge.OpDef`."""
    lib = vllm_lib if target_lib is None else target_lib
    name = f"{lib.ns}::{op_name}"
    if not isinstance(op_name, str) or "::" in op_name or "." in op_name:
        raise ValueError(
            f"{name}: op_name must be a bare name such as 'silly_attention'; the namespace comes "
            f"from target_lib and overload names are not supported."
        )
    if lib.kind == "IMPL":
        raise ValueError(
            f"{name}: target_lib is an IMPL library, which cannot define operators. "
            f"Pass a Library('{lib.ns}', 'FRAGMENT')."
        )
    check_name_free(name)
    caller = sys._getframe(1)
    if dispatch_key is None:
        dispatch_key = default_dispatch_key()
    device_types = _device_types(name, dispatch_key)
    if mutates_args is None:
        mutates_args = ()
    elif isinstance(mutates_args, str) and mutates_args == "unknown":
        mutates_args = all_tensor_params(signature_types(name, op_func, caller)[0])
    # vLLM's op is opaque to the compiler whatever its body launches, so the
    # Triton scan is off.
    return _op.define(
        name,
        op_func,
        mutates_args=mutates_args,
        fake=fake_impl,
        device_types=device_types,
        tags=tags,
        triton="off",
        _caller=caller,
    )


def default_dispatch_key() -> str:
    """vLLM's `current_platform.dispatch_key`: vLLM's own answer when vLLM is
    loaded, else "CUDA" (CUDA and ROCm), "XPU" or "CPU"."""
    platforms = sys.modules.get("vllm.platforms")
    platform = getattr(platforms, "current_platform", None)
    key = getattr(platform, "dispatch_key", None)
    if isinstance(key, str):
        return key
    if torch.cuda.is_available():
        return "CUDA"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "XPU"
    return "CPU"


def _device_types(name: str, dispatch_key: str) -> list[str] | None:
    """"CUDA" -> ["cuda"]; "CompositeExplicitAutograd" -> None (every device)."""
    if dispatch_key == _ALL_DEVICES:
        return None
    candidates = (*_DEVICE_TYPES, _torch_C._get_privateuse1_backend_name())
    for device in candidates:
        try:
            if _torch_C._dispatch_key_for_device(device) == dispatch_key:
                return [device]
        except RuntimeError:
            continue
    raise ValueError(
        f"{name}: dispatch_key {dispatch_key!r} is not a device's dispatch key. Use one such as "
        f"'CPU' or 'CUDA', or '{_ALL_DEVICES}' to register the kernel for every device."
    )
