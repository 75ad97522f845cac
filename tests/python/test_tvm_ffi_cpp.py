"""An OPFORGE_LIBRARY op whose kernel is a TVM-FFI function exported by name
from a module .so (tests/cpp_ext/tvm_ffi, docs/tvm_ffi.md#c-libraries): from
Python, from torch.ops, compiled, and from a C++ program with no Python."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

tvm_ffi = pytest.importorskip("tvm_ffi")
import tvm_ffi.libinfo  # noqa: E402

import opforge  # noqa: E402
from cpp_ext import build  # noqa: E402
from kernel_library import STABLE_BUILDS  # noqa: E402
from op_testing import AOTI_RUNS_OUT_VARIANT_OPS  # noqa: E402


@pytest.fixture(scope="module")
def built():
    return build("tests/cpp_ext/tvm_ffi", "tvm_ffi", f"TVM_FFI_INCLUDE={tvm_ffi.libinfo.find_include_path()}",
                 f"TVM_FFI_LIB={tvm_ffi.libinfo.find_libtvm_ffi()}", f"TVM_FFI_STABLE={'ON' if STABLE_BUILDS else 'OFF'}")


@pytest.fixture(scope="module")
def ops(built):
    opforge.load_library(os.path.join(built, "libopforge_test_tvm_ffi.so"))
    return opforge.ops.ffi_ext


def ref(x, w, eps, add_one):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (w + (1.0 if add_one else 0.0))


def test_the_struct_op_reaches_the_exported_function_with_its_fields(ops):
    x, w, out = torch.randn(4, 16), torch.randn(16), torch.full((4, 16), float("nan"))
    ops.rms_norm(out, x, w, cfg=opforge.structs.ffi_ext.NormCfg(eps=1e-5, add_one=True))
    torch.testing.assert_close(out, ref(x, w, 1e-5, True))
    out.zero_()
    torch.ops.ffi_ext.rms_norm(out, x, w, 1e-5, False)
    torch.testing.assert_close(out, ref(x, w, 1e-5, False))
    assert ops.count(x) == 64


def test_the_cpp_op_compiles_with_no_graph_break(ops):
    x, w = torch.randn(2, 8), torch.randn(8)
    cfg = opforge.structs.ffi_ext.NormCfg(eps=1e-6, add_one=False)

    def step(x, w):
        out = torch.empty_like(x)
        ops.rms_norm(out, x, w, cfg=cfg)
        return out * 2

    torch.testing.assert_close(torch.compile(step, backend="aot_eager", fullgraph=True)(x, w), step(x, w))


def test_a_kernel_error_names_the_op(ops):
    with pytest.raises(RuntimeError, match=r"ffi_ext::rms_norm: its TVM-FFI kernel rms_norm raised InternalError:.*2-D"):
        ops.rms_norm(torch.zeros(3), torch.zeros(3), torch.ones(3), cfg=opforge.structs.ffi_ext.NormCfg())


def test_a_symbol_the_module_does_not_export_is_a_load_error_and_its_op_raises_it_when_called(built):
    library = os.path.join(built, "libopforge_test_tvm_ffi_missing.so")
    with pytest.raises(RuntimeError, match=r"ffi_missing::gone: .*exports no TVM-FFI function 'no_such_function'.*"
                                           r"TVM_FFI_DLL_EXPORT_TYPED_FUNC\(no_such_function"):
        opforge.load_library(library)
    errors = opforge.load_errors()
    gone = next(e for e in errors if "ffi_missing::gone" in e)
    assert gone.endswith("The op is defined; calling it raises this error."), gone
    # The schema is there, the block's other op works, and the call says what the load said.
    assert torch.ops.ffi_missing.fine(torch.zeros(3)) == 3
    with pytest.raises(RuntimeError) as raised:
        torch.ops.ffi_missing.gone(torch.zeros(3))
    message = str(raised.value)
    assert message.startswith("ffi_missing::gone: its TVM-FFI kernel 'no_such_function' was not found when "
                              f"{library} loaded, so the op has no CompositeExplicitAutograd kernel. The load "
                              "error: "), message
    assert gone in message, message
    text = " ".join(errors)
    assert ("ffi_undefined::nowhere: CompositeExplicitAutograd kernel: the op is not defined in this library block. "
            "Define it with m.def(schema) in the block that gives its TVM-FFI kernel.") in text, text
    assert not hasattr(torch.ops.ffi_undefined, "nowhere")
    assert ("ffi_no_module::f: its TVM-FFI kernel's module libno_such_module.so cannot be loaded (") in text, text
    assert "Give the module's path, absolute or relative to this library's folder." in text, text
    with pytest.raises(RuntimeError, match=r"^ffi_no_module::f: its TVM-FFI kernel 'count' was not found"):
        torch.ops.ffi_no_module.f(torch.zeros(3))


def test_torch_ops_load_library_of_a_missing_symbol_loads_and_the_call_raises_the_load_error(built):
    # Its own process: torch.ops.load_library reports a block's errors on stderr only.
    code = textwrap.dedent(f"""
        import torch, opforge
        torch.ops.load_library({os.path.join(built, "libopforge_test_tvm_ffi_missing.so")!r})
        print(torch.ops.ffi_missing.fine(torch.zeros(2)))
        try:
            torch.ops.ffi_missing.gone(torch.zeros(2))
        except RuntimeError as e:
            print(type(e).__name__, [m for m in opforge.load_errors() if "ffi_missing::gone" in m][0] in str(e))
            print(str(e).splitlines()[0])
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    fine, verdict, first = child.stdout.splitlines()[:3]
    assert fine == "2" and verdict == "RuntimeError True", child.stdout
    assert "ffi_missing::gone" in first and "no_such_function" in first and "libopforge_test_tvm_ffi_missing.so" in first
    assert "exports no TVM-FFI function 'no_such_function'" in child.stderr, child.stderr


