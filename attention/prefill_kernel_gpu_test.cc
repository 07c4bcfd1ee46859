// The prefill kernel against a CPU float64 reference: fresh prompts of many lengths around the
// tile boundaries, cached prefixes (chunked prefill), every dtype / head_dim / tile / group
// configuration, and KV splits whose partials merge back to the reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/attention_params.h"
#include "attention/prefill_kernel.h"
#include "attention/prefill_test_util.h"
#include "attention/split_kv_planner.h"
#include "gtest/gtest.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

using prefill_testing::BatchSizes;
using prefill_testing::DeviceBatch;
using prefill_testing::HostBatch;
using prefill_testing::SeqSpec;
using prefill_testing::Shape;
using prefill_testing::TestPlan;

// bf16 keeps 8 bits of mantissa, fp16 11: P and o are rounded to them.
double Tolerance(AttentionDtype dtype) { return dtype == AttentionDtype::kBf16 ? 1e-2 : 2e-3; }

std::string Describe(const Shape& s) {
  return absl::StrCat(s.dtype == AttentionDtype::kBf16 ? "bf16" : "fp16", " d=", s.head_dim,
                      " T=", s.tile_rows, " heads=", s.num_q_heads, "/", s.num_kv_heads,
                      " block=", s.block_size);
}

uint64_t FreshSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

class PrefillKernelGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPUS(1);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    auto stream = Stream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = std::move(stream).value();
  }

  // Runs one batch with a plan cut at kv_chunk (0: no split) and checks o, every partial slot
  // (o and lse against the reference for its chunk) and the merge of the partials.
  void CheckBatch(const Shape& shape, const std::vector<SeqSpec>& seqs, int kv_chunk = 0,
                  bool extra_empty_chunk = false, float softmax_scale = 0.0f) {
    SCOPED_TRACE(absl::StrCat("kv_chunk=", kv_chunk));
    const TestPlan plan = prefill_testing::BuildPlan(seqs, shape.group(), shape.tile_rows, kv_chunk,
                                                     extra_empty_chunk);
    if (kv_chunk > 0) {
      ASSERT_GT(plan.num_slots, 0) << "the split test must split something";
    }
    CheckPlan(shape, seqs, plan, static_cast<int>(plan.items.size()) + 3, softmax_scale);
  }

  // Plans with the real SplitKvPlanner (prefill part; it splits long tiles over idle SMs) and
  // checks the kernel on its items. Returns the number of split tiles through `merges`.
  void CheckPlannerBatch(const Shape& shape, const std::vector<SeqSpec>& seqs, int sm_count,
                         int* merges) {
    SplitKvPlannerOptions options;
    options.num_q_heads = shape.num_q_heads;
    options.num_kv_heads = shape.num_kv_heads;
    options.head_dim = shape.head_dim;
    options.sm_count = sm_count;
    int tokens = 0, longest = 0;
    for (const SeqSpec& s : seqs) {
      tokens += s.q_len;
      longest = std::max(longest, s.kv_len);
    }
    options.key = {static_cast<int>(seqs.size()) + 2, tokens + 7, longest + 100};
    options.prefill.tile_rows = shape.tile_rows;
    auto planner = SplitKvPlanner::Create(options);
    ASSERT_TRUE(planner.ok()) << planner.status();
    int capacity = 0;
    auto plan = prefill_testing::PlanWithPlanner(*planner, seqs, &capacity);
    ASSERT_TRUE(plan.ok()) << plan.status();
    *merges = static_cast<int>(plan->merges.size());
    CheckPlan(shape, seqs, *plan, capacity, 0.0f);
  }

  // Runs one batch with `plan` padded to `capacity` and checks o, every partial slot (o and lse
  // against the reference for its chunk) and the merge of the partials.
  void CheckPlan(const Shape& shape, const std::vector<SeqSpec>& seqs, const TestPlan& plan,
                 int capacity, float softmax_scale) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat(Describe(shape), " seed=", seed));
    const int group = shape.group();
    const int dim = shape.head_dim;
    // Two spare q/o rows past the batch, and three padding items, must stay untouched.
    int tokens = 0;
    for (const SeqSpec& s : seqs) tokens += s.q_len;
    BatchSizes sizes;
    sizes.num_tokens = tokens + 2;
    const HostBatch batch = prefill_testing::MakeRandomBatch(shape, seqs, seed, sizes);
    auto dev_or = DeviceBatch::Upload(batch, plan, capacity);
    ASSERT_TRUE(dev_or.ok()) << dev_or.status();
    DeviceBatch dev = std::move(dev_or).value();

    PrefillAttentionParams params = dev.Params();
    params.softmax_scale = softmax_scale;
    // Strided variant: q and o live inside wider rows (as in a fused QKV buffer), with the
    // padding between tokens poisoned; o is gathered back into the contiguous buffer afterwards.
    const size_t row_bytes = static_cast<size_t>(shape.num_q_heads) * shape.head_dim * 2;
    const int64_t stride = static_cast<int64_t>(shape.num_q_heads + 2 * shape.num_kv_heads) *
                           shape.head_dim;
    DeviceBuffer q_wide, o_wide;
    if (strided_) {
      auto qw = DeviceBuffer::Allocate(batch.q_rows * stride * 2, "q wide");
      auto ow = DeviceBuffer::Allocate(batch.q_rows * stride * 2, "o wide");
      ASSERT_TRUE(qw.ok() && ow.ok());
      q_wide = std::move(qw).value();
      o_wide = std::move(ow).value();
      // On the kernel's stream: default-stream fills and copies are not ordered with it.
      ASSERT_EQ(cudaMemsetAsync(q_wide.data(), 0xFF, q_wide.size(), stream_.get()), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(o_wide.data(), 0xFF, o_wide.size(), stream_.get()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy2DAsync(q_wide.data(), stride * 2, params.q, row_bytes, row_bytes,
                                  batch.q_rows, cudaMemcpyDeviceToDevice, stream_.get()),
                cudaSuccess);
      params.q = q_wide.data();
      params.q_stride = stride;
      params.o = o_wide.data();
      params.o_stride = stride;
    }
    const absl::Status launched = LaunchPrefillAttention(params, stream_.get());
    ASSERT_TRUE(launched.ok()) << launched;
    ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
    if (strided_) {
      ASSERT_EQ(cudaMemcpy2D(dev.o(), row_bytes, o_wide.data(), stride * 2, row_bytes,
                             batch.q_rows, cudaMemcpyDeviceToDevice),
                cudaSuccess);
      // The padding between the tokens' rows must still hold the poison.
      std::vector<uint16_t> wide(o_wide.size() / 2);
      ASSERT_EQ(cudaMemcpy(wide.data(), o_wide.data(), o_wide.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (int t = 0; t < batch.q_rows; ++t) {
        for (int64_t i = row_bytes / 2; i < stride; ++i) {
          ASSERT_EQ(wide[t * stride + i], 0xFFFF) << "o padding of token " << t << " written";
        }
      }
    }

    auto bits_or = dev.DownloadOutputBits(stream_.get());
    ASSERT_TRUE(bits_or.ok()) << bits_or.status();
    const std::vector<uint16_t>& bits = *bits_or;
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      out[i] = prefill_testing::BitsToFloat(bits[i], shape.dtype);
    }
    const int token_elems = shape.num_q_heads * dim;
    for (size_t i = static_cast<size_t>(tokens) * token_elems; i < bits.size(); ++i) {
      ASSERT_EQ(bits[i], 0xFFFF) << "spare o row element " << i << " was written";
    }

    if (!plan.merges.empty()) {
      auto po_or = dev.DownloadPartialO(stream_.get());
      auto pl_or = dev.DownloadPartialLse(stream_.get());
      ASSERT_TRUE(po_or.ok() && pl_or.ok());
      const std::vector<float>& po = *po_or;
      const std::vector<float>& pl = *pl_or;
      const float tol = static_cast<float>(Tolerance(shape.dtype));
      // Every partial row against the reference of its own chunk.
      std::vector<double> ref_row(dim);
      for (const AttentionWorkItem& item : plan.items) {
        if (item.partial_slot < 0) continue;
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
          for (int row = item.row_begin; row < item.row_end; ++row) {
            const int j = row / group;
            const int h = kv_head * group + row % group;
            const double lse = prefill_testing::ReferenceRow(batch, item.seq, j, h, item.kv_begin,
                                                             item.kv_end, softmax_scale,
                                                             ref_row.data());
            const size_t slot_row =
                (static_cast<size_t>(item.partial_slot) * shape.num_kv_heads + kv_head) *
                    shape.tile_rows +
                (row - item.row_begin);
            if (std::isinf(lse)) {
              ASSERT_TRUE(std::isinf(pl[slot_row]) && pl[slot_row] < 0)
                  << "empty chunk lse " << pl[slot_row] << " at slot row " << slot_row;
              for (int d = 0; d < dim; ++d) ASSERT_EQ(po[slot_row * dim + d], 0.0f);
              continue;
            }
            ASSERT_NEAR(pl[slot_row], lse, 2e-3 + 1e-5 * std::fabs(lse)) << "slot row " << slot_row;
            double err = 0, norm = 0;
            for (int d = 0; d < dim; ++d) {
              const double diff = po[slot_row * dim + d] - ref_row[d];
              err += diff * diff;
              norm += ref_row[d] * ref_row[d];
            }
            ASSERT_TRUE(std::isfinite(err)) << "slot row " << slot_row;
            ASSERT_LT(std::sqrt(err / norm), tol) << "slot row " << slot_row;
          }
        }
      }
      // Split rows are the merge's to write: the kernel must leave them in o untouched, and
      // the CPU merge of the partials must give the reference.
      for (const AttentionMergeItem& m : plan.merges) {
        const int q_start = batch.seq_q_start[m.seq];
        for (int kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
          for (int row = m.row_begin; row < m.row_end; ++row) {
            const int h = kv_head * group + row % group;
            const size_t o_base =
                (static_cast<size_t>(q_start + row / group) * shape.num_q_heads + h) * dim;
            for (int d = 0; d < dim; ++d) ASSERT_EQ(bits[o_base + d], 0xFFFF);
            double max_lse = -std::numeric_limits<double>::infinity();
            for (int i = 0; i < m.num_slots; ++i) {
              const size_t sr =
                  (static_cast<size_t>(m.first_slot + i) * shape.num_kv_heads + kv_head) *
                      shape.tile_rows +
                  (row - m.row_begin);
              max_lse = std::max<double>(max_lse, pl[sr]);
            }
            ASSERT_FALSE(std::isinf(max_lse)) << "a real row saw no key";
            double weight = 0;
            std::vector<double> acc(dim, 0.0);
            for (int i = 0; i < m.num_slots; ++i) {
              const size_t sr =
                  (static_cast<size_t>(m.first_slot + i) * shape.num_kv_heads + kv_head) *
                      shape.tile_rows +
                  (row - m.row_begin);
              const double w = std::exp2(pl[sr] - max_lse);
              weight += w;
              for (int d = 0; d < dim; ++d) acc[d] += w * po[sr * dim + d];
            }
            for (int d = 0; d < dim; ++d) out[o_base + d] = static_cast<float>(acc[d] / weight);
          }
        }
      }
    }

    const std::vector<double> ref = prefill_testing::ReferenceOutput(batch, softmax_scale);
    const double err = prefill_testing::MaxTokenRelativeError(out, ref, tokens, token_elems);
    EXPECT_LT(err, Tolerance(shape.dtype)) << "worst per-token relative error";
  }

  Stream stream_;
  bool strided_ = false;
};

