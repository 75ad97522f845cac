"""The example kernel library (examples/kernel_library) through opforge: a
library written the way vLLM's csrc/ is, on libtorch's C++ API or, with
OPFORGE_KERNELS=stable (or a prebuilt .so's path), on torch's stable ABI
(docs/stable_abi.md). The same tests run against either build."""

import os

import pytest
import torch

import opforge

import kernel_library
from kernel_library import rms_norm_ref, run_python
from op_testing import needs_torch

pytestmark = needs_torch("2.10", "a library built on torch's stable ABI",
                         kernel_library.STABLE_BUILDS or kernel_library.mode() != "stable")


@pytest.fixture(scope="module")
def kernels():
    return kernel_library.load()


def test_the_library_is_the_build_asked_for(kernels):
    info = opforge._C.library_op("kernels::rms_norm")
    assert info["library"] == os.path.realpath(kernel_library.library_path()) or \
        os.path.samefile(info["library"], kernel_library.library_path())
    assert info["abi"] == ("unstable" if kernel_library.mode() == "unstable" else "stable")
    assert opforge._C.library_op("kernels::rms_norm_fn")["has_cpp_autograd" if info["abi"] == "unstable"
                                                          else "has_torch_layer_autograd"]
    print(f"\n{info['abi']} build {kernel_library.library_path()} sha256 {kernel_library.sha256(kernel_library.library_path())}")


def test_struct_defaults_from_cpp_initializers_reach_python_and_the_flat_schema(kernels):
    s = opforge.structs.kernels
    assert s.NormCfg() == s.NormCfg(eps=1e-6, gemma=False)
    assert s.ActCfg() == s.ActCfg(act=s.Act.kSilu, limit=0.0)
    assert [m.name for m in s.Act] == ["kSilu", "kGelu"]
    assert "float cfg__eps=9.9999999999999995e-07, bool cfg__gemma=False" in kernels.rms_norm.schema


def test_a_runner_handle_a_list_and_an_optional_reach_the_kernel(kernels):
    table = kernels.make_scale_table([1.0, 2.0, -3.0])
    x = torch.arange(6.0).reshape(3, 2)
    out = torch.empty_like(x)
    kernels.scale_rows(out, x, table, [2, 0, 1])
    torch.testing.assert_close(out, x * torch.tensor([[-3.0], [1.0], [2.0]]))
    kernels.scale_rows(out, x, table, [1, 1, 1], clamp=5.0)
    torch.testing.assert_close(out, (x * 2).clamp(-5, 5))
    with pytest.raises(RuntimeError, match=r"scale_rows: a row is outside the table"):
        kernels.scale_rows(out, x, table, [0, 0, 3])
    assert opforge._C.handle_release(table)
    # The error names the op and the parameter, in both ABI modes and on both paths.
    stale = r"kernels::scale_rows: the CPU kernel, parameter 'table': handle \d+: is stale"
    with pytest.raises(RuntimeError, match=stale):
        kernels.scale_rows(out, x, table, [0, 0, 0])
    with pytest.raises(RuntimeError, match=stale):
        torch.ops.kernels.scale_rows(out, x, table, [0, 0, 0])


def test_a_handle_made_by_another_process_is_an_error_naming_the_op_and_the_parameter(kernels):
    # The other process registers a table first, then so does this one: the
    # same number must not name this process's table.
    made = run_python(f"""
        import os
        os.environ["OPFORGE_KERNELS"] = {kernel_library.mode()!r}
        import kernel_library
        print(kernel_library.load().make_scale_table([5.0]))
    """)
    assert made.returncode == 0, made.stderr
    foreign = int(made.stdout.split()[-1])
    mine = kernels.make_scale_table([3.0])
    assert mine != foreign
    out, x = torch.empty(1, 2), torch.ones(1, 2)
    message = (rf"kernels::scale_rows: the CPU kernel, parameter 'table': handle {foreign}: is stale: .*another "
               r"process made it .*a handle is this process's state")
    for call in (kernels.scale_rows, torch.ops.kernels.scale_rows):
        with pytest.raises(RuntimeError, match=message):
            call(out, x, foreign, [0])
    kernels.scale_rows(out, x, mine, [0])
    torch.testing.assert_close(out, torch.full((1, 2), 3.0))
    opforge._C.handle_release(mine)


