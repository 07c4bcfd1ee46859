// The TMA GEMM against a CPU float64 product: row counts on both sides of each padding (16, 32,
// 64), shapes whose n is not a multiple of the 64-row tile and whose k is not a multiple of the
// 64-k piece, one and several k slices, rings that are refilled and rings that hold a whole
// slice; the 1B model's projections with the chosen configurations; two launches back to back
// where the second reads the first's output (the programmatic-launch wait); graph replay equal
// to eager and repeats equal bit for bit; SiLU·mul in the epilogue against the plain GEMM followed
// by the SiLU·mul kernel (bit for bit) and against float64; unsupported shapes refused. The
// configuration choice is checked without a GPU.
#include "runtime/model/tma_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/bf16.h"
#include "runtime/model/internal/gpu_test_helpers.h"
#include "runtime/model/silu_mul.h"

namespace kiln {
namespace {

using testing_internal::Bf16ToDouble;
using testing_internal::CaptureAndReplay;
using testing_internal::DeviceVector;
using testing_internal::ExpectSiluMulOutput;
using testing_internal::GemmProduct;
using testing_internal::GpuTest;
using testing_internal::RelativeError;
using testing_internal::SiluMulOfProduct;

constexpr int kSmCount = 132;
// One rounding of y to bf16.
constexpr double kTolerance = 6e-3;

// Device buffers of one shape.
class Problem {
 public:
  Problem(int max_m, int n, int k)
      : n_(n),
        k_(k),
        x_(static_cast<size_t>(max_m) * k),
        w_(static_cast<size_t>(n) * k),
        y_(static_cast<size_t>(max_m) * n) {}

  TmaGemmArgs Args(int m) const {
    TmaGemmArgs a;
    a.x = reinterpret_cast<const __nv_bfloat16*>(x_.get());
    a.w = reinterpret_cast<const __nv_bfloat16*>(w_.get());
    a.y = reinterpret_cast<__nv_bfloat16*>(y_.get());
    a.m = m;
    a.n = n_;
    a.k = k_;
    return a;
  }


  // Returns y [m, n] as float64 (poisoned elements are NaN).
  std::vector<double> Output(int m, cudaStream_t stream) const {
    std::vector<uint16_t> y = y_.Download(stream);
    y.resize(static_cast<size_t>(m) * n_);
    return Bf16ToDouble(y);
  }

  DeviceVector<uint16_t>& x() { return x_; }
  DeviceVector<uint16_t>& w() { return w_; }
  DeviceVector<uint16_t>& y() { return y_; }

 private:
  int n_, k_;
  DeviceVector<uint16_t> x_, w_, y_;
};

class TmaGemmGpuTest : public GpuTest {
 protected:
  // Runs `config` (poisoned output first) and returns the relative error against `ref`.
  double Check(Problem& problem, const TmaGemmArgs& args, const TmaGemmConfig& config,
               const std::vector<double>& ref) {
    problem.y().Poison(stream());
    EXPECT_TRUE(TmaGemmSupports(args, config)) << config.ToString();
    EXPECT_EQ(LaunchTmaGemm(args, config, stream()), cudaSuccess) << config.ToString();
    return RelativeError(problem.Output(args.m, stream()), ref);
  }
};

TEST_F(TmaGemmGpuTest, EdgeShapesMatchFloat64) {
  struct Shape {
    int n, k;
  };
  // k = 8: one partial piece; k = 200: three pieces and a partial one; k = 2056: 32 pieces and
  // 8 k; n = 100, 333 and 17: partial tiles (and fewer rows than one tile).
  for (const Shape& s : {Shape{64, 64}, Shape{17, 8}, Shape{100, 200}, Shape{333, 2056}}) {
    Problem problem(kTmaGemmMaxRows, s.n, s.k);
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(s.n) * s.k);
    problem.w().Upload(w, stream());
    const int pieces = (s.k + kTmaGemmStageK - 1) / kTmaGemmStageK;
    for (int m : {1, 9, 16, 17, 31, 32, 33, 64}) {
      const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * s.k, -3.f, 3.f);
      problem.x().Upload(x, stream());
      const std::vector<double> ref = GemmProduct(Bf16ToDouble(x), w, m, s.n, s.k);
      const TmaGemmConfig chosen = ChooseTmaGemmConfig(m, s.n, s.k, kSmCount);
      // The chosen configuration, one slice through one slot (every piece waits for its copy),
      // three slices through two slots, and the most slices with one slot each.
      for (const TmaGemmConfig& config :
           {chosen, TmaGemmConfig{1, 1}, TmaGemmConfig{std::min(pieces, 3), 2},
            TmaGemmConfig{std::min(pieces, kTmaGemmMaxSplits), 1}}) {
        SCOPED_TRACE(::testing::Message() << "n=" << s.n << " k=" << s.k << " m=" << m << " "
                                          << config.ToString());
        EXPECT_LT(Check(problem, problem.Args(m), config, ref), kTolerance);
      }
    }
  }
}

