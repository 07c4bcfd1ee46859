#include "runtime/model/reference_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "attention/rope_frequency.h"
#include "runtime/model/bf16.h"

namespace kiln {

int32_t ArgmaxLowestIndex(absl::Span<const double> values) {
  int32_t best = -1;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) continue;
    if (best < 0 || values[i] > values[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

absl::StatusOr<ReferenceDecoder> ReferenceDecoder::Create(LlamaHostWeights weights,
                                                          ReferenceDecoderOptions options) {
  if (absl::Status status = weights.Validate(); !status.ok()) return status;
  return ReferenceDecoder(std::move(weights), options);
}

int ReferenceDecoder::AddSequence() {
  Sequence seq;
  seq.k.resize(shape().layers);
  seq.v.resize(shape().layers);
  sequences_.push_back(std::move(seq));
  return static_cast<int>(sequences_.size()) - 1;
}

int ReferenceDecoder::Length(int seq) const {
  if (seq < 0 || seq >= static_cast<int>(sequences_.size())) return 0;
  return sequences_[seq].length;
}

double ReferenceDecoder::Round(double x) const {
  return options_.bf16_activations ? RoundToBf16(x) : x;
}

void ReferenceDecoder::RoundAll(std::vector<double>& x) const {
  if (!options_.bf16_activations) return;
  for (double& v : x) v = RoundToBf16(v);
}

void ReferenceDecoder::MatVec(const WeightTensor& w, int64_t first_row, int64_t rows,
                              const double* x, double* y) const {
  const uint16_t* base = weights_.tensor(w) + first_row * w.cols;
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = base + r * w.cols;
    double acc = 0.0;
    for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(Bf16BitsToFloat(row[c])) * x[c];
    y[r] = acc;
  }
}

void ReferenceDecoder::RmsNorm(const WeightTensor& w, const std::vector<double>& x,
                               std::vector<double>& out) const {
  double sum_sq = 0.0;
  for (double v : x) sum_sq += v * v;
  const double scale = 1.0 / std::sqrt(sum_sq / static_cast<double>(x.size()) + shape().rms_eps);
  const uint16_t* weight = weights_.tensor(w);
  out.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = Round(x[i] * scale * static_cast<double>(Bf16BitsToFloat(weight[i])));
  }
}

void ReferenceDecoder::HeadNorm(const WeightTensor& w, double* x) const {
  const int d = shape().head_dim;
  double sum_sq = 0.0;
  for (int i = 0; i < d; ++i) sum_sq += x[i] * x[i];
  const double scale = 1.0 / std::sqrt(sum_sq / d + shape().rms_eps);
  const uint16_t* weight = weights_.tensor(w);
  for (int i = 0; i < d; ++i) {
    x[i] = Round(x[i] * scale * static_cast<double>(Bf16BitsToFloat(weight[i])));
  }
}

std::vector<double> ReferenceDecoder::Token(Sequence& seq, int32_t token) {
  const LlamaShape& s = shape();
  const LlamaWeightLayout& layout = weights_.layout;
  const int64_t hidden = s.hidden;
  const int d = s.head_dim;
  const int group = s.heads / s.kv_heads;
  const int pos = seq.length;

  std::vector<double> residual(hidden);
  const uint16_t* emb = weights_.tensor(layout.embedding()) + int64_t{token} * hidden;
  for (int64_t i = 0; i < hidden; ++i) residual[i] = Bf16BitsToFloat(emb[i]);

  // RoPE angles for this position: rotate-half pairs (i, i + d/2) by pos * f_i, with
  // f_i = theta^(-2i/d) rescaled by the shape's rope_scaling (attention/rope_frequency.h).
  const RopeFrequencies freqs = RopeFrequencies::Make(s.rope_theta, s.rope_scaling);
  std::vector<double> cos_t(d / 2), sin_t(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    const double angle = pos * RopeFrequency(freqs, i, d);
    cos_t[i] = std::cos(angle);
    sin_t[i] = std::sin(angle);
  }
  auto rope = [&](double* x) {
    for (int i = 0; i < d / 2; ++i) {
      const double a = x[i], b = x[i + d / 2];
      x[i] = Round(a * cos_t[i] - b * sin_t[i]);
      x[i + d / 2] = Round(b * cos_t[i] + a * sin_t[i]);
    }
  };

  std::vector<double> h, qkv(s.qkv_rows()), attn(s.q_width()), proj(hidden), gu(2 * int64_t{s.ffn}),
      act(s.ffn), scores;
  for (int l = 0; l < s.layers; ++l) {
    RmsNorm(layout.input_norm(l), residual, h);
    MatVec(layout.qkv(l), 0, s.qkv_rows(), h.data(), qkv.data());
    RoundAll(qkv);
    if (s.qkv_bias) {  // added to the rounded product, as kiln's bias kernel does
      const uint16_t* bias = weights_.tensor(layout.qkv_bias(l));
      for (int64_t i = 0; i < s.qkv_rows(); ++i) {
        qkv[i] = Round(qkv[i] + static_cast<double>(Bf16BitsToFloat(bias[i])));
      }
    }
    double* q = qkv.data();
    double* k = q + s.q_width();
    double* v = k + s.kv_width();
    if (s.qk_norm) {  // each head over head_dim, as kiln's QK norm kernel does
      for (int head = 0; head < s.heads; ++head) HeadNorm(layout.q_norm(l), q + int64_t{head} * d);
      for (int head = 0; head < s.kv_heads; ++head) HeadNorm(layout.k_norm(l), k + int64_t{head} * d);
    }
    for (int head = 0; head < s.heads; ++head) rope(q + int64_t{head} * d);
    for (int head = 0; head < s.kv_heads; ++head) rope(k + int64_t{head} * d);
    seq.k[l].insert(seq.k[l].end(), k, k + s.kv_width());
    seq.v[l].insert(seq.v[l].end(), v, v + s.kv_width());

    // Causal attention: this token (position pos) sees positions [0, pos].
    const int n = pos + 1;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    scores.resize(n);
    for (int head = 0; head < s.heads; ++head) {
      const int kv = head / group;
      const double* qh = q + int64_t{head} * d;
      double max_score = -std::numeric_limits<double>::infinity();
      for (int t = 0; t < n; ++t) {
        const double* kt = seq.k[l].data() + int64_t{t} * s.kv_width() + int64_t{kv} * d;
        double dot = 0.0;
        for (int i = 0; i < d; ++i) dot += qh[i] * kt[i];
        scores[t] = dot * scale;
        max_score = std::max(max_score, scores[t]);
      }
      double denom = 0.0;
      for (int t = 0; t < n; ++t) {
        scores[t] = std::exp(scores[t] - max_score);
        denom += scores[t];
      }
      double* out = attn.data() + int64_t{head} * d;
      for (int i = 0; i < d; ++i) out[i] = 0.0;
      for (int t = 0; t < n; ++t) {
        const double p = scores[t] / denom;
        const double* vt = seq.v[l].data() + int64_t{t} * s.kv_width() + int64_t{kv} * d;
        for (int i = 0; i < d; ++i) out[i] += p * vt[i];
      }
    }
    RoundAll(attn);
    MatVec(layout.o(l), 0, hidden, attn.data(), proj.data());
    RoundAll(proj);
    for (int64_t i = 0; i < hidden; ++i) residual[i] = Round(residual[i] + proj[i]);

    RmsNorm(layout.post_norm(l), residual, h);
    MatVec(layout.gate_up(l), 0, 2 * int64_t{s.ffn}, h.data(), gu.data());
    RoundAll(gu);
    for (int i = 0; i < s.ffn; ++i) {
      const double g = gu[i];
      act[i] = Round(g / (1.0 + std::exp(-g)) * gu[s.ffn + i]);
    }
    MatVec(layout.down(l), 0, hidden, act.data(), proj.data());
    RoundAll(proj);
    for (int64_t i = 0; i < hidden; ++i) residual[i] = Round(residual[i] + proj[i]);
  }
  RmsNorm(layout.final_norm(), residual, h);
  std::vector<double> logits(s.vocab);
  MatVec(layout.lm_head(), 0, s.vocab, h.data(), logits.data());
  ++seq.length;
  return logits;
}

absl::StatusOr<std::vector<double>> ReferenceDecoder::Forward(int seq,
                                                              absl::Span<const int32_t> tokens) {
  if (seq < 0 || seq >= static_cast<int>(sequences_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("Sequence ", seq, " does not exist; there are ",
                                                   sequences_.size(),
                                                   ", add one with AddSequence"));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= shape().vocab) {
      return absl::InvalidArgumentError(absl::StrCat("Token ", tokens[i], " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     shape().vocab, ")"));
    }
  }
  std::vector<double> logits;
  logits.reserve(tokens.size() * static_cast<size_t>(shape().vocab));
  for (int32_t token : tokens) {
    std::vector<double> row = Token(sequences_[seq], token);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

absl::StatusOr<std::vector<int32_t>> ReferenceDecoder::GenerateGreedy(
    absl::Span<const int32_t> prompt, int steps) {
  if (prompt.empty() || steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GenerateGreedy needs a non-empty prompt and ",
                                                   "steps >= 0; got ", prompt.size(),
                                                   " prompt tokens and steps ", steps));
  }
  const int seq = AddSequence();
  absl::StatusOr<std::vector<double>> logits = Forward(seq, prompt);
  if (!logits.ok()) return logits.status();
  std::vector<int32_t> generated;
  const size_t vocab = static_cast<size_t>(shape().vocab);
  for (int step = 0; step < steps; ++step) {
    absl::Span<const double> last(logits->data() + logits->size() - vocab, vocab);
    const int32_t next = ArgmaxLowestIndex(last);
    if (next < 0) {  // every logit NaN: there is no greedy token, and -1 is no token at all
      return absl::InvalidArgumentError(absl::StrCat(
          "Every logit of greedy step ", step,
          " is NaN, so there is no token to pick; the weights hold NaN or infinite values "
          "(check the checkpoint)"));
    }
    generated.push_back(next);
    if (step + 1 == steps) break;
    logits = Forward(seq, {next});
    if (!logits.ok()) return logits.status();
  }
  return generated;
}

}  // namespace kiln
