// Host half of the CPU twin: the part of the CANN runtime that runs op_host code, for tests. Outside include/ on
// purpose: op_host sources see only include/ (the stub of ${CANN}/include); test drivers include this file too.
//
// What it does: keeps the registries OP_ADD writes into (OpDef snapshots, OpImplRegisterV2 functions), builds a
// node the way the aclnn layer does for a call (one instance per present input, IR instance info for optional
// inputs, attributes in OpDef order, a tiling buffer of the registered capacity, a platform), runs the registered
// tiling / shape / dtype functions and records everything they set.
// Status: compiled and run on CPU in CI (tests/ascend/host). It is a model of CANN, checked against the headers
// and sources cited in include/; it is not CANN.
#ifndef FUSED_LCE_TWIN_HOST_RUNTIME_H_
#define FUSED_LCE_TWIN_HOST_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"

namespace fused_lce_twin_host {

// A part's resources as the platform info of the real runtime reports them (physical sizes; PlatformAscendC
// subtracts its reservations). Presets: part("Ascend910B2") etc.
struct Part {
    std::string soc_version = "Ascend910B";  // short SoC version (what GetSocVersion maps)
    NpuArch arch = NpuArch::DAV_2201;
    uint32_t aic = 24, aiv = 48;
    uint64_t ub = 192 * 1024, l1 = 512 * 1024, l0a = 64 * 1024, l0b = 64 * 1024, l0c = 128 * 1024;
};
// Known presets: "Ascend910B1".."Ascend910B4", "Ascend910_9391" (A3), and the synthetic "tiny" (2 AIC / 4 AIV,
// 910B memories: forces vocabulary segments with few token blocks). Throws std::invalid_argument otherwise.
Part part(const std::string& name);

struct TensorArg {
    TensorArg() = default;
    TensorArg(bool p, std::vector<int64_t> s, ge::DataType t) : present(p), shape(std::move(s)), dtype(t) {}
    bool present = true;  // false: an optional input the caller passed as nullptr (no instance)
    std::vector<int64_t> shape;
    ge::DataType dtype = ge::DT_UNDEFINED;
};

struct AttrArg {
    enum Kind { kInt, kFloat, kBool } kind = kInt;
    int64_t i = 0;
    float f = 0.0f;
    bool b = false;
    static AttrArg Int(int64_t v) { AttrArg a; a.kind = kInt; a.i = v; return a; }
    static AttrArg Float(float v) { AttrArg a; a.kind = kFloat; a.f = v; return a; }
    static AttrArg Bool(bool v) { AttrArg a; a.kind = kBool; a.b = v; return a; }
};

// The recorded OpDef (what opbuild would generate the aclnn API from).
struct ParamInfo {
    std::string name;
    ops::Option param_type = ops::REQUIRED;
    std::vector<ge::DataType> dtypes;
    std::vector<ge::Format> formats;
};
struct AttrInfo {
    std::string name;
    ops::Option attr_type = ops::REQUIRED;
    ops::AttrDataType data_type = ops::AttrDataType::ATTR_DT_INT;
    bool has_default = false;
    AttrArg default_value;
};
struct OpInfo {
    std::string type;
    std::vector<ParamInfo> inputs, outputs;
    std::vector<AttrInfo> attrs;
    std::vector<std::string> aicore_configs;  // AddConfig socs
    bool has_tiling = false, has_infer_shape = false, has_infer_dtype = false;
    // what the GRAPH library's OP_ADD would register (the TILING library registers only the tiling function)
    gert::OpImplRegisterV2::InferShapeKernelFunc infer_shape = nullptr;
    gert::OpImplRegisterV2::InferDataTypeKernelFunc infer_dtype = nullptr;
};
// nullptr when no OpDef of that type was constructed (OP_ADD runs at static initialisation).
const OpInfo* find_op(const std::string& type);
// every op type an OpDef was recorded for, sorted
std::vector<std::string> op_types();

struct TilingResult {
    ge::graphStatus status = ge::GRAPH_FAILED;
    size_t tiling_capacity = 0;    // bytes the runtime offered (OpImplRegisterV2::Tiling max_tiling_data_size)
    size_t tiling_size = 0;        // bytes the tiling function declared used (TilingData::GetDataSize)
    std::vector<uint8_t> tiling_data;  // tiling_capacity bytes as left by the tiling function
    bool block_dim_set = false;
    uint32_t block_dim = 0;
    bool schedule_mode_set = false;
    uint32_t schedule_mode = 0;
    bool workspace_set = false;
    std::vector<size_t> workspaces;
    bool tiling_key_set = false;
    uint64_t tiling_key = 0;
    bool need_atomic = false;
};

// Runs the tiling function registered for `op_type` (OP_ADD in OP_TILING_LIB mode) on a node with inputs given per IR
// input (in OpDef order; absent optional inputs have present = false), attributes by name (a missing optional
// attribute takes its OpDef default, a missing required one throws std::invalid_argument), outputs shaped by the
// registered InferShape (if any). Throws std::invalid_argument for an unknown op or a bad argument list.
// The tiling buffer is filled with `poison` first: running twice with two poisons shows bytes the tiling left unset.
// `outputs` (by output index) overrides InferShape's shape of an output, or makes an optional output absent
// (present = false: no output instance, GetOutputShape returns nullptr).
TilingResult run_tiling(const std::string& op_type, const std::vector<TensorArg>& ir_inputs,
                        const std::map<std::string, AttrArg>& attrs, const Part& part, uint8_t poison = 0xCD,
                        const std::map<size_t, TensorArg>& outputs = {});

// Makes the host MatmulApiTiling::GetTiling return base M / N other than SetFixSplit's (0: keep them, as CANN's
// does: matmul_tiling_base.cpp SetFixSplit pins min = max): for tests that the tilings refuse a tiling whose base tile
// is not the one their plan fixed. Stays in effect until reset with (0, 0).
void set_base_tile_quirk(int32_t base_m, int32_t base_n);
// Makes GetTiling return this singleCoreK instead of SetShape's K (0: keep it, as a single-core SetShape does).
void set_single_k_quirk(int32_t single_k);

struct InferResult {
    ge::graphStatus shape_status = ge::GRAPH_FAILED, dtype_status = ge::GRAPH_FAILED;
    std::vector<std::vector<int64_t>> shapes;  // per output
    std::vector<ge::DataType> dtypes;          // per output
};
InferResult run_infer(const std::string& op_type, const std::vector<TensorArg>& ir_inputs,
                      const std::map<std::string, AttrArg>& attrs);

}  // namespace fused_lce_twin_host

#endif  // FUSED_LCE_TWIN_HOST_RUNTIME_H_
