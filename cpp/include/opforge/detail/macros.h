// OPFORGE_LIBRARY and OPFORGE_LIBRARY_IMPL, the same in both torch ABIs: a
// block run at load by the ABI's ::opforge::detail::LibraryInit, whose
// arguments the ABI header spells (OPFORGE_DETAIL_LIBRARY_ARGS_,
// OPFORGE_DETAIL_IMPL_ARGS_).
#pragma once

#include "opforge/detail/pp.h"

#define OPFORGE_UID_(prefix, line) OPFORGE_PP_CAT(prefix, line)

// OPFORGE_LIBRARY(ns, m) { m.def(...); } -- like TORCH_LIBRARY (a fragment,
// so Python and C++ ops can share a namespace).
#define OPFORGE_LIBRARY(ns, m)                                                           \
  static void OPFORGE_PP_CAT(opforge_library_init_, ns)(::opforge::Library&);           \
  static const ::opforge::detail::LibraryInit OPFORGE_UID_(opforge_library_, __LINE__)(  \
      OPFORGE_DETAIL_LIBRARY_ARGS_(ns), &OPFORGE_PP_CAT(opforge_library_init_, ns), __FILE__, __LINE__); \
  void OPFORGE_PP_CAT(opforge_library_init_, ns)(::opforge::Library & m)

// OPFORGE_LIBRARY_IMPL(ns, CUDA, m) { m.impl("op", &op_cuda); }
#define OPFORGE_LIBRARY_IMPL(ns, key, m)                                                                \
  static void OPFORGE_PP_CAT(OPFORGE_PP_CAT(opforge_library_impl_, ns), key)(::opforge::Library&);     \
  static const ::opforge::detail::LibraryInit OPFORGE_UID_(opforge_library_impl_, __LINE__)(           \
      OPFORGE_DETAIL_IMPL_ARGS_(ns, key), &OPFORGE_PP_CAT(OPFORGE_PP_CAT(opforge_library_impl_, ns), key), \
      __FILE__, __LINE__);                                                                              \
  void OPFORGE_PP_CAT(OPFORGE_PP_CAT(opforge_library_impl_, ns), key)(::opforge::Library & m)
