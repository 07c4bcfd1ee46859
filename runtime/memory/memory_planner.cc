#include "runtime/memory/memory_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "attention/split_kv_planner.h"
#include "graph/capture_sizes.h"
#include "runtime/config/presets.h"

namespace kiln {
namespace {

using config::DType;
using config::GpuSpec;
using config::ModelShape;
using config::PlannerConfig;

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// ---------------------------------------------------------------------------------------------
// Estimates. Each is what the planner assumes until the runner's --measure mode has measured it
// on the GPU (it then writes a Calibration). They are deliberately on the generous side: a
// KV cache a little too small costs a little throughput, one too large fails graph capture.

// Device memory of instantiated CUDA graphs: a cost per graph and one per node (the driver's node
// records and the copies of kernel parameters it keeps on the device). Three captures of the 1B
// model, measured as cudaMemGetInfo deltas on an H200 (CUDA 13.0, driver 580, 2026-11-21;
// runtime/runner/NOTES.md): 41 full graphs of 8434 nodes took 26.0 MiB, the 27 decode graphs
// alone (5267 nodes) 16.0 MiB, and 697 piecewise graphs 94 MiB. About 113 KiB per graph and
// 2.6 KiB per node fit all three within the 2 MiB steps the delta moves in; we take 128 KiB and
// 3 KiB, which with the kernels counted below predict 28.3, 17.8 and 105 MiB. (Before: 4 KiB per
// node and nothing per graph, right for full graphs and a quarter of the piecewise figure.)
constexpr int64_t kGraphBytesPerGraph = 128 * kKiB;
constexpr int64_t kGraphBytesPerNode = 3 * kKiB;

// Kernels one decoder layer launches besides attention (runtime/model/llama_model.cc): input
// RMSNorm (fused with the residual add from layer 1 on), QKV GEMM, RoPE, KV append, O GEMM,
// residual add + post-attention RMSNorm, gate-up GEMM, SiLU·mul, down GEMM. Attention adds one
// kernel per plan part and a merge per part that splits KV, read from the attention planner's
// layout. Tensor parallelism adds an all-reduce after O and after down. cuBLASLt may launch two
// kernels for a GEMM: the 1B's graphs had 195 and 226 nodes per decode and prefill key against
// the 182 and 214 counted here.
constexpr int64_t kKernelsPerLayer = 9;
constexpr int64_t kAllReducesPerLayer = 2;
// Outside the layers: the memset that clears the attention output's padding rows, embedding,
// final RMSNorm, last-token gather, lm head GEMM, greedy sampling (the LM head is replicated over
// tensor-parallel ranks, so there is no logits gather).
constexpr int64_t kKernelsOutsideLayers = 6;

// cuBLASLt workspace for the GEMMs (one stream, one workspace): the cuBLAS documentation
// (cublasSetWorkspace) recommends 32 MiB on Hopper and 4 MiB on earlier GPUs; we reserve the
// larger everywhere, as PyTorch does on Hopper. (--measure on an H200: Gemm::Create, workspace
// and handle, took 34.0 MiB; the handle's 2 MiB falls in the margin.)
constexpr int64_t kCublasLtWorkspaceBytes = 32 * kMiB;

// Custom all-reduce: a registered staging buffer that eager calls copy their input into, and a
// scratch buffer of the same size for the two-shot (reduce-scatter + all-gather) kernel. 8 MiB is
// the size up to which the custom kernel beats NCCL on NVLink (vLLM's default limit); larger
// messages go to NCCL. Peers' buffers are mapped through CUDA IPC and cost no local memory.
constexpr int64_t kCustomAllReduceBufferBytes = 8 * kMiB;
constexpr int64_t kCustomAllReduceBuffers = 2;
// The fused all-reduce + residual add + RMSNorm's push buffer: per epoch parity, one 512 KiB slot
// per rank that peers write their partial sums into.
constexpr int64_t kFusedNormPushSlotBytes = 512 * 1024;
constexpr int64_t kFusedNormPushParities = 2;

// NCCL's device buffers: per channel and peer connection a buffer per protocol, 4 MiB for the
// Simple protocol (NCCL_BUFFSIZE's default) and less for LL/LL128. Measured by the tensor-parallel
// runner on 2 x H200 (NVLink, NCCL 2.28, NVLS off, 2026-11-21): 384-388 MiB per rank at
// communicator creation (runtime/runner/runner_multigpu_test, memory item "collectives"); we take
// 400 MiB. (The estimate before, 256 MiB, was 32 channels x send and receive x 4 MiB.) NCCL calls
// captured into graphs take more (graph_executables); kiln's runner uses the custom all-reduce
// in its decode graphs wherever it applies.
constexpr int64_t kNcclBytes = 400 * kMiB;

// Room for what no term names: the CUDA context and loaded kernel images (--measure on an H200,
// CUDA 13.0 with lazy loading: 526.8 MiB before the first allocation, nothing more after the
// first eager steps), small metadata buffers (block tables, sampling state) and fragmentation.
constexpr int64_t kMarginBytes = 1 * kGiB;

// The Runner's attention planner options (runtime/runner/step_plan.cc, PlannerOptionsFor):
// decode tiles hold one token of each query-head group, prefill tiles this many query rows
// (RunnerOptions::prefill_tile_rows' default); the rest are SplitKvPlannerOptions' defaults.
constexpr int kPrefillTileRows = 64;

// Sections of the step metadata blob and of the model's activation region are 256-byte aligned
// (runtime/runner/step_plan.cc, MetadataLayout; runtime/model/llama_model.cc, Offsets).
constexpr int64_t kMetadataAlign = 256;
constexpr int64_t kActivationAlign = 256;
// The most token rows whose norms the model folds into its GEMMs (kPrefetchGemmMaxRows in
// runtime/model/prefetch_gemm.h): the rows of its mid_residual buffer.
constexpr int64_t kFoldedNormMaxRows = 8;

// Prefill-only graphs are captured up to this many tokens by default.
constexpr int kDefaultPrefillCaptureLimit = 512;

// Upper bounds on the inputs, far above any real model or GPU, so that no product in the formulas
// can overflow 64 bits (the largest, the weights, stays below 2^61). Values above them are typos.
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden_size, intermediate_size
constexpr int64_t kMaxHeads = int64_t{1} << 12;  // num_heads, num_kv_heads, head_dim, layers
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxSeqs = int64_t{1} << 20;    // max_num_seqs
constexpr int64_t kMaxTokens = int64_t{1} << 24;  // max_num_batched_tokens
constexpr int64_t kMaxBlockSize = int64_t{1} << 16;
constexpr int64_t kMaxModelLen = int64_t{1} << 24;  // max_model_len
constexpr int64_t kMaxSmCount = int64_t{1} << 16;
constexpr uint64_t kMaxGpuBytes = uint64_t{1} << 50;      // 1 PiB
constexpr uint64_t kMaxPerUnitBytes = uint64_t{1} << 30;  // calibrated bytes per token
constexpr uint64_t kMaxPerNodeBytes = uint64_t{1} << 20;  // calibrated bytes per graph node
constexpr uint64_t kMaxPerGraphBytes = uint64_t{1} << 30; // calibrated bytes per graph
constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 40;   // calibrated buffers and margin

// ---------------------------------------------------------------------------------------------

// A dtype for a message: its name, or the number a textproto gave that no type has.
std::string DTypeValue(DType dtype) {
  return config::DType_IsValid(dtype) ? DTypeName(dtype) : absl::StrCat(static_cast<int>(dtype));
}

std::string ModelFlagHint() {
  return absl::StrCat("or pick a model preset (--preset=", absl::StrJoin(ModelPresetNames(), "|"),
                      ")");
}

absl::Status CheckAtMost(int64_t value, int64_t limit, absl::string_view field) {
  if (value > limit) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", value, " is above ", limit,
                                                   ", beyond anything kiln plans for; check the "
                                                   "value (a typo or the wrong unit?)"));
  }
  return absl::OkStatus();
}

