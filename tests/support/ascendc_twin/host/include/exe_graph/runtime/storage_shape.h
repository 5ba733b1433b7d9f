// Stub of CANN's exe_graph/runtime/storage_shape.h (hicann/metadef inc/external/exe_graph/runtime/storage_shape.h):
// origin shape (what the framework sees) and storage shape (the device layout; equal for ND tensors).
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_STORAGE_SHAPE_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_STORAGE_SHAPE_H_

#include "exe_graph/runtime/shape.h"

namespace gert {

struct StorageShape {
public:
    StorageShape() = default;
    StorageShape(const std::initializer_list<int64_t>& origin_shape,
                 const std::initializer_list<int64_t>& storage_shape)
        : origin_shape_(origin_shape), storage_shape_(storage_shape) {}
    const Shape& GetOriginShape() const { return origin_shape_; }
    const Shape& GetShape() const { return storage_shape_; }
    const Shape& GetStorageShape() const { return storage_shape_; }
    Shape& MutableShape() { return storage_shape_; }
    Shape& MutableOriginShape() { return origin_shape_; }
    Shape& MutableStorageShape() { return storage_shape_; }
    bool operator==(const StorageShape& o) const {
        return origin_shape_ == o.origin_shape_ && storage_shape_ == o.storage_shape_;
    }

private:
    Shape origin_shape_;
    Shape storage_shape_;
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_STORAGE_SHAPE_H_
