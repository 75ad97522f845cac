"""opforge.deploy (docs/deploy.md): what an exported program needs where it
runs, and the opt-in refusal to package a program for a Python-free runtime
when one of its ops has only a Python kernel."""

import io
import os

import pytest
import torch

import opforge
import kernel_library
from op_testing import AOTI_RUNS_OUT_VARIANT_OPS, needs_torch, ns  # noqa: F401

Tensor = torch.Tensor

# The tests of a program that calls the example library. In the stable pass
# (OPFORGE_KERNELS=stable) that library is its stable-ABI build, which torch
# 2.9 cannot build.
CALLS_THE_LIBRARY = needs_torch("2.10", "a library built on torch's stable ABI",
                                kernel_library.STABLE_BUILDS or kernel_library.mode() != "stable")


@pytest.fixture(scope="module")
def kernels():
    return kernel_library.load()


def program(ns, kernels):
    @opforge.op(f"{ns}::shift", fake=lambda x: torch.empty_like(x))
    def shift(x: Tensor) -> Tensor:
        return x + 1

    class Model(torch.nn.Module):
        def forward(self, x, w):
            out = torch.empty_like(x)
            kernels.rms_norm(out, x, w, opforge.structs.kernels.NormCfg())
            return shift(out) * 2

    return torch.export.export(Model(), (torch.randn(2, 8), torch.randn(8)))


@CALLS_THE_LIBRARY
def test_requirements_list_each_cpp_library_with_its_ops_the_runtime_and_the_python_ops(ns, kernels):
    needs = opforge.deploy.requirements(program(ns, kernels))
    assert list(needs.libraries.values()) == [("kernels::rms_norm",)]
    (library,) = needs.libraries
    assert os.path.samefile(library, kernel_library.library_path())
    assert needs.python_ops == (f"{ns}::shift",)
    assert needs.other_ops == ()
    names = [os.path.basename(p) for p in needs.runtime]
    assert names[0] == "libopforge_core.so" and all(os.path.exists(p) for p in needs.runtime)
    if kernel_library.mode() == "unstable":
        assert names == ["libopforge_core.so", "libopforge_torch.so"]


@CALLS_THE_LIBRARY
def test_a_python_free_package_of_a_program_with_a_python_op_is_refused_before_compiling(ns, kernels, monkeypatch):
    calls = []
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", lambda *a, **k: calls.append(k) or "model.pt2")
    ep = program(ns, kernels)
    with pytest.raises(ValueError, match=rf"^opforge.deploy: the program calls {ns}::shift, defined in Python with "
                                         r"@opforge.op: a Python-free runtime .* has no kernel for it\. Give each a C\+\+ "
                                         r"kernel in an OPFORGE_LIBRARY"):
        opforge.deploy.aoti_compile_and_package(ep, package_path="model.pt2", python_free=True)
    assert calls == []
    # Without the check it packages, for a runtime that runs Python.
    assert opforge.deploy.aoti_compile_and_package(ep, package_path="model.pt2") == "model.pt2"
    assert calls == [{"package_path": "model.pt2"}]


def test_requirements_take_only_a_program(ns):
    with pytest.raises(TypeError, match=r"takes a torch.export.ExportedProgram or a torch.fx.GraphModule, not Linear"):
        opforge.deploy.requirements(torch.nn.Linear(2, 2))


