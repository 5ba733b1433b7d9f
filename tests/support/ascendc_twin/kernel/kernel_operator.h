// CPU twin of the AscendC API: the header kernels include. Selecting this directory with -I (instead of the CANN
// include path) compiles an AscendC kernel source unchanged with g++, the way AscendC's CPU-debug mode does; see
// twin/runtime.h for what the twin models and checks, and docs/npu-status.md for what it proves.
#ifndef FUSED_LCE_TWIN_KERNEL_OPERATOR_H_
#define FUSED_LCE_TWIN_KERNEL_OPERATOR_H_

#define FUSED_LCE_ASCEND_TWIN 1

#include "twin/ops.h"

namespace AscendC {
// ---- kernel entry helpers -------------------------------------------------------------------------------------
// GetUserWorkspace / GetSysWorkSpacePtr: the framework passes one workspace, the library's system part first.
__aicore__ inline GM_ADDR GetSysWorkSpacePtr() { return twin::rt().sys_ws; }
__aicore__ inline GM_ADDR GetUserWorkspace(GM_ADDR workspace) {
    return workspace == nullptr ? nullptr : workspace + twin::rt().sys_ws_bytes;
}
}  // namespace AscendC
using AscendC::GetSysWorkSpacePtr;
using AscendC::GetTPipePtr;
using AscendC::GetUserWorkspace;

namespace twin {
inline void declare_kernel_type(int type) {
    Runtime& r = rt();
    const int want = type == AscendC::KERNEL_TYPE_MIX_AIC_1_2 ? 2 : type == AscendC::KERNEL_TYPE_MIX_AIC_1_1 ? 1 : 0;
    if (type != AscendC::KERNEL_TYPE_AIV_ONLY && type != AscendC::KERNEL_TYPE_MIX_AIC_1_2 &&
        type != AscendC::KERNEL_TYPE_MIX_AIC_1_1 && type != AscendC::KERNEL_TYPE_MIX_AIV_1_0)
        throw Error(format("twin ERROR [%s]: kernel type %d is not modelled", cur().name.c_str(), type));
    if (want != r.ratio)
        throw Error(format("twin ERROR [%s]: the kernel declares %d vector cores per cube core but was launched "
                           "with %d", cur().name.c_str(), want, r.ratio));
    cur().declared_type = type;
}
template <typename T>
inline void copy_tiling(T* dst, const void* src) {
    static_assert(std::is_trivially_copyable<T>::value, "tiling data must be trivially copyable");
    if (src == nullptr) throw Error("twin ERROR: null tiling pointer");
    std::memcpy(dst, src, sizeof(T));
}
}  // namespace twin

#define KERNEL_TASK_TYPE_DEFAULT(type) ::twin::declare_kernel_type(type)
#define KERNEL_TASK_TYPE(key, type) ::twin::declare_kernel_type(type)
// REGISTER_TILING_DEFAULT(T) names the tiling struct; GET_TILING_DATA(var, tiling) copies it out of GM.
#define REGISTER_TILING_DEFAULT(T) using TwinTilingType__ = T
#define GET_TILING_DATA(var, tiling) \
    TwinTilingType__ var;            \
    ::twin::copy_tiling(&var, tiling)
#define GET_TILING_DATA_WITH_STRUCT(T, var, tiling) \
    T var;                                          \
    ::twin::copy_tiling(&var, tiling)
#define ASCEND_IS_AIV (::twin::cur().kind == ::twin::Core::AIV)
#define ASCEND_IS_AIC (::twin::cur().kind == ::twin::Core::AIC)
#define ASCEND_IS_NOT_AIV (!ASCEND_IS_AIV)
#define ASCEND_IS_NOT_AIC (!ASCEND_IS_AIC)

#endif  // FUSED_LCE_TWIN_KERNEL_OPERATOR_H_
