// The accounting behind GraphMemoryPool, with no CUDA in it: a bump allocator over one region
// [base, base + reserved) with a hard byte budget, rewound to the base at the start of every
// capture sequence, and the high-water marks it reached per capture key.
//
//   kiln::PoolArena arena(/*budget_bytes=*/64 << 20);
//   arena.Rebase(region_base, region_bytes);       // the device region GraphMemoryPool owns
//   arena.Begin({kiln::GraphMode::kDecode, 256});   // every capture starts from the base
//   ASSIGN_OR_RETURN(uintptr_t scratch, arena.Allocate(1 << 20, "attention workspace"));
//   arena.End();
//
// Why a rewinding bump allocator: graphs replay one at a time on one stream, so their scratch
// memory can overlap; the region then needs the maximum over capture keys, not the sum. A warm-up
// and the capture that follows it make the same calls in the same order, so they get the same
// addresses. Allocations are 256-byte aligned (what cudaMalloc guarantees, and enough for any
// vector access).
//
// States: idle ──Begin(key)──► allocating ──End()──► idle. Allocate is legal only while
// allocating. Not thread-safe: one thread captures at a time.
#ifndef KILN_GRAPH_POOL_ARENA_H_
#define KILN_GRAPH_POOL_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/capture_context.h"

namespace kiln {

class PoolArena {
 public:
  // Alignment of every allocation, in bytes.
  static constexpr size_t kAlignment = 256;

  // Creates an arena that may hand out at most `budget_bytes` per capture sequence, over no
  // region yet (reserved 0).
  explicit PoolArena(size_t budget_bytes) : budget_(budget_bytes) {}

  // Points the arena at the region [base, base + reserved_bytes). `base` must be a multiple of
  // kAlignment, the region must end within the address space and `reserved_bytes` be at most the
  // budget (InvalidArgument otherwise).
  // FailedPrecondition while a sequence is open.
  absl::Status Rebase(uintptr_t base, size_t reserved_bytes);

  // Starts a capture sequence for `key` at the region's base (ends any open one).
  void Begin(CaptureKey key);

  // Returns the address of `bytes` (rounded up to kAlignment) from the current sequence.
  //   FailedPrecondition: no sequence is open.
  //   ResourceExhausted: the sequence would pass the budget (message names the key, `name`, the
  //     bytes asked, the bytes in use and the budget).
  //   FailedPrecondition: the sequence fits the budget but not the reserved region; the region
  //     must grow first (NeedsGrowth tells this case apart beforehand).
  // `bytes` == 0 returns the current offset's address and takes nothing.
  absl::StatusOr<uintptr_t> Allocate(size_t bytes, absl::string_view name);

  // Returns true when Allocate(bytes) would fit the budget but not the reserved region.
  bool NeedsGrowth(size_t bytes) const;

  // Ends the current sequence (no-op when none is open).
  void End() { open_ = false; }

  // Returns `bytes` rounded up to kAlignment.
  static size_t AlignUp(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  // Returns the hard budget per sequence, in bytes.
  size_t budget_bytes() const { return budget_; }
  // Returns the size of the region the arena hands out from.
  size_t reserved_bytes() const { return reserved_; }
  // Returns the bytes taken by the open sequence (0 when idle).
  size_t in_use_bytes() const { return open_ ? offset_ : 0; }
  // Returns the most bytes any sequence took: the size the region needs.
  size_t high_water_bytes() const { return high_water_; }
  // Returns the most bytes a sequence for `key` took (0 if none ran).
  size_t HighWater(CaptureKey key) const;
  // Returns the high-water mark of every key that ran a sequence, ordered by key.
  const std::map<CaptureKey, size_t>& per_key_high_water() const { return per_key_; }
  // Returns true while a sequence is open, and its key.
  bool open() const { return open_; }
  CaptureKey key() const { return key_; }

 private:
  size_t budget_;
  uintptr_t base_ = 0;
  size_t reserved_ = 0;
  bool open_ = false;
  CaptureKey key_;
  size_t offset_ = 0;
  size_t high_water_ = 0;
  std::map<CaptureKey, size_t> per_key_;
};

}  // namespace kiln

#endif  // KILN_GRAPH_POOL_ARENA_H_
