#include "runtime/runner/runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attention/decode_kernel.h"
#include "attention/plan_buffers.h"
#include "graph/capture_context.h"
#include "runtime/config/presets.h"
#include "runtime/config/quoted.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/model/device_weights.h"
#include "runtime/model/llama_checkpoint.h"
#include "runtime/model/sampling.h"
#include "runtime/model/tensor_parallel.h"
#include "runtime/runner/rank_agreement.h"
#include "runtime/runner/step_fetch.h"

namespace kiln {
namespace {

// Prefill graphs are captured up to this many tokens unless told otherwise.
constexpr int kDefaultPrefillLimit = 512;

absl::StatusOr<size_t> FreeDeviceBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

// Records the device memory an allocation step took: `requested` bytes asked for, and the drop in
// free memory since `free_before`.
absl::Status Record(RunnerMemory* memory, const std::string& name, int64_t requested,
                    size_t free_before) {
  ASSIGN_OR_RETURN(size_t free_after, FreeDeviceBytes());
  memory->items.push_back(RunnerMemoryItem{
      name, requested, static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after)});
  return absl::OkStatus();
}

absl::Status AllocateIfNeeded(size_t bytes, const char* name, DeviceBuffer* out) {
  if (bytes == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(*out, DeviceBuffer::Allocate(bytes, name));
  return absl::OkStatus();
}

}  // namespace

const char* GraphExecutionName(GraphExecution mode) {
  switch (mode) {
    case GraphExecution::kFull:
      return "full";
    case GraphExecution::kPiecewise:
      return "piecewise";
    case GraphExecution::kNone:
      return "none";
  }
  return "unknown";
}

std::string RunnerCaptureSummary::ToString() const {
  return absl::StrFormat(
      "Captured %d graphs (%d decode, %d prefill sizes) in %.2f s, pool %s, %d nodes, %s of "
      "device memory for the executables",
      num_graphs, num_decode_sizes, num_prefill_sizes, seconds, FormatBytes(pool_bytes),
      num_nodes, FormatBytes(static_cast<size_t>(std::max<int64_t>(device_bytes, 0))));
}

const RunnerMemoryItem* RunnerMemory::Find(const std::string& name) const {
  for (const RunnerMemoryItem& item : items) {
    if (item.name == name) return &item;
  }
  return nullptr;
}

absl::StatusOr<LlamaShape> LlamaShapeFromConfig(const config::ModelShape& m) {
  if (m.dtype() != config::DTYPE_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("Model dtype ", DTypeName(m.dtype()),
                     " is not supported; kiln's model runs bf16 (set model.dtype: DTYPE_BF16)"));
  }
  LlamaShape s;
  s.hidden = m.hidden_size();
  s.layers = m.num_layers();
  s.heads = m.num_heads();
  s.kv_heads = m.num_kv_heads();
  s.head_dim = m.head_dim();
  s.ffn = m.intermediate_size();
  s.vocab = m.vocab_size();
  if (m.has_rope_theta()) s.rope_theta = m.rope_theta();
  if (m.has_rms_norm_eps()) s.rms_eps = m.rms_norm_eps();
  s.tie_embeddings = m.tie_embeddings();
  s.qkv_bias = m.attention_bias();
  s.qk_norm = m.qk_norm();
  // rope_type "default" (Hugging Face's name for unscaled RoPE) turns a preset's scaling off.
  if (m.has_rope_scaling() && m.rope_scaling().rope_type() != "default") {
    const config::RopeScaling& r = m.rope_scaling();
    if (!r.has_rope_type()) {
      return absl::InvalidArgumentError(
          "Model rope_scaling has no rope_type; kiln implements \"llama3\" RoPE scaling (set "
          "rope_type: \"llama3\", or \"default\" for none)");
    }
    if (r.rope_type() != "llama3") {
      return absl::InvalidArgumentError(absl::StrCat(
          "Model rope_scaling.rope_type ", Quoted(r.rope_type()),
          " is not supported; kiln implements \"llama3\" RoPE scaling (or rope_type "
          "\"default\" for none)"));
    }
    struct Field {
      bool has;
      const char* name;
      const char* published;
    };
    const Field fields[] = {
        {r.has_factor(), "factor", "8, or 32 for 3.2 1B and 3B"},
        {r.has_low_freq_factor(), "low_freq_factor", "1"},
        {r.has_high_freq_factor(), "high_freq_factor", "4"},
        {r.has_original_max_position_embeddings(), "original_max_position_embeddings", "8192"},
    };
    for (const Field& f : fields) {
      if (f.has) continue;
      return absl::InvalidArgumentError(absl::StrCat("Model rope_scaling has no ", f.name,
                                                     "; give it (Llama 3.x: ", f.published, ")"));
    }
    // Factor 0 would read as no scaling (RopeScaling::enabled); a llama3 scaling is at least 1.
    if (r.factor() == 0.0) {
      return absl::InvalidArgumentError(
          "Model rope_scaling.factor is 0; it must be at least 1 (or rope_type \"default\" for "
          "none)");
    }
    s.rope_scaling = RopeScaling::Llama3(r.factor(), r.low_freq_factor(), r.high_freq_factor(),
                                         r.original_max_position_embeddings());
  }
  RETURN_IF_ERROR(s.Validate());
  // Refused here, before weights are read or memory allocated, rather than at the first step.
  if (absl::Status attention = DecodeAttentionSupportsShape(s.heads, s.kv_heads, s.head_dim);
      !attention.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Model ", Quoted(m.name()), ": ", attention.message(),
                     "; kiln cannot run it yet"));
  }
  return s;
}

absl::Status CheckSlidingWindow(const config::ModelShape& model, int max_model_len) {
  if (!model.has_sliding_window() || max_model_len <= model.sliding_window()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "Model ", Quoted(model.name()), " attends over a sliding window of its last ",
      model.sliding_window(), " tokens, which kiln's attention does not implement; up to ",
      model.sliding_window(), " tokens full attention computes the same: set max_model_len (",
      max_model_len, ") to at most ", model.sliding_window()));
}

absl::StatusOr<LlamaShape> CheckRunnerModel(const config::PlannerConfig& resolved,
                                            int max_model_len) {
  ASSIGN_OR_RETURN(LlamaShape shape, LlamaShapeFromConfig(resolved.model()));
  RETURN_IF_ERROR(CheckSlidingWindow(resolved.model(), max_model_len));
  if (resolved.kv_cache_dtype() != config::DTYPE_BF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_dtype ", DTypeName(resolved.kv_cache_dtype()),
        " is not supported; kiln's KV cache is bf16: leave kv_cache_dtype unset or bf16"));
  }
  // A step samples a token for each of its sequences in one launch; the planner allows more
  // sequences than that launch takes, which would fail a step only after its model had run.
  if (resolved.max_num_seqs() > kGreedySampleMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_num_seqs ", resolved.max_num_seqs(), " is above ", kGreedySampleMaxRows,
        ", the most sequences a step's greedy sampling takes; lower max_num_seqs"));
  }
  return shape;
}

