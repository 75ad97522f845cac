"""Finding the Triton launches of a function and of the helpers it calls.

Two layers. `code_info(code)` reads the syntax tree once per code object and
records where launches (`k[grid](...)`, `k.run(..., grid=...)`), calls and
name chains (`K.add_kernel`, `Holder.k`) are. `Scan` resolves those chains
against one function's globals and closure cells, follows the helpers they
name into other modules, and collects the kernels:

    scan = Scan()
    scan.visit(body)                  # True: the body needs its launches wrapped
    scan.kernels                      # {id: add_kernel, ...}
"""

from __future__ import annotations

import ast
import builtins
import dis
import importlib
import importlib.util
import inspect
import os
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from typing import Any

from .. import _C
from . import _kernels, _ops, _source

MISSING = object()
WRAP_NAMES = frozenset({"wrap_triton", "capture_triton"})
MAX_DEPTH = 12

# Helpers in these packages never launch user kernels; not scanning them keeps
# registration fast.
_SKIPPED = frozenset({"torch", "triton", "opforge", "numpy", "functorch", "sympy", "typing_extensions",
                      "_pytest", "pytest", "pluggy", "builtins"})
_STDLIB = os.path.normcase(sysconfig.get_paths()["stdlib"]) + os.sep

stats = {"code_hits": 0, "code_misses": 0}


def _key(node: ast.AST) -> tuple:
    return (type(node).__name__, node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)


IMPORTED = "\0import:"  # chain root of `importlib.import_module("lib.ops")` written inline
_IMPORT_FUNCS = frozenset({"import_module", "__import__"})


