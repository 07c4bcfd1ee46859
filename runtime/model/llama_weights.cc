#include "runtime/model/llama_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/model/internal/weight_init.h"

namespace kiln {

absl::StatusOr<LlamaWeightLayout> LlamaWeightLayout::Create(const LlamaShape& shape) {
  RETURN_IF_ERROR(shape.Validate());
  LlamaWeightLayout layout;
  layout.shape_ = shape;
  size_t offset = 0;
  auto add = [&](std::string name, WeightKind kind, int64_t rows, int64_t cols) {
    WeightTensor t;
    t.name = std::move(name);
    t.kind = kind;
    t.rows = rows;
    t.cols = cols;
    t.offset = offset;
    t.index = static_cast<int>(layout.tensors_.size());
    offset += (t.bytes() + kAlignment - 1) / kAlignment * kAlignment;
    layout.tensors_.push_back(std::move(t));
  };
  const int64_t h = shape.hidden;
  add("embedding", WeightKind::kEmbedding, shape.vocab, h);
  for (int l = 0; l < shape.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "input_norm", WeightKind::kNorm, h, 1);
    add(p + "qkv", WeightKind::kMatrix, shape.qkv_rows(), h);
    add(p + "o", WeightKind::kMatrix, h, shape.q_width());
    add(p + "post_norm", WeightKind::kNorm, h, 1);
    add(p + "gate_up", WeightKind::kMatrix, 2 * int64_t{shape.ffn}, h);
    add(p + "down", WeightKind::kMatrix, h, shape.ffn);
  }
  add("final_norm", WeightKind::kNorm, h, 1);
  if (!shape.tie_embeddings) add("lm_head", WeightKind::kMatrix, shape.vocab, h);
  layout.bias_base_ = static_cast<int>(layout.tensors_.size());
  if (shape.qkv_bias) {
    for (int l = 0; l < shape.layers; ++l) {
      add(absl::StrCat("layers.", l, ".qkv_bias"), WeightKind::kBias, shape.qkv_rows(), 1);
    }
  }
  layout.qk_norm_base_ = static_cast<int>(layout.tensors_.size());
  if (shape.qk_norm) {
    for (int l = 0; l < shape.layers; ++l) {
      add(absl::StrCat("layers.", l, ".q_norm"), WeightKind::kNorm, shape.head_dim, 1);
      add(absl::StrCat("layers.", l, ".k_norm"), WeightKind::kNorm, shape.head_dim, 1);
    }
  }
  layout.total_bytes_ = offset;
  return layout;
}

size_t LlamaWeightLayout::StepReadBytes(int64_t num_tokens) const {
  size_t bytes = 0;
  for (const WeightTensor& t : tensors_) bytes += t.bytes();
  if (shape_.tie_embeddings) return bytes;
  const WeightTensor& table = embedding();
  const int64_t gathered = std::clamp<int64_t>(num_tokens, 0, table.rows);
  return bytes - table.bytes() + static_cast<size_t>(gathered * table.cols) * 2;
}

absl::Status LlamaHostWeights::Validate() const {
  if (layout.tensors().empty() || data.size() * 2 != layout.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaHostWeights hold ", data.size() * 2, " bytes but their layout (",
        layout.tensors().size(), " tensors) needs ", layout.total_bytes(),
        "; build them with ZeroLlamaHostWeights, RandomLlamaHostWeights or ReadLlamaSafetensors "
        "and do not resize or move from them"));
  }
  return absl::OkStatus();
}

namespace {

// This machine's physical memory in bytes, or 0 when the system does not say.
uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

}  // namespace

absl::StatusOr<LlamaHostWeights> ZeroLlamaHostWeights(const LlamaShape& shape) {
  ASSIGN_OR_RETURN(LlamaWeightLayout layout, LlamaWeightLayout::Create(shape));
  return ZeroLlamaHostWeights(std::move(layout));
}

absl::StatusOr<LlamaHostWeights> ZeroLlamaHostWeights(LlamaWeightLayout layout) {
  // Weights of no tensors would fail LlamaHostWeights::Validate wherever they were passed.
  if (layout.tensors().empty()) {
    return absl::InvalidArgumentError(
        "ZeroLlamaHostWeights got a layout with no tensors (default-constructed or moved from); "
        "build it with LlamaWeightLayout::Create");
  }
  const LlamaShape& shape = layout.shape();
  // A valid shape may still need far more than any host has; refuse it here rather than let the
  // allocation throw (which ends the process: kiln has no exception handlers).
  const uint64_t memory = PhysicalMemoryBytes();
  const uint64_t limit = memory != 0 ? memory : std::numeric_limits<uint64_t>::max();
  const size_t values = layout.total_bytes() / 2;
  if (layout.total_bytes() > limit || values > std::vector<uint16_t>().max_size()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "Host weights for a Llama with ", shape.ToString(), " need ", layout.total_bytes(),
        " bytes, more than ",
        memory != 0 ? absl::StrCat("this machine's ", memory, " bytes of memory")
                    : std::string("a host vector holds"),
        "; check the LlamaShape for a typo, or split the model over more tensor-parallel ranks"));
  }
  LlamaHostWeights weights;
  weights.data.assign(values, 0);
  weights.layout = std::move(layout);
  return weights;
}

WeightInitRange InitRangeFor(const WeightTensor& t) {
  WeightInitRange range;
  switch (t.kind) {
    case WeightKind::kEmbedding:
      range.amplitude = std::sqrt(3.0);
      break;
    case WeightKind::kNorm:
      range.amplitude = 0.25;
      range.centre = 1.0f;
      break;
    case WeightKind::kMatrix:
      range.amplitude = std::sqrt(3.0 / static_cast<double>(t.cols));
      break;
    case WeightKind::kBias:
      range.amplitude = 0.5;
      break;
  }
  return range;
}

absl::StatusOr<LlamaHostWeights> RandomLlamaHostWeights(const LlamaShape& shape, uint64_t seed) {
  ASSIGN_OR_RETURN(LlamaHostWeights weights, ZeroLlamaHostWeights(shape));
  for (const WeightTensor& t : weights.layout.tensors()) {
    const WeightInitRange range = InitRangeFor(t);
    const internal::UniformInit init =
        internal::MakeUniformInit(seed, t.index, range.amplitude, range.centre);
    uint16_t* out = weights.mutable_tensor(t);
    const int64_t n = t.elements();
    for (int64_t i = 0; i < n; ++i) {
      out[i] = internal::InitValueBits(init, static_cast<uint64_t>(i));
    }
  }
  return weights;
}

}  // namespace kiln
