// bf16 instantiations of the custom all-reduce kernels (one file per dtype builds in parallel).
#include "collectives/internal/custom_allreduce_kernels.cuh"

namespace kiln {
namespace internal {

cudaError_t LaunchCustomAllReduceBf16(const CustomAllReduceArgs& args, int world_size,
                                      bool two_shot, int blocks, int threads, bool programmatic,
                                      cudaStream_t stream) {
  return LaunchForType<__nv_bfloat16>(args, world_size, two_shot, blocks, threads, programmatic,
                                      stream);
}

}  // namespace internal
}  // namespace kiln
