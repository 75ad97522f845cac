"""Symmetric-memory arguments (docs/symm_mem.md): the tag registry, validation,
the group_name warning, queries, forwarding to torch's native registry, and
opforge's own Inductor lowering for torch without it.

Comm buffers are CUDA-only, so on CPU Inductor's realization is observed
where it ends: its codegen refuses a CPU comm buffer ("Comm buffer requires a
valid CUDA device", or "accelerator device" on torch 2.15).
tests/gpu/test_symm_mem_gpu.py runs the real thing.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import inspect
import textwrap
import warnings
from dataclasses import dataclass

import pytest
import torch
from op_testing import needs_torch, ns  # noqa: F401
from torch._inductor.utils import fresh_cache, run_and_get_code

import opforge
from opforge import _C, symm_mem

Tensor = torch.Tensor
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE = symm_mem.has_native_registry()
needs_native = needs_torch("2.13", "the native symm-mem registry", NATIVE)
# Inductor's message when asked to allocate a comm buffer on CPU: proof that it
# tried (torch 2.15 says "accelerator device" where earlier releases say "CUDA").
COMM_BUFFER_ON_CPU = re.compile(r"Comm buffer requires a valid (CUDA|accelerator) device")


@dataclass(frozen=True)
class Bufs:
    w: Tensor
    scale: float


@dataclass(frozen=True)
class Knobs:
    scale: float


@pytest.fixture
def defined(ns):
    """define(body, name=...) -> OpDef; its tags are forgotten after the test."""
    names = []

    def define(fn, name="op", fake=None):
        op = opforge.op(f"{ns}::{name}", fake=fake)(fn)
        names.append(op.name)
        return op

    yield define
    for name in names:
        symm_mem.forget(name)


@pytest.fixture(params=["native", "lowering"])
def path(request):
    """Runs a test through torch's registry and through opforge's lowering."""
    if request.param == "native" and not NATIVE:
        pytest.skip(f"needs torch 2.13 (this is {torch.__version__}): the native symm-mem registry")
    previous = symm_mem.set_mode(request.param)
    yield request.param
    symm_mem.set_mode(previous)


@pytest.fixture
def lowering_path():
    previous = symm_mem.set_mode("lowering")
    yield
    symm_mem.set_mode(previous)


def all_reduce_op(define, name="ar", group=True):
    """A stand-in for a symmetric all-reduce: on one rank the sum is the input."""
    if group:
        def ar(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
            return input.clone()
    else:
        def ar(input: Tensor, reduce_op: str) -> Tensor:
            return input.clone()

    return define(ar, name, fake=lambda input, *args: torch.empty_like(input))


def declare(op, names, **kwargs):
    return symm_mem.declare(op.name, op.lowered, names, **kwargs)


def compile_and_code(fn, *args):
    torch._dynamo.reset()
    with fresh_cache():
        out, code = run_and_get_code(torch.compile(fn, fullgraph=True), *args)
    return out, "\n".join(code)


def lowering_of(op):
    """Inductor's lowering of an OpDef or an OpOverload."""
    from torch._inductor.lowering import lowerings

    return lowerings.get(getattr(op, "overload", op))


# Registry, validation and queries

def test_names_resolve_to_flat_tensor_leaves_in_schema_order(defined):
    def attn(q: Tensor, k: Tensor, bufs: Bufs, group_name: str) -> Tensor:
        return q

    op = defined(attn, "attn")
    assert declare(op, ["k", "bufs"]) == ["k", "bufs__w"]
    assert opforge.symm_mem.symm_mem_args(op.name) == ["k", "bufs__w"]
    assert symm_mem.arg_tags(op.name) == {"k": ["symm_mem"], "bufs__w": ["symm_mem"]}
    assert op.name in _C.ops_with_tag("symm_mem")


def test_a_field_path_and_a_leaf_name_denote_the_same_argument(defined):
    def attn(q: Tensor, bufs: Bufs, group_name: str) -> Tensor:
        return q

    op = defined(attn, "attn")
    assert declare(op, ["bufs.w"]) == ["bufs__w"]
    assert declare(op, ["bufs__w"]) == ["bufs__w"]


