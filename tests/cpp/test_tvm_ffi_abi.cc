// opforge's mirror of TVM-FFI's C ABI (cpp/src/torch/tvm_ffi_abi.h) against
// TVM-FFI's own header, tvm/ffi/c_api.h: a TVM-FFI release that moved a field
// or renumbered a type index would otherwise be misread silently. Built with
// the header where apache-tvm-ffi is installed (tests/cpp/CMakeLists.txt);
// without it, the test is reported skipped, saying so.
#include <gtest/gtest.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "torch/tvm_ffi_abi.h"

#ifdef OPFORGE_TEST_TVM_FFI_HEADER
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

namespace opforge {
namespace {

#define EXPECT_SAME_LAYOUT(ours, theirs)                                                     \
  EXPECT_EQ(sizeof(ours), sizeof(theirs)) << #ours " is not the size of TVM-FFI's " #theirs; \
  EXPECT_EQ(alignof(ours), alignof(theirs)) << #ours " is not aligned as TVM-FFI's " #theirs
#define EXPECT_SAME_OFFSET(ours, our_field, theirs, their_field)                                  \
  EXPECT_EQ(offsetof(ours, our_field), offsetof(theirs, their_field))                             \
      << #ours "::" #our_field " is not where TVM-FFI's " #theirs "::" #their_field " is";        \
  EXPECT_EQ(sizeof(ours::our_field), sizeof(theirs::their_field))                                 \
      << #ours "::" #our_field " is not the size of TVM-FFI's " #theirs "::" #their_field

TEST(TvmFfiAbi, TypeIndicesAreTvmFfis) {
  const std::pair<int32_t, int32_t> pairs[] = {
      {kFfiNone, kTVMFFINone},           {kFfiInt, kTVMFFIInt},
      {kFfiBool, kTVMFFIBool},           {kFfiFloat, kTVMFFIFloat},
      {kFfiOpaquePtr, kTVMFFIOpaquePtr}, {kFfiDataType, kTVMFFIDataType},
      {kFfiDevice, kTVMFFIDevice},       {kFfiDLTensorPtr, kTVMFFIDLTensorPtr},
      {kFfiRawStr, kTVMFFIRawStr},       {kFfiSmallStr, kTVMFFISmallStr},
      {kFfiStaticObjectBegin, kTVMFFIStaticObjectBegin},
      {kFfiStr, kTVMFFIStr},             {kFfiError, kTVMFFIError},
      {kFfiFunction, kTVMFFIFunction},   {kFfiShape, kTVMFFIShape},
      {kFfiTensor, kTVMFFITensor},       {kFfiArray, kTVMFFIArray},
  };
  for (const auto& [ours, theirs] : pairs) EXPECT_EQ(ours, theirs) << "type index " << ours;
}

TEST(TvmFfiAbi, ObjectHeader) {
  EXPECT_SAME_LAYOUT(OpforgeFfiObject, TVMFFIObject);  // an object's cell follows its header
  EXPECT_SAME_OFFSET(OpforgeFfiObject, combined_ref_count, TVMFFIObject, combined_ref_count);
  EXPECT_SAME_OFFSET(OpforgeFfiObject, type_index, TVMFFIObject, type_index);
  EXPECT_SAME_OFFSET(OpforgeFfiObject, deleter, TVMFFIObject, deleter);
}

TEST(TvmFfiAbi, Any) {
  EXPECT_SAME_LAYOUT(OpforgeFfiAny, TVMFFIAny);  // arguments travel as an array of them
  EXPECT_SAME_OFFSET(OpforgeFfiAny, type_index, TVMFFIAny, type_index);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, zero_padding, TVMFFIAny, zero_padding);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, zero_padding, TVMFFIAny, small_str_len);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, v_int64, TVMFFIAny, v_int64);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, v_float64, TVMFFIAny, v_float64);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, v_ptr, TVMFFIAny, v_ptr);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, v_c_str, TVMFFIAny, v_c_str);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, v_obj, TVMFFIAny, v_obj);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, v_dtype, TVMFFIAny, v_dtype);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, v_device, TVMFFIAny, v_device);
  EXPECT_SAME_OFFSET(OpforgeFfiAny, v_bytes, TVMFFIAny, v_bytes);
  EXPECT_EQ(sizeof(OpforgeFfiAny::v_bytes), sizeof(TVMFFIAny::v_bytes)) << "a small string's inline bytes";
  EXPECT_EQ(sizeof(OpforgeFfiAny::v_dtype), sizeof(DLDataType));
  EXPECT_EQ(sizeof(OpforgeFfiAny::v_device), sizeof(DLDevice));
}

