// The device-side contract shared by kiln's attention kernels (decode, append/prefill, merge)
// and the host planner that feeds them. Plain structs, no CUDA types: host code fills them.
//
// Tensors (all row-major, dtype T = bf16 or fp16 unless noted):
//   q            [num_tokens, num_q_heads, head_dim]        new tokens of every sequence, packed
//   o            [num_tokens, num_q_heads, head_dim]        output, same layout as q
//   k_cache      [num_blocks, num_kv_heads, block_size, head_dim]
//   v_cache      [num_blocks, num_kv_heads, block_size, head_dim]
//   block_table  int32 [max_seqs, max_blocks_per_seq]       physical block of each logical block
//   seq_q_start  int32 [max_seqs + 1]                       first token of each sequence in q/o
//   seq_kv_len   int32 [max_seqs]                           cached tokens incl. the new ones
//
// Sequence s owns tokens [seq_q_start[s], seq_q_start[s+1]) of q; q_len = their count. Its new
// tokens sit at the end of its KV: token j (0-based among the new ones) has position
// kv_len - q_len + j and attends causally to KV positions [0, kv_len - q_len + j].
//
// Query rows: the G = num_q_heads / num_kv_heads query heads that share a KV head are packed with
// the tokens into rows, row = j * G + g, so one tile of T rows reads each KV element once for all
// of them. A work item is one (sequence, query tile, KV chunk) for every KV head (grid.y).
#ifndef KILN_ATTENTION_ATTENTION_PARAMS_H_
#define KILN_ATTENTION_ATTENTION_PARAMS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "attention/rope_frequency.h"

