#include "runtime/model/tensor_parallel.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

// What a tensor of LlamaWeightLayout is, from its index; a QKV bias splits as the QKV rows do,
// and the QK norms' weights, shared by every head, are replicated.
enum class Role { kReplicated, kQkv, kO, kGateUp, kDown };

// A tensor's role and full size, from its index and the shape alone: building the whole layout
// per tensor would make a pass over every tensor quadratic (36,000 tensors at 4096 layers with
// biases and QK norms: minutes). Sizes as llama_weights.h lists them.
struct TensorRole {
  Role role = Role::kReplicated;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Where each group of tensors starts in LlamaWeightLayout, and how many there are.
struct TensorBases {
  int layer_end = 0;     // the final norm
  int bias_base = 0;     // layer 0's QKV bias
  int qk_norm_base = 0;  // layer 0's q_norm
  int count = 0;
};

TensorBases BasesOf(const LlamaShape& shape) {
  TensorBases b;
  b.layer_end = 1 + shape.layers * LlamaWeightLayout::kTensorsPerLayer;
  b.bias_base = b.layer_end + 1 + (shape.tie_embeddings ? 0 : 1);
  b.qk_norm_base = b.bias_base + (shape.qkv_bias ? shape.layers : 0);
  b.count = b.qk_norm_base + (shape.qk_norm ? 2 * shape.layers : 0);
  return b;
}

absl::StatusOr<TensorRole> RoleOf(const LlamaShape& shape, int tensor_index) {
  const int per_layer = LlamaWeightLayout::kTensorsPerLayer;
  const auto [layer_end, bias_base, qk_norm_base, count] = BasesOf(shape);
  if (tensor_index < 0 || tensor_index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Weight tensor index ", tensor_index, " is outside [0, ", count,
        ") for this shape; pass the index of one of LlamaWeightLayout::tensors()"));
  }
  const int64_t h = shape.hidden;
  if (tensor_index >= qk_norm_base) return TensorRole{Role::kReplicated, shape.head_dim, 1};
  if (tensor_index >= bias_base) return TensorRole{Role::kQkv, shape.qkv_rows(), 1};
  if (tensor_index == 0 || tensor_index == layer_end + 1) {  // the embedding, an untied LM head
    return TensorRole{Role::kReplicated, shape.vocab, h};
  }
  if (tensor_index == layer_end) return TensorRole{Role::kReplicated, h, 1};  // final norm
  // Per layer: input_norm, qkv, o, post_norm, gate_up, down (llama_weights.h).
  switch ((tensor_index - 1) % per_layer) {
    case 1:
      return TensorRole{Role::kQkv, shape.qkv_rows(), h};
    case 2:
      return TensorRole{Role::kO, h, shape.q_width()};
    case 4:
      return TensorRole{Role::kGateUp, 2 * int64_t{shape.ffn}, h};
    case 5:
      return TensorRole{Role::kDown, h, shape.ffn};
    default:  // input_norm, post_norm
      return TensorRole{Role::kReplicated, h, 1};
  }
}

// KvHeadsPerRank for a split CheckTensorParallelShape accepted.
int KvHeadsOf(const LlamaShape& full, int tp_size) {
  return full.kv_heads >= tp_size ? full.kv_heads / tp_size : 1;
}

// Returns InvalidArgument where `full` does not split over `tp_size` ranks or `rank` is outside
// [0, tp_size): what every map needs, checked once per map or pass.
absl::Status CheckShardRank(const LlamaShape& full, int tp_size, int rank) {
  RETURN_IF_ERROR(CheckTensorParallelShape(full, tp_size));
  if (rank < 0 || rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rank ", rank, " is outside [0, ", tp_size,
                     "); a rank counts from 0 to the tensor-parallel size less 1"));
  }
  return absl::OkStatus();
}

