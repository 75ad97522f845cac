"""`NS_ops.h`: a typed C++ function for every generated op, in schema order as
ATen's `at::<name>_outf`, calling through the dispatcher's typed handle.

    >>> print(header_source(select(["add"], "myaten")))
    ...
    // myaten::add(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)
    inline at::Tensor & add(const at::Tensor & self, const at::Tensor & other, const at::Scalar & alpha,
                            at::Tensor & out) {
      static const auto op = ::opforge_gen::Typed<at::Tensor & (const at::Tensor &, ...)>("myaten::add");
      return op.call(self, other, alpha, out);
    }

The C++ types are torchgen's, the generator ATen's own headers come from:
the public signature is the faithful one `at::<name>_outf` has (int64_t and
IntArrayRef where the schema says SymInt), the handle's is the dispatcher's
(c10::SymInt), and torchgen's `translate` converts between them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# C++ keywords an ATen base name could spell; such an op gets a trailing '_'.
_CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq
""".split())


@dataclass
class TypedFunction:
    name: str  # the C++ function name (the op name, or with '_' for a keyword)
    op: str  # "myaten::add"
    schema: str
    decl: str  # "at::Tensor & add(const at::Tensor & self, ...)"
    handle_type: str  # "at::Tensor & (const at::Tensor &, ...)"
    call_args: str  # "self, c10::fromIntArrayRefSlow(size), out"
    returns_void: bool


def typed_function(op) -> TypedFunction:
    """The typed C++ function of one generated op (torchgen's signatures)."""
    from torchgen import local
    from torchgen.api.translate import translate
    from torchgen.api.types import CppSignature, DispatcherSignature
    from torchgen.model import FunctionSchema

    # The target's schema without its namespace, list defaults without
    # spaces (`dim=[-2,-1]`): torchgen's grammar. Defaults do not change a
    # signature.
    text = re.sub(r"=\[([^\]]*)\]", lambda m: "=[" + m.group(1).replace(" ", "") + "]",
                  op.target_text[len("aten::"):])
    func = FunctionSchema.parse(text)
    name = op.name + "_" if op.name in _CPP_KEYWORDS else op.name
    # Mutable tensors as `at::Tensor &`, lists as ArrayRef: ATen's own
    # defaults for out= and in-place overloads.
    with local.parametrize(use_const_ref_for_mutable_tensors=False, use_ilistref_for_tensor_lists=False):
        public = CppSignature(func=func, method=False, faithful=True, symint=False, cpp_no_default_args=set())
        dispatcher = DispatcherSignature.from_schema(func)
        exprs = translate(public.arguments(), dispatcher.arguments(), method=False)
        return TypedFunction(
            name=name,
            op=op.qualified_name,
            schema=op.schema_text,
            decl=public.decl(name=name),
            handle_type=dispatcher.type(),
            call_args=", ".join(e.expr for e in exprs),
            returns_void=dispatcher.returns_type().cpp_type() == "void",
        )


def header_file(namespace: str) -> str:
    return f"{namespace}_ops.h"


_PRELUDE = """\
#pragma once

#include <ATen/core/Tensor.h>
// Named-tensor overloads (at::Dimname) exist in older torch only.
#if __has_include(<ATen/core/Dimname.h>)
#include <ATen/core/Dimname.h>
#endif
#include <ATen/core/Generator.h>
#include <ATen/core/List.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Scalar.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/OptionalArrayRef.h>

#include <array>
#include <optional>
#include <tuple>

namespace opforge_gen {

// The typed handle of a generated op, looked up on first use. Throws (a
// c10::Error naming the op) when the op's library is not loaded.
template <class Signature>
c10::TypedOperatorHandle<Signature> Typed(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").template typed<Signature>();
}

}  // namespace opforge_gen
"""


def header_source(selection) -> str:
    """The text of `NS_ops.h`; an op torchgen cannot type is listed, not emitted."""
    ns = selection.namespace
    functions, left_out = [], []
    for op in selection.ops:
        try:
            functions.append(typed_function(op))
        except Exception as e:  # noqa: BLE001 -- torchgen's errors have no common type
            left_out.append((op.qualified_name, f"{type(e).__name__}: {e}".splitlines()[0]))
    lines = [
        f"// Generated by `opforge gen aten` from torch {selection.torch_version}; do not edit.",
        f"// Typed C++ calls of the {len(functions)} {ns} operators: {ns}::<name>(args..., out), in",
        "// schema order as ATen's at::<name>_outf, each through the dispatcher's typed handle, so",
        "// a call is checked at compile time. The ops' library must be loaded (linked, or",
        "// dlopen'ed) before the first call. docs/codegen.md#typed-c-header",
        _PRELUDE,
    ]
    if left_out:
        lines.append("// Not in this header (no C++ signature could be derived):")
        lines += [f"//   {name}: {why}" for name, why in left_out]
        lines.append("")
    lines.append(f"namespace {ns} {{")
    for fn in functions:
        ret = "" if fn.returns_void else "return "
        lines += [
            "",
            f"// {fn.schema}",
            f"inline {fn.decl} {{",
            f"  static const auto op = ::opforge_gen::Typed<{fn.handle_type}>(\"{fn.op}\");",
            f"  {ret}op.call({fn.call_args});",
            "}",
        ]
    lines += ["", f"}}  // namespace {ns}", ""]
    return "\n".join(lines)