def chain_of(node: ast.AST) -> tuple[str, ...] | None:
    """`K.add_kernel` -> ('K', 'add_kernel'); `importlib.import_module("lib.ops").fwd`
    -> ('\0import:lib.ops', 'fwd'); None for anything else but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call):
        module = imported_module(node)
        if module is None:
            return None
        parts.append(IMPORTED + module)
        return tuple(reversed(parts))
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return tuple(reversed(parts))


def imported_module(node: ast.AST) -> str | None:
    """'lib.ops' for `importlib.import_module("lib.ops")` (or `import_module`,
    `__import__`) with a constant name; None otherwise."""
    if not isinstance(node, ast.Call) or not node.args or len(node.args) > 1 or node.keywords:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    arg = node.args[0]
    if name not in _IMPORT_FUNCS or not isinstance(arg, ast.Constant) or not isinstance(arg.value, str):
        return None
    if name == "__import__" and "." in arg.value:
        return None  # __import__("a.b") returns the package a, not a.b
    return arg.value


@dataclass(frozen=True)
class Import:
    """A name a function binds with an import statement of its own:
    `from lib.ops import fwd` -> Import('lib.ops', 'fwd', 0, False)."""

    module: str
    attr: str | None = None
    level: int = 0
    top: bool = False  # `import a.b` binds the package a


@dataclass
class Site:
    key: tuple
    chain: tuple[str, ...] | None  # the launched kernel or the callee, when a name chain
    root: str  # 'free', 'global' or 'local' (local: only known at run time)
    line: int
    wrapped: bool = False  # launch through the user's own wrap_triton(k)
    wrapped_chain: tuple[str, ...] | None = None
    text: str = ""


@dataclass
class CodeInfo:
    """What the syntax tree of one code object says, before any name is resolved."""

    found: _source.Found | None
    launches: list[Site] = field(default_factory=list)
    calls: list[Site] = field(default_factory=list)
    subscripts: list[Site] = field(default_factory=list)  # k[grid] not called on the spot
    loads: list[tuple[tuple[str, ...], str, int]] = field(default_factory=list)
    names: list[tuple[str, str]] = field(default_factory=list)  # without source: (name, root)
    user_wraps: int = 0
    imports: dict[str, Import] = field(default_factory=dict)  # names bound by imports inside the function


_CODE_INFO = _source.CodeCache()


def code_info(code: types.CodeType, module_globals: dict | None) -> CodeInfo:
    info = _CODE_INFO.get(code)
    if info is not None:
        stats["code_hits"] += 1
        return info
    stats["code_misses"] += 1
    found = _source.find(code, module_globals)
    info = _collect(found, code) if found is not None else CodeInfo(None, names=bytecode_names(code))
    _CODE_INFO[code] = info
    return info


def bytecode_names(code: types.CodeType) -> list[tuple[str, str]]:
    """Global and closure names a code object may read, without its source.
    co_names also holds attribute names; those simply fail to resolve."""
    out: dict[str, str] = {}

    def walk(c: types.CodeType, top: bool) -> None:
        for n in c.co_names:
            out.setdefault(n, "global")
        if top:
            for n in c.co_freevars:
                out[n] = "free"
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                walk(const, False)

    walk(code, True)
    return list(out.items())


class _Bindings(ast.NodeVisitor):
    """Names bound anywhere inside a def (any nested scope): conservative,
    a name bound in any inner scope counts as local."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.declared_global: set[str] = set()

    def visit_arg(self, node: ast.arg) -> None:
        self.bound.add(node.arg)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self.bound.add(node.id)

    def _def(self, node) -> None:
        self.bound.add(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

    def visit_alias(self, node: ast.alias) -> None:
        self.bound.add(node.asname or node.name.split(".")[0])

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.declared_global.update(node.names)


class _Imports(ast.NodeVisitor):
    """Names a def binds by importing: `import a.b as c`, `from .ops import f`,
    `m = importlib.import_module("lib.ops")`."""

    def __init__(self) -> None:
        self.found: dict[str, Import] = {}

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.found[alias.asname] = Import(alias.name)
            else:
                self.found[alias.name.split(".")[0]] = Import(alias.name, top=True)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self.found[alias.asname or alias.name] = Import(node.module or "", alias.name, node.level)

    def visit_Assign(self, node: ast.Assign) -> None:
        module = imported_module(node.value)
        if module is not None and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.found[node.targets[0].id] = Import(module)
        self.generic_visit(node)


class _Collector(ast.NodeVisitor):
    def __init__(self, info: CodeInfo, root_of) -> None:
        self.info = info
        self.root_of = root_of

    def _site(self, node, target, **extra) -> Site:
        chain = chain_of(target) if target is not None else None
        root = self.root_of(chain[0]) if chain else "local"
        return Site(_key(node), chain, root, node.lineno, **extra)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        target = None
        if isinstance(func, ast.Subscript):
            target = func.value
        elif isinstance(func, ast.Attribute) and func.attr == "run" and any(
                k.arg in ("grid", None) for k in node.keywords):
            target = func.value
        if target is not None:
            wrapped = isinstance(target, ast.Call) and (chain_of(target.func) or ("",))[-1] in WRAP_NAMES
            wrapped_chain = chain_of(target.args[0]) if wrapped and target.args else None
            site = self._site(node, target, wrapped=wrapped, wrapped_chain=wrapped_chain,
                              text=_text(target, func))
            if wrapped and wrapped_chain:
                site.root = self.root_of(wrapped_chain[0])
            self.info.launches.append(site)
            # The launched expression itself is not a bare subscript.
            if isinstance(func, ast.Subscript):
                self.visit(func.value)
                self.visit(func.slice)
            else:
                self.visit(func.value)
        else:
            chain = chain_of(func)
            if chain and chain[-1] in WRAP_NAMES:
                self.info.user_wraps += 1
            self.info.calls.append(self._site(node, func))
            self.visit(func)
        for a in node.args:
            self.visit(a)
        for k in node.keywords:
            self.visit(k.value)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        chain = chain_of(node.value)
        if chain and isinstance(node.ctx, ast.Load):
            self.info.subscripts.append(Site(_key(node), chain, self.root_of(chain[0]), node.lineno))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = chain_of(node)
        if chain is None:
            self.generic_visit(node)
        elif isinstance(node.ctx, ast.Load):
            self.info.loads.append((chain, self.root_of(chain[0]), node.lineno))

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.info.loads.append(((node.id,), self.root_of(node.id), node.lineno))


def _text(target: ast.AST, func: ast.AST) -> str:
    try:
        t = ast.unparse(target)
    except Exception:  # pragma: no cover - unparse handles every expression
        t = "<kernel>"
    return f"{t}[...]" if isinstance(func, ast.Subscript) else f"{t}.run"


def _collect(found: _source.Found, code: types.CodeType) -> CodeInfo:
    info = CodeInfo(found)
    node = found.node
    bindings = _Bindings()
    bindings.visit(node.args)
    for child in (node.body if isinstance(node.body, list) else [node.body]):
        bindings.visit(child)
    free = set(code.co_freevars)
    imports = _Imports()
    for child in (node.body if isinstance(node.body, list) else [node.body]):
        imports.visit(child)
    info.imports = imports.found

    def root_of(name: str) -> str:
        if name in bindings.declared_global:
            return "global"
        if name in free:
            return "free"
        if name in info.imports or name.startswith(IMPORTED):
            return "import"
        if name in bindings.bound:
            return "local"
        return "global"

    collector = _Collector(info, root_of)
    for child in (node.body if isinstance(node.body, list) else [node.body]):
        collector.visit(child)
    if found.class_name:
        _mangle_chains(info, found.class_name)
    return info


def _mangle_chains(info: CodeInfo, class_name: str) -> None:
    """`cls.__k` inside class C reads `cls._C__k`, as Python compiles it."""
    prefix = "_" + class_name.lstrip("_")

    def mangle(chain):
        if chain is None:
            return None
        return tuple(prefix + n if n.startswith("__") and not n.endswith("__") else n for n in chain)

    for site in (*info.launches, *info.calls, *info.subscripts):
        site.chain = mangle(site.chain)
        site.wrapped_chain = mangle(site.wrapped_chain)
    info.loads = [(mangle(c), root, line) for c, root, line in info.loads]


# --- resolution ------------------------------------------------------------


@dataclass(frozen=True)
class OpRef:
    """`torch.ops.ns.op` seen in source: the op may not be registered yet."""

    name: str


class Resolver:
    """Looks up name chains the way the function would, right now."""

    def __init__(self, fn: types.FunctionType, imports: dict | None = None):
        self.globals = fn.__globals__
        self.imports = imports or {}
        self.failed_imports: list[str] = []
        self.cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        b = self.globals.get("__builtins__", builtins)
        self.builtins = b.__dict__ if isinstance(b, types.ModuleType) else b

    def root(self, name: str, kind: str) -> Any:
        if kind == "free":
            cell = self.cells.get(name)
            if cell is None:
                return MISSING
            try:
                return cell.cell_contents
            except ValueError:
                return MISSING
        if kind == "global":
            if name in self.globals:
                return self.globals[name]
            return self.builtins.get(name, MISSING)
        if kind == "import":
            if name.startswith(IMPORTED):
                return self._import(Import(name[len(IMPORTED):]))
            spec = self.imports.get(name)
            return MISSING if spec is None else self._import(spec)
        return MISSING

    def _import(self, spec: Import) -> Any:
        """What the import statement binds, importing the module as the
        statement would when the body runs."""
        name = spec.module
        try:
            if spec.level:
                package = self.globals.get("__package__") or (self.globals.get("__name__") or "").rpartition(".")[0]
                name = importlib.util.resolve_name("." * spec.level + spec.module, package)
            module = importlib.import_module(name)
        except Exception as e:  # the body would fail the same way when it runs
            self.failed_imports.append(f"import of {'.' * spec.level}{spec.module} ({type(e).__name__}: {e})")
            return MISSING
        if spec.top:
            return sys.modules.get(name.split(".")[0], MISSING)
        if spec.attr is None:
            return module
        value = static_getattr(module, spec.attr)
        if value is MISSING:
            try:
                value = importlib.import_module(f"{name}.{spec.attr}")
            except Exception:
                return MISSING
        return value

    def walk(self, chain: tuple[str, ...], kind: str) -> list:
        """Every object along the chain, stopping at the first that cannot be
        resolved without running user code (or at an op)."""
        obj = self.root(chain[0], kind)
        out = []
        rest = list(chain[1:])
        while obj is not MISSING:
            out.append(obj)
            if _is_op(obj) or not rest:
                break
            attr = rest.pop(0)
            ns = _ops_namespace(obj)
            if ns is not None:
                if ns == "":  # torch.ops: the next name is the namespace
                    if not rest:
                        break
                    out.append(OpRef(f"{attr}::{rest.pop(0)}"))
                else:
                    out.append(OpRef(f"{ns}::{attr}"))
                break
            obj = static_getattr(obj, attr)
        return out

    def resolve(self, chain: tuple[str, ...], kind: str) -> Any:
        objs = self.walk(chain, kind)
        if not objs:
            return MISSING
        if len(objs) == len(chain) or _is_op(objs[-1]):
            return objs[-1]
        return MISSING


def static_getattr(obj: Any, attr: str) -> Any:
    """getattr that runs no user code (no properties, no __getattr__)."""
    try:
        v = inspect.getattr_static(obj, attr)
    except AttributeError:
        return MISSING
    if isinstance(v, (staticmethod, classmethod)):
        v = v.__func__
    return v


def _ops_namespace(obj: Any) -> str | None:
    """'' for torch.ops itself, 'ns' for torch.ops.ns, None otherwise."""
    import torch

    if isinstance(obj, torch._ops._Ops):
        return ""
    if isinstance(obj, torch._ops._OpNamespace):
        return obj.name
    return None


def _is_op(obj: Any) -> bool:
    return op_name(obj) is not None


def op_name(obj: Any) -> str | None:
    """'ns::op' for anything that calls a dispatcher op."""
    if isinstance(obj, OpRef):
        return obj.name
    import torch

    if isinstance(obj, torch._ops.OpOverload):
        return obj._schema.name
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return obj._qualified_op_name
    if isinstance(obj, torch._library.custom_ops.CustomOpDef):
        return obj._qualname
    if isinstance(obj, _C.OpBase):  # an opforge op, Python or C++
        return obj.name
    return None


# Namespaces Inductor lowers itself; any other op is opaque unless it is a Triton op.
_TRANSPARENT_NAMESPACES = frozenset({"aten", "prims", "higher_order", "_c10d_functional", "c10d_functional"})


def triton_op_kernels(name: str) -> tuple | None:
    """The kernels of a registered Triton op (opforge's or torch.library.triton_op's), else None."""
    kernels = _ops.triton_op_kernels(name)
    if kernels is not None:
        return kernels
    from torch._library import triton as torch_triton

    kernels = getattr(torch_triton, "triton_ops_to_kernels", {}).get(name)
    if kernels is not None:
        return tuple(kernels)
    return () if _decomposes(name) else None


def _decomposes(name: str) -> bool:
    """Has a FunctionalTensorMode rule, as triton_op registers: AOTAutograd
    traces into it instead of keeping the call."""
    try:
        from torch._library import simple_registry
        from torch._subclasses.functional_tensor import FunctionalTensorMode

        entry = simple_registry.singleton._data.get(name)
        return entry is not None and entry.torch_dispatch_rules.find(FunctionalTensorMode) is not None
    except (ImportError, AttributeError):  # pragma: no cover - older registries
        return False


def is_opaque(name: str) -> bool:
    """An op Inductor cannot see into: not ATen, not a Triton op."""
    return name.split("::")[0] not in _TRANSPARENT_NAMESPACES and triton_op_kernels(name) is None


def skipped(fn: types.FunctionType) -> bool:
    mod = fn.__globals__.get("__name__") or getattr(fn, "__module__", None) or ""
    if mod.split(".")[0] in _SKIPPED:
        return True
    filename = os.path.normcase(fn.__code__.co_filename)
    return filename.startswith(("<frozen", _STDLIB)) and "site-packages" not in filename


_USES_TRITON: dict[int, tuple[int, bool]] = {}  # id(module globals) -> (their size, answer)


def uses_triton(scope: dict) -> bool:
    """Whether a module imports Triton: code there may launch kernels the
    scan cannot see, so its calls are checked when tracing."""
    for name in ("triton", "tl"):
        value = scope.get(name)
        if isinstance(value, types.ModuleType) and value.__name__.partition(".")[0] == "triton":
            return True
    entry = _USES_TRITON.get(id(scope))
    if entry is not None and entry[0] == len(scope):
        return entry[1]
    answer = any(isinstance(v, types.ModuleType) and v.__name__.partition(".")[0] == "triton"
                 for v in list(scope.values()))
    _USES_TRITON[id(scope)] = (len(scope), answer)
    return answer


def holds_kernel(obj: Any) -> bool:
    """A callable object that keeps a Triton kernel among its attributes: a
    library's launcher whose kernels only the run time builds (FlagGems'
    `@pointwise_dynamic` functions keep the @triton.jit function they expand)."""
    if isinstance(obj, (types.FunctionType, types.MethodType, type, types.ModuleType)):
        return False
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict) or len(attrs) > 64:
        return False
    return any(_kernels.is_kernel(v) for v in attrs.values())


