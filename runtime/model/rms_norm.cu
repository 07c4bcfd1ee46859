#include "runtime/model/rms_norm.h"

#include <cuda_bf16.h>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

// Each thread keeps up to kMaxChunks vectors of its row in registers between the two passes, so
// the row is read from memory once.
constexpr int kMaxChunks = 4;
constexpr int kMaxThreads = 1024;

// kChunks vectors per thread (1: the row fits one vector per thread, as up to hidden 8192; else
// kMaxChunks). With one, the thread's weights are loaded before the wait, off the path from the
// kernel before to the kernel after (no kernel writes weights).
template <int V, bool kAddResidual, int kChunks>
__global__ void __launch_bounds__(kMaxThreads)
    RmsNormKernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                  const __nv_bfloat16* __restrict__ weight, __nv_bfloat16* out, int hidden,
                  float eps) {
  AllowDependentLaunch();  // the next GEMM may start streaming its weights
  float w[kChunks][V];
  const bool early_weights = kChunks == 1 && static_cast<int>(threadIdx.x) * V < hidden;
  if (early_weights) internal::LoadBf16<V>(weight + threadIdx.x * V, w[0]);
  WaitForPrerequisites();  // x and the residual come from the kernels before
  __shared__ float scratch[32];
  const int64_t base = int64_t{blockIdx.x} * hidden;
  float v[kChunks][V];
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col = (c * blockDim.x + threadIdx.x) * V;
    if (col < hidden) {
      internal::LoadBf16<V>(x + base + col, v[c]);
      if constexpr (kAddResidual) {
        float r[V];
        internal::LoadBf16<V>(residual + base + col, r);
#pragma unroll
        for (int i = 0; i < V; ++i) v[c][i] += r[i];
        internal::StoreBf16<V>(residual + base + col, v[c]);
        // Normalise the stored (rounded) residual, not the float sum.
#pragma unroll
        for (int i = 0; i < V; ++i) v[c][i] = __bfloat162float(__float2bfloat16_rn(v[c][i]));
      }
#pragma unroll
      for (int i = 0; i < V; ++i) sum_sq += v[c][i] * v[c][i];
    }
  }
  const float total = BlockSum(sum_sq, scratch);
  const float scale = rsqrtf(total / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col = (c * blockDim.x + threadIdx.x) * V;
    if (col < hidden) {
      if (!early_weights) internal::LoadBf16<V>(weight + col, w[c]);
#pragma unroll
      for (int i = 0; i < V; ++i) v[c][i] = v[c][i] * scale * w[c][i];
      internal::StoreBf16<V>(out + base + col, v[c]);
    }
  }
}

template <bool kAddResidual>
cudaError_t Launch(const __nv_bfloat16* x, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                   __nv_bfloat16* out, int num_tokens, int hidden, float eps,
                   cudaStream_t stream) {
  // A negative (or NaN) eps would make rsqrt's argument negative for small rows: NaN out.
  if (num_tokens < 0 || hidden <= 0 || !(eps >= 0.0f)) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  if (x == nullptr || weight == nullptr || out == nullptr ||
      (kAddResidual && residual == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const bool vec = hidden % 8 == 0 && internal::Aligned16(x) && internal::Aligned16(weight) &&
                   internal::Aligned16(out) &&
                   (!kAddResidual || internal::Aligned16(residual));
  const int V = vec ? 8 : 1;
  const int units = (hidden + V - 1) / V;
  if (units > kMaxChunks * kMaxThreads) return cudaErrorInvalidValue;
  // Enough threads that kMaxChunks per thread cover the row; at least a full row in one chunk
  // when it fits, so short rows still use many threads.
  const int threads = internal::WarpRoundedThreads(units, kMaxThreads);
  const bool one_chunk = units <= threads;
  auto kernel = vec ? (one_chunk ? RmsNormKernel<8, kAddResidual, 1>
                                 : RmsNormKernel<8, kAddResidual, kMaxChunks>)
                    : (one_chunk ? RmsNormKernel<1, kAddResidual, 1>
                                 : RmsNormKernel<1, kAddResidual, kMaxChunks>);
  // Programmatic dependent launch (internal/pdl_launch.cuh): the kernel starts while the one
  // before it finishes and waits for it before reading x.
  return internal::LaunchWithPdl(kernel, dim3(num_tokens), dim3(threads), 0, stream, x, residual,
                                 weight, out, hidden, eps);
}

}  // namespace

cudaError_t LaunchRmsNorm(const __nv_bfloat16* x, const __nv_bfloat16* weight, __nv_bfloat16* out,
                          int num_tokens, int hidden, float eps, cudaStream_t stream) {
  return Launch<false>(x, nullptr, weight, out, num_tokens, hidden, eps, stream);
}

cudaError_t LaunchFusedAddRmsNorm(const __nv_bfloat16* x, __nv_bfloat16* residual,
                                  const __nv_bfloat16* weight, __nv_bfloat16* out, int num_tokens,
                                  int hidden, float eps, cudaStream_t stream) {
  return Launch<true>(x, residual, weight, out, num_tokens, hidden, eps, stream);
}

}  // namespace kiln
