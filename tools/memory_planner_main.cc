// memory_planner: sizes the KV cache of a model on a GPU before any graph memory exists, and
// explains every byte of the budget.
//
//   bazel run //tools:memory_planner                                   # Llama-3.1-8B on an H100
//   bazel run //tools:memory_planner -- --preset=llama-3.1-70b --gpu=h200 --tensor_parallel_size=4
//   bazel run //tools:memory_planner -- --config=$PWD/serve.json --format=json --svg=$PWD/plan.svg
//   bazel run //tools:memory_planner -- --model_dir=/models/Llama-3.2-1B --gpu=l40s
//   bazel run -c opt //tools:memory_planner -- --preset=llama-3.2-1b --measure   # on a GPU
//
// Exit codes: 0 with the plan on stdout; 2 with a message and its fix on stderr for any bad
// input (a flag, a config file, a model that leaves no KV block); never a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/config/config_loader.h"
#include "runtime/config/hf_model.h"
#include "runtime/config/presets.h"
#include "runtime/config/quoted.h"
#include "runtime/cuda/device_info.h"
#include "runtime/memory/memory_planner.h"
#include "tools/cli_flags.h"
#include "tools/memory_planner_measure.h"
#include "tools/memory_planner_output.h"

// What to plan for (later sources override earlier ones): the built-in default, --config,
// --preset (or --model_dir) and --gpu, then the single-field flags below.
ABSL_FLAG(std::string, config, "",
          "PlannerConfig file: a textproto, or JSON (which also accepts FastDeploy's "
          "graph_optimization_config keys); fields it sets override the built-in default");
ABSL_FLAG(std::string, preset, "",
          "Model preset: llama-3.2-1b, llama-3.2-3b, llama-3.1-8b (default), llama-3.1-70b, "
          "mistral-7b-v0.3, qwen2.5-7b, qwen3-8b, qwen3-4b; replaces the model");
ABSL_FLAG(std::string, model_dir, "",
          "Hugging Face model directory: the model's shape from its config.json (the weights "
          "need not be there yet); replaces the model, as --preset does");
ABSL_FLAG(std::string, gpu, "",
          "GPU preset: h100-80gb (default), h200-141gb, a100-80gb, l40s-48gb (or h100, h200, "
          "a100, l40s), or auto to read GPU 0 of this machine");

// Output.
ABSL_FLAG(std::string, format, "table", "Output on stdout: table, json or textproto");
ABSL_FLAG(int64_t, context, 8192, "Tokens per sequence for the maximum-concurrency line");
ABSL_FLAG(std::string, svg, "", "Also write the budget as an SVG stacked bar to this file");
ABSL_FLAG(bool, measure, false,
          "Build the runner on GPU 0 (random weights, real KV cache, every planned graph captured) "
          "and print measured beside predicted for each term, with the calibration it implies");

// Serving limits, graphs, KV cache, parallelism.
ABSL_FLAG(std::optional<double>, gpu_memory_utilization, std::nullopt,
          "Fraction of the GPU's memory kiln may use, in (0, 1] (default 0.9)");
ABSL_FLAG(std::optional<int>, max_num_seqs, std::nullopt,
          "Most sequences in one step (default 256)");
ABSL_FLAG(std::optional<int>, max_num_batched_tokens, std::nullopt,
          "Most tokens in one step (default 8192)");
ABSL_FLAG(std::optional<std::string>, graph_mode, std::nullopt,
          "CUDA graphs: decode, prefill_only or none (default decode)");
ABSL_FLAG(std::optional<std::string>, capture_sizes, std::nullopt,
          "Comma-separated sizes to capture (e.g. 1,2,4,8), or 'default'");
ABSL_FLAG(std::optional<int>, max_capture_size, std::nullopt,
          "Largest size that gets a graph; larger listed sizes are dropped");
ABSL_FLAG(std::optional<std::string>, graph_execution, std::nullopt,
          "full (one graph per size, attention inside) or piecewise (layers + 1 graphs per size, "
          "attention eager between them) (default full)");
ABSL_FLAG(std::optional<bool>, capture_prefill, std::nullopt,
          "With --graph_mode=decode, also capture the prefill token budgets (default true)");
