// Stub of CANN's exe_graph/runtime/tiling_parse_context.h: only named by OP_ADD in OP_TILING_LIB mode (the
// compile-info parse hook, which OP_ADD sets to a no-op).
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_TILING_PARSE_CONTEXT_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_TILING_PARSE_CONTEXT_H_

#include "exe_graph/runtime/extended_kernel_context.h"

namespace gert {
class TilingParseContext : public ExtendedKernelContext {};
}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_TILING_PARSE_CONTEXT_H_
