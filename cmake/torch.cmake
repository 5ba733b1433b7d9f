# Finding torch for C++ code that is loaded into Python next to it (fused_lce._C, the NPU host adapter).
#
#   list(APPEND CMAKE_MODULE_PATH <repo>/cmake)
#   include(torch)
#   fused_lce_add_torch_extension(<target> <python module, e.g. fused_lce._C> SOURCES ... [INCLUDES ...])
#
# The Python interpreter (Python3_EXECUTABLE, or the one found on PATH / in the active virtualenv) is asked for
# the installed torch's CMake prefix, version and OpenMP use, so the extension is compiled against exactly the
# torch that will import it -- the same contract as `pip install --no-build-isolation`. Sets FUSED_LCE_TORCH_VERSION,
# TORCH_LIBRARIES / TORCH_INCLUDE_DIRS / TORCH_CXX_FLAGS (from TorchConfig.cmake) and TORCH_PYTHON_LIBRARY.
include_guard(GLOBAL)

find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
          "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__.split('+')[0]); print(int(torch.backends.openmp.is_available()))"
  OUTPUT_VARIABLE _fused_lce_torch_info
  RESULT_VARIABLE _fused_lce_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _fused_lce_torch_rc EQUAL 0)
  message(FATAL_ERROR "fused_lce: torch is not importable by ${Python3_EXECUTABLE}; install torch first")
endif()
string(REPLACE "\n" ";" _fused_lce_torch_info "${_fused_lce_torch_info}")
list(GET _fused_lce_torch_info 0 _fused_lce_torch_prefix)
list(GET _fused_lce_torch_info 1 FUSED_LCE_TORCH_VERSION)
list(GET _fused_lce_torch_info 2 _fused_lce_torch_openmp)
list(PREPEND CMAKE_PREFIX_PATH "${_fused_lce_torch_prefix}")

# TorchConfig pulls in Caffe2's CUDA/XPU probes when the installed torch has them; a CPU wheel needs none.
find_package(Torch REQUIRED)
find_library(TORCH_PYTHON_LIBRARY torch_python PATHS "${TORCH_INSTALL_PREFIX}/lib" REQUIRED NO_DEFAULT_PATH)
if(_fused_lce_torch_openmp)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
endif()
message(STATUS "fused_lce: torch ${FUSED_LCE_TORCH_VERSION} at ${TORCH_INSTALL_PREFIX} (OpenMP: ${_fused_lce_torch_openmp})")

# A Python extension module linked against torch: the flags torch.utils.cpp_extension would use (C++ standard of
# the torch release, its ABI flags, TORCH_EXTENSION_NAME), -O3, and OpenMP when torch's at::parallel_for uses it
# (its OpenMP code is inline in the headers, so the extension must be compiled with it).
function(fused_lce_add_torch_extension target module)
  cmake_parse_arguments(ARG "" "" "SOURCES;INCLUDES" ${ARGN})
  string(REGEX REPLACE ".*\\." "" _short "${module}")
  Python3_add_library(${target} MODULE WITH_SOABI ${ARG_SOURCES})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME "${_short}" CXX_EXTENSIONS OFF)
  if(FUSED_LCE_TORCH_VERSION VERSION_GREATER_EQUAL 2.10)
    target_compile_features(${target} PRIVATE cxx_std_20)
  else()
    target_compile_features(${target} PRIVATE cxx_std_17)
  endif()
  separate_arguments(_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(${target} PRIVATE ${_torch_flags} $<$<CONFIG:Release>:-O3>)
  target_compile_definitions(${target} PRIVATE TORCH_EXTENSION_NAME=${_short} TORCH_API_INCLUDE_EXTENSION_H)
  target_include_directories(${target} PRIVATE ${ARG_INCLUDES} ${TORCH_INCLUDE_DIRS})
  target_link_libraries(${target} PRIVATE ${TORCH_LIBRARIES} ${TORCH_PYTHON_LIBRARY})
  if(_fused_lce_torch_openmp)
    target_link_libraries(${target} PRIVATE OpenMP::OpenMP_CXX)
  endif()
endfunction()