ABSL_FLAG(std::optional<std::string>, prefill_sizes, std::nullopt,
          "With --graph_mode=decode: comma-separated prefill token budgets (e.g. 64,256,512), or "
          "'default'");
ABSL_FLAG(std::optional<int>, max_model_len, std::nullopt,
          "Longest sequence in tokens, prompt and output (default 4096)");
ABSL_FLAG(std::optional<std::string>, kv_cache_dtype, std::nullopt,
          "KV cache element type: bf16, fp16, fp32, fp8 (default: the model's dtype)");
ABSL_FLAG(std::optional<int>, block_size, std::nullopt, "Tokens per KV block (default 64)");
ABSL_FLAG(std::optional<int>, tensor_parallel_size, std::nullopt,
          "GPUs one model is split over (default 1)");

// Model shape (override single fields of the preset).
ABSL_FLAG(std::optional<std::string>, model_name, std::nullopt, "Model name for display");
ABSL_FLAG(std::optional<int>, hidden_size, std::nullopt, "Model width");
ABSL_FLAG(std::optional<int>, num_layers, std::nullopt, "Decoder layers");
ABSL_FLAG(std::optional<int>, num_heads, std::nullopt, "Query heads");
ABSL_FLAG(std::optional<int>, num_kv_heads, std::nullopt, "KV heads");
ABSL_FLAG(std::optional<int>, head_dim, std::nullopt, "Dimension per head");
ABSL_FLAG(std::optional<int>, intermediate_size, std::nullopt, "MLP width");
ABSL_FLAG(std::optional<int>, vocab_size, std::nullopt, "Vocabulary size");
ABSL_FLAG(std::optional<std::string>, dtype, std::nullopt,
          "Weights and activations: bf16, fp16, fp32, fp8");
ABSL_FLAG(std::optional<bool>, tie_embeddings, std::nullopt,
          "The lm head shares the embedding (true or false)");
ABSL_FLAG(std::optional<bool>, attention_bias, std::nullopt, "QKV projections have a bias");
ABSL_FLAG(std::optional<bool>, qk_norm, std::nullopt,
          "Query and key heads are RMS-normed before RoPE (Qwen3)");
ABSL_FLAG(std::optional<double>, rope_theta, std::nullopt, "RoPE base (not used for memory)");
ABSL_FLAG(std::optional<double>, rms_norm_eps, std::nullopt,
          "RMSNorm epsilon (not used for memory)");

// GPU (override single fields of the GPU preset).
ABSL_FLAG(std::optional<std::string>, gpu_name, std::nullopt, "GPU name for display");
ABSL_FLAG(std::optional<uint64_t>, gpu_total_bytes, std::nullopt, "GPU memory in bytes");
ABSL_FLAG(std::optional<int>, gpu_sm_count, std::nullopt, "GPU streaming multiprocessors");

// Calibration: replace the planner's estimates with measured values.
ABSL_FLAG(std::optional<uint64_t>, activation_bytes_per_token, std::nullopt,
          "Activation arena per batched token");
ABSL_FLAG(std::optional<uint64_t>, graph_bytes_per_graph, std::nullopt,
          "Device memory per captured graph, besides its nodes");
ABSL_FLAG(std::optional<uint64_t>, graph_bytes_per_node, std::nullopt,
          "Device memory per captured graph node");
ABSL_FLAG(std::optional<uint64_t>, cublaslt_workspace_bytes, std::nullopt, "cuBLASLt workspace");
ABSL_FLAG(std::optional<uint64_t>, custom_allreduce_buffer_bytes, std::nullopt,
          "Custom all-reduce buffer (two are reserved)");
ABSL_FLAG(std::optional<uint64_t>, nccl_bytes, std::nullopt, "NCCL's device buffers");
ABSL_FLAG(std::optional<uint64_t>, margin_bytes, std::nullopt,
          "Reserve for the CUDA context, kernel images and fragmentation");

