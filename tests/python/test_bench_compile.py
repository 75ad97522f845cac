"""`opforge bench --compile` (python/opforge/_bench_compile.py): a run with
tiny counts measures every row for the three models, each model compiled
equal to eager (the measurement asserts it), one recompile each for a changed
struct field, and its table names every row with its budget."""

import argparse
import math

import pytest
from op_testing import torch_build_dir

from opforge import _bench_compile

GENERATED = ["abs", "add", "topk"]  # add.out's alpha has a default, topk writes two tensors


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    allowlist = tmp_path_factory.mktemp("allowlist") / "names.txt"
    allowlist.write_text("\n".join(GENERATED) + "\n")
    args = argparse.Namespace(compile_leaves=[1], compile_layers=[2], compile_repeats=1, registrations=3,
                              dim_compiled=16, batch=2, repeats=2, min_time=0.001, threads=1,
                              compile_allowlist=str(allowlist), compile_gen_dir=torch_build_dir("bench-compile-gen"),
                              compile_generated=True)
    out = _bench_compile.measure(args)
    out["threads"] = 1
    return out


def test_every_model_has_every_row_with_a_positive_figure(result):
    rows = result["layers"][2]
    assert list(rows) == list(_bench_compile._VARIANTS)
    for name, row in rows.items():
        for key in ("dynamo_s", "inductor_cold_s", "inductor_warm_s", "step_us"):
            assert math.isfinite(row[key]) and row[key] > 0, (name, key, row)
    reg = result["registration"][1]
    assert all(reg[k] > 0 for k in ("opforge", "custom_op", "define_impl")), reg


def test_the_generated_ops_register_with_each_variant(result):
    generated = result["generated"]
    # The forwarded overloads: abs.out, add.out, add.Scalar_out, topk.values.
    assert generated["ops"] == 4
    assert generated["registered"] == {name: 4 for name in _bench_compile._GEN_VARIANTS}
    assert generated["refused"] == {name: 0 for name in _bench_compile._GEN_VARIANTS}
    assert all(ms > 0 for ms in generated["ms_per_op"].values()), generated


def test_the_default_allowlist_is_the_525_names_of_the_examples():
    path = _bench_compile.default_allowlist()
    with open(path) as f:
        assert len([line for line in f if line.strip() and not line.startswith("#")]) == 525


def test_a_changed_struct_field_is_one_recompile_for_every_model(result):
    assert [row["recompiles"] for row in result["layers"][2].values()] == [1, 1, 1]


def test_the_table_names_each_row_and_budget(result):
    text = _bench_compile.render(result)
    for label in ("registration, ms per op", "dynamo s", "inductor cold s", "inductor warm s", "recompiles",
                  "step µs", "dynamo / custom_op", "cold / define+impl", "warm / custom_op", "step / define+impl",
                  "4 ops of 3 names"):
        assert label in text, label
    assert text.count("budget <=") == 6
