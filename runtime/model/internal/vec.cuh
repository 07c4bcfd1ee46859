// Vector loads and stores of V bf16 values as floats: V = 8 is one 16-byte access (the fast
// path every kernel takes when its rows are 16-byte aligned), V = 1 the scalar fallback for
// odd widths; the PDL, bf16 packing and sum helpers come from runtime/cuda/device_helpers.cuh.
// Included by the .cu files of //runtime/model only.
#ifndef KILN_RUNTIME_MODEL_INTERNAL_VEC_CUH_
#define KILN_RUNTIME_MODEL_INTERNAL_VEC_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "runtime/cuda/device_helpers.cuh"

namespace kiln {
namespace internal {

// A 16-byte load of weights: each is read once, so it skips L1 (caching it would only evict
// activations). volatile keeps it in program order with griddepcontrol.wait (it is legal before
// the wait: no kernel writes weights).
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A 16-byte load of data an earlier kernel (or another CTA of this one, after a grid barrier)
// wrote: from L2 (this SM's L1 may hold older lines of the same buffer), never moved before a
// preceding wait (volatile, memory clobber).
__device__ __forceinline__ uint4 LoadCoherent(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

template <int V>
__device__ __forceinline__ void LoadBf16(const __nv_bfloat16* p, float (&out)[V]) {
  if constexpr (V == 8) {
    UnpackBf16x8(*reinterpret_cast<const uint4*>(p), out);
  } else {
    static_assert(V == 1, "vector width must be 8 or 1");
    out[0] = __bfloat162float(*p);
  }
}

template <int V>
__device__ __forceinline__ void StoreBf16(__nv_bfloat16* p, const float (&in)[V]) {
  if constexpr (V == 8) {
    *reinterpret_cast<uint4*>(p) = PackBf16x8(in);
  } else {
    static_assert(V == 1, "vector width must be 8 or 1");
    *p = __float2bfloat16_rn(in[0]);
  }
}

// Returns whether `p` is 16-byte aligned.
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Rounds `n` up to a multiple of 32 (a whole warp), at least 32 and at most `limit`.
inline int WarpRoundedThreads(long long n, int limit) {
  long long t = (n + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > limit) t = limit;
  return static_cast<int>(t);
}

// SiLU(gate)·up of 8 packed bf16 values, rounded to bf16 as the SiLU·mul kernel does.
__device__ __forceinline__ uint4 SiluMul(const uint4& gate, const uint4& up) {
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gate);
  const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&up);
  uint4 out;
  __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 g = __bfloat1622float2(g2[i]);
    const float2 u = __bfloat1622float2(u2[i]);
    o2[i] = __floats2bfloat162_rn(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y);
  }
  return out;
}

// SiLU(gate)·up of one pair of bf16 values, as SiluMul.
__device__ __forceinline__ __nv_bfloat16 SiluMul(__nv_bfloat16 gate, __nv_bfloat16 up) {
  const float g = __bfloat162float(gate);
  const float u = __bfloat162float(up);
  return __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
}

// d += a · b on the tensor cores: one m16n8k16 step, bf16 inputs, float accumulators (the
// decode GEMM's and the prefetch GEMM's fragments, see their kernels).
__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_VEC_CUH_
