// Implementation of the host twin (see ../twin_host_runtime.h): the registries of OP_ADD, the gert contexts, the
// OpDef DSL, PlatformAscendC and the MatmulApiTiling model. One translation unit, linked into test drivers only.
#include "../twin_host_runtime.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>

#include "tiling/tiling_api.h"

// ------------------------------------------------------------------------------------------------ platform info
namespace fe {
class PlatFormInfos {
public:
    fused_lce_twin_host::Part part;
};
}  // namespace fe

namespace gert {

// Everything a context can see about one node, owned by run_tiling / run_infer.
struct TwinNode {
    std::string type, name;
    std::vector<AnchorInstanceInfo> ir_inputs;          // per IR input
    std::vector<CompileTimeTensorDesc> input_descs;     // per instance
    std::vector<StorageShape> input_shapes;             // per instance
    std::vector<CompileTimeTensorDesc> output_descs;    // per output
    std::vector<StorageShape> output_shapes;            // per output (tiling: as inferred, or as the caller gave)
    std::vector<char> output_absent;                    // per output: an optional output the caller did not give
    std::vector<Shape> infer_output_shapes;             // InferShape writes here
    std::vector<ge::DataType> infer_output_dtypes;      // InferDataType writes here
    std::vector<uint64_t> attr_slots;                   // one 8-byte slot per attribute
    RuntimeAttrs attrs;
    fe::PlatFormInfos* platform = nullptr;
    TilingData tiling_data;
    std::vector<uint8_t> tiling_buffer;
    fused_lce_twin_host::TilingResult out;
    static constexpr size_t kWorkspaceCapacity = 16;    // assumption: the real runtime's limit is not documented
    size_t workspace_storage[kWorkspaceCapacity] = {};
};

struct TwinAccess {
    static const TwinNode* node(const ExtendedKernelContext* c) { return static_cast<const TwinNode*>(c->twin_); }
    static TwinNode* mut(ExtendedKernelContext* c) { return const_cast<TwinNode*>(node(c)); }
    static const TwinNode* node(const RuntimeAttrs* a) { return static_cast<const TwinNode*>(a->twin_); }
    static void bind(ExtendedKernelContext* c, TwinNode* n) { c->twin_ = n; }
    static void bind(RuntimeAttrs* a, TwinNode* n) { a->twin_ = n; }
    static void bind(TilingData* t, void* data, size_t capacity) {
        t->data_ = data;
        t->capacity_ = capacity;
        t->data_size_ = 0;
    }
    using Funcs = OpImplRegisterV2::Funcs;
    static std::map<std::string, Funcs>& impl_registry() {
        static std::map<std::string, Funcs> r;
        return r;
    }
    static const Funcs& funcs_of(const std::string& op_type) {
        auto it = impl_registry().find(op_type);
        if (it == impl_registry().end()) throw std::invalid_argument("no implementation registered for " + op_type);
        return it->second;
    }
    static void record(const ops::OpDefImpl& d);
};

// ---------------------------------------------------------------------------------------- ExtendedKernelContext
const CompileTimeTensorDesc* ExtendedKernelContext::GetInputDesc(const size_t index) const {
    const TwinNode* n = TwinAccess::node(this);
    return index < n->input_descs.size() ? &n->input_descs[index] : nullptr;
}
const CompileTimeTensorDesc* ExtendedKernelContext::GetDynamicInputDesc(const size_t ir_index,
                                                                        const size_t relative_index) const {
    const AnchorInstanceInfo* info = GetIrInputInstanceInfo(ir_index);
    if (info == nullptr || info->GetInstanceNum() <= relative_index) return nullptr;
    return GetInputDesc(info->GetInstanceStart() + relative_index);
}
const CompileTimeTensorDesc* ExtendedKernelContext::GetOptionalInputDesc(const size_t ir_index) const {
    return GetDynamicInputDesc(ir_index, 0);
}
const CompileTimeTensorDesc* ExtendedKernelContext::GetRequiredInputDesc(const size_t ir_index) const {
    return GetDynamicInputDesc(ir_index, 0);
}
const CompileTimeTensorDesc* ExtendedKernelContext::GetOutputDesc(const size_t index) const {
    const TwinNode* n = TwinAccess::node(this);
    return index < n->output_descs.size() ? &n->output_descs[index] : nullptr;
}
const AnchorInstanceInfo* ExtendedKernelContext::GetIrInputInstanceInfo(const size_t ir_index) const {
    const TwinNode* n = TwinAccess::node(this);
    return ir_index < n->ir_inputs.size() ? &n->ir_inputs[ir_index] : nullptr;
}
const AnchorInstanceInfo* ExtendedKernelContext::GetIrOutputInstanceInfo(const size_t) const { return nullptr; }
size_t ExtendedKernelContext::GetComputeNodeInputNum() const { return TwinAccess::node(this)->input_descs.size(); }
size_t ExtendedKernelContext::GetComputeNodeOutputNum() const { return TwinAccess::node(this)->output_descs.size(); }
const RuntimeAttrs* ExtendedKernelContext::GetAttrs() const { return &TwinAccess::node(this)->attrs; }
const ge::char_t* ExtendedKernelContext::GetNodeType() const { return TwinAccess::node(this)->type.c_str(); }
const ge::char_t* ExtendedKernelContext::GetNodeName() const { return TwinAccess::node(this)->name.c_str(); }
const StorageShape* ExtendedKernelContext::TwinInputShape(size_t index) const {
    const TwinNode* n = TwinAccess::node(this);
    return index < n->input_shapes.size() ? &n->input_shapes[index] : nullptr;
}
const StorageShape* ExtendedKernelContext::TwinDynamicInputShape(size_t ir_index, size_t relative_index) const {
    const AnchorInstanceInfo* info = GetIrInputInstanceInfo(ir_index);
    if (info == nullptr || info->GetInstanceNum() <= relative_index) return nullptr;
    return TwinInputShape(info->GetInstanceStart() + relative_index);
}

size_t RuntimeAttrs::GetAttrNum() const { return TwinAccess::node(this)->attr_slots.size(); }
const void* RuntimeAttrs::GetPointerByIndex(size_t index) const {
    const TwinNode* n = TwinAccess::node(this);
    return index < n->attr_slots.size() ? static_cast<const void*>(&n->attr_slots[index]) : nullptr;
}

// ---------------------------------------------------------------------------------------------- TilingContext
const void* TilingContext::GetCompileInfo() const { return nullptr; }
const StorageShape* TilingContext::GetOutputShape(const size_t index) const {
    const TwinNode* n = TwinAccess::node(this);
    return index < n->output_shapes.size() && !n->output_absent[index] ? &n->output_shapes[index] : nullptr;
}
ge::graphStatus TilingContext::SetTilingKey(const uint64_t tiling_key) {
    TwinNode* n = TwinAccess::mut(this);
    n->out.tiling_key_set = true;
    n->out.tiling_key = tiling_key;
    return ge::GRAPH_SUCCESS;
}
uint64_t TilingContext::GetTilingKey() const { return TwinAccess::node(this)->out.tiling_key; }
ge::graphStatus TilingContext::SetScheduleMode(const uint32_t schedule_mode) {
    TwinNode* n = TwinAccess::mut(this);
    n->out.schedule_mode_set = true;
    n->out.schedule_mode = schedule_mode;
    return ge::GRAPH_SUCCESS;
}
uint32_t TilingContext::GetScheduleMode() const { return TwinAccess::node(this)->out.schedule_mode; }
ge::graphStatus TilingContext::SetSimdNumBlocks(const uint32_t num_blocks) {
    TwinNode* n = TwinAccess::mut(this);
    n->out.block_dim_set = true;
    n->out.block_dim = num_blocks;
    return ge::GRAPH_SUCCESS;
}
uint32_t TilingContext::GetSimdNumBlocks() const { return TwinAccess::node(this)->out.block_dim; }
ge::graphStatus TilingContext::SetNeedAtomic(const bool atomic) {
    TwinAccess::mut(this)->out.need_atomic = atomic;
    return ge::GRAPH_SUCCESS;
}
bool TilingContext::NeedAtomic() const { return TwinAccess::node(this)->out.need_atomic; }
TilingData* TilingContext::GetRawTilingData() { return &TwinAccess::mut(this)->tiling_data; }
size_t* TilingContext::GetWorkspaceSizes(const size_t workspace_count) {
    TwinNode* n = TwinAccess::mut(this);
    if (workspace_count > TwinNode::kWorkspaceCapacity) return nullptr;
    n->out.workspace_set = true;
    n->out.workspaces.assign(workspace_count, 0);
    return n->workspace_storage;
}
size_t TilingContext::GetWorkspaceNum() const { return TwinAccess::node(this)->out.workspaces.size(); }
fe::PlatFormInfos* TilingContext::GetPlatformInfo() const { return TwinAccess::node(this)->platform; }
int32_t TilingContext::GetDeterministic() const { return 0; }

// ------------------------------------------------------------------------------------ shape / dtype inference
const Shape* InferShapeContext::GetInputShape(const size_t index) const {
    const StorageShape* s = TwinInputShape(index);
    return s == nullptr ? nullptr : &s->GetOriginShape();
}
const Shape* InferShapeContext::GetDynamicInputShape(const size_t ir_index, const size_t relative_index) const {
    const StorageShape* s = TwinDynamicInputShape(ir_index, relative_index);
    return s == nullptr ? nullptr : &s->GetOriginShape();
}
const Shape* InferShapeContext::GetOptionalInputShape(const size_t ir_index) const {
    return GetDynamicInputShape(ir_index, 0);
}
const Shape* InferShapeContext::GetRequiredInputShape(const size_t ir_index) const {
    return GetDynamicInputShape(ir_index, 0);
}
Shape* InferShapeContext::GetOutputShape(const size_t index) {
    TwinNode* n = TwinAccess::mut(this);
    return index < n->infer_output_shapes.size() ? &n->infer_output_shapes[index] : nullptr;
}

ge::DataType InferDataTypeContext::GetInputDataType(const size_t index) const {
    const CompileTimeTensorDesc* d = GetInputDesc(index);
    return d == nullptr ? ge::DT_UNDEFINED : d->GetDataType();
}
ge::DataType InferDataTypeContext::GetDynamicInputDataType(const size_t ir_index, const size_t relative_index) const {
    const CompileTimeTensorDesc* d = GetDynamicInputDesc(ir_index, relative_index);
    return d == nullptr ? ge::DT_UNDEFINED : d->GetDataType();
}
ge::DataType InferDataTypeContext::GetOptionalInputDataType(const size_t ir_index) const {
    return GetDynamicInputDataType(ir_index, 0);
}
ge::DataType InferDataTypeContext::GetRequiredInputDataType(const size_t ir_index) const {
    return GetDynamicInputDataType(ir_index, 0);
}
ge::DataType InferDataTypeContext::GetOutputDataType(const size_t index) const {
    const TwinNode* n = TwinAccess::node(this);
    return index < n->infer_output_dtypes.size() ? n->infer_output_dtypes[index] : ge::DT_UNDEFINED;
}
ge::graphStatus InferDataTypeContext::SetOutputDataType(const size_t index, const ge::DataType datatype) {
    TwinNode* n = TwinAccess::mut(this);
    if (index >= n->infer_output_dtypes.size()) return ge::GRAPH_FAILED;
    n->infer_output_dtypes[index] = datatype;
    return ge::GRAPH_SUCCESS;
}

// ------------------------------------------------------------------------------------------ OpImplRegisterV2
OpImplRegisterV2::OpImplRegisterV2(const ge::char_t* op_type) { funcs_.op_type = op_type == nullptr ? "" : op_type; }
OpImplRegisterV2::OpImplRegisterV2(OpImplRegisterV2&& other) noexcept : funcs_(std::move(other.funcs_)) {}
OpImplRegisterV2::OpImplRegisterV2(const OpImplRegisterV2& other) : funcs_(other.funcs_) {
    // registering merges with what another library (TILING vs GRAPH) registered for the same op
    Funcs& r = TwinAccess::impl_registry()[funcs_.op_type];
    r.op_type = funcs_.op_type;
    if (funcs_.infer_shape != nullptr) r.infer_shape = funcs_.infer_shape;
    if (funcs_.infer_shape_range != nullptr) r.infer_shape_range = funcs_.infer_shape_range;
    if (funcs_.infer_datatype != nullptr) r.infer_datatype = funcs_.infer_datatype;
    if (funcs_.tiling != nullptr) {
        r.tiling = funcs_.tiling;
        r.max_tiling_data_size = funcs_.max_tiling_data_size;
    }
    if (funcs_.tiling_parse != nullptr) r.tiling_parse = funcs_.tiling_parse;
}
OpImplRegisterV2::~OpImplRegisterV2() = default;
OpImplRegisterV2& OpImplRegisterV2::InferShape(InferShapeKernelFunc f) {
    funcs_.infer_shape = f;
    return *this;
}
OpImplRegisterV2& OpImplRegisterV2::InferShapeRange(InferShapeRangeKernelFunc f) {
    funcs_.infer_shape_range = f;
    return *this;
}
OpImplRegisterV2& OpImplRegisterV2::InferDataType(InferDataTypeKernelFunc f) {
    funcs_.infer_datatype = f;
    return *this;
}
OpImplRegisterV2& OpImplRegisterV2::Tiling(TilingKernelFunc f, size_t max_tiling_data_size) {
    funcs_.tiling = f;
    funcs_.max_tiling_data_size = max_tiling_data_size;
    return *this;
}
OpImplRegisterV2& OpImplRegisterV2::TwinTilingParse(TilingParseFunc f, size_t) {
    funcs_.tiling_parse = f;
    return *this;
}

}  // namespace gert

