"""benchmarks/bench_tvm_ffi.py: a run with tiny counts on the CPU reports
every row of both kernels at both sizes with sane figures, its table names
every row, and the check before timing catches a row whose output differs.
The kernels compile once (load_inline caches them under ~/.cache/tvm-ffi)."""

import math
import os
import sys

import pytest

pytest.importorskip("tvm_ffi")

from cpp_ext import ROOT  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_tvm_ffi as bench  # noqa: E402


@pytest.fixture(scope="module")
def report():
    return bench.measure("cpu", pairs=3, calls=20)


def positive_finite(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_every_row_is_reported_for_both_sizes(report):
    got = [(r["size"], r["kernel"], r["row"]) for r in report["rows"]]
    expected = [(size, kernel, row) for size in bench.SIZES for kernel in bench.KERNELS for row in bench.ROWS]
    assert sorted(got) == sorted(expected)
    assert len(got) == len(set(got)), "no row is reported twice"


def test_every_time_per_call_is_a_positive_finite_number_of_microseconds(report):
    for r in report["rows"]:
        assert positive_finite(r["us"]), r


def test_every_row_but_raw_has_a_positive_finite_ratio_to_its_reference(report):
    for r in report["rows"]:
        assert r["reference"] == bench.ROWS[r["row"]], r
        if r["row"] == bench.RAW:
            assert r["ratio"] is None, r
            continue
        assert positive_finite(r["ratio"]), r
        assert positive_finite(r["q1"]) and positive_finite(r["q3"]), r


def test_the_quartiles_bracket_the_median_ratio(report):
    for r in report["rows"]:
        if r["ratio"] is not None:
            assert r["q1"] <= r["ratio"] <= r["q3"], r


def test_the_torch_ops_row_is_measured_against_define_and_impl(report):
    rows = [r for r in report["rows"] if r["row"] == "opforge torch.ops"]
    assert rows and all(r["reference"] == bench.DEFINE_IMPL for r in rows)


def test_the_rendered_table_names_every_row_and_the_budget(report):
    text = bench.render(report)
    for row in bench.ROWS:
        assert f"| {row} |" in text or f"| {row} (" in text, row
    for kernel in bench.KERNELS:
        assert f"| {kernel} |" in text, kernel
    assert "Budget: opforge torch.ops / define+impl <= 1x" in text


def test_the_equality_check_names_a_row_whose_output_differs():
    ways = bench.define_ops(bench.build("cpu"), "_check_test")
    statements, _ = ways["rms_norm"]
    statements["custom_op"] += " or out.view(-1)[0].add_(1e-3)"  # the row writes one element off
    with pytest.raises(AssertionError, match="'custom_op' row's output differs"):
        bench.check_equal(ways, "cpu")


def test_the_cpp_benchmark_reports_each_kernel_size_and_way_of_calling():
    import bench_tvm_ffi_cpp

    from cpp_ext import BUILD

    rows = bench_tvm_ffi_cpp.measure(bench_tvm_ffi_cpp.build(os.path.join(BUILD, "bench_tvm_ffi_cpp")), pairs=2)
    assert sorted((r["kernel"], r["size"], r["way"]) for r in rows) == sorted(
        (k, s, w) for k in ("noop", "rms_norm") for s in ("4x128", "256x4096") for w in ("Call", "OpRef"))
    for r in rows:
        assert positive_finite(r["direct_ns"]) and positive_finite(r["op_ns"]) and r["q1"] <= r["ratio"] <= r["q3"]
    assert "opforge::OpRef" in bench_tvm_ffi_cpp.render(rows)
