// Test helpers for GPU tests: skip with a reason when the machine has too few GPUs.
//
//   TEST(DecodeGpuTest, MatchesReference) {
//     KILN_REQUIRE_GPUS(1);
//     ...
//   }
//
// On a machine with enough GPUs the test runs; it never passes by skipping there.
#ifndef KILN_RUNTIME_CUDA_GPU_TEST_UTIL_H_
#define KILN_RUNTIME_CUDA_GPU_TEST_UTIL_H_

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

#endif  // KILN_RUNTIME_CUDA_GPU_TEST_UTIL_H_
