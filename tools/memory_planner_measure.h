// The memory planner's --measure mode: builds the Runner for real on GPU 0 from a planner config
// (weights, KV cache, activation arena, graph pool, logits, captures of every planned graph: the
// Runner's options follow the config's graph execution, prefill budgets and max_model_len) and
// puts each term the planner predicted beside what the device's free memory says it cost.
//
//   ASSIGN_OR_RETURN(kiln::MeasuredPlan m, kiln::MeasurePlan(config));
//   std::cout << kiln::RenderMeasured(m);   // predicted | measured | note, then a Calibration
//
// Measured: every allocation as a cudaMemGetInfo delta; the CUDA context and kernel modules as
// what the device lost before the first allocation plus what lazily loaded modules took during a
// first eager step; the graph executables as the delta across Capture (the pool is reserved
// before it); the pool's high-water mark. From these it derives the calibration constants
// (graph_bytes_per_node with the per-graph estimate held, cuBLASLt workspace, margin); the
// activations need none, the planner counts the model's layout. Needs a GPU; not thread-safe.
#ifndef KILN_TOOLS_MEMORY_PLANNER_MEASURE_H_
#define KILN_TOOLS_MEMORY_PLANNER_MEASURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/config/planner_config.pb.h"
#include "runtime/memory/memory_planner.h"

namespace kiln {

// One line of the comparison.
struct MeasuredTerm {
  std::string name;       // the planner's term name
  int64_t predicted = 0;  // the planner's bytes
  int64_t measured = 0;   // what the device lost for it
  std::string note;
};

struct MeasuredPlan {
  MemoryPlan plan;  // what the planner predicted for the device
  std::vector<MeasuredTerm> terms;
  int num_graphs = 0;
  int64_t num_nodes = 0;
  double capture_seconds = 0;
  int64_t pool_high_water = 0;
  // Calibration derived from the measurement.
  config::Calibration calibration;
};

// Returns what MeasurePlan refuses in `config` before it looks for a GPU: what the planner
// rejects, a model the Runner cannot build (its shape, sliding window or KV cache dtype), and
// tensor parallelism, as one process on GPU 0 measures one rank. `config` names a GPU (a preset
// may stand in for the device's, which sizes only the KV cache). Host-only; thread-safe.
absl::Status CheckMeasurable(const config::PlannerConfig& config);

// Runs the measurement for `config` on GPU 0, whose GPU fields must be set (the CLI fills them
// from the device, as for --gpu=auto; a gpu_preset of "auto" is refused as the planner refuses it).
// InvalidArgument as CheckMeasurable says, checked first; FailedPrecondition without a GPU; what
// Runner::Create returns on other bad input.
absl::StatusOr<MeasuredPlan> MeasurePlan(const config::PlannerConfig& config);

// Returns the comparison as a table followed by the calibration as a textproto block. The title
// writes the model and GPU names as Escaped does (runtime/config/quoted.h). Host-only.
std::string RenderMeasured(const MeasuredPlan& measured);

}  // namespace kiln

#endif  // KILN_TOOLS_MEMORY_PLANNER_MEASURE_H_
