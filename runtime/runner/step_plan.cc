#include "runtime/runner/step_plan.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

constexpr size_t kAlign = 256;

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

absl::StatusOr<StepKeys> StepKeys::Create(const StepLimits& limits, const CaptureSizes* decode,
                                          const CaptureSizes* prefill) {
  if (limits.max_num_seqs < 1 || limits.max_num_batched_tokens < limits.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Step limits max_num_seqs ", limits.max_num_seqs, " and max_num_batched_tokens ",
        limits.max_num_batched_tokens,
        " must be positive with max_num_batched_tokens >= max_num_seqs"));
  }
  StepKeys keys;
  keys.limits_ = limits;
  if (decode != nullptr) {
    if (decode->max_size() > limits.max_num_seqs) {
      return absl::InvalidArgumentError(
          absl::StrCat("Decode capture size ", decode->max_size(), " exceeds max_num_seqs ",
                       limits.max_num_seqs, "; remove it or raise max_num_seqs"));
    }
    keys.decode_index_.assign(decode->max_size() + 1, -1);
    for (int size : decode->sizes()) {
      StepKey k;
      k.key = {GraphMode::kDecode, size};
      k.max_tokens = size;
      k.max_rows = size;
      k.decode_part = true;
      keys.keys_.push_back(k);
    }
    for (int b = decode->max_size(); b >= 1; --b) {
      const int index = keys.Find({GraphMode::kDecode, *decode->PaddedSize(b)});
      keys.decode_index_[b] = index;
      keys.keys_[index].min_rows = b;
    }
  }
  if (prefill != nullptr) {
    if (prefill->max_size() > limits.max_num_batched_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Prefill capture size ", prefill->max_size(), " exceeds max_num_batched_tokens ",
          limits.max_num_batched_tokens, "; remove it or raise max_num_batched_tokens"));
    }
    keys.prefill_index_.assign(prefill->max_size() + 1, -1);
    for (int size : prefill->sizes()) {
      StepKey k;
      k.key = {GraphMode::kPrefill, size};
      k.max_tokens = size;
      k.max_rows = std::min(size, limits.max_num_seqs);
      k.decode_part = true;
      k.prefill_part = true;
      keys.keys_.push_back(k);
    }
    for (int t = 1; t <= prefill->max_size(); ++t) {
      keys.prefill_index_[t] = keys.Find({GraphMode::kPrefill, *prefill->PaddedSize(t)});
    }
  }
  StepKey eager;
  eager.key = {GraphMode::kMixed, limits.max_num_batched_tokens};
  eager.max_tokens = limits.max_num_batched_tokens;
  eager.max_rows = limits.max_num_seqs;
  eager.decode_part = true;
  eager.prefill_part = true;
  eager.eager_only = true;
  keys.keys_.push_back(eager);
  return keys;
}

int StepKeys::Find(CaptureKey key) const {
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i].key == key && !keys_[i].eager_only) return static_cast<int>(i);
  }
  return -1;
}

absl::Status StepKeys::Check(absl::Span<const SeqLens> seqs) const {
  if (seqs.empty()) {
    return absl::InvalidArgumentError("The step has no sequences; give at least one");
  }
  if (seqs.size() > static_cast<size_t>(limits_.max_num_seqs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("The step has ", seqs.size(), " sequences, above max_num_seqs ",
                     limits_.max_num_seqs, "; split it into smaller steps"));
  }
  int64_t tokens = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqLens& s = seqs[i];
    if (s.q_len < 1) {
      return absl::InvalidArgumentError(absl::StrCat("Sequence ", i, " of the step brings ",
                                                     s.q_len, " tokens; each needs at least 1"));
    }
    // Its new tokens go to positions kv_len - q_len .. kv_len - 1, which must not be negative.
    if (s.kv_len < s.q_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sequence ", i, " of the step has kv_len ", s.kv_len, " below its q_len ",
                       s.q_len, "; kv_len counts the cached tokens and the new ones"));
    }
    tokens += s.q_len;
  }
  if (tokens > limits_.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "The step has ", tokens, " tokens, above max_num_batched_tokens ",
        limits_.max_num_batched_tokens, "; chunk the prefill into smaller steps"));
  }
  return absl::OkStatus();
}

