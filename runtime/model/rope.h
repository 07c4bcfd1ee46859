// Rotary position embedding (Llama's rotate-half form) applied in place to the q and k parts of
// the fused QKV projection output.
//
//   // qkv [num_tokens, (heads + 2 * kv_heads) * head_dim]; positions int32 [num_tokens] on the GPU
//   CUDA_RETURN_IF_ERROR(kiln::LaunchRope(qkv, positions, num_tokens, heads, kv_heads, head_dim,
//                                         shape.rope_theta, shape.rope_scaling, stream));
//
// For every q and k head and i < head_dim / 2, with f_i = theta^(-2i / head_dim) (rescaled when
// `scaling` is enabled: attention/rope_frequency.h) and angle a = position * f_i:
//   (x_i, x_{i+d/2}) <- (x_i cos a - x_{i+d/2} sin a, x_{i+d/2} cos a + x_i sin a).
// V is left alone. Positions are read from device memory, so a captured graph replays for new
// positions; the launch shape depends only on num_tokens and the head counts. cos/sin are
// computed per token in double precision and rounded to float (accurate at any position, no
// table to size); the rotation itself is float arithmetic with one bf16 rounding.
// Callable during capture; thread-safe.
#ifndef KILN_RUNTIME_MODEL_ROPE_H_
#define KILN_RUNTIME_MODEL_ROPE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/rope_frequency.h"

namespace kiln {

// Enqueues the rotation on `stream`. Returns cudaErrorInvalidValue for a negative num_tokens,
// non-positive head counts, an odd head_dim or one above 256, a row of more than 2^31 - 1
// elements, theta <= 0, a scaling that RopeScaling::Validate refuses, or (for num_tokens > 0) a
// null qkv or positions; else the launch's error.
cudaError_t LaunchRope(__nv_bfloat16* qkv,        // [num_tokens, (heads + 2 * kv_heads) * head_dim]
                       const int32_t* positions,  // [num_tokens]
                       int num_tokens, int heads, int kv_heads, int head_dim, double theta,
                       const RopeScaling& scaling, cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_ROPE_H_
