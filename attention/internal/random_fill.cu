#include "attention/internal/random_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kiln {
namespace attention_internal {
namespace {

__device__ uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void FillKernel(uint16_t* data, size_t count, uint64_t seed, bool bf16) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(Mix(seed ^ (i * 0x2545f4914f6cdd1dull)) >> 40) *
                        (2.f / 16777216.f) -
                    1.f;
    if (bf16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(u);
      data[i] = *reinterpret_cast<const uint16_t*>(&b);
    } else {
      const __half h = __float2half_rn(u);
      data[i] = *reinterpret_cast<const uint16_t*>(&h);
    }
  }
}

}  // namespace

cudaError_t FillRandom16(void* data, size_t count, uint64_t seed, bool bf16, cudaStream_t stream) {
  FillKernel<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(data), count, seed, bf16);
  return cudaGetLastError();
}

}  // namespace attention_internal
}  // namespace kiln
