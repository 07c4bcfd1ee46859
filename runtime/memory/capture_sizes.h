// The sizes CUDA graphs are captured at, as the memory planner counts them.
//
//   std::vector<int> sizes = kiln::DefaultCaptureSizes(256);  // 1, 2, 4, 8, 16, ..., 240, 256
//   ASSIGN_OR_RETURN(sizes, kiln::ValidateCaptureSizes(user_sizes, 256, "max_num_seqs"));
//
// This is the default decode list of DESIGN.md (graph/: CaptureSizes). It lives here until
// //graph:capture_sizes exists; then the planner should take the list from there so the runner
// and the planner can never disagree. Thread-safe; no CUDA.
#ifndef KILN_RUNTIME_MEMORY_CAPTURE_SIZES_H_
#define KILN_RUNTIME_MEMORY_CAPTURE_SIZES_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kiln {

// Returns 1, 2, 4, then 8..128 step 8, 144..256 step 16, 288..1024 step 32, cropped to `limit`,
// with `limit` itself added when it is not in the list (so every size up to it has a graph).
// Ascending. Empty when limit < 1.
std::vector<int> DefaultCaptureSizes(int limit);

// Returns `sizes` sorted ascending, or InvalidArgument naming the first bad value: a size that
// is not positive, appears twice, or exceeds `limit` (`limit_name` says which setting the limit
// is, for the message: "Capture size 300 exceeds max_num_seqs 256; remove it or raise
// max_num_seqs").
absl::StatusOr<std::vector<int>> ValidateCaptureSizes(absl::Span<const int> sizes, int limit,
                                                      absl::string_view limit_name);

}  // namespace kiln

#endif  // KILN_RUNTIME_MEMORY_CAPTURE_SIZES_H_
