// generate: runs a Llama-family model through kiln's Runner on prompts of random tokens (or given
// ids) and reports what it costs: memory, capture time, prefill time, decode step latency and
// tokens per second for each batch size.
//
//   bazel run -c opt //tools:generate                                  # 1B-class, random weights
//   bazel run -c opt //tools:generate -- --batch=1,8,32 --prompt_len=512 --gen_tokens=128
//   bazel run -c opt //tools:generate -- --prompt_ids=128000,791,6460 --gen_tokens=16 --batch=1
//   bazel run -c opt //tools:generate -- --graphs=piecewise      # or none
//   bazel run -c opt //tools:generate -- --weights=/models/llama-1b/model.safetensors --batch=1
//   bazel run -c opt //tools:generate -- --model_dir=/models/Llama-3.2-1B --batch=1
//
// The default model is the 1B-class shape (llama-3.2-1b preset: hidden 2048, 16 layers, 32/8 heads
// of 64, ffn 8192, vocab 128256) with seeded random weights, so the tokens are meaningless but the
// work is the real work; --weights reads a Hugging Face checkpoint of the preset's (or --config's)
// shape instead, and --model_dir a Hugging Face model directory: the shape from its config.json,
// the weights from its safetensors files. Exit codes: 0 on success, 2 for bad flags, 1 for a
// runtime error. Every flag, the config and the model are checked (and the weight files' headers
// read) before the GPU is looked for, so a bad flag gets its message on any machine.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/config/config_loader.h"
#include "runtime/config/hf_model.h"
#include "runtime/config/presets.h"
#include "runtime/config/quoted.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/memory/memory_planner.h"
#include "runtime/runner/runner.h"
#include "tools/cli_flags.h"

// Empty by default, so that an explicit --preset can be told from the default one.
ABSL_FLAG(std::string, preset, "",
          "Model preset (random weights of its shape; default llama-3.2-1b)");
ABSL_FLAG(std::string, config, "",
          "PlannerConfig file (textproto or JSON) layered under the flags");
// The flags a --config file can also set are unset by default, so that the file's value holds
// unless the flag is given; the help names the default used when neither sets it.
ABSL_FLAG(std::optional<std::string>, graphs, std::nullopt,
          "CUDA graphs: full, piecewise or none (default: --config's execution, or full)");
ABSL_FLAG(std::string, batch, "1,8,32", "Comma-separated batch sizes to run, one after another");
ABSL_FLAG(std::optional<int>, prompt_len, std::nullopt,
          "Tokens per random prompt (default 128; not with --prompt_ids)");
ABSL_FLAG(std::string, prompt_ids, "",
          "Comma-separated token ids used as every sequence's prompt instead of random tokens");
ABSL_FLAG(int, gen_tokens, 64, "Tokens to generate per sequence");
ABSL_FLAG(std::optional<int>, max_num_seqs, std::nullopt,
          "Most sequences in one step, and the largest decode graph (default: --config's, or "
          "256)");
ABSL_FLAG(std::optional<int>, max_num_batched_tokens, std::nullopt,
          "Most tokens in one step, the prefill chunk (default: --config's, or 8192)");
ABSL_FLAG(std::optional<int>, max_model_len, std::nullopt,
          "Longest sequence (default: --config's, or 4096)");
ABSL_FLAG(int64_t, max_kv_blocks, 0, "Use at most this many KV blocks (0: what the planner gives)");
ABSL_FLAG(std::optional<double>, gpu_memory_utilization, std::nullopt,
          "Fraction of the GPU's memory to plan for (default: --config's, or 0.9)");
ABSL_FLAG(std::optional<bool>, capture_prefill, std::nullopt,
          "Also capture prefill graphs, up to 512 tokens (default: --config's, or true)");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the random weights and prompts");
ABSL_FLAG(std::string, weights, "",
          "Comma-separated Hugging Face safetensors files holding the model's weights (of the "
          "--preset or --config shape) instead of random ones");
