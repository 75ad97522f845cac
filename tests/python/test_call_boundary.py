"""One call boundary: each case where the eager fast path and the dispatcher
path used to disagree, or the process crashed, now behaves the same on both
paths (and as torch's dispatcher does for the op's flat schema).

Crash cases run in a subprocess so that a regression fails the test instead
of taking pytest down with it (those that need no fresh process of their own
share one, tests/python/child_batch.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from child_batch import printed, run_batch
from op_testing import fast_path, ns, path  # noqa: F401

import opforge

Tensor = torch.Tensor


def outcome(fn, *args, **kwargs):
    """('ok', value) or (exception type, message)."""
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the test compares whatever is raised
        return type(e), str(e)


def on_both_paths(fn, *args, **kwargs):
    with fast_path(True):
        fast = outcome(fn, *args, **kwargs)
    with fast_path(False):
        slow = outcome(fn, *args, **kwargs)
    return fast, slow


def run_program(source: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
                          timeout=300)


# --- crashes ------------------------------------------------------------------


def _crash_cases() -> dict:
    cases = {}
    for fast, route in ((True, "fast"), (False, "dispatcher")):
        cases[f"inference {route}"] = f"""
            opforge.set_fast_path_enabled({fast})

            @opforge.op("kv_{route}::write", mutates_args=("cache",))
            def write(cache: torch.Tensor, x: torch.Tensor) -> None:
                cache.copy_(x)

            with torch.inference_mode():
                cache = torch.zeros(2)  # a KV cache allocated while serving
            try:
                write(cache, torch.ones(2))
            except RuntimeError as e:
                print("RuntimeError:", e)
            with torch.inference_mode():
                write(cache, torch.ones(2))
            print("inside inference_mode:", cache.tolist())
        """
        cases[f"too many {route}"] = f"""
            opforge.set_fast_path_enabled({fast})

            @opforge.op("ret_{route}::two")
            def two(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return x + 1, x + 2, x + 3

            with torch.profiler.profile():
                try:
                    two(torch.ones(1))
                except TypeError as e:
                    print("TypeError:", e)
        """
    return cases


@pytest.fixture(scope="module")
def crash_cases():
    """What each crash case printed, the cases sharing a child while none
    dies (tests/python/child_batch.py)."""
    results = run_batch("import torch, opforge", _crash_cases(), between="opforge.set_fast_path_enabled(True)")
    return lambda case_id: printed(results[case_id], case_id)


@pytest.mark.parametrize("route", ["fast", "dispatcher"])
def test_mutating_an_inference_tensor_outside_inference_mode_raises_torchs_error_instead_of_aborting(crash_cases, route):
    out = crash_cases(f"inference {route}")
    assert "RuntimeError: Inplace update to inference tensor outside InferenceMode is not allowed" in out
    assert "inside inference_mode: [1.0, 1.0]" in out


@pytest.mark.parametrize("route", ["fast", "dispatcher"])
def test_returning_too_many_tensors_is_an_error_naming_the_op_even_under_the_profiler(crash_cases, route):
    out = crash_cases(f"too many {route}")
    assert (f"TypeError: ret_{route}::two: return value: expected a tuple of 2 values, got tuple of 3. "
            "Return a tuple of 2 values.") in out


# Runners freed by the garbage collector at exit, or held by Dynamo's caches
# until the interpreter tears down opforge's modules.
@pytest.mark.parametrize("first_call, cycle", [("eager", True), ("compiled", False)],
                         ids=["eager-first-runners-in-cycles", "compiled-first"])
def test_a_program_whose_compiled_model_holds_runners_exits_quietly(first_call, cycle):
    result = run_program(f"""
        import torch, opforge

        class Runner:
            def __init__(self, k):
                self.k = k
                self.me = self if {cycle} else None

        @opforge.op("quiet::gemm")
        def gemm(x: torch.Tensor, r: opforge.Handle[Runner]) -> torch.Tensor:
            return x * r.k

        @gemm.register_fake
        def _(x, r):
            return torch.empty_like(x)

        class Layer(torch.nn.Module):
            def __init__(self, k):
                super().__init__()
                self.r = Runner(k)

            def forward(self, x):
                return gemm(x, self.r)

        model = torch.nn.Sequential(*[Layer(float(i)) for i in range(4)])
        if "{first_call}" == "eager":
            model(torch.ones(2))
        print(torch.compile(model, backend="eager", fullgraph=True)(torch.ones(2)).tolist())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0.0, 0.0]"
    assert "Exception ignored" not in result.stderr


