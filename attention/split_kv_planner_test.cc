#include "attention/split_kv_planner.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "attention/attention_params.h"
#include "attention/internal/sweep_values.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using attention_internal::Chance;
using attention_internal::Draw;
using attention_internal::Uniform;
using attention_internal::kInt32Max;
using attention_internal::kInt32Min;

constexpr unsigned char kGuardByte = 0xAB;
constexpr size_t kGuardBytes = 256;

// A 16-byte aligned plan blob with guard bytes after it, to prove Plan() stays inside.
class Blob {
 public:
  explicit Blob(size_t bytes) : bytes_(bytes), storage_((bytes + kGuardBytes) / 16 + 2) {
    std::memset(data(), 0x5C, bytes_);  // poison: every field Plan() must write is rewritten
    std::memset(static_cast<char*>(data()) + bytes_, kGuardByte, kGuardBytes);
  }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  bool GuardIntact() const {
    const unsigned char* g = static_cast<const unsigned char*>(data()) + bytes_;
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (g[i] != kGuardByte) return false;
    }
    return true;
  }

 private:
  struct alignas(16) Chunk {
    unsigned char b[16];
  };
  size_t bytes_;
  std::vector<Chunk> storage_;
};

bool SamePart(const PlanPartLayout& a, const PlanPartLayout& b) {
  return a.enabled == b.enabled && a.tile_rows == b.tile_rows && a.max_tiles == b.max_tiles &&
         a.max_seqs == b.max_seqs && a.max_tokens == b.max_tokens &&
         a.work_capacity == b.work_capacity && a.merge_capacity == b.merge_capacity &&
         a.slot_capacity == b.slot_capacity && a.header_offset == b.header_offset &&
         a.work_items_offset == b.work_items_offset &&
         a.merge_items_offset == b.merge_items_offset && a.partial_o_bytes == b.partial_o_bytes &&
         a.partial_lse_bytes == b.partial_lse_bytes &&
         a.merge_counter_bytes == b.merge_counter_bytes;
}

bool SameLayout(const PlanLayout& a, const PlanLayout& b) {
  return a.max_seqs == b.max_seqs && a.group_size == b.group_size &&
         a.seq_q_start_offset == b.seq_q_start_offset &&
         a.seq_kv_len_offset == b.seq_kv_len_offset && a.plan_bytes == b.plan_bytes &&
         SamePart(a.decode, b.decode) && SamePart(a.prefill, b.prefill);
}

bool IsPadding(const AttentionWorkItem& w) {
  return w.seq == -1 && w.row_begin == 0 && w.row_end == 0 && w.kv_begin == 0 &&
         w.kv_end == 0 && w.partial_slot == -1;
}

bool IsPadding(const AttentionMergeItem& m) {
  return m.seq == -1 && m.row_begin == 0 && m.row_end == 0 && m.first_slot == 0 &&
         m.num_slots == 0;
}

// Checks every property of one part of a plan; returns "" or the first violation.
std::string CheckPart(const SplitKvPlannerOptions& options, const PlanLayout& layout,
                      bool decode_part, absl::Span<const SeqLens> seqs, const void* blob,
                      const PlanPartSummary& summary, bool count_cells) {
  const PlanPartLayout& part = decode_part ? layout.decode : layout.prefill;
  const PlanPartOptions& part_options = decode_part ? options.decode : options.prefill;
  const int g = layout.group_size;
  const int t_rows = part.tile_rows;
  PlanPartView view = ViewPart(const_cast<void*>(blob), part);
  const AttentionPlanHeader h = *view.header;
  const std::string where = decode_part ? "decode: " : "prefill: ";
  if (h.num_work_items < 0 || h.num_work_items > part.work_capacity) {
    return where + "work item count " + std::to_string(h.num_work_items) + " out of capacity";
  }
  if (h.num_merge_items < 0 || h.num_merge_items > part.merge_capacity) {
    return where + "merge count out of capacity";
  }
  if (h.num_tiles > part.max_tiles) return where + "tiles exceed the closed-form bound";
  if (h.num_tiles != summary.num_tiles || h.num_work_items != summary.num_work_items ||
      h.num_merge_items != summary.num_merge_items || h.kv_chunk_size != summary.kv_chunk_size) {
    return where + "header and summary disagree";
  }
  if (h.kv_chunk_size <= 0 || h.kv_chunk_size % part_options.kv_granularity != 0) {
    return where + "chunk size " + std::to_string(h.kv_chunk_size) + " not a granule multiple";
  }
  for (int i = h.num_work_items; i < part.work_capacity; ++i) {
    if (!IsPadding(view.work_items[i])) return where + "work item past the count is not padding";
  }
  for (int i = h.num_merge_items; i < part.merge_capacity; ++i) {
    if (!IsPadding(view.merge_items[i])) return where + "merge past the count is not padding";
  }
  // Group the valid items by tile.
  std::map<std::pair<int, int>, std::vector<AttentionWorkItem>> tiles;
  std::set<int> slots;
  for (int i = 0; i < h.num_work_items; ++i) {
    const AttentionWorkItem& w = view.work_items[i];
    if (w.seq < 0 || w.seq >= static_cast<int>(seqs.size())) return where + "bad seq index";
    // In 64 bits: a corrupt item must fail the check, not overflow it.
    if (int64_t{w.row_end} - w.row_begin > t_rows || w.row_end <= w.row_begin) {
      return where + "tile rows out of range";
    }
    if (w.partial_slot >= 0) {
      if (w.partial_slot >= part.slot_capacity) return where + "slot beyond capacity";
      if (!slots.insert(w.partial_slot).second) return where + "slot used twice";
    }
    tiles[{w.seq, w.row_begin}].push_back(w);
  }
  std::map<std::pair<int, int>, AttentionMergeItem> merges;
  for (int i = 0; i < h.num_merge_items; ++i) {
    const AttentionMergeItem& m = view.merge_items[i];
    if (!merges.insert({{m.seq, m.row_begin}, m}).second) return where + "tile merged twice";
  }
  // Every routed sequence's rows are cut into consecutive tiles, each covered exactly once.
  size_t expected_tiles = 0;
  int routed_seqs = 0;
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    const SeqLens& sl = seqs[s];
    const bool to_decode = layout.decode.enabled && sl.q_len == 1;
    if (sl.q_len == 0 || to_decode != decode_part) continue;
    ++routed_seqs;
    // In 64 bits: q_len · G fits int32 (Create bounds it), rb + tile_rows need not.
    const int64_t rows = int64_t{sl.q_len} * g;
    for (int64_t rb = 0; rb < rows; rb += t_rows) {
      ++expected_tiles;
      const int64_t re = std::min<int64_t>(rb + t_rows, rows);
      auto it = tiles.find({s, static_cast<int>(rb)});
      if (it == tiles.end()) return where + "missing tile of seq " + std::to_string(s);
      std::vector<AttentionWorkItem> items = it->second;
      std::sort(items.begin(), items.end(),
                [](const AttentionWorkItem& a, const AttentionWorkItem& b) {
                  return a.kv_begin < b.kv_begin;
                });
      const int64_t kv_end =
          std::max<int64_t>(0, int64_t{sl.kv_len} - sl.q_len + (re - 1) / g + 1);
      int64_t at = 0;
      for (size_t k = 0; k < items.size(); ++k) {
        const AttentionWorkItem& w = items[k];
        if (w.row_end != re) return where + "tile row_end mismatch";
        if (w.kv_begin != at) return where + "gap or overlap in a tile's KV chunks";
        if (w.kv_end < w.kv_begin || (w.kv_end == w.kv_begin && kv_end != 0)) {
          return where + "empty chunk in a non-empty tile";
        }
        if (k + 1 < items.size() && int64_t{w.kv_end} - w.kv_begin != h.kv_chunk_size) {
          return where + "inner chunk differs from the header's chunk size";
        }
        if (int64_t{w.kv_end} - w.kv_begin > h.kv_chunk_size) {
          return where + "chunk above chunk size";
        }
        at = w.kv_end;
      }
      if (at != kv_end) return where + "tile KV coverage ends at " + std::to_string(at);
      auto m = merges.find({s, static_cast<int>(rb)});
      if (items.size() == 1) {
        if (items[0].partial_slot != -1) return where + "single chunk writes a partial";
        if (m != merges.end()) return where + "single-chunk tile has a merge";
      } else {
        if (m == merges.end()) return where + "split tile has no merge";
        if (m->second.row_end != re || m->second.num_slots != static_cast<int>(items.size())) {
          return where + "merge does not match its tile";
        }
        std::set<int> tile_slots;
        for (const AttentionWorkItem& w : items) tile_slots.insert(w.partial_slot);
        for (int k = 0; k < m->second.num_slots; ++k) {
          if (!tile_slots.count(static_cast<int>(int64_t{m->second.first_slot} + k))) {
            return where + "merge slots do not match the tile's chunks";
          }
        }
      }
    }
  }
  if (tiles.size() != expected_tiles) return where + "items hold tiles no sequence owns";
  if (merges.size() != static_cast<size_t>(h.num_merge_items)) return where + "merge count";
  if (static_cast<int>(expected_tiles) != h.num_tiles) return where + "tile count mismatch";
  if (routed_seqs != summary.num_seqs) return where + "routed sequence count mismatch";
  if (count_cells) {
    // Independent check: each (row, KV position) of each row's causal range is computed by
    // exactly one work item.
    for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
      const SeqLens& sl = seqs[s];
      const bool to_decode = layout.decode.enabled && sl.q_len == 1;
      if (sl.q_len == 0 || to_decode != decode_part) continue;
      const int rows = sl.q_len * g;
      std::vector<int> cells(static_cast<size_t>(rows) * (sl.kv_len + 1), 0);
      for (int i = 0; i < h.num_work_items; ++i) {
        const AttentionWorkItem& w = view.work_items[i];
        if (w.seq != s) continue;
        for (int r = w.row_begin; r < w.row_end; ++r) {
          const int limit = sl.kv_len - sl.q_len + r / g + 1;
          for (int kv = w.kv_begin; kv < std::min(w.kv_end, limit); ++kv) {
            ++cells[static_cast<size_t>(r) * (sl.kv_len + 1) + kv];
          }
        }
      }
      for (int r = 0; r < rows; ++r) {
        const int limit = std::max(0, sl.kv_len - sl.q_len + r / g + 1);
        for (int kv = 0; kv <= sl.kv_len; ++kv) {
          const int want = kv < limit ? 1 : 0;
          if (cells[static_cast<size_t>(r) * (sl.kv_len + 1) + kv] != want) {
            return where + "cell (row " + std::to_string(r) + ", kv " + std::to_string(kv) +
                   ") of seq " + std::to_string(s) + " covered wrongly";
          }
        }
      }
    }
  }
  return "";
}

