"""A warm compile cache never stands for an op's old definition
(docs/compile_cache.md): processes that share one TORCHINDUCTOR_CACHE_DIR,
with one thing about each op changed between them, on both of opforge's
routes into a compiled graph (the op as one node of Dynamo's graph, and the
traced call of an op Dynamo cannot name).

    process 1: version 1 of every op     (fills the caches)
    process 2: version 2, each op changed in one way
    process 3: version 2 again           (nothing changed: every graph hits)
    process 4: version 2, one op's body changed (the body is not keyed: every graph hits)

Every compiled output (value, dtype, shape, the mutated argument, the
gradient) must equal the eager output of its own process.
`torch.library.custom_op` versions of four cases run beside them as
controls; their outcomes are printed, not asserted (torch's own caches get
some of them wrong: pytorch#160472, #187319, #144344).

A C++ library (tests/cpp_ext/compile_cache) is built three times from one
source: definition 1, definition 2 (an Enum member put in front, a struct
field's and a parameter's default changed), and definition 2 with only its
kernels changed. Processes that load one build each share another cache:
the second must miss and compute what eager does, the third must hit.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from cpp_ext import build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One copy at the module's top level (found by module and qualified name: one
# node of Dynamo's graph) and one inside a function (traced). V is the version.
OPS = '''
Mode = enum.Enum("Mode", {"GELU": 1, "RELU": 2} if V == 1 else {"TANH": 1, "GELU": 2, "RELU": 3},
                 module=__name__, qualname=QUAL + "Mode")
Speed = enum.Enum("Speed", {"FAST": "fast"} if V == 1 else {"FAST": "fast2"}, module=__name__,
                  qualname=QUAL + "Speed")
FACTOR = {"GELU": 10.0, "RELU": 20.0, "TANH": 30.0}


@dataclasses.dataclass(frozen=True)
class Cfg:
    scale: float = 2.0 if V == 1 else 3.0


@dataclasses.dataclass(frozen=True)
class ModeCfg:
    mode: Mode = Mode.GELU


if V == 1:
    @dataclasses.dataclass(frozen=True)
    class Grow:
        a: float = 1.0
else:
    @dataclasses.dataclass(frozen=True)
    class Grow:
        a: float = 1.0
        b: float = 5.0

if V == 1:
    @opforge.op(NS + "::dtype", fake=lambda x: torch.empty_like(x))
    def dtype(x: Tensor) -> Tensor:
        return x * 2
else:
    @opforge.op(NS + "::dtype", fake=lambda x: torch.empty_like(x, dtype=torch.float64))
    def dtype(x: Tensor) -> Tensor:
        return (x * 2).double()

if V == 1:
    @opforge.op(NS + "::shape", fake=lambda x: x.new_empty(2))
    def shape(x: Tensor) -> Tensor:
        return x[:2] * 1
else:
    @opforge.op(NS + "::shape", fake=lambda x: x.new_empty(3))
    def shape(x: Tensor) -> Tensor:
        return x[:3] * 1


@opforge.op(NS + "::field_default", fake=lambda x, cfg: torch.empty_like(x))
def field_default(x: Tensor, cfg: Cfg) -> Tensor:
    return x * cfg.scale


@opforge.op(NS + "::param_default", fake=lambda x, s=0.0: torch.empty_like(x))
def param_default(x: Tensor, s: float = 2.0 if V == 1 else 3.0) -> Tensor:
    return x * s


@opforge.op(NS + "::grow", fake=lambda x, g: torch.empty_like(x))
def grow(x: Tensor, g: Grow) -> Tensor:
    return x * g.a + getattr(g, "b", 0.0)


@opforge.op(NS + "::enum_param", fake=lambda x, m: torch.empty_like(x))
def enum_param(x: Tensor, m: Mode) -> Tensor:
    return x * FACTOR[m.name]


@opforge.op(NS + "::enum_field", fake=lambda x, cfg: torch.empty_like(x))
def enum_field(x: Tensor, cfg: ModeCfg) -> Tensor:
    return x * FACTOR[cfg.mode.name]


@opforge.op(NS + "::str_enum", fake=lambda x, s: torch.empty_like(x))
def str_enum(x: Tensor, s: Speed) -> Tensor:
    return x * 7


if V == 1:
    @opforge.op(NS + "::mutation", fake=lambda x, buf: torch.empty_like(x))
    def mutation(x: Tensor, buf: Tensor) -> Tensor:
        return x + 1
else:
    @opforge.op(NS + "::mutation", mutates_args=("buf",), fake=lambda x, buf: torch.empty_like(x))
    def mutation(x: Tensor, buf: Tensor) -> Tensor:
        buf.add_(1)
        return x + 1


@opforge.op(NS + "::backward", fake=lambda x: torch.empty_like(x),
            backward=lambda ctx, g: g * (2.0 if V == 1 else 3.0))
def backward(x: Tensor) -> Tensor:
    return x * 2


@opforge.op(NS + "::body", fake=lambda x: torch.empty_like(x))
def body(x: Tensor) -> Tensor:
    return x * BODY


def models():
    """name -> (function to compile, its inputs)"""
    return {
        "fake dtype": (lambda x: dtype(x) + 1, lambda: [torch.arange(4.0)]),
        "fake shape": (lambda x: shape(x) + 1, lambda: [torch.arange(4.0)]),
        "struct field default": (lambda x: field_default(x, Cfg()), lambda: [torch.arange(4.0)]),
        "parameter default": (lambda x: param_default(x), lambda: [torch.arange(4.0)]),
        "struct gains a field": (lambda x: grow(x, Grow()), lambda: [torch.arange(4.0)]),
        "int Enum values, parameter": (lambda x: enum_param(x, Mode.GELU), lambda: [torch.arange(4.0)]),
        "int Enum values, struct field": (lambda x: enum_field(x, ModeCfg(Mode.GELU)), lambda: [torch.arange(4.0)]),
        "str Enum values": (lambda x: str_enum(x, Speed.FAST), lambda: [torch.arange(4.0)]),
        "mutates_args, argument read before": (read_then_mutate(mutation), lambda: [torch.arange(4.0), torch.ones(4)]),
        "backward": (lambda x: backward(x).sum(), lambda: [torch.arange(4.0, requires_grad=True)]),
        "the body alone": (lambda x: body(x), lambda: [torch.arange(4.0)]),
    }
'''

CONTROLS = '''
if V == 1:
    @torch.library.custom_op("ctl_cc::dtype", mutates_args=())
    def c_dtype(x: Tensor) -> Tensor:
        return x * 2
    c_dtype.register_fake(lambda x: torch.empty_like(x))
else:
    @torch.library.custom_op("ctl_cc::dtype", mutates_args=())
    def c_dtype(x: Tensor) -> Tensor:
        return (x * 2).double()
    c_dtype.register_fake(lambda x: torch.empty_like(x, dtype=torch.float64))


@torch.library.custom_op("ctl_cc::param_default", mutates_args=())
def c_param_default(x: Tensor, s: float = 2.0 if V == 1 else 3.0) -> Tensor:
    return x * s
c_param_default.register_fake(lambda x, s=0.0: torch.empty_like(x))

if V == 1:
    @torch.library.custom_op("ctl_cc::mutation", mutates_args=())
    def c_mutation(x: Tensor, buf: Tensor) -> Tensor:
        return x + 1
else:
    @torch.library.custom_op("ctl_cc::mutation", mutates_args=("buf",))
    def c_mutation(x: Tensor, buf: Tensor) -> Tensor:
        buf.add_(1)
        return x + 1
c_mutation.register_fake(lambda x, buf: torch.empty_like(x))


@torch.library.custom_op("ctl_cc::backward", mutates_args=())
def c_backward(x: Tensor) -> Tensor:
    return x * 2
c_backward.register_fake(lambda x: torch.empty_like(x))
c_backward.register_autograd(lambda ctx, g: g * (2.0 if V == 1 else 3.0))

CONTROL_MODELS = {
    "fake dtype": (lambda x: c_dtype(x) + 1, lambda: [torch.arange(4.0)]),
    "parameter default": (lambda x: c_param_default(x), lambda: [torch.arange(4.0)]),
    "mutates_args, argument read before": (read_then_mutate(c_mutation), lambda: [torch.arange(4.0), torch.ones(4)]),
    "backward": (lambda x: c_backward(x).sum(), lambda: [torch.arange(4.0, requires_grad=True)]),
}
'''

MODULE = '''
import dataclasses, enum
import torch
from torch import Tensor
import opforge

V = {version}
BODY = {body}
{read_then_mutate}

NS, QUAL = "cc_one", ""
{top}


def _traced():
    NS, QUAL = "cc_traced", "_traced.<locals>."
{inner}
    return models(), dtype


TRACED, TRACED_DTYPE = _traced()
'''

CONTROL_MODULE = '''
import torch
from torch import Tensor

V = {version}
{read_then_mutate}
{controls}
'''

READ_THEN_MUTATE = '''

def read_then_mutate(op):
    def model(x, buf):
        before = buf * 1
        y = op(x, buf)
        return before + y + buf
    return model
'''

CHILD = r'''
import json, sys
import torch
from torch._dynamo.utils import counters
if sys.argv[1] == "controls":
    import cc_control as cc_model
elif sys.argv[1] != "cpp":
    import cc_model
    import opforge


def outcome(fn, inputs):
    """(eager, compiled) results: value, dtype, shape, mutated inputs, gradients."""
    def run(f):
        args = inputs()
        out = f(*args)
        grads = []
        if any(a.requires_grad for a in args):
            out.backward()
            grads = [a.grad.tolist() for a in args if a.requires_grad]
        return {"out": out.tolist() if out.dim() else out.item(), "dtype": str(out.dtype),
                "shape": list(out.shape), "args": [a.detach().tolist() for a in args], "grads": grads}
    try:
        eager = run(fn)
    except Exception as e:  # noqa: BLE001
        eager = {"error": f"{type(e).__name__}: {e}"}
    torch._dynamo.reset()
    before = {k: sum(counters[g][k] for g in ("inductor", "aot_autograd")) for k in
              ("fxgraph_cache_hit", "fxgraph_cache_miss", "autograd_cache_hit", "autograd_cache_miss")}
    try:
        compiled = run(torch.compile(fn, fullgraph=True))
    except Exception as e:  # noqa: BLE001
        compiled = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    after = {k: sum(counters[g][k] for g in ("inductor", "aot_autograd")) for k in before}
    hits = after["fxgraph_cache_hit"] - before["fxgraph_cache_hit"] + \
        after["autograd_cache_hit"] - before["autograd_cache_hit"]
    misses = after["fxgraph_cache_miss"] - before["fxgraph_cache_miss"] + \
        after["autograd_cache_miss"] - before["autograd_cache_miss"]
    return {"eager": eager, "compiled": compiled, "hits": hits, "misses": misses}


result = {}
if sys.argv[1] == "cpp":
    import opforge
    opforge.load_library(sys.argv[2])
    ops, S = opforge.ops.cc_cpp, opforge.structs.cc_cpp
    x4 = lambda: [torch.arange(4.0)]
    table = {
        # Act.kGelu passed: its flat value (1, then 2) is a constant of the graph, so the graphs differ anyway.
        "int Enum values, parameter": (lambda x: ops.act_param(x, S.Act.kGelu), x4),
        # The field's default, Act.kSilu: its flat value (0, then 1) is the schema's default, which a
        # traced graph leaves out, so only the key can tell the two builds' graphs apart.
        "int Enum values, struct field": (lambda x: ops.act_field(x, S.ActCfg()), x4),
        "struct field default": (lambda x: ops.field_default(x, S.ScaleCfg()), x4),
        "parameter default": (lambda x: ops.param_default(x), x4),
        "the body alone": (lambda x: ops.body(x), x4),
    }
    for case, (fn, inputs) in table.items():
        result[f"cpp: {case}"] = outcome(fn, inputs)
    result["digests"] = {name: opforge._cache_key.digest(getattr(ops, name)) for name in
                         ("act_param", "act_field", "field_default", "param_default", "body")}
elif sys.argv[1] == "controls":
    for case, (fn, inputs) in cc_model.CONTROL_MODELS.items():
        result[f"custom_op control: {case}"] = outcome(fn, inputs)
else:
    for route, table in (("one node", cc_model.models()), ("traced", cc_model.TRACED)):
        for case, (fn, inputs) in table.items():
            result[f"{route}: {case}"] = outcome(fn, inputs)
    result["admitted"] = [opforge._in_graph.admitted(cc_model.dtype),
                          opforge._in_graph.admitted(cc_model.TRACED_DTYPE)]
print("RESULT " + json.dumps(result))
'''


def write_modules(directory, version: int, body: float) -> None:
    ops = textwrap.dedent(OPS)
    with open(os.path.join(directory, "cc_model.py"), "w") as f:
        f.write(MODULE.format(version=version, body=body, top=ops, inner=textwrap.indent(ops, "    "),
                              read_then_mutate=READ_THEN_MUTATE))
    with open(os.path.join(directory, "cc_control.py"), "w") as f:
        f.write(CONTROL_MODULE.format(version=version, controls=textwrap.dedent(CONTROLS),
                                      read_then_mutate=READ_THEN_MUTATE))


def run_process(directory, cache, version: int, body: float, what: str = "opforge") -> dict:
    write_modules(directory, version, body)
    return run_child(directory, cache, what)


def run_child(directory, cache, *argv: str) -> dict:
    """The CHILD script with `argv`, on the compile cache `cache`, importing from `directory`."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
           "TORCHINDUCTOR_AUTOGRAD_CACHE": "1", "PYTHONPATH": str(directory), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=600, env=env,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    directory, cache = tmp_path_factory.mktemp("model"), tmp_path_factory.mktemp("cache")
    runs = [run_process(directory, cache, *how) for how in ((1, 2.0), (2, 2.0), (2, 2.0), (2, 5.0))]
    # torch's own custom_op, in processes of their own on another cache: what torch's caches do without opforge.
    control_cache = tmp_path_factory.mktemp("control_cache")
    runs.append([run_process(directory, control_cache, v, 2.0, "controls") for v in (1, 2)][-1])
    return runs


