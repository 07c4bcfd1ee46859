#include "runtime/runner/step_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

struct Fixture {
  CaptureSizes decode = *CaptureSizes::Decode(64);       // 1, 2, 4, 8, ..., 64
  CaptureSizes prefill = *CaptureSizes::Prefill(512);    // 16, 32, 48, 64, 96, ..., 512
  StepKeys keys = *StepKeys::Create({64, 1024}, &decode, &prefill);
};

std::vector<SeqLens> Decodes(int n, int kv = 100) { return std::vector<SeqLens>(n, {1, kv}); }

TEST(StepKeysTest, KeysCoverEverySizeAndTheEagerKey) {
  Fixture f;
  const size_t expected = f.decode.sizes().size() + f.prefill.sizes().size() + 1;
  ASSERT_EQ(f.keys.keys().size(), expected);
  const StepKey& eager = f.keys.key(f.keys.eager_index());
  EXPECT_TRUE(eager.eager_only);
  EXPECT_EQ(eager.max_tokens, 1024);
  EXPECT_EQ(eager.max_rows, 64);
  const StepKey& p16 = f.keys.key(f.keys.Find({GraphMode::kPrefill, 16}));
  EXPECT_EQ(p16.max_rows, 16);
  EXPECT_TRUE(p16.decode_part && p16.prefill_part);
  const StepKey& p512 = f.keys.key(f.keys.Find({GraphMode::kPrefill, 512}));
  EXPECT_EQ(p512.max_rows, 64);  // capped at max_num_seqs
  const StepKey& d8 = f.keys.key(f.keys.Find({GraphMode::kDecode, 8}));
  EXPECT_TRUE(d8.decode_part);
  EXPECT_FALSE(d8.prefill_part);
}

TEST(StepKeysTest, DecodeBatchesPadToTheNextDecodeSize) {
  Fixture f;
  for (int n = 1; n <= 64; ++n) {
    const StepRoute r = f.keys.Route(Decodes(n));
    const StepKey& k = f.keys.key(r.key_index);
    EXPECT_EQ(k.key.mode, GraphMode::kDecode);
    EXPECT_EQ(k.key.size, *f.decode.PaddedSize(n));
    EXPECT_EQ(r.num_tokens, k.key.size);
    EXPECT_EQ(r.num_rows, k.key.size);
    EXPECT_GE(r.num_rows, n);
  }
  EXPECT_EQ(f.keys.key(f.keys.Route(Decodes(5)).key_index).key.size, 8);
}

TEST(StepKeysTest, PrefillAndMixedBatchesPadByTokens) {
  Fixture f;
  // One prompt of 20 tokens: prefill/32.
  StepRoute r = f.keys.Route(std::vector<SeqLens>{{20, 20}});
  EXPECT_EQ(f.keys.key(r.key_index).key, (CaptureKey{GraphMode::kPrefill, 32}));
  EXPECT_EQ(r.num_tokens, 32);
  EXPECT_EQ(r.num_rows, 32);
  // Mixed: 3 decodes and a 13-token chunk = 16 tokens.
  r = f.keys.Route(std::vector<SeqLens>{{1, 5}, {13, 13}, {1, 9}, {1, 700}});
  EXPECT_EQ(f.keys.key(r.key_index).key, (CaptureKey{GraphMode::kPrefill, 16}));
  // A chunk exactly at a size boundary.
  r = f.keys.Route(std::vector<SeqLens>{{512, 600}});
  EXPECT_EQ(f.keys.key(r.key_index).key, (CaptureKey{GraphMode::kPrefill, 512}));
}

TEST(StepKeysTest, BatchesAboveEveryCapturedSizeRunEagerlyAtExactSizes) {
  CaptureSizes decode = *CaptureSizes::Decode(64, {1, 2, 4});
  CaptureSizes prefill = *CaptureSizes::Prefill(512);
  StepKeys keys = *StepKeys::Create({64, 1024}, &decode, &prefill);
  StepRoute r = keys.Route(Decodes(5));
  EXPECT_EQ(r.key_index, keys.eager_index());
  EXPECT_EQ(r.num_tokens, 5);
  EXPECT_EQ(r.num_rows, 5);
  r = keys.Route(std::vector<SeqLens>{{600, 600}, {1, 3}});
  EXPECT_EQ(r.key_index, keys.eager_index());
  EXPECT_EQ(r.num_tokens, 601);
  EXPECT_EQ(r.num_rows, 2);
  // No prefill keys at all: every prefill is eager.
  StepKeys decode_only = *StepKeys::Create({64, 1024}, &decode, nullptr);
  EXPECT_EQ(decode_only.Route(std::vector<SeqLens>{{3, 3}}).key_index, decode_only.eager_index());
}

