// Device code: the per-head RMSNorm of a query or key head (Qwen3's q_norm and k_norm), the
// arithmetic runtime/model's QK norm kernel and decode attention (when it norms and rotates the
// step's new q and k itself) both use, so that both produce the same bits. Included by .cu files
// only.
//
// A head of d values (d a multiple of 8) is held by four lanes of a warp, a quad: lane t of the
// quad holds the 8-value pieces that start at 32c + 8t for c = 0, 1, ... (the fragments decode
// attention loads). Each lane sums its squares piece by piece in that order, the quad adds the
// lanes' sums (lane t + (t ^ 1), then + (t ^ 2)), and every value becomes
// bf16(x · rsqrt(sum / d + eps) · w):
//
//   float s = 0.f;
//   for (int c = 0; 32 * c + 8 * t < d; ++c) s = kiln::QkNormSumSquares(piece[c], s);
//   s = kiln::QkNormQuadSum(s, quad_mask);
//   const float scale = kiln::QkNormScale(s, d, eps);
//   for (...) piece[c] = kiln::QkNormApply(piece[c], weight_piece[c], scale);
#ifndef KILN_ATTENTION_QK_NORM_MATH_CUH_
#define KILN_ATTENTION_QK_NORM_MATH_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace kiln {

// Returns s plus the squares of the 8 bf16 values of `piece` (in memory order), each added with a
// fused multiply-add so the bits do not depend on how a compiler contracts the sum.
__device__ __forceinline__ float QkNormSumSquares(const uint4& piece, float s) {
  const uint32_t words[4] = {piece.x, piece.y, piece.z, piece.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float lo = __uint_as_float(words[w] << 16);
    const float hi = __uint_as_float(words[w] & 0xffff0000u);
    s = __fmaf_rn(lo, lo, s);
    s = __fmaf_rn(hi, hi, s);
  }
  return s;
}

// Returns the quad's total of `s` (the lanes of `mask`, which holds the quad, all call it).
__device__ __forceinline__ float QkNormQuadSum(float s, unsigned mask) {
  s = __fadd_rn(s, __shfl_xor_sync(mask, s, 1));
  return __fadd_rn(s, __shfl_xor_sync(mask, s, 2));
}

// Returns rsqrt(sum / d + eps).
__device__ __forceinline__ float QkNormScale(float sum, int d, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(sum, static_cast<float>(d)), eps));
}

// Returns the 8 values of `piece` as bf16(x · scale · w), w the matching 8 values of the weight.
__device__ __forceinline__ uint4 QkNormApply(const uint4& piece, const uint4& weight,
                                             float scale) {
  const uint32_t x[4] = {piece.x, piece.y, piece.z, piece.w};
  const uint32_t g[4] = {weight.x, weight.y, weight.z, weight.w};
  uint32_t out[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float lo = __fmul_rn(__fmul_rn(__uint_as_float(x[w] << 16), scale),
                               __uint_as_float(g[w] << 16));
    const float hi = __fmul_rn(__fmul_rn(__uint_as_float(x[w] & 0xffff0000u), scale),
                               __uint_as_float(g[w] & 0xffff0000u));
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    out[w] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace kiln

#endif  // KILN_ATTENTION_QK_NORM_MATH_CUH_