absl::Status CheckPositive(bool has, int64_t value, absl::string_view field, absl::string_view flag,
                           absl::string_view otherwise) {
  if (!has) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is not set; set it (--", flag, ") ", otherwise));
  }
  if (value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be positive, got ", value,
                                                   "; set it (--", flag, ") ", otherwise));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelShape> ResolveModel(const PlannerConfig& in) {
  ModelShape model;
  if (in.has_model_preset()) {
    absl::StatusOr<ModelShape> preset = ModelPreset(in.model_preset());
    if (!preset.ok()) return preset.status();
    model = *std::move(preset);
  }
  model.MergeFrom(in.model());
  if (in.has_model_preset() && !in.model().has_name()) {
    // A preset with fields changed is no longer the published model; say so wherever it is named.
    // RoPE and the norm's epsilon do not change memory, so changing only them keeps the name.
    config::ModelShape changed = in.model();
    changed.clear_rope_theta();
    changed.clear_rope_scaling();
    changed.clear_rms_norm_eps();
    if (changed.ByteSizeLong() > 0) model.set_name(absl::StrCat(model.name(), " (modified)"));
  }
  const std::string hint = ModelFlagHint();
  struct Field {
    bool has;
    int64_t value;
    const char* name;
    const char* flag;
    int64_t limit;
  };
  const Field fields[] = {
      {model.has_hidden_size(), model.hidden_size(), "model.hidden_size", "hidden_size", kMaxWidth},
      {model.has_num_layers(), model.num_layers(), "model.num_layers", "num_layers", kMaxHeads},
      {model.has_num_heads(), model.num_heads(), "model.num_heads", "num_heads", kMaxHeads},
      {model.has_num_kv_heads(), model.num_kv_heads(), "model.num_kv_heads", "num_kv_heads",
       kMaxHeads},
      {model.has_head_dim(), model.head_dim(), "model.head_dim", "head_dim", kMaxHeads},
      {model.has_intermediate_size(), model.intermediate_size(), "model.intermediate_size",
       "intermediate_size", kMaxWidth},
      {model.has_vocab_size(), model.vocab_size(), "model.vocab_size", "vocab_size", kMaxVocab},
  };
  for (const Field& f : fields) {
    absl::Status status = CheckPositive(f.has, f.value, f.name, f.flag, hint);
    if (status.ok()) status = CheckAtMost(f.value, f.limit, f.name);
    if (!status.ok()) return status;
  }
  if (DTypeBytes(model.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dtype is ", model.has_dtype() ? DTypeValue(model.dtype()) : "not set",
                     "; set it (--dtype=bf16|fp16|fp32|fp8) ", hint));
  }
  if (model.num_heads() % model.num_kv_heads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.num_heads ", model.num_heads(),
                     " is not a multiple of model.num_kv_heads ", model.num_kv_heads(),
                     "; grouped-query attention shares each KV head among a whole "
                     "group of query heads: fix the shape"));
  }
  if (!model.has_name()) model.set_name("custom model");
  if (!model.has_tie_embeddings()) model.set_tie_embeddings(false);
  if (!model.has_attention_bias()) model.set_attention_bias(false);
  if (!model.has_qk_norm()) model.set_qk_norm(false);
  return model;
}

absl::StatusOr<GpuSpec> ResolveGpu(const PlannerConfig& in) {
  GpuSpec gpu;
  if (in.has_gpu_preset()) {
    if (in.gpu_preset() == "auto") {
      return absl::InvalidArgumentError(
          "gpu_preset \"auto\" needs a device query, which this host-only library does not make; "
          "the memory_planner CLI resolves --gpu=auto, library callers fill config.gpu from "
          "kiln::DeviceInfo::Query");
    }
    absl::StatusOr<GpuSpec> preset = GpuPreset(in.gpu_preset());
    if (!preset.ok()) return preset.status();
    gpu = *std::move(preset);
  }
  gpu.MergeFrom(in.gpu());
  if (in.has_gpu_preset() && !in.gpu().has_name() && in.gpu().ByteSizeLong() > 0) {
    gpu.set_name(absl::StrCat(gpu.name(), " (modified)"));
  }
  const std::string hint =
      absl::StrCat("or pick a GPU preset (--gpu=", absl::StrJoin(GpuPresetNames(), "|"), "|auto)");
  if (!gpu.has_total_bytes() || gpu.total_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu.total_bytes is ", gpu.has_total_bytes() ? "0" : "not set",
                     "; set the GPU's memory in bytes (--gpu_total_bytes) ", hint));
  }
  if (gpu.total_bytes() > kMaxGpuBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu.total_bytes ", gpu.total_bytes(),
                     " is more than a PiB; give the GPU's memory in "
                     "bytes (--gpu_total_bytes), e.g. 85520809984 for an H100 80GB"));
  }
  absl::Status sm =
      CheckPositive(gpu.has_sm_count(), gpu.sm_count(), "gpu.sm_count", "gpu_sm_count", hint);
  if (sm.ok()) sm = CheckAtMost(gpu.sm_count(), kMaxSmCount, "gpu.sm_count");
  if (!sm.ok()) return sm;
  if (!gpu.has_name()) gpu.set_name("custom GPU");
  return gpu;
}