std::string CheckPlan(const SplitKvPlanner& planner, absl::Span<const SeqLens> seqs,
                      const Blob& blob, const PlanSummary& summary, bool count_cells) {
  const PlanLayout& layout = planner.layout();
  const SplitKvPlannerOptions& options = planner.options();
  if (!blob.GuardIntact()) return "plan wrote past plan_bytes";
  const char* base = static_cast<const char*>(blob.data());
  const int32_t* q_start = reinterpret_cast<const int32_t*>(base + layout.seq_q_start_offset);
  const int32_t* kv_len = reinterpret_cast<const int32_t*>(base + layout.seq_kv_len_offset);
  int32_t at = 0;
  for (int i = 0; i < layout.max_seqs; ++i) {
    if (q_start[i] != at) return "seq_q_start[" + std::to_string(i) + "] wrong";
    const bool real = i < static_cast<int>(seqs.size());
    if (kv_len[i] != (real ? seqs[i].kv_len : 0)) return "seq_kv_len wrong";
    if (real) at += seqs[i].q_len;
  }
  if (q_start[layout.max_seqs] != at || summary.num_tokens != at) return "token total wrong";
  for (bool decode_part : {true, false}) {
    const PlanPartLayout& part = decode_part ? layout.decode : layout.prefill;
    if (!part.enabled) continue;
    std::string error =
        CheckPart(options, layout, decode_part, seqs, blob.data(),
                  decode_part ? summary.decode : summary.prefill, count_cells);
    if (!error.empty()) return error;
  }
  return "";
}

SplitKvPlannerOptions SmallOptions(int group, int decode_rows, int prefill_rows) {
  SplitKvPlannerOptions o;
  o.num_q_heads = group;
  o.num_kv_heads = 1;
  o.head_dim = 64;
  o.sm_count = 4;  // 8 partial slots: splits happen often in small cases
  o.key = {4, 64, 512};
  for (PlanPartOptions* p : {&o.decode, &o.prefill}) {
    p->kv_granularity = 16;
    p->min_kv_chunk = 16;
    p->ctas_per_sm = 2;
  }
  o.decode.tile_rows = decode_rows;
  o.prefill.tile_rows = prefill_rows;
  return o;
}

TEST(MaxQueryTilesTest, MatchesTheDesignExample) {
  // [13, 13] with G = 5, T = 64: 65 rows each, 2 tiles each.
  EXPECT_EQ(MaxQueryTiles(2, 26, 5, 64), 4);
  EXPECT_EQ(MaxQueryTiles(1, 26, 5, 64), 3);
  EXPECT_EQ(MaxQueryTiles(4, 3, 8, 16), 3);  // capped by one token per tile
  EXPECT_EQ(MaxQueryTiles(0, 10, 4, 64), 0);
}

TEST(SplitKvPlannerTest, PlansTheDesignExampleAndTheSampleThatMissesIt) {
  SplitKvPlannerOptions o = SmallOptions(5, 0, 64);
  o.key = {2, 26, 100};
  auto planner = SplitKvPlanner::Create(o);
  ASSERT_TRUE(planner.ok()) << planner.status();
  EXPECT_EQ(planner->layout().prefill.max_tiles, 4);
  Blob blob(planner->layout().plan_bytes);
  std::vector<SeqLens> even = {{13, 40}, {13, 13}};
  auto s = planner->Plan(even, blob.data());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->prefill.num_tiles, 4);
  EXPECT_EQ(CheckPlan(*planner, even, blob, *s, true), "");
  std::vector<SeqLens> sample = {{1, 1}, {25, 30}};
  s = planner->Plan(sample, blob.data());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->prefill.num_tiles, 3);
  EXPECT_EQ(CheckPlan(*planner, sample, blob, *s, true), "");
}

// Exact maximum of sum ceil(q_i * g / t) over at most b sequences with at most n tokens.
std::vector<std::vector<int>> ExactMaxTiles(int max_b, int max_n, int g, int t) {
  std::vector<std::vector<int>> best(max_b + 1, std::vector<int>(max_n + 1, 0));
  for (int b = 1; b <= max_b; ++b) {
    for (int n = 0; n <= max_n; ++n) {
      int v = best[b - 1][n];
      for (int q = 1; q <= n; ++q) v = std::max(v, best[b - 1][n - q] + (q * g + t - 1) / t);
      best[b][n] = v;
    }
  }
  return best;
}

// Every multiset of up to 4 query lengths with at most 64 tokens, for G in {1, 4, 5, 8} and
// T in {16, 64}: with a prefill-only planner (where the closed form is the part's bound) and a
// decode + prefill planner, with KV lengths that include empty, short and block-straddling ones.
class ExhaustiveSmallTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ExhaustiveSmallTest, CoversExactlyWithinTheBoundAndKeyOnlyLayout) {
  const int g = std::get<0>(GetParam());
  const int t = std::get<1>(GetParam());
  constexpr int kMaxSeqs = 4;
  constexpr int kMaxTokens = 64;
  auto single = SplitKvPlanner::Create(SmallOptions(g, 0, t));
  auto mixed = SplitKvPlanner::Create(SmallOptions(g, g, t));
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  const PlanLayout single_layout = single->layout();
  const PlanLayout mixed_layout = mixed->layout();
  Blob single_blob(single_layout.plan_bytes);
  Blob mixed_blob(mixed_layout.plan_bytes);

