// Stub of CANN's register/op_def.h (hicann/metadef inc/external/asc/register/op_def.h): the operator definition DSL of
// AscendC custom ops (OpDef / OpParamDef / OpAttrDef / OpAICoreDef / OpAICoreConfig). Public member functions are
// declared with the real signatures (a subset: the ones fused_lce's op_host code and the OP_ADD macro use, plus
// their close siblings); the twin host runtime implements them and records the definition so tests can read back
// inputs, attributes (their order is the RuntimeAttrs index the tiling reads) and outputs. The real classes also
// have private accessors for the code generators (opbuild); those are not modelled.
#ifndef FUSED_LCE_TWIN_HOST_REGISTER_OP_DEF_H_
#define FUSED_LCE_TWIN_HOST_REGISTER_OP_DEF_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/ascend_string.h"
#include "graph/types.h"
#include "register/op_impl_registry.h"

namespace optiling {
#define FUNC_CHECK_SUPPORTED "check_supported"
#define FUNC_OP_SELECT_FORMAT "op_select_format"
#define FUNC_GET_OP_SUPPORT_INFO "get_op_support_info"
#define FUNC_GET_SPECIFIC_INFO "get_op_specific_info"
using OP_CHECK_FUNC = ge::graphStatus (*)(const ge::Operator& op, ge::AscendString& result);
using PARAM_GENERALIZE_FUNC = ge::graphStatus (*)(const ge::Operator& op, const ge::AscendString& generalize_config,
                                                  ge::AscendString& generalized_op_params);
class OpCheckFuncHelper {
public:
    OpCheckFuncHelper(const ge::AscendString& check_type, const ge::AscendString& op_type, OP_CHECK_FUNC func);
    OpCheckFuncHelper(const ge::AscendString& op_type, PARAM_GENERALIZE_FUNC func);
};
}  // namespace optiling

