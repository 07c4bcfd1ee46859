#include "runtime/model/llama_model.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/attention_launch.h"
#include "attention/decode_kernel.h"
#include "attention/internal/unchecked_launch.h"
#include "attention/paged_kv_cache.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/model/bias_add.h"
#include "runtime/model/decode_gemm.h"
#include "runtime/model/decode_layer.h"
#include "runtime/model/embedding.h"
#include "runtime/model/prefetch_gemm.h"
#include "runtime/model/qk_norm.h"
#include "runtime/model/rms_norm.h"
#include "runtime/model/rope.h"
#include "runtime/model/rope_kv_append.h"
#include "runtime/model/sampling.h"
#include "runtime/model/silu_mul.h"
#include "runtime/model/skinny_gemm.h"

namespace kiln {
namespace {

using bf16 = __nv_bfloat16;

constexpr size_t kAlign = 256;

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of each activation inside the step's region.
struct ActivationOffsets {
  size_t residual, hidden, normed, qkv, attn, gate_up, act, last, mid_residual, total;
};

ActivationOffsets Offsets(const LlamaShape& s, int num_tokens, int num_rows) {
  const size_t n = static_cast<size_t>(num_tokens);
  const size_t e = sizeof(bf16);
  ActivationOffsets o;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at += AlignUp(bytes);
    return here;
  };
  o.residual = take(n * s.hidden * e);
  o.hidden = take(n * s.hidden * e);
  o.normed = take(n * s.hidden * e);
  o.qkv = take(n * s.qkv_rows() * e);
  o.attn = take(n * s.q_width() * e);
  o.gate_up = take(n * 2 * s.ffn * e);
  o.act = take(n * s.ffn * e);
  o.last = take(static_cast<size_t>(num_rows) * s.hidden * e);
  // Folded norms run only where the prefetch GEMM takes the step's rows.
  o.mid_residual =
      take(std::min<size_t>(n, static_cast<size_t>(kPrefetchGemmMaxRows)) * s.hidden * e);
  o.total = at;
  return o;
}

// One projection of the model: output rows n, inner dimension k, input kind, output type.
struct Projection {
  LlamaModel::Proj proj;
  int64_t n, k;
  DecodeGemmInput input;
  bool float_output;
};

std::vector<Projection> Projections(const LlamaShape& s) {
  using P = LlamaModel::Proj;
  return {{P::kQkv, s.qkv_rows(), s.hidden, DecodeGemmInput::kPlain, false},
          {P::kO, s.hidden, s.q_width(), DecodeGemmInput::kPlain, false},
          {P::kGateUp, 2 * int64_t{s.ffn}, s.hidden, DecodeGemmInput::kPlain, false},
          {P::kDown, s.hidden, s.ffn, DecodeGemmInput::kPlain, false},
          {P::kDown, s.hidden, s.ffn, DecodeGemmInput::kSiluMul, false},
          {P::kLmHead, s.vocab, s.hidden, DecodeGemmInput::kPlain, true}};
}

// The LM head's row limit: Rows is DecodeGemmRows or PrefetchGemmRows; TmaGemmRows has none.
template <typename Rows>
int LmHeadRows(const Rows& rows) {
  return rows.lm_head;
}
int LmHeadRows(const TmaGemmRows&) { return 0; }
int LmHeadRows(const TmaGemmSplits&) { return 0; }

// Rows is DecodeGemmRows, PrefetchGemmRows or TmaGemmRows.
template <typename Rows>
int MaxRows(const Rows& rows) {
  return std::max({rows.qkv, rows.o, rows.gate_up, rows.down, LmHeadRows(rows)});
}

// The most rows `proj` runs through the decode, prefetch or TMA GEMM (or, for TmaGemmSplits, the
// most k slices it gets there).
template <typename Rows>
int RowLimit(const Rows& rows, LlamaModel::Proj proj) {
  switch (proj) {
    case LlamaModel::Proj::kQkv: return rows.qkv;
    case LlamaModel::Proj::kO: return rows.o;
    case LlamaModel::Proj::kGateUp: return rows.gate_up;
    case LlamaModel::Proj::kDown: return rows.down;
    case LlamaModel::Proj::kLmHead: return LmHeadRows(rows);
  }
  return 0;
}

// Returns InvalidArgument naming `what` and its limits where a row limit is negative or above
// `most`.
template <typename Rows>
absl::Status CheckRows(const Rows& rows, const char* what, int most) {
  if (std::min({rows.qkv, rows.o, rows.gate_up, rows.down, LmHeadRows(rows)}) >= 0 &&
      MaxRows(rows) <= most) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " (qkv ", rows.qkv, ", o ", rows.o, ", gate_up ", rows.gate_up, ", down ", rows.down,
      ", lm_head ", LmHeadRows(rows), ") must lie in [0, ", most, "]"));
}

// Returns the prefetch, TMA or decode GEMM's arguments for y [m, n] = x [m, k] · Wᵀ (their
// fields share these names); the caller sets the rest (input, output type, epilogue).
template <typename Args, typename Y>
Args GemmArgs(const bf16* x, const bf16* w, Y* y, int64_t m, int64_t n, int64_t k) {
  Args args;
  args.x = x;
  args.w = w;
  args.y = y;
  args.m = static_cast<int>(m);
  args.n = static_cast<int>(n);
  args.k = static_cast<int>(k);
  return args;
}

// The error for a GEMM that refuses the gate-up projection with SiLU·mul in its epilogue.
absl::Status GateUpSiluRefused(const char* gemm, int64_t m, const std::string& config,
                               const char* option) {
  return absl::InternalError(absl::StrCat("The ", gemm,
                                          " refuses the gate-up projection with SiLU·mul at ", m,
                                          " rows (", config, "); set ", option, " = false"));
}

}  // namespace

struct LlamaModel::Activations {
  bf16* residual;  // [n, hidden]
  bf16* hidden;    // [n, hidden]: O and down projection outputs (summed over ranks), or with
                   // the fused all-reduce + norm its normed output
  bf16* normed;    // [n, hidden]
  bf16* qkv;       // [n, qkv_rows]
  bf16* attn;      // [n, q_width]
  bf16* gate_up;   // [n, 2 ffn]
  bf16* act;       // [n, ffn]
  bf16* last;      // [rows, hidden]
  bf16* mid_residual;  // [min(n, kPrefetchGemmMaxRows), hidden]: the residual between a layer's
                       // QKV and gate-up GEMMs where they fold the norms
};

