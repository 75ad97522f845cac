"""What opforge knows of each op whose launches it traces: the kernels the
scan found when the op was defined, and those found while tracing it.

    record_forward("mylib::add", (add_kernel,))     # the body is a Triton op
    record_backward("mylib::add", (add_bwd_kernel,))
    found("mylib::add", "body", generated_kernel)  # a launch seen while tracing
    kernels_of("mylib::add")                       # KernelList(forward=[add_kernel, generated_kernel], ...)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import _kernels


@dataclass
class OpKernels:
    triton_op: bool = False  # the body decomposes into its launches (a plan was made for it)
    forward: tuple = ()  # found by the scan in the body
    backward: tuple = ()  # found by the scan in backward and setup_context
    traced_forward: dict = field(default_factory=dict)  # id -> kernel, launched while tracing the body
    traced_backward: dict = field(default_factory=dict)  # the same for backward and setup_context


_OPS: dict[str, OpKernels] = {}


def _entry(name: str) -> OpKernels:
    entry = _OPS.get(name)
    if entry is None:
        entry = _OPS[name] = OpKernels()
    return entry


def record_forward(name: str, kernels: tuple) -> None:
    """The body of op `name` is a Triton op launching `kernels` (more may be found when it is traced)."""
    entry = _entry(name)
    entry.triton_op, entry.forward = True, tuple(kernels)
    entry.traced_forward.clear()


def record_backward(name: str, kernels: tuple) -> None:
    entry = _entry(name)
    entry.backward = tuple(kernels)
    entry.traced_backward.clear()


def found(name: str, phase: str, kernel: Any) -> None:
    """A launch of `kernel` seen while tracing op `name`'s body (phase 'body') or backward."""
    entry = _OPS.get(name)
    if entry is not None:
        (entry.traced_forward if phase == "body" else entry.traced_backward).setdefault(id(kernel), kernel)


def forget(name: str) -> None:
    """Op `name` was not registered after all (its definition failed)."""
    _OPS.pop(name, None)


def triton_op_kernels(name: str) -> tuple | None:
    """The forward kernels of `name` if opforge made it a Triton op, else None."""
    entry = _OPS.get(name)
    if entry is None or not entry.triton_op:
        return None
    return _merged(entry.forward, entry.traced_forward)


def _merged(static: tuple, traced: dict) -> tuple:
    seen = {id(k) for k in static}
    return (*static, *(k for k in traced.values() if id(k) not in seen))


class KernelList(tuple):
    """The kernels an op launches, forward's first; `.forward` and
    `.backward` (backward and setup_context) say which is which. Kernels
    found while the op was traced (those a library builds at run time) are
    listed after the ones found when it was defined.

        add.triton_kernels            # (add_kernel, add_backward_kernel)
        add.triton_kernels.backward   # (add_backward_kernel,)
    """

    forward: tuple
    backward: tuple

    def __new__(cls, forward: tuple = (), backward: tuple = ()):
        self = super().__new__(cls, (*forward, *(k for k in backward if k not in forward)))
        self.forward = tuple(forward)
        self.backward = tuple(backward)
        return self

    def __repr__(self) -> str:
        def names(ks):
            return ", ".join(_kernels.kernel_name(k) for k in ks)

        return f"KernelList(forward=[{names(self.forward)}], backward=[{names(self.backward)}])"


def kernels_of(name: str) -> KernelList:
    """The KernelList of op `name`."""
    entry = _OPS.get(name)
    if entry is None:
        return KernelList()
    forward = _merged(entry.forward, entry.traced_forward) if entry.triton_op else ()
    return KernelList(forward, _merged(entry.backward, entry.traced_backward))
