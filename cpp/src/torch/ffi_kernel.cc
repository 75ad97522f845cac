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

#include <array>
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

FfiKernel::FfiKernel(std::string op, std::string function_name, void* function, const OpforgeFfiApi* api,
                     FfiKernelOptions options)
    : op_(std::move(op)),
      function_name_(function_name.empty() ? std::string() : " " + function_name),
      function_(function),
      api_(api),
      options_(std::move(options)) {
  api_->object_inc_ref(function_);
}

FfiKernel::~FfiKernel() {
  if (!g_exiting) api_->object_dec_ref(function_);
}

LeafPlan PlanLeaf(const c10::TypePtr& type) {
  LeafPlan plan;
  c10::TypePtr real = type;
  if (auto opt = type->cast<c10::OptionalType>()) {
    plan.optional = true;
    real = opt->getElementType();
  }
  switch (real->kind()) {
    case c10::TypeKind::TensorType:
      plan.way = LeafWay::kTensor;
      break;
    // Layout and MemoryFormat travel as their int values, as the IValue holds them.
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:  // an int in a call; a symbol goes by its tag, to its error
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
      plan.way = LeafWay::kInt;
      break;
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      plan.way = LeafWay::kFloat;
      break;
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      plan.way = LeafWay::kBool;
      break;
    case c10::TypeKind::StringType:
      plan.way = LeafWay::kStr;
      break;
    case c10::TypeKind::ScalarTypeType:
      plan.way = LeafWay::kDataType;
      break;
    case c10::TypeKind::DeviceObjType:
      plan.way = LeafWay::kDevice;
      break;
    case c10::TypeKind::ListType:
      plan.way = LeafWay::kList;
      plan.item = PlanLeaf(real->castRaw<c10::ListType>()->getElementType()).way;
      break;
    default:  // Scalar (an int, a double, a complex, ...): what the value holds
      plan.way = LeafWay::kByTag;
      break;
  }
  return plan;
}

