"""benchmarks/bench_symm_mem_tp.py's eager TP-step figures without a GPU: the
interleaved rounds rotate the order of the steps, take medians, and give the
opforge step's ratio per round; the report prints them per rank."""

import os
import sys
from types import SimpleNamespace

from cpp_ext import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_symm_mem_tp as bench  # noqa: E402


# What rank 0 passes to the report besides the ranks' figures.
META = {"two_shot_min_bytes": 2 << 20, "two_shot_min_bytes_override": -1, "world_size": 2, "device": "GPU",
        "torch": "2.11", "env": {}, "inductor_collective_auto_select": False, "rounds": 15}


class FakeRank:
    """Times from a script: each step's µs grow by one per round, the opforge step twice the matmuls'."""

    def __init__(self, rounds):
        self.args = SimpleNamespace(rounds=rounds)
        self.rank, self.errors, self.calls = 0, [], []

    def eager_us(self, fn, nbytes):
        name = fn()
        k = sum(1 for c in self.calls if c == name)
        self.calls.append(name)
        return {"opforge": 20.0, "matmuls": 10.0, "matmuls + direct": 16.0, "all-reduce alone": 6.0}[name] + k

    def host_us(self, fn, nbytes):
        """A tenth of the eager figure of the same round."""
        name = fn()
        return {"opforge": 20.0, "matmuls": 10.0, "matmuls + direct": 16.0, "all-reduce alone": 6.0}[name] / 10 + (
            sum(1 for c in self.calls if c == name) - 1)


def test_rounds_rotate_the_order_and_give_median_ratios():
    r = FakeRank(rounds=5)
    names = ["opforge", "matmuls", "matmuls + direct", "all-reduce alone"]
    eager, host, ratios = bench.interleaved(r, "step", {n: (lambda n=n: n) for n in names}, 1024)
    assert r.calls[:4] == names
    assert r.calls[4:8] == names[1:] + names[:1]  # the second round starts one later
    assert eager == {"opforge": 22.0, "matmuls": 12.0, "matmuls + direct": 18.0, "all-reduce alone": 8.0}
    per_round = [(20 + k) / (16 + k) for k in range(5)]
    median, q1, q3 = ratios["opforge / (matmuls + direct)"]
    assert median == per_round[2] and q1 < median < q3
    assert ratios["opforge / (matmuls + all-reduce alone)"][0] == 22 / 20
    assert host == {"opforge": 4.0, "matmuls": 3.0, "matmuls + direct": 3.6, "all-reduce alone": 2.6}
    assert ratios["opforge / (matmuls + direct) (host)"][0] == (2 + 2) / (1.6 + 2)


def test_a_step_that_fails_is_reported_and_leaves_the_others():
    r = FakeRank(rounds=3)

    def broken():
        raise RuntimeError("no symmetric memory")

    eager, host, ratios = bench.interleaved(r, "step", {"opforge": broken, "matmuls": lambda: "matmuls"}, 1024)
    assert eager["opforge"] is None and eager["matmuls"] == 11.0
    assert host["opforge"] is None and host["matmuls"] == 2.0
    assert ratios == {}
    assert r.errors[0]["what"] == "step: opforge (eager)" and "no symmetric memory" in r.errors[0]["error"]


def test_the_report_prints_the_pieces_per_rank():
    times = {"empty_strided_p2p (the step's buffer)": 5.5, "torch's op of the same path, direct": 13.25}
    reports = [{"rank": rank, "sweep": [], "steps": [], "checks": [], "errors": [], "profiles": [],
                "parts": [{"tokens": 64, "bytes": 512 << 10, "path": "one-shot",
                           "times": {name: value + rank for name, value in times.items()},
                           "host": {name: value / 2 for name, value in times.items()}}]} for rank in (0, 1)]
    text = bench.render(META, reports)
    assert "## pieces of the compiled step, eager, tokens 64 (512KB, one-shot), µs per call, per rank" in text
    assert "| piece | rank 0 eager | host (CPU) | rank 1 eager | host (CPU) |" in text
    assert "| empty_strided_p2p (the step's buffer) | 5.5 | 2.8 | 6.5 | 2.8 |" in text
    assert "| torch's op of the same path, direct | 13.2 | 6.6 | 14.2 | 6.6 |" in text


def test_the_report_prints_each_steps_host_figure_and_ratio():
    times = {"opforge": 30.0, "nccl": 40.0, "matmuls": 10.0, "matmuls + direct": 25.0, "all-reduce alone": 12.0}
    step = {"tokens": 64, "hidden": 4096, "dtype": "bfloat16", "bytes": 512 << 10, "path": "one-shot",
            "times": {n: {"eager": v, "host": v / 2, "graph": v / 3} for n, v in times.items()},
            "eager_ratios": {"opforge / (matmuls + direct)": [1.2, 1.1, 1.3],
                             "opforge / (matmuls + direct) (host)": [1.05, 1.0, 1.1]}}
    reports = [{"rank": 0, "sweep": [], "steps": [step], "checks": [], "errors": [], "profiles": []}]
    text = bench.render(META, reports)
    assert "| step | eager | host (CPU) | CUDA graph |" in text
    assert "| opforge | 30.0 | 15.0 | 10.0 |" in text
    assert "| matmuls, plus all-reduce alone (the sum) | 22.0 | 11.0 | 7.3 |" in text
    assert "- opforge / (matmuls + direct), eager, median of 15 rounds' ratios [quartiles], per rank: " \
           "1.200x [1.100-1.300]" in text
    assert "- opforge / (matmuls + direct), host (CPU), median of 15 rounds' ratios [quartiles], per rank: " \
           "1.050x [1.000-1.100]" in text
