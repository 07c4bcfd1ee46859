#include "runtime/memory/capture_sizes.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln {

std::vector<int> DefaultCaptureSizes(int limit) {
  std::vector<int> sizes;
  if (limit < 1) return sizes;
  // Small batches are common and cheap to capture; the step widens as padding waste shrinks
  // relative to the batch (at most 1/8 of a batch is padding past 8).
  std::vector<int> ladder = {1, 2, 4};
  for (int s = 8; s <= 128; s += 8) ladder.push_back(s);
  for (int s = 144; s <= 256; s += 16) ladder.push_back(s);
  for (int s = 288; s <= 1024; s += 32) ladder.push_back(s);
  for (int s : ladder) {
    if (s <= limit) sizes.push_back(s);
  }
  if (sizes.back() != limit) sizes.push_back(limit);
  return sizes;
}

absl::StatusOr<std::vector<int>> ValidateCaptureSizes(absl::Span<const int> sizes, int limit,
                                                      absl::string_view limit_name) {
  std::vector<int> sorted(sizes.begin(), sizes.end());
  for (int s : sorted) {
    if (s <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Capture size ", s, " is not positive; remove it"));
    }
    if (s > limit) {
      return absl::InvalidArgumentError(absl::StrCat("Capture size ", s, " exceeds ", limit_name,
                                                     " ", limit, "; remove it or raise ",
                                                     limit_name));
    }
  }
  std::sort(sorted.begin(), sorted.end());
  auto duplicate = std::adjacent_find(sorted.begin(), sorted.end());
  if (duplicate != sorted.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Capture size ", *duplicate, " appears twice; list each size once"));
  }
  return sorted;
}

}  // namespace kiln
