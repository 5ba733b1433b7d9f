// Stub of CANN's platform/soc_spec.h: only the NpuArch enum named by platform_ascendc.h (DAV_2201 = Atlas A2/A3,
// the architecture whose GetLibApiWorkSpaceSize is 16 MiB, asc-devkit impl/utils/tiling/platform/platform_ascendc.cpp).
// Values are the architecture numbers; the real enum has more members.
#ifndef FUSED_LCE_TWIN_HOST_PLATFORM_SOC_SPEC_H_
#define FUSED_LCE_TWIN_HOST_PLATFORM_SOC_SPEC_H_

#include <cstdint>

enum class NpuArch : uint32_t {
    DAV_1001 = 1001,
    DAV_2002 = 2002,
    DAV_2201 = 2201,
    DAV_3002 = 3002,
    DAV_3510 = 3510,
    DAV_RESV = 0xFFFFFFFFu,
};

#endif  // FUSED_LCE_TWIN_HOST_PLATFORM_SOC_SPEC_H_
