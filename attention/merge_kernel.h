// The split-kv merge: combines the partial results of every tile a plan split into KV chunks
// into the final output rows. Shared by the decode and prefill kernels — both write the partial
// workspace of attention_params.h (normalised partial_o rows and base-2 log-sum-exp per row),
// with the tile_rows of their plan part.
//
//   kiln::AttentionMergeParams merge;
//   merge.dtype = kiln::AttentionDtype::kBf16;
//   merge.num_q_heads = 32; merge.num_kv_heads = 8; merge.head_dim = 128;
//   merge.o = o;                      // [tokens, num_q_heads, head_dim]
//   merge.plan = buffers.prefill();   // after the prefill kernel, on the same stream
//   RETURN_IF_ERROR(kiln::LaunchAttentionMerge(merge, stream));
//
// Per row: a chunk with lse = -inf (it saw no KV for the row) weighs 0; a row no chunk saw is
// written as zeros, never NaN; a tile of one chunk is copied exactly. Padding merge items
// (seq = -1) exit at once. The grid (merge_capacity × num_kv_heads) depends on the plan layout
// only, so the launch may be captured in a graph and replayed with later plans. Legal during
// capture; thread-safe.
#ifndef KILN_ATTENTION_MERGE_KERNEL_H_
#define KILN_ATTENTION_MERGE_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace kiln {

struct AttentionMergeParams {
  AttentionDtype dtype = AttentionDtype::kBf16;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;       // 64 or 128
  void* o = nullptr;      // [tokens, num_q_heads, head_dim]
  int64_t o_stride = 0;   // elements between tokens of o; 0 means num_q_heads × head_dim
  AttentionPlanPartDevice plan;  // the part whose partials to merge (merge items, workspace)
};

// Checks the host-side fields of `params` (dtype, heads, head_dim 64 or 128, o, the merge items,
// seq_q_start and the partial workspace set, o_stride 0 or a multiple of 8 of at least
// num_q_heads × head_dim, o and partial_o 16-byte aligned) and returns InvalidArgument naming
// the bad value, or OK. Thread-safe; callable during capture.
absl::Status ValidateAttentionMergeParams(const AttentionMergeParams& params);

// Launches the merge of `params.plan` on `stream`; does nothing when the part has no merge
// capacity. InvalidArgument names an unsupported dtype or head_dim, a missing pointer or a bad
// o_stride or alignment (ValidateAttentionMergeParams).
absl::Status LaunchAttentionMerge(const AttentionMergeParams& params, cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_ATTENTION_MERGE_KERNEL_H_
