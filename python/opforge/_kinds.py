"""Kernel kinds: what each kind of kernel means for an op
(docs/architecture.md#kernel-kinds).

    kind = of_definition(name, fn, kernel, devices, triton, extra_kernels, mutates_args, tags)
    kind.body, kind.fake, kind.no_fake      # what the op's state starts with
    kind.install(opdef, kind.devices)       # the dispatcher's kernels and the eager path's
    kind.commit(opdef)                      # once every registration of the op succeeded
    kind.backward(opdef, backward, setup)   # what a backward means for it
    kind.undo(name)                         # what install and commit left outside the op

`_op.define` and `OpDef.register_kernel` call every kind the same way; only
`of_definition` and `of_kernel` look at what they were given. The kinds:

    Body        a Python function (the decorated one, or register_kernel's)
    TritonPlan  a Python function that launches Triton kernels (docs/triton.md)
    FfiKernels  TVM-FFI functions (docs/tvm_ffi.md)
    CppKernels  a C++ library's own kernels (docs/cpp_ops.md): C++ installs them
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import _C as _torch_C

from . import _C, _ffi

COMPOSITE = "CompositeExplicitAutograd"  # the key of a kernel for every device


class Kind:
    body: Callable | None = None  # the Python function eager calls run (None: not Python)
    fake: Callable | None = None  # the fake this kind brings (a Triton op's traceable body)
    traced_body: Callable | None = None
    no_fake: str | None = None  # what a trace says where the op has no fake, if the kind says more
    one_node = True  # whether Dynamo may record a call as one node (opforge._in_graph)
    devices: list[str] | None = None  # the device types its kernels are for (None: every device)

    def install(self, opdef, devices: list[str] | None) -> None:
        """The op's kernels for `devices` (None: every device), in the
        dispatcher and on the eager path."""

    def commit(self, opdef) -> None:
        """What the kind records once the whole op is registered."""

    def undo(self, name: str) -> None:
        """What `install` and `commit` left outside the op's registrations."""

    def backward(self, opdef, backward: Callable, setup_context: Callable | None) -> tuple:
        """backward and setup_context as the op's autograd bridge runs them:
        a backward that calls a TVM-FFI function directly refuses fake tensors."""
        return _ffi.guard_backward(opdef.name, backward), setup_context


def _keys(devices: list[str] | None) -> list[tuple[str, str | None]]:
    """(dispatch key, device type or None) of each kernel: one for every device, or one per device type."""
    if devices is None:
        return [(COMPOSITE, None)]
    return [(_torch_C._dispatch_key_for_device(d), d) for d in devices]


def _finish_install(opdef, devices: list[str] | None) -> None:
    if devices is not None:
        opdef._device_kernels = True
    # The direct autograd path only knows the default Python body
    # (_op._install_autograd turns it on where that is all there is).
    opdef._set_has_backward(False)


@dataclass(frozen=True)
class TritonOptions:
    """The decorator's Triton arguments, which `register_autograd` reuses."""

    mode: str = "off"  # 'auto', 'off' or 'force'
    extra_kernels: tuple = ()
    mutates_args: tuple = ()


NO_TRITON = TritonOptions()


class Body(Kind):
    """A Python function with the op's original signature. With Triton
    options on, a backward that launches Triton kernels is made traceable
    (docs/triton.md), whatever the forward launches."""

    def __init__(self, fn: Callable, devices: list[str] | None = None, options: TritonOptions | None = None):
        self.body = fn
        self.devices = devices
        self.options = options or NO_TRITON

    def install(self, opdef, devices: list[str] | None) -> None:
        for key, device in _keys(devices):
            kernel = opdef._registrations.get(key)
            if isinstance(kernel, _C.OpKernel):  # registered once per key, then only the function changes
                kernel.set_fn(self.body)
            else:
                opdef._registrations.pop(key, None)  # another kind's, undone before this one takes the key
                opdef._registrations[key] = _C.register_kernel(opdef.boundary, self.body, key)
            opdef._set_kernel(device, self.body)
        _finish_install(opdef, devices)

    def backward(self, opdef, backward: Callable, setup_context: Callable | None) -> tuple:
        options = self.options
        module = triton_module() if options.mode != "off" else None
        if module is not None:
            backward, setup_context = module.autograd(
                opdef.name, opdef.__wrapped__, backward, setup_context, mode=options.mode,
                extra_kernels=options.extra_kernels, mutates_args=options.mutates_args)
        return super().backward(opdef, backward, setup_context)


class FfiKernels(Kind):
    """TVM-FFI functions ({device type or None: _C.FfiKernel}), called from C
    on both paths; the decorated function gives only the signature."""

    def __init__(self, name: str, kernels: dict):
        self.kernels = kernels
        self.devices = None if kernels.keys() == {None} else list(kernels)
        self.no_fake = _ffi.missing_fake_message(name)

    def install(self, opdef, devices: list[str] | None) -> None:
        """Its own kernels: `devices` is the `devices` it was made with."""
        for key, device in _keys(self.devices):
            kernel = self.kernels[device]
            opdef._registrations.pop(key, None)  # the kernel it replaces, undone first
            opdef._registrations[key] = _C.register_ffi_kernel(kernel, key)
            opdef._set_kernel(device, kernel)
        # With a gradient, the eager route records the graph node and calls the kernel from C (op_object.cc).
        _finish_install(opdef, self.devices)


