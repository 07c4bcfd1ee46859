// Where every weight of a Llama decoder lives: one contiguous bf16 region, each tensor at a
// 256-byte-aligned offset, in kiln's fused layout; and the host-side copy of that region.
//
//   ASSIGN_OR_RETURN(kiln::LlamaWeightLayout layout, kiln::LlamaWeightLayout::Create(shape));
//   size_t weight_bytes = layout.total_bytes();          // for the memory planner
//   const kiln::WeightTensor& qkv = layout.qkv(3);       // [qkv_rows, hidden] at qkv.offset
//
//   ASSIGN_OR_RETURN(kiln::LlamaHostWeights w, kiln::RandomLlamaHostWeights(shape, /*seed=*/1));
//   const uint16_t* qkv_bits = w.tensor(w.layout.qkv(3));   // bf16 bits
//
// Layout, in order (row-major, y = x · Wᵀ for every matrix W [out_features, in_features]):
//   embedding          [vocab, hidden]
//   per layer l:
//     input_norm       [hidden]
//     qkv              [(heads + 2 * kv_heads) * head_dim, hidden]   rows: q, k, then v heads
//     o                [hidden, heads * head_dim]
//     post_norm        [hidden]
//     gate_up          [2 * ffn, hidden]                             rows: gate, then up
//     down             [hidden, ffn]
//   final_norm         [hidden]
//   lm_head            [vocab, hidden]          absent when tie_embeddings (lm_head() is embedding)
//   per layer l, only when qkv_bias:
//     qkv_bias         [(heads + 2 * kv_heads) * head_dim]           q, k, then v heads
//   per layer l, only when qk_norm:
//     q_norm           [head_dim]                                    shared by the query heads
//     k_norm           [head_dim]                                    shared by the key heads
// (the biases and QK norms come last, so a shape's other tensors keep their indices, and seeded
// values, with or without them)
//
// Seeded initialisation (RandomLlamaHostWeights here, LlamaDeviceWeights::Random on the GPU;
// bit-identical): uniform values with standard deviation 1 for the embedding, 1/sqrt(fan_in)
// for matrices (so each projection keeps activations O(1)), 1 ± 0.25 for norm weights and
// ± 0.5 for biases.
// Plain value types, no CUDA; thread-safe to read.
#ifndef KILN_RUNTIME_MODEL_LLAMA_WEIGHTS_H_
#define KILN_RUNTIME_MODEL_LLAMA_WEIGHTS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/llama_shape.h"

namespace kiln {

// What a weight tensor is for; decides its initialisation.
enum class WeightKind { kEmbedding, kNorm, kMatrix, kBias };

// One tensor of the layout.
struct WeightTensor {
  std::string name;             // kiln's name: "embedding", "layers.3.qkv", "final_norm", ...
  WeightKind kind = WeightKind::kMatrix;
  int64_t rows = 0;             // out_features (vocab for the embedding; width for a norm)
  int64_t cols = 0;             // in_features (hidden for the embedding; 1 for a norm or bias)
  size_t offset = 0;            // bytes from the start of the region, a multiple of 256
  int index = 0;                // position in LlamaWeightLayout::tensors(), seeds its values

  int64_t elements() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(elements()) * 2; }
};

// The offsets of every tensor for one LlamaShape.
class LlamaWeightLayout {
 public:
  // Alignment of every tensor's offset in bytes (cuBLASLt's preferred alignment).
  static constexpr size_t kAlignment = 256;

  // Returns the layout for `shape`, or InvalidArgument from shape.Validate().
  static absl::StatusOr<LlamaWeightLayout> Create(const LlamaShape& shape);

  const LlamaShape& shape() const { return shape_; }
  // Returns every tensor in layout order.
  const std::vector<WeightTensor>& tensors() const { return tensors_; }
  // Returns the bytes of the whole region (the sum of the tensors plus alignment padding).
  size_t total_bytes() const { return total_bytes_; }
  // Returns the weight bytes a step of `num_tokens` token rows reads: every tensor once, except
  // an embedding table the LM head does not share, of which it gathers only the tokens' rows
  // (at most the whole table). With tied embeddings the table is read whole, as the LM head.
  size_t StepReadBytes(int64_t num_tokens) const;