absl::Status ResolveGraphs(PlannerConfig* out) {
  config::GraphConfig* graph = out->mutable_graph();
  // A number the enums do not name (a textproto may give one) would plan as some other mode.
  if (!config::GraphMode_IsValid(graph->mode())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "graph.mode ", static_cast<int>(graph->mode()),
        " is not a graph mode; use GRAPH_MODE_DECODE, GRAPH_MODE_PREFILL_ONLY or GRAPH_MODE_NONE"));
  }
  if (!config::GraphExecution_IsValid(graph->execution())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "graph.execution ", static_cast<int>(graph->execution()),
        " is not a graph execution; use GRAPH_EXECUTION_FULL or GRAPH_EXECUTION_PIECEWISE"));
  }
  if (graph->mode() == config::GRAPH_MODE_UNSPECIFIED) graph->set_mode(config::GRAPH_MODE_DECODE);
  if (graph->mode() == config::GRAPH_MODE_NONE) {
    // Sizes mean nothing without graphs (FastDeploy's use_cudagraph: false keeps its list too).
    graph->clear_capture_sizes();
    graph->clear_max_capture_size();
    graph->clear_execution();
    graph->clear_capture_prefill();
    graph->clear_prefill_sizes();
    return absl::OkStatus();
  }
  if (graph->execution() == config::GRAPH_EXECUTION_UNSPECIFIED) {
    graph->set_execution(config::GRAPH_EXECUTION_FULL);
  }
  const bool decode = graph->mode() == config::GRAPH_MODE_DECODE;
  const int hard_limit = decode ? out->max_num_seqs() : out->max_num_batched_tokens();
  const char* hard_name = decode ? "max_num_seqs" : "max_num_batched_tokens";
  int limit = hard_limit;
  std::string limit_name = hard_name;
  if (graph->has_max_capture_size()) {
    if (graph->max_capture_size() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "graph.max_capture_size must be positive, got ", graph->max_capture_size(),
          "; set it to the largest size that gets a graph (--max_capture_size) or leave it unset"));
    }
    if (graph->max_capture_size() > hard_limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph.max_capture_size ", graph->max_capture_size(), " exceeds ", hard_name,
                       " ", hard_limit, "; lower it or raise ", hard_name));
    }
    limit = graph->max_capture_size();
    limit_name = "graph.max_capture_size";
  }
  std::vector<int> sizes;
  if (graph->capture_sizes_size() == 0) {
    // The runner captures exactly these lists (//graph:capture_sizes), so the planner counts
    // the graphs that will exist.
    if (decode) {
      sizes = CaptureSizes::DefaultDecodeSizes(limit);
    } else {
      const int default_limit = graph->has_max_capture_size()
                                    ? limit
                                    : std::min(kDefaultPrefillCaptureLimit, limit);
      sizes = CaptureSizes::DefaultPrefillSizes(default_limit);
    }
  } else {
    std::vector<int> given(graph->capture_sizes().begin(), graph->capture_sizes().end());
    if (graph->has_max_capture_size()) {
      // FastDeploy's rule: sizes above max_capture_size are dropped, not reported.
      given.erase(std::remove_if(given.begin(), given.end(), [&](int s) { return s > limit; }),
                  given.end());
    }
    if (given.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "No capture size is left at or below graph.max_capture_size ", limit,
          "; list smaller sizes, raise max_capture_size, or turn graphs off (--graph_mode=none)"));
    }
    absl::StatusOr<CaptureSizes> valid = CaptureSizes::FromList(given, limit, limit_name);
    if (!valid.ok()) return valid.status();
    sizes = valid->sizes();
  }
  if (sizes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        limit_name, " ", limit, " is above ", CaptureSizes::kMaxLimit,
        ", the largest limit graph sizes are padded to; list the sizes to capture "
        "(--capture_sizes), lower ", limit_name, ", or turn graphs off (--graph_mode=none)"));
  }
  graph->clear_capture_sizes();
  for (int s : sizes) graph->add_capture_sizes(s);
  graph->set_max_capture_size(sizes.back());

  if (!decode) {
    if (graph->prefill_sizes_size() > 0) {
      return absl::InvalidArgumentError(
          "graph.prefill_sizes is for GRAPH_MODE_DECODE; in GRAPH_MODE_PREFILL_ONLY list the "
          "token budgets in graph.capture_sizes");
    }
    graph->clear_capture_prefill();  // prefill graphs are the mode itself
    return absl::OkStatus();
  }
  // The prefill step keys: batches with a prompt pad to them, captured or not (the Runner's
  // RunnerOptions::prefill_sizes, and capture_prefill).
  if (!graph->has_capture_prefill()) graph->set_capture_prefill(true);
  std::vector<int> prefill;
  if (graph->prefill_sizes_size() == 0) {
    prefill = CaptureSizes::DefaultPrefillSizes(
        std::min(kDefaultPrefillCaptureLimit, out->max_num_batched_tokens()));
  } else {
    std::vector<int> given(graph->prefill_sizes().begin(), graph->prefill_sizes().end());
    absl::StatusOr<CaptureSizes> valid =
        CaptureSizes::FromList(given, out->max_num_batched_tokens(), "max_num_batched_tokens");
    if (!valid.ok()) return valid.status();
    prefill = valid->sizes();
  }
  graph->clear_prefill_sizes();
  for (int s : prefill) graph->add_prefill_sizes(s);
  return absl::OkStatus();
}

absl::Status CheckTensorParallel(const ModelShape& model, int tp) {
  auto split_error = [&](absl::string_view what, int64_t value) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", value,
                                                   " does not split over tensor_parallel_size ", tp,
                                                   "; use a tensor_parallel_size that divides it"));
  };
  if (model.num_heads() % tp != 0) return split_error("model.num_heads", model.num_heads());
  if (model.intermediate_size() % tp != 0) {
    return split_error("model.intermediate_size", model.intermediate_size());
  }
  const int kv = model.num_kv_heads();
  if (kv >= tp ? kv % tp != 0 : tp % kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.num_kv_heads ", kv, " and tensor_parallel_size ", tp,
        " do not divide one another, so KV heads can be neither split nor replicated evenly; "
        "use a tensor_parallel_size that divides or is a multiple of ",
        kv));
  }
  return absl::OkStatus();
}