DecodeLayerShape DecodeLayerShapeOf(const LlamaShape& s) {
  DecodeLayerShape l;
  l.hidden = s.hidden;
  l.q_width = s.q_width();
  l.ffn = s.ffn;
  l.heads = s.heads;
  l.kv_heads = s.kv_heads;
  l.head_dim = s.head_dim;
  l.eps = static_cast<float>(s.rms_eps);
  l.theta = s.rope_theta;
  l.rope_scaling = s.rope_scaling;
  return l;
}

size_t LlamaModel::ActivationBytes(const LlamaShape& shape, int num_tokens, int num_rows) {
  return Offsets(shape, num_tokens, num_rows).total;
}

int64_t LlamaModel::ActivationBytesPerToken(const LlamaShape& s) {
  return (5 * int64_t{s.hidden} + s.qkv_rows() + s.q_width() + 3 * int64_t{s.ffn}) *
         static_cast<int64_t>(sizeof(bf16));
}

size_t LlamaModel::KvBlockBytes(const LlamaShape& s, int block_size) {
  return 2 * static_cast<size_t>(s.layers) * s.kv_heads * s.head_dim * block_size * sizeof(bf16);
}

// Carve places every activation inside the region, so its alignment is checked here.
absl::Status CheckLlamaStepArgs(const LlamaStepArgs& args) {
  if (args.num_tokens < 1 || args.num_rows < 1 || args.num_rows > args.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Step sizes num_tokens ", args.num_tokens, " and num_rows ", args.num_rows,
        " must be positive with num_rows <= num_tokens"));
  }
  if (args.activations == nullptr || reinterpret_cast<uintptr_t>(args.activations) % kAlign != 0) {
    return absl::InvalidArgumentError(
        "Step activations must be a 256-byte aligned region of ActivationBytes(num_tokens, "
        "num_rows) bytes; pass the arena or a graph memory pool allocation");
  }
  const std::pair<const char*, const void*> views[] = {
      {"token_ids", args.token_ids},
      {"positions", args.positions},
      {"last_token_rows", args.last_token_rows},
      {"block_table", args.block_table},
      {"logits", args.logits},
      {"next_tokens", args.next_tokens}};
  for (const auto& [name, view] : views) {
    if (view == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Step view ", name, " is null; pass the step's uploaded metadata and output buffers"));
    }
  }
  if (args.max_blocks_per_seq < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Step max_blocks_per_seq ", args.max_blocks_per_seq,
        " is below 1; pass the block table's row width"));
  }
  if (args.decode.work_capacity <= 0 && args.prefill.work_capacity <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Step has no enabled plan part (work_capacity decode ", args.decode.work_capacity,
        ", prefill ", args.prefill.work_capacity, "); pass the step's plan with decode and/or "
        "prefill enabled"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckedLlamaStepArgs> CheckedLlamaStepArgs::Check(const LlamaStepArgs& args) {
  RETURN_IF_ERROR(CheckLlamaStepArgs(args));
  return CheckedLlamaStepArgs(args);
}

absl::Status CheckLlamaModelOptions(const LlamaShape& s, const LlamaModelOptions& options) {
  RETURN_IF_ERROR(s.Validate());
  RETURN_IF_ERROR(DecodeAttentionSupportsShape(s.heads, s.kv_heads, s.head_dim));
  if (options.skinny_gemm_max_rows < 0 || options.skinny_gemm_max_rows > kSkinnyGemmMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("skinny_gemm_max_rows ", options.skinny_gemm_max_rows, " is outside [0, ",
                     kSkinnyGemmMaxRows, "]"));
  }
  const PrefetchGemmRows& prefetch = options.prefetch_gemm_rows;
  RETURN_IF_ERROR(CheckRows(prefetch, "prefetch_gemm_rows", kPrefetchGemmMaxRows));
  if (options.prefetch_gemm_ctas_per_sm < 1 || options.prefetch_gemm_ctas_per_sm > 2) {
    return absl::InvalidArgumentError(absl::StrCat("prefetch_gemm_ctas_per_sm ",
                                                   options.prefetch_gemm_ctas_per_sm,
                                                   " must be 1 or 2"));
  }
  const TmaGemmRows& tma = options.tma_gemm_rows;
  RETURN_IF_ERROR(CheckRows(tma, "tma_gemm_rows", kTmaGemmMaxRows));
  if (options.tma_gemm_ctas_per_sm < 1 || options.tma_gemm_ctas_per_sm > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tma_gemm_ctas_per_sm ", options.tma_gemm_ctas_per_sm, " must be 1 or 2"));
  }
  const TmaGemmSplits& splits = options.tma_gemm_max_splits;
  const auto limits = {splits.qkv, splits.qkv_at_32_rows, splits.o, splits.gate_up, splits.down};
  if (std::min(limits) < 1 || std::max(limits) > kTmaGemmMaxSplits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tma_gemm_max_splits {", splits.qkv, ", ", splits.qkv_at_32_rows, ", ", splits.o, ", ",
        splits.gate_up, ", ", splits.down, "} must each be in [1, ", kTmaGemmMaxSplits, "]"));
  }
  if (options.layer_kernel_rows < 0 || options.layer_kernel_rows > kDecodeLayerMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat("layer_kernel_rows ", options.layer_kernel_rows,
                                                   " is outside [0, ", kDecodeLayerMaxRows, "]"));
  }
  if ((s.qkv_bias || s.qk_norm) && options.layer_kernel_rows > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer_kernel_rows ", options.layer_kernel_rows, ": the decode layer kernel has no ",
        s.qkv_bias ? "QKV bias" : "QK norm", "; set layer_kernel_rows to 0 for this model"));
  }
  if (options.rope_in_attention_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope_in_attention_rows ", options.rope_in_attention_rows, " must be 0 (never) or more"));
  }
  if (options.rope_in_attention_min_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_in_attention_min_rows ", options.rope_in_attention_min_rows,
                     " must be 1 or more (rope_in_attention_rows 0 turns the path off)"));
  }
  const DecodeGemmRows& rows = options.decode_gemm_rows;
  RETURN_IF_ERROR(CheckRows(rows, "decode_gemm_rows", kDecodeGemmMaxRows));
  if (options.num_kv_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_kv_blocks ", options.num_kv_blocks, " must be positive; size it with the memory "
        "planner"));
  }
  PagedKvLayout layout{options.num_kv_blocks, options.block_size, s.kv_heads, s.head_dim,
                       AttentionDtype::kBf16};
  RETURN_IF_ERROR(layout.Validate());
  // K and V pools for every layer in one allocation: their size must not wrap.
  const size_t pools = 2 * static_cast<size_t>(s.layers);
  if (layout.PoolBytes() > std::numeric_limits<size_t>::max() / pools) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_kv_blocks ", options.num_kv_blocks, " gives K and V pools of ", layout.PoolBytes(),
        " bytes per layer, more than 64 bits hold for ", s.layers, " layers; size it with the "
        "memory planner"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(LlamaDeviceWeights weights,
                                                               const LlamaModelOptions& options,
                                                               std::unique_ptr<Gemm> gemm) {
  const LlamaShape& s = weights.shape();
  RETURN_IF_ERROR(CheckLlamaModelOptions(s, options));
  const PrefetchGemmRows& prefetch = options.prefetch_gemm_rows;
  const TmaGemmRows& tma = options.tma_gemm_rows;
  const DecodeGemmRows& rows = options.decode_gemm_rows;
  PagedKvLayout layout{options.num_kv_blocks, options.block_size, s.kv_heads, s.head_dim,
                       AttentionDtype::kBf16};
  const size_t kv_bytes = 2 * static_cast<size_t>(s.layers) * layout.PoolBytes();
  ASSIGN_OR_RETURN(DeviceBuffer kv, DeviceBuffer::Allocate(kv_bytes, "kv cache"));
  if (gemm == nullptr) {
    ASSIGN_OR_RETURN(gemm, Gemm::Create(options.gemm_workspace_bytes));
  }
  // The decode GEMM's split-K partials and counters: the most any projection needs at any row
  // count it serves (configurations depend on the SM count).
  int device = 0, sm_count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  size_t workspace_bytes = 0;
  int counters = 0;
  for (int m = 1; m <= MaxRows(rows); ++m) {
    for (const Projection& p : Projections(s)) {
      if (m > RowLimit(rows, p.proj)) continue;
      const DecodeGemmConfig c = ChooseDecodeGemmConfig(m, p.n, p.k, sm_count);
      if (!DecodeGemmSupportsShape(m, p.n, p.k, p.input, p.float_output, c)) continue;
      workspace_bytes = std::max(workspace_bytes, DecodeGemmWorkspaceBytes(m, p.n, c));
      counters = std::max(counters, DecodeGemmCounters(p.n, c));
    }
  }
  // The prefetch GEMM's shared-memory limits are raised here, outside any capture.
  if (MaxRows(prefetch) > 0) CUDA_RETURN_IF_ERROR(PreparePrefetchGemm());
  // So are the TMA GEMM's, and its tensor-map encoder is found.
  if (MaxRows(tma) > 0) CUDA_RETURN_IF_ERROR(PrepareTmaGemm());
  // The decode layer kernel's launch shapes (they query the device, so not during capture) and
  // its grid barrier's state.
  LayerKernel layer_kernel;
  if (options.communicator == nullptr) {
    for (int m = 1; m <= options.layer_kernel_rows; ++m) {
      layer_kernel.configs[m] = ChooseDecodeLayerConfig(m, DecodeLayerShapeOf(s), sm_count);
    }
  }
  if (options.layer_kernel_rows > 0) {
    ASSIGN_OR_RETURN(layer_kernel.sync,
                     DeviceBuffer::Allocate(kDecodeLayerSyncBytes, "decode layer grid barrier"));
    RETURN_IF_ERROR(FillDeviceAndWait(layer_kernel.sync.data(), 0, layer_kernel.sync.size(),
                                      layer_kernel.sync.name()));
  }
  DeviceBuffer decode_workspace, decode_counters;
  if (workspace_bytes > 0) {
    ASSIGN_OR_RETURN(decode_workspace,
                     DeviceBuffer::Allocate(workspace_bytes, "decode GEMM workspace"));
    ASSIGN_OR_RETURN(decode_counters, DeviceBuffer::Allocate(counters * sizeof(int32_t),
                                                             "decode GEMM counters"));
    RETURN_IF_ERROR(FillDeviceAndWait(decode_counters.data(), 0, decode_counters.size(),
                                      decode_counters.name()));
  }
  return std::unique_ptr<LlamaModel>(new LlamaModel(
      std::move(weights), options, layout, std::move(kv), std::move(gemm), sm_count,
      std::move(decode_workspace), std::move(decode_counters), std::move(layer_kernel)));
}

