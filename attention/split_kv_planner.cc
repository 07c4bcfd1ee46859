#include "attention/split_kv_planner.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

constexpr size_t kAlign = 16;

// Work items, merge items, headers and grids hold int32 counts, packed rows and KV positions.
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr AttentionWorkItem kPaddingWorkItem = {-1, 0, 0, 0, 0, -1};
constexpr AttentionMergeItem kPaddingMergeItem = {-1, 0, 0, 0, 0};

// `max_kv_len`: the key's longest KV, whose chunk size (a multiple of kv_granularity that covers
// it) is an int32 in the plan header.
absl::Status ValidatePart(const PlanPartOptions& part, const char* name, int group_size,
                          int64_t max_kv_len) {
  if (part.tile_rows == 0) return absl::OkStatus();
  if (part.tile_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner ", name, ".tile_rows ", part.tile_rows, " is negative; use 0 to disable the ",
        name, " part or at least the ", group_size, " query heads per KV head"));
  }
  if (part.tile_rows < group_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner ", name, ".tile_rows ", part.tile_rows, " is below the ", group_size,
        " query heads per KV head; use at least ", group_size, " rows per tile"));
  }
  if (part.kv_granularity < 1 || part.min_kv_chunk < 1 || part.ctas_per_sm < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner ", name, " options are out of range (tile_rows ", part.tile_rows,
        ", kv_granularity ", part.kv_granularity, ", min_kv_chunk ", part.min_kv_chunk,
        ", ctas_per_sm ", part.ctas_per_sm, "); each must be positive"));
  }
  if (CeilDiv(max_kv_len, part.kv_granularity) * part.kv_granularity > kMaxInt32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner key max_kv_len ", max_kv_len, " rounded up to ", name, ".kv_granularity ",
        part.kv_granularity, " is above ", kMaxInt32, " (int32 KV chunk sizes); lower max_kv_len"));
  }
  return CheckSplitAims(part.aim_by_seqs, absl::StrCat("Planner ", name, ".aim_by_seqs"));
}

// The partial slots a step whose part holds `num_seqs` sequences may use: the slot capacity, or
// fewer where an aim_by_seqs rule aims at fewer CTAs per SM.
int StepSlots(const SplitKvPlannerOptions& options, const PlanPartOptions& part,
              int slot_capacity, int num_seqs) {
  for (const SplitAim& aim : part.aim_by_seqs) {
    if (num_seqs > aim.max_seqs) continue;
    const int64_t slots =
        CeilDiv(static_cast<int64_t>(options.sm_count) * aim.ctas_per_sm, options.num_kv_heads);
    return static_cast<int>(std::min<int64_t>(slot_capacity, slots));
  }
  return slot_capacity;
}

// Computes the key-only shape of one part (`name`) that receives at most `max_seqs` sequences
// and `max_tokens` tokens. InvalidArgument when a capacity would not fit an int32 or a workspace
// size would not fit a size_t.
absl::StatusOr<PlanPartLayout> MakePartLayout(const SplitKvPlannerOptions& options,
                                              const PlanPartOptions& part, const char* name,
                                              int max_seqs, int max_tokens, int group_size) {
  PlanPartLayout layout;
  if (part.tile_rows <= 0) return layout;
  layout.enabled = true;
  layout.tile_rows = part.tile_rows;
  layout.max_seqs = max_seqs;
  layout.max_tokens = max_tokens;
  layout.max_tiles = MaxQueryTiles(max_seqs, max_tokens, group_size, part.tile_rows);
  int64_t slots = 0;
  if (part.allow_split && options.key.max_kv_len > part.min_kv_chunk) {
    // One item per CTA-slot of the GPU, per KV head (grid.y): enough chunks to fill the GPU
    // once when the step has few tiles.
    slots = CeilDiv(static_cast<int64_t>(options.sm_count) * part.ctas_per_sm,
                    options.num_kv_heads);
  }
  const int64_t merges = std::min<int64_t>(layout.max_tiles, slots / 2);
  if (merges == 0) slots = 0;  // a split needs two slots and a tile to merge
  const int64_t work = layout.max_tiles + slots;
  if (work > kMaxInt32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner ", name, " part needs ", work, " work items (", layout.max_tiles,
        " query tiles + ", slots, " partial slots of sm_count ", options.sm_count, " x ",
        name, ".ctas_per_sm ", part.ctas_per_sm, "), above the int32 grid limit ", kMaxInt32,
        "; lower the key's max_tokens or ctas_per_sm"));
  }
  // Below 2^31 slots, slots · num_kv_heads fits 64 bits, but the workspace (times tile_rows and
  // head_dim floats) need not fit a size_t.
  const uint64_t slot_heads = static_cast<uint64_t>(slots) * options.num_kv_heads;
  const uint64_t per_row = static_cast<uint64_t>(options.head_dim) * sizeof(float);
  if (slot_heads > 0 && static_cast<uint64_t>(part.tile_rows) >
                            std::numeric_limits<size_t>::max() / per_row / slot_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner buffer '", name, " partial_o' of ", slots, " slots x ", options.num_kv_heads,
        " KV heads x ", part.tile_rows, " rows x ", options.head_dim,
        " floats overflows size_t; lower ", name, ".ctas_per_sm or tile_rows"));
  }
  layout.slot_capacity = static_cast<int>(slots);
  layout.merge_capacity = static_cast<int>(merges);
  layout.work_capacity = static_cast<int>(work);
  const size_t rows = static_cast<size_t>(slot_heads) * part.tile_rows;
  layout.partial_o_bytes = rows * options.head_dim * sizeof(float);
  layout.partial_lse_bytes = rows * sizeof(float);
  layout.merge_counter_bytes = static_cast<size_t>(slot_heads) * sizeof(int32_t);
  return layout;
}

