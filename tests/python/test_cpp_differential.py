"""Differential test of C++ ops' errors, in both ABI modes: over a corpus of
good and bad calls of the ops of tests/cpp_ext/mistakes (`throws`),
examples/kernel_library and tests/cpp_ext/differential (an optional struct),
each call goes through

    fast        opforge.ops.<ns>.<op>, the eager fast path
    dispatcher  the same with the fast path off
    compiled    torch.compile(fullgraph=False, backend="eager") of a function calling it
    flat        torch.ops.<ns>.<op> with the flat arguments, where the call has a flat form

Bad calls raise the same exception type and message on the fast path and
through the dispatcher, and the same type, with that message in its own,
compiled; good calls give equal values (returns and written tensors) on every
path. Where the compiled error legitimately differs, the difference is
asserted as such. Each mode's corpus runs in a child process: the example
library's namespace (`kernels`) is the same in both modes, and a call that
kills the process shows as that case's dead child, not as a lost test run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from cpp_ext import build
from kernel_library import STABLE_BUILDS

MODE_NAMES = ("unstable", "stable")
HERE = os.path.dirname(os.path.abspath(__file__))
# What a kernel's std::invalid_argument is in Python: pybind11's translation
# before torch 2.15, torch's own from 2.15 (test_cpp_mistakes.py).
TORCH_TRANSLATES = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 15)
INVALID_ARGUMENT = "RuntimeError" if TORCH_TRANSLATES else "ValueError"

# How the compiled error relates to the eager one.
SAME = "same"  # the eager type, with the eager message in the compiled one
# The op has no fake kernel, so its kernel runs on fake tensors while Dynamo
# traces (docs/cpp_ops.md, "What m.def with a kernel means"), and Dynamo
# reports what an op raised on fake tensors as its TorchRuntimeError (a
# RuntimeError) quoting the exception, `got ValueError('a bad argument')`, as
# it does for any torch op. (An IndexError it lets through as it is.)
TRACED_KERNEL = "traced kernel"
# Dynamo lets an IndexError from a fake-tensor run through as it is from torch
# 2.13 (torch/_dynamo/utils.py run_node); before, it wraps it as any other.
INDEX_ERROR_COMPILED = SAME if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13) \
    else TRACED_KERNEL
TORCH_RUNTIME_ERROR = "torch._dynamo.exc.TorchRuntimeError"

# Under torch.compile the boundary's checks of flat leaf values (a tensor, an
# int, a float, a list, in a struct or not) run while Dynamo traces the op, in
# Python, before torch's own schema check of the flat op could answer with its
# message; with fullgraph=False the user gets the eager error itself.


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    op: str  # M: mistakes_<mode>, K: kernels, D: differential_<mode>
    args: str  # the call's arguments, Python source
    error: tuple | None = None  # (type, message) raised eagerly; None: a good call
    flat: str | None = None  # the flat call's arguments, where it has a flat form
    by_kernel: bool = False  # the error is the kernel's, so torch.ops raises it too
    compiled: str = SAME
    traced: bool = True  # a good call's op is in the compiled graph

    def spec(self) -> dict:
        return {"id": self.id, "op": self.op, "args": self.args, "flat": self.flat}


THROWS = "mistakes_{mode}::throws"
NOT_STD = (THROWS + ": the CompositeExplicitAutograd kernel threw something that is not a std::exception; throw one "
           "(TORCH_CHECK does).")
WINDOW = "differential_{mode}::window: parameter 'w', field differential_{mode}.Window"
RANGE = ("is outside the range of torch's int (64-bit: -2**63 to 2**63-1). Pass a value in that range, or a float or "
         "Tensor parameter for larger values.")

CORPUS = [
    # Good calls: equal values on every path.
    Case("throws: good", "M.throws", "x, 9", flat="x, 9"),
    Case("throws: good, by keyword", "M.throws", "kind=9, x=x", flat="kind=9, x=x"),
    Case("rms_norm: good struct", "K.rms_norm", "out, x, w, NormCfg(eps=0.5, gemma=True)", flat="out, x, w, 0.5, True"),
    # A float for a bool is taken as torch takes it (test_boundary_differential.py).
    Case("rms_norm: float for a struct's bool", "K.rms_norm", "out, x, w, NormCfg(gemma=1.5)",
         flat="out, x, w, 1e-6, 1.5"),
    Case("rms_norm_fn: good, returns", "K.rms_norm_fn", "x, w, NormCfg(eps=0.25)", flat="x, w, 0.25, False"),
    Case("act_and_mul: good enum member", "K.act_and_mul", "half, x, ActCfg(act=Act.kGelu, limit=2.0)",
         flat="half, x, 1, 2.0"),
    Case("act_and_mul: good enum value", "K.act_and_mul", "half, x, ActCfg(act=1)", flat="half, x, 1, 0.0"),
    Case("scale_rows: good handle, list, optional", "K.scale_rows", "out, x, table, [2, 0], clamp=1.5",
         flat="out, x, table, [2, 0], clamp=1.5"),
    # An op of constant arguments and an int return is run while Dynamo
    # traces, and its value is a constant of the graph, which has no op.
    Case("two_shot_min_bytes: good int return", "K.all_reduce_two_shot_min_bytes", "4", flat="4", traced=False),
    Case("window: optional struct left out", "D.window", "out, x", flat="out, x"),
    Case("window: optional struct", "D.window", "out, x, Window(size=2, scale=0.5, mode=Mode.kAdd)",
         flat="out, x, True, 2, 0.5, 0"),
    Case("window: an object with the struct's fields", "D.window",
         "out, x, SimpleNamespace(size=2, scale=0.5, mode=Mode.kAdd)", flat="out, x, True, 2, 0.5, 0"),
    # A wrong type, None or an out-of-range value for a leaf.
    Case("throws: str for a tensor", "M.throws", "'a', 9", flat="'a', 9",
         error=("TypeError", THROWS + ": parameter 'x': expected a Tensor, got str 'a'. Pass a Tensor.")),
    # torch.ops hands a kernel None for a Tensor (docs/python_ops.md, "The
    # call boundary"): the flat call's error is then the kernel's.
    Case("throws: None for a tensor", "M.throws", "None, 9", flat="None, 9",
         error=("TypeError", THROWS + ": parameter 'x': expected a Tensor, got None. Pass a Tensor.")),
    Case("rms_norm_fn: None for a tensor", "K.rms_norm_fn", "x, None, NormCfg()", flat="x, None, 1e-6, False",
         error=("TypeError", "kernels::rms_norm_fn: parameter 'weight': expected a Tensor, got None. Pass a Tensor.")),
    Case("throws: float for an int", "M.throws", "x, 1.5", flat="x, 1.5",
         error=("TypeError", THROWS + ": parameter 'kind': expected an int, got float 1.5. Pass an int.")),
    Case("throws: int past 64 bits", "M.throws", "x, 2**64", flat="x, 2**64",
         error=("OverflowError", THROWS + ": parameter 'kind': int 18446744073709551616 " + RANGE)),
    Case("two_shot_min_bytes: int below 64 bits", "K.all_reduce_two_shot_min_bytes", "-2**63 - 1", flat="-2**63 - 1",
         error=("OverflowError", "kernels::all_reduce_two_shot_min_bytes: parameter 'world_size': int "
                "-9223372036854775809 " + RANGE)),
    Case("scale_rows: float in an int list", "K.scale_rows", "out, x, table, [0, 1.5]", flat="out, x, table, [0, 1.5]",
         error=("TypeError", "kernels::scale_rows: parameter 'rows': expected a list of int, got list [0, 1.5]. Pass "
                "a list of int.")),
    Case("scale_rows: str for an optional float", "K.scale_rows", "out, x, table, [0, 0], clamp='a'",
         flat="out, x, table, [0, 0], clamp='a'",
         error=("TypeError", "kernels::scale_rows: parameter 'clamp': expected a float or None, got str 'a'. Pass a "
                "float or None.")),
    Case("scale_rows: float for a handle", "K.scale_rows", "out, x, 1.5, [0, 0]", flat="out, x, 1.5, [0, 0]",
         error=("TypeError", "kernels::scale_rows: parameter 'table': expected an int, got float 1.5. Pass an int.")),
    # Structs.
    Case("rms_norm: str for a struct's float", "K.rms_norm", "out, x, w, NormCfg(eps='a')",
         flat="out, x, w, 'a', False",
         error=("TypeError", "kernels::rms_norm: parameter 'cfg', field kernels.NormCfg.eps: expected a float, got "
                "str 'a'. Pass a float.")),
    Case("rms_norm: None for a struct", "K.rms_norm", "out, x, w, None",
         error=("TypeError", "kernels::rms_norm: parameter 'cfg': expected a kernels.NormCfg, got None. Pass a "
                "kernels.NormCfg.")),
    Case("rms_norm: another struct", "K.rms_norm", "out, x, w, ActCfg()",
         error=("TypeError", "kernels::rms_norm: parameter 'cfg': expected an object with the fields of "
                "kernels.NormCfg (eps, gemma), got ActCfg kernels.ActCfg(act=<Act.kSilu: 0>, limit=0.0), which has "
                "no field 'eps'. Pass a kernels.NormCfg.")),
    Case("window: None for a required field of an optional struct", "D.window", "out, x, Window(size=None)",
         error=("TypeError", WINDOW + ".size: expected an int, got None. Pass an int.")),
    Case("window: float for an int field of an optional struct", "D.window", "out, x, Window(size=1.5)",
         flat="out, x, True, 1.5, 1.0, 1",
         error=("TypeError", WINDOW + ".size: expected an int, got float 1.5. Pass an int.")),
    # Enum values that are not the enum's (torch.ops takes any int for one:
    # the check is opforge's own, so there is no flat call to compare).
    Case("act_and_mul: enum value not allowed", "K.act_and_mul", "half, x, ActCfg(act=7)",
         error=("ValueError", "kernels::act_and_mul: parameter 'cfg', field kernels.ActCfg.act: 7 is not a member or "
                "value of kernels.Act. Pass one of kernels.Act.kSilu, kernels.Act.kGelu.")),
    Case("act_and_mul: enum name not allowed", "K.act_and_mul", "half, x, ActCfg(act='kRelu')",
         error=("ValueError", "kernels::act_and_mul: parameter 'cfg', field kernels.ActCfg.act: 'kRelu' is not a "
                "member or value of kernels.Act. Pass one of kernels.Act.kSilu, kernels.Act.kGelu.")),
    Case("window: enum value not allowed in an optional struct", "D.window", "out, x, Window(size=1, mode=5)",
         error=("ValueError", WINDOW + ".mode: 5 is not a member or value of differential_{mode}.Mode. Pass one of "
                "differential_{mode}.Mode.kAdd, differential_{mode}.Mode.kMul.")),
    # Errors of the kernels themselves.
    Case("scale_rows: stale handle", "K.scale_rows", "out, x, stale, [0, 0]", flat="out, x, stale, [0, 0]",
         by_kernel=True,
         error=("RuntimeError", "kernels::scale_rows: the CPU kernel, parameter 'table': handle {stale}: is stale: "
                "its object was released or is gone, or another process made it (a saved or exported program, a "
                "number passed by hand): a handle is this process's state. Pass the object itself, or register it "
                "in this process and use the new handle.")),
    Case("throws: std::invalid_argument", "M.throws", "x, 5", flat="x, 5", by_kernel=True, compiled=TRACED_KERNEL,
         error=(INVALID_ARGUMENT, "a bad argument")),
    Case("throws: std::out_of_range", "M.throws", "x, 4", flat="x, 4", by_kernel=True,
         compiled=INDEX_ERROR_COMPILED, error=("IndexError", "index 9 of 3")),
    Case("throws: an int", "M.throws", "x, 0", flat="x, 0", by_kernel=True, compiled=TRACED_KERNEL,
         error=("RuntimeError", NOT_STD)),
    Case("throws: a string literal", "M.throws", "x, 2", flat="x, 2", by_kernel=True, compiled=TRACED_KERNEL,
         error=("RuntimeError", NOT_STD)),
    Case("rms_norm: the kernel's own check", "K.rms_norm", "out, x, torch.ones(3), NormCfg()",
         flat="out, x, torch.ones(3), 1e-6, False", by_kernel=True,
         error=("RuntimeError", "rms_norm: weight must have the size of input's last dimension")),
    # Arguments that do not bind (Python's messages count the op as `self`).
    Case("throws: too many arguments", "M.throws", "x, 9, 1", flat="x, 9, 1",
         error=("TypeError", THROWS + "() takes 3 positional arguments but 4 were given")),
    Case("throws: too few arguments", "M.throws", "x", flat="x",
         error=("TypeError", THROWS + "() missing 1 required positional argument: 'kind'")),
    Case("throws: unknown keyword", "M.throws", "x, 9, bogus=1", flat="x, 9, bogus=1",
         error=("TypeError", THROWS + "() got an unexpected keyword argument 'bogus'")),
    Case("rms_norm: too many arguments", "K.rms_norm", "out, x, w, NormCfg(), 1",
         error=("TypeError", "kernels::rms_norm() takes 5 positional arguments but 6 were given")),
    Case("rms_norm: a flat leaf's name as a keyword", "K.rms_norm", "out, x, w, cfg__eps=0.5",
         error=("TypeError", "kernels::rms_norm() got an unexpected keyword argument 'cfg__eps'")),
]

CHILD = """
import json, sys, types
import torch, opforge

