"""A Triton op's device mistakes in the op's terms (docs/triton.md): the
launch's own error comes back naming the op, the parameter and the devices.
The op's boundary calls the hook only where the body failed, so a call that
succeeds costs nothing more.

    Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)
    -> ValueError: ns::add: parameter 'x' is a tensor on cpu, but the op's body launches Triton kernels (add_kernel), ...
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch

from . import _kernels

# What Triton and torch say when a launch is given tensors on the wrong device.
_DEVICE_TEXTS = ("cannot be accessed from Triton", "active drivers", "Expected all tensors to be on the same device")


def device_error_hook(plan) -> Callable:
    """The op boundary's kernel-error hook for `plan`'s op: called only where
    its body failed, it gives the error to raise instead, or None."""

    def hook(error: BaseException, args: tuple, kwargs: dict):
        message = _device_mistake(plan, args, kwargs, error)
        return None if message is None else ValueError(message)

    return hook


def _placed(body: Callable, args: tuple, kwargs: dict) -> list[tuple[str, torch.device]] | None:
    """(parameter path, device) of each tensor of the call, structs and lists followed."""
    try:
        bound = inspect.signature(body).bind(*args, **kwargs)
    except TypeError:
        return None
    placed: list[tuple[str, torch.device]] = []

    def walk(path, value, depth):
        if isinstance(value, torch.Tensor):
            placed.append((path, value.device))
        elif isinstance(value, (list, tuple)) and depth < 2:
            for i, item in enumerate(value):
                walk(f"{path}[{i}]", item, depth + 1)
        elif hasattr(value, "__dataclass_fields__") and depth < 4:
            for field in value.__dataclass_fields__:
                walk(f"{path}.{field}", getattr(value, field, None), depth + 1)

    for pname, value in bound.arguments.items():
        walk(pname, value, 0)
    return placed


def _device_mistake(plan, args: tuple, kwargs: dict, error: Exception) -> str | None:
    if not any(text in str(error) for text in _DEVICE_TEXTS):
        return None
    placed = _placed(plan.eager_body, args, kwargs)
    if placed is None:
        return None
    name = plan.name
    host = [(p, d) for p, d in placed if d.type == "cpu"]
    accel = [(p, d) for p, d in placed if d.type not in ("cpu", "meta")]
    kernels = ", ".join(_kernels.kernel_name(k) for k in plan.kernels) or "found at run time"
    if host:
        where = f"parameter '{host[0][0]}' is a tensor on cpu"
        if accel:
            where += f" and '{accel[0][0]}' one on {accel[0][1]}"
        return (f"{name}: {where}, but the op's body launches Triton kernels ({kernels}), which take tensors on a "
                f"GPU. Move '{host[0][0]}' to the GPU, or give the op a CPU kernel with "
                f"@{name.split('::')[1]}.register_kernel('cpu').")
    if len({d for _, d in accel}) > 1:
        first, other = accel[0], next(a for a in accel if a[1] != accel[0][1])
        return (f"{name}: parameter '{first[0]}' is on {first[1]} and '{other[0]}' on {other[1]}; the op's "
                f"Triton kernels ({kernels}) take every tensor on one device. Move them to one device.")
    return None
