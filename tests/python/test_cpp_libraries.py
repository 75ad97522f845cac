"""C++ kernel libraries as the field writes them (docs/cpp_ops.md): vLLM-style
registrations, two libraries in one process, load errors, the first call
under torch.compile, and symmetric-memory tags, through the example
libraries in examples/ and tests/cpp_ext."""

import ctypes
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opforge
from opforge._torch_version import abi_line

import kernel_library
from kernel_library import STABLE_BUILDS, rms_norm_ref, run_python
from op_testing import needs_torch
from cpp_ext import ROOT, build, load


@pytest.fixture(scope="module")
def kernels():
    return kernel_library.load()


@pytest.fixture(scope="module")
def kernels_b():
    opforge.load_library(os.path.join(build("examples/kernel_library_b", "kernel_library_b"),
                                      "libopforge_kernels_b.so"))
    return opforge.ops.sgl_kernels


@pytest.fixture(scope="module")
def ext():
    return load()


def test_every_alias_form_torch_registers_lowers_to_a_schema_torch_can_define():
    def canonical(text):
        names = {}

        def rename(match):
            return names.setdefault(match.group(0), f"s{len(names)}")

        # Alias set names, as written or as `Tensor!`'s `$0` / opforge's `_0`.
        return re.sub(r"(?<=[(|])[$\w]+(?=[!|)]| ->)|(?<=-> )[$\w*]+", rename, text)

    import torch.distributed.tensor  # noqa: F401  (registers more ops)

    checked = 0
    for schema in torch._C._jit_get_all_schemas():
        printed = str(schema)
        if "(" not in printed.split("->")[0][printed.index("("):] and "!" not in printed:
            continue
        if not any(arg.alias_info for arg in (*schema.arguments, *schema.returns)):
            continue
        try:
            definable = opforge._C.print_definable(printed)
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"{printed}: {e}")
        parsed = torch._C.parse_schema(definable)
        assert canonical(str(parsed)) == canonical(printed), (printed, definable)
        for a, b in zip((*parsed.arguments, *parsed.returns), (*schema.arguments, *schema.returns)):
            assert (a.alias_info is None) == (b.alias_info is None)
            if a.alias_info is not None:
                assert a.alias_info.is_write == b.alias_info.is_write, printed
        checked += 1
    assert checked > 500
    # The shorthand of every in-place op of vLLM and sgl-kernel.
    assert opforge._C.print_definable("k::f(Tensor! out, Tensor x) -> ()") == "k::f(Tensor(_0!) out, Tensor x) -> ()"
    assert torch._C.parse_schema(opforge._C.print_definable("k::f(Tensor! a, Tensor(_0!) b, Tensor! c) -> ()"))


# --- 3: two libraries, one struct name ------------------------------------------

def test_two_libraries_each_with_a_norm_cfg_load_in_one_process(kernels, kernels_b):
    a, b = opforge.structs.kernels.NormCfg, opforge.structs.sgl_kernels.NormCfg
    assert a is not b
    assert [f.name for f in __import__("dataclasses").fields(a)] == ["eps", "gemma"]
    assert [f.name for f in __import__("dataclasses").fields(b)] == ["groups", "eps", "scale"]
    assert kernels.rms_norm.spec == ("kernels::rms_norm(Tensor(_0!) out, Tensor input, Tensor weight, "
                                     "kernels.NormCfg cfg) -> ()")
    x = torch.randn(2, 8)
    out = torch.empty_like(x)
    kernels_b.group_rms_norm(out, x, b(groups=2, scale=3.0))
    ref = torch.cat([3 * rms_norm_ref(h, torch.ones(4), 1e-5) for h in x.chunk(2, -1)], -1)
    torch.testing.assert_close(out, ref)
    with pytest.raises(TypeError, match=r"sgl_kernels::group_rms_norm: parameter 'cfg'"):
        kernels_b.group_rms_norm(out, x, a())  # the other library's NormCfg: no field 'groups'


# --- 4: m.def(schema, &fn) with m.fake --------------------------------------------