spec = json.load(sys.stdin)
mode = spec["mode"]
try:
    opforge.load_library(spec["mistakes"])
except RuntimeError:
    pass  # its blocks of wrong kernels are refused (test_cpp_mistakes.py); `throws` loads
opforge.load_library(spec["kernels"])
opforge.load_library(spec["differential"])
M, K, D = getattr(opforge.ops, "mistakes_" + mode), opforge.ops.kernels, getattr(opforge.ops, "differential_" + mode)
KS, DS = opforge.structs.kernels, getattr(opforge.structs, "differential_" + mode)
table = K.make_scale_table([1.0, 2.0, -3.0])
stale = K.make_scale_table([1.0])
assert opforge._C.handle_release(stale)
TENSORS = ("x", "w", "out", "half")
print("READY " + json.dumps({"stale": stale}), flush=True)


def env():
    # Fresh tensors for every call, so each path's writes are its own.
    return dict(M=M, K=K, D=D, NormCfg=KS.NormCfg, ActCfg=KS.ActCfg, Act=KS.Act, Window=DS.Window, Mode=DS.Mode,
                SimpleNamespace=types.SimpleNamespace, torch=torch, table=table, stale=stale,
                x=torch.arange(8.0).reshape(2, 4) - 3, w=torch.linspace(0.5, 2.0, 4), out=torch.zeros(2, 4),
                half=torch.zeros(2, 2), bind=lambda *a, **k: (a, k))


