#include "runtime/config/presets.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/config/quoted.h"

namespace kiln {
namespace {

using config::DType;
using config::GpuSpec;
using config::ModelShape;

struct ModelEntry {
  const char* key;
  const char* display_name;
  int hidden_size;
  int num_layers;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int intermediate_size;
  int vocab_size;
  bool tie_embeddings;
  double rope_theta;
  double rms_norm_eps;
  bool attention_bias;
  bool qk_norm;
  // config.json's "rope_scaling" of rope_type "llama3"; rope_factor 0: none (no rope_scaling).
  double rope_factor;
  double rope_low_freq_factor;
  double rope_high_freq_factor;
  int rope_original_max_position;
};

// From each model's published config.json (Hugging Face: meta-llama/Llama-3.2-1B,
// meta-llama/Llama-3.2-3B, meta-llama/Llama-3.1-8B, meta-llama/Llama-3.1-70B,
// mistralai/Mistral-7B-v0.3, Qwen/Qwen2.5-7B, Qwen/Qwen3-8B, Qwen/Qwen3-4B). All ship in bf16.
constexpr ModelEntry kModels[] = {
    {"llama-3.2-1b", "Llama-3.2-1B", 2048, 16, 32, 8, 64, 8192, 128256, true, 500000.0, 1e-5,
     false, false, 32.0, 1.0, 4.0, 8192},
    {"llama-3.2-3b", "Llama-3.2-3B", 3072, 28, 24, 8, 128, 8192, 128256, true, 500000.0, 1e-5,
     false, false, 32.0, 1.0, 4.0, 8192},
    {"llama-3.1-8b", "Llama-3.1-8B", 4096, 32, 32, 8, 128, 14336, 128256, false, 500000.0, 1e-5,
     false, false, 8.0, 1.0, 4.0, 8192},
    {"llama-3.1-70b", "Llama-3.1-70B", 8192, 80, 64, 8, 128, 28672, 128256, false, 500000.0, 1e-5,
     false, false, 8.0, 1.0, 4.0, 8192},
    {"mistral-7b-v0.3", "Mistral-7B-v0.3", 4096, 32, 32, 8, 128, 14336, 32768, false, 1000000.0,
     1e-5, false, false, 0.0, 0.0, 0.0, 0},
    {"qwen2.5-7b", "Qwen2.5-7B", 3584, 28, 28, 4, 128, 18944, 152064, false, 1000000.0, 1e-6, true,
     false, 0.0, 0.0, 0.0, 0},
    {"qwen3-8b", "Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936, false, 1000000.0, 1e-6, false,
     true, 0.0, 0.0, 0.0, 0},
    {"qwen3-4b", "Qwen3-4B", 2560, 36, 32, 8, 128, 9728, 151936, true, 1000000.0, 1e-6, false,
     true, 0.0, 0.0, 0.0, 0},
};

struct GpuEntry {
  const char* key;
  const char* short_key;
  const char* display_name;
  int64_t total_mib;  // nvidia-smi memory.total
  int sm_count;
};

// Totals: nvidia-smi's memory.total of each board (MiB). SMs: NVIDIA's product specifications.
constexpr GpuEntry kGpus[] = {
    {"h100-80gb", "h100", "NVIDIA H100 80GB HBM3", 81559, 132},
    {"h200-141gb", "h200", "NVIDIA H200", 143771, 132},
    {"a100-80gb", "a100", "NVIDIA A100-SXM4-80GB", 81920, 108},
    {"l40s-48gb", "l40s", "NVIDIA L40S", 46068, 142},
};

}  // namespace

absl::StatusOr<ModelShape> ModelPreset(absl::string_view name) {
  const std::string key = absl::AsciiStrToLower(name);
  for (const ModelEntry& m : kModels) {
    if (key != m.key) continue;
    ModelShape shape;
    shape.set_name(m.display_name);
    shape.set_hidden_size(m.hidden_size);
    shape.set_num_layers(m.num_layers);
    shape.set_num_heads(m.num_heads);
    shape.set_num_kv_heads(m.num_kv_heads);
    shape.set_head_dim(m.head_dim);
    shape.set_intermediate_size(m.intermediate_size);
    shape.set_vocab_size(m.vocab_size);
    shape.set_dtype(config::DTYPE_BF16);
    shape.set_tie_embeddings(m.tie_embeddings);
    shape.set_rope_theta(m.rope_theta);
    shape.set_rms_norm_eps(m.rms_norm_eps);
    shape.set_attention_bias(m.attention_bias);
    shape.set_qk_norm(m.qk_norm);
    if (m.rope_factor != 0.0) {
      config::RopeScaling* scaling = shape.mutable_rope_scaling();
      scaling->set_rope_type("llama3");
      scaling->set_factor(m.rope_factor);
      scaling->set_low_freq_factor(m.rope_low_freq_factor);
      scaling->set_high_freq_factor(m.rope_high_freq_factor);
      scaling->set_original_max_position_embeddings(m.rope_original_max_position);
    }
    return shape;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("Unknown model preset ", Quoted(name), "; use one of ",
                   absl::StrJoin(ModelPresetNames(), ", "),
                   " or give the shape field by field (hidden_size, num_layers, ...)"));
}

absl::StatusOr<GpuSpec> GpuPreset(absl::string_view name) {
  const std::string key = absl::AsciiStrToLower(name);
  for (const GpuEntry& g : kGpus) {
    if (key != g.key && key != g.short_key) continue;
    GpuSpec gpu;
    gpu.set_name(g.display_name);
    gpu.set_total_bytes(static_cast<uint64_t>(g.total_mib) << 20);
    gpu.set_sm_count(g.sm_count);
    return gpu;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "Unknown GPU preset ", Quoted(name), "; use one of ", absl::StrJoin(GpuPresetNames(), ", "),
      ", \"auto\" on a GPU machine, or give total_bytes and sm_count"));
}

bool IsAutoGpuPreset(absl::string_view name) { return absl::AsciiStrToLower(name) == "auto"; }

bool UsesDeviceGpu(const config::PlannerConfig& config) {
  return IsAutoGpuPreset(config.gpu_preset()) ||
         (!config.has_gpu_preset() && !config.gpu().has_total_bytes());
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const ModelEntry& m : kModels) names.push_back(m.key);
  return names;
}

std::vector<std::string> GpuPresetNames() {
  std::vector<std::string> names;
  for (const GpuEntry& g : kGpus) names.push_back(g.key);
  return names;
}

config::PlannerConfig DefaultPlannerConfig() {
  config::PlannerConfig config;
  config.set_model_preset("llama-3.1-8b");
  config.set_gpu_preset("h100-80gb");
  config.set_gpu_memory_utilization(0.9);
  config.set_max_num_seqs(256);
  config.set_max_num_batched_tokens(8192);
  config.mutable_graph()->set_mode(config::GRAPH_MODE_DECODE);
  config.set_block_size(64);
  config.set_tensor_parallel_size(1);
  config.set_max_model_len(4096);
  return config;
}

}  // namespace kiln
