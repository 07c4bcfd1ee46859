// The prefetch GEMM against a CPU float64 product: every row count, plain and SiLU·mul inputs,
// bf16 and float outputs, on shapes whose k is not a multiple of the 1024-k stage (nor of the
// 32-k chunk) and whose n is not a multiple of the 16-row group or of the CTA count, with
// several ring depths and grid sizes; the 1B model's projections with the chosen
// configurations; two launches back to back where the second reads the first's output (the
// programmatic-launch wait); graph replay equal to eager and repeats equal bit for bit;
// unsupported shapes refused. The norm inputs (RMSNorm, residual add + RMSNorm folded into the
// GEMM) against a float64 reference and bit for bit against the norm kernels followed by the
// plain GEMM, with the new residual the norm kernel's bits. The SiLU·mul output bit for bit
// against the plain GEMM followed by the SiLU·mul kernel, and against float64. Row halves (CTAs
// of at most 8 rows, each as two k halves of a stage) against float64.
#include "runtime/model/prefetch_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/bf16.h"
#include "runtime/model/internal/gpu_test_helpers.h"
#include "runtime/model/rms_norm.h"
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
using testing_internal::ToDouble;

constexpr int kSmCount = 132;

// x as the GEMM reads it, in float64.
std::vector<double> Operand(const std::vector<uint16_t>& x, int m, int k, PrefetchGemmInput input) {
  return testing_internal::GemmOperand(x, m, k, input != PrefetchGemmInput::kPlain);
}

// Device buffers of one shape: x (room for SiLU·mul's [m, 2k]), W, y (room for float).
class Problem {
 public:
  Problem(int max_m, int n, int k)
      : n_(n),
        k_(k),
        x_(static_cast<size_t>(max_m) * 2 * k),
        w_(static_cast<size_t>(n) * k),
        y_(static_cast<size_t>(max_m) * n) {}

  PrefetchGemmArgs Args(int m, PrefetchGemmInput input, bool float_output) const {
    PrefetchGemmArgs a;
    a.x = reinterpret_cast<const __nv_bfloat16*>(x_.get());
    a.w = reinterpret_cast<const __nv_bfloat16*>(w_.get());
    a.y = y_.get();
    a.m = m;
    a.n = n_;
    a.k = k_;
    a.input = input;
    a.float_output = float_output;
    return a;
  }

  // Returns y [m, n] as float64 (poisoned elements are NaN).
  std::vector<double> Output(int m, bool float_output, cudaStream_t stream) const {
    const std::vector<float> raw = y_.Download(stream);
    std::vector<double> got(static_cast<size_t>(m) * n_);
    for (size_t i = 0; i < got.size(); ++i) {
      if (float_output) {
        got[i] = raw[i];
      } else {
        uint16_t bits;
        std::memcpy(&bits, reinterpret_cast<const char*>(raw.data()) + 2 * i, 2);
        got[i] = Bf16BitsToFloat(bits);
      }
    }
    return got;
  }

  DeviceVector<uint16_t>& x() { return x_; }
  DeviceVector<uint16_t>& w() { return w_; }
  DeviceVector<float>& y() { return y_; }

 private:
  int n_, k_;
  DeviceVector<uint16_t> x_, w_;
  DeviceVector<float> y_;
};

class PrefetchGemmGpuTest : public GpuTest {
 protected:
  // Runs `config` (poisoned output first) and returns the relative error against `ref`.
  double Check(Problem& problem, const PrefetchGemmArgs& args, const PrefetchGemmConfig& config,
               const std::vector<double>& ref) {
    problem.y().Poison(stream());
    EXPECT_TRUE(PrefetchGemmSupports(args, config)) << config.ToString();
    EXPECT_EQ(LaunchPrefetchGemm(args, config, stream()), cudaSuccess) << config.ToString();
    return RelativeError(problem.Output(args.m, args.float_output, stream()), ref);
  }

  // float output: only float rounding of the sum; bf16: one rounding of y (and of SiLU·mul,
  // which the kernel rounds to bf16 like the activation it replaces).
  static double Tolerance(PrefetchGemmInput input, bool float_output) {
    if (float_output) return input == PrefetchGemmInput::kPlain ? 1e-5 : 6e-3;
    return input == PrefetchGemmInput::kPlain ? 6e-3 : 1e-2;
  }
};

