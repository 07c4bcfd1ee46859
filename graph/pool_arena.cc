#include "graph/pool_arena.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status PoolArena::Rebase(uintptr_t base, size_t reserved_bytes) {
  if (open_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Graph memory pool region changed while the sequence for ", KeyName(key_),
                     " is open; change it between captures"));
  }
  if (base % kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Graph memory pool base 0x", absl::Hex(base),
                                                   " is not ", kAlignment,
                                                   "-byte aligned; use a cudaMalloc'd region"));
  }
  if (reserved_bytes > std::numeric_limits<uintptr_t>::max() - base) {
    // base + offset would wrap: the arena would hand out addresses below the region.
    return absl::InvalidArgumentError(absl::StrCat(
        "Graph memory pool region of ", reserved_bytes, " bytes at 0x", absl::Hex(base),
        " runs past the end of the address space; use a cudaMalloc'd region"));
  }
  if (reserved_bytes > budget_) {
    return absl::InvalidArgumentError(absl::StrCat("Graph memory pool region of ", reserved_bytes,
                                                   " bytes exceeds the budget of ", budget_,
                                                   " bytes; reserve at most the budget"));
  }
  base_ = base;
  reserved_ = reserved_bytes;
  return absl::OkStatus();
}

void PoolArena::Begin(CaptureKey key) {
  open_ = true;
  key_ = key;
  offset_ = 0;
  per_key_.emplace(key, 0);
}

namespace {

// Returns true when `bytes`, rounded up to the alignment, fits `room`; compared without
// overflow (sizes within an alignment of SIZE_MAX would round up to 0).
bool FitsAligned(size_t bytes, size_t room) {
  if (bytes > room || bytes > std::numeric_limits<size_t>::max() - (PoolArena::kAlignment - 1)) {
    return false;
  }
  return PoolArena::AlignUp(bytes) <= room;
}

}  // namespace

bool PoolArena::NeedsGrowth(size_t bytes) const {
  if (!open_ || !FitsAligned(bytes, budget_ - offset_)) return false;
  return offset_ + AlignUp(bytes) > reserved_;
}

absl::StatusOr<uintptr_t> PoolArena::Allocate(size_t bytes, absl::string_view name) {
  if (!open_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Graph memory pool allocation of '", name,
        "' outside a capture sequence; allocate inside GraphSet::Capture's function (or call "
        "Begin first)"));
  }
  // offset_ <= budget_ always holds.
  if (!FitsAligned(bytes, budget_ - offset_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "Graph memory pool budget exceeded while capturing ", KeyName(key_), ": '", name, "' asks ",
        bytes, " bytes with ", offset_, " in use, over the budget of ", budget_,
        " bytes; raise the graph pool budget or drop the sizes that need it"));
  }
  const size_t aligned = AlignUp(bytes);
  if (offset_ + aligned > reserved_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Graph memory pool region of ", reserved_, " bytes is too small for ",
                     KeyName(key_), ": '", name, "' needs it to grow to ", offset_ + aligned,
                     " bytes; reserve that much before capturing"));
  }
  const uintptr_t address = base_ + offset_;
  offset_ += aligned;
  high_water_ = std::max(high_water_, offset_);
  size_t& key_high = per_key_[key_];
  key_high = std::max(key_high, offset_);
  return address;
}

size_t PoolArena::HighWater(CaptureKey key) const {
  auto it = per_key_.find(key);
  return it == per_key_.end() ? 0 : it->second;
}

}  // namespace kiln