LlamaModel::LlamaModel(LlamaDeviceWeights weights, const LlamaModelOptions& options,
                       const PagedKvLayout& kv_layout, DeviceBuffer kv, std::unique_ptr<Gemm> gemm,
                       int sm_count, DeviceBuffer decode_workspace, DeviceBuffer decode_counters,
                       LayerKernel layer_kernel)
    : weights_(std::move(weights)),
      options_(options),
      kv_layout_(kv_layout),
      kv_(std::move(kv)),
      gemm_(std::move(gemm)),
      sm_count_(sm_count),
      decode_workspace_(std::move(decode_workspace)),
      decode_counters_(std::move(decode_counters)),
      layer_kernel_(std::move(layer_kernel)) {
  // The layer kernel repeats the prefetch GEMM's arithmetic: only where that is the step's path
  // for every projection.
  const LlamaShape& s = shape();
  const DecodeGemmInput plain = DecodeGemmInput::kPlain;
  for (int m = 1; m <= options_.layer_kernel_rows; ++m) {
    layer_kernel_.used[m] =
        layer_kernel_.configs[m].stages > 0 && options_.communicator == nullptr &&
        UsesPrefetchGemm(Proj::kQkv, m, s.qkv_rows(), s.hidden, plain) &&
        UsesPrefetchGemm(Proj::kO, m, s.hidden, s.q_width(), plain) &&
        UsesPrefetchGemm(Proj::kGateUp, m, 2 * int64_t{s.ffn}, s.hidden, plain) &&
        UsesPrefetchGemm(Proj::kDown, m, s.hidden, s.ffn, plain);
  }
}

LlamaModel::~LlamaModel() = default;

void* LlamaModel::k_cache(int layer) const {
  return static_cast<char*>(kv_.data()) + (2 * static_cast<size_t>(layer)) * kv_layout_.PoolBytes();
}

void* LlamaModel::v_cache(int layer) const {
  return static_cast<char*>(kv_.data()) +
         (2 * static_cast<size_t>(layer) + 1) * kv_layout_.PoolBytes();
}

bool LlamaModel::UsesSkinny(int64_t m) const { return m <= options_.skinny_gemm_max_rows; }