TEST_F(TmaGemmGpuTest, ModelShapesWithChosenConfigsMatchFloat64) {
  struct Shape {
    int n, k;
  };
  // The 1B model's QKV, O, gate-up and down projections.
  for (const Shape& s : {Shape{3072, 2048}, Shape{2048, 2048}, Shape{16384, 2048},
                         Shape{2048, 8192}}) {
    Problem problem(kTmaGemmMaxRows, s.n, s.k);
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(s.n) * s.k);
    problem.w().Upload(w, stream());
    for (int m : {9, 24, 32, 64}) {
      const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * s.k, -3.f, 3.f);
      problem.x().Upload(x, stream());
      const std::vector<double> want = GemmProduct(Bf16ToDouble(x), w, m, s.n, s.k);
      // The shape's own choice, and with at most 4 and 3 slices (limits the step has used for QKV).
      for (int max_splits : {kTmaGemmMaxSplits, 4, 3}) {
        const TmaGemmConfig config = ChooseTmaGemmConfig(m, s.n, s.k, kSmCount, 2, max_splits);
        SCOPED_TRACE(::testing::Message() << "n=" << s.n << " k=" << s.k << " m=" << m << " "
                                          << config.ToString());
        EXPECT_LT(Check(problem, problem.Args(m), config, want), kTolerance);
      }
    }
  }
}

TEST_F(TmaGemmGpuTest, SecondLaunchReadsTheFirstOnesOutput) {
  // y1 = x · W1ᵀ, then y2 = y1 · W2ᵀ, enqueued back to back (the second's weights stream in
  // while the first runs; it must read y1 only after the first completes). y1 is poisoned
  // first: a read before the first kernel's writes would make y2 NaN.
  const int m = 32, k = 2048, n1 = 2048, n2 = 3072;
  Problem first(m, n1, k), second(m, n2, n1);
  const std::vector<uint16_t> w1 = RandomBf16(static_cast<size_t>(n1) * k);
  const std::vector<uint16_t> w2 = RandomBf16(static_cast<size_t>(n2) * n1);
  first.w().Upload(w1, stream());
  second.w().Upload(w2, stream());
  for (int round = 0; round < 4; ++round) {
    first.x().Upload(RandomBf16(static_cast<size_t>(m) * k), stream());
    first.y().Poison(stream());
    second.y().Poison(stream());
    TmaGemmArgs a = first.Args(m);
    TmaGemmArgs b = second.Args(m);
    b.x = reinterpret_cast<const __nv_bfloat16*>(first.y().get());
    // One CTA per SM (the second launch's CTAs fit beside the first's), then two; the second
    // launch let in at the first's start, then only after the first's wait.
    const int per_sm = round % 2 == 0 ? 1 : 2;
    a.next_after_wait = round >= 2;
    ASSERT_EQ(LaunchTmaGemm(a, ChooseTmaGemmConfig(m, n1, k, kSmCount, per_sm), stream()),
              cudaSuccess);
    ASSERT_EQ(LaunchTmaGemm(b, ChooseTmaGemmConfig(m, n2, n1, kSmCount, per_sm), stream()),
              cudaSuccess);
    std::vector<uint16_t> y1 = first.y().Download(stream());
    y1.resize(static_cast<size_t>(m) * n1);
    for (uint16_t v : y1) ASSERT_TRUE(std::isfinite(Bf16BitsToFloat(v)));
    EXPECT_LT(RelativeError(second.Output(m, stream()),
                            GemmProduct(Bf16ToDouble(y1), w2, m, n2, n1)),
              kTolerance)
        << "round " << round;
  }
}

