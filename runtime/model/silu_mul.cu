#include "runtime/model/silu_mul.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

constexpr int kThreads = 256;

template <int V>
__global__ void __launch_bounds__(kThreads)
    SiluMulKernel(const __nv_bfloat16* __restrict__ gate_up, __nv_bfloat16* __restrict__ out,
                  int ffn) {
  AllowDependentLaunch();  // the down projection may start streaming its weights
  WaitForPrerequisites();  // gate_up comes from the GEMM before
  const int col = (blockIdx.y * kThreads + threadIdx.x) * V;
  if (col >= ffn) return;
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* gate = gate_up + row * 2 * ffn + col;
  float g[V], u[V], y[V];
  internal::LoadBf16<V>(gate, g);
  internal::LoadBf16<V>(gate + ffn, u);
#pragma unroll
  for (int i = 0; i < V; ++i) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
  internal::StoreBf16<V>(out + row * ffn + col, y);
}

}  // namespace

cudaError_t LaunchSiluMul(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int num_tokens, int ffn,
                          cudaStream_t stream) {
  if (num_tokens < 0 || ffn <= 0) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  if (gate_up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const bool vec = ffn % 8 == 0 && internal::Aligned16(gate_up) && internal::Aligned16(out);
  const int V = vec ? 8 : 1;
  const dim3 grid(num_tokens, (ffn + V * kThreads - 1) / (V * kThreads));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return internal::LaunchWithPdl(vec ? SiluMulKernel<8> : SiluMulKernel<1>, grid, dim3(kThreads), 0,
                                 stream, gate_up, out, ffn);
}

}  // namespace kiln
