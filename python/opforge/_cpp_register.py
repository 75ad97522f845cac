"""Python decorators on ops defined in C++ (docs/cpp_ops.md#python-decorators):
`register_fake`, `register_autograd` and `register_kernel`, written against
the op's original signature, with structs rebuilt as for `@opforge.op`.

    ops = opforge.ops.mylib                      # after torch.ops.load_library(...)

    @ops.attn.register_fake
    def _(q, cfg):                               # cfg: the AttnCfg dataclass
        return q.new_empty(q.shape)

    ops.attn.register_autograd(backward, setup_context=setup_context)
    # backward(ctx, grad) -> (grad_q, AttnCfg-like object of tensor-field grads or None)

    @ops.attn.register_kernel("cuda")
    def _(q, cfg): ...

A decorator registered again replaces the earlier function. What the C++
library already registered is never overridden: a C++ Meta kernel, a C++
backward or a C++ kernel for that device is a clear error.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch
from torch import _C as _torch_C

from . import _C
from ._codegen import _leaf_indices

_AFTER_AUTOGRAD = _torch_C._after_autograd_keyset
# Every runtime autograd key: a registration to the Autograd alias would lose
# to the CompositeImplicitAutograd kernel of `m.def(schema, &fn)`.
# Keys this torch build cannot parse (AutogradHIP on some builds) are left out.
_AUTOGRAD_KEYS = tuple(k for k in _torch_C.DispatchKey.__members__
                       if k.startswith("Autograd") and k not in ("Autograd", "AutogradFunctionality")
                       and _torch_C._parse_dispatch_key(k) is not None)


@dataclasses.dataclass
class _State:
    """What one C++ op's Python registrations read at call time."""

    libs: list = dataclasses.field(default_factory=list)
    fake: Callable | None = None  # flat fake kernel
    kernels: dict = dataclasses.field(default_factory=dict)  # dispatch key -> flat kernel
    backward: Callable | None = None
    setup_context: Callable | None = None
    function: type | None = None


_STATES: dict[str, _State] = {}


def _state(op) -> _State:
    state = _STATES.get(op.name)
    if state is None:
        state = _STATES[op.name] = _State()
    return state


def _has_kernel(name: str, key: str) -> bool:
    return _torch_C._dispatch_has_kernel_for_dispatch_key(name, key)


def _register(op, install: Callable[[torch.library.Library], None]) -> None:
    """Runs `install` on a new library fragment; on error nothing stays."""
    lib = torch.library.Library(op.name.split("::")[0], "FRAGMENT")
    try:
        install(lib)
    except BaseException:
        lib._destroy()
        raise
    _state(op).libs.append(lib)


class Decorators:
    """The decorators of a C++ op seen from Python (`opforge.ops.ns.op`)."""

    __slots__ = ()

    def register_fake(self, fn: Callable) -> Callable:
        """Registers the shape function, written against the original signature:
        `fn(x, cfg)` gets the struct as its dataclass, returns fake outputs
        (a struct return as its dataclass)."""
        register_fake(self, fn)
        return fn

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None) -> None:
        """Registers `backward(ctx, *grads) -> one gradient per original parameter`
        (a struct's gradient: an object with its tensor fields' gradients);
        `setup_context(ctx, inputs, output)` sees the original inputs."""
        register_autograd(self, backward, setup_context)

    def register_kernel(self, device_types: str | Sequence[str], fn: Callable | None = None):
        """Registers a Python kernel for a device ("cpu", "cuda", ...), with the
        original signature. Usable as `@op.register_kernel("cuda")`."""

        def register(fn: Callable) -> Callable:
            register_kernel(self, device_types, fn)
            return fn

        return register if fn is None else register(fn)


def register_fake(op, fn: Callable) -> None:
    name = op.name
    if not callable(fn):
        raise TypeError(f"{name}: register_fake expects a function, got {type(fn).__name__}.")
    state = _state(op)
    kernel = op._code.make_fake_kernel(fn)
    if state.fake is not None:
        state.fake = kernel
        return
    if _has_kernel(name, "CompositeImplicitAutograd"):
        raise RuntimeError(
            f"{name}: register_fake cannot take effect: the op's C++ kernel was registered for every backend "
            f"(m.def(schema, &fn)), and fake tensors run that kernel. Register the C++ kernel per device "
            f"instead (m.def(schema); m.impl(\"{name.split('::')[1]}\", c10::kCPU, &fn)), or give the op "
            f"its fake kernel in C++ with m.fake(...).")
    if _has_kernel(name, "Meta"):
        raise RuntimeError(f"{name}: register_fake: the op already has a fake (Meta) kernel from C++ "
                           f"(m.fake(...)). Remove one of the two.")

    def fake(*args, **kwargs):
        return state.fake(*args, **kwargs)

    _register(op, lambda lib: torch.library.register_fake(op.overload, fake, lib=lib))
    state.fake = kernel


def _device_keys(name: str, device_types: str | Sequence[str]) -> list[str]:
    devices = [device_types] if isinstance(device_types, str) else list(device_types)
    if not devices:
        raise ValueError(f"{name}: register_kernel needs at least one device type, such as \"cpu\" or \"cuda\".")
    keys = []
    for d in devices:
        try:
            keys.append(str(_torch_C._dispatch_key_for_device(d)).split(".")[-1])
        except RuntimeError:
            raise ValueError(f"{name}: register_kernel: {d!r} is not a device type. "
                             f"Use one such as \"cpu\" or \"cuda\".") from None
    return keys