// Rounds a / b up for a >= 0, b >= 1, without a + b - 1 (which overflows near INT64_MAX).
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The magnitude of `n`, defined for INT64_MIN too (whose negation overflows int64).
uint64_t Magnitude(int64_t n) { return n < 0 ? 0 - static_cast<uint64_t>(n) : n; }

// True where the public formulas are defined: every dimension and `tp` within the bounds
// ResolvePlannerConfig enforces, under which no product of theirs can overflow int64. Divisibility
// is not needed for that (heads and widths round down per rank).
bool InFormulaDomain(const ModelShape& m, int tp) {
  auto in = [](int64_t v, int64_t limit) { return v >= 1 && v <= limit; };
  return in(m.hidden_size(), kMaxWidth) && in(m.intermediate_size(), kMaxWidth) &&
         in(m.num_layers(), kMaxHeads) && in(m.num_heads(), kMaxHeads) &&
         in(m.num_kv_heads(), kMaxHeads) && in(m.head_dim(), kMaxHeads) &&
         in(m.vocab_size(), kMaxVocab) && in(tp, kMaxHeads);
}

}  // namespace

int64_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case config::DTYPE_BF16:
    case config::DTYPE_FP16:
      return 2;
    case config::DTYPE_FP32:
      return 4;
    case config::DTYPE_FP8_E4M3:
      return 1;
    default:
      return 0;
  }
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case config::DTYPE_BF16:
      return "bf16";
    case config::DTYPE_FP16:
      return "fp16";
    case config::DTYPE_FP32:
      return "fp32";
    case config::DTYPE_FP8_E4M3:
      return "fp8";
    default:
      return "unspecified";
  }
}

std::string Thousands(int64_t n) {
  const std::string digits = absl::StrCat(Magnitude(n));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return n < 0 ? "-" + out : out;
}

std::string FormatBytes(int64_t bytes) {
  const uint64_t magnitude = Magnitude(bytes);
  const double b = static_cast<double>(bytes);
  if (magnitude >= uint64_t{kGiB}) return absl::StrFormat("%.2f GiB", b / kGiB);
  if (magnitude >= uint64_t{kMiB}) return absl::StrFormat("%.1f MiB", b / kMiB);
  if (magnitude >= uint64_t{kKiB}) return absl::StrFormat("%.1f KiB", b / kKiB);
  return absl::StrFormat("%d B", bytes);
}

int KvHeadsPerRank(const ModelShape& model, int tp) {
  if (!InFormulaDomain(model, tp)) return -1;
  return model.num_kv_heads() >= tp ? model.num_kv_heads() / tp : 1;
}

int64_t WeightParamsPerRank(const ModelShape& model, int tp) {
  if (!InFormulaDomain(model, tp)) return -1;
  const int64_t h = model.hidden_size();
  const int64_t d = model.head_dim();
  const int64_t heads = model.num_heads() / tp;
  const int64_t kv_heads = KvHeadsPerRank(model, tp);
  const int64_t ffn = model.intermediate_size() / tp;
  // The runner replicates the embedding and LM head on every rank (runtime/model/
  // tensor_parallel.h): a vocabulary split would save their memory but need a logits gather.
  const int64_t vocab_rows = model.vocab_size();

  const int64_t qkv_width = (heads + 2 * kv_heads) * d;
  const int64_t per_layer = h * qkv_width                               // QKV projection
                            + (model.attention_bias() ? qkv_width : 0)  // QKV bias (Qwen2)
                            + (model.qk_norm() ? 2 * d : 0)             // QK norms (Qwen3)
                            + heads * d * h                             // O projection
                            + h * 2 * ffn                               // gate and up
                            + ffn * h                                   // down
                            + 2 * h;                                    // two RMSNorm weights
  const int64_t embedding = vocab_rows * h;
  const int64_t lm_head = model.tie_embeddings() ? 0 : vocab_rows * h;
  return embedding + model.num_layers() * per_layer + h /* final norm */ + lm_head;
}

int64_t KvBytesPerToken(const ModelShape& model, DType kv_dtype, int tp) {
  if (!InFormulaDomain(model, tp)) return -1;
  return 2 * int64_t{model.num_layers()} * KvHeadsPerRank(model, tp) * model.head_dim() *
         DTypeBytes(kv_dtype);
}

// The activation widths per token row on one rank, in elements. The model
// (runtime/model/llama_model.cc, Offsets) keeps, for the layer that runs (layers run in turn and
// reuse the region):
//   residual                                       [T, H]
//   O and down projection outputs (one buffer)     [T, H]
//   normed input                                   [T, H]
//   QKV                                            [T, (heads + 2 kv_heads) / rank × head_dim]
//   attention output                               [T, heads / rank × head_dim]
//   gate-up, SiLU·mul                              [T, 2F / rank], [T, F / rank]
//   each sequence's last token                     [rows, H]
//   the residual between the QKV and gate-up GEMMs [min(T, 8), H]
//     where they fold the norms (only at ≤ 8 rows: kPrefetchGemmMaxRows)
// With tensor parallelism each rank runs the model on its shard (runtime/model/tensor_parallel.h),
// with these per-rank widths; the O and down projections' partial sums use the normed buffer
// before the all-reduce writes the output buffer, so the layout is the same.
// MemoryPlannerTest.ActivationLayoutMatchesTheModel pins the numbers; change both together.
struct ActivationWidths {
  int64_t hidden, qkv, attn, gate_up, act;
};

ActivationWidths WidthsOf(const ModelShape& model, int tp) {
  const int64_t d = model.head_dim();
  const int64_t heads = model.num_heads() / tp;
  const int64_t kv_heads = KvHeadsPerRank(model, tp);
  const int64_t ffn = model.intermediate_size() / tp;
  return {model.hidden_size(), (heads + 2 * kv_heads) * d, heads * d, 2 * ffn, ffn};
}

int64_t ActivationDTypeBytes(const ModelShape& model) {
  return model.dtype() == config::DTYPE_FP8_E4M3 ? 2 : DTypeBytes(model.dtype());
}

int64_t ActivationBytesPerToken(const ModelShape& model, int tp) {
  if (!InFormulaDomain(model, tp)) return -1;
  const ActivationWidths w = WidthsOf(model, tp);
  return (3 * w.hidden + w.qkv + w.attn + w.gate_up + w.act) * ActivationDTypeBytes(model);
}

