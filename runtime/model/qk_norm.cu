#include "runtime/model/qk_norm.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "attention/qk_norm_math.cuh"
#include "runtime/cuda/device_helpers.cuh"
#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

constexpr int kThreads = 256;
constexpr int kHeadsPerBlock = kThreads / 4;           // one quad of lanes a head
constexpr int kMaxPieces = kQkNormMaxHeadDim / 32;     // 8-value pieces a lane holds at most

__global__ void __launch_bounds__(kThreads)
    QkNormKernel(__nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ q_norm,
                 const __nv_bfloat16* __restrict__ k_norm, int heads, int kv_heads, int head_dim,
                 float eps) {
  const int t = threadIdx.x % 4;
  const int head = blockIdx.y * kHeadsPerBlock + threadIdx.x / 4;  // q heads, then k heads
  const bool active = head < heads + kv_heads;
  const __nv_bfloat16* weight = head < heads ? q_norm : k_norm;
  uint4 w[kMaxPieces];
#pragma unroll
  for (int c = 0; c < kMaxPieces; ++c) {  // static data: before the wait
    const int at = 32 * c + 8 * t;
    w[c] = active && at < head_dim ? *reinterpret_cast<const uint4*>(weight + at) : uint4{};
  }
  WaitForPrerequisites();  // qkv comes from the GEMM (or bias) before
  AllowDependentLaunch();
  if (!active) return;
  __nv_bfloat16* x = qkv + int64_t{blockIdx.x} * (heads + 2 * kv_heads) * head_dim +
                     int64_t{head} * head_dim;
  uint4 v[kMaxPieces];
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kMaxPieces; ++c) {
    const int at = 32 * c + 8 * t;
    if (at < head_dim) {
      v[c] = *reinterpret_cast<const uint4*>(x + at);
      s = QkNormSumSquares(v[c], s);
    }
  }
  const unsigned quad = 0xfu << (threadIdx.x % 32 & ~3u);
  const float scale = QkNormScale(QkNormQuadSum(s, quad), head_dim, eps);
#pragma unroll
  for (int c = 0; c < kMaxPieces; ++c) {
    const int at = 32 * c + 8 * t;
    if (at < head_dim) *reinterpret_cast<uint4*>(x + at) = QkNormApply(v[c], w[c], scale);
  }
}

}  // namespace

cudaError_t LaunchQkNorm(__nv_bfloat16* qkv, const __nv_bfloat16* q_norm,
                         const __nv_bfloat16* k_norm, int num_tokens, int heads, int kv_heads,
                         int head_dim, float eps, cudaStream_t stream) {
  if (num_tokens < 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0 || head_dim % 8 != 0 ||
      head_dim > kQkNormMaxHeadDim || !(eps > 0.0f) || qkv == nullptr || q_norm == nullptr ||
      k_norm == nullptr || !internal::Aligned16(qkv) || !internal::Aligned16(q_norm) ||
      !internal::Aligned16(k_norm)) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  const dim3 grid(num_tokens, (heads + kv_heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return internal::LaunchWithPdl(QkNormKernel, grid, dim3(kThreads), 0, stream, qkv, q_norm,
                                 k_norm, heads, kv_heads, head_dim, eps);
}

}  // namespace kiln