namespace optiling {
OpCheckFuncHelper::OpCheckFuncHelper(const ge::AscendString&, const ge::AscendString&, OP_CHECK_FUNC) {}
OpCheckFuncHelper::OpCheckFuncHelper(const ge::AscendString&, PARAM_GENERALIZE_FUNC) {}
}  // namespace optiling

// ----------------------------------------------------------------------------------------------------- OpDef DSL
namespace ops {

class OpParamDefImpl {
public:
    fused_lce_twin_host::ParamInfo info;
};
class OpAttrDefImpl {
public:
    fused_lce_twin_host::AttrInfo info;
    ge::AscendString name;
};
class OpAICoreConfigImpl {
public:
    std::vector<OpParamDef> inputs, outputs;
};
class OpAICoreDefImpl {
public:
    gert::OpImplRegisterV2::TilingKernelFunc tiling = nullptr;
    optiling::OP_CHECK_FUNC check_support = nullptr, select_format = nullptr, support_info = nullptr,
                            spec_info = nullptr;
    optiling::PARAM_GENERALIZE_FUNC generalize = nullptr;
    std::vector<std::string> configs;
};
class OpDefImpl {
public:
    std::string type;
    std::vector<OpParamDef> inputs, outputs;
    std::vector<OpAttrDef> attrs;
    gert::OpImplRegisterV2::InferShapeKernelFunc infer_shape = nullptr;
    gert::OpImplRegisterV2::InferShapeRangeKernelFunc infer_shape_range = nullptr;
    gert::OpImplRegisterV2::InferDataTypeKernelFunc infer_datatype = nullptr;
    OpAICoreDef aicore;
};

OpParamDef::OpParamDef(const char* name) : impl_(new OpParamDefImpl) { impl_->info.name = name; }
OpParamDef::OpParamDef(const OpParamDef& def) : impl_(new OpParamDefImpl(*def.impl_)) {}
OpParamDef::~OpParamDef() = default;
OpParamDef& OpParamDef::operator=(const OpParamDef& def) {
    if (this != &def) *impl_ = *def.impl_;
    return *this;
}
OpParamDef& OpParamDef::ParamType(Option t) {
    impl_->info.param_type = t;
    return *this;
}
OpParamDef& OpParamDef::DataType(std::vector<ge::DataType> types) {
    impl_->info.dtypes = std::move(types);
    return *this;
}
OpParamDef& OpParamDef::DataTypeList(std::vector<ge::DataType> types) { return DataType(std::move(types)); }
OpParamDef& OpParamDef::Format(std::vector<ge::Format> formats) {
    impl_->info.formats = std::move(formats);
    return *this;
}
OpParamDef& OpParamDef::FormatList(std::vector<ge::Format> formats) { return Format(std::move(formats)); }
OpParamDef& OpParamDef::UnknownShapeFormat(std::vector<ge::Format> formats) { return Format(std::move(formats)); }
OpParamDef& OpParamDef::ValueDepend(Option) { return *this; }
OpParamDef& OpParamDef::IgnoreContiguous(void) { return *this; }
OpParamDef& OpParamDef::AutoContiguous() { return *this; }
OpParamDef& OpParamDef::Scalar() { return *this; }
OpParamDef& OpParamDef::To(const ge::DataType) { return *this; }
OpParamDef& OpParamDef::Version(uint32_t) { return *this; }
OpParamDef& OpParamDef::InitValue(uint64_t) { return *this; }
OpParamDef& OpParamDef::OutputShapeDependOnCompute() { return *this; }
OpParamDef& OpParamDef::Follow(const char*) { return *this; }
OpParamDef& OpParamDef::Comment(const char*) { return *this; }

OpAttrDef::OpAttrDef(const char* name) : impl_(new OpAttrDefImpl) {
    impl_->info.name = name;
    impl_->name = name;
}
OpAttrDef::OpAttrDef(const OpAttrDef& a) : impl_(new OpAttrDefImpl(*a.impl_)) {}
OpAttrDef::~OpAttrDef() = default;
OpAttrDef& OpAttrDef::operator=(const OpAttrDef& a) {
    if (this != &a) *impl_ = *a.impl_;
    return *this;
}
OpAttrDef& OpAttrDef::AttrType(Option t) {
    impl_->info.attr_type = t;
    return *this;
}
OpAttrDef& OpAttrDef::Bool(void) {
    impl_->info.data_type = AttrDataType::ATTR_DT_BOOL;
    return *this;
}
OpAttrDef& OpAttrDef::Bool(bool v) {
    Bool();
    impl_->info.has_default = true;
    impl_->info.default_value = fused_lce_twin_host::AttrArg::Bool(v);
    return *this;
}
OpAttrDef& OpAttrDef::Float(void) {
    impl_->info.data_type = AttrDataType::ATTR_DT_FLOAT;
    return *this;
}
OpAttrDef& OpAttrDef::Float(float v) {
    Float();
    impl_->info.has_default = true;
    impl_->info.default_value = fused_lce_twin_host::AttrArg::Float(v);
    return *this;
}
OpAttrDef& OpAttrDef::Int(void) {
    impl_->info.data_type = AttrDataType::ATTR_DT_INT;
    return *this;
}
OpAttrDef& OpAttrDef::Int(int64_t v) {
    Int();
    impl_->info.has_default = true;
    impl_->info.default_value = fused_lce_twin_host::AttrArg::Int(v);
    return *this;
}
OpAttrDef& OpAttrDef::String(void) {
    impl_->info.data_type = AttrDataType::ATTR_DT_STR;
    return *this;
}
OpAttrDef& OpAttrDef::String(const char*) { return String(); }
OpAttrDef& OpAttrDef::ListInt(void) {
    impl_->info.data_type = AttrDataType::ATTR_DT_LIST_INT;
    return *this;
}
OpAttrDef& OpAttrDef::ListInt(std::vector<int64_t>) { return ListInt(); }
OpAttrDef& OpAttrDef::Version(uint32_t) { return *this; }
OpAttrDef& OpAttrDef::Comment(const char*) { return *this; }
ge::AscendString& OpAttrDef::GetName(void) const { return impl_->name; }
bool OpAttrDef::IsRequired(void) { return impl_->info.attr_type == REQUIRED; }

OpAICoreConfig::OpAICoreConfig() : impl_(new OpAICoreConfigImpl) {}
OpAICoreConfig::OpAICoreConfig(const char*) : impl_(new OpAICoreConfigImpl) {}
OpAICoreConfig::OpAICoreConfig(const OpAICoreConfig& c) : impl_(new OpAICoreConfigImpl(*c.impl_)) {}
OpAICoreConfig::~OpAICoreConfig() = default;
OpAICoreConfig& OpAICoreConfig::operator=(const OpAICoreConfig& c) {
    if (this != &c) *impl_ = *c.impl_;
    return *this;
}
OpParamDef& OpAICoreConfig::Input(const char* name) {
    impl_->inputs.emplace_back(name);
    return impl_->inputs.back();
}
OpParamDef& OpAICoreConfig::Output(const char* name) {
    impl_->outputs.emplace_back(name);
    return impl_->outputs.back();
}
OpAICoreConfig& OpAICoreConfig::DynamicCompileStaticFlag(bool) { return *this; }
OpAICoreConfig& OpAICoreConfig::DynamicFormatFlag(bool) { return *this; }
OpAICoreConfig& OpAICoreConfig::DynamicRankSupportFlag(bool) { return *this; }
OpAICoreConfig& OpAICoreConfig::DynamicShapeSupportFlag(bool) { return *this; }
OpAICoreConfig& OpAICoreConfig::NeedCheckSupportFlag(bool) { return *this; }
OpAICoreConfig& OpAICoreConfig::PrecisionReduceFlag(bool) { return *this; }
OpAICoreConfig& OpAICoreConfig::ExtendCfgInfo(const char*, const char*) { return *this; }

OpAICoreDef::OpAICoreDef() : impl_(new OpAICoreDefImpl) {}
OpAICoreDef::OpAICoreDef(const OpAICoreDef& d) : impl_(new OpAICoreDefImpl(*d.impl_)) {}
OpAICoreDef::~OpAICoreDef() = default;
OpAICoreDef& OpAICoreDef::operator=(const OpAICoreDef& d) {
    if (this != &d) *impl_ = *d.impl_;
    return *this;
}
OpAICoreDef& OpAICoreDef::SetTiling(gert::OpImplRegisterV2::TilingKernelFunc f) {
    impl_->tiling = f;
    return *this;
}
OpAICoreDef& OpAICoreDef::SetCheckSupport(optiling::OP_CHECK_FUNC f) {
    impl_->check_support = f;
    return *this;
}
OpAICoreDef& OpAICoreDef::SetOpSelectFormat(optiling::OP_CHECK_FUNC f) {
    impl_->select_format = f;
    return *this;
}
OpAICoreDef& OpAICoreDef::SetOpSupportInfo(optiling::OP_CHECK_FUNC f) {
    impl_->support_info = f;
    return *this;
}
OpAICoreDef& OpAICoreDef::SetOpSpecInfo(optiling::OP_CHECK_FUNC f) {
    impl_->spec_info = f;
    return *this;
}
OpAICoreDef& OpAICoreDef::SetParamGeneralize(optiling::PARAM_GENERALIZE_FUNC f) {
    impl_->generalize = f;
    return *this;
}
OpAICoreDef& OpAICoreDef::LaunchWithZeroEleOutputTensors(bool) { return *this; }
gert::OpImplRegisterV2::TilingKernelFunc& OpAICoreDef::GetTiling(void) { return impl_->tiling; }
optiling::OP_CHECK_FUNC& OpAICoreDef::GetCheckSupport(void) { return impl_->check_support; }
optiling::OP_CHECK_FUNC& OpAICoreDef::GetOpSelectFormat(void) { return impl_->select_format; }
optiling::OP_CHECK_FUNC& OpAICoreDef::GetOpSupportInfo(void) { return impl_->support_info; }
optiling::OP_CHECK_FUNC& OpAICoreDef::GetOpSpecInfo(void) { return impl_->spec_info; }
optiling::PARAM_GENERALIZE_FUNC& OpAICoreDef::GetParamGeneralize(void) { return impl_->generalize; }
OpAICoreDef& OpAICoreDef::AddConfig(const char* soc) {
    impl_->configs.push_back(soc);
    return *this;
}
OpAICoreDef& OpAICoreDef::AddConfig(const char* soc, OpAICoreConfig&) { return AddConfig(soc); }

}  // namespace ops

