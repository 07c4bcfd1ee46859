// RMS-normalises every query and key head of the QKV projection's output in place, over
// head_dim, with one weight of head_dim per side shared by its heads: Qwen3's q_norm and k_norm,
// after the QKV GEMM (and its bias) and before RoPE. V is left as it is.
//
//   // qkv [num_tokens, (heads + 2 * kv_heads) * head_dim]: q heads, k heads, v heads
//   CUDA_RETURN_IF_ERROR(kiln::LaunchQkNorm(qkv, q_norm, k_norm, num_tokens, heads, kv_heads,
//                                           head_dim, /*eps=*/1e-6f, stream));
//
// For each head x [head_dim]: x = bf16(x · rsqrt(mean(x²) + eps) · w), in float with one
// rounding, as the RMSNorm kernel rounds (rms_norm.h; Hugging Face rounds x · rsqrt(...) to bf16
// before the weight's product, the difference within bf16 rounding). One quad of lanes per head,
// in attention/qk_norm_math.cuh's order, which decode attention repeats where it norms the step's
// new q and k itself (DecodeRopeAppendDevice::q_norm): the same bits either way, and on every
// launch. Grid: (num_tokens, ceil((heads + kv_heads) / 64)) blocks of 256 threads; the launch
// shape depends only on num_tokens, heads and kv_heads. The weights load before the wait for the
// kernel before (programmatic dependent launch); the next kernel launches only after this one's
// wait. Callable during capture; thread-safe.
#ifndef KILN_RUNTIME_MODEL_QK_NORM_H_
#define KILN_RUNTIME_MODEL_QK_NORM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace kiln {

// The largest head_dim the kernel takes (8 pieces of 8 values a lane).
inline constexpr int kQkNormMaxHeadDim = 256;

// Enqueues the norms on `stream`. Returns cudaErrorInvalidValue for a negative num_tokens,
// non-positive heads or kv_heads, a head_dim that is not a multiple of 8 in [8,
// kQkNormMaxHeadDim], an eps that is not positive, or a null or not 16-byte aligned pointer; else
// the launch's error.
cudaError_t LaunchQkNorm(__nv_bfloat16* qkv,                // [num_tokens, qkv_rows], in place
                         const __nv_bfloat16* q_norm,       // [head_dim]
                         const __nv_bfloat16* k_norm,       // [head_dim]
                         int num_tokens, int heads, int kv_heads, int head_dim, float eps,
                         cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_QK_NORM_H_
