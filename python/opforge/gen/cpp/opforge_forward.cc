// One boxed kernel serves every generated op: the generated schema is the
// target's schema renamed, so the argument stack can be passed on unchanged.
// Only the dispatcher headers are included, never <torch/torch.h>.
#include "opforge_forward.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace opforge_gen {
namespace {

class ForwardKernel final : public c10::OperatorKernel {
 public:
  explicit ForwardKernel(c10::OperatorHandle target) : target_(std::move(target)) {}

  void operator()(const c10::OperatorHandle& /*op*/, c10::DispatchKeySet /*keys*/,
                  torch::jit::Stack* stack) {
    // A fresh call, not a redispatch: the target then sees every dispatch
    // key (autograd, functionalization, modes) as a direct call would.
    target_.callBoxed(stack);
  }

 private:
  c10::OperatorHandle target_;  // looked up once, at registration
};

std::vector<std::unique_ptr<torch::Library>>& Libraries() {
  // Function-local, so the generated table's static initializer may run
  // before or after this file's.
  static std::vector<std::unique_ptr<torch::Library>> libraries;
  return libraries;
}

}  // namespace

int RegisterForwardedOps(const char* ns, const ForwardedOp* ops, std::size_t count) {
  // A fragment, so the namespace may also hold ops defined elsewhere.
  auto library = std::make_unique<torch::Library>(torch::Library::FRAGMENT, ns, std::nullopt,
                                                  __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  int defined = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const ForwardedOp& op = ops[i];
    auto target = dispatcher.findSchema({op.target, op.overload});
    if (!target.has_value()) {
      TORCH_WARN("opforge gen: ", ns, "::", op.name, " is skipped: this torch has no ", op.target,
                 ".", op.overload, ". Regenerate the ops with this torch.");
      continue;
    }
    // Compared parsed, not printed: no iostreams on the load path, which
    // some toolchains (a compiler newer than the runtime libstdc++) break.
    if (!(torch::jit::parseSchema(op.schema) == target->schema())) {
      TORCH_WARN("opforge gen: ", ns, "::", op.name, " was generated from '", op.schema,
                 "' but this torch has '", c10::toString(target->schema()),
                 "'; the live schema is used. Regenerate the ops with this torch to update "
                 "stubs and tests.");
    }
    // Defining from the live schema keeps the stack layout right by construction.
    c10::FunctionSchema schema =
        target->schema().cloneWithName(std::string(ns) + "::" + op.name, "");
    // A catch-all kernel is CompositeImplicitAutograd: autograd, fake tensors
    // and torch.compile all see the ATen call the op forwards to.
    library->def(std::move(schema),
                 torch::CppFunction::makeFromBoxedFunctor(std::make_unique<ForwardKernel>(*target)));
    ++defined;
  }
  Libraries().push_back(std::move(library));
  return defined;
}

}  // namespace opforge_gen