TEST(TvmFfiAbi, Cells) {
  EXPECT_SAME_LAYOUT(OpforgeFfiBytes, TVMFFIByteArray);
  EXPECT_SAME_OFFSET(OpforgeFfiBytes, data, TVMFFIByteArray, data);
  EXPECT_SAME_OFFSET(OpforgeFfiBytes, size, TVMFFIByteArray, size);
  // opforge reads the first fields of these cells; TVM-FFI may add fields after them.
  EXPECT_SAME_OFFSET(OpforgeFfiErrorCell, kind, TVMFFIErrorCell, kind);
  EXPECT_SAME_OFFSET(OpforgeFfiErrorCell, message, TVMFFIErrorCell, message);
  EXPECT_SAME_OFFSET(OpforgeFfiErrorCell, backtrace, TVMFFIErrorCell, backtrace);
  EXPECT_LE(sizeof(OpforgeFfiErrorCell), sizeof(TVMFFIErrorCell));
  EXPECT_SAME_OFFSET(OpforgeFfiSeqCell, data, TVMFFISeqCell, data);
  EXPECT_SAME_OFFSET(OpforgeFfiSeqCell, size, TVMFFISeqCell, size);
  EXPECT_SAME_OFFSET(OpforgeFfiSeqCell, capacity, TVMFFISeqCell, capacity);
  EXPECT_LE(sizeof(OpforgeFfiSeqCell), sizeof(TVMFFISeqCell));
}

// The functions opforge looks up: the same parameters, with TVM-FFI's handle
// and struct types spelled as opforge's mirrors.
template <typename Ours, typename Theirs>
struct SameArity;
template <typename R1, typename... A1, typename R2, typename... A2>
struct SameArity<R1 (*)(A1...), R2 (*)(A2...)> {
  static constexpr bool value = sizeof...(A1) == sizeof...(A2) && std::is_same_v<R1, R2> &&
                                ((sizeof(A1) == sizeof(A2)) && ...);
};
#define EXPECT_SAME_FUNCTION(field, function)                                                                 \
  EXPECT_TRUE((SameArity<decltype(OpforgeFfiApi::field), decltype(&function)>::value))                       \
      << "OpforgeFfiApi::" #field " does not take what TVM-FFI's " #function " takes"

TEST(TvmFfiAbi, Functions) {
  EXPECT_SAME_FUNCTION(function_call, TVMFFIFunctionCall);
  EXPECT_SAME_FUNCTION(error_move_from_raised, TVMFFIErrorMoveFromRaised);
  EXPECT_SAME_FUNCTION(object_inc_ref, TVMFFIObjectIncRef);
  EXPECT_SAME_FUNCTION(object_dec_ref, TVMFFIObjectDecRef);
  EXPECT_SAME_FUNCTION(function_get_global, TVMFFIFunctionGetGlobal);
  EXPECT_SAME_FUNCTION(env_set_stream, TVMFFIEnvSetStream);
  EXPECT_SAME_FUNCTION(tensor_from_dlpack, TVMFFITensorFromDLPack);
  EXPECT_SAME_FUNCTION(tensor_to_dlpack, TVMFFITensorToDLPack);
  EXPECT_SAME_FUNCTION(function_create, TVMFFIFunctionCreate);
  EXPECT_SAME_FUNCTION(env_set_allocator, TVMFFIEnvSetDLPackManagedTensorAllocator);
  EXPECT_TRUE((SameArity<OpforgeFfiSafeCall, TVMFFISafeCallType>::value)) << "the safe-call type";
}

}  // namespace
}  // namespace opforge

#else

TEST(TvmFfiAbi, NeedsTvmFfisHeader) {
  GTEST_SKIP() << "apache-tvm-ffi is not installed for the Python that configured this build, so TVM-FFI's "
                  "tvm/ffi/c_api.h is not here to compare cpp/src/torch/tvm_ffi_abi.h with (pip install "
                  "apache-tvm-ffi, as make test does, and configure again)";
}

#endif
