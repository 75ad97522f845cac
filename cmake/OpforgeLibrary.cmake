# opforge_add_library: a C++/CUDA kernel library built against the installed
# torch and opforge (docs/cpp_ops.md#building).
#
#   find_package(opforge REQUIRED)
#   opforge_add_library(kernels SOURCES ops.cc norm.cu)                    # libtorch's C++ API, this torch only
#   opforge_add_library(kernels STABLE SOURCES ops.cc norm.cu)             # torch's stable ABI, torch >= 2.10
#   opforge_add_library(kernels STABLE TORCH_TARGET_VERSION 2.12 SOURCES ...)
#
# CUDA sources (.cu) need CUDA enabled first (project(... LANGUAGES CXX CUDA),
# or enable_language(CUDA)). Their architectures: CUDA_ARCHITECTURES if
# given, else CMAKE_CUDA_ARCHITECTURES (or CUDAARCHS) if you set it, else the
# TORCH_CUDA_ARCH_LIST environment variable ("8.0;9.0+PTX" -> 80-real;90),
# else the GPUs of this machine ("native"). Sources are compiled with OPFORGE_WITH_CUDA=1 when the
# library has CUDA sources, so registrations can add CUDA kernels.
#
# RPATH: the library finds opforge's libraries and torch's in a wheel's layout
# (site-packages/<pkg>/, beside opforge/ and torch/) and, in the build tree,
# where they are now.
#
# Optimisation: with no build type (a plain `cmake -S . -B build`, which CMake
# compiles at -O0), the library is compiled with Release's flags (-O3
# -DNDEBUG), as scikit-build-core builds by default. A build type you give
# (CMAKE_BUILD_TYPE, a multi-config generator's configurations) or an -O in
# CMAKE_CXX_FLAGS is kept.
#
# opforge's headers are a system include (-isystem), like torch's: your
# warning flags apply to your code only.

set(_OPFORGE_LIBRARY_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")

# "2.10" -> "0x020A000000000000": torch's TORCH_TARGET_VERSION encoding.
function(_opforge_torch_version_hex version out)
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _m "${version}")
  if(NOT _m)
    message(FATAL_ERROR "opforge_add_library: TORCH_TARGET_VERSION '${version}' is not major.minor (e.g. 2.10)")
  endif()
  math(EXPR _v "(${CMAKE_MATCH_1} << 8) | ${CMAKE_MATCH_2}" OUTPUT_FORMAT HEXADECIMAL)
  string(SUBSTRING "${_v}" 2 -1 _digits)
  string(LENGTH "${_digits}" _len)
  while(_len LESS 4)
    set(_digits "0${_digits}")
    string(LENGTH "${_digits}" _len)
  endwhile()
  set(${out} "0x${_digits}000000000000" PARENT_SCOPE)
endfunction()