std::optional<PrefetchGemmConfig> LlamaModel::PrefetchGemmFor(Proj proj, int64_t m, int64_t n,
                                                              int64_t k,
                                                              DecodeGemmInput input) const {
  if (m > RowLimit(options_.prefetch_gemm_rows, proj)) return std::nullopt;
  if (input == DecodeGemmInput::kSiluMul &&
      (!options_.silu_in_down || !options_.prefetch_gemm_silu)) {
    return std::nullopt;
  }
  if (n > 0x7fffffff || k > 0x7fffffff) return std::nullopt;
  PrefetchGemmConfig c = ChoosePrefetchGemmConfig(static_cast<int>(m), static_cast<int>(n),
                                                  static_cast<int>(k), sm_count_,
                                                  options_.prefetch_gemm_ctas_per_sm);
  // Not QKV, whose GEMM may read the folded norm, nor gate-up, whose GEMM may write SiLU·mul.
  c.row_halves = options_.prefetch_row_halves && (proj == Proj::kO || proj == Proj::kDown) &&
                 PrefetchGemmTakesRowHalves(static_cast<int>(m), static_cast<int>(n),
                                            static_cast<int>(k), c.ctas,
                                            /*silu_mul_output=*/false);
  if (!PrefetchGemmSupportsShape(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                 c)) {
    return std::nullopt;
  }
  return c;
}

bool LlamaModel::UsesPrefetchGemm(Proj proj, int64_t m, int64_t n, int64_t k,
                                  DecodeGemmInput input) const {
  return PrefetchGemmFor(proj, m, n, k, input).has_value();
}

bool LlamaModel::PrefetchGemmTakesNorm(Proj proj, int64_t m, int64_t n, int64_t k) const {
  const std::optional<PrefetchGemmConfig> c =
      PrefetchGemmFor(proj, m, n, k, DecodeGemmInput::kPlain);
  return c.has_value() && PrefetchGemmSupportsNormShape(static_cast<int>(m), static_cast<int>(n),
                                                        static_cast<int>(k), *c);
}

bool LlamaModel::UsesLayerKernel(int num_tokens) const {
  return num_tokens >= 1 && num_tokens <= kDecodeLayerMaxRows && layer_kernel_.used[num_tokens];
}

bool LlamaModel::RopeInAttention(const LlamaStepArgs& args) const {
  return options_.run_attention && AttentionTakesRope(args);
}

bool LlamaModel::AttentionTakesRope(const LlamaStepArgs& args) const {
  // Not where the decode layer kernel runs the step (slower there, runtime/runner/NOTES.md), nor
  // without RoPE (for benchmarks).
  return args.num_tokens >= options_.rope_in_attention_min_rows &&
         args.num_tokens <= options_.rope_in_attention_rows && !UsesLayerKernel(args.num_tokens) &&
         options_.run_rope_append && args.decode.work_capacity > 0 &&
         args.prefill.work_capacity == 0;
}

bool LlamaModel::FoldsNorms(int num_tokens) const {
  // Both projections or neither: the residual moves to mid_residual in the QKV GEMM and back in
  // the gate-up GEMM, so a layer that moved it one way only would end with it in the wrong place.
  const LlamaShape& s = shape();
  return options_.fold_norm_into_gemm && !UsesLayerKernel(num_tokens) &&
         !FusesAllReduceNorm(num_tokens) &&
         num_tokens <= kPrefetchGemmMaxRows &&
         PrefetchGemmTakesNorm(Proj::kQkv, num_tokens, s.qkv_rows(), s.hidden) &&
         PrefetchGemmTakesNorm(Proj::kGateUp, num_tokens, 2 * int64_t{s.ffn}, s.hidden);
}

bool LlamaModel::FusesSiluMul(int64_t m, int64_t n, int64_t k) const {
  // Where the prefetch GEMM takes the down projection, it fuses SiLU·mul only if asked to;
  // elsewhere the decode GEMM does where it runs.
  if (UsesPrefetchGemm(Proj::kDown, m, n, k, DecodeGemmInput::kPlain)) {
    return UsesPrefetchGemm(Proj::kDown, m, n, k, DecodeGemmInput::kSiluMul);
  }
  return UsesDecodeGemm(Proj::kDown, m, n, k, DecodeGemmInput::kSiluMul);
}

LlamaModel::MlpPath LlamaModel::MlpPathFor(int64_t m) const {
  const LlamaShape& s = shape();
  const int64_t n = 2 * int64_t{s.ffn};
  MlpPath path;
  path.folded_norm = FoldsNorms(static_cast<int>(m));
  path.silu_in_down = FusesSiluMul(m, s.hidden, s.ffn);
  if (UsesLayerKernel(static_cast<int>(m)) || path.folded_norm || path.silu_in_down) return path;
  // Linear's order: the prefetch GEMM takes the projection first.
  if (std::optional<PrefetchGemmConfig> c =
          PrefetchGemmFor(Proj::kGateUp, m, n, s.hidden, DecodeGemmInput::kPlain)) {
    // A CTA owns at least one gate row and its up row.
    c->ctas = static_cast<int>(std::min<int64_t>(c->ctas, s.ffn));
    if (options_.prefetch_gate_up_silu) path.gate_up_silu.prefetch = c;
    return path;
  }
  if (options_.tma_gate_up_silu && m <= kTmaGemmMaxRows) {
    path.gate_up_silu.tma = TmaGemmFor(Proj::kGateUp, m, n, s.hidden, DecodeGemmInput::kPlain);
  }
  return path;
}

absl::Status LlamaModel::GateUpSiluMul(const bf16* x, const bf16* w, bf16* act, int64_t m,
                                       const GateUpSilu& path, cudaStream_t stream) {
  const int64_t n = 2 * int64_t{shape().ffn};
  const int64_t k = shape().hidden;
  if (path.prefetch) {
    PrefetchGemmArgs args = GemmArgs<PrefetchGemmArgs>(x, w, act, m, n, k);
    args.silu_mul_output = true;
    if (!PrefetchGemmSupports(args, *path.prefetch)) {
      return GateUpSiluRefused("prefetch GEMM", m, path.prefetch->ToString(),
                               "prefetch_gate_up_silu");
    }
    return ToStatus(LaunchPrefetchGemm(args, *path.prefetch, stream), "prefetch GEMM");
  }
  if (!path.tma) return absl::InternalError("GateUpSiluMul got no GEMM to run");
  TmaGemmArgs args = GemmArgs<TmaGemmArgs>(x, w, act, m, n, k);
  args.silu_mul = true;
  if (!TmaGemmSupports(args, *path.tma)) {
    return GateUpSiluRefused("TMA GEMM", m, path.tma->ToString(), "tma_gate_up_silu");
  }
  return ToStatus(LaunchTmaGemm(args, *path.tma, stream), "TMA GEMM");
}

