// Stub of CANN's exe_graph/runtime/infer_shape_context.h (hicann/metadef inc/external/exe_graph/runtime/
// infer_shape_context.h): GetInputShape(i) takes an instance index, Get{Optional,Required}InputShape(ir) IR indices.
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_INFER_SHAPE_CONTEXT_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_INFER_SHAPE_CONTEXT_H_

#include "exe_graph/runtime/extended_kernel_context.h"
#include "exe_graph/runtime/shape.h"

namespace gert {

class InferShapeContext : public ExtendedKernelContext {
public:
    const Shape* GetInputShape(const size_t index) const;
    const Shape* GetOptionalInputShape(const size_t ir_index) const;
    const Shape* GetRequiredInputShape(const size_t ir_index) const;
    const Shape* GetDynamicInputShape(const size_t ir_index, const size_t relative_index) const;
    Shape* GetOutputShape(const size_t index);
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_INFER_SHAPE_CONTEXT_H_