ABSL_FLAG(int, load_threads, 4, "Threads that read --weights or --model_dir's files (1 to 64)");
ABSL_FLAG(std::string, logits_out, "",
          "With --batch=1: write the sequence's generated tokens and the logits each was sampled "
          "from to this file (int32 steps, int32 vocab, int32 tokens[steps], float32 "
          "logits[steps][vocab], little-endian), e.g. for tools/bench/hf_reference_check.py");
ABSL_FLAG(std::string, model_dir, "",
          "A Hugging Face model directory: config.json and its safetensors (one file, or shards "
          "with model.safetensors.index.json); sets the model and its weights");

namespace kiln {
namespace {

constexpr char kDefaultPreset[] = "llama-3.2-1b";

// Each reading thread pins two 32 MiB buffers (RunnerOptions::weight_load_threads): 64 threads
// pin 4 GiB, more than any disk needs to be read at its full rate.
constexpr int kMaxLoadThreads = 64;

// --logits_out's logits are held in host memory until the run ends (gen_tokens x vocab floats).
constexpr int64_t kMaxLogitsBytes = int64_t{4} << 30;

// Parses --`flag`'s comma-separated integers ("" is none); `example` shows the form in the
// message about a bad list.
absl::StatusOr<std::vector<int>> ParseInts(const std::string& text, const char* flag,
                                           const char* example) {
  const std::string fix =
      absl::StrCat("; give comma-separated integers, e.g. --", flag, "=", example);
  absl::StatusOr<std::vector<int>> out = ParseIntList(text, flag, fix);
  // Commas with no integer between them (",") are a typo, not "none".
  if (out.ok() && out->empty() && text.find(',') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", Escaped(text), " has an empty entry", fix));
  }
  return out;
}

// Checks, without a GPU, what Runner::Create refuses before it allocates: the config as the
// planner resolves it (limits, presets, capture sizes; a stand-in GPU where the device's would
// be used), the model's shape and sliding window, the KV cache's dtype, and one rank. Returns
// the model's shape.
absl::StatusOr<LlamaShape> CheckRunnable(const RunnerOptions& options) {
  config::PlannerConfig config = Runner::PlannerConfigFor(options);
  if (UsesDeviceGpu(config)) {
    config.set_gpu_preset(kStandInGpuPreset);  // the config's GPU fields still override it
  }
  ASSIGN_OR_RETURN(config::PlannerConfig resolved, ResolvePlannerConfig(config));
  ASSIGN_OR_RETURN(LlamaShape shape, CheckRunnerModel(resolved, options.max_model_len));
  if (resolved.tensor_parallel_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_parallel_size ", resolved.tensor_parallel_size(),
        " needs one process per GPU, and generate runs one; set tensor_parallel_size to 1 in the "
        "--config file (tp_benchmark runs tensor parallelism)"));
  }
  return shape;
}

// Checks --logits_out before the run, as the file is written only after it: the path must name
// a regular file, or none yet, in an existing directory where this process may write it. Probes
// by opening it for writing; a file made for the probe is removed again.
absl::Status CheckLogitsOut(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  const fs::path dir = file.has_parent_path() ? file.parent_path() : ".";
  std::error_code error;
  const fs::file_status status = fs::status(file, error);
  const char* problem = fs::is_directory(status) ? " is a directory"
                        : fs::exists(status) && !fs::is_regular_file(status)
                            ? " is not a regular file (a FIFO, a device or a socket)"
                        : !fs::is_directory(dir, error) ? "'s directory does not exist"
                                                        : nullptr;
  if (problem != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--logits_out ", Quoted(path), problem,
                     "; give a file in an existing directory, e.g. /tmp/logits.bin"));
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const bool created = fd >= 0;
  if (fd < 0 && errno == EEXIST) fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--logits_out ", Quoted(path), " cannot be written: ", std::strerror(errno),
                     "; give a file in a directory you may write to, e.g. /tmp/logits.bin"));
  }
  ::close(fd);
  if (created) ::unlink(path.c_str());
  return absl::OkStatus();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Writes --logits_out's file (see the flag).