std::optional<TmaGemmConfig> LlamaModel::TmaGemmFor(Proj proj, int64_t m, int64_t n, int64_t k,
                                                    DecodeGemmInput input) const {
  if (m > RowLimit(options_.tma_gemm_rows, proj) || input != DecodeGemmInput::kPlain) {
    return std::nullopt;
  }
  if (n > 0x7fffffff || k > 0x7fffffff) return std::nullopt;
  const TmaGemmSplits& splits = options_.tma_gemm_max_splits;
  const int max_splits = proj == Proj::kQkv && TmaGemmPaddedRows(static_cast<int>(m)) == 32
                             ? splits.qkv_at_32_rows
                             : RowLimit(splits, proj);
  const TmaGemmConfig c = ChooseTmaGemmConfig(static_cast<int>(m), static_cast<int>(n),
                                              static_cast<int>(k), sm_count_,
                                              options_.tma_gemm_ctas_per_sm, max_splits);
  if (!TmaGemmSupportsShape(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), c)) {
    return std::nullopt;
  }
  return c;
}

std::optional<DecodeGemmConfig> LlamaModel::DecodeGemmFor(Proj proj, int64_t m, int64_t n,
                                                          int64_t k,
                                                          DecodeGemmInput input) const {
  if (m > RowLimit(options_.decode_gemm_rows, proj)) return std::nullopt;
  if (input == DecodeGemmInput::kSiluMul && !options_.silu_in_down) return std::nullopt;
  if (n > 0x7fffffff || k > 0x7fffffff) return std::nullopt;
  const bool float_output = proj == Proj::kLmHead;
  const DecodeGemmConfig c = ChooseDecodeGemmConfig(static_cast<int>(m), static_cast<int>(n),
                                                    static_cast<int>(k), sm_count_);
  if (!DecodeGemmSupportsShape(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                               input, float_output, c)) {
    return std::nullopt;
  }
  return c;
}

bool LlamaModel::UsesDecodeGemm(Proj proj, int64_t m, int64_t n, int64_t k,
                                DecodeGemmInput input) const {
  return DecodeGemmFor(proj, m, n, k, input).has_value();
}

absl::Status LlamaModel::Prepare(int num_tokens, int num_rows) {
  const LlamaShape& s = shape();
  for (const Projection& p : Projections(s)) {
    if (p.input == DecodeGemmInput::kSiluMul) continue;  // falls back to the plain down GEMM
    const int64_t m = p.float_output ? num_rows : num_tokens;
    const LinearPath path = LinearPathFor(p.proj, m, p.n, p.k, p.input);
    if (path.prefetch || path.tma || path.decode || path.skinny) continue;
    RETURN_IF_ERROR(gemm_->Prepare(m, p.n, p.k,
                                   p.float_output ? GemmOutput::kFloat32 : GemmOutput::kBf16));
  }
  return absl::OkStatus();
}

LlamaModel::LinearPath LlamaModel::LinearPathFor(Proj proj, int64_t m, int64_t n, int64_t k,
                                                 DecodeGemmInput input) const {
  LinearPath path;
  path.proj = proj;
  path.input = input;
  path.m = m;
  path.n = n;
  path.k = k;
  path.prefetch = PrefetchGemmFor(proj, m, n, k, input);
  path.tma = TmaGemmFor(proj, m, n, k, input);
  path.decode = DecodeGemmFor(proj, m, n, k, input);
  path.skinny = UsesSkinny(m);
  return path;
}

LlamaModel::StepDecisions LlamaModel::DecideStep(const LlamaStepArgs& args) const {
  const LlamaShape& s = shape();
  const int n = args.num_tokens;
  const DecodeGemmInput plain = DecodeGemmInput::kPlain;
  StepDecisions step;
  step.layer_kernel = UsesLayerKernel(n);
  step.fused_allreduce_norm = FusesAllReduceNorm(n);
  step.attention_rope = AttentionTakesRope(args);
  step.mlp = MlpPathFor(n);
  step.qkv = LinearPathFor(Proj::kQkv, n, s.qkv_rows(), s.hidden, plain);
  step.o = LinearPathFor(Proj::kO, n, s.hidden, s.q_width(), plain);
  step.gate_up = LinearPathFor(Proj::kGateUp, n, 2 * int64_t{s.ffn}, s.hidden, plain);
  step.down = LinearPathFor(Proj::kDown, n, s.hidden, s.ffn,
                            step.mlp.silu_in_down ? DecodeGemmInput::kSiluMul : plain);
  step.lm_head = LinearPathFor(Proj::kLmHead, args.num_rows, s.vocab, s.hidden, plain);
  return step;
}

absl::Status LlamaModel::Linear(const LinearPath& path, const bf16* x, const bf16* w, void* y,
                                cudaStream_t stream) {
  const int64_t m = path.m, n = path.n, k = path.k;
  const bool float_output = path.proj == Proj::kLmHead;
  if (path.prefetch) {
    PrefetchGemmArgs args = GemmArgs<PrefetchGemmArgs>(x, w, y, m, n, k);
    args.float_output = float_output;
    args.input = path.input == DecodeGemmInput::kSiluMul ? PrefetchGemmInput::kSiluMul
                                                         : PrefetchGemmInput::kPlain;
    if (PrefetchGemmSupports(args, *path.prefetch)) {
      return ToStatus(LaunchPrefetchGemm(args, *path.prefetch, stream), "prefetch GEMM");
    }
  }
  if (path.tma) {
    TmaGemmArgs args = GemmArgs<TmaGemmArgs>(x, w, static_cast<bf16*>(y), m, n, k);
    args.next_after_wait = path.proj == Proj::kQkv && options_.tma_qkv_next_after_wait;
    if (TmaGemmSupports(args, *path.tma)) {
      return ToStatus(LaunchTmaGemm(args, *path.tma, stream), "TMA GEMM");
    }
  }
  if (path.decode) {
    DecodeGemmArgs args = GemmArgs<DecodeGemmArgs>(x, w, y, m, n, k);
    args.float_output = float_output;
    args.input = path.input;
    if (DecodeGemmSupports(args, *path.decode)) {
      return ToStatus(LaunchDecodeGemm(args, *path.decode, decode_workspace_.as<float>(),
                                       decode_counters_.as<int32_t>(), stream),
                      "decode GEMM");
    }
  }
  if (path.input != DecodeGemmInput::kPlain) {
    return absl::InternalError("Linear got a fused SiLU·mul input the decode GEMM cannot take");
  }
  if (path.skinny && SkinnyGemmSupports(m, k, x, w, y)) {
    return ToStatus(LaunchSkinnyGemm(x, w, y, m, n, k, float_output, stream), "skinny GEMM");
  }
  return gemm_->Run(x, w, y, m, n, k, stream,
                    float_output ? GemmOutput::kFloat32 : GemmOutput::kBf16);
}

