// Test helpers for GPU tests: skip with a reason when the machine has too few GPUs; a path for a
// test's scratch file.
//
//   TEST(DecodeGpuTest, MatchesReference) {
//     KILN_REQUIRE_GPUS(1);
//     ...
//   }
//
// On a machine with enough GPUs the test runs; it never passes by skipping there.
#ifndef KILN_RUNTIME_CUDA_GPU_TEST_UTIL_H_
#define KILN_RUNTIME_CUDA_GPU_TEST_UTIL_H_

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "runtime/cuda/device_info.h"

// Skips the current test, naming how many GPUs it needs and how many exist, when fewer than
// `n` are visible.
#define KILN_REQUIRE_GPUS(n)                                                             \
  do {                                                                                   \
    const int kiln_gpus_ = ::kiln::DeviceCount();                                        \
    if (kiln_gpus_ < (n)) {                                                              \
      GTEST_SKIP() << "Needs " << (n) << " GPU(s), this machine has " << kiln_gpus_;     \
    }                                                                                    \
  } while (false)

namespace kiln {

// Returns `name` in the test's scratch directory: $TEST_TMPDIR under Bazel, else /tmp (the GPU
// hosts run the binaries directly).
inline std::string TestTempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_GPU_TEST_UTIL_H_
