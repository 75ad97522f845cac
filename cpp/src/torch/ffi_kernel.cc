// FfiKernel (ffi_kernel.h): an op's flat arguments as TVM-FFI Anys, the
// call through TVM-FFI's C ABI, its result as the schema's returns.
#include "torch/ffi_kernel.h"
#include "torch/capture_guard.h"

#include <ATen/DLConvertor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <dlfcn.h>
#include <torch/library.h>

#include "core/torch_layer.h"
#include "torch/registration.h"

#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

namespace opforge {
namespace {

// Set when the process exits: TVM-FFI objects are then left to the OS, as
// libtvm_ffi's own state may already be gone when the dispatcher's kernels are.
std::atomic<bool> g_exiting{false};

// DLPack's device types (dlpack.h's DLDeviceType).
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLROCM = 10;

std::string Text(const OpforgeFfiBytes& b) { return b.data == nullptr ? std::string() : std::string(b.data, b.size); }

// The error TVM-FFI holds for the failed call, as (kind, message).
std::pair<std::string, std::string> TakeError(const OpforgeFfiApi& api) {
  void* err = nullptr;
  api.error_move_from_raised(&err);
  if (err == nullptr) return {"RuntimeError", "the call failed without an error object"};
  auto* cell = reinterpret_cast<const OpforgeFfiErrorCell*>(static_cast<const char*>(err) + sizeof(OpforgeFfiObject));
  std::pair<std::string, std::string> out{Text(cell->kind), Text(cell->message)};
  api.object_dec_ref(err);
  return out;
}

[[noreturn]] void Throw(const std::string& kind, const std::string& message) {
  if (kind == "TypeError") C10_THROW_ERROR(TypeError, message);
  if (kind == "ValueError") C10_THROW_ERROR(ValueError, message);
  if (kind == "IndexError") C10_THROW_ERROR(IndexError, message);
  if (kind == "NotImplementedError") C10_THROW_ERROR(NotImplementedError, message);
  C10_THROW_ERROR(Error, message);
}

// TVM-FFI objects made for one call, released when it ends.
struct Temporaries {
  const OpforgeFfiApi& api;
  c10::SmallVector<void*, 8> objects;
  ~Temporaries() {
    for (void* obj : objects) api.object_dec_ref(obj);
  }
};

OpforgeFfiAny None() {
  OpforgeFfiAny a{};
  a.type_index = kFfiNone;
  return a;
}

OpforgeFfiAny Int(int64_t v) {
  OpforgeFfiAny a{};
  a.type_index = kFfiInt;
  a.v_int64 = v;
  return a;
}

// What TVMFFIEnvTensorAlloc allocates with while opforge calls a kernel
// (ffi::Tensor::FromEnvAlloc): torch's allocator, as TVM-FFI's own torch
// glue sets it.
int TorchAllocator(DLTensor* prototype, DLManagedTensorVersioned** out, void* error_ctx,
                   void (*set_error)(void* error_ctx, const char* kind, const char* message)) {
  try {
    c10::Device device(c10::DeviceType::CPU);
    switch (prototype->device.device_type) {
      case kDLCPU:
        break;
      case kDLCUDA:
        device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(prototype->device.device_id));
        break;
      case kDLROCM:
        device = c10::Device(c10::DeviceType::HIP, static_cast<c10::DeviceIndex>(prototype->device.device_id));
        break;
      default:
        set_error(error_ctx, "ValueError", "opforge's allocator takes CPU, CUDA and ROCm devices only");
        return -1;
    }
    at::Tensor t = at::empty(at::IntArrayRef(prototype->shape, prototype->shape + prototype->ndim),
                             at::TensorOptions().dtype(at::toScalarType(prototype->dtype)).device(device));
    *out = at::toDLPackVersioned(t);
    return 0;
  } catch (const std::exception& e) {
    set_error(error_ctx, "MemoryError", e.what());
    return -1;
  }
}

// The function "ffi.Array", which builds an Array of its arguments.
void* ArrayConstructor(const OpforgeFfiApi& api) {
  static void* ctor = [&] {
    void* out = nullptr;
    const OpforgeFfiBytes name{"ffi.Array", 9};
    if (api.function_get_global(&name, &out) != 0) TakeError(api);
    return out;
  }();
  return ctor;
}

}  // namespace

