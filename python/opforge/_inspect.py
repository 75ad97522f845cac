"""`opforge inspect NS::op`: an op's original signature, flat schema and
mapping tree.

    $ opforge inspect opforge_demo::attention --import opforge._demo
    opforge_demo::attention
      signature  attention(q: Tensor, k: Tensor, v: Tensor, cfg: AttnCfg) -> Tensor
      spec       opforge_demo::attention(Tensor q, ..., opforge._demo.AttnCfg cfg, ...) -> Tensor
      schema     opforge_demo::attention(Tensor q, ..., float cfg__scale, ...) -> Tensor
      mapping
        q                            [0] Tensor q
        cfg: AttnCfg
          scale                      [3] float cfg__scale
      ...

Ops defined in a module are registered when it is imported: pass the module
with `--import` (repeatable). `--source` also prints the generated code.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import sys

import torch

from . import _C, _op, _types


def _leaf_line(index: int, flat_args, leaves) -> str:
    arg = flat_args[index]
    text = f"[{index}] {arg}"
    leaf = leaves[index]
    notes = []
    if leaf.enum_name:
        enum = _types.ENUMS_BY_NAME[leaf.enum_name].cls
        notes.append(f"enum {enum.__qualname__}: " + ", ".join(repr(m.value) for m in enum))
    elif leaf.allowed:
        notes.append("one of " + ", ".join(repr(v) for v in leaf.allowed))
    if leaf.handle_type:
        notes.append(f"handle to {leaf.handle_type}")
    if leaf.is_presence:
        notes.append("presence flag")
    if leaf.mutated:
        notes.append("mutated")
    return text + (f"  ({'; '.join(notes)})" if notes else "")


def _tree_lines(node, t, flat_args, leaves, depth: int) -> list[str]:
    pad = "  " * depth
    if node.is_leaf:
        label = f"{pad}{node.name}"
        return [f"{label:<33}{_leaf_line(node.leaf_index, flat_args, leaves)}"]
    cls = t.py.__qualname__ if t is not None and t.py is not None else node.struct_name
    lines = [f"{pad}{node.name}: {'Optional[' + cls + ']' if node.optional else cls}"]
    if node.optional:
        lines.append(f"{pad + '  (is set)':<33}{_leaf_line(node.presence_index, flat_args, leaves)}")
    for child in node.children:
        sub = t.fields.get(child.name) if t is not None else None
        lines.extend(_tree_lines(child, sub, flat_args, leaves, depth + 1))
    return lines


def _return_lines(nodes, types, flat_returns) -> list[str]:
    lines = []

    def walk(node, t, depth):
        pad = "  " * depth
        if node.is_leaf:
            lines.append(f"{pad + (node.name or 'value'):<33}[{node.leaf_index}] {flat_returns[node.leaf_index].type}")
            return
        cls = t.py.__qualname__ if t is not None and t.py is not None else node.struct_name
        lines.append(f"{pad}{node.name or 'value'}: {cls}")
        for child in node.children:
            walk(child, t.fields.get(child.name) if t is not None else None, depth + 1)

    for node, t in zip(nodes, types):
        walk(node, t, 2)
    return lines or ["    (none)"]


def _annotation(ann) -> str:
    if isinstance(ann, str):
        return ann
    if isinstance(ann, type):
        return ann.__qualname__
    return repr(ann).replace("typing.", "").replace("torch.", "")


def format_signature(fn) -> str:
    """`attn(q: Tensor, cfg: AttnCfg, mode: Mode = Mode.FAST) -> Tensor`, with
    annotations as written (string annotations unquoted)."""
    try:
        params, ret = _op._signature(fn)
    except (TypeError, ValueError):
        return "(unavailable)"
    parts, star = [], False
    for name, kind, default, ann in params:
        if kind is inspect.Parameter.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = name if ann is inspect.Parameter.empty else f"{name}: {_annotation(ann)}"
        if default is not inspect.Parameter.empty:
            text += f" = {default!s}" if isinstance(default, enum.Enum) else f" = {default!r}"
        parts.append(text)
    out = f"{getattr(fn, '__name__', 'op')}({', '.join(parts)})"
    return out if ret is inspect.Parameter.empty else f"{out} -> {_annotation(ret)}"


def describe(op: "_op.OpDef", source: bool = False) -> str:
    """The text `opforge inspect` prints for an op defined with @opforge.op."""
    model = op.model
    params = op._code.params
    builder = op._code._builder
    flat = model.lowered.flat
    signature = format_signature(op.__wrapped__)
    lines = [
        op.name,
        f"  signature  {signature}",
        f"  spec       {op.spec}",
        f"  schema     {op.schema}",
        "  mapping (parameter -> flat argument)",
    ]
    for p in params:
        lines.extend(_tree_lines(p.node, p.type, flat.arguments, model.leaves, 2))
    lines.append("  returns")
    lines.extend(_return_lines(model.returns, builder.return_types, flat.returns))
    state = op._state
    if state.backward is not None:
        autograd = "backward registered"
    else:
        autograd = "no backward: differentiating through it is an error"
    lines.append(f"  autograd   {autograd}")
    if state.fake is not None and state.fake is state.traced_body:
        fake = "the traced body (a Triton op: fake tensors run the body, the kernels stay unlaunched)"
    elif state.fake is not None:
        fake = "registered"
    elif model.return_types:
        fake = "none (torch.compile and fake tensors need one)"
    else:
        fake = "not needed (no tensor returns)"
    lines.append(f"  fake       {fake}")
    lines.append(f"  triton     {_triton_line(op)}")
    if source:
        lines += ["  generated code", ""]
        lines += ["    " + line if line else "" for line in op._code.source.splitlines()]
    return "\n".join(lines)


def _triton_line(op: "_op.OpDef") -> str:
    """`add_kernel (forward); add_backward_kernel (backward)`, or why there are none."""
    kernels = op.triton_kernels
    if not kernels:
        if _triton_op_without_kernels_yet(op.name):
            return "a Triton op whose kernels are found when it is traced: none traced yet"
        return "no Triton kernels: Inductor calls the op as one opaque call"
    from .triton import _kernels

    def names(ks) -> str:
        return ", ".join(f"{_kernels.kernel_name(k)} ({getattr(_kernels.jit_of(k), '__module__', '?')})"
                         for k in ks)

    parts = []
    if kernels.forward:
        parts.append(f"forward: {names(kernels.forward)}")
    if kernels.backward:
        parts.append(f"backward: {names(kernels.backward)}")
    return "; ".join(parts)


def _triton_op_without_kernels_yet(name: str) -> bool:
    try:
        from .triton import _ops
    except ImportError:
        return False
    return _ops.triton_op_kernels(name) is not None


def describe_torch_op(name: str) -> str:
    schemas = torch._C._jit_get_schemas_for_operator(name)
    lines = [name, "  not defined with @opforge.op; torch's registered schemas:"]
    lines += [f"    {s}" for s in schemas]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("op", help="the operator, as namespace::name")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (it defines the op); repeatable")
    parser.add_argument("--source", action="store_true", help="also print the generated Python code")


def run(args: argparse.Namespace) -> int:
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as e:
            print(f"opforge inspect: cannot import {module!r}: {e}", file=sys.stderr)
            return 2
    name = args.op
    try:
        _C.check_op_name(name)
    except ValueError as e:
        print(f"opforge inspect: {e}", file=sys.stderr)
        return 2
    op = _op.registered_ops().get(name)
    if op is not None:
        print(describe(op, source=args.source))
        return 0
    if _op._schema_exists(name):
        print(describe_torch_op(name))
        return 0
    hint = "Import the module that defines it with --import MODULE." if not args.imports else \
        "None of the imported modules defines it."
    print(f"opforge inspect: no operator named '{name}' is registered. {hint}", file=sys.stderr)
    return 2