# --- leaves converted as the dispatcher converts them ---------------------------


def test_an_int_for_a_float_parameter_is_converted_on_both_paths(ns):
    @opforge.op(f"{ns}::scale")
    def scale(x: Tensor, s: float, n: int) -> Tensor:
        return x * s * n

    fast, slow = on_both_paths(scale, torch.arange(3), 2, 1)
    assert fast[0] == "ok" and slow[0] == "ok"
    assert fast[1].dtype == slow[1].dtype == torch.float32
    assert torch.equal(fast[1], torch.tensor([0.0, 2.0, 4.0])) and torch.equal(slow[1], fast[1])


def test_a_float_for_an_int_parameter_is_the_same_type_error_on_both_paths(ns):
    @opforge.op(f"{ns}::scale")
    def scale(x: Tensor, s: float, n: int) -> Tensor:
        return x * s * n

    fast, slow = on_both_paths(scale, torch.ones(1), 2.0, 1.5)
    assert fast == slow == (TypeError, f"{ns}::scale: parameter 'n': expected an int, got float 1.5. Pass an int.")


@dataclass(frozen=True)
class Dims:
    scale: float
    dims: list[int] = dataclasses.field(default_factory=lambda: [0])


def test_a_tuple_for_a_list_reaches_the_body_as_a_list_on_both_paths_at_any_depth(ns):
    seen = []

    @opforge.op(f"{ns}::lst")
    def lst(x: Tensor, dims: list[int], cfg: Dims) -> Tensor:
        seen.append((dims, cfg.dims))
        return x.clone()

    for enabled in (True, False):
        with fast_path(enabled):
            lst(torch.ones(1), (1, 2), Dims(1.0, (3,)))
    assert seen == [([1, 2], [3]), ([1, 2], [3])]
    assert all(type(d) is list and type(c) is list for d, c in seen)


# --- structs ------------------------------------------------------------------


@dataclass(frozen=True)
class Cfg:
    scale: float


@dataclass(frozen=True)
class Other:
    scale: float


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Other(1.0), "parameter 'cfg': expected a Cfg instance, got Other Other(scale=1.0). Pass a Cfg instance."),
        (Cfg("a"), "parameter 'cfg', field Cfg.scale: expected a float, got str 'a'. Pass a float."),
        (None, "parameter 'cfg': expected a Cfg, got None. Pass a Cfg."),
    ],
    ids=["another_class", "str_in_a_float_field", "none"],
)
def test_a_wrong_struct_is_the_same_type_error_on_both_paths(ns, value, expected):
    @opforge.op(f"{ns}::st")
    def st(x: Tensor, cfg: Cfg) -> Tensor:
        return x * cfg.scale

    fast, slow = on_both_paths(st, torch.ones(1), value)
    assert fast == slow == (TypeError, f"{ns}::st: {expected}")


def test_an_unknown_keyword_names_the_op(ns, path):
    @opforge.op(f"{ns}::st")
    def st(x: Tensor, cfg: Cfg) -> Tensor:
        return x * cfg.scale

    with pytest.raises(TypeError, match=rf"^{ns}::st\(\) got an unexpected keyword argument 'bogus'$"):
        st(torch.ones(1), Cfg(1.0), bogus=1)


# --- the body runs as a kernel on both paths -------------------------------------


def test_a_body_runs_below_autograd_on_both_paths_so_autograd_grad_inside_fails_alike(ns):
    # As in any torch kernel: the body runs with the autograd keys excluded,
    # so a backward belongs in backward=, not in the body.
    @opforge.op(f"{ns}::g", backward=lambda ctx, g: g * 3)
    def g(x: Tensor) -> Tensor:
        with torch.enable_grad():
            w = torch.ones(2, requires_grad=True)
            (gw,) = torch.autograd.grad((w * 3).sum(), w)
        return x * gw

    fast, slow = on_both_paths(g, torch.ones(2, requires_grad=True))
    assert fast == slow
    assert fast[0] is RuntimeError and "does not require grad" in fast[1]


def test_mkldnn_tensors_pick_the_same_kernel_on_both_paths(ns):
    @opforge.op(f"{ns}::which")
    def which(x: Tensor) -> Tensor:
        return x.clone()

    @which.register_kernel("cpu")
    def _(x):
        return x.clone() + 1

    x = torch.ones(2, 2).to_mkldnn()
    fast, slow = on_both_paths(which, x)
    assert fast[0] == slow[0] == "ok"
    assert torch.equal(fast[1].to_dense(), slow[1].to_dense())
    assert torch.equal(which(torch.ones(1)), torch.full((1,), 2.0))


