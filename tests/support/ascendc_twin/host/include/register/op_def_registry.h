// Stub of CANN's register/op_def_registry.h (hicann/metadef inc/external/asc/register/op_def_registry.h): OP_ADD in
// its three compilation modes, with the same observable effect as the real macro (written here as templates):
//   * OP_PROTO_LIB  (the GRAPH library, npu_op_library(... GRAPH)): constructs the op and registers its InferShape,
//     InferShapeRange and InferDataType functions;
//   * OP_TILING_LIB (the TILING library, npu_op_library(... TILING)): registers AICore().GetTiling() with the default
//     tiling buffer (2048 bytes), a no-op compile-info parser, and the AICore check functions;
//   * neither (opbuild's libascend_all_ops.so, built by compile_ascendc_all_ops_so.py): registers a factory that
//     builds the OpDef by value (the op class is sliced to OpDef, so it must not add data members).
// Includes what the real one makes visible to op_host sources: OpDef and, through op_impl_registry.h, the gert
// contexts and ge types.
#ifndef FUSED_LCE_TWIN_HOST_REGISTER_OP_DEF_REGISTRY_H_
#define FUSED_LCE_TWIN_HOST_REGISTER_OP_DEF_REGISTRY_H_

#include "register/op_def.h"
#include "register/op_def_factory.h"

namespace ops {
namespace twin_op_add {

template <typename Op>
int ProtoLib(const char* name) {
    Op op(name);
    gert::OpImplRegisterV2 impl(name);
    impl.InferShape(op.GetInferShape());
    impl.InferShapeRange(op.GetInferShapeRange());
    impl.InferDataType(op.GetInferDataType());
    const gert::OpImplRegisterV2 registered(impl);
    (void)registered;
    return 0;
}

struct NoCompileInfo {};
inline ge::graphStatus NoTilingParse(gert::TilingParseContext*) { return ge::GRAPH_SUCCESS; }

template <typename Op>
int TilingLib(const char* name) {
    Op op(name);
    gert::OpImplRegisterV2 impl(name);
    impl.Tiling(op.AICore().GetTiling());
    impl.TilingParse<NoCompileInfo>(NoTilingParse);
    const optiling::OpCheckFuncHelper c1(FUNC_CHECK_SUPPORTED, name, op.AICore().GetCheckSupport());
    const optiling::OpCheckFuncHelper c2(FUNC_OP_SELECT_FORMAT, name, op.AICore().GetOpSelectFormat());
    const optiling::OpCheckFuncHelper c3(FUNC_GET_OP_SUPPORT_INFO, name, op.AICore().GetOpSupportInfo());
    const optiling::OpCheckFuncHelper c4(FUNC_GET_SPECIFIC_INFO, name, op.AICore().GetOpSpecInfo());
    const optiling::OpCheckFuncHelper c5(name, op.AICore().GetParamGeneralize());
    (void)c1, (void)c2, (void)c3, (void)c4, (void)c5;
    const gert::OpImplRegisterV2 registered(impl);
    (void)registered;
    return 0;
}

template <typename Op>
OpDef Make(const char* name) {
    return Op(name);
}

template <typename Op>
int OpBuild(const char* name) {
    return OpDefFactory::OpDefRegisterV2 != nullptr ? OpDefFactory::OpDefRegisterV2(name, &Make<Op>)
                                                    : OpDefFactory::OpDefRegister(name, &Make<Op>);
}

}  // namespace twin_op_add
}  // namespace ops

#if defined(OP_PROTO_LIB)
#define OP_ADD(opType, ...) static int g_##opType##_added = ::ops::twin_op_add::ProtoLib<opType>(#opType)
#elif defined(OP_TILING_LIB)
#define OP_ADD(opType, ...) static int g_##opType##_added = ::ops::twin_op_add::TilingLib<opType>(#opType)
#else
#define OP_ADD(opType, ...) static int g_##opType##_added = ::ops::twin_op_add::OpBuild<opType>(#opType)
#endif

#endif  // FUSED_LCE_TWIN_HOST_REGISTER_OP_DEF_REGISTRY_H_
