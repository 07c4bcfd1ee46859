#include "runtime/model/llama_shape.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {

LlamaShape LlamaShape::Llama1B() {
  LlamaShape shape;
  shape.rope_scaling = RopeScaling::Llama3(32.0, 1.0, 4.0, 8192);
  return shape;
}

LlamaShape LlamaShape::Tiny() {
  LlamaShape shape;
  shape.hidden = 256;
  shape.layers = 2;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 64;
  shape.ffn = 512;
  shape.vocab = 1024;
  shape.rope_theta = 10000.0;
  shape.rms_eps = 1e-5;
  shape.tie_embeddings = false;
  return shape;
}

namespace {

absl::Status Positive(const char* field, int value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("LlamaShape.", field, " is ", value, "; it must be positive"));
}

// Upper bounds far above any real model (the memory planner's, runtime/memory), so that every
// GEMM dimension fits an int and no weight count or byte size overflows 64 bits: the weights stay
// below 2^57 bytes. Values above them are typos.
constexpr int kMaxWidth = 1 << 20;  // hidden, ffn
constexpr int kMaxHeads = 1 << 12;  // heads, kv_heads, layers
constexpr int kMaxVocab = 1 << 24;

// Saturating int64 arithmetic for the derived sizes of a shape Validate may refuse: a product of
// a few int fields can pass 2^63 (3 · 2^31 QKV heads of 2^31 dimensions), which in plain int64
// arithmetic is undefined behaviour.
int64_t Saturate(bool negative) {
  return negative ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
}

int64_t MulSat(int64_t a, int64_t b) {
  int64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return Saturate((a < 0) != (b < 0));
  return product;
}

int64_t AddSat(int64_t a, int64_t b) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return Saturate(a < 0);
  return sum;
}

absl::Status AtMost(const char* field, int value, int limit) {
  if (value <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "LlamaShape.", field, " is ", value, ", above ", limit,
      ", beyond anything kiln runs; check the value (a typo or the wrong field?)"));
}

}  // namespace

absl::Status LlamaShape::Validate() const {
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"hidden", hidden}, {"layers", layers}, {"heads", heads},
        {"kv_heads", kv_heads}, {"head_dim", head_dim}, {"ffn", ffn}, {"vocab", vocab}}) {
    absl::Status status = Positive(field, value);
    if (!status.ok()) return status;
  }
  for (const auto& [field, value, limit] :
       {std::tuple<const char*, int, int>{"hidden", hidden, kMaxWidth},
        {"ffn", ffn, kMaxWidth}, {"layers", layers, kMaxHeads}, {"heads", heads, kMaxHeads},
        {"kv_heads", kv_heads, kMaxHeads}, {"vocab", vocab, kMaxVocab}}) {
    absl::Status status = AtMost(field, value, limit);
    if (!status.ok()) return status;
  }
  if (heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaShape.heads ", heads, " is not a multiple of kv_heads ", kv_heads,
        "; grouped-query attention needs whole groups, so pick kv_heads dividing heads"));
  }
  if (head_dim % 2 != 0 || head_dim > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaShape.head_dim is ", head_dim,
        "; RoPE needs an even head_dim of at most 256 (64 and 128 are the attention sizes)"));
  }
  // Every row of every weight and activation must start 16-byte aligned for the vectorised
  // kernels and cuBLASLt's fast paths: widths are multiples of 8 bf16 values.
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"hidden", hidden}, {"ffn", ffn}, {"head_dim", head_dim}}) {
    if (value % 8 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LlamaShape.", field, " is ", value,
          "; it must be a multiple of 8 so rows stay 16-byte aligned"));
    }
  }
  if (!IsRopeTheta(rope_theta)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaShape.rope_theta is ", rope_theta, "; it must be a finite value above 1"));
  }
  if (absl::Status status = rope_scaling.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaShape.rope_scaling: ", status.message()));
  }
  // The kernels take the epsilon as a float: below the least normal float it becomes 0 or a
  // subnormal that the GPU flushes to 0, and an all-zero row (a padded token) then gives NaN.
  constexpr double kMinEps = std::numeric_limits<float>::min();
  if (!(rms_eps >= kMinEps) || !(rms_eps < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaShape.rms_eps is ", rms_eps, "; it must lie in [", kMinEps,
        ", 1) (the kernels add it in float; config.json's rms_norm_eps is typically 1e-5 or "
        "1e-6)"));
  }
  return absl::OkStatus();
}

int64_t LlamaShape::qkv_rows() const {
  // The sum is at most 3 · 2^31 in magnitude; only the product can overflow.
  return MulSat(int64_t{heads} + 2 * int64_t{kv_heads}, head_dim);
}

int64_t LlamaShape::ParameterCount() const {
  const int64_t h = hidden;
  const int64_t qkv = qkv_rows();
  int64_t per_layer = AddSat(2 * h, MulSat(qkv, h));  // the norms, QKV
  per_layer = AddSat(per_layer, MulSat(h, q_width()));  // O
  per_layer = AddSat(per_layer, MulSat(3 * int64_t{ffn}, h));  // gate, up, down
  per_layer = AddSat(per_layer, (qkv_bias ? qkv : 0));
  per_layer = AddSat(per_layer, (qk_norm ? 2 * int64_t{head_dim} : 0));
  const int64_t table = MulSat(vocab, h);
  int64_t total = AddSat(AddSat(table, MulSat(layers, per_layer)), h);
  if (!tie_embeddings) total = AddSat(total, table);
  return total;
}

std::string LlamaShape::ToString() const {
  return absl::StrFormat(
      "hidden %d, %d layers, %d/%d heads x %d, ffn %d, vocab %d, rope_theta %g, rope_scaling %s, "
      "rms_eps %g, %s%s%s",
      hidden, layers, heads, kv_heads, head_dim, ffn, vocab, rope_theta, rope_scaling.ToString(),
      rms_eps, tie_embeddings ? "tied embeddings" : "separate lm_head",
      qkv_bias ? ", QKV bias" : "", qk_norm ? ", QK norm" : "");
}

}  // namespace kiln