namespace {
std::mutex g_api_mu;
OpforgeFfiApi g_api{};
bool g_api_loaded = false;
}  // namespace

const OpforgeFfiApi* LoadFfiApi(const std::string& path, std::string* error) {
  {
    std::lock_guard<std::mutex> lock(g_api_mu);
    if (g_api_loaded) return &g_api;
  }
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *error = "cannot load " + path + ": " + dlerror();
    return nullptr;
  }
  return LoadFfiApi(lib, path, error);
}

const OpforgeFfiApi* LoadFfiApi(void* lib, const std::string& path, std::string* error) {
  std::lock_guard<std::mutex> lock(g_api_mu);
  if (g_api_loaded) return &g_api;
  OpforgeFfiApi& api = g_api;
  struct Entry {
    const char* name;
    void** slot;
  };
  const Entry entries[] = {
      {"TVMFFIFunctionCall", reinterpret_cast<void**>(&api.function_call)},
      {"TVMFFIErrorMoveFromRaised", reinterpret_cast<void**>(&api.error_move_from_raised)},
      {"TVMFFIObjectIncRef", reinterpret_cast<void**>(&api.object_inc_ref)},
      {"TVMFFIObjectDecRef", reinterpret_cast<void**>(&api.object_dec_ref)},
      {"TVMFFIFunctionGetGlobal", reinterpret_cast<void**>(&api.function_get_global)},
      {"TVMFFIEnvSetStream", reinterpret_cast<void**>(&api.env_set_stream)},
      {"TVMFFITensorFromDLPack", reinterpret_cast<void**>(&api.tensor_from_dlpack)},
      {"TVMFFITensorToDLPack", reinterpret_cast<void**>(&api.tensor_to_dlpack)},
      {"TVMFFIFunctionCreate", reinterpret_cast<void**>(&api.function_create)},
      {"TVMFFIEnvSetDLPackManagedTensorAllocator", reinterpret_cast<void**>(&api.env_set_allocator)},
  };
  for (const Entry& e : entries) {
    *e.slot = dlsym(lib, e.name);
    if (*e.slot == nullptr) {
      *error = path + " has no " + e.name + ": it is not a TVM-FFI runtime opforge knows (apache-tvm-ffi 0.1.x)";
      api = OpforgeFfiApi{};
      return nullptr;
    }
  }
  std::atexit([] { g_exiting = true; });
  g_api_loaded = true;
  return &api;
}

FfiKernel::FfiKernel(std::string op, std::string function_name, void* function, const OpforgeFfiApi* api)
    : op_(std::move(op)),
      function_name_(function_name.empty() ? std::string() : " " + function_name),
      function_(function),
      api_(api) {
  api_->object_inc_ref(function_);
}

FfiKernel::~FfiKernel() {
  if (!g_exiting) api_->object_dec_ref(function_);
}

namespace {

// How one call's arguments become Anys: tensors as DLTensor views (or owned
// TVM-FFI Tensors), lists as TVM-FFI Arrays.
class ArgWriter {
 public:
  ArgWriter(const FfiKernel& kernel, const OpforgeFfiApi& api, bool owned, size_t num_tensors)
      : kernel_(kernel), api_(api), owned_(owned), temps_{api, {}} {
    views_.reserve(num_tensors);  // the Anys point into it
  }

