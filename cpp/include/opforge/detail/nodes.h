// The parameter tree of a C++ kernel, written once for both torch ABIs: how
// many flat leaves each parameter has, its schema type text, the struct and
// enum declarations it needs, and how a struct is rebuilt from its leaves.
// Each leaf is read through a Reader (opforge/detail/reader.h), whose slots
// each ABI supplies.
//
//   struct Lin { at::Tensor w; std::optional<at::Tensor> b; double scale = 1.0; };
//   Node<Lin>::kCount    == 3
//   Node<Lin>::Schema()  == "Lin"       (declared with fields "w: Tensor", "b: Tensor?", "scale: float = 1.")
//   Node<std::optional<Lin>>::kCount == 4   (a bool presence leaf first)
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/abi.h"
#include "opforge/detail/leaves.h"
#include "opforge/detail/typelist.h"
#include "opforge/reflect.h"

namespace opforge {

template <class T>
class Handle;

namespace detail {

template <class T>
struct IsOptionalStruct : std::false_type {};
template <class T>
struct IsOptionalStruct<std::optional<T>> : std::bool_constant<kIsStruct<T>> {};

// The schema name of a struct or enum as its macro gave it.
template <class S>
const char* StructName() {
  return opforge_struct_name(static_cast<S*>(nullptr));
}

// "liba::NormCfg" -> "liba.NormCfg".
inline std::string DottedName(const char* cpp_name) {
  std::string name(cpp_name);
  if (name.rfind("::", 0) == 0) name = name.substr(2);
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name.compare(i, 2, "::") == 0) {
      out += '.';
      ++i;
    } else {
      out += name[i];
    }
  }
  return out;
}

// A present Optional[Struct] must have every required field; the one
// wording of that error for both ABIs.
[[noreturn]] inline void ThrowMissingField() {
  throw std::invalid_argument(
      "opforge: an optional struct argument is set (its __is_set leaf is True) but one of its required fields "
      "is None; pass every field, or set __is_set to False.");
}

// What reading parameter `index` of a kernel threw (a stale handle, a missing
// field of a present struct), for the kernel's adapter to name the op and
// the parameter (Rethrow).
struct ParamError : std::runtime_error {
  ParamError(size_t index, const std::string& what) : std::runtime_error(what), index(index) {}
  size_t index;
};

// ---------------------------------------------------------------------------
// Defaults: C++ default member initializers become schema defaults. A
// default-constructible struct is default-initialized (`new (p) S`, no
// braces) into two buffers filled with different bytes: a scalar field whose
// bytes agree was written by an initializer (or the default constructor); one
// whose bytes differ has no default. Fields of class type are always
// initialized, so their value is their default (docs/cpp_ops.md#defaults).

class DefaultProbe {
 public:
  template <class S>
  static DefaultProbe Of() {
    return DefaultProbe(sizeof(S), alignof(S), [](void* p) { ::new (p) S; },
                        [](void* p) { static_cast<S*>(p)->~S(); });
  }
  DefaultProbe(const DefaultProbe&) = delete;  // Of() returns a prvalue: no copy or move is made
  DefaultProbe& operator=(const DefaultProbe&) = delete;
  ~DefaultProbe() {
    if (ok_) {
      destroy_(a_);
      destroy_(b_);
    }
    if (a_) ::operator delete(a_, std::align_val_t(align_));
    if (b_) ::operator delete(b_, std::align_val_t(align_));
  }

  // False when the default constructor threw: the struct gets no defaults.
  bool ok() const { return ok_; }
  const void* object() const { return a_; }
  // True when bytes [offset, offset + size) are the same in both objects.
  bool Written(size_t offset, size_t size) const {
    return offset + size <= size_ &&
           std::memcmp(static_cast<const char*>(a_) + offset, static_cast<const char*>(b_) + offset, size) == 0;
  }

 private:
  // Keeps the compiler from treating `p`'s bytes as dead or unknown across
  // this point: the fill before construction and the reads after stay real.
  static void Opaque(void* p) { asm volatile("" : : "r"(p) : "memory"); }

