// Append/prefill attention over a paged KV cache, on tensor cores.
//
// Many new query tokens per sequence attend causally to each other and to every cached token of
// their sequence, read through the block table. The query heads that share a KV head are packed
// with the tokens into rows (row = token * G + g, see attention_params.h), so one CTA of T rows
// reads each K/V element once for all G heads. The kernel works FlashAttention-2 style: the
// tile's queries stay in shared memory, K/V tiles of 64 tokens stream in through a multi-stage
// cp.async pipeline, scores and outputs are mma.sync m16n8k16 products with an online softmax
// in float. KV tiles past every row's causal limit are skipped; the diagonal tiles are masked.
//
// One CTA runs one AttentionWorkItem for one KV head: grid = (num_work_items, num_kv_heads).
// The grid depends only on num_work_items (the capacity the capture key fixes) and the model,
// never on the batch contents; padding items (seq = -1) exit at once. An item with
// partial_slot = -1 writes its rows of o directly; otherwise it writes its partial result for the
// merge kernel: the normalised output (float) and the log2-sum-exp of the scaled scores
// (-inf and zeros for a chunk that no row of the tile can see).
//
//   kiln::PrefillAttentionParams p;
//   p.dtype = kiln::AttentionDtype::kBf16;
//   p.head_dim = 128;  p.tile_rows = 128;
//   p.num_q_heads = 32;  p.num_kv_heads = 8;
//   p.block_size = 16;  p.max_blocks_per_seq = 512;
//   p.q = q;  p.o = o;  p.k_cache = k;  p.v_cache = v;
//   p.block_table = block_table;  p.seq_q_start = q_start;  p.seq_kv_len = kv_len;
//   p.work_items = items;  p.num_work_items = capacity;
//   p.partial_o = partial_o;  p.partial_lse = partial_lse;   // only read when items split
//   RETURN_IF_ERROR(kiln::LaunchPrefillAttention(p, stream));
#ifndef KILN_ATTENTION_PREFILL_KERNEL_H_
#define KILN_ATTENTION_PREFILL_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace kiln {

// Everything one prefill launch needs (AttentionDtype is in attention_params.h). Plain data; the
// caller owns every buffer, which must stay alive until the launch has run. Shapes as in
// attention_params.h.
struct PrefillAttentionParams {
  AttentionDtype dtype = AttentionDtype::kBf16;
  int head_dim = 128;           // 64 or 128
  int tile_rows = 128;          // T, packed query rows per work item: 64 or 128
  int num_q_heads = 0;          // a multiple of num_kv_heads
  int num_kv_heads = 0;
  int block_size = 0;           // tokens per KV block
  int max_blocks_per_seq = 0;   // row stride of block_table
  float softmax_scale = 0.0f;   // 0 means 1 / sqrt(head_dim)

  const void* q = nullptr;                // [num_tokens, num_q_heads, head_dim]
  int64_t q_stride = 0;                   // elements between tokens of q; 0: num_q_heads * head_dim
  void* o = nullptr;                      // [num_tokens, num_q_heads, head_dim]
  int64_t o_stride = 0;                   // elements between tokens of o; 0: num_q_heads * head_dim
  const void* k_cache = nullptr;          // [num_blocks, num_kv_heads, block_size, head_dim]
  const void* v_cache = nullptr;          // [num_blocks, num_kv_heads, block_size, head_dim]
  const int32_t* block_table = nullptr;   // [max_seqs, max_blocks_per_seq]
  const int32_t* seq_q_start = nullptr;   // [max_seqs + 1]
  const int32_t* seq_kv_len = nullptr;    // [max_seqs]

  const AttentionWorkItem* work_items = nullptr;  // [num_work_items], device memory
  int num_work_items = 0;                         // grid.x: the plan's capacity

  float* partial_o = nullptr;    // [max_slots, num_kv_heads, tile_rows, head_dim]; may be null
  float* partial_lse = nullptr;  // [max_slots, num_kv_heads, tile_rows] when no item splits
};

// Checks the host-side fields of `params` (supported dtype, head_dim and tile_rows, head counts,
// non-null tensors, q, k_cache and v_cache 16-byte aligned, o 4-byte, partial_o 8-byte) and
// returns InvalidArgument naming the bad value, or OK. Device contents
// (items, lengths, block table) are the planner's responsibility and are not read.
// Thread-safe; callable during capture.
absl::Status ValidatePrefillAttentionParams(const PrefillAttentionParams& params);

// Validates `params` and enqueues the kernel on `stream`, with grid (num_work_items,
// num_kv_heads); does nothing when num_work_items is 0. Returns the launch error, if any, as a
// Status. Callable during capture (the launch shape depends only on the params' sizes, never on
// device contents); thread-safe.
absl::Status LaunchPrefillAttention(const PrefillAttentionParams& params, cudaStream_t stream);

// Returns the dynamic shared memory one CTA uses for this configuration (bytes), or 0 when the
// configuration is unsupported. For occupancy reports and benchmarks.
int PrefillAttentionSharedMemoryBytes(AttentionDtype dtype, int head_dim, int tile_rows);

}  // namespace kiln

#endif  // KILN_ATTENTION_PREFILL_KERNEL_H_
