// Mistakes a kernel library can make, each of which once killed the process
// or passed silently (tests/python/test_cpp_mistakes.py): kernels and
// backwards that throw what is not a std::exception, kernels whose C++
// types are not their schema's, and an op tag torch does not have. The same
// source builds in both ABI modes.
#include <opforge/opforge.h>

#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#ifdef OPFORGE_STABLE_ABI
#define MISTAKES_NS mistakes_stable
#define MISTAKES_OPTIONAL_NS mistakes_optional_stable
#define MISTAKES_ARITY_NS mistakes_arity_stable
#define MISTAKES_BYTES_NS mistakes_bytes_stable
#define MISTAKES_TAG_NS mistakes_tag_stable
#else
#define MISTAKES_NS mistakes_unstable
#define MISTAKES_OPTIONAL_NS mistakes_optional_unstable
#define MISTAKES_ARITY_NS mistakes_arity_unstable
#define MISTAKES_BYTES_NS mistakes_bytes_unstable
#define MISTAKES_TAG_NS mistakes_tag_unstable
#endif

namespace mistakes {

using opforge::Tensor;

struct Plain {
  int code;
};

// What each kernel throws, by `kind`: 0 an int, 1 a plain struct, 2 a string
// literal, 3 std::bad_alloc, 4 std::out_of_range, 5 std::invalid_argument.
Tensor Throws(const Tensor& x, int64_t kind) {
  switch (kind) {
    case 0: throw 42;
    case 1: throw Plain{7};
    case 2: throw "text";
    case 3: throw std::bad_alloc();
    case 4: throw std::out_of_range("index 9 of 3");
    case 5: throw std::invalid_argument("a bad argument");
    default: return x;
  }
}

Tensor Identity(const Tensor& x) { return x; }

// A backward (and a setup_context) that throw an int.
struct ThrowingGrad {
  static opforge::GradsFor<decltype(Identity)> backward(opforge::AutogradContext*, const Tensor&) { throw 42; }
};
struct ThrowingSetup {
  static void setup_context(opforge::AutogradContext*, const Tensor&, const Tensor&) { throw 42; }
  static opforge::GradsFor<decltype(Identity)> backward(opforge::AutogradContext*, const Tensor& g) { return {g}; }
};

// Undefined tensors where the schema says Tensor: alone, in a tuple, in a list.
Tensor Undefined(const Tensor&) { return Tensor(); }
std::tuple<Tensor, Tensor> UndefinedInTuple(const Tensor& x) { return {x, Tensor()}; }
std::vector<Tensor> UndefinedInList(const Tensor& x) { return {x, Tensor()}; }

#define MISTAKES_STR2(x) #x
#define MISTAKES_STR(x) MISTAKES_STR2(x)

// opforge::Call with a return type of two tensors for an op of one
// (`wrong == 0`), with a parameter too few (`wrong == 1`), or of an op that
// does not exist (`wrong == 2`).
Tensor CallsWrongly(const Tensor& x, int64_t wrong) {
  const char* op = MISTAKES_STR(MISTAKES_NS) "::throws";
  if (wrong == 2) return opforge::Call<Tensor>(MISTAKES_STR(MISTAKES_NS) "::no_such_op", x);
  if (wrong == 0) return std::get<1>(opforge::Call<std::tuple<Tensor, Tensor>>(op, x, int64_t{9}));
  return opforge::Call<Tensor>(op, x);
}

Tensor TakesTensor(const Tensor& x, const Tensor&) { return x; }
Tensor TakesOne(const Tensor& x) { return x; }

}  // namespace mistakes

OPFORGE_LIBRARY(MISTAKES_NS, m) {
  m.def("throws(Tensor x, int kind) -> Tensor", &mistakes::Throws);
  m.def("bad_backward(Tensor x) -> Tensor", &mistakes::Identity).autograd<mistakes::ThrowingGrad>();
  m.def("bad_setup(Tensor x) -> Tensor", &mistakes::Identity).autograd<mistakes::ThrowingSetup>();
  m.def("undefined(Tensor x) -> Tensor", &mistakes::Undefined);
  m.def("undefined_in_tuple(Tensor x) -> (Tensor, Tensor)", &mistakes::UndefinedInTuple);
  m.def("undefined_in_list(Tensor x) -> Tensor[]", &mistakes::UndefinedInList);
  m.def("calls_wrongly(Tensor x, int wrong) -> Tensor", &mistakes::CallsWrongly);
}

// Blocks torch would take but whose kernels read their arguments wrongly:
// each is refused at load, and the good block above still loads.
OPFORGE_LIBRARY(MISTAKES_OPTIONAL_NS, m) {
  m.def("optional_as_tensor(Tensor x, Tensor? w) -> Tensor", &mistakes::TakesTensor);
}
OPFORGE_LIBRARY(MISTAKES_ARITY_NS, m) {
  m.def("too_few(Tensor x, float eps) -> Tensor", &mistakes::TakesOne);
}
// A schema holding a byte that is not UTF-8.
OPFORGE_LIBRARY(MISTAKES_BYTES_NS, m) {
  m.def("bytes(Tensor x, int n\xff) -> Tensor", &mistakes::TakesOne);
}
// An op tag torch does not have, after an untagged and a tagged op: the
// block is refused and none of its ops stays defined.
OPFORGE_LIBRARY(MISTAKES_TAG_NS, m) {
  m.def("plain(Tensor x) -> Tensor", &mistakes::TakesOne);
  m.def("unsafe(Tensor x) -> Tensor", &mistakes::TakesOne).tag("cudagraph_unsafe");
  m.def("bad_tag(Tensor x) -> Tensor", &mistakes::TakesOne).tag("not_a_tag");
}