const std::vector<SplitAim>& DecodeSplitRules(const RunnerOptions& options, int head_dim) {
  return head_dim == 128 ? options.decode_split_by_rows_head_dim_128
                         : options.decode_split_by_rows;
}

absl::StatusOr<StepSetup> BuildStepSetup(const config::PlannerConfig& resolved,
                                         const RunnerOptions& options, const LlamaShape& shape,
                                         int sm_count, int max_blocks_per_seq) {
  if (max_blocks_per_seq < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_blocks_per_seq ", max_blocks_per_seq,
                     " must be positive; pass the SequenceTable's max_blocks_per_seq"));
  }
  StepSetup setup;
  const StepLimits limits{resolved.max_num_seqs(), resolved.max_num_batched_tokens()};
  const config::GraphMode graph_mode = resolved.graph().mode();
  std::vector<int> listed(resolved.graph().capture_sizes().begin(),
                          resolved.graph().capture_sizes().end());
  if (graph_mode == config::GRAPH_MODE_DECODE) {
    ASSIGN_OR_RETURN(setup.decode_sizes,
                     CaptureSizes::FromList(listed, limits.max_num_seqs, "max_num_seqs"));
  } else {
    ASSIGN_OR_RETURN(setup.decode_sizes, CaptureSizes::Decode(limits.max_num_seqs));
  }
  if (graph_mode == config::GRAPH_MODE_PREFILL_ONLY) {
    ASSIGN_OR_RETURN(setup.prefill_sizes,
                     CaptureSizes::FromList(listed, limits.max_num_batched_tokens,
                                            "max_num_batched_tokens"));
  } else if (!options.prefill_sizes.empty()) {
    ASSIGN_OR_RETURN(setup.prefill_sizes, CaptureSizes::Prefill(limits.max_num_batched_tokens,
                                                                options.prefill_sizes));
  } else {
    ASSIGN_OR_RETURN(setup.prefill_sizes,
                     CaptureSizes::Prefill(
                         std::min(kDefaultPrefillLimit, limits.max_num_batched_tokens)));
  }
  ASSIGN_OR_RETURN(setup.keys,
                   StepKeys::Create(limits, &*setup.decode_sizes, &*setup.prefill_sizes));

  for (const StepKey& key : setup.keys.keys()) {
    SplitKvPlannerOptions planner_options =
        PlannerOptionsFor(key, shape.heads, shape.kv_heads, shape.head_dim, sm_count,
                          options.max_model_len, options.prefill_tile_rows);
    planner_options.decode.min_kv_chunk = options.decode_min_kv_chunk;
    SetDecodeSplit(key, DecodeSplitRules(options, shape.head_dim), options.decode_ctas_per_sm,
                   &planner_options.decode);
    ASSIGN_OR_RETURN(SplitKvPlanner planner, SplitKvPlanner::Create(planner_options));
    setup.layouts.push_back(
        MetadataLayout::Create(key, planner.layout().plan_bytes, max_blocks_per_seq));
    setup.planners.push_back(std::move(planner));
  }
  return setup;
}

absl::StatusOr<HostStepPlan> PlanHostSteps(const RunnerOptions& options) {
  RETURN_IF_ERROR(CheckRunnerOptions(options));
  HostStepPlan p;
  config::PlannerConfig config = Runner::PlannerConfigFor(options);
  config.set_tensor_parallel_size(1);
  ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(config));
  p.resolved = std::move(plan.config);
  ASSIGN_OR_RETURN(p.shape, CheckRunnerModel(p.resolved, options.max_model_len));
  p.sm_count = static_cast<int>(p.resolved.gpu().sm_count());
  p.max_blocks_per_seq =
      SequenceTable::MaxBlocksPerSeq(p.resolved.block_size(), options.max_model_len);
  ASSIGN_OR_RETURN(p.steps, BuildStepSetup(p.resolved, options, p.shape, p.sm_count,
                                           p.max_blocks_per_seq));
  return p;
}

absl::Status CheckStepTokens(absl::Span<const SequenceTokens> batch, int vocab,
                             int max_num_batched_tokens) {
  const size_t max_tokens = static_cast<size_t>(std::max(max_num_batched_tokens, 0));
  for (const SequenceTokens& s : batch) {
    if (s.tokens.size() > max_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sequence ", s.id, " brings ", s.tokens.size(), " tokens, above max_num_batched_tokens ",
          max_num_batched_tokens, "; chunk the prefill into smaller steps"));
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Sequence ", s.id, " has token ", t, " outside the vocabulary [0, ", vocab, ")"));
      }
    }
  }
  return absl::OkStatus();
}

config::ModelShape ModelShapeFromLlamaShape(const LlamaShape& t, absl::string_view name) {
  config::ModelShape m;
  m.set_name(std::string(name));
  m.set_hidden_size(t.hidden);
  m.set_num_layers(t.layers);
  m.set_num_heads(t.heads);
  m.set_num_kv_heads(t.kv_heads);
  m.set_head_dim(t.head_dim);
  m.set_intermediate_size(t.ffn);
  m.set_vocab_size(t.vocab);
  m.set_dtype(config::DTYPE_BF16);
  m.set_tie_embeddings(t.tie_embeddings);
  m.set_attention_bias(t.qkv_bias);
  m.set_qk_norm(t.qk_norm);
  m.set_rope_theta(t.rope_theta);
  m.set_rms_norm_eps(t.rms_eps);
  if (t.rope_scaling.enabled()) {
    config::RopeScaling* r = m.mutable_rope_scaling();
    r->set_rope_type("llama3");
    r->set_factor(t.rope_scaling.factor);
    r->set_low_freq_factor(t.rope_scaling.low_freq_factor);
    r->set_high_freq_factor(t.rope_scaling.high_freq_factor);
    r->set_original_max_position_embeddings(t.rope_scaling.original_max_position);
  }
  return m;
}