std::vector<SeqSpec> Fresh(const std::vector<int>& lengths) {
  std::vector<SeqSpec> seqs;
  for (int len : lengths) seqs.push_back({len, len});
  return seqs;
}

// Tile boundaries: with G = 4 and T = 128 a query tile holds 32 tokens; KV tiles hold 64 keys.
TEST_F(PrefillKernelGpuTest, FreshPromptsAroundTileBoundaries) {
  Shape shape{AttentionDtype::kBf16, 128, 128, 8, 2, 16};
  CheckBatch(shape,
             Fresh({1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257}));
}

TEST_F(PrefillKernelGpuTest, LongFreshPrompts) {
  Shape shape{AttentionDtype::kBf16, 128, 128, 8, 2, 16};
  CheckBatch(shape, Fresh({4096, 2049, 1000}));
}

TEST_F(PrefillKernelGpuTest, FreshPromptsSmallTilesNoGroup) {
  Shape shape{AttentionDtype::kFp16, 128, 64, 4, 4, 32};
  CheckBatch(shape, Fresh({1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 700}));
}

// Cached prefixes of every alignment: the new tokens start mid-block and mid-tile.
TEST_F(PrefillKernelGpuTest, ChunkedPrefillWithCachedPrefix) {
  Shape shape{AttentionDtype::kBf16, 128, 64, 8, 2, 16};
  CheckBatch(shape, {{1, 2}, {1, 64}, {1, 65}, {64, 127}, {64, 128}, {100, 163}, {257, 321},
                     {31, 531}, {129, 3129}, {16, 3000}});
}

