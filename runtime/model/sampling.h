// Greedy sampling: the argmax over the vocabulary of each row of logits.
//
//   // logits [num_rows, vocab] (bf16, or float from Gemm with GemmOutput::kFloat32)
//   CUDA_RETURN_IF_ERROR(kiln::LaunchGreedySample(logits, num_rows, vocab, next_tokens, stream));
//
// Ties go to the lowest index, so the result does not depend on the reduction order; NaN
// never wins; a row with no non-NaN value gives -1. On sm_90+ each row is split over a
// cluster of 8 blocks of 512 threads, which combine their results through distributed shared
// memory; below sm_90 one block of 512 threads scans the row. 16-byte loads when rows are
// 16-byte aligned; num_rows at most 65535 (the grid's y extent); the launch shape depends only
// on num_rows and vocab. `mirror`, when not null, receives the same tokens: pinned host memory
// (cudaMallocHost) works there, so a caller reads the tokens after synchronizing the stream with
// no copy of its own. Callable during capture; thread-safe.
#ifndef KILN_RUNTIME_MODEL_SAMPLING_H_
#define KILN_RUNTIME_MODEL_SAMPLING_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln {

// The most rows one launch takes: rows lie along the grid's y extent.
inline constexpr int kGreedySampleMaxRows = 65535;

// Enqueues tokens[r] = argmax_j logits[r, j] on `stream`. Returns cudaErrorInvalidValue for a
// num_rows outside [0, kGreedySampleMaxRows], a vocab outside [1, 2^31 - 2^14 - 1] or (for num_rows > 0) a
// null logits or tokens, else the launch's error.
cudaError_t LaunchGreedySample(const __nv_bfloat16* logits,  // [num_rows, vocab]
                               int num_rows, int vocab,
                               int32_t* tokens,               // [num_rows]
                               cudaStream_t stream, int32_t* mirror = nullptr);

// The same for float logits.
cudaError_t LaunchGreedySample(const float* logits,  // [num_rows, vocab]
                               int num_rows, int vocab,
                               int32_t* tokens,      // [num_rows]
                               cudaStream_t stream, int32_t* mirror = nullptr);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_SAMPLING_H_
