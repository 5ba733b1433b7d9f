// Test launcher of the AscendC CPU twin (the role ICPU_RUN_KF plays in AscendC's CPU-debug mode): registers the
// kernel's global-memory buffers with the twin and runs the kernel entry on every vector core of a launch,
// interleaved by the twin's seeded scheduler. Throws twin::Error with the first error the twin detected.
#ifndef FUSED_LCE_TESTS_TWIN_LAUNCH_H_
#define FUSED_LCE_TESTS_TWIN_LAUNCH_H_

#include <string>
#include <vector>

#include "kernel_operator.h"

namespace twin_test {

struct GmBuffer {
    const void* ptr;
    uint64_t bytes;
    std::string name;
    bool read_only;
};

// Runs `entry` (a callable that calls the kernel with its GM_ADDR arguments) on block_dim AI cores with `ratio`
// vector cores each (2 for a MIX 1:2 kernel). `buffers` are the kernel's GM arguments; the system workspace (the
// first sys_bytes of the workspace argument) is registered by the twin itself.
template <class Entry>
inline void run_kernel(int block_dim, int ratio, const twin::Config& cfg, const std::vector<GmBuffer>& buffers,
                       GM_ADDR sys_workspace, uint64_t sys_bytes, Entry entry) {
    twin::LaunchSpec spec;
    spec.block_dim = block_dim;
    spec.ratio = ratio;
    spec.cfg = cfg;
    spec.sys_workspace = sys_workspace;
    spec.sys_workspace_bytes = sys_bytes;
    twin::launch(
        spec, [&entry]() { entry(); },
        [&buffers](twin::Runtime&) {
            for (const GmBuffer& b : buffers) twin::register_gm(b.ptr, b.bytes, b.name, b.read_only);
        });
}

}  // namespace twin_test

#endif  // FUSED_LCE_TESTS_TWIN_LAUNCH_H_