  OpforgeFfiAny Write(const c10::Argument& arg, const c10::IValue& v) {
    if (v.isNone()) return None();
    if (v.isTensor()) return Tensor(arg, v.toTensor());
    if (v.isInt()) {
      if (arg.real_type()->kind() == c10::TypeKind::ScalarTypeType) {
        OpforgeFfiAny a{};
        a.type_index = kFfiDataType;
        const DLDataType dt = at::getDLDataType(at::empty({0}, at::TensorOptions().dtype(
                                                                   static_cast<c10::ScalarType>(v.toInt()))));
        a.v_dtype = {dt.code, dt.bits, dt.lanes};
        return a;
      }
      return Int(v.toInt());
    }
    if (v.isDouble()) {
      OpforgeFfiAny a{};
      a.type_index = kFfiFloat;
      a.v_float64 = v.toDouble();
      return a;
    }
    if (v.isBool()) {
      OpforgeFfiAny a{};
      a.type_index = kFfiBool;
      a.v_int64 = v.toBool() ? 1 : 0;
      return a;
    }
    if (v.isString()) {
      OpforgeFfiAny a{};
      a.type_index = kFfiRawStr;
      a.v_c_str = v.toStringRef().c_str();
      return a;
    }
    if (v.isDevice()) {
      OpforgeFfiAny a{};
      a.type_index = kFfiDevice;
      a.v_device = {DeviceTypeOf(v.toDevice()), v.toDevice().has_index() ? v.toDevice().index() : 0};
      return a;
    }
    if (v.isList()) return List(arg, v.toListRef());
    TORCH_CHECK(false, kernel_.op(), ": argument '", arg.name(), "' is a ", v.tagKind(),
                ", which opforge does not pass to a TVM-FFI kernel. Pass it as one of the types listed in "
                "docs/tvm_ffi.md#argument-types.");
  }

  // The device of the first CUDA tensor written, or -1.
  int cuda_device() const { return cuda_device_; }
  Temporaries& temps() { return temps_; }

 private:
  int32_t DeviceTypeOf(const c10::Device& d) const {
    switch (d.type()) {
      case c10::DeviceType::CPU:
        return kDLCPU;
      case c10::DeviceType::CUDA:
        return kDLCUDA;
      case c10::DeviceType::HIP:
        return kDLROCM;
      default:
        return -1;
    }
  }

  OpforgeFfiAny Tensor(const c10::Argument& arg, const at::Tensor& t) {
    if (!t.defined()) return None();
    // A fake or meta tensor has no memory a kernel could read: its data
    // pointer is null, and a kernel writing through it would kill the process.
    const bool no_memory = !t.has_storage() || t.storage().device_type() == c10::DeviceType::Meta ||
                           t.key_set().has(c10::DispatchKey::Python);
    TORCH_CHECK(!no_memory, kernel_.op(), ": argument '", arg.name(),
                "' is a fake or meta tensor, which its TVM-FFI kernel cannot read (torch.compile, torch.export "
                "and meta tensors run the op's fake). Give the op a fake: fake= in opforge.op, or "
                "@op.register_fake (docs/tvm_ffi.md#fakes).");
    const int32_t device_type = t.is_cpu() ? kDLCPU : DeviceTypeOf(t.device());
    TORCH_CHECK(device_type > 0, kernel_.op(), ": argument '", arg.name(), "' is on ", t.device(),
                ", and opforge passes only CPU, CUDA and ROCm tensors to a TVM-FFI kernel.");
    if (device_type != kDLCPU && cuda_device_ < 0) cuda_device_ = t.device().index();
    if (owned_) {
      DLManagedTensor* managed = at::toDLPack(t);
      void* obj = nullptr;
      if (api_.tensor_from_dlpack(managed, 0, 0, &obj) != 0) {
        managed->deleter(managed);
        const auto err = TakeError(api_);
        Throw(err.first, kernel_.op() + ": argument '" + arg.name() + "' could not be made a TVM-FFI Tensor: " +
                             err.second);
      }
      temps_.objects.push_back(obj);
      OpforgeFfiAny a{};
      a.type_index = kFfiTensor;
      a.v_ptr = obj;
      return a;
    }
    views_.emplace_back();
    DLTensor& d = views_.back();
    d.data = t.data_ptr();
    d.device = {static_cast<DLDeviceType>(device_type), static_cast<int32_t>(t.is_cpu() ? 0 : t.device().index())};
    d.ndim = static_cast<int32_t>(t.dim());
    d.dtype = at::getDLDataType(t);
    d.shape = const_cast<int64_t*>(t.sizes().data());
    d.strides = const_cast<int64_t*>(t.strides().data());
    d.byte_offset = 0;
    OpforgeFfiAny a{};
    a.type_index = kFfiDLTensorPtr;
    a.v_ptr = &d;
    return a;
  }