def python_function(obj: Any) -> types.FunctionType | None:
    """The Python function that calling `obj` runs, with functools.wraps
    layers removed; None for builtins, classes and skipped packages."""
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    if not isinstance(obj, types.FunctionType):
        wrapped = getattr(obj, "__wrapped__", None) if not isinstance(obj, type) else None
        if isinstance(wrapped, types.FunctionType):
            obj = wrapped
        elif obj is MISSING or isinstance(obj, (type, types.ModuleType)) or not callable(obj):
            return None
        else:
            call = static_getattr(type(obj), "__call__")
            if not isinstance(call, types.FunctionType):
                return None
            obj = call
    for _ in range(16):
        inner = obj.__dict__.get("__wrapped__") if obj.__dict__ else None
        if not isinstance(inner, types.FunctionType):
            break
        obj = inner
    return None if skipped(obj) else obj


def interesting(obj: Any) -> bool:
    """Could reading this name lead to a kernel? Used to skip scanning bodies
    that only touch torch, builtins and plain values."""
    if obj is MISSING:
        return False
    if _kernels.is_kernel(obj) or python_function(obj) is not None:
        return True
    if isinstance(obj, (list, tuple, dict)):
        return bool(container_kernels(obj))
    if isinstance(obj, types.ModuleType):
        return not _skipped_module(obj.__name__, getattr(obj, "__file__", None))
    cls = obj if isinstance(obj, type) else type(obj)
    mod = sys.modules.get(getattr(cls, "__module__", None) or "")
    return mod is not None and not _skipped_module(mod.__name__, getattr(mod, "__file__", None))


