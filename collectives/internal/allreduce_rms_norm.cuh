// Internal to //collectives:custom_allreduce: device helpers shared by the pull and push kernels
// of the fused all-reduce + residual add + RMSNorm (allreduce_rms_norm.h). Both kernels use
// programmatic dependent launch (runtime/cuda/device_helpers.cuh) and every block waits for the
// kernel before, so a kernel completes only after its predecessor: the epoch protocol (a rank
// reaches call N + 2 only after its peers finished call N) relies on that. Included by .cu files
// only, after custom_allreduce_kernels.cuh.
#ifndef KILN_COLLECTIVES_INTERNAL_ALLREDUCE_RMS_NORM_CUH_
#define KILN_COLLECTIVES_INTERNAL_ALLREDUCE_RMS_NORM_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "collectives/internal/allreduce_rms_norm.h"
#include "collectives/internal/custom_allreduce_kernels.cuh"
#include "runtime/cuda/device_helpers.cuh"

namespace kiln {
namespace internal {

// Loads the norm weights of this thread's packs (before griddepcontrol.wait: no kernel writes
// them).
template <int kChunks>
__device__ __forceinline__ void LoadGamma(const AllReduceRmsNormArgs& p, uint4 (&gamma)[kChunks]) {
  const int row_packs = p.hidden / 8;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col = c * blockDim.x + threadIdx.x;
    if (col < row_packs) gamma[c] = __ldg(static_cast<const uint4*>(p.weight) + col);
  }
}

// Loads this thread's packs of a row's residual: issued before the wait for the peers, so the
// load's latency hides behind NVLink's.
template <int kChunks>
__device__ __forceinline__ void LoadResidualRow(const AllReduceRmsNormArgs& p, uint64_t base,
                                                uint4 (&res)[kChunks]) {
  const int row_packs = p.hidden / 8;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col = c * blockDim.x + threadIdx.x;
    if (col < row_packs) res[c] = static_cast<const uint4*>(p.residual)[base + col];
  }
}

// The rest of a row once `v` holds its all-reduced values (already rounded to bf16) in the
// packs t, t + blockDim.x, ... of this thread and `res` its residual: residual += v (rounded,
// written back), the sum of squares of the rounded residual in rms_norm.cu's order, out =
// residual * rsqrt(mean + eps) * weight. Every thread of the block calls it (it synchronises).
template <int kChunks>
__device__ __forceinline__ void AddNormRow(const AllReduceRmsNormArgs& p, uint64_t base,
                                           float (&v)[kChunks][8], const uint4 (&res)[kChunks],
                                           const uint4 (&gamma)[kChunks], float* scratch) {
  const int row_packs = p.hidden / 8;
  uint4* residual = static_cast<uint4*>(p.residual);
  uint4* out = static_cast<uint4*>(p.base.out);
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col = c * blockDim.x + threadIdx.x;
    if (col < row_packs) {
      float r[8];
      UnpackBf16x8(res[c], r);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[c][i] += r[i];
      residual[base + col] = PackBf16x8(v[c]);
      // Normalise the stored (rounded) residual, not the float sum.
#pragma unroll
      for (int i = 0; i < 8; ++i) v[c][i] = __bfloat162float(__float2bfloat16_rn(v[c][i]));
#pragma unroll
      for (int i = 0; i < 8; ++i) sum_sq += v[c][i] * v[c][i];
    }
  }
  const float total = BlockSum(sum_sq, scratch);
  const float scale = rsqrtf(total / static_cast<float>(p.hidden) + p.eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col = c * blockDim.x + threadIdx.x;
    if (col < row_packs) {
      float w[8];
      UnpackBf16x8(gamma[c], w);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[c][i] = v[c][i] * scale * w[i];
      out[base + col] = PackBf16x8(v[c]);
    }
  }
  __syncthreads();  // every thread read `scratch` before the next row's sum overwrites it
}

// The last block to finish advances the call counter (stream order, and for a PDL successor
// griddepcontrol.wait, makes the next kernel see it). A grid of one block (a decode step of one
// token) skips the atomic: its round trip to L2 delays the kernel's completion.
__device__ __forceinline__ void FinishCall(const CustomAllReduceArgs& a, uint64_t epoch) {
  if (threadIdx.x == 0 && gridDim.x == 1) {
    volatile AllReduceControl* control = a.control;
    control->epoch = epoch + 1;
  } else if (threadIdx.x == 0) {
    const unsigned prev = atomicAdd(&a.control->blocks_done, 1u);
    if (prev == gridDim.x - 1) {
      volatile AllReduceControl* control = a.control;
      control->blocks_done = 0;
      control->epoch = epoch + 1;
    }
  }
}

bool RmsNormSupportsProgrammaticLaunch();

// Launches kernel<W, chunks> (chunks 1, 2 or 4 from the row width) with PDL where supported.
template <template <int, int> class KernelOf, int W>
cudaError_t LaunchRmsNormKernel(const AllReduceRmsNormArgs& args, int blocks,
                                cudaStream_t stream) {
  const int threads = AllReduceRmsNormThreads(args.hidden);
  const int chunks = (args.hidden / 8 + threads - 1) / threads;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = RmsNormSupportsProgrammaticLaunch() ? 1 : 0;
  switch (chunks) {
    case 1:
      return cudaLaunchKernelEx(&config, KernelOf<W, 1>::kernel, args);
    case 2:
      return cudaLaunchKernelEx(&config, KernelOf<W, 2>::kernel, args);
    default:
      return cudaLaunchKernelEx(&config, KernelOf<W, kRmsNormChunks>::kernel, args);
  }
}

}  // namespace internal
}  // namespace kiln

#endif  // KILN_COLLECTIVES_INTERNAL_ALLREDUCE_RMS_NORM_CUH_
