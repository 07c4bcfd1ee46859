#include "runtime/memory/memory_planner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/config/presets.h"
#include "graph/capture_sizes.h"

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

// Device memory per node of an instantiated CUDA graph (the driver's node records and the copies
// of kernel parameters it keeps on the device). Measured with `memory_planner --measure
// --preset=llama-3.2-1b` on an H200 (CUDA 13.0, driver 580, 2026-11-21): the 27 decode graphs of
// the 1B model, 5233 kernel and memset nodes, took 16.0 MiB across capture (cudaMemGetInfo
// delta; the pool was reserved before), 3.2 KiB per node. We take 4 KiB: the delta is only
// visible in 2 MiB steps. (The estimate before, 16 KiB, came from a public CUDA 11.2 report of
// about 64 KiB per empty-kernel node and serving engines' totals.)
constexpr int64_t kGraphBytesPerNode = 4 * kKiB;

// Kernels one decoder layer launches in a captured step: input RMSNorm, QKV GEMM, RoPE + KV
// append, attention, split-kv merge, O GEMM, residual add + post-attention RMSNorm, gate-up GEMM,
// SiLU·mul, down GEMM, residual add. Tensor parallelism adds an all-reduce after O and after down.
constexpr int64_t kKernelsPerLayer = 11;
constexpr int64_t kAllReducesPerLayer = 2;
// Outside the layers: embedding, final RMSNorm, lm head GEMM, greedy sampling (the LM head is
// replicated over tensor-parallel ranks, so no logits gather).
constexpr int64_t kKernelsOutsideLayers = 4;

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

// Split-kv attention writes partial outputs in float: [slots, kv_heads, tile_rows, head_dim] plus
// a log-sum-exp per row (attention/attention_params.h). The planner splits KV only until the grid
// fills the GPU, so slots ≤ one per sequence plus two CTAs' worth per SM; tiles are 64 rows.
constexpr int64_t kAttentionTileRows = 64;
constexpr int64_t kSplitSlotsPerSm = 2;

// Prefill-only graphs are captured up to this many tokens by default (DESIGN.md, graph/).
constexpr int kDefaultPrefillCaptureLimit = 512;

// Upper bounds on the inputs, far above any real model or GPU, so that no product in the formulas
// can overflow 64 bits (the largest, the weights, stays below 2^61). Values above them are typos.
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden_size, intermediate_size
constexpr int64_t kMaxHeads = int64_t{1} << 12;  // num_heads, num_kv_heads, head_dim, layers
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxSeqs = int64_t{1} << 20;    // max_num_seqs
constexpr int64_t kMaxTokens = int64_t{1} << 24;  // max_num_batched_tokens
constexpr int64_t kMaxBlockSize = int64_t{1} << 16;
constexpr int64_t kMaxSmCount = int64_t{1} << 16;
constexpr uint64_t kMaxGpuBytes = uint64_t{1} << 50;      // 1 PiB
constexpr uint64_t kMaxPerUnitBytes = uint64_t{1} << 30;  // calibrated bytes per token
constexpr uint64_t kMaxPerNodeBytes = uint64_t{1} << 20;  // calibrated bytes per graph node
constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 40;   // calibrated buffers and margin