  // best[count][tokens]: most tiles the planner made for a distribution of that shape.
  std::vector<std::vector<int>> best(kMaxSeqs + 1, std::vector<int>(kMaxTokens + 1, 0));
  int distributions = 0;
  int splits_seen = 0;
  int q[4];
  for (q[0] = 0; q[0] <= kMaxTokens; ++q[0]) {
    for (q[1] = q[0]; q[0] + q[1] <= kMaxTokens; ++q[1]) {
      for (q[2] = q[1]; q[0] + q[1] + q[2] <= kMaxTokens; ++q[2]) {
        for (q[3] = q[2]; q[0] + q[1] + q[2] + q[3] <= kMaxTokens; ++q[3]) {
          ++distributions;
          std::vector<SeqLens> seqs(kMaxSeqs);
          int count = 0;
          int tokens = 0;
          for (int i = 0; i < kMaxSeqs; ++i) {
            // Contexts 0..199 from a fixed hash, sometimes shorter than q_len (empty rows).
            const int h = (distributions * 131 + i * 71 + q[i] * 17) % 211;
            const int kv = h < 11 ? std::max(0, q[i] - h) : q[i] + (h - 11);
            seqs[i] = {q[i], kv};
            count += q[i] > 0;
            tokens += q[i];
          }
          const bool cells = distributions % 41 == 0;
          for (int which = 0; which < 2; ++which) {
            const SplitKvPlanner& planner = which == 0 ? *single : *mixed;
            Blob& blob = which == 0 ? single_blob : mixed_blob;
            auto summary = planner.Plan(seqs, blob.data());
            ASSERT_TRUE(summary.ok()) << summary.status();
            ASSERT_EQ(CheckPlan(planner, seqs, blob, *summary, cells), "")
                << "q = " << q[0] << "," << q[1] << "," << q[2] << "," << q[3];
            ASSERT_TRUE(SameLayout(planner.layout(), which == 0 ? single_layout : mixed_layout));
            splits_seen += summary->decode.num_merge_items + summary->prefill.num_merge_items;
            if (which == 0) {
              // Tiles never exceed the closed form of the step's own shape (nor, by
              // monotonicity, of any key that admits it).
              ASSERT_LE(summary->prefill.num_tiles, MaxQueryTiles(count, tokens, g, t));
              best[count][tokens] = std::max(best[count][tokens], summary->prefill.num_tiles);
            } else {
              const int decode_seqs = summary->decode.num_seqs;
              ASSERT_LE(summary->decode.num_tiles, MaxQueryTiles(decode_seqs, decode_seqs, g, g));
              ASSERT_LE(summary->prefill.num_tiles,
                        MaxQueryTiles(count - decode_seqs, tokens - decode_seqs, g, t));
            }
          }
        }
      }
    }
  }
  EXPECT_GT(splits_seen, 0) << "the small cases never exercised a split";
  // Per key (B, N): the planner's maximum over all distributions the key admits equals the
  // exact maximum, never exceeds the closed form, and reaches it whenever B = 1. The closed form
  // overshoots by at most B - 1 tiles (it counts one partial tile per sequence; the exact
  // maximum is at least ceil(N*G/T), one sequence holding everything).
  const auto exact = ExactMaxTiles(kMaxSeqs, kMaxTokens, g, t);
  int keys = 0;
  int reached = 0;
  for (int b = 1; b <= kMaxSeqs; ++b) {
    for (int n = 1; n <= kMaxTokens; ++n) {
      int planned = 0;
      for (int c = 0; c <= b; ++c) {
        for (int k = 0; k <= n; ++k) planned = std::max(planned, best[c][k]);
      }
      const int bound = MaxQueryTiles(b, n, g, t);
      ++keys;
      reached += planned == bound;
      ASSERT_EQ(planned, exact[b][n]) << "B=" << b << " N=" << n;
      ASSERT_LE(planned, bound) << "B=" << b << " N=" << n;
      ASSERT_LE(bound - planned, b - 1) << "B=" << b << " N=" << n;
      if (b == 1) {
        ASSERT_EQ(planned, bound) << "N=" << n;
      }
    }
  }
  RecordProperty("keys", keys);
  RecordProperty("keys_reaching_bound", reached);
  EXPECT_GT(reached, 0);
}

INSTANTIATE_TEST_SUITE_P(GroupsAndTiles, ExhaustiveSmallTest,
                         ::testing::Combine(::testing::Values(1, 4, 5, 8),
                                            ::testing::Values(16, 64)));

SplitKvPlannerOptions LargeOptions(int max_tokens, int prefill_rows) {
  SplitKvPlannerOptions o;
  o.num_q_heads = 32;
  o.num_kv_heads = 8;
  o.head_dim = 128;
  o.sm_count = 132;
  o.key = {256, max_tokens, 32768};
  o.decode.tile_rows = 4;
  o.prefill.tile_rows = prefill_rows;
  o.prefill.kv_granularity = prefill_rows;
  o.prefill.ctas_per_sm = 1;
  return o;
}

TEST(SplitKvPlannerTest, RandomLargeDecodeBatches) {
  auto planner = SplitKvPlanner::Create(LargeOptions(256, 0));
  ASSERT_TRUE(planner.ok()) << planner.status();
  const PlanLayout layout = planner->layout();
  EXPECT_EQ(layout.decode.max_tiles, 256);
  EXPECT_EQ(layout.decode.slot_capacity, 33);  // ceil(132 * 2 / 8)
  Blob blob(layout.plan_bytes);
  absl::BitGen gen;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = trial < 50 ? 256 : absl::Uniform<int>(absl::IntervalClosed, gen, 1, 256);
    std::vector<SeqLens> seqs(n);
    const int style = trial % 4;
    for (SeqLens& s : seqs) {
      s.q_len = absl::Bernoulli(gen, 0.05) ? 0 : 1;
      switch (style) {
        case 0: s.kv_len = absl::Uniform<int>(absl::IntervalClosed, gen, 0, 32768); break;
        case 1: s.kv_len = absl::Uniform<int>(absl::IntervalClosed, gen, 1, 300); break;
        case 2: s.kv_len = absl::Bernoulli(gen, 0.02) ? 32768 : 17; break;
        default: {
          const int edges[] = {0, 1, 15, 16, 17, 63, 64, 65, 32767, 32768};
          s.kv_len = edges[absl::Uniform<int>(gen, 0, 10)];
        }
      }
      if (s.q_len == 1 && s.kv_len == 0) s.kv_len = 1;
    }
    auto summary = planner->Plan(seqs, blob.data());
    ASSERT_TRUE(summary.ok()) << summary.status();
    ASSERT_EQ(CheckPlan(*planner, seqs, blob, *summary, false), "") << "trial " << trial;
    ASSERT_TRUE(SameLayout(planner->layout(), layout));
  }
}

TEST(SplitKvPlannerTest, RandomLargeMixedBatches) {
  for (int prefill_rows : {64, 128}) {
    auto planner = SplitKvPlanner::Create(LargeOptions(4096, prefill_rows));
    ASSERT_TRUE(planner.ok()) << planner.status();
    const PlanLayout layout = planner->layout();
    EXPECT_EQ(layout.prefill.max_tiles, MaxQueryTiles(256, 4096, 4, prefill_rows));
    Blob blob(layout.plan_bytes);
    absl::BitGen gen;
    for (int trial = 0; trial < 200; ++trial) {
      const int n = absl::Uniform<int>(absl::IntervalClosed, gen, 1, 256);
      std::vector<SeqLens> seqs(n);
      int budget = 4096;
      for (SeqLens& s : seqs) {
        const int want = absl::Bernoulli(gen, 0.7) ? 1 : absl::Uniform<int>(gen, 0, 400);
        s.q_len = std::min(want, budget);
        budget -= s.q_len;
        s.kv_len = std::min(32768, s.q_len + absl::Uniform<int>(gen, 0, 20000));
      }
      auto summary = planner->Plan(seqs, blob.data());
      ASSERT_TRUE(summary.ok()) << summary.status();
      ASSERT_EQ(CheckPlan(*planner, seqs, blob, *summary, false), "") << "trial " << trial;
      ASSERT_TRUE(SameLayout(planner->layout(), layout));
    }
  }
}

