// The merge kernel: combines the partial results of a split tile into o (see merge_kernel.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/internal/kernel_args.h"
#include "attention/internal/merge.cuh"

namespace kiln {
namespace attention_internal {
namespace {

constexpr int kMergeThreads = 128;

// One CTA per (merge item, KV head); D/8 threads per row, each owning 8 dimensions.
template <AttentionDtype kDtype, int kHeadDim>
__global__ void __launch_bounds__(kMergeThreads) AttentionMergeKernel(const MergeKernelArgs args) {
  const AttentionMergeItem item = args.merge_items[blockIdx.x];
  if (item.seq < 0) return;  // padding
  MergeRows<kDtype, kHeadDim>(args.partial_o, args.partial_lse, args.num_kv_heads,
                              args.tile_rows, item.first_slot, item.num_slots, blockIdx.y,
                              item.row_begin, item.row_end - item.row_begin,
                              args.seq_q_start[item.seq], args.group_size,
                              static_cast<uint16_t*>(args.o), args.o_stride, threadIdx.x,
                              kMergeThreads);
}

}  // namespace

template <AttentionDtype kDtype, int kHeadDim>
cudaError_t LaunchMergeKernel(const MergeKernelArgs& args, int grid_x, cudaStream_t stream) {
  const dim3 grid(grid_x, args.num_kv_heads);
  AttentionMergeKernel<kDtype, kHeadDim><<<grid, kMergeThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

template cudaError_t LaunchMergeKernel<AttentionDtype::kBf16, 64>(const MergeKernelArgs&, int,
                                                                  cudaStream_t);
template cudaError_t LaunchMergeKernel<AttentionDtype::kBf16, 128>(const MergeKernelArgs&, int,
                                                                   cudaStream_t);
template cudaError_t LaunchMergeKernel<AttentionDtype::kFp16, 64>(const MergeKernelArgs&, int,
                                                                  cudaStream_t);
template cudaError_t LaunchMergeKernel<AttentionDtype::kFp16, 128>(const MergeKernelArgs&, int,
                                                                   cudaStream_t);

}  // namespace attention_internal
}  // namespace kiln
