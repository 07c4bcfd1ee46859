#include "runtime/runner/sequence_table.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

// Returns the id of `ids` (an id and its entry's index each) whose second entry comes first, or
// nullopt when no id repeats. Sorts `ids`.
std::optional<int64_t> FirstRepeated(std::vector<std::pair<int64_t, size_t>>& ids) {
  if (ids.size() < 2) return std::nullopt;
  std::sort(ids.begin(), ids.end());
  std::optional<int64_t> repeated;
  size_t first = 0;
  for (size_t i = 1; i < ids.size(); ++i) {
    // Sorted by id, then index: ids[i] is a later entry of ids[i - 1]'s id.
    if (ids[i].first == ids[i - 1].first && (!repeated || ids[i].second < first)) {
      repeated = ids[i].first;
      first = ids[i].second;
    }
  }
  return repeated;
}

absl::Status RepeatedInStep(int64_t id) {
  return absl::InvalidArgumentError(absl::StrCat(
      "Sequence ", id, " appears twice in one step; give each sequence one entry"));
}

// Lengths are int32 (SeqLens, the attention plan), so no sequence passes 2^31 - 1 tokens.
int64_t ClampTokens(int64_t max_tokens) {
  return std::clamp<int64_t>(max_tokens, 0, std::numeric_limits<int32_t>::max());
}

}  // namespace

SequenceTable::SequenceTable(int num_blocks, int block_size, int64_t max_tokens)
    : num_blocks_(std::max(num_blocks, 0)),
      block_size_(std::max(block_size, 1)),
      max_tokens_(ClampTokens(max_tokens)),
      max_blocks_per_seq_(MaxBlocksPerSeq(block_size_, max_tokens_)) {
  // Block 0 on top of the stack: a fresh table hands out blocks in ascending order.
  free_.reserve(num_blocks_);
  for (int b = num_blocks_ - 1; b >= 0; --b) free_.push_back(b);
}

int SequenceTable::MaxBlocksPerSeq(int block_size, int64_t max_tokens) {
  const int64_t size = std::max(block_size, 1);
  return static_cast<int>((ClampTokens(max_tokens) + size - 1) / size);
}

absl::Status SequenceTable::CheckGrowth(int64_t id, int64_t q_len) const {
  return CheckGrowth(id, Length(id), q_len);
}