// Places one part's sections in the blob from `offset` on; returns the new offset.
size_t PlacePart(PlanPartLayout* part, size_t offset) {
  if (!part->enabled) return offset;
  part->header_offset = offset;
  offset += AlignUp(sizeof(AttentionPlanHeader));
  part->work_items_offset = offset;
  offset += AlignUp(sizeof(AttentionWorkItem) * part->work_capacity);
  part->merge_items_offset = offset;
  offset += AlignUp(sizeof(AttentionMergeItem) * part->merge_capacity);
  return offset;
}

bool GoesToDecode(bool decode_enabled, int32_t q_len) { return decode_enabled && q_len == 1; }

}  // namespace

absl::Status CheckSplitAims(const std::vector<SplitAim>& aims, absl::string_view name) {
  for (size_t i = 0; i < aims.size(); ++i) {
    const SplitAim& aim = aims[i];
    if (aim.max_seqs < 1 || aim.ctas_per_sm < 1 ||
        (i > 0 && aim.max_seqs <= aims[i - 1].max_seqs)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "[", i, "] (max_seqs ", aim.max_seqs, ", ctas_per_sm ", aim.ctas_per_sm,
          ") is out of range; give positive values, with max_seqs above the aim before it"));
    }
  }
  return absl::OkStatus();
}

int MaxQueryTiles(int b, int n, int g, int t) {
  if (b <= 0 || n <= 0 || g <= 0 || t <= 0) return 0;
  // In 64 bits (n · g passes int32 for large arguments). With t >= g the bound is at most n; with
  // t < g a token spans several tiles and the count may pass int32: it saturates there rather
  // than wrap into a small or negative capacity.
  const int64_t spread = CeilDiv(static_cast<int64_t>(n) * g, t) + b - 1;
  const int64_t per_token = static_cast<int64_t>(n) * CeilDiv(g, t);
  return static_cast<int>(std::min({spread, per_token, kMaxInt32}));
}

std::vector<PlanBufferSize> PlanLayout::Buffers() const {
  return {
      {"plan", plan_bytes},
      {"decode partial_o", decode.partial_o_bytes},
      {"decode partial_lse", decode.partial_lse_bytes},
      {"decode merge counters", decode.merge_counter_bytes},
      {"prefill partial_o", prefill.partial_o_bytes},
      {"prefill partial_lse", prefill.partial_lse_bytes},
      {"prefill merge counters", prefill.merge_counter_bytes},
  };
}

PlanPartView ViewPart(void* blob, const PlanPartLayout& part) {
  PlanPartView view;
  if (!part.enabled) return view;
  char* base = static_cast<char*>(blob);
  view.header = reinterpret_cast<AttentionPlanHeader*>(base + part.header_offset);
  view.work_items = reinterpret_cast<AttentionWorkItem*>(base + part.work_items_offset);
  view.merge_items = reinterpret_cast<AttentionMergeItem*>(base + part.merge_items_offset);
  return view;
}

