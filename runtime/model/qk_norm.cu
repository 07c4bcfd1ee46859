#include "runtime/model/qk_norm.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "runtime/cuda/device_helpers.cuh"
#include "runtime/model/internal/pdl_launch.cuh"

namespace kiln {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kPerLane = kQkNormMaxHeadDim / 32;

__global__ void __launch_bounds__(kThreads)
    QkNormKernel(__nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ q_norm,
                 const __nv_bfloat16* __restrict__ k_norm, int heads, int kv_heads, int head_dim,
                 float eps) {
  const int lane = threadIdx.x % 32;
  const int head = blockIdx.y * kWarps + threadIdx.x / 32;  // q heads, then k heads
  const bool active = head < heads + kv_heads;
  const __nv_bfloat16* weight = head < heads ? q_norm : k_norm;
  float w[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {  // static data: before the wait
    const int i = lane + 32 * j;
    w[j] = active && i < head_dim ? __bfloat162float(weight[i]) : 0.0f;
  }
  WaitForPrerequisites();  // qkv comes from the GEMM (or bias) before
  AllowDependentLaunch();
  if (!active) return;
  const int64_t row = int64_t{blockIdx.x} * (heads + 2 * kv_heads) * head_dim;
  __nv_bfloat16* x = qkv + row + int64_t{head} * head_dim;
  float v[kPerLane];
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    v[j] = i < head_dim ? __bfloat162float(x[i]) : 0.0f;
    sum_sq += v[j] * v[j];
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  }
  const float scale = rsqrtf(sum_sq / static_cast<float>(head_dim) + eps);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < head_dim) x[i] = __float2bfloat16_rn(v[j] * scale * w[j]);
  }
}

}  // namespace

cudaError_t LaunchQkNorm(__nv_bfloat16* qkv, const __nv_bfloat16* q_norm,
                         const __nv_bfloat16* k_norm, int num_tokens, int heads, int kv_heads,
                         int head_dim, float eps, cudaStream_t stream) {
  if (num_tokens < 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0 ||
      head_dim > kQkNormMaxHeadDim || !(eps > 0.0f) || qkv == nullptr || q_norm == nullptr ||
      k_norm == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  const dim3 grid(num_tokens, (heads + kv_heads + kWarps - 1) / kWarps);
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return internal::LaunchWithPdl(QkNormKernel, grid, dim3(kThreads), 0, stream, qkv, q_norm,
                                 k_norm, heads, kv_heads, head_dim, eps);
}

}  // namespace kiln
