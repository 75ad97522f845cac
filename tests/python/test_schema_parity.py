"""opforge's schema parser and printer against torch's, on every schema the
installed torch knows."""

import functools
import importlib
import os
import re

import pytest
import torch

from opforge import _C


@functools.lru_cache(maxsize=None)
def registry_schemas():
    """(printed text, torch schema) for every registered schema."""
    # Some subsystems register more schemas on import (e.g. PyObject ones).
    if torch.distributed.is_available():
        importlib.import_module("torch.distributed.tensor")
    schemas = list(torch._C._jit_get_all_schemas()) + list(torch._C._jit_get_custom_class_schemas())
    return [(str(s), s) for s in schemas]


@functools.lru_cache(maxsize=None)
def yaml_schemas():
    yaml = pytest.importorskip("yaml")
    import torchgen

    path = os.path.join(
        os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml"
    )
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path) as f:
        entries = yaml.load(f, Loader=loader)
    return ["aten::" + e["func"] for e in entries if "func" in e]


def torch_default(value):
    if isinstance(value, torch.device):
        return str(value)
    return value


def same_value(ours, theirs):
    theirs = torch_default(theirs)
    if type(ours) is not type(theirs):
        return False
    if isinstance(ours, list):
        return len(ours) == len(theirs) and all(same_value(a, b) for a, b in zip(ours, theirs))
    return ours == theirs


# Printed forms torch's own parser cannot read back, and why. Ops defined at
# run time (by other tests, too) can show any of them.
TORCH_CANNOT_PARSE = {
    r"\bPyObject\b": "torch prints the PyObject type but its parser does not accept it",
    r"\bDevice\??(\([^)]*\))? \w+=[a-z]": "torch prints Device defaults bare (cpu), its parser wants a string",
    r"=-?[0-9.e+-]+[+-][0-9.e+]+j\b": "torch prints complex defaults as 0.+1.j, which its parser rejects",
    r"\(\$\d+! -> \)": "torch prints a TORCH_LIBRARY op's bare Tensor! as Tensor($0! -> ), which its parser rejects",
}


def known_unparsable(text):
    return any(re.search(pattern, text) for pattern in TORCH_CANNOT_PARSE)


def structure_mismatches(text, registered=None):
    """Differences between opforge's and torch's parse of `text`.

    `registered` is the torch FunctionSchema the text was printed from, used
    when torch cannot parse its own printed form."""
    ours = _C.parse_schema(text)
    try:
        theirs = torch._C.parse_schema(text)
    except RuntimeError:
        if registered is None or not known_unparsable(text):
            raise
        theirs = registered
    problems = []
    if str(ours) != str(theirs):
        problems.append(f"printed {str(ours)!r} vs {str(theirs)!r}")
    if (ours.name, ours.overload) != (theirs.name, theirs.overload_name):
        problems.append("name")
    # torch's Python binding does not expose the vararg flags; the printed
    # form above covers them.
    for kind, a_list, b_list in (
        ("argument", ours.arguments, theirs.arguments),
        ("return", ours.returns, theirs.returns),
    ):
        if len(a_list) != len(b_list):
            problems.append(f"{kind} count")
            continue
        for a, b in zip(a_list, b_list):
            where = f"{kind} {b.name!r}"
            if a.name != b.name:
                problems.append(f"{where}: name {a.name!r}")
            if a.type.annotation_str != str(b.real_type):
                problems.append(f"{where}: type {a.type.annotation_str} vs {b.real_type}")
            if a.N != b.N:
                problems.append(f"{where}: N {a.N} vs {b.N}")
            if a.kwarg_only != b.kwarg_only:
                problems.append(f"{where}: kwarg_only")
            if a.has_default != (b.default_value is not None) and b.default_value is not None:
                problems.append(f"{where}: has_default")
            if b.default_value is not None and not same_value(a.default_value, b.default_value):
                problems.append(f"{where}: default {a.default_value!r} vs {b.default_value!r}")
            if (a.alias_info is None) != (b.alias_info is None):
                problems.append(f"{where}: alias presence")
            elif a.alias_info is not None:
                ai, bi = a.alias_info, b.alias_info
                if (set(ai.before_sets), set(ai.after_sets), ai.is_write) != (
                    bi.before_set,
                    bi.after_set,
                    bi.is_write,
                ):
                    problems.append(f"{where}: alias {ai} vs {bi}")
    return problems


def check_all(items):
    failures = {}
    for text, registered in items:
        problems = structure_mismatches(text, registered)
        if problems:
            failures[text] = problems
    return failures


def test_every_registered_schema_prints_and_parses_like_torch():
    items = registry_schemas()
    assert len(items) > 3000
    failures = check_all(items)
    assert not failures, f"{len(failures)} of {len(items)} differ: {list(failures.items())[:5]}"