class TritonPlan(Body):
    """A Python function launching Triton kernels, as the scan planned it
    (docs/triton.md): eager calls run the function at full speed; its
    traceable copy is the fake and, under AOTAutograd, the decomposition
    Inductor sees."""

    one_node = False  # the traced body is captured through the op's traced __call__

    def __init__(self, module, plan, options: TritonOptions, devices: list[str] | None):
        super().__init__(plan.eager_body, devices, options)
        self.module = module
        self.plan = plan
        self.fake = self.traced_body = plan.traced_body

    def install(self, opdef, devices: list[str] | None) -> None:
        super().install(opdef, devices)
        from torch._subclasses.functional_tensor import FunctionalTensorMode

        traced_kernel = opdef._code.make_fake_kernel(self.plan.traced_body)

        def functional_decomp(mode, func, types, args, kwargs):
            with mode:
                return traced_kernel(*args, **kwargs)

        torch.library.register_torch_dispatch(opdef.overload, FunctionalTensorMode, functional_decomp,
                                              lib=opdef._lib)
        opdef.boundary.set_kernel_error_hook(self.module.device_error_hook(self.plan))

    def commit(self, opdef) -> None:
        self.module.record_forward(opdef.name, self.plan.kernels)

    def undo(self, name: str) -> None:
        self.module.forget(name)


class CppKernels(Kind):
    """A C++ library's kernels: C++ registered them, so there is nothing to
    install; Python decorators add to them (docs/cpp_ops.md)."""

    one_node = False


CPP = CppKernels()


def of_definition(name: str, fn: Callable, kernel: Any, devices: list[str] | None, triton: str,
                  extra_kernels, mutates_args, tags: list) -> Kind:
    """The kind of the op `@opforge.op(name, ...)` defines from `fn`."""
    extra_kernels, mutates_args = tuple(extra_kernels), tuple(mutates_args)
    if kernel is not None:
        kernels = {d: _ffi.make_kernel(name, f, "kernel=") for d, f in _ffi.kernels_of(name, kernel, devices).items()}
        if kernels.keys() != {None}:
            kernels = dict(zip(device_list(name, list(kernels)), kernels.values()))
        _opaque_if_unsafe(name, "off", extra_kernels, tags)
        return FfiKernels(name, kernels)
    mode = _opaque_if_unsafe(name, triton, extra_kernels, tags)
    module, plan = _triton_plan(name, fn, mode, extra_kernels, mutates_args)
    options = TritonOptions(mode, extra_kernels, mutates_args)
    return Body(fn, devices, options) if plan is None else TritonPlan(module, plan, options, devices)


def of_kernel(name: str, fn: Callable, devices: list[str]) -> Kind:
    """The kind of a kernel given to `register_kernel` for `devices`."""
    if _ffi.unwrap(fn) is not None:
        kernel = _ffi.make_kernel(name, fn, "register_kernel")
        return FfiKernels(name, {d: kernel for d in devices})
    return Body(fn, devices)


def device_list(name: str, device_types) -> list[str]:
    devices = [device_types] if isinstance(device_types, str) else list(device_types)
    out = []
    for d in devices:
        try:
            out.append(torch.device(d).type)
        except RuntimeError:
            raise ValueError(f"{name}: device_types: {d!r} is not a device type. Use e.g. 'cpu' or 'cuda'.") from None
    return out


_TRITON: list = []  # [the opforge.triton module, or None when unavailable]


def triton_module():
    """opforge.triton, imported on the first Triton question (it imports triton)."""
    if not _TRITON:
        try:
            from . import triton as module
        except ImportError:
            module = None
        _TRITON.append(module if callable(getattr(module, "plan", None)) else None)
    return _TRITON[0]


def _triton_plan(name: str, fn: Callable, mode: str, extra_kernels: tuple, mutates_args: tuple) -> tuple:
    """(opforge.triton, what its scan found), or (None, None) for an opaque op."""
    if mode not in ("auto", "off", "force"):
        raise ValueError(f"{name}: triton={mode!r} is not one of 'auto', 'off', 'force'.")
    if mode == "off":
        return None, None
    module = triton_module()
    if module is None:
        if mode == "force" or extra_kernels:
            raise ValueError(f"{name}: triton={mode!r} needs the triton package, which is not importable.")
        return None, None
    return module, module.plan(name, fn, mode=mode, extra_kernels=extra_kernels, mutates_args=mutates_args)


def _opaque_if_unsafe(name: str, mode: str, extra_kernels: tuple, tags: list) -> str:
    """The op's Triton mode: 'off' for a cudagraph_unsafe op, which must stay
    one node for Inductor's graph partition to cut around, so its Triton
    launches are not traced into the graph (docs/cuda_graphs.md)."""
    if torch.Tag.cudagraph_unsafe not in tags:
        return mode
    if mode == "force" or extra_kernels:
        raise ValueError(f"{name}: an op tagged torch.Tag.cudagraph_unsafe stays opaque to Inductor, so its "
                         f"Triton kernels cannot be traced (triton={mode!r}, extra_triton_kernels). Drop "
                         f"triton='force' and extra_triton_kernels, or the tag.")
    return "off"