TEST(StepKeysTest, CheckNamesTheLimit) {
  Fixture f;
  EXPECT_THAT(f.keys.Check({}).message(), HasSubstr("no sequences"));
  EXPECT_THAT(f.keys.Check(Decodes(65)).message(), HasSubstr("max_num_seqs 64"));
  EXPECT_THAT(f.keys.Check(std::vector<SeqLens>{{1000, 1000}, {25, 25}}).message(),
              HasSubstr("max_num_batched_tokens 1024"));
  EXPECT_TRUE(f.keys.Check(std::vector<SeqLens>{{1000, 1000}, {24, 24}}).ok());
  EXPECT_EQ(StepKeys::Create({8, 4}, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StepPlanTest, PlannerOptionsFollowTheKey) {
  Fixture f;
  const StepKey& d = f.keys.key(f.keys.Find({GraphMode::kDecode, 8}));
  SplitKvPlannerOptions o = PlannerOptionsFor(d, 32, 8, 64, 132, 4096);
  EXPECT_EQ(o.decode.tile_rows, 4);
  EXPECT_EQ(o.prefill.tile_rows, 0);
  EXPECT_EQ(o.key.max_seqs, 8);
  EXPECT_EQ(o.key.max_tokens, 8);
  EXPECT_EQ(o.key.max_kv_len, 4096);
  ASSERT_TRUE(SplitKvPlanner::Create(o).ok());
  const StepKey& p = f.keys.key(f.keys.Find({GraphMode::kPrefill, 96}));
  o = PlannerOptionsFor(p, 32, 8, 64, 132, 4096, 128);
  EXPECT_EQ(o.decode.tile_rows, 4);
  EXPECT_EQ(o.prefill.tile_rows, 128);
  EXPECT_EQ(o.key.max_seqs, 64);
  EXPECT_EQ(o.key.max_tokens, 96);
  ASSERT_TRUE(SplitKvPlanner::Create(o).ok());
}

TEST(StepKeysTest, DecodeKeysKnowTheirFewestRows) {
  Fixture f;
  auto fewest = [&](CaptureKey k) { return f.keys.key(f.keys.Find(k)).min_rows; };
  EXPECT_EQ(fewest({GraphMode::kDecode, 1}), 1);
  EXPECT_EQ(fewest({GraphMode::kDecode, 2}), 2);
  EXPECT_EQ(fewest({GraphMode::kDecode, 4}), 3);
  EXPECT_EQ(fewest({GraphMode::kDecode, 16}), 9);
  EXPECT_EQ(fewest({GraphMode::kPrefill, 96}), 1);
  EXPECT_EQ(f.keys.key(f.keys.eager_index()).min_rows, 1);
}

TEST(StepPlanTest, DecodeSplitFollowsTheFirstRuleThatHoldsTheKey) {
  Fixture f;
  const std::vector<SplitAim> rules = {{2, 3}, {8, 4}};
  auto ctas = [&](CaptureKey k) { return DecodeCtasPerSm(f.keys.key(f.keys.Find(k)), rules, 5); };
  EXPECT_EQ(ctas({GraphMode::kDecode, 1}), 3);
  EXPECT_EQ(ctas({GraphMode::kDecode, 2}), 3);
  EXPECT_EQ(ctas({GraphMode::kDecode, 4}), 4);
  EXPECT_EQ(ctas({GraphMode::kDecode, 8}), 4);
  EXPECT_EQ(ctas({GraphMode::kDecode, 16}), 5);
  // A prefill key holds up to 64 sequences (PlannerOptionsFollowTheKey).
  EXPECT_EQ(ctas({GraphMode::kPrefill, 96}), 5);
  EXPECT_EQ(DecodeCtasPerSm(f.keys.key(f.keys.Find({GraphMode::kDecode, 1})), {}, 5), 5);
}

// A step can aim lower than its key but not higher, so a decode key sizes for the largest aim
// of the counts routed to it.
TEST(StepPlanTest, DecodeKeySizesForTheLargestAimOfItsBatches) {
  Fixture f;
  const std::vector<SplitAim> rules = {{2, 3}, {8, 4}, {10, 6}, {24, 1}};
  auto ctas = [&](CaptureKey k) { return DecodeCtasPerSm(f.keys.key(f.keys.Find(k)), rules, 2); };
  EXPECT_EQ(ctas({GraphMode::kDecode, 8}), 4);    // 5–8
  EXPECT_EQ(ctas({GraphMode::kDecode, 16}), 6);   // 9–10 aim at 6, 11–16 at 1
  EXPECT_EQ(ctas({GraphMode::kDecode, 32}), 2);   // 17–24 at 1, 25–32 otherwise
  EXPECT_EQ(ctas({GraphMode::kDecode, 64}), 2);   // above every rule
  EXPECT_EQ(ctas({GraphMode::kPrefill, 16}), 1);  // by its capacity, 16
  EXPECT_EQ(ctas({GraphMode::kPrefill, 96}), 2);  // 64 sequences
}

// Counts above every rule aim at `otherwise`, not at the key's sizing aim: the key of 32 rows
// when it is the only decode size sizes for 4 CTAs per SM (batches of 5–8), yet a step of 25–32
// sequences must aim at 2.
TEST(StepPlanTest, DecodeCountsAboveTheRulesAimAtOtherwise) {
  const std::vector<SplitAim> rules = {{7, 2}, {8, 4}, {24, 1}};
  StepKey key;
  key.key = {GraphMode::kDecode, 32};
  key.decode_part = true;
  key.max_rows = 32;
  key.max_tokens = 32;
  key.min_rows = 1;
  SplitKvPlannerOptions o = PlannerOptionsFor(key, 32, 8, 64, 132, 2048);
  o.decode.min_kv_chunk = 64;
  SetDecodeSplit(key, rules, 2, &o.decode);
  EXPECT_EQ(o.decode.ctas_per_sm, 4);
  EXPECT_EQ(o.decode.min_kv_chunk, 64);  // left alone
  const std::vector<SplitAim> aims = o.decode.aim_by_seqs;
  ASSERT_EQ(aims.size(), 4u);
  EXPECT_EQ(aims[3].max_seqs, 32);
  EXPECT_EQ(aims[3].ctas_per_sm, 2);
  EXPECT_TRUE(CheckSplitAims(aims, "aims").ok());

  // With those rules the planner splits 32 sequences for 2 CTAs per SM (1B shape, 132 SMs).
  absl::StatusOr<SplitKvPlanner> planner = SplitKvPlanner::Create(o);
  ASSERT_TRUE(planner.ok()) << planner.status();
  SplitKvPlannerOptions unsized = o;  // the same key sized for 2 CTAs per SM, no rules
  unsized.decode.ctas_per_sm = 2;
  unsized.decode.aim_by_seqs.clear();
  absl::StatusOr<SplitKvPlanner> reference = SplitKvPlanner::Create(unsized);
  ASSERT_TRUE(reference.ok()) << reference.status();
  struct alignas(16) Chunk {
    char bytes[16];
  };
  auto plan = [](const SplitKvPlanner& p) {
    std::vector<Chunk> blob(p.layout().plan_bytes / sizeof(Chunk) + 1);
    const std::vector<SeqLens> seqs(32, SeqLens{1, 1025});
    absl::StatusOr<PlanSummary> summary = p.Plan(seqs, blob.data());
    EXPECT_TRUE(summary.ok()) << summary.status();
    return summary.ok() ? summary->decode : PlanPartSummary{};
  };
  const PlanPartSummary got = plan(*planner);
  const PlanPartSummary want = plan(*reference);
  EXPECT_EQ(got.kv_chunk_size, want.kv_chunk_size);
  EXPECT_EQ(got.num_work_items, want.num_work_items);
  EXPECT_EQ(got.num_merge_items, want.num_merge_items);
  // The rules alone split the same step for 4 CTAs per SM: more chunks.
  o.decode.aim_by_seqs = rules;
  absl::StatusOr<SplitKvPlanner> rules_only = SplitKvPlanner::Create(o);
  ASSERT_TRUE(rules_only.ok()) << rules_only.status();
  EXPECT_GT(plan(*rules_only).num_work_items, want.num_work_items);

  // A key that ends at a rule, or whose rules run past it, gets no extra rule.
  auto aims_for = [&](const std::vector<SplitAim>& r, int otherwise) {
    PlanPartOptions part;
    SetDecodeSplit(key, r, otherwise, &part);
    return part.aim_by_seqs;
  };
  key.max_rows = 24;
  EXPECT_EQ(aims_for(rules, 2).size(), 3u);
  key.max_rows = 8;
  EXPECT_EQ(aims_for(rules, 2).size(), 3u);
  // No rules: every count aims at `otherwise`.
  const std::vector<SplitAim> none = aims_for({}, 5);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].ctas_per_sm, 5);
}

