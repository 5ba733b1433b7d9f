# FindCANN: locate an installed CANN toolkit (Ascend NPU) for the custom OPP package in csrc/ascend.
#
# Looks at, in order: -DCANN_ROOT=..., $ASCEND_HOME_PATH (set by the toolkit's set_env.sh), $ASCEND_TOOLKIT_HOME,
# /usr/local/Ascend/cann, /usr/local/Ascend/ascend-toolkit/latest. A root qualifies when it has what the OPP build
# uses: include/register/op_def_registry.h (opbuild compiles the op_host sources with -I<root>/include) and
# tools/opbuild/op_build (run by npu_op_code_gen, asc-devkit cmake/asc/fwk_modules/func.cmake).
# Sets CANN_FOUND, CANN_ROOT, CANN_VERSION (from version.cfg / version.info when present), ASCEND_CANN_PACKAGE_PATH
# (read by the ASC package's config.cmake) and puts the directory holding asc-config.cmake
# (<root>/<arch>-linux/lib64/cmake, asc-devkit cmake/CMakeLists.txt) on CMAKE_PREFIX_PATH for find_package(ASC).
# ASCEND_HOME_PATH must be set in the environment: asc-config.cmake stops without it, and the kernel compiler the
# build runs later is only on PATH after set_env.sh.
# Status: checked by reading against asc-devkit; never run here (no CANN toolkit on this host).
include(FindPackageHandleStandardArgs)

set(_cann_hints "")
foreach(_c IN ITEMS "${CANN_ROOT}" "$ENV{ASCEND_HOME_PATH}" "$ENV{ASCEND_TOOLKIT_HOME}"
                    "/usr/local/Ascend/cann" "/usr/local/Ascend/ascend-toolkit/latest")
  if(_c AND EXISTS "${_c}")
    list(APPEND _cann_hints "${_c}")
  endif()
endforeach()

find_path(CANN_ROOT
  NAMES include/register/op_def_registry.h
  HINTS ${_cann_hints}
  NO_DEFAULT_PATH)

set(_cann_reason "")
if(CANN_ROOT)
  if(NOT EXISTS "${CANN_ROOT}/tools/opbuild/op_build")
    set(_cann_reason "${CANN_ROOT} has no tools/opbuild/op_build (needed to generate the aclnn API)")
  endif()
  if(NOT DEFINED ENV{ASCEND_HOME_PATH})
    set(_cann_reason "ASCEND_HOME_PATH is not set: source ${CANN_ROOT}/set_env.sh first")
  endif()
  foreach(_f IN ITEMS "${CANN_ROOT}/version.cfg" "${CANN_ROOT}/version.info"
                      "${CANN_ROOT}/compiler/version.info" "${CANN_ROOT}/runtime/version.info")
    if(NOT CANN_VERSION AND EXISTS "${_f}")
      file(STRINGS "${_f}" _v REGEX "[Vv]ersion=")
      if(_v)
        list(GET _v 0 _v)
        string(REGEX REPLACE ".*[Vv]ersion=[\" ]*([0-9A-Za-z.]+).*" "\\1" CANN_VERSION "${_v}")
      endif()
    endif()
  endforeach()
  set(ASCEND_CANN_PACKAGE_PATH "${CANN_ROOT}" CACHE PATH "CANN toolkit root used by the ASC CMake package")
  find_path(CANN_ASC_CONFIG_DIR
    NAMES asc-config.cmake
    HINTS "${CANN_ROOT}/${CMAKE_SYSTEM_PROCESSOR}-linux/lib64/cmake" "${CANN_ROOT}/lib64/cmake"
          "${CANN_ROOT}/compiler/lib64/cmake"
    NO_DEFAULT_PATH)
  if(NOT CANN_ASC_CONFIG_DIR)  # unknown layout: search the toolkit once
    file(GLOB_RECURSE _asc_cfg LIST_DIRECTORIES false "${CANN_ROOT}/*/asc-config.cmake")
    if(_asc_cfg)
      list(GET _asc_cfg 0 _asc_cfg)
      get_filename_component(_d "${_asc_cfg}" DIRECTORY)
      set(CANN_ASC_CONFIG_DIR "${_d}" CACHE PATH "directory of the toolkit's asc-config.cmake" FORCE)
    endif()
  endif()
  if(CANN_ASC_CONFIG_DIR)
    list(PREPEND CMAKE_PREFIX_PATH "${CANN_ASC_CONFIG_DIR}")
  elseif(NOT _cann_reason)
    set(_cann_reason "no asc-config.cmake under ${CANN_ROOT} (the ASC CMake package of asc-devkit)")
  endif()
else()
  set(_cann_reason "no include/register/op_def_registry.h under any of: ${_cann_hints}")
endif()

if(_cann_reason)
  set(_cann_ok "")  # fails the REQUIRED_VARS check below with the reason
else()
  set(_cann_ok TRUE)
endif()
find_package_handle_standard_args(CANN
  REQUIRED_VARS CANN_ROOT _cann_ok
  VERSION_VAR CANN_VERSION
  REASON_FAILURE_MESSAGE "${_cann_reason}")
mark_as_advanced(CANN_ROOT CANN_ASC_CONFIG_DIR)
