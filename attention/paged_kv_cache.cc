#include "attention/paged_kv_cache.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attention/internal/kernel_args.h"
#include "attention/internal/unchecked_launch.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status.h"

namespace kiln {
namespace {

int Log2(int power_of_two) {
  int log = 0;
  while ((1 << log) < power_of_two) ++log;
  return log;
}

}  // namespace

namespace attention_internal {

absl::Status AppendKvWithValidLayout(const AppendKvParams& params, const PagedKvLayout& layout,
                                     const PagedKvDevice& kv, void* k_cache, void* v_cache,
                                     cudaStream_t stream) {
  if (params.max_tokens <= 0) return absl::OkStatus();
  const int64_t row = static_cast<int64_t>(layout.num_kv_heads) * layout.head_dim;
  if (params.k == nullptr || params.v == nullptr || k_cache == nullptr || v_cache == nullptr) {
    return absl::InvalidArgumentError("AppendKv needs k, v and both cache pools");
  }
  // The kernel copies 16-byte vectors.
  for (const void* p : {params.k, params.v, static_cast<const void*>(k_cache),
                        static_cast<const void*>(v_cache)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return absl::InvalidArgumentError(
          "AppendKv k, v and both cache pools must each be 16-byte aligned");
    }
  }
  if ((params.k_stride != 0 && (params.k_stride < row || params.k_stride % 8 != 0)) ||
      (params.v_stride != 0 && (params.v_stride < row || params.v_stride % 8 != 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AppendKv k_stride ", params.k_stride, " and v_stride ", params.v_stride,
        " must be 0 or multiples of 8 of at least num_kv_heads × head_dim = ", row));
  }
  // The pools are laid out in the layout's blocks; attention reads them in kv.block_size ones.
  if (kv.block_size != layout.block_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AppendKv block_size ", kv.block_size, " differs from the layout's ", layout.block_size,
        ": attention would read other slots than the append writes; pass the layout's"));
  }
  if (params.slot_mapping == nullptr &&
      (params.plan.seq_q_start == nullptr || params.plan.seq_kv_len == nullptr ||
       kv.block_table == nullptr || params.plan.max_seqs <= 0 || kv.max_blocks_per_seq < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AppendKv needs a slot mapping, or an uploaded plan and the block table (rows of "
        "max_blocks_per_seq ", kv.max_blocks_per_seq, " blocks, at least 1)"));
  }
  attention_internal::AppendKernelArgs args;
  args.k = params.k;
  args.k_stride = params.k_stride != 0 ? params.k_stride : row;
  args.v = params.v;
  args.v_stride = params.v_stride != 0 ? params.v_stride : row;
  args.slot_mapping = params.slot_mapping;
  args.seq_q_start = params.plan.seq_q_start;
  args.seq_kv_len = params.plan.seq_kv_len;
  args.max_seqs = params.plan.max_seqs;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.block_table = kv.block_table;
  args.max_blocks_per_seq = kv.max_blocks_per_seq;
  args.log2_block_size = Log2(layout.block_size);
  args.num_kv_heads = layout.num_kv_heads;
  args.head_dim = layout.head_dim;
  return ToStatus(attention_internal::LaunchAppendKernel(args, params.max_tokens, stream),
                  "append KV kernel launch");
}

}  // namespace attention_internal

absl::Status AppendKv(const AppendKvParams& params, const PagedKvLayout& layout,
                      const PagedKvDevice& kv, void* k_cache, void* v_cache,
                      cudaStream_t stream) {
  if (params.max_tokens <= 0) return absl::OkStatus();
  RETURN_IF_ERROR(layout.Validate());
  return attention_internal::AppendKvWithValidLayout(params, layout, kv, k_cache, v_cache, stream);
}

absl::StatusOr<PagedKvCache> PagedKvCache::Create(const PagedKvLayout& layout, int max_seqs,
                                                  int max_blocks_per_seq) {
  RETURN_IF_ERROR(layout.Validate());
  if (max_seqs <= 0 || max_blocks_per_seq <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedKvCache max_seqs ", max_seqs,
                                                   " and max_blocks_per_seq ",
                                                   max_blocks_per_seq, " must be positive"));
  }
  PagedKvCache cache;
  cache.layout_ = layout;
  cache.max_seqs_ = max_seqs;
  cache.max_blocks_per_seq_ = max_blocks_per_seq;
  ASSIGN_OR_RETURN(cache.k_, DeviceBuffer::Allocate(layout.PoolBytes(), "kv cache K"));
  ASSIGN_OR_RETURN(cache.v_, DeviceBuffer::Allocate(layout.PoolBytes(), "kv cache V"));
  const size_t entries = static_cast<size_t>(max_seqs) * max_blocks_per_seq;
  ASSIGN_OR_RETURN(cache.table_device_,
                   DeviceBuffer::Allocate(entries * sizeof(int32_t), "kv block table"));
  ASSIGN_OR_RETURN(cache.table_host_, PinnedHostBuffer::Allocate(entries * sizeof(int32_t),
                                                                 "kv block table (pinned)"));
  cache.table_ = std::make_unique<BlockTable>(
      absl::MakeSpan(cache.table_host_.as<int32_t>(), entries), max_seqs, max_blocks_per_seq,
      layout);
  // Unassigned entries are -1 on the device too, so a stray read fails loudly.
  RETURN_IF_ERROR(FillDeviceAndWait(cache.table_device_.data(), 0xff, entries * sizeof(int32_t),
                                    "kv block table"));
  return cache;
}

absl::Status PagedKvCache::UploadBlockTable(cudaStream_t stream) const {
  RETURN_IF_ERROR(CheckNotCapturing(stream, "PagedKvCache::UploadBlockTable"));
  const int columns = table_->max_blocks_in_use();
  if (columns == 0) return absl::OkStatus();
  const size_t pitch = static_cast<size_t>(max_blocks_per_seq_) * sizeof(int32_t);
  return ToStatus(cudaMemcpy2DAsync(table_device_.data(), pitch, table_host_.data(), pitch,
                                    columns * sizeof(int32_t), max_seqs_,
                                    cudaMemcpyHostToDevice, stream),
                  "cudaMemcpy2DAsync(kv block table)");
}

absl::Status PagedKvCache::Append(const AppendKvParams& params, cudaStream_t stream) {
  // Create validated layout_; a cache that Create did not make has no pools, which the append
  // refuses.
  return attention_internal::AppendKvWithValidLayout(params, layout_, device(), k_.data(),
                                                     v_.data(), stream);
}

PagedKvDevice PagedKvCache::device() const {
  PagedKvDevice d;
  d.k_cache = k_.data();
  d.v_cache = v_.data();
  d.block_table = table_device_.as<int32_t>();
  d.max_blocks_per_seq = max_blocks_per_seq_;
  d.block_size = layout_.block_size;
  return d;
}

}  // namespace kiln
