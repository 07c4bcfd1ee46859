// The decode GEMM against a CPU float64 product: every configuration (row warps × splits) on
// partial row tiles, row counts around each x-tile width, plain and SiLU·mul inputs, bf16 and
// float outputs; the 1B model's projection shapes with the chosen configurations; graph replay
// equal to eager and repeated runs equal bit for bit, with the split counters back at zero;
// unsupported shapes refused.
#include "runtime/model/decode_gemm.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/bf16.h"
#include "runtime/model/internal/gpu_test_helpers.h"

namespace kiln {
namespace {

using testing_internal::CaptureAndReplay;
using testing_internal::DeviceVector;
using testing_internal::GemmProduct;
using testing_internal::GpuTest;
using testing_internal::RelativeError;

constexpr int kSmCount = 132;

// x as the GEMM reads it, in float64.
std::vector<double> Operand(const std::vector<uint16_t>& x, int m, int k, DecodeGemmInput input) {
  return testing_internal::GemmOperand(x, m, k, input != DecodeGemmInput::kPlain);
}

// Device buffers of one shape: x, W, y (room for float), split workspace and counters.
class Problem {
 public:
  Problem(int max_m, int n, int k, cudaStream_t stream)
      : n_(n),
        k_(k),
        x_(static_cast<size_t>(max_m) * 2 * k),
        w_(static_cast<size_t>(n) * k),
        y_(static_cast<size_t>(max_m) * n),
        workspace_(static_cast<size_t>(8) * max_m * n),
        counters_(static_cast<size_t>(n / 16)) {
    EXPECT_EQ(cudaMemsetAsync(counters_.get(), 0, counters_.size() * sizeof(int32_t), stream),
              cudaSuccess);
    // Poisoned: a split that read a partial nothing wrote would give NaN.
    workspace_.Poison(stream);
  }

  DecodeGemmArgs Args(int m, DecodeGemmInput input, bool float_output) const {
    DecodeGemmArgs a;
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

  cudaError_t Launch(const DecodeGemmArgs& a, const DecodeGemmConfig& c, cudaStream_t stream) {
    return LaunchDecodeGemm(a, c, workspace_.get(), counters_.get(), stream);
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

  std::vector<int32_t> Counters(cudaStream_t stream) const { return counters_.Download(stream); }

  DeviceVector<uint16_t>& x() { return x_; }
  DeviceVector<uint16_t>& w() { return w_; }
  DeviceVector<float>& y() { return y_; }

 private:
  int n_, k_;
  DeviceVector<uint16_t> x_, w_;
  DeviceVector<float> y_;
  DeviceVector<float> workspace_;
  DeviceVector<int32_t> counters_;
};

class DecodeGemmGpuTest : public GpuTest {
 protected:
  // Runs `config` (poisoned output first) and returns the relative error against `ref`.
  double Check(Problem& problem, const DecodeGemmArgs& args, const DecodeGemmConfig& config,
               const std::vector<double>& ref) {
    problem.y().Poison(stream());
    EXPECT_TRUE(DecodeGemmSupports(args, config)) << config.ToString();
    EXPECT_EQ(problem.Launch(args, config, stream()), cudaSuccess) << config.ToString();
    return RelativeError(problem.Output(args.m, args.float_output, stream()), ref);
  }
};

TEST_F(DecodeGemmGpuTest, EveryConfigMatchesFloat64) {
  // 272 rows: the last tile of 32 or 64 rows is partial. k = 1024 takes every split.
  const int n = 272, k = 1024;
  Problem problem(32, n, k, stream());
  const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(n) * k);
  problem.w().Upload(w, stream());
  for (int m : {1, 7, 8, 9, 16, 20, 32}) {
    for (DecodeGemmInput input : {DecodeGemmInput::kPlain, DecodeGemmInput::kSiluMul}) {
      const int x_cols = input == DecodeGemmInput::kPlain ? k : 2 * k;
      const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * x_cols, -3.f, 3.f);
      problem.x().Upload(x, stream());
      const std::vector<double> ref = GemmProduct(Operand(x, m, k, input), w, m, n, k);
      for (bool float_output : {false, true}) {
        if (float_output && input == DecodeGemmInput::kSiluMul) continue;
        const DecodeGemmArgs args = problem.Args(m, input, float_output);
        // float output: only float rounding of the products' sum; bf16: one rounding of y (and
        // of SiLU·mul, which the kernel rounds to bf16 like the activation it replaces).
        const double tolerance =
            float_output ? 1e-5 : (input == DecodeGemmInput::kPlain ? 6e-3 : 1e-2);
        for (int row_warps : {1, 2, 4}) {
          for (int splits : {1, 2, 4, 8}) {
            const DecodeGemmConfig config{row_warps, splits};
            SCOPED_TRACE(::testing::Message() << "m=" << m << " silu="
                                              << (input == DecodeGemmInput::kSiluMul)
                                              << " float=" << float_output << " "
                                              << config.ToString());
            EXPECT_LT(Check(problem, args, config, ref), tolerance);
          }
        }
      }
    }
  }
  for (int32_t c : problem.Counters(stream())) ASSERT_EQ(c, 0);
}

TEST_F(DecodeGemmGpuTest, ModelShapesWithChosenConfigsMatchFloat64) {
  struct Shape {
    int n, k;
    DecodeGemmInput input;
  };
  // The 1B model's qkv and down projections (the down one through SiLU·mul of gate_up).
  for (const Shape& s : {Shape{3072, 2048, DecodeGemmInput::kPlain},
                         Shape{2048, 8192, DecodeGemmInput::kSiluMul}}) {
    Problem problem(32, s.n, s.k, stream());
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(s.n) * s.k);
    problem.w().Upload(w, stream());
    for (int m : {1, 8, 24, 32}) {
      const int x_cols = s.input == DecodeGemmInput::kPlain ? s.k : 2 * s.k;
      const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * x_cols, -3.f, 3.f);
      problem.x().Upload(x, stream());
      const DecodeGemmConfig config = ChooseDecodeGemmConfig(m, s.n, s.k, kSmCount);
      SCOPED_TRACE(::testing::Message() << "n=" << s.n << " k=" << s.k << " m=" << m << " "
                                        << config.ToString());
      const DecodeGemmArgs args = problem.Args(m, s.input, false);
      EXPECT_LT(
          Check(problem, args, config, GemmProduct(Operand(x, m, s.k, s.input), w, m, s.n, s.k)),
          s.input == DecodeGemmInput::kPlain ? 6e-3 : 1e-2);
    }
  }
}

