// One device region with a hard byte budget that every CUDA graph capture takes its scratch
// memory from.
//
//   ASSIGN_OR_RETURN(kiln::GraphMemoryPool pool,
//                    kiln::GraphMemoryPool::Create(/*budget_bytes=*/planner.graph_pool_bytes));
//   kiln::GraphSet graphs(&pool);
//   // Inside the function GraphSet::Capture runs (warm-ups and capture alike):
//   ASSIGN_OR_RETURN(void* workspace, pool.Allocate(workspace_bytes, "attention workspace"));
//   ...
//   std::cout << pool.high_water_bytes() << " bytes used by the largest graph\n";
//
// Graphs replay one at a time on one stream, so every capture starts from the region's base
// (PoolArena rewinds it) and the region needs the maximum over capture keys, not the sum. Capture
// largest first so the first capture meets the high-water mark. Memory from the pool is scratch:
// the next replay of any graph may overwrite it, so a graph's outputs belong in the caller's
// static buffers, not here.
//
// Asking for more than the budget is ResourceExhausted naming the key, the bytes asked and the
// budget. The region is reserved up front (the whole budget unless told otherwise); making it
// larger (Reserve) moves it, is illegal during capture (FailedPrecondition through
// runtime/cuda/capture_check, so CaptureGuard names it) and bumps generation(), which makes
// GraphSet refuse to replay graphs captured over the old region.
//
// Not thread-safe: one thread captures at a time. Movable, not copyable; frees the region on
// destruction (after every graph that uses it is gone).
#ifndef KILN_GRAPH_GRAPH_MEMORY_POOL_H_
#define KILN_GRAPH_GRAPH_MEMORY_POOL_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/capture_context.h"
#include "graph/pool_arena.h"
#include "runtime/cuda/device_buffer.h"

namespace kiln {

class GraphMemoryPool {
 public:
  // Passed as `reserve_bytes` to reserve the whole budget.
  static constexpr size_t kWholeBudget = std::numeric_limits<size_t>::max();

  // Creates a pool with a hard budget of `budget_bytes` per capture and reserves a device region
  // of min(reserve_bytes, budget_bytes) on the current device. ResourceExhausted if the device
  // cannot hold the region. Illegal during capture (FailedPrecondition).
  static absl::StatusOr<GraphMemoryPool> Create(size_t budget_bytes,
                                                size_t reserve_bytes = kWholeBudget);

  GraphMemoryPool(GraphMemoryPool&&) = default;
  GraphMemoryPool& operator=(GraphMemoryPool&&) = default;
  GraphMemoryPool(const GraphMemoryPool&) = delete;
  GraphMemoryPool& operator=(const GraphMemoryPool&) = delete;

  // Replaces the region by one of `bytes` (at most the budget), at a new address: graphs
  // captured before must be captured again (generation() changes). FailedPrecondition naming
  // "Graph memory pool growth" during capture; InvalidArgument above the budget. Not callable
  // during capture.
  absl::Status Reserve(size_t bytes);

  // Starts the allocation sequence of one warm-up or capture of `key` at the region's base.
  // GraphSet calls this; callable during capture.
  void Begin(CaptureKey key) { arena_.Begin(key); }

  // Returns `bytes` of device memory (256-byte aligned) from the current sequence; the pool
  // keeps ownership. Callable during capture. Errors: ResourceExhausted over the budget (names
  // the key, `name`, the bytes and the budget); FailedPrecondition when the region would have to
  // grow (recorded as the capture's illegal operation when capturing) or outside a sequence.
  absl::StatusOr<void*> Allocate(size_t bytes, absl::string_view name);

  // Ends the current sequence. GraphSet calls this.
  void End() { arena_.End(); }

  // Returns the hard budget, in bytes.
  size_t budget_bytes() const { return arena_.budget_bytes(); }
  // Returns the size of the device region, in bytes.
  size_t reserved_bytes() const { return arena_.reserved_bytes(); }
  // Returns the most bytes one capture took (the region size the captures need).
  size_t high_water_bytes() const { return arena_.high_water_bytes(); }
  // Returns the most bytes a capture of `key` took.
  size_t HighWater(CaptureKey key) const { return arena_.HighWater(key); }
  // Returns the high-water mark of every key, ordered by key.
  const std::map<CaptureKey, size_t>& per_key_high_water() const {
    return arena_.per_key_high_water();
  }
  // Returns a number that changes whenever the region moves.
  uint64_t generation() const { return generation_; }
  // Returns the region's base address (nullptr when nothing is reserved).
  void* base() const { return region_.data(); }

  // Returns "pool 12.0 MiB of 64.0 MiB reserved (budget 64.0 MiB)".
  std::string ToString() const;

 private:
  explicit GraphMemoryPool(size_t budget_bytes) : arena_(budget_bytes) {}

  DeviceBuffer region_;
  PoolArena arena_;
  uint64_t generation_ = 0;
};

// Returns `bytes` as "12.0 MiB" (or "512 B", "3.5 KiB", "1.2 GiB").
std::string FormatBytes(size_t bytes);

}  // namespace kiln

#endif  // KILN_GRAPH_GRAPH_MEMORY_POOL_H_