def test_schemas_torch_cannot_parse_back_are_only_the_known_kinds():
    unparsable = []
    for text, _ in registry_schemas():
        try:
            torch._C.parse_schema(text)
        except RuntimeError:
            unparsable.append(text)
            # opforge reads torch's printed form all the same.
            assert str(_C.parse_schema(text)) == text
    for text in unparsable:
        assert known_unparsable(text), text


def test_every_native_functions_yaml_schema_prints_and_parses_like_torch():
    texts = yaml_schemas()
    assert len(texts) > 2000
    failures = check_all([(t, None) for t in texts])
    assert not failures, f"{len(failures)} of {len(texts)} differ: {list(failures.items())[:5]}"


@pytest.mark.parametrize(
    "text",
    [
        'a::b(float x=1e-5, float y=0.1, float z=-0.0, float w=3, float v=1e20, float u=1e10) -> Tensor',
        'a::b(float u=123456789012.5, float t=1e-300, float s=1e18) -> Tensor',
        'a::b(Scalar s=1, Scalar t=1.5, Scalar r=-2, Scalar? u=None, complex c=1.5, Scalar q="a") -> Tensor',
        'a::b(ScalarType d=float, ScalarType? e=long, Layout l=strided, MemoryFormat m=contiguous_format, int r=Mean) -> Tensor',
        'a::b(float[] x=[1,2.5], int[2] y=1, int[2] z=[1,2], int[3] q=[1,1,1], bool[2] b=[True,False], int[] e=[]) -> Tensor',
        'a::b(str s="a\\"b\\n", str? t=None, str u=\'x\', str v="\\101\\t") -> Tensor',
        'a::b(str s="caf\u00e9") -> Tensor',
        'a::b(Device d="cpu", Device? e="cuda:1", Device? f=None) -> Tensor',
        'a::b(Tensor(a|b|c) x, Tensor(a! -> a|b) y, Tensor(a -> *) z, Tensor(a|*) w) -> Tensor(c|b|a)',
        'a::b(Tensor(a!)[] y, Tensor[](b) z, Tensor(a)?[] w, Tensor(a!)[2] v, int[2](a!) u) -> Tensor',
        'a::b(Any x, t y, Dict(str, t) z, Future(t) f, (int, str) tup, Storage s, Stream st, AnyEnumType e, RRef(t) r, Await(t) aw, Union(int, str) un, NoneType n, QScheme q, Capsule c, AnyClassType act, Quantizer qz, Generator? g=None) -> ((str, t)[])',
        'a::b(bool? b=True, int? i=-3, float? f=2, int x=0x10, float y=0x10, int? z=True, bool w=1) -> Tensor',
        'a::b(Tensor x, *, Tensor y, *, Tensor z) -> (Tensor a, Tensor b)',
        'a::b(int x, ...) -> (int, ...)',
        '  a :: b ( Tensor  x ) -> Tensor # comment',
    ],
)
def test_edge_cases_match_torch(text):
    assert structure_mismatches(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "a::b(Tensor x, Tensor y",
        "a::b.default(Tensor x) -> Tensor",
        "a::b(int x=1, int y) -> Tensor",
        "a::b(Tensor in) -> Tensor",
        "a::b(float x=inf) -> Tensor",
        "a::b(str[] s=[\"a\"]) -> Tensor",
        "a::b(int[] x=None) -> Tensor",
        "a::b(Tensor(*|a) x) -> Tensor",
    ],
)
def test_rejects_what_torch_rejects(text):
    with pytest.raises(RuntimeError):
        torch._C.parse_schema(text)
    with pytest.raises(ValueError):
        _C.parse_schema(text)


def test_forms_torch_prints_but_cannot_parse_are_read_by_opforge():
    lib = torch.library.Library("opforge_parity_probe", "FRAGMENT")
    lib.define('f(Tensor x, Device d="cpu", Device? e="cuda:1", complex c=1.5) -> Tensor')
    schema = torch.ops.opforge_parity_probe.f.default._schema
    text = str(schema)
    assert text == "opforge_parity_probe::f(Tensor x, Device d=cpu, Device? e=cuda:1, complex c=0.+1.j) -> Tensor"
    with pytest.raises(RuntimeError):
        torch._C.parse_schema(text)
    assert known_unparsable(text)
    assert structure_mismatches(text, schema) == []
    lib._destroy()


@pytest.mark.parametrize(
    ("text", "kind"),
    [("Tensor", "Tensor"), ("SymInt", "SymInt"), ("int", "int"), ("Scalar", "Scalar"), ("ScalarType", "ScalarType"),
     ("Device", "Device"), ("Any", "Any"), ("NoneType", "NoneType"), ("t", "Var"), ("int[]", "List"),
     ("Tensor?", "Optional"), ("(int, str)", "Tuple"), ("Dict(str, Tensor)", "Dict"), ("Future(int)", "Future"),
     ("Literal[1, 2]", "Literal"), ("Handle(mod.Runner)", "Handle")],
)
def test_a_types_kind_is_a_leaf_as_the_schema_prints_it_or_the_composites_own_name(text, kind):
    assert _C.parse_type(text).kind == kind
