// Stub of CANN's exe_graph/runtime/infer_datatype_context.h (hicann/metadef inc/external/exe_graph/runtime/
// infer_datatype_context.h).
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_INFER_DATATYPE_CONTEXT_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_INFER_DATATYPE_CONTEXT_H_

#include "exe_graph/runtime/extended_kernel_context.h"
#include "graph/ge_error_codes.h"
#include "graph/types.h"

namespace gert {

class InferDataTypeContext : public ExtendedKernelContext {
public:
    ge::DataType GetInputDataType(const size_t index) const;
    ge::DataType GetOptionalInputDataType(const size_t ir_index) const;
    ge::DataType GetRequiredInputDataType(const size_t ir_index) const;
    ge::DataType GetDynamicInputDataType(const size_t ir_index, const size_t relative_index) const;
    ge::DataType GetOutputDataType(const size_t index) const;
    ge::graphStatus SetOutputDataType(const size_t index, const ge::DataType datatype);
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_INFER_DATATYPE_CONTEXT_H_
