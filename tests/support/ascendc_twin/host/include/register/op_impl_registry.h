// Stub of CANN's register/op_impl_registry.h (hicann/metadef inc/external/register/op_impl_registry.h):
// gert::OpImplRegisterV2, whose copy constructor registers an op's implementation functions (that is how OP_ADD in
// OP_TILING_LIB / OP_PROTO_LIB mode registers them). Tiling's max_tiling_data_size defaults to 2048 bytes as in the
// real header: it becomes the capacity of the tiling buffer the runtime hands to the tiling function.
// Only the members OP_ADD uses are modelled; the real class has many more (op execute, format inference, ...).
#ifndef FUSED_LCE_TWIN_HOST_REGISTER_OP_IMPL_REGISTRY_H_
#define FUSED_LCE_TWIN_HOST_REGISTER_OP_IMPL_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "exe_graph/runtime/infer_datatype_context.h"
#include "exe_graph/runtime/infer_shape_context.h"
#include "exe_graph/runtime/tiling_context.h"
#include "exe_graph/runtime/tiling_parse_context.h"
#include "graph/ascend_string.h"
#include "graph/types.h"

namespace gert {

class InferShapeRangeContext;
using UINT32 = uint32_t;

class OpImplRegisterV2 {
public:
    using InferShapeKernelFunc = UINT32 (*)(InferShapeContext*);
    using InferShapeRangeKernelFunc = UINT32 (*)(InferShapeRangeContext*);
    using TilingKernelFunc = UINT32 (*)(TilingContext*);
    using InferDataTypeKernelFunc = UINT32 (*)(InferDataTypeContext*);
    using TilingParseFunc = UINT32 (*)(TilingParseContext*);

    explicit OpImplRegisterV2(const ge::char_t* op_type);
    OpImplRegisterV2(OpImplRegisterV2&& other) noexcept;
    OpImplRegisterV2(const OpImplRegisterV2& other);  // registers the functions collected so far
    OpImplRegisterV2& operator=(const OpImplRegisterV2&) = delete;
    OpImplRegisterV2& operator=(OpImplRegisterV2&&) = delete;
    ~OpImplRegisterV2();

    OpImplRegisterV2& InferShape(InferShapeKernelFunc infer_shape_func);
    OpImplRegisterV2& InferShapeRange(InferShapeRangeKernelFunc infer_shape_range_func);
    OpImplRegisterV2& InferDataType(InferDataTypeKernelFunc infer_datatype_func);
    OpImplRegisterV2& Tiling(TilingKernelFunc tiling_func, size_t max_tiling_data_size = 2048);
    template <typename T>
    OpImplRegisterV2& TilingParse(TilingParseFunc tiling_parse_func) {
        return TwinTilingParse(tiling_parse_func, sizeof(T));
    }

private:
    OpImplRegisterV2& TwinTilingParse(TilingParseFunc func, size_t compile_info_size);
    struct Funcs {
        std::string op_type;
        InferShapeKernelFunc infer_shape = nullptr;
        InferShapeRangeKernelFunc infer_shape_range = nullptr;
        InferDataTypeKernelFunc infer_datatype = nullptr;
        TilingKernelFunc tiling = nullptr;
        size_t max_tiling_data_size = 0;
        TilingParseFunc tiling_parse = nullptr;
    } funcs_;
    friend struct TwinAccess;
};

}  // namespace gert

#endif  // FUSED_LCE_TWIN_HOST_REGISTER_OP_IMPL_REGISTRY_H_