# --- 1, 2, 8: Tensor! schemas, Tensor& kernels, def then impl -------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tensor_bang_op_with_a_tensor_ref_kernel_writes_its_output(kernels, dtype):
    NormCfg = opforge.structs.kernels.NormCfg
    assert kernels.rms_norm.schema == ("kernels::rms_norm(Tensor(_0!) out, Tensor input, Tensor weight, "
                                       "float cfg__eps=9.9999999999999995e-07, bool cfg__gemma=False) -> ()")
    x = torch.randn(3, 16, dtype=dtype)
    w = torch.randn(16, dtype=dtype)
    for cfg in (NormCfg(), NormCfg(eps=0.5, gemma=True)):
        out = torch.empty_like(x)
        assert kernels.rms_norm(out, x, w, cfg) is None
        torch.testing.assert_close(out, rms_norm_ref(x, w, cfg.eps, cfg.gemma))
    out = torch.empty_like(x)
    torch.ops.kernels.rms_norm(out, x, w, 1e-6, False)  # the flat op, struct defaults as leaf defaults
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6))


def test_an_op_writing_two_arguments_writes_both(kernels):
    NormCfg = opforge.structs.kernels.NormCfg
    x, res, w = torch.randn(2, 8), torch.randn(2, 8), torch.randn(8)
    x0, res0 = x.clone(), res.clone()
    versions = (x._version, res._version)
    kernels.fused_add_rms_norm(x, res, w, NormCfg(eps=1e-5))
    torch.testing.assert_close(res, res0 + x0)
    torch.testing.assert_close(x, rms_norm_ref(res0 + x0, w, 1e-5))
    # Written arguments get their versions bumped, as torch's own in-place ops.
    assert (x._version, res._version) == (versions[0] + 1, versions[1] + 1)


def test_a_cudagraph_unsafe_cpp_op_is_tagged_refused_by_a_plain_capture_and_breaks_a_breakable_one(kernels):
    assert torch.Tag.cudagraph_unsafe in torch.ops.kernels.scale_by_host.default.tags
    assert torch.Tag.cudagraph_unsafe not in torch.ops.kernels.rms_norm.default.tags
    out, x, host = torch.zeros(3), torch.arange(3.0), torch.tensor([2.0])
    kernels.scale_by_host(out, x, host)  # no capture: an ordinary call
    assert out.tolist() == [0.0, 2.0, 4.0]
    breaks = []

    def current():
        return "step"  # the engine's capture under way on this thread

    def add_eager(capture, fn):
        result = fn()
        breaks.append(fn)
        return result

    previous = opforge._C._set_capture_probe(1)  # every device reports a capture under way
    try:
        out.zero_()
        for call in (kernels.scale_by_host, torch.ops.kernels.scale_by_host):
            with pytest.raises(RuntimeError, match=r"^kernels::scale_by_host: this op is tagged "
                                                   r"torch.Tag.cudagraph_unsafe .*Nothing was launched"):
                call(out, x, host)
        assert out.tolist() == [0.0, 0.0, 0.0]
        opforge.cuda_graphs.register_capture(current=current, add_eager=add_eager, name="test_kernel_library")
        try:
            kernels.scale_by_host(out, x, host)
        finally:
            assert opforge.cuda_graphs.unregister_capture(current)
    finally:
        opforge._C._set_capture_probe(previous)
    assert [call.name for call in breaks] == ["kernels::scale_by_host"]
    assert out.tolist() == [0.0, 2.0, 4.0]
    host.fill_(-1.0)  # the next step's host value, read by the replayed break
    breaks[0]()
    assert out.tolist() == [0.0, -1.0, -2.0]


def test_a_cpp_kernel_that_throws_in_a_break_or_its_replay_raises_its_error_and_the_engine_goes_on(kernels):
    breaks = []

    def current():
        return "step"

    def add_eager(capture, fn):
        try:
            return fn()
        finally:
            breaks.append(fn)

    out, x = torch.zeros(3), torch.ones(3)
    good, wrong = torch.tensor([2.0]), torch.tensor([2.0], dtype=torch.float64)
    opforge.cuda_graphs.register_capture(current=current, add_eager=add_eager, name="throws")
    previous = opforge._C._set_capture_probe(1)
    try:
        with pytest.raises(RuntimeError, match="^scale_by_host: host_scale must be one float32 on the CPU"):
            kernels.scale_by_host(out, x, wrong)  # the kernel throws while it runs as a break
        kernels.scale_by_host(out, x, good)
    finally:
        opforge._C._set_capture_probe(previous)
        assert opforge.cuda_graphs.unregister_capture(current)
    assert out.tolist() == [2.0, 2.0, 2.0]
    good.data = wrong  # the static argument changes under the recorded break
    with pytest.raises(RuntimeError, match="^scale_by_host: host_scale must be one float32 on the CPU"):
        breaks[1]()
    assert out.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("act", ["kSilu", "kGelu"])
