"""`opforge gen aten` end to end on a subset of the allowlist: generated ops
exist, match ATen, build fast and are not rebuilt when nothing changed.

The build is cached under build/torch-<release>/test_gen/, so a second run of this file
compiles nothing. The full 525-name build is benchmarks/bench_gen.py.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from op_testing import torch_build_dir
from opforge.gen import _generate, casekit
from opforge.gen._io import Progress

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = torch_build_dir("test_gen")
NAMESPACE = "opforge_test_aten"
SUBSET = [
    "abs", "add_", "addmm", "max", "sort", "split_copy", "linalg_lu_factor", "nll_loss", "bernoulli",
    "arange", "clamp", "index", "where", "rand", "scatter", "scatter_reduce", "range", "eq", "cumsum",
    "upsample_nearest2d", "avg_pool2d_backward", "linalg_svd", "empty", "cudnn_convolution",
    "nonzero [cudagraph_unsafe]",  # a data-dependent op: an eager break of a breakable capture
]


@pytest.fixture(scope="module")
def generated():
    report = _generate.generate_aten(SUBSET, NAMESPACE, os.path.join(OUT, "subset"), jobs=2)
    torch.ops.load_library(report.library)
    return report


@pytest.fixture(scope="module")
def ops(generated):
    return getattr(torch.ops, NAMESPACE)


def test_every_subset_name_is_generated_with_its_overloads(generated):
    assert generated.coverage == (len(SUBSET), len(SUBSET))
    names = {op.name for op in generated.selection.ops}
    assert {"abs", "add_", "add_scalar_", "max", "max_dim_max", "max_unary", "sort_values",
            "sort_values_stable", "scatter_reduce", "scatter_reduce_out", "range", "range_out"} <= names


def test_generated_ops_are_registered_with_the_target_schema_renamed(generated, ops):
    for op in generated.selection.ops:
        schema = getattr(ops, op.name).default._schema
        assert str(schema) == op.schema_text


def test_an_out_op_writes_into_out_and_returns_it(ops):
    a, b, c = torch.randn(3, 4), torch.randn(3, 5), torch.randn(5, 4)
    out = torch.empty(0)
    result = ops.addmm(a, b, c, beta=0.5, alpha=2, out=out)
    assert result is out
    torch.testing.assert_close(out, torch.addmm(a, b, c, beta=0.5, alpha=2))


def test_a_multi_output_op_fills_every_out_tensor(ops):
    x = torch.randn(4, 6)
    values, indices = torch.empty(0), torch.empty(0, dtype=torch.long)
    result = ops.max_dim_max(x, 1, keepdim=True, max=values, max_values=indices)
    assert result[0] is values and result[1] is indices
    expected = torch.max(x, 1, keepdim=True)
    torch.testing.assert_close(values, expected.values)
    torch.testing.assert_close(indices, expected.indices)


def test_a_tensor_list_out_op_fills_the_list(ops):
    x = torch.arange(10.0)
    # split_copy does not resize its outputs: they come sized.
    outs = [torch.empty(3), torch.empty(3), torch.empty(3), torch.empty(1)]
    assert ops.split_copy(x, 3, out=outs) is None
    assert [o.tolist() for o in outs] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [9.0]]


def test_an_in_place_op_mutates_and_returns_self(ops):
    x = torch.ones(3)
    assert ops.add_scalar_(x, 2, alpha=3) is x
    assert x.tolist() == [7.0, 7.0, 7.0]


def test_optional_tensor_list_and_string_arguments_are_passed_through(ops):
    x = torch.arange(12.0).reshape(3, 4)
    out = torch.empty(0)
    ops.index(x, [torch.tensor([2, 0]), None], out=out)
    assert out.tolist() == [[8.0, 9.0, 10.0, 11.0], [0.0, 1.0, 2.0, 3.0]]
    src = torch.ones(3, 4)
    index = torch.tensor([[0, 0, 0, 0]])
    ops.scatter_reduce(x, 0, index, src, "amax", include_self=False, out=out)
    assert out[0].tolist() == [1.0, 1.0, 1.0, 1.0]


def test_scalar_type_and_generator_arguments_are_passed_through(ops):
    out = torch.empty(0, dtype=torch.float64)
    ops.cumsum(torch.ones(4, dtype=torch.int32), 0, dtype=torch.float64, out=out)
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]
    first, second = torch.empty(3), torch.empty(3)
    ops.rand_generator([3], generator=torch.Generator().manual_seed(5), out=first)
    ops.rand_generator([3], generator=torch.Generator().manual_seed(5), out=second)
    assert torch.equal(first, second)


def test_errors_from_aten_reach_the_caller_unchanged(ops):
    with pytest.raises(RuntimeError, match="functions with out=... arguments don't support automatic"):
        ops.abs(torch.ones(2, requires_grad=True), out=torch.empty(2))


def test_generated_ops_trace_through_torch_compile(ops):
    def f(x):
        out = torch.empty_like(x)
        ops.abs(x, out=out)
        return out * 2

    x = torch.randn(5)
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="eager")(x), x.abs() * 2)


def test_generated_ops_run_on_fake_tensors(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = ops.addmm(torch.empty(3, 4), torch.empty(3, 5), torch.empty(5, 4), out=torch.empty(0))
    assert tuple(out.shape) == (3, 4)


def test_the_generated_test_module_passes_in_process(generated):
    path = os.path.join(generated.out_dir, f"test_{NAMESPACE}_ops.py")
    spec = importlib.util.spec_from_file_location("generated_test_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    passed, skipped = 0, []
    for case in module.CASES:
        if case.skip:
            skipped.append(case.skip)
            continue
        casekit.run_case(case, casekit.generated_op(NAMESPACE, case.op))
        passed += 1
    assert passed + len(skipped) == generated.cases
    assert passed >= 0.9 * generated.cases
    no_cpu_kernel = {
        "ATen has no CPU kernel for aten::addmm.dtype_out; it is not exercised on CPU",
        "ATen has no CPU kernel for aten::cudnn_convolution.out; it is not exercised on CPU",
    }
    assert no_cpu_kernel <= set(skipped)
    # torch <= 2.12 still has Dimname overloads, which need named tensors no
    # generated input has.
    for reason in set(skipped) - no_cpu_kernel:
        assert "all symbols must have a namespace" in reason, reason


def _load_cases(path):
    spec = importlib.util.spec_from_file_location("generated_test_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


def test_the_generated_test_module_runs_under_pytest(generated):
    path = os.path.join(generated.out_dir, f"test_{NAMESPACE}_ops.py")
    result = subprocess.run([sys.executable, "-m", "pytest", path, "-q", "-p", "no:cacheprovider"],
                            capture_output=True, text=True, cwd=generated.out_dir)
    assert result.returncode == 0, result.stdout[-3000:]
    skips = sum(1 for case in _load_cases(path) if case.skip)
    assert f"{generated.cases - skips} passed, {skips} skipped" in result.stdout


def test_the_harness_fails_a_wrong_op():
    case = casekit.Case("abs", "aten::abs.out", "aten::abs", "out", {"self": casekit.T((3,), seed=1)},
                        outs=("out",))
    casekit.run_case(case, torch.ops.aten.abs.out)
    with pytest.raises(AssertionError, match=r"abs\(out=...\)\[0\]: Tensor-likes are not close"):
        casekit.run_case(case, torch.ops.aten.neg.out)


def test_the_metadata_lists_every_op_its_target_and_the_test_counts(generated):
    with open(os.path.join(generated.out_dir, f"{NAMESPACE}_ops.json")) as f:
        data = json.load(f)
    assert data["namespace"] == NAMESPACE
    assert data["allowlist"] == {"names": len(SUBSET), "generated": len(SUBSET), "not_generated": []}
    ops = {op["name"]: op for op in data["ops"]}
    assert ops["add_scalar_"]["target"] == "aten::add_.Scalar"
    assert ops["add_scalar_"]["kind"] == "inplace"
    assert ops["max_dim_max"]["arguments"][-1] == {
        "name": "max_values", "type": "Tensor", "kwarg_only": True, "alias": "(b!)", "out": True}
    assert "nondeterministic_seeded" in ops["bernoulli"]["tags"]
    assert data["tests"]["cases"] == generated.cases
    assert data["library"] == os.path.join("build", f"lib{NAMESPACE}_ops.so")


def test_a_tagged_allowlist_entry_defines_its_ops_with_the_tag_and_only_those(generated, ops):
    assert torch.Tag.cudagraph_unsafe in ops.nonzero.default.tags
    assert torch.Tag.cudagraph_unsafe not in ops.abs.default.tags
    assert [op.tags for op in generated.selection.ops if op.base == "nonzero"] == [("cudagraph_unsafe",)]
    with open(os.path.join(generated.out_dir, f"{NAMESPACE}_ops.json")) as f:
        data = {op["name"]: op for op in json.load(f)["ops"]}
    assert data["nonzero"]["op_tags"] == ["cudagraph_unsafe"] and data["abs"]["op_tags"] == []


class OneStepCapture:
    """A breakable capture with vLLM's protocol, on the CPU (the graph
    segments are empty): add_eager(fn) runs fn and records it; replay() runs
    the recorded breaks."""

    active = None

    def __init__(self):
        self._capturing, self.breaks = True, []

    @classmethod
    def current(cls):
        return cls.active

    def add_eager(self, fn):
        self._capturing = False
        try:
            result = fn()
            self.breaks.append(fn)
            return result
        finally:
            self._capturing = True


@pytest.fixture
def capture_probe():
    """Every device reports a capture under way (opforge's test probe)."""
    from opforge import _C

    previous = _C._set_capture_probe(1)
    try:
        yield
    finally:
        _C._set_capture_probe(previous)


def test_a_tagged_generated_op_in_a_plain_capture_is_refused_naming_it_before_it_runs(ops, capture_probe):
    x, out = torch.tensor([0.0, 2.0, 0.0, 3.0]), torch.full((2, 1), -1, dtype=torch.long)
    with pytest.raises(RuntimeError, match=f"{NAMESPACE}::nonzero: this op is tagged torch.Tag.cudagraph_unsafe"):
        ops.nonzero(x, out=out)
    assert out.tolist() == [[-1], [-1]]
    assert torch.equal(ops.abs(x, out=torch.empty(4)), x.abs())  # untagged: an ordinary call


def test_a_tagged_generated_op_breaks_in_an_engines_capture_and_replay_recomputes(ops, capture_probe):
    from opforge import cuda_graphs

    cuda_graphs.register_capture(OneStepCapture)
    capture = OneStepCapture()
    x, out = torch.tensor([0.0, 2.0, 0.0, 3.0]), torch.empty(2, 1, dtype=torch.long)
    try:
        OneStepCapture.active = capture
        result = ops.nonzero(x, out=out)
    finally:
        OneStepCapture.active = None
        cuda_graphs.unregister_capture(OneStepCapture)
    assert result is out and out.tolist() == [[1], [3]]
    assert len(capture.breaks) == 1 and capture.breaks[0].name == f"{NAMESPACE}::nonzero"
    x.copy_(torch.tensor([5.0, 0.0, 0.0, 1.0]))
    capture.breaks[0]()  # the replay, past the guard though the probe still says "capturing"
    assert out.tolist() == [[0], [3]]
    x.copy_(torch.tensor([5.0, 1.0, 1.0, 1.0]))  # four nonzeros: nonzero.out resizes `out`
    with pytest.raises(RuntimeError, match=f"{NAMESPACE}::nonzero: return 0 is the captured tensor, but the kernel "
                                           r"resized it at replay \(to \[4, 1\], captured as \[2, 1\]\)"):
        capture.breaks[0]()


def test_identical_regeneration_writes_nothing_and_compiles_nothing(generated):
    again = _generate.generate_aten(SUBSET, NAMESPACE, generated.out_dir, jobs=2)
    assert again.written == []
    assert again.build.compiled == [] and not again.build.linked


def test_a_changed_allowlist_recompiles_only_the_table():
    out = os.path.join(OUT, "changes")
    _generate.generate_aten(["abs", "neg"], "opforge_test_changes", out, tests=False)
    changed = _generate.generate_aten(["abs"], "opforge_test_changes", out, tests=False)
    assert changed.written == ["opforge_test_changes_ops.cc", "opforge_test_changes_ops.h", "opforge_test_changes.pyi",
                               "opforge_test_changes.py", "opforge_test_changes_ops.json"]
    assert changed.build.compiled == ["opforge_test_changes_ops.cc"]
    assert changed.build.linked
    restored = _generate.generate_aten(["abs", "neg"], "opforge_test_changes", out, tests=False)
    assert restored.build.compiled == ["opforge_test_changes_ops.cc"]


def test_progress_lines_go_to_stderr_unless_quiet(tmp_path, capsys):
    from opforge import cli

    allowlist = tmp_path / "list.txt"
    allowlist.write_text("abs\nneg\n")
    argv = ["gen", "aten", "--allowlist", str(allowlist), "--namespace", "opforge_test_cli",
            "--out", str(tmp_path / "out"), "--no-build", "--no-tests"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "[1/2] generating opforge_test_cli::abs <- aten::abs.out" in captured.err
    assert "opforge_test_cli: 2 ops for 2 of 2 allowlisted names" in captured.out
    assert sorted(os.listdir(tmp_path / "out")) == [
        "opforge_forward.cc", "opforge_forward.h", "opforge_test_cli.py", "opforge_test_cli.pyi",
        "opforge_test_cli_ops.cc", "opforge_test_cli_ops.h", "opforge_test_cli_ops.json"]
    assert cli.main(argv + ["--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_the_cli_reports_a_bad_allowlist_entry_and_exits_2(tmp_path, capsys):
    from opforge import cli

    allowlist = tmp_path / "list.txt"
    allowlist.write_text("abs\nadd.out\n")
    code = cli.main(["gen", "aten", "--allowlist", str(allowlist), "--namespace", "x", "--out", str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err == (
        "opforge gen aten: error: list.txt:2: 'add.out' names an overload; the allowlist takes base names, "
        "every overload is generated: write 'add'.\n")


def test_strict_mode_fails_on_a_name_it_cannot_generate(tmp_path, capsys):
    from opforge import cli

    allowlist = tmp_path / "list.txt"
    allowlist.write_text("abs\nnot_an_op\n")
    code = cli.main(["gen", "aten", "--allowlist", str(allowlist), "--namespace", "x", "--out", str(tmp_path),
                     "--strict", "--no-build", "--no-tests"])
    assert code == 2
    assert "--strict: these allowlist names cannot be generated: not_an_op (torch" in capsys.readouterr().err


def test_the_runtime_module_loads_the_library_and_exposes_the_ops(generated):
    sys.path.insert(0, generated.out_dir)
    try:
        module = importlib.import_module(NAMESPACE)
        assert module.abs is getattr(torch.ops, NAMESPACE).abs
    finally:
        sys.path.remove(generated.out_dir)
        sys.modules.pop(NAMESPACE, None)


def test_progress_prints_first_last_and_a_bounded_number_of_steps():
    import io

    stream = io.StringIO()
    progress = Progress(stream=stream, lines=4)
    for i in range(1, 101):
        progress.step(i, 100, f"op{i}")
    assert stream.getvalue().splitlines() == [
        "[  1/100] op1", "[ 25/100] op25", "[ 50/100] op50", "[ 75/100] op75", "[100/100] op100"]
