"""`opforge gen` given a path it cannot use ends with one line on stderr that
names the path and the fix, and exit status 2, never a traceback. The cases
the issue names run the command line in its own process, as a user runs it
(`gen`); the others run `opforge.cli.main` in this process (`gen_here`),
where an exception escaping it fails the test just the same."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

from cpp_ext import build
from kernel_library import STABLE_BUILDS
from opforge import cli


def gen(cwd, *argv, **env):
    """Runs `python -m opforge gen ARGV` in `cwd`; returns the finished process."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([sys.executable, "-m", "opforge", "gen", *argv], capture_output=True, text=True,
                          cwd=cwd, env=environment, timeout=300)


@pytest.fixture
def gen_here(tmp_path, capsys, monkeypatch):
    """`gen` in this process: runs `opforge gen ARGV` in tmp_path, which is on sys.path. The modules it
    imported from there are forgotten afterwards, so that another test's module of the same name is imported."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def run(cwd, *argv, **env):
        assert cwd == tmp_path
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        code = cli.main(["gen", *argv])
        captured = capsys.readouterr()
        return types.SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)

    yield run
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def error_line(result, command: str) -> str:
    """The one line the command printed, without its 'opforge gen COMMAND: error: ' prefix; fails unless the
    command exited with 2, printed nothing on stdout, no traceback, and only that line on stderr."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    prefix = f"opforge gen {command}: error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix):]


@pytest.fixture
def allowlist(tmp_path):
    (tmp_path / "list.txt").write_text("abs\n")
    return "list.txt"


def test_load_of_a_file_that_is_not_a_shared_library(tmp_path):
    (tmp_path / "ops.txt").write_text("not a library\n")
    message = error_line(gen(tmp_path, "stubs", "--namespace", "x", "--out", "out", "--load", "ops.txt"), "stubs")
    assert message.startswith("--load ops.txt: not a loadable shared library (")
    assert message.endswith("); pass an operator library built for this torch and platform (a .so).")
    assert not (tmp_path / "out").exists()


def test_load_of_a_directory(tmp_path, gen_here):
    (tmp_path / "lib").mkdir()
    message = error_line(gen_here(tmp_path, "stubs", "--namespace", "x", "--out", "out", "--load", "lib"), "stubs")
    assert message == "--load lib: is a directory; pass the path of a built operator library (a .so file)."


def test_load_of_a_missing_file(tmp_path, gen_here):
    message = error_line(gen_here(tmp_path, "stubs", "--namespace", "x", "--out", "out", "--load", "gone.so"),
                         "stubs")
    assert message == "--load gone.so: no such file; pass the path of a built operator library."


def test_load_of_a_shared_library_that_defines_no_operators_of_the_namespace(tmp_path):
    # A real shared library, but not one of operators: torch's own c10.
    c10 = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    message = error_line(gen(tmp_path, "stubs", "--namespace", "nothing_here", "--out", "out", "--load", c10),
                         "stubs")
    assert message == (f"--load {c10} registered no operators under namespace 'nothing_here'; check --namespace, "
                       "or pass the library or module that defines them.")
    assert not (tmp_path / "out").exists()


def test_load_of_an_opforge_library_whose_blocks_failed_names_the_library_and_the_first_error(tmp_path):
    # Built as tests/python/test_cpp_mistakes.py builds it (its C++ API library has blocks that fail).
    built = build("tests/cpp_ext/mistakes", "mistakes", f"MISTAKES_STABLE={'ON' if STABLE_BUILDS else 'OFF'}")
    library = os.path.join(built, "libopforge_test_mistakes_unstable.so")
    result = gen(tmp_path, "stubs", "--namespace", "mistakes_unstable", "--out", "out", "--load", library)
    assert "Traceback" not in result.stderr and result.returncode == 2, result.stderr
    # The library prints each block's error as it loads; opforge gen's own line comes last.
    printed = result.stderr.splitlines()
    last = printed[-1]
    count = sum(line.startswith("opforge: libopforge_test_mistakes_unstable.so: ") for line in printed)
    assert count >= 2
    assert last.startswith(f"opforge gen stubs: error: --load {library}: {count} of its OPFORGE_LIBRARY blocks could "
                           "not be registered, the first: libopforge_test_mistakes_unstable.so: "
                           "OPFORGE_LIBRARY(mistakes_optional_unstable) at "), last
    assert last.endswith("Nothing of this block was registered. Fix them and rebuild the library.")
    assert not (tmp_path / "out").exists()


def test_import_of_a_module_that_raises_names_the_module_and_its_line(tmp_path, gen_here):
    (tmp_path / "broken_ops.py").write_text("import torch\n\nraise ValueError('the table is empty.')\n")
    message = error_line(gen_here(tmp_path, "stubs", "--namespace", "x", "--out", "out", "--import", "broken_ops"),
                         "stubs")
    assert message == (f"--import broken_ops: importing it raised ValueError at {tmp_path / 'broken_ops.py'}:3: "
                       "the table is empty; fix the module, or import it in Python to see the whole traceback.")


