#include "runtime/cuda/compute_capability.h"

#include <cuda_runtime_api.h>

namespace kiln {

bool CurrentDeviceIsSm90OrLater() {
  static const bool answer = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return answer;
}

}  // namespace kiln