TEST_F(TmaGemmGpuTest, GraphReplayAndRepeatsAreBitwiseEqual) {
  struct Shape {
    int n, k;
  };
  // QKV (several slices: the sum over slices has a fixed order) and gate-up (one slice).
  for (const Shape& s : {Shape{3072, 2048}, Shape{16384, 2048}}) {
    Problem problem(kTmaGemmMaxRows, s.n, s.k);
    problem.w().Upload(RandomBf16(static_cast<size_t>(s.n) * s.k), stream());
    ASSERT_EQ(PrepareTmaGemm(), cudaSuccess);
    for (int m : {16, 32}) {
      problem.x().Upload(RandomBf16(static_cast<size_t>(m) * s.k), stream());
      const TmaGemmConfig config = ChooseTmaGemmConfig(m, s.n, s.k, kSmCount);
      SCOPED_TRACE(::testing::Message() << "n=" << s.n << " m=" << m << " "
                                        << config.ToString());
      const TmaGemmArgs args = problem.Args(m);
      problem.y().Poison(stream());
      ASSERT_EQ(LaunchTmaGemm(args, config, stream()), cudaSuccess);
      const std::vector<uint16_t> eager = problem.y().Download(stream());
      problem.y().Poison(stream());
      ASSERT_EQ(LaunchTmaGemm(args, config, stream()), cudaSuccess);
      const std::vector<uint16_t> again = problem.y().Download(stream());
      // Where the next kernel may launch changes nothing in y.
      TmaGemmArgs late = args;
      late.next_after_wait = true;
      problem.y().Poison(stream());
      ASSERT_EQ(LaunchTmaGemm(late, config, stream()), cudaSuccess);
      const std::vector<uint16_t> after_wait = problem.y().Download(stream());

      problem.y().Poison(stream());
      ASSERT_NO_FATAL_FAILURE(CaptureAndReplay(
          stream(), 3, 3, [&] { return LaunchTmaGemm(args, config, stream()); }));
      const std::vector<uint16_t> replayed = problem.y().Download(stream());

      const size_t bytes = static_cast<size_t>(m) * s.n * sizeof(uint16_t);
      for (double v : problem.Output(m, stream())) ASSERT_TRUE(std::isfinite(v));
      EXPECT_EQ(std::memcmp(eager.data(), again.data(), bytes), 0);
      EXPECT_EQ(std::memcmp(eager.data(), after_wait.data(), bytes), 0);
      EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), bytes), 0);
    }
  }
}