def test_import_of_a_module_with_a_syntax_error_names_its_line(tmp_path, gen_here):
    (tmp_path / "typo_ops.py").write_text("x = 1\ndef f(:\n")
    message = error_line(gen_here(tmp_path, "stubs", "--namespace", "x", "--out", "out", "--import", "typo_ops"),
                         "stubs")
    assert message.startswith(f"--import typo_ops: importing it raised SyntaxError at {tmp_path / 'typo_ops.py'}:2: ")


def test_import_of_a_module_whose_op_opforge_refuses_gives_opforges_message(tmp_path, gen_here):
    (tmp_path / "unannotated_ops.py").write_text(
        "import opforge\n\n\n@opforge.op('gen_cli_errors::f')\ndef f(x):\n    return x\n")
    message = error_line(gen_here(tmp_path, "stubs", "--namespace", "gen_cli_errors", "--out", "out",
                             "--import", "unannotated_ops"), "stubs")
    assert message.startswith(f"--import unannotated_ops: importing it raised SignatureError at "
                              f"{tmp_path / 'unannotated_ops.py'}:4: gen_cli_errors::f: parameter 'x': missing type "
                              "annotation")


@pytest.mark.parametrize("command", ["aten", "stubs"])
def test_out_naming_an_existing_file(tmp_path, allowlist, command, gen_here):
    (tmp_path / "out").write_text("")
    args = (["--allowlist", allowlist, "--namespace", "gen_cli_errors", "--no-build", "--no-tests", "--quiet"]
            if command == "aten" else ["--namespace", "aten", "--quiet"])
    message = error_line(gen_here(tmp_path, command, *args, "--out", "out"), command)
    assert message == "--out out: is a file, not a directory; pass a directory (it is created if missing)."
    assert (tmp_path / "out").read_text() == ""


def test_out_below_an_existing_file(tmp_path, allowlist, gen_here):
    (tmp_path / "out").write_text("")
    message = error_line(gen_here(tmp_path, "aten", "--allowlist", allowlist, "--namespace", "gen_cli_errors",
                             "--out", "out/gen", "--no-build", "--no-tests", "--quiet"), "aten")
    assert message == ("--out out/gen: cannot create the directory (Not a directory: out/gen); pass a directory "
                       "that can be created or written.")


def test_build_dir_naming_an_existing_file(tmp_path, allowlist, gen_here):
    (tmp_path / "build").write_text("")
    message = error_line(gen_here(tmp_path, "aten", "--allowlist", allowlist, "--namespace", "gen_cli_errors",
                             "--out", "out", "--build-dir", "build", "--no-tests", "--quiet"), "aten")
    assert message == "--build-dir build: is a file, not a directory; pass a directory (it is created if missing)."
    assert not (tmp_path / "out").exists()  # refused before anything is generated


def test_a_generated_file_that_cannot_be_written(tmp_path, gen_here):
    (tmp_path / "gen_cli_errors_ops.py").write_text(
        "import torch\n"
        "lib = torch.library.Library('gen_cli_errors_w', 'DEF')\n"
        "lib.define('twice(Tensor x) -> Tensor')\n")
    (tmp_path / "out" / "gen_cli_errors_w.pyi").mkdir(parents=True)
    message = error_line(gen_here(tmp_path, "stubs", "--namespace", "gen_cli_errors_w", "--out", "out",
                             "--import", "gen_cli_errors_ops", "--quiet"), "stubs")
    assert message == ("cannot write out/gen_cli_errors_w.pyi (Is a directory: out/gen_cli_errors_w.pyi); make its "
                       "directory a writable directory, or pass another one.")


def test_allowlist_that_is_not_utf8_names_the_file_and_the_line(tmp_path, gen_here):
    (tmp_path / "list.txt").write_bytes(b"abs\n# \xe9l\xe9ments\nadd\n")  # Latin-1
    message = error_line(gen_here(tmp_path, "aten", "--allowlist", "list.txt", "--namespace", "gen_cli_errors",
                             "--out", "out", "--no-build", "--no-tests"), "aten")
    assert message == ("allowlist 'list.txt' is not UTF-8 text (byte 0xe9 on line 2); save it as UTF-8, one ATen "
                       "base name per line.")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("path, reason", [("missing.txt", "No such file or directory"), (".", "Is a directory")])
def test_allowlist_that_cannot_be_read(tmp_path, path, reason, gen_here):
    message = error_line(gen_here(tmp_path, "aten", "--allowlist", path, "--namespace", "gen_cli_errors",
                             "--out", "out", "--no-build", "--no-tests"), "aten")
    assert message == f"cannot read allowlist {path!r}: {reason}; pass an existing file to --allowlist."


def test_a_compiler_that_does_not_exist_is_named(tmp_path, allowlist, gen_here):
    message = error_line(gen_here(tmp_path, "aten", "--allowlist", allowlist, "--namespace", "gen_cli_errors",
                             "--out", "out", "--no-tests", "--quiet", CXX="no-such-compiler-here"), "aten")
    assert message == ("cannot run the C++ compiler 'no-such-compiler-here' (No such file or directory); install "
                       "one, name it in CXX, or pass --no-build.")
