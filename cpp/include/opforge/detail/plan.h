// One OPFORGE_LIBRARY block as it is written: its types, ops, kernels, tags
// and backwards, collected while the block runs and committed when it ends,
// so the order of def and impl does not matter and a failure registers
// nothing. The same for both torch ABIs; each supplies the backend that talks
// to torch (libtorch's C++ API, or torch's stable C shims).
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <memory>
#include <cctype>
#include <string>
#include <vector>

#include "opforge/abi.h"
#include "opforge/detail/abi_access.h"
#include "opforge/detail/nodes.h"
#include "opforge/version.h"

namespace opforge::detail {

class LibraryPlan {
 public:
  LibraryPlan(const char* ns, const char* impl_key, const char* file, uint32_t line, const void* anchor,
              const char* abi, uint64_t torch_version)
      : ns_(ns), impl_key_(impl_key ? impl_key : ""), file_(file ? file : ""), line_(line), abi_(abi),
        torch_version_(torch_version) {
    Dl_info info{};
    if (anchor && dladdr(anchor, &info) && info.dli_fname) dso_ = info.dli_fname;
  }

  const std::string& ns() const { return ns_; }
  const std::string& impl_key() const { return impl_key_; }
  const std::string& dso() const { return dso_; }
  TypeDecls& types() { return types_; }

  // Returns the op's name within the namespace: "rms_norm" for
  // "rms_norm(Tensor! out, ...) -> ()".
  std::string AddOp(std::string schema) {
    std::string name = schema.substr(0, schema.find('('));
    while (!name.empty() && name.back() == ' ') name.pop_back();
    ops_.push_back(Op{name, std::move(schema), nullptr, nullptr});
    return name;
  }
  void SetAutograd(const std::string& op, void* autograd) { Find(op).autograd = autograd; }
  void SetTorchLayerAutograd(const std::string& op, const void* autograd) { Find(op).torch_layer_autograd = autograd; }

  void AddKernel(std::string op, std::string key, void* kernel, std::string signature) {
    kernels_.push_back(Kernel{std::move(op), std::move(key), kernel, std::move(signature)});
  }
  // The parameter names of `op` when this block defines it ("x", "cfg"), for
  // kernels' messages; empty otherwise.
  std::vector<std::string> ParamNames(const std::string& op) const {
    std::vector<std::string> names;
    for (const auto& o : ops_) {
      if (o.name != op) continue;
      // Each top-level parameter ends at a ',' or the closing ')': its name is
      // the last word before any '=' (defaults are skipped, brackets and all).
      int depth = 0;
      bool in_default = false;
      std::string word, last;
      for (size_t i = o.schema.find('('); i < o.schema.size(); ++i) {
        const char c = o.schema[i];
        const bool word_char = std::isalnum(static_cast<unsigned char>(c)) || c == '_';
        if (depth == 1 && word_char && !in_default) {
          word += c;
          continue;
        }
        if (!word.empty()) last = word;
        word.clear();
        if (c == '"' || c == '\'') {
          const size_t close = o.schema.find(c, i + 1);
          i = close == std::string::npos ? o.schema.size() : close;
        } else if (c == '(' || c == '[') {
          depth++;
        } else if (c == ')' || c == ']') {
          depth--;
        } else if (c == '=' && depth == 1) {
          in_default = true;
        }
        if ((c == ',' && depth == 1) || depth == 0) {
          if (!last.empty()) names.push_back(last);
          last.clear();
          in_default = false;
          if (depth == 0) break;
        }
      }
    }
    return names;
  }

  bool HasKernel(const std::string& op, const std::string& key) const {
    for (const auto& k : kernels_) {
      if (k.op == op && k.key == key) return true;
    }
    for (const auto& k : ffi_kernels_) {
      if (k.op == op && k.key == key) return true;
    }
    return false;
  }
  // A TVM-FFI function as `op`'s kernel for `key` (opforge::TvmFfi).
  void AddFfiKernel(std::string op, std::string key, std::string module, std::string symbol, uint32_t flags) {
    ffi_kernels_.push_back(FfiKernel{std::move(op), std::move(key), std::move(module), std::move(symbol), flags});
  }

  void AddTag(std::string op, std::string tag, std::vector<std::string> names) {
    tags_.push_back(Tag{std::move(op), std::move(tag), std::move(names), {}});
  }

  // A mistake found while the block ran (a kernel given twice): reported
  // when the block commits, as the core reports its own.
  void Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }

