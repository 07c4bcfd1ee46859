// Validation and dispatch of the prefill attention kernel; the kernel itself is in
// prefill_kernel_impl.cuh, instantiated per dtype and head_dim in prefill_<dtype>_hd<dim>.cu.
#include "attention/prefill_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attention/internal/unchecked_launch.h"
#include "attention/prefill_kernel_internal.h"
#include "runtime/cuda/status.h"

namespace kiln {
namespace {

using prefill_internal::KernelArgs;

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// One DISPATCH helper per axis; each default names the unsupported value.
template <typename T, int kHeadDim>
absl::Status DispatchTileRows(const PrefillAttentionParams& p, const KernelArgs& args,
                              cudaStream_t stream) {
  cudaError_t err;
  switch (p.tile_rows) {
    case 64:
      err = prefill_internal::LaunchPrefillKernel<T, kHeadDim, 64>(args, p.num_work_items, stream);
      break;
    case 128:
      err = prefill_internal::LaunchPrefillKernel<T, kHeadDim, 128>(args, p.num_work_items, stream);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Prefill tile_rows ", p.tile_rows, " is not supported; use 64 or 128"));
  }
  return ToStatus(err, "prefill attention launch");
}

template <typename T>
absl::Status DispatchHeadDim(const PrefillAttentionParams& p, const KernelArgs& args,
                             cudaStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return DispatchTileRows<T, 64>(p, args, stream);
    case 128:
      return DispatchTileRows<T, 128>(p, args, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Prefill head_dim ", p.head_dim, " is not supported; use 64 or 128"));
  }
}

absl::Status DispatchDtype(const PrefillAttentionParams& p, const KernelArgs& args,
                           cudaStream_t stream) {
  switch (p.dtype) {
    case AttentionDtype::kBf16:
      return DispatchHeadDim<__nv_bfloat16>(p, args, stream);
    case AttentionDtype::kFp16:
      return DispatchHeadDim<__half>(p, args, stream);
  }
  return absl::InvalidArgumentError(absl::StrCat("Prefill dtype ", static_cast<int>(p.dtype),
                                                 " is not supported; use kBf16 or kFp16"));
}

template <typename T>
int SmemForHeadDim(int head_dim, int tile_rows) {
  if (head_dim == 64) {
    if (tile_rows == 64) return prefill_internal::SharedMemoryBytes<T, 64, 64>();
    if (tile_rows == 128) return prefill_internal::SharedMemoryBytes<T, 64, 128>();
  } else if (head_dim == 128) {
    if (tile_rows == 64) return prefill_internal::SharedMemoryBytes<T, 128, 64>();
    if (tile_rows == 128) return prefill_internal::SharedMemoryBytes<T, 128, 128>();
  }
  return 0;
}

}  // namespace

absl::Status ValidatePrefillAttentionParams(const PrefillAttentionParams& p) {
  if (p.dtype != AttentionDtype::kBf16 && p.dtype != AttentionDtype::kFp16) {
    return absl::InvalidArgumentError(absl::StrCat("Prefill dtype ", static_cast<int>(p.dtype),
                                                   " is not supported; use kBf16 or kFp16"));
  }
  if (p.head_dim != 64 && p.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("Prefill head_dim ", p.head_dim, " is not supported; use 64 or 128"));
  }
  if (p.tile_rows != 64 && p.tile_rows != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("Prefill tile_rows ", p.tile_rows, " is not supported; use 64 or 128"));
  }
  if (p.num_kv_heads <= 0 || p.num_kv_heads > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_kv_heads ", p.num_kv_heads, " is out of range; use 1 to 65535 KV heads per rank"));
  }
  if (p.num_q_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_q_heads ", p.num_q_heads, " is not a positive multiple of num_kv_heads ",
                     p.num_kv_heads, "; GQA needs whole groups of query heads"));
  }
  if (p.block_size <= 0 || p.max_blocks_per_seq <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV block_size ", p.block_size, " and max_blocks_per_seq ",
                     p.max_blocks_per_seq, " must both be positive"));
  }
  const int64_t token_elems = static_cast<int64_t>(p.num_q_heads) * p.head_dim;
  if ((p.q_stride != 0 && (p.q_stride < token_elems || p.q_stride % 8 != 0)) ||
      (p.o_stride != 0 && (p.o_stride < token_elems || p.o_stride % 8 != 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Prefill q_stride ", p.q_stride, " / o_stride ", p.o_stride,
        " must be 0 or a multiple of 8 elements of at least num_q_heads * head_dim = ",
        token_elems));
  }
  if (p.num_work_items < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_work_items ", p.num_work_items, " is negative; pass the plan capacity"));
  }
  if (!(p.softmax_scale >= 0.0f) || std::isinf(p.softmax_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "softmax_scale ", p.softmax_scale, " is not finite and non-negative; 0 means 1/sqrt(d)"));
  }
  if (p.q == nullptr || p.o == nullptr || p.k_cache == nullptr || p.v_cache == nullptr ||
      p.block_table == nullptr || p.seq_q_start == nullptr || p.seq_kv_len == nullptr ||
      p.work_items == nullptr) {
    return absl::InvalidArgumentError(
        "Prefill q, o, k_cache, v_cache, block_table, seq_q_start, seq_kv_len and work_items "
        "must all be set; one is null");
  }
  if ((p.partial_o == nullptr) != (p.partial_lse == nullptr)) {
    return absl::InvalidArgumentError(
        "Prefill partial_o and partial_lse must be both set or both null");
  }
  // q, k and v arrive through 16-byte cp.async copies; o is written in pairs of elements and
  // partial_o in pairs of floats.
  if (!Aligned(p.q, 16) || !Aligned(p.k_cache, 16) || !Aligned(p.v_cache, 16) ||
      !Aligned(p.o, 4) || !Aligned(p.partial_o, 8)) {
    return absl::InvalidArgumentError(
        "Prefill q, k_cache and v_cache must be 16-byte aligned, o 4-byte and partial_o 8-byte "
        "aligned");
  }
  return absl::OkStatus();
}

