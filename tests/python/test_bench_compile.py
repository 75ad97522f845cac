"""`opforge bench --compile` (python/opforge/bench/compile.py): a run with
tiny counts measures every row for the three models, each model compiled
equal to eager (the measurement asserts it), one recompile each for a changed
struct field, and its table names every row with its budget."""

import argparse
import math

import pytest
import torch
from op_testing import torch_build_dir

from opforge.bench import compile as _bench_compile

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
    for name, row in rows.items():  # the repeats behind each median
        samples = row["samples"]
        assert set(samples) == {"dynamo_s", "inductor_cold_s", "inductor_warm_s"}, samples
        assert all(len(v) == 1 and v[0] == row[k] for k, v in samples.items()), (name, samples)


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
    for label in ("registration, ms per op", "dynamo s", "inductor cold s", "inductor warm s", "inductor warm misses",
                  "definition digests at a compile start", "recompiles",
                  "step µs", "dynamo / custom_op", "cold / define+impl", "warm / custom_op", "step / define+impl",
                  "4 ops of 3 names", "dynamo calls, k", "inductor cold calls, k", "inductor warm calls, k",
                  "opforge per call site"):
        assert label in text, label
    assert text.count("budget <=") == 6


def test_traced_work_is_counted_for_every_model_and_a_struct_call_site_stays_near_a_flat_one(result):
    rows = result["layers"][2]
    for key in ("dynamo_calls", "inductor_cold_calls", "inductor_warm_calls"):
        counts = {name: rows[name][key] for name in _bench_compile._VARIANTS}
        assert all(isinstance(c, int) and c > 10_000 for c in counts.values()), (key, counts)
        # Counts, not times: the same on every machine. When Dynamo traced the
        # struct flatten leaf by leaf, its trace was 2.3-2.7x custom_op's.
        assert counts["opforge struct op"] <= 1.25 * counts["custom_op (flat)"], (key, counts)
    assert rows["opforge struct op"]["call_sites"] == 8


def test_counting_the_traced_work_twice_gives_the_same_count_to_a_thousandth():
    models = _bench_compile._bench_compiled.build_models(2, 16)
    x = torch.randn(2, 16)
    with torch.no_grad(), _bench_compile._no_compile_caches():
        _bench_compile._traced_calls(models["opforge struct op"], x, "eager")  # the first compile warms up
        counts = [_bench_compile._traced_calls(models["opforge struct op"], x, "eager") for _ in range(2)]
    # (A finalizer the collector runs may add a call or two.)
    assert abs(counts[0] - counts[1]) <= counts[0] / 1000 and counts[0] > 10_000, counts


def test_a_warm_compile_misses_no_cache_and_the_digests_are_measured(result):
    # Every op's definition is in the caches' keys (docs/compile_cache.md): nothing changed, nothing missed.
    assert [row["inductor_warm_misses"] for row in result["layers"][2].values()] == [0, 0, 0]
    digests = result["digests"]
    assert digests["ops"] >= 1 and digests["cold_ms"] > 0 and digests["warm_us"] > 0, digests