def test_a_tensor_list_argument_can_be_symmetric(defined):
    def gather(xs: list[Tensor], group_name: str) -> Tensor:
        return xs[0]

    assert declare(defined(gather, "gather"), ["xs"]) == ["xs"]


def test_an_unknown_name_is_an_error_naming_the_op_and_the_fix(defined):
    op = all_reduce_op(defined)
    with pytest.raises(ValueError, match=rf"^{op.name}: symm_mem_args: 'inp' is not a parameter.*"
                                         r"Name a parameter \(input, reduce_op, group_name\)"):
        declare(op, ["inp"])
    assert symm_mem.symm_mem_args(op.name) == []


def test_a_non_tensor_argument_is_an_error(defined):
    op = all_reduce_op(defined)
    with pytest.raises(ValueError, match=r"'reduce_op' has type str; only Tensor arguments can be "
                                         r"symm_mem_args\. Remove it from symm_mem_args\."):
        declare(op, ["reduce_op"])


def test_a_struct_without_tensor_fields_is_an_error(defined):
    def scaled(x: Tensor, knobs: Knobs, group_name: str) -> Tensor:
        return x

    with pytest.raises(ValueError, match="'knobs' is a struct with no Tensor fields"):
        declare(defined(scaled, "scaled"), ["knobs"])


def test_a_string_instead_of_a_sequence_is_a_type_error(defined):
    op = all_reduce_op(defined)
    with pytest.raises(TypeError, match=r"Write symm_mem_args=\('input',\)"):
        declare(op, "input")


def test_a_failed_declaration_keeps_the_previous_one(defined):
    op = all_reduce_op(defined)
    declare(op, ["input"])
    with pytest.raises(ValueError):
        declare(op, ["input", "nope"])
    assert symm_mem.symm_mem_args(op.name) == ["input"]


def test_no_names_declare_nothing(defined):
    op = all_reduce_op(defined)
    assert declare(op, []) == []
    assert symm_mem.arg_tags(op.name) == {}
    assert symm_mem.handled_by(op.name) is None


def test_a_missing_group_name_warns_that_automatic_realization_needs_it(defined):
    op = all_reduce_op(defined, group=False)
    with pytest.warns(UserWarning, match=rf"^{op.name}: symm_mem_args are declared but the op has no "
                                         r"'group_name' argument; automatic realization .* needs one"):
        assert declare(op, ["input"]) == ["input"]
    assert symm_mem.symm_mem_args(op.name) == ["input"]


def test_a_group_name_that_is_not_a_string_warns(defined):
    def ar(input: Tensor, group_name: int) -> Tensor:
        return input

    with pytest.warns(UserWarning, match="argument 'group_name' has type SymInt; .* needs a str group_name"):
        declare(defined(ar, "ar"), ["input"])


def test_a_str_group_name_does_not_warn(defined, monkeypatch):
    monkeypatch.setattr(symm_mem, "lowering_realizes_fixed_buffers", lambda: True)  # as on torch 2.11+
    op = all_reduce_op(defined)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        declare(op, ["input"])


@pytest.mark.parametrize("realizes", [True, False], ids=["torch-2.11+", "torch-2.10"])
def test_declaring_says_when_this_torch_cannot_allocate_the_arguments_under_compile(defined, monkeypatch,
                                                                                     realizes):
    monkeypatch.setattr(symm_mem, "lowering_realizes_fixed_buffers", lambda: realizes)
    previous = symm_mem.set_mode("lowering")
    try:
        op = all_reduce_op(defined)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            declare(op, ["input"])
    finally:
        symm_mem.set_mode(previous)
    messages = [str(w.message) for w in caught]
    if realizes:
        assert messages == []
    else:
        assert messages == [f"{op.name}: symm_mem_args 'input': torch {torch.__version__}'s Inductor cannot allocate "
                            f"an argument in symmetric memory once the op's layout constraint has fixed it (torch "
                            f"2.11 can), so under torch.compile they get ordinary buffers. Pass tensors from "
                            f"torch.distributed._symmetric_memory.empty(), or use torch 2.11 or later."]


