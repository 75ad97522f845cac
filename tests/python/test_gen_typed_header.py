"""The typed C++ header `NS_ops.h` of `opforge gen aten`, for the standard
525-name allowlist: one function per generated op, and a C++ program
(tests/gen/typed_ops_test.cc) that includes it, calls 25 generated ops with
typed arguments and compares each with ATen.

Generation and builds are cached under build/test_gen_typed/; the header's
compile cost is measured by benchmarks/bench_gen.py --header.
"""

import os
import re
import subprocess

import pytest
import torch

from opforge.gen import _generate, _typed
from opforge.gen._build import torch_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALLOWLIST = os.path.join(ROOT, "examples", "codegen", "aten_allowlist.txt")
OUT = os.path.join(ROOT, "build", "test_gen_typed")
NAMESPACE = "opforge_typed"
TEST_SOURCE = os.path.join(ROOT, "tests", "gen", "typed_ops_test.cc")


@pytest.fixture(scope="module")
def generated():
    return _generate.generate_aten(ALLOWLIST, NAMESPACE, OUT, tests=False, jobs=2)


@pytest.fixture(scope="module")
def header(generated):
    with open(os.path.join(OUT, _typed.header_file(NAMESPACE)), encoding="utf-8") as f:
        return f.read()


def test_the_header_has_one_typed_function_per_generated_op(generated, header):
    assert generated.coverage[1] == 525  # every name is generated on torch 2.13; older ones may lack a few
    functions = re.findall(r"^inline .*? (\w+)\(", header, flags=re.M)
    assert functions == [op.name for op in generated.selection.ops]
    assert "Not in this header" not in header


def test_a_function_takes_the_arguments_in_schema_order_with_outf_types(header):
    # As at::new_empty_strided_outf: SymInt[] as IntArrayRef, converted for the
    # dispatcher's SymInt handle; out last.
    assert ("inline at::Tensor & addmm(const at::Tensor & self, const at::Tensor & mat1, const at::Tensor & mat2, "
            "const at::Scalar & beta, const at::Scalar & alpha, at::Tensor & out) {") in header
    assert "inline at::Tensor & zeros(at::IntArrayRef size, at::Tensor & out) {" in header
    assert "op.call(c10::fromIntArrayRefSlow(size), out);" in header
    assert ("inline ::std::tuple<at::Tensor &,at::Tensor &> max_dim_max(const at::Tensor & self, int64_t dim, "
            "bool keepdim, at::Tensor & max, at::Tensor & max_values) {") in header
    assert "inline void split_copy(const at::Tensor & self, int64_t split_size, int64_t dim, at::TensorList out) {" \
        in header
    assert "inline at::Tensor & add_(at::Tensor & self, const at::Tensor & other, const at::Scalar & alpha) {" \
        in header


def test_a_cpp_program_calls_generated_ops_through_the_header_and_matches_aten(generated):
    binary = os.path.join(OUT, "typed_ops_test")
    cflags, ldflags = torch_flags()
    cflags = [f for f in cflags if not f.startswith("-fvisibility")]
    lib_dir = os.path.dirname(os.path.abspath(generated.library))
    command = (["c++"] + cflags + ["-I", OUT, TEST_SOURCE, "-o", binary]
               + [f for f in ldflags if f != "-shared"]
               # The generated ops register when their library loads: keep it linked.
               + ["-Wl,--no-as-needed", os.path.abspath(generated.library), f"-Wl,-rpath,{lib_dir}",
                  "-Wl,--as-needed", "-ltorch", "-lgtest", "-lgtest_main", "-pthread"])
    stamp = binary + ".cmd"
    sources = [TEST_SOURCE, os.path.join(OUT, _typed.header_file(NAMESPACE)), generated.library]
    fresh = (os.path.exists(binary) and os.path.exists(stamp) and open(stamp).read() == repr(command)
             and all(os.path.getmtime(s) <= os.path.getmtime(binary) for s in sources))
    if not fresh:
        build = subprocess.run(command, capture_output=True, text=True)
        assert build.returncode == 0, build.stderr[-6000:]
        with open(stamp, "w") as f:
            f.write(repr(command))
    run = subprocess.run([binary], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "[  PASSED  ] 7 tests." in run.stdout
    called = set(re.findall(r"opforge_typed::(\w+)\(", open(TEST_SOURCE).read()))
    assert len(called) >= 20, sorted(called)
