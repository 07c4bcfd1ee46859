// SiLU-gated product on the fused gate-up projection output: out = silu(gate) * up.
//
//   // gate_up [num_tokens, 2 * ffn] (gate columns first, then up) -> act [num_tokens, ffn]
//   CUDA_RETURN_IF_ERROR(kiln::LaunchSiluMul(gate_up, act, num_tokens, ffn, stream));
//
// out[t, j] = bf16(g / (1 + exp(-g)) * u) with g = gate_up[t, j], u = gate_up[t, ffn + j], in
// float with one rounding. Grid: (num_tokens, ceil(ffn / (8 * 256))) blocks of 256 threads with
// 16-byte accesses when ffn is a multiple of 8 and pointers are 16-byte aligned (else one
// element per access); the launch shape depends only on num_tokens and ffn.
// Callable during capture; thread-safe.
#ifndef KILN_RUNTIME_MODEL_SILU_MUL_H_
#define KILN_RUNTIME_MODEL_SILU_MUL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace kiln {

// Enqueues the product on `stream`. Returns cudaErrorInvalidValue for a negative num_tokens, a
// non-positive ffn or (for num_tokens > 0) a null pointer, else the launch's error. `out` must
// not overlap `gate_up`.
cudaError_t LaunchSiluMul(const __nv_bfloat16* gate_up,  // [num_tokens, 2 * ffn]
                          __nv_bfloat16* out,            // [num_tokens, ffn]
                          int num_tokens, int ffn, cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_SILU_MUL_H_
