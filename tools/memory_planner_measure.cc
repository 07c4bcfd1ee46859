#include "tools/memory_planner_measure.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/config/quoted.h"
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

absl::Status CheckMeasurable(const config::PlannerConfig& config) {
  ASSIGN_OR_RETURN(config::PlannerConfig resolved, ResolvePlannerConfig(config));
  absl::Status runnable = CheckRunnerModel(resolved, resolved.max_model_len()).status();
  if (!runnable.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--measure builds kiln's runner, which refuses this config: ", runnable.message(),
        " (without --measure it is planned)"));
  }
  if (resolved.tensor_parallel_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--measure runs one rank on GPU 0 and cannot measure tensor_parallel_size ",
        resolved.tensor_parallel_size(), "; set --tensor_parallel_size=1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MeasuredPlan> MeasurePlan(const config::PlannerConfig& config) {
  RETURN_IF_ERROR(CheckMeasurable(config));
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

  // The Runner captures exactly the graphs the planner counts: its options follow the config.
  ASSIGN_OR_RETURN(config::PlannerConfig resolved, ResolvePlannerConfig(config));
  const config::GraphConfig& graph = resolved.graph();
  RunnerOptions options;
  options.config = config;
  options.graphs = graph.execution() == config::GRAPH_EXECUTION_PIECEWISE
                       ? GraphExecution::kPiecewise
                       : GraphExecution::kFull;
  options.capture_prefill = graph.capture_prefill();
  options.prefill_sizes.assign(graph.prefill_sizes().begin(), graph.prefill_sizes().end());
  options.max_model_len = resolved.max_model_len();
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
      absl::StrFormat("delta across Capture: %d graphs, %d nodes (counted: %d, %d), %.2f s",
                      m.num_graphs, m.num_nodes, p.num_graphs, p.num_graph_nodes,
                      m.capture_seconds));
  add("custom_allreduce", 0, "not measured (tensor_parallel_size 1)");
  add("nccl", 0, "not measured (tensor_parallel_size 1)");
  add("cublaslt_workspace", Measured(*runner, "cublaslt_workspace"), "Gemm::Create");
  add("logits", Measured(*runner, "logits"), "float logits + next tokens");
  add("margin", context_bytes + module_bytes,
      absl::StrCat("CUDA context ", FormatBytes(context_bytes), " + lazily loaded kernels ",
                   FormatBytes(module_bytes), "; fragmentation is not measured"));
  add("kv_cache", Measured(*runner, "kv_cache"),
      absl::StrCat(runner->num_kv_blocks(), " blocks allocated"));

  // One capture cannot tell the cost per graph from the cost per node: the per-graph estimate
  // (fitted to full and piecewise captures) is held, and the rest is spread over the nodes.
  if (m.num_nodes > 0) {
    const int64_t node_bytes = std::max<int64_t>(
        captured.device_bytes - m.num_graphs * p.estimates.graph_bytes_per_graph, 0);
    m.calibration.set_graph_bytes_per_node(static_cast<uint64_t>(node_bytes / m.num_nodes));
  }
  m.calibration.set_cublaslt_workspace_bytes(
      static_cast<uint64_t>(Measured(*runner, "cublaslt_workspace")));
  m.calibration.set_margin_bytes(static_cast<uint64_t>(context_bytes + module_bytes));
  return m;
}

std::string RenderMeasured(const MeasuredPlan& m) {
  // The GPU and model names come from the user (a flag, a config file, a model directory):
  // escaped, as the plan's table writes them, so that none breaks the title's line or sends a
  // terminal sequence.
  std::string out = absl::StrFormat(
      "Measured on %s (%s): %s, %d %s graphs\n", Escaped(m.plan.config.gpu().name()),
      FormatBytes(m.plan.total_bytes), Escaped(m.plan.config.model().name()), m.num_graphs,
      m.plan.config.graph().execution() == config::GRAPH_EXECUTION_PIECEWISE ? "piecewise"
                                                                               : "full");
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
  if (c.has_graph_bytes_per_node()) {
    absl::StrAppend(&out, "  graph_bytes_per_node: ", c.graph_bytes_per_node(), "\n");
  }
  absl::StrAppend(&out, "  cublaslt_workspace_bytes: ", c.cublaslt_workspace_bytes(), "\n");
  absl::StrAppend(&out, "  margin_bytes: ", c.margin_bytes(), "\n}\n");
  return out;
}

}  // namespace kiln