StepRoute StepKeys::Route(absl::Span<const SeqLens> seqs) const {
  // A batch Check refuses must still route without reading outside the tables or overflowing:
  // counts in 64 bits, tables indexed only at 1..size - 1, and an eager route clamped to int,
  // which FillStepInputs then refuses as larger than the eager layout.
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  int64_t tokens = 0;
  bool decode_only = true;
  for (const SeqLens& s : seqs) {
    tokens += s.q_len;
    decode_only = decode_only && s.q_len == 1;
  }
  StepRoute route;
  if (decode_only && num_seqs >= 1 && num_seqs < static_cast<int64_t>(decode_index_.size())) {
    route.key_index = decode_index_[num_seqs];
  } else if (!decode_only && tokens >= 1 && tokens < static_cast<int64_t>(prefill_index_.size())) {
    route.key_index = prefill_index_[tokens];
  }
  if (route.key_index < 0) {
    constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
    route.key_index = eager_index();
    route.num_tokens = static_cast<int>(std::clamp<int64_t>(tokens, 0, kMaxInt));
    route.num_rows = static_cast<int>(std::min(num_seqs, kMaxInt));
    return route;
  }
  route.num_tokens = keys_[route.key_index].max_tokens;
  route.num_rows = keys_[route.key_index].max_rows;
  return route;
}

SplitKvPlannerOptions PlannerOptionsFor(const StepKey& key, int num_q_heads, int num_kv_heads,
                                        int head_dim, int sm_count, int max_kv_len,
                                        int prefill_tile_rows) {
  SplitKvPlannerOptions o;
  o.num_q_heads = num_q_heads;
  o.num_kv_heads = num_kv_heads;
  o.head_dim = head_dim;
  o.sm_count = sm_count;
  o.key = {key.max_rows, key.max_tokens, max_kv_len};
  // No division by a KV head count below 1: the part is left off, and SplitKvPlanner::Create
  // refuses the heads by name.
  o.decode.tile_rows = key.decode_part && num_kv_heads > 0 ? num_q_heads / num_kv_heads : 0;
  o.prefill.tile_rows = key.prefill_part ? prefill_tile_rows : 0;
  return o;
}

int DecodeCtasPerSm(const StepKey& key, const std::vector<SplitAim>& aims, int otherwise) {
  const int low = key.prefill_part ? key.max_rows : key.min_rows;
  int largest = 0;
  for (const SplitAim& aim : aims) {
    if (aim.max_seqs >= low) largest = std::max(largest, aim.ctas_per_sm);
    if (aim.max_seqs >= key.max_rows) return largest;  // no count of the key lies above it
  }
  return std::max(largest, otherwise);
}

void SetDecodeSplit(const StepKey& key, const std::vector<SplitAim>& aims, int otherwise,
                    PlanPartOptions* decode) {
  decode->ctas_per_sm = DecodeCtasPerSm(key, aims, otherwise);
  decode->aim_by_seqs = aims;
  if (aims.empty() || aims.back().max_seqs < key.max_rows) {
    decode->aim_by_seqs.push_back({key.max_rows, otherwise});
  }
}

MetadataLayout MetadataLayout::Create(const StepKey& key, size_t plan_bytes,
                                      int max_blocks_per_seq) {
  MetadataLayout l;
  l.max_tokens = key.max_tokens;
  l.max_rows = key.max_rows;
  l.max_blocks_per_seq = max_blocks_per_seq;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at += AlignUp(bytes);
    return here;
  };
  l.token_ids = take(sizeof(int32_t) * key.max_tokens);
  l.positions = take(sizeof(int32_t) * key.max_tokens);
  l.last_token_rows = take(sizeof(int32_t) * key.max_rows);
  l.plan = take(plan_bytes);
  l.block_table = take(sizeof(int32_t) * key.max_rows * static_cast<size_t>(max_blocks_per_seq));
  l.bytes = at;
  return l;
}

MetadataFetch MetadataLayout::Fetch() const {
  MetadataFetch f;
  const size_t table_bytes = bytes - block_table;
  f.fixed_bytes = table_bytes <= kWholeTableFetchBytes ? bytes : block_table;
  f.table_offset = block_table;
  f.row_bytes = table_bytes <= kWholeTableFetchBytes
                    ? 0
                    : static_cast<size_t>(max_blocks_per_seq) * sizeof(int32_t);
  f.last_token_rows = last_token_rows;
  f.max_rows = max_rows;
  return f;
}