namespace kiln {

// One CTA's job, for each KV head. Padding items (beyond the plan's count, up to the capacity
// fixed by the capture key) have seq = -1 and exit at once.
struct AttentionWorkItem {
  int32_t seq;            // sequence index, or -1 for padding
  int32_t row_begin;      // first packed query row of the tile (row = token * G + g)
  int32_t row_end;        // one past the last row (<= q_len * G)
  int32_t kv_begin;       // KV chunk [kv_begin, kv_end); the kernel also applies the causal mask
  int32_t kv_end;
  int32_t partial_slot;   // -1: the item covers all of the tile's KV, write o directly;
                          // else its slot in the partial workspace, merged later
};

// One tile whose KV was split into chunks: the merge combines partial slots
// [first_slot, first_slot + num_slots) row by row into o. Padding has seq = -1.
struct AttentionMergeItem {
  int32_t seq;
  int32_t row_begin;
  int32_t row_end;
  int32_t first_slot;
  int32_t num_slots;
};

// Partial results live in a float workspace sized by the capture key:
//   partial_o    float [max_slots, num_kv_heads, tile_rows, head_dim]
//   partial_lse  float [max_slots, num_kv_heads, tile_rows]   log2-sum-exp of the scaled scores;
//                                                             -inf for an empty chunk (weight 0)
// Row m of a slot is packed query row row_begin + m of its tile. partial_o holds the chunk's
// normalised output (sum_j p_j v_j / sum_j p_j, zeros when the chunk is empty for that row), and
// partial_lse = log2(sum_j 2^(s_j)) with s_j = (q . k_j) * softmax_scale * log2(e), so the merge
// weighs chunk i by 2^(lse_i - max_i lse_i).

// Element type of q, o and the KV cache; accumulation is always float.
enum class AttentionDtype : int32_t {
  kBf16 = 0,
  kFp16 = 1,
};

// Returns OK for kBf16 and kFp16; else InvalidArgument "<what> dtype N is not supported; use
// kBf16 (0) or kFp16 (1)", with `what` naming the caller's parameter (e.g. "Decode").
// Thread-safe; callable during capture.
absl::Status CheckAttentionDtype(AttentionDtype dtype, absl::string_view what);

// Per-step header of one plan part, uploaded with its items: the kernels read the chunk size
// from here (it changes every step) while their grids stay fixed by the capture key.
struct AttentionPlanHeader {
  int32_t num_work_items;   // valid items; the rest, up to the capacity, are padding (seq = -1)
  int32_t num_merge_items;  // valid merge items; the rest are padding (seq = -1)
  int32_t kv_chunk_size;    // KV tokens per work item this step (a tile's last chunk: fewer)
  int32_t num_tiles;        // query tiles this step
};

// Device pointers to one uploaded plan part and its partial workspace, as the kernels read them
// (PlanBuffers::decode() / prefill() fill it). The grids are work_capacity × num_kv_heads and
// merge_capacity × num_kv_heads, both fixed by the capture key.
struct AttentionPlanPartDevice {
  const AttentionPlanHeader* header = nullptr;
  const int32_t* seq_q_start = nullptr;         // [max_seqs + 1]
  const int32_t* seq_kv_len = nullptr;          // [max_seqs]
  int32_t max_seqs = 0;                         // the plan's sequence capacity
  const AttentionWorkItem* work_items = nullptr;  // [work_capacity]
  int32_t work_capacity = 0;
  const AttentionMergeItem* merge_items = nullptr;  // [merge_capacity]
  int32_t merge_capacity = 0;
  int32_t tile_rows = 0;                        // rows per slot of the partial workspace
  float* partial_o = nullptr;                   // [slot_capacity, num_kv_heads, tile_rows,
                                                //  head_dim]
  float* partial_lse = nullptr;                 // [slot_capacity, num_kv_heads, tile_rows]
  int32_t slot_capacity = 0;
  // [slot_capacity, num_kv_heads], zero between launches. When set, a kernel may merge a split
  // tile itself: the last of its chunks to finish (counted here, indexed by the tile's first
  // slot) merges and resets the counter to zero. Null: the separate merge kernel finishes.
  int32_t* merge_counters = nullptr;
};

// Device pointers to a paged KV cache (layout above). block_size is a power of two >= 16.
struct PagedKvDevice {
  const void* k_cache = nullptr;       // [num_blocks, num_kv_heads, block_size, head_dim]
  const void* v_cache = nullptr;       // [num_blocks, num_kv_heads, block_size, head_dim]
  const int32_t* block_table = nullptr;  // [max_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  int32_t block_size = 0;
};

// The step's RoPE and KV append, done by the decode kernel itself (a decode part: every
// sequence has q_len 1). With positions set, the kernel reads q unrotated and rotates it as it
// loads it (Llama's rotate-half form, attention/rope_rotation.cuh), and the chunk that holds each
// sequence's new position kv_len − 1 takes that token's K (rotated) and V from here instead of
// the cache and writes both into its cache slot: the same bits as a RoPE + KV append kernel run
// before, without that kernel. The rotated q is not written back. With q_norm and k_norm set
// (Qwen3, bf16 only), each head of q and of the new k is first RMS-normed over head_dim
// (attention/qk_norm_math.cuh): the bits of runtime/model's QK norm kernel run before.
struct DecodeRopeAppendDevice {
  const int32_t* positions = nullptr;  // [tokens]: RoPE positions; null: the cache holds the
                                       // step's K and V already and q is rotated
  double theta = 0.0;                  // RoPE base, > 0
  RopeScaling scaling;                 // the model's frequency scaling; none by default
  const void* k = nullptr;             // [tokens, num_kv_heads, head_dim]: the new, unrotated k
  const void* v = nullptr;             // [tokens, num_kv_heads, head_dim]: the new v
  int64_t kv_stride = 0;               // elements between tokens of k and of v
  const void* q_norm = nullptr;        // [head_dim]: the query heads' norm weight; null: none
  const void* k_norm = nullptr;        // [head_dim]: the key heads' norm weight (with q_norm)
  float qk_norm_eps = 0.f;             // the norms' epsilon, > 0 with them
};

}  // namespace kiln

#endif  // KILN_ATTENTION_ATTENTION_PARAMS_H_