def describe(v):
    if isinstance(v, torch.Tensor):
        return ["Tensor", str(v.dtype), list(v.shape), v.tolist()]
    if isinstance(v, (list, tuple)):
        return [describe(i) for i in v]
    return [type(v).__name__, repr(v)]


def outcome(call, e):
    try:
        result = call(e)
    except Exception as exc:
        return [type(exc).__module__ + "." + type(exc).__qualname__, str(exc)]
    return ["ok", describe(result), {n: describe(e[n]) for n in TENSORS}]


graphs = []
eager = torch._dynamo.lookup_backend("eager")


def recording_eager(gm, inputs):  # the eager backend, noting the ops of each graph it gets
    graphs.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    return eager(gm, inputs)


for case in spec["cases"]:
    def op(e):
        return eval(case["op"], e)

    def call(e):
        a, k = eval("bind(" + case["args"] + ")", e)
        return op(e)(*a, **k)

    def compiled(e):
        fn = op(e)
        a, k = eval("bind(" + case["args"] + ")", e)

        def f(*a, **k):
            return fn(*a, **k)

        torch._dynamo.reset()
        return torch.compile(f, backend=recording_eager, fullgraph=False)(*a, **k)

    def flat(e):
        ns, name = op(e).name.split("::")
        a, k = eval("bind(" + case["flat"] + ")", e)
        return getattr(getattr(torch.ops, ns), name)(*a, **k)

    result = {"id": case["id"]}
    opforge.set_fast_path_enabled(True)
    result["fast"] = outcome(call, env())
    opforge.set_fast_path_enabled(False)
    result["dispatcher"] = outcome(call, env())
    opforge.set_fast_path_enabled(True)
    graphs.clear()
    result["compiled"] = outcome(compiled, env())
    result["traced"] = str(op(env()).overload) in graphs
    if case["flat"] is not None:
        result["flat"] = outcome(flat, env())
    print("CASE " + json.dumps(result), flush=True)