  // A list as a TVM-FFI Array; its tensors as owned Tensors (an Array holds
  // what it stores).
  OpforgeFfiAny List(const c10::Argument& arg, c10::ArrayRef<c10::IValue> items) {
    void* ctor = ArrayConstructor(api_);
    TORCH_CHECK(ctor != nullptr, kernel_.op(), ": argument '", arg.name(),
                "' is a list, and this TVM-FFI runtime has no ffi.Array to pass it as.");
    const bool was_owned = owned_;
    owned_ = true;
    std::vector<OpforgeFfiAny> elems;
    elems.reserve(items.size());
    for (const c10::IValue& item : items) elems.push_back(Write(arg, item));
    owned_ = was_owned;
    OpforgeFfiAny result = None();
    if (api_.function_call(ctor, elems.data(), static_cast<int32_t>(elems.size()), &result) != 0) {
      const auto err = TakeError(api_);
      Throw(err.first, kernel_.op() + ": argument '" + arg.name() + "' could not be made a TVM-FFI Array: " +
                           err.second);
    }
    temps_.objects.push_back(result.v_ptr);
    return result;
  }

  const FfiKernel& kernel_;
  const OpforgeFfiApi& api_;
  bool owned_;
  c10::SmallVector<DLTensor, 8> views_;
  Temporaries temps_;
  int cuda_device_ = -1;
};

// The items of a returned Array (or Tuple, an Array underneath).
c10::ArrayRef<OpforgeFfiAny> ArrayItems(const OpforgeFfiAny& array) {
  auto* cell =
      reinterpret_cast<const OpforgeFfiSeqCell*>(static_cast<const char*>(array.v_ptr) + sizeof(OpforgeFfiObject));
  return {static_cast<const OpforgeFfiAny*>(cell->data), static_cast<size_t>(cell->size)};
}

size_t CountTensors(c10::ArrayRef<c10::IValue> args) {
  size_t n = 0;
  for (const c10::IValue& v : args) n += v.isTensor() ? 1 : 0;
  return n;
}

const char* KindName(int32_t type_index) {
  switch (type_index) {
    case kFfiNone:
      return "None";
    case kFfiInt:
      return "an int";
    case kFfiBool:
      return "a bool";
    case kFfiFloat:
      return "a float";
    case kFfiTensor:
      return "a Tensor";
    case kFfiArray:
      return "an Array";
    default:
      return type_index >= kFfiStaticObjectBegin ? "an object" : "a value";
  }
}

// One returned Any as the IValue of schema type `type`.
c10::IValue ReadReturn(const FfiKernel& kernel, const OpforgeFfiApi& api, const OpforgeFfiAny& any,
                       const c10::TypePtr& type) {
  const auto fail = [&]() -> c10::IValue {
    TORCH_CHECK(false, kernel.op(), ": its TVM-FFI kernel", kernel.function_name(), " returned ",
                KindName(any.type_index), " where the schema returns ", type->str(),
                ". Make the op's return annotation match what the function returns (an out-variant op "
                "returns None).");
  };
  if (any.type_index == kFfiNone) {
    return type->kind() == c10::TypeKind::OptionalType || type->kind() == c10::TypeKind::NoneType ? c10::IValue()
                                                                                                  : fail();
  }
  c10::TypePtr real = type;
  if (auto opt = type->cast<c10::OptionalType>()) real = opt->getElementType();
  switch (real->kind()) {
    case c10::TypeKind::TensorType: {
      if (any.type_index != kFfiTensor) return fail();
      void* managed = nullptr;
      if (api.tensor_to_dlpack(any.v_ptr, &managed) != 0) {
        const auto err = TakeError(api);
        Throw(err.first, kernel.op() + ": its returned tensor could not be read: " + err.second);
      }
      return at::fromDLPack(static_cast<DLManagedTensor*>(managed));
    }
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      if (any.type_index == kFfiInt || any.type_index == kFfiBool) return any.v_int64;
      return fail();
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      if (any.type_index == kFfiFloat) return any.v_float64;
      if (any.type_index == kFfiInt) return static_cast<double>(any.v_int64);
      return fail();
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      if (any.type_index == kFfiBool || any.type_index == kFfiInt) return any.v_int64 != 0;
      return fail();
    case c10::TypeKind::ListType: {
      auto elem = real->castRaw<c10::ListType>()->getElementType();
      if (any.type_index != kFfiArray || elem->kind() != c10::TypeKind::TensorType) return fail();
      c10::List<at::Tensor> out;
      for (const OpforgeFfiAny& item : ArrayItems(any)) out.push_back(ReadReturn(kernel, api, item, elem).toTensor());
      return out;
    }
    default:
      return fail();
  }
}

}  // namespace

