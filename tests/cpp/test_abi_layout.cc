// The C surface (opforge/abi.h) is a promise: a stable-ABI library built
// against this opforge keeps loading with later ones, so no field of a
// versioned struct may move, change type or disappear; a new field means a new
// version (OpforgeAbiV2). This test freezes every V1 layout as published, for
// LP64 (Linux x86-64 and aarch64): if it fails, the change broke built
// libraries. Add a V2 struct instead of editing a V1 one.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "opforge/abi.h"

namespace {

// The type of member `f` of `T`: FieldOf(&T::f).
template <class T, class M>
M FieldOf(M T::*);

#define EXPECT_FIELD(T, field, offset, ...)                                                 \
  do {                                                                                      \
    EXPECT_EQ(offsetof(T, field), size_t{offset}) << #T "." #field " moved";                \
    EXPECT_TRUE((std::is_same_v<decltype(FieldOf(&T::field)), __VA_ARGS__>))                \
        << #T "." #field " changed type";                                                   \
  } while (0)

class AbiLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    if (sizeof(void*) != 8 || sizeof(size_t) != 8) GTEST_SKIP() << "the layouts below are LP64's";
  }
};

TEST_F(AbiLayout, VersionAndKindConstantsAreAsPublished) {
  EXPECT_EQ(OPFORGE_ABI_VERSION, 1);
  EXPECT_EQ(kOpforgeStruct, 0);
  EXPECT_EQ(kOpforgeEnum, 1);
}

TEST_F(AbiLayout, TypeDeclarationsKeepTheirLayout) {
  EXPECT_EQ(sizeof(OpforgeFieldV1), 24u);
  EXPECT_FIELD(OpforgeFieldV1, name, 0, const char*);
  EXPECT_FIELD(OpforgeFieldV1, type, 8, const char*);
  EXPECT_FIELD(OpforgeFieldV1, default_value, 16, const char*);

  EXPECT_EQ(sizeof(OpforgeTypeV1), 64u);
  EXPECT_FIELD(OpforgeTypeV1, kind, 0, int32_t);
  EXPECT_FIELD(OpforgeTypeV1, name, 8, const char*);
  EXPECT_FIELD(OpforgeTypeV1, cpp_name, 16, const char*);
  EXPECT_FIELD(OpforgeTypeV1, fields, 24, const OpforgeFieldV1*);
  EXPECT_FIELD(OpforgeTypeV1, num_fields, 32, size_t);
  EXPECT_FIELD(OpforgeTypeV1, members, 40, const char* const*);
  EXPECT_FIELD(OpforgeTypeV1, values, 48, const int64_t*);
  EXPECT_FIELD(OpforgeTypeV1, num_members, 56, size_t);
}

TEST_F(AbiLayout, OpsKernelsAndTagsKeepTheirLayout) {
  EXPECT_EQ(sizeof(OpforgeOpV1), 24u);
  EXPECT_FIELD(OpforgeOpV1, schema, 0, const char*);
  EXPECT_FIELD(OpforgeOpV1, autograd, 8, void*);
  EXPECT_FIELD(OpforgeOpV1, torch_layer_autograd, 16, const void*);

  EXPECT_EQ(sizeof(OpforgeKernelV1), 24u);
  EXPECT_FIELD(OpforgeKernelV1, op, 0, const char*);
  EXPECT_FIELD(OpforgeKernelV1, key, 8, const char*);
  EXPECT_FIELD(OpforgeKernelV1, kernel, 16, void*);

  EXPECT_EQ(sizeof(OpforgeTagV1), 32u);
  EXPECT_FIELD(OpforgeTagV1, op, 0, const char*);
  EXPECT_FIELD(OpforgeTagV1, tag, 8, const char*);
  EXPECT_FIELD(OpforgeTagV1, names, 16, const char* const*);
  EXPECT_FIELD(OpforgeTagV1, num_names, 24, size_t);
}