def test_this_torch_is_read_right_about_fixed_buffers():
    from torch._inductor import comm_lowering

    assert symm_mem.lowering_realizes_fixed_buffers() is ("FixedLayout" in inspect.getsource(
        comm_lowering.can_realize_as_comm_buffer))


def test_arg_tags_shows_every_tag_of_the_generic_registry(defined):
    def attn(q: Tensor, k: Tensor, group_name: str) -> Tensor:
        return q

    op = defined(attn, "attn")
    _C.set_arg_tag(op.name, "pinned", ["q", "k"])
    declare(op, ["k"])
    assert symm_mem.arg_tags(op.name) == {"q": ["pinned"], "k": ["pinned", "symm_mem"]}
    assert _C.args_with_tag(op.name, "pinned") == ["q", "k"]
    symm_mem.forget(op.name)
    assert symm_mem.arg_tags(op.name) == {"q": ["pinned"], "k": ["pinned"]}
    _C.set_arg_tag(op.name, "pinned", [])


def test_queries_of_an_untagged_op_are_empty():
    assert symm_mem.symm_mem_args("nobody::nothing") == []
    assert symm_mem.arg_tags("nobody::nothing") == {}


def test_queries_need_a_qualified_name():
    with pytest.raises(ValueError, match="must have the form 'namespace::name'"):
        symm_mem.symm_mem_args("all_reduce")


def test_redeclaring_replaces_the_names(defined, path):
    def two(a: Tensor, b: Tensor, group_name: str) -> Tensor:
        return a + b

    op = defined(two, "two")
    declare(op, ["a"])
    declare(op, ["b"])
    assert symm_mem.symm_mem_args(op.name) == ["b"]
    if path == "native":
        assert list(native_entry(op.name).get()) == ["b"]


def test_forget_drops_the_tags_and_what_they_installed(defined, path):
    op = all_reduce_op(defined)
    declare(op, ["input"])
    symm_mem.forget(op.name)
    assert symm_mem.symm_mem_args(op.name) == []
    assert symm_mem.handled_by(op.name) is None
    # The op, still defined, has the flat-call lowering back (opforge._inductor).
    assert getattr(lowering_of(op), "_opforge_flat_call", None) is op.overload
    if path == "native":
        assert native_entry(op.name).get() is None


# torch's native registry (2.13+)

def native_entry(name):
    from torch._library.simple_registry import singleton

    return singleton.find(name).symm_mem_args


@needs_native
def test_auto_mode_forwards_to_the_native_registry(defined):
    assert symm_mem.mode() == "auto"
    op = all_reduce_op(defined)
    declare(op, ["input"])
    assert symm_mem.handled_by(op.name) == "native"
    assert list(native_entry(op.name).get()) == ["input"]
    assert not getattr(lowering_of(op), "_opforge_symm_mem", None)


@needs_native
def test_the_native_registration_lives_with_the_given_library(defined):
    op = all_reduce_op(defined)
    lib = torch.library.Library(op.name.split("::")[0], "FRAGMENT")
    declare(op, ["input"], lib=lib)
    assert list(native_entry(op.name).get()) == ["input"]
    lib._destroy()
    assert native_entry(op.name).get() is None


@needs_native
def test_uninstall_undoes_the_native_registration_and_sync_restores_it(defined):
    op = all_reduce_op(defined)
    declare(op, ["input"])
    assert op.name in symm_mem.uninstall()
    assert native_entry(op.name).get() is None
    assert symm_mem.symm_mem_args(op.name) == ["input"]  # the declaration stays in the core
    assert op.name in symm_mem.sync()
    assert list(native_entry(op.name).get()) == ["input"]


@needs_native
def test_ops_registered_with_torch_directly_are_reported(ns):
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define("ar(Tensor input, str reduce_op, str group_name) -> Tensor")
    lib.register_symm_mem_args("ar", ["input"])
    assert symm_mem.symm_mem_args(f"{ns}::ar") == ["input"]
    assert symm_mem.arg_tags(f"{ns}::ar") == {"input": ["symm_mem"]}
    lib._destroy()


@pytest.mark.skipif(NATIVE, reason=f"torch {torch.__version__} has the native registry: the error is for torch "
                                   f"before 2.13")
