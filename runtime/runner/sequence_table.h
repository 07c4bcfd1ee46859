// Host bookkeeping of the sequences a runner serves: each sequence's cached length and the KV
// blocks that hold it, taken from one fixed pool of blocks.
//
//   kiln::SequenceTable table(/*num_blocks=*/4096, /*block_size=*/64, /*max_tokens=*/8192);
//   std::vector<kiln::SequenceTable::Entry> step = {{/*id=*/7, /*q_len=*/300}, {9, 1}};
//   ASSIGN_OR_RETURN(std::vector<kiln::SeqLens> lens, table.Reserve(step));  // blocks for the step
//   ... run the step ...
//   RETURN_IF_ERROR(table.Commit(step));  // lengths advance by q_len
//   table.Release(7);            // sequence 7 finished: its blocks return to the pool
//
// A sequence id first seen in Reserve starts empty (its first tokens are its prompt). Reserve is
// all or nothing: on any error no sequence gains a block. Blocks are never moved: a sequence's
// block list only grows until Release, so the device copy of its row stays valid.
//
// Each sequence: unknown --Reserve--> reserved --Commit--> committed --Reserve--> reserved ...,
// and --Release--> unknown from any state. Reserve again before Commit replaces the reservation
// (a step that ran but was not committed); Commit advances only entries of the latest Reserve,
// once each, so a sequence's blocks always cover its length.
// Host-only (no CUDA); not thread-safe, CheckCommit included (it marks the sequences it has seen
// to find a repeated id without a set of its own).
#ifndef KILN_RUNTIME_RUNNER_SEQUENCE_TABLE_H_
#define KILN_RUNTIME_RUNNER_SEQUENCE_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention/split_kv_planner.h"

namespace kiln {

class SequenceTable {
 public:
  // One sequence's part of a step: its id and how many new tokens it brings.
  struct Entry {
    int64_t id = 0;
    int q_len = 0;
  };

  // Creates a table over blocks [0, num_blocks) of `block_size` tokens; a sequence holds at most
  // max_tokens tokens (a runner's max_model_len), so at most ceil(max_tokens / block_size)
  // blocks. All three should be positive; smaller values are raised to 0 blocks, 1-token blocks
  // and 0 tokens (a table that admits nothing: a runner's placeholder before setup), and
  // max_tokens is capped at 2^31 - 1.
  SequenceTable(int num_blocks, int block_size, int64_t max_tokens);

  // Returns max_blocks_per_seq() of a table of `block_size` and `max_tokens` (raised and capped
  // as the constructor does), without building one: ceil(max_tokens / block_size).
  static int MaxBlocksPerSeq(int block_size, int64_t max_tokens);

  // Returns OK if sequence `id` may take q_len more tokens: q_len >= 1 and Length(id) + q_len
  // within max_tokens() and 2^31 - 1 (lengths are int32). InvalidArgument otherwise, naming the
  // sequence, its length and the limit. Reserve checks every entry with it; a caller that must
  // refuse a step before anything else may call it first.
  absl::Status CheckGrowth(int64_t id, int64_t q_len) const;

  // Returns the (q_len, kv_len) of each entry, in order, after making sure every sequence has
  // blocks for kv_len = Length(id) + q_len tokens. InvalidArgument: an id twice in the step, or
  // an entry CheckGrowth refuses. ResourceExhausted: the pool lacks the blocks (names the blocks
  // needed and free). Nothing changes on error.
  absl::StatusOr<std::vector<SeqLens>> Reserve(absl::Span<const Entry> entries);

  // Reserve(entries), which also calls `admit` with the entries' (q_len, kv_len), in order, once
  // every entry passed its checks and before the check of the pool's free blocks: an error from
  // `admit` is returned and nothing changes. For a caller whose own refusals depend on the
  // step's lengths (a runner routes the step by them): each entry is checked and its length
  // looked up once, here. `admit` must not use the table.
  absl::StatusOr<std::vector<SeqLens>> Reserve(
      absl::Span<const Entry> entries,
      absl::FunctionRef<absl::Status(absl::Span<const SeqLens> lens)> admit);

  // Reserve(entries, admit) into vectors the caller owns and reuses from step to step, so that a
  // step allocates nothing once they have grown: replaces `*lens` with the lengths the other
  // overloads return, and, where `blocks` is not null, `*blocks` with each entry's blocks, in
  // order, as Blocks(id) returns them (valid until the table next changes). `lens` must not be
  // null. On error the table is unchanged and the vectors' contents are unspecified.
  absl::Status Reserve(absl::Span<const Entry> entries,
                       absl::FunctionRef<absl::Status(absl::Span<const SeqLens> lens)> admit,
                       std::vector<SeqLens>* lens,
                       std::vector<absl::Span<const int32_t>>* blocks = nullptr);

  // Returns OK if Commit(entries) would advance every entry: each id known, at most once, and
  // its q_len that of the sequence's latest Reserve not yet committed. NotFound for an unknown
  // id, InvalidArgument for an id twice, FailedPrecondition for an entry no Reserve covers (never
  // reserved, already committed, or reserved with another q_len); each names the sequence.
  absl::Status CheckCommit(absl::Span<const Entry> entries) const;

  // Advances each entry's length by its q_len (after its step ran). All or nothing: returns
  // CheckCommit's error and changes nothing when it refuses the entries, so a stray or repeated
  // Commit can never make a length outrun its blocks.
  absl::Status Commit(absl::Span<const Entry> entries);

  // Forgets sequence `id` and returns its blocks to the pool. NotFound for an unknown id.
  absl::Status Release(int64_t id);

  // Returns the tokens sequence `id` holds (0 for an unknown id).
  int Length(int64_t id) const;
  // Returns the blocks of sequence `id`, in position order (empty for an unknown id).
  absl::Span<const int32_t> Blocks(int64_t id) const;
  // Returns true if the table knows `id`.
  bool Contains(int64_t id) const { return sequences_.contains(id); }

  int free_blocks() const { return static_cast<int>(free_.size()); }
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int max_blocks_per_seq() const { return max_blocks_per_seq_; }
  // Returns the longest sequence the table admits (the max_tokens it was created with).
  int64_t max_tokens() const { return max_tokens_; }
  int num_sequences() const { return static_cast<int>(sequences_.size()); }

 private:
  struct Sequence {
    int length = 0;
    // The q_len of the latest Reserve, 0 once committed: what Commit may add. The blocks cover
    // length + reserved_q_len tokens.
    int reserved_q_len = 0;
    std::vector<int32_t> blocks;
    // The mark of the latest Reserve or CheckCommit that saw this sequence: a second entry of
    // the id in that call finds its own mark.
    mutable uint64_t mark = 0;
  };

  int BlocksFor(int64_t tokens) const {
    return static_cast<int>((tokens + block_size_ - 1) / block_size_);
  }
  // CheckGrowth for a sequence of `length` tokens.
  absl::Status CheckGrowth(int64_t id, int64_t length, int64_t q_len) const;

  int num_blocks_;
  int block_size_;
  int64_t max_tokens_;
  int max_blocks_per_seq_;
  std::vector<int32_t> free_;  // a stack: the back is taken first
  absl::flat_hash_map<int64_t, Sequence> sequences_;
  // The latest Sequence::mark taken: each Reserve and CheckCommit takes the next.
  mutable uint64_t last_mark_ = 0;
  // Reserve's scratch, kept for its capacity: the ids the table does not know yet, with their
  // entry's index (they have no Sequence to mark).
  std::vector<std::pair<int64_t, size_t>> new_ids_;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_RUNNER_SEQUENCE_TABLE_H_
