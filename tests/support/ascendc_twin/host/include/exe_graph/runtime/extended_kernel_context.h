// Stub of CANN's exe_graph/runtime/extended_kernel_context.h (hicann/metadef inc/external/exe_graph/runtime/
// extended_kernel_context.h): what every op_host context (tiling, shape and dtype inference) knows about its node.
// Index conventions as the real one: GetInputDesc(i) / GetOutputDesc(i) take *instance* indices (nullptr past the last
// instance), Get{Optional,Required,Dynamic}InputDesc(ir) take IR indices (nullptr for an absent optional input).
// The real methods are inline over a KernelContext value chain; here they are declared and implemented by the twin
// host runtime (src/host_runtime.cpp), which is what lets a test build contexts. Signatures match the real ones.
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_EXTENDED_KERNEL_CONTEXT_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_EXTENDED_KERNEL_CONTEXT_H_

#include <cstddef>

#include "exe_graph/runtime/compute_node_info.h"
#include "exe_graph/runtime/runtime_attrs.h"
#include "exe_graph/runtime/storage_shape.h"
#include "graph/types.h"

namespace gert {

struct TwinAccess;

class ExtendedKernelContext {
public:
    const CompileTimeTensorDesc* GetInputDesc(const size_t index) const;
    const CompileTimeTensorDesc* GetOptionalInputDesc(const size_t ir_index) const;
    const CompileTimeTensorDesc* GetRequiredInputDesc(const size_t ir_index) const;
    const CompileTimeTensorDesc* GetDynamicInputDesc(const size_t ir_index, const size_t relative_index) const;
    const CompileTimeTensorDesc* GetOutputDesc(const size_t index) const;
    const AnchorInstanceInfo* GetIrInputInstanceInfo(const size_t ir_index) const;
    const AnchorInstanceInfo* GetIrOutputInstanceInfo(const size_t ir_index) const;
    size_t GetComputeNodeInputNum() const;
    size_t GetComputeNodeOutputNum() const;
    const RuntimeAttrs* GetAttrs() const;
    const ge::char_t* GetNodeType() const;
    const ge::char_t* GetNodeName() const;

protected:
    ExtendedKernelContext() = default;
    // instance-indexed input shape (nullptr past the last instance) and the IR-indexed variant
    const StorageShape* TwinInputShape(size_t index) const;
    const StorageShape* TwinDynamicInputShape(size_t ir_index, size_t relative_index) const;
    const void* twin_ = nullptr;

private:
    friend struct TwinAccess;
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_EXTENDED_KERNEL_CONTEXT_H_