def test_native_mode_needs_the_native_registry():
    with pytest.raises(RuntimeError, match="has no native symm-mem registry.*Use 'auto' or 'lowering'"):
        symm_mem.set_mode("native")


def test_an_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="unknown mode 'fast'. Use one of auto, native, lowering"):
        symm_mem.set_mode("fast")


# opforge's Inductor lowering (torch without the native registry)

def test_the_lowering_is_installed_and_removed(defined, lowering_path, monkeypatch):
    import torch._inductor.lowering as L

    op = all_reduce_op(defined)
    # Every opforge op has the flat-call lowering (opforge._inductor); the symm_mem one wraps it.
    flat = lowering_of(op)
    assert flat._opforge_flat_call is op.overload
    declare(op, ["input"])
    assert symm_mem.handled_by(op.name) == "lowering"
    assert lowering_of(op)._opforge_symm_mem == op.name
    if NATIVE:
        assert native_entry(op.name).get() is None
    assert op.name in symm_mem.uninstall()
    assert lowering_of(op) is flat
    # Without the flat-call lowering, uninstall() leaves nothing of its own behind.
    assert symm_mem._inductor.remove(op.overload)
    monkeypatch.setattr(symm_mem._inductor, "sync", lambda: 0)
    declare(op, ["input"])
    symm_mem.uninstall()
    assert op.overload not in L.lowerings
    assert op.overload not in L.fallbacks and op.overload not in L._maybe_layout_constraints
    symm_mem.sync()
    assert lowering_of(op)._opforge_symm_mem == op.name


def test_the_lowering_wraps_an_existing_lowering_and_restores_it(defined, lowering_path):
    op = all_reduce_op(defined)
    x = torch.ones(3)
    compile_and_code(lambda t: op(t + 1, "sum", "0"), x)  # Inductor makes its own fallback
    fallback = lowering_of(op)
    assert getattr(fallback, "_opforge_symm_mem", None) is None
    declare(op, ["input"])
    assert lowering_of(op) is not fallback
    symm_mem.forget(op.name)
    assert lowering_of(op) is fallback


def test_installing_twice_changes_nothing(defined, lowering_path):
    op = all_reduce_op(defined)
    declare(op, ["input"])
    installed = lowering_of(op)
    declare(op, ["input"])
    assert symm_mem.sync() == []
    assert lowering_of(op) is installed


def test_switching_modes_moves_every_op(defined):
    op = all_reduce_op(defined)
    declare(op, ["input"])
    previous = symm_mem.set_mode("lowering")
    try:
        assert symm_mem.handled_by(op.name) == "lowering"
        assert lowering_of(op)._opforge_symm_mem == op.name
    finally:
        symm_mem.set_mode(previous)
    assert symm_mem.handled_by(op.name) == ("native" if NATIVE else "lowering")
    if NATIVE:
        assert getattr(lowering_of(op), "_opforge_symm_mem", None) is None
        assert list(native_entry(op.name).get()) == ["input"]


def test_sync_picks_up_tags_set_in_the_core(ns, lowering_path):
    # What OPFORGE_LIBRARY's .symm_mem_args() leaves behind: a spec and a tag in the core.
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define("ar(Tensor input, str reduce_op, str group_name) -> Tensor")
    lowered = _C.lower(f"{ns}::ar(Tensor input, str reduce_op, str group_name) -> Tensor", [])
    _C.add_op_spec(lowered)
    _C.set_arg_tag(f"{ns}::ar", "symm_mem", _C.resolve_tensor_args(lowered, ["input"], "symm_mem_args"))
    try:
        assert symm_mem.sync() == [f"{ns}::ar"]
        assert lowering_of(getattr(torch.ops, ns).ar.default)._opforge_symm_mem == f"{ns}::ar"
        assert symm_mem.sync() == []
    finally:
        _C.remove_op_spec(f"{ns}::ar")
        symm_mem.sync()
    assert symm_mem.handled_by(f"{ns}::ar") is None
    lib._destroy()