TEST_F(PrefetchGemmGpuTest, EdgeShapesMatchFloat64) {
  struct Shape {
    int n, k;
  };
  // k = 8: one vector; k = 1000: one partial stage with a partial 32-k chunk (and the one-stage
  // reduction path); k = 2056: a 1024-k stage, another and 8 k; n = 333 and 17: partial groups,
  // and more CTAs than 16-row groups.
  for (const Shape& s : {Shape{40, 8}, Shape{300, 1000}, Shape{333, 2056}, Shape{17, 3080}}) {
    Problem problem(kPrefetchGemmMaxRows, s.n, s.k);
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(s.n) * s.k);
    problem.w().Upload(w, stream());
    for (int m = 1; m <= kPrefetchGemmMaxRows; ++m) {
      for (PrefetchGemmInput input : {PrefetchGemmInput::kPlain, PrefetchGemmInput::kSiluMul}) {
        const int x_cols = input == PrefetchGemmInput::kPlain ? s.k : 2 * s.k;
        const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * x_cols, -3.f, 3.f);
        problem.x().Upload(x, stream());
        const std::vector<double> ref = GemmProduct(Operand(x, m, s.k, input), w, m, s.n, s.k);
        for (bool float_output : {false, true}) {
          const PrefetchGemmArgs args = problem.Args(m, input, float_output);
          const PrefetchGemmConfig chosen = ChoosePrefetchGemmConfig(m, s.n, s.k, kSmCount);
          // The chosen ring, a single slot (every stage waits for its copy), two slots on a few
          // CTAs (many stages each, slots reused many times) and every row in one CTA.
          for (const PrefetchGemmConfig& config :
               {chosen, PrefetchGemmConfig{chosen.ctas, 1}, PrefetchGemmConfig{std::min(s.n, 3), 2},
                PrefetchGemmConfig{1, 3}}) {
            SCOPED_TRACE(::testing::Message()
                         << "n=" << s.n << " k=" << s.k << " m=" << m
                         << " silu=" << (input == PrefetchGemmInput::kSiluMul)
                         << " float=" << float_output << " " << config.ToString());
            EXPECT_LT(Check(problem, args, config, ref), Tolerance(input, float_output));
          }
        }
      }
    }
  }
}

TEST_F(PrefetchGemmGpuTest, ModelShapesWithChosenConfigsMatchFloat64) {
  struct Shape {
    int n, k;
    PrefetchGemmInput input;
    bool float_output;
    std::vector<int> rows;
  };
  // The 1B model's projections (the down one also through SiLU·mul of gate_up; from 4 rows its
  // staged x leaves room for one CTA per SM) and an LM head of a 32064-token vocabulary.
  const std::vector<Shape> shapes = {
      {3072, 2048, PrefetchGemmInput::kPlain, false, {1, 5, 8}},
      {2048, 2048, PrefetchGemmInput::kPlain, false, {1, 8}},
      {16384, 2048, PrefetchGemmInput::kPlain, false, {1, 8}},
      {2048, 8192, PrefetchGemmInput::kSiluMul, false, {1, 2, 8}},
      {2048, 8192, PrefetchGemmInput::kPlain, false, {4, 8}},
      {32064, 2048, PrefetchGemmInput::kPlain, true, {1, 3}},
  };
  for (const Shape& s : shapes) {
    Problem problem(kPrefetchGemmMaxRows, s.n, s.k);
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(s.n) * s.k);
    problem.w().Upload(w, stream());
    for (int m : s.rows) {
      const int x_cols = s.input == PrefetchGemmInput::kPlain ? s.k : 2 * s.k;
      const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * x_cols, -3.f, 3.f);
      problem.x().Upload(x, stream());
      const PrefetchGemmConfig config = ChoosePrefetchGemmConfig(m, s.n, s.k, kSmCount);
      SCOPED_TRACE(::testing::Message() << "n=" << s.n << " k=" << s.k << " m=" << m << " "
                                        << config.ToString());
      // Two CTAs per SM, but one where the staged x leaves no room for two (down at 8 rows).
      const bool two_fit =
          PrefetchGemmSharedBytes(m, s.k, config.stages) <= kPrefetchGemmCoResidentBytes;
      EXPECT_EQ(config.ctas, two_fit ? 2 * kSmCount : kSmCount);
      EXPECT_GE(config.stages, 2);
      EXPECT_LT(Check(problem, problem.Args(m, s.input, s.float_output), config,
                      GemmProduct(Operand(x, m, s.k, s.input), w, m, s.n, s.k)),
                Tolerance(s.input, s.float_output));
    }
  }
}

