// Stub of CANN's exe_graph/runtime/compute_node_info.h (hicann/metadef inc/external/exe_graph/runtime/
// compute_node_info.h): the compile-time tensor descriptor and the IR-to-instance mapping of a node's inputs.
// An optional input that is absent has an IR entry with GetInstanceNum() == 0 and no instance: every later input's
// *instance* index is one lower than its IR index. ExtendedKernelContext::GetInputDesc(i) /
// TilingContext::GetInputShape(i) take instance indices; Get{Optional,Required}Input{Desc,Shape}(ir) take IR indices.
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_COMPUTE_NODE_INFO_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_COMPUTE_NODE_INFO_H_

#include <cstddef>

#include "graph/types.h"

namespace gert {

class AnchorInstanceInfo {
public:
    AnchorInstanceInfo() = default;
    AnchorInstanceInfo(const size_t instance_start, const size_t instantiation_num)
        : instance_start_(instance_start), instantiation_num_(instantiation_num) {}
    size_t GetInstanceNum() const { return instantiation_num_; }
    size_t GetInstanceStart() const { return instance_start_; }
    void SetInstanceStart(const size_t start) { instance_start_ = start; }
    void SetInstantiationNum(const size_t num) { instantiation_num_ = num; }

private:
    size_t instance_start_ = 0;
    size_t instantiation_num_ = 0;
};

class CompileTimeTensorDesc {
public:
    ge::DataType GetDataType() const { return data_type_; }
    ge::Format GetOriginFormat() const { return origin_format_; }
    ge::Format GetStorageFormat() const { return storage_format_; }
    void SetDataType(const ge::DataType data_type) { data_type_ = data_type; }
    void SetStorageFormat(const ge::Format format) { storage_format_ = format; }
    void SetOriginFormat(const ge::Format format) { origin_format_ = format; }

private:
    ge::DataType data_type_ = ge::DT_UNDEFINED;
    ge::Format origin_format_ = ge::FORMAT_ND;
    ge::Format storage_format_ = ge::FORMAT_ND;
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_COMPUTE_NODE_INFO_H_
