"""Every private torch name opforge's Python package reaches, in one table
(docs/versions.md#torch-internals-opforge-uses).

Each entry names what opforge reads (a module, function, class, attribute or
config key under `torch._...`, a private attribute of a public object, or a
Dynamo or Inductor source file whose text opforge reads instead of importing
it), where it is used, what for, and what opforge does on a torch that lacks
it. ("symm_mem's lowering mode" is how symm_mem_args reach Inductor on torch
before 2.13, or after `opforge.symm_mem.set_mode("lowering")`.) `missing()`
resolves every entry that applies to the running torch and returns the names
that are gone:

    >>> from opforge import _torch_internals
    >>> _torch_internals.missing()
    []

tests/python/test_torch_internals.py resolves each entry, checks the
behaviour the most important ones are used for, and fails where opforge's
source reaches a private torch name that is not listed here.

Nothing in opforge imports this module, and it imports no torch submodule
until `missing()` or `resolve()` runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys

__all__ = ["INTERNALS", "Gone", "Internal", "applies", "missing", "resolve"]


@dataclasses.dataclass(frozen=True)
class Internal:
    """One private torch name opforge uses.

    name: dotted, from `torch`. For an attribute set on instances, the
        class's name and the attribute (`instance` says which object it is
        checked on); for an attribute of a thread-local or of an object that
        only exists while compiling, the path as far as it exists at import
        time (`what` says what is read later).
    used_in: the opforge modules that use it.
    what: what opforge uses it for.
    without: what opforge does on a torch without it.
    since, until: the torch versions opforge uses it on (`since` inclusive,
        `until` exclusive, major.minor); None for every supported version.
    checked: the torch versions the entry was checked on.
    instance: for an attribute set on instances, the object it is looked up
        on (a key of `_PROBES`).
    text: strings opforge looks for in the named object's source (it reads
        the file instead of importing it).
    """

    name: str
    used_in: tuple[str, ...]
    what: str
    without: str
    since: str | None = None
    until: str | None = None
    checked: tuple[str, ...] = ("2.13.0",)
    instance: str | None = None
    text: tuple[str, ...] = ()


def _e(name: str, used_in: str, what: str, without: str, **kwargs) -> Internal:
    return Internal(name, tuple(used_in.split()), what, without, **kwargs)


_OP = "torch.ops.aten.add.Tensor"
_PACKET = "torch.ops.aten.add"
_LIBRARY = 'torch.library.Library("opforge_internals_probe", "FRAGMENT")'
_ENTRY = 'torch._library.simple_registry.SimpleOperatorEntry("opforge_internals_probe::op")'

INTERNALS: tuple[Internal, ...] = (
    # --- the dispatcher and schema registry (torch._C) ---
    _e("torch._C._jit_get_schemas_for_operator", "opforge._op opforge._inspect opforge.symm_mem",
       "whether an operator name is taken (every op definition), a torch op's schemas (`opforge inspect`), "
       "argument order (symm_mem.arg_tags)",
       "error: every op definition raises AttributeError"),
    _e("torch._C._jit_get_all_schemas", "opforge.gen._aten opforge.gen._stubs",
       "every registered schema: `opforge gen --source registry`, stubs of a namespace",
       "error: `opforge gen` (registry source) and stub generation raise AttributeError"),
    _e("torch._C._dispatch_key_for_device", "opforge._kinds opforge._cpp_ops opforge.compat.vllm",
       "the dispatch key of a device type (register_kernel, device_types, vLLM's dispatch_key)",
       "error: registering a per-device kernel raises AttributeError"),
    _e("torch._C._dispatch_has_kernel_for_dispatch_key", "opforge._cpp_ops",
       "whether a C++ op already has a kernel for a key, so a Python decorator does not override it",
       "error: register_fake, register_autograd and register_kernel of C++ ops raise AttributeError"),
    _e("torch._C._dispatch_find_schema_or_throw", "opforge.deploy",
       "whether the ops a saved program needs are registered (deploy.load)",
       "error: deploy.load's check raises AttributeError"),
    _e("torch._C._get_privateuse1_backend_name", "opforge.compat.vllm",
       "the PrivateUse1 device name, a candidate device for vLLM's dispatch_key",
       "error: a vLLM-style op with a device dispatch_key raises AttributeError"),
    _e("torch._C._GLIBCXX_USE_CXX11_ABI", "opforge.gen._build",
       "the C++ ABI flag for compiling generated libraries",
       "error: building an `opforge gen` library raises AttributeError"),
    _e("torch._C.TensorBase.data_ptr", "opforge.triton._trace",
       "the function torch_function modes see for `t.data_ptr()`: traced Triton host code gets a stand-in address",
       "error: importing opforge.triton raises AttributeError, so every op definition fails where Triton is "
       "installed"),
    _e("torch._C._len_torch_dispatch_stack", "opforge.triton._trace",
       "whether a dispatch mode is active: a Triton op's backward runs its traced copy",
       "error: importing opforge.triton raises AttributeError, so every op definition fails where Triton is "
       "installed"),
    _e("torch._C._DisableTorchDispatch", "opforge.triton._writes",
       "real stand-in tensors for torch's write analysis of a Triton kernel while tracing",
       "feature off (quiet): the analysis answers None, so undeclared writes of Triton kernels are not "
       "reported"),
    _e("torch._mkldnn", "opforge.gen.casekit",
       "the MKLDNN layout, to allocate an out= tensor like a reference result",
       "error: casekit checks of an op with an MKLDNN result raise AttributeError"),
    # --- operator objects (torch._ops, torch._library) ---
    _e("torch._ops.OpOverload", "opforge._inductor opforge.deploy opforge.symm_mem opforge.triton._scan",
       "isinstance checks: the flat call's ops, a program's ops, ops a Triton op's body calls",
       "error: those checks raise AttributeError"),
    _e("torch._ops.OpOverload._schema",
       "opforge._op opforge._inductor opforge.deploy opforge.symm_mem opforge.triton._scan",
       "an overload's schema: OpDef.schema, the flat call's name, a program's op names, argument names",
       "error: OpDef.schema, deploy.requirements and the Triton scan raise AttributeError; the flat-call "
       "lowering fails to install (logged)", instance=_OP),
    _e("torch._ops.OpOverload._overloadname", "opforge._inductor",
       "the overload's name in the flat call's name under extern_kernels",
       "slower path: the flat-call lowering fails to install (logged); error declaring symm_mem_args in "
       "symm_mem's lowering mode", instance=_OP),
    _e("torch._ops.OpOverloadPacket._qualified_op_name", "opforge.triton._scan",
       "the name of an op packet a Triton op's body calls", "error: scanning such a body raises AttributeError",
       instance=_PACKET),
    _e("torch._ops._Ops", "opforge.triton._scan",
       "recognizes `torch.ops` in a Triton op's body", "error: scanning an op's body raises AttributeError"),
    _e("torch._ops._OpNamespace", "opforge.triton._scan",
       "recognizes `torch.ops.ns` (and reads its `name`) in a Triton op's body",
       "error: scanning an op's body raises AttributeError"),
    _e("torch._library.custom_ops.CustomOpDef._qualname", "opforge.triton._scan",
       "the name of a torch.library.custom_op a Triton op's body calls",
       "error: scanning an op's body raises AttributeError"),
    _e("torch._library.fake_impl.FakeImplHolder", "opforge._op",
       "whether FakeImplHolder.register takes `lib`: the fake kernel is registered without reading the caller's "
       "source line", "slower path: Library._register_fake, which reads the caller's source line from disk"),
    _e("torch._library.simple_registry.singleton", "opforge._op opforge.symm_mem",
       "torch's per-op registry: find(name).fake_impl to register a fake kernel; get(name) for native "
       "symm_mem_args (torch 2.13+)",
       "error: every op definition raises AttributeError (where FakeImplHolder.register takes lib)"),
    _e("torch._library.simple_registry.singleton._data", "opforge.triton._scan",
       "whether an op has a FunctionalTensorMode rule (torch.library.triton_op's decomposition)",
       "feature off (quiet): such an op counts as opaque in a Triton op's body"),
    _e("torch._library.simple_registry.SimpleOperatorEntry.symm_mem_args", "opforge.symm_mem",
       "the symm_mem_args torch's native registry holds for an op",
       "error: symm_mem_args() and arg_tags() of an op opforge did not tag raise AttributeError",
       since="2.13", instance=_ENTRY),
    _e("torch._library.utils.get_layout_constraint_tag", "opforge._inductor",
       "the layout constraint of the fallback Inductor would make for an op",
       "slower path: the flat-call lowering fails to install (logged); error declaring symm_mem_args in "
       "symm_mem's lowering mode"),
    _e("torch._library.triton.wrap_triton_enabled", "opforge.triton",
       "the thread-local (`.value`) that turns wrap_triton off for an eager Triton op call",
       "slower path: set_wrap_triton_enabled, a context manager, around each eager call"),
    _e("torch._library.triton.wrap_triton_enabled_default", "opforge.triton",
       "what wrap_triton_enabled.value means when unset", "assumes True"),
    _e("torch._library.triton.set_wrap_triton_enabled", "opforge.triton",
       "wrap_triton off around an eager call (where the thread-local is absent)",
       "error: defining a Triton op whose body calls wrap_triton raises AttributeError"),
    _e("torch._library.triton.triton_ops_to_kernels", "opforge.triton._scan",
       "the kernels of a torch.library.triton_op op that a Triton op's body calls",
       "feature off (quiet): such an op's kernels are not seen"),
    # --- torch.library.Library's private members ---
    _e("torch.library.Library._destroy", "opforge._op",
       "removes the op's library when a definition fails part way",
       "error: a failed definition raises AttributeError from its rollback instead of its own error"),
    _e("torch.library.Library._register_fake", "opforge._op opforge.bench.eager",
       "registers a fake kernel where FakeImplHolder.register does not take lib",
       "error on that path: every op definition raises AttributeError"),
    _e("torch.library.Library._registration_handles", "opforge._op opforge.symm_mem",
       "the library's registration handles: the fake kernel's handle is added; the native symm_mem_args "
       "registration's handle is taken back",
       "slower path for fake kernels (Library._register_fake); error forwarding symm_mem_args to torch's "
       "registry (torch 2.13+)", instance=_LIBRARY),
    _e("torch.library.Library.m", "opforge.symm_mem",
       "the C++ library; None once the library is destroyed",
       "native symm_mem_args are registered in opforge's own fragment library of the namespace", instance=_LIBRARY),
    # --- tensor subclasses used while tracing ---
    _e("torch._subclasses.functional_tensor.FunctionalTensorMode", "opforge._kinds opforge.triton._scan",
       "a Triton op's decomposition under AOTAutograd; whether an op has such a rule",
       "error: defining a Triton op raises ImportError"),
    _e("torch._subclasses.functional_tensor.FunctionalTensor", "opforge.triton._trace",
       "whether a value is traced (a Triton op's backward, data_ptr of traced tensors)",
       "error: a Triton op's backward and traced host code raise ImportError"),
    _e("torch._subclasses.fake_tensor.FakeTensor", "opforge.triton._trace",
       "whether a value is traced (a Triton op's backward, data_ptr of traced tensors)",
       "error: a Triton op's backward and traced host code raise ImportError"),
    _e("torch._subclasses.fake_tensor.DataDependentOutputException", "opforge.triton._trace",
       "recognizes host code that reads a tensor's value while a Triton op is traced",
       "error: ImportError in place of the HostCodeError naming the user's line"),
    _e("torch._subclasses.fake_tensor.DynamicOutputShapeException", "opforge.triton._trace",
       "recognizes host code that reads a tensor's value while a Triton op is traced",
       "error: ImportError in place of the HostCodeError naming the user's line"),
    _e("torch._higher_order_ops.triton_kernel_wrap.identify_accessed_tensors", "opforge.triton._writes",
       "which arguments a Triton kernel writes (undeclared-write check)",
       "falls back to identify_mutated_tensors; without either, undeclared writes are not reported", since="2.12"),
    _e("torch._higher_order_ops.triton_kernel_wrap.identify_mutated_tensors", "opforge.triton._writes",
       "which arguments a Triton kernel writes, before torch 2.12",
       "feature off: undeclared writes of Triton kernels are not reported", until="2.12"),
    _e("torch._higher_order_ops.triton_kernel_wrap.log", "opforge.triton._writes",
       "the logger of the analysis' 'assuming every input is mutated' warning, filtered to tell a failed "
       "analysis from a real answer",
       "filters the logger named 'torch._higher_order_ops.triton_kernel_wrap', not the one torch 2.13 logs "
       "to ('torch._dynamo'): a failed analysis would read as every argument written"),
    # --- Dynamo ---
    _e("torch._dynamo.symbolic_convert.tls", "opforge._in_graph",
       "whether Dynamo is tracing: `tls.current_tx` is set while it runs a node on fake tensors",
       "quiet: a refused argument of a one-node op fails torch.compile with Dynamo's TorchRuntimeError, where "
       "a graph break would run the call eagerly and raise the boundary's own error"),
    _e("torch._dynamo.utils.get_current_node", "opforge._in_graph",
       "the graph node Dynamo is running on fake tensors: a refused call is a graph break only in its own "
       "node's run", "every refused call of a one-node op while Dynamo traces becomes a graph break"),
    _e("torch._dynamo.exc.Unsupported", "opforge._in_graph",
       "the graph break a refused argument of a one-node op raises, with the boundary's message",
       "error: ImportError in place of the graph break"),
    _e("torch._dynamo.callback.callback_handler", "opforge._registry",
       "the compile-start callback (start_callbacks, register_start_callback): C++ ops made, one-node ops "
       "given to allow_in_graph, symm_mem tags synced, before Dynamo traces",
       "import fails: feature off (quiet): no op is one node of Dynamo's graph, a C++ op loaded with "
       "torch.ops.load_library has no OpDef when first traced; a missing method: `import opforge` fails"),
    _e("torch._dynamo.callback.callback_handler.clear", "opforge._registry",
       "what torch._dynamo.reset() calls to drop every callback; opforge's replacement registers its own again",
       "quiet: after torch._dynamo.reset() the compile-start callback is gone (as without callback_handler)"),
    _e("torch._dynamo.reset", "opforge.bench.compile opforge.bench.compiled opforge.bench.runners opforge._demo",
       "a fresh Dynamo before each measured compile", "error: benchmarks and the demo raise AttributeError"),
    _e("torch._dynamo.utils.counters", "opforge.bench.compile opforge.bench.runners opforge._demo",
       "counters['stats']['unique_graphs']: graphs compiled", "error: benchmarks and the demo raise ImportError"),
    _e("torch._dynamo.assume_constant_result", "opforge.handles",
       "marks the function that registers a runner at trace time (or, before Dynamo is imported, opforge sets "
       "the `_dynamo_marked_constant` attribute it sets)",
       "error: defining the first op with a Handle parameter raises AttributeError", since="2.12"),
    _e("torch._dynamo.variables.functions.invoke_and_store_as_constant", "opforge.handles",
       "source text read: it takes a plain object, so runners made without __init__ register at trace time",
       "such a runner, first met under torch.compile, is an error naming the fix (as on torch 2.11)",
       since="2.12", text=("UserDefinedObjectVariable",)),
    _e("torch._dynamo.variables.functions", "opforge.handles",
       "source text read: Dynamo honours the `_dynamo_marked_constant` attribute opforge sets itself",
       "such a runner, first met under torch.compile, is an error naming the fix (as on torch 2.11)",
       since="2.12", text=("_dynamo_marked_constant",)),
    _e("torch._dynamo.variables.builder", "opforge.handles",
       "source text read: Dynamo lifts a DynamicInt (_DynamicScalar) as a SymInt graph input; without "
       "DynamicInt (torch 2.9), 're.match' says dynamic_sources takes patterns",
       "handles mode 'dynamic_sources' or 'constant': an int handle is a constant under torch.compile",
       since="2.10", text=("_DynamicScalar",)),
    _e("torch.compiler._is_exporting_flag", "opforge.handles",
       "whether torch.export is tracing: a handle op refuses an export",
       "torch.compiler.is_exporting(), which some releases (2.11) trace as True under torch.compile: every "
       "compiled call of a handle op is refused as an export"),
    # --- Inductor ---
    _e("torch._inductor.lowering", "opforge._inductor opforge.symm_mem",
       "the module whose import an import hook watches: flat-call lowerings installed, symm_mem synced",
       "slower path (quiet): no flat-call lowering, Inductor calls every opforge op through torch.ops; in "
       "symm_mem's lowering mode tagged arguments get ordinary buffers"),
    _e("torch._inductor.lowering.lowerings", "opforge._inductor opforge.symm_mem",
       "Inductor's lowering table: the flat-call and symm-mem lowerings go in it",
       "error: every op definition after Inductor is imported raises AttributeError (read outside the "
       "install's try)"),
    _e("torch._inductor.lowering.decompositions", "opforge._inductor",
       "ops Inductor decomposes are left to it",
       "slower path: the flat-call lowering fails to install (logged); Inductor calls torch.ops"),
    _e("torch._inductor.lowering.fallbacks", "opforge._inductor",
       "put back as it was when a flat-call lowering is removed",
       "slower path: the flat-call lowering fails to install (logged); error declaring symm_mem_args in "
       "symm_mem's lowering mode"),
    _e("torch._inductor.lowering.needs_realized_inputs", "opforge._inductor",
       "put back as it was when a flat-call lowering is removed",
       "slower path: the flat-call lowering fails to install (logged); error declaring symm_mem_args in "
       "symm_mem's lowering mode"),
    _e("torch._inductor.lowering._maybe_layout_constraints", "opforge._inductor",
       "put back as it was when a flat-call lowering is removed",
       "slower path: the flat-call lowering fails to install (logged); error declaring symm_mem_args in "
       "symm_mem's lowering mode"),
    _e("torch._inductor.lowering.tag_to_layout_constraint", "opforge._inductor",
       "the layout constraint of the fallback Inductor would make",
       "slower path: the flat-call lowering fails to install (logged); error declaring symm_mem_args in "
       "symm_mem's lowering mode"),
    _e("torch._inductor.lowering.make_fallback", "opforge._inductor opforge.symm_mem",
       "the fallback lowering each opforge lowering wraps",
       "slower path: the flat-call lowering fails to install (logged); error declaring symm_mem_args in "
       "symm_mem's lowering mode"),
    _e("torch._decomp.global_decomposition_table", "opforge._inductor",
       "ops with a post-autograd decomposition are left to Inductor",
       "slower path: the flat-call lowering fails to install (logged); Inductor calls torch.ops"),
    _e("torch._inductor.select_algorithm.extern_kernels", "opforge._inductor opforge.symm_mem",
       "the namespace Inductor's Python wrapper imports; each op's _C.FlatCall is registered in it",
       "slower path: the flat-call lowering fails to install (logged); error declaring symm_mem_args in "
       "symm_mem's lowering mode"),
    _e("torch._inductor.ir.FallbackKernel", "opforge._inductor",
       "the nodes a fallback lowering adds: reads `op_overload`, rewrites `python_kernel_name` (the callee "
       "the Python wrapper writes) to the FlatCall",
       "error: compiling a graph holding an opforge op fails in Inductor's lowering"),
    _e("torch._inductor.ir.TensorBox", "opforge.symm_mem", "the tagged arguments a symm-mem lowering realizes",
       "error: compiling a symm-mem op fails in Inductor's lowering (symm_mem's lowering mode)"),
    _e("torch._inductor.ir.CommBufferType", "opforge.symm_mem", "SYMM_MEM, the comm buffer kind of a tagged argument",
       "error: compiling a symm-mem op fails in Inductor's lowering (symm_mem's lowering mode)"),
    _e("torch._inductor.virtualized.V", "opforge._inductor opforge.symm_mem",
       "V.graph while lowering: `operations` (the nodes a lowering adds), `cpp_wrapper`, `fx_wrapper`",
       "error: compiling a graph holding an opforge op fails in Inductor's lowering"),
    _e("torch._inductor.config.implicit_fallbacks", "opforge._inductor",
       "a flat-call lowering refuses the op as Inductor does where implicit fallbacks are off",
       "error: compiling a graph holding an opforge op fails in Inductor's lowering"),
    _e("torch._inductor.exc.MissingOperatorWithoutDecomp", "opforge._inductor",
       "the error Inductor raises for an op it cannot lower, raised where implicit fallbacks are off",
       "error: compiling a graph holding an opforge op fails in Inductor's lowering"),
    _e("torch._inductor.config.unsafe_marked_cacheable_functions", "opforge._in_graph",
       "one-node ops and their struct classes marked cacheable for AOTAutograd's cache",
       "slower path (quiet): AOTAutograd's cache refuses graphs holding one-node ops"),
    _e("torch._inductor.comm_lowering.can_realize_as_comm_buffer", "opforge.symm_mem",
       "source text read: a buffer whose layout is fixed can be made a comm buffer (FixedLayout); called in "
       "the symm-mem lowering",
       "text gone: a warning at declaration that tagged arguments get ordinary buffers under torch.compile; "
       "function gone: compiling a symm-mem op fails in Inductor's lowering (both in symm_mem's lowering mode)",
       since="2.11", text=("FixedLayout",)),
    _e("torch._inductor.comm_lowering.realize_as_comm_buffer", "opforge.symm_mem",
       "makes a tagged argument a SYMM_MEM comm buffer of the op's group",
       "error: compiling a symm-mem op fails in Inductor's lowering (symm_mem's lowering mode)"),
    _e("torch._inductor.aoti_compile_and_package", "opforge.deploy",
       "what deploy.aoti_compile_and_package calls", "error: deploy.aoti_compile_and_package raises AttributeError"),
    _e("torch._inductor.config.force_disable_caches", "opforge.bench.runners",
       "compile caches off while compile times are measured",
       "quiet: the cache stays as configured; measured compiles may hit it"),
    _e("torch._inductor.config.fx_graph_cache", "opforge.bench.runners",
       "compile caches off while compile times are measured",
       "quiet: the cache stays as configured; measured compiles may hit it"),
    _e("torch._functorch.config.enable_autograd_cache", "opforge.bench.runners",
       "compile caches off while compile times are measured",
       "quiet: the cache stays as configured; measured compiles may hit it"),
    _e("torch.nn.Module._compiled_call_impl", "opforge.bench.runners",
       "set to None to drop a layer's Module.compile", "quiet: layers stay compiled after the runner benchmark"),
    _e("torch.utils._pytree.tree_leaves", "opforge.symm_mem", "the tensors of a tagged argument",
       "error: compiling a symm-mem op fails in Inductor's lowering (symm_mem's lowering mode)"),
)


class Gone(LookupError):
    """An entry of the table that the running torch does not have (or not as opforge uses it)."""


def _library_probe():
    import torch

    return torch.library.Library("opforge_internals_probe", "FRAGMENT")


def _entry_probe():
    import torch._library.simple_registry as registry

    return registry.SimpleOperatorEntry("opforge_internals_probe::op")


def _op_probe():
    import torch

    return torch.ops.aten.add.Tensor


def _packet_probe():
    import torch

    return torch.ops.aten.add


# The object an instance attribute is looked up on, made once.
_PROBES = {_OP: _op_probe, _PACKET: _packet_probe, _LIBRARY: _library_probe, _ENTRY: _entry_probe}
_probed: dict[str, object] = {}


def _probe(key: str):
    if key not in _probed:
        _probed[key] = _PROBES[key]()
    return _probed[key]


_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def _version(text: str) -> tuple[int, ...]:
    match = _VERSION.match(text)
    if match is None:
        raise ValueError(f"not a torch version: {text!r}")
    return tuple(int(g) for g in match.groups() if g is not None)


def applies(entry: Internal, torch_version: str | None = None) -> bool:
    """Whether opforge uses `entry` on `torch_version` (default: the running torch)."""
    if torch_version is None:
        import torch

        torch_version = str(torch.__version__)
    version = _version(torch_version)
    if entry.since is not None and version < _version(entry.since):
        return False
    return entry.until is None or version < _version(entry.until)


def resolve(entry: Internal):
    """The object `entry` names on the running torch: the modules along its
    name imported, each attribute looked up from `torch`; for an instance
    attribute, on the entry's instance; with `text`, each string found in the
    object's source. Raises Gone naming what is missing and where opforge
    uses it."""
    where = ", ".join(entry.used_in)
    parts = entry.name.split(".")
    import_error = None
    for i in range(2, len(parts) + 1):
        dotted = ".".join(parts[:i])
        if dotted in sys.modules:
            if sys.modules[dotted] is None:
                break
            continue
        try:
            importlib.import_module(dotted)
        except ModuleNotFoundError as e:
            if e.name != dotted:
                import_error = e
            break
        except Exception as e:  # noqa: BLE001 - a module that fails to import is as good as gone
            import_error = e
            break
    obj = sys.modules.get("torch") or importlib.import_module("torch")
    path = "torch"
    for k, part in enumerate(parts[1:], start=2):
        on_instance = k == len(parts) and entry.instance is not None
        if on_instance:
            if not isinstance(obj, type):
                raise Gone(f"{entry.name} (used in {where}): {path} is not a class")
            try:
                instance = _probe(entry.instance)
            except Exception as e:  # noqa: BLE001
                raise Gone(f"{entry.name} (used in {where}): cannot make {entry.instance}: "
                           f"{type(e).__name__}: {e}") from e
            if not isinstance(instance, obj):
                raise Gone(f"{entry.name} (used in {where}): {entry.instance} is not a {path}")
            obj, path = instance, entry.instance
        try:
            if on_instance:
                inspect.getattr_static(obj, part)  # not through __getattr__ (OpOverloadPacket's reads the name)
            obj = getattr(obj, part)
        except Exception as e:  # noqa: BLE001 - AttributeError, or the ImportError of a lazy submodule
            because = f" ({type(import_error).__name__}: {import_error})" if import_error is not None else ""
            raise Gone(f"{entry.name} (used in {where}): {path} has no attribute {part!r}{because}") from e
        path = f"{path}.{part}"
    if entry.text:
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError) as e:
            raise Gone(f"{entry.name} (used in {where}): its source cannot be read: {e}") from e
        absent = [t for t in entry.text if t not in source]
        if absent:
            raise Gone(f"{entry.name} (used in {where}): its source no longer has {', '.join(map(repr, absent))}")
    return obj


def missing(torch_version: str | None = None) -> list[str]:
    """The names of the entries that apply to `torch_version` (default: the
    running torch's) and that the running torch does not have."""
    gone = []
    for entry in INTERNALS:
        if not applies(entry, torch_version):
            continue
        try:
            resolve(entry)
        except Gone:
            gone.append(entry.name)
    return gone
