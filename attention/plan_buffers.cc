#include "attention/plan_buffers.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status.h"

namespace kiln {
namespace {

// Allocates `bytes` named `name`, or leaves `out` empty for a zero-sized buffer.
absl::Status AllocateIfNeeded(size_t bytes, const char* name, DeviceBuffer* out) {
  if (bytes == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(*out, DeviceBuffer::Allocate(bytes, name));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PlanBuffers> PlanBuffers::Create(const PlanLayout& layout) {
  PlanBuffers buffers;
  buffers.layout_ = layout;
  ASSIGN_OR_RETURN(buffers.host_, PinnedHostBuffer::Allocate(layout.plan_bytes, "plan (pinned)"));
  std::memset(buffers.host_.data(), 0, layout.plan_bytes);
  ASSIGN_OR_RETURN(buffers.device_, DeviceBuffer::Allocate(layout.plan_bytes, "plan"));
  RETURN_IF_ERROR(
      AllocateIfNeeded(layout.decode.partial_o_bytes, "decode partial_o", &buffers.decode_o_));
  RETURN_IF_ERROR(AllocateIfNeeded(layout.decode.partial_lse_bytes, "decode partial_lse",
                                   &buffers.decode_lse_));
  RETURN_IF_ERROR(
      AllocateIfNeeded(layout.prefill.partial_o_bytes, "prefill partial_o", &buffers.prefill_o_));
  RETURN_IF_ERROR(AllocateIfNeeded(layout.prefill.partial_lse_bytes, "prefill partial_lse",
                                   &buffers.prefill_lse_));
  RETURN_IF_ERROR(AllocateIfNeeded(layout.decode.merge_counter_bytes, "decode merge counters",
                                   &buffers.decode_counters_));
  RETURN_IF_ERROR(AllocateIfNeeded(layout.prefill.merge_counter_bytes, "prefill merge counters",
                                   &buffers.prefill_counters_));
  for (const DeviceBuffer* counters : {&buffers.decode_counters_, &buffers.prefill_counters_}) {
    if (counters->size() == 0) continue;
    RETURN_IF_ERROR(FillDeviceAndWait(counters->data(), 0, counters->size(), counters->name()));
  }
  return buffers;
}

absl::Status PlanBuffers::Upload(cudaStream_t stream) const {
  RETURN_IF_ERROR(CheckNotCapturing(stream, "PlanBuffers::Upload"));
  return ToStatus(cudaMemcpyAsync(device_.data(), host_.data(), layout_.plan_bytes,
                                  cudaMemcpyHostToDevice, stream),
                  "cudaMemcpyAsync(plan)");
}

AttentionPlanPartDevice PlanPartDeviceView(const PlanLayout& layout, const PlanPartLayout& part,
                                           const char* plan, const DeviceBuffer& partial_o,
                                           const DeviceBuffer& partial_lse,
                                           const DeviceBuffer& merge_counters) {
  AttentionPlanPartDevice view;
  if (!part.enabled) return view;
  view.header = reinterpret_cast<const AttentionPlanHeader*>(plan + part.header_offset);
  view.seq_q_start = reinterpret_cast<const int32_t*>(plan + layout.seq_q_start_offset);
  view.seq_kv_len = reinterpret_cast<const int32_t*>(plan + layout.seq_kv_len_offset);
  view.max_seqs = layout.max_seqs;
  view.work_items = reinterpret_cast<const AttentionWorkItem*>(plan + part.work_items_offset);
  view.work_capacity = part.work_capacity;
  view.merge_items = reinterpret_cast<const AttentionMergeItem*>(plan + part.merge_items_offset);
  view.merge_capacity = part.merge_capacity;
  view.tile_rows = part.tile_rows;
  view.partial_o = partial_o.as<float>();
  view.partial_lse = partial_lse.as<float>();
  view.slot_capacity = part.slot_capacity;
  if (part.merge_counter_bytes > 0 && merge_counters.size() >= part.merge_counter_bytes) {
    view.merge_counters = merge_counters.as<int32_t>();
  }
  return view;
}

AttentionPlanPartDevice PlanBuffers::Part(const PlanPartLayout& part, const DeviceBuffer& o,
                                          const DeviceBuffer& lse,
                                          const DeviceBuffer& counters) const {
  return PlanPartDeviceView(layout_, part, static_cast<const char*>(device_.data()), o, lse,
                            counters);
}

}  // namespace kiln