void FfiKernel::Plan(const c10::FunctionSchema& schema) {
  // Every call asks: an acquire load once planned (call_once costs more per call).
  if (planned_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(plan_mu_);
  if (planned_.load(std::memory_order_relaxed)) return;
  for (const c10::Argument& arg : schema.arguments()) {
    plan_.push_back(PlanLeaf(arg.real_type()));
    num_tensor_leaves_ += plan_.back().way == LeafWay::kTensor ? 1 : 0;
  }
  planned_.store(true, std::memory_order_release);
}

namespace {

// DLPack's code of every torch dtype, read once from torch's own
// conversion (at::getDLDataType): a ScalarType argument then costs a lookup.
// Left out, and converted when met: the quantized dtypes (DLPack has no code
// for them) and ComplexHalf, whose tensors warn that they are experimental:
// making the table must not print torch's warnings on a program's first call.
struct DataTypeTable {
  std::array<DLDataType, static_cast<size_t>(c10::ScalarType::NumOptions)> types{};
  std::array<bool, static_cast<size_t>(c10::ScalarType::NumOptions)> known{};
};

const DataTypeTable& DataTypes() {
  static const DataTypeTable table = [] {
    DataTypeTable t;
    for (size_t i = 0; i < t.types.size(); ++i) {
      const auto type = static_cast<c10::ScalarType>(i);
      if (c10::isQIntType(type) || type == c10::ScalarType::ComplexHalf) continue;
      try {
        t.types[i] = at::getDLDataType(at::empty({0}, at::TensorOptions().dtype(type).device(c10::kMeta)));
        t.known[i] = true;
      } catch (const std::exception&) {  // no DLPack code (a bit or unsigned dtype, ...): torch's error at the call
      }
    }
    return t;
  }();
  return table;
}

bool InTable(int64_t scalar_type) {
  const DataTypeTable& table = DataTypes();
  return scalar_type >= 0 && static_cast<size_t>(scalar_type) < table.types.size() && table.known[scalar_type];
}

// A dtype argument's code.
DLDataType DataTypeOf(int64_t scalar_type) {
  if (InTable(scalar_type)) return DataTypes().types[scalar_type];
  return at::getDLDataType(at::empty({0}, at::TensorOptions().dtype(static_cast<c10::ScalarType>(scalar_type))));
}

// A tensor's dtype code.
DLDataType DataTypeOf(const at::Tensor& t) {
  const auto type = static_cast<int64_t>(t.scalar_type());
  return InTable(type) ? DataTypes().types[type] : at::getDLDataType(t);
}

// How one call's arguments become Anys, each as its leaf's plan says:
// tensors as DLTensor views (or owned TVM-FFI Tensors), lists as TVM-FFI Arrays.
class ArgWriter {
 public:
  ArgWriter(const FfiKernel& kernel, const OpforgeFfiApi& api, bool owned, size_t num_tensors)
      : kernel_(kernel), api_(api), owned_(owned), temps_{api, {}} {
    views_.reserve(num_tensors);  // the Anys point into it
  }

  OpforgeFfiAny Write(const c10::Argument& arg, const LeafPlan& plan, const c10::IValue& v) {
    if (v.isNone()) return None();
    switch (plan.way) {
      case LeafWay::kTensor:
        if (v.isTensor()) return Tensor(arg, v.toTensor());
        break;
      case LeafWay::kInt:
        if (v.isInt()) return Int(v.toInt());
        break;
      case LeafWay::kFloat:
        if (v.isDouble()) return Float(v.toDouble());
        break;
      case LeafWay::kBool:
        if (v.isBool()) return Bool(v.toBool());
        break;
      case LeafWay::kStr:
        if (v.isString()) return Str(v.toStringRef());
        break;
      case LeafWay::kDataType:
        if (v.isInt()) return DataType(v.toInt());
        break;
      case LeafWay::kDevice:
        if (v.isDevice()) return Device(v.toDevice());
        break;
      case LeafWay::kList:
        if (v.isList()) return List(arg, LeafPlan{plan.item, true, LeafWay::kByTag}, v.toListRef());
        break;
      case LeafWay::kByTag:
        break;
    }
    return ByTag(arg, v);
  }

  // The device of the first CUDA tensor written, or -1.
  int cuda_device() const { return cuda_device_; }
  Temporaries& temps() { return temps_; }

 private:
  // A value the plan does not name (a SymInt leaf's int, a Scalar's double),
  // as its IValue's tag says.
  OpforgeFfiAny ByTag(const c10::Argument& arg, const c10::IValue& v) {
    if (v.isTensor()) return Tensor(arg, v.toTensor());
    if (v.isInt()) return Int(v.toInt());
    if (v.isDouble()) return Float(v.toDouble());
    if (v.isBool()) return Bool(v.toBool());
    if (v.isString()) return Str(v.toStringRef());
    if (v.isDevice()) return Device(v.toDevice());
    if (v.isList()) return List(arg, LeafPlan{}, v.toListRef());
    TORCH_CHECK(false, kernel_.op(), ": argument '", arg.name(), "' is a ", v.tagKind(),
                ", which opforge does not pass to a TVM-FFI kernel. Pass it as one of the types listed in "
                "docs/tvm_ffi.md#argument-types.");
  }

  static OpforgeFfiAny Float(double v) {
    OpforgeFfiAny a{};
    a.type_index = kFfiFloat;
    a.v_float64 = v;
    return a;
  }

  static OpforgeFfiAny Bool(bool v) {
    OpforgeFfiAny a{};
    a.type_index = kFfiBool;
    a.v_int64 = v ? 1 : 0;
    return a;
  }

  static OpforgeFfiAny Str(const std::string& v) {
    OpforgeFfiAny a{};
    a.type_index = kFfiRawStr;
    a.v_c_str = v.c_str();
    return a;
  }

  static OpforgeFfiAny DataType(int64_t scalar_type) {
    OpforgeFfiAny a{};
    a.type_index = kFfiDataType;
    const DLDataType dt = DataTypeOf(scalar_type);
    a.v_dtype = {dt.code, dt.bits, dt.lanes};
    return a;
  }

  static OpforgeFfiAny Device(const c10::Device& d) {
    OpforgeFfiAny a{};
    a.type_index = kFfiDevice;
    a.v_device = {DeviceTypeOf(d), d.has_index() ? d.index() : 0};
    return a;
  }

  static int32_t DeviceTypeOf(const c10::Device& d) {
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
    d.dtype = DataTypeOf(t);
    d.shape = const_cast<int64_t*>(t.sizes().data());
    d.strides = const_cast<int64_t*>(t.strides().data());
    d.byte_offset = 0;
    OpforgeFfiAny a{};
    a.type_index = kFfiDLTensorPtr;
    a.v_ptr = &d;
    return a;
  }

  // A list as a TVM-FFI Array of its items, each as `item` says; its
  // tensors as owned Tensors (an Array holds what it stores).
  OpforgeFfiAny List(const c10::Argument& arg, const LeafPlan& item, c10::ArrayRef<c10::IValue> items) {
    void* ctor = ArrayConstructor(api_);
    TORCH_CHECK(ctor != nullptr, kernel_.op(), ": argument '", arg.name(),
                "' is a list, and this TVM-FFI runtime has no ffi.Array to pass it as.");
    const bool was_owned = owned_;
    owned_ = true;
    std::vector<OpforgeFfiAny> elems;
    elems.reserve(items.size());
    for (const c10::IValue& v : items) elems.push_back(Write(arg, item, v));
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

// Whether TVM-FFI's TypeError says a parameter wanted an owned Tensor and
// got a view: "... Expected `ffi.Tensor` but got `DLTensor*`" (or
// `Optional<ffi.Tensor>`).
bool WantsOwnedTensor(const std::string& message) {
  const size_t got = message.find("` but got `DLTensor*`");
  if (got == std::string::npos) return false;
  const size_t expected = message.rfind("Expected `", got);
  return expected != std::string::npos && message.substr(expected, got - expected).find("ffi.Tensor") != std::string::npos;
}

}  // namespace

void FfiKernel::Call(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                     std::vector<c10::IValue>& out) {
  const auto& params = schema.arguments();
  TORCH_INTERNAL_ASSERT(params.size() == args.size());
  Plan(schema);  // a kernel no registration planned (one set on an op directly)
  TORCH_INTERNAL_ASSERT(plan_.size() == args.size(), op_, ": its TVM-FFI kernel was planned for ", plan_.size(),
                        " arguments, not ", args.size());
  ArgWriter writer(*this, *api_, options_.owned_tensors, num_tensor_leaves_);
  c10::SmallVector<OpforgeFfiAny, 16> anys;
  for (size_t i = 0; i < args.size(); ++i) anys.push_back(writer.Write(params[i], plan_[i], args[i]));
  // The kernel runs on torch's current stream, as TVM-FFI's own torch glue sets it.
  void* previous = nullptr;
  const int cuda = writer.cuda_device();
  if (cuda >= 0) {
    const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(cuda));
    void* stream = CudaStreamHandle(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device));
    api_->env_set_stream(kDLCUDA, cuda, stream, &previous);
  }
  void* previous_allocator = nullptr;
  api_->env_set_allocator(reinterpret_cast<void*>(&TorchAllocator), 0, &previous_allocator);
  OpforgeFfiAny result = None();
  const int rc = api_->function_call(function_, anys.data(), static_cast<int32_t>(anys.size()), &result);
  api_->env_set_allocator(previous_allocator, 0, nullptr);
  if (cuda >= 0) api_->env_set_stream(kDLCUDA, cuda, previous, nullptr);
  if (rc != 0) {
    const auto err = TakeError(*api_);
    // A function that takes ffi::Tensor rejects a DLTensor view before its
    // body runs; opforge passes owned Tensors only when told so.
    if (!options_.owned_tensors && err.first == "TypeError" && WantsOwnedTensor(err.second)) {
      Throw(err.first, op_ + ": its TVM-FFI kernel" + function_name_ +
                           " takes owned tensors (an ffi::Tensor parameter), and opforge passes DLTensor views "
                           "unless told otherwise. Say so with " + options_.owned_tensors_hint +
                           ", or declare the parameter ffi::TensorView (no DLPack capsule per call). TVM-FFI said: " +
                           err.second);
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
  if (returns.empty()) {
    TORCH_CHECK(result.type_index == kFfiNone, op_, ": its TVM-FFI kernel", function_name_, " returned ",
                KindName(result.type_index), ", but the op's schema returns nothing (-> ()), so it would be lost. "
                "Annotate the return (-> Tensor) or make the function return nothing (void).");
    return;
  }
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

namespace {

class UnavailableKernel : public c10::OperatorKernel {
 public:
  explicit UnavailableKernel(std::string message) : message_(std::move(message)) {}
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*) {
    TORCH_CHECK(false, message_);
  }

 private:
  std::string message_;
};

// The top-level items of the JSON array that starts at `open` ('['):
// `[{"type":"int"},{"type":"Optional","args":[...]}]` -> its two objects.
std::vector<std::string> JsonItems(const std::string& json, size_t open) {
  std::vector<std::string> items;
  int depth = 0;
  bool in_string = false;
  size_t start = open + 1;
  for (size_t i = open; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') ++depth;
    else if (c == ']' || c == '}') {
      if (--depth == 0) {
        if (i > start) items.push_back(json.substr(start, i - start));
        return items;
      }
    } else if (c == ',' && depth == 1) {
      items.push_back(json.substr(start, i - start));
      start = i + 1;
    }
  }
  return items;
}

}  // namespace

torch::CppFunction MakeUnavailableKernel(std::string message) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<UnavailableKernel>(std::move(message)));
}

bool SchemaTakesOwnedTensors(const std::string& type_schema) {
  const std::string params = "\"params\":[";
  const size_t at = type_schema.find(params);
  if (at == std::string::npos) return false;
  for (const std::string& param : JsonItems(type_schema, at + params.size() - 1)) {
    if (param == R"({"type":"ffi.Tensor"})" || param.rfind(R"({"type":"Optional","args":[{"type":"ffi.Tensor"})", 0) == 0) {
      return true;
    }
  }
  return false;
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

// The function's TVM-FFI type schema, from the `__tvm_ffi__metadata_<symbol>`
// that TVM_FFI_DLL_EXPORT_TYPED_FUNC exports where the module was built
// with TVM_FFI_DLL_EXPORT_INCLUDE_METADATA=1; "" where it has none.
std::string TypeSchemaOf(void* handle, const std::string& symbol, const OpforgeFfiApi& api) {
  auto getter = reinterpret_cast<OpforgeFfiSafeCall>(dlsym(handle, ("__tvm_ffi__metadata_" + symbol).c_str()));
  if (getter == nullptr) return "";
  OpforgeFfiAny result{};
  if (getter(nullptr, nullptr, 0, &result) != 0) {
    TakeError(api);
    return "";
  }
  std::string json;
  if (result.type_index == kFfiSmallStr) {
    json.assign(result.v_bytes, result.zero_padding);
  } else if (result.type_index == kFfiStr) {
    json = Text(*reinterpret_cast<const OpforgeFfiBytes*>(static_cast<const char*>(result.v_ptr) +
                                                          sizeof(OpforgeFfiObject)));
    api.object_dec_ref(result.v_ptr);
  }
  // {"type_schema":"<the schema, JSON-escaped>"}
  const std::string key = "\"type_schema\":\"";
  const size_t at = json.find(key);
  if (at == std::string::npos) return "";
  std::string schema;
  for (size_t i = at + key.size(); i < json.size() && json[i] != '"'; ++i) {
    if (json[i] == '\\' && i + 1 < json.size()) ++i;
    schema += json[i];
  }
  return schema;
}

// The kernel of an op whose TVM-FFI function could not be found: raises the
// load error at every call (TorchLayerFfiKernel, core/torch_layer.h).
void* RegisterUnavailable(const TorchLayerFfiKernel& k, const std::string& problem, std::string* unavailable) {
  *unavailable = k.where + ": " + problem + " The op is defined; calling it raises this error.";
  const std::string message = k.op + ": its TVM-FFI kernel '" + k.symbol + "' was not found when " + k.library +
                              " loaded, so the op has no " + k.key + " kernel. The load error: " + *unavailable;
  return RegisterBoxed(k.op, {c10::parseDispatchKey(k.key)}, [&] { return MakeUnavailableKernel(message); })
      .release();
}

// The torch layer's register_ffi_kernel (core/torch_layer.h): `symbol` of
// `module` as `op`'s boxed kernel for `key`.
void* RegisterFfiKernel(const TorchLayerFfiKernel& k, std::string* unavailable) {
  const std::string path = ModulePath(k.module, k.library);
  // Kept loaded for the life of the process, as the library that names it.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return RegisterUnavailable(k, k.op + ": its TVM-FFI kernel's module " + k.module + " cannot be loaded (" +
                                      dlerror() + "). Give the module's path, absolute or relative to this "
                                      "library's folder.", unavailable);
  }
  const std::string exported = "__tvm_ffi_" + k.symbol;
  auto safe_call = reinterpret_cast<OpforgeFfiSafeCall>(dlsym(handle, exported.c_str()));
  if (safe_call == nullptr) {
    return RegisterUnavailable(k, k.op + ": " + path + " exports no TVM-FFI function '" + k.symbol + "' (no symbol " +
                                      exported + "). Export it with TVM_FFI_DLL_EXPORT_TYPED_FUNC(" + k.symbol +
                                      ", fn).", unavailable);
  }
  std::string error;
  const OpforgeFfiApi* api = LoadFfiApi(handle, path, &error);
  if (api == nullptr) {
    throw std::runtime_error(k.op + ": its TVM-FFI kernel " + k.symbol + " cannot be called: " + error +
                             ". The module must link libtvm_ffi.");
  }
  void* function = nullptr;
  if (api->function_create(nullptr, safe_call, nullptr, &function) != 0) {
    const auto err = TakeError(*api);
    throw std::runtime_error(k.op + ": its TVM-FFI kernel " + k.symbol + " could not be wrapped: " + err.second);
  }
  FfiKernelOptions options;
  options.owned_tensors = k.owned_tensors || SchemaTakesOwnedTensors(TypeSchemaOf(handle, k.symbol, *api));
  options.owned_tensors_hint = "m.impl(..., opforge::TvmFfi(\"" + k.symbol + "\", ...).owned_tensors())";
  auto kernel = std::make_shared<FfiKernel>(k.op, k.symbol, function, api, std::move(options));
  api->object_dec_ref(function);  // the kernel holds its own reference
  auto op = c10::Dispatcher::singleton().findSchema({k.op, ""});
  if (op) kernel->Plan(op->schema());
  return RegisterBoxed(k.op, {c10::parseDispatchKey(k.key)}, [&] { return MakeFfiDispatcherKernel(kernel); }).release();
}

}  // namespace detail

}  // namespace opforge
