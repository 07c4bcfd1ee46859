// PlanBuffers: the pinned host blob a SplitKvPlanner writes, the fixed device buffers it is
// copied into with one asynchronous copy, and the partial workspaces of the split parts, all
// sized by a PlanLayout (so by the capture key alone) and allocated once.
//
//   ASSIGN_OR_RETURN(kiln::PlanBuffers buffers, kiln::PlanBuffers::Create(planner.layout()));
//   // every step, before the eager launch or the graph replay (replay-prepare):
//   ASSIGN_OR_RETURN(kiln::PlanSummary s, planner.Plan(seqs, buffers.host_plan()));
//   RETURN_IF_ERROR(buffers.Upload(stream));
//   decode_params.plan = buffers.decode();   // device pointers, stable for the buffers' life
//
// Device addresses never change after Create, so a graph captured once reads every later
// step's plan. Upload is one cudaMemcpyAsync from pinned memory; it returns FailedPrecondition
// during capture (the plan must reach the device before a replay, not inside it). The copy reads
// host_plan() when the stream reaches it: plan the next step only after that (e.g. after the
// step's results were synchronised). Movable, not copyable; not thread-safe.
#ifndef KILN_ATTENTION_PLAN_BUFFERS_H_
#define KILN_ATTENTION_PLAN_BUFFERS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/attention_params.h"
#include "attention/split_kv_planner.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/pinned_buffer.h"

namespace kiln {

// Returns the device view of `part` inside a plan blob at device address `plan` laid out as
// `layout`, with the given partial workspace and merge counters (all null for a disabled part;
// counters too small for the part, or empty, leave the merge to the merge kernel). PlanBuffers
// uses it for its own blob; a caller that uploads plans elsewhere (e.g. inside a larger step
// blob) with workspaces shared between layouts uses it directly.
AttentionPlanPartDevice PlanPartDeviceView(const PlanLayout& layout, const PlanPartLayout& part,
                                           const char* plan, const DeviceBuffer& partial_o,
                                           const DeviceBuffer& partial_lse,
                                           const DeviceBuffer& merge_counters);

class PlanBuffers {
 public:
  // Allocates the pinned blob, its device copy and the workspaces of `layout`, each named as in
  // PlanLayout::Buffers() ("plan", "decode partial_o", ...), and zeroes the merge counters.
  // Not during capture.
  static absl::StatusOr<PlanBuffers> Create(const PlanLayout& layout);

  PlanBuffers() = default;
  PlanBuffers(PlanBuffers&&) = default;
  PlanBuffers& operator=(PlanBuffers&&) = default;

  // Returns the pinned blob (layout().plan_bytes bytes) that SplitKvPlanner::Plan fills.
  void* host_plan() const { return host_.data(); }

  // Copies the whole blob to the device on `stream` (asynchronous, one copy).
  // FailedPrecondition during capture.
  absl::Status Upload(cudaStream_t stream) const;

  // Returns the device view of each part (all null for a disabled part).
  AttentionPlanPartDevice decode() const {
    return Part(layout_.decode, decode_o_, decode_lse_, decode_counters_);
  }
  AttentionPlanPartDevice prefill() const {
    return Part(layout_.prefill, prefill_o_, prefill_lse_, prefill_counters_);
  }

  const PlanLayout& layout() const { return layout_; }

 private:
  AttentionPlanPartDevice Part(const PlanPartLayout& part, const DeviceBuffer& o,
                               const DeviceBuffer& lse, const DeviceBuffer& counters) const;

  PlanLayout layout_;
  PinnedHostBuffer host_;
  DeviceBuffer device_;
  DeviceBuffer decode_o_;
  DeviceBuffer decode_lse_;
  DeviceBuffer decode_counters_;
  DeviceBuffer prefill_o_;
  DeviceBuffer prefill_lse_;
  DeviceBuffer prefill_counters_;
};

}  // namespace kiln

#endif  // KILN_ATTENTION_PLAN_BUFFERS_H_
