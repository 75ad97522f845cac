"""benchmarks/bench_handles.py: a run with tiny counts reports every row as a
positive figure and writes them to its JSON file; its checks before timing
hold (the runner resolves to itself through the op and the table)."""

import json
import math
import subprocess
import sys

from cpp_ext import ROOT


def test_a_tiny_run_reports_every_row(tmp_path):
    out = tmp_path / "h.json"
    run = subprocess.run([sys.executable, f"{ROOT}/benchmarks/bench_handles.py", "--repeats", "2", "--number", "50",
                          "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())
    assert list(rows) == ["tensor op", "handle op, object", "handle op, torch.ops", "tensor op, torch.ops",
                          "handles.resolve"]
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in rows.values()), rows
    for name in rows:
        assert name in run.stdout