def test_a_mutation_below_ad_inplace_or_view_bumps_the_version_alike_on_both_paths(ns):
    @opforge.op(f"{ns}::mut", mutates_args=("x",))
    def mut(x: Tensor) -> None:
        x.add_(1)

    deltas = []
    for enabled in (True, False):
        x = torch.zeros(2)
        before = x._version
        with fast_path(enabled), torch._C._AutoDispatchBelowADInplaceOrView():
            mut(x)
        deltas.append(x._version - before)
        assert torch.equal(x, torch.ones(2))
    assert deltas[0] == deltas[1]


# --- decoration ------------------------------------------------------------------


def test_a_non_ascii_str_default_registers_and_reaches_torch_ops_callers(ns, path):
    @opforge.op(f"{ns}::greet")
    def greet(x: Tensor, word: str = "été") -> Tensor:
        return x + len(word)

    assert torch.equal(greet(torch.zeros(1)), torch.full((1,), 3.0))
    assert torch.equal(getattr(torch.ops, ns).greet(torch.zeros(1)), torch.full((1,), 3.0))


def test_an_int_parameter_with_a_float_default_is_rejected(ns):
    with pytest.raises(TypeError, match=rf"^{ns}::f: parameter 'n' \(its default\): expected an int, got float "
                                        r"1.5. Change the default to an int, or the annotation.$"):

        @opforge.op(f"{ns}::f")
        def f(x: Tensor, n: int = 1.5) -> Tensor:
            return x * n

    assert not hasattr(getattr(torch.ops, ns), "f")


@dataclass(frozen=True)
class Node:
    value: float
    next: Optional[Node] = None


def test_a_recursive_struct_is_a_short_error_naming_the_cycle(ns):
    with pytest.raises(TypeError) as info:

        @opforge.op(f"{ns}::walk")
        def walk(x: Tensor, node: Node) -> Tensor:
            return x * node.value

    message = str(info.value)
    assert message == (f"{ns}::walk: parameter 'node', field Node.next: dataclass Node contains itself, which a "
                       f"flat schema cannot express. Break the cycle: pass the nested part as its own parameter.")
    assert not hasattr(getattr(torch.ops, ns), "walk")


@pytest.mark.parametrize("what", ["fake", "backward", "setup_context"])
def test_a_hook_that_is_not_callable_is_rejected(ns, what):
    with pytest.raises(TypeError, match=rf"^{ns}::f: {what}= must be a function written against the op's "
                                        r"signature, not int 3."):
        opforge.op(f"{ns}::f", **{what: 3})(lambda x: x)
    assert not hasattr(getattr(torch.ops, ns), "f")


def test_a_required_structs_field_defaults_reach_torch_ops_callers(ns):
    @opforge.op(f"{ns}::affine")
    def affine(x: Tensor, cfg: Dims) -> Tensor:
        return x.sum(cfg.dims) * cfg.scale

    assert affine.schema == f"{ns}::affine(Tensor x, float cfg__scale, SymInt[] cfg__dims=[0]) -> Tensor"
    out = getattr(torch.ops, ns).affine(torch.ones(2, 3), 2.0)
    assert torch.equal(out, torch.full((3,), 4.0))


@dataclass(frozen=True)
class Inner:
    w: float


@dataclass(frozen=True)
class WithInner:
    scale: float
    inner: Inner
    maybe: Optional[Inner] = None


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (WithInner(None, Inner(1.0)), "parameter 'cfg', field WithInner.scale: expected a float, got None. "
                                      "Pass a float."),
        (WithInner(2.0, None), "parameter 'cfg', field WithInner.inner: expected a Inner, got None. Pass a Inner."),
        (WithInner(2.0, Inner(1.0), Inner(None)), "parameter 'cfg', field WithInner.maybe, field Inner.w: expected "
                                                  "a float, got None. Pass a float."),
    ],
    ids=["scalar_field", "struct_field", "field_of_an_optional_struct_field"],
)
def test_none_for_a_required_field_of_an_optional_struct_never_reaches_the_body_compiled(ns, cfg, expected):
    seen = []

    @opforge.op(f"{ns}::opt_field")
    def opt_field(x: Tensor, cfg: Optional[WithInner] = None) -> None:
        seen.append(cfg)

    def call(t):
        opt_field(t, cfg)

    assert outcome(opt_field, torch.ones(1), cfg) == (TypeError, f"{ns}::opt_field: {expected}")
    torch._dynamo.reset()
    # With graph breaks allowed, the boundary's own error; with fullgraph,
    # Dynamo reports that the traced code raised.
    assert outcome(torch.compile(call, backend="eager"), torch.ones(1)) == (TypeError, f"{ns}::opt_field: {expected}")
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(call, backend="eager", fullgraph=True)(torch.ones(1))
    # Dynamo's report carries the boundary's message (it said a C++ function was skipped).
    assert f"{ns}::opt_field: {expected}" in str(info.value)
    assert seen == []