def test_the_lowering_leaves_untagged_ops_alone(defined, lowering_path, caplog):
    op = all_reduce_op(defined)
    declare(op, ["input"])
    _C.set_arg_tag(op.name, "symm_mem", [])  # tags gone, lowering not yet removed
    caplog.set_level(logging.DEBUG, logger="opforge.symm_mem")
    out, _ = compile_and_code(lambda t: op(t * 2, "sum", "0"), torch.ones(4))
    assert torch.equal(out, torch.full((4,), 2.0))
    assert "opforge.symm_mem" not in [r.name for r in caplog.records]


def test_the_lowering_passes_cpu_tensors_through(defined, lowering_path, caplog):
    op = all_reduce_op(defined)
    declare(op, ["input"])
    caplog.set_level(logging.DEBUG, logger="opforge.symm_mem")
    out, code = compile_and_code(lambda t: op(t * 2 + 1, "sum", "0"), torch.ones(4))
    assert torch.equal(out, torch.full((4,), 3.0))
    assert f"getattr(extern_kernels, '{symm_mem.flat_call_name(op.overload)}', None)" in code
    assert "empty_strided_p2p(" not in code
    assert f"{op.name}: argument 'input' is on cpu, where Inductor has no symmetric memory" in caplog.text


def test_the_emitted_code_calls_the_op_from_c(defined, lowering_path):
    from torch._inductor.select_algorithm import extern_kernels

    op = all_reduce_op(defined)
    declare(op, ["input"])
    calls = []
    op.register_kernel("cpu")(lambda input, reduce_op, group_name: calls.append(group_name) or input * 3)
    out, code = compile_and_code(lambda t: op(t + 1, "sum", group_name="7"), torch.ones(4))
    assert torch.equal(out, torch.full((4,), 6.0)) and calls == ["7"]
    name = symm_mem.flat_call_name(op.overload)
    ns, short = op.name.split("::")
    assert name == f"opforge_{len(ns)}_{ns}_{len(short)}_{short}_default"
    call = f"(getattr(extern_kernels, '{name}', None) or torch.ops.{op.name.replace('::', '.')}.default)"
    assert re.search(rf"= {re.escape(call)}\(buf\d+, 'sum', '7'\)", code), code
    flat = getattr(extern_kernels, name)
    assert isinstance(flat, _C.FlatCall) and flat.overload is op.overload
    symm_mem.forget(op.name)  # code compiled before keeps its call
    assert getattr(extern_kernels, name) is flat


def test_ops_whose_names_differ_only_in_underscores_get_calls_of_their_own():
    a = torch.library.Library("fc_a__b", "FRAGMENT")
    b = torch.library.Library("fc_a", "FRAGMENT")
    try:
        a.define("c(Tensor x) -> Tensor")
        b.define("b__c(Tensor x) -> Tensor")
        first, second = torch.ops.fc_a__b.c.default, torch.ops.fc_a.b__c.default
        names = {symm_mem.flat_call_name(first), symm_mem.flat_call_name(second)}
        assert names == {"opforge_7_fc_a__b_1_c_default", "opforge_4_fc_a_4_b__c_default"}
    finally:
        a._destroy()
        b._destroy()


