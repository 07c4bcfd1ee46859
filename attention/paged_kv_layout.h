// Host side of kiln's paged KV cache: the block layout, per-sequence block tables over a pool
// of fixed-size blocks, and slot mapping of a step's new tokens. No CUDA dependency.
//
// Layout (attention_params.h): k_cache and v_cache are each
//   [num_blocks, num_kv_heads, block_size, head_dim]   (bf16 or fp16)
// so the tokens of one block and one KV head are contiguous (block_size × head_dim elements):
// a kernel reads a whole page with 16-byte loads. Token position pos of sequence s lives in
// block block_table[s][pos / block_size], at offset pos % block_size: its slot is
// block · block_size + offset.
//
//   kiln::PagedKvLayout layout{/*num_blocks=*/4096, /*block_size=*/16, /*num_kv_heads=*/8,
//                              /*head_dim=*/128, kiln::AttentionDtype::kBf16};
//   RETURN_IF_ERROR(layout.Validate());
//   std::vector<int32_t> storage(max_seqs * max_blocks_per_seq);
//   kiln::BlockTable table(absl::MakeSpan(storage), max_seqs, max_blocks_per_seq, layout);
//   RETURN_IF_ERROR(table.Reserve(/*seq=*/0, /*num_tokens=*/kv_len));   // before appending
//   ...
//   table.Release(0);                                                   // sequence finished
//
// Not thread-safe; usable in any capture phase (host only).
#ifndef KILN_ATTENTION_PAGED_KV_LAYOUT_H_
#define KILN_ATTENTION_PAGED_KV_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "attention/attention_params.h"
#include "attention/split_kv_planner.h"

namespace kiln {

// The shape of one KV pool (K and V each have one).
struct PagedKvLayout {
  int num_blocks = 0;
  int block_size = 0;  // tokens per block: a power of two >= 16 (16 and 64 are typical)
  int num_kv_heads = 0;
  int head_dim = 0;    // a multiple of 8 (16-byte rows)
  AttentionDtype dtype = AttentionDtype::kBf16;

  // Returns InvalidArgument naming the first bad field: non-positive counts, a block_size
  // that is not a power of two >= 16, a head_dim that is not a multiple of 8, an unknown dtype,
  // more token slots than int32 holds, or a pool whose bytes pass int64 (the kernels' offsets).
  // A layout it accepts has PoolBytes() exact and every ElementOffset() inside the pool.
  absl::Status Validate() const;

  // Returns the bytes of one element (2 for bf16 and fp16).
  static constexpr size_t ElementBytes() { return 2; }
  // Returns the elements of one block of one pool: num_kv_heads × block_size × head_dim.
  size_t BlockElements() const {
    return static_cast<size_t>(num_kv_heads) * block_size * head_dim;
  }
  // Returns the bytes of one pool (K or V): num_blocks blocks.
  size_t PoolBytes() const { return BlockElements() * num_blocks * ElementBytes(); }
  // Returns the element offset of (slot, head, dim 0) in a pool. For a layout Validate()
  // accepts, 0 <= slot < num_blocks × block_size and 0 <= head < num_kv_heads; no checks.
  size_t ElementOffset(int64_t slot, int head) const {
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    return (static_cast<size_t>(block) * num_kv_heads + head) * block_size * head_dim +
           static_cast<size_t>(offset) * head_dim;
  }
};

// Per-sequence block tables over a pool, stored row-major in caller-owned memory
// ([max_seqs, max_blocks_per_seq] int32, e.g. pinned memory uploaded with one copy), plus the
// pool's free list. Unassigned entries hold -1.
class BlockTable {
 public:
  // Binds `storage` (max_seqs × max_blocks_per_seq entries, not owned, must outlive this) and
  // puts every block of `layout` on the free list in order. A layout that Validate() refuses
  // gives a table with no blocks whose Reserve and FillSlotMapping fail (layout_status()). The
  // table's own memory is bounded by the storage and the validated pool, whatever the counts.
  BlockTable(absl::Span<int32_t> storage, int max_seqs, int max_blocks_per_seq,
             const PagedKvLayout& layout);

  // Gives sequence `seq` blocks for positions [0, num_tokens), taking them from the free list.
  // InvalidArgument for a bad seq, a negative num_tokens or more than max_blocks_per_seq
  // blocks; ResourceExhausted when the pool has too few free blocks (nothing is taken then);
  // FailedPrecondition for a table built over a bad layout or over storage too small for the
  // sequence's row.
  absl::Status Reserve(int seq, int num_tokens);

  // Returns every block of `seq` to the free list.
  void Release(int seq);

  // Replaces the free list (e.g. to scatter sequences over the pool in tests and benchmarks).
  // Every block must be free and `order` a permutation of [0, num_blocks).
  absl::Status SetFreeOrder(absl::Span<const int32_t> order);

  // OK, or the layout's Validate() error for a table built over a bad layout.
  const absl::Status& layout_status() const { return layout_status_; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  // Returns the blocks sequence `seq` holds: 0 for a seq outside the table or its storage.
  int blocks_of(int seq) const {
    return seq >= 0 && static_cast<size_t>(seq) < blocks_.size() ? blocks_[seq] : 0;
  }
  int max_seqs() const { return max_seqs_; }
  int block_size() const { return block_size_; }
  int max_blocks_per_seq() const { return max_blocks_per_seq_; }
  // Returns the widest row in use (blocks), for uploading only the used columns.
  int max_blocks_in_use() const;
  const int32_t* data() const { return storage_.data(); }
  int32_t at(int seq, int logical_block) const {
    return storage_[static_cast<size_t>(seq) * max_blocks_per_seq_ + logical_block];
  }

 private:
  absl::Span<int32_t> storage_;
  int max_seqs_;
  int max_blocks_per_seq_;
  int block_size_;
  int num_blocks_;  // 0 for a layout Validate() refuses
  absl::Status layout_status_;
  // Blocks owned by each sequence whose row fits the storage (at most max_seqs entries).
  std::vector<int32_t> blocks_;
  std::vector<int32_t> free_;    // a stack: the back is taken first
};

// Writes the slot (block · block_size + offset, with the table's block_size) of every new token
// of a step into `slots` ([num_tokens] entries; token order as in the plan: sequence by
// sequence), and -1 for the entries past the step's tokens (padding). A token at position
// kv_len − q_len + j < 0 gets -1 too. InvalidArgument when a token's block is unassigned, `slots`
// is too small, a q_len or kv_len is negative or `seqs` has more sequences than the table;
// FailedPrecondition for a table over a bad layout. `slots` is unspecified after an error.
absl::Status FillSlotMapping(absl::Span<const SeqLens> seqs, const BlockTable& table,
                             absl::Span<int32_t> slots);

}  // namespace kiln

#endif  // KILN_ATTENTION_PAGED_KV_LAYOUT_H_