namespace {

// CheckSplitAims, and no aim above kMaxCtasPerSm: an aim past what an SM holds only grows the
// partial workspace (at 2^24 CTAs per SM the planner would size one of hundreds of GiB, once the
// weights were already on the GPU).
absl::Status CheckDecodeSplitRules(const std::vector<SplitAim>& rules, absl::string_view name) {
  RETURN_IF_ERROR(CheckSplitAims(rules, name));
  for (size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].ctas_per_sm > kMaxCtasPerSm) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "[", i, "] (max_seqs ", rules[i].max_seqs, ", ctas_per_sm ",
          rules[i].ctas_per_sm, ") aims above ", kMaxCtasPerSm,
          " CTAs per SM, the most an SM holds; lower its ctas_per_sm"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRunnerOptions(const RunnerOptions& options) {
  if (options.max_model_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_model_len ", options.max_model_len, " must be positive; give the longest sequence"));
  }
  // A value outside the enum would pass PlannerConfigFor as kNone but capture as neither mode.
  if (options.graphs != GraphExecution::kFull && options.graphs != GraphExecution::kPiecewise &&
      options.graphs != GraphExecution::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunnerOptions::graphs ", static_cast<int>(options.graphs),
        " is not a GraphExecution; use kFull, kPiecewise or kNone"));
  }
  if (options.progress != CaptureProgress::kAuto && options.progress != CaptureProgress::kBar &&
      options.progress != CaptureProgress::kLines && options.progress != CaptureProgress::kNone &&
      options.progress != CaptureProgress::kQuiet) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunnerOptions::progress ", static_cast<int>(options.progress),
        " is not a CaptureProgress; use kAuto, kBar, kLines, kNone or kQuiet"));
  }
  RETURN_IF_ERROR(
      CheckDecodeSplitRules(options.decode_split_by_rows, "RunnerOptions::decode_split_by_rows"));
  RETURN_IF_ERROR(CheckDecodeSplitRules(options.decode_split_by_rows_head_dim_128,
                                        "RunnerOptions::decode_split_by_rows_head_dim_128"));
  // The attention planner's options, checked here on the host: the planners are built only after
  // the device is queried and the memory planned (BuildStepSetup), and the prefill kernel's tile
  // rows are checked only at the first prefill launch.
  if (options.prefill_tile_rows != 64 && options.prefill_tile_rows != 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunnerOptions::prefill_tile_rows ", options.prefill_tile_rows,
        " is not a tile size the prefill attention kernel has; use 64 or 128"));
  }
  if (options.decode_min_kv_chunk < 1 || options.decode_ctas_per_sm < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunnerOptions::decode_min_kv_chunk ", options.decode_min_kv_chunk,
        " and decode_ctas_per_sm ", options.decode_ctas_per_sm,
        " must be positive (defaults: 64 and 2)"));
  }
  if (options.decode_ctas_per_sm > kMaxCtasPerSm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunnerOptions::decode_ctas_per_sm ", options.decode_ctas_per_sm, " is above ",
        kMaxCtasPerSm, ", the most CTAs an SM holds; lower it (default 2)"));
  }
  // Checked by CheckLlamaModelOptions only where the model is sharded (world size > 1): a bad
  // value must not wait for the first tensor-parallel run to be refused.
  const PrefetchGemmRows& sharded = options.sharded_prefetch_gemm_rows;
  if (std::min({sharded.qkv, sharded.o, sharded.gate_up, sharded.down, sharded.lm_head}) < 0 ||
      std::max({sharded.qkv, sharded.o, sharded.gate_up, sharded.down, sharded.lm_head}) >
          kPrefetchGemmMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunnerOptions::sharded_prefetch_gemm_rows (qkv ", sharded.qkv, ", o ", sharded.o,
        ", gate_up ", sharded.gate_up, ", down ", sharded.down, ", lm_head ", sharded.lm_head,
        ") must lie in [0, ", kPrefetchGemmMaxRows, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Runner>> Runner::Create(const RunnerOptions& options) {
  std::unique_ptr<Runner> runner(new Runner());
  RETURN_IF_ERROR(runner->Init(options));
  return runner;
}

Runner::~Runner() {
  if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
  graphs_.reset();
  piece_graphs_.clear();
}

absl::Status Runner::Init(const RunnerOptions& options) {
  options_ = options;
  absl::Status status = InitPlan(options);
  if (tensor_parallel_size() == 1) {
    RETURN_IF_ERROR(status);
    return InitAllocations(options);
  }
  // Every rank takes the same path: a rank whose setup failed must not leave the others waiting
  // in the communicator's creation.
  HostBootstrap& bootstrap = *options.bootstrap;
  RETURN_IF_ERROR(AgreeOnStatus(bootstrap, status, "Runner setup", "runner.setup_plan"));
  ASSIGN_OR_RETURN(size_t free_bytes, FreeDeviceBytes());
  ASSIGN_OR_RETURN(comm_, AutoCommunicator::Create(bootstrap, options.device, options.allreduce));
  int64_t collective_bytes = 0;
  for (const char* term : {"custom_allreduce", "nccl"}) {
    if (const MemoryTerm* t = plan_.Find(term)) collective_bytes += t->bytes;
  }
  status = Record(&memory_, "collectives", collective_bytes, free_bytes);
  if (status.ok()) status = InitAllocations(options);
  return AgreeOnStatus(bootstrap, status, "Runner setup", "runner.setup_allocations");
}

config::PlannerConfig Runner::PlannerConfigFor(const RunnerOptions& options) {
  config::PlannerConfig config = options.config;
  config::GraphConfig* graph = config.mutable_graph();
  if (options.graphs == GraphExecution::kPiecewise) {
    graph->set_execution(config::GRAPH_EXECUTION_PIECEWISE);
  } else if (options.graphs == GraphExecution::kFull) {
    graph->set_execution(config::GRAPH_EXECUTION_FULL);
  }
  graph->set_capture_prefill(options.capture_prefill);
  // In GRAPH_MODE_PREFILL_ONLY the budgets are the capture sizes themselves (and the Runner
  // ignores prefill_sizes, as the planner refuses them there).
  if (!options.prefill_sizes.empty() && graph->mode() != config::GRAPH_MODE_PREFILL_ONLY) {
    graph->clear_prefill_sizes();
    for (int size : options.prefill_sizes) graph->add_prefill_sizes(size);
  }
  config.set_max_model_len(options.max_model_len);
  return config;
}

absl::Status Runner::InitPlan(const RunnerOptions& options) {
  RETURN_IF_ERROR(CheckRunnerOptions(options));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  ASSIGN_OR_RETURN(DeviceInfo device, DeviceInfo::Query(options.device));
  sm_count_ = device.sm_count;

  // The planner sizes memory for the GPU it is told about; by default, this one.
  config::PlannerConfig config = PlannerConfigFor(options);
  if (UsesDeviceGpu(config)) {
    config.clear_gpu_preset();
    config::GpuSpec gpu;
    gpu.set_name(device.name);
    gpu.set_total_bytes(device.total_memory_bytes);
    gpu.set_sm_count(device.sm_count);
    gpu.MergeFrom(options.config.gpu());
    *config.mutable_gpu() = gpu;
  }
  const int world = tensor_parallel_size();
  if (config.has_tensor_parallel_size() && config.tensor_parallel_size() != world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_parallel_size ", config.tensor_parallel_size(), " does not match the ", world,
        " rank(s) of RunnerOptions::bootstrap; start one process per rank and pass their "
        "bootstrap, or set tensor_parallel_size to ",
        world));
  }
  config.set_tensor_parallel_size(world);
  if (world > 1 && !config.calibration().has_custom_allreduce_buffer_bytes()) {
    // The planner's custom all-reduce term follows the buffer the communicator will allocate.
    config.mutable_calibration()->set_custom_allreduce_buffer_bytes(
        options.allreduce.buffer_bytes());
  }
  ASSIGN_OR_RETURN(plan_, PlanMemory(config));
  const config::PlannerConfig& resolved = plan_.config;
  ASSIGN_OR_RETURN(full_shape_, CheckRunnerModel(resolved, options.max_model_len));
  ASSIGN_OR_RETURN(const LlamaShape rank_shape, RankShape(full_shape_, world));
  // Checked before any device memory exists: a wrong file fails here (on every rank
  // alike under tensor parallelism, see Init).
  if (!options.weight_files.empty()) RETURN_IF_ERROR(OpenWeightFiles(options));

  max_blocks_per_seq_ =
      SequenceTable::MaxBlocksPerSeq(resolved.block_size(), options.max_model_len);

  // Step keys, and one attention planner and metadata layout per key, built (or refused)
  // before any device memory exists.
  ASSIGN_OR_RETURN(StepSetup setup, BuildStepSetup(resolved, options, rank_shape, sm_count_,
                                                   max_blocks_per_seq_));
  // The table's free list holds up to 2^30 blocks: built once the setup is known good.
  int64_t num_blocks = plan_.num_kv_blocks;
  if (options.max_kv_blocks > 0) num_blocks = std::min(num_blocks, options.max_kv_blocks);
  if (num_blocks > int64_t{1} << 30) num_blocks = int64_t{1} << 30;
  table_ = SequenceTable(static_cast<int>(num_blocks), resolved.block_size(),
                         options.max_model_len);
  decode_sizes_ = std::move(setup.decode_sizes);
  prefill_sizes_ = std::move(setup.prefill_sizes);
  keys_ = std::move(setup.keys);
  planners_ = std::move(setup.planners);
  layouts_ = std::move(setup.layouts);
  const config::GraphMode graph_mode = resolved.graph().mode();
  const bool graphs_on = options.graphs != GraphExecution::kNone;
  capture_decode_ = graphs_on && graph_mode == config::GRAPH_MODE_DECODE;
  capture_prefill_ = graphs_on && (graph_mode == config::GRAPH_MODE_PREFILL_ONLY ||
                                   (graph_mode == config::GRAPH_MODE_DECODE &&
                                    options.capture_prefill));
  // What the model would refuse once the weights are on the GPU, checked before they are.
  return CheckLlamaModelOptions(rank_shape, ModelOptions(options));
}

