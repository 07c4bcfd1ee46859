#include "tools/memory_planner_measure.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/runner/runner.h"

namespace kiln {
namespace {

absl::StatusOr<int64_t> FreeBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

int64_t Measured(const Runner& runner, const std::string& name) {
  const RunnerMemoryItem* item = runner.memory().Find(name);
  return item == nullptr ? 0 : item->measured_bytes;
}

int64_t Predicted(const MemoryPlan& plan, const std::string& name) {
  const MemoryTerm* term = plan.Find(name);
  return term == nullptr ? 0 : term->bytes;
}

}  // namespace

absl::StatusOr<MeasuredPlan> MeasurePlan(const config::PlannerConfig& config) {
  if (DeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "--measure needs a GPU, and no CUDA device is visible on this machine; run without "
        "--measure for the estimate");
  }
  // The context: what the device has lost before kiln allocates anything (on an idle GPU).
  CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  CUDA_RETURN_IF_ERROR(cudaFree(nullptr));
  size_t free0 = 0, total = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free0, &total));
  const int64_t context_bytes = static_cast<int64_t>(total) - static_cast<int64_t>(free0);

  RunnerOptions options;
  options.config = config;
  options.graphs = GraphExecution::kFull;
  options.capture_prefill = false;  // capture exactly the graphs the planner counts
  options.progress = CaptureProgress::kNone;
  ASSIGN_OR_RETURN(std::unique_ptr<Runner> runner, Runner::Create(options));

  MeasuredPlan m;
  m.plan = runner->memory_plan();

  // Kernel modules load lazily at their first launch: one eager prefill and decode step first.
  ASSIGN_OR_RETURN(int64_t before_modules, FreeBytes());
  std::vector<SequenceTokens> prompt = {{0, std::vector<int32_t>(40, 1)}};
  StepOptions eager;
  eager.force_eager = true;
  RETURN_IF_ERROR(runner->Step(prompt, eager).status());
  RETURN_IF_ERROR(runner->Step({{0, {2}}}, eager).status());
  RETURN_IF_ERROR(runner->Release(0));
  ASSIGN_OR_RETURN(int64_t after_modules, FreeBytes());
  const int64_t module_bytes = before_modules - after_modules;

  ASSIGN_OR_RETURN(RunnerCaptureSummary captured, runner->Capture());
  m.num_graphs = captured.num_graphs;
  m.num_nodes = static_cast<int64_t>(captured.num_nodes);
  m.capture_seconds = captured.seconds;
  m.pool_high_water = static_cast<int64_t>(captured.pool_bytes);
  m.largest_capture = m.plan.config.graph().max_capture_size();

  const MemoryPlan& p = m.plan;
  auto add = [&m, &p](const std::string& name, int64_t measured, std::string note) {
    m.terms.push_back(MeasuredTerm{name, Predicted(p, name), measured, std::move(note)});
  };
  add("weights", Measured(*runner, "weights"), "cudaMemGetInfo delta of the allocation");
  add("activation_arena", Measured(*runner, "activation_arena"),
      absl::StrCat("eager arena for ", p.config.max_num_batched_tokens(), " tokens"));
  add("attention_workspace",
      Measured(*runner, "attention_workspace") + Measured(*runner, "step_metadata"),
      "split-kv partials of every key (shared) + the step metadata blob");
  const RunnerMemoryItem* pool_item = runner->memory().Find("graph_pool");
  add("graph_pool", m.pool_high_water,
      absl::StrCat("high-water mark of ", m.num_graphs, " captures (",
                   FormatBytes(pool_item ? pool_item->measured_bytes : 0), " reserved)"));
  add("graph_executables", captured.device_bytes,
      absl::StrFormat("delta across Capture: %d graphs, %d nodes, %.2f s", m.num_graphs,
                      m.num_nodes, m.capture_seconds));
  add("custom_allreduce", 0, "not measured (tensor_parallel_size 1)");
  add("nccl", 0, "not measured (tensor_parallel_size 1)");
  add("cublaslt_workspace", Measured(*runner, "cublaslt_workspace"), "Gemm::Create");
  add("logits", Measured(*runner, "logits"), "float logits + next tokens");
  add("margin", context_bytes + module_bytes,
      absl::StrCat("CUDA context ", FormatBytes(context_bytes), " + lazily loaded kernels ",
                   FormatBytes(module_bytes), "; fragmentation is not measured"));
  add("kv_cache", Measured(*runner, "kv_cache"),
      absl::StrCat(runner->num_kv_blocks(), " blocks allocated"));

  if (m.num_nodes > 0) {
    m.calibration.set_graph_bytes_per_node(
        static_cast<uint64_t>(std::max<int64_t>(captured.device_bytes, 0) / m.num_nodes));
  }
  if (m.largest_capture > 0 && m.pool_high_water > 0) {
    m.calibration.set_activation_bytes_per_token(
        static_cast<uint64_t>((m.pool_high_water + m.largest_capture - 1) / m.largest_capture));
  }
  m.calibration.set_cublaslt_workspace_bytes(
      static_cast<uint64_t>(Measured(*runner, "cublaslt_workspace")));
  m.calibration.set_margin_bytes(static_cast<uint64_t>(context_bytes + module_bytes));
  return m;
}

std::string RenderMeasured(const MeasuredPlan& m) {
  std::string out = absl::StrFormat(
      "Measured on %s (%s): %s, %d graphs of %s\n", m.plan.config.gpu().name(),
      FormatBytes(m.plan.total_bytes), m.plan.config.model().name(), m.num_graphs,
      m.plan.config.graph().mode() == config::GRAPH_MODE_PREFILL_ONLY ? "prefill" : "decode");
  absl::StrAppendFormat(&out, "%-20s %12s %12s %8s  %s\n", "term", "predicted", "measured",
                        "diff", "how it was measured");
  for (const MeasuredTerm& t : m.terms) {
    std::string diff = "-";
    if (t.predicted > 0) {
      diff = absl::StrFormat("%+.1f%%", 100.0 * (t.measured - t.predicted) / t.predicted);
    }
    absl::StrAppendFormat(&out, "%-20s %12s %12s %8s  %s\n", t.name, FormatBytes(t.predicted),
                          FormatBytes(t.measured), diff, t.note);
  }
  absl::StrAppend(&out,
                  "\nCalibration measured here (a PlannerConfig's calibration; --graph_bytes_per_"
                  "node etc.):\ncalibration {\n");
  const config::Calibration& c = m.calibration;
  if (c.has_activation_bytes_per_token()) {
    absl::StrAppend(&out, "  activation_bytes_per_token: ", c.activation_bytes_per_token(), "\n");
  }
  if (c.has_graph_bytes_per_node()) {
    absl::StrAppend(&out, "  graph_bytes_per_node: ", c.graph_bytes_per_node(), "\n");
  }
  absl::StrAppend(&out, "  cublaslt_workspace_bytes: ", c.cublaslt_workspace_bytes(), "\n");
  absl::StrAppend(&out, "  margin_bytes: ", c.margin_bytes(), "\n}\n");
  return out;
}

}  // namespace kiln