absl::Status LlamaModel::FoldedNormLinear(const LinearPath& path, const bf16* x,
                                          const bf16* residual_in, bf16* residual_out,
                                          const bf16* norm_weight, const bf16* w, void* y,
                                          cudaStream_t stream) {
  const int64_t m = path.m, n = path.n, k = path.k;
  PrefetchGemmArgs args = GemmArgs<PrefetchGemmArgs>(x, w, y, m, n, k);
  args.input =
      residual_in != nullptr ? PrefetchGemmInput::kAddRmsNorm : PrefetchGemmInput::kRmsNorm;
  args.residual_in = residual_in;
  args.residual_out = residual_out;
  args.norm_weight = norm_weight;
  args.eps = static_cast<float>(shape().rms_eps);
  // FoldsNorms found this configuration (PrefetchGemmTakesNorm): ChoosePrefetchGemmConfig's, as
  // PrefetchGemmFor sets row halves for neither QKV nor gate-up.
  if (!path.prefetch || !PrefetchGemmSupports(args, *path.prefetch)) {
    return absl::InternalError(absl::StrCat(
        "The prefetch GEMM refuses a folded norm at ", m, " x ", n, " x ", k, " (",
        path.prefetch ? path.prefetch->ToString() : "no configuration",
        ") that FoldsNorms chose"));
  }
  return ToStatus(LaunchPrefetchGemm(args, *path.prefetch, stream),
                  "prefetch GEMM with folded norm");
}

LlamaModel::Activations LlamaModel::Carve(const LlamaStepArgs& args) const {
  const ActivationOffsets o = Offsets(shape(), args.num_tokens, args.num_rows);
  char* base = static_cast<char*>(args.activations);
  return Activations{reinterpret_cast<bf16*>(base + o.residual),
                     reinterpret_cast<bf16*>(base + o.hidden),
                     reinterpret_cast<bf16*>(base + o.normed),
                     reinterpret_cast<bf16*>(base + o.qkv),
                     reinterpret_cast<bf16*>(base + o.attn),
                     reinterpret_cast<bf16*>(base + o.gate_up),
                     reinterpret_cast<bf16*>(base + o.act),
                     reinterpret_cast<bf16*>(base + o.last),
                     reinterpret_cast<bf16*>(base + o.mid_residual)};
}

absl::Status LlamaModel::PreAttention(int layer, const LlamaStepArgs& args,
                                      const StepDecisions& step, const Activations& a,
                                      cudaStream_t stream) {
  const LlamaShape& s = shape();
  const LlamaDeviceWeights& w = weights_;
  const int n = args.num_tokens;
  const float eps = static_cast<float>(s.rms_eps);
  const bf16* normed = a.normed;
  if (step.mlp.folded_norm) {
    // The QKV GEMM norms its input itself: mid_residual = residual (+ the previous layer's down
    // projection); its x = RMSNorm(mid_residual). The gate-up GEMM moves the residual back.
    const bool first = layer == 0;
    RETURN_IF_ERROR(FoldedNormLinear(step.qkv, first ? a.residual : a.hidden,
                                     first ? nullptr : a.residual, a.mid_residual,
                                     w.input_norm(layer), w.qkv(layer), a.qkv, stream));
  } else {
    if (!options_.run_norms) {
      // A benchmark times the step without its norm kernels.
    } else if (layer == 0) {
      CUDA_RETURN_IF_ERROR(LaunchRmsNorm(a.residual, w.input_norm(0), a.normed, n, s.hidden, eps,
                                         stream));
    } else if (step.fused_allreduce_norm) {
      // The previous layer's down-projection all-reduce already added the residual and normed
      // it into `hidden` (PostAttention, in the same piece).
      normed = a.hidden;
    } else {
      // residual += the previous layer's down projection; normed = RMSNorm(residual).
      CUDA_RETURN_IF_ERROR(LaunchFusedAddRmsNorm(a.hidden, a.residual, w.input_norm(layer),
                                                 a.normed, n, s.hidden, eps, stream));
    }
    RETURN_IF_ERROR(Linear(step.qkv, normed, w.qkv(layer), a.qkv, stream));
  }
  if (s.qkv_bias) {
    CUDA_RETURN_IF_ERROR(LaunchBiasAdd(a.qkv, w.qkv_bias(layer), n,
                                       static_cast<int>(s.qkv_rows()), stream));
  }
  // Where attention rotates q and the new k, it norms them first (the same bits); the step
  // without attention (benchmarks) leaves both out there too.
  const bool attention_rotates = step.attention_rope;
  if (s.qk_norm && !attention_rotates) {
    CUDA_RETURN_IF_ERROR(LaunchQkNorm(a.qkv, w.q_norm(layer), w.k_norm(layer), n, s.heads,
                                      s.kv_heads, s.head_dim, eps, stream));
  }
  if (!options_.run_rope_append || attention_rotates) return absl::OkStatus();
  // The per-sequence arrays are shared by both parts of a plan; either enabled part has them.
  const AttentionPlanPartDevice& plan = args.decode.work_capacity > 0 ? args.decode : args.prefill;
  if (options_.fuse_rope_append) {
    RopeKvAppendParams rope;
    rope.qkv = a.qkv;
    rope.positions = args.positions;
    rope.num_tokens = n;
    rope.heads = s.heads;
    rope.kv_heads = s.kv_heads;
    rope.head_dim = s.head_dim;
    rope.theta = s.rope_theta;
    rope.rope_scaling = s.rope_scaling;
    rope.plan = plan;
    rope.kv.k_cache = k_cache(layer);
    rope.kv.v_cache = v_cache(layer);
    rope.kv.block_table = args.block_table;
    rope.kv.max_blocks_per_seq = args.max_blocks_per_seq;
    rope.kv.block_size = kv_layout_.block_size;
    if (RopeKvAppendSupports(rope)) {
      return ToStatus(LaunchRopeKvAppend(rope, stream), "RoPE + KV append");
    }
  }
  CUDA_RETURN_IF_ERROR(LaunchRope(a.qkv, args.positions, n, s.heads, s.kv_heads, s.head_dim,
                                  s.rope_theta, s.rope_scaling, stream));
  AppendKvParams append;
  append.k = a.qkv + s.q_width();
  append.k_stride = s.qkv_rows();
  append.v = a.qkv + s.q_width() + s.kv_width();
  append.v_stride = s.qkv_rows();
  append.max_tokens = n;
  append.plan = plan;
  PagedKvDevice kv;
  kv.k_cache = k_cache(layer);
  kv.v_cache = v_cache(layer);
  kv.block_table = args.block_table;
  kv.max_blocks_per_seq = args.max_blocks_per_seq;
  kv.block_size = kv_layout_.block_size;
  // CheckLlamaModelOptions, which Create calls, validated kv_layout_; the per-step arguments are
  // checked here.
  return attention_internal::AppendKvWithValidLayout(append, kv_layout_, kv, k_cache(layer),
                                                     v_cache(layer), stream);
}