CASES = ["fake dtype", "fake shape", "struct field default", "parameter default", "struct gains a field",
         "int Enum values, parameter", "int Enum values, struct field", "str Enum values",
         "mutates_args, argument read before", "backward", "the body alone"]
ROUTES = ["one node", "traced"]


def test_the_ops_take_both_routes(runs):
    # The top-level copy is one node of Dynamo's graph; the function-local one is traced.
    assert runs[0]["admitted"] == [True, False]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", CASES)
def test_a_changed_definition_compiles_what_eager_computes(runs, route, case):
    for number, run in enumerate(runs[:4], 1):
        got = run[f"{route}: {case}"]
        assert "error" not in got["eager"], got["eager"]
        assert got["compiled"] == got["eager"], f"process {number}: {got}"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", CASES)
def test_the_first_process_misses_and_a_changed_op_misses(runs, route, case):
    # (A backward graph that does not call the op may be one another case of the same process cached.)
    first, changed = runs[0][f"{route}: {case}"], runs[1][f"{route}: {case}"]
    assert first["misses"] > 0, first
    assert changed["misses"] > 0, changed


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", CASES)
def test_nothing_changed_or_only_a_body_changed_hits(runs, route, case):
    for run in runs[2:4]:
        got = run[f"{route}: {case}"]
        assert got["misses"] == 0 and got["hits"] > 0, got
    # The changed body runs: the cached code calls the op.
    assert runs[3][f"{route}: the body alone"]["compiled"]["out"] == [0.0, 5.0, 10.0, 15.0]


