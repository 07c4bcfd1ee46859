#include "graph/graph_memory_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {

absl::StatusOr<GraphMemoryPool> GraphMemoryPool::Create(size_t budget_bytes, size_t reserve_bytes) {
  GraphMemoryPool pool(budget_bytes);
  RETURN_IF_ERROR(pool.Reserve(std::min(reserve_bytes, budget_bytes)));
  return pool;
}

absl::Status GraphMemoryPool::Reserve(size_t bytes) {
  RETURN_IF_ERROR(
      CheckNotCapturing(nullptr, absl::StrCat("Graph memory pool growth from ",
                                              arena_.reserved_bytes(), " to ", bytes, " bytes")));
  if (bytes > arena_.budget_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Graph memory pool region of ", bytes, " bytes exceeds the budget of ",
        arena_.budget_bytes(), " bytes; reserve at most the budget or create a larger pool"));
  }
  if (arena_.open()) {
    return absl::FailedPreconditionError(
        "Graph memory pool region changed while a capture sequence is open; reserve between "
        "captures");
  }
  // Free the old region first: the device may not hold both. Until the new one exists the arena
  // points at nothing, so a failed Reserve leaves a pool that refuses every allocation.
  region_ = DeviceBuffer();
  ++generation_;
  RETURN_IF_ERROR(arena_.Rebase(0, 0));
  if (bytes == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(region_, DeviceBuffer::Allocate(bytes, "graph memory pool"));
  return arena_.Rebase(reinterpret_cast<uintptr_t>(region_.data()), bytes);
}

absl::StatusOr<void*> GraphMemoryPool::Allocate(size_t bytes, absl::string_view name) {
  if (arena_.NeedsGrowth(bytes)) {
    // Growth would move the region under addresses already handed out in this sequence (and
    // under captured graphs); during capture it is also an allocation, which is illegal.
    RETURN_IF_ERROR(CheckNotCapturing(
        nullptr, absl::StrCat("Graph memory pool growth for '", name, "' (", bytes,
                              " bytes) beyond the ", arena_.reserved_bytes(), " reserved bytes")));
  }
  ASSIGN_OR_RETURN(uintptr_t address, arena_.Allocate(bytes, name));
  return reinterpret_cast<void*>(address);
}

std::string GraphMemoryPool::ToString() const {
  return absl::StrCat("pool ", FormatBytes(high_water_bytes()), " of ",
                      FormatBytes(reserved_bytes()), " reserved (budget ",
                      FormatBytes(budget_bytes()), ")");
}

std::string FormatBytes(size_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, units[unit]);
}

}  // namespace kiln
