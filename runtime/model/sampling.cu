#include "runtime/model/sampling.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <limits>

#include "runtime/model/internal/pdl_launch.cuh"
#include "runtime/model/internal/vec.cuh"

namespace kiln {
namespace {

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

// 8 bf16 values per 16-byte load. __ldg, not internal::LoadBf16<8>: once inlined, the latter's
// uint4 is split into four 4-byte loads, and the scan is bound by the loads in flight.
template <>
struct Loader<__nv_bfloat16> {
  static constexpr int kVec = 8;
  __device__ static void Load(const __nv_bfloat16* p, float (&out)[kVec]) {
    UnpackBf16x8(__ldg(reinterpret_cast<const uint4*>(p)), out);
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

// One 1024-thread block per row, each thread waiting on one 16-byte load at a time (~31 of them
// for a 128256-wide float row), took 21.5 us on an H200 for 1 row and for 32: latency, not
// bandwidth. A cluster of 8 CTAs per row (the portable cluster size) cuts each CTA's slice to an
// eighth, and each thread issues all its loads of a round before it compares any, so one round
// of 8 × 512 × 32 elements covers a whole Llama 3 row (131072 ≥ 128256).
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kClusterCtas = 8;
constexpr int kRoundElements = 32;  // elements each thread loads before it reduces them
constexpr int kMaxRows = kGreedySampleMaxRows;
// Indices and loop counters are int: a thread's last round may look up to a round's elements
// past the row's end, which must not wrap.
constexpr int kMaxVocab = std::numeric_limits<int32_t>::max() - kRoundElements * kThreads;

// Reduces `best` over the warp's lanes by an xor butterfly; every lane gets the result, which
// does not depend on the order since Beats orders any two seen entries the same way.
__device__ __forceinline__ Best WarpBest(Best best) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_value = __shfl_xor_sync(0xffffffffu, best.value, offset);
    const int32_t other_index = __shfl_xor_sync(0xffffffffu, best.index, offset);
    if (other_index >= 0) Offer(other_value, other_index, best);
  }
  return best;
}

// grid (CTAs per row, num_rows), kThreads threads. With CTAs per row > 1 (sm_90+ only) the
// launch groups a row's CTAs into one cluster: CTA c scans the c-th slice of the row and rank 0
// combines the CTAs' results through distributed shared memory. With 1 (below sm_90, where
// there are no clusters) the CTA scans the whole row.
template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    GreedySampleKernel(const T* __restrict__ logits, int vocab, int32_t* __restrict__ tokens,
                       int32_t* __restrict__ mirror) {
  constexpr int kWidth = kVector ? Loader<T>::kVec : 1;  // elements per load
  constexpr int kLoads = kRoundElements / kWidth;        // loads in flight per thread
  AllowDependentLaunch();
  WaitForPrerequisites();  // the logits come from the GEMM before
  const int row_index = blockIdx.y;
  const int ctas = gridDim.x;  // CTAs per row
  const T* row = logits + int64_t{row_index} * vocab;
  // This CTA's slice, in loads: whole vectors, so 16-byte loads stay aligned. Rounding the
  // slice up leaves the last CTAs a shorter slice, or none when the row is tiny.
  const int loads = vocab / kWidth;  // exact: the vector path needs vocab % kVec == 0
  const int slice = (loads + ctas - 1) / ctas;
  const int begin = min(static_cast<int>(blockIdx.x) * slice, loads);
  const int end = min(begin + slice, loads);
  Best best{0.0f, -1};
  // Each thread visits its indices in increasing order, so among its own ties it keeps the
  // lowest; the reductions below break remaining ties by index.
  for (int first = begin + threadIdx.x; first < end; first += kLoads * kThreads) {
    float x[kLoads][kWidth];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int v = first + u * kThreads;
      if (v >= end) {
#pragma unroll
        for (int i = 0; i < kWidth; ++i) x[u][i] = __int_as_float(0x7fc00000);  // NaN never wins
      } else if constexpr (kVector) {
        Loader<T>::Load(row + v * kWidth, x[u]);
      } else {
        x[u][0] = Loader<T>::LoadOne(row + v);
      }
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
#pragma unroll
      for (int i = 0; i < kWidth; ++i) Offer(x[u][i], (first + u * kThreads) * kWidth + i, best);
    }
  }
  // Warp, then block reduction of (value, index) pairs: warp 0 ends with the CTA's best.
  __shared__ Best warp_best[kWarps];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  best = WarpBest(best);
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) best = WarpBest(lane < kWarps ? warp_best[lane] : Best{0.0f, -1});
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ctas > 1) {
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    __shared__ Best cta_best;
    if (threadIdx.x == 0) cta_best = best;
    cluster.sync();  // every CTA's cta_best is written (and every CTA of the cluster started)
    if (cluster.block_rank() == 0 && warp == 0) {
      const Best other = lane < ctas ? *cluster.map_shared_rank(&cta_best, lane) : Best{0.0f, -1};
      best = WarpBest(other);
      if (lane == 0) {
        tokens[row_index] = best.index;
        if (mirror != nullptr) mirror[row_index] = best.index;
      }
    }
    cluster.sync();  // no CTA exits, freeing its shared memory, while rank 0 still reads it
    return;
  }
#endif
  if (threadIdx.x == 0) {
    tokens[row_index] = best.index;
    if (mirror != nullptr) mirror[row_index] = best.index;
  }
}

template <typename T>
cudaError_t Launch(const T* logits, int num_rows, int vocab, int32_t* tokens, cudaStream_t stream,
                   int32_t* mirror) {
  if (num_rows < 0 || num_rows > kMaxRows || vocab <= 0 || vocab > kMaxVocab) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  if (logits == nullptr || tokens == nullptr) return cudaErrorInvalidValue;
  // A row stays 16-byte aligned only if vocab is a multiple of the vector width.
  const bool vec = vocab % Loader<T>::kVec == 0 && internal::Aligned16(logits);
  // On sm_90+ a cluster of kClusterCtas CTAs per row; below, where there are no clusters, one
  // CTA per row. The shape depends only on num_rows and the GPU, so a captured graph replays for
  // any contents.
  const unsigned ctas = internal::SupportsProgrammaticLaunch() ? kClusterCtas : 1;
  return internal::LaunchWithPdlInClusters(
      vec ? GreedySampleKernel<T, true> : GreedySampleKernel<T, false>, dim3(ctas, num_rows),
      dim3(kThreads), ctas, 0, stream, logits, vocab, tokens, mirror);
}

}  // namespace

cudaError_t LaunchGreedySample(const __nv_bfloat16* logits, int num_rows, int vocab,
                               int32_t* tokens, cudaStream_t stream, int32_t* mirror) {
  return Launch(logits, num_rows, vocab, tokens, stream, mirror);
}

cudaError_t LaunchGreedySample(const float* logits, int num_rows, int vocab, int32_t* tokens,
                               cudaStream_t stream, int32_t* mirror) {
  return Launch(logits, num_rows, vocab, tokens, stream, mirror);
}

}  // namespace kiln
