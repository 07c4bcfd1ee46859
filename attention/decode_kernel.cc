#include "attention/decode_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attention/internal/dispatch.h"
#include "attention/internal/kernel_args.h"
#include "attention/internal/unchecked_launch.h"
#include "attention/merge_kernel.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

constexpr int kMaxTileRows = 16;  // the kernel's MMA tile height

int Log2(int power_of_two) {
  int log = 0;
  while ((1 << log) < power_of_two) ++log;
  return log;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The merge that RunDecodeAttention launches after the kernel of `p`.
AttentionMergeParams MergeParams(const DecodeAttentionParams& p) {
  AttentionMergeParams merge;
  merge.dtype = p.dtype;
  merge.num_q_heads = p.num_q_heads;
  merge.num_kv_heads = p.num_kv_heads;
  merge.head_dim = p.head_dim;
  merge.o = p.o;
  merge.o_stride = p.o_stride;
  merge.plan = p.plan;
  return merge;
}

}  // namespace

absl::Status DecodeAttentionSupportsShape(int num_q_heads, int num_kv_heads, int head_dim) {
  if (num_q_heads <= 0 || num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Decode heads (", num_q_heads, " query, ", num_kv_heads,
        " KV) must be positive with query heads a multiple of KV heads"));
  }
  // The grid's y dimension is the KV head (at most 65535): refused here, not at launch, where
  // it would break a capture in progress.
  if (num_kv_heads > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Decode num_kv_heads ", num_kv_heads, " is above 65535; split the heads over ranks"));
  }
  if (head_dim != 64 && head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Decode attention has no kernel for head_dim ", head_dim, "; it is built for 64 and 128"));
  }
  const std::vector<int> groups = {KILN_DECODE_GROUPS};
  const int group = num_q_heads / num_kv_heads;
  if (std::find(groups.begin(), groups.end(), group) == groups.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Decode attention has no kernel for ", num_q_heads, " query heads over ", num_kv_heads,
        " KV heads (", group, " per KV head); it is built for ", absl::StrJoin(groups, ", "),
        " (KILN_DECODE_GROUPS, attention/internal/kernel_args.h, names the instantiations)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RopeFrequencies> attention_internal::ValidateDecodeAttention(
    const DecodeAttentionParams& p) {
  RETURN_IF_ERROR(CheckAttentionDtype(p.dtype, "Decode"));
  RETURN_IF_ERROR(DecodeAttentionSupportsShape(p.num_q_heads, p.num_kv_heads, p.head_dim));
  const int group = p.num_q_heads / p.num_kv_heads;
  const int bs = p.kv.block_size;
  if (bs < 16 || (bs & (bs - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Decode KV block_size ", bs, " must be a power of two of at least 16"));
  }
  if (p.plan.tile_rows < group || p.plan.tile_rows > kMaxTileRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Decode plan tile_rows ", p.plan.tile_rows, " must be between the group size ", group,
        " and ", kMaxTileRows, "; plan the decode part with such tile_rows"));
  }
  if (p.q == nullptr || p.o == nullptr || p.kv.k_cache == nullptr || p.kv.v_cache == nullptr ||
      p.kv.block_table == nullptr || p.plan.work_items == nullptr ||
      p.plan.seq_q_start == nullptr || p.plan.seq_kv_len == nullptr) {
    return absl::InvalidArgumentError(
        "Decode needs q, o, the KV cache, its block table and an uploaded plan part");
  }
  // The kernel moves q, o and the cache in 16-byte vectors.
  if (!Aligned16(p.q) || !Aligned16(p.o) || !Aligned16(p.kv.k_cache) || !Aligned16(p.kv.v_cache)) {
    return absl::InvalidArgumentError(
        "Decode q, o, k_cache and v_cache must each be 16-byte aligned");
  }
  // Row s of the block table starts at s × max_blocks_per_seq.
  if (p.kv.max_blocks_per_seq < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Decode KV max_blocks_per_seq ", p.kv.max_blocks_per_seq,
        " must be positive; pass the block table's row width"));
  }
  if (p.plan.slot_capacity > 0 &&
      (p.plan.partial_o == nullptr || p.plan.partial_lse == nullptr ||
       !Aligned16(p.plan.partial_o))) {
    return absl::InvalidArgumentError(
        "Decode plan part splits but has no (16-byte aligned) partial workspace");
  }
  if (p.plan.merge_counters != nullptr && p.plan.header == nullptr) {
    return absl::InvalidArgumentError("Decode fused merge needs the plan part's header");
  }
  // As the prefill kernel: a negative, infinite or NaN scale gives NaN or meaningless weights.
  if (!(p.sm_scale >= 0.f) || std::isinf(p.sm_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Decode sm_scale ", p.sm_scale, " is not finite and non-negative; 0 means 1/sqrt(d)"));
  }
  const int64_t row = static_cast<int64_t>(p.num_q_heads) * p.head_dim;
  if ((p.q_stride != 0 && (p.q_stride < row || p.q_stride % 8 != 0)) ||
      (p.o_stride != 0 && (p.o_stride < row || p.o_stride % 8 != 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Decode q_stride ", p.q_stride, " and o_stride ", p.o_stride,
        " must be 0 or multiples of 8 of at least num_q_heads × head_dim = ", row));
  }
  const DecodeRopeAppendDevice& r = p.rope_append;
  RopeFrequencies rope_freqs;
  if (r.positions != nullptr) {
    const int64_t kv_row = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
    if (!IsRopeTheta(r.theta)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Decode RoPE theta ", r.theta,
          " must be a finite base above 1 (the model's rope_theta)"));
    }
    absl::StatusOr<RopeFrequencies> freqs = RopeFrequencies::MakeValidated(r.theta, r.scaling);
    if (!freqs.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Decode ", freqs.status().message()));
    }
    rope_freqs = *freqs;
    if (r.k == nullptr || r.v == nullptr || !Aligned16(r.k) || !Aligned16(r.v)) {
      return absl::InvalidArgumentError(
          "Decode RoPE + KV append needs the new k and v, each 16-byte aligned");
    }
    if (r.kv_stride < kv_row || r.kv_stride % 8 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Decode RoPE + KV append kv_stride ", r.kv_stride,
          " must be a multiple of 8 of at least num_kv_heads × head_dim = ", kv_row));
    }
  }
  if (r.q_norm != nullptr || r.k_norm != nullptr) {
    if (r.positions == nullptr || r.q_norm == nullptr || r.k_norm == nullptr ||
        !Aligned16(r.q_norm) || !Aligned16(r.k_norm)) {
      return absl::InvalidArgumentError(
          "Decode QK norm needs the RoPE + KV append (positions) and both q_norm and k_norm, each "
          "16-byte aligned");
    }
    if (p.dtype != AttentionDtype::kBf16 || !(r.qk_norm_eps > 0.f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Decode QK norm runs bf16 with an epsilon above 0 (dtype ",
          p.dtype == AttentionDtype::kBf16 ? "bf16" : "fp16",
          ", qk_norm_eps ", r.qk_norm_eps, ")"));
    }
  }
  return rope_freqs;
}

