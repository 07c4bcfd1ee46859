// Tensor-parallel sharding of a Llama decoder (Megatron style): which part of every weight one
// rank holds. Query heads, KV heads and MLP columns are split over the ranks; the QKV and
// gate-up projections are column-parallel (each rank computes its heads' and columns' outputs),
// the O and down projections row-parallel (each rank computes a partial sum over its inputs,
// which an all-reduce completes). The embedding, the norms and the LM head are replicated, so
// every rank holds the whole hidden state and computes the same logits without a gather.
//
//   ASSIGN_OR_RETURN(kiln::LlamaShape local, kiln::RankShape(full, /*tp_size=*/2));
//   // local.heads == full.heads / 2, local.ffn == full.ffn / 2, local.hidden == full.hidden
//   ASSIGN_OR_RETURN(kiln::LlamaHostWeights full_w, kiln::RandomLlamaHostWeights(full, seed));
//   ASSIGN_OR_RETURN(kiln::LlamaHostWeights mine, kiln::ShardLlamaHostWeights(full_w, 2, rank));
//
// A rank's weights are laid out as the full model's LlamaWeightLayout for RankShape(full, tp)
// (same tensors, same order, fewer rows or columns), so the single-GPU model runs a shard
// unchanged. Rank r holds, with H = heads / tp, K = KvHeadsPerRank, F = ffn / tp, d = head_dim:
//   qkv      rows  q heads [r H, (r + 1) H), then its K KV heads' k rows, then their v rows
//   gate_up  rows  gate [r F, (r + 1) F), then up [r F, (r + 1) F)
//   o        columns [r H d, (r + 1) H d)
//   down     columns [r F, (r + 1) F)
// When tp exceeds kv_heads, each rank holds the one KV head its query heads use (replicated
// over tp / kv_heads ranks). Seeded random weights of a shard are the full model's values at
// these places (LlamaDeviceWeights::RandomShard), so every TP size runs the same logical model.
// Host-only; plain functions, thread-safe.
#ifndef KILN_RUNTIME_MODEL_TENSOR_PARALLEL_H_
#define KILN_RUNTIME_MODEL_TENSOR_PARALLEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/llama_shape.h"
#include "runtime/model/llama_weights.h"

namespace kiln {

// Returns InvalidArgument unless `full` splits over `tp_size` ranks: heads and ffn divisible by
// tp_size, kv_heads dividing or divided by it, and the per-rank shape valid (ffn / tp a multiple
// of 8). The message names the value and the sizes that would work.
absl::Status CheckTensorParallelShape(const LlamaShape& full, int tp_size);

// Returns the KV heads one rank holds: kv_heads / tp_size, or 1 when tp_size > kv_heads; -1
// when CheckTensorParallelShape refuses `full` and `tp_size` (tp_size 0 included).
int KvHeadsPerRank(const LlamaShape& full, int tp_size);

// Returns the shape one rank runs (see the file comment); `full` itself for tp_size 1.
absl::StatusOr<LlamaShape> RankShape(const LlamaShape& full, int tp_size);

// Where a rank's tensor lies in the full one: its rows come from `rows` (contiguous runs, in
// order, covering every local row), its columns from [col_offset, col_offset + local cols) of
// a full row of `full_cols` columns.
struct WeightShardMap {
  struct Rows {
    int64_t local_first = 0;
    int64_t full_first = 0;
    int64_t count = 0;
  };
  std::vector<Rows> rows;  // at most 3 runs
  int64_t full_cols = 0;
  int64_t col_offset = 0;
  int64_t cols = 0;       // the rank's columns: [col_offset, col_offset + cols) of a full row
  bool identity = false;  // the rank holds the whole tensor (replicated)

  // Returns the full tensor's flat index of local element (row, col), or -1 for an element
  // outside the rank's rows or columns (any int64 values may be passed).
  int64_t FullIndex(int64_t row, int64_t col) const;
};

// Returns the map of tensor `tensor_index` (its position in LlamaWeightLayout::tensors(), the
// same in the full and in the rank's layout) for `rank` of `tp_size`. InvalidArgument for a
// shape that does not split, a rank outside [0, tp_size) or an unknown tensor index. Takes time
// independent of the number of tensors, so a pass over every tensor is linear.
absl::StatusOr<WeightShardMap> ShardMapFor(const LlamaShape& full, int tp_size, int rank,
                                           int tensor_index);

// Returns the maps of every tensor, indexed as LlamaWeightLayout::tensors(): ShardMapFor of each,
// with the split and the rank checked once for the whole pass (what a loader wants).
// InvalidArgument as ShardMapFor for a shape that does not split or a rank outside [0, tp_size).
absl::StatusOr<std::vector<WeightShardMap>> ShardMapsFor(const LlamaShape& full, int tp_size,
                                                         int rank);

// Returns rank `rank`'s host weights cut out of the full model's host weights (laid out for
// RankShape(full.layout.shape(), tp_size)). InvalidArgument as ShardMapFor, or from
// full.Validate() for weights whose data does not match their layout; ResourceExhausted as
// ZeroLlamaHostWeights.
absl::StatusOr<LlamaHostWeights> ShardLlamaHostWeights(const LlamaHostWeights& full, int tp_size,
                                                       int rank);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_TENSOR_PARALLEL_H_