// The map of a tensor of role `t` for a split and rank CheckShardRank accepted.
WeightShardMap MapOf(const LlamaShape& full, int tp_size, int rank, const TensorRole& t) {
  const int64_t d = full.head_dim;
  const int64_t heads = full.heads / tp_size;      // query heads per rank
  const int64_t kv = KvHeadsOf(full, tp_size);     // KV heads per rank
  const int64_t ffn = full.ffn / tp_size;          // MLP columns per rank
  // The first KV head of this rank: split, or the one its query heads share.
  const int64_t first_kv =
      full.kv_heads >= tp_size ? rank * kv : rank / (tp_size / full.kv_heads);

  WeightShardMap map;
  map.full_cols = t.cols;
  map.cols = t.cols;  // split below for the row-parallel O and down projections
  switch (t.role) {
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
      map.cols = heads * d;
      map.identity = tp_size == 1;
      break;
    case Role::kDown:
      map.rows = {{0, 0, t.rows}};
      map.col_offset = rank * ffn;
      map.cols = ffn;
      map.identity = tp_size == 1;
      break;
  }
  return map;
}

}  // namespace

int KvHeadsPerRank(const LlamaShape& full, int tp_size) {
  if (!CheckTensorParallelShape(full, tp_size).ok()) return -1;
  return KvHeadsOf(full, tp_size);
}

absl::Status CheckTensorParallelShape(const LlamaShape& full, int tp_size) {
  RETURN_IF_ERROR(full.Validate());
  if (tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Tensor-parallel size ", tp_size, " must be at least 1 (1: no split)"));
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
  local.kv_heads = KvHeadsOf(full, tp_size);
  local.ffn = full.ffn / tp_size;
  RETURN_IF_ERROR(local.Validate());
  return local;
}

int64_t WeightShardMap::FullIndex(int64_t row, int64_t col) const {
  if (col < 0 || col >= cols) return -1;  // also keeps the products below inside the tensor
  for (const Rows& run : rows) {
    if (row >= run.local_first && row - run.local_first < run.count) {
      return (run.full_first + row - run.local_first) * full_cols + col_offset + col;
    }
  }
  return -1;
}

absl::StatusOr<WeightShardMap> ShardMapFor(const LlamaShape& full, int tp_size, int rank,
                                           int tensor_index) {
  RETURN_IF_ERROR(CheckShardRank(full, tp_size, rank));
  ASSIGN_OR_RETURN(const TensorRole t, RoleOf(full, tensor_index));
  return MapOf(full, tp_size, rank, t);
}

absl::StatusOr<std::vector<WeightShardMap>> ShardMapsFor(const LlamaShape& full, int tp_size,
                                                         int rank) {
  RETURN_IF_ERROR(CheckShardRank(full, tp_size, rank));
  const int count = BasesOf(full).count;
  std::vector<WeightShardMap> maps;
  maps.reserve(static_cast<size_t>(count));
  for (int index = 0; index < count; ++index) {
    ASSIGN_OR_RETURN(const TensorRole t, RoleOf(full, index));
    maps.push_back(MapOf(full, tp_size, rank, t));
  }
  return maps;
}

absl::StatusOr<LlamaHostWeights> ShardLlamaHostWeights(const LlamaHostWeights& full, int tp_size,
                                                       int rank) {
  RETURN_IF_ERROR(full.Validate());
  const LlamaShape& full_shape = full.layout.shape();
  // A split or rank the maps refuse is refused here, before the shard is allocated.
  ASSIGN_OR_RETURN(const std::vector<WeightShardMap> maps,
                   ShardMapsFor(full_shape, tp_size, rank));
  ASSIGN_OR_RETURN(LlamaShape local_shape, RankShape(full_shape, tp_size));
  ASSIGN_OR_RETURN(LlamaHostWeights local, ZeroLlamaHostWeights(local_shape));
  for (const WeightTensor& t : local.layout.tensors()) {
    const WeightShardMap& map = maps[t.index];
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
