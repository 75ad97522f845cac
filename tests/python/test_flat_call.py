"""_C.FlatCall (cpp/src/python/op_object.cc): an op's flat call from C, which
the code Inductor emits for symm-mem ops calls (docs/symm_mem.md). Every call
must give what `overload(*args, **kwargs)` gives: the same result, the same
error, the same overrides seen. Differential over a corpus of calls."""

from __future__ import annotations

import gc

import pytest
import torch
from op_testing import ns  # noqa: F401
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from opforge import _C


@pytest.fixture
def lib(ns):
    lib = torch.library.Library(ns, "DEF")
    lib.define("mix(Tensor x, int[] dims, float scale=2., *, Tensor? bias=None, str mode='sum', bool flag=False) "
               "-> Tensor")
    lib.define("pair(Tensor[] xs, SymInt n) -> (Tensor, Tensor)")
    lib.define("nothing(Tensor(a!) x, Scalar s) -> ()")
    lib.define("fails(Tensor x) -> Tensor")

    def mix(x, dims, scale=2.0, *, bias=None, mode="sum", flag=False):
        out = x.sum(dims) * scale if mode == "sum" else x.amax(dims) * scale
        return (out + bias if bias is not None else out) + int(flag)

    lib.impl("mix", mix, "CPU")
    lib.impl("pair", lambda xs, n: (torch.stack(xs) * n, torch.cat(xs)), "CPU")
    def nothing(x, s):
        x.add_(s)

    lib.impl("nothing", nothing, "CPU")

    def fails(x):
        raise ValueError(f"fails: bad input of shape {tuple(x.shape)}")

    lib.impl("fails", fails, "CPU")
    yield getattr(torch.ops, ns)
    lib._destroy()


def outcome(fn, *args, **kwargs):
    """What a call gives: its value, or its error's type and message."""
    try:
        return ("value", fn(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - the errors are compared
        return ("error", type(e), str(e))


def assert_same(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert a[1:] == b[1:]
    else:
        torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)


X = torch.arange(12.0).reshape(3, 4)
CALLS = [
    ("mix", (X, [0]), {}),
    ("mix", (X, [1], 0.5), {}),
    ("mix", (X, (0, 1)), {"bias": torch.ones(()), "mode": "max", "flag": True}),
    ("mix", (X,), {"dims": [1], "scale": 3.0}),
    ("mix", (X, [0], 1), {}),                      # an int for a float: torch converts it
    ("mix", (X, [0]), {"bias": None}),
    ("mix", (X, [0], "a"), {}),                    # wrong type
    ("mix", (X, [0]), {"nope": 1}),                # unknown keyword
    ("mix", (X, [0], 1.0, None), {}),              # a keyword-only argument given by position
    ("mix", (X,), {}),                             # missing argument
    ("mix", (), {"x": X, "dims": [0]}),
    ("mix", (X, [0]), {"dims": [1]}),              # given twice
    ("mix", (3, [0]), {}),                         # a number for a Tensor
    ("mix", (X, "01"), {}),
    ("mix", (X, [0], 2.0 ** 70), {}),
    ("mix", (X, [2 ** 70]), {}),
    ("mix", (X, [0]), {"mode": "max", "flag": 1}),
    ("pair", ([X, X + 1], 2), {}),
    ("pair", ((X,), 3), {}),
    ("pair", ([X, None], 2), {}),
    ("pair", ([], 2), {}),
    ("fails", (X,), {}),
]


@pytest.mark.parametrize("name,args,kwargs", CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CALLS)])
def test_a_call_gives_what_torch_ops_gives(lib, name, args, kwargs):
    overload = getattr(lib, name).default
    flat = _C.FlatCall(overload)
    assert_same(outcome(flat, *args, **kwargs), outcome(overload, *args, **kwargs))


def test_aten_ops_with_keyword_only_arguments():
    overload = torch.ops.aten.sum.dim_IntList
    flat = _C.FlatCall(overload)
    for args, kwargs in [((X, [1]), {}), ((X, [0], True), {"dtype": torch.float64}), ((X, None), {"keepdim": True})]:
        assert_same(outcome(flat, *args, **kwargs), outcome(overload, *args, **kwargs))
    add = _C.FlatCall(torch.ops.aten.add.Tensor)
    assert torch.equal(add(X, X, alpha=2), X * 3)


def test_a_mutating_op_writes_and_bumps_the_version(lib):
    flat = _C.FlatCall(lib.nothing.default)
    x = torch.zeros(3)
    before = x._version
    assert flat(x, 2) is None
    assert torch.equal(x, torch.full((3,), 2.0)) and x._version > before


def test_a_tensor_subclass_goes_through_its_torch_function(lib):
    seen = []

    class Traced(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    flat = _C.FlatCall(lib.mix.default)
    out = flat(X.as_subclass(Traced), [0])
    assert lib.mix.default in seen
    assert torch.equal(out.as_subclass(torch.Tensor), X.sum(0) * 2)
    seen.clear()
    flat = _C.FlatCall(lib.pair.default)
    flat([X, X.as_subclass(Traced)], 1)
    assert lib.pair.default in seen


def test_modes_see_the_call(lib):
    flat = _C.FlatCall(lib.mix.default)

    class Functions(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    class Dispatches(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    with Functions() as functions:
        flat(X, [0])
    with Dispatches() as dispatches:
        flat(X, [0])
    assert lib.mix.default in functions.seen and lib.mix.default in dispatches.seen


def test_it_is_made_from_an_op_overload_only(lib):
    with pytest.raises(TypeError, match="FlatCall takes an OpOverload"):
        _C.FlatCall(len)
    with pytest.raises(TypeError):
        _C.FlatCall()
    flat = _C.FlatCall(lib.mix.default)
    assert flat.overload is lib.mix.default
    assert "mix" in repr(flat)


def test_a_call_after_the_op_is_gone_is_torchs_error_not_a_crash(ns):
    lib = torch.library.Library(ns, "DEF")
    lib.define("gone(Tensor x) -> Tensor")
    lib.impl("gone", lambda x: x + 1, "CPU")
    overload = getattr(torch.ops, ns).gone.default
    flat = _C.FlatCall(overload)
    assert torch.equal(flat(X), X + 1)
    lib._destroy()
    gc.collect()
    got, want = outcome(flat, X), outcome(overload, X)
    assert got[0] == "error" and got[1:] == want[1:]


def test_only_what_the_c_path_cannot_take_goes_to_the_overload(lib, monkeypatch):
    taken = []
    call = torch._ops.OpOverload.__call__

    def spy(self, *args, **kwargs):
        taken.append(self)
        return call(self, *args, **kwargs)

    monkeypatch.setattr(torch._ops.OpOverload, "__call__", spy)
    flat = _C.FlatCall(lib.mix.default)
    flat(X, [0], 1.0, bias=torch.ones(()), mode="max")
    flat(X, (0,), 1)
    assert taken == []
    outcome(flat, X, [0], "a")
    outcome(flat, X, [0], nope=1)
    assert taken == [lib.mix.default] * 2
