// PagedKvCache: kiln's paged KV cache on the device — the K and V pools laid out by a
// PagedKvLayout, the per-sequence block table (host side in pinned memory, uploaded with one
// copy) — and the kernel that appends a step's new K and V rows (already rotated by RoPE) into
// their slots.
//
//   kiln::PagedKvLayout layout{/*num_blocks=*/4096, /*block_size=*/16, /*num_kv_heads=*/8,
//                              /*head_dim=*/128, kiln::AttentionDtype::kBf16};
//   ASSIGN_OR_RETURN(kiln::PagedKvCache cache,
//                    kiln::PagedKvCache::Create(layout, /*max_seqs=*/256,
//                                               /*max_blocks_per_seq=*/2048));
//   RETURN_IF_ERROR(cache.block_table().Reserve(seq, kv_len));   // host, per step
//   RETURN_IF_ERROR(cache.UploadBlockTable(stream));             // before launch or replay
//   kiln::AppendKvParams append;                                 // during the step (capturable)
//   append.k = k_rope; append.v = v;                             // both [max_tokens, kv_heads,
//                                                                //       head_dim]
//   append.max_tokens = max_tokens;
//   append.plan = buffers.decode();                              // token → slot from the plan
//   RETURN_IF_ERROR(cache.Append(append, stream));
//
// Device addresses are fixed at Create, so graphs capture them once. Append is legal during
// capture (its grid is max_tokens, fixed by the key; rows past the step's tokens are skipped).
// UploadBlockTable is FailedPrecondition during capture. Movable, not copyable; not thread-safe.
#ifndef KILN_ATTENTION_PAGED_KV_CACHE_H_
#define KILN_ATTENTION_PAGED_KV_CACHE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/attention_params.h"
#include "attention/paged_kv_layout.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/pinned_buffer.h"

namespace kiln {

// Where a step's new K and V rows come from and where they go.
struct AppendKvParams {
  const void* k = nullptr;  // [max_tokens, num_kv_heads, head_dim], RoPE applied
  int64_t k_stride = 0;     // elements between tokens; 0 means num_kv_heads × head_dim
  const void* v = nullptr;  // [max_tokens, num_kv_heads, head_dim]
  int64_t v_stride = 0;
  int max_tokens = 0;       // rows of k and v (the key's token capacity; the grid)
  // The slot of each row: either an explicit mapping (FillSlotMapping; -1 skips a row) ...
  const int32_t* slot_mapping = nullptr;  // [max_tokens] or null
  // ... or, when slot_mapping is null, derived from an uploaded plan's per-sequence arrays
  // (token j of sequence s goes to position kv_len − q_len + j) and the block table.
  AttentionPlanPartDevice plan;
};

// Appends `params` into the pools described by `kv` and `layout` on `stream` (the raw form of
// PagedKvCache::Append, for caches owned elsewhere). Row s of the block table belongs to
// sequence s of the plan. InvalidArgument for a bad layout or stride, a missing or not 16-byte
// aligned k, v or pool, a kv.block_size other than the layout's, or, without a slot mapping, a
// missing plan or block table.
absl::Status AppendKv(const AppendKvParams& params, const PagedKvLayout& layout,
                      const PagedKvDevice& kv, void* k_cache, void* v_cache,
                      cudaStream_t stream);

class PagedKvCache {
 public:
  // Validates `layout` and allocates both pools ("kv cache K", "kv cache V"), the device block
  // table and its pinned host copy. Not during capture.
  static absl::StatusOr<PagedKvCache> Create(const PagedKvLayout& layout, int max_seqs,
                                             int max_blocks_per_seq);

  PagedKvCache() = default;
  PagedKvCache(PagedKvCache&&) = default;
  PagedKvCache& operator=(PagedKvCache&&) = default;

  // Returns the host block table (pinned storage) to Reserve/Release sequences in.
  BlockTable& block_table() { return *table_; }
  const BlockTable& block_table() const { return *table_; }

  // Copies the used columns of every row of the block table to the device, asynchronously
  // (one 2-D copy): the copy reads the pinned table when the stream reaches it, so change the
  // table for the next step (Reserve, Release) only after that, e.g. once the step's results
  // were synchronised. FailedPrecondition during capture.
  absl::Status UploadBlockTable(cudaStream_t stream) const;

  // Appends a step's K and V (see AppendKvParams) with AppendKv's checks, except the layout's:
  // Create checked it once. InvalidArgument for a cache that Create did not make (no pools).
  // Legal during capture.
  absl::Status Append(const AppendKvParams& params, cudaStream_t stream);

  // Returns the device view the attention kernels read.
  PagedKvDevice device() const;

  void* k_cache() const { return k_.data(); }
  void* v_cache() const { return v_.data(); }
  int32_t* device_block_table() const { return table_device_.as<int32_t>(); }
  const PagedKvLayout& layout() const { return layout_; }
  int max_seqs() const { return max_seqs_; }
  int max_blocks_per_seq() const { return max_blocks_per_seq_; }

 private:
  PagedKvLayout layout_;
  int max_seqs_ = 0;
  int max_blocks_per_seq_ = 0;
  DeviceBuffer k_;
  DeviceBuffer v_;
  DeviceBuffer table_device_;
  PinnedHostBuffer table_host_;
  std::unique_ptr<BlockTable> table_;  // over table_host_ (whose address survives moves)
};

}  // namespace kiln

#endif  // KILN_ATTENTION_PAGED_KV_CACHE_H_