namespace gert {
// The recorded definitions. Kept on destruction of an OpDef (the registrations of OP_ADD construct one and drop it).
static std::map<std::string, fused_lce_twin_host::OpInfo>& def_registry() {
    static std::map<std::string, fused_lce_twin_host::OpInfo> r;
    return r;
}
void TwinAccess::record(const ops::OpDefImpl& d) {
    fused_lce_twin_host::OpInfo info;
    info.type = d.type;
    for (const ops::OpParamDef& p : d.inputs) info.inputs.push_back(p.impl_->info);
    for (const ops::OpParamDef& p : d.outputs) info.outputs.push_back(p.impl_->info);
    for (const ops::OpAttrDef& a : d.attrs) info.attrs.push_back(a.impl_->info);
    info.aicore_configs = d.aicore.impl_->configs;
    info.has_tiling = d.aicore.impl_->tiling != nullptr;
    info.has_infer_shape = d.infer_shape != nullptr;
    info.has_infer_dtype = d.infer_datatype != nullptr;
    info.infer_shape = d.infer_shape;
    info.infer_dtype = d.infer_datatype;
    def_registry()[info.type] = info;
}
}  // namespace gert

namespace ops {

OpDef::OpDef(const char* type) : impl_(new OpDefImpl) { impl_->type = type; }
OpDef::OpDef(const OpDef& d) : impl_(new OpDefImpl(*d.impl_)) {}
OpDef::~OpDef() { gert::TwinAccess::record(*impl_); }
OpDef& OpDef::operator=(const OpDef& d) {
    if (this != &d) *impl_ = *d.impl_;
    return *this;
}
OpParamDef& OpDef::Input(const char* name) {
    impl_->inputs.emplace_back(name);
    return impl_->inputs.back();
}
OpParamDef& OpDef::Output(const char* name) {
    impl_->outputs.emplace_back(name);
    return impl_->outputs.back();
}
OpAttrDef& OpDef::Attr(const char* name) {
    impl_->attrs.emplace_back(name);
    return impl_->attrs.back();
}
OpDef& OpDef::SetInferShape(gert::OpImplRegisterV2::InferShapeKernelFunc f) {
    impl_->infer_shape = f;
    return *this;
}
OpDef& OpDef::SetInferShapeRange(gert::OpImplRegisterV2::InferShapeRangeKernelFunc f) {
    impl_->infer_shape_range = f;
    return *this;
}
OpDef& OpDef::SetInferDataType(gert::OpImplRegisterV2::InferDataTypeKernelFunc f) {
    impl_->infer_datatype = f;
    return *this;
}
gert::OpImplRegisterV2::InferShapeKernelFunc& OpDef::GetInferShape(void) { return impl_->infer_shape; }
gert::OpImplRegisterV2::InferShapeRangeKernelFunc& OpDef::GetInferShapeRange(void) {
    return impl_->infer_shape_range;
}
gert::OpImplRegisterV2::InferDataTypeKernelFunc& OpDef::GetInferDataType(void) { return impl_->infer_datatype; }
OpAICoreDef& OpDef::AICore(void) { return impl_->aicore; }
OpDef& OpDef::FormatMatchMode(FormatCheckOption) { return *this; }
OpDef& OpDef::EnableFallBack(void) { return *this; }

int OpDefFactory::OpDefRegister(const char* name, OpDefCreator creator) {
    const OpDef d = creator(name);  // its destructor records it
    return 0;
}
int OpDefFactory::OpDefRegisterV2(const char* name, OpDefFuncPtr ptr) {
    const OpDef d = ptr(name);
    return 0;
}

}  // namespace ops