// Under the default capture sizes and rules (RunnerOptions) the last rule changes no plan: every
// key, every decode count it takes, the same chunks and items as with the rules alone.
TEST(StepPlanTest, DecodeSplitKeepsTheDefaultCaptureListsPlans) {
  CaptureSizes decode = *CaptureSizes::Decode(256);
  CaptureSizes prefill = *CaptureSizes::Prefill(512);
  const StepKeys keys = *StepKeys::Create({256, 8192}, &decode, &prefill);
  const std::vector<SplitAim> rules = {{7, 2}, {8, 4}, {24, 1}};
  struct alignas(16) Chunk {
    char bytes[16];
  };
  int compared = 0;
  for (const StepKey& key : keys.keys()) {
    SplitKvPlannerOptions o = PlannerOptionsFor(key, 32, 8, 64, 132, 2048);
    o.decode.min_kv_chunk = 64;
    o.decode.ctas_per_sm = DecodeCtasPerSm(key, rules, 2);
    o.decode.aim_by_seqs = rules;
    absl::StatusOr<SplitKvPlanner> before = SplitKvPlanner::Create(o);
    SetDecodeSplit(key, rules, 2, &o.decode);
    absl::StatusOr<SplitKvPlanner> after = SplitKvPlanner::Create(o);
    ASSERT_TRUE(before.ok() && after.ok()) << before.status() << after.status();
    std::vector<Chunk> blob(after->layout().plan_bytes / sizeof(Chunk) + 1);
    for (int n = key.min_rows; n <= key.max_rows; ++n) {
      const std::vector<SeqLens> seqs(n, SeqLens{1, 1025});
      absl::StatusOr<PlanSummary> a = before->Plan(seqs, blob.data());
      absl::StatusOr<PlanSummary> b = after->Plan(seqs, blob.data());
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      EXPECT_EQ(a->decode.kv_chunk_size, b->decode.kv_chunk_size) << key.max_rows << " " << n;
      EXPECT_EQ(a->decode.num_work_items, b->decode.num_work_items) << key.max_rows << " " << n;
      ++compared;
    }
  }
  EXPECT_GT(compared, 256);
}

TEST(StepPlanTest, MetadataLayoutIsAlignedAndTheTableComesLast) {
  Fixture f;
  const StepKey& k = f.keys.key(f.keys.Find({GraphMode::kDecode, 8}));
  const MetadataLayout l = MetadataLayout::Create(k, /*plan_bytes=*/1000, /*blocks=*/32);
  for (size_t off : {l.token_ids, l.positions, l.last_token_rows, l.plan, l.block_table}) {
    EXPECT_EQ(off % 256, 0u);
  }
  EXPECT_LT(l.plan, l.block_table);
  EXPECT_GE(l.block_table - l.plan, 1000u);
  EXPECT_EQ(l.bytes, l.block_table + 8 * 32 * 4);
  EXPECT_EQ(l.UploadBytes(3), l.block_table + 3 * 32 * 4);
}

TEST(StepPlanTest, FetchTakesASmallTableWholeAndALargeOneByRows) {
  Fixture f;
  const StepKey& k = f.keys.key(f.keys.Find({GraphMode::kDecode, 8}));
  // 8 rows of 32 blocks: 1 KiB of table, fetched with the rest.
  const MetadataLayout small = MetadataLayout::Create(k, /*plan_bytes=*/1000, /*blocks=*/32);
  const MetadataFetch whole = small.Fetch();
  EXPECT_EQ(whole.fixed_bytes, small.bytes);
  EXPECT_EQ(whole.row_bytes, 0u);
  // 8 rows of 4096 blocks: 128 KiB, above kWholeTableFetchBytes; the rows follow the count.
  const MetadataLayout large = MetadataLayout::Create(k, /*plan_bytes=*/1000, /*blocks=*/4096);
  ASSERT_GT(large.bytes - large.block_table, kWholeTableFetchBytes);
  const MetadataFetch rows = large.Fetch();
  EXPECT_EQ(rows.fixed_bytes, large.block_table);
  EXPECT_EQ(rows.table_offset, large.block_table);
  EXPECT_EQ(rows.row_bytes, 4096u * 4);
  EXPECT_EQ(rows.last_token_rows, large.last_token_rows);
  EXPECT_EQ(rows.max_rows, 8);
  // What the fetch copies for a step of 3 sequences is what it must upload.
  EXPECT_EQ(rows.fixed_bytes + 3 * rows.row_bytes, large.UploadBytes(3));
}

TEST(StepPlanTest, FillEndsLastTokenRowsWithMinusOneToTheLayoutsEnd) {
  // The eager key routes a batch at its own row count; the fetch counts the sequences up to the
  // first -1, so the rows past the route must say -1 too, whatever the blob held.
  Fixture f;
  const std::vector<SeqLens> seqs = {{2, 40}, {1, 7}};
  const StepKey& eager = f.keys.key(f.keys.eager_index());
  const StepRoute route{f.keys.eager_index(), 3, 2};
  const MetadataLayout l = MetadataLayout::Create(eager, 64, /*blocks=*/4);
  std::vector<char> blob(l.bytes, 0x11);  // stale, non-negative words
  const std::vector<int32_t> t0 = {5, 6}, t1 = {9};
  const std::vector<int32_t> b0 = {0, 1, 2}, b1 = {3};
  const std::vector<absl::Span<const int32_t>> tokens = {t0, t1}, blocks = {b0, b1};
  ASSERT_TRUE(FillStepInputs(l, route, seqs, tokens, blocks, 16, blob.data()).ok());
  const int32_t* last = reinterpret_cast<const int32_t*>(blob.data() + l.last_token_rows);
  EXPECT_EQ(last[0], 1);
  EXPECT_EQ(last[1], 2);
  for (int i = 2; i < l.max_rows; ++i) ASSERT_EQ(last[i], -1) << "row " << i;
}