def test_the_custom_op_controls_are_printed(runs, capsys):
    with capsys.disabled():
        print()
        for case in ("fake dtype", "parameter default", "mutates_args, argument read before", "backward"):
            got = runs[4][f"custom_op control: {case}"]
            same = got["compiled"] == got["eager"]
            print(f"  torch.library.custom_op, {case}: second process "
                  f"{'right' if same else 'WRONG'} ({got['hits']} cache hits)")
    assert all(f"custom_op control: {c}" in runs[4] for c in ("fake dtype", "backward"))


# The C++ library's builds: (CC_VERSION, CC_BODY) -> the .so, built once per torch release.
CPP_BUILDS = ((1, 1), (2, 1), (2, 5))
CPP_CASES = ["int Enum values, parameter", "int Enum values, struct field", "struct field default",
             "parameter default", "the body alone"]


@pytest.fixture(scope="module")
def cpp_runs(tmp_path_factory):
    libs = [os.path.join(build("tests/cpp_ext/compile_cache", f"compile_cache_v{v}_body{b}", f"CC_VERSION={v}",
                               f"CC_BODY={b}"), "libopforge_test_compile_cache.so") for v, b in CPP_BUILDS]
    directory, cache = tmp_path_factory.mktemp("cpp_model"), tmp_path_factory.mktemp("cpp_cache")
    return [run_child(directory, cache, "cpp", lib) for lib in libs]