absl::Status Runner::OpenWeightFiles(const RunnerOptions& options) {
  if (options.weight_load_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("RunnerOptions::weight_load_threads is ",
                                                   options.weight_load_threads,
                                                   "; read the weight files with at least 1 thread"));
  }
  // Each rank reads its own shard: its heads' QKV rows, its O and down columns, its gate-up rows.
  // The files are checked here, before any device memory is allocated; LoadWeights reads them.
  absl::StatusOr<LlamaShardReader> reader = LlamaShardReader::Open(
      options.weight_files, full_shape_, tensor_parallel_size(), rank());
  if (!reader.ok()) return WeightFilesError(reader.status());
  weight_reader_.emplace(*std::move(reader));
  return absl::OkStatus();
}

absl::Status Runner::WeightFilesError(const absl::Status& status) const {
  return absl::Status(status.code(), absl::StrCat("RunnerOptions::weight_files (",
                                                  Quoted(plan_.config.model().name()),
                                                  " shape): ", status.message()));
}

absl::StatusOr<LlamaDeviceWeights> Runner::LoadWeights(const RunnerOptions& options,
                                                       cudaStream_t stream) {
  // Progress on the capture's stream: a line at each quarter of the bytes, then a summary.
  const bool report = options.progress != CaptureProgress::kQuiet && rank() == 0;
  const bool quarters = report && options.progress != CaptureProgress::kNone;
  std::ostream& out = options.progress_stream ? *options.progress_stream : std::cerr;
  const absl::Time start = absl::Now();
  int next_quarter = 1;
  auto progress = [&](int64_t done, int64_t total) {
    for (; quarters && next_quarter < 4 && done * 4 >= total * next_quarter; ++next_quarter) {
      out << absl::StrFormat("weights: %d%% of %.2f GiB loaded\n", 25 * next_quarter,
                             total / 1073741824.0);
    }
  };
  absl::StatusOr<LlamaDeviceWeights> weights =
      LlamaDeviceWeights::Load(*weight_reader_, stream, progress,
                               WeightLoadOptions{options.weight_load_threads});
  if (!weights.ok()) return WeightFilesError(weights.status());
  if (report) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const double bytes = static_cast<double>(weight_reader_->bytes());
    const int world = tensor_parallel_size();
    const std::set<std::string>& converted = weight_reader_->converted_dtypes();
    out << absl::StrFormat(
        "weights: %d file(s), %.2f GiB%s%s read and copied to the GPU in %.2f s (%.2f GB/s)\n",
        options.weight_files.size(), bytes / 1073741824.0,
        world > 1 ? absl::StrFormat(" (rank 0's shard of %d)", world) : "",
        converted.empty() ? ""
                          : absl::StrCat(", ", absl::StrJoin(converted, " and "),
                                         " values rounded to bf16"),
        seconds, seconds > 0 ? bytes / seconds / 1e9 : 0.0);
  }
  weight_reader_.reset();
  return weights;
}

LlamaModelOptions Runner::ModelOptions(const RunnerOptions& options) const {
  const int world = tensor_parallel_size();
  LlamaModelOptions model_options;
  model_options.num_kv_blocks = table_.num_blocks();
  model_options.block_size = plan_.config.block_size();
  model_options.skinny_gemm_max_rows = options.skinny_gemm_max_rows;
  model_options.prefetch_gemm_rows =
      world > 1 ? options.sharded_prefetch_gemm_rows : options.prefetch_gemm_rows;
  model_options.prefetch_gemm_ctas_per_sm = options.prefetch_gemm_ctas_per_sm;
  model_options.prefetch_gemm_silu = options.prefetch_gemm_silu;
  model_options.fold_norm_into_gemm = options.fold_norm_into_gemm;
  model_options.tma_gemm_rows = options.tma_gemm_rows;
  model_options.tma_gemm_ctas_per_sm = options.tma_gemm_ctas_per_sm;
  model_options.tma_gemm_max_splits = options.tma_gemm_max_splits;
  model_options.tma_qkv_next_after_wait = options.tma_qkv_next_after_wait;
  model_options.prefetch_gate_up_silu = options.prefetch_gate_up_silu;
  model_options.prefetch_row_halves = options.prefetch_row_halves;
  model_options.tma_gate_up_silu = options.tma_gate_up_silu;
  model_options.layer_kernel_rows = options.layer_kernel_rows;
  model_options.decode_gemm_rows = options.decode_gemm_rows;
  model_options.silu_in_down = options.silu_in_down;
  model_options.fuse_rope_append = options.fuse_rope_append;
  model_options.rope_in_attention_rows = options.rope_in_attention_rows;
  model_options.rope_in_attention_min_rows = options.rope_in_attention_min_rows;
  model_options.run_attention = !options.skip_attention;
  model_options.run_rope_append = !options.skip_rope_append;
  model_options.run_norms = !options.skip_norms;
  model_options.run_silu_mul = !options.skip_silu_mul;
  model_options.communicator = options.skip_allreduce ? nullptr : comm_.get();
  model_options.fuse_allreduce_norm = options.fuse_allreduce_norm;
  return model_options;
}