// ----------------------------------------------------------------------------------------------- PlatformAscendC
namespace platform_ascendc {

static constexpr uint64_t kLocalReserve = 256;  // platform_ascendc.cpp LOCAL_RESERV_SIZE (910B, kfc)

fe::PlatFormInfos* PlatformAscendC::GetPlatFormInfo(void) const {
    if (platformInfo_ == nullptr) throw std::logic_error("PlatformAscendC: no platform info (nullptr)");
    return platformInfo_;
}
// assumption: on parts with separate AIC / AIV cores GetCoreNum reports the vector cores (unused by fused_lce)
uint32_t PlatformAscendC::GetCoreNum(void) const { return GetPlatFormInfo()->part.aiv; }
uint32_t PlatformAscendC::GetCoreNumAic(void) const { return GetPlatFormInfo()->part.aic; }
uint32_t PlatformAscendC::GetCoreNumAiv(void) const { return GetPlatFormInfo()->part.aiv; }
uint32_t PlatformAscendC::GetCoreNumVector(void) const { return 0; }  // separate Vector Cores: 310P only
// approximation (the real one is not read here); unused by fused_lce
uint32_t PlatformAscendC::CalcTschBlockDim(uint32_t sliceNum, uint32_t aicCoreNum, uint32_t aivCoreNum) const {
    if (aicCoreNum == 0 || aivCoreNum == 0 || aicCoreNum > aivCoreNum) return sliceNum;
    const uint32_t ratio = aivCoreNum / aicCoreNum;
    return (sliceNum + ratio - 1) / ratio;
}
uint32_t PlatformAscendC::GetLibApiWorkSpaceSize(void) const {
    switch (GetCurNpuArch()) {
        case NpuArch::DAV_2201:
        case NpuArch::DAV_3510: return 16u * 1024u * 1024u;
        case NpuArch::DAV_RESV: return static_cast<uint32_t>(-1);
        default: return 2u * 1024u * 1024u;
    }
}
void PlatformAscendC::GetCoreMemSize(const CoreMemType& memType, uint64_t& size) const {
    const fused_lce_twin_host::Part& p = GetPlatFormInfo()->part;
    switch (memType) {
        case CoreMemType::L0_A: size = p.l0a; break;
        case CoreMemType::L0_B: size = p.l0b; break;
        case CoreMemType::L0_C: size = p.l0c; break;
        case CoreMemType::L1: size = p.l1; break;
        case CoreMemType::UB: size = p.ub; break;
        default: size = 0; break;
    }
    if ((memType == CoreMemType::UB || memType == CoreMemType::L1) && GetSocVersion() == SocVersion::ASCEND910B)
        size -= kLocalReserve;
    if (memType == CoreMemType::UB) size -= reservedMemSize_;
}
void PlatformAscendC::ReserveLocalMemory(ReservedSize size) {
    reservedMemSize_ = size == ReservedSize::RESERVED_SIZE_8K ? 8192u
                       : size == ReservedSize::RESERVED_SIZE_16K ? 16384u : 32768u;
}
SocVersion PlatformAscendC::GetSocVersion(void) const {
    const std::string& s = GetPlatFormInfo()->part.soc_version;
    if (s == "Ascend910B" || s == "Ascend910_93") return SocVersion::ASCEND910B;  // platform_ascendc.cpp's map
    if (s == "Ascend910") return SocVersion::ASCEND910;
    if (s == "Ascend310P") return SocVersion::ASCEND310P;
    if (s == "Ascend950") return SocVersion::ASCEND950;
    return SocVersion::RESERVED_VERSION;
}
NpuArch PlatformAscendC::GetCurNpuArch(void) const { return GetPlatFormInfo()->part.arch; }

}  // namespace platform_ascendc