@dataclass(frozen=True)
class Step:
    size: torch.types.Number


def test_a_scalar_field_keeps_each_calls_python_type_on_every_path(ns, path):
    # Struct instances are reused for leaf values that compare equal; 1, 1.0
    # and True compare equal, so a Scalar leaf must never key that reuse.
    seen = []

    @opforge.op(f"{ns}::step")
    def step(x: Tensor, cfg: Step) -> Tensor:
        seen.append(type(cfg.size))
        return x * cfg.size

    flat = getattr(torch.ops, ns).step
    for value in (1, 1.0, True, 1):
        step(torch.ones(1), Step(value))
        flat(torch.ones(1), value)
    assert seen == [int, int, float, float, bool, bool, int, int]


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64])
def test_an_int_past_64_bits_says_so(ns, value):
    @opforge.op(f"{ns}::shift")
    def shift(x: Tensor, n: int, ns_: list[int]) -> Tensor:
        return x + n

    expected = (OverflowError, f"{ns}::shift: parameter 'n': int {value} is outside the range of torch's int "
                               f"(64-bit: -2**63 to 2**63-1). Pass a value in that range, or a float or Tensor "
                               f"parameter for larger values.")
    assert on_both_paths(shift, torch.ones(1), value, [1]) == (expected, expected)
    assert outcome(shift, torch.ones(1), 2**63 - 1, [1])[0] == "ok"
    kind, message = outcome(shift, torch.ones(1), 1, [1, value])
    assert kind is TypeError and message.startswith(f"{ns}::shift: parameter 'ns_'")


@dataclass(frozen=True)
class Scaled:
    scale: float
    n: int = 1


@pytest.mark.parametrize(("args", "error"), [
    (("a", 1), (TypeError, "parameter 'x': expected a Tensor, got str 'a'. Pass a Tensor.")),
    ((None, 1), (TypeError, "parameter 'x': expected a Tensor, got None. Pass a Tensor.")),
    ((1.0, 1), (TypeError, "parameter 'x': expected a Tensor, got float 1.0. Pass a Tensor.")),
    (("T", 1.5), (TypeError, "parameter 'k': expected an int, got float 1.5. Pass an int.")),
    (("T", 2**64), (OverflowError, "parameter 'k': int 18446744073709551616 is outside the range of torch's int")),
    (("T", 1, Scaled("a")), (TypeError, "parameter 'cfg', field Scaled.scale: expected a float, got str 'a'.")),
    (("T", 1, None, [1, 1.5]), (TypeError, "parameter 'ls': expected a list of int, got list [1, 1.5].")),
    (("T", 1, None, [1], 3), (TypeError, "parameter 's': expected a str, got int 3. Pass a str.")),
], ids=["str_tensor", "none_tensor", "float_tensor", "float_int", "int_past_64_bits", "field", "list_item", "int_str"])
def test_a_bad_leaf_value_is_the_boundarys_error_compiled_as_eager(ns, args, error):
    @opforge.op(f"{ns}::leafy", fake=lambda x, k, cfg=None, ls=(1,), s="a": torch.empty_like(x))
    def leafy(x: Tensor, k: int, cfg: Optional[Scaled] = None, ls: list[int] = (1,), s: str = "a") -> Tensor:
        return x * k

    args = tuple(torch.ones(2) if a == "T" else a for a in args)
    kind, text = error
    eager = outcome(leafy, *args)
    assert eager[0] is kind and eager[1].startswith(f"{ns}::leafy: {text}"), eager
    torch._dynamo.reset()
    assert outcome(torch.compile(leafy, backend="eager"), *args) == eager
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:  # Dynamo's report that the traced call raised it
        torch.compile(leafy, backend="eager", fullgraph=True)(*args)
    assert f"{ns}::leafy: {text}" in str(info.value)
    torch._dynamo.reset()
    good = torch.compile(leafy, backend="eager", fullgraph=True)(torch.ones(2), 3, Scaled(2.0), [1, 2], "b")
    assert torch.equal(good, torch.full((2,), 3.0))