absl::Status WriteLogits(const std::string& path, const std::vector<int32_t>& tokens,
                         const std::vector<float>& logits, int vocab) {
  if (logits.size() != tokens.size() * static_cast<size_t>(vocab)) {
    return absl::InternalError(absl::StrCat("--logits_out: ", logits.size(), " logits for ",
                                            tokens.size(), " tokens of a vocabulary of ", vocab));
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("--logits_out: cannot open ", Quoted(path),
                                            " for writing; check the directory exists"));
  }
  const int32_t header[2] = {static_cast<int32_t>(tokens.size()), vocab};
  bool ok = std::fwrite(header, sizeof(header), 1, f) == 1;
  ok = ok && std::fwrite(tokens.data(), sizeof(int32_t), tokens.size(), f) == tokens.size();
  ok = ok && std::fwrite(logits.data(), sizeof(float), logits.size(), f) == logits.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    return absl::DataLossError(absl::StrCat("--logits_out: writing ", Quoted(path), " failed"));
  }
  return absl::OkStatus();
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct BatchResult {
  int batch = 0;
  double prefill_ms = 0;
  int prefill_steps = 0;
  double device_ms = 0;  // median decode step on the device
  double step_ms = 0;    // median decode step, host wall time
  double tokens_per_s = 0;
  std::vector<int32_t> first_tokens;
};

// Prefills `prompts` (chunked into steps of at most max_num_batched_tokens), then decodes
// gen_tokens steps for all of them. With `logits` (one prompt only), appends the logits row each
// generated token was sampled from.
absl::StatusOr<BatchResult> RunBatch(Runner& runner,
                                     const std::vector<std::vector<int32_t>>& prompts,
                                     int gen_tokens, int64_t first_id,
                                     std::vector<float>* logits = nullptr) {
  auto keep_logits = [&]() -> absl::Status {
    if (logits == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<float> row, runner.LastLogits(1));
    logits->insert(logits->end(), row.begin(), row.end());
    return absl::OkStatus();
  };
  BatchResult r;
  r.batch = static_cast<int>(prompts.size());
  const int max_tokens = runner.memory_plan().config.max_num_batched_tokens();
  std::vector<int32_t> next(prompts.size());
  std::vector<size_t> done(prompts.size(), 0);
  auto t0 = std::chrono::steady_clock::now();
  for (bool left = true; left;) {
    std::vector<SequenceTokens> step;
    std::vector<size_t> index;
    int tokens = 0;
    for (size_t i = 0; i < prompts.size() && tokens < max_tokens; ++i) {
      if (done[i] == prompts[i].size()) continue;
      const size_t take = std::min<size_t>(prompts[i].size() - done[i], max_tokens - tokens);
      step.push_back({first_id + static_cast<int64_t>(i),
                      std::vector<int32_t>(prompts[i].begin() + done[i],
                                           prompts[i].begin() + done[i] + take)});
      index.push_back(i);
      done[i] += take;
      tokens += static_cast<int>(take);
    }
    if (step.empty()) break;
    ASSIGN_OR_RETURN(std::vector<int32_t> out, runner.Step(step));
    for (size_t j = 0; j < index.size(); ++j) next[index[j]] = out[j];
    ++r.prefill_steps;
    left = false;
    for (size_t i = 0; i < prompts.size(); ++i) left = left || done[i] < prompts[i].size();
  }
  RETURN_IF_ERROR(keep_logits());  // the last prefill step's: the first generated token's
  r.prefill_ms = Since(t0);
  r.first_tokens.push_back(next[0]);

  std::vector<double> device, wall;
  t0 = std::chrono::steady_clock::now();
  for (int s = 1; s < gen_tokens; ++s) {
    std::vector<SequenceTokens> step;
    for (size_t i = 0; i < prompts.size(); ++i) {
      step.push_back({first_id + static_cast<int64_t>(i), {std::max(next[i], 0)}});
    }
    const auto s0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(next, runner.Step(step));
    wall.push_back(Since(s0));
    device.push_back(runner.last_step().device_ms);
    r.first_tokens.push_back(next[0]);
    RETURN_IF_ERROR(keep_logits());
  }
  const double decode_ms = Since(t0);
  r.device_ms = Median(device);
  r.step_ms = Median(wall);
  r.tokens_per_s = decode_ms > 0 ? 1e3 * (gen_tokens - 1) * prompts.size() / decode_ms : 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RETURN_IF_ERROR(runner.Release(first_id + static_cast<int64_t>(i)));
  }
  return r;
}

