# find_package(opforge) for C++ kernel libraries:
#
#   find_package(opforge REQUIRED)        # CMAKE_PREFIX_PATH: python -c "import opforge; print(opforge.cmake_prefix_path)"
#   opforge_add_library(myops SOURCES myops.cc myops.cu)          # or:
#   add_library(myops SHARED myops.cc)
#   target_link_libraries(myops PRIVATE opforge::opforge)
#
# torch is located through the Python that has opforge installed (the one
# that will load the library); set Python_EXECUTABLE to choose it.
get_filename_component(_opforge_root "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
include("${CMAKE_CURRENT_LIST_DIR}/OpforgeTorch.cmake")
opforge_find_torch()
# The torch this opforge was built against (written at build time).
include("${CMAKE_CURRENT_LIST_DIR}/opforgeTorchVersion.cmake" OPTIONAL)
if(DEFINED opforge_TORCH_VERSION)
  opforge_check_torch_version("${opforge_TORCH_VERSION}" "${OPFORGE_TORCH_VERSION}")
endif()

if(NOT TARGET opforge::opforge)
  add_library(opforge::core SHARED IMPORTED)
  set_target_properties(opforge::core PROPERTIES
    IMPORTED_LOCATION "${_opforge_root}/lib/libopforge_core.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_opforge_root}/include"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_opforge_root}/include"  # even under NO_SYSTEM_FROM_IMPORTED
    INTERFACE_COMPILE_FEATURES cxx_std_17)
  add_library(opforge::torch SHARED IMPORTED)
  set_target_properties(opforge::torch PROPERTIES
    IMPORTED_LOCATION "${_opforge_root}/lib/libopforge_torch.so"
    INTERFACE_LINK_LIBRARIES "opforge::core;opforge_torch_deps")
  add_library(opforge::opforge INTERFACE IMPORTED)
  set_target_properties(opforge::opforge PROPERTIES INTERFACE_LINK_LIBRARIES "opforge::torch")
endif()
set(opforge_LIBRARY_DIR "${_opforge_root}/lib")
set(opforge_INCLUDE_DIR "${_opforge_root}/include")
# The C ABI version these headers speak (opforge/abi.h), for a library's
# record of what it needs at run time.
file(STRINGS "${opforge_INCLUDE_DIR}/opforge/abi.h" _abi_line REGEX "^#define OPFORGE_ABI_VERSION ")
string(REGEX REPLACE "^#define OPFORGE_ABI_VERSION ([0-9]+).*" "\\1" opforge_ABI_VERSION "${_abi_line}")
include("${CMAKE_CURRENT_LIST_DIR}/OpforgeLibrary.cmake")
set(opforge_FOUND TRUE)