TEST(SplitKvPlannerTest, SplitsFewLongSequencesToFillTheGpu) {
  auto planner = SplitKvPlanner::Create(LargeOptions(256, 0));
  ASSERT_TRUE(planner.ok());
  Blob blob(planner->layout().plan_bytes);
  struct Case {
    int seqs, kv, items, chunk;
  };
  // 33 slots: 1 × 8192 splits into 32 chunks of 256; 16 × 4096 into 2 each; 64 × 4096 has
  // enough tiles and stays whole.
  for (const Case& c : {Case{1, 8192, 32, 256}, Case{16, 4096, 32, 2048},
                        Case{64, 4096, 64, 4096}, Case{256, 1024, 256, 1024}}) {
    std::vector<SeqLens> seqs(c.seqs, SeqLens{1, c.kv});
    auto s = planner->Plan(seqs, blob.data());
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->decode.num_work_items, c.items) << c.seqs << " x " << c.kv;
    EXPECT_EQ(s->decode.kv_chunk_size, c.chunk) << c.seqs << " x " << c.kv;
    EXPECT_EQ(CheckPlan(*planner, seqs, blob, *s, false), "");
  }
  // One long sequence among many short ones is split; the short ones are not.
  std::vector<SeqLens> skewed(64, SeqLens{1, 100});
  skewed[7] = {1, 32768};
  auto s = planner->Plan(skewed, blob.data());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->decode.num_merge_items, 1);
  EXPECT_EQ(s->decode.kv_chunk_size, 1024);
  EXPECT_EQ(s->decode.num_work_items, 63 + 32);
  EXPECT_EQ(CheckPlan(*planner, skewed, blob, *s, false), "");
}

TEST(SplitKvPlannerTest, AimBySeqsSplitsFewerWaysWithinTheKeysGrid) {
  // The 1B decode shape under a key of 8 sequences: 66 slots (4 CTAs per SM). Rules: up to 3
  // sequences aim at 2 (33 slots), 4 at 4, 5-7 at 2, and 8 at 6, above the capacity: capped.
  SplitKvPlannerOptions o = LargeOptions(8, 0);
  o.key = {8, 8, 2048};
  o.decode.min_kv_chunk = 64;
  o.decode.ctas_per_sm = 4;
  SplitKvPlannerOptions plain = o;
  o.decode.aim_by_seqs = {{3, 2}, {4, 4}, {7, 2}, {8, 6}};
  auto planner = SplitKvPlanner::Create(o);
  auto reference = SplitKvPlanner::Create(plain);
  ASSERT_TRUE(planner.ok()) << planner.status();
  ASSERT_TRUE(reference.ok()) << reference.status();
  // The rules change no capacity: the grid, workspaces and blob are the key's.
  EXPECT_TRUE(SameLayout(planner->layout(), reference->layout()));
  EXPECT_EQ(planner->layout().decode.slot_capacity, 66);
  Blob blob(planner->layout().plan_bytes);
  Blob reference_blob(reference->layout().plan_bytes);
  struct Case {
    int seqs, chunk, reference_chunk;
  };
  // 1024 tokens each. 3 sequences in 33 slots: chunks of 128 (24 items), not 64 (48 items);
  // 4 in 66: 64 as without rules; 6 in 33: 256, not 128; 8 capped at 66: 128 as without.
  for (const Case& c : {Case{1, 64, 64}, Case{3, 128, 64}, Case{4, 64, 64}, Case{6, 256, 128},
                        Case{7, 256, 128}, Case{8, 128, 128}}) {
    std::vector<SeqLens> seqs(c.seqs, SeqLens{1, 1024});
    auto s = planner->Plan(seqs, blob.data());
    auto r = reference->Plan(seqs, reference_blob.data());
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(s->decode.kv_chunk_size, c.chunk) << c.seqs << " sequences";
    EXPECT_EQ(r->decode.kv_chunk_size, c.reference_chunk) << c.seqs << " sequences";
    EXPECT_EQ(s->decode.num_work_items, c.seqs * 1024 / c.chunk) << c.seqs << " sequences";
    EXPECT_EQ(CheckPlan(*planner, seqs, blob, *s, false), "");
  }
  EXPECT_TRUE(blob.GuardIntact());

  // Rules out of order or out of range are refused by name.
  for (const std::vector<SplitAim>& bad :
       {std::vector<SplitAim>{{4, 2}, {4, 4}}, std::vector<SplitAim>{{4, 2}, {2, 4}},
        std::vector<SplitAim>{{0, 2}}, std::vector<SplitAim>{{4, 0}}}) {
    SplitKvPlannerOptions w = plain;
    w.decode.aim_by_seqs = bad;
    auto p = SplitKvPlanner::Create(w);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("decode.aim_by_seqs["), std::string::npos) << p.status();
    const absl::Status named = CheckSplitAims(bad, "my_aims");
    EXPECT_EQ(named.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(named.message().rfind("my_aims[", 0), 0u) << named;
  }
  EXPECT_TRUE(CheckSplitAims({{2, 2}, {3, 2}, {5, 4}, {7, 2}, {8, 4}}, "my_aims").ok());
  EXPECT_TRUE(CheckSplitAims({}, "my_aims").ok());
}

