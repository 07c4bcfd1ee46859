// Helpers shared by //runtime/model's GPU tests: a stream per test, typed device buffers filled
// from host vectors, poisoning, random bf16 data and relative error against a float64
// reference. Test-only.
#ifndef KILN_RUNTIME_MODEL_INTERNAL_GPU_TEST_HELPERS_H_
#define KILN_RUNTIME_MODEL_INTERNAL_GPU_TEST_HELPERS_H_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/gpu_test_util.h"
#include "runtime/cuda/stream.h"
#include "runtime/model/bf16.h"

namespace kiln {
namespace testing_internal {

// A device copy of a host vector (or an uninitialised buffer of n elements).
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(size_t n, const std::string& name = "test buffer") : n_(n) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(n * sizeof(T) + 16, name);
    EXPECT_TRUE(b.ok()) << b.status();
    if (b.ok()) buffer_ = *std::move(b);
  }
  DeviceVector(const std::vector<T>& host, cudaStream_t stream) : DeviceVector(host.size()) {
    Upload(host, stream);
  }

  T* get() const { return buffer_.as<T>(); }
  size_t size() const { return n_; }

  void Upload(const std::vector<T>& host, cudaStream_t stream) {
    ASSERT_LE(host.size(), n_);
    ASSERT_EQ(cudaMemcpyAsync(get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice,
                              stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  // Fills every byte with `byte` (0xFF makes bf16 and float NaN), so unwritten output fails.
  void Poison(cudaStream_t stream, int byte = 0xFF) {
    ASSERT_EQ(cudaMemsetAsync(get(), byte, n_ * sizeof(T), stream), cudaSuccess);
  }
  std::vector<T> Download(cudaStream_t stream) const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t n_;
  DeviceBuffer buffer_;
};

// Base fixture: skips without a GPU, gives each test a stream and a fresh random generator.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPUS(1);
    absl::StatusOr<Stream> s = Stream::Create();
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = *std::move(s);
    rng_.seed(std::random_device{}());
  }
  void TearDown() override {
    if (stream_.get() != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    }
  }

  cudaStream_t stream() const { return stream_.get(); }

  // Returns n bf16 values uniform in [lo, hi), as bits.
  std::vector<uint16_t> RandomBf16(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = FloatToBf16Bits(dist(rng_));
    return v;
  }
  int RandomInt(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  Stream stream_;
  std::mt19937_64 rng_;
};

inline double ToDouble(uint16_t bf16_bits) { return Bf16BitsToFloat(bf16_bits); }

// Returns ||got - ref|| / ||ref|| over all elements; infinity if any value is NaN or inf (an
// unwritten poisoned element reads as NaN).
inline double RelativeError(const std::vector<double>& got, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline std::vector<double> Bf16ToDouble(const std::vector<uint16_t>& bits) {
  std::vector<double> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = Bf16BitsToFloat(bits[i]);
  return out;
}

// Captures `launches` calls of `launch` on `stream` into a graph, replays it `replays` times and
// waits for the replays; a failed step is a gtest failure (callers wrap the call in
// ASSERT_NO_FATAL_FAILURE).
inline void CaptureAndReplay(cudaStream_t stream, int launches, int replays,
                             const std::function<cudaError_t()>& launch) {
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  for (int i = 0; i < launches; ++i) EXPECT_EQ(launch(), cudaSuccess) << "launch " << i;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int r = 0; r < replays; ++r) EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

// x as a decode-time GEMM reads it, in float64: x [m, k] itself, or, with silu_mul, SiLU(gate)·up
// of x [m, 2k] (gate the first k columns of a row, up the last k).
inline std::vector<double> GemmOperand(const std::vector<uint16_t>& x, int m, int k,
                                       bool silu_mul) {
  std::vector<double> a(static_cast<size_t>(m) * k);
  for (int i = 0; i < m; ++i) {
    for (int e = 0; e < k; ++e) {
      if (!silu_mul) {
        a[static_cast<size_t>(i) * k + e] = Bf16BitsToFloat(x[static_cast<size_t>(i) * k + e]);
      } else {
        const double g = Bf16BitsToFloat(x[static_cast<size_t>(i) * 2 * k + e]);
        const double u = Bf16BitsToFloat(x[static_cast<size_t>(i) * 2 * k + k + e]);
        a[static_cast<size_t>(i) * k + e] = g / (1.0 + std::exp(-g)) * u;
      }
    }
  }
  return a;
}

// Returns y [m, n] = a [m, k] · W^T in float64, W [n, k] in bf16 bits.
inline std::vector<double> GemmProduct(const std::vector<double>& a,
                                       const std::vector<uint16_t>& w, int m, int n, int k) {
  std::vector<float> wf(w.size());
  for (size_t i = 0; i < w.size(); ++i) wf[i] = Bf16BitsToFloat(w[i]);
  std::vector<double> y(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i) {
    const double* ai = a.data() + static_cast<size_t>(i) * k;
    for (int j = 0; j < n; ++j) {
      const float* wj = wf.data() + static_cast<size_t>(j) * k;
      double sum = 0.0;
      for (int e = 0; e < k; ++e) sum += ai[e] * wj[e];
      y[static_cast<size_t>(i) * n + j] = sum;
    }
  }
  return y;
}

// Returns SiLU(gate)·up [m, ffn] in float64 of a gate-up product [m, 2 · ffn] (the gate columns
// first).
inline std::vector<double> SiluMulOfProduct(const std::vector<double>& product, int m, int ffn) {
  std::vector<double> out(static_cast<size_t>(m) * ffn);
  for (int i = 0; i < m; ++i) {
    for (int c = 0; c < ffn; ++c) {
      const double g = product[static_cast<size_t>(i) * 2 * ffn + c];
      const double u = product[static_cast<size_t>(i) * 2 * ffn + ffn + c];
      out[static_cast<size_t>(i) * ffn + c] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  return out;
}

// Expects a GEMM's SiLU·mul output, the first m · ffn bf16 values of `fused`, to have the bits
// of `chained` (the plain GEMM followed by the SiLU·mul kernel) and to lie within `tolerance` of
// `want` (SiluMulOfProduct).
inline void ExpectSiluMulOutput(const DeviceVector<uint16_t>& fused,
                                const DeviceVector<uint16_t>& chained, int m, int ffn,
                                const std::vector<double>& want, double tolerance,
                                cudaStream_t stream) {
  const size_t count = static_cast<size_t>(m) * ffn;
  std::vector<uint16_t> got = fused.Download(stream);
  got.resize(count);
  const std::vector<uint16_t> chain = chained.Download(stream);
  EXPECT_EQ(std::memcmp(got.data(), chain.data(), count * sizeof(uint16_t)), 0);
  EXPECT_LT(RelativeError(Bf16ToDouble(got), want), tolerance);
}

}  // namespace testing_internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_GPU_TEST_HELPERS_H_
