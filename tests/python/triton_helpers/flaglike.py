"""A small Triton library written the way FlagGems is, for the launcher
tests (docs/triton.md, "Kernels found where they are launched"):

- `entry()`: the library's own launcher, a `triton.KernelInterface` holding
  the kernel at `.fn` (FlagGems' `@libentry()`), over plain, autotuned and
  heuristics kernels;
- `tuner(...)`: a `triton.runtime.Autotuner` subclass with its own `run`
  (FlagGems' `@libtuner`);
- `Pointwise`: a function whose launching code and kernel are written to a
  file per tensor rank and imported when first called (FlagGems'
  `@pointwise_dynamic`), launched with a `Buffer` standing in for each
  tensor (FlagGems' `StridedBuffer`);
- kernels calling helpers through a module (`device.program_id(0)`).
"""

import atexit
import importlib.util
import os
import shutil
import tempfile

import torch
import triton
import triton.language as tl

from . import device, library

BLOCK = 32


class Entry(triton.KernelInterface):
    """Launches `fn`, counting launches per argument types as a launcher
    that caches compiled kernels would."""

    def __init__(self, fn):
        self.fn = fn
        self.arg_names = fn.arg_names
        self.launches: dict = {}

    def run(self, *args, grid, warmup, **kwargs):
        key = tuple(type(a).__name__ for a in args)
        self.launches[key] = self.launches.get(key, 0) + 1
        return self.fn.run(*args, grid=grid, warmup=warmup, **kwargs)


def entry():
    return Entry


class Tuner(triton.runtime.Autotuner):
    """Takes the first config without benchmarking (a library's own tuning policy)."""

    def run(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        self.best_config = self.configs[0]
        try:
            return self.fn.run(*args, **kwargs, **self.best_config.all_kwargs())
        finally:
            self.nargs = None


def tuner(configs, key):
    def decorate(fn):
        return Tuner(fn, fn.arg_names, configs, key, reset_to_zero=None, restore_value=None)

    return decorate


scale_kernel = entry()(library.scale_kernel)


@entry()
@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"]) // 2, "num_warps": lambda args: 2})
@triton.jit
def square_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = device.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * x, mask=mask)


@entry()
@tuner(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, device.twice(tl.load(x_ptr + offsets, mask=mask)), mask=mask)


@tuner(configs=[triton.Config({"BLOCK": 32})], key=["n"])
@triton.jit
def negate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, -tl.load(x_ptr + offsets, mask=mask), mask=mask)


class Unfollowable(triton.KernelInterface):
    """A launcher that keeps its kernel where opforge cannot find it."""

    def __init__(self, fn):
        self.compiled = fn

    def run(self, *args, grid, warmup, **kwargs):
        return self.compiled.run(*args, grid=grid, warmup=warmup, **kwargs)


hidden_kernel = Unfollowable(scale_kernel.fn)


def _blocks(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def scale(x, factor):
    out = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), factor, BLOCK=BLOCK)
    return out


def square(x):
    out = torch.empty_like(x)
    square_kernel[_blocks(x.numel())](x, out, x.numel())
    return out


def double(x):
    out = torch.empty_like(x)
    double_kernel[_blocks(x.numel())](x, out, x.numel())
    return out


def negate(x):
    out = torch.empty_like(x)
    negate_kernel[_blocks(x.numel())](x, out, x.numel())
    return out


def hidden_scale(x, factor):
    out = torch.empty_like(x)
    hidden_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), factor, BLOCK=BLOCK)
    return out


# --- kernels generated at run time ----------------------------------------------------------


class Buffer:
    """Stands for a tensor in a launch: Triton passes anything with
    data_ptr() and dtype as a pointer."""

    def __init__(self, base):
        self._base = base
        self.dtype = base.dtype
        self._ptr = base.data_ptr()
        self.shape = tuple(base.shape)

    def data_ptr(self):
        return self._ptr

    def numel(self):
        return self._base.numel()

    def unwrap(self):
        return self._base


_SOURCE = '''
import triton
from triton import language as tl

from {package} import device
from {package}.flaglike import entry


def {name}_wrapper_rank_{rank}(in0, in1, /, *, out0):
    n = out0.numel()
    {name}_kernel_rank_{rank}[(triton.cdiv(n, {block}),)](in0, in1, out0, n, BLOCK={block})
    return out0


@entry()
@triton.jit
def {name}_kernel_rank_{rank}(in0_ptr, in1_ptr, out0_ptr, n, BLOCK: tl.constexpr):
    offsets = device.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(in0_ptr + offsets, mask=mask)
    y = tl.load(in1_ptr + offsets, mask=mask)
    tl.store(out0_ptr + offsets, {name}(x, y), mask=mask)
'''

_GENERATED = tempfile.mkdtemp(prefix="opforge-flaglike-")
atexit.register(shutil.rmtree, _GENERATED, True)


class Pointwise:
    """`f(x, y)` elementwise with the @triton.jit function `scalar`; the
    code that launches it is generated per tensor rank on first use."""

    def __init__(self, scalar):
        self._scalar = scalar
        self.overloads: dict = {}

    def __call__(self, x, y):
        return self._call(x, y)

    def _call(self, x, y):
        out = torch.empty_like(x)
        launch = self.instantiate(x.ndim)
        result = launch(Buffer(x), Buffer(y), out0=Buffer(out))
        return result.unwrap()

    def instantiate(self, rank):
        if rank in self.overloads:
            return self.overloads[rank]
        name = self._scalar.__name__
        path = os.path.join(_GENERATED, f"{__package__}_{name}_rank_{rank}.py")
        with open(path, "w") as f:
            f.write(_SOURCE.format(package=__package__, name=name, rank=rank, block=BLOCK))
        spec = importlib.util.spec_from_file_location(f"_generated_{name}_rank_{rank}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.__dict__[name] = self._scalar
        launch = getattr(module, f"{name}_wrapper_rank_{rank}")
        self.overloads[rank] = launch
        return launch


def pointwise(fn):
    return Pointwise(fn)


@pointwise
@triton.jit
def mul(x, y):
    return x * y


def multiply(x, y):
    return mul(x, y)
