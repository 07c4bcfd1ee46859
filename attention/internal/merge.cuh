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
// into o, with `num_threads` (a multiple of 32) threads numbered `thread`; every thread of the
// CTA must call it (it shuffles within warps). Row r is packed query row
// row_begin + r of the sequence whose first token is q_start. Loads bypass L1 (ld.global.cg):
// in the fused merge the partials were written by other CTAs of the same launch.
template <AttentionDtype kDtype, int kHeadDim>
__device__ __forceinline__ void MergeRows(const float* partial_o, const float* partial_lse,
                                          int num_kv_heads, int tile_rows, int first_slot,
                                          int num_slots, int kv_head, int row_begin,
                                          int num_rows, int q_start, int group, uint16_t* o,
                                          int64_t o_stride, int thread, int num_threads) {
  using Ops = DtypeOps<kDtype>;
  constexpr unsigned kFull = 0xffffffffu;
  constexpr int kChunks = kHeadDim / 8;  // (row, 8 dimensions) cells per row
  // Slots per thread whose loads fly together: 9 registers each. For head_dim 64 the fused merge
  // runs inside the decode kernel at its cap of 168 registers, where 16 slots' loads did not all
  // fly at once: per-CTA clock stamps put the merge's loads at 2.5 µs, and the 1B step at batch 1
  // is 11–17 µs faster with 8 (attention/decode_perf_notes.md). head_dim 128's kernel has room.
  constexpr int kBatch = kHeadDim == 64 ? 8 : 16;
  // A decode tile has only G rows: spread each cell's slots over `split` adjacent lanes (up to
  // 8, within one warp) so that all threads load, then combine the lanes with shuffles.
  const int cells = num_rows * kChunks;
  int split = 1;
  while (split < 8 && cells * split * 2 <= num_threads) split *= 2;
  const int tasks = cells * split;
  // Every thread runs the same number of rounds: the shuffles below need the whole warp.
  for (int round = 0; round < tasks; round += num_threads) {
    const int task = round + thread;
    const bool active = task < tasks;
    const int part = task % split;
    const int cell = task / split;
    const int row = cell / kChunks;
    const int chunk = cell - row * kChunks;
    auto slot_row = [&](int i) {
      return (static_cast<int64_t>(first_slot + i) * num_kv_heads + kv_head) * tile_rows + row;
    };
    // One pass over this lane's slots (part, part + split, ...) with a running maximum.
    // -0 + x == x for every x (even -0), so a single split is copied exactly.
    float running_max = NegativeInfinity();
    float weight_sum = 0.f;
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = -0.f;
    for (int i0 = part; active && i0 < num_slots; i0 += kBatch * split) {
      float lse[kBatch];
      float4 lo[kBatch], hi[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u * split;
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
    // Combine the lanes of a cell: rescale each to the common maximum, then add.
    for (int offset = 1; offset < split; offset *= 2) {
      const float other_max = __shfl_xor_sync(kFull, running_max, offset);
      const float new_max = fmaxf(running_max, other_max);
      const float rescale =
          running_max == NegativeInfinity() ? 0.f : exp2f(running_max - new_max);
      running_max = new_max;
      weight_sum *= rescale;
      weight_sum += __shfl_xor_sync(kFull, weight_sum, offset);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        acc[k] *= rescale;
        acc[k] += __shfl_xor_sync(kFull, acc[k], offset);
      }
    }
    if (!active || part != 0) continue;
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
