// Internal: the row merge of split-kv partials, shared by the merge kernel and the decode
// kernel's fused merge. Included by .cu files only.
#ifndef KILN_ATTENTION_INTERNAL_MERGE_CUH_
#define KILN_ATTENTION_INTERNAL_MERGE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/internal/mma.cuh"

namespace kiln {
namespace attention_internal {

// Merges rows [0, num_rows) of partial slots [first_slot, first_slot + num_slots) of `kv_head`
// into o, with `num_threads` threads numbered `thread`. Row r is packed query row
// row_begin + r of the sequence whose first token is q_start. Loads bypass L1 (ld.global.cg):
// in the fused merge the partials were written by other CTAs of the same launch.
template <AttentionDtype kDtype, int kHeadDim>
__device__ __forceinline__ void MergeRows(const float* partial_o, const float* partial_lse,
                                          int num_kv_heads, int tile_rows, int first_slot,
                                          int num_slots, int kv_head, int row_begin,
                                          int num_rows, int q_start, int group, uint16_t* o,
                                          int64_t o_stride, int thread, int num_threads) {
  using Ops = DtypeOps<kDtype>;
  constexpr int kChunks = kHeadDim / 8;  // threads per row, 8 dimensions each
  const int chunk = thread % kChunks;
  constexpr int kBatch = 8;  // slots whose loads are in flight together
  for (int row = thread / kChunks; row < num_rows; row += num_threads / kChunks) {
    auto slot_row = [&](int i) {
      return (static_cast<int64_t>(first_slot + i) * num_kv_heads + kv_head) * tile_rows + row;
    };
    // One pass with a running maximum, kBatch slots per round trip to L2. -0 + x == x for
    // every x (even -0), so a single split is copied exactly.
    float running_max = NegativeInfinity();
    float weight_sum = 0.f;
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = -0.f;
    for (int i0 = 0; i0 < num_slots; i0 += kBatch) {
      float lse[kBatch];
      float4 lo[kBatch], hi[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u;
        lse[u] = NegativeInfinity();
        lo[u] = hi[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < num_slots) {
          lse[u] = __ldcg(partial_lse + slot_row(i));
          const float4* src =
              reinterpret_cast<const float4*>(partial_o + slot_row(i) * kHeadDim + 8 * chunk);
          lo[u] = __ldcg(src);
          hi[u] = __ldcg(src + 1);
        }
      }
      float batch_max = NegativeInfinity();
#pragma unroll
      for (int u = 0; u < kBatch; ++u) batch_max = fmaxf(batch_max, lse[u]);
      if (batch_max == NegativeInfinity()) continue;  // every chunk here empty: weight 0
      const float new_max = fmaxf(running_max, batch_max);
      const float rescale = exp2f(running_max - new_max);  // 0 while nothing was seen
      running_max = new_max;
      weight_sum *= rescale;
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] *= rescale;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (lse[u] == NegativeInfinity()) continue;  // empty chunk for this row: weight 0
        const float w = exp2f(lse[u] - running_max);
        weight_sum += w;
        acc[0] = fmaf(w, lo[u].x, acc[0]);
        acc[1] = fmaf(w, lo[u].y, acc[1]);
        acc[2] = fmaf(w, lo[u].z, acc[2]);
        acc[3] = fmaf(w, lo[u].w, acc[3]);
        acc[4] = fmaf(w, hi[u].x, acc[4]);
        acc[5] = fmaf(w, hi[u].y, acc[5]);
        acc[6] = fmaf(w, hi[u].z, acc[6]);
        acc[7] = fmaf(w, hi[u].w, acc[7]);
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
    const int r = row_begin + row;
    const int j = r / group;
    const int g = r - j * group;
    uint16_t* out = o + static_cast<int64_t>(q_start + j) * o_stride +
                    static_cast<int64_t>(kv_head * group + g) * kHeadDim + 8 * chunk;
    *reinterpret_cast<uint4*>(out) =
        make_uint4(Ops::Pack(acc[0], acc[1]), Ops::Pack(acc[2], acc[3]),
                   Ops::Pack(acc[4], acc[5]), Ops::Pack(acc[6], acc[7]));
  }
}

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_MERGE_CUH_