int64_t ActivationArenaBytes(const ModelShape& model, int tp, int64_t num_tokens,
                             int64_t num_rows) {
  if (!InFormulaDomain(model, tp) || num_tokens < 0 || num_tokens > kMaxTokens || num_rows < 0 ||
      num_rows > kMaxSeqs) {
    return -1;
  }
  const ActivationWidths w = WidthsOf(model, tp);
  const int64_t e = ActivationDTypeBytes(model);
  auto aligned = [](int64_t bytes) { return CeilDiv(bytes, kActivationAlign) * kActivationAlign; };
  return 3 * aligned(num_tokens * w.hidden * e) + aligned(num_tokens * w.qkv * e) +
         aligned(num_tokens * w.attn * e) + aligned(num_tokens * w.gate_up * e) +
         aligned(num_tokens * w.act * e) + aligned(num_rows * w.hidden * e) +
         aligned(std::min(num_tokens, kFoldedNormMaxRows) * w.hidden * e);
}

int64_t GraphNodesOutsideAttention(const ModelShape& model, int tp) {
  if (!InFormulaDomain(model, tp)) return -1;
  const bool parallel = tp > 1;
  return model.num_layers() * (kKernelsPerLayer + (parallel ? kAllReducesPerLayer : 0)) +
         kKernelsOutsideLayers;
}

namespace {

// PlanStepKeys of a config ResolvePlannerConfig returned (which bounds every product here).
absl::StatusOr<std::vector<PlannedStepKey>> PlanResolvedStepKeys(const PlannerConfig& c) {
  const config::GraphConfig& g = c.graph();
  const ModelShape& m = c.model();
  const int tp = c.tensor_parallel_size();
  const int max_seqs = c.max_num_seqs();
  const int max_tokens = c.max_num_batched_tokens();
  const bool decode_mode = g.mode() == config::GRAPH_MODE_DECODE;
  const bool prefill_mode = g.mode() == config::GRAPH_MODE_PREFILL_ONLY;
  const int64_t per_token = static_cast<int64_t>(c.calibration().activation_bytes_per_token());

  // The Runner's lists (runtime/runner/runner.cc, Init): the mode's capture sizes, otherwise the
  // defaults, which still pad batches (eager steps run at a key's sizes too).
  const std::vector<int> decode_sizes =
      decode_mode ? std::vector<int>(g.capture_sizes().begin(), g.capture_sizes().end())
                  : CaptureSizes::DefaultDecodeSizes(max_seqs);
  std::vector<int> prefill_sizes;
  if (prefill_mode) {
    prefill_sizes.assign(g.capture_sizes().begin(), g.capture_sizes().end());
  } else if (decode_mode) {
    prefill_sizes.assign(g.prefill_sizes().begin(), g.prefill_sizes().end());
  } else {
    prefill_sizes =
        CaptureSizes::DefaultPrefillSizes(std::min(kDefaultPrefillCaptureLimit, max_tokens));
  }

  // runtime/runner/step_plan.cc: StepKeys::Create.
  struct Shape {
    CaptureKey key;
    int tokens, rows;
    bool decode_part, prefill_part, captured;
  };
  std::vector<Shape> shapes;
  for (int size : decode_sizes) {
    shapes.push_back({{GraphMode::kDecode, size}, size, size, true, false, decode_mode});
  }
  const bool capture_prefill = prefill_mode || (decode_mode && g.capture_prefill());
  for (int size : prefill_sizes) {
    shapes.push_back(
        {{GraphMode::kPrefill, size}, size, std::min(size, max_seqs), true, true, capture_prefill});
  }
  shapes.push_back({{GraphMode::kMixed, max_tokens}, max_tokens, max_seqs, true, true, false});

  const int64_t blocks_per_seq = CeilDiv(c.max_model_len(), c.block_size());
  auto aligned = [](int64_t bytes) { return CeilDiv(bytes, kMetadataAlign) * kMetadataAlign; };
  std::vector<PlannedStepKey> keys;
  keys.reserve(shapes.size());
  for (const Shape& s : shapes) {
    // runtime/runner/step_plan.cc: PlannerOptionsFor.
    SplitKvPlannerOptions o;
    o.num_q_heads = m.num_heads() / tp;
    o.num_kv_heads = KvHeadsPerRank(m, tp);
    o.head_dim = m.head_dim();
    o.sm_count = static_cast<int>(c.gpu().sm_count());
    o.key = {s.rows, s.tokens, c.max_model_len()};
    o.decode.tile_rows = s.decode_part ? o.num_q_heads / o.num_kv_heads : 0;
    o.prefill.tile_rows = s.prefill_part ? kPrefillTileRows : 0;
    absl::StatusOr<SplitKvPlanner> planner = SplitKvPlanner::Create(o);
    if (!planner.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("kiln's attention cannot plan step key ", KeyName(s.key), " of this model: ",
                       planner.status().message()));
    }
    const PlanLayout& layout = planner->layout();
    PlannedStepKey k;
    k.key = s.key;
    k.max_tokens = s.tokens;
    k.max_rows = s.rows;
    k.captured = s.captured;
    k.activation_bytes = per_token > 0 ? per_token * s.tokens
                                       : ActivationArenaBytes(m, tp, s.tokens, s.rows);
    // runtime/runner/step_plan.cc: MetadataLayout::Create.
    k.metadata_bytes = 2 * aligned(int64_t{4} * s.tokens) + aligned(int64_t{4} * s.rows) +
                       aligned(static_cast<int64_t>(layout.plan_bytes)) +
                       aligned(int64_t{4} * s.rows * blocks_per_seq);
    k.decode_partial_bytes =
        static_cast<int64_t>(layout.decode.partial_o_bytes + layout.decode.partial_lse_bytes);
    k.prefill_partial_bytes =
        static_cast<int64_t>(layout.prefill.partial_o_bytes + layout.prefill.partial_lse_bytes);
    k.decode_slots = layout.decode.slot_capacity;
    k.prefill_slots = layout.prefill.slot_capacity;
    for (const PlanPartLayout* part : {&layout.decode, &layout.prefill}) {
      k.attention_kernels_per_layer += (part->enabled ? 1 : 0) + (part->splits() ? 1 : 0);
    }
    keys.push_back(k);
  }
  return keys;
}

}  // namespace

absl::StatusOr<std::vector<PlannedStepKey>> PlanStepKeys(const PlannerConfig& config) {
  // A caller's config that skipped resolving (any field any value) gets the resolver's error.
  absl::StatusOr<PlannerConfig> resolved = ResolvePlannerConfig(config);
  if (!resolved.ok()) return resolved.status();
  return PlanResolvedStepKeys(*resolved);
}

