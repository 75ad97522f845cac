"""`opforge inspect`, `opforge demo` and `opforge bench` on the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opforge import _demo, cli


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def table_row(out: str, label: str) -> list[float]:
    """The numbers of a bench table's row: '  custom_op (flat)   361.9   45.24   0.32' -> [361.9, 45.24, 0.32];
    fails unless exactly one line has the label and every column after it is a number."""
    (line,) = [line for line in out.splitlines() if line.strip().startswith(label + "  ")]
    return [float(v.rstrip("x")) for v in line.strip()[len(label):].split()]


def test_inspect_prints_signature_schema_and_mapping_tree(capsys):
    code, out, _ = run_cli(capsys, "inspect", "opforge_demo::attention", "--import", "opforge._demo")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "opforge_demo::attention"
    assert lines[1] == "  signature  attention(q: Tensor, k: Tensor, v: Tensor, cfg: AttnCfg) -> Tensor"
    assert lines[3] == ("  schema     opforge_demo::attention(Tensor q, Tensor k, Tensor v, float cfg__scale, "
                        "float? cfg__softcap=None, bool cfg__mask__is_set=False, bool? cfg__mask__causal=None, "
                        "SymInt? cfg__mask__window=None) -> Tensor")
    assert "    cfg: AttnCfg" in lines
    assert "      mask: Optional[Mask]" in lines
    assert any(line.split() == ["(is", "set)", "[5]", "bool", "cfg__mask__is_set=False", "(presence", "flag)"]
               for line in lines)
    assert any(line.split() == ["window", "[7]", "SymInt?", "cfg__mask__window=None"] for line in lines)


def test_inspect_shows_enum_values_mutation_and_struct_returns(capsys):
    _, out, _ = run_cli(capsys, "inspect", "opforge_demo::reduce")
    assert "(enum Reduce: 'sum', 'max')" in out
    _, out, _ = run_cli(capsys, "inspect", "opforge_demo::accumulate")
    assert "Tensor(a1!) acc__total  (mutated)" in out
    _, out, _ = run_cli(capsys, "inspect", "opforge_demo::minmax")
    assert "    value: MinMax" in out and "autograd   no backward" in out
    _, out, _ = run_cli(capsys, "inspect", "opforge_demo::weighted")
    assert "autograd   backward registered" in out


def test_inspect_source_prints_the_generated_code(capsys):
    code, out, _ = run_cli(capsys, "inspect", "opforge_demo::affine", "--source")
    assert code == 0
    assert "    def _call(_self, x, cfg):" in out
    assert "    def _make_fake_kernel(_fn):" in out


def test_inspect_an_unknown_op_is_a_clear_error(capsys):
    code, out, err = run_cli(capsys, "inspect", "nowhere::nothing")
    assert code == 2 and out == ""
    assert err.strip() == ("opforge inspect: no operator named 'nowhere::nothing' is registered. "
                           "Import the module that defines it with --import MODULE.")


def test_inspect_a_malformed_name_or_missing_module_is_a_clear_error(capsys):
    code, _, err = run_cli(capsys, "inspect", "nothing")
    assert code == 2 and "the op name must have the form 'namespace::name'" in err
    code, _, err = run_cli(capsys, "inspect", "x::y", "--import", "no_such_module_anywhere")
    assert code == 2 and "cannot import 'no_such_module_anywhere'" in err


def test_inspect_an_op_opforge_did_not_define_shows_torch_schemas(capsys):
    code, out, _ = run_cli(capsys, "inspect", "aten::pow")
    assert code == 0
    assert "not defined with @opforge.op" in out
    assert "    aten::pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor" in out


def test_demo_runs_every_form_and_reports_its_checks(capsys):
    code, out, _ = run_cli(capsys, "demo", "--backend", "eager")
    assert code == 0
    for form in ("plain", "struct", "nested + optional struct", "enum + Literal + list default",
                 "mutation inside a struct", "backward", "handle", "struct return"):
        assert f"\n  {form}: opforge_demo::" in out
    assert "compiled (fullgraph, 0 graph breaks) ok" in out
    assert "backward ok, compiled backward ok" in out
    assert out.rstrip().endswith("8 ops, 18 of 18 checks passed")


def test_demo_exits_non_zero_when_a_check_fails(capsys, monkeypatch):
    real_steps = _demo._steps

    def broken_steps():
        step = real_steps()[0]
        step.reference = lambda x: x * 100.0
        return [step]

    monkeypatch.setattr(_demo, "_steps", broken_steps)
    code, out, _ = run_cli(capsys, "demo", "--backend", "eager")
    assert code == 1
    assert "eager FAILED" in out and out.rstrip().endswith("0 of 2 checks passed; 2 FAILED")


def test_bench_prints_every_row_and_the_budgets(capsys):
    code, out, _ = run_cli(capsys, "bench", "--args", "1,5", "--repeats", "1", "--min-time", "0.001",
                           "--registrations", "2", "--no-cpp")
    assert code == 0
    for row in ("opforge struct op (eager fast path)", "Library.define + impl", "torch.library.custom_op, flat",
                "custom_op + register_autograd", "plain torch.autograd.Function",
                "plain Python call of the body", "struct op / plain call of the body",
                "struct op / define+impl flat", "custom_op flat / struct op (speed-up)",
                "custom_op+autograd / opforge, fwd+bwd", "registration, ms per op",
                "5 args, distinct signatures", "opforge op through torch.ops, flat",
                "opforge / torch.neg, fwd+.sum().backward()", "opforge / autograd.Function, fwd+out.backward(G)",
                "op through torch.ops / define+impl"):
        assert row in out, row
    assert "budget <= 0.25x" in out and "budget <= 3x" in out and "budget >= 4x" in out and "budget <= 0.3 ms" in out
    assert "budget <= 1.15x" in out and "budget <= 1.0x" in out


def test_bench_compiled_runs_each_model_and_prints_the_step_ratio(capsys, tmp_path):
    out_file = tmp_path / "compiled.json"
    code, out, _ = run_cli(capsys, "bench", "--compiled", "--compiled-layers", "2", "--compiled-dim", "8",
                           "--backend", "eager", "--repeats", "1", "--min-time", "0.001", "--json", str(out_file))
    assert code == 0
    assert "2 layers x 4 ops (2 tensors + a struct of 5 scalars), backend eager" in out
    result = json.loads(out_file.read_text())
    assert result["ops"] == 8
    assert list(result["rows"]) == ["opforge struct op", "define+impl (flat)", "custom_op (flat)"]
    # step µs, per op µs, compile s: the JSON's numbers, as printed.
    for label, row in result["rows"].items():
        assert table_row(out, label) == [round(row["step_us"], 1), round(row["step_us"] / 8, 2),
                                         round(row["compile_s"], 2)], label
    ratio_line = next(line for line in out.splitlines() if "step, opforge / define+impl" in line)
    ratio = result["rows"]["opforge struct op"]["step_us"] / result["rows"]["define+impl (flat)"]["step_us"]
    assert ratio_line.split() == ["step,", "opforge", "/", "define+impl", f"{ratio:.2f}x", "budget", "<=", "1.0x:",
                                  *(["met"] if ratio <= 1.0 else ["NOT", "met"])]


def test_bench_compile_measures_every_stage_for_each_model(capsys, tmp_path):
    out_file = tmp_path / "compile.json"
    code, out, _ = run_cli(capsys, "bench", "--compile", "--compile-layers", "2", "--compile-leaves", "1",
                           "--compile-repeats", "1", "--registrations", "3", "--compiled-dim", "8", "--repeats", "1",
                           "--min-time", "0.001", "--no-compile-generated", "--json", str(out_file))
    assert code == 0
    result = json.loads(out_file.read_text())
    # The generated-ops row (tests/python/test_bench_compile.py) is left out: nothing built.
    assert result["generated"] is None
    assert list(result["registration"]) == ["1"] and list(result["layers"]) == ["2"]
    rows = result["layers"]["2"]
    assert list(rows) == ["opforge struct op", "define+impl (flat)", "custom_op (flat)"]
    assert all(r["recompiles"] == 1 for r in rows.values())
    assert "2 layers x 4 ops" in out and out.count("budget <=") == 5
    reg = result["registration"]["1"]
    line = next(x for x in out.splitlines() if x.strip().startswith("1 leaves"))
    assert f"{reg['opforge']:.3f}" in line and f"{reg['opforge'] / reg['custom_op']:.2f}x" in line


def test_bench_runners_compiles_each_model_once_and_prints_the_ratios(capsys, tmp_path):
    out_file = tmp_path / "runners.json"
    code, out, _ = run_cli(capsys, "bench", "--runners", "--layers", "6", "--dim", "16", "--backend", "eager",
                           "--repeats", "1", "--min-time", "0.001", "--compile-repeats", "1",
                           "--json", str(out_file))
    assert code == 0
    assert "6 layers, each compiled with fullgraph=True (backend eager)" in out
    for row in ("without runners (matmul inline)", "tensor op (weight as a Tensor)", "runner op (Handle[Runner])",
                "/ without runners", "/ tensor op"):
        assert row in out, row
    result = json.loads(out_file.read_text())
    assert [r["graphs"] for r in result["rows"].values()] == [1, 1, 1]  # six runners, one graph
    # compile s, graphs, step µs, eager µs: the JSON's numbers, as printed.
    for label, row in result["rows"].items():
        assert table_row(out, label) == [round(row["compile_s"], 2), row["graphs"], round(row["step_us"], 1),
                                         round(row["eager_step_us"], 1)], label


def test_bench_without_cuda_says_so(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code, _, err = run_cli(capsys, "bench", "--device", "cuda")
    assert code == 2 and "needs a CUDA GPU" in err


def test_the_entry_point_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "opforge.cli", "inspect", "opforge_demo::scale",
                             "--import", "opforge._demo"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "schema     opforge_demo::scale(Tensor x, float factor) -> Tensor" in result.stdout


def test_inspect_says_a_triton_ops_fake_is_its_traced_body_and_names_a_registered_one():
    pytest.importorskip("triton")
    import torch
    from triton_helpers import library

    import opforge
    from opforge import _inspect

    def body(x: torch.Tensor) -> torch.Tensor:
        return library.scale_forward(x, 3.0)

    traced = opforge.op("cli_test::triton_scale")(body)
    assert "  fake       the traced body (a Triton op: fake tensors run the body, the kernels stay " \
           "unlaunched)" in _inspect.describe(traced)
    traced.register_fake(lambda x: torch.empty_like(x))
    assert "  fake       registered" in _inspect.describe(traced)
    given = opforge.op("cli_test::triton_scale_given", fake=lambda x: torch.empty_like(x))(body)
    assert "  fake       registered" in _inspect.describe(given)
