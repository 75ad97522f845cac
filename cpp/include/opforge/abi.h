/* What a built kernel library needs from opforge at run time: a small C
 * surface, versioned as torch's own C shims are, so that a library built
 * against one opforge loads with a later one (docs/stable_abi.md#versions).
 *
 *   uint32_t newest = 0;
 *   const OpforgeAbiV1* abi = (const OpforgeAbiV1*)opforge_abi_get(1, &newest);
 *   if (!abi) ... this opforge only knows ABI versions up to `newest` ...
 *   abi->commit_library(&library, error, sizeof error);
 *
 * The three functions declared at the bottom never change or go away; every
 * other entry point is reached through a table of one version. A new version
 * adds a new table (OpforgeAbiV2) and keeps serving the old ones. Strings are
 * UTF-8 and borrowed for the duration of a call. Nothing here knows torch.
 */
#ifndef OPFORGE_ABI_H_
#define OPFORGE_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPFORGE_ABI_VERSION 1

/* A struct or enum a library declares: its C++ layout, as schema text.
 * Struct fields: type text as in a schema ("float", "Tensor?", "Inner"),
 * default as schema default text or NULL. Enums: member names and values. */
enum { kOpforgeStruct = 0, kOpforgeEnum = 1 };
typedef struct OpforgeFieldV1 {
  const char* name;
  const char* type;
  const char* default_value;
} OpforgeFieldV1;

typedef struct OpforgeTypeV1 {
  int32_t kind;          /* kOpforgeStruct or kOpforgeEnum */
  const char* name;      /* as written in C++: "NormCfg", or dotted "mylib.NormCfg" */
  const char* cpp_name;  /* the C++ type, for messages: "liba::NormCfg" */
  const OpforgeFieldV1* fields;
  size_t num_fields;
  const char* const* members;
  const int64_t* values;
  size_t num_members;
} OpforgeTypeV1;

/* One `m.def(schema)`. */
typedef struct OpforgeOpV1 {
  const char* schema; /* "rms_norm(Tensor! out, Tensor x, NormCfg cfg) -> ()", no namespace */
  /* A C++ backward the backend registers itself (libtorch's C++ API):
   * handed to backend.autograd once the op is defined. NULL if none. */
  void* autograd;
  /* A backward the library cannot register itself (torch's stable ABI has no
   * autograd): opaque to the core, wired by opforge's torch layer. */
  const void* torch_layer_autograd;
} OpforgeOpV1;

/* One kernel: `m.impl(name, key, &fn)`. `key` is a dispatch key name
 * ("CPU", "CUDA", "Meta", "CompositeExplicitAutograd", ...). `kernel` is the
 * backend's own object, handed back to its impl callback. */
typedef struct OpforgeKernelV1 {
  const char* op;
  const char* key;
  void* kernel;
} OpforgeKernelV1;

/* A kernel that is a function exported through Apache TVM-FFI:
 * `m.impl(name, key, opforge::TvmFfi(symbol, module))`. opforge's torch layer
 * registers it, the same for both ABI modes. */
typedef struct OpforgeFfiKernelV1 {
  const char* op;     /* the op's name in the namespace */
  const char* key;    /* a dispatch key name, as OpforgeKernelV1's */
  const char* module; /* the module .so's path; a relative one is found beside `dso` */
  const char* symbol; /* as TVM_FFI_DLL_EXPORT_TYPED_FUNC names it (exported as __tvm_ffi_<symbol>) */
} OpforgeFfiKernelV1;

/* Tensors reach the function as owned TVM-FFI Tensors (it takes
 * `ffi::Tensor`), not DLTensor views: `opforge::TvmFfi(...).owned_tensors()`. */
enum { kOpforgeFfiOwnedTensors = 1 };

/* A tag whose text starts with this is one of torch's op tags, given to the
 * op itself ("torch.cudagraph_unsafe", no names), not to arguments. */
#define OPFORGE_TORCH_TAG_PREFIX "torch."