def test_fake_tensors_never_reach_a_kernel_that_has_a_fake(ext):
    x = torch.arange(6.0).reshape(2, 3)
    torch.testing.assert_close(ext.sum_rows(x), x.sum(1))
    with FakeTensorMode():
        fake = ext.sum_rows(torch.empty(5, 3))  # the kernel would read a data pointer
    assert fake.shape == (5,)
    compiled = torch.compile(lambda t: ext.sum_rows(t) * 2, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), 2 * x.sum(1))
    opforge.opcheck(ext.sum_rows, (x,))
    # Without a backward, a gradient through it is an error, as for a Python op.
    y = ext.sum_rows(x.clone().requires_grad_())
    with pytest.raises(RuntimeError, match=r"opforge_ext::sum_rows: a gradient was requested"):
        y.sum().backward()
    assert not ext.sum_rows(torch.ones(2, 2)).requires_grad


# --- a block that cannot be registered ---------------------------------------------

def test_a_library_block_that_cannot_be_registered_raises_and_leaves_nothing():
    library = os.path.join(build("tests/cpp_ext", "cpp_ext"), "libopforge_test_bad.so")
    result = run_python(f"""
        import torch, opforge
        try:
            opforge.load_library({library!r})
        except RuntimeError as e:
            print("raised:", e)
        print("ok block:", torch.ops.opforge_bad_ok.good(torch.ones(1)).item())
        print("failed block registered:", hasattr(torch.ops.opforge_bad, "write"))
        try:
            opforge.ops.opforge_bad.write
        except AttributeError as e:
            print("access:", e)
    """)
    assert result.returncode == 0, result.stderr  # never an abort
    out = result.stdout
    assert re.search(r"raised: libopforge_test_bad\.so: OPFORGE_LIBRARY\(opforge_bad\) at .*bad_library\.cc:\d+: "
                     r"opforge_bad::broken: its schema names type 'NoSuchCfg', which this library block does not "
                     r"declare\. Declare it with OPFORGE_STRUCT \(or OPFORGE_ENUM\) and take it in a kernel of this "
                     r"block, or list it with m\.types<NoSuchCfg>\(\) \(this block declares: nothing\)\. Nothing of "
                     r"this block was registered\.", out), out
    assert "ok block: 1.0" in out
    assert "failed block registered: False" in out
    assert "access: opforge.ops: opforge_bad::write is not registered because its library failed to load" in out


# --- 11: symmetric-memory tags, whatever was imported first -------------------------

@pytest.mark.skipif(not hasattr(torch.library.Library, "register_symm_mem_args"),
                    reason="torch's own symm-mem registry exists from torch 2.13")