void FfiKernel::Call(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                     std::vector<c10::IValue>& out) {
  const auto& params = schema.arguments();
  TORCH_INTERNAL_ASSERT(params.size() == args.size());
  for (int attempt = 0;; ++attempt) {
    ArgWriter writer(*this, *api_, owned_tensors_, CountTensors(args));
    c10::SmallVector<OpforgeFfiAny, 16> anys;
    for (size_t i = 0; i < args.size(); ++i) anys.push_back(writer.Write(params[i], args[i]));
    // The kernel runs on torch's current stream, as TVM-FFI's own torch glue sets it.
    void* previous = nullptr;
    const int cuda = writer.cuda_device();
    if (cuda >= 0) {
      const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(cuda));
      void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
      api_->env_set_stream(kDLCUDA, cuda, stream, &previous);
    }
    void* previous_allocator = nullptr;
    api_->env_set_allocator(reinterpret_cast<void*>(&TorchAllocator), 0, &previous_allocator);
    OpforgeFfiAny result = None();
    const int rc = api_->function_call(function_, anys.data(), static_cast<int32_t>(anys.size()), &result);
    api_->env_set_allocator(previous_allocator, 0, nullptr);
    if (cuda >= 0) api_->env_set_stream(kDLCUDA, cuda, previous, nullptr);
    if (rc != 0) {
      auto err = TakeError(*api_);
      // A function that takes ffi::Tensor rejects a DLTensor view before
      // its body runs: it gets owned Tensors from now on.
      if (attempt == 0 && !owned_tensors_ && err.first == "TypeError" &&
          err.second.find("Mismatched type on argument") != std::string::npos &&
          err.second.find("but got `DLTensor*`") != std::string::npos) {
        owned_tensors_ = true;
        continue;
      }
      Throw(err.first, op_ + ": its TVM-FFI kernel" + function_name_ + " raised " + err.first + ": " + err.second);
    }
    struct Release {
      const OpforgeFfiApi& api;
      OpforgeFfiAny& any;
      ~Release() {
        if (any.type_index >= kFfiStaticObjectBegin) api.object_dec_ref(any.v_ptr);
      }
    } release{*api_, result};
    const auto& returns = schema.returns();
    if (returns.empty()) return;
    if (returns.size() == 1) {
      out.push_back(ReadReturn(*this, *api_, result, returns[0].real_type()));
      return;
    }
    TORCH_CHECK(result.type_index == kFfiArray, op_, ": its TVM-FFI kernel", function_name_, " returned ",
                KindName(result.type_index), " where the schema returns ", returns.size(),
                " values. Return them as a tuple (an ffi::Tuple or ffi::Array).");
    const auto items = ArrayItems(result);
    TORCH_CHECK(items.size() == returns.size(), op_, ": its TVM-FFI kernel", function_name_, " returned ",
                items.size(), " values where the schema returns ", returns.size(), ".");
    for (size_t i = 0; i < returns.size(); ++i) out.push_back(ReadReturn(*this, *api_, items[i], returns[i].real_type()));
    return;
  }
}

