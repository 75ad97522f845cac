"""benchmarks/bench_vllm_style.py: its libraries build (six registrations of
one vLLM-style kernel set, and the C++ timing loop), its equality check runs
and catches a variant that differs, and a --quick run prints every row of
its table with parseable figures. The build is kept under build/ as the
other C++ tests keep theirs, so a second run only relinks what changed."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from cpp_ext import BUILD, ROOT
from kernel_library import STABLE_BUILDS

BENCHMARKS = os.path.join(ROOT, "benchmarks")
SCRIPT = os.path.join(BENCHMARKS, "bench_vllm_style.py")
BUILD_DIR = os.path.join(BUILD, "bench_vllm_style")

pytestmark = pytest.mark.skipif(not STABLE_BUILDS, reason=(
    f"needs torch 2.10 (this is {torch.__version__}): half the benchmark's libraries are on the stable ABI"))

sys.path.insert(0, BENCHMARKS)
import bench_vllm_style as bench  # noqa: E402

RATIO = re.compile(r"^(\d+\.\d+)x \[(\d+\.\d+)-(\d+\.\d+)\]$")


@pytest.fixture(scope="module")
def built():
    return bench.build(BUILD_DIR, quiet=True)


def table_rows(out: str) -> list[list[str]]:
    """The cells of every data row of the markdown tables in `out`."""
    rows = []
    for line in out.splitlines():
        if line.startswith("| ") and not line.startswith("| comparison"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_a_quick_run_checks_equality_and_prints_every_row(built):
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--device", "cpu", "--build-dir", built],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    check = re.search(r"^Equality check \(cpu\): passed: 6 libraries, 10 ways of calling, (\d+) cases", out, re.M)
    assert check and int(check.group(1)) >= 2 * len(bench.OPS), out
    assert out.index("Equality check") < out.index("| comparison"), "the check runs before any timing"

    rows = table_rows(out)
    expected = {(row.label, op) for row in bench.ROWS for op in bench.OPS}
    assert len(rows) == len(expected) and {(r[0], r[1]) for r in rows} == expected, out
    for cells in rows:
        assert len(cells) == 2 + 3 * len(bench.SIZES), cells
        for first, second, ratio in zip(cells[2::3], cells[3::3], cells[4::3]):
            first, second = float(first), float(second)
            assert first > 0 and second > 0, cells
            match = RATIO.match(ratio)
            assert match, cells
            median, q1, q3 = (float(g) for g in match.groups())
            assert q1 <= median <= q3, cells
            # The median of the pairs' ratios, near the ratio of the medians.
            assert 0.2 < median / (first / second) < 5, cells


def test_the_equality_check_names_a_variant_whose_output_differs(built):
    script = f"""
        import sys
        import torch
        sys.path.insert(0, {BENCHMARKS!r})
        import bench_vllm_style as bench
        bench.load({built!r})
        honest = bench.caller

        def caller(lib, api, op, t, head_size, is_neox=True):
            call = honest(lib, api, op, t, head_size, is_neox)
            if lib != "structs_stable" or op != "silu_and_mul":
                return call
            def off_by_one_ulp():  # in float32, the first case checked
                call()
                t[0].view(-1)[0] = t[0].view(-1)[0].float().nextafter(torch.tensor(1e9)).to(t[0].dtype)
            return off_by_one_ulp

        bench.caller = caller
        try:
            bench.check_equal("cpu")
        except AssertionError as e:
            print(e)
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "silu_and_mul" in proc.stdout and "structs_stable" in proc.stdout, proc.stdout
    assert "differs from TORCH_LIBRARY's" in proc.stdout, proc.stdout
