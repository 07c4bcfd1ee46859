// Device code: Llama's rotary position embedding (rotate-half form) of one pair of a head, the
// arithmetic every kiln kernel that rotates q or k uses (runtime/model's RoPE and RoPE + KV
// append kernels, the decode layer kernel, and decode attention when it rotates for the step
// itself), so that all of them produce the same bits. Included by .cu files only.
//
//   float c, s;
//   kiln::RopeCosSin(position, i, head_dim, freqs, &c, &s);   // pair i < head_dim / 2; freqs:
//                                                             // RopeFrequencies (rope_frequency.h)
//   float lo, hi;
//   kiln::RopeRotate(x[i], x[i + head_dim / 2], c, s, &lo, &hi);
#ifndef KILN_ATTENTION_ROPE_ROTATION_CUH_
#define KILN_ATTENTION_ROPE_ROTATION_CUH_

#include "attention/rope_frequency.h"

namespace kiln {

// cos and sin of pair i's angle at `position`: the frequency (RopeFrequency: theta^(-2i/d),
// scaled where the model's RoPE is) and the angle in double (in float, position · freq loses
// ~1e-2 of phase at positions around 1e5), rounded to float.
__device__ __forceinline__ void RopeCosSin(int position, int i, int head_dim,
                                           const RopeFrequencies& freqs, float* cos_out,
                                           float* sin_out) {
  const double freq = RopeFrequency(freqs, i, head_dim);
  double s, c;
  sincos(static_cast<double>(position) * freq, &s, &c);
  *cos_out = static_cast<float>(c);
  *sin_out = static_cast<float>(s);
}

// (x, y) = (element i, element i + d/2) → (x·c − y·s, y·c + x·s), each product and sum rounded
// on its own (no fused multiply-add), so the bits do not depend on how a compiler contracts them.
__device__ __forceinline__ void RopeRotate(float x, float y, float c, float s, float* lo,
                                           float* hi) {
  *lo = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  *hi = __fadd_rn(__fmul_rn(y, c), __fmul_rn(x, s));
}

}  // namespace kiln

#endif  // KILN_ATTENTION_ROPE_ROTATION_CUH_