absl::Status SequenceTable::CheckGrowth(int64_t id, int64_t length, int64_t q_len) const {
  if (q_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Sequence ", id, " brings ", q_len, " tokens; every entry needs at least one"));
  }
  // q_len may be anything up to INT64_MAX: compare against the room left, which cannot
  // overflow, instead of adding it to the length.
  if (q_len > max_tokens_ - length) {
    const std::string would_hold =
        q_len > std::numeric_limits<int64_t>::max() - length
            ? absl::StrCat("more than ", std::numeric_limits<int64_t>::max())
            : absl::StrCat(length + q_len);
    return absl::InvalidArgumentError(absl::StrCat(
        "Sequence ", id, " would hold ", would_hold, " tokens, above max_model_len ", max_tokens_,
        max_tokens_ == std::numeric_limits<int32_t>::max() ? " (lengths are int32)" : "",
        "; finish it (Release) or raise max_model_len"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SeqLens>> SequenceTable::Reserve(absl::Span<const Entry> entries) {
  return Reserve(entries, [](absl::Span<const SeqLens>) { return absl::OkStatus(); });
}

absl::StatusOr<std::vector<SeqLens>> SequenceTable::Reserve(
    absl::Span<const Entry> entries,
    absl::FunctionRef<absl::Status(absl::Span<const SeqLens> lens)> admit) {
  std::vector<SeqLens> lens;
  if (absl::Status reserved = Reserve(entries, admit, &lens); !reserved.ok()) return reserved;
  return lens;
}

absl::Status SequenceTable::Reserve(
    absl::Span<const Entry> entries,
    absl::FunctionRef<absl::Status(absl::Span<const SeqLens> lens)> admit,
    std::vector<SeqLens>* lens, std::vector<absl::Span<const int32_t>>* blocks) {
  lens->clear();
  lens->reserve(entries.size());
  const uint64_t mark = ++last_mark_;
  new_ids_.clear();
  int64_t needed = 0;
  // The first entry refused, in order; the loop stops there.
  absl::Status refused;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    int length = 0;
    int have = 0;
    auto it = sequences_.find(e.id);
    if (it == sequences_.end()) {
      new_ids_.emplace_back(e.id, i);
    } else if (it->second.mark == mark) {
      refused = RepeatedInStep(e.id);
      break;
    } else {
      it->second.mark = mark;
      length = it->second.length;
      have = static_cast<int>(it->second.blocks.size());
    }
    refused = CheckGrowth(e.id, length, e.q_len);
    if (!refused.ok()) break;
    const int64_t kv_len = int64_t{length} + e.q_len;
    needed += std::max(0, BlocksFor(kv_len) - have);
    lens->push_back(SeqLens{e.q_len, static_cast<int32_t>(kv_len)});
  }
  // An id the table does not know has no mark: its repeats are found among new_ids_, which end
  // at the refused entry, so such a repeat comes before the refusal (or is that entry, whose
  // repeat is checked before its growth), as an id checked entry by entry would.
  if (std::optional<int64_t> repeated = FirstRepeated(new_ids_)) return RepeatedInStep(*repeated);
  if (!refused.ok()) return refused;
  if (absl::Status admitted = admit(*lens); !admitted.ok()) return admitted;
  if (needed > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "The step needs ", needed, " more KV blocks but ", free_blocks(), " of ", num_blocks_,
        " are free; release finished sequences, schedule fewer tokens, or give the KV cache more "
        "memory"));
  }
  // Sized, then written by index: cheaper than a push_back per entry.
  if (blocks != nullptr) blocks->resize(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    Sequence& seq = sequences_[entries[i].id];
    seq.reserved_q_len = entries[i].q_len;
    const int want = BlocksFor((*lens)[i].kv_len);
    while (static_cast<int>(seq.blocks.size()) < want) {
      seq.blocks.push_back(free_.back());
      free_.pop_back();
    }
    // A later entry's insert may move `seq` within sequences_, but not its blocks' storage.
    if (blocks != nullptr) (*blocks)[i] = seq.blocks;
  }
  return absl::OkStatus();
}

absl::Status SequenceTable::CheckCommit(absl::Span<const Entry> entries) const {
  const uint64_t mark = ++last_mark_;
  for (const Entry& e : entries) {
    auto it = sequences_.find(e.id);
    if (it == sequences_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "Sequence ", e.id, " is not known; reserve it (Reserve) before committing it"));
    }
    const Sequence& seq = it->second;
    if (seq.mark == mark) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sequence ", e.id, " appears twice in one commit; commit the step's entries once"));
    }
    seq.mark = mark;
    if (seq.reserved_q_len == 0 || e.q_len != seq.reserved_q_len) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Sequence ", e.id, " commits ", e.q_len, " tokens but ",
          seq.reserved_q_len == 0 ? std::string("has no reservation left to commit")
                                  : absl::StrCat("its latest Reserve was for ", seq.reserved_q_len),
          "; commit exactly the entries of the latest Reserve, once"));
    }
  }
  return absl::OkStatus();
}

absl::Status SequenceTable::Commit(absl::Span<const Entry> entries) {
  if (absl::Status refused = CheckCommit(entries); !refused.ok()) return refused;
  for (const Entry& e : entries) {
    Sequence& seq = sequences_.find(e.id)->second;
    // Reserve admitted length + q_len <= max_tokens_ <= 2^31 - 1: no overflow.
    seq.length += e.q_len;
    seq.reserved_q_len = 0;
  }
  return absl::OkStatus();
}

absl::Status SequenceTable::Release(int64_t id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("Sequence ", id, " is not known; nothing to release"));
  }
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) {
    free_.push_back(*b);
  }
  sequences_.erase(it);
  return absl::OkStatus();
}

int SequenceTable::Length(int64_t id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : it->second.length;
}

absl::Span<const int32_t> SequenceTable::Blocks(int64_t id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return {};
  return it->second.blocks;
}

}  // namespace kiln
