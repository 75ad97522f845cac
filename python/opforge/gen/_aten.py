"""Which ATen overloads an allowlist generates, and what the generated
operators are called.

    >>> sel = select(["add", "add_"], "myaten")
    >>> [(op.name, op.target_qualified) for op in sel.ops]
    [('add', 'aten::add.out'), ('add_', 'aten::add_.Tensor'),
     ('add_scalar', 'aten::add.Scalar_out'), ('add_scalar_', 'aten::add_.Scalar')]
    >>> sel.ops[0].schema_text
    'myaten::add(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)'

Schemas are read with opforge's own parser (`opforge._C.parse_schema`), from
the live operator registry of the installed torch or from torchgen's packaged
`native_functions.yaml`.

Naming rule (deterministic, documented in docs/codegen.md):

1. The overload name loses its `out` tokens: `Scalar_out` -> `scalar`,
   `out_mode` -> `mode`, `OutScalar_Self` -> `scalar_self`, `out` -> ``.
2. An overload left with an empty suffix takes the bare base name. If none
   does, the only overload of the base takes it (`kthvalue.values` ->
   `kthvalue`), else the single `Tensor`/`Tensor_Tensor` overload does
   (`eq.Tensor_out` -> `eq`, `pow.Tensor_Tensor_out` -> `pow`).
3. Otherwise the name is `base_suffix` (`add.Scalar_out` -> `add_scalar`);
   in-place bases keep their trailing underscore after the suffix
   (`add_.Scalar` -> `add_scalar_`).
4. If two overloads still share a name, the one whose name is its bare base
   name keeps it and the other spells out its whole overload name:
   `range.out_` -> `range_out`, `scatter.reduce_out` -> `scatter_reduce_out`
   (as `scatter_reduce.two_out` is `scatter_reduce`).
"""

from __future__ import annotations

import functools
import keyword
import os
import re
from dataclasses import dataclass, field

from .. import _C

# Types that only TorchScript's own operators use; an ATen kernel never takes
# them, so an overload that mentions one is not a tensor operator.
_SCRIPT_ONLY_KINDS = frozenset(
    ["Var", "Any", "AnyClassType", "AnyEnumType", "Dict", "Future", "RRef", "Await", "Union",
     "Tuple", "Class", "Capsule", "NoneType"]
)
# Factory functions take these on the functional form and derive them from
# `out` on the out= form; they do not stop the two from being a pair.
_FACTORY_KWARGS = frozenset(["dtype", "layout", "device", "pin_memory"])
# Namespaces that belong to torch itself.
_RESERVED_NAMESPACES = frozenset(["aten", "prim", "prims", "_", "torch", "c10", "at", "quantized"])


class GenError(Exception):
    """A problem with the generator's input: says what is wrong and the fix."""


@dataclass(frozen=True)
class GeneratedOp:
    """One generated operator, `ns::name`, forwarding to `target.overload`."""

    name: str  # "add_scalar"
    namespace: str  # "myaten"
    base: str  # the allowlist entry: "add"
    target: str  # "aten::add"
    overload: str  # "Scalar_out"
    kind: str  # "out" or "inplace"
    schema: object  # opforge._C.Schema of the target
    reference: str | None  # functional counterpart, "aten::add.Scalar", or None
    # Factory keywords the reference takes and the target does not ("dtype").
    reference_extra: tuple = ()
    # Torch op tags the op is defined with: ("cudagraph_unsafe",).
    tags: tuple = ()

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.name}"

    @property
    def target_qualified(self) -> str:
        return f"{self.target}.{self.overload}" if self.overload else self.target

    @property
    def target_text(self) -> str:
        return str(self.schema)

    @property
    def schema_text(self) -> str:
        """The generated op's schema: the target's, renamed.

        'aten::add.Scalar_out(Tensor self, ...' -> 'myaten::add_scalar(Tensor self, ...'
        """
        text = self.target_text
        return self.qualified_name + text[len(self.target_qualified):]

    @property
    def out_arguments(self) -> list[str]:
        return [a.name for a in self.schema.arguments if _is_out(a)]


@dataclass(frozen=True)
class NotGenerated:
    name: str
    reason: str


@dataclass
class Selection:
    namespace: str
    source: str
    torch_version: str
    ops: list[GeneratedOp] = field(default_factory=list)
    not_generated: list[NotGenerated] = field(default_factory=list)
    # Overloads of a generated base left out, as (qualified target, reason).
    excluded_overloads: list[tuple[str, str]] = field(default_factory=list)

    @property
    def generated_bases(self) -> list[str]:
        seen = []
        for op in self.ops:
            if op.base not in seen:
                seen.append(op.base)
        return seen