// Row halves: each CTA's at most 8 rows fill a stage as 8 rows × 2048 k. The O and down
// projections of the 1B model with the chosen grid (256 CTAs where the chosen one has more than
// 8 rows a CTA), and a small n on grids of 8, 5 and 1 rows per CTA with one, two and three ring
// slots.
TEST_F(PrefetchGemmGpuTest, RowHalvesMatchFloat64) {
  struct Shape {
    int n, k;
  };
  for (const Shape& s : {Shape{2048, 2048}, Shape{2048, 8192}, Shape{100, 4096}}) {
    Problem problem(kPrefetchGemmMaxRows, s.n, s.k);
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(s.n) * s.k);
    problem.w().Upload(w, stream());
    for (int m = 1; 2 * m <= 8; ++m) {
      for (PrefetchGemmInput input : {PrefetchGemmInput::kPlain, PrefetchGemmInput::kSiluMul}) {
        const int x_cols = input == PrefetchGemmInput::kPlain ? s.k : 2 * s.k;
        const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * x_cols, -3.f, 3.f);
        problem.x().Upload(x, stream());
        const std::vector<double> ref = GemmProduct(Operand(x, m, s.k, input), w, m, s.n, s.k);
        PrefetchGemmConfig chosen = ChoosePrefetchGemmConfig(m, s.n, s.k, kSmCount);
        std::vector<PrefetchGemmConfig> configs;
        if (s.n == 100) {
          for (int ctas : {13, 20, 100}) {
            for (int stages : {1, 2, 3}) configs.push_back(PrefetchGemmConfig{ctas, stages, true});
          }
        } else if (PrefetchGemmTakesRowHalves(m, s.n, s.k, chosen.ctas, false)) {
          chosen.row_halves = true;
          configs = {chosen, PrefetchGemmConfig{chosen.ctas, 1, true}};
        } else {
          // The down projection's x from 3 rows leaves room for one CTA of 16 rows per SM only;
          // 256 CTAs of 8 rows with one slot fit twice.
          EXPECT_EQ(chosen.ctas, kSmCount);
          configs = {PrefetchGemmConfig{256, 1, true}};
        }
        for (bool float_output : {false, true}) {
          const PrefetchGemmArgs args = problem.Args(m, input, float_output);
          for (const PrefetchGemmConfig& config : configs) {
            SCOPED_TRACE(::testing::Message()
                         << "n=" << s.n << " k=" << s.k << " m=" << m
                         << " silu=" << (input == PrefetchGemmInput::kSiluMul)
                         << " float=" << float_output << " " << config.ToString());
            EXPECT_LT(Check(problem, args, config, ref), Tolerance(input, float_output));
          }
        }
      }
    }
  }
}

TEST_F(PrefetchGemmGpuTest, ChosenConfigsFitTheCoResidentBudget) {
  // The 1B model's projections fit two CTAs per SM with at least two stages each (but the down
  // projection from 4 rows, whose staged x alone is 64 KiB and more).
  struct Case {
    int m, n, k;
  };
  for (const Case& c : {Case{1, 3072, 2048}, Case{8, 3072, 2048}, Case{1, 2048, 2048},
                        Case{8, 16384, 2048}, Case{1, 2048, 8192}, Case{2, 2048, 8192}}) {
    const PrefetchGemmConfig config = ChoosePrefetchGemmConfig(c.m, c.n, c.k, kSmCount);
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k << " "
                                      << config.ToString());
    EXPECT_GE(config.stages, 2);
    EXPECT_LE(PrefetchGemmSharedBytes(c.m, c.k, config.stages), kPrefetchGemmCoResidentBytes);
  }
  // O at one row: 8 rows × 2048 k per CTA, two stages, all of it.
  EXPECT_EQ(ChoosePrefetchGemmConfig(1, 2048, 2048, kSmCount).stages, 2);
  // One CTA per SM asked for: the ring takes up to the budget (QKV: 3 of a CTA's 4 stages).
  const PrefetchGemmConfig qkv1 = ChoosePrefetchGemmConfig(1, 3072, 2048, kSmCount, 1);
  EXPECT_EQ(qkv1.ctas, kSmCount);
  EXPECT_EQ(qkv1.stages, 3);
  // Down at 8 rows: x is 128 KiB; one CTA per SM, the ring past the co-resident budget.
  const PrefetchGemmConfig down8 = ChoosePrefetchGemmConfig(8, 2048, 8192, kSmCount);
  EXPECT_EQ(down8.ctas, kSmCount);
  EXPECT_GE(down8.stages, 2);
  EXPECT_GT(PrefetchGemmSharedBytes(8, 8192, down8.stages), kPrefetchGemmCoResidentBytes);
  EXPECT_LE(PrefetchGemmSharedBytes(8, 8192, down8.stages), kPrefetchGemmMaxSharedBytes);
}

