// Stub of CANN's exe_graph/runtime/shape.h (hicann/metadef inc/external/exe_graph/runtime/shape.h): gert::Shape with
// the real capacity (kMaxDimNum = 25) and the real out-of-range behaviour of GetDim (kInvalidDimValue past
// kMaxDimNum; dims between GetDimNum() and kMaxDimNum read as whatever is stored — 0 here — so code must check
// GetDimNum() before reading a dim, as on the device).
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_SHAPE_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_SHAPE_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>

namespace gert {

struct Shape {
public:
    static constexpr size_t kMaxDimNum = 25;
    static constexpr int64_t kInvalidDimValue = std::numeric_limits<int64_t>::min();

    Shape() : dim_num_(0) {
        for (size_t i = 0; i < kMaxDimNum; ++i) dims_[i] = 0;
    }
    Shape(const std::initializer_list<int64_t>& args) : Shape() {
        if (args.size() > kMaxDimNum) return;
        for (const int64_t a : args) dims_[dim_num_++] = a;
    }
    bool operator==(const Shape& o) const {
        if (dim_num_ != o.dim_num_) return false;
        for (size_t i = 0; i < dim_num_; ++i) {
            if (dims_[i] != o.dims_[i]) return false;
        }
        return true;
    }
    bool operator!=(const Shape& o) const { return !(*this == o); }
    // product of the dims; kInvalidDimValue on overflow (as the real one)
    int64_t GetShapeSize() const {
        int64_t size = 1;
        for (size_t i = 0; i < dim_num_; ++i) {
            if (dims_[i] != 0 && size > std::numeric_limits<int64_t>::max() / (dims_[i] < 0 ? -dims_[i] : dims_[i]))
                return kInvalidDimValue;
            size *= dims_[i];
        }
        return size;
    }
    bool IsScalar() const { return dim_num_ == 0; }
    void SetScalar() { dim_num_ = 0; }
    size_t GetDimNum() const { return dim_num_; }
    void SetDimNum(const size_t dim_num) { dim_num_ = dim_num > kMaxDimNum ? kMaxDimNum : dim_num; }
    int64_t GetDim(const size_t idx) const { return idx >= kMaxDimNum ? kInvalidDimValue : dims_[idx]; }
    const int64_t& operator[](const size_t idx) const { return dims_[idx]; }
    int64_t& operator[](const size_t idx) { return dims_[idx]; }
    void SetDim(size_t idx, const int64_t dim_value) {
        if (idx < kMaxDimNum) dims_[idx] = dim_value;
    }
    Shape& AppendDim(const int64_t value) {
        if (dim_num_ < kMaxDimNum) dims_[dim_num_++] = value;
        return *this;
    }

private:
    size_t dim_num_;
    int64_t dims_[kMaxDimNum];
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_SHAPE_H_