absl::Status LlamaModel::CheckLayer(int layer) const {
  // The layer picks the KV pools (k_cache, v_cache) and QK norm weights: outside the model they
  // would lie past the cache and the weights.
  if (layer < 0 || layer >= shape().layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("Layer ", layer, " is outside [0, ", shape().layers, ")"));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::RunAttention(int layer, const LlamaStepArgs& args, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckLayer(layer));
  RETURN_IF_ERROR(CheckLlamaStepArgs(args));
  return RunCheckedAttention(layer, args, Carve(args), stream);
}

absl::Status LlamaModel::RunAttention(int layer, const CheckedLlamaStepArgs& args,
                                      cudaStream_t stream) {
  RETURN_IF_ERROR(CheckLayer(layer));
  return RunCheckedAttention(layer, args.args(), Carve(args.args()), stream);
}

absl::Status LlamaModel::RunCheckedAttention(int layer, const LlamaStepArgs& args,
                                             const Activations& a, cudaStream_t stream) {
  const LlamaShape& s = shape();
  AttentionStepParams step;
  step.dtype = AttentionDtype::kBf16;
  step.num_q_heads = s.heads;
  step.num_kv_heads = s.kv_heads;
  step.head_dim = s.head_dim;
  step.q = a.qkv;
  step.q_stride = s.qkv_rows();
  step.o = a.attn;
  step.kv.k_cache = k_cache(layer);
  step.kv.v_cache = v_cache(layer);
  step.kv.block_table = args.block_table;
  step.kv.max_blocks_per_seq = args.max_blocks_per_seq;
  step.kv.block_size = kv_layout_.block_size;
  step.decode = args.decode;
  step.prefill = args.prefill;
  if (RopeInAttention(args)) {
    step.rope_append.positions = args.positions;
    step.rope_append.theta = s.rope_theta;
    step.rope_append.scaling = s.rope_scaling;
    step.rope_append.k = a.qkv + s.q_width();
    step.rope_append.v = a.qkv + s.q_width() + s.kv_width();
    step.rope_append.kv_stride = s.qkv_rows();
    if (s.qk_norm) {  // instead of the QK norm kernel (PreAttention)
      step.rope_append.q_norm = weights_.q_norm(layer);
      step.rope_append.k_norm = weights_.k_norm(layer);
      step.rope_append.qk_norm_eps = static_cast<float>(s.rms_eps);
    }
  }
  return RunAttentionStep(step, stream);
}

bf16* LlamaModel::ProjectionOutput(const Activations& a) const {
  // The partial sum goes to `normed`, free between its reader (the QKV or gate-up GEMM) and the
  // next norm: the all-reduce is then out of place, so a graph's one-shot all-reduce may read it
  // registered, without a copy (AllReduceConfig.graph_one_shot_registered).
  return options_.communicator != nullptr ? a.normed : a.hidden;
}

absl::Status LlamaModel::AllReduceProjection(const Activations& a, int num_tokens,
                                             cudaStream_t stream) {
  if (options_.communicator == nullptr) return absl::OkStatus();
  return options_.communicator->AllReduce(
      a.normed, a.hidden, static_cast<size_t>(num_tokens) * shape().hidden, DataType::kBf16,
      stream);
}

bool LlamaModel::FusesAllReduceNorm(int num_tokens) const {
  return options_.communicator != nullptr && options_.fuse_allreduce_norm &&
         options_.communicator->SupportsAllReduceAddRmsNorm(num_tokens, shape().hidden,
                                                            DataType::kBf16);
}

absl::Status LlamaModel::AllReduceAddRmsNorm(const Activations& a, int num_tokens,
                                             const bf16* weight, cudaStream_t stream) {
  AllReduceAddRmsNormArgs fused;
  fused.partial = a.normed;  // ProjectionOutput
  fused.residual = a.residual;
  fused.weight = weight;
  fused.out = a.hidden;  // out of place, so a graph may read the partial sums registered
  fused.tokens = num_tokens;
  fused.hidden = shape().hidden;
  fused.eps = static_cast<float>(shape().rms_eps);
  fused.dtype = DataType::kBf16;
  return options_.communicator->AllReduceAddRmsNorm(fused, stream);
}

absl::Status LlamaModel::PostAttention(int layer, const LlamaStepArgs& args,
                                       const StepDecisions& step, const Activations& a,
                                       cudaStream_t stream) {
  const LlamaShape& s = shape();
  const LlamaDeviceWeights& w = weights_;
  const int n = args.num_tokens;
  const float eps = static_cast<float>(s.rms_eps);
  // With the fused all-reduce + norm, each projection's all-reduce also adds the residual and
  // applies the norm that follows: the post-attention norm after O, and after down the next
  // layer's input norm (PreAttention then skips it) or, after the last layer, the final norm
  // (RunPiece then skips it). The normed rows land in `hidden`, not `normed`.
  const bool fused = step.fused_allreduce_norm;
  RETURN_IF_ERROR(Linear(step.o, a.attn, w.o(layer), ProjectionOutput(a), stream));
  const MlpPath& mlp = step.mlp;
  if (fused) {
    RETURN_IF_ERROR(AllReduceAddRmsNorm(a, n, w.post_norm(layer), stream));
  } else {
    RETURN_IF_ERROR(AllReduceProjection(a, n, stream));
    if (!mlp.folded_norm && options_.run_norms) {
      CUDA_RETURN_IF_ERROR(LaunchFusedAddRmsNorm(a.hidden, a.residual, w.post_norm(layer),
                                                 a.normed, n, s.hidden, eps, stream));
    }
  }
  const bf16* normed = fused ? a.hidden : a.normed;
  if (mlp.folded_norm) {
    // residual = mid_residual (from the QKV GEMM) + the O projection; the gate-up GEMM's x =
    // RMSNorm(residual).
    RETURN_IF_ERROR(FoldedNormLinear(step.gate_up, a.hidden, a.mid_residual, a.residual,
                                     w.post_norm(layer), w.gate_up(layer), a.gate_up, stream));
  } else if (mlp.gate_up_silu.any()) {
    // The gate-up GEMM's epilogue writes SiLU(gate)·up into act: no SiLU·mul kernel.
    RETURN_IF_ERROR(GateUpSiluMul(normed, w.gate_up(layer), a.act, n, mlp.gate_up_silu, stream));
  } else {
    RETURN_IF_ERROR(Linear(step.gate_up, normed, w.gate_up(layer), a.gate_up, stream));
  }
  if (mlp.silu_in_down) {
    // The down GEMM reads SiLU(gate)·up of gate_up itself.
    RETURN_IF_ERROR(Linear(step.down, a.gate_up, w.down(layer), ProjectionOutput(a), stream));
  } else {
    if (!mlp.gate_up_silu.any() && options_.run_silu_mul) {
      CUDA_RETURN_IF_ERROR(LaunchSiluMul(a.gate_up, a.act, n, s.ffn, stream));
    }
    RETURN_IF_ERROR(Linear(step.down, a.act, w.down(layer), ProjectionOutput(a), stream));
  }
  if (!fused) return AllReduceProjection(a, n, stream);
  const bf16* next_norm = layer + 1 < s.layers ? w.input_norm(layer + 1) : w.final_norm();
  return AllReduceAddRmsNorm(a, n, next_norm, stream);
}

