# Locates the installed torch through the Python that will run it, without
# torch's own CMake config (which drags in CUDA discovery).
#
# Defines the interface target opforge_torch_deps when torch is found.
function(opforge_find_torch)
  if(TARGET opforge_torch_deps)
    return()
  endif()
  if(NOT Python_EXECUTABLE)
    find_package(Python 3.9 COMPONENTS Interpreter REQUIRED)
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__); print(torch.version.cuda or '')"
    OUTPUT_VARIABLE _out RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "opforge: torch is not importable from ${Python_EXECUTABLE}; install torch first")
  endif()
  string(REPLACE "\n" ";" _out "${_out}")
  list(GET _out 0 _torch_dir)
  list(GET _out 1 _abi)
  list(GET _out 2 _version)
  list(LENGTH _out _n)
  set(_cuda "")
  if(_n GREATER 3)
    list(GET _out 3 _cuda)
  endif()
  message(STATUS "opforge: building against torch ${_version} at ${_torch_dir}")
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" _major_minor "${_version}")
  add_library(opforge_torch_deps INTERFACE)
  # torch 2.14 and later use C++20 in their headers (concepts, operator<=>);
  # whatever includes them, a user's kernel library too, compiles as C++20.
  if(_major_minor VERSION_GREATER_EQUAL 2.14)
    target_compile_features(opforge_torch_deps INTERFACE cxx_std_20)
  endif()
  target_include_directories(opforge_torch_deps SYSTEM INTERFACE
    "${_torch_dir}/include"
    "${_torch_dir}/include/torch/csrc/api/include")
  target_compile_definitions(opforge_torch_deps INTERFACE _GLIBCXX_USE_CXX11_ABI=${_abi})
  target_link_libraries(opforge_torch_deps INTERFACE
    "${_torch_dir}/lib/libc10.so"
    "${_torch_dir}/lib/libtorch_cpu.so"
    "${_torch_dir}/lib/libtorch.so")
  set(OPFORGE_TORCH_DIR "${_torch_dir}" PARENT_SCOPE)
  set(OPFORGE_TORCH_DIR "${_torch_dir}" CACHE INTERNAL "")
  set(OPFORGE_TORCH_VERSION "${_version}" PARENT_SCOPE)
  set(OPFORGE_TORCH_VERSION "${_version}" CACHE INTERNAL "")
  # The CUDA version torch was built with ("13.0"), empty for a CPU build.
  set(OPFORGE_TORCH_CUDA "${_cuda}" PARENT_SCOPE)
  set(OPFORGE_TORCH_CUDA "${_cuda}" CACHE INTERNAL "")
endfunction()

# Keeps whatever a shared library links statically private to it. Toolchains
# that link the C++ runtime statically (-static-libstdc++, or a devtoolset's
# libstdc++_nonshared.a) otherwise export its symbols, and another library
# in the process then binds to this copy of, say, std::ostream's number
# formatting while the stream's locale belongs to another copy: a crash on
# the first error message that prints an integer.
function(opforge_private_static_libs target)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    target_link_options(${target} PRIVATE "LINKER:--exclude-libs,ALL")
  endif()
endfunction()

# Fails configuration when the torch found is not of the release line
# (major.minor) opforge was built against: torch keeps no C++ ABI across
# minor releases (docs/versions.md). Versions: "2.13.0+cpu", "2.15.0".
function(opforge_check_torch_version built found)
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" _built_line "${built}")
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" _found_line "${found}")
  if(NOT _built_line OR NOT _built_line VERSION_EQUAL _found_line)
    message(FATAL_ERROR "opforge was built against torch ${built} but ${Python_EXECUTABLE} has torch ${found}; "
      "rebuild opforge for this torch (docs/versions.md) or set Python_EXECUTABLE to the Python it was built for.")
  endif()
endfunction()
