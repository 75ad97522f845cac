"""C++ default member initializers seen from Python: the generated dataclass
has them, the flat schema has them as leaf defaults, and calls may omit them
(tests/cpp_ext/ext.cc, ext::AttnCfg)."""

import dataclasses

import pytest
import torch

import opforge

from cpp_ext import load


@pytest.fixture(scope="module")
def ext():
    return load()


@pytest.fixture(scope="module")
def AttnCfg(ext):
    return opforge.structs.opforge_ext.AttnCfg


def expected(x, scale, causal=True, window=-1, mode=1, softcap=None, tag="attn"):
    """What ext::Attn computes, with ext::AttnCfg's C++ defaults."""
    return x * scale + int(causal) + window * 10 + mode * 100 + (softcap or 0.0) * 1000 + len(tag) * 10000


def test_the_dataclass_has_the_cpp_initializers_as_defaults(AttnCfg):
    Mode = opforge.structs.opforge_ext.Mode
    defaults = {f.name: f.default for f in dataclasses.fields(AttnCfg)}
    assert defaults == {"scale": dataclasses.MISSING, "causal": True, "window": -1, "mode": Mode.kMul,
                        "softcap": None, "tag": "attn"}
    assert AttnCfg(0.5) == AttnCfg(scale=0.5, causal=True, window=-1, mode=Mode.kMul, softcap=None, tag="attn")
    with pytest.raises(TypeError, match="scale"):
        AttnCfg()


def test_the_flat_schema_has_them_as_leaf_defaults(ext):
    assert ext.attn.schema == (
        "opforge_ext::attn(Tensor x, float cfg__scale, bool cfg__causal=True, int cfg__window=-1, "
        "int cfg__mode=1, float? cfg__softcap=None, str cfg__tag=\"attn\") -> Tensor")
    assert ext.attn.spec == "opforge_ext::attn(Tensor x, ext.AttnCfg cfg) -> Tensor"


def test_a_python_call_that_omits_the_defaults_gets_the_cpp_values(ext, AttnCfg):
    x = torch.arange(3.0)
    torch.testing.assert_close(ext.attn(x, AttnCfg(2.0)), expected(x, 2.0))
    Mode = opforge.structs.opforge_ext.Mode
    torch.testing.assert_close(ext.attn(x, AttnCfg(2.0, causal=False, mode=Mode.kAdd, softcap=0.5)),
                               expected(x, 2.0, causal=False, mode=0, softcap=0.5))


def test_torch_ops_callers_may_omit_the_defaulted_leaves(ext):
    x = torch.arange(3.0)
    torch.testing.assert_close(torch.ops.opforge_ext.attn(x, 2.0), expected(x, 2.0))
    torch.testing.assert_close(torch.ops.opforge_ext.attn(x, 2.0, cfg__window=3, cfg__tag="ab"),
                               expected(x, 2.0, window=3, tag="ab"))


def test_a_call_with_defaults_omitted_compiles_with_fullgraph(ext, AttnCfg):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x):
        return ext.attn(x, AttnCfg(0.5)) + 1

    x = torch.arange(4.0)
    torch.testing.assert_close(f(x), expected(x, 0.5) + 1)
    assert not torch._dynamo.utils.counters["graph_break"]


def test_a_struct_parameter_default_in_the_schema_makes_the_struct_optional(ext, AttnCfg):
    assert ext.attn_default.schema == (
        "opforge_ext::attn_default(Tensor x, float cfg__scale=2., bool cfg__causal=True, int cfg__window=3, "
        "int cfg__mode=1, float? cfg__softcap=None, str cfg__tag=\"attn\") -> Tensor")
    x = torch.arange(3.0)
    torch.testing.assert_close(ext.attn_default(x), expected(x, 2.0, window=3))
    torch.testing.assert_close(torch.ops.opforge_ext.attn_default(x), expected(x, 2.0, window=3))
    torch.testing.assert_close(ext.attn_default(x, AttnCfg(1.0)), expected(x, 1.0))
