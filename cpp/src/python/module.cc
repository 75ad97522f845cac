// opforge._C: the core, as seen from Python.
//
//   >>> from opforge import _C
//   >>> s = _C.parse_schema("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")
//   >>> s.arguments[2].default_value
//   1
#include <pybind11/pybind11.h>
#include <pybind11/complex.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <complex>

#include "opforge/abi.h"
#include "torch/autograd_kernels.h"
#include "core/error.h"
#include "core/handles.h"
#include "core/libraries.h"
#include "core/schema.h"
#include "core/spec.h"
#include "core/structs.h"
#include "core/tags.h"

namespace py = pybind11;

namespace opforge {

void InitBoundary(py::module_& m);
void InitOpObject(py::module_& m);
void InitAutograd(py::module_& m);
void InitKernels(py::module_& m);
void InitFfi(py::module_& m);
void InitCapture(py::module_& m);

namespace {

// `Type.kind` for Python: a leaf kind as the schema prints it (the core owns
// those names), a composite by the kind's own name.
std::string KindName(TypeKind kind) {
  switch (kind) {
    case TypeKind::kVar: return "Var";
    case TypeKind::kClass: return "Class";
    case TypeKind::kList: return "List";
    case TypeKind::kOptional: return "Optional";
    case TypeKind::kTuple: return "Tuple";
    case TypeKind::kDict: return "Dict";
    case TypeKind::kFuture: return "Future";
    case TypeKind::kRRef: return "RRef";
    case TypeKind::kAwait: return "Await";
    case TypeKind::kUnion: return "Union";
    case TypeKind::kStruct: return "Struct";
    case TypeKind::kEnum: return "Enum";
    case TypeKind::kLiteral: return "Literal";
    case TypeKind::kHandle: return "Handle";
    default: return TypeStr(*Type::Get(kind));
  }
}

py::object ToPython(const Value& v);

py::list ToPython(const std::vector<Value>& values) {
  py::list out;
  for (const auto& v : values) out.append(ToPython(v));
  return out;
}

py::object ToPython(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kNone: return py::none();
    case Value::Kind::kBool: return py::bool_(v.b);
    case Value::Kind::kInt: return py::int_(v.i);
    case Value::Kind::kDouble: return py::float_(v.d);
    case Value::Kind::kComplex: return py::cast(std::complex<double>(v.d, v.imag));
    case Value::Kind::kString:
    case Value::Kind::kDevice: return py::str(v.s);
    case Value::Kind::kList: return ToPython(v.items);
    case Value::Kind::kStruct: {
      py::dict out;
      for (size_t i = 0; i < v.items.size(); ++i) out[py::str(v.names[i])] = ToPython(v.items[i]);
      return std::move(out);
    }
  }
  return py::none();
}

// One flat argument as the front ends see it: the schema argument and what
// lowering knows about it, in one immutable object.
struct LeafModel {
  std::string name;
  std::string type;  // flat schema type, e.g. "SymInt[]?"
  bool kwarg_only = false;
  bool has_default = false;
  py::object default_value;  // the schema default as a Python value (raw: codes, strings)
  bool is_tensor = false;
  std::string path;
  py::object allowed;  // list of Literal/Enum values, or None
  std::string enum_name;
  std::string handle_type;
  bool is_presence = false;
  bool mutated = false;
  bool default_from_field = false;
};

std::vector<LeafModel> LeafModels(const LoweredOp& l) {
  std::vector<LeafModel> out;
  out.reserve(l.flat.arguments.size());
  for (size_t i = 0; i < l.flat.arguments.size(); ++i) {
    const Argument& a = l.flat.arguments[i];
    const LeafInfo& info = l.leaves[i];
    out.push_back({a.name, TypeStr(*a.type), a.kwarg_only, a.default_value.has_value(),
                   a.default_value ? ToPython(*a.default_value) : py::none(), IsTensorLike(*a.type), info.path,
                   info.allowed.empty() ? py::object(py::none()) : ToPython(info.allowed), info.enum_name,
                   info.handle_type, info.is_presence, info.mutated, info.default_from_field});
  }
  return out;
}

// A Python constant as a core Value. A value the core has no kind for is
// carried as its repr (in a kind the core's checks reject), so their
// messages can show it.
Value FromPython(py::handle v) {
  if (py::isinstance<py::bool_>(v)) return Value::Bool(v.cast<bool>());
  if (py::isinstance<py::int_>(v)) {
    int overflow = 0;
    const long long i = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow == 0) return Value::Int(i);
  }
  if (py::isinstance<py::str>(v)) return Value::String(v.cast<std::string>());
  if (py::isinstance<py::float_>(v)) return Value::Double(v.cast<double>());
  return Value::Device(py::repr(v).cast<std::string>());
}