@pytest.mark.parametrize("case", CPP_CASES)
def test_a_cpp_op_changed_between_two_builds_compiles_what_eager_computes(cpp_runs, case):
    first, changed, body = (run[f"cpp: {case}"] for run in cpp_runs)
    for number, got in enumerate((first, changed, body), 1):
        assert "error" not in got["eager"], got["eager"]
        assert got["compiled"] == got["eager"], f"build {number}: {got}"
    assert first["misses"] > 0 and changed["misses"] > 0, (first, changed)
    # Only the kernels changed (every value times 5): every graph hits, and the new kernel runs.
    assert body["misses"] == 0 and body["hits"] > 0, body
    assert body["compiled"]["out"] == [5 * v for v in changed["compiled"]["out"]]


def test_each_cpp_ops_digest_follows_its_definition_not_its_kernel(cpp_runs):
    # Each changed op's own digest moves (the key does not only move because another op changed).
    v1, v2, body = (run["digests"] for run in cpp_runs)
    assert {name for name in v1 if v1[name] != v2[name]} == {"act_param", "act_field", "field_default",
                                                             "param_default"}
    assert body == v2
    # The Enum's new member is what moved the Enum cases: Act.kGelu is 1 in build 1, 2 in build 2.
    assert cpp_runs[0]["cpp: int Enum values, parameter"]["eager"]["out"] == [0.0, 20.0, 40.0, 60.0]
    assert cpp_runs[1]["cpp: parameter default"]["eager"]["out"] == [0.0, 3.0, 6.0, 9.0]