@CALLS_THE_LIBRARY
@AOTI_RUNS_OUT_VARIANT_OPS
def test_the_deploy_example_runs_its_package_in_a_cpp_program_bitwise_equal_to_eager(kernels):
    import subprocess
    import sys

    from cpp_ext import BUILD, ROOT, build

    out = build("examples/deploy", f"deploy_example_{kernel_library.mode()}")
    package = os.path.join(out, "model.pt2")
    exported = kernel_library.run_python(f"""
        import runpy, sys
        sys.argv = ["export_model.py", {kernel_library.library_path()!r}, {package!r}]
        runpy.run_path({os.path.join(ROOT, "examples", "deploy", "export_model.py")!r}, run_name="__main__")
    """)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert "libraries={" in exported.stdout and "'kernels::rms_norm'" in exported.stdout
    assert exported.stdout.split()[-2:] == ["python", "True"], exported.stdout
    child = subprocess.run([os.path.join(out, "run_model"), kernel_library.library_path(), package],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout + child.stderr
    assert child.stdout.strip() == "bitwise"


MODEL_MODULE = '''
import dataclasses, torch, opforge
import kernel_library

kernels = kernel_library.load()


@dataclasses.dataclass(frozen=True)
class Scale:
    factor: float = 2.0
    bias: float = 0.0


@opforge.op("deploy_saved::scale", fake=lambda x, cfg: torch.empty_like(x))
def scale(x: torch.Tensor, cfg: Scale) -> torch.Tensor:
    return x * cfg.factor + cfg.bias


class Model(torch.nn.Module):
    def forward(self, x, w):
        out = torch.empty_like(x)
        kernels.rms_norm(out, x, w, opforge.structs.kernels.NormCfg(eps=1e-5))
        return scale(out, Scale(3.0, 0.5))


def inputs():
    return torch.sin(torch.arange(4 * 16, dtype=torch.float32)).reshape(4, 16), torch.cos(torch.arange(16.0))
'''


@CALLS_THE_LIBRARY
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_saved_program_with_python_and_cpp_ops_loads_and_runs_in_a_fresh_process(tmp_path, dynamic):
    (tmp_path / "saved_model.py").write_text(MODEL_MODULE)
    saved = tmp_path / "model.pt2"
    dims = "{'x': {0: torch.export.Dim('rows', min=2)}, 'w': None}" if dynamic else "None"
    prologue = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\nimport torch, saved_model\n"
    made = kernel_library.run_python(prologue + f"""
ep = torch.export.export(saved_model.Model(), saved_model.inputs(), dynamic_shapes={dims})
torch.export.save(ep, {str(saved)!r})
""")
    assert made.returncode == 0, made.stderr
    # A fresh process: importing the module registers both ops before the load.
    ran = kernel_library.run_python(prologue + f"""
ep = torch.export.load({str(saved)!r})
x, w = saved_model.inputs()
if {dynamic}:
    x = torch.cat([x, x])
print(torch.equal(ep.module()(x, w), saved_model.Model()(x, w)))
""")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split()[-1] == "True"


@CALLS_THE_LIBRARY
def test_deploy_load_of_a_program_whose_ops_are_missing_names_each_op_and_what_registers_it(tmp_path):
    (tmp_path / "saved_model.py").write_text(MODEL_MODULE)
    saved = tmp_path / "model.pt2"
    prologue = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\nimport torch, opforge\n"
    made = kernel_library.run_python(prologue + f"""
import saved_model
opforge.deploy.save(torch.export.export(saved_model.Model(), saved_model.inputs()), {str(saved)!r},
                    extra_files={{"note.txt": "mine"}})
""")
    assert made.returncode == 0, made.stderr
    # A fresh process that registers neither op: opforge's error, not torch's "Could not find schema".
    missing = kernel_library.run_python(prologue + f"""
try:
    opforge.deploy.load({str(saved)!r})
except RuntimeError as e:
    print(e)
""")
    assert missing.returncode == 0, missing.stderr
    text = missing.stdout
    assert "Could not find schema" not in text
    assert f"opforge.deploy.load: {saved} calls ops this process has not registered" in text
    library = os.path.basename(kernel_library.library_path())
    assert "kernels::rms_norm: from the opforge library " + library in text
    assert "call opforge.load_library(path)" in text
    assert "deploy_saved::scale: defined in Python with @opforge.op: import saved_model" in text
    # Loading the library alone leaves only the Python op to name.
    half = kernel_library.run_python(prologue + f"""
import kernel_library
kernel_library.load()
try:
    opforge.deploy.load({str(saved)!r})
except RuntimeError as e:
    print(e)
""")
    assert "deploy_saved::scale" in half.stdout and "kernels::rms_norm" not in half.stdout, half.stdout + half.stderr
    # With the module imported it loads and runs; the user's extra file comes back, opforge's record does not.
    ran = kernel_library.run_python(prologue + f"""
import saved_model
extra = {{}}
ep = opforge.deploy.load({str(saved)!r}, extra_files=extra)
x, w = saved_model.inputs()
print(sorted(extra), torch.equal(ep.module()(x, w), saved_model.Model()(x, w)))
""")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split()[-2:] == ["['note.txt']", "True"], ran.stdout


def test_deploy_save_takes_an_exported_program_and_keeps_its_record_name(tmp_path, ns):
    with pytest.raises(TypeError, match="opforge.deploy.save takes a torch.export.ExportedProgram, not Linear"):
        opforge.deploy.save(torch.nn.Linear(2, 2), tmp_path / "m.pt2")
    ep = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    with pytest.raises(ValueError, match="extra_files may not hold 'opforge-requirements.json'"):
        opforge.deploy.save(ep, tmp_path / "m.pt2", extra_files={opforge.deploy.RECORD: "x"})
    assert not (tmp_path / "m.pt2").exists()
    # A program torch.export.save wrote (no record) loads through opforge.deploy.load as through torch's.
    torch.export.save(ep, tmp_path / "plain.pt2")
    x = torch.randn(1, 2)
    assert torch.equal(opforge.deploy.load(tmp_path / "plain.pt2").module()(x), ep.module()(x))
    # A file object: load reads the record, then torch reads the program from where the file was.
    buffer = io.BytesIO()
    opforge.deploy.save(ep, buffer)
    buffer.seek(0)
    assert torch.equal(opforge.deploy.load(buffer).module()(x), ep.module()(x))