namespace kiln {
namespace {

constexpr int kBadInput = 2;
// The longest --context: the planner's bound on max_model_len. Longer ones are typos.
constexpr int64_t kMaxContext = int64_t{1} << 24;

int Fail(const std::string& message) {
  std::cerr << "memory_planner: " << message << "\n";
  return kBadInput;
}

int Fail(const absl::Status& status) { return Fail(std::string(status.message())); }

absl::StatusOr<config::DType> ParseDType(const std::string& text, absl::string_view flag) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "bf16" || t == "bfloat16") return config::DTYPE_BF16;
  if (t == "fp16" || t == "float16" || t == "half") return config::DTYPE_FP16;
  if (t == "fp32" || t == "float32" || t == "float") return config::DTYPE_FP32;
  if (t == "fp8" || t == "fp8_e4m3") return config::DTYPE_FP8_E4M3;
  return absl::InvalidArgumentError(
      absl::StrCat("Unknown --", flag, " ", Quoted(text), "; use bf16, fp16, fp32 or fp8"));
}

absl::StatusOr<config::GraphExecution> ParseGraphExecution(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "full") return config::GRAPH_EXECUTION_FULL;
  if (t == "piecewise") return config::GRAPH_EXECUTION_PIECEWISE;
  return absl::InvalidArgumentError(
      absl::StrCat("Unknown --graph_execution ", Quoted(text), "; use full or piecewise"));
}

absl::StatusOr<config::GraphMode> ParseGraphMode(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "decode") return config::GRAPH_MODE_DECODE;
  if (t == "prefill_only" || t == "prefill") return config::GRAPH_MODE_PREFILL_ONLY;
  if (t == "none" || t == "off") return config::GRAPH_MODE_NONE;
  return absl::InvalidArgumentError(
      absl::StrCat("Unknown --graph_mode ", Quoted(text), "; use decode, prefill_only or none"));
}

// A path given on `bazel run`'s command line is relative to where bazel was run, not to the
// runfiles directory the binary starts in.
std::string UserPath(const std::string& path) {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || dir == nullptr) return path;
  return absl::StrCat(dir, "/", path);
}

