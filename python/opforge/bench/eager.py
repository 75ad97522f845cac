"""`opforge bench`: the Python rows of docs/performance.md, measured side by side in one
process.

    opforge bench                      # CPU tensors
    opforge bench --device cuda        # CUDA tensors
    opforge bench --args 5 --repeats 11
    opforge bench --runners            # runners under torch.compile (docs/handles.md)
    opforge bench --compiled           # a compiled model of struct ops against define+impl ops
    opforge bench --compile            # registration, Dynamo, Inductor cold/warm, recompiles, step

Every op has a no-op body and `n` flat arguments (n = 1, 5, 30): two tensors
(one for n = 1) and n - 2 scalars (float, int, bool in turn). The opforge op
takes the scalars as one frozen dataclass; the others take them flat. Times
are the median over `--repeats` repeats of the per-call time in µs.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import platform
import statistics
import time
import timeit
from typing import Any, Callable

import torch

import opforge

from .. import _C, _op

Tensor = torch.Tensor
_SCALAR_TYPES = (("float", 0.5), ("int", 3), ("bool", True))
_run_ids = itertools.count()


@dataclasses.dataclass
class Case:
    """One op shape: the callables to time and their arguments."""

    n: int
    stmts: dict[str, str]  # row -> statement timed in a loop
    namespace: dict[str, Any]


def _scalars(n: int) -> list[tuple[str, str, Any]]:
    """(name, type, value) of the scalar arguments of an n-argument op."""
    count = max(n - 2, 0)
    return [(f"f{i}", *_SCALAR_TYPES[i % 3]) for i in range(count)]


def _exec(source: str, scope: dict) -> None:
    exec(compile(source, "<opforge bench>", "exec", dont_inherit=True), scope)  # noqa: S102


def make_case(n: int, device: str, tag: str) -> Case:
    """Defines the ops of one shape in fresh namespaces."""
    scalars = _scalars(n)
    tensors = ["x"] if n == 1 else ["x", "y"]
    out = torch.empty(4, device=device)
    scope: dict[str, Any] = {"torch": torch, "Tensor": Tensor, "opforge": opforge, "OUT": out,
                             "dataclasses": dataclasses}
    flat_params = ", ".join([f"{t}: Tensor" for t in tensors] + [f"{name}: {ty}" for name, ty, _ in scalars])
    flat_names = ", ".join(tensors + [name for name, _, _ in scalars])
    nones = ", ".join(["None"] * (len(tensors) + len(scalars) - 1))
    grads_flat = f"(g, {nones})" if nones else "(g,)"

    # The struct op: the scalars grouped in one frozen dataclass.
    if scalars:
        fields = "\n".join(f"    {name}: {ty}" for name, ty, _ in scalars)
        _exec(f"@dataclasses.dataclass(frozen=True)\nclass Cfg:\n{fields}\n", scope)
        struct_params = ", ".join([f"{t}: Tensor" for t in tensors] + ["cfg: Cfg"])
        struct_args = ", ".join(tensors + ["cfg"])
        scope["cfg"] = scope["Cfg"](*[v for _, _, v in scalars])
        struct_grads = "(g, " + ", ".join(["None"] * len(tensors)) + ")"
        # A new config object per call, as a model that builds it in forward.
        fresh_args = ", ".join(tensors + ["Cfg(" + ", ".join(name for name, _, _ in scalars) + ")"])
    else:
        struct_params, struct_args = "x: Tensor", "x"
        struct_grads = "g"
        fresh_args = struct_args
    ns_opforge, ns_define, ns_custom = f"ofb{tag}", f"ofb_def{tag}", f"ofb_cop{tag}"
    _exec(
        f"def struct_body({struct_params}) -> Tensor:\n    return OUT\n"
        f"def struct_grad_body({struct_params}) -> Tensor:\n    return torch.empty_like(x)\n"
        f"def struct_backward(ctx, g):\n    return {struct_grads}\n"
        f"def flat_body({flat_params}) -> Tensor:\n    return OUT\n"
        f"def flat_grad_body({flat_params}) -> Tensor:\n    return torch.empty_like(x)\n"
        f"def flat_backward(ctx, g):\n    return {grads_flat}\n"
        f"def no_setup(ctx, inputs, output):\n    pass\n"
        f"class Function(torch.autograd.Function):\n"
        f"    @staticmethod\n"
        f"    def forward(ctx, {flat_names}):\n        return torch.empty_like(x)\n"
        f"    @staticmethod\n"
        f"    def backward(ctx, g):\n        return {grads_flat}\n"
        # In place: x is modified (a kernel that writes it) and returned, marked dirty.
        f"def inplace_body({struct_params}) -> Tensor:\n    return x\n"
        f"def dirty_setup(ctx, inputs, output):\n    ctx.mark_dirty(inputs[0])\n"
        f"class InplaceFunction(torch.autograd.Function):\n"
        f"    @staticmethod\n"
        f"    def forward(ctx, {flat_names}):\n        ctx.mark_dirty(x)\n        return x\n"
        f"    @staticmethod\n"
        f"    def backward(ctx, g):\n        return {grads_flat}\n",
        scope,
    )
    fake = lambda *a, **k: torch.empty_like(a[0])  # noqa: E731
    scope["struct_op"] = opforge.op(f"{ns_opforge}::s", fake=fake)(scope["struct_body"])
    scope["struct_overload"] = scope["struct_op"].overload
    scope["struct_grad_op"] = opforge.op(f"{ns_opforge}::sg", fake=fake, backward=scope["struct_backward"])(
        scope["struct_grad_body"])
    scope["inplace_op"] = opforge.op(f"{ns_opforge}::si_", fake=lambda *a, **k: a[0], mutates_args=("x",),
                                     setup_context=scope["dirty_setup"], backward=scope["struct_backward"])(
        scope["inplace_body"])

    lib = torch.library.Library(ns_define, "FRAGMENT")
    schema = torch.library.infer_schema(scope["flat_body"], mutates_args=())
    lib.define("f" + schema)
    lib.impl("f", scope["flat_body"], "CompositeExplicitAutograd")
    scope["_libs"] = [lib]
    scope["define_op"] = getattr(getattr(torch.ops, ns_define), "f").default

    scope["custom_op"] = torch.library.custom_op(f"{ns_custom}::f", mutates_args=())(scope["flat_body"])
    cop = torch.library.custom_op(f"{ns_custom}::g", mutates_args=())(scope["flat_grad_body"])
    cop.register_autograd(scope["flat_backward"], setup_context=scope["no_setup"])
    scope["custom_grad_op"] = cop

    scope["x"] = torch.randn(4, device=device)
    scope["y"] = torch.randn(4, device=device)
    scope["xg"] = torch.randn(4, device=device, requires_grad=True)
    scope["G"] = torch.ones(4, device=device)
    for name, _, value in scalars:
        scope[name] = value
    flat_call = flat_names
    grad_flat_call = flat_names.replace("x", "xg", 1)
    grad_struct_call = struct_args.replace("x", "xg", 1)
    stmts = {
        "opforge": f"struct_op({struct_args})",
        "opforge_fresh": f"struct_op({fresh_args})",
        "body": f"struct_body({struct_args})",
        "body_fresh": f"struct_body({fresh_args})",
        "opforge_dispatcher": f"struct_op({struct_args})",
        "opforge_torch_ops": f"struct_overload({flat_call})",
        "define_impl": f"define_op({flat_call})",
        "custom_op": f"custom_op({flat_call})",
        "aten": "torch.neg(x)",
        "opforge_bwd": f"struct_grad_op({grad_struct_call}).backward(G)",
        "opforge_dispatcher_bwd": f"struct_grad_op({grad_struct_call}).backward(G)",
        "custom_op_bwd": f"custom_grad_op({grad_flat_call}).backward(G)",
        "function_bwd": f"Function.apply({grad_flat_call}).backward(G)",
        "aten_bwd": "torch.neg(xg).backward(G)",
        "opforge_inplace_bwd": f"inplace_op({grad_struct_call.replace('xg', 'xg.mul(1)', 1)}).backward(G)",
        "function_inplace_bwd": f"InplaceFunction.apply({grad_flat_call.replace('xg', 'xg.mul(1)', 1)}).backward(G)",
        "opforge_sum_bwd": f"struct_grad_op({grad_struct_call}).sum().backward()",
        "custom_op_sum_bwd": f"custom_grad_op({grad_flat_call}).sum().backward()",
        "function_sum_bwd": f"Function.apply({grad_flat_call}).sum().backward()",
        "aten_sum_bwd": "torch.neg(xg).sum().backward()",
    }
    return Case(n, stmts, scope)


_DISPATCHER_ROWS = ("opforge_dispatcher", "opforge_dispatcher_bwd")


def _loops(timer: timeit.Timer, min_time: float, sync: Callable[[], None]) -> int:
    """Executions per timed sample, so that one sample takes at least `min_time`."""
    number = 1
    while True:
        sync()
        t = timer.timeit(number)
        sync()
        if t >= min_time or number >= 1 << 22:
            return number
        number = max(number * 2, int(number * min_time / max(t, 1e-9) * 1.2))


def measure_calls(case: Case, *, repeats: int, min_time: float, sync) -> dict[str, float]:
    """Median µs per execution of each row. Every repeat times each row once,
    in turn, so that load from elsewhere on the machine falls on all rows alike."""
    timers = {row: timeit.Timer(stmt, globals=case.namespace) for row, stmt in case.stmts.items()}

    def timed(row: str, number: int) -> float:
        previous = opforge.set_fast_path_enabled(row not in _DISPATCHER_ROWS)
        try:
            sync()
            start = time.perf_counter()
            timers[row].timeit(number)
            sync()
            return (time.perf_counter() - start) / number * 1e6
        finally:
            opforge.set_fast_path_enabled(previous)

    numbers = {}
    for row in timers:
        previous = opforge.set_fast_path_enabled(row not in _DISPATCHER_ROWS)
        try:
            numbers[row] = _loops(timers[row], min_time, sync)
        finally:
            opforge.set_fast_path_enabled(previous)
    samples: dict[str, list[float]] = {row: [] for row in timers}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for row in timers:
                samples[row].append(timed(row, numbers[row]))
    finally:
        if gc_was_enabled:
            gc.enable()
    return {row: statistics.median(v) for row, v in samples.items()}


def _registration_fns(n: int, distinct: bool, index: int, cfg: type | None):
    """Fresh functions to register: the struct op (taking `cfg`) and its flat
    twin. With `distinct`, parameter names differ per op, so no generated
    code is shared between them."""
    scalars = _scalars(n)
    tensors = ["x"] if n == 1 else ["x", "y"]
    suffix = f"_{index}" if distinct else ""
    scope: dict[str, Any] = {"torch": torch, "Tensor": Tensor, "Cfg": cfg}
    names = [t + suffix if i else t for i, t in enumerate(tensors)]
    flat = ", ".join([f"{t}: Tensor" for t in names] + [f"{s}{suffix}: {ty}" for s, ty, _ in scalars])
    struct = ", ".join([f"{t}: Tensor" for t in names] + [f"cfg{suffix}: Cfg"]) if scalars else flat
    _exec(f"def s({struct}) -> Tensor:\n    return x.clone()\n"
          f"def f({flat}) -> Tensor:\n    return x.clone()\n", scope)
    return scope["s"], scope["f"]


def measure_registration(n: int, *, count: int, repeats: int, distinct: bool) -> dict[str, float]:
    """Median ms per registered op, registering `count` ops per repeat. The
    struct type is registered once beforehand, as in a library that defines
    many ops over a few config types."""
    tag = next(_run_ids)
    samples: dict[str, list[float]] = {"opforge": [], "custom_op": [], "define_impl": [], "torch_part": []}
    scalars = _scalars(n)
    cfg = None
    if scalars:
        scope: dict[str, Any] = {"dataclasses": dataclasses}
        fields = "\n".join(f"    {name}: {ty}" for name, ty, _ in scalars)
        _exec(f"@dataclasses.dataclass(frozen=True)\nclass Cfg:\n{fields}\n", scope)
        cfg = scope["Cfg"]
    warm, _ = _registration_fns(n, distinct, count + 1, cfg)
    opforge.op(f"ofr{tag}w::warm")(warm)
    libs = []
    for r in range(repeats):
        fns = [_registration_fns(n, distinct, i, cfg) for i in range(count)]
        schemas = [torch.library.infer_schema(f, mutates_args=()) for _s, f in fns]
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            for i, (s, _f) in enumerate(fns):
                opforge.op(f"ofr{tag}_{r}::s{i}")(s)
            samples["opforge"].append((time.perf_counter() - start) / count * 1e3)

            start = time.perf_counter()
            for i, (_s, f) in enumerate(fns):
                torch.library.custom_op(f"ofr{tag}c_{r}::f{i}", mutates_args=())(f)
            samples["custom_op"].append((time.perf_counter() - start) / count * 1e3)

            start = time.perf_counter()
            for i, (_s, f) in enumerate(fns):
                lib = torch.library.Library(f"ofr{tag}d_{r}", "FRAGMENT")
                lib.define(f"f{i}" + schemas[i])
                lib.impl(f"f{i}", f, "CompositeExplicitAutograd")
                libs.append(lib)
            samples["define_impl"].append((time.perf_counter() - start) / count * 1e3)

            # The torch steps of an opforge registration alone: define, impl,
            # the fake kernel (a Meta kernel), the OpOverload object and the
            # Autograd kernel.
            start = time.perf_counter()
            for i, (_s, f) in enumerate(fns):
                ns = f"ofr{tag}t_{r}_{i}"
                lib = torch.library.Library(ns, "FRAGMENT")
                lib.define("f" + schemas[i])
                lib.impl("f", f, "CompositeExplicitAutograd")
                _op._register_fake(lib, f"{ns}::f", f)
                getattr(getattr(torch.ops, ns), "f").default
                libs.append((lib, _C.register_no_backward_kernel(f"{ns}::f", "no backward")))
            samples["torch_part"].append((time.perf_counter() - start) / count * 1e3)
        finally:
            gc.enable()
    return {k: statistics.median(v) for k, v in samples.items()}


def _budget(ok: bool) -> str:
    return "met" if ok else "NOT met"


def render(device: str, calls: dict[int, dict[str, float]], registration: dict[str, dict[str, float]],
           repeats: int) -> str:
    ns_ = sorted(calls)
    width = 11
    head = "".join(f"{f'{n} arg' + ('s' if n != 1 else ''):>{width}}" for n in ns_)
    lines = [
        f"opforge bench: {device.upper()} tensors, torch {torch.__version__}, Python {platform.python_version()}, "
        f"median of {repeats} repeats",
        "",
        f"{'per call, µs (no-op bodies)':52}{head}",
    ]
    labels = [
        ("opforge", "opforge struct op (eager fast path)"),
        ("opforge_fresh", "  the same, a new Cfg each call"),
        ("body", "plain Python call of the body"),
        ("body_fresh", "  the same, a new Cfg each call"),
        ("opforge_dispatcher", "opforge struct op (fast path off: dispatcher)"),
        ("opforge_torch_ops", "opforge op through torch.ops, flat"),
        ("define_impl", "Library.define + impl, flat (OpOverload call)"),
        ("custom_op", "torch.library.custom_op, flat"),
        ("aten", "reference: torch.neg (one ATen op)"),
        (None, "forward + backward, out.backward(G)"),
        ("opforge_bwd", "opforge op with backward (fast path)"),
        ("opforge_dispatcher_bwd", "opforge op with backward (dispatcher)"),
        ("custom_op_bwd", "custom_op + register_autograd"),
        ("function_bwd", "plain torch.autograd.Function"),
        ("aten_bwd", "reference: torch.neg"),
        (None, "in place (x.mul(1) modified, marked dirty), forward + out.backward(G)"),
        ("opforge_inplace_bwd", "opforge op with mutates_args and backward"),
        ("function_inplace_bwd", "torch.autograd.Function"),
        (None, "forward + out.sum().backward()"),
        ("opforge_sum_bwd", "opforge op with backward"),
        ("custom_op_sum_bwd", "custom_op + register_autograd"),
        ("function_sum_bwd", "plain torch.autograd.Function"),
        ("aten_sum_bwd", "reference: torch.neg"),
    ]
    for key, label in labels:
        if key is None:
            lines.append(f"  {label}")
            continue
        lines.append(f"{'    ' + label:52}" + "".join(f"{calls[n][key]:>{width}.2f}" for n in ns_))

    def ratio_line(label, values, budget, ok):
        text = "".join(f"{v:>{width - 1}.2f}x" for v in values)
        verdict = ", ".join(_budget(o) for o in ok)
        return f"{'    ' + label:52}{text}   budget {budget}: {verdict}"

    lines += ["", "  ratios (budgets: docs/performance.md)"]
    r1 = [calls[n]["opforge"] / calls[n]["define_impl"] for n in ns_]
    lines.append(ratio_line("struct op / define+impl flat", r1, "<= 0.25x", [r <= 0.25 for r in r1]))
    r0 = [calls[n]["opforge"] / calls[n]["body"] for n in ns_]
    lines.append(ratio_line("struct op / plain call of the body", r0, "<= 3x", [r <= 3 for r in r0]))
    r0f = [calls[n]["opforge_fresh"] / calls[n]["body_fresh"] for n in ns_]
    lines.append(ratio_line("  the same, a new Cfg each call", r0f, "<= 3x", [r <= 3 for r in r0f]))
    r2 = [calls[n]["custom_op"] / calls[n]["opforge"] for n in ns_]
    lines.append(ratio_line("custom_op flat / struct op (speed-up)", r2, ">= 4x", [r >= 4 for r in r2]))
    r3 = [calls[n]["custom_op_bwd"] / calls[n]["opforge_bwd"] for n in ns_]
    lines.append(ratio_line("custom_op+autograd / opforge, fwd+bwd", r3, ">= 3x", [r >= 3 for r in r3]))
    r4 = [calls[n]["custom_op_sum_bwd"] / calls[n]["opforge_sum_bwd"] for n in ns_]
    lines.append(ratio_line("the same with .sum().backward()", r4, ">= 3x", [r >= 3 for r in r4]))
    r5 = [(calls[n]["custom_op_bwd"] - calls[n]["aten_bwd"]) / max(calls[n]["opforge_bwd"] - calls[n]["aten_bwd"], 1e-3)
          for n in ns_]
    lines.append(ratio_line("fwd+bwd beyond one ATen op (custom/opforge)", r5, "", []).split("   budget")[0])
    r6 = [calls[n]["function_bwd"] / calls[n]["opforge_bwd"] for n in ns_]
    lines.append(ratio_line("autograd.Function / opforge, fwd+bwd", r6, "", []).split("   budget")[0])
    for suffix, label in (("bwd", "out.backward(G)"), ("sum_bwd", ".sum().backward()")):
        r7 = [calls[n][f"opforge_{suffix}"] / calls[n][f"aten_{suffix}"] for n in ns_]
        lines.append(ratio_line(f"opforge / torch.neg, fwd+{label}", r7, "<= 1.15x", [r <= 1.15 for r in r7]))
        r8 = [calls[n][f"opforge_{suffix}"] / calls[n][f"function_{suffix}"] for n in ns_]
        lines.append(ratio_line(f"opforge / autograd.Function, fwd+{label}", r8, "<= 1.0x",
                                [r <= 1.0 for r in r8]))
    r10 = [calls[n]["opforge_inplace_bwd"] / calls[n]["function_inplace_bwd"] for n in ns_]
    lines.append(ratio_line("opforge / autograd.Function, in place", r10, "<= 1.0x", [r <= 1.0 for r in r10]))
    r9 = [calls[n]["opforge_torch_ops"] / calls[n]["define_impl"] for n in ns_]
    lines.append(ratio_line("op through torch.ops / define+impl", r9, "<= 1.0x", [r <= 1.0 for r in r9]))

    columns = (("opforge", "opforge"), ("custom_op", "custom_op"), ("define_impl", "define+impl"),
               ("torch_part", "torch part"))
    lines += ["", f"{'registration, ms per op':52}" + "".join(f"{label:>{width + 2}}" for _, label in columns)]
    for label, reg in registration.items():
        # The budget is set at 5 arguments; the other rows show how the cost grows.
        verdict = f"   budget <= 0.3 ms: {_budget(reg['opforge'] <= 0.3)}" if label.startswith("5 args") else ""
        lines.append(f"{'    ' + label:52}" + "".join(f"{reg[k]:>{width + 2}.3f}" for k, _ in columns) + verdict)
    lines.append("    (torch part: the define, impl, fake, OpOverload and Autograd-kernel steps of an opforge "
                 "registration, timed alone)")
    return "\n".join(lines)