absl::Status Runner::InitAllocations(const RunnerOptions& options) {
  const config::PlannerConfig& resolved = plan_.config;
  const int world = tensor_parallel_size();
  ASSIGN_OR_RETURN(LlamaShape shape, RankShape(full_shape_, world));
  const StepLimits limits{resolved.max_num_seqs(), resolved.max_num_batched_tokens()};

  ASSIGN_OR_RETURN(stream_, Stream::Create());
  cudaStream_t stream = stream_.get();

  // Allocations, each measured. With tensor parallelism the weights are this rank's shard of
  // the same model (the files', or the seeded one), so every tensor-parallel size runs the same
  // logical model.
  ASSIGN_OR_RETURN(size_t free_bytes, FreeDeviceBytes());
  absl::StatusOr<LlamaDeviceWeights> uploaded =
      weight_reader_.has_value()
          ? LoadWeights(options, stream)
          : world > 1 ? LlamaDeviceWeights::RandomShard(full_shape_, world, rank(),
                                                        options.weight_seed, stream)
                      : LlamaDeviceWeights::Random(shape, options.weight_seed, stream);
  if (!uploaded.ok()) return uploaded.status();
  LlamaDeviceWeights weights = *std::move(uploaded);
  RETURN_IF_ERROR(stream_.Synchronize());
  const int64_t weight_bytes = static_cast<int64_t>(weights.bytes());
  RETURN_IF_ERROR(Record(&memory_, "weights", weight_bytes, free_bytes));

  ASSIGN_OR_RETURN(free_bytes, FreeDeviceBytes());
  ASSIGN_OR_RETURN(std::unique_ptr<Gemm> gemm, Gemm::Create());
  RETURN_IF_ERROR(Record(&memory_, "cublaslt_workspace",
                         static_cast<int64_t>(gemm->workspace_bytes()), free_bytes));

  ASSIGN_OR_RETURN(free_bytes, FreeDeviceBytes());
  const LlamaModelOptions model_options = ModelOptions(options);
  ASSIGN_OR_RETURN(model_, LlamaModel::Create(std::move(weights), model_options, std::move(gemm)));
  RETURN_IF_ERROR(Record(&memory_, "kv_cache", static_cast<int64_t>(model_->kv_cache_bytes()),
                         free_bytes));

  // One pinned blob and one device copy shared by all keys (steps run one at a time), and one
  // partial workspace per plan part, each as large as the largest key's (InitPlan's planners
  // and layouts).
  size_t metadata_bytes = 0, decode_o = 0, decode_lse = 0, prefill_o = 0, prefill_lse = 0;
  size_t decode_counters = 0, prefill_counters = 0;
  for (size_t i = 0; i < planners_.size(); ++i) {
    const PlanLayout& layout = planners_[i].layout();
    metadata_bytes = std::max(metadata_bytes, layouts_[i].bytes);
    decode_o = std::max(decode_o, layout.decode.partial_o_bytes);
    decode_lse = std::max(decode_lse, layout.decode.partial_lse_bytes);
    prefill_o = std::max(prefill_o, layout.prefill.partial_o_bytes);
    prefill_lse = std::max(prefill_lse, layout.prefill.partial_lse_bytes);
    decode_counters = std::max(decode_counters, layout.decode.merge_counter_bytes);
    prefill_counters = std::max(prefill_counters, layout.prefill.merge_counter_bytes);
  }
  ASSIGN_OR_RETURN(free_bytes, FreeDeviceBytes());
  ASSIGN_OR_RETURN(metadata_host_, PinnedHostBuffer::Allocate(metadata_bytes, "step metadata"));
  std::memset(metadata_host_.data(), 0, metadata_bytes);
  ASSIGN_OR_RETURN(metadata_device_, DeviceBuffer::Allocate(metadata_bytes, "step metadata"));
  RETURN_IF_ERROR(Record(&memory_, "step_metadata", static_cast<int64_t>(metadata_bytes),
                         free_bytes));

  ASSIGN_OR_RETURN(free_bytes, FreeDeviceBytes());
  RETURN_IF_ERROR(AllocateIfNeeded(decode_o, "decode partial_o", &decode_partial_o_));
  RETURN_IF_ERROR(AllocateIfNeeded(decode_lse, "decode partial_lse", &decode_partial_lse_));
  RETURN_IF_ERROR(AllocateIfNeeded(prefill_o, "prefill partial_o", &prefill_partial_o_));
  RETURN_IF_ERROR(AllocateIfNeeded(prefill_lse, "prefill partial_lse", &prefill_partial_lse_));
  if (!options.fused_attention_merge) decode_counters = prefill_counters = 0;
  RETURN_IF_ERROR(
      AllocateIfNeeded(decode_counters, "decode merge counters", &decode_merge_counters_));
  RETURN_IF_ERROR(
      AllocateIfNeeded(prefill_counters, "prefill merge counters", &prefill_merge_counters_));
  for (DeviceBuffer* counters : {&decode_merge_counters_, &prefill_merge_counters_}) {
    if (counters->size() > 0) {
      RETURN_IF_ERROR(FillDeviceAndWait(counters->data(), 0, counters->size(), counters->name()));
    }
  }
  RETURN_IF_ERROR(Record(&memory_, "attention_workspace",
                         static_cast<int64_t>(decode_o + decode_lse + prefill_o + prefill_lse +
                                              decode_counters + prefill_counters),
                         free_bytes));

  // The eager arena holds the largest step (the eager key); piecewise graphs use it too.
  const StepKey& eager = keys_.key(keys_.eager_index());
  const size_t arena_bytes = LlamaModel::ActivationBytes(shape, eager.max_tokens, eager.max_rows);
  ASSIGN_OR_RETURN(free_bytes, FreeDeviceBytes());
  ASSIGN_OR_RETURN(arena_, DeviceBuffer::Allocate(arena_bytes, "activation arena"));
  RETURN_IF_ERROR(Record(&memory_, "activation_arena", static_cast<int64_t>(arena_bytes),
                         free_bytes));

  // The graph pool: the largest captured key's activations (graphs replay one at a time).
  if (options.graphs == GraphExecution::kFull && (capture_decode_ || capture_prefill_)) {
    size_t pool_bytes = 0;
    for (const auto& [mode, sizes] : CapturedSizeLists()) {
      for (int size : sizes->sizes()) {
        const StepKey& key = keys_.key(keys_.Find({mode, size}));
        pool_bytes = std::max(pool_bytes,
                              LlamaModel::ActivationBytes(shape, key.max_tokens, key.max_rows));
      }
    }
    ASSIGN_OR_RETURN(free_bytes, FreeDeviceBytes());
    ASSIGN_OR_RETURN(GraphMemoryPool pool, GraphMemoryPool::Create(pool_bytes));
    pool_.emplace(std::move(pool));
    RETURN_IF_ERROR(Record(&memory_, "graph_pool", static_cast<int64_t>(pool_bytes), free_bytes));
  }

  ASSIGN_OR_RETURN(free_bytes, FreeDeviceBytes());
  const size_t logits_bytes =
      static_cast<size_t>(limits.max_num_seqs) * shape.vocab * sizeof(float);
  ASSIGN_OR_RETURN(logits_, DeviceBuffer::Allocate(logits_bytes, "logits"));
  ASSIGN_OR_RETURN(next_tokens_, DeviceBuffer::Allocate(
                                     sizeof(int32_t) * limits.max_num_seqs, "next tokens"));
  RETURN_IF_ERROR(Record(&memory_, "logits",
                         static_cast<int64_t>(logits_bytes + next_tokens_.size()), free_bytes));
  ASSIGN_OR_RETURN(next_tokens_host_, PinnedHostBuffer::Allocate(next_tokens_.size(),
                                                                 "next tokens (pinned)"));

  if (options.time_steps) {
    ASSIGN_OR_RETURN(step_start_, Event::Create(Event::kTiming));
    ASSIGN_OR_RETURN(step_stop_, Event::Create(Event::kTiming));
  }
  RETURN_IF_ERROR(buffers_.Bind("step metadata", metadata_device_.data(), metadata_device_.size(),
                                BufferRole::kInput));
  RETURN_IF_ERROR(buffers_.Bind("kv cache", model_->kv_cache_data(), model_->kv_cache_bytes(),
                                BufferRole::kInput));
  RETURN_IF_ERROR(buffers_.Bind("logits", logits_.data(), logits_.size(), BufferRole::kOutput));
  RETURN_IF_ERROR(buffers_.Bind("next tokens", next_tokens_.data(), next_tokens_.size(),
                                BufferRole::kOutput));
  if (options.graphs == GraphExecution::kPiecewise) {
    RETURN_IF_ERROR(
        buffers_.Bind("activation arena", arena_.data(), arena_.size(), BufferRole::kInput));
  }
  return absl::OkStatus();
}

