#include "runtime/model/bias_add.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

constexpr int kThreads = 256;

template <int V>
__global__ void __launch_bounds__(kThreads)
    BiasAddKernel(__nv_bfloat16* __restrict__ y, const __nv_bfloat16* __restrict__ bias,
                  int width) {
  const int col = (blockIdx.y * kThreads + threadIdx.x) * V;
  float b[V];
  if (col < width) internal::LoadBf16<V>(bias + col, b);  // static data: before the wait
  WaitForPrerequisites();                                  // y comes from the GEMM before
  AllowDependentLaunch();
  if (col >= width) return;
  __nv_bfloat16* row = y + int64_t{blockIdx.x} * width + col;
  float v[V];
  internal::LoadBf16<V>(row, v);
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] += b[i];
  internal::StoreBf16<V>(row, v);
}

}  // namespace

cudaError_t LaunchBiasAdd(__nv_bfloat16* y, const __nv_bfloat16* bias, int num_tokens, int width,
                          cudaStream_t stream) {
  if (num_tokens < 0 || width <= 0 || y == nullptr || bias == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  const bool vec = width % 8 == 0 && internal::Aligned16(y) && internal::Aligned16(bias);
  const int V = vec ? 8 : 1;
  const dim3 grid(num_tokens, (width + V * kThreads - 1) / (V * kThreads));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return internal::LaunchWithPdl(vec ? BiasAddKernel<8> : BiasAddKernel<1>, grid, dim3(kThreads), 0,
                                 stream, y, bias, width);
}

}  // namespace kiln