  // Registers everything through `backend`, or nothing. Returns "" or the
  // error, which the core has also recorded (opforge.load_errors()).
  std::string Commit(const OpforgeBackendV1& backend) {
    std::string why;
    const OpforgeAbiV1* abi = FindAbi(&why);
    if (abi == nullptr) {
      const std::string message = (dso_.empty() ? std::string("a kernel library") : dso_) +
                                  ": OPFORGE_LIBRARY(" + ns_ + "): " + why;
      std::fprintf(stderr, "opforge: %s\n", message.c_str());
      return message;
    }
    if (!error_.empty()) {
      const std::string message = Where() + ": " + error_ + " Nothing of this block was registered.";
      Report(message);
      return message;
    }
    std::vector<OpforgeOpV1> ops;
    for (const auto& o : ops_) ops.push_back(OpforgeOpV1{o.schema.c_str(), o.autograd, o.torch_layer_autograd});
    std::vector<OpforgeKernelV1> kernels;
    std::vector<const char*> signatures;
    for (const auto& k : kernels_) {
      kernels.push_back(OpforgeKernelV1{k.op.c_str(), k.key.c_str(), k.kernel});
      signatures.push_back(k.signature.c_str());
    }
    std::vector<OpforgeTagV1> tags;
    for (auto& t : tags_) {
      t.names_c.clear();
      for (const auto& n : t.names) t.names_c.push_back(n.c_str());
      tags.push_back(OpforgeTagV1{t.op.c_str(), t.tag.c_str(), t.names_c.data(), t.names_c.size()});
    }
    const auto& types = types_.View();
    OpforgeLibraryV1 lib{};
    lib.size = sizeof(OpforgeLibraryV1);
    lib.ns = ns_.c_str();
    lib.impl_key = impl_key_.empty() ? nullptr : impl_key_.c_str();
    lib.file = file_.c_str();
    lib.line = line_;
    lib.dso = dso_.c_str();
    lib.abi = abi_;
    lib.opforge_version = OPFORGE_VERSION_STRING;
    lib.torch_version = torch_version_;
    lib.types = types.data();
    lib.num_types = types.size();
    lib.ops = ops.data();
    lib.num_ops = ops.size();
    lib.kernels = kernels.data();
    lib.num_kernels = kernels.size();
    lib.tags = tags.data();
    lib.num_tags = tags.size();
    lib.backend = backend;
    lib.kernel_signatures = signatures.data();
    std::vector<OpforgeFfiKernelV1> ffi_kernels;
    std::vector<uint32_t> ffi_kernel_flags;
    for (const auto& k : ffi_kernels_) {
      ffi_kernels.push_back(OpforgeFfiKernelV1{k.op.c_str(), k.key.c_str(), k.module.c_str(), k.symbol.c_str()});
      ffi_kernel_flags.push_back(k.flags);
    }
    lib.ffi_kernels = ffi_kernels.data();
    lib.num_ffi_kernels = ffi_kernels.size();
    lib.ffi_kernel_flags = ffi_kernel_flags.data();
#ifdef OPFORGE_STABLE_ABI
    if (NeedsTorchLayer()) LoadTorchLayer();  // the core's error says so if it is not there
#endif
    char error[2048] = "";
    if (abi->commit_library(&lib, error, sizeof error) != 0) return error;
    return "";
  }

 private:
  struct Op {
    std::string name;
    std::string schema;
    void* autograd;
    const void* torch_layer_autograd;
  };
  struct Kernel {
    std::string op;
    std::string key;
    void* kernel;
    std::string signature;  // KernelSignature
  };
  struct FfiKernel {
    std::string op, key, module, symbol;
    uint32_t flags;  // kOpforgeFfi*
  };

  // What only opforge's torch layer registers in a stable-ABI block:
  // TVM-FFI kernels, and ops with torch op tags.
  bool NeedsTorchLayer() const {
    if (!ffi_kernels_.empty()) return true;
    for (const auto& t : tags_) {
      if (t.tag.rfind(OPFORGE_TORCH_TAG_PREFIX, 0) == 0) return true;
    }
    return false;
  }
  struct Tag {
    std::string op;
    std::string tag;
    std::vector<std::string> names;
    std::vector<const char*> names_c;
  };

  Op& Find(const std::string& op) {
    for (auto& o : ops_) {
      if (o.name == op) return o;
    }
    throw std::logic_error("opforge: op " + op + " was not defined in this block");
  }

  std::string Where() const {
    std::string where = dso_.empty() ? "" : dso_.substr(dso_.rfind('/') + 1) + ": ";
    where += impl_key_.empty() ? "OPFORGE_LIBRARY(" + ns_ + ")"
                               : "OPFORGE_LIBRARY_IMPL(" + ns_ + ", " + impl_key_ + ")";
    return where + " at " + file_ + ":" + std::to_string(line_);
  }

  void Report(const std::string& message) const {
#ifdef OPFORGE_STABLE_ABI
    void* core = Core();
    using ReportFn = decltype(&opforge_report_load_error);
    auto report = core ? reinterpret_cast<ReportFn>(dlsym(core, "opforge_report_load_error")) : nullptr;
    if (report) {
      report(dso_.c_str(), message.c_str());
    } else {
      std::fprintf(stderr, "opforge: %s\n", message.c_str());
    }
#else
    opforge_report_load_error(dso_.c_str(), message.c_str());
#endif
  }

  std::string ns_;
  std::string impl_key_;
  std::string file_;
  uint32_t line_;
  std::string dso_;
  const char* abi_;
  uint64_t torch_version_;
  TypeDecls types_;
  std::vector<Op> ops_;
  std::vector<Kernel> kernels_;
  std::vector<FfiKernel> ffi_kernels_;
  std::vector<Tag> tags_;
  std::string error_;
};

}  // namespace opforge::detail