"""


def libraries(mode: str) -> dict:
    stable = "ON" if STABLE_BUILDS else "OFF"
    kernels = (build("examples/kernel_library", "kernel_library") if mode == "unstable" else
               build("examples/kernel_library", "kernel_library_stable", "KERNELS_STABLE=ON"))
    return {
        "mistakes": os.path.join(build("tests/cpp_ext/mistakes", "mistakes", f"MISTAKES_STABLE={stable}"),
                                 f"libopforge_test_mistakes_{mode}.so"),
        "kernels": os.path.join(kernels, "libopforge_kernels.so"),
        "differential": os.path.join(build("tests/cpp_ext/differential", "differential",
                                           f"DIFFERENTIAL_STABLE={stable}"),
                                     f"libopforge_test_differential_{mode}.so"),
    }


def run_corpus(mode: str, libs: dict) -> dict:
    """Each case's outcome on each path, by case id, and the stale handle
    ("stale"). A case whose call killed the child is {"died": exit status,
    "stderr": ...}; the cases after it run in a new child."""
    spec = {"mode": mode, **libs}
    remaining = [case.spec() for case in CORPUS]
    results: dict = {}
    while remaining:
        child = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps({**spec, "cases": remaining}),
                               capture_output=True, text=True, cwd=HERE, timeout=600)
        lines = child.stdout.splitlines()
        ready = [line for line in lines if line.startswith("READY ")]
        assert ready, f"the child did not start ({child.returncode}):\n{child.stdout}\n{child.stderr}"
        results["stale"] = json.loads(ready[0][len("READY "):])["stale"]
        for line in lines:
            if line.startswith("CASE "):
                result = json.loads(line[len("CASE "):])
                results[result["id"]] = result
        remaining = [case for case in remaining if case["id"] not in results]
        if remaining:
            assert child.returncode != 0, f"the child stopped early:\n{child.stdout}\n{child.stderr}"
            results[remaining.pop(0)["id"]] = {"died": child.returncode, "stderr": child.stderr[-4000:]}
    return results


@pytest.fixture(scope="module")
def outcomes():
    """outcomes(mode, case): that case's outcome on each path."""
    cache: dict = {}

    def get(mode: str, case: Case) -> dict:
        if not cache:
            # Builds one at a time (the modes share build folders), then both children at once.
            modes = [m for m in MODE_NAMES if m == "unstable" or STABLE_BUILDS]
            libs = {m: libraries(m) for m in modes}
            with concurrent.futures.ThreadPoolExecutor(len(modes)) as pool:
                cache.update(zip(modes, pool.map(lambda m: run_corpus(m, libs[m]), modes)))
        got = cache[mode][case.id]
        assert "died" not in got, f"the call killed the process ({got.get('died')}):\n{got.get('stderr')}"
        return {**got, "stale": cache[mode]["stale"]}

    return get