function(_opforge_cuda_architectures out given)
  # CMake fills CMAKE_CUDA_ARCHITECTURES with the compiler's default when
  # nobody set it; only a value someone chose counts.
  set(_chosen "${CMAKE_CUDA_ARCHITECTURES}")
  if(_chosen STREQUAL "${CMAKE_CUDA_ARCHITECTURES_DEFAULT}" AND NOT DEFINED ENV{CUDAARCHS})
    set(_chosen "")
  endif()
  if(given)
    set(${out} "${given}" PARENT_SCOPE)
  elseif(_chosen)
    set(${out} "${_chosen}" PARENT_SCOPE)
  elseif(DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
    string(REPLACE " " ";" _list "$ENV{TORCH_CUDA_ARCH_LIST}")
    set(_archs "")
    foreach(_a IN LISTS _list)
      string(REGEX MATCH "^([0-9]+)\\.([0-9]+)([a-z]?)(\\+PTX)?$" _m "${_a}")
      if(NOT _m)
        message(FATAL_ERROR "opforge_add_library: TORCH_CUDA_ARCH_LIST entry '${_a}' is not like 8.0, 9.0a or 9.0+PTX")
      endif()
      set(_n "${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
      if(CMAKE_MATCH_4)
        list(APPEND _archs "${_n}")
      else()
        list(APPEND _archs "${_n}-real")
      endif()
    endforeach()
    set(${out} "${_archs}" PARENT_SCOPE)
  else()
    set(${out} "native" PARENT_SCOPE)
  endif()
endfunction()

# Release's flags for `name` when nothing chose an optimisation level; says
# so once per configuration.
function(_opforge_default_optimisation name)
  get_property(_multi GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
  if(_multi OR CMAKE_BUILD_TYPE)
    return()
  endif()
  set(_applied "")
  foreach(_lang CXX CUDA)
    if(CMAKE_${_lang}_COMPILER_LOADED AND NOT CMAKE_${_lang}_FLAGS MATCHES "(^| )-O")
      separate_arguments(_flags UNIX_COMMAND "${CMAKE_${_lang}_FLAGS_RELEASE}")
      target_compile_options(${name} PRIVATE "$<$<COMPILE_LANGUAGE:${_lang}>:${_flags}>")
      list(APPEND _applied "${_lang}: ${CMAKE_${_lang}_FLAGS_RELEASE}")
    endif()
  endforeach()
  get_property(_said GLOBAL PROPERTY _OPFORGE_SAID_OPTIMISATION)
  if(_applied AND NOT _said)
    set_property(GLOBAL PROPERTY _OPFORGE_SAID_OPTIMISATION TRUE)
    list(JOIN _applied ", " _applied)
    message(STATUS "opforge: no CMAKE_BUILD_TYPE given, so opforge_add_library compiles with Release's flags "
                   "(${_applied}); pass -DCMAKE_BUILD_TYPE=... to choose another")
  endif()
endfunction()

function(opforge_add_library name)
  cmake_parse_arguments(ARG "STABLE" "TORCH_TARGET_VERSION" "SOURCES;CUDA_ARCHITECTURES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "opforge_add_library(${name}): give the sources, e.g. SOURCES ops.cc")
  endif()
  if(ARG_TORCH_TARGET_VERSION AND NOT ARG_STABLE)
    message(FATAL_ERROR "opforge_add_library(${name}): TORCH_TARGET_VERSION applies to STABLE libraries only")
  endif()
  set(_cuda_sources ${ARG_SOURCES})
  list(FILTER _cuda_sources INCLUDE REGEX "\\.cu$")
  if(_cuda_sources AND NOT CMAKE_CUDA_COMPILER_LOADED)
    message(FATAL_ERROR "opforge_add_library(${name}): CUDA sources given but CUDA is not enabled; add CUDA to "
                        "project(... LANGUAGES CXX CUDA) or call enable_language(CUDA) before.")
  endif()

  add_library(${name} SHARED ${ARG_SOURCES})
  opforge_private_static_libs(${name})
  _opforge_default_optimisation(${name})
  target_include_directories(${name} SYSTEM PRIVATE "${opforge_INCLUDE_DIR}")
  if(ARG_STABLE)
    if(NOT ARG_TORCH_TARGET_VERSION)
      set(ARG_TORCH_TARGET_VERSION 2.10)
    endif()
    if(ARG_TORCH_TARGET_VERSION VERSION_LESS 2.10)
      message(FATAL_ERROR "opforge_add_library(${name}): stable-ABI libraries target torch 2.10 or later "
                          "(its stable ABI gained lists, strings and versioning in 2.10)")
    endif()
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" _building "${OPFORGE_TORCH_VERSION}")
    if(_building VERSION_LESS ARG_TORCH_TARGET_VERSION)
      message(FATAL_ERROR "opforge_add_library(${name}): a stable-ABI library targeting torch "
                          "${ARG_TORCH_TARGET_VERSION} builds against torch ${ARG_TORCH_TARGET_VERSION} or later "
                          "(the stable headers of its target), but this is torch ${OPFORGE_TORCH_VERSION}; build it "
                          "with a later torch, and the library loads on every torch from ${ARG_TORCH_TARGET_VERSION} on")
    endif()
    _opforge_torch_version_hex("${ARG_TORCH_TARGET_VERSION}" _hex)
    # Only torch's headers: the stable C shims resolve against the libtorch
    # the process has loaded, and opforge's core is found at load time.
    target_include_directories(${name} SYSTEM PRIVATE "${OPFORGE_TORCH_DIR}/include")
    target_compile_definitions(${name} PRIVATE OPFORGE_STABLE_ABI "TORCH_TARGET_VERSION=${_hex}ULL")
    if(OPFORGE_TORCH_VERSION VERSION_GREATER_EQUAL 2.14)
      target_compile_features(${name} PRIVATE cxx_std_20)  # the headers' own standard
    else()
      target_compile_features(${name} PRIVATE cxx_std_17)
    endif()
    # torch's C shims live in libtorch_cpu (libtorch_cuda for CUDA's), whose
    # unversioned names every torch release keeps.
    target_link_libraries(${name} PRIVATE ${CMAKE_DL_LIBS} "${OPFORGE_TORCH_DIR}/lib/libtorch_cpu.so")
    if(_cuda_sources AND EXISTS "${OPFORGE_TORCH_DIR}/lib/libtorch_cuda.so")
      target_link_libraries(${name} PRIVATE "${OPFORGE_TORCH_DIR}/lib/libtorch_cuda.so")
    endif()
    set_target_properties(${name} PROPERTIES
      INSTALL_RPATH "$ORIGIN/../opforge/lib;$ORIGIN/../torch/lib"
      BUILD_RPATH "${opforge_LIBRARY_DIR};${OPFORGE_TORCH_DIR}/lib")
    if(_cuda_sources)
      target_compile_definitions(${name} PRIVATE USE_CUDA)
    endif()
  else()
    target_link_libraries(${name} PRIVATE opforge::opforge)
    set_target_properties(${name} PROPERTIES
      INSTALL_RPATH "$ORIGIN/../opforge/lib;$ORIGIN/../torch/lib"
      BUILD_RPATH "${opforge_LIBRARY_DIR};${OPFORGE_TORCH_DIR}/lib")
    if(_cuda_sources)
      foreach(_lib c10_cuda torch_cuda)
        if(EXISTS "${OPFORGE_TORCH_DIR}/lib/lib${_lib}.so")
          target_link_libraries(${name} PRIVATE "${OPFORGE_TORCH_DIR}/lib/lib${_lib}.so")
        endif()
      endforeach()
    endif()
  endif()
  if(_cuda_sources)
    find_package(CUDAToolkit REQUIRED)
    target_link_libraries(${name} PRIVATE CUDA::cudart)
    _opforge_cuda_architectures(_archs "${ARG_CUDA_ARCHITECTURES}")
    set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES "${_archs}")
    target_compile_definitions(${name} PRIVATE OPFORGE_WITH_CUDA=1)
    # The flags torch's own extensions build CUDA with: torch's half types
    # bring their own operators.
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:
      -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
      -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr>)
  endif()
endfunction()
