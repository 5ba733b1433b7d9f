// Stub of CANN's graph/types.h (the host twin): the subset of ge::DataType / ge::Format
// the fused_lce op_host code names. Modelled on hicann/metadef inc/external/graph/types.h and c_types.h (enumerator
// values copied as numbers so a tiling that stores them behaves the same); the real enums have many more members.
#ifndef FUSED_LCE_TWIN_HOST_GRAPH_TYPES_H_
#define FUSED_LCE_TWIN_HOST_GRAPH_TYPES_H_

#include <cstdint>

#include "graph/ge_error_codes.h"

namespace ge {

using char_t = char;

enum DataType {
    DT_FLOAT = 0,
    DT_FLOAT16 = 1,
    DT_INT8 = 2,
    DT_INT32 = 3,
    DT_UINT8 = 4,
    DT_INT16 = 6,
    DT_UINT16 = 7,
    DT_UINT32 = 8,
    DT_INT64 = 9,
    DT_UINT64 = 10,
    DT_DOUBLE = 11,
    DT_BOOL = 12,
    DT_BF16 = 27,
    DT_UNDEFINED = 28,
};

enum Format {
    FORMAT_NCHW = 0,
    FORMAT_NHWC = 1,
    FORMAT_ND = 2,
    FORMAT_RESERVED = 40,
};

}  // namespace ge

#endif  // FUSED_LCE_TWIN_HOST_GRAPH_TYPES_H_