// Builds a config holding exactly the fields the command line sets.
absl::StatusOr<config::PlannerConfig> FlagOverlay() {
  config::PlannerConfig o;
  if (!absl::GetFlag(FLAGS_preset).empty()) o.set_model_preset(absl::GetFlag(FLAGS_preset));
  if (!absl::GetFlag(FLAGS_gpu).empty()) o.set_gpu_preset(absl::GetFlag(FLAGS_gpu));

  if (auto v = absl::GetFlag(FLAGS_gpu_memory_utilization)) o.set_gpu_memory_utilization(*v);
  if (auto v = absl::GetFlag(FLAGS_max_num_seqs)) o.set_max_num_seqs(*v);
  if (auto v = absl::GetFlag(FLAGS_max_num_batched_tokens)) o.set_max_num_batched_tokens(*v);
  if (auto v = absl::GetFlag(FLAGS_block_size)) o.set_block_size(*v);
  if (auto v = absl::GetFlag(FLAGS_tensor_parallel_size)) o.set_tensor_parallel_size(*v);
  if (auto v = absl::GetFlag(FLAGS_kv_cache_dtype)) {
    absl::StatusOr<config::DType> dtype = ParseDType(*v, "kv_cache_dtype");
    if (!dtype.ok()) return dtype.status();
    o.set_kv_cache_dtype(*dtype);
  }
  if (auto v = absl::GetFlag(FLAGS_graph_mode)) {
    absl::StatusOr<config::GraphMode> mode = ParseGraphMode(*v);
    if (!mode.ok()) return mode.status();
    o.mutable_graph()->set_mode(*mode);
  }
  if (auto v = absl::GetFlag(FLAGS_max_capture_size)) o.mutable_graph()->set_max_capture_size(*v);
  if (auto v = absl::GetFlag(FLAGS_graph_execution)) {
    absl::StatusOr<config::GraphExecution> execution = ParseGraphExecution(*v);
    if (!execution.ok()) return execution.status();
    o.mutable_graph()->set_execution(*execution);
  }
  if (auto v = absl::GetFlag(FLAGS_capture_prefill)) o.mutable_graph()->set_capture_prefill(*v);
  if (auto v = absl::GetFlag(FLAGS_max_model_len)) o.set_max_model_len(*v);

  config::ModelShape* m = o.mutable_model();
  if (auto v = absl::GetFlag(FLAGS_model_name)) m->set_name(*v);
  if (auto v = absl::GetFlag(FLAGS_hidden_size)) m->set_hidden_size(*v);
  if (auto v = absl::GetFlag(FLAGS_num_layers)) m->set_num_layers(*v);
  if (auto v = absl::GetFlag(FLAGS_num_heads)) m->set_num_heads(*v);
  if (auto v = absl::GetFlag(FLAGS_num_kv_heads)) m->set_num_kv_heads(*v);
  if (auto v = absl::GetFlag(FLAGS_head_dim)) m->set_head_dim(*v);
  if (auto v = absl::GetFlag(FLAGS_intermediate_size)) m->set_intermediate_size(*v);
  if (auto v = absl::GetFlag(FLAGS_vocab_size)) m->set_vocab_size(*v);
  if (auto v = absl::GetFlag(FLAGS_dtype)) {
    absl::StatusOr<config::DType> dtype = ParseDType(*v, "dtype");
    if (!dtype.ok()) return dtype.status();
    m->set_dtype(*dtype);
  }
  if (auto v = absl::GetFlag(FLAGS_tie_embeddings)) m->set_tie_embeddings(*v);
  if (auto v = absl::GetFlag(FLAGS_attention_bias)) m->set_attention_bias(*v);
  if (auto v = absl::GetFlag(FLAGS_qk_norm)) m->set_qk_norm(*v);
  if (auto v = absl::GetFlag(FLAGS_rope_theta)) m->set_rope_theta(*v);
  if (auto v = absl::GetFlag(FLAGS_rms_norm_eps)) m->set_rms_norm_eps(*v);

  config::GpuSpec* g = o.mutable_gpu();
  if (auto v = absl::GetFlag(FLAGS_gpu_name)) g->set_name(*v);
  if (auto v = absl::GetFlag(FLAGS_gpu_total_bytes)) g->set_total_bytes(*v);
  if (auto v = absl::GetFlag(FLAGS_gpu_sm_count)) g->set_sm_count(*v);

  config::Calibration* c = o.mutable_calibration();
  if (auto v = absl::GetFlag(FLAGS_activation_bytes_per_token)) {
    c->set_activation_bytes_per_token(*v);
  }
  if (auto v = absl::GetFlag(FLAGS_graph_bytes_per_graph)) c->set_graph_bytes_per_graph(*v);
  if (auto v = absl::GetFlag(FLAGS_graph_bytes_per_node)) c->set_graph_bytes_per_node(*v);
  if (auto v = absl::GetFlag(FLAGS_cublaslt_workspace_bytes)) c->set_cublaslt_workspace_bytes(*v);
  if (auto v = absl::GetFlag(FLAGS_custom_allreduce_buffer_bytes)) {
    c->set_custom_allreduce_buffer_bytes(*v);
  }
  if (auto v = absl::GetFlag(FLAGS_nccl_bytes)) c->set_nccl_bytes(*v);
  if (auto v = absl::GetFlag(FLAGS_margin_bytes)) c->set_margin_bytes(*v);
  return o;
}

// Applies a size-list flag (--capture_sizes, --prefill_sizes) to `sizes`: "default" clears the
// list; else a comma-separated list replaces it.
absl::Status ApplySizeList(const std::optional<std::string>& text, absl::string_view flag,
                           google::protobuf::RepeatedField<int32_t>* sizes) {
  if (!text) return absl::OkStatus();
  sizes->Clear();
  if (absl::AsciiStrToLower(*text) == "default") return absl::OkStatus();
  absl::StatusOr<std::vector<int>> parsed =
      ParseIntList(*text, flag, "; give sizes like 1,2,4,8 or 'default'");
  if (!parsed.ok()) return parsed.status();
  if (parsed->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " is empty; give sizes like 1,2,4,8, 'default', or --graph_mode=none"));
  }
  sizes->Add(parsed->begin(), parsed->end());
  return absl::OkStatus();
}

