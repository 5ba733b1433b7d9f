// Stub of CANN's exe_graph/runtime/runtime_attrs.h (hicann/metadef inc/external/exe_graph/runtime/runtime_attrs.h).
// Attributes are addressed by their position in the OpDef's Attr(...) declarations; GetAttrPointer<T> reinterprets
// the stored value (int64_t for Int, float for Float, bool for Bool: metadef AttrDataType) and returns nullptr past
// the last attribute. The twin stores each attribute in its own 8-byte slot filled with 0xA5 bytes beyond the value,
// so reading a Float as int64_t (or an Int as float) gives a visibly wrong number instead of a lucky right one.
#ifndef FUSED_LCE_TWIN_HOST_EXE_GRAPH_RUNTIME_ATTRS_H_
#define FUSED_LCE_TWIN_HOST_EXE_GRAPH_RUNTIME_ATTRS_H_

#include <cstddef>
#include <cstdint>

namespace gert {

struct TwinAccess;  // twin-only: the host runtime (tests/support/ascendc_twin/host/src) fills the storage

class RuntimeAttrs {
public:
    template <typename T>
    const T* GetAttrPointer(size_t index) const {
        return reinterpret_cast<const T*>(GetPointerByIndex(index));
    }
    const int64_t* GetInt(const size_t index) const { return GetAttrPointer<int64_t>(index); }
    const char* GetStr(const size_t index) const { return GetAttrPointer<char>(index); }
    const float* GetFloat(const size_t index) const { return GetAttrPointer<float>(index); }
    const bool* GetBool(const size_t index) const { return GetAttrPointer<bool>(index); }
    size_t GetAttrNum() const;
    const void* GetPointerByIndex(size_t index) const;

private:
    friend struct TwinAccess;
    const void* twin_ = nullptr;
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_EXE_GRAPH_RUNTIME_ATTRS_H_