absl::Status ValidateDecodeAttentionParams(const DecodeAttentionParams& params) {
  return attention_internal::ValidateDecodeAttention(params).status();
}

absl::Status attention_internal::LaunchDecodeAttentionUnchecked(
    const DecodeAttentionParams& params, const RopeFrequencies& rope_freqs, cudaStream_t stream) {
  if (params.plan.work_capacity <= 0) return absl::OkStatus();
  attention_internal::DecodeKernelArgs args;
  const int64_t row = static_cast<int64_t>(params.num_q_heads) * params.head_dim;
  args.q = params.q;
  args.q_stride = params.q_stride != 0 ? params.q_stride : row;
  args.o = params.o;
  args.o_stride = params.o_stride != 0 ? params.o_stride : row;
  args.k_cache = params.kv.k_cache;
  args.v_cache = params.kv.v_cache;
  args.block_table = params.kv.block_table;
  args.max_blocks_per_seq = params.kv.max_blocks_per_seq;
  args.log2_block_size = Log2(params.kv.block_size);
  args.seq_q_start = params.plan.seq_q_start;
  args.seq_kv_len = params.plan.seq_kv_len;
  args.work_items = params.plan.work_items;
  args.header = params.plan.header;
  args.merge_counters = params.plan.merge_counters;
  args.tile_rows = params.plan.tile_rows;
  args.partial_o = params.plan.partial_o;
  args.partial_lse = params.plan.partial_lse;
  args.num_q_heads = params.num_q_heads;
  args.num_kv_heads = params.num_kv_heads;
  const float scale = params.sm_scale != 0.f ? params.sm_scale
                                             : 1.f / std::sqrt(static_cast<float>(params.head_dim));
  args.scale_log2 = scale * 1.4426950408889634f;  // log2(e)
  const DecodeRopeAppendDevice& rope = params.rope_append;
  args.rope_positions = rope.positions;
  args.rope_freqs = rope_freqs;
  args.new_k = rope.k;
  args.new_v = rope.v;
  args.new_kv_stride = rope.kv_stride;
  args.q_norm = rope.q_norm;
  args.k_norm = rope.k_norm;
  args.qk_norm_eps = rope.qk_norm_eps;
  const int group = params.num_q_heads / params.num_kv_heads;
  const int grid = params.plan.work_capacity;
  return DISPATCH_DTYPE(params.dtype, kDtype, [&] {
    return DISPATCH_HEAD_DIM(params.head_dim, kHeadDim, [&] {
      return DISPATCH_GROUP(group, kGroup, [&] {
        return ToStatus(
            attention_internal::LaunchDecodeKernel<kDtype, kHeadDim, kGroup>(args, grid, stream),
            "decode attention kernel launch");
      });
    });
  });
}

absl::Status LaunchDecodeAttention(const DecodeAttentionParams& params, cudaStream_t stream) {
  if (params.plan.work_capacity <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const RopeFrequencies rope_freqs,
                   attention_internal::ValidateDecodeAttention(params));
  return attention_internal::LaunchDecodeAttentionUnchecked(params, rope_freqs, stream);
}

absl::Status RunDecodeAttention(const DecodeAttentionParams& params, cudaStream_t stream) {
  // Both launches are checked before the first is enqueued, so a refused merge does not follow
  // a kernel that already ran (or was captured) and wrote partials nothing merges.
  RopeFrequencies rope_freqs;
  if (params.plan.work_capacity > 0) {
    ASSIGN_OR_RETURN(rope_freqs, attention_internal::ValidateDecodeAttention(params));
  }
  const AttentionMergeParams merge = MergeParams(params);
  // With merge counters the kernel merges its split tiles itself.
  const bool merges = params.plan.merge_counters == nullptr && params.plan.merge_capacity > 0;
  if (merges) RETURN_IF_ERROR(ValidateAttentionMergeParams(merge));
  RETURN_IF_ERROR(
      attention_internal::LaunchDecodeAttentionUnchecked(params, rope_freqs, stream));
  if (!merges) return absl::OkStatus();
  return attention_internal::LaunchAttentionMergeUnchecked(merge, stream);
}

}  // namespace kiln
