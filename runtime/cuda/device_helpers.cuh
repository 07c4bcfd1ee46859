// Device helpers every kernel package of kiln shares: programmatic dependent launch, a counter
// for the last CTA of a split, 16-byte vectors of bf16 as floats, and warp and block sums in a
// fixed order. Header-only; included by .cu files only.
//
//   __global__ void Kernel(...) {
//     kiln::AllowDependentLaunch();   // the next kernel may start its own prologue now
//     ... read only what no kernel of the step writes (weights, uploaded metadata) ...
//     kiln::WaitForPrerequisites();   // the kernel before has completed; its writes are visible
//   }
#ifndef KILN_RUNTIME_CUDA_DEVICE_HELPERS_CUH_
#define KILN_RUNTIME_CUDA_DEVICE_HELPERS_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace kiln {

// Lets a kernel launched after this one with programmatic dependent launch (PDL) start now, so
// its independent prologue (e.g. streaming weights) overlaps this kernel; the dependent still
// waits for this kernel's completion (griddepcontrol.wait) before it reads what this one writes.
// A no-op when the next kernel is not launched with PDL, and before sm_90.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until every kernel this one depends on through PDL has completed and its memory is
// visible. Returns at once when the kernel was launched without PDL, and before sm_90. Every
// block of a kernel must wait (also one with nothing to do), so that the kernel completes only
// after its predecessor and completion stays transitive along the stream.
__device__ __forceinline__ void WaitForPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Adds one to `counter` (shared by the CTAs of a launch) and returns the value before, with
// acquire and release at GPU scope: after a CTA barrier, one thread's count publishes its whole
// CTA's writes, and the CTA that counts last sees every earlier counter's writes after a CTA
// barrier following the count. The last-CTA-reduces pattern without a fence in every thread.
__device__ __forceinline__ int32_t CountAcqRel(int32_t* counter) {
  int32_t before;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;"
               : "=r"(before)
               : "l"(counter)
               : "memory");
  return before;
}

// The 8 bf16 values of a 16-byte vector as floats.
__device__ __forceinline__ void UnpackBf16x8(const uint4& raw, float (&out)[8]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// 8 floats rounded to bf16 (to nearest even) as one 16-byte vector.
__device__ __forceinline__ uint4 PackBf16x8(const float (&in)[8]) {
  uint4 raw;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return raw;
}

// Sums `value` over the 32 lanes of the warp by an xor butterfly; every lane gets the sum.
__device__ __forceinline__ float WarpSum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Sums `value` over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order (each
// warp's butterfly, then a butterfly over the warp sums), so the result is the same on every
// run; every thread receives the sum. `scratch` holds 32 floats.
__device__ __forceinline__ float BlockSum(float value, float* scratch) {
  value = WarpSum(value);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  return WarpSum(lane < warps ? scratch[lane] : 0.0f);
}

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_DEVICE_HELPERS_CUH_
