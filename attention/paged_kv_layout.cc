#include "attention/paged_kv_layout.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status PagedKvLayout::Validate() const {
  if (num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout num_blocks ", num_blocks, " must be positive"));
  }
  if (block_size < 16 || (block_size & (block_size - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV block_size ", block_size, " must be a power of two of at least 16 (e.g. 16, 64)"));
  }
  if (num_kv_heads <= 0 || head_dim <= 0 || head_dim % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout heads ", num_kv_heads, " and head_dim ", head_dim,
                     " must be positive, head_dim a multiple of 8"));
  }
  // Slots (block · block_size + offset) are int32 in the slot mapping and the kernels' tables.
  if (int64_t{num_blocks} * block_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout of ", num_blocks, " blocks x ", block_size, " tokens has more than 2^31 - 1 "
        "token slots (int32 slot indices); use fewer blocks"));
  }
  return absl::OkStatus();
}

// Negative counts (a layout or sizes that were never validated) make an empty table whose
// Reserve refuses every sequence, rather than a vector of negative size.
BlockTable::BlockTable(absl::Span<int32_t> storage, int max_seqs, int max_blocks_per_seq,
                       const PagedKvLayout& layout)
    : storage_(storage),
      max_seqs_(std::max(max_seqs, 0)),
      max_blocks_per_seq_(std::max(max_blocks_per_seq, 0)),
      block_size_(layout.block_size),
      num_blocks_(std::max(layout.num_blocks, 0)),
      blocks_(max_seqs_, 0) {
  std::fill(storage_.begin(), storage_.end(), -1);
  free_.reserve(num_blocks_);
  for (int b = num_blocks_ - 1; b >= 0; --b) free_.push_back(b);  // block 0 is taken first
}

absl::Status BlockTable::Reserve(int seq, int num_tokens) {
  if (seq < 0 || seq >= max_seqs_ || num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Reserve(seq ", seq, ", tokens ", num_tokens,
                                                   ") is outside ", max_seqs_, " sequences"));
  }
  if (block_size_ < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BlockTable has block_size ", block_size_, "; build it over a layout that Validate() "
        "accepts"));
  }
  if ((static_cast<size_t>(seq) + 1) * max_blocks_per_seq_ > storage_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BlockTable storage holds ", storage_.size(), " entries, fewer than sequence ", seq,
        "'s row needs (", max_blocks_per_seq_, " per sequence); bind max_seqs x "
        "max_blocks_per_seq entries"));
  }
  // In 64 bits: num_tokens near INT_MAX must not wrap to a negative block count.
  const int64_t need = (int64_t{num_tokens} + block_size_ - 1) / block_size_;
  if (need > max_blocks_per_seq_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Sequence ", seq, " needs ", need, " blocks for ", num_tokens,
        " tokens, above max_blocks_per_seq ", max_blocks_per_seq_, "; raise it"));
  }
  const int more = static_cast<int>(need) - blocks_[seq];
  if (more <= 0) return absl::OkStatus();
  if (more > static_cast<int>(free_.size())) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache has ", free_.size(),
                                                     " free blocks; sequence ", seq, " needs ",
                                                     more, " more; free finished sequences"));
  }
  int32_t* row = storage_.data() + static_cast<size_t>(seq) * max_blocks_per_seq_;
  for (int i = blocks_[seq]; i < need; ++i) {
    row[i] = free_.back();
    free_.pop_back();
  }
  blocks_[seq] = need;
  return absl::OkStatus();
}

void BlockTable::Release(int seq) {
  if (seq < 0 || seq >= max_seqs_) return;
  int32_t* row = storage_.data() + static_cast<size_t>(seq) * max_blocks_per_seq_;
  for (int i = blocks_[seq] - 1; i >= 0; --i) {
    free_.push_back(row[i]);
    row[i] = -1;
  }
  blocks_[seq] = 0;
}

absl::Status BlockTable::SetFreeOrder(absl::Span<const int32_t> order) {
  if (static_cast<int>(free_.size()) != num_blocks_ ||
      static_cast<int>(order.size()) != num_blocks_) {
    return absl::FailedPreconditionError(
        "SetFreeOrder needs every block free and a permutation of all blocks");
  }
  std::vector<bool> seen(num_blocks_, false);
  for (int32_t b : order) {
    if (b < 0 || b >= num_blocks_ || seen[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("SetFreeOrder: ", b, " repeats or is not a block index"));
    }
    seen[b] = true;
  }
  free_.assign(order.rbegin(), order.rend());  // order[0] is taken first
  return absl::OkStatus();
}

int BlockTable::max_blocks_in_use() const {
  int most = 0;
  for (int b : blocks_) most = std::max(most, b);
  return most;
}

absl::Status FillSlotMapping(absl::Span<const SeqLens> seqs, const BlockTable& table,
                             absl::Span<int32_t> slots) {
  const int block_size = table.block_size();
  if (seqs.size() > static_cast<size_t>(table.max_seqs())) {
    return absl::InvalidArgumentError(absl::StrCat("Slot mapping has ", seqs.size(),
                                                   " sequences; the block table holds ",
                                                   table.max_seqs()));
  }
  size_t t = 0;
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    const SeqLens& sl = seqs[s];
    for (int j = 0; j < sl.q_len; ++j, ++t) {
      if (t >= slots.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Slot mapping has ", slots.size(), " entries; the step has more tokens"));
      }
      const int64_t pos = int64_t{sl.kv_len} - sl.q_len + j;
      if (pos < 0) {
        slots[t] = -1;
        continue;
      }
      const int64_t logical = pos / block_size;
      const int32_t block =
          logical < table.blocks_of(s) ? table.at(s, static_cast<int>(logical)) : -1;
      if (block < 0) {
        return absl::InvalidArgumentError(absl::StrCat("Sequence ", s, " position ", pos,
                                                       " has no block; Reserve it first"));
      }
      slots[t] = static_cast<int32_t>(int64_t{block} * block_size + pos % block_size);
    }
  }
  for (; t < slots.size(); ++t) slots[t] = -1;
  return absl::OkStatus();
}

}  // namespace kiln
