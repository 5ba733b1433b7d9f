// Stub of CANN's tiling/platform/platform_ascendc.h (asc-devkit include/utils/tiling/platform/platform_ascendc.h):
// declarations as the real header (enumerator order and values of CoreMemType / SocVersion included). The twin host
// runtime implements the methods over a synthetic fe::PlatFormInfos with the semantics of asc-devkit
// impl/utils/tiling/platform/platform_ascendc.cpp: on SocVersion::ASCEND910B (Ascend910B* and Ascend910_93)
// GetCoreMemSize(UB / L1) returns the physical size minus 256 bytes reserved for the Matmul client (kfc), UB also
// minus what ReserveLocalMemory took; GetLibApiWorkSpaceSize is 16 MiB on DAV_2201 (2 MiB on older parts).
#ifndef FUSED_LCE_TWIN_HOST_TILING_PLATFORM_ASCENDC_H_
#define FUSED_LCE_TWIN_HOST_TILING_PLATFORM_ASCENDC_H_

#include <cstdint>
#include <mutex>

#include "platform/soc_spec.h"

namespace fe {
class PlatFormInfos;
}  // namespace fe

namespace platform_ascendc {

enum class CoreMemType { L0_A = 0, L0_B = 1, L0_C = 2, L1 = 3, L2 = 4, UB = 5, HBM = 6, FB = 7, BT = 8, RESERVED };

enum class SocVersion {
    ASCEND910 = 0,
    ASCEND910B,
    ASCEND310P,
    ASCEND310B,
    ASCEND950,
    ASCEND910_55,
    ASCEND910_95 = ASCEND950,
    AS31XM1,
    ASCEND031,
    ASCEND035,
    ASCEND310,
    ASCEND610,
    ASCEND610Lite,
    ASCEND910_93,
    BS9SX1A,
    BS9SX2A,
    HI3796CV300CS,
    HI3796CV300ES,
    MC61AM21A,
    MC62,
    SD3403,
    KIRINX90,
    KIRIN9030,
    MC32DM11A,
    ASCEND350,
    RESERVED_VERSION = 99999
};

enum class ReservedSize { RESERVED_SIZE_8K, RESERVED_SIZE_16K, RESERVED_SIZE_32K };

class PlatformAscendC {
public:
    PlatformAscendC() = delete;
    ~PlatformAscendC() = default;
    explicit PlatformAscendC(fe::PlatFormInfos* platformInfo) : platformInfo_(platformInfo) {}
    uint32_t GetCoreNum(void) const;
    uint32_t GetCoreNumAic(void) const;
    uint32_t GetCoreNumAiv(void) const;
    uint32_t GetCoreNumVector(void) const;
    uint32_t CalcTschBlockDim(uint32_t sliceNum, uint32_t aicCoreNum, uint32_t aivCoreNum) const;
    uint32_t GetLibApiWorkSpaceSize(void) const;
    void GetCoreMemSize(const CoreMemType& memType, uint64_t& size) const;
    void ReserveLocalMemory(ReservedSize size);
    SocVersion GetSocVersion(void) const;
    NpuArch GetCurNpuArch(void) const;

private:
    fe::PlatFormInfos* platformInfo_;
    fe::PlatFormInfos* GetPlatFormInfo(void) const;
    uint32_t reservedMemSize_ = 0;
};

}  // namespace platform_ascendc

#endif  // FUSED_LCE_TWIN_HOST_TILING_PLATFORM_ASCENDC_H_