// ----------------------------------------------------------------------------------------------- MatmulApiTiling
namespace matmul_tiling {

enum : uint32_t { kSetA = 1, kSetB = 2, kSetC = 4, kSetShape = 8 };

static int32_t dtype_bits(DataType t) {
    switch (t) {
        case DataType::DT_FLOAT:
        case DataType::DT_INT32:
        case DataType::DT_UINT32: return 32;
        case DataType::DT_FLOAT16:
        case DataType::DT_BF16:
        case DataType::DT_BFLOAT16:
        case DataType::DT_INT16:
        case DataType::DT_UINT16: return 16;
        case DataType::DT_INT8:
        case DataType::DT_UINT8: return 8;
        default: return 0;
    }
}

MatmulApiTilingBase::MatmulApiTilingBase() : bufferPool_{} {
    bufferPool_.l1Size = 512 * 1024;
    bufferPool_.l0CSize = 128 * 1024;
    bufferPool_.ubSize = 192 * 1024;
    bufferPool_.l0ASize = 64 * 1024;
    bufferPool_.l0BSize = 64 * 1024;
    bufferPool_.btSize = 1024;
}
MatmulApiTilingBase::MatmulApiTilingBase(const platform_ascendc::PlatformAscendC& plat) : bufferPool_{} {
    uint64_t v = 0;
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L1, v);
    bufferPool_.l1Size = static_cast<int32_t>(v);
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L0_C, v);
    bufferPool_.l0CSize = static_cast<int32_t>(v);
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::UB, v);
    bufferPool_.ubSize = static_cast<int32_t>(v);
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L0_A, v);
    bufferPool_.l0ASize = static_cast<int32_t>(v);
    plat.GetCoreMemSize(platform_ascendc::CoreMemType::L0_B, v);
    bufferPool_.l0BSize = static_cast<int32_t>(v);
    bufferPool_.btSize = 1024;
    socVersion = plat.GetSocVersion();
}
MatmulApiTilingBase::MatmulApiTilingBase(const PlatformInfo& p) : bufferPool_{} {
    bufferPool_.l1Size = static_cast<int32_t>(p.l1Size);
    bufferPool_.l0CSize = static_cast<int32_t>(p.l0CSize);
    bufferPool_.ubSize = static_cast<int32_t>(p.ubSize);
    bufferPool_.l0ASize = static_cast<int32_t>(p.l0ASize);
    bufferPool_.l0BSize = static_cast<int32_t>(p.l0BSize);
    bufferPool_.btSize = 1024;
    socVersion = p.socVersion;
}
MatmulApiTilingBase::~MatmulApiTilingBase() = default;