TEST_F(AbiLayout, TheBackendAndTheLibraryKeepTheirLayout) {
  EXPECT_EQ(sizeof(OpforgeBackendV1), 48u);
  EXPECT_FIELD(OpforgeBackendV1, ctx, 0, void*);
  EXPECT_FIELD(OpforgeBackendV1, def, 8, char* (*)(void*, const char*));
  EXPECT_FIELD(OpforgeBackendV1, impl, 16, char* (*)(void*, const char*, const char*, void*));
  EXPECT_FIELD(OpforgeBackendV1, autograd, 24, char* (*)(void*, const char*, void*));
  EXPECT_FIELD(OpforgeBackendV1, rollback, 32, void (*)(void*));
  EXPECT_FIELD(OpforgeBackendV1, warn, 40, void (*)(void*, const char*));

  EXPECT_EQ(sizeof(OpforgeLibraryV1), 216u);
  EXPECT_FIELD(OpforgeLibraryV1, size, 0, uint32_t);
  EXPECT_FIELD(OpforgeLibraryV1, ns, 8, const char*);
  EXPECT_FIELD(OpforgeLibraryV1, impl_key, 16, const char*);
  EXPECT_FIELD(OpforgeLibraryV1, file, 24, const char*);
  EXPECT_FIELD(OpforgeLibraryV1, line, 32, uint32_t);
  EXPECT_FIELD(OpforgeLibraryV1, dso, 40, const char*);
  EXPECT_FIELD(OpforgeLibraryV1, abi, 48, const char*);
  EXPECT_FIELD(OpforgeLibraryV1, opforge_version, 56, const char*);
  EXPECT_FIELD(OpforgeLibraryV1, torch_version, 64, uint64_t);
  EXPECT_FIELD(OpforgeLibraryV1, types, 72, const OpforgeTypeV1*);
  EXPECT_FIELD(OpforgeLibraryV1, num_types, 80, size_t);
  EXPECT_FIELD(OpforgeLibraryV1, ops, 88, const OpforgeOpV1*);
  EXPECT_FIELD(OpforgeLibraryV1, num_ops, 96, size_t);
  EXPECT_FIELD(OpforgeLibraryV1, kernels, 104, const OpforgeKernelV1*);
  EXPECT_FIELD(OpforgeLibraryV1, num_kernels, 112, size_t);
  EXPECT_FIELD(OpforgeLibraryV1, tags, 120, const OpforgeTagV1*);
  EXPECT_FIELD(OpforgeLibraryV1, num_tags, 128, size_t);
  EXPECT_FIELD(OpforgeLibraryV1, backend, 136, OpforgeBackendV1);
  // A later field: the core reads it only from a library whose size covers it.
  EXPECT_FIELD(OpforgeLibraryV1, kernel_signatures, 184, const char* const*);
  EXPECT_FIELD(OpforgeLibraryV1, ffi_kernels, 192, const OpforgeFfiKernelV1*);
  EXPECT_FIELD(OpforgeLibraryV1, num_ffi_kernels, 200, size_t);
  EXPECT_FIELD(OpforgeLibraryV1, ffi_kernel_flags, 208, const uint32_t*);
  EXPECT_EQ(kOpforgeFfiOwnedTensors, 1);

  EXPECT_EQ(sizeof(OpforgeFfiKernelV1), 32u);
  EXPECT_FIELD(OpforgeFfiKernelV1, op, 0, const char*);
  EXPECT_FIELD(OpforgeFfiKernelV1, key, 8, const char*);
  EXPECT_FIELD(OpforgeFfiKernelV1, module, 16, const char*);
  EXPECT_FIELD(OpforgeFfiKernelV1, symbol, 24, const char*);
}

