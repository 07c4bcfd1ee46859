#include "runtime/runner/step_plan.h"

#include <cstring>
#include <vector>

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

}  // namespace
}  // namespace kiln