absl::StatusOr<SplitKvPlanner> SplitKvPlanner::Create(const SplitKvPlannerOptions& options) {
  if (options.num_q_heads <= 0 || options.num_kv_heads <= 0 ||
      options.num_q_heads % options.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner num_q_heads ", options.num_q_heads, " and num_kv_heads ", options.num_kv_heads,
        " must be positive, num_q_heads a multiple of num_kv_heads; pass the model's head "
        "counts (per rank)"));
  }
  if (options.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner head_dim ", options.head_dim, " must be positive; pass the model's head_dim"));
  }
  if (options.sm_count <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Planner sm_count ", options.sm_count,
                                              " must be positive; pass DeviceInfo::sm_count"));
  }
  const AttentionPlanKey& key = options.key;
  if (key.max_seqs <= 0 || key.max_tokens <= 0 || key.max_kv_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner key (max_seqs ", key.max_seqs, ", max_tokens ", key.max_tokens,
        ", max_kv_len ", key.max_kv_len, ") must be positive; give each capacity at least 1"));
  }
  if (options.decode.tile_rows <= 0 && options.prefill.tile_rows <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner has neither a decode nor a prefill part (decode.tile_rows ",
        options.decode.tile_rows, ", prefill.tile_rows ", options.prefill.tile_rows,
        "); set decode.tile_rows or prefill.tile_rows to a positive number of rows"));
  }
  const int group = options.num_q_heads / options.num_kv_heads;
  if (absl::Status s = ValidatePart(options.decode, "decode", group, key.max_kv_len); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidatePart(options.prefill, "prefill", group, key.max_kv_len);
      !s.ok()) {
    return s;
  }
  // A sequence of the key may bring max_tokens tokens: its packed rows (row = token·G + g) are
  // int32 in the work items.
  if (static_cast<int64_t>(key.max_tokens) * group > kMaxInt32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Planner key max_tokens ", key.max_tokens, " x ", group,
        " query heads per KV head is above ", kMaxInt32,
        " packed query rows (int32 in the work items); lower max_tokens"));
  }

  PlanLayout layout;
  layout.max_seqs = key.max_seqs;
  layout.group_size = group;
  const bool has_decode = options.decode.tile_rows > 0;
  // Decode sequences bring one token each; prefill sequences bring at least two when a decode
  // part takes the single-token ones, else at least one.
  const int decode_seqs = std::min(key.max_seqs, key.max_tokens);
  const int prefill_seqs =
      std::min(key.max_seqs, has_decode ? key.max_tokens / 2 : key.max_tokens);
  absl::StatusOr<PlanPartLayout> decode =
      MakePartLayout(options, options.decode, "decode", decode_seqs, decode_seqs, group);
  if (!decode.ok()) return decode.status();
  absl::StatusOr<PlanPartLayout> prefill =
      MakePartLayout(options, options.prefill, "prefill", prefill_seqs, key.max_tokens, group);
  if (!prefill.ok()) return prefill.status();
  layout.decode = *decode;
  layout.prefill = *prefill;

  size_t offset = 0;
  layout.seq_q_start_offset = offset;
  offset += AlignUp(sizeof(int32_t) * (static_cast<size_t>(key.max_seqs) + 1));
  layout.seq_kv_len_offset = offset;
  offset += AlignUp(sizeof(int32_t) * static_cast<size_t>(key.max_seqs));
  offset = PlacePart(&layout.decode, offset);
  offset = PlacePart(&layout.prefill, offset);
  layout.plan_bytes = offset;
  return SplitKvPlanner(options, layout);
}