int32_t MatmulApiTilingBase::SetAType(TPosition pos, CubeFormat type, DataType dataType, bool isTrans) {
    aType_.pos = pos;
    aType_.type = type;
    aType_.dataType = dataType;
    aType_.isTrans = isTrans;
    twinSet_ |= kSetA;
    return 0;
}
int32_t MatmulApiTilingBase::SetBType(TPosition pos, CubeFormat type, DataType dataType, bool isTrans) {
    bType_.pos = pos;
    bType_.type = type;
    bType_.dataType = dataType;
    bType_.isTrans = isTrans;
    twinSet_ |= kSetB;
    return 0;
}
int32_t MatmulApiTilingBase::SetCType(TPosition pos, CubeFormat type, DataType dataType) {
    cType_.pos = pos;
    cType_.type = type;
    cType_.dataType = dataType;
    twinSet_ |= kSetC;
    return 0;
}
int32_t MatmulApiTilingBase::SetBiasType(TPosition pos, CubeFormat type, DataType dataType) {
    biasType_.pos = pos;
    biasType_.type = type;
    biasType_.dataType = dataType;
    return 0;
}
int32_t MatmulApiTilingBase::SetShape(int32_t m, int32_t n, int32_t k) {
    singleM = m;
    singleN = n;
    singleK = k;
    if (orgM == -1 && orgN == -1 && orgKa == -1 && orgKb == -1) {
        orgM = m;
        orgN = n;
        orgKa = k;
        orgKb = k;
    }
    twinSet_ |= kSetShape;
    return 0;
}
int32_t MatmulApiTilingBase::SetOrgShape(int32_t m, int32_t n, int32_t k) { return SetOrgShape(m, n, k, k); }
int32_t MatmulApiTilingBase::SetOrgShape(int32_t m, int32_t n, int32_t ka, int32_t kb) {
    orgM = m;
    orgN = n;
    orgKa = ka;
    orgKb = kb;
    return 0;
}
int32_t MatmulApiTilingBase::EnableBias(bool b) {
    isBias = b;
    return 0;
}
int32_t MatmulApiTilingBase::SetBias(bool b) { return EnableBias(b); }
int32_t MatmulApiTilingBase::SetFixSplit(int32_t bm, int32_t bn, int32_t bk) {
    if (bm == 0 || bn == 0 || bk == 0) return -1;
    if (bm != -1) {
        if (bm % C0_SIZE != 0) return -1;
        baseM = bm;
    }
    if (bn != -1) {
        if (bn % C0_SIZE != 0) return -1;
        baseN = bn;
    }
    if (bk != -1) {
        const int32_t bits = dtype_bits(aType_.dataType);
        const int32_t k0 = bits == 0 ? 0 : C0_BYTE_SIZE * BITS_PER_BYTE / bits;
        if (k0 == 0 || bk % k0 != 0) return -1;
        baseK = bk;
    }
    return 0;
}
int32_t MatmulApiTilingBase::SetBufferSpace(int32_t l1, int32_t l0c, int32_t ub, int32_t bt) {
    if (l1 < -1 || l1 > bufferPool_.l1Size || l0c < -1 || l0c > bufferPool_.l0CSize || ub < -1 ||
        ub > bufferPool_.ubSize || bt < -1 || bt > bufferPool_.btSize)
        return -1;
    if (l1 != -1) bufferPool_.l1Size = l1;
    if (l0c != -1) bufferPool_.l0CSize = l0c;
    if (ub != -1) bufferPool_.ubSize = ub;
    if (bt != -1) bufferPool_.btSize = bt;
    return 0;
}
int32_t MatmulApiTilingBase::SetTraverse(MatrixTraverse t) {
    traverse_ = t;
    return 0;
}
int32_t MatmulApiTilingBase::SetMadType(MatrixMadType t) {
    madType_ = t;
    return 0;
}
void MatmulApiTilingBase::SetMatmulConfigParams(int32_t type, bool, ScheduleType, MatrixTraverse, bool) {
    mmConfigType = type;
}
bool MatmulApiTilingBase::CheckSetParam() {
    const int32_t a_bits = dtype_bits(aType_.dataType), b_bits = dtype_bits(bType_.dataType);
    if ((twinSet_ & (kSetA | kSetB | kSetC | kSetShape)) != (kSetA | kSetB | kSetC | kSetShape)) return false;
    if (a_bits == 0 || b_bits == 0) return false;
    if (baseM != -1 && baseK != -1 &&
        static_cast<int64_t>(baseM) * baseK * a_bits / BITS_PER_BYTE > bufferPool_.l0ASize)
        return false;
    if (baseK != -1 && baseN != -1 &&
        static_cast<int64_t>(baseK) * baseN * b_bits / BITS_PER_BYTE > bufferPool_.l0BSize)
        return false;
    if (baseM != -1 && baseN != -1 && static_cast<int64_t>(baseM) * baseN * FP32_BYTES > bufferPool_.l0CSize)
        return false;
    if (singleM <= 0 || singleN <= 0 || singleK <= 0) return false;
    return true;
}

int64_t MatmulApiTiling::GetTiling(optiling::TCubeTiling&) { return -1; }  // not modelled (fused_lce uses the other)

static int32_t align_up(int32_t a, int32_t b) { return (a + b - 1) / b * b; }

// A host library that does not keep SetFixSplit's base M / N (fused_lce_twin_host::set_base_tile_quirk) or SetShape's
// K as singleCoreK (set_single_k_quirk): what the next GetTiling calls return instead (0: keep them, as CANN's does).
static int32_t g_quirk_base_m = 0, g_quirk_base_n = 0, g_quirk_single_k = 0;