class PrefillConfigGpuTest
    : public PrefillKernelGpuTest,
      public ::testing::WithParamInterface<std::tuple<AttentionDtype, int, int, int>> {};

TEST_P(PrefillConfigGpuTest, MixedLengthsMatchReference) {
  const auto [dtype, head_dim, tile_rows, group] = GetParam();
  Shape shape{dtype, head_dim, tile_rows, 2 * group, 2, 16};
  CheckBatch(shape, {{1, 1}, {1, 300}, {37, 37}, {64, 200}, {129, 192}, {200, 1200}, {3, 90}});
}

INSTANTIATE_TEST_SUITE_P(
    AllConfigs, PrefillConfigGpuTest,
    ::testing::Combine(::testing::Values(AttentionDtype::kBf16, AttentionDtype::kFp16),
                       ::testing::Values(64, 128), ::testing::Values(64, 128),
                       ::testing::Values(1, 5)));

// Split tiles write partials (normalised o + log2-sum-exp) that merge to the reference; chunks
// past a row's causal limit are empty (lse = -inf, o = 0); unsplit tiles still write o.
TEST_F(PrefillKernelGpuTest, SplitKvPartialsMergeToReference) {
  CheckBatch(Shape{AttentionDtype::kBf16, 128, 64, 8, 2, 16},
             {{1, 700}, {100, 500}, {300, 300}, {5, 5}, {64, 1000}}, /*kv_chunk=*/128,
             /*extra_empty_chunk=*/true);
  CheckBatch(Shape{AttentionDtype::kFp16, 64, 128, 10, 2, 16},
             {{1, 700}, {100, 500}, {300, 300}, {5, 5}, {13, 77}}, /*kv_chunk=*/64);
}

// A chunk size that is not a multiple of the 64-key tile: partial tiles at both chunk ends.
TEST_F(PrefillKernelGpuTest, SplitKvUnalignedChunks) {
  CheckBatch(Shape{AttentionDtype::kBf16, 128, 128, 8, 8, 16}, {{40, 1000}, {200, 333}},
             /*kv_chunk=*/100, /*extra_empty_chunk=*/true);
}

// A large softmax scale spreads the scores over tens of powers of two, so the running maximum
// moves by more than the rescale slack often and the lazy-rescale path is exercised.
TEST_F(PrefillKernelGpuTest, WideScoresRescaleExactly) {
  CheckBatch(Shape{AttentionDtype::kBf16, 128, 128, 8, 2, 16}, {{700, 700}, {64, 900}},
             /*kv_chunk=*/0, false, /*softmax_scale=*/1.0f);
  CheckBatch(Shape{AttentionDtype::kFp16, 64, 64, 8, 2, 16}, {{300, 1000}, {100, 100}},
             /*kv_chunk=*/256, false, /*softmax_scale=*/0.7f);
}

// The real planner's items: few long sequences split over the GPU's slots, many short ones not.
TEST_F(PrefillKernelGpuTest, SplitKvPlannerItemsMatchReference) {
  int merges = 0;
  CheckPlannerBatch(Shape{AttentionDtype::kBf16, 128, 128, 8, 2, 16},
                    {{1, 3000}, {40, 2500}, {300, 300}}, /*sm_count=*/132, &merges);
  EXPECT_GT(merges, 0) << "long tiles on an idle GPU should split";
  CheckPlannerBatch(Shape{AttentionDtype::kFp16, 64, 64, 10, 2, 16},
                    {{13, 13}, {13, 900}, {1, 1}, {200, 1200}, {77, 77}}, /*sm_count=*/8, &merges);
}

TEST_F(PrefillKernelGpuTest, StridedQueryAndOutput) {
  strided_ = true;
  CheckBatch(Shape{AttentionDtype::kBf16, 128, 128, 8, 2, 16}, {{100, 400}, {33, 33}, {1, 9}});
  CheckBatch(Shape{AttentionDtype::kFp16, 64, 64, 10, 2, 16}, {{100, 400}, {33, 33}},
             /*kv_chunk=*/128);
}

TEST_F(PrefillKernelGpuTest, LargeBlocksAndOddBlockSize) {
  CheckBatch(Shape{AttentionDtype::kBf16, 128, 128, 8, 2, 128}, {{300, 1000}, {1, 129}, {77, 77}});
  CheckBatch(Shape{AttentionDtype::kFp16, 64, 64, 8, 2, 24}, {{300, 1000}, {1, 129}, {77, 77}});
}

}  // namespace
}  // namespace kiln