absl::StatusOr<PlanSummary> SplitKvPlanner::Plan(absl::Span<const SeqLens> seqs,
                                                 void* blob) const {
  if (blob == nullptr || reinterpret_cast<uintptr_t>(blob) % kAlign != 0) {
    return absl::InvalidArgumentError("Plan blob must be non-null and 16-byte aligned");
  }
  const AttentionPlanKey& key = options_.key;
  // Compared as a size_t: a span of 2^31 or more sequences must not wrap into a small count.
  if (seqs.size() > static_cast<size_t>(key.max_seqs)) {
    return absl::InvalidArgumentError(absl::StrCat("Step has ", seqs.size(),
                                                   " sequences, above the key's max_seqs ",
                                                   key.max_seqs, "; plan it under a larger key"));
  }
  const int n = static_cast<int>(seqs.size());
  char* base = static_cast<char*>(blob);
  int32_t* seq_q_start = reinterpret_cast<int32_t*>(base + layout_.seq_q_start_offset);
  int32_t* seq_kv_len = reinterpret_cast<int32_t*>(base + layout_.seq_kv_len_offset);
  const bool has_decode = layout_.decode.enabled;
  const bool has_prefill = layout_.prefill.enabled;
  int64_t tokens = 0;
  for (int i = 0; i < n; ++i) {
    const SeqLens& s = seqs[i];
    if (s.q_len < 0 || s.kv_len < 0 || s.kv_len > key.max_kv_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sequence ", i, " has q_len ", s.q_len, " and kv_len ", s.kv_len,
          "; both must be non-negative and kv_len at most the key's max_kv_len ",
          key.max_kv_len));
    }
    if (s.q_len > 0 && !GoesToDecode(has_decode, s.q_len) && !has_prefill) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sequence ", i, " has q_len ", s.q_len,
          " but the planner has no prefill part; set prefill.tile_rows"));
    }
    seq_q_start[i] = static_cast<int32_t>(tokens);
    seq_kv_len[i] = s.kv_len;
    tokens += s.q_len;
    if (tokens > key.max_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("Step has more than ", key.max_tokens,
                                                " tokens (the key's max_tokens) by sequence ", i,
                                                "; plan it under a larger key"));
    }
  }
  for (int i = n; i < key.max_seqs; ++i) {
    seq_q_start[i] = static_cast<int32_t>(tokens);
    seq_kv_len[i] = 0;
  }
  seq_q_start[key.max_seqs] = static_cast<int32_t>(tokens);

  PlanSummary summary;
  summary.num_seqs = n;
  summary.num_tokens = static_cast<int>(tokens);
  if (has_decode) {
    if (absl::Status s = PlanPart(seqs, /*decode_part=*/true, options_.decode, layout_.decode,
                                  ViewPart(blob, layout_.decode), &summary.decode);
        !s.ok()) {
      return s;
    }
  }
  if (has_prefill) {
    if (absl::Status s = PlanPart(seqs, /*decode_part=*/false, options_.prefill,
                                  layout_.prefill, ViewPart(blob, layout_.prefill),
                                  &summary.prefill);
        !s.ok()) {
      return s;
    }
  }
  return summary;
}