std::vector<std::pair<GraphMode, const CaptureSizes*>> Runner::CapturedSizeLists() const {
  std::vector<std::pair<GraphMode, const CaptureSizes*>> lists;
  if (capture_decode_) lists.push_back({GraphMode::kDecode, &*decode_sizes_});
  if (capture_prefill_) lists.push_back({GraphMode::kPrefill, &*prefill_sizes_});
  return lists;
}

LlamaStepArgs Runner::Args(int key_index, const StepRoute& route, void* activations) const {
  const MetadataLayout& l = layouts_[key_index];
  const PlanLayout& plan = planners_[key_index].layout();
  const char* base = static_cast<const char*>(metadata_device_.data());
  LlamaStepArgs args;
  args.num_tokens = route.num_tokens;
  args.num_rows = route.num_rows;
  args.token_ids = reinterpret_cast<const int32_t*>(base + l.token_ids);
  args.positions = reinterpret_cast<const int32_t*>(base + l.positions);
  args.last_token_rows = reinterpret_cast<const int32_t*>(base + l.last_token_rows);
  args.block_table = reinterpret_cast<const int32_t*>(base + l.block_table);
  args.max_blocks_per_seq = l.max_blocks_per_seq;
  args.decode = PlanPartDeviceView(plan, plan.decode, base + l.plan, decode_partial_o_,
                                   decode_partial_lse_, decode_merge_counters_);
  args.prefill = PlanPartDeviceView(plan, plan.prefill, base + l.plan, prefill_partial_o_,
                                    prefill_partial_lse_, prefill_merge_counters_);
  args.activations = activations;
  args.logits = logits_.as<float>();
  args.next_tokens = next_tokens_.as<int32_t>();
  args.next_tokens_mirror = next_tokens_host_.as<int32_t>();
  return args;
}

absl::Status Runner::FillEmptyStep(int key_index) {
  // The host blob is shared by every key: wait until earlier fetches from it have run.
  RETURN_IF_ERROR(stream_.Synchronize());
  const StepKey& key = keys_.key(key_index);
  const MetadataLayout& layout = layouts_[key_index];
  char* host = metadata_host_.as<char>();
  const StepRoute route{key_index, key.max_tokens, key.max_rows};
  RETURN_IF_ERROR(FillStepInputs(layout, route, {}, {}, {}, table_.block_size(), host));
  return planners_[key_index].Plan({}, host + layout.plan).status();
}

absl::Status Runner::FetchMetadata(int key_index, cudaStream_t stream) const {
  const cudaError_t launched = LaunchFetchStepMetadata(
      metadata_host_.data(), metadata_device_.data(), layouts_[key_index].Fetch(), stream);
  // The key's name only on failure: an eager step makes no string.
  if (launched == cudaSuccess) return absl::OkStatus();
  return ToStatus(launched,
                  absl::StrCat("The metadata fetch of ", KeyName(keys_.key(key_index).key)));
}

absl::StatusOr<RunnerCaptureSummary> Runner::Capture() {
  RunnerCaptureSummary summary;
  if (options_.graphs == GraphExecution::kNone || (!capture_decode_ && !capture_prefill_)) {
    return summary;
  }
  ASSIGN_OR_RETURN(size_t free_before, FreeDeviceBytes());
  const auto start = std::chrono::steady_clock::now();
  graphs_registered_ = false;
  if (options_.graphs == GraphExecution::kFull) {
    RETURN_IF_ERROR(CaptureFull(&summary));
  } else {
    RETURN_IF_ERROR(CapturePiecewise(&summary));
  }
  if (comm_ == nullptr || options_.register_graph_buffers) RETURN_IF_ERROR(RegisterGraphBuffers());
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSIGN_OR_RETURN(size_t free_after, FreeDeviceBytes());
  summary.device_bytes = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
  if (capture_decode_) summary.num_decode_sizes = static_cast<int>(decode_sizes_->sizes().size());
  if (capture_prefill_) {
    summary.num_prefill_sizes = static_cast<int>(prefill_sizes_->sizes().size());
  }
  summary.pool_bytes = pool_ ? pool_->high_water_bytes() : 0;
  if (options_.progress != CaptureProgress::kQuiet && rank() == 0) {
    std::ostream& out = options_.progress_stream ? *options_.progress_stream : std::cerr;
    out << summary.ToString() << "\n";
  }
  return summary;
}

absl::Status Runner::RegisterGraphBuffers() {
  if (comm_ != nullptr) RETURN_IF_ERROR(comm_->RegisterGraphBuffers());
  graphs_registered_ = true;
  return absl::OkStatus();
}

absl::Status Runner::RunCaptureHook(CaptureKey key) const {
  if (!options_.capture_step_hook_for_testing) return absl::OkStatus();
  return options_.capture_step_hook_for_testing(key);
}