TEST_F(PrefetchGemmGpuTest, SecondLaunchReadsTheFirstOnesOutput) {
  // y1 = x · W1ᵀ, then y2 = y1 · W2ᵀ, enqueued back to back (the second's weights stream in
  // while the first runs; it must read y1 only after the first completes). y1 is poisoned
  // first: a read before the first kernel's writes would make y2 NaN.
  const int m = 4, k = 2048, n1 = 2048, n2 = 3072;
  Problem first(m, n1, k), second(m, n2, n1);
  const std::vector<uint16_t> w1 = RandomBf16(static_cast<size_t>(n1) * k);
  const std::vector<uint16_t> w2 = RandomBf16(static_cast<size_t>(n2) * n1);
  first.w().Upload(w1, stream());
  second.w().Upload(w2, stream());
  for (int round = 0; round < 3; ++round) {
    first.x().Upload(RandomBf16(static_cast<size_t>(m) * k), stream());
    first.y().Poison(stream());
    second.y().Poison(stream());
    PrefetchGemmArgs a = first.Args(m, PrefetchGemmInput::kPlain, false);
    PrefetchGemmArgs b = second.Args(m, PrefetchGemmInput::kPlain, false);
    b.x = reinterpret_cast<const __nv_bfloat16*>(first.y().get());
    // One CTA per SM (the second launch's CTAs fit beside the first's), then two.
    const int per_sm = round == 0 ? 1 : 2;
    const PrefetchGemmConfig ca = ChoosePrefetchGemmConfig(m, n1, k, kSmCount, per_sm);
    const PrefetchGemmConfig cb = ChoosePrefetchGemmConfig(m, n2, n1, kSmCount, per_sm);
    ASSERT_EQ(LaunchPrefetchGemm(a, ca, stream()), cudaSuccess);
    ASSERT_EQ(LaunchPrefetchGemm(b, cb, stream()), cudaSuccess);
    // The reference of the second product starts from the first one's bf16 output.
    const std::vector<float> y1_raw = first.y().Download(stream());
    std::vector<uint16_t> y1(static_cast<size_t>(m) * n1);
    std::memcpy(y1.data(), y1_raw.data(), y1.size() * sizeof(uint16_t));
    for (uint16_t v : y1) ASSERT_TRUE(std::isfinite(Bf16BitsToFloat(v)));
    EXPECT_LT(
        RelativeError(second.Output(m, false, stream()),
                      GemmProduct(Operand(y1, m, n1, PrefetchGemmInput::kPlain), w2, m, n2, n1)),
        6e-3)
        << "round " << round;
  }
}