TEST_F(AbiLayout, TheStableAutogradTablesKeepTheirLayout) {
  EXPECT_EQ(sizeof(OpforgeValuesV1), 104u);
  EXPECT_FIELD(OpforgeValuesV1, self, 0, void*);
  EXPECT_FIELD(OpforgeValuesV1, size, 8, size_t (*)(void*));
  EXPECT_FIELD(OpforgeValuesV1, is_none, 16, int32_t (*)(void*, size_t));
  EXPECT_FIELD(OpforgeValuesV1, to_int, 24, int64_t (*)(void*, size_t));
  EXPECT_FIELD(OpforgeValuesV1, to_double, 32, double (*)(void*, size_t));
  EXPECT_FIELD(OpforgeValuesV1, to_bool, 40, int32_t (*)(void*, size_t));
  EXPECT_FIELD(OpforgeValuesV1, to_string, 48, size_t (*)(void*, size_t, char*, size_t));
  EXPECT_FIELD(OpforgeValuesV1, list_size, 56, size_t (*)(void*, size_t));
  EXPECT_FIELD(OpforgeValuesV1, int_at, 64, int64_t (*)(void*, size_t, size_t));
  EXPECT_FIELD(OpforgeValuesV1, double_at, 72, double (*)(void*, size_t, size_t));
  EXPECT_FIELD(OpforgeValuesV1, tensor, 80, void* (*)(void*, size_t));
  EXPECT_FIELD(OpforgeValuesV1, tensor_at, 88, void* (*)(void*, size_t, size_t));
  EXPECT_FIELD(OpforgeValuesV1, device, 96, int32_t (*)(void*, size_t, int32_t*));

  EXPECT_EQ(sizeof(OpforgeAutogradCtxV1), 88u);
  EXPECT_FIELD(OpforgeAutogradCtxV1, self, 0, void*);
  EXPECT_FIELD(OpforgeAutogradCtxV1, save_for_backward, 8, void (*)(void*, void* const*, size_t));
  EXPECT_FIELD(OpforgeAutogradCtxV1, num_saved, 16, size_t (*)(void*));
  EXPECT_FIELD(OpforgeAutogradCtxV1, saved, 24, void* (*)(void*, size_t));
  EXPECT_FIELD(OpforgeAutogradCtxV1, needs_input_grad, 32, int32_t (*)(void*, size_t));
  EXPECT_FIELD(OpforgeAutogradCtxV1, set_materialize_grads, 40, void (*)(void*, int32_t));
  EXPECT_FIELD(OpforgeAutogradCtxV1, mark_non_differentiable, 48, void (*)(void*, void* const*, size_t));
  EXPECT_FIELD(OpforgeAutogradCtxV1, state, 56, void* (*)(void*));
  EXPECT_FIELD(OpforgeAutogradCtxV1, set_state, 64, void (*)(void*, void*, void (*)(void*)));
  EXPECT_FIELD(OpforgeAutogradCtxV1, op_name, 72, const char* (*)(void*));
  EXPECT_FIELD(OpforgeAutogradCtxV1, param_name, 80, const char* (*)(void*, size_t));

  EXPECT_EQ(sizeof(OpforgeGradsV1), 24u);
  EXPECT_FIELD(OpforgeGradsV1, self, 0, void*);
  EXPECT_FIELD(OpforgeGradsV1, count, 8, size_t (*)(void*, size_t));
  EXPECT_FIELD(OpforgeGradsV1, set, 16, void (*)(void*, size_t, size_t, void*));

  EXPECT_EQ(sizeof(OpforgeStableAutogradV1), 24u);
  EXPECT_FIELD(OpforgeStableAutogradV1, size, 0, uint32_t);
  EXPECT_FIELD(OpforgeStableAutogradV1, setup, 8,
               char* (*)(const OpforgeAutogradCtxV1*, const OpforgeValuesV1*, const OpforgeValuesV1*));
  EXPECT_FIELD(OpforgeStableAutogradV1, backward, 16,
               char* (*)(const OpforgeAutogradCtxV1*, const OpforgeValuesV1*, const OpforgeGradsV1*));
}

TEST_F(AbiLayout, TheEntryTableAndItsFunctionsKeepTheirLayout) {
  EXPECT_EQ(sizeof(OpforgeAbiV1), 48u);
  EXPECT_FIELD(OpforgeAbiV1, size, 0, uint32_t);
  EXPECT_FIELD(OpforgeAbiV1, commit_library, 8, int32_t (*)(const OpforgeLibraryV1*, char*, size_t));
  EXPECT_FIELD(OpforgeAbiV1, handle_acquire, 16, void* (*)(int64_t, const char*, void**, char*, size_t));
  EXPECT_FIELD(OpforgeAbiV1, handle_release, 24, void (*)(void*));
  EXPECT_FIELD(OpforgeAbiV1, handle_register, 32,
               int64_t (*)(void*, void (*)(void*), const char*, int32_t, char*, size_t));
  // A later field, read only from cores whose size covers it.
  EXPECT_FIELD(OpforgeAbiV1, op_counts, 40, int32_t (*)(const char*, size_t*, size_t*));
  EXPECT_TRUE((std::is_same_v<decltype(&opforge_abi_get), const void* (*)(uint32_t, uint32_t*)>));
  EXPECT_TRUE((std::is_same_v<decltype(&opforge_version), const char* (*)()>));
  EXPECT_TRUE((std::is_same_v<decltype(&opforge_report_load_error), void (*)(const char*, const char*)>));
}

TEST_F(AbiLayout, TheCoreServesVersionOneAndNamesTheNewest) {
  uint32_t newest = 0;
  const auto* abi = static_cast<const OpforgeAbiV1*>(opforge_abi_get(1, &newest));
  ASSERT_NE(abi, nullptr);
  EXPECT_EQ(newest, 1u);
  EXPECT_EQ(abi->size, sizeof(OpforgeAbiV1));
  EXPECT_NE(abi->commit_library, nullptr);
  EXPECT_EQ(opforge_abi_get(2, &newest), nullptr);
}

}  // namespace
