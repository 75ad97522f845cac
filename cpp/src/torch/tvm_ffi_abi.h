// The part of Apache TVM-FFI's stable C ABI (tvm/ffi/c_api.h) that opforge
// calls, spelled out here so that opforge builds without TVM-FFI installed:
// a function is found at run time, in a libtvm_ffi.so that is already
// loaded. tests/cpp/test_tvm_ffi_abi.cc checks every size, offset and value
// below against TVM-FFI's own header where one is installed (ctest's
// test_tvm_ffi_abi; skipped, saying so, where apache-tvm-ffi is not).
//
//   OpforgeFfiAny arg{kFfiFloat, 0, {}}; arg.v_float64 = 0.5;
//   api.function_call(fn, &arg, 1, &result);
#pragma once

#include <cstddef>
#include <cstdint>

namespace opforge {

// TVMFFITypeIndex values opforge reads or writes.
enum FfiTypeIndex : int32_t {
  kFfiNone = 0,
  kFfiInt = 1,
  kFfiBool = 2,
  kFfiFloat = 3,
  kFfiOpaquePtr = 4,
  kFfiDataType = 5,
  kFfiDevice = 6,
  kFfiDLTensorPtr = 7,
  kFfiRawStr = 8,
  kFfiSmallStr = 11,
  kFfiStaticObjectBegin = 64,
  kFfiStr = 65,
  kFfiError = 67,
  kFfiFunction = 68,
  kFfiShape = 69,
  kFfiTensor = 70,
  kFfiArray = 71,
};

// TVMFFIObject: the header of every heap object.
struct OpforgeFfiObject {
  uint64_t combined_ref_count;
  int32_t type_index;
  uint32_t padding;
  void (*deleter)(void* self, int flags);
};

// TVMFFIAny: 16 bytes, a type index and a value.
struct OpforgeFfiAny {
  int32_t type_index;
  uint32_t zero_padding;  // small_str_len for kFfiSmallStr
  union {
    int64_t v_int64;
    double v_float64;
    void* v_ptr;
    const char* v_c_str;
    OpforgeFfiObject* v_obj;
    struct {
      uint8_t code, bits;
      uint16_t lanes;
    } v_dtype;
    struct {
      int32_t device_type, device_id;
    } v_device;
    char v_bytes[8];
  };
};

// TVMFFIByteArray.
struct OpforgeFfiBytes {
  const char* data;
  size_t size;
};

// TVMFFIErrorCell, which follows an error object's header.
struct OpforgeFfiErrorCell {
  OpforgeFfiBytes kind;
  OpforgeFfiBytes message;
  OpforgeFfiBytes backtrace;
};

// TVMFFISeqCell, which follows an Array object's header; its items are Anys.
struct OpforgeFfiSeqCell {
  void* data;
  int64_t size;
  int64_t capacity;
};

// TVMFFISafeCallType: what TVM_FFI_DLL_EXPORT_TYPED_FUNC exports as
// `__tvm_ffi_<name>`, and what a Function object calls.
using OpforgeFfiSafeCall = int (*)(void* self, const OpforgeFfiAny* args, int32_t num_args, OpforgeFfiAny* result);

// The libtvm_ffi functions opforge calls, found by name (TVMFFI...).
struct OpforgeFfiApi {
  int (*function_call)(void* func, OpforgeFfiAny* args, int32_t num_args, OpforgeFfiAny* result);
  void (*error_move_from_raised)(void** result);
  int (*object_inc_ref)(void* obj);
  int (*object_dec_ref)(void* obj);
  int (*function_get_global)(const OpforgeFfiBytes* name, void** out);
  int (*env_set_stream)(int32_t device_type, int32_t device_id, void* stream, void** original);
  int (*tensor_from_dlpack)(void* managed, int32_t require_alignment, int32_t require_contiguous, void** out);
  int (*tensor_to_dlpack)(void* tensor, void** managed);
  int (*function_create)(void* self, OpforgeFfiSafeCall safe_call, void (*deleter)(void* self), void** out);
  // TVMFFIEnvSetDLPackManagedTensorAllocator: `allocator` is DLPack's
  // DLPackManagedTensorAllocator, which TVMFFIEnvTensorAlloc calls.
  int (*env_set_allocator)(void* allocator, int32_t write_to_global_context, void** original);
};

}  // namespace opforge
