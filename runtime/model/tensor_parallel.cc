#include "runtime/model/tensor_parallel.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

// What a tensor of LlamaWeightLayout is, from its index; a QKV bias splits as the QKV rows do,
// and the QK norms' weights, shared by every head, are replicated.
enum class Role { kReplicated, kQkv, kO, kGateUp, kDown };

absl::StatusOr<Role> RoleOf(const LlamaShape& shape, int tensor_index) {
  const int per_layer = LlamaWeightLayout::kTensorsPerLayer;
  const int layer_end = 1 + shape.layers * per_layer;
  const int bias_base = layer_end + 1 + (shape.tie_embeddings ? 0 : 1);
  const int qk_norm_base = bias_base + (shape.qkv_bias ? shape.layers : 0);
  const int count = qk_norm_base + (shape.qk_norm ? 2 * shape.layers : 0);
  if (tensor_index < 0 || tensor_index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("Weight tensor index ", tensor_index,
                                                   " is outside [0, ", count, ") for this shape"));
  }
  if (tensor_index >= qk_norm_base) return Role::kReplicated;  // q_norm, k_norm
  if (tensor_index >= bias_base) return Role::kQkv;  // layers' QKV biases (llama_weights.h)
  if (tensor_index == 0 || tensor_index >= layer_end) return Role::kReplicated;
  // Per layer: input_norm, qkv, o, post_norm, gate_up, down (llama_weights.h).
  switch ((tensor_index - 1) % per_layer) {
    case 1:
      return Role::kQkv;
    case 2:
      return Role::kO;
    case 4:
      return Role::kGateUp;
    case 5:
      return Role::kDown;
    default:
      return Role::kReplicated;
  }
}

}  // namespace

int KvHeadsPerRank(const LlamaShape& full, int tp_size) {
  return full.kv_heads >= tp_size ? full.kv_heads / tp_size : 1;
}

absl::Status CheckTensorParallelShape(const LlamaShape& full, int tp_size) {
  RETURN_IF_ERROR(full.Validate());
  if (tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Tensor-parallel size ", tp_size, " must be at least 1"));
  }
  if (full.heads % tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Model heads ", full.heads, " do not split over tensor-parallel size ",
                     tp_size, "; use a size that divides ", full.heads));
  }
  const int kv = full.kv_heads;
  if (kv >= tp_size ? kv % tp_size != 0 : tp_size % kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Model kv_heads ", kv, " and tensor-parallel size ", tp_size,
        " do not divide one another; use a size that divides or is a multiple of ", kv));
  }
  if (full.ffn % tp_size != 0 || (full.ffn / tp_size) % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Model ffn ", full.ffn, " does not split over tensor-parallel size ", tp_size,
        " into multiples of 8 columns; use a size for which ffn / size is a multiple of 8"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaShape> RankShape(const LlamaShape& full, int tp_size) {
  RETURN_IF_ERROR(CheckTensorParallelShape(full, tp_size));
  LlamaShape local = full;
  local.heads = full.heads / tp_size;
  local.kv_heads = KvHeadsPerRank(full, tp_size);
  local.ffn = full.ffn / tp_size;
  RETURN_IF_ERROR(local.Validate());
  return local;
}

int64_t WeightShardMap::FullIndex(int64_t row, int64_t col) const {
  for (const Rows& run : rows) {
    if (row >= run.local_first && row < run.local_first + run.count) {
      return (run.full_first + row - run.local_first) * full_cols + col_offset + col;
    }
  }
  return -1;
}

absl::StatusOr<WeightShardMap> ShardMapFor(const LlamaShape& full, int tp_size, int rank,
                                           int tensor_index) {
  RETURN_IF_ERROR(CheckTensorParallelShape(full, tp_size));
  if (rank < 0 || rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rank ", rank, " is outside [0, ", tp_size, ")"));
  }
  ASSIGN_OR_RETURN(Role role, RoleOf(full, tensor_index));
  ASSIGN_OR_RETURN(LlamaWeightLayout layout, LlamaWeightLayout::Create(full));
  const WeightTensor& t = layout.tensors()[tensor_index];
  const int64_t d = full.head_dim;
  const int64_t heads = full.heads / tp_size;         // query heads per rank
  const int64_t kv = KvHeadsPerRank(full, tp_size);   // KV heads per rank
  const int64_t ffn = full.ffn / tp_size;             // MLP columns per rank
  // The first KV head of this rank: split, or the one its query heads share.
  const int64_t first_kv =
      full.kv_heads >= tp_size ? rank * kv : rank / (tp_size / full.kv_heads);

  WeightShardMap map;
  map.full_cols = t.cols;
  switch (role) {
    case Role::kReplicated:
      map.rows = {{0, 0, t.rows}};
      map.identity = true;
      break;
    case Role::kQkv:
      map.rows = {{0, rank * heads * d, heads * d},
                  {heads * d, full.heads * d + first_kv * d, kv * d},
                  {(heads + kv) * d, (int64_t{full.heads} + full.kv_heads) * d + first_kv * d,
                   kv * d}};
      map.identity = tp_size == 1;
      break;
    case Role::kGateUp:
      map.rows = {{0, rank * ffn, ffn}, {ffn, full.ffn + rank * ffn, ffn}};
      map.identity = tp_size == 1;
      break;
    case Role::kO:
      map.rows = {{0, 0, t.rows}};
      map.col_offset = rank * heads * d;
      map.identity = tp_size == 1;
      break;
    case Role::kDown:
      map.rows = {{0, 0, t.rows}};
      map.col_offset = rank * ffn;
      map.identity = tp_size == 1;
      break;
  }
  return map;
}

absl::StatusOr<LlamaHostWeights> ShardLlamaHostWeights(const LlamaHostWeights& full, int tp_size,
                                                       int rank) {
  const LlamaShape& full_shape = full.layout.shape();
  ASSIGN_OR_RETURN(LlamaShape local_shape, RankShape(full_shape, tp_size));
  ASSIGN_OR_RETURN(LlamaHostWeights local, ZeroLlamaHostWeights(local_shape));
  for (const WeightTensor& t : local.layout.tensors()) {
    ASSIGN_OR_RETURN(WeightShardMap map, ShardMapFor(full_shape, tp_size, rank, t.index));
    const uint16_t* src = full.tensor(full.layout.tensors()[t.index]);
    uint16_t* dst = local.mutable_tensor(t);
    for (const WeightShardMap::Rows& run : map.rows) {
      for (int64_t row = run.local_first; row < run.local_first + run.count; ++row) {
        std::memcpy(dst + row * t.cols, src + map.FullIndex(row, 0),
                    static_cast<size_t>(t.cols) * sizeof(uint16_t));
      }
    }
  }
  return local;
}

}  // namespace kiln
