// The merge kernel: combines the partial results of a split tile into o (see merge_kernel.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/internal/kernel_args.h"
#include "attention/internal/mma.cuh"

namespace kiln {
namespace attention_internal {
namespace {

constexpr int kMergeThreads = 128;

// One CTA per (merge item, KV head); D/8 threads per row, each owning 8 dimensions.
template <AttentionDtype kDtype, int kHeadDim>
__global__ void __launch_bounds__(kMergeThreads) AttentionMergeKernel(const MergeKernelArgs args) {
  using Ops = DtypeOps<kDtype>;
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kRowsPerPass = kMergeThreads / kChunks;
  const AttentionMergeItem item = args.merge_items[blockIdx.x];
  if (item.seq < 0) return;  // padding
  const int kv_head = blockIdx.y;
  const int num_rows = item.row_end - item.row_begin;
  const int q_start = args.seq_q_start[item.seq];
  const int chunk = threadIdx.x % kChunks;
  for (int row = threadIdx.x / kChunks; row < num_rows; row += kRowsPerPass) {
    auto slot_row = [&](int i) {
      return (static_cast<int64_t>(item.first_slot + i) * args.num_kv_heads + kv_head) *
                 args.tile_rows +
             row;
    };
    float max_lse = NegativeInfinity();
    for (int i = 0; i < item.num_slots; ++i) max_lse = fmaxf(max_lse, args.partial_lse[slot_row(i)]);
    // -0 + x == x for every x (even -0), so a single split is copied exactly.
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = -0.f;
    float weight_sum = 0.f;
    if (max_lse != NegativeInfinity()) {
      for (int i = 0; i < item.num_slots; ++i) {
        const float lse = args.partial_lse[slot_row(i)];
        if (lse == NegativeInfinity()) continue;  // empty chunk for this row: weight 0
        const float w = exp2f(lse - max_lse);
        weight_sum += w;
        const float4* src =
            reinterpret_cast<const float4*>(args.partial_o + slot_row(i) * kHeadDim + 8 * chunk);
        const float4 a = src[0];
        const float4 b = src[1];
        acc[0] = fmaf(w, a.x, acc[0]);
        acc[1] = fmaf(w, a.y, acc[1]);
        acc[2] = fmaf(w, a.z, acc[2]);
        acc[3] = fmaf(w, a.w, acc[3]);
        acc[4] = fmaf(w, b.x, acc[4]);
        acc[5] = fmaf(w, b.y, acc[5]);
        acc[6] = fmaf(w, b.z, acc[6]);
        acc[7] = fmaf(w, b.w, acc[7]);
      }
    }
    // No chunk saw any KV for this row: zeros, never NaN.
    if (weight_sum > 0.f) {
      const float inv = 1.f / weight_sum;
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] *= inv;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] = 0.f;
    }
    const int r = item.row_begin + row;
    const int j = r / args.group_size;
    const int g = r - j * args.group_size;
    uint16_t* out = static_cast<uint16_t*>(args.o) +
                    static_cast<int64_t>(q_start + j) * args.o_stride +
                    static_cast<int64_t>(kv_head * args.group_size + g) * kHeadDim + 8 * chunk;
    *reinterpret_cast<uint4*>(out) =
        make_uint4(Ops::Pack(acc[0], acc[1]), Ops::Pack(acc[2], acc[3]),
                   Ops::Pack(acc[4], acc[5]), Ops::Pack(acc[6], acc[7]));
  }
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