def test_an_enum_field_picks_the_activation(kernels, act):
    s = opforge.structs.kernels
    x = torch.randn(4, 2 * 8)
    out = torch.empty(4, 8)
    kernels.act_and_mul(out, x, s.ActCfg(act=getattr(s.Act, act), limit=2.0))
    a = x[:, :8].clamp(-2, 2)
    ref = (torch.nn.functional.silu(a) if act == "kSilu" else torch.nn.functional.gelu(a)) * x[:, 8:]
    torch.testing.assert_close(out, ref)


def test_a_functional_op_with_a_cpp_backward_passes_opcheck_and_gradcheck(kernels):
    NormCfg = opforge.structs.kernels.NormCfg
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    for cfg in (NormCfg(eps=1e-5), NormCfg(eps=0.1, gemma=True)):
        torch.autograd.gradcheck(lambda x, w: kernels.rms_norm_fn(x, w, cfg), (x, w))
    opforge.opcheck(kernels.rms_norm_fn, (x, w, NormCfg()))
    out = torch.empty(3, 8, dtype=torch.float64)
    opforge.opcheck(kernels.rms_norm, (out, x.detach(), w.detach(), NormCfg()))


def test_a_cpp_backward_compiles_forward_and_backward(kernels):
    NormCfg = opforge.structs.kernels.NormCfg

    def f(x, w):
        return (kernels.rms_norm_fn(x, w, NormCfg(eps=1e-5)) ** 2).sum()

    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    gx, gw = torch.autograd.grad(f(x, w), (x, w))
    torch._dynamo.reset()
    cx, cw = torch.autograd.grad(torch.compile(f, fullgraph=True)(x, w), (x, w))
    torch.testing.assert_close((cx, cw), (gx, gw))


def test_inductors_code_calls_cpp_ops_from_c(kernels):
    # opforge._inductor: the wrapper calls the C++ op's FlatCall, not torch.ops.
    from torch._inductor.utils import fresh_cache, run_and_get_code

    from opforge import _inductor

    NormCfg = opforge.structs.kernels.NormCfg

    def f(x, res, w):
        y = kernels.rms_norm_fn(x * 2, w, NormCfg(eps=1e-5))
        kernels.fused_add_rms_norm(y, res, w, NormCfg(eps=1e-5))  # writes both
        return y + res

    args = (torch.randn(2, 8), torch.randn(2, 8), torch.randn(8))
    want = f(*(a.clone() for a in args))
    torch._dynamo.reset()
    with fresh_cache():
        out, code = run_and_get_code(torch.compile(f, fullgraph=True), *(a.clone() for a in args))
    torch.testing.assert_close(out, want)
    code = "\n".join(code)
    for op in (kernels.rms_norm_fn, kernels.fused_add_rms_norm):
        name = _inductor.flat_call_name(op.overload)
        assert f"(getattr(extern_kernels, {name!r}, None) or torch.ops.kernels.{op.name.split('::')[1]}.default)(" \
            in code, code


# --- 5: the first call of a C++ op inside a compiled region ------------------------

@pytest.mark.parametrize("reset", ["", "torch._dynamo.reset()", "torch.compiler.reset()"])
def test_the_first_call_of_a_cpp_op_may_be_inside_torch_compile(kernels, reset):
    # After a reset too: it clears Dynamo's compile-start callbacks, opforge's included.
    library = kernel_library.library_path()
    result = run_python(f"""
        import torch, opforge
        {reset}
        torch.ops.load_library({library!r})   # not opforge.load_library: nothing made yet

        @torch.compile(fullgraph=True)
        def step(x, w):
            return opforge.ops.kernels.rms_norm_fn(x, w, opforge.structs.kernels.NormCfg(eps=0.5)) + 1

        x, w = torch.ones(2, 4), torch.full((4,), 2.0)
        print(step(x, w).tolist())
    """)
    assert result.returncode == 0, result.stderr
    expected = (torch.ones(2, 4) / (1 + 0.5) ** 0.5 * 2 + 1).tolist()
    assert result.stdout.strip() == str(expected)


# --- 6: an op without a backward -------------------------------------------------