TEST(StepPlanTest, FillWritesTokensPositionsLastRowsAndBlocks) {
  Fixture f;
  const StepRoute route = f.keys.Route(std::vector<SeqLens>{{3, 18}, {1, 16}});  // prefill/16
  const StepKey& key = f.keys.key(route.key_index);
  ASSERT_EQ(key.key, (CaptureKey{GraphMode::kPrefill, 16}));
  const MetadataLayout l = MetadataLayout::Create(key, 64, /*blocks=*/4);
  std::vector<char> blob(l.bytes, 0x5a);  // poisoned
  const std::vector<SeqLens> seqs = {{3, 18}, {1, 16}};
  const std::vector<int32_t> t0 = {5, 6, 7}, t1 = {9};
  const std::vector<int32_t> b0 = {4, 2}, b1 = {7};
  const std::vector<absl::Span<const int32_t>> tokens = {t0, t1}, blocks = {b0, b1};
  ASSERT_TRUE(FillStepInputs(l, route, seqs, tokens, blocks, 16, blob.data()).ok());
  auto ints = [&](size_t off) { return reinterpret_cast<const int32_t*>(blob.data() + off); };
  const int32_t* ids = ints(l.token_ids);
  const int32_t* pos = ints(l.positions);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 6), (std::vector<int32_t>{5, 6, 7, 9, -1, -1}));
  EXPECT_EQ(ids[15], -1);
  // Sequence 0 holds 18 tokens of which 3 are new: positions 15, 16, 17 (crossing a block).
  EXPECT_EQ(std::vector<int32_t>(pos, pos + 5), (std::vector<int32_t>{15, 16, 17, 15, 0}));
  const int32_t* last = ints(l.last_token_rows);
  EXPECT_EQ(last[0], 2);
  EXPECT_EQ(last[1], 3);
  EXPECT_EQ(last[2], -1);
  EXPECT_EQ(last[15], -1);
  const int32_t* table = ints(l.block_table);
  EXPECT_EQ(std::vector<int32_t>(table, table + 8),
            (std::vector<int32_t>{4, 2, -1, -1, 7, -1, -1, -1}));
}

