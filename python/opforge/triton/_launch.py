"""Launches made traceable: what `__opforge_wrap__(k)[grid](...)` runs in a
traced body (docs/triton.md).

    wrap(add_kernel)[grid](x, y, out, n)           # wrap_triton(add_kernel)[grid](x, y, out, n, BLOCK=128)
    wrap(LibEntry(heuristics(k)))[grid](x, out)    # wrap_triton(k)[grid](x, out, TILE=..., num_warps=...)

A library's launcher (a triton.KernelInterface holding the kernel at `.fn`)
is followed to the kernel it launches; the @triton.heuristics right under it
are applied here, as the launcher does eagerly; arguments that stand for a
tensor (objects with data_ptr() and dtype holding one tensor, FlagGems'
StridedBuffer) are passed as that tensor. Every launch is recorded for
`op.triton_kernels` and checked for undeclared writes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from . import _flatten, _kernels, _trace


@dataclass(frozen=True)
class Launch:
    kernel: Any  # as the code launches it: a kernel or a launcher
    target: Any  # what wrap_triton traces (a copy Inductor can compile, see _flatten)
    heuristics: tuple  # applied to the arguments first

    def arguments(self, args: tuple, kwargs: dict, frame) -> tuple[tuple, dict]:
        for layer in self.heuristics:
            kwargs = dict(kwargs)
            for key, heuristic in layer.values.items():
                kwargs[key] = heuristic({**dict(zip(layer.arg_names, args)), **kwargs})
        args, kwargs = self._tensors(args, kwargs)
        kwargs = _kernels.bind_defaults(self.target, args, kwargs)
        if _trace.watching():
            _trace.check_launch(self.target, args, kwargs, frame)
        return args, kwargs

    def _tensors(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if not any(map(_stands_for_tensor, args)) and not any(map(_stands_for_tensor, kwargs.values())):
            return args, kwargs
        names = list(getattr(_kernels.jit_of(self.target), "arg_names", ()) or ())
        args = tuple(self._tensor(v, names[i] if i < len(names) else str(i)) for i, v in enumerate(args))
        return args, {k: self._tensor(v, k) for k, v in kwargs.items()}

    def _tensor(self, value: Any, name: str) -> Any:
        if not _stands_for_tensor(value):
            return value
        held = [v for v in vars(value).values() if isinstance(v, torch.Tensor)]
        what = f"Triton kernel '{_kernels.kernel_name(self.kernel)}' gets its argument '{name}' as a " \
               f"{type(value).__name__}, which Triton passes as a pointer (it has data_ptr() and dtype)"
        if len(held) != 1:
            raise _kernels.KernelError(
                f"{_trace.current_op()}: {what}; opforge passes such an argument to the traced kernel as the "
                f"tensor it holds, but it holds {len(held)} tensors. Pass the tensor itself, or keep the op opaque "
                f"with triton='off' and a shape function fake=.", kernel=self.kernel)
        tensor = held[0]
        if value.dtype != tensor.dtype or value.data_ptr() != tensor.data_ptr():
            raise _kernels.KernelError(
                f"{_trace.current_op()}: {what}, pointing into its tensor at an offset or as another dtype, which "
                f"a traced kernel cannot be given. Pass a view of the tensor (tensor[offset:], "
                f"tensor.view(dtype)), or keep the op opaque with triton='off' and a shape function fake=.",
                kernel=self.kernel)
        return tensor


def _stands_for_tensor(value: Any) -> bool:
    return not isinstance(value, torch.Tensor) and hasattr(type(value), "data_ptr") and hasattr(value, "dtype") \
        and hasattr(value, "__dict__")


_LAUNCHES: dict[int, tuple[Any, Launch]] = {}


def _launch(kernel: Any) -> Launch:
    entry = _LAUNCHES.get(id(kernel))
    if entry is not None and entry[0] is kernel:
        return entry[1]
    problem = _kernels.problem(kernel)
    if problem is not None:
        raise _kernels.KernelError(f"{_trace.current_op()}: {problem}", kernel=kernel)
    split = _kernels.split(kernel)
    launch = Launch(kernel, _flatten.for_inductor(split.target), split.heuristics)
    _LAUNCHES[id(kernel)] = (kernel, launch)
    return launch


def wrap(obj: Any) -> Any:
    """The launch target as traced code sees it: a Triton kernel, or a
    launcher holding one, goes through torch.library.wrap_triton (which
    returns the kernel itself while wrapping is disabled); anything else, and
    a kernel the user already wrapped, is returned unchanged."""
    if _kernels.classify(obj) is None or _kernels.is_interpreted(obj):
        # Interpreter kernels run eagerly on CPU; wrap_triton cannot trace them.
        return obj
    from torch.library import wrap_triton

    launch = _launch(obj)
    _trace.found(obj)
    # Not cached: torch._dynamo.reset() renumbers the kernels wrap_triton records.
    return Traceable(launch, wrap_triton(launch.target))


class Traceable:
    """`wrap_triton(kernel)`, with the launch's arguments completed as
    `Launch.arguments` describes.

        Traceable(launch, wrap_triton(k))[grid](x, out, n)   # wrap_triton(k)[grid](x, out, n, BLOCK=128)
    """

    __slots__ = ("launch", "wrapped")

    def __init__(self, launch: Launch, wrapped: Any):
        self.launch = launch
        self.wrapped = wrapped

    def __getitem__(self, grid: Any) -> "Traceable":
        return Traceable(self.launch, self.wrapped[grid])

    def __call__(self, *args, **kwargs):
        args, kwargs = self.launch.arguments(args, kwargs, sys._getframe(1))
        return self.wrapped(*args, **kwargs)

    def run(self, *args, **kwargs):
        args, kwargs = self.launch.arguments(args, kwargs, sys._getframe(1))
        return self.wrapped.run(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.launch.kernel, name)

    def __repr__(self) -> str:
        return f"<opforge traceable launch of {_kernels.kernel_name(self.launch.kernel)}>"
