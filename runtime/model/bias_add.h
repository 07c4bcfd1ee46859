// Adds a bias row to every row of a matrix in place: the QKV projection's bias (Qwen2's
// attention_bias), after the GEMM.
//
//   // qkv [num_tokens, qkv_rows] += bias [qkv_rows]
//   CUDA_RETURN_IF_ERROR(kiln::LaunchBiasAdd(qkv, bias, num_tokens, qkv_rows, stream));
//
// y[t, j] = bf16(float(y[t, j]) + float(bias[j])): the GEMM's bf16 output plus the bias, rounded
// once more (Hugging Face's fused linear rounds once; the difference is within bf16 rounding).
// Grid: (num_tokens, ceil(width / (8 * 256))) blocks of 256 threads with 16-byte accesses when
// width is a multiple of 8 and pointers are 16-byte aligned (else one element per access); the
// launch shape depends only on num_tokens and width. Lets the next kernel launch only after its
// own wait (programmatic dependent launch): the kernels after it read everything after theirs.
// Callable during capture; thread-safe.
#ifndef KILN_RUNTIME_MODEL_BIAS_ADD_H_
#define KILN_RUNTIME_MODEL_BIAS_ADD_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace kiln {

// Enqueues the addition on `stream`. Returns cudaErrorInvalidValue for a negative num_tokens, a
// non-positive width or a null pointer, else the launch's error.
cudaError_t LaunchBiasAdd(__nv_bfloat16* y,              // [num_tokens, width], in place
                          const __nv_bfloat16* bias,     // [width]
                          int num_tokens, int width, cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_BIAS_ADD_H_
