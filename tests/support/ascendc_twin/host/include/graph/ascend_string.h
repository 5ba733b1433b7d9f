// Stub of CANN's graph/ascend_string.h: ge::AscendString, implicitly constructible from a C string (the OP_ADD
// macro of OP_TILING_LIB mode passes string literals where AscendString is expected, metadef op_def.h).
#ifndef FUSED_LCE_TWIN_HOST_GRAPH_ASCEND_STRING_H_
#define FUSED_LCE_TWIN_HOST_GRAPH_ASCEND_STRING_H_

#include <string>

namespace ge {

class AscendString {
public:
    AscendString() = default;
    AscendString(const char* name) : s_(name == nullptr ? "" : name) {}  // NOLINT: implicit, as the real one
    const char* GetString() const { return s_.c_str(); }
    size_t GetLength() const { return s_.size(); }
    bool operator<(const AscendString& o) const { return s_ < o.s_; }
    bool operator==(const AscendString& o) const { return s_ == o.s_; }

private:
    std::string s_;
};

class Operator;  // graph/operator.h: only named by the check-function pointer types of OpAICoreDef

}  // namespace ge

#endif  // FUSED_LCE_TWIN_HOST_GRAPH_ASCEND_STRING_H_
