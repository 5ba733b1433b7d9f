// Stub of CANN's exe_graph/runtime/tiling_data.h (hicann/metadef inc/external/exe_graph/runtime/tiling_data.h): the
// tiling buffer of a launch. Its capacity is the max_tiling_data_size given to OpImplRegisterV2::Tiling (2048 bytes by
// default, which is what OP_ADD uses); TilingContext::GetTilingData<T>() returns nullptr when sizeof(T) exceeds it.
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_TILING_DATA_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_TILING_DATA_H_

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "graph/ge_error_codes.h"

namespace gert {

struct TwinAccess;

class TilingData {
public:
    size_t GetCapacity() const { return capacity_; }
    size_t GetDataSize() const { return data_size_; }
    void SetDataSize(const size_t size) { data_size_ = size; }
    void* GetData() { return data_; }
    const void* GetData() const { return data_; }
    template <typename T, typename std::enable_if<std::is_standard_layout<T>::value, int>::type = 0>
    ge::graphStatus Append(const T& data) {
        if (data_size_ + sizeof(T) > capacity_) return ge::GRAPH_FAILED;
        std::memcpy(static_cast<char*>(data_) + data_size_, &data, sizeof(T));
        data_size_ += sizeof(T);
        return ge::GRAPH_SUCCESS;
    }

private:
    friend struct TwinAccess;
    size_t capacity_ = 0;
    size_t data_size_ = 0;
    void* data_ = nullptr;
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_TILING_DATA_H_