namespace {

class FfiDispatcherKernel : public c10::OperatorKernel {
 public:
  explicit FfiDispatcherKernel(std::shared_ptr<FfiKernel> kernel) : kernel_(std::move(kernel)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t n = schema.arguments().size();
    std::vector<c10::IValue> out;
    kernel_->Call(schema, torch::jit::last(*stack, n), out);
    torch::jit::drop(*stack, n);
    for (c10::IValue& v : out) stack->push_back(std::move(v));
  }

 private:
  std::shared_ptr<FfiKernel> kernel_;
};

}  // namespace

torch::CppFunction MakeFfiDispatcherKernel(std::shared_ptr<FfiKernel> kernel) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<FfiDispatcherKernel>(std::move(kernel)));
}

namespace detail {

// `module` as the loader should open it: a relative path is found beside
// the library that names it, if it is there.
std::string ModulePath(const std::string& module, const std::string& library) {
  if (module.empty() || module[0] == '/') return module;
  const size_t slash = library.rfind('/');
  if (slash != std::string::npos) {
    const std::string beside = library.substr(0, slash + 1) + module;
    if (FILE* f = std::fopen(beside.c_str(), "rb")) {
      std::fclose(f);
      return beside;
    }
  }
  return module;
}

// The torch layer's hook for the core (core/torch_layer.h): `symbol` of
// `module` as `op`'s boxed kernel for `key`.
void* RegisterFfiKernel(const std::string& op, const std::string& key, const std::string& module,
                        const std::string& library, const std::string& symbol) {
  const std::string path = ModulePath(module, library);
  // Kept loaded for the life of the process, as the library that names it.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    throw std::runtime_error(op + ": its TVM-FFI kernel's module " + module + " cannot be loaded (" + dlerror() +
                             "). Give the module's path, absolute or relative to this library's folder.");
  }
  const std::string exported = "__tvm_ffi_" + symbol;
  auto safe_call = reinterpret_cast<OpforgeFfiSafeCall>(dlsym(handle, exported.c_str()));
  if (safe_call == nullptr) {
    throw std::runtime_error(op + ": " + path + " exports no TVM-FFI function '" + symbol + "' (no symbol " +
                             exported + "). Export it with TVM_FFI_DLL_EXPORT_TYPED_FUNC(" + symbol + ", fn).");
  }
  std::string error;
  const OpforgeFfiApi* api = LoadFfiApi(handle, path, &error);
  if (api == nullptr) {
    throw std::runtime_error(op + ": its TVM-FFI kernel " + symbol + " cannot be called: " + error +
                             ". The module must link libtvm_ffi.");
  }
  void* function = nullptr;
  if (api->function_create(nullptr, safe_call, nullptr, &function) != 0) {
    const auto err = TakeError(*api);
    throw std::runtime_error(op + ": its TVM-FFI kernel " + symbol + " could not be wrapped: " + err.second);
  }
  auto kernel = std::make_shared<FfiKernel>(op, symbol, function, api);
  api->object_dec_ref(function);  // the kernel holds its own reference
  return RegisterBoxed(op, {c10::parseDispatchKey(key)}, [&] { return MakeFfiDispatcherKernel(kernel); }).release();
}

void ReleaseFfiKernel(void* registration) { delete static_cast<KernelRegistration*>(registration); }

const bool kHooked = (SetTorchLayerHooks({&RegisterFfiKernel, &ReleaseFfiKernel, &DefineTagged}), true);

}  // namespace detail

}  // namespace opforge