// ---------------------------------------------------------------------------------------------

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
    config::ModelShape changed = in.model();
    changed.clear_rope_theta();
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
        absl::StrCat("model.dtype is ", model.has_dtype() ? DTypeName(model.dtype()) : "not set",
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
  if (graph->mode() == config::GRAPH_MODE_UNSPECIFIED) graph->set_mode(config::GRAPH_MODE_DECODE);
  if (graph->mode() == config::GRAPH_MODE_NONE) {
    // Sizes mean nothing without graphs (FastDeploy's use_cudagraph: false keeps its list too).
    graph->clear_capture_sizes();
    graph->clear_max_capture_size();
    return absl::OkStatus();
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
  graph->clear_capture_sizes();
  for (int s : sizes) graph->add_capture_sizes(s);
  graph->set_max_capture_size(sizes.back());
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

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string Thousands(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return n < 0 ? "-" + out : out;
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

std::string FormatBytes(int64_t bytes) {
  const int64_t magnitude = bytes < 0 ? -bytes : bytes;
  if (magnitude >= kGiB) return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / kGiB);
  if (magnitude >= kMiB) return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / kMiB);
  if (magnitude >= kKiB) return absl::StrFormat("%.1f KiB", static_cast<double>(bytes) / kKiB);
  return absl::StrFormat("%d B", bytes);
}

int KvHeadsPerRank(const ModelShape& model, int tp) {
  return model.num_kv_heads() >= tp ? model.num_kv_heads() / tp : 1;
}

int64_t WeightParamsPerRank(const ModelShape& model, int tp) {
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
                            + heads * d * h                             // O projection
                            + h * 2 * ffn                               // gate and up
                            + ffn * h                                   // down
                            + 2 * h;                                    // two RMSNorm weights
  const int64_t embedding = vocab_rows * h;
  const int64_t lm_head = model.tie_embeddings() ? 0 : vocab_rows * h;
  return embedding + model.num_layers() * per_layer + h /* final norm */ + lm_head;
}

int64_t KvBytesPerToken(const ModelShape& model, DType kv_dtype, int tp) {
  return 2 * int64_t{model.num_layers()} * KvHeadsPerRank(model, tp) * model.head_dim() *
         DTypeBytes(kv_dtype);
}

int64_t ActivationBytesPerToken(const ModelShape& model, int tp) {
  // Estimate: the intermediates one decoder layer keeps alive, summed as if none shared memory
  // (an upper bound of the runner's arena; layers run in turn and reuse it):
  //   residual, normed input, O output, down output  4 × [T, H]
  //   QKV                                            [T, (heads + 2 kv_heads) / rank × head_dim]
  //   attention output                               [T, heads / rank × head_dim]
  //   gate-up, SiLU·mul                              [T, 2F / rank], [T, F / rank]
  // in the activation dtype (bf16 when the weights are fp8). --measure replaces it.
  const int64_t h = model.hidden_size();
  const int64_t d = model.head_dim();
  const int64_t heads = model.num_heads() / tp;
  const int64_t kv_heads = KvHeadsPerRank(model, tp);
  const int64_t ffn = model.intermediate_size() / tp;
  const int64_t elements = 4 * h + (heads + 2 * kv_heads) * d + heads * d + 3 * ffn;
  const int64_t dtype_bytes =
      model.dtype() == config::DTYPE_FP8_E4M3 ? 2 : DTypeBytes(model.dtype());
  return elements * dtype_bytes;
}

int64_t GraphNodesPerGraph(const ModelShape& model, int tp) {
  const bool parallel = tp > 1;
  return model.num_layers() * (kKernelsPerLayer + (parallel ? kAllReducesPerLayer : 0)) +
         kKernelsOutsideLayers;
}

int64_t MemoryPlan::MaxConcurrency(int64_t context_tokens) const {
  if (context_tokens < 1 || block_size < 1) return 0;
  return num_kv_blocks / CeilDiv(context_tokens, block_size);
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
  if (!out.has_tensor_parallel_size())
    out.set_tensor_parallel_size(defaults.tensor_parallel_size());
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
        "kv_cache_dtype is not a known type; use --kv_cache_dtype=bf16|fp16|fp32|fp8");
  }
  absl::Status tp = CheckTensorParallel(out.model(), out.tensor_parallel_size());
  if (!tp.ok()) return tp;
  absl::Status graphs = ResolveGraphs(&out);
  if (!graphs.ok()) return graphs;
  return out;
}