  const WeightTensor& embedding() const { return tensors_[0]; }
  const WeightTensor& input_norm(int layer) const { return tensors_[LayerBase(layer) + 0]; }
  const WeightTensor& qkv(int layer) const { return tensors_[LayerBase(layer) + 1]; }
  const WeightTensor& o(int layer) const { return tensors_[LayerBase(layer) + 2]; }
  const WeightTensor& post_norm(int layer) const { return tensors_[LayerBase(layer) + 3]; }
  const WeightTensor& gate_up(int layer) const { return tensors_[LayerBase(layer) + 4]; }
  const WeightTensor& down(int layer) const { return tensors_[LayerBase(layer) + 5]; }
  const WeightTensor& final_norm() const { return tensors_[LayerBase(shape_.layers)]; }
  // Returns the LM head, which is the embedding when the shape ties them.
  const WeightTensor& lm_head() const {
    return shape_.tie_embeddings ? tensors_[0] : tensors_[LayerBase(shape_.layers) + 1];
  }
  // Returns layer `layer`'s QKV bias; only for a shape with qkv_bias.
  const WeightTensor& qkv_bias(int layer) const { return tensors_[bias_base_ + layer]; }
  // Returns layer `layer`'s query and key norm weights; only for a shape with qk_norm.
  const WeightTensor& q_norm(int layer) const { return tensors_[qk_norm_base_ + 2 * layer]; }
  const WeightTensor& k_norm(int layer) const { return tensors_[qk_norm_base_ + 2 * layer + 1]; }

  static constexpr int kTensorsPerLayer = 6;

 private:
  static int LayerBase(int layer) { return 1 + layer * kTensorsPerLayer; }
  LlamaShape shape_;
  std::vector<WeightTensor> tensors_;
  int bias_base_ = 0;     // index of layer 0's qkv_bias
  int qk_norm_base_ = 0;  // index of layer 0's q_norm
  size_t total_bytes_ = 0;
};

// A host copy of the weight region: bf16 bits at the layout's offsets (padding is zero).
struct LlamaHostWeights {
  LlamaWeightLayout layout;
  std::vector<uint16_t> data;  // layout.total_bytes() / 2 values

  const uint16_t* tensor(const WeightTensor& t) const { return data.data() + t.offset / 2; }
  uint16_t* mutable_tensor(const WeightTensor& t) { return data.data() + t.offset / 2; }

  // Returns OK when the layout has tensors (it came from LlamaWeightLayout::Create) and `data`
  // holds exactly its bytes, else InvalidArgument naming both sizes: default-constructed,
  // moved-from or resized weights, whose tensor() would point outside `data`. Functions that take
  // weights (ShardLlamaHostWeights, WriteLlamaSafetensors, ReferenceDecoder::Create) check it.
  absl::Status Validate() const;
};

// Returns zero-filled host weights for `shape`: InvalidArgument for a bad shape, and
// ResourceExhausted, before allocating, when they need more bytes than this machine's physical
// memory (a valid shape can describe petabytes: hidden 2^20 and vocab 2^24 is a 32 TiB table).
absl::StatusOr<LlamaHostWeights> ZeroLlamaHostWeights(const LlamaShape& shape);

// Returns zero-filled host weights laid out as `layout` (from LlamaWeightLayout::Create), for a
// caller that already holds the layout (a checkpoint reader's rank layout): the same weights as
// ZeroLlamaHostWeights(layout.shape()) without checking the shape or naming the tensors again.
// The weights keep `layout`: moved in, it is taken over; passed as an lvalue, it is copied (one
// name per tensor). InvalidArgument for a layout with no tensors (default-constructed or moved
// from); ResourceExhausted as above.
absl::StatusOr<LlamaHostWeights> ZeroLlamaHostWeights(LlamaWeightLayout layout);

// Returns the seeded random weights for `shape`, the same bits LlamaDeviceWeights::Random
// makes on the GPU; errors as ZeroLlamaHostWeights. Host-only; single-threaded (about 5 ns per
// value).
absl::StatusOr<LlamaHostWeights> RandomLlamaHostWeights(const LlamaShape& shape, uint64_t seed);

// The range a tensor's seeded values are drawn from: uniform in [centre - amplitude,
// centre + amplitude).
struct WeightInitRange {
  double amplitude = 0.0;
  float centre = 0.0f;
};

// Returns the range for `t`: amplitude sqrt(3) for the embedding (std 1), sqrt(3 / cols) for a
// matrix (std 1/sqrt(fan_in)), 0.25 around 1 for a norm weight, 0.5 around 0 for a bias.
WeightInitRange InitRangeFor(const WeightTensor& t);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_LLAMA_WEIGHTS_H_