int64_t MemoryPlan::MaxConcurrency(int64_t context_tokens) const {
  if (context_tokens < 1 || block_size < 1) return 0;
  const int64_t blocks = CeilDiv(context_tokens, block_size);
  return num_kv_blocks / blocks;
}

const MemoryTerm* MemoryPlan::Find(absl::string_view name) const {
  for (const MemoryTerm& t : terms) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<PlannerConfig> ResolvePlannerConfig(const PlannerConfig& in) {
  PlannerConfig out = in;
  const PlannerConfig defaults = DefaultPlannerConfig();

  if (!out.has_gpu_memory_utilization()) {
    out.set_gpu_memory_utilization(defaults.gpu_memory_utilization());
  }
  const double u = out.gpu_memory_utilization();
  if (!(u > 0.0 && u <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_memory_utilization ", u,
                     " is outside (0, 1]; give the fraction of the GPU's memory "
                     "kiln may use, e.g. --gpu_memory_utilization=0.9"));
  }

  absl::StatusOr<ModelShape> model = ResolveModel(in);
  if (!model.ok()) return model.status();
  *out.mutable_model() = *std::move(model);

  absl::StatusOr<GpuSpec> gpu = ResolveGpu(in);
  if (!gpu.ok()) return gpu.status();
  *out.mutable_gpu() = *std::move(gpu);

  if (!out.has_max_num_seqs()) out.set_max_num_seqs(defaults.max_num_seqs());
  if (!out.has_max_num_batched_tokens()) {
    out.set_max_num_batched_tokens(defaults.max_num_batched_tokens());
  }
  if (!out.has_block_size()) out.set_block_size(defaults.block_size());
  if (!out.has_max_model_len()) out.set_max_model_len(defaults.max_model_len());
  if (!out.has_tensor_parallel_size()) {
    out.set_tensor_parallel_size(defaults.tensor_parallel_size());
  }
  if (!out.has_kv_cache_dtype() || out.kv_cache_dtype() == config::DTYPE_UNSPECIFIED) {
    out.set_kv_cache_dtype(out.model().dtype());
  }

  const struct {
    int64_t value;
    const char* name;
    const char* what;
    int64_t limit;
  } scalars[] = {
      {out.max_num_seqs(), "max_num_seqs", "the most sequences in one step, e.g. 256", kMaxSeqs},
      {out.max_num_batched_tokens(), "max_num_batched_tokens",
       "the most tokens in one step, e.g. 8192", kMaxTokens},
      {out.block_size(), "block_size", "tokens per KV block, e.g. 64", kMaxBlockSize},
      {out.max_model_len(), "max_model_len", "the longest sequence in tokens, e.g. 4096",
       kMaxModelLen},
      {out.tensor_parallel_size(), "tensor_parallel_size", "GPUs per model, e.g. 1", kMaxHeads},
  };
  for (const auto& s : scalars) {
    if (s.value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(s.name, " must be positive, got ", s.value,
                                                     "; set --", s.name, " to ", s.what));
    }
    absl::Status bounded = CheckAtMost(s.value, s.limit, s.name);
    if (!bounded.ok()) return bounded;
  }
  const config::Calibration& cal = out.calibration();
  const struct {
    bool has;
    uint64_t value;
    const char* name;
    uint64_t limit;
  } calibrated[] = {
      {cal.has_activation_bytes_per_token(), cal.activation_bytes_per_token(),
       "calibration.activation_bytes_per_token", kMaxPerUnitBytes},
      {cal.has_graph_bytes_per_graph(), cal.graph_bytes_per_graph(),
       "calibration.graph_bytes_per_graph", kMaxPerGraphBytes},
      {cal.has_graph_bytes_per_node(), cal.graph_bytes_per_node(),
       "calibration.graph_bytes_per_node", kMaxPerNodeBytes},
      {cal.has_cublaslt_workspace_bytes(), cal.cublaslt_workspace_bytes(),
       "calibration.cublaslt_workspace_bytes", kMaxBufferBytes},
      {cal.has_custom_allreduce_buffer_bytes(), cal.custom_allreduce_buffer_bytes(),
       "calibration.custom_allreduce_buffer_bytes", kMaxBufferBytes},
      {cal.has_nccl_bytes(), cal.nccl_bytes(), "calibration.nccl_bytes", kMaxBufferBytes},
      {cal.has_margin_bytes(), cal.margin_bytes(), "calibration.margin_bytes", kMaxBufferBytes},
  };
  for (const auto& c : calibrated) {
    if (c.has && c.value > c.limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          c.name, " ", c.value, " is above ", c.limit,
          ", beyond anything a GPU measures; check the value (a typo or the wrong unit?)"));
    }
  }
  if (out.max_num_batched_tokens() < out.max_num_seqs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_num_batched_tokens ", out.max_num_batched_tokens(), " is below max_num_seqs ",
        out.max_num_seqs(), "; a decode step of ", out.max_num_seqs(),
        " sequences needs as many tokens: raise max_num_batched_tokens or lower max_num_seqs"));
  }
  if (DTypeBytes(out.kv_cache_dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_dtype ", DTypeValue(out.kv_cache_dtype()),
                     " is not a known type; use --kv_cache_dtype=bf16|fp16|fp32|fp8"));
  }
  absl::Status tp = CheckTensorParallel(out.model(), out.tensor_parallel_size());
  if (!tp.ok()) return tp;
  // Prefill attention holds a KV head's whole query-head group in one tile of kPrefillTileRows
  // rows; the attention planner refuses more, in terms (tile rows) no user can change.
  const int group = out.model().num_heads() / out.tensor_parallel_size() /
                    KvHeadsPerRank(out.model(), out.tensor_parallel_size());
  if (group > kPrefillTileRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.num_heads ", out.model().num_heads(), " and model.num_kv_heads ",
        out.model().num_kv_heads(), " at tensor_parallel_size ", out.tensor_parallel_size(),
        " leave ", group, " query heads per KV head on a rank, above the ", kPrefillTileRows,
        " kiln's attention takes (one prefill tile); fix the shape or split the query heads "
        "over more ranks"));
  }
  absl::Status graphs = ResolveGraphs(&out);
  if (!graphs.ok()) return graphs;
  return out;
}