TEST(SplitKvPlannerTest, RejectsStepsOutsideTheKey) {
  SplitKvPlannerOptions o = SmallOptions(4, 4, 0);
  o.key = {2, 2, 100};
  auto planner = SplitKvPlanner::Create(o);
  ASSERT_TRUE(planner.ok());
  Blob blob(planner->layout().plan_bytes);
  std::vector<SeqLens> too_many = {{1, 5}, {1, 5}, {1, 5}};
  EXPECT_EQ(planner->Plan(too_many, blob.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SeqLens> too_long = {{1, 101}};
  auto status = planner->Plan(too_long, blob.data()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("101"), std::string::npos) << status;
  std::vector<SeqLens> prefill = {{2, 5}};
  status = planner->Plan(prefill, blob.data()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("prefill"), std::string::npos) << status;
  std::vector<SeqLens> negative = {{-1, 5}};
  EXPECT_FALSE(planner->Plan(negative, blob.data()).ok());
  SplitKvPlannerOptions tokens = SmallOptions(4, 0, 16);
  tokens.key = {4, 10, 100};
  auto p2 = SplitKvPlanner::Create(tokens);
  ASSERT_TRUE(p2.ok());
  Blob blob2(p2->layout().plan_bytes);
  std::vector<SeqLens> over = {{6, 6}, {5, 5}};
  status = p2->Plan(over, blob2.data()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("max_tokens"), std::string::npos) << status;
  EXPECT_TRUE(blob.GuardIntact());
  EXPECT_TRUE(blob2.GuardIntact());
}

TEST(SplitKvPlannerTest, RejectsBadOptions) {
  SplitKvPlannerOptions o = SmallOptions(4, 2, 0);  // tile rows below G
  auto p = SplitKvPlanner::Create(o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("decode.tile_rows 2"), std::string::npos) << p.status();
  o = SmallOptions(4, 4, 0);
  o.num_kv_heads = 3;
  EXPECT_EQ(SplitKvPlanner::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallOptions(4, 0, 0);
  EXPECT_EQ(SplitKvPlanner::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallOptions(4, 4, 0);
  o.key.max_kv_len = 0;
  EXPECT_EQ(SplitKvPlanner::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// A KV length near int32's limit splits into chunks whose last end is computed without
// overflow (c0 + chunk passes int32 there), and the chunks still cover it exactly.
TEST(SplitKvPlannerTest, PlansKvLengthsNearTheInt32Limit) {
  constexpr int32_t kLongest = 2147483584;  // int32's largest multiple of the 64-token step
  SplitKvPlannerOptions o = LargeOptions(1, 0);
  o.key = {1, 1, kLongest};
  auto planner = SplitKvPlanner::Create(o);
  ASSERT_TRUE(planner.ok()) << planner.status();
  Blob blob(planner->layout().plan_bytes);
  for (int32_t kv_len : {kLongest, kLongest - 1000, int32_t{1} << 30}) {
    const std::vector<SeqLens> seqs = {{1, kv_len}};
    auto s = planner->Plan(seqs, blob.data());
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_GT(s->decode.num_merge_items, 0) << kv_len;  // it splits
    EXPECT_EQ(CheckPlan(*planner, seqs, blob, *s, /*count_cells=*/false), "") << kv_len;
  }
  // One more granule and the chunk size itself would not fit the header's int32.
  o.key.max_kv_len = kLongest + 1;
  auto too_long = SplitKvPlanner::Create(o);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("max_kv_len 2147483585"), std::string::npos)
      << too_long.status();
}

// Counts that the kernels read as int32 (packed query rows, grids) are refused when a key or
// the options would overflow them, instead of wrapping into a wrong layout.
TEST(SplitKvPlannerTest, RejectsKeysAndOptionsThatOverflowInt32) {
  SplitKvPlannerOptions o = SmallOptions(64, 0, 64);
  o.key = {1, 1 << 26, 4096};  // 2^26 tokens x 64 heads per KV head = 2^32 packed rows
  auto rows = SplitKvPlanner::Create(o);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rows.status().message().find("max_tokens 67108864 x 64"), std::string::npos)
      << rows.status();

  o = LargeOptions(64, 0);
  o.sm_count = 1 << 30;
  o.decode.ctas_per_sm = 64;  // 2^36 CTA slots over 8 KV heads: 2^33 partial slots
  auto slots = SplitKvPlanner::Create(o);
  EXPECT_EQ(slots.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(slots.status().message().find("above the int32 grid limit"), std::string::npos)
      << slots.status();
}

TEST(SplitKvPlannerTest, WorkspaceSizesFollowTheKeyAndNameTheirBuffers) {
  auto planner = SplitKvPlanner::Create(LargeOptions(4096, 128));
  ASSERT_TRUE(planner.ok());
  const PlanLayout& l = planner->layout();
  // 33 decode slots × 8 KV heads × 4 rows × 128 dims, and 17 prefill slots of 128 rows.
  EXPECT_EQ(l.decode.partial_o_bytes, size_t{33} * 8 * 4 * 128 * 4);
  EXPECT_EQ(l.decode.partial_lse_bytes, size_t{33} * 8 * 4 * 4);
  EXPECT_EQ(l.prefill.slot_capacity, 17);
  EXPECT_EQ(l.prefill.partial_o_bytes, size_t{17} * 8 * 128 * 128 * 4);
  const std::vector<PlanBufferSize> buffers = l.Buffers();
  ASSERT_EQ(buffers.size(), 7u);
  EXPECT_EQ(std::string(buffers[0].name), "plan");
  EXPECT_EQ(buffers[0].bytes, l.plan_bytes);
  EXPECT_EQ(std::string(buffers[3].name), "decode merge counters");
  EXPECT_EQ(buffers[3].bytes, size_t{33} * 8 * 4);
  EXPECT_EQ(std::string(buffers[4].name), "prefill partial_o");
  // Without splitting, no workspace and no merge launch.
  SplitKvPlannerOptions o = LargeOptions(256, 0);
  o.decode.allow_split = false;
  auto unsplit = SplitKvPlanner::Create(o);
  ASSERT_TRUE(unsplit.ok());
  EXPECT_FALSE(unsplit->layout().decode.splits());
  EXPECT_EQ(unsplit->layout().decode.partial_o_bytes, 0u);
  EXPECT_EQ(unsplit->layout().decode.work_capacity, 256);
}


// --- Adversarial sweeps: options, keys and steps as a server or a model config might send
// them. Every refusal is InvalidArgument naming the bad field and value; every acceptance is
// checked against an independent computation of the layout and of the plan. Seeded, so a
// failure reproduces.

// A refusal the test expects: every string of one entry must appear in the message.
using Expected = std::vector<std::vector<std::string>>;

// Returns "" when `status` is an InvalidArgument whose message reads like the style guide's
// and holds every string of at least one entry of `expected`.
std::string CheckRefusal(const absl::Status& status, const Expected& expected) {
  return attention_internal::CheckRefusal(status, absl::StatusCode::kInvalidArgument, expected);
}

int64_t CeilDiv64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The shape of one part, computed here from the header's rules (not the planner's code).
struct ModelPart {
  bool enabled = false;
  int64_t max_seqs = 0, max_tokens = 0, max_tiles = 0, slots = 0, merges = 0, work = 0;
};

// The options' refusals (each as the strings its message must hold) and, when there are none,
// the expected shape of each part.
Expected ModelOptions(const SplitKvPlannerOptions& o, ModelPart* decode, ModelPart* prefill) {
  Expected bad;
  const std::string q = std::to_string(o.num_q_heads), kv = std::to_string(o.num_kv_heads);
  if (o.num_q_heads <= 0) bad.push_back({"num_q_heads " + q});
  if (o.num_kv_heads <= 0) bad.push_back({"num_kv_heads " + kv});
  if (o.num_q_heads > 0 && o.num_kv_heads > 0 && o.num_q_heads % o.num_kv_heads != 0) {
    bad.push_back({"num_q_heads " + q, "num_kv_heads " + kv});
  }
  if (o.head_dim <= 0) bad.push_back({"head_dim " + std::to_string(o.head_dim)});
  if (o.sm_count <= 0) bad.push_back({"sm_count " + std::to_string(o.sm_count)});
  const AttentionPlanKey& key = o.key;
  if (key.max_seqs <= 0) bad.push_back({"max_seqs " + std::to_string(key.max_seqs)});
  if (key.max_tokens <= 0) bad.push_back({"max_tokens " + std::to_string(key.max_tokens)});
  if (key.max_kv_len <= 0) bad.push_back({"max_kv_len " + std::to_string(key.max_kv_len)});
  if (o.decode.tile_rows <= 0 && o.prefill.tile_rows <= 0) {
    bad.push_back({"decode.tile_rows " + std::to_string(o.decode.tile_rows),
                   "prefill.tile_rows " + std::to_string(o.prefill.tile_rows)});
  }
  if (!bad.empty()) return bad;  // the rules below assume the ones above hold

  const int64_t g = o.num_q_heads / o.num_kv_heads;
  const std::pair<const char*, const PlanPartOptions*> parts[] = {{"decode", &o.decode},
                                                                  {"prefill", &o.prefill}};
  for (const auto& [name, part] : parts) {
    if (part->tile_rows == 0) continue;
    const std::string n(name);
    if (part->tile_rows < 0) bad.push_back({n + ".tile_rows " + std::to_string(part->tile_rows)});
    if (part->tile_rows < g) bad.push_back({n + ".tile_rows " + std::to_string(part->tile_rows)});
    if (part->kv_granularity < 1) {
      bad.push_back({n, "kv_granularity " + std::to_string(part->kv_granularity)});
    }
    if (part->min_kv_chunk < 1) {
      bad.push_back({n, "min_kv_chunk " + std::to_string(part->min_kv_chunk)});
    }
    if (part->ctas_per_sm < 1) {
      bad.push_back({n, "ctas_per_sm " + std::to_string(part->ctas_per_sm)});
    }
    if (part->kv_granularity >= 1 &&
        CeilDiv64(key.max_kv_len, part->kv_granularity) * part->kv_granularity > kInt32Max) {
      bad.push_back({"max_kv_len " + std::to_string(key.max_kv_len), n + ".kv_granularity"});
    }
    for (size_t i = 0; i < part->aim_by_seqs.size(); ++i) {
      const SplitAim& aim = part->aim_by_seqs[i];
      if (aim.max_seqs < 1 || aim.ctas_per_sm < 1 ||
          (i > 0 && aim.max_seqs <= part->aim_by_seqs[i - 1].max_seqs)) {
        bad.push_back({n + ".aim_by_seqs[" + std::to_string(i) + "]"});
      }
    }
  }
  if (int64_t{key.max_tokens} * g > kInt32Max) {
    bad.push_back({"max_tokens " + std::to_string(key.max_tokens) + " x " + std::to_string(g)});
  }
  if (!bad.empty()) return bad;

  const bool has_decode = o.decode.tile_rows > 0;
  for (bool is_decode : {true, false}) {
    const PlanPartOptions& part = is_decode ? o.decode : o.prefill;
    ModelPart& m = is_decode ? *decode : *prefill;
    m = ModelPart();
    if (part.tile_rows == 0) continue;
    m.enabled = true;
    // Decode sequences bring one token; prefill ones at least two when a decode part exists.
    m.max_seqs = is_decode ? std::min(key.max_seqs, key.max_tokens)
                           : std::min(key.max_seqs, has_decode ? key.max_tokens / 2
                                                               : key.max_tokens);
    m.max_tokens = is_decode ? m.max_seqs : key.max_tokens;
    // Each sequence wastes less than one tile; each tile holds at least one token (T >= G).
    m.max_tiles = m.max_seqs == 0 ? 0
                                  : std::min(CeilDiv64(m.max_tokens * g, part.tile_rows) +
                                                 m.max_seqs - 1,
                                             m.max_tokens);
    if (part.allow_split && key.max_kv_len > part.min_kv_chunk) {
      m.slots = CeilDiv64(int64_t{o.sm_count} * part.ctas_per_sm, o.num_kv_heads);
    }
    m.merges = std::min(m.max_tiles, m.slots / 2);
    if (m.merges == 0) m.slots = 0;
    m.work = m.max_tiles + m.slots;
    const std::string n = is_decode ? "decode" : "prefill";
    if (m.work > kInt32Max) {
      bad.push_back({n + " part needs " + std::to_string(m.work) + " work items"});
      continue;
    }
    // partial_o: slots × kv heads × tile_rows × head_dim floats must fit a size_t.
    const long double floats = static_cast<long double>(m.slots) * o.num_kv_heads *
                               part.tile_rows * o.head_dim * sizeof(float);
    if (floats > static_cast<long double>(std::numeric_limits<size_t>::max())) {
      bad.push_back({"'" + n + " partial_o'"});
    }
  }
  return bad;
}

// Returns "" when `layout` has the model's capacities and sizes, and every section of the blob
// is 16-byte aligned, inside plan_bytes and apart from every other.
std::string CheckLayout(const SplitKvPlannerOptions& o, const PlanLayout& layout,
                        const ModelPart& decode, const ModelPart& prefill) {
  const int g = o.num_q_heads / o.num_kv_heads;
  if (layout.group_size != g || layout.max_seqs != o.key.max_seqs) return "group or max_seqs";
  struct Section {
    size_t begin, bytes;
    const char* name;
  };
  std::vector<Section> sections = {
      {layout.seq_q_start_offset, sizeof(int32_t) * (size_t{1} + o.key.max_seqs), "q_start"},
      {layout.seq_kv_len_offset, sizeof(int32_t) * static_cast<size_t>(o.key.max_seqs),
       "kv_len"}};
  for (bool is_decode : {true, false}) {
    const PlanPartLayout& part = is_decode ? layout.decode : layout.prefill;
    const ModelPart& m = is_decode ? decode : prefill;
    const PlanPartOptions& po = is_decode ? o.decode : o.prefill;
    const std::string n = is_decode ? "decode " : "prefill ";
    if (part.enabled != m.enabled) return n + "enabled";
    if (!m.enabled) {
      if (part.work_capacity != 0 || part.merge_capacity != 0 || part.partial_o_bytes != 0) {
        return n + "disabled part has capacity";
      }
      continue;
    }
    if (part.tile_rows != po.tile_rows || part.max_seqs != m.max_seqs ||
        part.max_tokens != m.max_tokens || part.max_tiles != m.max_tiles) {
      return n + "tiles: got " + std::to_string(part.max_tiles) + " want " +
             std::to_string(m.max_tiles);
    }
    if (part.slot_capacity != m.slots || part.merge_capacity != m.merges ||
        part.work_capacity != m.work) {
      return n + "capacities";
    }
    if (part.splits() != (m.merges > 0)) return n + "splits()";
    const size_t rows = static_cast<size_t>(m.slots) * o.num_kv_heads * po.tile_rows;
    if (part.partial_o_bytes != rows * o.head_dim * sizeof(float) ||
        part.partial_lse_bytes != rows * sizeof(float) ||
        part.merge_counter_bytes !=
            static_cast<size_t>(m.slots) * o.num_kv_heads * sizeof(int32_t)) {
      return n + "workspace sizes";
    }
    sections.push_back({part.header_offset, sizeof(AttentionPlanHeader), "header"});
    sections.push_back({part.work_items_offset,
                        sizeof(AttentionWorkItem) * static_cast<size_t>(m.work), "work"});
    sections.push_back({part.merge_items_offset,
                        sizeof(AttentionMergeItem) * static_cast<size_t>(m.merges), "merge"});
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& a = sections[i];
    if (a.begin % 16 != 0) return std::string(a.name) + " not 16-byte aligned";
    if (a.begin > layout.plan_bytes || a.bytes > layout.plan_bytes - a.begin) {
      return std::string(a.name) + " past plan_bytes";
    }
    for (size_t j = 0; j < i; ++j) {
      const Section& b = sections[j];
      if (a.bytes > 0 && b.bytes > 0 && a.begin < b.begin + b.bytes &&
          b.begin < a.begin + a.bytes) {
        return std::string(a.name) + " overlaps " + b.name;
      }
    }
  }
  const std::vector<PlanBufferSize> buffers = layout.Buffers();
  if (buffers.size() != 7 || buffers[0].bytes != layout.plan_bytes ||
      buffers[1].bytes != layout.decode.partial_o_bytes ||
      buffers[6].bytes != layout.prefill.merge_counter_bytes) {
    return "Buffers() disagrees with the layout";
  }
  return "";
}

SplitKvPlannerOptions RandomOptions(std::mt19937& rng) {
  SplitKvPlannerOptions o;
  const double edge = 0.04;  // per field: most option sets are valid, most fields plausible
  o.num_kv_heads = Draw(rng, 1, 16, edge);
  const int32_t group = Draw(rng, 1, 9, edge);
  const int64_t q = int64_t{o.num_kv_heads} * group;
  o.num_q_heads = Chance(rng, 0.95) && q >= kInt32Min && q <= kInt32Max
                      ? static_cast<int32_t>(q)
                      : Draw(rng, 1, 64, 0.5);
  o.head_dim = Chance(rng, 0.9) ? (Chance(rng, 0.5) ? 64 : 128) : Draw(rng, 1, 512, 0.5);
  o.sm_count = Draw(rng, 1, 160, edge);
  o.key.max_seqs = Chance(rng, 0.5) ? Uniform(rng, 1, 8) : Draw(rng, 1, 300, edge);
  o.key.max_tokens = Chance(rng, 0.5) ? Uniform(rng, 1, 64) : Draw(rng, 1, 2048, edge);
  o.key.max_kv_len = Chance(rng, 0.5) ? Uniform(rng, 1, 600) : Draw(rng, 1, 1 << 17, 0.15);
  const int g = o.num_kv_heads > 0 && o.num_q_heads > 0 ? std::max(1, o.num_q_heads /
                                                                           o.num_kv_heads)
                                                         : 1;
  for (PlanPartOptions* part : {&o.decode, &o.prefill}) {
    const bool is_decode = part == &o.decode;
    if (Chance(rng, 0.2)) {
      part->tile_rows = 0;
    } else if (Chance(rng, 0.85)) {
      part->tile_rows = is_decode ? Uniform(rng, g, std::max(g, 16))
                                  : (Chance(rng, 0.5) ? 64 : Uniform(rng, g, std::max(g, 200)));
    } else {
      part->tile_rows = Draw(rng, g, 128, 0.7);
    }
    const int32_t grans[] = {1, 16, 64, 128};
    part->kv_granularity = Chance(rng, 0.9) ? grans[Uniform(rng, 0, 3)] : Draw(rng, 1, 300, 0.5);
    part->min_kv_chunk = Draw(rng, 1, 512, edge * 2);
    part->ctas_per_sm = Draw(rng, 1, 8, edge);
    part->allow_split = Chance(rng, 0.85);
    if (Chance(rng, 0.2)) {
      int at = 0;
      for (int i = Uniform(rng, 1, 4); i > 0; --i) {
        at += Chance(rng, 0.9) ? Uniform(rng, 1, 4) : Draw(rng, -2, 2, 0.5);
        part->aim_by_seqs.push_back({at, Chance(rng, 0.9) ? Uniform(rng, 1, 6)
                                                          : Draw(rng, 0, 2, 0.5)});
      }
    }
  }
  return o;
}

// A step for `o`'s key: mostly within it (empty, all-empty, all-decode, one long prompt, mixed,
// q_len above kv_len, kv_len at the key's limit), sometimes past it by one or by far. At most
// `cap` sequences.
std::vector<SeqLens> RandomStep(std::mt19937& rng, const SplitKvPlannerOptions& o, int cap) {
  const AttentionPlanKey& key = o.key;
  const int b = std::min(key.max_seqs, cap);
  const int32_t l = key.max_kv_len;
  auto kv_for = [&](int32_t q_len) {
    switch (Uniform(rng, 0, 5)) {
      case 0: return int32_t{0};
      case 1: return std::min(l, q_len);
      case 2: return l;
      case 3: return std::max(0, std::min(l, q_len - 1));
      default: return Uniform(rng, 0, l);
    }
  };
  std::vector<SeqLens> seqs;
  switch (Uniform(rng, 0, 9)) {
    case 0:  // empty step
      break;
    case 1:  // the whole batch, nothing new
      seqs.assign(b, SeqLens{0, 0});
      for (SeqLens& s : seqs) s.kv_len = kv_for(0);
      break;
    case 2:  // a full decode batch
      seqs.assign(std::min(b, key.max_tokens), SeqLens{1, 0});
      for (SeqLens& s : seqs) s.kv_len = std::max(1, kv_for(1));
      break;
    case 3:  // one prompt of every token the key allows
      seqs.push_back({key.max_tokens, kv_for(key.max_tokens)});
      break;
    case 4:    // past the key: one sequence too many, one token too many or a KV too long
      seqs.assign(std::min(b, key.max_tokens), SeqLens{1, 1});
      switch (Uniform(rng, 0, 2)) {
        case 0:
          if (key.max_seqs < cap) seqs.assign(key.max_seqs + 1, SeqLens{0, 1});
          break;
        case 1:  // the last sequence brings the rest of the key's tokens and one more
          seqs.back().q_len = static_cast<int32_t>(std::min<int64_t>(
              kInt32Max, int64_t{key.max_tokens} - static_cast<int64_t>(seqs.size()) + 2));
          break;
        default:
          seqs.back().kv_len = l == kInt32Max ? l : l + 1;
      }
      break;
    case 5: {  // adversarial lengths in one sequence
      seqs.assign(Uniform(rng, 1, std::max(1, b)), SeqLens{0, 0});
      SeqLens& s = seqs[Uniform(rng, 0, static_cast<int>(seqs.size()) - 1)];
      s.q_len = Draw(rng, 0, 4, 0.8);
      s.kv_len = Draw(rng, 0, l, 0.8);
      break;
    }
    default: {  // a random mix of empty, decode and prefill sequences within the key
      const int n = Uniform(rng, 1, std::max(1, b));
      int64_t budget = key.max_tokens;
      for (int i = 0; i < n; ++i) {
        int32_t q_len = 0;
        const int kind = Uniform(rng, 0, 3);
        if (kind == 1) q_len = 1;
        if (kind >= 2 && budget > 0) {
          q_len = Uniform(rng, 1, static_cast<int32_t>(std::min<int64_t>(budget, 300)));
        }
        q_len = static_cast<int32_t>(std::min<int64_t>(q_len, budget));
        budget -= q_len;
        seqs.push_back({q_len, kv_for(q_len)});
      }
    }
  }
  return seqs;
}

// The step's refusal (strings its message must hold), or {} when the planner must accept it.
Expected ModelStep(const SplitKvPlannerOptions& o, absl::Span<const SeqLens> seqs) {
  const AttentionPlanKey& key = o.key;
  if (static_cast<int64_t>(seqs.size()) > key.max_seqs) {
    return {{std::to_string(seqs.size()) + " sequences", "max_seqs " +
                                                              std::to_string(key.max_seqs)}};
  }
  int64_t tokens = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqLens& s = seqs[i];
    const std::string seq = "Sequence " + std::to_string(i);
    Expected bad;
    if (s.q_len < 0) bad.push_back({seq, "q_len " + std::to_string(s.q_len)});
    if (s.kv_len < 0 || s.kv_len > key.max_kv_len) {
      bad.push_back({seq, "kv_len " + std::to_string(s.kv_len)});
    }
    if (s.q_len > 1 || (s.q_len == 1 && o.decode.tile_rows == 0)) {
      if (o.prefill.tile_rows == 0) bad.push_back({seq, "no prefill part"});
    }
    tokens += std::max(0, s.q_len);
    if (tokens > key.max_tokens) {
      bad.push_back({"more than " + std::to_string(key.max_tokens) + " tokens",
                     "sequence " + std::to_string(i)});
    }
    if (!bad.empty()) return bad;
  }
  return {};
}

// Options and keys from the whole int32 range. Refused ones name a bad field and its value;
// accepted ones have the layout the header's rules give, and plan random steps (accepted and
// refused by the same rules) into a guarded blob with every token of every sequence covered once.
TEST(SplitKvPlannerSweepTest, RandomAndAdversarialOptionsAndSteps) {
  std::mt19937 rng(20240611);
  constexpr int kOptionSets = 3000;
  constexpr size_t kMaxBlobBytes = size_t{1} << 18;
  constexpr int kSteps = 6;
  int accepted = 0, refused = 0, planned = 0, refused_steps = 0, split_steps = 0;
  for (int trial = 0; trial < kOptionSets; ++trial) {
    const SplitKvPlannerOptions o = RandomOptions(rng);
    ModelPart decode, prefill;
    const Expected want = ModelOptions(o, &decode, &prefill);
    absl::StatusOr<SplitKvPlanner> planner = SplitKvPlanner::Create(o);
    const std::string where = "trial " + std::to_string(trial) + ": heads " +
                              std::to_string(o.num_q_heads) + "/" +
                              std::to_string(o.num_kv_heads) + " key {" +
                              std::to_string(o.key.max_seqs) + ", " +
                              std::to_string(o.key.max_tokens) + ", " +
                              std::to_string(o.key.max_kv_len) + "} tile_rows " +
                              std::to_string(o.decode.tile_rows) + "/" +
                              std::to_string(o.prefill.tile_rows);
    if (!want.empty()) {
      ++refused;
      ASSERT_FALSE(planner.ok()) << where << ": accepted, want a refusal";
      ASSERT_EQ(CheckRefusal(planner.status(), want), "") << where;
      continue;
    }
    ASSERT_TRUE(planner.ok()) << where << ": " << planner.status();
    ++accepted;
    const PlanLayout layout = planner->layout();
    ASSERT_EQ(CheckLayout(o, layout, decode, prefill), "") << where;
    if (layout.plan_bytes > kMaxBlobBytes) continue;
    Blob blob(layout.plan_bytes);
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<SeqLens> seqs = RandomStep(rng, o, 512);
      const Expected step_want = ModelStep(o, seqs);
      absl::StatusOr<PlanSummary> summary = planner->Plan(seqs, blob.data());
      ASSERT_TRUE(blob.GuardIntact()) << where << " step " << step;
      if (!step_want.empty()) {
        ++refused_steps;
        ASSERT_FALSE(summary.ok()) << where << " step " << step << ": accepted";
        ASSERT_EQ(CheckRefusal(summary.status(), step_want), "") << where << " step " << step;
        continue;
      }
      ASSERT_TRUE(summary.ok()) << where << " step " << step << ": " << summary.status();
      ++planned;
      split_steps += summary->decode.num_merge_items + summary->prefill.num_merge_items > 0;
      int64_t cells = 0;  // (row, KV position) pairs: count them one by one when few
      for (const SeqLens& s : seqs) cells += int64_t{s.q_len} * layout.group_size * s.kv_len;
      const bool count_cells = cells < 20000 && seqs.size() <= 64 && step % 2 == 0;
      ASSERT_EQ(CheckPlan(*planner, seqs, blob, *summary, count_cells), "")
          << where << " step " << step;
      ASSERT_TRUE(SameLayout(planner->layout(), layout)) << where;
    }
  }
  RecordProperty("accepted", accepted);
  RecordProperty("refused", refused);
  RecordProperty("planned_steps", planned);
  RecordProperty("refused_steps", refused_steps);
  RecordProperty("split_steps", split_steps);
  // The sweep must reach both sides of every rule often enough to mean something.
  EXPECT_GT(accepted, kOptionSets / 4);
  EXPECT_GT(refused, kOptionSets / 10);
  EXPECT_GT(planned, 5000);
  EXPECT_GT(refused_steps, 1000);
  EXPECT_GT(split_steps, 500);
}


// Keys and options at the edges of what Create accepts: each is accepted with the model's
// layout and plans its extreme steps exactly, and one step further is refused by name.
TEST(SplitKvPlannerSweepTest, PlansAtTheInt32EdgesAndRefusesOnePast) {
  struct Case {
    const char* what;
    int q_heads, kv_heads, head_dim, sm_count;
    AttentionPlanKey key;
    int decode_rows, prefill_rows, granularity, min_chunk, ctas;
    std::vector<std::vector<SeqLens>> steps;
  };
  const int32_t m = kInt32Max;
  const std::vector<Case> cases = {
      {"KV of int32's limit, granularity 1", 8, 8, 128, 132, {4, 4, m}, 1, 0, 1, 1, 2,
       {{{1, m}, {1, m - 1}, {1, 1}, {1, 0}}, {{1, m}}, {}}},
      {"one prompt of int32's limit in one tile", 1, 1, 64, 8, {1, m, 1 << 20}, 0, m, 64, 256, 1,
       {{{m, 1 << 20}}, {{m, 0}}, {{1, 1}}, {{0, 1 << 20}}}},
      {"a decode and a prefill part under int32's packed-row limit", 2, 1, 64, 16,
       {3, m / 2, 4096}, 2, m - 1, 16, 16, 4,
       {{{1, 4096}, {m / 2 - 2, 4096}, {1, 17}}, {{2, 3}, {1, 0}}}},
      {"tile_rows of int32's limit, 64 query heads per KV head", 64, 1, 128, 1, {2, 1000, 1 << 16},
       0, m, 64, 64, 1, {{{1000, 1 << 16}}, {{1, 1}, {999, 999}}}},
      {"one SM, one CTA per SM, 8 KV heads: one slot, no split", 64, 8, 128, 1, {8, 64, 1 << 16},
       8, 64, 64, 64, 1, {{{1, 1 << 16}, {63, 1 << 16}}}},
      {"minimum everything", 1, 1, 1, 1, {1, 1, 1}, 1, 1, 1, 1, 1, {{{1, 1}}, {{1, 0}}, {{0, 1}}}},
  };
  for (const Case& c : cases) {
    SplitKvPlannerOptions o;
    o.num_q_heads = c.q_heads;
    o.num_kv_heads = c.kv_heads;
    o.head_dim = c.head_dim;
    o.sm_count = c.sm_count;
    o.key = c.key;
    o.decode.tile_rows = c.decode_rows;
    o.prefill.tile_rows = c.prefill_rows;
    for (PlanPartOptions* part : {&o.decode, &o.prefill}) {
      part->kv_granularity = c.granularity;
      part->min_kv_chunk = c.min_chunk;
      part->ctas_per_sm = c.ctas;
    }
    ModelPart decode, prefill;
    ASSERT_TRUE(ModelOptions(o, &decode, &prefill).empty()) << c.what;
    absl::StatusOr<SplitKvPlanner> planner = SplitKvPlanner::Create(o);
    ASSERT_TRUE(planner.ok()) << c.what << ": " << planner.status();
    ASSERT_EQ(CheckLayout(o, planner->layout(), decode, prefill), "") << c.what;
    Blob blob(planner->layout().plan_bytes);
    for (const std::vector<SeqLens>& seqs : c.steps) {
      ASSERT_TRUE(ModelStep(o, seqs).empty()) << c.what;
      absl::StatusOr<PlanSummary> summary = planner->Plan(seqs, blob.data());
      ASSERT_TRUE(summary.ok()) << c.what << ": " << summary.status();
      ASSERT_EQ(CheckPlan(*planner, seqs, blob, *summary, /*count_cells=*/false), "") << c.what;
    }
    // One past the key in each direction: refused by name, the guard bytes untouched.
    const int32_t too_long = c.key.max_kv_len == m ? -1 : c.key.max_kv_len + 1;
    const std::vector<std::vector<SeqLens>> past = {std::vector<SeqLens>(c.key.max_seqs + 1),
                                                    {{0, too_long}},
                                                    {{c.key.max_tokens, 1}, {1, 1}},
                                                    {{m, m}},
                                                    {{kInt32Min, kInt32Min}}};
    for (const std::vector<SeqLens>& seqs : past) {
      const Expected want = ModelStep(o, seqs);
      if (want.empty()) continue;  // e.g. {m, m} within a key of int32's limits
      ASSERT_EQ(CheckRefusal(planner->Plan(seqs, blob.data()).status(), want), "") << c.what;
      ASSERT_TRUE(blob.GuardIntact()) << c.what;
    }
  }
}

// The capacities Create sizes sit exactly at int32's grid limit and size_t's workspace limit:
// the last accepted value gets the model's layout, the next one a refusal naming the buffer.
TEST(SplitKvPlannerSweepTest, RefusesCapacitiesOnePastTheirLimits) {
  SplitKvPlannerOptions o;
  o.num_q_heads = 1;
  o.num_kv_heads = 1;
  o.head_dim = 1;
  o.key = {1, 1, 1 << 20};
  o.decode.tile_rows = 1;
  o.decode.ctas_per_sm = 1;
  // One decode tile plus sm_count slots: int32's limit is reached at sm_count = 2^31 - 2.
  o.sm_count = kInt32Max - 1;
  ModelPart decode, prefill;
  ASSERT_TRUE(ModelOptions(o, &decode, &prefill).empty());
  absl::StatusOr<SplitKvPlanner> at_limit = SplitKvPlanner::Create(o);
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(at_limit->layout().decode.work_capacity, kInt32Max);
  EXPECT_EQ(CheckLayout(o, at_limit->layout(), decode, prefill), "");
  o.sm_count = kInt32Max;
  EXPECT_EQ(CheckRefusal(SplitKvPlanner::Create(o).status(),
                         {{"decode part needs 2147483648 work items", "ctas_per_sm"}}),
            "");

  // 2^30 KV heads × 2^30 slots × 64 floats of 4 bytes: 2^68 bytes of partial_o.
  o.num_q_heads = 1 << 30;
  o.num_kv_heads = 1 << 30;
  o.head_dim = 64;
  o.sm_count = 1 << 30;
  o.decode.ctas_per_sm = 1 << 30;
  o.key = {4, 4, 1 << 20};
  EXPECT_EQ(CheckRefusal(SplitKvPlanner::Create(o).status(), {{"'decode partial_o'"}}), "");
  o.head_dim = 1;  // 2^60 × 4 bytes: fits
  ASSERT_TRUE(ModelOptions(o, &decode, &prefill).empty());
  absl::StatusOr<SplitKvPlanner> wide = SplitKvPlanner::Create(o);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(CheckLayout(o, wide->layout(), decode, prefill), "");
  EXPECT_EQ(wide->layout().decode.partial_o_bytes, size_t{1} << 62);
}

// A step of 2^31 or 2^32 sequences (a span over one real element: Plan must refuse it before it
// reads past that element) is refused by its true count, not planned as the int it wraps to.
TEST(SplitKvPlannerSweepTest, RefusesSpansPastInt32Sequences) {
  auto planner = SplitKvPlanner::Create(SmallOptions(4, 4, 16));
  ASSERT_TRUE(planner.ok()) << planner.status();
  Blob blob(planner->layout().plan_bytes);
  const SeqLens one = {1, 1};
  for (size_t size : {size_t{1} << 31, size_t{1} << 32, (size_t{1} << 32) + 1}) {
    const absl::Span<const SeqLens> seqs(&one, size);
    EXPECT_EQ(CheckRefusal(planner->Plan(seqs, blob.data()).status(),
                           {{std::to_string(size) + " sequences", "max_seqs 4"}}),
              "");
  }
  EXPECT_TRUE(blob.GuardIntact());
}

// The closed form for every kind of argument: 0 for a non-positive one, the formula (computed
// here in 64 bits) when t >= g, and never a negative or wrapped count when t < g.
TEST(SplitKvPlannerSweepTest, MaxQueryTilesNeverWraps) {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 200000; ++trial) {
    const int32_t b = Draw(rng, 0, 300, 0.3), n = Draw(rng, 0, 5000, 0.3);
    const int32_t g = Draw(rng, 1, 16, 0.3), t = Draw(rng, 1, 256, 0.3);
    const int got = MaxQueryTiles(b, n, g, t);
    const std::string args = "MaxQueryTiles(" + std::to_string(b) + ", " + std::to_string(n) +
                             ", " + std::to_string(g) + ", " + std::to_string(t) + ")";
    if (b <= 0 || n <= 0 || g <= 0 || t <= 0) {
      ASSERT_EQ(got, 0) << args;
      continue;
    }
    const int64_t spread = CeilDiv64(int64_t{n} * g, t) + b - 1;
    const int64_t per_token = int64_t{n} * CeilDiv64(g, t);
    const int64_t want = std::min<int64_t>({spread, per_token, kInt32Max});
    ASSERT_EQ(got, want) << args;
    if (t >= g) {
      ASSERT_LE(got, n) << args;
    }
  }
}

}  // namespace
}  // namespace kiln
