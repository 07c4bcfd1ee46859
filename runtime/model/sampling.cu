#include "runtime/model/sampling.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

constexpr int kThreads = 1024;

struct Best {
  float value;
  int32_t index;  // -1: nothing seen yet
};

// Returns whether (value, index) beats `best`: larger, or equal with a lower index. NaN
// compares false everywhere, so it never replaces anything.
__device__ __forceinline__ bool Beats(float value, int32_t index, const Best& best) {
  return best.index < 0 ? !isnan(value)
                        : (value > best.value || (value == best.value && index < best.index));
}

__device__ __forceinline__ void Offer(float value, int32_t index, Best& best) {
  if (Beats(value, index, best)) best = {value, index};
}

template <typename T>
struct Loader;

// 8 bf16 values per 16-byte load.
template <>
struct Loader<__nv_bfloat16> {
  static constexpr int kVec = 8;
  __device__ static void Load(const __nv_bfloat16* p, float (&out)[kVec]) {
    internal::LoadBf16<8>(p, out);
  }
  __device__ static float LoadOne(const __nv_bfloat16* p) { return __bfloat162float(*p); }
};

// 4 floats per 16-byte load.
template <>
struct Loader<float> {
  static constexpr int kVec = 4;
  __device__ static void Load(const float* p, float (&out)[kVec]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
  __device__ static float LoadOne(const float* p) { return *p; }
};

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    GreedySampleKernel(const T* __restrict__ logits, int vocab, int32_t* __restrict__ tokens) {
  constexpr int kVec = Loader<T>::kVec;
  internal::AllowDependentLaunch();
  internal::WaitForPrerequisites();  // the logits come from the GEMM before
  const T* row = logits + int64_t{blockIdx.x} * vocab;
  Best best{0.0f, -1};
  // Each thread visits its indices in increasing order, so among its own ties it keeps the
  // lowest; the cross-thread reduction below breaks remaining ties by index.
  if constexpr (kVector) {
    const int vectors = vocab / kVec;
    for (int v = threadIdx.x; v < vectors; v += kThreads) {
      float x[kVec];
      Loader<T>::Load(row + v * kVec, x);
#pragma unroll
      for (int i = 0; i < kVec; ++i) Offer(x[i], v * kVec + i, best);
    }
  } else {
    for (int j = threadIdx.x; j < vocab; j += kThreads) Offer(Loader<T>::LoadOne(row + j), j, best);
  }
  // Warp, then block reduction of (value, index) pairs.
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_value = __shfl_xor_sync(0xffffffffu, best.value, offset);
    const int32_t other_index = __shfl_xor_sync(0xffffffffu, best.index, offset);
    if (other_index >= 0) Offer(other_value, other_index, best);
  }
  __shared__ Best warp_best[kThreads / 32];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = warp_best[lane];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other_value = __shfl_xor_sync(0xffffffffu, best.value, offset);
      const int32_t other_index = __shfl_xor_sync(0xffffffffu, best.index, offset);
      if (other_index >= 0) Offer(other_value, other_index, best);
    }
    if (lane == 0) tokens[blockIdx.x] = best.index;
  }
}

template <typename T>
cudaError_t Launch(const T* logits, int num_rows, int vocab, int32_t* tokens, cudaStream_t stream) {
  if (num_rows < 0 || vocab <= 0) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  // A row stays 16-byte aligned only if vocab is a multiple of the vector width.
  const bool vec = vocab % Loader<T>::kVec == 0 && internal::Aligned16(logits);
  return internal::LaunchWithPdl(vec ? GreedySampleKernel<T, true> : GreedySampleKernel<T, false>,
                                 dim3(num_rows), dim3(kThreads), 0, stream, logits, vocab, tokens);
}

}  // namespace

cudaError_t LaunchGreedySample(const __nv_bfloat16* logits, int num_rows, int vocab,
                               int32_t* tokens, cudaStream_t stream) {
  return Launch(logits, num_rows, vocab, tokens, stream);
}

cudaError_t LaunchGreedySample(const float* logits, int num_rows, int vocab, int32_t* tokens,
                               cudaStream_t stream) {
  return Launch(logits, num_rows, vocab, tokens, stream);
}

}  // namespace kiln