def test_a_function_taking_owned_tensors_gets_them_from_its_type_schema_or_the_kernel_s_option(built):
    opforge.load_library(os.path.join(built, "libopforge_test_tvm_ffi_owned.so"))
    x = torch.zeros(2, 3)
    assert torch.ops.ffi_owned.by_schema(x) == 6  # the module exports its type schema
    assert torch.ops.ffi_owned.by_option(x) == 6  # opforge::TvmFfi(...).owned_tensors()
    with pytest.raises(TypeError, match=r"^ffi_owned::untold: its TVM-FFI kernel owned_count takes owned tensors "
                                        r"\(an ffi::Tensor parameter\), .*m\.impl\(\.\.\., opforge::TvmFfi\("
                                        r"\"owned_count\", \.\.\.\)\.owned_tensors\(\)\)"):
        torch.ops.ffi_owned.untold(x)


STABLE = pytest.mark.skipif(not STABLE_BUILDS, reason=f"needs torch 2.10 (this is {torch.__version__}): a stable build")


@STABLE
def test_the_same_library_built_on_the_stable_abi_calls_the_same_function_in_its_own_process(built):
    # Its own process: both builds define ffi_ext.
    code = textwrap.dedent(f"""
        import torch, opforge
        opforge.load_library({os.path.join(built, "libopforge_test_tvm_ffi_stable.so")!r})
        x, w, out = torch.randn(3, 8), torch.randn(8), torch.zeros(3, 8)
        opforge.ops.ffi_ext.rms_norm(out, x, w, cfg=opforge.structs.ffi_ext.NormCfg(eps=0.5, add_one=True))
        ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 0.5) * (w + 1)
        print(torch.allclose(out, ref, atol=1e-5), torch.ops.ffi_ext.count(x))
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["True", "24"]


@pytest.mark.parametrize("abi", ["unstable", pytest.param("stable", marks=STABLE)])
def test_a_cpp_program_with_no_python_calls_the_op(built, abi):
    library = "libopforge_test_tvm_ffi.so" if abi == "unstable" else "libopforge_test_tvm_ffi_stable.so"
    child = subprocess.run([os.path.join(built, "call_ffi_op"), os.path.join(built, library)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout + child.stderr
    verdict, error, count = child.stdout.split()
    assert verdict == "ok" and float(error) < 1e-4 and count == "128"


EXPORT = """
import sys, torch, opforge
opforge.load_library(sys.argv[1])
cfg = opforge.structs.ffi_ext.NormCfg(eps=1e-5, add_one=True)


class Model(torch.nn.Module):
    def forward(self, x, w):
        out = torch.empty_like(x)
        opforge.ops.ffi_ext.rms_norm(out, x, w, cfg=cfg)
        return out * 2


x = torch.sin(torch.arange(4 * 32, dtype=torch.float32)).reshape(4, 32)
w = torch.cos(torch.arange(32, dtype=torch.float32))
ep = torch.export.export(Model(), (x, w))
path = torch._inductor.aoti_compile_and_package(ep, package_path=sys.argv[2])
# The package from Python too, in this fresh process.
loaded = torch._inductor.aoti_load_package(path)
print("python", torch.equal(loaded(x, w), Model()(x, w)))
"""


@AOTI_RUNS_OUT_VARIANT_OPS
@pytest.mark.parametrize("abi", ["unstable", pytest.param("stable", marks=STABLE)])
def test_an_aotinductor_package_of_a_model_using_the_op_runs_in_a_cpp_program_bitwise_equal_to_eager(built, abi):
    library = os.path.join(built, "libopforge_test_tvm_ffi.so" if abi == "unstable" else
                           "libopforge_test_tvm_ffi_stable.so")
    package = os.path.join(built, f"model_{abi}.pt2")
    exported = subprocess.run([sys.executable, "-c", EXPORT, library, package], capture_output=True, text=True,
                              timeout=600)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert exported.stdout.split()[-2:] == ["python", "True"], exported.stdout
    child = subprocess.run([os.path.join(built, "run_aoti"), library, package], capture_output=True, text=True,
                           timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert child.returncode == 0, child.stdout + child.stderr
    assert child.stdout.strip() == "bitwise"
