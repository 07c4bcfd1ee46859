// Test-only helpers for the graph GPU tests: status assertions, random data and host<->device
// round trips of float vectors.
#ifndef KILN_GRAPH_INTERNAL_GPU_TEST_HELPERS_H_
#define KILN_GRAPH_INTERNAL_GPU_TEST_HELPERS_H_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

// Asserts that `expr` (an absl::Status) is OK, printing it otherwise.
#define KILN_ASSERT_OK(expr)               \
  do {                                     \
    const ::absl::Status kiln_s_ = (expr); \
    ASSERT_TRUE(kiln_s_.ok()) << kiln_s_;  \
  } while (false)

#define KILN_TEST_CONCAT_INNER_(a, b) a##b
#define KILN_TEST_CONCAT_(a, b) KILN_TEST_CONCAT_INNER_(a, b)

// Asserts that `expr` (an absl::StatusOr) is OK and moves its value into `lhs`.
#define KILN_ASSERT_OK_AND_ASSIGN(lhs, expr)              \
  auto KILN_TEST_CONCAT_(kiln_or_, __LINE__) = (expr);    \
  ASSERT_TRUE(KILN_TEST_CONCAT_(kiln_or_, __LINE__).ok()) \
      << KILN_TEST_CONCAT_(kiln_or_, __LINE__).status();  \
  lhs = std::move(KILN_TEST_CONCAT_(kiln_or_, __LINE__)).value()

namespace kiln {
namespace graph_internal {

// Returns `n` fresh random floats in [-2, -0.25] u [0.25, 2] (never zero).
inline std::vector<float> RandomFloats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> magnitude(0.25f, 2.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> out(n);
  for (float& v : out) v = negative(rng) ? -magnitude(rng) : magnitude(rng);
  return out;
}

// Copies `host` to device `dst` and waits for the whole device (the tests' streams are
// non-blocking, so the legacy stream's copy is not ordered with them otherwise).
inline absl::Status Upload(void* dst, const std::vector<float>& host) {
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(dst, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) !=
          cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    return absl::InternalError("Upload failed");
  }
  return absl::OkStatus();
}

// Copies `n` floats from device `src` after waiting for all device work.
inline absl::StatusOr<std::vector<float>> Download(const void* src, size_t n) {
  std::vector<float> host(n);
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(host.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
    return absl::InternalError(std::string("Download failed: ") +
                               cudaGetErrorString(cudaGetLastError()));
  }
  return host;
}

// Fills `n` floats at `dst` with NaN bytes (0xFF), so an element nothing writes fails.
inline absl::Status PoisonFloats(void* dst, size_t n) {
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemset(dst, 0xFF, n * sizeof(float)) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    return absl::InternalError("Poison failed");
  }
  return absl::OkStatus();
}

// Returns ||got - want|| / ||want|| over the first want.size() elements (inf on NaN).
inline double RelativeError(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace graph_internal
}  // namespace kiln

#endif  // KILN_GRAPH_INTERNAL_GPU_TEST_HELPERS_H_