PlannerEstimates EstimatesFor(const PlannerConfig& resolved) {
  const config::Calibration& c = resolved.calibration();
  PlannerEstimates e;
  e.activation_bytes_per_token =
      c.has_activation_bytes_per_token()
          ? static_cast<int64_t>(c.activation_bytes_per_token())
          : ActivationBytesPerToken(resolved.model(), resolved.tensor_parallel_size());
  e.graph_bytes_per_node = c.has_graph_bytes_per_node()
                               ? static_cast<int64_t>(c.graph_bytes_per_node())
                               : kGraphBytesPerNode;
  e.cublaslt_workspace_bytes = c.has_cublaslt_workspace_bytes()
                                   ? static_cast<int64_t>(c.cublaslt_workspace_bytes())
                                   : kCublasLtWorkspaceBytes;
  e.custom_allreduce_buffer_bytes = c.has_custom_allreduce_buffer_bytes()
                                        ? static_cast<int64_t>(c.custom_allreduce_buffer_bytes())
                                        : kCustomAllReduceBufferBytes;
  e.nccl_bytes = c.has_nccl_bytes() ? static_cast<int64_t>(c.nccl_bytes()) : kNcclBytes;
  e.margin_bytes = c.has_margin_bytes() ? static_cast<int64_t>(c.margin_bytes()) : kMarginBytes;
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
      absl::StrFormat("%.2f B parameters x %d B (%s): embedding, %d x (QKV%s, O, gate-up, down, "
                      "norms), lm head (%s)%s",
                      params / 1e9, DTypeBytes(m.dtype()), dtype, m.num_layers(),
                      m.attention_bias() ? " + bias" : "",
                      m.tie_embeddings() ? "tied: shares the embedding" : "untied", per_rank));

  // Eager activation arena.
  add("activation_arena", e.activation_bytes_per_token * c.max_num_batched_tokens(),
      absl::StrCat(Thousands(c.max_num_batched_tokens()), " batched tokens x ",
                   FormatBytes(e.activation_bytes_per_token),
                   ": one layer's live intermediates, eager steps",
                   source(cal.has_activation_bytes_per_token())));

  // Split-kv partial outputs, bound to every graph and to eager steps alike: counted once.
  const int64_t kv_heads = KvHeadsPerRank(m, tp);
  const int64_t slots = c.max_num_seqs() + kSplitSlotsPerSm * c.gpu().sm_count();
  add("attention_workspace",
      slots * kv_heads * kAttentionTileRows * (m.head_dim() + 1) * int64_t{4},
      absl::StrFormat("split-kv partials, float: (%d seqs + %d x %d SMs) slots x %d KV heads x "
                      "%d rows x (%d + 1)",
                      c.max_num_seqs(), kSplitSlotsPerSm, c.gpu().sm_count(), kv_heads,
                      kAttentionTileRows, m.head_dim()));

  // Graphs: one shared pool (the largest capture), plus each graph's executable.
  const int64_t num_graphs = c.graph().capture_sizes_size();
  if (num_graphs == 0) {
    add("graph_pool", 0, "none: CUDA graphs are off (graph mode none)");
    add("graph_executables", 0, "none: CUDA graphs are off (graph mode none)");
  } else {
    const bool decode = c.graph().mode() == config::GRAPH_MODE_DECODE;
    const int largest = c.graph().max_capture_size();
    add("graph_pool", e.activation_bytes_per_token * largest,
        absl::StrFormat("largest of %d %s graphs, %d tokens x %s, shared: graphs replay one at "
                        "a time",
                        num_graphs, decode ? "decode" : "prefill", largest,
                        FormatBytes(e.activation_bytes_per_token)));
    const int64_t nodes = GraphNodesPerGraph(m, tp);
    add("graph_executables", num_graphs * nodes * e.graph_bytes_per_node,
        absl::StrCat(num_graphs, " graphs x ", nodes, " kernel nodes x ",
                     FormatBytes(e.graph_bytes_per_node), source(cal.has_graph_bytes_per_node())));
  }

  // Collectives, only with tensor parallelism.
  if (parallel) {
    add("custom_allreduce", kCustomAllReduceBuffers * e.custom_allreduce_buffer_bytes,
        absl::StrCat(kCustomAllReduceBuffers, " x ", FormatBytes(e.custom_allreduce_buffer_bytes),
                     ": IPC staging buffer and two-shot scratch",
                     source(cal.has_custom_allreduce_buffer_bytes())));
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

  add("logits", int64_t{c.max_num_seqs()} * m.vocab_size() * 4,
      absl::StrCat(c.max_num_seqs(), " seqs x ", Thousands(m.vocab_size()),
                   " vocab x 4 B: float logits of each sequence's last token"));

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
        "); raise gpu_memory_utilization, lower max_num_batched_tokens or max_num_seqs, raise "
        "tensor_parallel_size, or use a GPU with more memory"));
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