absl::Status attention_internal::LaunchPrefillAttentionUnchecked(const PrefillAttentionParams& p,
                                                                 cudaStream_t stream) {
  if (p.num_work_items == 0) return absl::OkStatus();
  const float scale =
      p.softmax_scale > 0.0f ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  KernelArgs args;
  args.q = p.q;
  args.o = p.o;
  args.k_cache = p.k_cache;
  args.v_cache = p.v_cache;
  args.block_table = p.block_table;
  args.seq_q_start = p.seq_q_start;
  args.seq_kv_len = p.seq_kv_len;
  args.work_items = p.work_items;
  args.partial_o = p.partial_o;
  args.partial_lse = p.partial_lse;
  const int64_t token_elems = static_cast<int64_t>(p.num_q_heads) * p.head_dim;
  args.q_stride = p.q_stride > 0 ? p.q_stride : token_elems;
  args.o_stride = p.o_stride > 0 ? p.o_stride : token_elems;
  args.num_q_heads = p.num_q_heads;
  args.num_kv_heads = p.num_kv_heads;
  args.group = p.num_q_heads / p.num_kv_heads;
  args.group_div = prefill_internal::FastDiv::Make(args.group);
  args.block_size = p.block_size;
  args.block_div = prefill_internal::FastDiv::Make(p.block_size);
  args.block_stride = static_cast<int64_t>(p.num_kv_heads) * p.block_size * p.head_dim;
  args.max_blocks_per_seq = p.max_blocks_per_seq;
  args.scale_log2 = scale * 1.4426950408889634f;
  return DispatchDtype(p, args, stream);
}

absl::Status LaunchPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidatePrefillAttentionParams(p));
  return attention_internal::LaunchPrefillAttentionUnchecked(p, stream);
}

int PrefillAttentionSharedMemoryBytes(AttentionDtype dtype, int head_dim, int tile_rows) {
  switch (dtype) {
    case AttentionDtype::kBf16:
      return SmemForHeadDim<__nv_bfloat16>(head_dim, tile_rows);
    case AttentionDtype::kFp16:
      return SmemForHeadDim<__half>(head_dim, tile_rows);
  }
  return 0;
}

}  // namespace kiln
