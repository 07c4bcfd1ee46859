#include "attention/paged_kv_layout.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status PagedKvLayout::Validate() const {
  if (num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout num_blocks ", num_blocks, " must be positive; size the pool in blocks"));
  }
  if (block_size < 16 || (block_size & (block_size - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV block_size ", block_size, " must be a power of two of at least 16 (e.g. 16, 64)"));
  }
  if (num_kv_heads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout num_kv_heads ", num_kv_heads,
        " must be positive; pass the model's KV heads (per rank)"));
  }
  if (head_dim <= 0 || head_dim % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout head_dim ", head_dim,
        " must be a positive multiple of 8 (16-byte rows); pass the model's head_dim"));
  }
  if (absl::Status s = CheckAttentionDtype(dtype, "KV layout"); !s.ok()) return s;
  // Slots (block · block_size + offset) are int32 in the slot mapping and the kernels' tables.
  if (int64_t{num_blocks} * block_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout of ", num_blocks, " blocks x ", block_size, " tokens has more than 2^31 - 1 "
        "token slots (int32 slot indices); use fewer blocks"));
  }
  // The kernels address a pool with int64 element offsets, and PoolBytes() is a size_t: a pool
  // past 2^63 - 1 bytes would wrap both (and an allocation of the wrapped size would succeed).
  // Multiplied one factor at a time so that the check itself cannot overflow.
  uint64_t bytes = ElementBytes();
  for (const int factor : {num_blocks, block_size, num_kv_heads, head_dim}) {
    if (bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / factor) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV layout of ", num_blocks, " blocks x ", block_size, " tokens x ", num_kv_heads,
          " KV heads x ", head_dim, " dims has more than 2^63 - 1 bytes per pool (int64 "
          "offsets); use fewer blocks or KV heads"));
    }
    bytes *= static_cast<uint64_t>(factor);
  }
  return absl::OkStatus();
}

// Counts from a layout or sizes that were never validated make a table that refuses what it
// cannot hold, never one whose own vectors are sized by them: the free list holds the blocks
// of a valid layout only, and the per-sequence counts the rows the storage holds.
BlockTable::BlockTable(absl::Span<int32_t> storage, int max_seqs, int max_blocks_per_seq,
                       const PagedKvLayout& layout)
    : storage_(storage),
      max_seqs_(std::max(max_seqs, 0)),
      max_blocks_per_seq_(std::max(max_blocks_per_seq, 0)),
      block_size_(layout.block_size),
      num_blocks_(0),
      layout_status_(layout.Validate()) {
  if (layout_status_.ok()) num_blocks_ = layout.num_blocks;
  // A row past the storage is refused by Reserve, so it needs no count (and a table of rows of
  // no blocks holds none).
  if (max_blocks_per_seq_ > 0) {
    blocks_.assign(std::min<size_t>(max_seqs_, storage_.size() / max_blocks_per_seq_), 0);
  }
  std::fill(storage_.begin(), storage_.end(), -1);
  free_.reserve(num_blocks_);
  for (int b = num_blocks_ - 1; b >= 0; --b) free_.push_back(b);  // block 0 is taken first
}

absl::Status BlockTable::Reserve(int seq, int num_tokens) {
  if (seq < 0 || seq >= max_seqs_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Reserve of sequence ", seq, " is outside the table's ", max_seqs_,
        " sequences; pass an index in [0, max_seqs)"));
  }
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Reserve of sequence ", seq, " for num_tokens ", num_tokens,
        "; pass the sequence's KV length (at least 0)"));
  }
  if (!layout_status_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BlockTable is built over a KV layout that Validate() refuses (",
        layout_status_.message(), "); build it over a valid layout"));
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
  // blocks_of: with rows of no blocks, need is 0 here and the table keeps no counts.
  const int more = static_cast<int>(need) - blocks_of(seq);
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
  if (seq < 0 || static_cast<size_t>(seq) >= blocks_.size()) return;  // holds no blocks
  int32_t* row = storage_.data() + static_cast<size_t>(seq) * max_blocks_per_seq_;
  for (int i = blocks_[seq] - 1; i >= 0; --i) {
    free_.push_back(row[i]);
    row[i] = -1;
  }
  blocks_[seq] = 0;
}

absl::Status BlockTable::SetFreeOrder(absl::Span<const int32_t> order) {
  // As size_t: an order of 2^32 entries must not wrap into a matching count.
  if (free_.size() != static_cast<size_t>(num_blocks_) ||
      order.size() != static_cast<size_t>(num_blocks_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SetFreeOrder got ", order.size(), " blocks while ", free_.size(), " of ", num_blocks_,
        " are free; release every sequence first and pass a permutation of all blocks"));
  }
  std::vector<bool> seen(num_blocks_, false);
  for (int32_t b : order) {
    if (b < 0 || b >= num_blocks_ || seen[b]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SetFreeOrder block ", b, " repeats or is not a block index; pass a permutation of [0, ",
          num_blocks_, ")"));
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
  // A table over a bad layout may have block_size 0: refused before anything divides by it.
  if (!table.layout_status().ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Slot mapping over a block table whose KV layout Validate() refuses (",
        table.layout_status().message(), "); build the table over a valid layout"));
  }
  const int block_size = table.block_size();
  if (seqs.size() > static_cast<size_t>(table.max_seqs())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Slot mapping has ", seqs.size(), " sequences; the block table holds ",
        table.max_seqs(), "; map at most that many or build a larger table"));
  }
  size_t t = 0;
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    const SeqLens& sl = seqs[s];
    if (sl.q_len < 0 || sl.kv_len < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Slot mapping sequence ", s, " has q_len ", sl.q_len, " and kv_len ", sl.kv_len,
          "; both must be non-negative"));
    }
    for (int j = 0; j < sl.q_len; ++j, ++t) {
      if (t >= slots.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Slot mapping has ", slots.size(), " entries; the step has more tokens (sequence ",
            s, " brings q_len ", sl.q_len, "); pass one entry per token of the key"));
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