  DefaultProbe(size_t size, size_t align, void (*construct)(void*), void (*destroy)(void*))
      : size_(size),
        align_(align),
        destroy_(destroy),
        a_(::operator new(size, std::align_val_t(align))),
        b_(::operator new(size, std::align_val_t(align))) {
    std::memset(a_, 0x00, size);
    std::memset(b_, 0xff, size);
    Opaque(a_);
    Opaque(b_);
    try {
      construct(a_);
    } catch (...) {
      return;
    }
    try {
      construct(b_);
    } catch (...) {
      destroy_(a_);
      return;
    }
    Opaque(a_);
    Opaque(b_);
    ok_ = true;
  }

  size_t size_;
  size_t align_;
  void (*destroy_)(void*);
  void* a_;
  void* b_;
  bool ok_ = false;
};

inline std::string DoubleText(double v) {
  if (v != v) return "nan";
  if (v == 1.0 / 0.0) return "inf";
  if (v == -1.0 / 0.0) return "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string text(buf);
  if (text.find_first_of(".e") == std::string::npos) text += ".";
  return text;
}

inline std::string QuotedText(const std::string& v) {
  std::string out = "\"";
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\%03o", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A field value as schema default text; nullopt where the schema has no form
// for it (a tensor, a struct, a handle, a device, a list of those).
template <class M>
std::optional<std::string> DefaultText(const M& v) {
  if constexpr (std::is_same_v<M, bool>) {
    return v ? "True" : "False";
  } else if constexpr (std::is_integral_v<M> || std::is_enum_v<M>) {
    return std::to_string(static_cast<int64_t>(v));  // OPFORGE_ENUM types, ScalarType, ...: their value
  } else if constexpr (std::is_floating_point_v<M>) {
    return DoubleText(static_cast<double>(v));
  } else if constexpr (std::is_same_v<M, std::string>) {
    return QuotedText(v);
  } else if constexpr (IsOptional<M>::value) {
    if (!v) return "None";
    return DefaultText(*v);
  } else if constexpr (IsVector<M>::value) {
    using T = typename M::value_type;
    if (!std::is_arithmetic_v<T>) return std::nullopt;  // the schema has list defaults of numbers and bools
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + DefaultText(static_cast<T>(v[i])).value_or("");
    return out + "]";
  } else {
    return std::nullopt;
  }
}

// ---------------------------------------------------------------------------
// Declarations: the structs and enums a library's kernels use, in an order
// where nested types come first, as the C surface wants them.

class TypeDecls {
 public:
  // Adds a struct or enum once (by its C++ type's identity).
  template <class T, class Fill>
  void Add(Fill fill) {
    const void* key = &Key<T>;
    for (const auto& d : decls_) {
      if (d.key == key) return;
    }
    Decl d;
    d.key = key;
    fill(d);
    decls_.push_back(std::move(d));
  }

  // The declarations as the C surface takes them; valid while `this` lives
  // and is not changed.
  const std::vector<OpforgeTypeV1>& View() {
    view_.clear();
    fields_.clear();
    members_.clear();
    fields_.reserve(decls_.size());
    members_.reserve(decls_.size());
    for (const auto& d : decls_) {
      fields_.emplace_back();
      for (const auto& f : d.fields) {
        const char* default_text = f.default_value ? f.default_value->c_str() : nullptr;
        fields_.back().push_back({f.name.c_str(), f.type.c_str(), default_text});
      }
      members_.emplace_back();
      for (const auto& m : d.members) members_.back().push_back(m.c_str());
      view_.push_back(OpforgeTypeV1{d.kind, d.name.c_str(), d.cpp_name.c_str(), fields_.back().data(),
                                    fields_.back().size(), members_.back().data(), d.values.data(), d.values.size()});
    }
    return view_;
  }

  struct Field {
    std::string name;
    std::string type;
    std::optional<std::string> default_value;
  };
  struct Decl {
    const void* key = nullptr;
    int32_t kind = kOpforgeStruct;
    std::string name;
    std::string cpp_name;
    std::vector<Field> fields;
    std::vector<std::string> members;
    std::vector<int64_t> values;
  };

 private:
  template <class T>
  static inline char Key = 0;

  std::vector<Decl> decls_;
  std::vector<OpforgeTypeV1> view_;
  std::vector<std::vector<OpforgeFieldV1>> fields_;
  std::vector<std::vector<const char*>> members_;
};

// The C++ name of T for messages; each ABI header provides it through RTTI.
template <class T>
std::string CppName();

// ---------------------------------------------------------------------------
// Nodes: a leaf, a struct or an optional struct, following the core's
// lowering rules (docs/python_ops.md): a struct's leaves are its fields'
// leaves in order; an optional struct has a bool presence leaf first.

template <class T, class = void>
struct Node;

template <class T>
struct LeafNode {
  static constexpr size_t kCount = 1;
  static std::string Schema() { return LeafTraits<T>::Schema(); }
  static void Declare(TypeDecls& decls) {
    if constexpr (kIsEnum<T>) {
      DeclareEnum<T>(decls);
    } else if constexpr (IsOptional<T>::value) {
      if constexpr (kIsEnum<typename T::value_type>) DeclareEnum<typename T::value_type>(decls);
    }
  }
  template <size_t I, class Reader>
  static decltype(auto) Build(Reader& r) {
    return r.template Leaf<T, I>();
  }
  template <size_t I, class Reader>
  static decltype(auto) BuildInOptional(Reader& r) {
    return r.template LeafInOptional<T, I>();
  }

  template <class E>
  static void DeclareEnum(TypeDecls& decls) {
    decls.Add<E>([](TypeDecls::Decl& d) {
      d.kind = kOpforgeEnum;
      d.name = EnumName<E>();
      d.cpp_name = CppName<E>();
      for (const auto& [member, value] : opforge_reflect_enum(static_cast<E*>(nullptr))) {
        d.members.emplace_back(member);
        d.values.push_back(static_cast<int64_t>(value));
      }
    });
  }
};

template <class S>
struct StructNode {
  static constexpr size_t kFields = kNumFields<S>;

  template <size_t... J>
  static constexpr size_t CountOf(std::index_sequence<J...>) {
    return (size_t{0} + ... + Node<FieldType<S, J>>::kCount);
  }
  static constexpr size_t kCount = CountOf(std::make_index_sequence<kFields>{});

  // Field J's first leaf, counted from the struct's first leaf.
  template <size_t J, size_t... K>
  static constexpr size_t OffsetImpl(std::index_sequence<K...>) {
    return LeafOffset<J, Node<FieldType<S, K>>::kCount...>();
  }
  template <size_t J>
  static constexpr size_t kOffset = OffsetImpl<J>(std::make_index_sequence<kFields>{});

  static std::string Schema() { return StructName<S>(); }

  static void Declare(TypeDecls& decls) { DeclareFields(decls, std::make_index_sequence<kFields>{}); }

  template <size_t... J>
  static void DeclareFields(TypeDecls& decls, std::index_sequence<J...>) {
    (Node<FieldType<S, J>>::Declare(decls), ...);
    decls.Add<S>([](TypeDecls::Decl& d) {
      d.kind = kOpforgeStruct;
      d.name = StructName<S>();
      d.cpp_name = CppName<S>();
      std::vector<std::optional<std::string>> defaults(kFields);
      // A struct that cannot be default-constructed has no defaults: there
      // is no object whose field values C++ would fill in.
      if constexpr (std::is_default_constructible_v<S> && std::is_destructible_v<S>) {
        DefaultProbe probe = DefaultProbe::Of<S>();
        if (probe.ok()) {
          const S& s = *static_cast<const S*>(probe.object());
          ((defaults[J] = FieldDefault<J>(probe, s)), ...);
        }
      }
      (d.fields.push_back({FieldName<S, J>(), Node<FieldType<S, J>>::Schema(), defaults[J]}), ...);
    });
  }

  template <size_t J>
  static std::optional<std::string> FieldDefault(const DefaultProbe& probe, const S& s) {
    using M = FieldType<S, J>;
    const M& value = FieldOf<J>(s);
    if constexpr (std::is_trivially_default_constructible_v<M>) {
      const size_t offset = static_cast<size_t>(reinterpret_cast<const char*>(&value) -
                                                reinterpret_cast<const char*>(&s));
      if (!probe.Written(offset, sizeof(M))) return std::nullopt;
    }
    return DefaultText(value);
  }

  template <size_t I, bool InOptional, class Reader, size_t... J>
  static S BuildFields(Reader& r, std::index_sequence<J...>) {
    static_assert(std::is_default_constructible_v<S>,
                  "opforge: a struct a kernel takes is built from a default-constructed one, field by field, so it "
                  "needs a default constructor: give a c10::Device field an initializer (= c10::kCPU), and take "
                  "a Handle<T> as std::optional<Handle<T>> or as a kernel parameter of its own.");
    S s{};
    if constexpr (InOptional) {
      ((FieldOf<J>(s) = Node<FieldType<S, J>>::template BuildInOptional<I + kOffset<J>>(r)), ...);
    } else {
      ((FieldOf<J>(s) = Node<FieldType<S, J>>::template Build<I + kOffset<J>>(r)), ...);
    }
    return s;
  }
  template <size_t I, class Reader>
  static S Build(Reader& r) {
    return BuildFields<I, false>(r, std::make_index_sequence<kFields>{});
  }
  template <size_t I, class Reader>
  static S BuildInOptional(Reader& r) {
    return BuildFields<I, true>(r, std::make_index_sequence<kFields>{});
  }
};

template <class S>
struct OptionalStructNode {
  using Inner = StructNode<S>;
  static constexpr size_t kCount = 1 + Inner::kCount;
  static std::string Schema() { return Inner::Schema() + "?"; }
  static void Declare(TypeDecls& decls) { Inner::Declare(decls); }
  template <size_t I, class Reader>
  static std::optional<S> Build(Reader& r) {
    if (!r.template Presence<I>()) return std::nullopt;
    return Inner::template BuildInOptional<I + 1>(r);
  }
  template <size_t I, class Reader>
  static std::optional<S> BuildInOptional(Reader& r) {
    return Build<I>(r);
  }
};

template <class T>
struct Node<T, std::enable_if_t<!kIsStruct<T> && !IsOptionalStruct<T>::value>> : LeafNode<T> {};
template <class T>
struct Node<T, std::enable_if_t<kIsStruct<T>>> : StructNode<T> {};
template <class T>
struct Node<std::optional<T>, std::enable_if_t<kIsStruct<T>>> : OptionalStructNode<T> {};

// A kernel parameter as written (`const NormCfg&`, `at::Tensor&`) -> its node.
template <class Arg>
using ParamNode = Node<std::remove_cv_t<std::remove_reference_t<Arg>>>;

// Parameter K's first flat leaf.
template <size_t K, class... Args>
inline constexpr size_t kParamOffset = LeafOffset<K, ParamNode<Args>::kCount...>();

template <class... Args>
inline constexpr size_t kLeafCount = (size_t{0} + ... + ParamNode<Args>::kCount);

// ---------------------------------------------------------------------------
// Returns: a struct returns as a tuple of its fields.

template <class R, class = void>
struct Ret {
  using Flat = R;
};
template <class S>
struct Ret<S, std::enable_if_t<kIsStruct<S>>> {
  template <size_t... J>
  static auto TupleOf(std::index_sequence<J...>) -> std::tuple<FieldType<S, J>...>;
  using Flat = decltype(TupleOf(std::make_index_sequence<kNumFields<S>>{}));
  static Flat Flatten(S&& s) { return FlattenImpl(std::move(s), std::make_index_sequence<kNumFields<S>>{}); }
  template <size_t... J>
  static Flat FlattenImpl(S&& s, std::index_sequence<J...>) {
    return Flat(std::move(FieldOf<J>(s))...);
  }
};

template <class T>
struct IsStdTupleOf : std::false_type {};
template <class... T>
struct IsStdTupleOf<std::tuple<T...>> : std::true_type {};

// The types a kernel `R(Args...)` needs declared: its parameters', and a struct return's.
template <class R, class... Args>
void DeclareKernelTypes(TypeDecls& decls) {
  (ParamNode<Args>::Declare(decls), ...);
  if constexpr (kIsStruct<std::decay_t<R>>) StructNode<std::decay_t<R>>::Declare(decls);
}

// A kernel's parameter and return types as a schema writes them, which the
// core checks against the op's schema at load: "Tensor, NormCfg?, float -> Tensor".
template <class... T>
std::string SchemaList() {
  std::string out;
  ((out += (out.empty() ? "" : ", ") + Node<std::decay_t<T>>::Schema()), ...);
  return out;
}
template <class R>
struct ReturnSchemas {
  static std::string Get() { return SchemaList<R>(); }
};
template <>
struct ReturnSchemas<void> {
  static std::string Get() { return ""; }
};
template <class... T>
struct ReturnSchemas<std::tuple<T...>> {
  static std::string Get() { return SchemaList<T...>(); }
};
template <class R, class... Args>
std::string KernelSignature() {
  return SchemaList<Args...>() + " -> " + ReturnSchemas<std::decay_t<R>>::Get();
}

}  // namespace detail
}  // namespace opforge