// Applies --capture_sizes and --prefill_sizes.
absl::Status ApplyCaptureSizes(config::PlannerConfig* config) {
  absl::Status status = ApplySizeList(absl::GetFlag(FLAGS_capture_sizes), "capture_sizes",
                                      config->mutable_graph()->mutable_capture_sizes());
  if (!status.ok()) return status;
  return ApplySizeList(absl::GetFlag(FLAGS_prefill_sizes), "prefill_sizes",
                       config->mutable_graph()->mutable_prefill_sizes());
}

bool IsAutoGpu(const config::PlannerConfig& config) {
  return IsAutoGpuPreset(config.gpu_preset());
}

// Returns the first flag --measure cannot honour: it prints its own table, of GPU 0 of this
// machine, whatever output or GPU the other flags ask for.
absl::Status CheckMeasureFlags() {
  std::string conflict;
  const std::string gpu = absl::GetFlag(FLAGS_gpu);
  if (absl::GetFlag(FLAGS_format) != "table") {
    conflict = absl::StrCat("--format=", absl::GetFlag(FLAGS_format));
  } else if (!absl::GetFlag(FLAGS_svg).empty()) {
    conflict = "--svg";
  } else if (!gpu.empty() && !IsAutoGpuPreset(gpu)) {
    conflict = absl::StrCat("--gpu=", Escaped(gpu));
  } else if (absl::GetFlag(FLAGS_gpu_name)) {
    conflict = "--gpu_name";
  } else if (absl::GetFlag(FLAGS_gpu_total_bytes)) {
    conflict = "--gpu_total_bytes";
  } else if (absl::GetFlag(FLAGS_gpu_sm_count)) {
    conflict = "--gpu_sm_count";
  }
  if (conflict.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(conflict, " does not apply to --measure, which prints its own table for GPU 0 "
                             "of this machine; drop ",
                   conflict, " or --measure"));
}

