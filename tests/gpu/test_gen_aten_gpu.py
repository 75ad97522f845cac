"""Generated ops tagged cudagraph_unsafe on a GPU (docs/codegen.md#op-tags):
`nonzero [cudagraph_unsafe]` in the allowlist makes the generated
nonzero (aten::nonzero.out, which syncs to learn its size) an eager break of
opforge's BreakableGraph, and a plain torch.cuda.graph capture refuses it,
naming it, with opforge imported or not.

    python -m pytest tests/gpu/test_gen_aten_gpu.py -v
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

NAMESPACE = "opforge_gpu_gen"


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    from opforge.gen import _generate

    out = tmp_path_factory.mktemp("gen")
    report = _generate.generate_aten(["abs", "nonzero [cudagraph_unsafe]"], NAMESPACE, str(out), tests=False,
                                     jobs=8)
    torch.ops.load_library(report.library)
    return report.library


@pytest.fixture(scope="module")
def ops(library):
    return getattr(torch.ops, NAMESPACE)


def step(ops, x, idx):
    """Captured ops around the generated break: idx holds the rows of x's
    nonzero entries (their number stays fixed across replays)."""
    y = x.abs() * 2
    ops.nonzero(y, out=idx)
    return y.sum() + idx.sum()


def test_the_generated_op_is_an_eager_break_of_a_breakable_graph_and_replays_right(ops):
    from opforge import cuda_graphs

    x = torch.tensor([0.0, 2.0, 0.0, -3.0, 0.0, 1.0], device="cuda")
    idx = torch.empty(3, 1, dtype=torch.long, device="cuda")
    graph = cuda_graphs.BreakableGraph()
    out = graph.capture(step, ops, x, idx)
    assert graph.num_breaks == 1 and graph.num_segments == 2
    for values in ([5.0, 0.0, 0.0, 1.0, 0.0, 7.0], [0.0, 0.0, 4.0, 4.0, 4.0, 0.0]):
        x.copy_(torch.tensor(values, device="cuda"))
        graph.replay()
        expected_idx = torch.nonzero(torch.tensor(values)).cuda()
        assert torch.equal(idx, expected_idx)
        assert torch.equal(out, torch.tensor(values).abs().cuda().mul(2).sum() + expected_idx.sum())
    graph.release()


def test_a_plain_capture_refuses_the_generated_op_naming_it_and_the_next_capture_works(ops):
    x = torch.tensor([0.0, 2.0, 0.0, -3.0], device="cuda")
    idx = torch.empty(2, 1, dtype=torch.long, device="cuda")
    with pytest.raises(RuntimeError, match=f"{NAMESPACE}::nonzero: this op is tagged torch.Tag.cudagraph_unsafe"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            step(ops, x, idx)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ops.abs(x, out=torch.empty_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, x.abs())


def test_without_opforge_imported_a_plain_capture_refuses_the_generated_op(library):
    code = textwrap.dedent(f"""
        import sys, torch
        torch.ops.load_library({library!r})
        x = torch.tensor([0.0, 2.0], device="cuda")
        idx = torch.empty(1, 1, dtype=torch.long, device="cuda")
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                torch.ops.{NAMESPACE}.nonzero(x, out=idx)
        except RuntimeError as e:
            print("refused:", str(e).splitlines()[0])
        assert "opforge" not in sys.modules
        torch.ops.{NAMESPACE}.nonzero(x, out=idx)   # outside a capture: an ordinary call
        print("eager:", idx.tolist())
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (f"refused: {NAMESPACE}::nonzero: this op is tagged torch.Tag.cudagraph_unsafe and was called while its "
            "CUDA stream is being captured") in done.stdout
    assert "`import opforge`" in done.stdout
    assert "eager: [[1]]" in done.stdout