TEST_F(PrefetchGemmGpuTest, GraphReplayAndRepeatsAreBitwiseEqual) {
  const int n = 3072, k = 2048;
  Problem problem(kPrefetchGemmMaxRows, n, k);
  problem.w().Upload(RandomBf16(static_cast<size_t>(n) * k), stream());
  ASSERT_EQ(PreparePrefetchGemm(), cudaSuccess);
  for (int m : {1, 8}) {
    problem.x().Upload(RandomBf16(static_cast<size_t>(m) * k), stream());
    const PrefetchGemmConfig config = ChoosePrefetchGemmConfig(m, n, k, kSmCount);
    SCOPED_TRACE(::testing::Message() << "m=" << m << " " << config.ToString());
    const PrefetchGemmArgs args = problem.Args(m, PrefetchGemmInput::kPlain, false);
    problem.y().Poison(stream());
    ASSERT_EQ(LaunchPrefetchGemm(args, config, stream()), cudaSuccess);
    const std::vector<float> eager = problem.y().Download(stream());
    problem.y().Poison(stream());
    ASSERT_EQ(LaunchPrefetchGemm(args, config, stream()), cudaSuccess);
    const std::vector<float> again = problem.y().Download(stream());

    problem.y().Poison(stream());
    ASSERT_NO_FATAL_FAILURE(CaptureAndReplay(
        stream(), 3, 3, [&] { return LaunchPrefetchGemm(args, config, stream()); }));
    const std::vector<float> replayed = problem.y().Download(stream());

    const size_t bytes = static_cast<size_t>(m) * n * sizeof(uint16_t);
    for (double v : problem.Output(m, false, stream())) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(std::memcmp(eager.data(), again.data(), bytes), 0);
    EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), bytes), 0);
  }
}

// The norm inputs' operand in float64 and the new residual's bits: h = x, or bf16(x + residual)
// (the sum of two bf16 values is exact in float64; float(sum) is the kernel's float add), then
// h / sqrt(mean(h²) + eps) · weight per row.
struct NormReference {
  std::vector<double> operand;   // [m, k]
  std::vector<uint16_t> h;       // [m, k]
};

NormReference NormOperand(const std::vector<uint16_t>& x, const std::vector<uint16_t>* residual,
                          const std::vector<uint16_t>& weight, int m, int k, float eps) {
  NormReference ref{std::vector<double>(static_cast<size_t>(m) * k),
                    std::vector<uint16_t>(static_cast<size_t>(m) * k)};
  for (int r = 0; r < m; ++r) {
    double sum_sq = 0.0;
    for (int e = 0; e < k; ++e) {
      const size_t i = static_cast<size_t>(r) * k + e;
      ref.h[i] =
          residual == nullptr
              ? x[i]
              : FloatToBf16Bits(static_cast<float>(ToDouble(x[i]) + ToDouble((*residual)[i])));
      sum_sq += ToDouble(ref.h[i]) * ToDouble(ref.h[i]);
    }
    const double scale = 1.0 / std::sqrt(sum_sq / k + eps);
    for (int e = 0; e < k; ++e) {
      const size_t i = static_cast<size_t>(r) * k + e;
      ref.operand[i] = ToDouble(ref.h[i]) * scale * ToDouble(weight[e]);
    }
  }
  return ref;
}

