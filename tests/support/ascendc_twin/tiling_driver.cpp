// Runs the real op_host tiling / inference functions of FusedLceStatsCube and FusedLceGradCube (linked in, registered
// by their OP_ADD in OP_TILING_LIB mode) under the host twin's runtime, for tests/ascend/host/test_host_tiling.py.
//
// stdin: one case per line, `key=value` words:
//   op=stats_cube|grad_cube part=Ascend910B2|... n= d= v= dtype=bf16|fp16|fp32
//   label=i32|i64 bias=0|1 softcap= temperature= mask= vocab_start= [with_zsum=0|1] [entropy=0|1] [coef_b=0|1]
//   [coef_u=0|1] [z_cache=0|1] [keep_dz=0|1] [keep_z=0|1] [variant=0..3] [absent=<input>] [shape.<input>=a,b] [dtype.<input>=..]
//   [out.z_cache=absent|a,b] (FusedLceStatsCube's optional output; default: (N, V) with keep_z, else absent, as the
//   adapter passes it) [mm_base=M,N] (GetTiling returns this base tile instead of the fixed one) [mm_single_k=K]
//   (GetTiling returns this singleCoreK instead of the GEMM's K)
// stdout: one JSON object per case: what the tiling set (status, block dim, schedule mode, workspaces, tiling data
// fields), the plan the cube planners give for the same problem on a HwSpec built here from the part's
// physical sizes minus PlatformAscendC's documented reservations (an independent path to the expected plan), and
// whether the tiling data bytes are fully written (two runs with different buffer poisons agree).
// `opdef <Type>` prints the recorded OpDef. `infer ...` (same keys) prints the inferred output shapes / dtypes.
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "twin_host_runtime.h"

#include "fused_lce_cube_tiling_data.h"

namespace th = fused_lce_twin_host;
namespace ft = fused_lce::tiling;
namespace fc = fused_lce::cube;

