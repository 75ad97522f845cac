"""Models whose every layer holds its own runner, compiled layer by layer
(regional compilation), shared by the CPU and GPU tests of runner handles.

    gemm = define_gemm("mylib")                  # mylib::runner_gemm, Handle[GemmRunner]
    layers = [PythonRunnerLayer(gemm, 16, seed=i) for i in range(24)]
    eager = run(layers, x)
    compile_layers(layers, backend="eager")      # each layer instance, fullgraph
    run(layers, x)                               # == eager, <= 2 graphs
"""

from __future__ import annotations

import torch

import opforge
from opforge import handles

Tensor = torch.Tensor


class GemmRunner:
    """Stands in for a compiled kernel object: its plan is prepared once and
    cannot be an op argument."""

    def __init__(self, weight: Tensor):
        self.plan = weight.t().contiguous()
        self.calls = 0

    def run(self, x: Tensor) -> Tensor:
        self.calls += 1
        return x @ self.plan


def define_gemm(ns: str, seen: dict | None = None):
    """`ns::runner_gemm(x, runner)`; `seen["fake"]` records what the fake
    kernel was given for the runner."""

    @opforge.op(f"{ns}::runner_gemm")
    def gemm(x: Tensor, runner: opforge.Handle[GemmRunner]) -> Tensor:
        return runner.run(x)

    @gemm.register_fake
    def _(x, runner):
        if seen is not None:
            seen.setdefault("fake", []).append(runner)
        return torch.empty_like(x)

    return gemm


def _weight(dim: int, seed: int, device) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(dim, dim, generator=g) / dim**0.5).to(device)


class PythonRunnerLayer(torch.nn.Module):
    """A residual block around a Python op that takes the layer's runner."""

    def __init__(self, gemm, dim: int, seed: int, device="cpu", register: bool = False):
        super().__init__()
        self.gemm = gemm
        self.norm = torch.nn.LayerNorm(dim, device=device)
        self.runner = GemmRunner(_weight(dim, seed, device))
        if register:
            handles.register(self.runner)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.gemm(self.norm(x), self.runner).relu()


class CppRunnerLayer(torch.nn.Module):
    """The same around a C++ op (tests/cpp_ext) with an opforge::Handle<Runner>:
    the layer holds the C++ runner's handle, made a graph input by
    opforge.handles.dynamic."""

    def __init__(self, ext, dim: int, factor: float, device="cpu"):
        super().__init__()
        self.ext = ext
        self.norm = torch.nn.LayerNorm(dim, device=device)
        self.proj = torch.nn.Linear(dim, dim, device=device)
        self.runner = handles.dynamic(ext.make_runner(factor))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.ext.run(self.proj(self.norm(x)), self.runner).relu()


class PlainLayer(torch.nn.Module):
    """PythonRunnerLayer without a runner: the matmul inline."""

    def __init__(self, dim: int, seed: int, device="cpu"):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim, device=device)
        self.register_buffer("plan", _weight(dim, seed, device).t().contiguous())

    def forward(self, x: Tensor) -> Tensor:
        return x + (self.norm(x) @ self.plan).relu()


def run(layers, x: Tensor) -> Tensor:
    for layer in layers:
        x = layer(x)
    return x


def run_uncompiled(layers, x: Tensor) -> Tensor:
    """`run` through each layer's own forward, not its compiled call."""
    for layer in layers:
        x = layer.forward(x)
    return x


def compile_layers(layers, **options) -> None:
    """Regional compilation: every layer instance compiled on its own."""
    for layer in layers:
        layer.compile(fullgraph=True, **options)


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]