def _skipped_module(name: str, filename: str | None) -> bool:
    top = name.split(".")[0]
    if top in _SKIPPED or top in sys.builtin_module_names:
        return True
    if filename is None:
        return False
    filename = os.path.normcase(filename)
    return filename.startswith(_STDLIB) and "site-packages" not in filename


def container_kernels(obj: Any) -> list:
    """Kernels held in a small module-level tuple, list or dict."""
    if isinstance(obj, dict):
        values = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        values = list(obj)
    else:
        return []
    if len(values) > 256:
        return []
    return [v for v in values if _kernels.is_kernel(v)]


@dataclass
class FnResult:
    fn: types.FunctionType
    info: CodeInfo
    needs_rewrite: bool  # it, or a helper it calls, launches; or it makes calls only tracing can resolve
    call_keys: frozenset = frozenset()
    subscript_keys: frozenset = frozenset()
    launches: bool = False  # it, or a helper it calls, launches (or calls a launcher)


def where(info: CodeInfo | None, fn: types.FunctionType, line: int | None = None) -> str:
    filename = os.path.basename(fn.__code__.co_filename)
    return f"{filename}:{line if line is not None else fn.__code__.co_firstlineno}"


class Scan:
    """One walk over a body and the helpers it calls, as they are bound now."""

    def __init__(self) -> None:
        self.kernels: dict[int, Any] = {}
        self.kernel_where: dict[int, str] = {}
        self.opaque: list[tuple[str, str]] = []
        self.user_wrapped = False
        self.unresolved: list[str] = []  # launches whose kernel only the run time knows
        self.runtime: list[str] = []  # launches and launchers whose kernels are found when tracing
        self.launch_texts: list[str] = []
        self.results: dict[int, FnResult | None] = {}

    def _kernel(self, k: Any, at: str) -> None:
        if id(k) not in self.kernels:
            self.kernels[id(k)] = k
            self.kernel_where[id(k)] = at

    def visit(self, fn: types.FunctionType, depth: int = 0) -> bool:
        """Records what `fn` launches; True if its launches or calls must be rewritten."""
        key = id(fn)
        if key in self.results:
            r = self.results[key]
            return r.needs_rewrite if r is not None else False
        if depth > MAX_DEPTH:
            return False
        self.results[key] = None  # in progress: recursion counts as no launch
        info = code_info(fn.__code__, fn.__globals__)
        resolver = Resolver(fn, info.imports)
        result = self._visit_source(fn, info, resolver, depth) if info.found is not None else \
            self._visit_bytecode(fn, info, resolver, depth)
        self.results[key] = result
        self.unresolved.extend(f"{f} in {where(info, fn)}" for f in resolver.failed_imports)
        return result.needs_rewrite

    def _op_call(self, name: str, at: str) -> None:
        """Another Triton op decomposes too: its kernels count as launched here."""
        kernels = triton_op_kernels(name)
        if kernels is not None:
            for k in kernels:
                self._kernel(k, at)
        elif is_opaque(name):
            self.opaque.append((name, at))

    def _collect_kernels(self, objs: list, at: str) -> bool:
        found = False
        for obj in objs:
            if _kernels.is_kernel(obj):
                self._kernel(obj, at)
                found = True
        if objs and not found:
            for k in container_kernels(objs[-1]):
                self._kernel(k, at)
                found = True
        return found

    def _visit_source(self, fn, info: CodeInfo, resolver: Resolver, depth: int) -> FnResult:
        launches = False  # it, or a helper it calls, launches or calls a launcher
        needs = False  # it needs a traced copy
        for chain, root, line in info.loads:
            if root != "local":
                self._collect_kernels(resolver.walk(chain, root), where(info, fn, line))
        for site in info.launches:
            launches = True
            at = where(info, fn, site.line)
            self.launch_texts.append(f"{site.text} at {at}")
            if site.wrapped:
                self.user_wrapped = True
                if site.wrapped_chain and site.root != "local":
                    self._collect_kernels(resolver.walk(site.wrapped_chain, site.root), at)
                continue
            if site.chain and site.root != "local":
                if self._collect_kernels(resolver.walk(site.chain, site.root), at):
                    continue
            self.unresolved.append(f"{site.text} at {at}")
            if uses_triton(fn.__globals__):
                self.runtime.append(f"{site.text} at {at}")
        if info.user_wraps:
            self.user_wrapped = True
            launches = True
        calls = set()
        dynamic = False  # calls only the run time can resolve
        for site in info.calls:
            if site.chain is None or site.root == "local":
                calls.add(site.key)
                dynamic = True
                continue
            obj = resolver.resolve(site.chain, site.root)
            name = op_name(obj)
            if name is not None:
                self._op_call(name, where(info, fn, site.line))
                continue
            helper = python_function(obj)
            if helper is None:
                continue
            launcher = self._launcher(obj, site.chain, where(info, fn, site.line))
            if self.visit(helper, depth + 1) or launcher:
                calls.add(site.key)
                needs = True
                result = self.results.get(id(helper))
                launches = launches or launcher or (result is not None and result.launches)
        subs = set()
        for site in info.subscripts:
            if site.root == "local":
                subs.add(site.key)  # `launch = kernel[grid]` with a local kernel: checked when tracing
            elif _kernels.is_kernel(resolver.resolve(site.chain, site.root)):
                subs.add(site.key)
                launches = True
        # In a module that imports Triton, a call only the run time resolves may
        # reach a kernel built at run time: the traced copy checks it then.
        needs = needs or launches or (dynamic and uses_triton(fn.__globals__))
        return FnResult(fn, info, needs, frozenset(calls), frozenset(subs), launches)

    def _launcher(self, obj: Any, chain: tuple, at: str) -> bool:
        if not holds_kernel(obj):
            return False
        self.runtime.append(f"{'.'.join(chain)}(...) at {at}")
        return True

    def _visit_bytecode(self, fn, info: CodeInfo, resolver: Resolver, depth: int) -> FnResult:
        needs = False
        at = where(info, fn)
        for name, root in info.names:
            obj = resolver.root(name, root)
            if obj is MISSING:
                continue
            if _kernels.is_kernel(obj):
                self._kernel(obj, at)
                needs = True
                continue
            op = op_name(obj)
            if op is not None:
                self._op_call(op, at)
                continue
            helper = python_function(obj)
            if helper is not None and (self._launcher(obj, (name,), at) | self.visit(helper, depth + 1)):
                needs = True
        return FnResult(fn, info, needs, launches=needs)


