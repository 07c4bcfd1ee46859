// Dtype dispatch of the custom all-reduce and the P2P probe kernel.
#include <cuda_runtime.h>

#include "collectives/internal/custom_allreduce_kernels.h"

namespace kiln {
namespace internal {
namespace {

struct ProbeArgs {
  char* regions[kMaxRanks];
};

// Thread p writes this rank's probe record into peer p's region through the IPC mapping.
__global__ void P2pProbeKernel(const ProbeArgs args, int world_size, int rank, uint32_t nonce) {
  const int peer = threadIdx.x;
  if (peer >= world_size) return;
  volatile uint4* slot =
      reinterpret_cast<volatile uint4*>(args.regions[peer] + kProbeOffset) + rank;
  uint4 record = make_uint4(kProbeMagic, static_cast<uint32_t>(rank), static_cast<uint32_t>(peer),
                            nonce);
  slot->x = record.x;
  slot->y = record.y;
  slot->z = record.z;
  slot->w = record.w;
  __threadfence_system();
}

}  // namespace

cudaError_t LaunchCustomAllReduce(const CustomAllReduceArgs& args, KernelDtype dtype,
                                  int world_size, bool two_shot, int blocks, int threads,
                                  bool programmatic, cudaStream_t stream) {
  switch (dtype) {
    case KernelDtype::kBf16:
      return LaunchCustomAllReduceBf16(args, world_size, two_shot, blocks, threads, programmatic,
                                       stream);
    case KernelDtype::kFp16:
      return LaunchCustomAllReduceFp16(args, world_size, two_shot, blocks, threads, programmatic,
                                       stream);
    case KernelDtype::kFp32:
      return LaunchCustomAllReduceFp32(args, world_size, two_shot, blocks, threads, programmatic,
                                       stream);
  }
  return cudaErrorInvalidValue;  // unsupported dtype
}

cudaError_t LaunchP2pProbe(char* const* regions, int world_size, int rank, uint32_t nonce,
                           cudaStream_t stream) {
  if (world_size < 1 || world_size > kMaxRanks) return cudaErrorInvalidValue;
  ProbeArgs args{};
  for (int i = 0; i < world_size; ++i) args.regions[i] = regions[i];
  P2pProbeKernel<<<1, 32, 0, stream>>>(args, world_size, rank, nonce);
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace kiln
