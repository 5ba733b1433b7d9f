# FindCANN: locate an installed CANN toolkit (Ascend NPU) for the custom OPP package in csrc/ascend.
#
# Looks at, in order: -DCANN_ROOT=..., $ASCEND_HOME_PATH (set by the toolkit's set_env.sh), $ASCEND_TOOLKIT_HOME,
# /usr/local/Ascend/cann, /usr/local/Ascend/ascend-toolkit/latest.
# Sets CANN_FOUND, CANN_ROOT, CANN_VERSION (from the toolkit's version.cfg / version.info when present),
# ASCEND_CANN_PACKAGE_PATH (what the ASC CMake package expects) and prepends the directories that hold the
# toolkit's asc-config.cmake to CMAKE_PREFIX_PATH, so that find_package(ASC) works afterwards.
# Status: written, not run here (no CANN toolkit on this host).
include(FindPackageHandleStandardArgs)

set(_cann_hints "")
foreach(_c IN ITEMS "${CANN_ROOT}" "$ENV{ASCEND_HOME_PATH}" "$ENV{ASCEND_TOOLKIT_HOME}"
                    "/usr/local/Ascend/cann" "/usr/local/Ascend/ascend-toolkit/latest")
  if(_c AND EXISTS "${_c}")
    list(APPEND _cann_hints "${_c}")
  endif()
endforeach()

find_path(CANN_ROOT
  NAMES include/acl/acl.h
  HINTS ${_cann_hints}
  NO_DEFAULT_PATH)

if(CANN_ROOT)
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
  file(GLOB_RECURSE _asc_cfg LIST_DIRECTORIES false "${CANN_ROOT}/*/asc-config.cmake")
  foreach(_cfg IN LISTS _asc_cfg)
    get_filename_component(_d "${_cfg}" DIRECTORY)
    list(PREPEND CMAKE_PREFIX_PATH "${_d}")
  endforeach()
  list(PREPEND CMAKE_PREFIX_PATH "${CANN_ROOT}")
endif()

find_package_handle_standard_args(CANN
  REQUIRED_VARS CANN_ROOT
  VERSION_VAR CANN_VERSION)
mark_as_advanced(CANN_ROOT)