PlannerEstimates EstimatesFor(const PlannerConfig& resolved) {
  const config::Calibration& c = resolved.calibration();
  // A resolved config's values are far below 2^63; an unresolved one's may not be, and would
  // wrap negative as int64.
  auto bytes = [](uint64_t v) -> int64_t {
    return static_cast<int64_t>(std::min<uint64_t>(v, std::numeric_limits<int64_t>::max()));
  };
  PlannerEstimates e;
  e.activation_bytes_per_token = bytes(c.activation_bytes_per_token());
  e.graph_bytes_per_graph =
      c.has_graph_bytes_per_graph() ? bytes(c.graph_bytes_per_graph()) : kGraphBytesPerGraph;
  e.graph_bytes_per_node =
      c.has_graph_bytes_per_node() ? bytes(c.graph_bytes_per_node()) : kGraphBytesPerNode;
  e.cublaslt_workspace_bytes = c.has_cublaslt_workspace_bytes()
                                   ? bytes(c.cublaslt_workspace_bytes())
                                   : kCublasLtWorkspaceBytes;
  e.custom_allreduce_buffer_bytes = c.has_custom_allreduce_buffer_bytes()
                                        ? bytes(c.custom_allreduce_buffer_bytes())
                                        : kCustomAllReduceBufferBytes;
  e.nccl_bytes = c.has_nccl_bytes() ? bytes(c.nccl_bytes()) : kNcclBytes;
  e.margin_bytes = c.has_margin_bytes() ? bytes(c.margin_bytes()) : kMarginBytes;
  return e;
}

