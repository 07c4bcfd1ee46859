// RoPE and the paged-KV append of one token row (rope_kv_append.h), as device functions: the
// RoPE + KV append kernel runs them with one CTA per token, the decode layer kernel
// (decode_layer.cu) with its compute threads after its QKV projection. Same arithmetic in both,
// so the same bits. Included by .cu files only.
#ifndef KILN_RUNTIME_MODEL_INTERNAL_ROPE_KV_APPEND_CUH_
#define KILN_RUNTIME_MODEL_INTERNAL_ROPE_KV_APPEND_CUH_

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "attention/paged_kv_slot.cuh"
#include "attention/rope_rotation.cuh"
#include "runtime/model/internal/vec.cuh"
#include "runtime/model/rope_kv_append.h"

namespace kiln {
namespace internal {

constexpr int kRopeMaxHalf = 128;  // head_dim <= 256

struct RopeKvArgs {
  __nv_bfloat16* qkv;
  const int32_t* positions;
  int heads, kv_heads, head_dim;
  RopeFrequencies freqs;
  const int32_t* seq_q_start;
  const int32_t* seq_kv_len;
  int max_seqs;
  uint16_t* k_cache;
  uint16_t* v_cache;
  const int32_t* block_table;
  int max_blocks_per_seq;
  int log2_block_size;
};

// Returns log2 of a power of two.
inline int Log2OfPowerOfTwo(int power_of_two) {
  int log = 0;
  while ((1 << log) < power_of_two) ++log;
  return log;
}

// The device functions' arguments for `p` (which RopeKvAppendSupports takes).
inline RopeKvArgs MakeRopeKvArgs(const RopeKvAppendParams& p) {
  RopeKvArgs a;
  a.qkv = p.qkv;
  a.positions = p.positions;
  a.heads = p.heads;
  a.kv_heads = p.kv_heads;
  a.head_dim = p.head_dim;
  a.freqs = RopeFrequencies::Make(p.theta, p.rope_scaling);
  a.seq_q_start = p.plan.seq_q_start;
  a.seq_kv_len = p.plan.seq_kv_len;
  a.max_seqs = p.plan.max_seqs;
  a.k_cache = static_cast<uint16_t*>(const_cast<void*>(p.kv.k_cache));
  a.v_cache = static_cast<uint16_t*>(const_cast<void*>(p.kv.v_cache));
  a.block_table = p.kv.block_table;
  a.max_blocks_per_seq = p.kv.max_blocks_per_seq;
  a.log2_block_size = Log2OfPowerOfTwo(p.kv.block_size);
  return a;
}

// Returns the cache slot of `token` (block << log2_block_size | offset), or -1 when it is not
// appended, as attention's append kernel finds it (attention/paged_kv_slot.cuh).
__device__ __forceinline__ int64_t SlotOf(const RopeKvArgs& a, int token) {
  return PagedKvSlotOf(token, a.seq_q_start, a.max_seqs, a.seq_kv_len, a.block_table,
                       a.max_blocks_per_seq, a.log2_block_size);
}

// Before the wait (positions, the plan and the block table come from the step's upload, not
// from a kernel of the step): fills cos/sin [head_dim / 2] for `token` (threads `tid` of
// `threads`) and returns its cache slot (SlotOf) from thread 0 into *slot. The caller
// synchronises its threads before reading them.
__device__ __forceinline__ void RopePrologue(const RopeKvArgs& a, int token, float* cos_table,
                                             float* sin_table, int64_t* slot, int tid,
                                             int threads) {
  const int half = a.head_dim / 2;
  const int position = a.positions[token];
  for (int i = tid; i < half; i += threads) {
    RopeCosSin(position, i, a.head_dim, a.freqs, &cos_table[i], &sin_table[i]);
  }
  if (tid == 0) *slot = SlotOf(a, token);
}

// After the wait: rotates q of `token`'s QKV row in place and writes the rotated k and the v
// into the cache slot `slot` (none when negative). Units of work: a rotation of 8 pairs of one
// q or k head (the 8 values at i and their partners at i + d/2), or a 16-byte copy of v.
__device__ __forceinline__ void RopeAppendToken(const RopeKvArgs& a, int token, int64_t slot,
                                                const float* cos_table, const float* sin_table,
                                                int tid, int threads) {
  const int half = a.head_dim / 2;
  const int row_width = (a.heads + 2 * a.kv_heads) * a.head_dim;
  __nv_bfloat16* row = a.qkv + static_cast<int64_t>(token) * row_width;
  const int units_per_head = half / 8;
  const int rotations = (a.heads + a.kv_heads) * units_per_head;
  const int copies = a.kv_heads * (a.head_dim / 8);
  const int64_t block = slot >> a.log2_block_size;
  const int64_t offset = slot & ((1 << a.log2_block_size) - 1);
  // Element offset of kv head `h`'s row for this token in either pool.
  auto cache_at = [&](int h) {
    return (((block * a.kv_heads + h) << a.log2_block_size) + offset) * a.head_dim;
  };
  for (int u = tid; u < rotations + copies; u += threads) {
    if (u < rotations) {
      const int head = u / units_per_head;  // q heads, then k heads
      const int i = (u - head * units_per_head) * 8;
      const bool is_k = head >= a.heads;
      if (is_k && slot < 0) continue;
      __nv_bfloat16* lo = row + head * a.head_dim + i;
      __nv_bfloat16* hi = lo + half;
      float x[8], y[8];
      internal::LoadBf16<8>(lo, x);
      internal::LoadBf16<8>(hi, y);
      float out_lo[8], out_hi[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        RopeRotate(x[j], y[j], cos_table[i + j], sin_table[i + j], &out_lo[j], &out_hi[j]);
      }
      if (!is_k) {
        internal::StoreBf16<8>(lo, out_lo);
        internal::StoreBf16<8>(hi, out_hi);
      } else {
        __nv_bfloat16* dst =
            reinterpret_cast<__nv_bfloat16*>(a.k_cache) + cache_at(head - a.heads) + i;
        internal::StoreBf16<8>(dst, out_lo);
        internal::StoreBf16<8>(dst + half, out_hi);
      }
    } else {
      if (slot < 0) continue;
      const int c = u - rotations;
      const int h = c / (a.head_dim / 8);
      const int d = (c - h * (a.head_dim / 8)) * 8;
      const uint4 v = *reinterpret_cast<const uint4*>(
          row + (a.heads + a.kv_heads) * a.head_dim + h * a.head_dim + d);
      *reinterpret_cast<uint4*>(a.v_cache + cache_at(h) + d) = v;
    }
  }
}

}  // namespace internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_ROPE_KV_APPEND_CUH_
