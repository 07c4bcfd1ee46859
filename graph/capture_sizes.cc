#include "graph/capture_sizes.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

// Appends start, start + step, ... up to `last` (inclusive) to `out`.
void AppendRange(int start, int last, int step, std::vector<int>* out) {
  for (int s = start; s <= last; s += step) out->push_back(s);
}

// Crops the ascending `full` list to `limit` and appends `limit` when it is missing.
std::vector<int> CropAndClose(const std::vector<int>& full, int limit) {
  std::vector<int> out;
  for (int s : full) {
    if (s <= limit) out.push_back(s);
  }
  if (out.empty() || out.back() != limit) out.push_back(limit);
  return out;
}

absl::Status CheckLimit(int limit, absl::string_view limit_name) {
  if (limit < 1 || limit > CaptureSizes::kMaxLimit) {
    return absl::InvalidArgumentError(absl::StrCat(limit_name, " ", limit,
                                                   " is out of range; use a value in [1, ",
                                                   CaptureSizes::kMaxLimit, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int> CaptureSizes::DefaultDecodeSizes(int max_num_seqs) {
  if (max_num_seqs < 1 || max_num_seqs > kMaxLimit) return {};
  std::vector<int> full = {1, 2, 4};
  AppendRange(8, 128, 8, &full);
  AppendRange(144, 256, 16, &full);
  AppendRange(288, 1024, 32, &full);
  return CropAndClose(full, max_num_seqs);
}

std::vector<int> CaptureSizes::DefaultPrefillSizes(int max_num_tokens) {
  if (max_num_tokens < 1 || max_num_tokens > kMaxLimit) return {};
  std::vector<int> full;
  AppendRange(16, 64, 16, &full);
  AppendRange(96, 256, 32, &full);
  AppendRange(320, 512, 64, &full);
  return CropAndClose(full, max_num_tokens);
}

absl::StatusOr<CaptureSizes> CaptureSizes::Decode(int max_num_seqs,
                                                  const std::vector<int>& user_sizes) {
  if (!user_sizes.empty()) return FromList(user_sizes, max_num_seqs, "max_num_seqs");
  // The default list ends at the limit itself, so the limit bounds the padding table.
  RETURN_IF_ERROR(CheckLimit(max_num_seqs, "max_num_seqs"));
  return CaptureSizes(DefaultDecodeSizes(max_num_seqs));
}

absl::StatusOr<CaptureSizes> CaptureSizes::Prefill(int max_num_tokens,
                                                   const std::vector<int>& user_sizes) {
  if (!user_sizes.empty()) return FromList(user_sizes, max_num_tokens, "max_num_tokens");
  RETURN_IF_ERROR(CheckLimit(max_num_tokens, "max_num_tokens"));
  return CaptureSizes(DefaultPrefillSizes(max_num_tokens));
}

absl::StatusOr<CaptureSizes> CaptureSizes::FromList(const std::vector<int>& sizes, int limit,
                                                    absl::string_view limit_name) {
  // A listed size, not the limit, bounds the padding table: a limit above kMaxLimit is fine
  // (batches above the largest size run eagerly), a size above it is not.
  if (limit < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(limit_name, " ", limit, " is out of range; use a positive value"));
  }
  if (sizes.empty()) {
    return absl::InvalidArgumentError(
        "The capture size list is empty; give at least one size or leave it unset for the "
        "defaults");
  }
  absl::flat_hash_set<int> seen;
  for (int s : sizes) {
    if (s < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("Capture size ", s, " is not positive; every size must be at least 1"));
    }
    if (s > limit) {
      return absl::InvalidArgumentError(absl::StrCat("Capture size ", s, " exceeds ", limit_name,
                                                     " ", limit, "; remove it or raise ",
                                                     limit_name));
    }
    if (s > kMaxLimit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Capture size ", s, " is above ", kMaxLimit,
          ", the largest size batches are padded to; remove it (larger batches run eagerly)"));
    }
    if (!seen.insert(s).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("Capture size ", s, " appears more than once; list each size once"));
    }
  }
  std::vector<int> sorted = sizes;
  std::sort(sorted.begin(), sorted.end());
  return CaptureSizes(std::move(sorted));
}

CaptureSizes::CaptureSizes(std::vector<int> sizes) : sizes_(std::move(sizes)) {
  padded_.assign(static_cast<size_t>(sizes_.back()) + 1, 0);
  int n = 1;
  for (int s : sizes_) {
    for (; n <= s; ++n) padded_[n] = s;
  }
}

std::vector<int> CaptureSizes::LargestFirst() const {
  return std::vector<int>(sizes_.rbegin(), sizes_.rend());
}

std::string CaptureSizes::ToString(int max_items) const {
  std::string out;
  const int n = static_cast<int>(sizes_.size());
  if (n <= max_items || max_items < 2) {
    for (int i = 0; i < n; ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", sizes_[i]);
    return out;
  }
  // The first max_items - 1 values, "...", the last one, and the count.
  for (int i = 0; i < max_items - 1; ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", sizes_[i]);
  absl::StrAppend(&out, ", ..., ", sizes_.back(), " (", n, " sizes)");
  return out;
}

}  // namespace kiln