def test_a_cached_graph_finds_the_call_in_a_fresh_process(tmp_path):
    # Later processes load the first one's code from Inductor's cache, which
    # skips the lowering: the call is registered all the same (tagged or not,
    # every opforge op has one: opforge._inductor), and a process that defines
    # the op with torch.library instead (so nothing registers it) calls torch's op.
    script = """
        import os, sys, torch, opforge
        from opforge import symm_mem
        from torch._dynamo.utils import counters
        from torch._inductor.select_algorithm import extern_kernels
        symm_mem.set_mode("lowering")
        tagged = ("input",) if sys.argv[1] == "tagged" else ()
        fake = lambda input, reduce_op, group_name: input.clone()

        if sys.argv[1] == "torch.library":
            # The opforge processes' key of the op (docs/compile_cache.md), which a process with no
            # opforge op lacks: with it, this process finds the graph they cached and runs it.
            import torch._inductor.config as inductor_config
            inductor_config.unsafe_marked_cacheable_functions = {"opforge cached::ar": sys.argv[2]}
            lib = torch.library.Library("cached", "DEF")
            lib.define("ar(Tensor input, str reduce_op, str group_name) -> Tensor")
            lib.impl("ar", lambda input, reduce_op, group_name: input * 2, "CPU")
            torch.library.register_fake("cached::ar", fake, lib=lib)
            ar = torch.ops.cached.ar.default
        else:
            # Defined in a function: Dynamo's graph then holds the flat op, as the torch.library
            # process's does, so that process finds the graph the first one cached. (A top-level
            # op is one node of Dynamo's graph, opforge._in_graph, and keys a graph of its own.)
            def define():
                @opforge.op("cached::ar", symm_mem_args=tagged, fake=fake)
                def ar(input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
                    return input * 2
                return ar
            ar = define()

        out = torch.compile(lambda t: ar(t + 1, "sum", "0"), fullgraph=True)(torch.ones(3))
        hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
        print(out.tolist(), min(hits, 1), hasattr(extern_kernels, "opforge_6_cached_2_ar_default"))
        import torch._inductor.config as inductor_config
        print(inductor_config.unsafe_marked_cacheable_functions.get("opforge cached::ar"))
    """
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    outs = []
    key = ""
    for how in ("tagged", "tagged", "untagged", "torch.library"):
        run = subprocess.run([sys.executable, "-c", textwrap.dedent(script), how, key], capture_output=True,
                             text=True, timeout=300, cwd=ROOT, env=env)
        assert run.returncode == 0, run.stderr
        line, key = run.stdout.strip().splitlines()
        outs.append(line)
    assert outs == ["[4.0, 4.0, 4.0] 0 True", "[4.0, 4.0, 4.0] 1 True", "[4.0, 4.0, 4.0] 1 True",
                    "[4.0, 4.0, 4.0] 1 False"]
    code = "".join(p.read_text() for p in tmp_path.rglob("*.py"))
    assert "getattr(extern_kernels, 'opforge_6_cached_2_ar_default', None)" in code


# Inductor realizes the tagged producer as a symmetric comm buffer

@pytest.fixture
def cpu_comm_buffers(monkeypatch):
    """Lets opforge's lowering realize CPU tensors, as torch's own registry does."""
    monkeypatch.setattr(symm_mem, "_COMM_DEVICE_TYPES", frozenset({"cuda", "cpu"}))


realizes_fixed_buffers = needs_torch("2.11", "Inductor making a buffer with a fixed layout a comm buffer",
                                     symm_mem.lowering_realizes_fixed_buffers())


def assert_realized_as_comm_buffer(fn, *args):
    try:
        _, code = compile_and_code(fn, *args)
    except Exception as e:  # torch's CPU codegen stops at the comm buffer
        assert COMM_BUFFER_ON_CPU.search(str(e)), str(e)
    else:
        assert "empty_strided_p2p(" in code


@realizes_fixed_buffers
def test_the_tagged_producer_becomes_a_comm_buffer(defined, path, cpu_comm_buffers):
    op = all_reduce_op(defined)
    declare(op, ["input"])
    assert_realized_as_comm_buffer(lambda t: op(t * 2 + 1, "sum", "0"), torch.ones(8))


@realizes_fixed_buffers
def test_every_item_of_a_tagged_tensor_list_becomes_a_comm_buffer(defined, path, cpu_comm_buffers):
    def gather(xs: list[Tensor], group_name: str) -> Tensor:
        return torch.cat(xs)

    op = defined(gather, "gather", fake=lambda xs, group_name: torch.cat(xs))
    declare(op, ["xs"])
    assert_realized_as_comm_buffer(lambda a, b: op([a * 2, b + 1], "0"), torch.ones(4), torch.ones(4))


def test_without_group_name_nothing_is_realized(defined, path, cpu_comm_buffers):
    op = all_reduce_op(defined, group=False)
    with pytest.warns(UserWarning, match="no 'group_name' argument"):
        declare(op, ["input"])
    out, code = compile_and_code(lambda t: op(t * 2 + 1, "sum"), torch.ones(4))
    assert torch.equal(out, torch.full((4,), 3.0))
    assert "empty_strided_p2p(" not in code