@pytest.mark.parametrize("reset", ["", "torch._dynamo.reset()"])
def test_cpp_symm_mem_args_reach_torchs_registry_when_inductor_was_imported_first(reset):
    library = os.path.join(build("tests/cpp_ext", "cpp_ext"), "libopforge_test_ext.so")
    result = run_python(f"""
        import torch, torch._inductor.lowering   # a serving engine imports Inductor early
        import opforge
        {reset}
        from torch._library.simple_registry import singleton
        torch.ops.load_library({library!r})
        compiled = torch.compile(lambda x: x + 1, backend="eager")
        compiled(torch.ones(1))                  # any compile: opforge syncs first
        print(sorted(singleton.find("opforge_ext::all_reduce").symm_mem_args.get() or []))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['x']"


# --- the wheel's load-time check -------------------------------------------------

def test_a_library_built_against_another_opforge_is_a_one_sentence_error():
    torch_version = torch.__version__
    with pytest.raises(ImportError) as e:
        opforge.check_library("kernels", opforge_version="9.9.0", abi_version=1, torch_version=torch_version,
                              stable=False)
    assert str(e.value).startswith(f"kernels was built against opforge 9.9.0 but opforge {opforge.__version__} "
                                   f"is installed; install opforge==9.9.0")
    assert str(e.value).count(". ") == 0  # one sentence
    with pytest.raises(ImportError, match=r"kernels was built against torch 2\.1\.0 but torch .* is installed"):
        opforge.check_library("kernels", opforge_version=opforge.__version__, abi_version=1, torch_version="2.1.0",
                              stable=False)
    with pytest.raises(ImportError, match=r"whose C ABI version is 7, but opforge .* serves versions up to 1; "
                                          r"install opforge>=3\.0"):
        opforge.check_library("kernels", opforge_version="3.0", abi_version=7, torch_version="2.10", stable=True)
    # A stable-ABI library loads with any opforge serving its ABI, and any torch from its target on;
    # an older torch is the error naming the torch it needs.
    running = abi_line(torch.__version__)
    opforge.check_library("kernels", opforge_version="0.0.9", abi_version=1, torch_version="2.10.0", stable=True,
                          torch_target_version=f"{running[0]}.{running[1]}")
    with pytest.raises(ImportError, match=rf"built on torch's stable ABI for torch {running[0]}\.{running[1] + 1} "
                                          rf"and later, but torch .* is installed; install torch>={running[0]}\.{running[1] + 1}"):
        opforge.check_library("kernels", opforge_version="0.0.9", abi_version=1, torch_version="2.10.0", stable=True,
                              torch_target_version=f"{running[0]}.{running[1] + 1}")


# --- 9: the eager path of C++ ops, against the dispatcher path ---------------------

def test_cpp_ops_fast_path_and_dispatcher_path_agree_on_every_field_and_value(ext):
    import dataclasses

    from op_testing import fast_path
    from test_boundary_differential import corpus

    Probe = opforge.structs.opforge_ext.Probe
    fields = [f.name for f in dataclasses.fields(Probe)]
    assert fields == ["i", "f", "b", "s", "of", "il", "fl", "dt", "m", "t", "ts"]

    def outcome(fn, *args):
        try:
            out = fn(*args)
        except Exception as e:  # noqa: BLE001 - the comparison is over whatever is raised
            return (type(e).__name__, str(e))
        return ("ok", [None if math.isnan(v) else v for v in out.tolist()])

    combinations, accepted, report = 0, 0, []
    for field in fields:
        for value in corpus():
            for op, make in ((ext.probe, lambda p: p), (ext.probe_optional, lambda p: p)):
                args = (torch.ones(1), make(Probe(**{"ts": [], field: value})))
                with fast_path(True):
                    fast = outcome(op, *args)
                with fast_path(False):
                    slow = outcome(op, *args)
                combinations += 1
                accepted += fast[0] == "ok"
                if fast != slow:
                    report.append(f"{op.name} / {field} / {value!r}:\n  fast: {fast}\n  dispatcher: {slow}")
    assert not report, "\n".join(report[:20])
    assert combinations >= 11 * 30 * 2 and accepted > combinations // 10
    # Absent optional struct, and the raw value of an enum field, on both paths.
    for enabled in (True, False):
        with fast_path(enabled):
            assert ext.probe_optional(torch.ones(1), None).tolist() == [-1.0] * 11
            assert ext.probe(torch.zeros(1), Probe(m=opforge.structs.opforge_ext.Mode.kMul, ts=[]))[8].item() == 1


def test_the_c_surface_serves_its_version_and_names_the_newest_it_serves():
    core = ctypes.CDLL(os.path.join(opforge.cmake_prefix_path, "lib", "libopforge_core.so"))
    get = core.opforge_abi_get
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
    core.opforge_version.restype = ctypes.c_char_p
    newest = ctypes.c_uint32(0)
    assert get(1, ctypes.byref(newest)) is not None
    assert newest.value == opforge._C.abi_version() == 1
    # A library built for a later table gets none, and learns which one this opforge has.
    assert get(2, ctypes.byref(newest)) is None and newest.value == 1
    assert core.opforge_version().decode() == opforge.__version__


def test_the_headers_version_is_the_packages():
    # A library records OPFORGE_VERSION_STRING when built; the core compares it with its own at load.
    with open(os.path.join(ROOT, "cpp", "include", "opforge", "version.h"), encoding="utf-8") as f:
        header = re.search(r'#define OPFORGE_VERSION_STRING "([^"]+)"', f.read()).group(1)
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        project = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    assert header == project == opforge.__version__


def test_a_library_that_links_the_cpp_runtime_statically_keeps_it_private(tmp_path):
    # Toolchains that link libstdc++ statically (-static-libstdc++, a
    # devtoolset's libstdc++_nonshared.a) export its symbols from every shared
    # library they build; another library then binds to that copy of
    # std::ostream's number formatting while its stream's locale is another
    # copy's, and crashes on the first message that prints an integer.
    # opforge_add_library keeps the copy private; a plain add_library, built
    # the same way beside it, shows what it prevents.
    static = subprocess.run([os.environ.get("CXX", "c++"), "-print-file-name=libstdc++.a"],
                            capture_output=True, text=True).stdout.strip()
    if shutil.which("nm") is None or not os.path.isabs(static):
        pytest.skip("needs nm and a static libstdc++ (libstdc++.a)")
    (tmp_path / "prints.cc").write_text(
        '#include <sstream>\n#include <string>\n'
        'extern "C" int prints(long v) { std::ostringstream s; s << v; return (int)s.str().size(); }\n')
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(prints LANGUAGES CXX)\n"
        "find_package(opforge REQUIRED)\n"
        "opforge_add_library(with_opforge SOURCES prints.cc)\n"
        "add_library(plain SHARED prints.cc)\n")
    out = Path(build(str(tmp_path), "prints", "CMAKE_SHARED_LINKER_FLAGS=-static-libstdc++",
                     out=str(tmp_path / "build")))

    def exported(lib):
        nm = subprocess.run(["nm", "-D", "--defined-only", str(out / lib)], capture_output=True, text=True)
        assert nm.returncode == 0, nm.stderr
        return {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}

    ostream_insert_long = "_ZNSo9_M_insertIlEERSoT_"  # std::ostream::_M_insert<long>, libstdc++'s own
    assert ostream_insert_long in exported("libplain.so")
    with_opforge = exported("libwith_opforge.so")
    assert ostream_insert_long not in with_opforge and "prints" in with_opforge
    # And the library still works.
    lib = ctypes.CDLL(str(out / "libwith_opforge.so"))
    assert lib.prints(ctypes.c_long(-123456)) == 7


def _ident_library(tmp_path, device, target=""):
    (tmp_path / "ident.cc").write_text(
        "#include <opforge/opforge.h>\n"
        "opforge::Tensor ident(const opforge::Tensor& x) { return x; }\n"
        "OPFORGE_LIBRARY(t_fpga_keys, m) {\n"
        "  m.def(\"ident(Tensor x) -> Tensor\");\n"
        f"  m.impl(\"ident\", c10::DeviceType::{device}, &ident);\n"
        "}\n")
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(ident LANGUAGES CXX)\n"
        "find_package(opforge REQUIRED)\n"
        f"opforge_add_library(ident STABLE {target and 'TORCH_TARGET_VERSION ' + target} SOURCES ident.cc)\n")


@needs_torch("2.10", "building a library on torch's stable ABI", STABLE_BUILDS)
def test_a_stable_library_naming_a_device_without_a_kernel_key_is_a_load_error(tmp_path):
    _ident_library(tmp_path, "FPGA")
    out = build(str(tmp_path), "ident", out=str(tmp_path / "build"))
    with pytest.raises(RuntimeError, match=r"OPFORGE_LIBRARY\(t_fpga_keys\) at .*ident\.cc:\d+: " + re.escape(
            'm.impl("ident", device type 7): a stable-ABI library registers kernels by device type for CPU, '
            'CUDA, HIP, XPU, MPS, Meta and PrivateUse1; for another dispatch key, name it as a string: '
            'm.impl("ident", "<key>", &fn). Nothing of this block was registered.')):
        opforge.load_library(os.path.join(out, "libident.so"))
    assert not hasattr(torch.ops.t_fpga_keys, "ident")


def test_a_stable_library_built_against_a_torch_older_than_its_target_is_a_configure_error(tmp_path):
    # One minor release past the running torch (2.10 on torch 2.9, whose headers have no stable ABI to build on).
    major, minor = abi_line(torch.__version__)
    target = f"{major}.{minor + 1}"
    _ident_library(tmp_path, "CPU", target)
    done = subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(tmp_path / "build"), "-G", "Ninja",
                           f"-DCMAKE_PREFIX_PATH={opforge.cmake_prefix_path}",
                           f"-DPython_EXECUTABLE={sys.executable}"], capture_output=True, text=True)
    assert done.returncode != 0
    text = " ".join(done.stderr.split())
    assert (f"opforge_add_library(ident): a stable-ABI library targeting torch {target} builds against torch "
            f"{target} or later (the stable headers of its target), but this is torch {torch.__version__}; build "
            f"it with a later torch, and the library loads on every torch from {target} on") in text, done.stderr