namespace ops {

enum Option { IGNORE = 0, OPTIONAL = 1, REQUIRED = 2, DYNAMIC = 3, VIRTUAL = 4 };
enum class FormatCheckOption : uint32_t { DEFAULT = 0, STRICT = 1, MAX };
enum class DependScope : uint32_t { ALL = 0, TILING = 1, INVALID_SCOPE };
enum class FollowType : uint32_t { ALL = 0, DTYPE = 1, FORMAT = 2, SHAPE = 3, INVALID_TYPE };
enum class AttrDataType {
    ATTR_DT_BOOL = 0,
    ATTR_DT_FLOAT = 1,
    ATTR_DT_INT = 2,
    ATTR_DT_STR = 3,
    ATTR_DT_LIST_BOOL = 4,
    ATTR_DT_LIST_FLOAT = 5,
    ATTR_DT_LIST_INT = 6,
    ATTR_DT_LIST_LIST_INT = 7,
    ATTR_DT_MAX
};

class OpParamDefImpl;
class OpParamDef {
public:
    explicit OpParamDef(const char* name);
    OpParamDef(const OpParamDef& def);
    ~OpParamDef();
    OpParamDef& operator=(const OpParamDef& def);
    OpParamDef& ParamType(Option param_type);
    OpParamDef& DataType(std::vector<ge::DataType> types);
    OpParamDef& DataTypeList(std::vector<ge::DataType> types);
    OpParamDef& Format(std::vector<ge::Format> formats);
    OpParamDef& FormatList(std::vector<ge::Format> formats);
    OpParamDef& UnknownShapeFormat(std::vector<ge::Format> formats);
    OpParamDef& ValueDepend(Option value_depend);
    OpParamDef& IgnoreContiguous(void);
    OpParamDef& AutoContiguous();
    OpParamDef& Scalar();
    OpParamDef& To(const ge::DataType type);
    OpParamDef& Version(uint32_t version);
    OpParamDef& InitValue(uint64_t value);
    OpParamDef& OutputShapeDependOnCompute();
    OpParamDef& Follow(const char* paramName);
    OpParamDef& Comment(const char* comment);

private:
    friend class OpDef;
    friend struct gert::TwinAccess;
    std::unique_ptr<OpParamDefImpl> impl_;
};

class OpAttrDefImpl;
class OpAttrDef {
public:
    explicit OpAttrDef(const char* name);
    OpAttrDef(const OpAttrDef& attr_def);
    ~OpAttrDef();
    OpAttrDef& operator=(const OpAttrDef& attr_def);
    OpAttrDef& AttrType(Option attr_type);
    OpAttrDef& Bool(void);
    OpAttrDef& Bool(bool value);
    OpAttrDef& Float(void);
    OpAttrDef& Float(float value);
    OpAttrDef& Int(void);
    OpAttrDef& Int(int64_t value);
    OpAttrDef& String(void);
    OpAttrDef& String(const char* value);
    OpAttrDef& ListInt(void);
    OpAttrDef& ListInt(std::vector<int64_t> value);
    OpAttrDef& Version(uint32_t version);
    OpAttrDef& Comment(const char* comment);
    ge::AscendString& GetName(void) const;
    bool IsRequired(void);

private:
    friend class OpDef;
    friend struct gert::TwinAccess;
    std::unique_ptr<OpAttrDefImpl> impl_;
};

class OpAICoreConfigImpl;
class OpAICoreConfig {
public:
    OpAICoreConfig();
    OpAICoreConfig(const char* soc);
    OpAICoreConfig(const OpAICoreConfig& aicore_config);
    ~OpAICoreConfig();
    OpAICoreConfig& operator=(const OpAICoreConfig& aicore_config);
    OpParamDef& Input(const char* name);
    OpParamDef& Output(const char* name);
    OpAICoreConfig& DynamicCompileStaticFlag(bool flag);
    OpAICoreConfig& DynamicFormatFlag(bool flag);
    OpAICoreConfig& DynamicRankSupportFlag(bool flag);
    OpAICoreConfig& DynamicShapeSupportFlag(bool flag);
    OpAICoreConfig& NeedCheckSupportFlag(bool flag);
    OpAICoreConfig& PrecisionReduceFlag(bool flag);
    OpAICoreConfig& ExtendCfgInfo(const char* key, const char* value);

private:
    friend class OpAICoreDef;
    friend struct gert::TwinAccess;
    std::unique_ptr<OpAICoreConfigImpl> impl_;
};

class OpAICoreDefImpl;
class OpAICoreDef {
public:
    OpAICoreDef();
    OpAICoreDef(const OpAICoreDef& aicore_def);
    ~OpAICoreDef();
    OpAICoreDef& operator=(const OpAICoreDef& aicore_def);
    OpAICoreDef& SetTiling(gert::OpImplRegisterV2::TilingKernelFunc func);
    OpAICoreDef& SetCheckSupport(optiling::OP_CHECK_FUNC func);
    OpAICoreDef& SetOpSelectFormat(optiling::OP_CHECK_FUNC func);
    OpAICoreDef& SetOpSupportInfo(optiling::OP_CHECK_FUNC func);
    OpAICoreDef& SetOpSpecInfo(optiling::OP_CHECK_FUNC func);
    OpAICoreDef& SetParamGeneralize(optiling::PARAM_GENERALIZE_FUNC func);
    OpAICoreDef& LaunchWithZeroEleOutputTensors(bool launchFlag);
    gert::OpImplRegisterV2::TilingKernelFunc& GetTiling(void);
    optiling::OP_CHECK_FUNC& GetCheckSupport(void);
    optiling::OP_CHECK_FUNC& GetOpSelectFormat(void);
    optiling::OP_CHECK_FUNC& GetOpSupportInfo(void);
    optiling::OP_CHECK_FUNC& GetOpSpecInfo(void);
    optiling::PARAM_GENERALIZE_FUNC& GetParamGeneralize(void);
    OpAICoreDef& AddConfig(const char* soc);
    OpAICoreDef& AddConfig(const char* soc, OpAICoreConfig& aicore_config);

private:
    friend class OpDef;
    friend struct gert::TwinAccess;
    std::unique_ptr<OpAICoreDefImpl> impl_;
};

class OpDefImpl;
class OpDef {
public:
    explicit OpDef(const char* type);
    OpDef(const OpDef& op_def);
    ~OpDef();  // twin: records the finished definition (see the host runtime's op registry)
    OpDef& operator=(const OpDef& op_def);
    OpParamDef& Input(const char* name);
    OpParamDef& Output(const char* name);
    OpAttrDef& Attr(const char* name);
    OpDef& SetInferShape(gert::OpImplRegisterV2::InferShapeKernelFunc func);
    OpDef& SetInferShapeRange(gert::OpImplRegisterV2::InferShapeRangeKernelFunc func);
    OpDef& SetInferDataType(gert::OpImplRegisterV2::InferDataTypeKernelFunc func);
    gert::OpImplRegisterV2::InferShapeKernelFunc& GetInferShape(void);
    gert::OpImplRegisterV2::InferShapeRangeKernelFunc& GetInferShapeRange(void);
    gert::OpImplRegisterV2::InferDataTypeKernelFunc& GetInferDataType(void);
    OpAICoreDef& AICore(void);
    OpDef& FormatMatchMode(FormatCheckOption option);
    OpDef& EnableFallBack(void);

private:
    friend struct gert::TwinAccess;
    std::unique_ptr<OpDefImpl> impl_;
};

}  // namespace ops

#endif  // FUSED_LCE_TWIN_HOST_REGISTER_OP_DEF_H_