absl::Status LlamaModel::RunPiece(int piece, const LlamaStepArgs& args, cudaStream_t stream) {
  if (piece < 0 || piece >= num_pieces()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Piece ", piece, " is outside [0, ", num_pieces(), ")"));
  }
  RETURN_IF_ERROR(CheckLlamaStepArgs(args));
  return RunCheckedPiece(piece, args, DecideStep(args), Carve(args), stream);
}

absl::Status LlamaModel::RunCheckedPiece(int piece, const LlamaStepArgs& args,
                                         const StepDecisions& step, const Activations& a,
                                         cudaStream_t stream) {
  const LlamaShape& s = shape();
  const int n = args.num_tokens;
  if (step.layer_kernel) return RunLayerKernelPiece(piece, args, step, a, stream);
  if (piece == 0) {
    // Attention writes only the rows of real tokens; the embedding kernel clears the attention
    // output once per step so the O projection never reads stale values in padding rows.
    CUDA_RETURN_IF_ERROR(LaunchEmbeddingGather(weights_.embedding(), s.vocab, s.hidden,
                                               args.token_ids, n, a.residual, stream, a.attn,
                                               s.q_width()));
    return PreAttention(0, args, step, a, stream);
  }
  RETURN_IF_ERROR(PostAttention(piece - 1, args, step, a, stream));
  if (piece < s.layers) return PreAttention(piece, args, step, a, stream);

  // The last piece: final norm (done by the last all-reduce when fused), each sequence's last
  // token, logits, greedy tokens.
  const bf16* normed = a.normed;
  if (step.fused_allreduce_norm) {
    normed = a.hidden;
  } else if (options_.run_norms) {
    CUDA_RETURN_IF_ERROR(LaunchFusedAddRmsNorm(a.hidden, a.residual, weights_.final_norm(),
                                               a.normed, n, s.hidden,
                                               static_cast<float>(s.rms_eps), stream));
  }
  return Head(args, step, a, normed, stream);
}

absl::Status LlamaModel::Head(const LlamaStepArgs& args, const StepDecisions& step,
                              const Activations& a, const bf16* normed, cudaStream_t stream) {
  const LlamaShape& s = shape();
  const int n = args.num_tokens;
  CUDA_RETURN_IF_ERROR(LaunchEmbeddingGather(normed, n, s.hidden, args.last_token_rows,
                                             args.num_rows, a.last, stream));
  RETURN_IF_ERROR(Linear(step.lm_head, a.last, weights_.lm_head(), args.logits, stream));
  return ToStatus(
      LaunchGreedySample(args.logits, args.num_rows, s.vocab, args.next_tokens, stream,
                         args.next_tokens_mirror),
      "greedy sampling");
}

absl::Status LlamaModel::RunLayerKernelPiece(int piece, const LlamaStepArgs& args,
                                             const StepDecisions& step, const Activations& a,
                                             cudaStream_t stream) {
  const LlamaShape& s = shape();
  const LlamaDeviceWeights& w = weights_;
  const int n = args.num_tokens;
  DecodeLayerArgs l;
  l.m = n;
  l.shape = DecodeLayerShapeOf(s);
  l.attn = a.attn;
  l.hidden = a.hidden;
  l.residual = a.residual;
  l.mid_residual = a.mid_residual;
  l.act = a.act;
  l.qkv = a.qkv;
  l.normed = a.normed;
  l.grid_sync = layer_kernel_.sync.as<uint32_t>();
  // Consecutive launches use different work counters, also from a step's last piece to the next
  // step's first: pieces alternate between sets 0 and 1, the last piece takes set 2.
  auto work_set = [&](int p) { return p == s.layers ? 2 : p % 2; };
  l.work_set = work_set(piece);
  l.previous_work_set = work_set(piece == 0 ? s.layers : piece - 1);
  if (piece == 0) {
    // As RunPiece: the embeddings, clearing the padding rows' attention output.
    CUDA_RETURN_IF_ERROR(LaunchEmbeddingGather(weights_.embedding(), s.vocab, s.hidden,
                                               args.token_ids, n, a.residual, stream, a.attn,
                                               s.q_width()));
  } else {
    l.finish = true;
    l.o = w.o(piece - 1);
    l.post_norm = w.post_norm(piece - 1);
    l.gate_up = w.gate_up(piece - 1);
    l.down = w.down(piece - 1);
  }
  if (piece < s.layers) {
    l.start = true;
    l.norm = w.input_norm(piece);
    l.qkv_w = w.qkv(piece);
    l.positions = args.positions;
    // The per-sequence arrays are shared by both parts of a plan; either enabled part has them.
    l.plan = args.decode.work_capacity > 0 ? args.decode : args.prefill;
    l.kv.k_cache = k_cache(piece);
    l.kv.v_cache = v_cache(piece);
    l.kv.block_table = args.block_table;
    l.kv.max_blocks_per_seq = args.max_blocks_per_seq;
    l.kv.block_size = kv_layout_.block_size;
  } else {
    l.final_norm = true;
    l.norm = w.final_norm();
  }
  const DecodeLayerConfig& c = layer_kernel_.configs[n];
  if (!DecodeLayerSupports(l, c)) {
    return absl::InternalError(absl::StrCat("The decode layer kernel does not take piece ", piece,
                                            " of a ", n, "-row step (", c.ToString(), ")"));
  }
  CUDA_RETURN_IF_ERROR(LaunchDecodeLayer(l, c, stream));
  if (piece < s.layers) return absl::OkStatus();
  return Head(args, step, a, a.normed, stream);
}

absl::Status LlamaModel::Forward(const LlamaStepArgs& args, cudaStream_t stream) {
  // Once per step: every piece below reads the same decisions, and every piece and attention
  // the same views and activations.
  RETURN_IF_ERROR(CheckLlamaStepArgs(args));
  const StepDecisions step = DecideStep(args);
  const Activations a = Carve(args);
  for (int piece = 0; piece < num_pieces(); ++piece) {
    RETURN_IF_ERROR(RunCheckedPiece(piece, args, step, a, stream));
    if (piece < shape().layers && options_.run_attention) {
      RETURN_IF_ERROR(RunCheckedAttention(piece, args, a, stream));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