absl::StatusOr<MemoryPlan> PlanMemory(const PlannerConfig& config) {
  absl::StatusOr<PlannerConfig> resolved = ResolvePlannerConfig(config);
  if (!resolved.ok()) return resolved.status();

  MemoryPlan plan;
  plan.config = *std::move(resolved);
  const PlannerConfig& c = plan.config;
  const ModelShape& m = c.model();
  const config::Calibration& cal = c.calibration();
  const int tp = c.tensor_parallel_size();
  const bool parallel = tp > 1;
  const PlannerEstimates e = EstimatesFor(c);
  plan.estimates = e;
  auto source = [](bool calibrated) { return calibrated ? " (calibrated)" : " (estimate)"; };
  const std::string dtype = DTypeName(m.dtype());
  const std::string per_rank = parallel ? absl::StrCat(", per rank of ", tp) : "";

  plan.total_bytes = static_cast<int64_t>(c.gpu().total_bytes());
  plan.budget_bytes = static_cast<int64_t>(
      std::floor(static_cast<long double>(plan.total_bytes) * c.gpu_memory_utilization()));

  auto add = [&plan](std::string name, int64_t bytes, std::string explanation) {
    plan.terms.push_back(MemoryTerm{std::move(name), bytes, std::move(explanation)});
  };

  // Weights.
  const int64_t params = WeightParamsPerRank(m, tp);
  add("weights", params * DTypeBytes(m.dtype()),
      absl::StrFormat("%.2f B parameters x %d B (%s): embedding, %d x (QKV%s%s, O, gate-up, "
                      "down, norms), lm head (%s)%s",
                      params / 1e9, DTypeBytes(m.dtype()), dtype, m.num_layers(),
                      m.attention_bias() ? " + bias" : "", m.qk_norm() ? " + QK norms" : "",
                      m.tie_embeddings() ? "tied: shares the embedding" : "untied", per_rank));

  absl::StatusOr<std::vector<PlannedStepKey>> keys = PlanResolvedStepKeys(c);
  if (!keys.ok()) return keys.status();
  plan.step_keys = *std::move(keys);
  const PlannedStepKey& eager = plan.step_keys.back();

  // The eager arena holds the eager key's activations (runner.cc; piecewise graphs use it too).
  const int64_t per_token = e.activation_bytes_per_token;
  const int64_t row_bytes = m.hidden_size() * ActivationDTypeBytes(m);
  add("activation_arena", eager.activation_bytes,
      per_token > 0
          ? absl::StrCat(Thousands(eager.max_tokens), " batched tokens x ",
                         FormatBytes(per_token), ": eager steps (calibrated)")
          : absl::StrCat(Thousands(eager.max_tokens), " tokens x ",
                         FormatBytes(ActivationBytesPerToken(m, tp)), " + ", eager.max_rows,
                         " last-token + ", std::min<int64_t>(eager.max_tokens, kFoldedNormMaxRows),
                         " mid-residual rows x ", FormatBytes(row_bytes),
                         ": the model's layout (3 x hidden, QKV, attention, gate-up, SiLU), "
                         "eager steps"));

  // Split-kv partials: one buffer per plan part, sized for the largest key and bound to every
  // graph and eager step alike; and the step metadata blob the plan is uploaded in.
  int64_t decode_partials = 0, prefill_partials = 0;
  int decode_slots = 0, prefill_slots = 0;
  const PlannedStepKey* metadata = &eager;
  for (const PlannedStepKey& k : plan.step_keys) {
    decode_partials = std::max(decode_partials, k.decode_partial_bytes);
    prefill_partials = std::max(prefill_partials, k.prefill_partial_bytes);
    decode_slots = std::max(decode_slots, k.decode_slots);
    prefill_slots = std::max(prefill_slots, k.prefill_slots);
    if (k.metadata_bytes > metadata->metadata_bytes) metadata = &k;
  }
  const int64_t kv_heads = KvHeadsPerRank(m, tp);
  const int64_t group = m.num_heads() / tp / kv_heads;
  add("attention_workspace", decode_partials + prefill_partials + metadata->metadata_bytes,
      absl::StrFormat("split-kv partials, float: %d KV heads x (%d slots x %d decode rows + %d x "
                      "%d prefill) x (%d + 1); %s step metadata (%s: tokens, plan, blocks)",
                      kv_heads, decode_slots, group, prefill_slots, kPrefillTileRows,
                      m.head_dim(), FormatBytes(metadata->metadata_bytes),
                      KeyName(metadata->key)));

  // Graphs. Full: one per captured key, activations in one shared pool sized for the largest
  // (graphs replay one at a time). Piecewise: layers + 1 per key around eager attention, over the
  // eager arena.
  const bool piecewise = c.graph().execution() == config::GRAPH_EXECUTION_PIECEWISE;
  const PlannedStepKey* largest = nullptr;
  int64_t decode_graphs = 0, prefill_graphs = 0, decode_nodes = 0, prefill_nodes = 0;
  const int64_t outside = GraphNodesOutsideAttention(m, tp);
  for (const PlannedStepKey& k : plan.step_keys) {
    if (!k.captured) continue;
    if (largest == nullptr || k.activation_bytes > largest->activation_bytes) largest = &k;
    const int64_t nodes =
        outside + (piecewise ? 0 : int64_t{m.num_layers()} * k.attention_kernels_per_layer);
    (k.key.mode == GraphMode::kDecode ? decode_graphs : prefill_graphs) += 1;
    (k.key.mode == GraphMode::kDecode ? decode_nodes : prefill_nodes) += nodes;
  }
  const int64_t pieces = piecewise ? m.num_layers() + 1 : 1;
  plan.num_graphs = (decode_graphs + prefill_graphs) * pieces;
  plan.num_graph_nodes = decode_nodes + prefill_nodes;
  if (largest == nullptr) {
    add("graph_pool", 0, "none: CUDA graphs are off (graph mode none)");
    add("graph_executables", 0, "none: CUDA graphs are off (graph mode none)");
  } else {
    if (piecewise) {
      add("graph_pool", 0, "none: piecewise graphs keep their activations in the eager arena");
    } else {
      const std::string activations =
          per_token > 0 ? absl::StrCat(Thousands(largest->max_tokens), " tokens x ",
                                       FormatBytes(per_token), " (calibrated)")
                        : absl::StrCat("(", Thousands(largest->max_tokens), " tokens, ",
                                       largest->max_rows, " rows) activations");
      add("graph_pool", largest->activation_bytes,
          absl::StrCat("largest of ", plan.num_graphs, " graphs: ", KeyName(largest->key), " ",
                       activations, ", shared: graphs replay one at a time"));
    }
    // "27 decode x 182 + 14 prefill x 214 nodes" (the count per graph where it is the same).
    auto kind = [](const char* name, int64_t graphs, int64_t nodes) -> std::string {
      if (graphs == 0) return "";
      return nodes % graphs == 0 ? absl::StrCat(graphs, " ", name, " x ", Thousands(nodes / graphs))
                                 : absl::StrCat(graphs, " ", name, " (", Thousands(nodes), ")");
    };
    std::string per_key = kind("decode", decode_graphs, decode_nodes);
    const std::string prefill_part = kind("prefill", prefill_graphs, prefill_nodes);
    if (!per_key.empty() && !prefill_part.empty()) per_key += " + ";
    per_key += prefill_part;
    const bool calibrated = cal.has_graph_bytes_per_graph() || cal.has_graph_bytes_per_node();
    add("graph_executables",
        plan.num_graphs * e.graph_bytes_per_graph + plan.num_graph_nodes * e.graph_bytes_per_node,
        absl::StrCat(plan.num_graphs, " graphs x ", FormatBytes(e.graph_bytes_per_graph), " + ",
                     Thousands(plan.num_graph_nodes), " nodes x ",
                     FormatBytes(e.graph_bytes_per_node), " (", per_key, " nodes",
                     piecewise ? absl::StrCat(", in ", pieces, " pieces each") : "", ")",
                     source(calibrated)));
  }

  // Collectives, only with tensor parallelism.
  if (parallel) {
    const int64_t push_bytes = kFusedNormPushParities * tp * kFusedNormPushSlotBytes;
    add("custom_allreduce", kCustomAllReduceBuffers * e.custom_allreduce_buffer_bytes + push_bytes,
        absl::StrCat(kCustomAllReduceBuffers, " x ", FormatBytes(e.custom_allreduce_buffer_bytes),
                     ": IPC staging buffer and two-shot scratch, + ", FormatBytes(push_bytes),
                     " fused-norm push slots", source(cal.has_custom_allreduce_buffer_bytes())));
    add("nccl", e.nccl_bytes,
        absl::StrCat("NCCL channel buffers among ", tp, " ranks", source(cal.has_nccl_bytes())));
  } else {
    add("custom_allreduce", 0, "none: tensor_parallel_size 1");
    add("nccl", 0, "none: tensor_parallel_size 1");
  }

  add("cublaslt_workspace", e.cublaslt_workspace_bytes,
      cal.has_cublaslt_workspace_bytes()
          ? "cuBLASLt GEMM workspace (calibrated)"
          : "cuBLASLt GEMM workspace, NVIDIA's recommendation for Hopper");

  add("logits", int64_t{c.max_num_seqs()} * (m.vocab_size() + 1) * 4,
      absl::StrCat(c.max_num_seqs(), " seqs x (", Thousands(m.vocab_size()),
                   " vocab + 1) x 4 B: float logits of each sequence's last token, sampled "
                   "token"));

  add("margin", e.margin_bytes,
      absl::StrCat("CUDA context, kernel images, small buffers, fragmentation",
                   source(cal.has_margin_bytes())));

  for (const MemoryTerm& t : plan.terms) plan.reserved_bytes += t.bytes;

  // The KV cache: whole blocks of what is left.
  plan.block_size = c.block_size();
  plan.kv_bytes_per_token = KvBytesPerToken(m, c.kv_cache_dtype(), tp);
  plan.kv_block_bytes = plan.kv_bytes_per_token * c.block_size();
  const int64_t rest = plan.budget_bytes - plan.reserved_bytes;
  if (rest < plan.kv_block_bytes) {
    const MemoryTerm* largest = &plan.terms.front();
    for (const MemoryTerm& t : plan.terms) {
      if (t.bytes > largest->bytes) largest = &t;
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "The budget leaves no room for a KV block: ", FormatBytes(plan.budget_bytes), " budget (",
        FormatBytes(plan.total_bytes), " x ", c.gpu_memory_utilization(), ") - ",
        FormatBytes(plan.reserved_bytes), " reserved = ", FormatBytes(rest), ", but one block of ",
        c.block_size(), " tokens needs ", FormatBytes(plan.kv_block_bytes),
        " (largest term: ", largest->name, " ", FormatBytes(largest->bytes),
        "); raise gpu_memory_utilization, lower max_num_batched_tokens or max_num_seqs, capture "
        "fewer graph sizes, raise tensor_parallel_size, or use a GPU with more memory"));
  }
  plan.num_kv_blocks = rest / plan.kv_block_bytes;
  const int64_t kv_bytes = plan.num_kv_blocks * plan.kv_block_bytes;
  add("kv_cache", kv_bytes,
      absl::StrFormat("%s blocks x %d tokens x %s/token (2 x %d layers x %d KV heads x %d x %d B "
                      "%s)",
                      Thousands(plan.num_kv_blocks), c.block_size(),
                      FormatBytes(plan.kv_bytes_per_token), m.num_layers(), kv_heads, m.head_dim(),
                      DTypeBytes(c.kv_cache_dtype()), DTypeName(c.kv_cache_dtype())));
  add("unused", rest - kv_bytes,
      absl::StrCat("rest of the budget, less than one ", FormatBytes(plan.kv_block_bytes),
                   " block"));
  return plan;
}

}  // namespace kiln
