# Shared settings of the fused_lce custom OPP package (csrc/ascend/CMakeLists.txt includes this).
# Vendor "fused_lce": the package installs to <prefix>/vendors/fused_lce, whose bin/set_env.bash appends that
# directory to ASCEND_CUSTOM_OPP_PATH -- the place fused_lce.backends.npu_ascendc looks for libcust_opapi.so.
set(FUSED_LCE_OPP_VENDOR "fused_lce")
# Atlas A2 (910B) and A3; override with -DFUSED_LCE_COMPUTE_UNITS="ascend910b" to build one part only
set(FUSED_LCE_COMPUTE_UNITS "ascend910b;ascend910_93" CACHE STRING "AI processor types to build kernels for")
# The tiling header shared with host code and the g++ unit tests
get_filename_component(FUSED_LCE_REPO_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(FUSED_LCE_TILING_INCLUDE "${FUSED_LCE_REPO_ROOT}/csrc/include")