def register_kernel(op, device_types: str | Sequence[str], fn: Callable) -> None:
    name = op.name
    if not callable(fn):
        raise TypeError(f"{name}: register_kernel expects a function, got {type(fn).__name__}.")
    state = _state(op)
    keys = _device_keys(name, device_types)
    for key in keys:
        if key not in state.kernels and _has_kernel(name, key):
            raise RuntimeError(f"{name}: register_kernel: the op already has a {key} kernel from C++. "
                               f"Register the Python kernel for another device, or drop the C++ one.")
    kernel = op._code.make_kernel(fn)
    new = [key for key in keys if key not in state.kernels]

    def install(lib):
        for key in new:
            lib.impl(name.split("::")[1], _trampoline(state.kernels, key), key)

    if new:
        _register(op, install)
    for key in keys:
        state.kernels[key] = kernel


def _trampoline(kernels: dict, key: str) -> Callable:
    def kernel(*args, **kwargs):
        return kernels[key](*args, **kwargs)

    return kernel


def register_autograd(op, backward: Callable, setup_context: Callable | None) -> None:
    name = op.name
    if not callable(backward):
        raise TypeError(f"{name}: register_autograd expects a backward function, got {type(backward).__name__}.")
    if setup_context is not None and not callable(setup_context):
        raise TypeError(f"{name}: register_autograd: setup_context must be a function or None.")
    state = _state(op)
    if state.function is None:
        if _has_kernel(name, "AutogradCPU"):
            raise RuntimeError(f"{name}: register_autograd: the op already has a backward from C++ "
                               f"(.autograd<G>()). Remove one of the two.")
        if not torch._library.utils.is_functional_schema(op.overload._schema):
            raise RuntimeError(f"{name}: register_autograd: the op mutates an argument; a backward is only "
                               f"supported for ops that mutate nothing. Return a new tensor instead.")
        function = _make_function(op, state)
        kernel = _autograd_kernel(op, function)

        def install(lib):
            for key in _AUTOGRAD_KEYS:
                lib.impl(name.split("::")[1], kernel, key, with_keyset=True)

        _register(op, install)
        state.function = function
    state.backward = backward
    state.setup_context = setup_context


class _Meta:
    """The last input of the op's autograd.Function: how to redispatch. A
    class, not a tuple, so that pytree-based wrappers leave it whole."""

    __slots__ = ("keyset", "args", "kwargs")

    def __init__(self, keyset, args, kwargs):
        self.keyset = keyset
        self.args = args
        self.kwargs = kwargs


def _autograd_kernel(op, function: type) -> Callable:
    overload = op.overload
    code = op._code
    tensor_positions = code.tensor_leaf_positions

    def autograd_kernel(keyset, *args, **kwargs):
        if _torch_C.is_grad_enabled() and _torch_C._any_requires_grad(*args, **kwargs):
            leaves = code.flat_full(*args, **kwargs)
            return function.apply(*[leaves[i] for i in tensor_positions], _Meta(keyset, args, kwargs))
        with _torch_C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & _AFTER_AUTOGRAD, *args, **kwargs)

    return autograd_kernel


def _make_function(op, state: _State) -> type:
    """An autograd.Function over the op's tensor leaves that redispatches the
    forward below autograd and hands setup_context / backward the original
    (struct) form."""
    overload = op.overload
    code = op._code
    lowered = _C.op_spec(op.name)
    tensor_positions = code.tensor_leaf_positions
    slot = {leaf: k for k, leaf in enumerate(tensor_positions)}
    slots_per_param = [[slot[i] for i in _leaf_indices(node) if i in slot] for node in lowered.params]
    leaf_returns = all(node.is_leaf for node in lowered.returns)
    multiple_returns = len(lowered.returns) > 1

    def forward(ctx, *inputs):
        meta = inputs[-1]
        with _torch_C._AutoDispatchBelowAutograd():
            out = overload.redispatch(meta.keyset & _AFTER_AUTOGRAD, *meta.args, **meta.kwargs)
        if state.setup_context is not None:
            original_inputs = code.rebuild_inputs(code.flat_full(*meta.args, **meta.kwargs))
            state.setup_context(ctx, original_inputs, out if leaf_returns else code.rebuild_output(out))
        return out

    def backward(ctx, *grads):
        flat = grads if len(grads) > 1 else grads[0]
        original = flat if leaf_returns else code.rebuild_output(flat)
        needs = ctx.needs_input_grad
        ctx.needs_input_grad = tuple(any(needs[k] for k in slots) for slots in slots_per_param)
        try:
            result = state.backward(ctx, *original) if multiple_returns else state.backward(ctx, original)
        finally:
            ctx.needs_input_grad = needs
        if type(result) is not tuple:
            result = (result,)
        per_leaf = code.flatten_grads(result)  # raises the errors that name the op and parameter
        return (*[per_leaf[i] for i in tensor_positions], None)

    cls = type(f"PyBackward_{op.name.replace('::', '_')}", (torch.autograd.Function,),
               {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    if any(isinstance(a.type, torch.ListType) and "Tensor" in str(a.type.getElementType())
           for a in (*overload._schema.arguments, *overload._schema.returns)):
        from torch._library.autograd import supports_tensorlist

        cls = supports_tensorlist(cls)
    return cls