def test_an_untagged_argument_is_not_realized(defined, path, cpu_comm_buffers):
    def two(a: Tensor, b: Tensor, group_name: str) -> Tensor:
        return a + b

    op = defined(two, "two", fake=lambda a, b, group_name: torch.empty_like(a))
    declare(op, ["b"])
    out, code = compile_and_code(lambda x, y: op(x * 2, y, "0"), torch.ones(4), torch.ones(4))
    assert torch.equal(out, torch.full((4,), 3.0))  # b is a graph input: warned about, passed as is


def test_a_graph_input_cannot_be_realized_and_is_reported(defined, lowering_path, cpu_comm_buffers, caplog):
    op = all_reduce_op(defined)
    declare(op, ["input"])
    out, _ = compile_and_code(lambda t: op(t, "sum", "0"), torch.ones(4))
    assert torch.equal(out, torch.ones(4))
    assert f"{op.name}: argument 'input' cannot be allocated in symmetric memory by Inductor" in caplog.text


# Import cost and automatic pick-up

def run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_declaring_defers_the_lowering_until_inductor_is_imported():
    out = run_python("""
        import sys, torch, opforge
        from opforge import symm_mem

        symm_mem.set_mode("lowering")

        @opforge.op("late::ar")
        def ar(input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
            return input.clone()

        symm_mem.declare(ar.name, ar.lowered, ["input"])
        print("inductor imported:", "torch._inductor.lowering" in sys.modules)
        from torch._inductor.lowering import lowerings
        print("installed:", lowerings[ar.overload]._opforge_symm_mem)
    """)
    assert out.splitlines() == ["inductor imported: False", "installed: late::ar"]


def test_ops_tagged_in_the_core_are_picked_up_when_inductor_is_imported():
    out = run_python("""
        import torch, opforge
        from opforge import _C, symm_mem

        schema = "cpp_like::ar(Tensor input, str reduce_op, str group_name) -> Tensor"
        lib = torch.library.Library("cpp_like", "DEF")
        lib.define(schema.split("::")[1])
        lowered = _C.lower(schema, [])
        _C.add_op_spec(lowered)
        _C.set_arg_tag("cpp_like::ar", "symm_mem", ["input"])
        import torch._inductor.lowering
        print(symm_mem.handled_by("cpp_like::ar"))
    """)
    assert out.strip() == ("native" if NATIVE else "lowering")


def test_the_example_explains_itself_without_two_gpus():
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine can run the example for real")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "symm_mem_allreduce.py")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "needs 2 CUDA GPUs" in result.stdout


def test_the_decorator_declares_symm_mem_args(ns):
    @opforge.op(f"{ns}::ar", symm_mem_args=("input",))
    def ar(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
        return input.clone()

    try:
        assert opforge.symm_mem.symm_mem_args(ar.name) == ["input"]
        assert symm_mem.handled_by(ar.name) == ("native" if NATIVE else "lowering")
    finally:
        symm_mem.forget(ar.name)


def test_forgetting_tags_declared_at_definition_gives_the_op_its_flat_call_lowering(ns, lowering_path):
    # The symm_mem lowering came first and had nothing to wrap; once it is
    # gone the op gets the lowering every opforge op has (opforge._inductor).
    import torch._inductor.lowering  # noqa: F401 - the lowering path installs into Inductor's tables

    @opforge.op(f"{ns}::ar", symm_mem_args=("input",))
    def ar(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
        return input.clone()

    try:
        assert getattr(lowering_of(ar), "_opforge_symm_mem", None) == ar.name
    finally:
        symm_mem.forget(ar.name)
    assert getattr(lowering_of(ar), "_opforge_flat_call", None) is ar.overload


@realizes_fixed_buffers
def test_a_cpp_ops_tagged_producer_becomes_a_comm_buffer(path, cpu_comm_buffers):
    # tests/cpp_ext: opforge_ext::all_reduce(Tensor x, str reduce_op, str group_name), .symm_mem_args({"x"}).
    from cpp_ext import load

    ext = load()
    assert symm_mem.symm_mem_args("opforge_ext::all_reduce") == ["x"]
    assert symm_mem.handled_by("opforge_ext::all_reduce") == path
    assert_realized_as_comm_buffer(lambda t: ext.all_reduce(t * 2 + 1, "sum", "0"), torch.ones(8))