/* `.arg_tag(tag, names)` / `.symm_mem_args(names)`. */
typedef struct OpforgeTagV1 {
  const char* op;
  const char* tag;
  const char* const* names;
  size_t num_names;
} OpforgeTagV1;

/* How the core registers with torch, implemented by the library's ABI mode
 * (libtorch's C++ API, or torch's stable C shims). Each call returns NULL on
 * success or an error message allocated with malloc (the core frees it). */
typedef struct OpforgeBackendV1 {
  void* ctx;
  char* (*def)(void* ctx, const char* schema_without_namespace);
  char* (*impl)(void* ctx, const char* op_name, const char* key, void* kernel);
  char* (*autograd)(void* ctx, const char* qualified_name, void* autograd);
  /* Undoes every def and impl this backend made. */
  void (*rollback)(void* ctx);
  /* Shows a warning the way the backend's torch shows warnings. */
  void (*warn)(void* ctx, const char* message);
} OpforgeBackendV1;

/* One OPFORGE_LIBRARY (or OPFORGE_LIBRARY_IMPL) block. */
typedef struct OpforgeLibraryV1 {
  uint32_t size; /* sizeof(OpforgeLibraryV1), for later growth */
  const char* ns;
  const char* impl_key; /* OPFORGE_LIBRARY_IMPL's key, or NULL */
  const char* file;
  uint32_t line;
  const char* dso;        /* the shared library's path, for messages */
  const char* abi;        /* "unstable" or "stable" */
  const char* opforge_version; /* the opforge the library was built against */
  uint64_t torch_version; /* stable: TORCH_TARGET_VERSION; unstable: the torch it was built against */
  const OpforgeTypeV1* types;
  size_t num_types;
  const OpforgeOpV1* ops;
  size_t num_ops;
  const OpforgeKernelV1* kernels;
  size_t num_kernels;
  const OpforgeTagV1* tags;
  size_t num_tags;
  OpforgeBackendV1 backend;
  /* Per kernel, its C++ parameter and return types as a schema writes them
   * ("Tensor, NormCfg?, float -> Tensor"), checked against the op's schema.
   * A later field: libraries built before it end at `backend` (see size). */
  const char* const* kernel_signatures;
  /* Kernels exported through TVM-FFI. A later field: libraries built before
   * it end at `kernel_signatures` (see size). */
  const OpforgeFfiKernelV1* ffi_kernels;
  size_t num_ffi_kernels;
  /* Per TVM-FFI kernel, kOpforgeFfi* bits. A later field: libraries built
   * before it end at `num_ffi_kernels` (see size), and their kernels get none. */
  const uint32_t* ffi_kernel_flags;
} OpforgeLibraryV1;

/* A C++ backward of a library on torch's stable ABI, which has no autograd:
 * opforge's torch layer (built for the running torch) wires it as the op's
 * autograd kernel and calls these. Tensors cross as torch's stable tensor
 * handles (AtenTensorHandle, here void*). */

/* Flat values of one call, read-only: the op's inputs, its outputs, or the
 * outputs' gradients. A tensor comes back as a new handle the caller owns,
 * NULL for None or an undefined tensor. */
typedef struct OpforgeValuesV1 {
  void* self;
  size_t (*size)(void* self);
  int32_t (*is_none)(void* self, size_t i);
  int64_t (*to_int)(void* self, size_t i);
  double (*to_double)(void* self, size_t i);
  int32_t (*to_bool)(void* self, size_t i);
  /* Copies up to `capacity` bytes; returns the string's length. */
  size_t (*to_string)(void* self, size_t i, char* out, size_t capacity);
  size_t (*list_size)(void* self, size_t i);
  int64_t (*int_at)(void* self, size_t i, size_t j);
  double (*double_at)(void* self, size_t i, size_t j);
  void* (*tensor)(void* self, size_t i);
  void* (*tensor_at)(void* self, size_t i, size_t j);
  /* The device type code (c10::DeviceType); *index gets the device index. */
  int32_t (*device)(void* self, size_t i, int32_t* index);
} OpforgeValuesV1;