absl::StatusOr<int> Runner::CaptureEachSize(GraphSet& set, absl::string_view scope, GraphMode mode,
                                            const CaptureSizes& sizes, const KeyedStepFn& fn) {
  if (comm_ == nullptr) {
    absl::StatusOr<CaptureSummary> s = set.CaptureAll(mode, sizes, fn, stream_.get(), &buffers_);
    if (s.ok()) return s->num_graphs;
    if (scope == "full") return s.status();
    // Every piece captures the same keys: the message says which piece's capture failed.
    return absl::Status(s.status().code(), absl::StrCat(scope, ": ", s.status().message()));
  }
  // Lock-step: every rank starts each size together (the warm-ups and the capture make
  // collective calls), and learns after it whether every rank captured it.
  HostBootstrap& bootstrap = *options_.bootstrap;
  int captured = 0;
  for (int size : sizes.LargestFirst()) {  // the largest sets the pool's high-water mark
    const CaptureKey key{mode, size};
    // Named by the scope and the key ("runner.capture_size.piece/3.decode/8"), so that ranks
    // whose graph sets, modes or sizes differ fail at the first call whose names differ: at the
    // first size where their lists differ or, where one rank's list is a prefix of another's, at
    // that rank's next call after this loop, which meets the other's next size (a next call
    // that sends no frame, an unnamed Broadcast, or none leaves the others to wait out their
    // timeout).
    const std::string name = absl::StrCat(scope, ".", KeyName(key));
    RETURN_IF_ERROR(bootstrap.Barrier(absl::StrCat("runner.capture_size.", name)));
    const absl::Status status = set.Capture(
        key, [&fn, key](cudaStream_t stream) { return fn(key, stream); }, stream_.get(),
        &buffers_);
    const absl::Status agreed =
        AgreeOnStatus(bootstrap, status,
                      absl::StrCat("Capture of ", KeyName(key),
                                   scope == "full" ? "" : absl::StrCat(" in ", scope)),
                      absl::StrCat("runner.capture_agreement.", name));
    if (!agreed.ok()) {
      // A rank whose own capture of the key succeeded drops it too: every rank then runs the key
      // eagerly, where one rank replaying it beside another's eager step would pair unlike
      // collectives.
      set.Erase(key);
      return agreed;
    }
    ++captured;
  }
  return captured;
}

absl::Status Runner::CaptureFull(RunnerCaptureSummary* summary) {
  GraphSetOptions graph_options;
  graph_options.progress = options_.progress;
  graph_options.progress_stream = options_.progress_stream;
  graphs_ = std::make_unique<GraphSet>(&*pool_, graph_options);
  KeyedStepFn step = [this](CaptureKey key, cudaStream_t stream) -> absl::Status {
    const int index = keys_.Find(key);
    if (index < 0) return absl::InternalError(absl::StrCat("No step key ", KeyName(key)));
    const StepKey& k = keys_.key(index);
    RETURN_IF_ERROR(RunCaptureHook(key));
    if (CaptureContext::Phase() == CapturePhase::kWarmup) RETURN_IF_ERROR(FillEmptyStep(index));
    ASSIGN_OR_RETURN(void* activations,
                     pool_->Allocate(LlamaModel::ActivationBytes(shape(), k.max_tokens, k.max_rows),
                                     "activations"));
    RETURN_IF_ERROR(FetchMetadata(index, stream));
    return model_->Forward(Args(index, StepRoute{index, k.max_tokens, k.max_rows}, activations),
                           stream);
  };
  for (const auto& [mode, sizes] : CapturedSizeLists()) {
    ASSIGN_OR_RETURN(int n, CaptureEachSize(*graphs_, "full", mode, *sizes, step));
    summary->num_graphs += n;
  }
  for (const GraphStats& stats : graphs_->AllStats()) summary->num_nodes += stats.num_nodes;
  return absl::OkStatus();
}

absl::Status Runner::CapturePiecewise(RunnerCaptureSummary* summary) {
  piece_graphs_.clear();
  piece_lookup_.reserve(static_cast<size_t>(model_->num_pieces()));  // no growth in a step
  GraphSetOptions graph_options;
  graph_options.progress = CaptureProgress::kQuiet;
  for (int piece = 0; piece < model_->num_pieces(); ++piece) {
    piece_graphs_.push_back(std::make_unique<GraphSet>(nullptr, graph_options));
    KeyedStepFn step = [this, piece](CaptureKey key, cudaStream_t stream) -> absl::Status {
      const int index = keys_.Find(key);
      if (index < 0) return absl::InternalError(absl::StrCat("No step key ", KeyName(key)));
      const StepKey& k = keys_.key(index);
      RETURN_IF_ERROR(RunCaptureHook(key));
      if (CaptureContext::Phase() == CapturePhase::kWarmup) RETURN_IF_ERROR(FillEmptyStep(index));
      if (piece == 0) RETURN_IF_ERROR(FetchMetadata(index, stream));
      return model_->RunPiece(
          piece, Args(index, StepRoute{index, k.max_tokens, k.max_rows}, arena_.data()), stream);
    };
    for (const auto& [mode, sizes] : CapturedSizeLists()) {
      ASSIGN_OR_RETURN(int n, CaptureEachSize(*piece_graphs_.back(), absl::StrCat("piece/", piece),
                                              mode, *sizes, step));
      summary->num_graphs += n;
    }
    for (const GraphStats& stats : piece_graphs_.back()->AllStats()) {
      summary->num_nodes += stats.num_nodes;
    }
  }
  return absl::OkStatus();
}

absl::Status Runner::RunEager(int key_index, const StepRoute& route) {
  RETURN_IF_ERROR(FetchMetadata(key_index, stream_.get()));
  return model_->Forward(Args(key_index, route, arena_.data()), stream_.get());
}

absl::Span<const GraphSet::Graph* const> Runner::FindPieceGraphs(CaptureKey key) {
  // No storage is allocated per step: piece_lookup_ keeps its capacity between steps.
  piece_lookup_.clear();
  // A capture that failed before the last piece's set was made leaves fewer sets than pieces.
  if (piece_graphs_.size() != static_cast<size_t>(model_->num_pieces())) return {};
  for (const std::unique_ptr<GraphSet>& set : piece_graphs_) {
    const GraphSet::Graph* graph = set->Find(key);
    if (graph == nullptr) {
      piece_lookup_.clear();
      return {};
    }
    piece_lookup_.push_back(graph);
  }
  return piece_lookup_;
}