TEST_F(TmaGemmGpuTest, SiluMulEpilogueGivesTheSiluMulKernelBits) {
  struct Shape {
    int ffn, k;
    std::vector<int> rows;
  };
  // The 1B model's gate-up (256 tiles of one slice), the tiny model's (16 tiles of 4 slices: the
  // cluster's sums), and halves that are not a multiple of the 32 columns a tile takes (the last
  // tile's gate rows run into the up half, its up rows past the end).
  const std::vector<int> all = {1, 9, 16, 17, 33, 64};
  for (const Shape& s : {Shape{8192, 2048, {3, 17, 48}}, Shape{512, 256, all},
                         Shape{40, 200, all}, Shape{100, 2056, all}}) {
    const int n = 2 * s.ffn;
    Problem problem(kTmaGemmMaxRows, n, s.k);
    DeviceVector<uint16_t> fused(static_cast<size_t>(kTmaGemmMaxRows) * s.ffn);
    DeviceVector<uint16_t> chained(static_cast<size_t>(kTmaGemmMaxRows) * s.ffn);
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(n) * s.k);
    problem.w().Upload(w, stream());
    const int pieces = (s.k + kTmaGemmStageK - 1) / kTmaGemmStageK;
    for (int m : s.rows) {
      const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * s.k, -3.f, 3.f);
      problem.x().Upload(x, stream());
      const std::vector<double> want =
          SiluMulOfProduct(GemmProduct(Bf16ToDouble(x), w, m, n, s.k), m, s.ffn);
      for (const TmaGemmConfig& config :
           {ChooseTmaGemmConfig(m, n, s.k, kSmCount), TmaGemmConfig{1, 1},
            TmaGemmConfig{std::min(pieces, 3), 2},
            TmaGemmConfig{std::min(pieces, kTmaGemmMaxSplits), 1}}) {
        SCOPED_TRACE(::testing::Message() << "ffn=" << s.ffn << " k=" << s.k << " m=" << m
                                          << " " << config.ToString());
        // The plain GEMM and the SiLU·mul kernel: the bits to give.
        problem.y().Poison(stream());
        chained.Poison(stream());
        ASSERT_EQ(LaunchTmaGemm(problem.Args(m), config, stream()), cudaSuccess);
        ASSERT_EQ(LaunchSiluMul(reinterpret_cast<const __nv_bfloat16*>(problem.y().get()),
                                reinterpret_cast<__nv_bfloat16*>(chained.get()), m, s.ffn,
                                stream()),
                  cudaSuccess);
        TmaGemmArgs args = problem.Args(m);
        args.y = reinterpret_cast<__nv_bfloat16*>(fused.get());
        args.silu_mul = true;
        fused.Poison(stream());
        ASSERT_TRUE(TmaGemmSupports(args, config));
        ASSERT_EQ(LaunchTmaGemm(args, config, stream()), cudaSuccess);
        // Three roundings to bf16: g, u and the product.
        ExpectSiluMulOutput(fused, chained, m, s.ffn, want, 2 * kTolerance, stream());
      }
    }
  }
}

TEST_F(TmaGemmGpuTest, UnsupportedShapesAreRefused) {
  Problem problem(kTmaGemmMaxRows, 256, 512);
  const TmaGemmConfig ok = ChooseTmaGemmConfig(32, 256, 512, kSmCount);
  ASSERT_GT(ok.splits, 1);
  EXPECT_TRUE(TmaGemmSupports(problem.Args(32), ok));
  TmaGemmArgs args = problem.Args(32);
  args.m = 0;
  EXPECT_FALSE(TmaGemmSupports(args, ok));
  args.m = kTmaGemmMaxRows + 1;
  EXPECT_FALSE(TmaGemmSupports(args, ok));
  args = problem.Args(32);
  args.k = 500;  // not a multiple of 8
  EXPECT_FALSE(TmaGemmSupports(args, ok));
  args = problem.Args(32);
  args.x = reinterpret_cast<const __nv_bfloat16*>(problem.x().get() + 1);  // 2-byte aligned
  EXPECT_FALSE(TmaGemmSupports(args, ok));
  EXPECT_EQ(LaunchTmaGemm(args, ok, stream()), cudaErrorInvalidValue);
  // 448 k is 7 pieces: 8 slices leave one empty.
  args = problem.Args(32);
  args.k = 448;
  EXPECT_TRUE(TmaGemmSupports(args, TmaGemmConfig{7, 1}));
  EXPECT_FALSE(TmaGemmSupports(args, TmaGemmConfig{8, 1}));
  // SiLU·mul needs an even n: a gate half and an up half.
  args = problem.Args(32);
  args.silu_mul = true;
  EXPECT_TRUE(TmaGemmSupports(args, ok));
  args.n = 255;
  EXPECT_FALSE(TmaGemmSupports(args, ok));
  EXPECT_EQ(LaunchTmaGemm(args, ok, stream()), cudaErrorInvalidValue);
  // More slices than a portable cluster holds.
  EXPECT_FALSE(TmaGemmSupports(problem.Args(32), TmaGemmConfig{kTmaGemmMaxSplits + 1, 1}));
  EXPECT_FALSE(TmaGemmSupports(problem.Args(32), TmaGemmConfig{1, 0}));
  EXPECT_FALSE(TmaGemmSupports(problem.Args(32), TmaGemmConfig{1, kTmaGemmMaxStages + 1}));
  EXPECT_EQ(LaunchTmaGemm(problem.Args(32), TmaGemmConfig{1, 0}, stream()),
            cudaErrorInvalidValue);
}

