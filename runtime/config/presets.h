// Published model shapes and GPU kinds by name, and kiln's default planner configuration.
//
//   ASSIGN_OR_RETURN(kiln::config::ModelShape shape, kiln::ModelPreset("llama-3.1-8b"));
//   ASSIGN_OR_RETURN(kiln::config::GpuSpec gpu, kiln::GpuPreset("h100-80gb"));
//   kiln::config::PlannerConfig config = kiln::DefaultPlannerConfig();
//
// Names are matched without regard to case. Model shapes are the published config.json values
// of each model; GPU totals are the memory.total nvidia-smi reports for the board (the CUDA
// runtime reports a few hundred MiB less on the same board: on the machine itself, query the
// device instead, e.g. the memory planner's --gpu=auto). Thread-safe; no CUDA.
#ifndef KILN_RUNTIME_CONFIG_PRESETS_H_
#define KILN_RUNTIME_CONFIG_PRESETS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/config/gpu_spec.pb.h"
#include "runtime/config/model_shape.pb.h"
#include "runtime/config/planner_config.pb.h"

namespace kiln {

// Returns the shape of the model named `name` (e.g. "llama-3.1-8b"), every field set (rope_scaling
// only where the model's config.json has one), or InvalidArgument naming the unknown name and
// listing the known ones.
absl::StatusOr<config::ModelShape> ModelPreset(absl::string_view name);

// Returns the GPU named `name` (e.g. "h100-80gb" or its short form "h100"), every field set, or
// InvalidArgument naming the unknown name and listing the known ones.
absl::StatusOr<config::GpuSpec> GpuPreset(absl::string_view name);

// Returns true for the GPU preset "auto" (any case): the GPU is the device's, looked up where the
// config is used (the Runner, the memory_planner CLI); GpuPreset itself refuses it.
bool IsAutoGpuPreset(absl::string_view name);

// Returns true where the Runner plans for the GPU it runs on: gpu_preset "auto" (any case), or
// neither a GPU preset nor gpu.total_bytes (the config's other GPU fields still override the
// device's).
bool UsesDeviceGpu(const config::PlannerConfig& config);

// The preset that stands in for the device's GPU where a config is checked before the device is
// looked up (its memory and SMs size only the KV cache, which such a check leaves out).
inline constexpr char kStandInGpuPreset[] = "h100-80gb";

// Returns the canonical model preset names, in a fixed order.
std::vector<std::string> ModelPresetNames();

// Returns the canonical GPU preset names, in a fixed order.
std::vector<std::string> GpuPresetNames();

// Returns kiln's default planner inputs: Llama-3.1-8B on an H100 80GB, gpu_memory_utilization
// 0.9, max_num_seqs 256, max_num_batched_tokens 8192, decode graphs at the default capture sizes
// (full graphs, prefill budgets captured too, as the Runner does), KV blocks of 64 tokens in the
// model's dtype, no tensor parallelism, max_model_len 4096 (the Runner's default).
config::PlannerConfig DefaultPlannerConfig();

}  // namespace kiln

#endif  // KILN_RUNTIME_CONFIG_PRESETS_H_