std::vector<Value> FromPython(const py::list& values) {
  std::vector<Value> out;
  for (const auto& v : values) out.push_back(FromPython(v));
  return out;
}

using FieldTuples = std::vector<std::tuple<std::string, std::string, std::optional<std::string>>>;

// A struct's fields, each (name, type text, default text or None), as MakeStruct takes them.
std::vector<FieldText> FieldTexts(const FieldTuples& fields) {
  std::vector<FieldText> texts;
  for (const auto& [field, type, def] : fields) texts.push_back({field, type, def});
  return texts;
}

void Translate(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kTypeError: PyErr_SetString(PyExc_TypeError, e.what()); return;
    case ErrorKind::kLookupError: PyErr_SetString(PyExc_LookupError, e.what()); return;
    case ErrorKind::kValueError:
    case ErrorKind::kSyntaxError: PyErr_SetString(PyExc_ValueError, e.what()); return;
  }
}

}  // namespace
}  // namespace opforge

PYBIND11_MODULE(_C, m) {
  using namespace opforge;
  m.doc() = "opforge core: schema parsing and printing, struct registry, lowering.";

  // Local: with torch 2.14+ pybind11 shares its internals with torch, and a
  // global translator would also retype errors torch's own bindings raise.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      Translate(e);
    }
  });

  py::class_<Type, std::shared_ptr<Type>>(m, "Type")
      .def_property_readonly("kind", [](const Type& t) { return KindName(t.kind); })
      .def_property_readonly("name", [](const Type& t) { return t.name; })
      .def_property_readonly("elements",
                             [](const Type& t) {
                               std::vector<std::shared_ptr<Type>> out;
                               for (const auto& e : t.elements) out.push_back(std::const_pointer_cast<Type>(e));
                               return out;
                             })
      .def_property_readonly("literals", [](const Type& t) { return ToPython(t.literals); })
      .def_property_readonly("annotation_str", [](const Type& t) { return AnnotationStr(t); })
      .def("__str__", [](const Type& t) { return TypeStr(t); })
      .def("__repr__", [](const Type& t) { return "<opforge Type " + TypeStr(t) + ">"; });

  py::class_<AliasInfo>(m, "AliasInfo")
      .def_readonly("before_sets", &AliasInfo::before_sets)
      .def_readonly("after_sets", &AliasInfo::after_sets)
      .def_readonly("is_write", &AliasInfo::is_write)
      .def_readonly("contained", &AliasInfo::contained)
      .def("__str__", [](const AliasInfo& a) { return ToString(a); });

  py::class_<Argument>(m, "Argument")
      .def_readonly("name", &Argument::name)
      .def_property_readonly("type", [](const Argument& a) { return std::const_pointer_cast<Type>(a.type); })
      .def_readonly("N", &Argument::N)
      .def_property_readonly("has_default", [](const Argument& a) { return a.default_value.has_value(); })
      .def_property_readonly("default_value", [](const Argument& a) {
        return a.default_value ? ToPython(*a.default_value) : py::none();
      })
      .def_property_readonly("default_str", [](const Argument& a) -> py::object {
        if (!a.default_value) return py::none();
        return py::str(DefaultToString(*a.default_value, *a.type));
      })
      .def_readonly("alias_info", &Argument::alias_info)
      .def_readonly("kwarg_only", &Argument::kwarg_only)
      .def("__str__", [](const Argument& a) { return ToString(a); });

  py::class_<FunctionSchema>(m, "Schema")
      .def_readonly("name", &FunctionSchema::name)
      .def_readonly("overload", &FunctionSchema::overload)
      .def_readonly("arguments", &FunctionSchema::arguments)
      .def_readonly("returns", &FunctionSchema::returns)
      .def_readonly("is_vararg", &FunctionSchema::is_vararg)
      .def_readonly("is_varret", &FunctionSchema::is_varret)
      .def("__str__", [](const FunctionSchema& s) { return ToString(s); })
      .def("__repr__", [](const FunctionSchema& s) { return "<opforge Schema " + ToString(s) + ">"; });

  py::class_<LeafInfo>(m, "LeafInfo")
      .def_readonly("path", &LeafInfo::path)
      .def_property_readonly("allowed", [](const LeafInfo& l) { return ToPython(l.allowed); })
      .def_readonly("enum_name", &LeafInfo::enum_name)
      .def_readonly("handle_type", &LeafInfo::handle_type)
      .def_readonly("is_presence", &LeafInfo::is_presence)
      .def_readonly("mutated", &LeafInfo::mutated);

  // The mapping tree: a parameter (or return) and, for a struct, its fields.
  //   node.kind == "leaf":   node.name, node.leaf_index
  //   node.kind == "struct": node.name, node.struct_name, node.optional,
  //                          node.presence_index, node.children
  py::class_<MappingNode>(m, "MappingNode")
      .def_property_readonly("kind", [](const MappingNode& n) {
        return n.kind == MappingNode::Kind::kLeaf ? "leaf" : "struct";
      })
      .def_property_readonly("is_leaf", [](const MappingNode& n) { return n.kind == MappingNode::Kind::kLeaf; })
      .def_readonly("name", &MappingNode::name)
      .def_readonly("leaf_index", &MappingNode::leaf_index)
      .def_readonly("struct_name", &MappingNode::struct_name)
      .def_readonly("optional", &MappingNode::optional)
      .def_readonly("presence_index", &MappingNode::presence_index)
      .def_readonly("children", &MappingNode::children)
      .def("__repr__", [](const MappingNode& n) {
        return n.kind == MappingNode::Kind::kLeaf
                   ? "<MappingNode leaf " + n.name + " -> " + std::to_string(n.leaf_index) + ">"
                   : "<MappingNode struct " + n.name + ": " + n.struct_name + ">";
      });

  py::class_<LeafModel>(m, "LeafModel")
      .def_readonly("name", &LeafModel::name)
      .def_readonly("type", &LeafModel::type)
      .def_readonly("kwarg_only", &LeafModel::kwarg_only)
      .def_readonly("has_default", &LeafModel::has_default)
      .def_readonly("default", &LeafModel::default_value)
      .def_readonly("is_tensor", &LeafModel::is_tensor)
      .def_readonly("path", &LeafModel::path)
      .def_readonly("allowed", &LeafModel::allowed)
      .def_readonly("enum_name", &LeafModel::enum_name)
      .def_readonly("handle_type", &LeafModel::handle_type)
      .def_readonly("is_presence", &LeafModel::is_presence)
      .def_readonly("mutated", &LeafModel::mutated)
      .def_readonly("default_from_field", &LeafModel::default_from_field)
      .def("__repr__", [](const LeafModel& l) { return "<LeafModel " + l.type + " " + l.name + ">"; });

  py::class_<LoweredOp>(m, "Lowered")
      .def_readonly("original", &LoweredOp::original)
      .def_readonly("flat", &LoweredOp::flat)
      .def_property_readonly("schema", [](const LoweredOp& l) { return ToString(l.flat); })
      .def_readonly("leaves", &LoweredOp::leaves)
      .def_readonly("params", &LoweredOp::params)
      .def_readonly("returns", &LoweredOp::returns)
      .def_readonly("warnings", &LoweredOp::warnings)
      .def_property_readonly("definable_schema", [](const LoweredOp& l) { return ToDefinableString(l.flat); })
      .def_property_readonly("definable_spec", [](const LoweredOp& l) { return ToDefinableString(l.original); },
                             "The original signature as torch's parser reads it (`Tensor!` as `Tensor(_0!)`).")
      .def_property_readonly("model_leaves", &LeafModels,
                             "Every flat argument with what lowering knows about it, in order.")
      .def_property_readonly("return_types", [](const LoweredOp& l) {
        std::vector<std::string> out;
        for (const auto& r : l.flat.returns) out.push_back(TypeStr(*r.type));
        return out;
      })
      .def_property_readonly("is_identity", &LoweredOp::is_identity);

  m.def("parse_schema", [](const std::string& text) { return ParseSchema(text); },
        py::arg("text"), "Parses a schema in torch's grammar.");
  m.def("print_definable", [](const std::string& text) { return ToDefinableString(ParseSchema(text)); },
        py::arg("text"), "The schema in the form torch's parser reads back (`Tensor!` -> `Tensor(_0!)`).");
  m.def("parse_type",
        [](const std::string& text) {
          ParseOptions options;
          options.registry = &TypeRegistry::Global();
          return std::const_pointer_cast<Type>(ParseType(text, options));
        },
        py::arg("text"));

  m.def("register_struct",
        [](const std::string& name, const FieldTuples& fields) {
          auto& registry = TypeRegistry::Global();
          return registry.AddStruct(MakeStruct(name, FieldTexts(fields), registry));
        },
        py::arg("name"), py::arg("fields"),
        "Registers a struct: fields are (name, type text, default text or None). "
        "Returns False if an identical struct already exists.");
  m.def("register_enum",
        [](const std::string& name, const std::vector<std::string>& members, const py::list& values) {
          return TypeRegistry::Global().AddEnum(EnumDef{name, members, FromPython(values)});
        },
        py::arg("name"), py::arg("members"), py::arg("values"),
        "Registers an enum; the core checks its values (all str or all int).");
  m.def("check_literal", [](const py::list& values) { CheckLiteralValues(FromPython(values)); }, py::arg("values"),
        "Raises TypeError unless the values are all str or all int.");
  m.def("struct_matches",
        [](const std::string& name, const FieldTuples& fields) {
          // Whether `name` is registered with exactly this layout, defaults included.
          auto& registry = TypeRegistry::Global();
          auto existing = registry.FindStruct(name);
          if (!existing) return false;
          try {
            return SameLayout(*existing, MakeStruct(name, FieldTexts(fields), registry));
          } catch (const Error&) {
            return false;
          }
        },
        py::arg("name"), py::arg("fields"));
  m.def("remove_type", [](const std::string& name) { return TypeRegistry::Global().Remove(name); }, py::arg("name"));
  m.def("has_type", [](const std::string& name) { return TypeRegistry::Global().Contains(name); }, py::arg("name"));
  m.def("type_names", [] { return TypeRegistry::Global().Names(); });
  m.def("describe_struct", [](const std::string& name) -> py::object {
    auto def = TypeRegistry::Global().FindStruct(name);
    if (!def) return py::none();
    py::list fields;
    for (const auto& f : def->fields) {
      fields.append(py::make_tuple(f.name, std::const_pointer_cast<Type>(f.type),
                                   f.default_value ? ToPython(*f.default_value) : py::none(),
                                   f.default_value.has_value()));
    }
    return std::move(fields);
  });
  m.def("describe_enum", [](const std::string& name) -> py::object {
    auto def = TypeRegistry::Global().FindEnum(name);
    if (!def) return py::none();
    return py::make_tuple(def->members, ToPython(def->values));
  });

  InitBoundary(m);
  InitOpObject(m);

  py::class_<KernelRegistration>(m, "KernelRegistration");
  m.def("register_no_backward_kernel",
        [](const std::string& qualname, const std::string& message) {
          return RegisterNoBackwardKernel(qualname, message);
        },
        py::arg("qualname"), py::arg("message"),
        "Installs the Autograd kernel of an op without backward; it stays while the result lives.");
  m.def("register_inplace_kernel", &RegisterInplaceKernel, py::arg("qualname"),
        "Installs the ADInplaceOrView kernel that bumps the versions of what the op writes; it stays while the "
        "result lives.");
  InitAutograd(m);
  InitKernels(m);
  InitFfi(m);
  InitCapture(m);

  // Python objects in the shared handle table: the payload is a PyObject
  // (a weakref, or the object itself when pinned), typed "py:<name>".
  m.def("handle_register",
        [](py::object payload, const std::string& type) {
          PyObject* raw = payload.release().ptr();
          std::shared_ptr<void> holder(raw, [](void* p) {
            py::gil_scoped_acquire gil;
            Py_DECREF(static_cast<PyObject*>(p));
          });
          return HandleTable::Global().Register(std::move(holder), type);
        },
        py::arg("payload"), py::arg("type"));
  m.def("handle_payload",
        [](int64_t handle, const std::string& type) {
          auto payload = HandleTable::Global().Resolve(handle, type);
          if (HandleTable::Global().TypeOf(handle).rfind("py:", 0) != 0) {
            throw Error(ErrorKind::kTypeError, "", "handle " + std::to_string(handle),
                        "refers to a C++ object, which Python cannot use.");
          }
          return py::reinterpret_borrow<py::object>(static_cast<PyObject*>(payload.get()));
        },
        py::arg("handle"), py::arg("type") = "");
  m.def("handle_release", [](int64_t handle) { return HandleTable::Global().Release(handle); });
  m.def("handle_count", [] { return HandleTable::Global().size(); });

  // Ops defined through either front end, and argument tags (docs/symm_mem.md).
  m.def("op_spec", [](const std::string& name) -> py::object {
    auto spec = OpSpecRegistry::Global().Find(name);
    if (!spec) return py::none();
    return py::cast(*spec);
  }, py::arg("name"), "The lowered spec of an op defined through opforge, or None.");
  m.def("add_op_spec", [](const LoweredOp& op) { OpSpecRegistry::Global().Add(op); }, py::arg("lowered"));
  m.def("remove_op_spec", [](const std::string& name) {
    TagRegistry::Global().RemoveOp(name);
    return OpSpecRegistry::Global().Remove(name);
  }, py::arg("name"));
  m.def("op_spec_names", [] { return OpSpecRegistry::Global().Names(); });

  // C++ kernel libraries (docs/cpp_ops.md): their ops, and the blocks that
  // failed to load.
  m.def("library_op", [](const std::string& name) -> py::object {
    auto op = LibraryRegistry::Global().Find(name);
    if (!op) return py::none();
    return py::dict(py::arg("library") = op->library, py::arg("abi") = op->abi,
                    py::arg("has_cpp_autograd") = op->has_cpp_autograd,
                    py::arg("has_torch_layer_autograd") = op->torch_layer_autograd != nullptr);
  }, py::arg("name"), "What a C++ library says of one of its ops, or None for an op of no C++ library.");
  m.def("abi_version", [] {
    uint32_t newest = 0;
    opforge_abi_get(0, &newest);
    return newest;
  }, "The newest C ABI version (opforge/abi.h) this opforge serves to built libraries.");
  m.def("library_generation", [] { return LibraryRegistry::Global().generation(); },
        "Bumped each time a C++ library block commits ops.");
  m.def("load_errors", [] {
    py::list out;
    for (const auto& e : LibraryRegistry::Global().LoadErrors()) out.append(py::make_tuple(e.library, e.message));
    return out;
  }, "[(library path, message)] for every C++ library block that could not be registered.");
  m.def("drop_no_backward_kernel", &DropNoBackwardKernel, py::arg("name"),
        "Drops the no-backward kernel of a C++ library's op, so a Python backward can take its place.");
  m.def("resolve_tensor_args", &ResolveTensorArgs, py::arg("lowered"), py::arg("names"), py::arg("option"),
        "Flat names of the Tensor leaves that `names` denote (a struct expands to its Tensor leaves).");
  m.def("set_arg_tag",
        [](const std::string& op, const std::string& tag, std::vector<std::string> args) {
          TagRegistry::Global().Set(op, tag, std::move(args));
        },
        py::arg("op"), py::arg("tag"), py::arg("args"));
  m.def("args_with_tag",
        [](const std::string& op, const std::string& tag) { return TagRegistry::Global().ArgsWithTag(op, tag); },
        py::arg("op"), py::arg("tag"));
  m.def("arg_tags", [](const std::string& op) { return TagRegistry::Global().TagsOf(op); }, py::arg("op"));
  m.def("ops_with_tag", [](const std::string& tag) { return TagRegistry::Global().OpsWithTag(tag); }, py::arg("tag"));
  m.def("tags_version", [] { return TagRegistry::Global().version(); });

  m.def("bench_parse_print",
        [](const std::vector<std::string>& texts, int repeats) {
          // Parse and print every text, `repeats` times; the median pass in ms.
          std::vector<double> ms;
          size_t sink = 0;
          for (int r = 0; r < repeats; ++r) {
            auto start = std::chrono::steady_clock::now();
            for (const auto& text : texts) sink += ToString(ParseSchema(text)).size();
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
          }
          std::sort(ms.begin(), ms.end());
          return std::make_pair(ms[ms.size() / 2], sink);
        },
        py::arg("texts"), py::arg("repeats") = 9, py::call_guard<py::gil_scoped_release>());

  m.def("check_op_name", &CheckOpName, py::arg("name"),
        "Raises ValueError unless name has the form 'namespace::name'.");

  m.def("lower",
        [](const std::string& spec, const std::vector<std::string>& mutates_args) {
          LowerOptions options;
          options.mutates_args = mutates_args;
          return LowerText(spec, options);
        },
        py::arg("spec"), py::arg("mutates_args") = std::vector<std::string>{},
        "Lowers an op spec to the flat schema and mapping tree.");
}
