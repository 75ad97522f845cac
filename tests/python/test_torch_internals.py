"""Every private torch name opforge uses is in opforge._torch_internals' table,
and is there on the running torch (docs/versions.md#torch-internals-opforge-uses).

A torch that drops or moves one fails here naming it and where opforge uses
it, instead of costing a feature without a failing test; the behaviour the
most important ones are used for is checked too. Taking any one entry away
makes `missing()` report exactly that name, and a reach into torch's
internals that the table does not list fails the scan of opforge's source."""

from __future__ import annotations

import ast
import inspect
import logging
import os
import re
import sys
import threading

import pytest
import torch

from opforge import _C, _torch_internals
from opforge._torch_internals import INTERNALS, Gone, applies, missing, resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "python", "opforge")
TABLE = os.path.join(PACKAGE, "_torch_internals.py")
NAMES = {e.name for e in INTERNALS}
BY_NAME = {e.name: e for e in INTERNALS}
VERSION = str(torch.__version__)


def _range(entry) -> str:
    if entry.since and entry.until:
        return f"{entry.since} up to {entry.until}"
    return f"{entry.since} and later" if entry.since else f"before {entry.until}"


def _applicable(entry) -> None:
    if not applies(entry):
        pytest.skip(f"opforge uses {entry.name} on torch {_range(entry)} only (this is {VERSION})")


def needs(name: str) -> None:
    _applicable(BY_NAME[name])


# --- the table itself ---------------------------------------------------------------------


def test_the_table_names_each_internal_once_with_every_field_filled():
    assert len(NAMES) == len(INTERNALS)
    for e in INTERNALS:
        assert e.name.startswith("torch.") and e.used_in and e.what and e.without and e.checked, e
        assert all(m.startswith("opforge.") for m in e.used_in), e
        for m in e.used_in:
            path = os.path.join(os.path.dirname(PACKAGE), *m.split(".")) + ".py"
            package = os.path.join(os.path.dirname(PACKAGE), *m.split("."), "__init__.py")
            assert os.path.exists(path) or os.path.exists(package), f"{e.name}: no module {m}"
        assert e.instance is None or e.instance in _torch_internals._PROBES, e


def test_nothing_in_opforge_imports_the_table():
    importers = [path for path, text in _sources() if "_torch_internals" in text]
    assert importers == []


def test_the_table_imports_no_torch_submodule_at_import():
    with open(TABLE, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top for a in n.names] + [n.module for n in top if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n and n.split(".")[0] == "torch"]


def test_applies_reads_since_as_inclusive_and_until_as_exclusive():
    e = _torch_internals.Internal("torch.x", ("opforge._op",), "w", "w", since="2.11", until="2.13")
    assert [applies(e, v) for v in ("2.10.1", "2.11.0", "2.12.1+cu130", "2.13.0", "2.14.0a0+git")] == \
        [False, True, True, False, False]


def _row(entry) -> str:
    """The entry's row in docs/versions.md's table."""
    versions = f" ({_range(entry)})" if entry.since or entry.until else ""
    used = ", ".join(f"`{m.removeprefix('opforge.')}`" for m in entry.used_in)
    return f"| `{entry.name}`{versions} | {used} | {entry.what} | {entry.without} | {', '.join(entry.checked)} |"


