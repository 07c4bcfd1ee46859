#include "runtime/model/skinny_gemm.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
// 16-byte weight vectors each lane loads before it uses any: 8 × 16 B × 32 lanes = 4 KiB in
// flight per warp, a whole row of a k = 2048 projection.
constexpr int kUnroll = 8;

// Loads the kUnroll weight vectors of this lane starting at vector `base` of the row.
__device__ __forceinline__ void LoadWeights(const uint4* w_row, int64_t base, int64_t vectors,
                                            int lane, uint4 (&wv)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t v = base + u * 32 + lane;
    wv[u] = v < vectors ? internal::LoadStreaming(w_row + v) : make_uint4(0, 0, 0, 0);
  }
}

template <typename OutT>
__device__ __forceinline__ void Store(OutT* p, float v);
template <>
__device__ __forceinline__ void Store<float>(float* p, float v) {
  *p = v;
}
template <>
__device__ __forceinline__ void Store<__nv_bfloat16>(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// One warp per output column `col` (row `col` of W); M rows of x.
template <int M, typename OutT>
__global__ void __launch_bounds__(kThreads)
    SkinnyGemmKernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                     OutT* __restrict__ y, int64_t n, int64_t k) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (col >= n) return;  // the whole warp leaves; no block-wide synchronisation follows
  const int64_t vectors = k / 8;
  const uint4* w_row = reinterpret_cast<const uint4*>(w + col * k);
  const uint4* x_rows = reinterpret_cast<const uint4*>(x);

  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;

  // The first weights are independent of the kernels before this one: with PDL they stream in
  // while those finish; x is read only after WaitForPrerequisites.
  uint4 wv[kUnroll];
  LoadWeights(w_row, 0, vectors, lane, wv);
  WaitForPrerequisites();
  AllowDependentLaunch();
  for (int64_t base = 0; base < vectors; base += 32 * kUnroll) {
    if (base > 0) LoadWeights(w_row, base, vectors, lane, wv);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + u * 32 + lane;
      if (v < vectors) {
        float wf[8];
        UnpackBf16x8(wv[u], wf);
#pragma unroll
        for (int i = 0; i < M; ++i) {
          float xf[8];
          UnpackBf16x8(__ldg(x_rows + i * vectors + v), xf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[i] = fmaf(wf[e], xf[e], acc[i]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], offset);
    }
  }
  if (lane < M) {
    // Lane i writes row i (every lane holds every sum after the butterfly).
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (i == lane) Store<OutT>(y + i * n + col, acc[i]);
    }
  }
}

template <int M, typename OutT>
cudaError_t Launch(const __nv_bfloat16* x, const __nv_bfloat16* w, OutT* y, int64_t n, int64_t k,
                   cudaStream_t stream) {
  const int64_t blocks = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // Programmatic dependent launch: the kernel may start while the one before it finishes (see
  // the kernel); Hopper and later only.
  return internal::LaunchWithPdl(SkinnyGemmKernel<M, OutT>, dim3(static_cast<unsigned>(blocks)),
                                 dim3(kThreads), 0, stream, x, w, y, n, k);
}

template <typename OutT>
cudaError_t Dispatch(const __nv_bfloat16* x, const __nv_bfloat16* w, OutT* y, int64_t m, int64_t n,
                     int64_t k, cudaStream_t stream) {
  switch (m) {
    case 1: return Launch<1>(x, w, y, n, k, stream);
    case 2: return Launch<2>(x, w, y, n, k, stream);
    case 3: return Launch<3>(x, w, y, n, k, stream);
    case 4: return Launch<4>(x, w, y, n, k, stream);
    case 5: return Launch<5>(x, w, y, n, k, stream);
    case 6: return Launch<6>(x, w, y, n, k, stream);
    case 7: return Launch<7>(x, w, y, n, k, stream);
    case 8: return Launch<8>(x, w, y, n, k, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool SkinnyGemmSupports(int64_t m, int64_t k, const void* x, const void* w, const void* y) {
  return m >= 1 && m <= kSkinnyGemmMaxRows && k > 0 && k % 8 == 0 && x != nullptr &&
         w != nullptr && y != nullptr && internal::Aligned16(x) && internal::Aligned16(w) &&
         internal::Aligned16(y);
}

cudaError_t LaunchSkinnyGemm(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, int64_t m,
                             int64_t n, int64_t k, bool float_output, cudaStream_t stream) {
  if (!SkinnyGemmSupports(m, k, x, w, y) || n < 1 || (n + kWarpsPerBlock - 1) / kWarpsPerBlock >
                                                         int64_t{0x7fffffff}) {
    return cudaErrorInvalidValue;
  }
  if (float_output) return Dispatch(x, w, static_cast<float*>(y), m, n, k, stream);
  return Dispatch(x, w, static_cast<__nv_bfloat16*>(y), m, n, k, stream);
}

}  // namespace kiln
