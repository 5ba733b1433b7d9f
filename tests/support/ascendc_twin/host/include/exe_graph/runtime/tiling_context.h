// Stub of CANN's exe_graph/runtime/tiling_context.h (hicann/metadef inc/external/exe_graph/runtime/tiling_context.h).
// The outputs a tiling function sets (tiling key, block dim, atomic-clean flag, tiling data, workspace sizes, schedule
// mode) are recorded by the twin host runtime so tests can check them. Notes from the real header:
//   * SetBlockDim == SetSimdNumBlocks (kOutputSimdNumBlocks): the number of AI cores a MIX (cube + vector) kernel
//     is launched on;
//   * SetScheduleMode(1) = batch mode: the launch waits until it owns all its cores. Kernels that synchronise across
//     cores (SyncAll) need it, else two such kernels on different streams can each hold part of the cores and wait
//     for the rest forever (asc-devkit docs/zh/api/SIMD-API/.../核间同步/SyncAll.md, 约束说明);
//   * GetTilingData<T>() returns nullptr when sizeof(T) exceeds the buffer's capacity;
//   * GetWorkspaceSizes(n) returns nullptr when n exceeds the runtime's capacity.
// Subset: the real class also has input tensors (value-depend inputs), compile info parsing, SIMT grid / block dims,
// dynamic UB size, views and strides; none is used by fused_lce. GetCompileInfo returns nullptr here (OP_ADD registers
// an empty compile-info struct).
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_TILING_CONTEXT_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_TILING_CONTEXT_H_

#include <cstdint>

#include "exe_graph/runtime/extended_kernel_context.h"
#include "exe_graph/runtime/storage_shape.h"
#include "exe_graph/runtime/tiling_data.h"
#include "graph/ge_error_codes.h"

namespace fe {
class PlatFormInfos;
}  // namespace fe

namespace gert {

class TilingContext : public ExtendedKernelContext {
public:
    const void* GetCompileInfo() const;
    template <typename T>
    const T* GetCompileInfo() const {
        return reinterpret_cast<const T*>(GetCompileInfo());
    }
    const StorageShape* GetInputShape(const size_t index) const { return TwinInputShape(index); }
    const StorageShape* GetOptionalInputShape(const size_t ir_index) const {
        return TwinDynamicInputShape(ir_index, 0);
    }
    const StorageShape* GetRequiredInputShape(const size_t ir_index) const {
        return TwinDynamicInputShape(ir_index, 0);
    }
    const StorageShape* GetDynamicInputShape(const size_t ir_index, const size_t relative_index) const {
        return TwinDynamicInputShape(ir_index, relative_index);
    }
    const StorageShape* GetOutputShape(const size_t index) const;

    ge::graphStatus SetTilingKey(const uint64_t tiling_key);
    uint64_t GetTilingKey() const;
    ge::graphStatus SetScheduleMode(const uint32_t schedule_mode);
    uint32_t GetScheduleMode() const;
    ge::graphStatus SetBlockDim(const uint32_t block_dim) { return SetSimdNumBlocks(block_dim); }
    ge::graphStatus SetSimdNumBlocks(const uint32_t num_blocks);
    uint32_t GetBlockDim() const { return GetSimdNumBlocks(); }
    uint32_t GetSimdNumBlocks() const;
    ge::graphStatus SetNeedAtomic(const bool atomic);
    bool NeedAtomic() const;
    template <typename T>
    auto GetTilingData() -> T* {
        TilingData* tiling_data = GetRawTilingData();
        if (tiling_data == nullptr) return nullptr;
        if (tiling_data->GetCapacity() < sizeof(T)) return nullptr;
        tiling_data->SetDataSize(sizeof(T));
        return static_cast<T*>(tiling_data->GetData());
    }
    TilingData* GetRawTilingData();
    size_t* GetWorkspaceSizes(const size_t workspace_count);
    size_t GetWorkspaceNum() const;
    fe::PlatFormInfos* GetPlatformInfo() const;
    int32_t GetDeterministic() const;
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_TILING_CONTEXT_H_