def test_docs_versions_renders_the_table():
    with open(os.path.join(ROOT, "docs", "versions.md"), encoding="utf-8") as f:
        section = f.read().split("## Torch internals opforge uses", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `torch.")]
    expected = [_row(e) for e in INTERNALS]
    assert rows == expected, ("docs/versions.md#torch-internals-opforge-uses differs from "
                              "opforge/_torch_internals.py; its rows are:\n" + "\n".join(expected))


# --- each entry is there ------------------------------------------------------------------


@pytest.mark.parametrize("entry", INTERNALS, ids=lambda e: e.name)
def test_the_internal_is_there(entry):
    _applicable(entry)
    try:
        resolve(entry)
    except Gone as e:
        pytest.fail(f"torch {VERSION} lacks {e}; without it opforge: {entry.without}. Update opforge "
                    f"(and opforge/_torch_internals.py).", pytrace=False)


# --- taking one away ----------------------------------------------------------------------


def _parent(entry):
    parent_name, attr = entry.name.rsplit(".", 1)
    return resolve(_torch_internals.Internal(parent_name, entry.used_in, "", "")), attr


def _take_away(monkeypatch, entry) -> None:
    """What a torch without the entry's name looks like to `resolve`."""
    parent, attr = _parent(entry)
    if entry.instance is not None:
        parent = _torch_internals._probe(entry.instance)  # the object resolve looks the attribute up on
    config = getattr(parent, "_config", None)
    if isinstance(parent, torch.utils._config_module.ConfigModule) and attr in config:
        # How a config module deletes a key; a plain delattr is not undone for an alias (force_disable_caches).
        monkeypatch.setattr(config[attr], "hide", True)
        return
    value = getattr(parent, attr)
    if inspect.ismodule(value):
        monkeypatch.setitem(sys.modules, value.__name__, None)
        if attr in vars(parent):
            monkeypatch.delattr(parent, attr)
        return
    owners = [parent] if attr in getattr(parent, "__dict__", {}) else []
    classes = parent.__mro__ if isinstance(parent, type) else type(parent).__mro__
    owners += [c for c in classes if c is not parent and attr in vars(c)]
    try:
        for owner in owners or [parent]:
            monkeypatch.delattr(owner, attr)
    except TypeError:  # an attribute of a built-in type: the type is replaced by one without it
        grandparent, parent_attr = _parent(_torch_internals.Internal(entry.name.rsplit(".", 1)[0], (), "", ""))
        monkeypatch.setattr(grandparent, parent_attr, type(parent_attr, (), {}))


@pytest.mark.parametrize("entry", INTERNALS, ids=lambda e: e.name)
def test_taking_the_internal_away_makes_missing_report_it(monkeypatch, entry):
    _applicable(entry)
    resolve(entry)  # the entry's instance is made before anything is taken away
    _take_away(monkeypatch, entry)
    gone = missing()
    assert entry.name in gone, f"{entry.name} was taken away but missing() reports {gone}"
    # Entries under it (its attributes) go with it; nothing else does.
    assert [n for n in gone if n != entry.name and not n.startswith(entry.name + ".")] == []


# --- what the most important ones are used for --------------------------------------------


def test_dynamo_sets_current_tx_and_the_current_node_while_it_runs_a_node_on_fake_tensors():
    from torch._dynamo import symbolic_convert, utils

    seen = []

    def f(x):
        seen.append((getattr(symbolic_convert.tls, "current_tx", None) is not None, utils.get_current_node()))
        return x + 1

    torch.compiler.allow_in_graph(f)
    torch._dynamo.reset()
    try:
        torch.compile(lambda x: f(x) * 2, backend="eager", fullgraph=True)(torch.ones(2))
    finally:
        torch._dynamo.reset()
    assert isinstance(symbolic_convert.tls, threading.local)
    traced = [(tx, node) for tx, node in seen if tx]
    assert traced, "opforge._in_graph.refused: Dynamo no longer sets symbolic_convert.tls.current_tx in a fake run"
    assert callable(utils.get_current_node) and traced[0][1] is not None and traced[0][1].target is f, \
        "opforge._in_graph.refused: get_current_node() is not the node of the call Dynamo runs"
    assert seen[-1] == (False, None)  # the compiled call itself: not tracing
    assert utils.get_current_node() is None


def test_unsupported_is_an_exception_made_from_a_message():
    from torch._dynamo.exc import Unsupported
    from torch._dynamo.utils import counters

    assert issubclass(Unsupported, Exception)
    before = dict(counters["unimplemented"])
    try:
        assert "opforge: refused" in str(Unsupported("opforge: refused"))
    finally:  # Dynamo counts each graph break it makes
        counters["unimplemented"].clear()
        counters["unimplemented"].update(before)


def test_reset_keeps_opforges_compile_start_callback():
    from torch._dynamo.callback import callback_handler

    from opforge import _registry

    assert isinstance(callback_handler.start_callbacks, list)
    assert callable(callback_handler.register_start_callback)
    assert callable(type(callback_handler).clear)
    assert getattr(callback_handler.clear, "_opforge_keeps", False), \
        "opforge._registry: callback_handler.clear is not opforge's: torch._dynamo.reset() drops its callback"
    torch._dynamo.reset()
    assert _registry.compile_start in callback_handler.start_callbacks, \
        "torch._dynamo.reset() no longer calls callback_handler.clear(): opforge's compile-start callback is gone"


def test_fake_kernels_are_registered_on_the_fast_path():
    import torch._library.fake_impl as fake_impl
    import torch._library.simple_registry as registry

    from opforge import _op

    assert "lib" in inspect.signature(fake_impl.FakeImplHolder.register).parameters
    assert _op._FAKE_REGISTER_TAKES_LIB
    assert isinstance(registry.singleton.find("aten::add").fake_impl, fake_impl.FakeImplHolder)
    assert isinstance(registry.singleton._data, dict)
    from opforge import symm_mem

    if symm_mem.has_native_registry():  # get(name): native symm_mem_args only (torch 2.13+; 2.11 has no get)
        assert registry.singleton.get("opforge_internals_probe::nothing") is None
    lib = torch.library.Library("opforge_internals_probe_b", "FRAGMENT")
    assert isinstance(lib._registration_handles, list) and lib.m is not None
    lib._destroy()
    assert lib.m is None  # what symm_mem takes for a destroyed library


def test_the_native_symm_mem_registry_answers_through_the_operator_entry():
    needs("torch._library.simple_registry.SimpleOperatorEntry.symm_mem_args")
    import torch._library.simple_registry as registry

    holder = registry.SimpleOperatorEntry("opforge_internals_probe::op").symm_mem_args
    assert callable(holder.get) and not holder.get()


def test_the_schema_and_dispatch_queries_answer_as_opforge_reads_them():
    schemas = torch._C._jit_get_schemas_for_operator("aten::add")
    assert schemas and [a.name for a in schemas[0].arguments][:2] == ["self", "other"]
    assert not torch._C._jit_get_schemas_for_operator("opforge_internals_probe::nothing")
    assert any(s.name == "aten::add" for s in torch._C._jit_get_all_schemas())
    assert torch._C._dispatch_key_for_device("cpu") == "CPU"
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::relu", "CPU") is True
    torch._C._dispatch_find_schema_or_throw("aten::relu", "")
    with pytest.raises(RuntimeError):
        torch._C._dispatch_find_schema_or_throw("opforge_internals_probe::nothing", "")
    assert isinstance(torch._C._get_privateuse1_backend_name(), str)
    assert isinstance(torch._C._GLIBCXX_USE_CXX11_ABI, bool)
    assert torch._C._len_torch_dispatch_stack() == 0
    with torch._C._DisableTorchDispatch():
        pass
    assert isinstance(torch._mkldnn, torch.layout)


def test_a_torch_function_mode_sees_tensor_base_data_ptr_for_data_ptr():
    from torch.overrides import TorchFunctionMode

    seen = []

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Mode():
        torch.ones(1).data_ptr()
    assert seen[-1] is torch._C.TensorBase.data_ptr


def test_op_objects_carry_the_names_opforge_reads():
    import torch._library.custom_ops as custom_ops

    overload = torch.ops.aten.add.Tensor
    assert isinstance(overload, torch._ops.OpOverload)
    assert overload._schema.name == "aten::add" and overload._overloadname == "Tensor"
    assert torch.ops.aten.add._qualified_op_name == "aten::add"
    assert isinstance(torch.ops, torch._ops._Ops)
    assert isinstance(torch.ops.aten, torch._ops._OpNamespace) and torch.ops.aten.name == "aten"
    assert isinstance(inspect.getattr_static(custom_ops.CustomOpDef, "_qualname"), property)


def test_inductors_tables_are_what_the_flat_call_lowering_edits():
    import torch._decomp
    import torch._inductor.config as config
    import torch._inductor.exc as exc
    import torch._inductor.lowering as L
    from torch._library.utils import get_layout_constraint_tag

    assert isinstance(L.lowerings, dict) and isinstance(L.decompositions, dict)
    assert isinstance(L._maybe_layout_constraints, dict)
    assert callable(L.fallbacks.discard) and callable(L.needs_realized_inputs.discard)
    assert {"layout_constraint", "warn"} <= set(inspect.signature(L.make_fallback).parameters)
    tag = get_layout_constraint_tag(torch.ops.aten.add.Tensor, with_default=True)
    assert isinstance(tag, torch.Tag)
    L.tag_to_layout_constraint(tag)
    assert isinstance(torch._decomp.global_decomposition_table["post_autograd"], dict)
    assert isinstance(config.implicit_fallbacks, bool)
    assert isinstance(config.unsafe_marked_cacheable_functions, dict)
    assert issubclass(exc.MissingOperatorWithoutDecomp, Exception)
    assert callable(torch._inductor.aoti_compile_and_package)


def test_the_python_wrapper_calls_a_fallback_kernel_by_its_python_kernel_name_from_extern_kernels():
    import torch._inductor.codegen.wrapper as wrapper
    from torch._inductor import ir
    from torch._inductor.select_algorithm import extern_kernels

    assert issubclass(ir.FallbackKernel, ir.ExternKernel)
    assert {"python_kernel_name", "op_overload"} <= set(inspect.signature(ir.ExternKernel.__init__).parameters)
    source = inspect.getsource(wrapper)
    assert "from torch._inductor.select_algorithm import extern_kernels" in source
    assert "python_kernel_name" in inspect.getsource(wrapper.PythonWrapperCodegen)
    extern_kernels.opforge_internals_probe = len
    try:
        assert getattr(extern_kernels, "opforge_internals_probe") is len
    finally:
        del extern_kernels.opforge_internals_probe


def test_the_symm_mem_lowering_finds_inductors_comm_buffer_functions():
    from torch._inductor import comm_lowering, ir
    from torch.utils._pytree import tree_leaves

    from opforge import symm_mem

    assert ir.CommBufferType.SYMM_MEM is not None and isinstance(ir.TensorBox, type)
    assert len(inspect.signature(comm_lowering.can_realize_as_comm_buffer).parameters) == 2  # (box, type)
    assert len(inspect.signature(comm_lowering.realize_as_comm_buffer).parameters) == 3  # (box, type, group)
    assert tree_leaves({"a": [1, (2,)]}) == [1, 2]
    if applies(BY_NAME["torch._inductor.comm_lowering.can_realize_as_comm_buffer"]):
        assert symm_mem.lowering_realizes_fixed_buffers()


def test_handles_detect_dynamic_ints_and_trace_time_registration_from_dynamos_source():
    from opforge import handles

    needs("torch._dynamo.variables.builder")
    assert "_DynamicScalar" in handles._dynamo_source("variables.builder")
    assert handles._detect_mode() == "dynamic_int"
    if applies(BY_NAME["torch._dynamo.variables.functions"]):
        assert handles._dynamo_registers_at_trace_time()

        def marked():
            return None

        torch._dynamo.assume_constant_result(marked)
        assert marked._dynamo_marked_constant is True  # what opforge sets itself before Dynamo is imported


def test_the_exporting_flag_is_a_bool_outside_export():
    assert torch.compiler._is_exporting_flag is False


def test_the_triton_write_analysis_logs_its_failure_to_the_logger_opforge_filters():
    import torch._higher_order_ops.triton_kernel_wrap as tkw

    assert isinstance(tkw.log, logging.Logger)
    if applies(BY_NAME["torch._higher_order_ops.triton_kernel_wrap.identify_accessed_tensors"]):
        assert len(inspect.signature(tkw.identify_accessed_tensors).parameters) == 3
        assert {"read_writes"} <= set(tkw.TensorAccesses.__dataclass_fields__)
        source = inspect.getsource(tkw.identify_accessed_tensors)
        assert "log.warning" in source and "Encountered an exception" in source


def test_wrap_triton_enabled_is_the_thread_local_set_wrap_triton_enabled_sets():
    import torch._library.triton as torch_triton

    state = torch_triton.wrap_triton_enabled
    default = torch_triton.wrap_triton_enabled_default
    before = getattr(state, "value", default)
    with torch_triton.set_wrap_triton_enabled(not before):
        assert state.value is (not before) and torch_triton.is_wrap_triton_enabled() is (not before)
    assert getattr(state, "value", default) is before
    assert isinstance(torch_triton.triton_ops_to_kernels, dict)


def test_tracing_types_and_host_errors():
    import torch._library.simple_registry as registry
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    assert issubclass(FakeTensor, torch.Tensor) and issubclass(FunctionalTensor, torch.Tensor)
    assert issubclass(DataDependentOutputException, Exception)
    assert issubclass(DynamicOutputShapeException, Exception)
    assert registry.singleton.find("aten::add").torch_dispatch_rules.find(FunctionalTensorMode) is None


def test_benchmark_internals():
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    for config, name in ((inductor_config, "force_disable_caches"), (inductor_config, "fx_graph_cache"),
                         (functorch_config, "enable_autograd_cache")):
        assert isinstance(getattr(config, name), bool), name
    assert callable(torch._dynamo.reset)
    assert isinstance(counters["stats"]["unique_graphs"], int)
    layer = torch.nn.Linear(1, 1)
    layer.compile(backend="eager")
    assert layer._compiled_call_impl is not None


# --- opforge's source reaches nothing the table does not list -----------------------------


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _torch_private(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "torch" and any(_private(p) for p in parts[1:])


def covered(name: str) -> bool:
    """A listed name, a module on the way to one, or a public attribute of
    one (`torch._dynamo.symbolic_convert.tls.current_tx`). An `_opforge...`
    attribute is opforge's own mark on torch's object."""
    if name in NAMES or any(n.startswith(name + ".") for n in NAMES):
        return True
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:i]) in NAMES:
            return not any(_private(p) and not p.startswith("_opforge") for p in parts[i:])
    return False


# Names the scan finds that opforge does not reach, each with the reason.
IGNORED = {
    "torch.distributed._symmetric_memory.empty": "named in symm_mem's warnings as what the user can call",
}

# Private attributes opforge uses on objects that are not torch's, each with the owner.
FOREIGN = {
    "_initializing": "importlib's ModuleSpec (opforge._inductor.loaded)",
    "_active": "Triton's runtime driver (opforge.triton._writes)",
    "_capturing": "vLLM's breakable capture (opforge.cuda_graphs)",
    "_getframe": "sys._getframe",
    "_repr": "Triton's JITFunction (opforge.triton._flatten copies it)",
    "_magi_torch_registered_op": "MagiCompiler's, set on the op for MagiCompiler to read (opforge.compat.magi)",
    "_magi_param_mapping_tree": "MagiCompiler's, set on the op for MagiCompiler to read (opforge.compat.magi)",
    "_magi_flat_plan": "MagiCompiler's, set on the op for MagiCompiler to read (opforge.compat.magi)",
}

# Private attributes of torch's that opforge sets on its own objects, and the entry that covers each.
MARKS = {
    "_dynamo_marked_constant": "torch._dynamo.variables.functions",
}

_ATTR_CALLS = ("getattr", "hasattr", "setattr", "delattr")


def _sources():
    for d, _, files in os.walk(PACKAGE):
        for f in sorted(files):
            path = os.path.join(d, f)
            if f.endswith(".py") and path != TABLE:
                with open(path, encoding="utf-8") as src:
                    yield os.path.relpath(path, os.path.dirname(PACKAGE)), src.read()


def _const(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _chain(node, aliases: dict) -> str | None:
    """The dotted name an expression reaches: `L._maybe_layout_constraints`,
    `getattr(x, "a")`, `sys.modules.get("torch._x")`."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _chain(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Call):
        func = _chain(node.func, aliases) if not isinstance(node.func, ast.Name) else node.func.id
        if func in _ATTR_CALLS and len(node.args) >= 2 and _const(node.args[1]):
            base = _chain(node.args[0], aliases)
            return f"{base}.{_const(node.args[1])}" if base else None
        if func in ("sys.modules.get", "importlib.import_module") and node.args and _const(node.args[0]):
            return _const(node.args[0])
    if isinstance(node, ast.Subscript) and _chain(node.value, aliases) == "sys.modules":
        return _const(node.slice)
    return None


def _scope(nodes):
    """The nodes of one scope, and the functions defined in it."""
    inner, stack = [], list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner.append(node)  # its decorators, defaults and annotations belong to this scope
            stack.extend([*node.decorator_list, node.args, *([node.returns] if node.returns else [])])
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))
    yield from inner


def _reaches(tree) -> list[tuple[int, str]]:
    """(line, name) of every private torch name the module's code reaches."""
    found: list[tuple[int, str]] = []

    def visit(nodes, outer: dict) -> None:
        nodes = list(_scope(nodes))
        aliases = dict(outer)
        for _ in range(2):  # an assignment may use an alias bound below it
            for node in nodes:
                if isinstance(node, ast.Import):
                    for a in node.names:
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    for a in node.names:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    chain = _chain(node.value, aliases)
                    for t in targets:
                        if isinstance(t, ast.Name) and chain:
                            aliases[t.id] = chain
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(node.body, aliases)
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif _const(node) and re.fullmatch(r"torch(\.\w+)+", _const(node)):
                names = [_const(node)]
            elif isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                names = [_chain(node, aliases) or ""]
            found.extend((getattr(node, "lineno", 0), n) for n in names if _torch_private(n))

    visit(tree.body, {})
    return found


def test_every_private_torch_name_opforges_code_reaches_is_in_the_table():
    unlisted = []
    for path, text in _sources():
        for line, name in _reaches(ast.parse(text)):
            if not covered(name) and name not in IGNORED:
                unlisted.append(f"{path}:{line}: {name}")
    assert not unlisted, ("private torch names opforge uses that opforge/_torch_internals.py does not list "
                          "(add an entry):\n  " + "\n  ".join(sorted(set(unlisted))))


def test_every_private_torch_name_opforges_comments_and_messages_mention_is_in_the_table():
    unlisted = []
    for path, text in _sources():
        for number, line in enumerate(text.splitlines(), 1):
            for match in re.finditer(r"\btorch(?:\.\w+)+", line):
                name = match.group(0)
                if _torch_private(name) and not covered(name) and name not in IGNORED:
                    unlisted.append(f"{path}:{number}: {name}")
    assert not unlisted, ("private torch names in opforge's source that opforge/_torch_internals.py does not "
                          "list (add an entry, or to IGNORED with the reason):\n  " + "\n  ".join(unlisted))


def _own_names() -> set[str]:
    """Every name opforge defines: functions, classes, assigned names,
    parameters, slots, attributes it sets on `self` or `cls`, its extension's."""
    own = set(dir(_C))
    for name in dir(_C):
        if isinstance(getattr(_C, name), type):
            own |= set(dir(getattr(_C, name)))
    for _, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                own.add(node.arg)  # argparse's set_defaults(_module=...)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                own.add(node.attr)
            elif isinstance(node, ast.alias):
                own.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                      for t in node.targets):
                own |= {c.value for c in ast.walk(node.value) if _const(c)}
    return own


def test_every_private_attribute_opforge_uses_on_torchs_objects_is_in_the_table():
    """`overload._schema`, `lib._destroy()`: a private attribute of an object
    the scan cannot name. Every private attribute opforge reads or sets that
    opforge does not define is a listed name's last part, or in FOREIGN or
    MARKS."""
    for attr, name in MARKS.items():
        assert attr in BY_NAME[name].text, (attr, name)
    own = _own_names()
    last_parts = {n.rsplit(".", 1)[1] for n in NAMES}
    unlisted = []
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute):
                base, attr = node.value, node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTR_CALLS
                  and len(node.args) >= 2 and _const(node.args[1])):
                base, attr = node.args[0], _const(node.args[1])
            else:
                continue
            if (not _private(attr) or attr.startswith("_opforge") or attr in own or attr in last_parts
                    or attr in FOREIGN or attr in MARKS):
                continue
            if isinstance(base, ast.Name) and base.id == "torch":
                continue  # a torch._ name: the scans above
            unlisted.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not unlisted, ("private attributes opforge uses that neither opforge defines nor "
                          "opforge/_torch_internals.py lists (add an entry, or to FOREIGN with the owner):\n  "
                          + "\n  ".join(unlisted))