TEST(TmaGemmConfigTest, ChosenConfigsFillTheGpuWithinTheSharedBudget) {
  struct Case {
    int m, n, k;
  };
  // The 1B model's projections at 9–64 rows: two CTAs per SM at most, at least two stages
  // (whole slices where they fit), within the co-resident budget.
  for (const Case& c : {Case{9, 3072, 2048}, Case{32, 3072, 2048}, Case{32, 2048, 2048},
                        Case{32, 16384, 2048}, Case{32, 2048, 8192}, Case{64, 2048, 8192}}) {
    const TmaGemmConfig config = ChooseTmaGemmConfig(c.m, c.n, c.k, kSmCount);
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k << " "
                                      << config.ToString());
    const int tiles = (c.n + kTmaGemmTileRows - 1) / kTmaGemmTileRows;
    EXPECT_LE(tiles * config.splits, 2 * kSmCount);
    EXPECT_GT(tiles * config.splits, kSmCount);
    EXPECT_GE(config.stages, 2);
    EXPECT_LE(TmaGemmSharedBytes(c.m, config.stages), kTmaGemmCoResidentBytes);
  }
  // QKV at 32 rows: 48 tiles × 5 slices of 6–7 pieces, 5 stages of 12 KiB (a cluster's budget).
  EXPECT_EQ(ChooseTmaGemmConfig(32, 3072, 2048, kSmCount).splits, 5);
  EXPECT_EQ(ChooseTmaGemmConfig(32, 3072, 2048, kSmCount).stages, 5);
  // The same with at most 4 slices (the step's default for QKV): 8 pieces each, the same ring.
  const TmaGemmConfig qkv4 = ChooseTmaGemmConfig(32, 3072, 2048, kSmCount, 2, 4);
  EXPECT_EQ(qkv4.splits, 4);
  EXPECT_EQ(qkv4.stages, 5);
  // A limit above the shape's own choice changes nothing; one outside [1, 8] gets no stages.
  EXPECT_EQ(ChooseTmaGemmConfig(32, 2048, 8192, kSmCount, 2, 8).splits, 8);
  EXPECT_EQ(ChooseTmaGemmConfig(32, 16384, 2048, kSmCount, 2, 4).splits, 1);
  EXPECT_EQ(ChooseTmaGemmConfig(32, 3072, 2048, kSmCount, 2, 0).stages, 0);
  EXPECT_EQ(ChooseTmaGemmConfig(32, 3072, 2048, kSmCount, 2, kTmaGemmMaxSplits + 1).stages, 0);
  // Gate-up at 32 rows: 256 tiles, one slice of 32 pieces through 9 stages of 12 KiB.
  EXPECT_EQ(ChooseTmaGemmConfig(32, 16384, 2048, kSmCount).splits, 1);
  EXPECT_EQ(ChooseTmaGemmConfig(32, 16384, 2048, kSmCount).stages, 9);
  // One CTA per SM: the ring may take the whole shared memory.
  const TmaGemmConfig down1 = ChooseTmaGemmConfig(32, 2048, 8192, kSmCount, 1);
  EXPECT_EQ(down1.splits, 4);
  EXPECT_EQ(down1.stages, kTmaGemmMaxStages);
  EXPECT_EQ(TmaGemmPaddedRows(1), 16);
  EXPECT_EQ(TmaGemmPaddedRows(17), 32);
  EXPECT_EQ(TmaGemmPaddedRows(33), 64);
  // Shapes the kernel does not take get no stages.
  EXPECT_EQ(ChooseTmaGemmConfig(65, 2048, 2048, kSmCount).stages, 0);
  EXPECT_EQ(ChooseTmaGemmConfig(32, 2048, 2044, kSmCount).stages, 0);
}

}  // namespace
}  // namespace kiln
