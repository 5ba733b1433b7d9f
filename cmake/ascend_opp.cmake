# Shared settings of the fused_lce custom OPP package (csrc/ascend/CMakeLists.txt includes this).
# Vendor "fused_lce": npu_op_package(... CONFIG VENDOR_NAME) makes the package install to
# <install-path>/vendors/fused_lce, whose bin/set_env.bash (written by the package's install.sh when --install-path
# is given, asc-devkit cmake/asc/fwk_modules/scripts/install.sh) prepends that directory to ASCEND_CUSTOM_OPP_PATH --
# the place fused_lce.backends.npu.env looks for op_api/lib/libcust_opapi.so. Keep in sync with OPP_VENDOR in
# cmake/npu_build.py and fused_lce/backends/npu/env.py.
set(FUSED_LCE_OPP_VENDOR "fused_lce")
# Atlas A2 (910B) and A3 (910_93): the SoCs the op definitions AddConfig; override with
# -DFUSED_LCE_COMPUTE_UNITS="ascend910b" to build one part only. Names from ASC_VALID_SOC_LIST
# (asc-devkit cmake/asc/fwk_modules/config.cmake).
set(FUSED_LCE_COMPUTE_UNITS "ascend910b;ascend910_93" CACHE STRING "AI processor types to build kernels for")