int64_t MatmulApiTiling::Compute() {
    if (!CheckSetParam()) return -1;
    if (g_quirk_base_m > 0) baseM = g_quirk_base_m;
    if (g_quirk_base_n > 0) baseN = g_quirk_base_n;
    // documented limits of a fixed split (SetFixSplit.md): base M <= singleM aligned to 16, base N <= singleN aligned
    // to the C0 size of the output
    if (baseM != -1 && baseM > align_up(singleM, C0_SIZE)) return -1;
    if (baseN != -1 && baseN > align_up(singleN, C0_SIZE)) return -1;
    const int32_t a_bytes = dtype_bits(aType_.dataType) / BITS_PER_BYTE;
    const int32_t b_bytes = dtype_bits(bType_.dataType) / BITS_PER_BYTE;
    const int32_t k0 = C0_BYTE_SIZE / a_bytes;
    if (baseM == -1) baseM = std::min(128, align_up(singleM, C0_SIZE));
    if (baseN == -1) baseN = std::min(128, align_up(singleN, C0_SIZE));
    while (static_cast<int64_t>(baseM) * baseN * FP32_BYTES > bufferPool_.l0CSize && baseN > C0_SIZE) baseN /= 2;
    if (baseK == -1) {
        // the largest power-of-two multiple of k0 that fits both L0A and L0B double-buffered
        int32_t k = 256;
        const int32_t kcap = align_up(singleK, k0);
        while (k > k0 && (k > kcap || static_cast<int64_t>(baseM) * k * a_bytes * 2 > bufferPool_.l0ASize ||
                          static_cast<int64_t>(baseN) * k * b_bytes * 2 > bufferPool_.l0BSize))
            k /= 2;
        baseK = std::max(k, k0);
    }
    if (static_cast<int64_t>(baseM) * baseK * a_bytes > bufferPool_.l0ASize ||
        static_cast<int64_t>(baseN) * baseK * b_bytes > bufferPool_.l0BSize)
        return -1;
    return 0;
}

int64_t MatmulApiTiling::GetTiling(AscendC::tiling::TCubeTiling& t) {
    if (Compute() != 0) return -1;
    const int32_t a_bytes = dtype_bits(aType_.dataType) / BITS_PER_BYTE;
    const int32_t b_bytes = dtype_bits(bType_.dataType) / BITS_PER_BYTE;
    t = AscendC::tiling::TCubeTiling();
    t.usedCoreNum = 1;
    t.M = orgM;
    t.N = orgN;
    t.Ka = orgKa;
    t.Kb = orgKb;
    t.singleCoreM = singleM;
    t.singleCoreN = singleN;
    t.singleCoreK = g_quirk_single_k > 0 ? g_quirk_single_k : singleK;
    t.baseM = baseM;
    t.baseN = baseN;
    t.baseK = baseK;
    t.stepM = 1;
    t.stepN = 1;
    t.stepKa = 1;
    t.stepKb = 1;
    t.depthA1 = 2;
    t.depthB1 = 2;
    t.isBias = isBias ? 1 : 0;
    t.iterateOrder = traverse_ == MatrixTraverse::FIRSTN ? 1 : 0;
    t.dbL0A = 2;
    t.dbL0B = 2;
    t.dbL0C = static_cast<int64_t>(baseM) * baseN * FP32_BYTES * 2 <= bufferPool_.l0CSize ? 2 : 1;
    t.shareL1Size = baseM * baseK * a_bytes * t.depthA1 + baseN * baseK * b_bytes * t.depthB1;
    t.shareL0CSize = baseM * baseN * FP32_BYTES;
    t.shareUbSize = 0;
    t.transLength = 0;
    if (t.shareL1Size > bufferPool_.l1Size) return -1;
    return 0;
}

}  // namespace matmul_tiling

