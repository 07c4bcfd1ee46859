// The skinny GEMM against a CPU float64 product, for every row count it takes, both output types,
// odd column counts and long rows; repeated runs are bitwise identical.
#include "runtime/model/skinny_gemm.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/bf16.h"
#include "runtime/model/internal/gpu_test_helpers.h"

namespace kiln {
namespace {

using testing_internal::DeviceVector;
using testing_internal::GpuTest;
using testing_internal::RelativeError;

class SkinnyGemmGpuTest : public GpuTest {};

std::vector<double> Reference(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                              int m, int n, int k) {
  std::vector<double> y(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int e = 0; e < k; ++e) {
        sum += double{Bf16BitsToFloat(x[static_cast<size_t>(i) * k + e])} *
               Bf16BitsToFloat(w[static_cast<size_t>(j) * k + e]);
      }
      y[static_cast<size_t>(i) * n + j] = sum;
    }
  }
  return y;
}

TEST_F(SkinnyGemmGpuTest, MatchesFloat64ForEveryRowCount) {
  struct Shape {
    int n, k;
  };
  for (const Shape& shape : {Shape{96, 256}, Shape{333, 2048}, Shape{17, 8200}, Shape{40, 8}}) {
    const std::vector<uint16_t> w = RandomBf16(static_cast<size_t>(shape.n) * shape.k);
    DeviceVector<uint16_t> w_dev(w, stream());
    for (int m = 1; m <= kSkinnyGemmMaxRows; ++m) {
      for (bool float_output : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << shape.n << " k=" << shape.k
                                          << " float=" << float_output);
        const std::vector<uint16_t> x = RandomBf16(static_cast<size_t>(m) * shape.k);
        DeviceVector<uint16_t> x_dev(x, stream());
        DeviceVector<float> y_dev(static_cast<size_t>(m) * shape.n);
        y_dev.Poison(stream());
        auto* xp = reinterpret_cast<const __nv_bfloat16*>(x_dev.get());
        auto* wp = reinterpret_cast<const __nv_bfloat16*>(w_dev.get());
        ASSERT_TRUE(SkinnyGemmSupports(m, shape.k, xp, wp, y_dev.get()));
        ASSERT_EQ(LaunchSkinnyGemm(xp, wp, y_dev.get(), m, shape.n, shape.k, float_output,
                                   stream()),
                  cudaSuccess);
        const std::vector<float> first = y_dev.Download(stream());
        std::vector<double> got(static_cast<size_t>(m) * shape.n);
        for (size_t i = 0; i < got.size(); ++i) {
          if (float_output) {
            got[i] = first[i];
          } else {
            uint16_t bits;
            std::memcpy(&bits, reinterpret_cast<const char*>(first.data()) + 2 * i, 2);
            got[i] = Bf16BitsToFloat(bits);
          }
        }
        const double err = RelativeError(got, Reference(x, w, m, shape.n, shape.k));
        EXPECT_LT(err, float_output ? 1e-5 : 6e-3);

        // Same shape again: bit for bit.
        y_dev.Poison(stream());
        ASSERT_EQ(LaunchSkinnyGemm(xp, wp, y_dev.get(), m, shape.n, shape.k, float_output,
                                   stream()),
                  cudaSuccess);
        const std::vector<float> second = y_dev.Download(stream());
        const size_t bytes = static_cast<size_t>(m) * shape.n * (float_output ? 4 : 2);
        EXPECT_EQ(std::memcmp(first.data(), second.data(), bytes), 0);
      }
    }
  }
}

TEST_F(SkinnyGemmGpuTest, RejectsUnsupportedShapes) {
  DeviceVector<uint16_t> buf(4096);
  auto* p = reinterpret_cast<const __nv_bfloat16*>(buf.get());
  EXPECT_FALSE(SkinnyGemmSupports(0, 64, p, p, buf.get()));
  EXPECT_FALSE(SkinnyGemmSupports(kSkinnyGemmMaxRows + 1, 64, p, p, buf.get()));
  EXPECT_FALSE(SkinnyGemmSupports(1, 12, p, p, buf.get()));
  EXPECT_FALSE(SkinnyGemmSupports(1, 64, p + 1, p, buf.get()));
  EXPECT_EQ(LaunchSkinnyGemm(p, p, buf.get(), 9, 8, 64, false, stream()), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSkinnyGemm(p, p, buf.get(), 1, 0, 64, false, stream()), cudaErrorInvalidValue);
}

// Null tensors are refused like misaligned ones, before any launch (this case needs no GPU).
TEST(SkinnyGemmTest, RejectsNullTensors) {
  alignas(16) static uint16_t buffer[64];
  auto* p = reinterpret_cast<const __nv_bfloat16*>(buffer);
  EXPECT_FALSE(SkinnyGemmSupports(1, 64, nullptr, p, buffer));
  EXPECT_FALSE(SkinnyGemmSupports(1, 64, p, nullptr, buffer));
  EXPECT_FALSE(SkinnyGemmSupports(1, 64, p, p, nullptr));
  EXPECT_EQ(LaunchSkinnyGemm(nullptr, p, buffer, 1, 8, 64, false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSkinnyGemm(p, p, nullptr, 1, 8, 64, true, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kiln