absl::Status SplitKvPlanner::PlanPart(absl::Span<const SeqLens> seqs, bool decode_part,
                                      const PlanPartOptions& part_options,
                                      const PlanPartLayout& part, PlanPartView view,
                                      PlanPartSummary* summary) const {
  const char* name = decode_part ? "decode" : "prefill";
  const int group = layout_.group_size;
  const int tile_rows = part.tile_rows;
  const bool has_decode = layout_.decode.enabled;
  const int n = static_cast<int>(seqs.size());
  auto routed = [&](int32_t q_len) {
    return q_len > 0 && GoesToDecode(has_decode, q_len) == decode_part;
  };

  // Pass 1: count the tiles, so they can be parked at the end of the work-item array.
  int64_t num_tiles = 0;
  int num_seqs = 0;
  for (int i = 0; i < n; ++i) {
    if (!routed(seqs[i].q_len)) continue;
    ++num_seqs;
    num_tiles += CeilDiv(static_cast<int64_t>(seqs[i].q_len) * group, tile_rows);
  }
  if (num_tiles > part.max_tiles) {
    // Unreachable for a step within the key: the bound is proven in the header comment.
    return absl::ResourceExhaustedError(absl::StrCat(
        "Plan needs ", num_tiles, " query tiles but buffer '", name, " work items' holds ",
        part.max_tiles, " tiles; plan it under a larger key"));
  }
  const int t = static_cast<int>(num_tiles);
  const int capacity = part.work_capacity;
  AttentionWorkItem* items = view.work_items;
  AttentionWorkItem* tiles = items + (capacity - t);

  // Pass 2: the tiles, in sequence order, parked in items[capacity - t, capacity). Emitting
  // tile k later writes items[p, p + chunks) with p + chunks <= capacity - t + k + 1 (total
  // chunks never exceed the capacity), so it never overwrites a tile it has not read yet.
  int32_t max_kv = 0;
  int k = 0;
  for (int i = 0; i < n; ++i) {
    const SeqLens& s = seqs[i];
    if (!routed(s.q_len)) continue;
    // Within int32 (Create bounds max_tokens · G); the sums below are taken in 64 bits.
    const int64_t rows = static_cast<int64_t>(s.q_len) * group;
    for (int64_t row_begin = 0; row_begin < rows; row_begin += tile_rows) {
      const int64_t row_end = std::min(row_begin + tile_rows, rows);
      const int64_t last_token = (row_end - 1) / group;
      const int32_t kv_end =
          static_cast<int32_t>(std::max<int64_t>(0, int64_t{s.kv_len} - s.q_len + last_token + 1));
      tiles[k++] = AttentionWorkItem{i, static_cast<int32_t>(row_begin),
                                     static_cast<int32_t>(row_end), 0, kv_end, -1};
      max_kv = std::max(max_kv, kv_end);
    }
  }

  // Prefill tiles are causal, so their KV lengths differ widely (one long prompt: from one
  // tile's worth to the whole context). CTAs start in blockIdx order, so emitting the longest
  // tiles first lets the short ones fill the tail of the grid instead of a long one starting
  // last (longest-processing-time first). std::sort works in place: Plan() allocates nothing.
  // Decode tiles all see their sequence's whole KV and keep sequence order.
  if (!decode_part) {
    std::sort(tiles, tiles + t, [](const AttentionWorkItem& a, const AttentionWorkItem& b) {
      if (a.kv_end != b.kv_end) return a.kv_end > b.kv_end;
      if (a.seq != b.seq) return a.seq < b.seq;
      return a.row_begin < b.row_begin;
    });
  }

  // Chunk size: by default one chunk per tile. With slots to spare, the smallest multiple of
  // the granularity (and at least min_kv_chunk) whose split tiles fit the slots.
  const int64_t gran = part_options.kv_granularity;
  const int slots = StepSlots(options_, part_options, part.slot_capacity, num_seqs);
  int64_t chunk = std::max<int64_t>(CeilDiv(max_kv, gran), 1) * gran;
  if (slots >= 2 && max_kv > part_options.min_kv_chunk) {
    auto fits = [&](int64_t c) {
      int64_t used = 0;
      for (int j = 0; j < t; ++j) {
        const int32_t len = tiles[j].kv_end;
        if (len > c) {
          used += CeilDiv(len, c);
          if (used > slots) return false;
        }
      }
      return true;
    };
    // The longest tile alone needs ceil(max_kv / c) <= slots when it splits.
    int64_t lo = CeilDiv(std::max<int64_t>(part_options.min_kv_chunk, CeilDiv(max_kv, slots)),
                         gran);
    int64_t hi = chunk / gran;  // fits: nothing splits
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (fits(mid * gran)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    chunk = std::min(chunk, hi * gran);
  }

  // Pass 3: emit items and merges in tile order (the sorted order for prefill), then padding.
  int p = 0;
  int merges = 0;
  int32_t slot = 0;
  for (int j = 0; j < t; ++j) {
    const AttentionWorkItem tile = tiles[j];
    const int32_t len = tile.kv_end;
    if (len <= chunk) {
      items[p++] = AttentionWorkItem{tile.seq, tile.row_begin, tile.row_end, 0, len, -1};
      continue;
    }
    const int32_t c = static_cast<int32_t>(chunk);
    const int32_t num_chunks = static_cast<int32_t>(CeilDiv(len, c));
    if (slot + num_chunks > slots || merges >= part.merge_capacity) {
      // Unreachable: the chunk size was chosen so the split tiles fit.
      return absl::ResourceExhaustedError(absl::StrCat(
          "Plan needs more than ", slots, " partial slots (buffer '", name,
          " partial_o') or ", part.merge_capacity, " merges (buffer '", name,
          " merge items')"));
    }
    view.merge_items[merges++] =
        AttentionMergeItem{tile.seq, tile.row_begin, tile.row_end, slot, num_chunks};
    // In 64 bits: the last chunk's c0 + c may pass int32 when len is near its limit.
    for (int64_t c0 = 0; c0 < len; c0 += c) {
      items[p++] = AttentionWorkItem{tile.seq,
                                     tile.row_begin,
                                     tile.row_end,
                                     static_cast<int32_t>(c0),
                                     static_cast<int32_t>(std::min<int64_t>(c0 + c, len)),
                                     slot++};
    }
  }
  for (int j = p; j < capacity; ++j) items[j] = kPaddingWorkItem;
  for (int j = merges; j < part.merge_capacity; ++j) view.merge_items[j] = kPaddingMergeItem;
  *view.header = AttentionPlanHeader{p, merges, static_cast<int32_t>(chunk), t};

  summary->num_seqs = num_seqs;
  summary->num_tiles = t;
  summary->num_work_items = p;
  summary->num_merge_items = merges;
  summary->kv_chunk_size = static_cast<int>(chunk);
  return absl::OkStatus();
}

}  // namespace kiln