TEST_F(PrefetchGemmGpuTest, NormInputsMatchFloat64AndTheNormKernelsBitForBit) {
  struct Shape {
    int n, k;
  };
  // The 1B model's QKV and gate-up projections (k = 2048: one norm vector per thread), k = 1000
  // (not a multiple of the stage or of 32 norm vectors: a partial norm warp), k = 3080 (two
  // CTA-wide passes over the vectors, the second partial), k = 8192 (the most, four passes), and
  // k = 8 (one vector per row).
  const float eps = 1e-5f;
  for (const Shape& s : {Shape{3072, 2048}, Shape{16384, 2048}, Shape{300, 1000},
                         Shape{333, 3080}, Shape{96, 8192}, Shape{40, 8}}) {
    const size_t rows_k = static_cast<size_t>(kPrefetchGemmMaxRows) * s.k;
    Problem problem(kPrefetchGemmMaxRows, s.n, s.k);
    Problem unfused(kPrefetchGemmMaxRows, s.n, s.k);  // its x: the norm kernel's output
    DeviceVector<uint16_t> residual_in(rows_k), residual_out(rows_k), norm_residual(rows_k);
    DeviceVector<uint16_t> norm_weight(s.k);
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(s.n) * s.k);
    problem.w().Upload(w, stream());
    unfused.w().Upload(w, stream());
    for (int m : {1, 3, 8}) {
      for (PrefetchGemmInput input :
           {PrefetchGemmInput::kAddRmsNorm, PrefetchGemmInput::kRmsNorm}) {
        const bool add = input == PrefetchGemmInput::kAddRmsNorm;
        const size_t count = static_cast<size_t>(m) * s.k;
        const std::vector<uint16_t> x = RandomBf16(count, -3.f, 3.f);
        const std::vector<uint16_t> residual = RandomBf16(count, -2.f, 2.f);
        const std::vector<uint16_t> weight = RandomBf16(s.k, 0.5f, 1.5f);
        problem.x().Upload(x, stream());
        residual_in.Upload(residual, stream());
        norm_weight.Upload(weight, stream());
        const NormReference ref =
            NormOperand(x, add ? &residual : nullptr, weight, m, s.k, eps);
        const std::vector<double> y_ref = GemmProduct(ref.operand, w, m, s.n, s.k);
        const PrefetchGemmConfig chosen = ChoosePrefetchGemmConfig(m, s.n, s.k, kSmCount);
        // The chosen configuration, and a few CTAs with many stages each.
        for (const PrefetchGemmConfig& config :
             {chosen, PrefetchGemmConfig{std::min(s.n, 24), 2}}) {
          // kRmsNorm without residual_out on the second configuration.
          const bool write_residual = add || config.ctas == chosen.ctas;
          SCOPED_TRACE(::testing::Message() << "n=" << s.n << " k=" << s.k << " m=" << m
                                            << " add=" << add << " write_residual="
                                            << write_residual << " " << config.ToString());
          PrefetchGemmArgs args = problem.Args(m, input, /*float_output=*/false);
          args.residual_in = add ? reinterpret_cast<const __nv_bfloat16*>(residual_in.get())
                                 : nullptr;
          args.residual_out =
              write_residual ? reinterpret_cast<__nv_bfloat16*>(residual_out.get()) : nullptr;
          args.norm_weight = reinterpret_cast<const __nv_bfloat16*>(norm_weight.get());
          args.eps = eps;
          residual_out.Poison(stream());
          const double error = Check(problem, args, config, y_ref);
          EXPECT_LT(error, Tolerance(PrefetchGemmInput::kSiluMul, false));
          const std::vector<float> folded_y = problem.y().Download(stream());
          const std::vector<uint16_t> got_residual = residual_out.Download(stream());
          const std::vector<uint16_t> read_residual = residual_in.Download(stream());
          EXPECT_TRUE(std::equal(residual.begin(), residual.end(), read_residual.begin()))
              << "residual_in was written";
          if (write_residual) {
            EXPECT_TRUE(std::equal(ref.h.begin(), ref.h.end(), got_residual.begin()))
                << "residual_out is not bf16(x + residual)";
          } else {
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(got_residual[i], 0xFFFF) << i;
          }

          // The unfused step: the norm kernel into `normed`, then the plain GEMM.
          norm_residual.Upload(residual, stream());
          unfused.x().Poison(stream());
          unfused.y().Poison(stream());
          auto* normed = reinterpret_cast<__nv_bfloat16*>(unfused.x().get());
          const auto* bf_x = reinterpret_cast<const __nv_bfloat16*>(problem.x().get());
          const auto* bf_weight = reinterpret_cast<const __nv_bfloat16*>(norm_weight.get());
          ASSERT_EQ(add ? LaunchFusedAddRmsNorm(
                              bf_x, reinterpret_cast<__nv_bfloat16*>(norm_residual.get()),
                              bf_weight, normed, m, s.k, eps, stream())
                        : LaunchRmsNorm(bf_x, bf_weight, normed, m, s.k, eps, stream()),
                    cudaSuccess);
          ASSERT_EQ(LaunchPrefetchGemm(unfused.Args(m, PrefetchGemmInput::kPlain, false), config,
                                       stream()),
                    cudaSuccess);
          const std::vector<float> unfused_y = unfused.y().Download(stream());
          const size_t y_bytes = static_cast<size_t>(m) * s.n * sizeof(uint16_t);
          EXPECT_EQ(std::memcmp(folded_y.data(), unfused_y.data(), y_bytes), 0)
              << "y differs from the norm kernel + plain GEMM";
          if (add) {
            const std::vector<uint16_t> kernel_residual = norm_residual.Download(stream());
            EXPECT_EQ(std::memcmp(got_residual.data(), kernel_residual.data(), count * 2), 0)
                << "residual_out differs from the norm kernel's residual";
          }
        }
      }
    }
  }
}

