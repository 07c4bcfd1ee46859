// Internal: per-dtype tensor-core and conversion helpers shared by the attention kernels.
// Included by .cu files only.
#ifndef KILN_ATTENTION_INTERNAL_MMA_CUH_
#define KILN_ATTENTION_INTERNAL_MMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/attention_params.h"

namespace kiln {
namespace attention_internal {

template <AttentionDtype kDtype>
struct DtypeOps;

template <>
struct DtypeOps<AttentionDtype::kBf16> {
  // Packs two floats into one register, `lo` in the low half (round to nearest even).
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  // The two values of a packed register, low half first.
  __device__ __forceinline__ static float2 Unpack(uint32_t bits) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
  }
  // d += a · b for one m16n8k16 tile (A row-major 16×16, B column-major 16×8, float C/D).
  __device__ __forceinline__ static void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct DtypeOps<AttentionDtype::kFp16> {
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  __device__ __forceinline__ static float2 Unpack(uint32_t bits) {
    return __half22float2(*reinterpret_cast<const __half2*>(&bits));
  }
  __device__ __forceinline__ static void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// 2^x with the special-function unit (x = -inf gives +0).
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float NegativeInfinity() { return __int_as_float(0xff800000); }

// 16-byte read-only load, not kept in L1: KV pages are read once per CTA.
__device__ __forceinline__ uint4 LoadStreaming(const void* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

// The four 32-bit words of a 16-byte load (the registers an MMA fragment takes).
__device__ __forceinline__ void ToWords(const uint4& v, uint32_t (&w)[4]) {
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_MMA_CUH_