int Run(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Runs a model through kiln's Runner and reports memory, capture time, latency and "
      "throughput.\n  generate --batch=1,8,32 --prompt_len=128 --gen_tokens=64");
  auto fail = [](const absl::Status& s, int code) {
    std::fprintf(stderr, "generate: %s\n", std::string(s.message()).c_str());
    return code;
  };
  absl::Status flags = CheckFlags(argc, argv, "generate");
  if (!flags.ok()) return fail(flags, 2);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("Unexpected argument ", Quoted(rest[1]),
                                 "; generate takes only flags (see --help)")),
                2);
  }
  RunnerOptions options;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::StatusOr<config::PlannerConfig> file =
        LoadPlannerConfigFile(absl::GetFlag(FLAGS_config));
    if (!file.ok()) return fail(file.status(), 2);
    options.config = *file;
  }
  // Each limit: the flag, else the --config file's, else kiln's default (DefaultPlannerConfig).
  config::PlannerConfig& c = options.config;
  const config::PlannerConfig defaults = DefaultPlannerConfig();
  options.max_model_len = absl::GetFlag(FLAGS_max_model_len)
                              .value_or(c.has_max_model_len() ? c.max_model_len()
                                                              : defaults.max_model_len());
  const std::string preset = absl::GetFlag(FLAGS_preset);
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  std::string converted_from;  // the checkpoint's dtype where it is not bf16
  if (!model_dir.empty()) {
    // The directory is the whole model: a second source of shape or weights would be mixed in.
    if (!preset.empty()) {
      return fail(
          absl::InvalidArgumentError("--model_dir and --preset both name the model; keep one"), 2);
    }
    if (!absl::GetFlag(FLAGS_weights).empty()) {
      return fail(absl::InvalidArgumentError(
                      "--model_dir and --weights both name the weights; drop --weights (the "
                      "directory's safetensors files are read)"),
                  2);
    }
    if (options.config.has_model_preset() || options.config.model().ByteSizeLong() > 0) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
                      "--model_dir and --config both set the model (",
                      Quoted(absl::GetFlag(FLAGS_config)),
                      " sets model_preset or model); drop the model from the file or --model_dir")),
                  2);
    }
    absl::StatusOr<HfModel> hf = LoadHfModelDir(model_dir);
    if (!hf.ok()) return fail(hf.status(), 2);
    // kiln's model runs bf16; float16 and float32 weights are rounded to bf16 as they load.
    if (std::optional<config::DType> stored = RunInBf16(&hf->model)) {
      converted_from = DTypeName(*stored);
    }
    *options.config.mutable_model() = hf->model;
    options.weight_files = hf->weight_files;
  } else if (!preset.empty()) {
    // The file is layered under the flags: --preset replaces the model it sets.
    options.config.clear_model();
    options.config.set_model_preset(preset);
  } else if (!options.config.has_model_preset() && !options.config.model().has_hidden_size()) {
    options.config.set_model_preset(kDefaultPreset);
  }
  c.set_max_num_seqs(absl::GetFlag(FLAGS_max_num_seqs)
                         .value_or(c.has_max_num_seqs() ? c.max_num_seqs()
                                                        : defaults.max_num_seqs()));
  c.set_max_num_batched_tokens(absl::GetFlag(FLAGS_max_num_batched_tokens)
                                   .value_or(c.has_max_num_batched_tokens()
                                                 ? c.max_num_batched_tokens()
                                                 : defaults.max_num_batched_tokens()));
  c.set_gpu_memory_utilization(absl::GetFlag(FLAGS_gpu_memory_utilization)
                                   .value_or(c.has_gpu_memory_utilization()
                                                 ? c.gpu_memory_utilization()
                                                 : defaults.gpu_memory_utilization()));
  const std::string graphs = absl::GetFlag(FLAGS_graphs).value_or(
      c.graph().execution() == config::GRAPH_EXECUTION_PIECEWISE ? "piecewise" : "full");
  if (graphs == "full") {
    options.graphs = GraphExecution::kFull;
  } else if (graphs == "piecewise") {
    options.graphs = GraphExecution::kPiecewise;
  } else if (graphs == "none") {
    options.graphs = GraphExecution::kNone;
  } else {
    return fail(absl::InvalidArgumentError(absl::StrCat(
                    "Unknown --graphs ", Quoted(graphs), "; use full, piecewise or none")),
                2);
  }
  options.max_kv_blocks = absl::GetFlag(FLAGS_max_kv_blocks);
  if (options.max_kv_blocks < 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
                    "--max_kv_blocks is ", options.max_kv_blocks,
                    "; give a positive limit, or 0 for the blocks the planner gives")),
                2);
  }
  options.capture_prefill = absl::GetFlag(FLAGS_capture_prefill)
                                .value_or(!c.graph().has_capture_prefill() ||
                                          c.graph().capture_prefill());
  options.weight_seed = absl::GetFlag(FLAGS_seed);
  for (absl::string_view file : absl::StrSplit(absl::GetFlag(FLAGS_weights), ',',
                                               absl::SkipWhitespace())) {
    options.weight_files.emplace_back(file);  // empty under --model_dir (checked above)
    std::error_code error;
    const std::filesystem::file_status status =
        std::filesystem::status(options.weight_files.back(), error);
    if (std::filesystem::is_directory(status)) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
                      "--weights ", Quoted(file),
                      " is a directory; give its safetensors files, or the directory as "
                      "--model_dir")),
                  2);
    }
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
                      "--weights ", Quoted(file),
                      " is not a regular file (a FIFO, a device or a socket); give safetensors "
                      "files")),
                  2);
    }
  }
  if (options.weight_files.empty() && !absl::GetFlag(FLAGS_weights).empty()) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
                    "--weights=", Escaped(absl::GetFlag(FLAGS_weights)),
                    " names no file; give comma-separated safetensors files, or leave it out for "
                    "random weights")),
                2);
  }
  options.weight_load_threads = absl::GetFlag(FLAGS_load_threads);
  if (options.weight_load_threads < 1) {
    return fail(absl::InvalidArgumentError(absl::StrCat("--load_threads is ",
                                                        options.weight_load_threads,
                                                        "; read with at least 1 thread")),
                2);
  }
  if (options.weight_load_threads > kMaxLoadThreads) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
                    "--load_threads is ", options.weight_load_threads, ", more than ",
                    kMaxLoadThreads, "; each reading thread pins 64 MiB of host memory: give 1 to ",
                    kMaxLoadThreads, " (default 4)")),
                2);
  }
  options.time_steps = true;

  absl::StatusOr<std::vector<int>> batches =
      ParseInts(absl::GetFlag(FLAGS_batch), "batch", "1,8,32");
  if (!batches.ok()) return fail(batches.status(), 2);
  if (batches->empty()) {
    return fail(absl::InvalidArgumentError(
                    "--batch is empty; give the batch sizes to run, e.g. --batch=1,8,32"),
                2);
  }
  absl::StatusOr<std::vector<int>> ids =
      ParseInts(absl::GetFlag(FLAGS_prompt_ids), "prompt_ids", "128000,791,6460");
  if (!ids.ok()) return fail(ids.status(), 2);
  if (!ids->empty() && absl::GetFlag(FLAGS_prompt_len).has_value()) {
    return fail(absl::InvalidArgumentError(
                    "--prompt_len and --prompt_ids both set the prompt; keep one (the ids' count "
                    "is the prompt's length)"),
                2);
  }
  const int prompt_len =
      ids->empty() ? absl::GetFlag(FLAGS_prompt_len).value_or(128) : static_cast<int>(ids->size());
  const int gen_tokens = absl::GetFlag(FLAGS_gen_tokens);
  if (prompt_len < 1 || gen_tokens < 1) {
    return fail(absl::InvalidArgumentError("--prompt_len and --gen_tokens must be positive"), 2);
  }
  const std::string logits_out = absl::GetFlag(FLAGS_logits_out);
  if (!logits_out.empty() && *batches != std::vector<int>{1}) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
                    "--logits_out writes one sequence's logits; give --batch=1 (not --batch=",
                    Escaped(absl::GetFlag(FLAGS_batch)), ")")),
                2);
  }
  if (!logits_out.empty()) {
    absl::Status writable = CheckLogitsOut(logits_out);
    if (!writable.ok()) return fail(writable, 2);
  }
  absl::StatusOr<LlamaShape> runnable = CheckRunnable(options);
  if (!runnable.ok()) return fail(runnable.status(), 2);
  for (int b : *batches) {
    if (b < 1 || b > options.config.max_num_seqs()) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
                      "--batch ", b, " is outside [1, --max_num_seqs ",
                      options.config.max_num_seqs(), "]; give batch sizes in that range")),
                  2);
    }
  }
  for (int id : *ids) {
    if (id < 0 || id >= runnable->vocab) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
                      "--prompt_ids has token ", id, ", outside the model's vocabulary [0, ",
                      runnable->vocab, "); give token ids of the model's tokenizer")),
                  2);
    }
  }
  // A sequence holds its prompt and every generated token but the last (never fed back).
  if (static_cast<int64_t>(prompt_len) + gen_tokens - 1 > options.max_model_len) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
                    "A prompt of ", prompt_len, " tokens and ", gen_tokens,
                    " generated tokens exceed --max_model_len ", options.max_model_len,
                    "; shorten --prompt_len (or --prompt_ids) or --gen_tokens, or raise "
                    "--max_model_len")),
                2);
  }
  if (!logits_out.empty()) {
    const int64_t bytes = int64_t{gen_tokens} * runnable->vocab * int64_t{sizeof(float)};
    if (bytes > kMaxLogitsBytes) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
                      "--logits_out would keep ", FormatBytes(bytes), " of logits (--gen_tokens ",
                      gen_tokens, " x vocabulary ", runnable->vocab, " x 4 bytes), more than the ",
                      FormatBytes(kMaxLogitsBytes), " generate holds; lower --gen_tokens")),
                  2);
    }
  }
  if (!model_dir.empty()) {
    std::printf("model_dir %s: %s, %zu safetensors file%s%s\n", Escaped(model_dir).c_str(),
                Escaped(options.config.model().name()).c_str(), options.weight_files.size(),
                options.weight_files.size() == 1 ? "" : "s",
                converted_from.empty()
                    ? ""
                    : absl::StrCat(", ", converted_from, " weights rounded to bf16 as they load")
                          .c_str());
  }
  // The weight files' headers (names, dtypes, shapes, sizes) are read now too, as the Runner reads
  // them again: a missing file is a bad flag, a wrong or truncated one a runtime error (as when
  // the Runner finds it).
  if (!options.weight_files.empty()) {
    absl::StatusOr<LlamaShardReader> reader =
        LlamaShardReader::Open(options.weight_files, *runnable);
    if (!reader.ok()) {
      const bool missing = reader.status().code() == absl::StatusCode::kNotFound;
      const std::string flag =
          model_dir.empty() ? "--weights" : absl::StrCat("--model_dir ", Quoted(model_dir));
      return fail(absl::Status(reader.status().code(),
                               absl::StrCat(flag, ": ", reader.status().message(),
                                            missing ? "; check the path" : "")),
                  missing ? 2 : 1);
    }
  }
  if (DeviceCount() == 0) {
    return fail(absl::FailedPreconditionError("No CUDA device is visible; generate needs a GPU"),
                1);
  }

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Runner>> created = Runner::Create(options);
  if (!created.ok()) return fail(created.status(), 1);
  Runner& runner = **created;
  const LlamaShape& shape = runner.shape();
  const std::string weights =
      options.weight_files.empty()
          ? absl::StrCat("random weights, seed ", options.weight_seed)
          : absl::StrCat("weights from ", Escaped(absl::StrJoin(options.weight_files, ", ")));
  std::printf("model: %s (%s, %s)\n",
              Escaped(runner.memory_plan().config.model().name()).c_str(),
              shape.ToString().c_str(), weights.c_str());
  std::printf("created in %.2f s; device memory (requested / measured):\n", Since(t0) / 1e3);
  for (const RunnerMemoryItem& item : runner.memory().items) {
    std::printf("  %-20s %12s %12s\n", item.name.c_str(), FormatBytes(item.requested_bytes).c_str(),
                FormatBytes(item.measured_bytes).c_str());
  }
  std::printf("  KV cache: %d blocks of %d tokens\n", runner.num_kv_blocks(),
              runner.sequences().block_size());

  absl::StatusOr<RunnerCaptureSummary> captured = runner.Capture();
  if (!captured.ok()) return fail(captured.status(), 1);
  std::printf("graphs (%s): %s\n", GraphExecutionName(options.graphs),
              captured->ToString().c_str());

  std::mt19937_64 rng(options.weight_seed);
  std::printf("\n%6s %8s %12s %10s %16s %14s %12s\n", "batch", "prompt", "prefill ms",
              "steps", "decode ms (gpu)", "step ms (host)", "tokens/s");
  std::vector<BatchResult> results;
  int64_t first_id = 0;
  for (int b : *batches) {  // each within [1, max_num_seqs], checked with the flags above
    std::vector<std::vector<int32_t>> prompts(b);
    for (auto& p : prompts) {
      if (!ids->empty()) {
        p.assign(ids->begin(), ids->end());
      } else {
        for (int i = 0; i < prompt_len; ++i) p.push_back(static_cast<int32_t>(rng() % shape.vocab));
      }
    }
    std::vector<float> logits;
    absl::StatusOr<BatchResult> r =
        RunBatch(runner, prompts, gen_tokens, first_id, logits_out.empty() ? nullptr : &logits);
    if (!r.ok()) return fail(r.status(), 1);
    if (!logits_out.empty()) {
      absl::Status written = WriteLogits(logits_out, r->first_tokens, logits, shape.vocab);
      if (!written.ok()) return fail(written, 1);
      std::printf("wrote %zu tokens and their logits to %s\n", r->first_tokens.size(),
                  Escaped(logits_out).c_str());
    }
    first_id += b;
    std::printf("%6d %8d %12.2f %10d %16.3f %14.3f %12.0f\n", b, prompt_len, r->prefill_ms,
                r->prefill_steps, r->device_ms, r->step_ms, r->tokens_per_s);
    results.push_back(*r);
  }
  for (const BatchResult& r : results) {
    const size_t shown = std::min<size_t>(r.first_tokens.size(), 16);
    std::printf("batch %d, sequence 0 generated: %s%s\n", r.batch,
                absl::StrJoin(r.first_tokens.begin(), r.first_tokens.begin() + shown, " ").c_str(),
                r.first_tokens.size() > shown ? " ..." : "");
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Run(argc, argv); }
