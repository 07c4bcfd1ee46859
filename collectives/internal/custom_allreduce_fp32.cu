// fp32 instantiations of the custom all-reduce kernels (one file per dtype builds in parallel).
#include "collectives/internal/custom_allreduce_kernels.cuh"

namespace kiln {
namespace internal {

cudaError_t LaunchCustomAllReduceFp32(const CustomAllReduceArgs& args, int world_size,
                                      bool two_shot, int blocks, int threads, bool programmatic,
                                      cudaStream_t stream) {
  return LaunchForType<float>(args, world_size, two_shot, blocks, threads, programmatic, stream);
}

}  // namespace internal
}  // namespace kiln