namespace {

std::map<std::string, std::string> parse(const std::string& line) {
    std::map<std::string, std::string> kv;
    std::istringstream is(line);
    std::string w;
    while (is >> w) {
        const size_t eq = w.find('=');
        if (eq == std::string::npos) {
            kv[w] = "";
        } else {
            kv[w.substr(0, eq)] = w.substr(eq + 1);
        }
    }
    return kv;
}

std::string get(const std::map<std::string, std::string>& kv, const std::string& k, const std::string& dflt) {
    auto it = kv.find(k);
    return it == kv.end() ? dflt : it->second;
}

ge::DataType dtype_of(const std::string& s) {
    if (s == "bf16") return ge::DT_BF16;
    if (s == "fp16") return ge::DT_FLOAT16;
    if (s == "fp32") return ge::DT_FLOAT;
    if (s == "i32") return ge::DT_INT32;
    if (s == "i64") return ge::DT_INT64;
    if (s == "i8") return ge::DT_INT8;
    throw std::invalid_argument("dtype " + s);
}

std::vector<int64_t> dims_of(const std::string& s) {
    std::vector<int64_t> d;
    std::istringstream is(s);
    std::string x;
    while (std::getline(is, x, ',')) {
        if (!x.empty()) d.push_back(std::stoll(x));
    }
    return d;
}

struct Case {
    std::string type;
    std::vector<th::TensorArg> inputs;
    std::map<std::string, th::AttrArg> attrs;
    th::Part part;
    std::map<size_t, th::TensorArg> outputs;  // overrides of the inferred outputs
    std::vector<int64_t> mm_base;             // the base tile GetTiling returns instead of the fixed one
    int32_t mm_single_k = 0;                  // the singleCoreK GetTiling returns instead of the GEMM's K
};

Case build(const std::map<std::string, std::string>& kv) {
    Case c;
    const std::string kind = get(kv, "op", "stats_cube");
    const bool grad = kind == "grad_cube";
    const std::map<std::string, std::string> types = {{"stats_cube", "FusedLceStatsCube"},
                                                      {"grad_cube", "FusedLceGradCube"}};
    c.type = types.at(kind);
    c.part = th::part(get(kv, "part", "Ascend910B2"));
    const int64_t n = std::stoll(get(kv, "n", "1")), d = std::stoll(get(kv, "d", "1")),
                  v = std::stoll(get(kv, "v", "1"));
    const ge::DataType dt = dtype_of(get(kv, "dtype", "bf16")), lt = dtype_of(get(kv, "label", "i64"));
    const bool bias = get(kv, "bias", "0") == "1";
    const th::OpInfo* op = th::find_op(c.type);
    if (op == nullptr) throw std::runtime_error("no OpDef for " + c.type);
    std::map<std::string, th::TensorArg> by_name;
    by_name["hidden"] = th::TensorArg{true, {n, d}, dt};
    by_name["weight"] = th::TensorArg{true, {v, d}, dt};
    by_name["bias"] = th::TensorArg{bias, {v}, dt};
    by_name["labels"] = th::TensorArg{true, {n}, lt};
    by_name["lse"] = th::TensorArg{true, {n}, ge::DT_FLOAT};
    by_name["coef_a"] = th::TensorArg{true, {n}, ge::DT_FLOAT};
    by_name["coef_t"] = th::TensorArg{true, {n}, ge::DT_FLOAT};
    by_name["coef_b"] = th::TensorArg{get(kv, "coef_b", "1") == "1", {n}, ge::DT_FLOAT};
    by_name["coef_u"] = th::TensorArg{get(kv, "coef_u", "1") == "1", {n}, ge::DT_FLOAT};
    by_name["z_cache"] = th::TensorArg{get(kv, "z_cache", "0") == "1", {n, v}, ge::DT_FLOAT};
    for (const auto& e : kv) {
        if (e.first.compare(0, 6, "shape.") == 0) by_name.at(e.first.substr(6)).shape = dims_of(e.second);
        if (e.first.compare(0, 6, "dtype.") == 0) by_name.at(e.first.substr(6)).dtype = dtype_of(e.second);
    }
    if (kv.count("absent")) by_name.at(get(kv, "absent", "")).present = false;
    for (const th::ParamInfo& p : op->inputs) c.inputs.push_back(by_name.at(p.name));
    const float softcap = std::stof(get(kv, "softcap", "0"));
    c.attrs["vocab_start"] = th::AttrArg::Int(std::stoll(get(kv, "vocab_start", "0")));
    c.attrs["softcap"] = th::AttrArg::Float(softcap);
    c.attrs["temperature"] = th::AttrArg::Float(std::stof(get(kv, "temperature", "1")));
    if (grad) {
        c.attrs["grad_mask"] = th::AttrArg::Int(std::stoll(get(kv, "mask", "7")));
        c.attrs["keep_dz"] = th::AttrArg::Bool(get(kv, "keep_dz", "0") == "1");
    } else {
        if (kv.count("keep_z")) c.attrs["keep_z"] = th::AttrArg::Bool(get(kv, "keep_z", "0") == "1");
        // z_cache, the last output
        const std::string zc = get(kv, "out.z_cache", get(kv, "keep_z", "0") == "1" ? "" : "absent");
        if (!zc.empty())
            c.outputs[op->outputs.size() - 1] =
                th::TensorArg{zc != "absent", zc != "absent" ? dims_of(zc) : std::vector<int64_t>(), ge::DT_FLOAT};
        c.attrs["with_zsum"] = th::AttrArg::Bool(get(kv, "with_zsum", "0") == "1");
        c.attrs["with_entropy"] = th::AttrArg::Bool(get(kv, "entropy", "0") == "1");
    }
    c.attrs["variant"] = th::AttrArg::Int(std::stoll(get(kv, "variant", "0")));
    if (kv.count("mm_base")) c.mm_base = dims_of(get(kv, "mm_base", ""));
    if (kv.count("mm_single_k")) c.mm_single_k = static_cast<int32_t>(std::stoll(get(kv, "mm_single_k", "0")));
    return c;
}

// The tiling function run on a case: twice (two buffer poisons), under its GetTiling quirk if any.
std::pair<th::TilingResult, th::TilingResult> run_twice(const Case& c) {
    if (c.mm_base.size() == 2)
        th::set_base_tile_quirk(static_cast<int32_t>(c.mm_base[0]), static_cast<int32_t>(c.mm_base[1]));
    th::set_single_k_quirk(c.mm_single_k);
    const th::TilingResult r = th::run_tiling(c.type, c.inputs, c.attrs, c.part, 0xCD, c.outputs);
    const th::TilingResult r2 = th::run_tiling(c.type, c.inputs, c.attrs, c.part, 0x5A, c.outputs);
    th::set_base_tile_quirk(0, 0);
    th::set_single_k_quirk(0);
    return {r, r2};
}

// The HwSpec the tiling should see on `p`, computed from the part's physical sizes (not through PlatformAscendC).
ft::HwSpec expected_hw(const th::Part& p) {
    ft::HwSpec hw;
    const uint64_t reserve = (p.soc_version == "Ascend910B" || p.soc_version == "Ascend910_93") ? 256 : 0;
    hw.cube_cores = p.aic;
    hw.vec_per_cube = p.aiv / p.aic;
    hw.ub_bytes = p.ub - reserve;
    hw.l1_bytes = p.l1 - reserve;
    hw.l0a_bytes = p.l0a;
    hw.l0b_bytes = p.l0b;
    hw.l0c_bytes = p.l0c;
    return hw;
}

// The plan fields the Python checks name; the whole Plan is compared bytewise ("plan_bytes_equal"), so a field added
// to fused_lce_tiling.h is covered without being listed here.
#define PLAN_FIELDS(X) \
    X(n) X(d) X(v) X(elt_bytes) X(flags) X(base_m) X(base_n) X(base_d) X(vec_rows) X(m_blocks) X(n_blocks) \
    X(segments) X(seg_blocks) X(tasks) X(used_cores) X(cube_cores) X(status)

std::string plan_json(const ft::Plan& p) {
    std::ostringstream o;
    o << std::boolalpha;
    o << "{";
    bool first = true;
#define EMIT(f)                                                        \
    o << (first ? "" : ",") << "\"" #f "\":" << static_cast<long long>(p.f); \
    first = false;
    PLAN_FIELDS(EMIT)
#undef EMIT
    o << "}";
    return o.str();
}

std::string cube_json(const AscendC::tiling::TCubeTiling& t) {
    std::ostringstream o;
    o << std::boolalpha;
    o << "{\"M\":" << t.M << ",\"N\":" << t.N << ",\"Ka\":" << t.Ka << ",\"Kb\":" << t.Kb
      << ",\"singleCoreM\":" << t.singleCoreM << ",\"singleCoreN\":" << t.singleCoreN
      << ",\"singleCoreK\":" << t.singleCoreK << ",\"baseM\":" << t.baseM << ",\"baseN\":" << t.baseN
      << ",\"baseK\":" << t.baseK << ",\"isBias\":" << t.isBias << ",\"usedCoreNum\":" << t.usedCoreNum
      << ",\"shareL1Size\":" << t.shareL1Size << ",\"shareL0CSize\":" << t.shareL0CSize
      << ",\"depthA1\":" << t.depthA1 << ",\"depthB1\":" << t.depthB1 << ",\"stepM\":" << t.stepM
      << ",\"stepN\":" << t.stepN << ",\"iterateOrder\":" << t.iterateOrder << "}";
    return o.str();
}

// What the tiling set for the launch (shared by every op): status, block dim, schedule mode, workspaces, and whether
// the first td_size bytes of the tiling data are the same after runs on two differently poisoned buffers.
void launch_json(std::ostringstream& o, const Case& c, const th::TilingResult& r, const th::TilingResult& r2,
                 size_t td_size) {
    o << "{\"op\":\"" << c.type << "\",\"status\":\"" << (r.status == ge::GRAPH_SUCCESS ? "ok" : "failed") << "\""
      << ",\"sizeof_td\":" << td_size << ",\"tiling_capacity\":" << r.tiling_capacity
      << ",\"tiling_size\":" << r.tiling_size << ",\"block_dim_set\":" << r.block_dim_set
      << ",\"block_dim\":" << r.block_dim << ",\"schedule_mode_set\":" << r.schedule_mode_set
      << ",\"schedule_mode\":" << r.schedule_mode << ",\"workspace_set\":" << r.workspace_set
      << ",\"lib_ws\":" << (c.part.arch == NpuArch::DAV_2201 ? 16u * 1024u * 1024u : 2u * 1024u * 1024u)
      << ",\"aic\":" << c.part.aic << ",\"workspaces\":[";
    for (size_t i = 0; i < r.workspaces.size(); ++i) o << (i ? "," : "") << r.workspaces[i];
    o << "]";
    // the whole tiling struct written, identically, whatever the buffer held before
    const bool same = r.tiling_data.size() >= td_size && r2.tiling_data.size() >= td_size &&
                      std::memcmp(r.tiling_data.data(), r2.tiling_data.data(), td_size) == 0;
    o << ",\"td_deterministic\":" << same;
}

// The tiling data against plan_stats() / plan_grad() of fused_lce_cube_tiling.h on the part's
// memories (the planner the twin kernels run with), bytewise for the whole CubePlan / CubeGradPlan.
template <typename MP>
std::string cube_plan_json(const MP& m) {
    std::ostringstream o;
    o << "{\"base\":" << plan_json(m.base) << ",\"slot_stride\":" << m.slot_stride << ",\"ub_end\":" << m.ub_end
      << ",\"ws_total\":" << m.ws_total << ",\"ws_ring\":" << m.ws_ring << ",\"status\":" << m.status;
    return o.str();
}

std::string cube_plan_json(const fc::CubeGradPlan& m) {  // plus the kept-dz workspace of the one-pass modes
    std::ostringstream o;
    o << cube_plan_json<fc::CubeGradPlan>(m) << ",\"ws_total_keep\":" << m.ws_total_keep
      << ",\"keep_cols\":" << m.keep_cols;
    return o.str();
}

void run_case(const std::map<std::string, std::string>& kv) {
    const Case c = build(kv);
    const auto runs = run_twice(c);
    const th::TilingResult &r = runs.first, &r2 = runs.second;
    const bool grad = c.type == "FusedLceGradCube";
    const size_t td_size = grad ? sizeof(FusedLceGradCubeTilingData) : sizeof(FusedLceStatsCubeTilingData);
    std::ostringstream o;
    o << std::boolalpha << std::setprecision(9);  // float32 attributes round-trip exactly
    launch_json(o, c, r, r2, td_size);
    const th::TensorArg& h = c.inputs[grad ? 4 : 0];
    const th::TensorArg& w = c.inputs[grad ? 5 : 1];
    const bool bias = c.inputs[grad ? 6 : 2].present;
    const bool ok = r.status == ge::GRAPH_SUCCESS && r.tiling_data.size() >= td_size;
    if (h.shape.size() == 2 && w.shape.size() == 2) {
        const uint64_t n = static_cast<uint64_t>(h.shape[0]), d = static_cast<uint64_t>(h.shape[1]),
                       v = static_cast<uint64_t>(w.shape[0]);
        const uint32_t elt = h.dtype == ge::DT_FLOAT ? 4u : 2u;
        uint32_t flags = (bias ? ft::kBias : 0u) | (c.attrs.at("softcap").f > 0 ? ft::kSoftcap : 0u);
        if (grad) {
            const fc::CubeGradPlan e = fc::plan_grad(n, d, v, elt, flags, expected_hw(c.part));
            o << ",\"expected_plan\":" << cube_plan_json(e) << ",\"ws_dz\":" << e.ws_dz
              << ",\"ws_db\":" << e.ws_db << "},\"l1_bytes\":" << expected_hw(c.part).l1_bytes;
            if (ok) {
                FusedLceGradCubeTilingData td;
                std::memcpy(static_cast<void*>(&td), r.tiling_data.data(), td_size);
                o << ",\"plan\":" << cube_plan_json(td.plan) << ",\"ws_dz\":" << td.plan.ws_dz
                  << ",\"ws_db\":" << td.plan.ws_db << "}"
                  << ",\"plan_bytes_equal\":" << (std::memcmp(&td.plan, &e, sizeof(e)) == 0)
                  << ",\"vocabStart\":" << td.vocabStart << ",\"softcap\":" << td.softcap
                  << ",\"invTemperature\":" << td.invTemperature << ",\"gradMask\":" << td.gradMask
                  << ",\"hasBias\":" << td.hasBias << ",\"hasB\":" << td.hasB << ",\"hasU\":" << td.hasU
                  << ",\"keepDz\":" << td.keepDz << ",\"hasZCache\":" << td.hasZCache
                  << ",\"variant\":" << td.variant
                  << ",\"mmZ\":" << cube_json(td.mmZ) << ",\"mmDx\":" << cube_json(td.mmDx)
                  << ",\"mmDw\":" << cube_json(td.mmDw) << ",\"mmDxAll\":" << cube_json(td.mmDxAll)
                  << ",\"mmDwAll\":" << cube_json(td.mmDwAll);
            }
        } else {
            if (c.attrs.at("with_zsum").b) flags |= ft::kSmoothing;
            const bool ez = c.attrs.at("with_entropy").b;
            const fc::CubePlan e = fc::plan_stats(n, d, v, elt, flags, ez, expected_hw(c.part));
            o << ",\"expected_plan\":" << cube_plan_json(e) << ",\"ws_stats\":" << e.ws_stats
              << "},\"l1_bytes\":" << expected_hw(c.part).l1_bytes;
            if (ok) {
                FusedLceStatsCubeTilingData td;
                std::memcpy(static_cast<void*>(&td), r.tiling_data.data(), td_size);
                o << ",\"plan\":" << cube_plan_json(td.plan) << ",\"ws_stats\":"
                  << td.plan.ws_stats << "}"
                  << ",\"plan_bytes_equal\":" << (std::memcmp(&td.plan, &e, sizeof(e)) == 0)
                  << ",\"vocabStart\":" << td.vocabStart << ",\"softcap\":" << td.softcap
                  << ",\"invTemperature\":" << td.invTemperature << ",\"withZsum\":" << td.withZsum
                  << ",\"withEz\":" << td.withEz << ",\"hasBias\":" << td.hasBias
                  << ",\"labelBytes\":" << td.labelBytes << ",\"hasZCache\":" << td.hasZCache
                  << ",\"variant\":" << td.variant
                  << ",\"mmLogits\":" << cube_json(td.mmLogits);
            }
        }
    }
    o << "}";
    std::cout << o.str() << std::endl;
}

const char* option_name(ops::Option o) {
    switch (o) {
        case ops::REQUIRED: return "required";
        case ops::OPTIONAL: return "optional";
        case ops::DYNAMIC: return "dynamic";
        default: return "other";
    }
}

const char* attr_type_name(ops::AttrDataType t) {
    switch (t) {
        case ops::AttrDataType::ATTR_DT_INT: return "int";
        case ops::AttrDataType::ATTR_DT_FLOAT: return "float";
        case ops::AttrDataType::ATTR_DT_BOOL: return "bool";
        default: return "other";
    }
}

void print_opdef(const std::string& type) {
    const th::OpInfo* op = th::find_op(type);
    if (op == nullptr) {
        std::cout << "{\"error\":\"no OpDef " << type << "\"}" << std::endl;
        return;
    }
    std::ostringstream o;
    o << std::boolalpha;
    auto params = [&o](const std::vector<th::ParamInfo>& ps) {
        o << "[";
        for (size_t i = 0; i < ps.size(); ++i) {
            o << (i ? "," : "") << "{\"name\":\"" << ps[i].name << "\",\"param\":\"" << option_name(ps[i].param_type)
              << "\",\"dtypes\":[";
            for (size_t j = 0; j < ps[i].dtypes.size(); ++j) o << (j ? "," : "") << static_cast<int>(ps[i].dtypes[j]);
            o << "],\"formats\":" << ps[i].formats.size() << "}";
        }
        o << "]";
    };
    o << "{\"type\":\"" << op->type << "\",\"inputs\":";
    params(op->inputs);
    o << ",\"outputs\":";
    params(op->outputs);
    o << ",\"attrs\":[";
    for (size_t i = 0; i < op->attrs.size(); ++i) {
        const th::AttrInfo& a = op->attrs[i];
        o << (i ? "," : "") << "{\"name\":\"" << a.name << "\",\"type\":\"" << attr_type_name(a.data_type)
          << "\",\"param\":\"" << option_name(a.attr_type) << "\",\"has_default\":" << a.has_default << "}";
    }
    o << "],\"configs\":[";
    for (size_t i = 0; i < op->aicore_configs.size(); ++i) o << (i ? "," : "") << "\"" << op->aicore_configs[i] << "\"";
    o << "],\"has_tiling\":" << op->has_tiling << ",\"has_infer_shape\":" << op->has_infer_shape
      << ",\"has_infer_dtype\":" << op->has_infer_dtype << "}";
    std::cout << o.str() << std::endl;
}

void print_infer(const std::map<std::string, std::string>& kv) {
    const Case c = build(kv);
    const th::InferResult r = th::run_infer(c.type, c.inputs, c.attrs);
    std::ostringstream o;
    o << std::boolalpha;
    o << "{\"shape_ok\":" << (r.shape_status == ge::GRAPH_SUCCESS) << ",\"dtype_ok\":"
      << (r.dtype_status == ge::GRAPH_SUCCESS) << ",\"shapes\":[";
    for (size_t i = 0; i < r.shapes.size(); ++i) {
        o << (i ? "," : "") << "[";
        for (size_t j = 0; j < r.shapes[i].size(); ++j) o << (j ? "," : "") << r.shapes[i][j];
        o << "]";
    }
    o << "],\"dtypes\":[";
    for (size_t i = 0; i < r.dtypes.size(); ++i) o << (i ? "," : "") << static_cast<int>(r.dtypes[i]);
    o << "]}";
    std::cout << o.str() << std::endl;
}

}  // namespace

int main() {
    std::cout << std::boolalpha;
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        try {
            const std::map<std::string, std::string> kv = parse(line);
            if (kv.count("opdef")) {
                print_opdef(get(kv, "opdef", ""));
            } else if (kv.count("infer")) {
                print_infer(kv);
            } else {
                run_case(kv);
            }
        } catch (const std::exception& e) {
            std::cout << "{\"error\":\"" << e.what() << "\"}" << std::endl;
        }
    }
    return 0;
}