def check_namespace(namespace: str) -> None:
    """Raises GenError unless `namespace` can hold generated operators."""
    if not namespace or not namespace.isidentifier() or keyword.iskeyword(namespace):
        raise GenError(
            f"namespace {namespace!r} is not a valid identifier; "
            "use letters, digits and underscores, e.g. --namespace myaten."
        )
    if namespace in _RESERVED_NAMESPACES:
        raise GenError(
            f"namespace {namespace!r} belongs to torch; choose your own, e.g. --namespace my{namespace}."
        )


def read_allowlist(path: str) -> list[str]:
    """Base names from an allowlist file: one per line, `#` starts a comment.

    'abs\\n# unary\\naten::acos\\n' -> ['abs', 'acos']
    """
    return list(read_allowlist_entries(path))


def read_allowlist_entries(path: str) -> dict[str, tuple]:
    """{base name: op tags} from an allowlist file (parse_allowlist_entries)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise GenError(f"cannot read allowlist {path!r}: {e.strerror}; pass an existing file to --allowlist.")
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark is not part of the first name
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise GenError(f"allowlist {path!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} on line {line}); "
                       "save it as UTF-8, one ATen base name per line.") from None
    return parse_allowlist_entries(text.splitlines(), origin=os.path.basename(path))


# Torch op tags a generated op may carry (the same names a C++ op's
# `.tag(...)` takes, docs/cpp_ops.md#op-tags); opforge_forward.cc knows them.
OP_TAGS = ("cudagraph_unsafe", "needs_fixed_stride_order", "flexible_layout", "nondeterministic_seeded",
           "nondeterministic_bitwise", "pt2_compliant_tag")


def check_tags(tags, where: str) -> tuple:
    """The tags as a sorted tuple; GenError naming `where` for an unknown one."""
    for tag in tags:
        if tag not in OP_TAGS:
            raise GenError(f"{where}: {tag!r} is not an op tag a generated op can carry; use one of: "
                           f"{', '.join(OP_TAGS)}.")
    return tuple(sorted(set(tags)))


def parse_allowlist(lines, origin: str = "<allowlist>") -> list[str]:
    """Base names, in order; tags after a name (`nonzero [cudagraph_unsafe]`) are
    read by `allowlist_tags`."""
    return list(parse_allowlist_entries(lines, origin))


def allowlist_tags(lines, origin: str = "<allowlist>") -> dict[str, tuple]:
    """{base: tags} for the allowlist's entries that name torch op tags."""
    return {name: tags for name, tags in parse_allowlist_entries(lines, origin).items() if tags}


def parse_allowlist_entries(lines, origin: str = "<allowlist>") -> dict[str, tuple]:
    """{base name: op tags}, in the allowlist's order. An entry is a base name,
    optionally followed by torch op tags in brackets, which every op generated
    for it carries: `nonzero [cudagraph_unsafe]` (docs/codegen.md#op-tags)."""
    names: dict[str, tuple] = {}
    for lineno, line in enumerate(lines, 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        tags: tuple = ()
        if "[" in entry or "]" in entry:
            head, bracket, rest = entry.partition("[")
            if not bracket or not rest.rstrip().endswith("]") or "[" in rest or "]" in head:
                raise GenError(f"{origin}:{lineno}: {entry!r}: write the tags after the name in one pair of "
                               "brackets, e.g. 'nonzero [cudagraph_unsafe]'.")
            listed = [t.strip() for t in rest.rstrip()[:-1].split(",") if t.strip()]
            tags = check_tags(listed, f"{origin}:{lineno}")
            entry = head.strip()
        if entry.startswith("aten::"):
            entry = entry[len("aten::"):]
        if "." in entry:
            base = entry.split(".", 1)[0]
            raise GenError(
                f"{origin}:{lineno}: {entry!r} names an overload; the allowlist takes base names, "
                f"every overload is generated: write {base!r}."
            )
        if not entry.isidentifier():
            raise GenError(
                f"{origin}:{lineno}: {entry!r} is not an operator base name; "
                "write one ATen name per line, e.g. 'add' or 'linalg_solve'."
            )
        names[entry] = tuple(sorted(set(names.get(entry, ()) + tags)))
    return names


def native_functions_yaml() -> str:
    import torchgen

    return os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native",
                        "native_functions.yaml")