absl::Status Runner::RunPiecewise(int key_index, const StepRoute& route,
                                  absl::Span<const GraphSet::Graph* const> graphs) {
  // Checked before the first piece is replayed; each layer's attention then checks its layer only.
  ASSIGN_OR_RETURN(const CheckedLlamaStepArgs args,
                   CheckedLlamaStepArgs::Check(Args(key_index, route, arena_.data())));
  for (int piece = 0; piece < model_->num_pieces(); ++piece) {
    RETURN_IF_ERROR(piece_graphs_[piece]->Replay(*graphs[piece], stream_.get()));
    if (piece < shape().layers && !options_.skip_attention) {
      RETURN_IF_ERROR(model_->RunAttention(piece, args, stream_.get()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Runner::Step(absl::Span<const SequenceTokens> batch,
                                                  const StepOptions& step_options) {
  // Before the int casts below (a longer list would wrap) and before any sequence takes blocks.
  RETURN_IF_ERROR(CheckStepTokens(batch, shape().vocab, keys_.limits().max_num_batched_tokens));
  // Sized, then written by index: cheaper than a push_back per sequence, whose capacity check
  // costs as much as the write.
  std::vector<SequenceTable::Entry>& entries = step_entries_;
  entries.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    entries[i] = {batch[i].id, static_cast<int>(batch[i].tokens.size())};
  }

  // Reserve checks each entry (an id twice, no tokens, a sequence past max_model_len) and hands
  // the step's lengths to `admit` before any sequence takes a block. The route, and with it
  // whether the step replays, follows from them: every refusal that depends on it is made
  // there, so a refused step changes no sequence. The graphs are looked up once, there too: the
  // full step's graph, or each piece's, which the step then replays.
  StepRoute route;
  bool replay = false;
  const GraphSet::Graph* full_graph = nullptr;
  absl::Span<const GraphSet::Graph* const> piece_graphs;
  auto admit = [&](absl::Span<const SeqLens> lens) -> absl::Status {
    RETURN_IF_ERROR(keys_.Check(lens));
    route = keys_.Route(lens);
    const StepKey& key = keys_.key(route.key_index);
    if (!key.eager_only && !step_options.force_eager) {
      if (options_.graphs == GraphExecution::kFull && graphs_ != nullptr) {
        full_graph = graphs_->Find(key.key);
        replay = full_graph != nullptr;
      } else if (options_.graphs == GraphExecution::kPiecewise) {
        piece_graphs = FindPieceGraphs(key.key);
        replay = !piece_graphs.empty();
      }
    }
    // After a peer was lost the communicator may be aborted: a replay would launch NCCL kernels
    // of a destroyed communicator. Report the lost peer again instead.
    RETURN_IF_ERROR(peer_lost_);
    if (replay && comm_ != nullptr) {
      // The graphs' all-reduces read peers' buffers only once every rank registered them.
      if (!graphs_registered_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Step ", KeyName(key.key), " would replay graphs whose all-reduce buffers are not "
            "registered; call Runner::RegisterGraphBuffers() on every rank after Capture()"));
      }
      RETURN_IF_ERROR(comm_->CheckReplayable());
    }
    return absl::OkStatus();
  };
  // Reserve hands back each sequence's blocks too: no second lookup by id.
  RETURN_IF_ERROR(table_.Reserve(entries, admit, &step_lens_, &step_blocks_));
  const std::vector<SeqLens>& lens = step_lens_;
  const StepKey& key = keys_.key(route.key_index);
  const MetadataLayout& layout = layouts_[route.key_index];

  step_tokens_.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) step_tokens_[i] = batch[i].tokens;
  char* host = metadata_host_.as<char>();
  // The ids need no second look: CheckStepTokens refused tokens outside the vocabulary, and the
  // table hands out only blocks in [0, num_blocks).
  RETURN_IF_ERROR(FillStepInputs(layout, route, lens, step_tokens_, step_blocks_,
                                 table_.block_size(), host, StepIds::kCheckedByCaller));
  RETURN_IF_ERROR(planners_[route.key_index].Plan(lens, host + layout.plan).status());
  const int num_seqs = static_cast<int>(batch.size());
  // The step's first kernel fetches the metadata (FetchMetadata, inside the graphs too), and the
  // sampling kernel writes the tokens into next_tokens_host_ as well: no copies of their own.
  if (options_.time_steps) RETURN_IF_ERROR(step_start_.Record(stream_.get()));
  if (replay && options_.graphs == GraphExecution::kFull) {
    RETURN_IF_ERROR(graphs_->Replay(*full_graph, stream_.get()));
  } else if (replay) {
    RETURN_IF_ERROR(RunPiecewise(route.key_index, route, piece_graphs));
  } else {
    RETURN_IF_ERROR(RunEager(route.key_index, route));
  }
  if (options_.time_steps) RETURN_IF_ERROR(step_stop_.Record(stream_.get()));
  if (comm_ != nullptr) {
    // A peer that died or hangs: the custom all-reduce gives up waiting at its barriers, and
    // NCCL is aborted after the same time (DeadlineExceeded either way).
    absl::Status synced = comm_->SynchronizeStream(
        stream_.get(), absl::Milliseconds(options_.allreduce.barrier_timeout_ms()));
    if (absl::IsDeadlineExceeded(synced)) peer_lost_ = synced;
    RETURN_IF_ERROR(synced);
  } else {
    RETURN_IF_ERROR(stream_.Synchronize());
  }
  last_.device_ms = 0;
  if (options_.time_steps) {
    ASSIGN_OR_RETURN(last_.device_ms, Event::ElapsedMs(step_start_, step_stop_));
  }

  if (step_options.commit) RETURN_IF_ERROR(table_.Commit(entries));
  last_.key = key.key;
  last_.eager_key = key.eager_only;
  last_.replayed = replay;
  last_.num_seqs = num_seqs;
  last_.num_tokens = 0;
  for (const SeqLens& s : lens) last_.num_tokens += s.q_len;
  last_.padded_tokens = route.num_tokens;
  last_.padded_rows = route.num_rows;
  const int32_t* next = next_tokens_host_.as<int32_t>();
  return std::vector<int32_t>(next, next + num_seqs);
}

absl::Status Runner::Release(int64_t id) { return table_.Release(id); }

absl::StatusOr<std::vector<float>> Runner::LastLogits(int num_seqs) {
  if (num_seqs < 0 || num_seqs > last_.num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("LastLogits asks for ", num_seqs,
                                                   " sequences; the last step had ",
                                                   last_.num_seqs));
  }
  std::vector<float> logits(static_cast<size_t>(num_seqs) * shape().vocab);
  if (logits.empty()) return logits;
  RETURN_IF_ERROR(stream_.Synchronize());
  RETURN_IF_ERROR(CopyDeviceToHost(logits.data(), logits_.data(), logits.size() * sizeof(float),
                                   stream_.get()));
  RETURN_IF_ERROR(stream_.Synchronize());
  return logits;
}

absl::Status Runner::PoisonOutputs() {
  RETURN_IF_ERROR(stream_.Synchronize());  // no kernel still writes the host copy of the tokens
  std::memset(next_tokens_host_.data(), 0xFF, next_tokens_host_.size());
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(logits_.data(), 0xFF, logits_.size(), stream_.get()));
  CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(next_tokens_.data(), 0xFF, next_tokens_.size(), stream_.get()));
  return absl::OkStatus();
}

absl::Status Runner::SetContextForBenchmark(int64_t id, int length) {
  const SequenceTable::Entry entry{id, length};
  RETURN_IF_ERROR(table_.Reserve({&entry, 1}).status());
  return table_.Commit({&entry, 1});
}

}  // namespace kiln
