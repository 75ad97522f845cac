"""The digest of an op's definition that enters torch.compile's cache keys
(docs/compile_cache.md), in one process: what moves it and what does not.
tests/python/test_compile_cache.py runs the processes that share a cache."""

import dataclasses
import enum
import logging

import pytest
import torch
from op_testing import ns  # noqa: F401

import opforge
from opforge import _cache_key


class Mode(enum.Enum):
    GELU = 1
    RELU = 2


@dataclasses.dataclass(frozen=True)
class Cfg:
    scale: float = 2.0
    mode: Mode = Mode.GELU


SCALE = 2.0


def fake_scaled(x, cfg):
    return torch.empty_like(x) * SCALE


def define(name, fake=fake_scaled, body_factor=1.0, **options):
    @opforge.op(name, fake=fake, **options)
    def scaled(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
        return x * cfg.scale * body_factor

    return scaled


def test_cache_key_names_every_part_of_the_definition(ns):
    op = define(f"{ns}::scaled")
    text = opforge.cache_key(op)
    assert text.splitlines()[0] == f"{ns}::scaled (python op): digest {_cache_key.digest(op)}"
    assert f"  schema: {op.schema}" in text
    assert f"  enum {__name__}.Mode: GELU=1, RELU=2" in text
    assert f"  struct {__name__}.Cfg: scale: float = 2.0, mode: {__name__}.Mode = Mode.GELU=1" in text
    assert "  backward: none" in text and "  fake: " in text
    assert "not in the key: the op's body and kernels" in text


def test_cache_key_refuses_what_is_not_an_opforge_op():
    with pytest.raises(TypeError, match="opforge.cache_key takes an opforge op .* not function"):
        opforge.cache_key(fake_scaled)


def test_the_body_is_not_in_the_digest_and_the_fake_and_its_module_globals_are(ns, monkeypatch):
    a, b = define(f"{ns}::a"), define(f"{ns}::b", body_factor=3.0)
    parts_a, parts_b = _cache_key.definition(a), _cache_key.definition(b)
    assert parts_a["functions"] == parts_b["functions"] and parts_a["enums"] == parts_b["enums"]
    before = _cache_key.code_digest(fake_scaled)
    monkeypatch.setattr(__import__(__name__), "SCALE", 3.0)
    assert _cache_key.code_digest(fake_scaled) != before  # a plain global the fake reads
    other = define(f"{ns}::c", fake=lambda x, cfg: torch.empty_like(x, dtype=torch.float64))
    assert _cache_key.definition(other)["functions"]["fake"] != parts_a["functions"]["fake"]


def test_a_changed_enum_table_struct_default_or_backward_changes_the_digest(ns):
    base = _cache_key.definition(define(f"{ns}::base"))
    Mode2 = enum.Enum("Mode", {"TANH": 1, "GELU": 2, "RELU": 3}, module=__name__)

    @opforge.op(f"{ns}::enum", fake=fake_scaled)
    def with_enum(x: torch.Tensor, cfg: Cfg, m: Mode2 = Mode2.GELU) -> torch.Tensor:
        return x

    assert _cache_key.definition(with_enum)["enums"][f"{__name__}.Mode"] == [("TANH", "1"), ("GELU", "2"),
                                                                            ("RELU", "3")]
    trained = define(f"{ns}::trained", backward=lambda ctx, g: g * 2)
    assert _cache_key.definition(trained)["functions"]["backward"] is not None
    assert base["functions"]["backward"] is None


def test_a_decorator_that_replaces_the_fake_computes_the_digest_again(ns):
    op = define(f"{ns}::scaled")
    first = _cache_key.digest(op)
    assert _cache_key.digest(op) == first

    @op.register_fake
    def _(x, cfg):
        return x.new_empty(x.shape[0] + 1)

    assert _cache_key.digest(op) != first


class Shape:
    def __call__(self, x, cfg):
        return torch.empty_like(x)


def test_a_fake_without_python_code_makes_the_ops_graphs_uncached_and_says_so_once(ns, caplog):
    op = define(f"{ns}::opaque", fake=Shape())
    with caplog.at_level(logging.DEBUG, logger="opforge.cache"):
        first = _cache_key.digest(op)
        _cache_key._memo.pop(id(op))
        second = _cache_key.digest(op)
    assert first.startswith("uncacheable-") and second.startswith("uncacheable-") and first != second
    said = [r.getMessage() for r in caplog.records if r.name == "opforge.cache"]
    assert said == [f"{ns}::opaque: its fake has no Python code to key, so graphs calling it are compiled anew in "
                    "every process instead of read from torch.compile's caches (docs/compile_cache.md)."]


def test_a_compile_start_gives_every_ops_digest_to_inductors_config(ns):
    import torch._inductor.config as config

    op = define(f"{ns}::scaled")
    torch.compile(lambda x: op(x, Cfg()), backend="eager")(torch.ones(2))
    assert config.unsafe_marked_cacheable_functions[f"opforge {ns}::scaled"] == _cache_key.digest(op)