// ------------------------------------------------------------------------------------------------ the harness
namespace fused_lce_twin_host {

void set_base_tile_quirk(int32_t base_m, int32_t base_n) {
    matmul_tiling::g_quirk_base_m = base_m;
    matmul_tiling::g_quirk_base_n = base_n;
}
void set_single_k_quirk(int32_t single_k) { matmul_tiling::g_quirk_single_k = single_k; }

Part part(const std::string& name) {
    Part p;
    if (name == "Ascend910B1" || name == "Ascend910B2") {
        p.aic = 24;
        p.aiv = 48;
    } else if (name == "Ascend910B3" || name == "Ascend910B4") {
        p.aic = 20;
        p.aiv = 40;
    } else if (name == "Ascend910_9391") {
        p.soc_version = "Ascend910_93";
        p.aic = 24;
        p.aiv = 48;
    } else if (name == "tiny") {
        p.aic = 2;
        p.aiv = 4;
    } else {
        throw std::invalid_argument("unknown part " + name);
    }
    return p;
}

const OpInfo* find_op(const std::string& type) {
    auto& r = gert::def_registry();
    auto it = r.find(type);
    return it == r.end() ? nullptr : &it->second;
}

std::vector<std::string> op_types() {
    std::vector<std::string> out;
    for (const auto& e : gert::def_registry()) out.push_back(e.first);
    return out;
}

static void fill_slot(uint64_t* slot, const AttrArg& a) {
    std::memset(slot, 0xA5, sizeof(*slot));
    switch (a.kind) {
        case AttrArg::kInt: std::memcpy(slot, &a.i, sizeof(a.i)); break;
        case AttrArg::kFloat: std::memcpy(slot, &a.f, sizeof(a.f)); break;
        case AttrArg::kBool: std::memcpy(slot, &a.b, sizeof(a.b)); break;
    }
}

static AttrArg::Kind kind_of(ops::AttrDataType t) {
    switch (t) {
        case ops::AttrDataType::ATTR_DT_FLOAT: return AttrArg::kFloat;
        case ops::AttrDataType::ATTR_DT_BOOL: return AttrArg::kBool;
        case ops::AttrDataType::ATTR_DT_INT: return AttrArg::kInt;
        default: throw std::invalid_argument("attribute type not modelled by the twin");
    }
}

// Builds the node of one call: instances for present inputs, IR instance info, attributes in OpDef order.
static void build_node(gert::TwinNode& n, const OpInfo& op, const std::vector<TensorArg>& ir_inputs,
                       const std::map<std::string, AttrArg>& attrs) {
    if (ir_inputs.size() != op.inputs.size())
        throw std::invalid_argument(op.type + ": expected " + std::to_string(op.inputs.size()) + " IR inputs");
    n.type = op.type;
    n.name = op.type + "_twin";
    for (size_t i = 0; i < ir_inputs.size(); ++i) {
        const TensorArg& t = ir_inputs[i];
        if (!t.present && op.inputs[i].param_type != ops::OPTIONAL)
            throw std::invalid_argument(op.type + ": required input " + op.inputs[i].name + " is absent");
        n.ir_inputs.emplace_back(n.input_descs.size(), t.present ? 1 : 0);
        if (!t.present) continue;
        gert::CompileTimeTensorDesc d;
        d.SetDataType(t.dtype);
        n.input_descs.push_back(d);
        gert::StorageShape s;
        for (const int64_t v : t.shape) {
            s.MutableOriginShape().AppendDim(v);
            s.MutableStorageShape().AppendDim(v);
        }
        n.input_shapes.push_back(s);
    }
    std::map<std::string, AttrArg> left = attrs;
    for (const AttrInfo& a : op.attrs) {
        AttrArg v;
        auto it = left.find(a.name);
        if (it != left.end()) {
            v = it->second;
            left.erase(it);
        } else if (a.has_default && a.attr_type == ops::OPTIONAL) {
            v = a.default_value;
        } else {
            throw std::invalid_argument(op.type + ": required attribute " + a.name + " not given");
        }
        if (v.kind != kind_of(a.data_type))
            throw std::invalid_argument(op.type + ": attribute " + a.name + " given with the wrong type");
        n.attr_slots.push_back(0);
        fill_slot(&n.attr_slots.back(), v);
    }
    if (!left.empty()) throw std::invalid_argument(op.type + ": unknown attribute " + left.begin()->first);
    n.output_descs.resize(op.outputs.size());
    n.output_shapes.resize(op.outputs.size());
    n.output_absent.assign(op.outputs.size(), 0);
    n.infer_output_shapes.resize(op.outputs.size());
    n.infer_output_dtypes.assign(op.outputs.size(), ge::DT_UNDEFINED);
    gert::TwinAccess::bind(&n.attrs, &n);
}

InferResult run_infer(const std::string& op_type, const std::vector<TensorArg>& ir_inputs,
                      const std::map<std::string, AttrArg>& attrs) {
    const OpInfo* op = find_op(op_type);
    if (op == nullptr) throw std::invalid_argument("no OpDef recorded for " + op_type);
    const auto& f = gert::TwinAccess::funcs_of(op_type);
    gert::TwinNode n;
    build_node(n, *op, ir_inputs, attrs);
    InferResult r;
    const auto infer_shape = f.infer_shape != nullptr ? f.infer_shape : op->infer_shape;
    const auto infer_dtype = f.infer_datatype != nullptr ? f.infer_datatype : op->infer_dtype;
    if (infer_shape != nullptr) {
        gert::InferShapeContext c;
        gert::TwinAccess::bind(&c, &n);
        r.shape_status = infer_shape(&c);
    }
    if (infer_dtype != nullptr) {
        gert::InferDataTypeContext c;
        gert::TwinAccess::bind(&c, &n);
        r.dtype_status = infer_dtype(&c);
    }
    for (const gert::Shape& s : n.infer_output_shapes) {
        std::vector<int64_t> v;
        for (size_t i = 0; i < s.GetDimNum(); ++i) v.push_back(s.GetDim(i));
        r.shapes.push_back(v);
    }
    r.dtypes = n.infer_output_dtypes;
    return r;
}

TilingResult run_tiling(const std::string& op_type, const std::vector<TensorArg>& ir_inputs,
                        const std::map<std::string, AttrArg>& attrs, const Part& part, uint8_t poison,
                        const std::map<size_t, TensorArg>& outputs) {
    const OpInfo* op = find_op(op_type);
    if (op == nullptr) throw std::invalid_argument("no OpDef recorded for " + op_type);
    const auto& f = gert::TwinAccess::funcs_of(op_type);
    if (f.tiling == nullptr) throw std::invalid_argument("no tiling function registered for " + op_type);
    gert::TwinNode n;
    build_node(n, *op, ir_inputs, attrs);
    // outputs as the caller would allocate them: what InferShape says (aclnn callers pass ready tensors)
    const auto infer_shape = f.infer_shape != nullptr ? f.infer_shape : op->infer_shape;
    if (infer_shape != nullptr) {
        gert::InferShapeContext c;
        gert::TwinAccess::bind(&c, &n);
        if (infer_shape(&c) == ge::GRAPH_SUCCESS) {
            for (size_t i = 0; i < n.infer_output_shapes.size(); ++i) {
                n.output_shapes[i].MutableOriginShape() = n.infer_output_shapes[i];
                n.output_shapes[i].MutableStorageShape() = n.infer_output_shapes[i];
            }
        }
    }
    for (const auto& o : outputs) {  // outputs the caller gives otherwise (or not at all)
        if (o.first >= n.output_shapes.size())
            throw std::invalid_argument(op->type + ": no output " + std::to_string(o.first));
        if (!o.second.present && op->outputs[o.first].param_type != ops::OPTIONAL)
            throw std::invalid_argument(op->type + ": required output " + op->outputs[o.first].name + " is absent");
        n.output_absent[o.first] = o.second.present ? 0 : 1;
        gert::Shape s;
        for (const int64_t v : o.second.shape) s.AppendDim(v);
        n.output_shapes[o.first].MutableOriginShape() = s;
        n.output_shapes[o.first].MutableStorageShape() = s;
    }
    fe::PlatFormInfos plat;
    plat.part = part;
    n.platform = &plat;
    // the buffer is poisoned so a field the tiling forgets to write is visible
    n.tiling_buffer.assign(f.max_tiling_data_size, poison);
    gert::TwinAccess::bind(&n.tiling_data, n.tiling_buffer.data(), n.tiling_buffer.size());
    gert::TilingContext c;
    gert::TwinAccess::bind(&c, &n);
    TilingResult r = n.out;
    r.status = f.tiling(&c);
    const TilingResult& o = n.out;
    r.block_dim_set = o.block_dim_set;
    r.block_dim = o.block_dim;
    r.schedule_mode_set = o.schedule_mode_set;
    r.schedule_mode = o.schedule_mode;
    r.workspace_set = o.workspace_set;
    r.workspaces.assign(n.workspace_storage, n.workspace_storage + o.workspaces.size());
    r.tiling_key_set = o.tiling_key_set;
    r.tiling_key = o.tiling_key;
    r.need_atomic = o.need_atomic;
    r.tiling_capacity = n.tiling_buffer.size();
    r.tiling_size = n.tiling_data.GetDataSize();
    r.tiling_data = n.tiling_buffer;
    return r;
}

}  // namespace fused_lce_twin_host