def params(select=lambda case: True) -> list:
    out = []
    for mode in MODE_NAMES:
        for case in filter(select, CORPUS):
            marks = []
            if mode == "stable" and not STABLE_BUILDS:
                marks.append(pytest.mark.skip(reason=f"needs torch 2.10 (this is {torch.__version__}): a stable-ABI "
                                                     f"library"))
            out.append(pytest.param(mode, case, id=f"{mode}-{re.sub(r'[^A-Za-z0-9]+', '_', case.id)}", marks=marks))
    return out


def expected(case: Case, mode: str, got: dict) -> list:
    """The eager outcome's type and message, as the child reports them."""
    kind, message = case.error
    return [f"builtins.{kind}", message.format(mode=mode, stale=got["stale"])]


def test_the_corpus_covers_every_kind_of_call():
    good = [c for c in CORPUS if c.error is None]
    bad = [c for c in CORPUS if c.error is not None]
    assert (len(CORPUS), len(good), len(bad)) == (40, 12, 28)
    assert {c.op[0] for c in CORPUS} == {"M", "K", "D"}
    assert len({c.id for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("mode, case", params())
def test_the_fast_path_and_the_dispatcher_give_the_same_outcome(outcomes, mode, case):
    got = outcomes(mode, case)
    if case.error is None:
        assert got["fast"][0] == "ok", got["fast"]
    else:
        assert got["fast"] == expected(case, mode, got)
    assert got["dispatcher"] == got["fast"]


@pytest.mark.parametrize("mode, case", params())
def test_a_compiled_call_gives_the_eager_outcome(outcomes, mode, case):
    got = outcomes(mode, case)
    fast, compiled = got["fast"], got["compiled"]
    if case.error is None:
        assert compiled == fast
        assert got["traced"] is case.traced
    elif case.compiled == SAME:
        # fullgraph=False: the boundary's own error, which Dynamo may follow
        # with where in the user's code it was raised.
        assert compiled[0] == fast[0], compiled
        assert fast[1] in compiled[1]
    else:
        assert case.compiled == TRACED_KERNEL
        assert compiled[0] == TORCH_RUNTIME_ERROR, compiled
        assert f"got {fast[0].split('.')[-1]}({fast[1]!r})" in compiled[1], compiled[1]


@pytest.mark.parametrize("mode, case", params(lambda case: case.flat is not None))
def test_a_flat_torch_ops_call_agrees(outcomes, mode, case):
    got = outcomes(mode, case)
    fast, flat = got["fast"], got["flat"]
    if case.error is None or case.by_kernel:
        assert flat == fast  # the same values, or the kernel's own error
    else:
        # torch's own check, with torch's message; a None for a Tensor passes
        # it, and the error is the kernel's (docs/python_ops.md, "The call boundary").
        assert flat[0] != "ok" and flat[1] != fast[1], flat