absl::Status FillStepInputs(const MetadataLayout& layout, const StepRoute& route,
                            absl::Span<const SeqLens> seqs,
                            absl::Span<const absl::Span<const int32_t>> tokens,
                            absl::Span<const absl::Span<const int32_t>> blocks, int block_size,
                            void* blob, StepIds id_check) {
  if (tokens.size() != seqs.size() || blocks.size() != seqs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Step inputs disagree: ", seqs.size(), " sequences, ", tokens.size(), " token lists, ",
        blocks.size(), " block lists; pass one token list and one block list per sequence"));
  }
  if (block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Step inputs block_size ", block_size, " must be positive; pass the KV cache's"));
  }
  // Compared as size_t before any int cast: a span of 2^31 sequences must not wrap.
  if (route.num_tokens < 0 || route.num_rows < 0 || route.num_tokens > layout.max_tokens ||
      route.num_rows > layout.max_rows || seqs.size() > static_cast<size_t>(route.num_rows)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Step of ", seqs.size(), " sequences at ", route.num_tokens, " token rows and ",
        route.num_rows, " logits rows does not fit the layout (", layout.max_tokens, " tokens, ",
        layout.max_rows, " rows); route the step with the layout's StepKeys"));
  }
  if (blob == nullptr) {
    return absl::InvalidArgumentError(
        "Step inputs blob is null; pass the layout's pinned host buffer");
  }
  const int num_seqs = static_cast<int>(seqs.size());
  // Every check before the first write: a refused step leaves the blob as it was.
  const bool check_ids = id_check != StepIds::kCheckedByCaller;  // any other value checks
  int64_t rows = 0;
  for (int i = 0; i < num_seqs; ++i) {
    const SeqLens& s = seqs[i];
    // An empty sequence has no last token: its row would read -1 (or the previous sequence's
    // row), which ends the fetch's count of sequences early.
    if (s.q_len < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sequence ", i, " has q_len ", s.q_len, "; every sequence of a step brings at least "
          "one token: leave it out of the step"));
    }
    // The new tokens sit at positions kv_len - q_len .. kv_len - 1 of the KV cache, where the
    // step appends them: a negative position would write before the sequence's first block.
    if (s.kv_len < s.q_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sequence ", i, " has kv_len ", s.kv_len, " below its q_len ", s.q_len,
                       "; kv_len counts the cached tokens and the new ones"));
    }
    if (tokens[i].size() != static_cast<size_t>(s.q_len)) {
      return absl::InvalidArgumentError(absl::StrCat("Sequence ", i, " has ", tokens[i].size(),
                                                     " tokens but q_len ", s.q_len,
                                                     "; pass q_len tokens"));
    }
    for (size_t j = 0; check_ids && j < tokens[i].size(); ++j) {
      if (tokens[i][j] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("Sequence ", i, " has token id ", tokens[i][j], " at ", j,
                         "; token ids are non-negative (-1 marks padding rows)"));
      }
    }
    rows += s.q_len;
    if (rows > route.num_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "The step's tokens (", rows, " through sequence ", i, ") exceed its ", route.num_tokens,
          " token rows; route the step (StepKeys::Route) after its last change"));
    }
    const int64_t needed = (int64_t{s.kv_len} + block_size - 1) / block_size;
    if (static_cast<int64_t>(blocks[i].size()) < needed ||
        static_cast<int64_t>(blocks[i].size()) > layout.max_blocks_per_seq) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sequence ", i, " has ", blocks[i].size(), " KV blocks; its ", s.kv_len, " tokens need ",
          needed, " and a row holds at most ", layout.max_blocks_per_seq,
          "; pass the blocks that cover kv_len (SequenceTable::Blocks after Reserve)"));
    }
    for (size_t j = 0; check_ids && j < blocks[i].size(); ++j) {
      if (blocks[i][j] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("Sequence ", i, " has KV block ", blocks[i][j], " at ", j,
                         "; block ids are non-negative (-1 marks unused table entries)"));
      }
    }
  }

  char* base = static_cast<char*>(blob);
  int32_t* ids = reinterpret_cast<int32_t*>(base + layout.token_ids);
  int32_t* positions = reinterpret_cast<int32_t*>(base + layout.positions);
  int32_t* last = reinterpret_cast<int32_t*>(base + layout.last_token_rows);
  int32_t* table = reinterpret_cast<int32_t*>(base + layout.block_table);
  int row = 0;
  for (int i = 0; i < num_seqs; ++i) {
    const SeqLens& s = seqs[i];
    const int first_position = s.kv_len - s.q_len;  // >= 0, checked above
    for (int j = 0; j < s.q_len; ++j) {
      ids[row + j] = tokens[i][j];
      positions[row + j] = first_position + j;
    }
    row += s.q_len;
    last[i] = row - 1;
    int32_t* table_row = table + static_cast<size_t>(i) * layout.max_blocks_per_seq;
    std::memcpy(table_row, blocks[i].data(), blocks[i].size() * sizeof(int32_t));
    std::fill(table_row + blocks[i].size(), table_row + layout.max_blocks_per_seq, -1);
  }
  std::fill(ids + row, ids + route.num_tokens, -1);
  std::fill(positions + row, positions + route.num_tokens, 0);
  // To the layout's end, not the route's: the fetch counts the sequences up to the first -1.
  std::fill(last + num_seqs, last + layout.max_rows, -1);
  return absl::OkStatus();
}

}  // namespace kiln
