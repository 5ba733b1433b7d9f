// Stub of CANN's register/op_def_factory.h (hicann/metadef inc/external/asc/register/op_def_factory.h): where OP_ADD
// registers an op definition when compiled for opbuild (neither OP_TILING_LIB nor OP_PROTO_LIB defined).
#ifndef FUSED_LCE_TWIN_HOST_REGISTER_OP_DEF_FACTORY_H_
#define FUSED_LCE_TWIN_HOST_REGISTER_OP_DEF_FACTORY_H_

#include <functional>

#include "register/op_def.h"

namespace ops {

using OpDefCreator = std::function<OpDef(const char*)>;
using OpDefFuncPtr = OpDef (*)(const char*);

class OpDefFactory {
public:
    static int OpDefRegister(const char* name, OpDefCreator creator);
    static int __attribute__((weak)) OpDefRegisterV2(const char* name, OpDefFuncPtr ptr);
};

}  // namespace ops

#endif  // FUSED_LCE_TWIN_HOST_REGISTER_OP_DEF_FACTORY_H_
