// A CPU float64 reference of kiln's Llama decoder, for tests: embedding, RMSNorm, fused QKV
// with RoPE (rotate-half), causal grouped-query attention over each sequence's full K/V
// history, O projection, residuals, SiLU·mul MLP, final norm, LM head, greedy argmax.
//
//   ASSIGN_OR_RETURN(kiln::LlamaHostWeights w,
//                    kiln::RandomLlamaHostWeights(kiln::LlamaShape::Tiny(), /*seed=*/7));
//   ASSIGN_OR_RETURN(kiln::ReferenceDecoder ref, kiln::ReferenceDecoder::Create(std::move(w)));
//   ASSIGN_OR_RETURN(std::vector<int32_t> tokens, ref.GenerateGreedy({1, 2, 3}, /*steps=*/8));
//
// Weights are the bf16 values of LlamaHostWeights, read exactly. With
// options.bf16_activations, every activation kiln stores as bf16 (norm outputs, projections,
// q/k after RoPE, the K/V cache, attention output, the residual stream, the MLP product) is
// rounded to bf16 at the same point, so the reference follows kiln's rounding and differs from
// it only by the order of float accumulation; without it everything stays in float64.
// Meant for small shapes (the 1B shape works but takes about a second per token).
// Host-only; not thread-safe (sequences hold mutable K/V histories).
#ifndef KILN_RUNTIME_MODEL_REFERENCE_DECODER_H_
#define KILN_RUNTIME_MODEL_REFERENCE_DECODER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/model/llama_shape.h"
#include "runtime/model/llama_weights.h"

namespace kiln {

struct ReferenceDecoderOptions {
  bool bf16_activations = false;
};

// Returns the index of the largest value, the lowest such index on ties (as kiln's greedy
// sampler); NaN values never win; -1 when there is no non-NaN value.
int32_t ArgmaxLowestIndex(absl::Span<const double> values);

class ReferenceDecoder {
 public:
  // Takes ownership of `weights` (their layout carries the shape); InvalidArgument as
  // LlamaHostWeights::Validate.
  static absl::StatusOr<ReferenceDecoder> Create(LlamaHostWeights weights,
                                                 ReferenceDecoderOptions options = {});

  const LlamaShape& shape() const { return weights_.layout.shape(); }

  // Starts an empty sequence and returns its id (0, 1, 2, ...).
  int AddSequence();

  // Returns the number of tokens sequence `seq` holds (its next token's position).
  int Length(int seq) const;

  // Feeds `tokens` as the next tokens of sequence `seq` (a prefill when there are several, a
  // decode step for one) at positions Length(seq), Length(seq) + 1, ...; each attends to the
  // sequence's history and to itself. Returns logits [tokens.size(), vocab], row-major.
  // InvalidArgument for an unknown sequence or a token outside [0, vocab).
  absl::StatusOr<std::vector<double>> Forward(int seq, absl::Span<const int32_t> tokens);

  // Runs `prompt` (non-empty) as a new sequence, then `steps` greedy decode steps; returns the
  // `steps` generated tokens. InvalidArgument for a bad prompt token or when a step's logits are
  // all NaN (weights holding NaN or infinities), which leave no token to pick.
  absl::StatusOr<std::vector<int32_t>> GenerateGreedy(absl::Span<const int32_t> prompt,
                                                      int steps);

 private:
  struct Sequence {
    // Per layer: K and V after RoPE, [length, kv_heads * head_dim] each.
    std::vector<std::vector<double>> k;
    std::vector<std::vector<double>> v;
    int length = 0;
  };

  ReferenceDecoder(LlamaHostWeights weights, ReferenceDecoderOptions options)
      : weights_(std::move(weights)), options_(options) {}

  double Round(double x) const;
  void RoundAll(std::vector<double>& x) const;
  // y [rows] = W [rows, cols] · x [cols] for the rows [first_row, first_row + rows) of `w`.
  void MatVec(const WeightTensor& w, int64_t first_row, int64_t rows, const double* x,
              double* y) const;
  // out = x / rms(x) * weight
  void RmsNorm(const WeightTensor& w, const std::vector<double>& x, std::vector<double>& out) const;
  // x [head_dim] = x / rms(x) * weight, in place (a query or key head's QK norm)
  void HeadNorm(const WeightTensor& w, double* x) const;
  std::vector<double> Token(Sequence& seq, int32_t token);

  LlamaHostWeights weights_;
  ReferenceDecoderOptions options_;
  std::vector<Sequence> sequences_;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_REFERENCE_DECODER_H_