TEST_F(PrefetchGemmGpuTest, NormInputsRefuseBadBuffers) {
  DeviceVector<uint16_t> buf(1 << 16);
  auto* p = reinterpret_cast<__nv_bfloat16*>(buf.get());
  const int m = 2, n = 64, k = 256;
  PrefetchGemmArgs a;
  a.x = p;
  a.w = p + 4096;
  a.y = p + 8 * 4096;
  a.m = m;
  a.n = n;
  a.k = k;
  a.input = PrefetchGemmInput::kAddRmsNorm;
  a.residual_in = p + 2 * 4096;
  a.residual_out = p + 3 * 4096;
  a.norm_weight = p + 4 * 4096;
  const PrefetchGemmConfig ok{16, 2};
  EXPECT_TRUE(PrefetchGemmSupports(a, ok));
  PrefetchGemmArgs bad = a;
  bad.residual_out = const_cast<__nv_bfloat16*>(a.residual_in);  // CTA 0 would write what all read
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad.residual_out = const_cast<__nv_bfloat16*>(a.residual_in) + k;  // overlaps row 1
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad.residual_out = const_cast<__nv_bfloat16*>(a.x) + 8;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = a;
  bad.residual_out = nullptr;  // the add needs somewhere to put the new residual
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad.input = PrefetchGemmInput::kRmsNorm;  // ... the plain norm does not
  EXPECT_TRUE(PrefetchGemmSupports(bad, ok));
  bad = a;
  bad.residual_in = nullptr;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = a;
  bad.norm_weight = nullptr;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = a;
  bad.norm_weight = a.norm_weight + 1;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = a;
  bad.residual_in = a.residual_in + 4;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  // k past the norm kernel's one vector per thread.
  bad = a;
  bad.m = 1;
  bad.k = kPrefetchGemmMaxNormK + 8;
  bad.residual_in = p + 16384;
  bad.residual_out = p + 2 * 16384;
  bad.norm_weight = p + 3 * 16384;
  EXPECT_FALSE(PrefetchGemmSupportsNormShape(1, n, bad.k, ok));
  EXPECT_TRUE(PrefetchGemmSupportsShape(1, n, bad.k, ok));
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  EXPECT_EQ(LaunchPrefetchGemm(bad, ok, stream()), cudaErrorInvalidValue);
}

TEST_F(PrefetchGemmGpuTest, SiluMulOutputGivesTheSiluMulKernelBits) {
  struct Shape {
    int ffn, k;
    std::vector<int> rows;
  };
  // The 1B model's gate-up; the tiny model's; halves that are not a multiple of the 8 gate rows
  // a group takes, with k not a multiple of the 1024-k stage (one partial stage, and two stages
  // and 8 k).
  const std::vector<int> all = {1, 2, 3, 4, 5, 6, 7, 8};
  for (const Shape& s : {Shape{8192, 2048, {1, 2, 8}}, Shape{512, 256, all},
                         Shape{40, 1000, all}, Shape{300, 2056, {1, 5, 8}}}) {
    const int n = 2 * s.ffn;
    Problem problem(kPrefetchGemmMaxRows, n, s.k);
    DeviceVector<uint16_t> fused(static_cast<size_t>(kPrefetchGemmMaxRows) * s.ffn);
    DeviceVector<uint16_t> chained(static_cast<size_t>(kPrefetchGemmMaxRows) * s.ffn);
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(n) * s.k);
    problem.w().Upload(w, stream());
    for (int m : s.rows) {
      const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * s.k, -3.f, 3.f);
      problem.x().Upload(x, stream());
      const std::vector<double> want = SiluMulOfProduct(
          GemmProduct(Operand(x, m, s.k, PrefetchGemmInput::kPlain), w, m, n, s.k), m, s.ffn);
      PrefetchGemmConfig chosen = ChoosePrefetchGemmConfig(m, n, s.k, kSmCount);
      chosen.ctas = std::min(chosen.ctas, s.ffn);
      // The chosen ring, one slot, a few CTAs of many groups and one CTA of every gate row.
      for (const PrefetchGemmConfig& config :
           {chosen, PrefetchGemmConfig{chosen.ctas, 1}, PrefetchGemmConfig{3, 2},
            PrefetchGemmConfig{1, 3}}) {
        SCOPED_TRACE(::testing::Message() << "ffn=" << s.ffn << " k=" << s.k << " m=" << m
                                          << " " << config.ToString());
        // The plain GEMM and the SiLU·mul kernel: the bits to give.
        const PrefetchGemmArgs plain = problem.Args(m, PrefetchGemmInput::kPlain, false);
        problem.y().Poison(stream());
        chained.Poison(stream());
        ASSERT_EQ(LaunchPrefetchGemm(plain, config, stream()), cudaSuccess);
        ASSERT_EQ(LaunchSiluMul(static_cast<const __nv_bfloat16*>(plain.y),
                                reinterpret_cast<__nv_bfloat16*>(chained.get()), m, s.ffn,
                                stream()),
                  cudaSuccess);
        PrefetchGemmArgs args = plain;
        args.y = fused.get();
        args.silu_mul_output = true;
        fused.Poison(stream());
        ASSERT_TRUE(PrefetchGemmSupports(args, config));
        ASSERT_EQ(LaunchPrefetchGemm(args, config, stream()), cudaSuccess);
        // Three roundings to bf16: g, u and the product.
        ExpectSiluMulOutput(fused, chained, m, s.ffn, want, 2e-2, stream());
      }
    }
  }
}