TEST(StepPlanTest, FillRejectsInconsistentInputs) {
  Fixture f;
  const std::vector<SeqLens> seqs = {{2, 40}};
  const StepRoute route = f.keys.Route(seqs);
  const MetadataLayout l = MetadataLayout::Create(f.keys.key(route.key_index), 64, 4);
  std::vector<char> blob(l.bytes);
  const std::vector<int32_t> one = {1}, two = {1, 2}, few_blocks = {0, 1}, blocks = {0, 1, 2};
  std::vector<absl::Span<const int32_t>> t = {one}, b = {blocks};
  EXPECT_THAT(FillStepInputs(l, route, seqs, t, b, 16, blob.data()).message(),
              HasSubstr("q_len 2"));
  t = {two};
  b = {few_blocks};
  EXPECT_THAT(FillStepInputs(l, route, seqs, t, b, 16, blob.data()).message(),
              HasSubstr("need 3"));
  b = {blocks};
  EXPECT_TRUE(FillStepInputs(l, route, seqs, t, b, 16, blob.data()).ok());
  EXPECT_THAT(FillStepInputs(l, route, seqs, t, b, 0, blob.data()).message(),
              HasSubstr("block_size 0"));
  // A KV length near INT_MAX needs more blocks than a row holds, not a negative count.
  const std::vector<SeqLens> huge = {{2, 2147483647}};
  EXPECT_EQ(FillStepInputs(l, route, huge, t, b, 16, blob.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// An empty sequence has no last token: its last-token row would be -1 (or repeat the sequence
// before it), and the step's fetch, which counts sequences up to the first -1, would miss the
// sequences after it. It is refused, as is a route of negative size (no fill runs backwards).
TEST(StepPlanTest, FillRejectsEmptySequencesAndNegativeRoutes) {
  Fixture f;
  const StepKey& eager = f.keys.key(f.keys.eager_index());
  const MetadataLayout l = MetadataLayout::Create(eager, 64, /*blocks=*/4);
  std::vector<char> blob(l.bytes, 0x11);
  const std::vector<int32_t> none, one = {9}, b0 = {0}, b1 = {1};
  const std::vector<absl::Span<const int32_t>> tokens = {none, one}, blocks = {b0, b1};
  const std::vector<SeqLens> seqs = {{0, 7}, {1, 8}};
  const StepRoute route{f.keys.eager_index(), 1, 2};
  const absl::Status empty = FillStepInputs(l, route, seqs, tokens, blocks, 16, blob.data());
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("Sequence 0 has q_len 0"));

  const StepRoute backwards{f.keys.eager_index(), -4, 0};
  EXPECT_EQ(FillStepInputs(l, backwards, {}, {}, {}, 16, blob.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// StepIds::kCheck (the default) reads every id and refuses a negative one, writing nothing;
// kCheckedByCaller (Runner::Step, whose ids CheckStepTokens and the SequenceTable vouch for)
// skips those reads and writes the same bytes for the same valid step.
TEST(StepPlanTest, FillChecksIdsUnlessTheCallerDid) {
  Fixture f;
  const std::vector<SeqLens> seqs = {{2, 18}, {1, 5}};
  const StepRoute route = f.keys.Route(seqs);
  const MetadataLayout l = MetadataLayout::Create(f.keys.key(route.key_index), 64, 4);
  const std::vector<int32_t> t0 = {11, 12}, t1 = {13}, b0 = {3, 8}, b1 = {6};
  const std::vector<int32_t> bad_t0 = {11, -1}, bad_b1 = {-7};
  const std::vector<char> poison(l.bytes, 0x5a);

  std::vector<absl::Span<const int32_t>> tokens = {bad_t0, t1}, blocks = {b0, b1};
  for (StepIds id_check : {StepIds::kCheck, static_cast<StepIds>(7)}) {
    std::vector<char> blob = poison;
    absl::Status status = FillStepInputs(l, route, seqs, tokens, blocks, 16, blob.data(), id_check);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("Sequence 0 has token id -1 at 1"));
    EXPECT_TRUE(blob == poison) << "a refused fill wrote into the blob";
  }
  tokens = {t0, t1};
  blocks = {b0, bad_b1};
  std::vector<char> blob = poison;
  absl::Status status = FillStepInputs(l, route, seqs, tokens, blocks, 16, blob.data());
  EXPECT_THAT(std::string(status.message()), HasSubstr("Sequence 1 has KV block -7 at 0"));
  EXPECT_TRUE(blob == poison) << "a refused fill wrote into the blob";

  blocks = {b0, b1};
  std::vector<char> checked = poison, trusted = poison;
  ASSERT_TRUE(FillStepInputs(l, route, seqs, tokens, blocks, 16, checked.data()).ok());
  ASSERT_TRUE(
      FillStepInputs(l, route, seqs, tokens, blocks, 16, trusted.data(), StepIds::kCheckedByCaller)
          .ok());
  EXPECT_TRUE(checked == trusted);
  EXPECT_EQ(reinterpret_cast<const int32_t*>(trusted.data() + l.token_ids)[2], 13);
  // Everything but the ids is still checked, before any write: a token count off by one.
  const std::vector<int32_t> short_t0 = {11};
  tokens = {short_t0, t1};
  blob = poison;
  status = FillStepInputs(l, route, seqs, tokens, blocks, 16, blob.data(),
                          StepIds::kCheckedByCaller);
  EXPECT_THAT(std::string(status.message()), HasSubstr("Sequence 0 has 1 tokens but q_len 2"));
  EXPECT_TRUE(blob == poison) << "a refused fill wrote into the blob";
}

constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();

// Limits and capture lists of every kind, extremes included: Create refuses exactly the limits
// that are not positive or have fewer tokens than sequences, and lists above their limit, and
// names the values.
TEST(StepKeysTest, CreateSweepRefusesBadLimitsByName) {
  std::mt19937 rng(7);
  const int values[] = {kMin32, -1, 0, 1, 2, 3, 8, 100, 1 << 16, kMax32};
  int refused = 0, created = 0;
  for (int seqs : values) {
    for (int tokens : values) {
      const StepLimits limits{seqs, tokens};
      const bool valid = seqs >= 1 && tokens >= seqs;
      absl::StatusOr<StepKeys> keys = StepKeys::Create(limits, nullptr, nullptr);
      ASSERT_EQ(keys.ok(), valid) << seqs << " " << tokens << ": " << keys.status();
      if (!valid) {
        ++refused;
        EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(
            std::string(keys.status().message()),
            HasSubstr(absl::StrCat("max_num_seqs ", seqs, " and max_num_batched_tokens ", tokens)));
        continue;
      }
      ++created;
      ASSERT_EQ(keys->keys().size(), 1u);  // the eager key alone
      EXPECT_EQ(keys->key(keys->eager_index()).max_tokens, tokens);
      EXPECT_EQ(keys->key(keys->eager_index()).max_rows, seqs);
      // Capture lists up to kMaxLimit, against these limits.
      for (int round = 0; round < 3; ++round) {
        const int decode_max = 2 + static_cast<int>(rng() % 300);  // {1, 1} is a duplicate
        const int prefill_max = 1 + static_cast<int>(rng() % 3000);
        absl::StatusOr<CaptureSizes> decode = CaptureSizes::FromList({1, decode_max}, kMax32, "d");
        absl::StatusOr<CaptureSizes> prefill = CaptureSizes::FromList({prefill_max}, kMax32, "p");
        ASSERT_TRUE(decode.ok() && prefill.ok());
        absl::StatusOr<StepKeys> with = StepKeys::Create(limits, &*decode, &*prefill);
        if (decode->max_size() > seqs) {
          ASSERT_FALSE(with.ok());
          EXPECT_THAT(std::string(with.status().message()),
                      HasSubstr(absl::StrCat("Decode capture size ", decode->max_size(),
                                             " exceeds max_num_seqs ", seqs)));
        } else if (prefill_max > tokens) {
          ASSERT_FALSE(with.ok());
          EXPECT_THAT(std::string(with.status().message()),
                      HasSubstr(absl::StrCat("Prefill capture size ", prefill_max,
                                             " exceeds max_num_batched_tokens ", tokens)));
        } else {
          ASSERT_TRUE(with.ok()) << with.status();
          EXPECT_EQ(with->keys().size(), decode->sizes().size() + 2);
        }
      }
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(created, 0);
}

struct KeysSetup {
  StepLimits limits;
  std::vector<int> decode;   // empty: no decode keys; {0}: the default list
  std::vector<int> prefill;  // likewise
};

struct BuiltKeys {
  std::optional<CaptureSizes> decode, prefill;
  StepKeys keys;
};

BuiltKeys Build(const KeysSetup& setup) {
  auto sizes = [](const std::vector<int>& list, int limit,
                  bool is_decode) -> std::optional<CaptureSizes> {
    if (list.empty()) return std::nullopt;
    absl::StatusOr<CaptureSizes> s =
        list == std::vector<int>{0}
            ? (is_decode ? CaptureSizes::Decode(limit) : CaptureSizes::Prefill(limit))
            : CaptureSizes::FromList(list, limit, is_decode ? "max_num_seqs" : "max_tokens");
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  };
  BuiltKeys b{sizes(setup.decode, setup.limits.max_num_seqs, true),
              sizes(setup.prefill, setup.limits.max_num_batched_tokens, false), StepKeys()};
  absl::StatusOr<StepKeys> keys = StepKeys::Create(setup.limits, b.decode ? &*b.decode : nullptr,
                                                   b.prefill ? &*b.prefill : nullptr);
  EXPECT_TRUE(keys.ok()) << keys.status();
  b.keys = *keys;
  return b;
}

const std::vector<KeysSetup>& Setups() {
  static const auto* setups = new std::vector<KeysSetup>{
      {{1, 1}, {0}, {0}},
      {{1, 16}, {0}, {0}},
      {{3, 5}, {2}, {3, 5}},
      {{8, 8}, {0}, {0}},
      {{8, 40}, {1, 3, 8}, {7, 40}},
      {{64, 1024}, {0}, {0}},
      {{256, 8192}, {0}, {16, 64, 512}},
      {{100, 100}, {}, {0}},
      {{64, 1024}, {0}, {}},
      {{kMax32, kMax32}, {}, {}},
      {{kMax32, kMax32}, {1, 2, 3}, {5, 1000}},
      {{1 << 16, 1 << 16}, {0}, {0}},
  };
  return *setups;
}

// Random and adversarial batches (no sequences, more than max_num_seqs, q_len of 0, negative or
// INT32_MAX, kv_len below q_len, negative or INT32_MAX, token totals past max_num_batched_tokens
// and past INT32_MAX) against every kind of key set. Check refuses exactly what a reference
// refuses, naming the sequence and value; Route never reads outside its tables or overflows
// (it used to index its prefill table with a negative token count), and for every batch Check
// accepts it picks the smallest key that holds the batch.
TEST(StepKeysTest, AdversarialBatchesCheckAndRouteSafely) {
  constexpr int kBatchesPerSetup = 2500;
  int accepted = 0, refused = 0, eager = 0, graphed = 0;
  for (size_t setup_index = 0; setup_index < Setups().size(); ++setup_index) {
    const KeysSetup& setup = Setups()[setup_index];
    const StepLimits& limits = setup.limits;
    SCOPED_TRACE(
        absl::StrCat("limits ", limits.max_num_seqs, " / ", limits.max_num_batched_tokens));
    const BuiltKeys built = Build(setup);
    const StepKeys& keys = built.keys;
    std::mt19937 rng(99 + static_cast<uint32_t>(setup_index));
    auto pick = [&rng](int64_t n) {
      return static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    };
    const int64_t seq_cap = std::min<int64_t>(limits.max_num_seqs, 300);
    for (int b = 0; b < kBatchesPerSetup; ++b) {
      int64_t n = 0;
      switch (pick(6)) {
        case 0:
          n = pick(4) == 0 ? 0 : 1;
          break;
        case 1:
          n = seq_cap;
          break;
        case 2:
          n = std::min<int64_t>(seq_cap + 1, limits.max_num_seqs + int64_t{1});
          break;
        default:
          n = 1 + pick(seq_cap);
      }
      const int kind = static_cast<int>(pick(3));  // decode, mixed, adversarial
      const int64_t per_seq =
          std::max<int64_t>(1, limits.max_num_batched_tokens / std::max<int64_t>(n, 1));
      std::vector<SeqLens> seqs;
      for (int64_t i = 0; i < n; ++i) {
        int64_t q = 1;
        if (kind == 1 && pick(2) == 0) q = 1 + pick(std::min<int64_t>(per_seq, 5000));
        if (kind == 2) {
          const int64_t odd[] = {1,
                                 0,
                                 -1,
                                 kMin32,
                                 kMax32,
                                 limits.max_num_batched_tokens,
                                 limits.max_num_batched_tokens + int64_t{1},
                                 1 + pick(per_seq)};
          q = odd[pick(8)];
        }
        int64_t kv = q + pick(5000);
        if (kind == 2 && pick(3) == 0) {
          const int64_t odd[] = {q - 1, 0, -1, kMin32, kMax32, q};
          kv = odd[pick(6)];
        }
        seqs.push_back({static_cast<int32_t>(std::clamp<int64_t>(q, kMin32, kMax32)),
                        static_cast<int32_t>(std::clamp<int64_t>(kv, kMin32, kMax32))});
      }

      // The reference Check.
      std::string text;
      int64_t tokens = 0;
      if (seqs.empty()) {
        text = "no sequences";
      } else if (static_cast<int64_t>(seqs.size()) > limits.max_num_seqs) {
        text = absl::StrCat("above max_num_seqs ", limits.max_num_seqs);
      } else {
        for (size_t i = 0; i < seqs.size() && text.empty(); ++i) {
          if (seqs[i].q_len < 1) {
            text = absl::StrCat("Sequence ", i, " of the step brings ", seqs[i].q_len);
          } else if (seqs[i].kv_len < seqs[i].q_len) {
            text = absl::StrCat("Sequence ", i, " of the step has kv_len ", seqs[i].kv_len,
                                " below its q_len ", seqs[i].q_len);
          }
          tokens += seqs[i].q_len;
        }
        if (text.empty() && tokens > limits.max_num_batched_tokens) {
          text = absl::StrCat("The step has ", tokens, " tokens, above max_num_batched_tokens ",
                              limits.max_num_batched_tokens);
        }
      }
      const absl::Status check = keys.Check(seqs);
      const StepRoute route = keys.Route(seqs);  // defined for any batch, checked or not
      ASSERT_GE(route.key_index, 0) << "batch " << b;
      ASSERT_LT(route.key_index, static_cast<int>(keys.keys().size())) << "batch " << b;
      ASSERT_GE(route.num_tokens, 0) << "batch " << b;
      ASSERT_GE(route.num_rows, 0) << "batch " << b;
      if (!text.empty()) {
        ++refused;
        ASSERT_EQ(check.code(), absl::StatusCode::kInvalidArgument) << "batch " << b;
        ASSERT_THAT(std::string(check.message()), HasSubstr(text)) << "batch " << b;
        continue;
      }
      ASSERT_TRUE(check.ok()) << "batch " << b << ": " << check;
      ++accepted;
      const int num = static_cast<int>(n);
      const bool decode_only =
          std::all_of(seqs.begin(), seqs.end(), [](const SeqLens& s) { return s.q_len == 1; });
      const StepKey& key = keys.key(route.key_index);
      std::optional<int> padded;
      if (decode_only && built.decode) padded = built.decode->PaddedSize(num);
      if (!decode_only && built.prefill)
        padded = built.prefill->PaddedSize(static_cast<int>(tokens));
      if (!padded) {
        ++eager;
        ASSERT_EQ(route.key_index, keys.eager_index()) << "batch " << b;
        ASSERT_EQ(route.num_tokens, tokens) << "batch " << b;
        ASSERT_EQ(route.num_rows, num) << "batch " << b;
        continue;
      }
      ++graphed;
      ASSERT_FALSE(key.eager_only) << "batch " << b;
      ASSERT_EQ(key.key,
                (CaptureKey{decode_only ? GraphMode::kDecode : GraphMode::kPrefill, *padded}))
          << "batch " << b;
      ASSERT_EQ(route.num_tokens, key.max_tokens);
      ASSERT_EQ(route.num_rows, key.max_rows);
      ASSERT_GE(route.num_tokens, tokens) << "batch " << b;
      ASSERT_GE(route.num_rows, num) << "batch " << b;
      if (decode_only) {
        ASSERT_LE(key.min_rows, num) << "batch " << b;
      }
    }
  }
  std::cout << "batches accepted " << accepted << " (graph keys " << graphed << ", eager " << eager
            << "), refused " << refused << "\n";
  EXPECT_EQ(accepted + refused, static_cast<int>(Setups().size()) * kBatchesPerSetup);
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 1000);
  EXPECT_GT(eager, 100);
  EXPECT_GT(graphed, 1000);
}

// A kiln model has at least one KV head, but PlannerOptionsFor used to divide by the count
// before anything checked it (a zero killed the process). Now the planner refuses it.
TEST(StepPlanTest, PlannerOptionsForZeroKvHeadsIsRefusedByThePlanner) {
  Fixture f;
  const StepKey& d = f.keys.key(f.keys.Find({GraphMode::kDecode, 8}));
  for (int kv_heads : {0, -1, kMin32}) {
    for (int q_heads : {32, 0, kMin32}) {
      const SplitKvPlannerOptions o = PlannerOptionsFor(d, q_heads, kv_heads, 64, 132, 4096);
      absl::StatusOr<SplitKvPlanner> planner = SplitKvPlanner::Create(o);
      ASSERT_FALSE(planner.ok());
      EXPECT_EQ(planner.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(planner.status().message()), HasSubstr("Planner"));
    }
  }
}

// What FillStepInputs must do, written out plainly: refuse (and leave `blob` alone) or write
// the expected bytes into `want`.
struct FillCase {
  MetadataLayout layout;
  StepRoute route;
  std::vector<SeqLens> seqs;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int32_t>> blocks;
  int block_size = 16;
  bool null_blob = false;
  bool drop_token_list = false;
  bool drop_block_list = false;
};

bool ReferenceValid(const FillCase& c) {
  const size_t n = c.seqs.size();
  if (c.drop_token_list || c.drop_block_list || c.block_size < 1 || c.null_blob) return false;
  const StepRoute& r = c.route;
  if (r.num_tokens < 0 || r.num_rows < 0 || r.num_tokens > c.layout.max_tokens ||
      r.num_rows > c.layout.max_rows || static_cast<int64_t>(n) > r.num_rows) {
    return false;
  }
  int64_t rows = 0;
  for (size_t i = 0; i < n; ++i) {
    const SeqLens& s = c.seqs[i];
    if (s.q_len < 1 || s.kv_len < s.q_len) return false;
    if (c.tokens[i].size() != static_cast<size_t>(s.q_len)) return false;
    for (int32_t t : c.tokens[i]) {
      if (t < 0) return false;
    }
    rows += s.q_len;
    if (rows > r.num_tokens) return false;
    const int64_t needed = (int64_t{s.kv_len} + c.block_size - 1) / c.block_size;
    const int64_t have = static_cast<int64_t>(c.blocks[i].size());
    if (have < needed || have > c.layout.max_blocks_per_seq) return false;
    for (int32_t b : c.blocks[i]) {
      if (b < 0) return false;
    }
  }
  return true;
}

void ReferenceFill(const FillCase& c, std::vector<char>* blob) {
  auto at = [blob](size_t offset, int64_t index) {
    return reinterpret_cast<int32_t*>(blob->data() + offset) + index;
  };
  int64_t row = 0;
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    for (int32_t j = 0; j < c.seqs[i].q_len; ++j) {
      *at(c.layout.token_ids, row) = c.tokens[i][j];
      *at(c.layout.positions, row) = c.seqs[i].kv_len - c.seqs[i].q_len + j;
      ++row;
    }
    *at(c.layout.last_token_rows, static_cast<int64_t>(i)) = static_cast<int32_t>(row - 1);
    for (int64_t k = 0; k < c.layout.max_blocks_per_seq; ++k) {
      *at(c.layout.block_table, static_cast<int64_t>(i) * c.layout.max_blocks_per_seq + k) =
          k < static_cast<int64_t>(c.blocks[i].size()) ? c.blocks[i][k] : -1;
    }
  }
  for (int64_t t = row; t < c.route.num_tokens; ++t) {
    *at(c.layout.token_ids, t) = -1;
    *at(c.layout.positions, t) = 0;
  }
  for (int64_t r = static_cast<int64_t>(c.seqs.size()); r < c.layout.max_rows; ++r) {
    *at(c.layout.last_token_rows, r) = -1;
  }
}

// Random steps under every kind of key, each filled as built and then with one input spoiled:
// sequences with no token, kv_len below q_len (negative positions), near INT32_MAX, token or
// block lists one short or one long, negative token and block ids, routes of negative size,
// beyond the layout or too small for the tokens, block sizes of 0, negative or INT32_MAX, lists
// that disagree in count, a null blob. An accepted fill writes exactly what the reference does
// (the plan, the alignment gaps and the rows past the step keep their poison); a refused one
// is InvalidArgument and leaves the blob byte for byte as it was.
TEST(StepPlanTest, FillSweepMatchesAReferenceAndRefusalsWriteNothing) {
  constexpr int kStepsPerSetup = 1200;
  int filled = 0, refused = 0, trusted_fills = 0;
  const std::vector<KeysSetup> setups = {
      {{1, 1}, {0}, {0}}, {{8, 40}, {1, 3, 8}, {7, 40}}, {{64, 1024}, {0}, {0}}};
  for (size_t setup_index = 0; setup_index < setups.size(); ++setup_index) {
    const BuiltKeys built = Build(setups[setup_index]);
    const StepKeys& keys = built.keys;
    const StepLimits& limits = setups[setup_index].limits;
    std::mt19937 rng(2024 + static_cast<uint32_t>(setup_index));
    auto pick = [&rng](int64_t n) {
      return static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    };
    for (int step = 0; step < kStepsPerSetup; ++step) {
      FillCase c;
      const int block_sizes[] = {1, 2, 16, 64, 1000};
      c.block_size = block_sizes[pick(5)];
      // A batch within the limits: decodes, or a mix, at times max_num_seqs sequences or one
      // chunk of up to max_num_batched_tokens.
      const int64_t n = pick(8) == 0 ? limits.max_num_seqs
                                     : 1 + pick(std::min<int64_t>(limits.max_num_seqs, 24));
      int64_t budget = limits.max_num_batched_tokens - n;  // beyond one token each
      const bool decode_only = pick(3) == 0;
      const bool big_chunk = pick(6) == 0;
      for (int64_t i = 0; i < n; ++i) {
        int64_t q = 1;
        if (!decode_only && budget > 0 && pick(2) == 0) {
          const int64_t extra = pick((big_chunk ? budget : std::min<int64_t>(budget, 200)) + 1);
          q += extra;
          budget -= extra;
        }
        const int64_t cached =
            pick(4) == 0 ? 0 : pick(300 / c.block_size + 2) * c.block_size - pick(2);
        c.seqs.push_back(
            {static_cast<int32_t>(q), static_cast<int32_t>(q + std::max<int64_t>(cached, 0))});
      }
      c.route = keys.Route(c.seqs);
      ASSERT_TRUE(keys.Check(c.seqs).ok());
      int64_t most_blocks = 0;
      for (const SeqLens& s : c.seqs) {
        most_blocks = std::max<int64_t>(most_blocks, (s.kv_len + c.block_size - 1) / c.block_size);
      }
      c.layout = MetadataLayout::Create(keys.key(c.route.key_index), /*plan_bytes=*/pick(700),
                                        static_cast<int>(most_blocks + pick(3)));
      for (const SeqLens& s : c.seqs) {
        std::vector<int32_t> t(s.q_len);
        for (int32_t& x : t) x = pick(50) == 0 ? kMax32 : static_cast<int32_t>(pick(128256));
        c.tokens.push_back(t);
        const int64_t needed = (s.kv_len + c.block_size - 1) / c.block_size;
        std::vector<int32_t> bl(needed + pick(c.layout.max_blocks_per_seq - needed + 1));
        for (int32_t& x : bl) x = pick(20) == 0 ? kMax32 : static_cast<int32_t>(pick(1 << 20));
        c.blocks.push_back(bl);
      }
      // Spoil one input, most of the time.
      const size_t j = static_cast<size_t>(pick(n));
      SeqLens& sj = c.seqs[j];
      switch (pick(16)) {
        case 0: {
          const int32_t odd[] = {0, -1, kMin32};
          sj.q_len = odd[pick(3)];
          break;
        }
        case 1: {
          const int32_t odd[] = {sj.q_len - 1, 0, -1, kMin32};
          sj.kv_len = odd[pick(4)];
          break;
        }
        case 2:
          sj.kv_len = kMax32;
          break;
        case 3:
          if (pick(2) == 0 && !c.tokens[j].empty())
            c.tokens[j].pop_back();
          else
            c.tokens[j].push_back(5);
          break;
        case 4:
          c.tokens[j][pick(c.tokens[j].size())] = pick(2) == 0 ? -1 : kMin32;
          break;
        case 5:
          if (!c.blocks[j].empty()) c.blocks[j].pop_back();
          break;
        case 6:
          c.blocks[j].resize(c.layout.max_blocks_per_seq + 1 + pick(3), 3);
          break;
        case 7:
          if (!c.blocks[j].empty())
            c.blocks[j][pick(c.blocks[j].size())] = pick(2) == 0 ? -1 : kMin32;
          break;
        case 8: {
          const int odd[] = {-1, kMin32, c.layout.max_tokens + 1, c.route.num_tokens - 1, kMax32};
          c.route.num_tokens = odd[pick(5)];
          break;
        }
        case 9: {
          const int odd[] = {-1, static_cast<int>(n) - 1, c.layout.max_rows + 1, kMin32};
          c.route.num_rows = odd[pick(4)];
          break;
        }
        case 10: {
          const int odd[] = {0, -1, kMin32, kMax32, c.block_size * 2};
          c.block_size = odd[pick(5)];
          break;
        }
        case 11:
          if (pick(2) == 0)
            c.drop_token_list = true;
          else
            c.drop_block_list = true;
          break;
        case 12:
          c.null_blob = true;
          break;
        default:
          break;  // as built
      }
      std::vector<absl::Span<const int32_t>> tokens(c.tokens.begin(), c.tokens.end());
      std::vector<absl::Span<const int32_t>> blocks(c.blocks.begin(), c.blocks.end());
      if (c.drop_token_list) tokens.pop_back();
      if (c.drop_block_list) blocks.pop_back();
      std::vector<char> blob(c.layout.bytes);
      // Poison: never 0x00 or 0xFF, so neither a 0 position nor a -1 padding word is there
      // before the fill writes it.
      const char poisons[] = {0x5a, 0x11, static_cast<char>(0xa5)};
      std::fill(blob.begin(), blob.end(), poisons[pick(3)]);
      const std::vector<char> before = blob;
      const absl::Status status = FillStepInputs(c.layout, c.route, c.seqs, tokens, blocks,
                                                 c.block_size, c.null_blob ? nullptr : blob.data());
      // A caller that refused negative ids itself (StepIds::kCheckedByCaller) gets the same
      // verdict and the same bytes for every step without one: every other check stays.
      bool negative_id = false;
      for (const auto& list : {c.tokens, c.blocks}) {
        for (const std::vector<int32_t>& ids : list) {
          negative_id = negative_id || std::any_of(ids.begin(), ids.end(),
                                                   [](int32_t id) { return id < 0; });
        }
      }
      if (!negative_id) {
        std::vector<char> trusted = before;
        const absl::Status trusted_status =
            FillStepInputs(c.layout, c.route, c.seqs, tokens, blocks, c.block_size,
                           c.null_blob ? nullptr : trusted.data(), StepIds::kCheckedByCaller);
        ASSERT_EQ(trusted_status, status) << "step " << step;
        ASSERT_TRUE(trusted == blob) << "step " << step << ": kCheckedByCaller wrote other bytes";
        ++trusted_fills;
      }
      if (!ReferenceValid(c)) {
        ++refused;
        ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
            << "step " << step << ": " << status;
        ASSERT_FALSE(status.message().empty());
        ASSERT_TRUE(blob == before)
            << "step " << step << ": a refused fill wrote into the blob (" << status << ")";
        continue;
      }
      ++filled;
      ASSERT_TRUE(status.ok()) << "step " << step << ": " << status;
      std::vector<char> want = before;
      ReferenceFill(c, &want);
      ASSERT_TRUE(blob == want) << "step " << step << ": the blob differs from the reference";
    }
  }
  std::cout << "steps filled " << filled << ", refused " << refused << "\n";
  EXPECT_EQ(filled + refused, 3 * kStepsPerSetup);
  EXPECT_GT(trusted_fills, 3 * kStepsPerSetup * 3 / 4);
  EXPECT_GT(filled, 600);
  EXPECT_GT(refused, 1500);
}

}  // namespace
}  // namespace kiln
