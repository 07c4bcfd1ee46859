// RMSNorm over each row of a [num_tokens, hidden] bf16 tensor, alone or fused with the
// residual add that precedes every norm after the first:
//
//   // Layer 0: the embedding output is the residual stream.
//   CUDA_RETURN_IF_ERROR(kiln::LaunchRmsNorm(x, input_norm_w, normed, n, hidden, eps, stream));
//   // Later: residual += x (the attention or MLP output); normed = RMSNorm(residual) * w.
//   CUDA_RETURN_IF_ERROR(kiln::LaunchFusedAddRmsNorm(x, residual, post_norm_w, normed, n, hidden,
//                                                    eps, stream));
//
// out[t, i] = bf16(v[t, i] / sqrt(mean_i(v[t, i]^2) + eps) * weight[i]), computed in float with
// one rounding; in the fused form v = bf16(x + residual), written back to `residual` first, so
// the norm sees exactly the residual that the next layer adds to.
// One block per row (up to 1024 threads, 16-byte accesses when hidden is a multiple of 8 and
// pointers are 16-byte aligned); the block's sum of squares is reduced in a fixed order, so
// results are bitwise reproducible. Where a row fits one 16-byte access per thread (hidden up to
// 8192), each thread loads its weights before the programmatic-launch wait, off the path from
// the kernel before to the one after. The launch shape depends only on num_tokens and hidden.
// hidden may be up to 32768 (4096 on the unaligned path). Callable during capture; thread-safe.
#ifndef KILN_RUNTIME_MODEL_RMS_NORM_H_
#define KILN_RUNTIME_MODEL_RMS_NORM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace kiln {

// Enqueues out = RMSNorm(x) * weight. `out` may alias `x`. Returns cudaErrorInvalidValue for
// a negative num_tokens, an unsupported hidden size, a negative or NaN eps, or (for num_tokens
// > 0) a null pointer, else the launch's error.
cudaError_t LaunchRmsNorm(const __nv_bfloat16* x,       // [num_tokens, hidden]
                          const __nv_bfloat16* weight,  // [hidden]
                          __nv_bfloat16* out,           // [num_tokens, hidden]
                          int num_tokens, int hidden, float eps, cudaStream_t stream);

// Enqueues residual = bf16(x + residual); out = RMSNorm(residual) * weight. `out` may alias
// `x` (not `residual`). Errors as LaunchRmsNorm.
cudaError_t LaunchFusedAddRmsNorm(const __nv_bfloat16* x,       // [num_tokens, hidden]
                                  __nv_bfloat16* residual,      // [num_tokens, hidden], updated
                                  const __nv_bfloat16* weight,  // [hidden]
                                  __nv_bfloat16* out,           // [num_tokens, hidden]
                                  int num_tokens, int hidden, float eps, cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_RMS_NORM_H_