/* torch's autograd context, as setup and backward see it. */
typedef struct OpforgeAutogradCtxV1 {
  void* self;
  void (*save_for_backward)(void* self, void* const* tensors, size_t n); /* borrowed handles */
  size_t (*num_saved)(void* self);
  void* (*saved)(void* self, size_t i); /* a new handle */
  /* Whether parameter `param` of the kernel has a tensor that needs a gradient. */
  int32_t (*needs_input_grad)(void* self, size_t param);
  void (*set_materialize_grads)(void* self, int32_t value);
  void (*mark_non_differentiable)(void* self, void* const* tensors, size_t n);
  /* The library's own state (its saved_data), kept until the graph node dies. */
  void* (*state)(void* self);
  void (*set_state)(void* self, void* state, void (*destroy)(void*));
  /* For messages: "mylib::op", and the kernel's parameter names. */
  const char* (*op_name)(void* self);
  const char* (*param_name)(void* self, size_t param);
} OpforgeAutogradCtxV1;

/* Where backward puts its gradients: one per tensor of each flat tensor
 * argument (`count` of them for argument `arg`). */
typedef struct OpforgeGradsV1 {
  void* self;
  size_t (*count)(void* self, size_t arg);
  void (*set)(void* self, size_t arg, size_t j, void* tensor); /* takes the handle */
} OpforgeGradsV1;

typedef struct OpforgeStableAutogradV1 {
  uint32_t size; /* sizeof(OpforgeStableAutogradV1) */
  /* After the forward, with the op's flat inputs and outputs. Returns NULL,
   * or an error message allocated with malloc. */
  char* (*setup)(const OpforgeAutogradCtxV1* ctx, const OpforgeValuesV1* inputs, const OpforgeValuesV1* outputs);
  /* The outputs' gradients in (`grads`), the inputs' gradients out. */
  char* (*backward)(const OpforgeAutogradCtxV1* ctx, const OpforgeValuesV1* grads, const OpforgeGradsV1* out);
} OpforgeStableAutogradV1;

typedef struct OpforgeAbiV1 {
  uint32_t size; /* sizeof(OpforgeAbiV1) */
  /* Declares the block's types under its namespace, lowers its schemas and
   * registers everything through `backend`: all of it, or nothing. Returns 0,
   * or 1 with the message (naming the library, the op and the fix) in
   * `error` and recorded as a load error (opforge.load_errors()). */
  int32_t (*commit_library)(const OpforgeLibraryV1* library, char* error, size_t error_size);
  /* Handles (docs/handles.md). acquire returns the object and a token that
   * keeps it alive until released; NULL with a message for a stale handle or
   * another type. */
  void* (*handle_acquire)(int64_t handle, const char* type, void** token, char* error, size_t error_size);
  void (*handle_release)(void* token);
  int64_t (*handle_register)(void* object, void (*destroy)(void*), const char* type, int32_t weak,
                             char* error, size_t error_size);
  /* The flat argument and return counts of an op opforge defined ("ns::op",
   * its default overload): 1, or 0 for any other op. For opforge::Call's
   * check before it reads returns. A later field: cores before it end at
   * `handle_register` (see size). */
  int32_t (*op_counts)(const char* qualified, size_t* num_args, size_t* num_returns);
} OpforgeAbiV1;

#if defined(_WIN32)
#define OPFORGE_C_API __declspec(dllexport)
#else
#define OPFORGE_C_API __attribute__((visibility("default")))
#endif

/* The table of ABI `version`, or NULL when this opforge does not provide it;
 * `*newest` is set to the newest version it provides. */
OPFORGE_C_API const void* opforge_abi_get(uint32_t version, uint32_t* newest);
/* This opforge's version, e.g. "0.1.0". */
OPFORGE_C_API const char* opforge_version(void);
/* Records a load error (shown by opforge.load_library and on stderr) for a
 * library that cannot use this opforge at all. */
OPFORGE_C_API void opforge_report_load_error(const char* library, const char* message);

#ifdef __cplusplus
}
#endif

#endif /* OPFORGE_ABI_H_ */