// Replaces gpu_preset "auto" with GPU 0 of this machine; explicit GPU fields still win.
absl::Status ResolveAutoGpu(config::PlannerConfig* config) {
  if (!IsAutoGpu(*config)) return absl::OkStatus();
  if (DeviceCount() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--gpu=auto found no GPU (no CUDA device is visible on this machine); pick a preset "
        "(--gpu=",
        absl::StrJoin(GpuPresetNames(), "|"), ") or give --gpu_total_bytes and --gpu_sm_count"));
  }
  absl::StatusOr<DeviceInfo> info = DeviceInfo::Query(0);
  if (!info.ok()) return info.status();
  config::GpuSpec gpu;
  gpu.set_name(info->name);
  gpu.set_total_bytes(info->total_memory_bytes);
  gpu.set_sm_count(info->sm_count);
  gpu.MergeFrom(config->gpu());
  *config->mutable_gpu() = gpu;
  config->clear_gpu_preset();
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Sizes the KV cache of a model on a GPU and explains every byte of the budget.\n"
      "  memory_planner                                 Llama-3.1-8B on an H100 80GB\n"
      "  memory_planner --preset=llama-3.1-70b --gpu=h200 --tensor_parallel_size=4\n"
      "  memory_planner --config=serve.json --format=json --svg=plan.svg");
  absl::Status flags = CheckFlags(argc, argv, "memory_planner");
  if (!flags.ok()) return Fail(flags);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    return Fail(absl::StrCat("Unexpected argument ", Quoted(rest[1]),
                             "; memory_planner takes only flags (see --help)"));
  }

  // Every flag is checked before the GPU is looked for (--measure, --gpu=auto), so a bad one gets
  // its own message on any machine.
  const bool measure = absl::GetFlag(FLAGS_measure);
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "table" && format != "json" && format != "textproto") {
    return Fail(
        absl::StrCat("Unknown --format ", Quoted(format), "; use table, json or textproto"));
  }
  const int64_t context = absl::GetFlag(FLAGS_context);
  if (context < 1) {
    return Fail(absl::StrCat("--context ", context,
                             " must be positive; give the tokens per sequence, e.g. 8192"));
  }
  if (context > kMaxContext) {
    return Fail(absl::StrCat("--context ", context, " is above ", kMaxContext,
                             " tokens, beyond anything kiln plans for; give the tokens per "
                             "sequence, e.g. 8192"));
  }
  if (measure) {
    absl::Status flags_for_measure = CheckMeasureFlags();
    if (!flags_for_measure.ok()) return Fail(flags_for_measure);
  }

  config::PlannerConfig config = DefaultPlannerConfig();
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::StatusOr<config::PlannerConfig> file =
        LoadPlannerConfigFile(UserPath(absl::GetFlag(FLAGS_config)));
    if (!file.ok()) return Fail(file.status());
    MergePlannerConfig(*file, &config);
  }
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  if (!model_dir.empty()) {
    if (!absl::GetFlag(FLAGS_preset).empty()) {
      return Fail("--model_dir and --preset both name the model; keep one");
    }
    absl::StatusOr<config::ModelShape> shape = LoadHfModelShape(UserPath(model_dir));
    if (!shape.ok()) return Fail(shape.status());
    // kiln's runner rounds float16 and float32 checkpoints to bf16 as it loads them, so the plan
    // counts the weights it will hold (--dtype, applied below, plans them as stored).
    if (std::optional<config::DType> stored = RunInBf16(&*shape)) {
      std::cerr << "memory_planner: --model_dir " << Quoted(model_dir) << " holds "
                << DTypeName(*stored)
                << " weights, which kiln rounds to bf16 as it loads them; planning bf16 (pass "
                   "--dtype to plan another type)\n";
    }
    config.clear_model_preset();
    *config.mutable_model() = *std::move(shape);
  }
  absl::StatusOr<config::PlannerConfig> overlay = FlagOverlay();
  if (!overlay.ok()) return Fail(overlay.status());
  MergePlannerConfig(*overlay, &config);
  absl::Status sizes = ApplyCaptureSizes(&config);
  if (!sizes.ok()) return Fail(sizes);
  if (measure) {
    // A measurement is of this machine's GPU, whatever GPU the config names.
    config.clear_gpu();
    config.set_gpu_preset("auto");
  }
  if (IsAutoGpu(config)) {
    // The device's memory and SMs size only the KV cache: a preset stands in for them while the
    // rest is checked.
    config::PlannerConfig stand_in = config;
    stand_in.set_gpu_preset(kStandInGpuPreset);
    absl::Status checked =
        measure ? CheckMeasurable(stand_in) : ResolvePlannerConfig(stand_in).status();
    if (!checked.ok()) return Fail(checked);
  }
  if (measure && DeviceCount() == 0) {
    return Fail(
        "--measure runs the real allocations and graph captures through the runner on GPU 0, and "
        "no CUDA device is visible on this machine; run without --measure for the estimate");
  }
  absl::Status gpu = ResolveAutoGpu(&config);
  if (!gpu.ok()) return Fail(gpu);
  if (measure) {
    absl::StatusOr<MeasuredPlan> measured = MeasurePlan(config);
    if (!measured.ok()) return Fail(measured.status());
    std::cout << RenderMeasured(*measured);
    std::cout.flush();
    return std::cout ? 0 : 1;
  }

  absl::StatusOr<MemoryPlan> plan = PlanMemory(config);
  if (!plan.ok()) return Fail(plan.status());

  // The SVG is written first, so a bad --svg path fails before anything reaches stdout.
  if (!absl::GetFlag(FLAGS_svg).empty()) {
    const std::string path = UserPath(absl::GetFlag(FLAGS_svg));
    std::error_code error;
    if (std::filesystem::is_directory(path, error)) {
      return Fail(absl::StrCat("--svg ", Quoted(path), " is a directory; give a file, e.g. ",
                               Quoted(absl::StrCat(path, "/plan.svg"))));
    }
    std::ofstream svg(path, std::ios::binary | std::ios::trunc);
    svg << RenderSvg(*plan);
    svg.close();
    if (!svg) {
      return Fail(absl::StrCat("Cannot write --svg file ", Quoted(path),
                               "; check that its directory exists and is writable"));
    }
  }
  if (format == "json") {
    std::cout << RenderJson(*plan, context) << "\n";
  } else if (format == "textproto") {
    std::cout << RenderTextProto(*plan, context);
  } else {
    std::cout << RenderTable(*plan, context);
  }
  std::cout.flush();
  return std::cout ? 0 : 1;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Run(argc, argv); }