def may_launch(fn: types.FunctionType) -> bool:
    """A quick look at the names a body reads: False when none of them can
    lead to a Triton kernel, so plain ops skip the full scan."""
    package = fn.__globals__.get("__package__") or ""
    for module, level in _quick_imports(fn.__code__):
        # A module imported inside the body (which may be what imports triton):
        # only the scan can tell what it holds.
        if (level and not _skipped_module(package, None)) or \
                (not level and not _skipped_module(module, _module_file(module))):
            return True
    if not _kernels._types():
        return False
    resolver = Resolver(fn)
    for name, root in _quick_names(fn.__code__):
        # `ops`: torch.ops.ns.op(...) may be another Triton op; `import_module`
        # and `__import__` import a module the scan must look into.
        if name in ("ops", "import_module", "__import__") or interesting(resolver.root(name, root)):
            return True
    return False


def _module_file(name: str) -> str | None:
    module = sys.modules.get(name)
    return getattr(module, "__file__", None) if module is not None else None


_IMPORT_NAME = dis.opmap["IMPORT_NAME"]
_QUICK_IMPORTS = _source.CodeCache()


def _quick_imports(code: types.CodeType) -> list[tuple[str, int]]:
    """(module, level) of the import statements of a code object and the
    code nested in it, from the bytecode."""
    found = _QUICK_IMPORTS.get(code)
    if found is not None:
        return found
    found = []

    def walk(c: types.CodeType) -> None:
        if _IMPORT_NAME in c.co_code[::2]:
            previous: list = []
            for ins in dis.get_instructions(c):
                if ins.opcode == _IMPORT_NAME:
                    level = previous[-2].argval if len(previous) >= 2 and isinstance(previous[-2].argval, int) else 0
                    found.append((ins.argval, level))
                previous.append(ins)
                del previous[:-2]
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    walk(code)
    _QUICK_IMPORTS[code] = found
    return found


_QUICK = _source.CodeCache()


def _quick_names(code: types.CodeType) -> list[tuple[str, str]]:
    names = _QUICK.get(code)
    if names is None:
        names = bytecode_names(code)
        _QUICK[code] = names
    return names
