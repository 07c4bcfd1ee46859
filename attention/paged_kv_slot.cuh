// Device code: the paged-cache slot of one token row of a step, from the step's plan arrays (the
// rows of sequence s are [seq_q_start[s], seq_q_start[s + 1]); its new tokens are the last q_len
// of seq_kv_len[s] positions). The append kernel and runtime/model's RoPE + KV append find a
// row's slot with it, so both write a token to the same place. Included by .cu files only.
//
//   const int64_t slot = kiln::PagedKvSlotOf(token, seq_q_start, max_seqs, seq_kv_len,
//                                            block_table, max_blocks_per_seq, log2_block_size);
//   if (slot >= 0) { block = slot >> log2_block_size; offset = slot & (block_size - 1); ... }
#ifndef KILN_ATTENTION_PAGED_KV_SLOT_CUH_
#define KILN_ATTENTION_PAGED_KV_SLOT_CUH_

#include <cstdint>

namespace kiln {

// Returns the slot (block << log2_block_size | offset) of row `token`, or -1 where it has none: a
// padding row (at or past seq_q_start[max_seqs]), a position before 0, or an unmapped (negative)
// block. The owner is the last sequence s with seq_q_start[s] <= token: empty sequences share
// their start with the next one, so the last is the non-empty owner.
__device__ __forceinline__ int64_t PagedKvSlotOf(int token, const int32_t* seq_q_start,
                                                 int max_seqs, const int32_t* seq_kv_len,
                                                 const int32_t* block_table,
                                                 int max_blocks_per_seq, int log2_block_size) {
  if (token >= seq_q_start[max_seqs]) return -1;
  int lo = 0;
  int hi = max_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (seq_q_start[mid] <= token) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int q_start = seq_q_start[lo];
  const int q_len = seq_q_start[lo + 1] - q_start;
  const int pos = seq_kv_len[lo] - q_len + (token - q_start);
  if (pos < 0) return -1;
  const int32_t block =
      block_table[static_cast<int64_t>(lo) * max_blocks_per_seq + (pos >> log2_block_size)];
  if (block < 0) return -1;
  return (static_cast<int64_t>(block) << log2_block_size) + (pos & ((1 << log2_block_size) - 1));
}

}  // namespace kiln

#endif  // KILN_ATTENTION_PAGED_KV_SLOT_CUH_
