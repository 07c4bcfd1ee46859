// The sizes kiln captures CUDA graphs for, and the O(1) padding of a live size to one of them.
//
//   ASSIGN_OR_RETURN(kiln::CaptureSizes decode, kiln::CaptureSizes::Decode(/*max_num_seqs=*/256));
//   std::optional<int> padded = decode.PaddedSize(num_seqs);   // 5 -> 8, 130 -> 144
//   if (!padded) return RunEagerly();                            // larger than every graph
//   RETURN_IF_ERROR(graphs.Replay({kiln::GraphMode::kDecode, *padded}, stream));
//
// Default decode sizes (number of sequences): 1, 2, 4, then 8..128 step 8, 144..256 step 16,
// 288..1024 step 32, cropped to max_num_seqs; max_num_seqs itself is added when it is not in the
// list, so every batch from 1 to max_num_seqs has a graph. 51 sizes up to 1024.
//
// Default prefill sizes (number of tokens): 16, 32, 48, 64, then 96..256 step 32, then 320..512
// step 64, cropped to max_num_tokens (which is added when missing). Why these: a prefill graph
// does work proportional to its padded token count, so the step grows with the size to keep the
// padding waste near or under 1/8 of the tokens (at most 16 tokens below 64, 32 up to 256, 64 up to
// 512), while 14 graphs keep capture time and executable overhead small. Prompts longer than the
// largest size run eagerly, where launch overhead is small next to the work anyway.
//
// A user list is validated (every size positive, no duplicates, none above the limit) and used
// as given, sorted; it gets no extra size, so batches above its largest run eagerly.
//
// Host-only (no CUDA). Immutable after creation: const methods are thread-safe and callable
// during capture.
#ifndef KILN_GRAPH_CAPTURE_SIZES_H_
#define KILN_GRAPH_CAPTURE_SIZES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

class CaptureSizes {
 public:
  // The largest size, and the largest limit (max_num_seqs or max_num_tokens) the default lists
  // accept (they end at the limit). The padding table holds one int32 per size up to the
  // largest, so this bounds it at 256 KiB.
  static constexpr int kMaxLimit = 1 << 16;

  // Returns the default decode sizes for `max_num_seqs` (ascending; see the file comment).
  // `max_num_seqs` must be in [1, kMaxLimit]; outside it, returns an empty list.
  static std::vector<int> DefaultDecodeSizes(int max_num_seqs);

  // Returns the default prefill token counts for `max_num_tokens` (ascending; see the file
  // comment). `max_num_tokens` must be in [1, kMaxLimit]; outside it, returns an empty list.
  static std::vector<int> DefaultPrefillSizes(int max_num_tokens = 512);

  // Returns the decode sizes: DefaultDecodeSizes(max_num_seqs) when `user_sizes` is empty,
  // else `user_sizes` validated against max_num_seqs. InvalidArgument names the bad value, e.g.
  // "Capture size 300 exceeds max_num_seqs 256; remove it or raise max_num_seqs".
  static absl::StatusOr<CaptureSizes> Decode(int max_num_seqs,
                                             const std::vector<int>& user_sizes = {});

  // Returns the prefill token counts: DefaultPrefillSizes(max_num_tokens) when `user_sizes` is
  // empty, else `user_sizes` validated against max_num_tokens.
  static absl::StatusOr<CaptureSizes> Prefill(int max_num_tokens,
                                              const std::vector<int>& user_sizes = {});

  // Returns `sizes` validated against `limit` (whose name, e.g. "max_num_seqs", appears in
  // errors): every size in [1, min(limit, kMaxLimit)], no duplicates, at least one size; limit
  // at least 1 (it may be above kMaxLimit: batches above the largest size run eagerly). The
  // sizes may come in any order.
  static absl::StatusOr<CaptureSizes> FromList(const std::vector<int>& sizes, int limit,
                                               absl::string_view limit_name);

  // Returns the smallest captured size >= n, or nullopt when n < 1 or n is above every size
  // (run eagerly). O(1): one table read.
  std::optional<int> PaddedSize(int n) const {
    if (n < 1 || n >= static_cast<int>(padded_.size())) return std::nullopt;
    return padded_[n];
  }

  // Returns the sizes, ascending.
  const std::vector<int>& sizes() const { return sizes_; }

  // Returns the sizes, largest first: the order to capture in, so that the first capture
  // reaches the graph pool's high-water mark and failures on memory show up at once.
  std::vector<int> LargestFirst() const;

  // Returns the largest size (the last one that has a graph).
  int max_size() const { return sizes_.back(); }

  // Returns "1, 2, 4, 8, ..., 256" (at most `max_items` values, then "... (N sizes)").
  std::string ToString(int max_items = 12) const;

 private:
  explicit CaptureSizes(std::vector<int> sizes);

  std::vector<int> sizes_;         // ascending, non-empty
  std::vector<int32_t> padded_;    // padded_[n] = smallest size >= n, for n in [1, max_size]
};

}  // namespace kiln

#endif  // KILN_GRAPH_CAPTURE_SIZES_H_
