// Stub of CANN's graph/ge_error_codes.h -> graph/error_codes.h (hicann/metadef inc/external/graph/error_codes.h):
// ge::graphStatus is a uint32_t, GRAPH_SUCCESS 0, GRAPH_FAILED 0xFFFFFFFF.
#ifndef FUSED_LCE_TWIN_HOST_GRAPH_GE_ERROR_CODES_H_
#define FUSED_LCE_TWIN_HOST_GRAPH_GE_ERROR_CODES_H_

#include <cstdint>

namespace ge {
using graphStatus = uint32_t;
const graphStatus GRAPH_FAILED = 0xFFFFFFFF;
const graphStatus GRAPH_SUCCESS = 0;
using Status = uint32_t;
const Status SUCCESS = 0;
const Status FAILED = 0xFFFFFFFF;
}  // namespace ge

#endif  // FUSED_LCE_TWIN_HOST_GRAPH_GE_ERROR_CODES_H_
