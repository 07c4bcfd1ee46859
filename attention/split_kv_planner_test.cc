#include "attention/split_kv_planner.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "attention/attention_params.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

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
    if (w.row_end - w.row_begin > t_rows || w.row_end <= w.row_begin) {
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
    const int rows = sl.q_len * g;
    for (int rb = 0; rb < rows; rb += t_rows) {
      ++expected_tiles;
      const int re = std::min(rb + t_rows, rows);
      auto it = tiles.find({s, rb});
      if (it == tiles.end()) return where + "missing tile of seq " + std::to_string(s);
      std::vector<AttentionWorkItem> items = it->second;
      std::sort(items.begin(), items.end(),
                [](const AttentionWorkItem& a, const AttentionWorkItem& b) {
                  return a.kv_begin < b.kv_begin;
                });
      const int kv_end = std::max(0, sl.kv_len - sl.q_len + (re - 1) / g + 1);
      int at = 0;
      for (size_t k = 0; k < items.size(); ++k) {
        const AttentionWorkItem& w = items[k];
        if (w.row_end != re) return where + "tile row_end mismatch";
        if (w.kv_begin != at) return where + "gap or overlap in a tile's KV chunks";
        if (w.kv_end < w.kv_begin || (w.kv_end == w.kv_begin && kv_end != 0)) {
          return where + "empty chunk in a non-empty tile";
        }
        if (k + 1 < items.size() && w.kv_end - w.kv_begin != h.kv_chunk_size) {
          return where + "inner chunk differs from the header's chunk size";
        }
        if (w.kv_end - w.kv_begin > h.kv_chunk_size) return where + "chunk above chunk size";
        at = w.kv_end;
      }
      if (at != kv_end) return where + "tile KV coverage ends at " + std::to_string(at);
      auto m = merges.find({s, rb});
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
          if (!tile_slots.count(m->second.first_slot + k)) {
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

}  // namespace
}  // namespace kiln
