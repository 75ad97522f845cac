"""The torch opforge was built against: recorded at build time, checked before
`opforge._C` loads, printed by `opforge --version` (docs/versions.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import opforge
from opforge import _build_info, _torch_version, cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILT = _build_info.TORCH_VERSION
MAJOR, MINOR = _torch_version.abi_line(BUILT)


def import_under(fake_version: str) -> subprocess.CompletedProcess:
    """`import opforge` in a fresh process whose torch reports `fake_version`."""
    code = (
        "import sys, torch\n"
        f"torch.__version__ = {fake_version!r}\n"
        "try:\n"
        "    import opforge\n"
        "except ImportError as e:\n"
        "    print('loaded _C:', 'opforge._C' in sys.modules)\n"
        "    raise\n"
        "print('imported', opforge.__version__)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_the_build_records_the_torch_it_was_built_against():
    assert BUILT == torch.__version__
    assert _torch_version.built_against() == BUILT
    assert _build_info.INSTALL_KIND in ("editable", "wheel")


def test_opforge_torch_and_package_versions_agree():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        declared = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    assert opforge.__version__ == declared == _build_info.OPFORGE_VERSION


def test_the_torch_requirement_is_the_oldest_torch_the_docs_support():
    # pip would otherwise replace a supported torch (2.10, say) with a newer one.
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        required = re.search(r'^dependencies = \["torch>=([0-9.]+)"\]', f.read(), re.M).group(1)
    with open(os.path.join(ROOT, "docs", "versions.md")) as f:
        oldest = re.search(r"supports torch ([0-9.]+) through", f.read()).group(1)
    assert required == oldest


def test_importing_under_another_torch_minor_fails_with_one_sentence_naming_both_versions():
    fake = f"{MAJOR}.{MINOR + 2}.0+cu999"
    result = import_under(fake)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    print(last)  # shown with -s: the message a user sees
    assert re.fullmatch(
        rf"ImportError: opforge was built against torch {re.escape(BUILT)} but torch {re.escape(fake)} is "
        r"installed; rebuild it for this torch with `pip install --no-build-isolation --no-deps "
        r"(-e (?P<src>\S+)` \(or `make build` in (?P=src)\)|--force-reinstall \.` in the opforge source tree)\.",
        last), last
    # One sentence, checked before the extension was loaded: no symbol error.
    assert last.count(". ") == 0 and "undefined symbol" not in result.stderr
    assert "loaded _C: False" in result.stdout


def test_an_editable_install_names_its_own_source_tree_in_the_rebuild_command():
    if _build_info.INSTALL_KIND != "editable":
        pytest.skip("opforge is installed from a wheel here: the message names no source tree")
    assert os.path.samefile(_build_info.SOURCE_DIR, ROOT)
    message = _torch_version.mismatch_message("2.13.0+cpu", "2.15.0", "editable", ROOT)
    assert message == (f"opforge was built against torch 2.13.0+cpu but torch 2.15.0 is installed; rebuild it for "
                       f"this torch with `pip install --no-build-isolation --no-deps -e {ROOT}` "
                       f"(or `make build` in {ROOT}).")


def test_importing_under_an_older_torch_minor_fails_too():
    result = import_under(f"{MAJOR}.{MINOR - 2}.1")
    assert result.returncode == 1
    assert f"but torch {MAJOR}.{MINOR - 2}.1 is installed" in result.stderr.strip().splitlines()[-1]


def test_another_patch_release_or_device_build_of_the_same_minor_imports():
    result = import_under(f"{MAJOR}.{MINOR}.9+cu999")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"imported {opforge.__version__}"


@pytest.mark.parametrize("built, running, ok", [
    ("2.13.0+cpu", "2.13.0", True),
    ("2.14.1+cu130", "2.14.0", True),
    ("2.13.0", "2.11.0", False),
    ("2.13.0", "2.15.0+cu132", False),
    ("2.13.0", "3.13.0", False),
    ("2.16.0.dev20260101+cpu", "2.16.0a0+git1234", True),
    ("", "2.13.0", False),
])
def test_the_check_compares_major_and_minor_only(built, running, ok):
    if ok:
        _torch_version.check(built, running)
    else:
        with pytest.raises(ImportError, match=rf"^opforge was built against torch {re.escape(built)} but torch "):
            _torch_version.check(built, running)


def test_a_wheel_install_points_at_the_source_tree_to_rebuild():
    assert _torch_version.mismatch_message("2.13.0", "2.15.0") == (
        "opforge was built against torch 2.13.0 but torch 2.15.0 is installed; rebuild it for this torch with "
        "`pip install --no-build-isolation --no-deps --force-reinstall .` in the opforge source tree.")


def expected_version_line() -> str:
    return f"opforge {opforge.__version__} (built against torch {BUILT})"


def test_version_flag_prints_opforge_and_the_torch_it_was_built_against(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == expected_version_line() + "\n"


def test_version_names_the_running_torch_when_it_is_another_build_of_the_same_minor(monkeypatch):
    monkeypatch.setattr(torch, "__version__", f"{MAJOR}.{MINOR}.9+cu999")
    assert cli.version_text() == (f"opforge {opforge.__version__} (built against torch {BUILT}, "
                                  f"running torch {MAJOR}.{MINOR}.9+cu999)")


def test_python_dash_m_opforge_prints_the_version():
    result = subprocess.run([sys.executable, "-m", "opforge", "--version"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected_version_line() + "\n"


def test_the_console_script_prints_the_same_version():
    script = os.path.join(os.path.dirname(sys.executable), "opforge")
    if not os.path.exists(script):
        pytest.skip("no opforge console script beside this Python (opforge not pip-installed here)")
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected_version_line() + "\n"


def test_python_dash_m_opforge_runs_subcommands_like_the_console_script(capsys):
    result = subprocess.run([sys.executable, "-m", "opforge", "inspect", "aten::pow"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert cli.main(["inspect", "aten::pow"]) == 0
    assert result.stdout == capsys.readouterr().out
    assert "aten::pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor" in result.stdout


def test_python_dash_m_opforge_reports_usage_errors_like_the_console_script():
    result = subprocess.run([sys.executable, "-m", "opforge", "inspect", "nowhere::nothing"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip() == ("opforge inspect: no operator named 'nowhere::nothing' is registered. "
                                     "Import the module that defines it with --import MODULE.")


def check_in_cmake(tmp_path, built: str, found: str) -> subprocess.CompletedProcess:
    script = tmp_path / "check.cmake"
    script.write_text(f'set(Python_EXECUTABLE "/env/bin/python")\n'
                      f'include("{os.path.join(ROOT, "cmake", "OpforgeTorch.cmake")}")\n'
                      f'opforge_check_torch_version("{built}" "{found}")\n'
                      f'message(STATUS "torch versions agree")\n')
    return subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True, timeout=60)


def test_find_package_records_the_torch_opforge_was_built_against():
    path = os.path.join(opforge.cmake_prefix_path, "share", "cmake", "opforge", "opforgeTorchVersion.cmake")
    with open(path) as f:
        assert f.read() == f'set(opforge_TORCH_VERSION "{BUILT}")\n'


def test_find_package_refuses_a_torch_of_another_minor(tmp_path):
    result = check_in_cmake(tmp_path, "2.13.0+cpu", "2.15.0")
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert ("opforge was built against torch 2.13.0+cpu but /env/bin/python has torch 2.15.0; rebuild opforge "
            "for this torch (docs/versions.md) or set Python_EXECUTABLE to the Python it was built for.") in message


def test_find_package_accepts_another_patch_release_of_the_same_minor(tmp_path):
    result = check_in_cmake(tmp_path, "2.14.1+cu130", "2.14.0")
    assert result.returncode == 0, result.stderr
    assert "torch versions agree" in result.stdout