TEST_F(DecodeGemmGpuTest, LogitsLikeShapeMatchesFloat64) {
  // An LM head of a 32064-token vocabulary (2004 row tiles), float logits, one row.
  const int n = 32064, k = 2048, m = 1;
  Problem problem(m, n, k, stream());
  const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(n) * k);
  const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(k));
  problem.w().Upload(w, stream());
  problem.x().Upload(x, stream());
  const DecodeGemmConfig config = ChooseDecodeGemmConfig(m, n, k, kSmCount);
  EXPECT_EQ(config.splits, 1);
  const DecodeGemmArgs args = problem.Args(m, DecodeGemmInput::kPlain, true);
  EXPECT_LT(Check(problem, args, config,
                  GemmProduct(Operand(x, m, k, DecodeGemmInput::kPlain), w, m, n, k)),
            1e-5);
}

TEST_F(DecodeGemmGpuTest, GraphReplayAndRepeatsAreBitwiseEqual) {
  const int n = 2048, k = 2048;
  Problem problem(32, n, k, stream());
  problem.w().Upload(RandomBf16(static_cast<size_t>(n) * k), stream());
  for (int m : {3, 32}) {
    for (int splits : {1, 4}) {
      problem.x().Upload(RandomBf16(static_cast<size_t>(m) * k), stream());
      const DecodeGemmConfig config{m > 8 ? 4 : 1, splits};
      SCOPED_TRACE(::testing::Message() << "m=" << m << " " << config.ToString());
      const DecodeGemmArgs args = problem.Args(m, DecodeGemmInput::kPlain, false);
      problem.y().Poison(stream());
      ASSERT_EQ(problem.Launch(args, config, stream()), cudaSuccess);
      const std::vector<float> eager = problem.y().Download(stream());
      problem.y().Poison(stream());
      ASSERT_EQ(problem.Launch(args, config, stream()), cudaSuccess);
      const std::vector<float> again = problem.y().Download(stream());

      problem.y().Poison(stream());
      ASSERT_NO_FATAL_FAILURE(CaptureAndReplay(
          stream(), 1, 3, [&] { return problem.Launch(args, config, stream()); }));
      const std::vector<float> replayed = problem.y().Download(stream());

      const size_t bytes = static_cast<size_t>(m) * n * sizeof(uint16_t);
      const std::vector<double> got = problem.Output(m, false, stream());
      for (double v : got) ASSERT_TRUE(std::isfinite(v));
      EXPECT_EQ(std::memcmp(eager.data(), again.data(), bytes), 0);
      EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), bytes), 0);
      for (int32_t c : problem.Counters(stream())) ASSERT_EQ(c, 0);
    }
  }
}

TEST_F(DecodeGemmGpuTest, RefusesUnsupportedShapes) {
  DeviceVector<uint16_t> buf(1 << 16);
  auto* p = reinterpret_cast<const __nv_bfloat16*>(buf.get());
  DecodeGemmArgs a;
  a.x = p;
  a.w = p;
  a.y = buf.get();
  a.m = 1;
  a.n = 64;
  a.k = 256;
  const DecodeGemmConfig plain{1, 1};
  EXPECT_TRUE(DecodeGemmSupports(a, plain));
  DecodeGemmArgs bad = a;
  bad.m = 0;
  EXPECT_FALSE(DecodeGemmSupports(bad, plain));
  bad.m = kDecodeGemmMaxRows + 1;
  EXPECT_FALSE(DecodeGemmSupports(bad, plain));
  bad = a;
  bad.n = 72;  // not a multiple of 16
  EXPECT_FALSE(DecodeGemmSupports(bad, plain));
  bad = a;
  bad.k = 320;  // not a multiple of 128
  EXPECT_FALSE(DecodeGemmSupports(bad, plain));
  EXPECT_FALSE(DecodeGemmSupports(a, DecodeGemmConfig{1, 4}));  // 256 / 4 is not 128-aligned
  EXPECT_FALSE(DecodeGemmSupports(a, DecodeGemmConfig{3, 1}));
  bad = a;
  bad.x = p + 1;
  EXPECT_FALSE(DecodeGemmSupports(bad, plain));
  bad = a;
  bad.input = DecodeGemmInput::kSiluMul;
  bad.float_output = true;
  EXPECT_FALSE(DecodeGemmSupports(bad, plain));
  bad = a;
  bad.k = 1 << 14;
  bad.m = 32;  // a staged x slice of 1 MiB
  EXPECT_FALSE(DecodeGemmSupports(bad, plain));
  EXPECT_EQ(LaunchDecodeGemm(bad, plain, nullptr, nullptr, stream()), cudaErrorInvalidValue);
  // Splits without a workspace.
  EXPECT_EQ(LaunchDecodeGemm(a, DecodeGemmConfig{1, 2}, nullptr, nullptr, stream()),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kiln