TEST_F(PrefetchGemmGpuTest, RefusesUnsupportedShapes) {
  DeviceVector<uint16_t> buf(1 << 16);
  auto* p = reinterpret_cast<const __nv_bfloat16*>(buf.get());
  PrefetchGemmArgs a;
  a.x = p;
  a.w = p;
  a.y = buf.get();
  a.m = 1;
  a.n = 64;
  a.k = 256;
  const PrefetchGemmConfig ok{16, 2};
  EXPECT_TRUE(PrefetchGemmSupports(a, ok));
  PrefetchGemmArgs bad = a;
  bad.m = 0;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad.m = kPrefetchGemmMaxRows + 1;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = a;
  bad.k = 260;  // not a multiple of 8
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = a;
  bad.n = 0;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  EXPECT_FALSE(PrefetchGemmSupports(a, PrefetchGemmConfig{65, 2}));  // more CTAs than rows
  EXPECT_FALSE(PrefetchGemmSupports(a, PrefetchGemmConfig{16, 0}));
  EXPECT_FALSE(PrefetchGemmSupports(a, PrefetchGemmConfig{16, kPrefetchGemmMaxStages + 1}));
  // Row halves: more than 8 rows a CTA, k not a multiple of 2048, more than 4 rows of x.
  EXPECT_FALSE(PrefetchGemmTakesRowHalves(1, 64, 2048, 7, false));
  EXPECT_FALSE(PrefetchGemmTakesRowHalves(1, 64, 3072, 8, false));
  EXPECT_FALSE(PrefetchGemmTakesRowHalves(5, 64, 2048, 8, false));
  EXPECT_FALSE(PrefetchGemmTakesRowHalves(1, 64, 2048, 8, true));
  EXPECT_TRUE(PrefetchGemmTakesRowHalves(4, 64, 2048, 8, false));
  bad = a;
  bad.x = p + 1;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = a;
  bad.y = buf.get() + 4;  // 8 bytes in
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = a;
  bad.m = 8;
  bad.k = 16384;  // a staged x of 256 KiB
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  EXPECT_EQ(ChoosePrefetchGemmConfig(8, 64, 16384, kSmCount).stages, 0);
  EXPECT_EQ(LaunchPrefetchGemm(bad, ok, stream()), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPrefetchGemm(a, PrefetchGemmConfig{16, 7}, stream()), cudaErrorInvalidValue)
      << "7 stages of 33 KiB exceed the shared-memory limit";
  // The SiLU·mul output: 32 gate rows, so at most 32 CTAs; bf16 y, plain x, n even.
  PrefetchGemmArgs silu = a;
  silu.silu_mul_output = true;
  EXPECT_TRUE(PrefetchGemmSupports(silu, PrefetchGemmConfig{32, 2}));
  EXPECT_FALSE(PrefetchGemmSupports(silu, PrefetchGemmConfig{33, 2}));
  bad = silu;
  bad.float_output = true;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = silu;
  bad.input = PrefetchGemmInput::kSiluMul;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  bad = silu;
  bad.n = 63;
  EXPECT_FALSE(PrefetchGemmSupports(bad, ok));
  EXPECT_EQ(LaunchPrefetchGemm(silu, PrefetchGemmConfig{33, 2}, stream()), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kiln