@functools.lru_cache(maxsize=4)
def load_aten_schemas(source: str = "registry") -> dict[str, list]:
    """ATen schemas by base name, parsed by opforge's parser.

    source='registry': what the installed torch registered (always present).
    source='yaml': torchgen's packaged native_functions.yaml (needs PyYAML).
    """
    if source == "registry":
        import torch

        texts = [str(s) for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::")]
    elif source == "yaml":
        try:
            import yaml
        except ImportError:
            raise GenError("--source yaml needs PyYAML; pip install pyyaml, or use --source registry.")
        path = native_functions_yaml()
        if not os.path.exists(path):
            raise GenError("this torch ships no packaged native_functions.yaml; use --source registry.")
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        with open(path, encoding="utf-8") as f:
            entries = yaml.load(f, Loader=loader)
        texts = ["aten::" + e["func"] for e in entries if isinstance(e, dict) and "func" in e]
    else:
        raise GenError(f"unknown schema source {source!r}; use 'registry' or 'yaml'.")
    by_base: dict[str, list] = {}
    for text in texts:
        schema = _C.parse_schema(text)
        by_base.setdefault(schema.name[len("aten::"):], []).append(schema)
    return by_base


def _writes(alias_info) -> bool:
    if alias_info is None:
        return False
    return alias_info.is_write or any(c.is_write for c in alias_info.contained)


def _is_out(argument) -> bool:
    return argument.kwarg_only and _writes(argument.alias_info)


def _kinds(type_) -> set[str]:
    kinds = {type_.kind}
    for element in type_.elements:
        kinds |= _kinds(element)
    return kinds


def _script_only(schema) -> str | None:
    for argument in list(schema.arguments) + list(schema.returns):
        bad = _kinds(argument.type) & _SCRIPT_ONLY_KINDS
        if bad:
            return f"TorchScript-only type {str(argument.type)!r}, not an ATen tensor operator"
    if schema.is_vararg or schema.is_varret:
        return "variadic TorchScript operator"
    return None


def _signature(arguments, drop_alias: bool = False) -> list[tuple]:
    return [
        (a.name, str(a.type), a.N, a.default_str, a.kwarg_only, None if drop_alias else str(a.alias_info))
        for a in arguments
    ]


def _functional_for_out(schema, siblings) -> str | None:
    """The functional overload computing what an out= overload writes.

    add.Scalar_out(Tensor self, Scalar other, Scalar alpha=1, *, Tensor(a!) out)
      -> aten::add.Scalar
    """
    kept = [a for a in schema.arguments if not _is_out(a)]
    wanted = _signature(kept)
    kept_names = {a.name for a in kept}
    for other in siblings:
        if any(_writes(a.alias_info) for a in other.arguments) or _script_only(other):
            continue
        core = [a for a in other.arguments
                if not (a.name in _FACTORY_KWARGS and a.name not in kept_names
                        and a.kwarg_only and a.has_default)]
        if _signature(core) == wanted:
            return _qualified(other), tuple(a.name for a in other.arguments if a.name not in kept_names)
    return None, ()


def _functional_for_inplace(schema, by_base) -> str | None:
    """add_.Scalar(Tensor(a!) self, Scalar other, ...) -> aten::add.Scalar"""
    base = schema.name[len("aten::"):]
    wanted = _signature(schema.arguments, drop_alias=True)
    matches = [o for o in by_base.get(base[:-1], [])
               if _signature(o.arguments, drop_alias=True) == wanted and not _script_only(o)]
    # Prefer the same overload name; pow_.Tensor pairs with pow.Tensor_Tensor.
    for other in matches:
        if other.overload == schema.overload:
            return _qualified(other)
    return _qualified(matches[0]) if len(matches) == 1 else None


def _qualified(schema) -> str:
    return f"{schema.name}.{schema.overload}" if schema.overload else schema.name


def _suffix(overload: str) -> str:
    """'Scalar_out' -> 'scalar', 'out_mode' -> 'mode', 'OutScalar_Self' -> 'scalar_self'"""
    tokens = []
    for token in overload.split("_"):
        if not token or token.lower() == "out":
            continue
        if token.startswith("Out") and len(token) > 3 and token[3].isupper():
            token = token[3:]
        tokens.append(token.lower())
    return "_".join(tokens)


def _compose(base: str, suffix: str) -> str:
    if base.endswith("_"):
        return base[:-1] + ("_" + suffix if suffix else "") + "_"
    return base + ("_" + suffix if suffix else "")


def canonical_names(base: str, overloads: list[str]) -> dict[str, str]:
    """Generated names for the selected overloads of one base.

    canonical_names('add', ['out', 'Scalar_out']) -> {'out': 'add', 'Scalar_out': 'add_scalar'}
    canonical_names('eq', ['Scalar_out', 'Tensor_out']) -> {'Scalar_out': 'eq_scalar', 'Tensor_out': 'eq'}
    """
    suffixes = {o: _suffix(o) for o in overloads}
    if "" not in suffixes.values():
        if len(overloads) == 1:
            suffixes[overloads[0]] = ""
        else:
            tensor = [o for o, s in suffixes.items() if s in ("tensor", "tensor_tensor")]
            if len(tensor) == 1:
                suffixes[tensor[0]] = ""
    return {o: _compose(base, s) for o, s in suffixes.items()}


def _verbatim_name(base: str, overload: str) -> str:
    text = re.sub(r"[^0-9A-Za-z]+", "_", overload).strip("_").lower()
    return _compose(base, text)


def select(allowlist: list[str], namespace: str, source: str = "registry", tags: dict | None = None) -> Selection:
    """Chooses the ATen overloads to generate for each allowlisted base name.

    A base with out= overloads generates those; an in-place base (`add_`),
    or a base whose only mutating forms are in place, generates its in-place
    overloads. Everything else is reported in `not_generated` with a reason.
    `tags`: {base: torch op tags} every op generated for that base is defined with.
    """
    import torch

    check_namespace(namespace)
    by_base = load_aten_schemas(source)
    selection = Selection(namespace=namespace, source=source, torch_version=torch.__version__)
    chosen: list[tuple[str, object, str]] = []  # (base, schema, kind)
    for base in allowlist:
        schemas = by_base.get(base)
        if not schemas:
            selection.not_generated.append(
                NotGenerated(base, f"torch {torch.__version__} has no ATen operator named {base!r}")
            )
            continue
        usable = []
        for schema in schemas:
            reason = _script_only(schema)
            if reason:
                if any(_writes(a.alias_info) for a in schema.arguments):
                    selection.excluded_overloads.append((_qualified(schema), reason))
                continue
            usable.append(schema)
        outs = [s for s in usable if any(_is_out(a) for a in s.arguments)]
        if outs:
            chosen += [(base, s, "out") for s in outs]
            continue
        inplace_base = base if base.endswith("_") else base + "_"
        inplace = [
            s for s in (usable if inplace_base == base else by_base.get(inplace_base, []))
            if s.arguments and not s.arguments[0].kwarg_only and _writes(s.arguments[0].alias_info)
            and not _script_only(s)
        ]
        if inplace:
            chosen += [(base, s, "inplace") for s in inplace]
            continue
        if not usable:
            why = "only TorchScript overloads (list/number operators), no ATen tensor overload"
        else:
            why = "ATen has neither an out= nor an in-place overload (functional only)"
        selection.not_generated.append(NotGenerated(base, why))

    # Names per target base, then a global pass that settles collisions.
    names: dict[int, str] = {}
    by_target: dict[str, list[int]] = {}
    for index, (_, schema, _) in enumerate(chosen):
        by_target.setdefault(schema.name, []).append(index)
    for target, indices in by_target.items():
        base = target[len("aten::"):]
        mapping = canonical_names(base, [chosen[i][1].overload for i in indices])
        for i in indices:
            names[i] = mapping[chosen[i][1].overload]
    owners: dict[str, list[int]] = {}
    for i, name in names.items():
        owners.setdefault(name, []).append(i)
    for name, indices in sorted(owners.items()):
        if len(indices) < 2:
            continue
        # The op that took its own base name keeps it: scatter_reduce.two_out
        # stays `scatter_reduce` and scatter.reduce_out becomes `scatter_reduce_out`.
        keep = [i for i in indices if names[i] == _compose(chosen[i][1].name[len("aten::"):], "")][:1]
        keep = keep or [i for i in indices if _suffix(chosen[i][1].overload) == ""][:1] or indices[:1]
        for i in indices:
            if i not in keep:
                names[i] = _verbatim_name(chosen[i][1].name[len("aten::"):], chosen[i][1].overload)
    if len(set(names.values())) != len(names):
        dupes = sorted({n for n in names.values() if list(names.values()).count(n) > 1})
        raise GenError(f"generated names collide: {', '.join(dupes)}; remove one of the bases from the allowlist.")

    for i, (base, schema, kind) in enumerate(chosen):
        target_base = schema.name[len("aten::"):]
        if kind == "out":
            reference, extra = _functional_for_out(schema, by_base[target_base])
        else:
            reference, extra = _functional_for_inplace(schema, by_base), ()
        selection.ops.append(
            GeneratedOp(name=names[i], namespace=namespace, base=base, target=schema.name,
                        overload=schema.overload, kind=kind, schema=schema, reference=reference,
                        reference_extra=extra, tags=tuple((tags or {}).get(base, ())))
        )
    selection.ops.sort(key=lambda op: op.name)
    return selection