def test_a_cpp_op_without_a_backward_raises_when_a_gradient_is_requested(kernels):
    NormCfg = opforge.structs.kernels.NormCfg
    x = torch.randn(2, 8, requires_grad=True)
    out = torch.empty(2, 8)
    kernels.rms_norm(out, x, torch.ones(8), NormCfg())
    with pytest.raises(RuntimeError, match=r"kernels::rms_norm: a gradient was requested through this op, but it "
                                           r"has no backward\. Declare one in C\+\+ .* or from Python "
                                           r"\(opforge\.ops\.kernels\.rms_norm\.register_autograd"):
        out.sum().backward()





def test_a_cpp_collective_declares_its_symmetric_input(kernels):
    s = opforge.structs.kernels
    assert opforge.symm_mem_args("kernels::one_shot_all_reduce") == ["input"]
    # The field's default is not in the flat schema: a required argument follows it.
    assert kernels.one_shot_all_reduce.schema == ("kernels::one_shot_all_reduce(Tensor input, "
                                                  "str cfg__reduce_op, str group_name) -> Tensor")
    assert s.ReduceCfg() == s.ReduceCfg(reduce_op="sum")
    if opforge.symm_mem.has_native_registry():
        from torch._library.simple_registry import singleton

        opforge._cpp_ops.refresh()
        assert list(singleton.find("kernels::one_shot_all_reduce").symm_mem_args.get()) == ["input"]


def test_the_cpp_all_reduce_picks_one_shot_or_two_shot_by_size_and_world_size(kernels):
    s = opforge.structs.kernels
    assert kernels.two_shot_all_reduce.schema == ("kernels::two_shot_all_reduce(Tensor(_0!) input, "
                                                  "str cfg__reduce_op, str group_name) -> Tensor")
    assert kernels.all_reduce.schema == ("kernels::all_reduce(Tensor(_0!) input, str cfg__reduce_op, "
                                         "str group_name, int world_size, int two_shot_min_bytes=-1) -> Tensor")
    assert opforge.symm_mem_args("kernels::two_shot_all_reduce") == ["input"]
    assert opforge.symm_mem_args("kernels::all_reduce") == ["input"]
    never = 2**63 - 1
    assert {w: kernels.all_reduce_two_shot_min_bytes(w) for w in range(1, 10)} == {
        1: never, 2: 2 << 20, 3: never, 4: 1 << 20, 5: never, 6: never, 7: never, 8: 256 << 10, 9: never}

    # torch's symm_mem ops have no CPU kernels: stand-ins record which one the op calls.
    calls = []

    def one_shot(input, reduce_op, group_name):
        calls.append(("one_shot", reduce_op, group_name))
        return input * 2

    def two_shot_out(input, reduce_op, group_name, output):
        calls.append(("two_shot", reduce_op, group_name))
        return output.copy_(input * 2)

    lib = torch.library.Library("symm_mem", "IMPL")
    try:
        lib.impl("one_shot_all_reduce", one_shot, "CPU")
        lib.impl("two_shot_all_reduce_out", two_shot_out, "CPU")

        def path(nbytes, world_size, *threshold):
            calls.clear()
            x = torch.arange(nbytes // 4, dtype=torch.float32)
            out = kernels.all_reduce(x, s.ReduceCfg(), "7", world_size, *threshold)
            torch.testing.assert_close(out, torch.arange(nbytes // 4, dtype=torch.float32) * 2)
            assert len(calls) == 1 and calls[0][1:] == ("sum", "7"), calls
            return calls[0][0]

        assert path(16, 2) == "one_shot"
        assert path((2 << 20) - 4, 2) == "one_shot"
        assert path(2 << 20, 2) == "two_shot"
        assert path((1 << 20) - 4, 4) == "one_shot"
        assert path(1 << 20, 4) == "two_shot"
        assert path((256 << 10) - 4, 8) == "one_shot"
        assert path(256 << 10, 8) == "two_shot"
        assert path(4 << 20, 3) == "one_shot"  # no two-shot kernel at 3 or 6 ranks
        assert path(4 << 20, 6, 0) == "one_shot"
        assert path(16, 2, 0) == "two_shot"  # the caller's threshold replaces the table's
        assert path(4 << 20, 8, 8 << 20) == "one_shot"
        calls.clear()
        x = torch.ones(8)
        torch.testing.assert_close(kernels.two_shot_all_reduce(x, s.ReduceCfg(), "7"), torch.full((8,), 2.0))
        torch.testing.assert_close(kernels.one_shot_all_reduce(x, s.ReduceCfg(), "7"), torch.full((8,), 2.0))
        assert [c[0] for c in calls] == ["two_shot", "one_shot"]
    finally:
        lib._destroy()
