#include "attention/merge_kernel.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "attention/internal/dispatch.h"
#include "attention/internal/kernel_args.h"
#include "attention/internal/unchecked_launch.h"
#include "runtime/cuda/status.h"

namespace kiln {

absl::Status ValidateAttentionMergeParams(const AttentionMergeParams& params) {
  const AttentionPlanPartDevice& plan = params.plan;
  RETURN_IF_ERROR(CheckAttentionDtype(params.dtype, "Merge"));
  if (params.num_q_heads <= 0 || params.num_kv_heads <= 0 ||
      params.num_q_heads % params.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Merge heads (", params.num_q_heads, " query, ", params.num_kv_heads,
        " KV) must be positive with query heads a multiple of KV heads"));
  }
  // The grid's y dimension is the KV head (at most 65535).
  if (params.num_kv_heads > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Merge num_kv_heads ", params.num_kv_heads, " is above 65535; split the heads over ranks"));
  }
  if (params.head_dim != 64 && params.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("Merge head_dim ", params.head_dim, " is not supported; use 64 or 128"));
  }
  if (params.o == nullptr || plan.merge_items == nullptr || plan.seq_q_start == nullptr ||
      plan.partial_o == nullptr || plan.partial_lse == nullptr || plan.tile_rows <= 0) {
    return absl::InvalidArgumentError(
        "Merge needs o, the plan's merge items, seq_q_start and partial workspace; pass "
        "PlanBuffers::decode() or prefill() as plan");
  }
  // Each thread writes 8 elements of o and reads 8 floats of partial_o as 16-byte vectors.
  const int64_t row = static_cast<int64_t>(params.num_q_heads) * params.head_dim;
  if ((params.o_stride != 0 && (params.o_stride < row || params.o_stride % 8 != 0)) ||
      reinterpret_cast<uintptr_t>(params.o) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(plan.partial_o) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Merge o_stride ", params.o_stride,
        " must be 0 or a multiple of 8 of at least num_q_heads × head_dim = ", row,
        ", with o and partial_o 16-byte aligned"));
  }
  return absl::OkStatus();
}

absl::Status attention_internal::LaunchAttentionMergeUnchecked(const AttentionMergeParams& params,
                                                               cudaStream_t stream) {
  const AttentionPlanPartDevice& plan = params.plan;
  if (plan.merge_capacity <= 0) return absl::OkStatus();
  attention_internal::MergeKernelArgs args;
  args.o = params.o;
  args.o_stride = params.o_stride != 0
                      ? params.o_stride
                      : static_cast<int64_t>(params.num_q_heads) * params.head_dim;
  args.seq_q_start = plan.seq_q_start;
  args.merge_items = plan.merge_items;
  args.partial_o = plan.partial_o;
  args.partial_lse = plan.partial_lse;
  args.tile_rows = plan.tile_rows;
  args.num_q_heads = params.num_q_heads;
  args.num_kv_heads = params.num_kv_heads;
  args.group_size = params.num_q_heads / params.num_kv_heads;
  const int grid = plan.merge_capacity;
  return DISPATCH_DTYPE(params.dtype, kDtype, [&] {
    return DISPATCH_HEAD_DIM(params.head_dim, kHeadDim, [&] {
      return ToStatus(attention_internal::LaunchMergeKernel<kDtype, kHeadDim>(args, grid, stream),
                      "attention merge kernel launch");
    });
  });
}

absl::Status LaunchAttentionMerge(const AttentionMergeParams& params, cudaStream_t stream) {
  if (params.plan.merge_capacity <= 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateAttentionMergeParams(params));
  return attention_internal::LaunchAttentionMergeUnchecked(params, stream);
}

}  // namespace kiln
